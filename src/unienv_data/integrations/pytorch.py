"""PyTorch bridges (importing this module imports torch; ``import unienv_data`` does not).

* `UniEnvAsPyTorchDataset`: any `BatchBase` (a ReplayBuffer, a storage view, ...) as a map-style
  ``torch.utils.data.Dataset`` whose batched ``__getitems__`` reads a whole DataLoader batch with one storage gather.
* `PyTorchAsUniEnvDataset`: any map-style torch dataset as a read-only `BatchBase`, its space inferred from
  ``dataset[0]``.
* `PinnedPrefetcher`: fetches batches from a sampler or an iterable on a background thread, copies them into
  pinned (page-locked) memory when CUDA is available, and yields them in order, optionally moved to a device.

DataLoader workers
------------------
``DataLoader(UniEnvAsPyTorchDataset(buffer), batch_size=B, collate_fn=UniEnvAsPyTorchDataset.collate_fn,
num_workers=N)`` works with the ``fork`` and ``spawn`` start methods and with ``persistent_workers=True``: the
dataset travels to each worker with the buffer, and array storages pickle by file name (memory-mapped) or by
shared-memory name, so every worker maps the same rows instead of copying them (an in-RAM storage without
``multiprocessing=True`` is copied). Rows written in place later are seen by the workers. The buffer's *length*,
though, is private to each process unless the buffer was created with ``multiprocessing=True``: to keep
appending to a buffer that persistent workers read, create it with ``multiprocessing=True``, or the DataLoader's
sampler (in the parent) may draw indices the workers' copies do not have yet.

A worker hands its batch back through a pipe: NumPy arrays are pickled byte by byte, torch tensors are moved into
a fresh shared-memory segment each. For camera batches of several MB either costs more than the read itself;
``shared_memory_dataloader`` (from `unienv_data.integrations.torch_loader`, re-exported here) has the workers fill
preallocated shared-memory slots that become the parent's tensors without a copy. Otherwise pass
``collate_fn=UniEnvAsPyTorchDataset.tensor_collate_fn`` so at least NumPy batches travel as tensors.
"""
from __future__ import annotations

import queue
import threading
import weakref
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence, Union

import numpy as np
import torch
from torch.utils.data import Dataset
from torch.utils.data import default_collate

from unienv_data.base.closing import ClosesOnExit
from unienv_data.base.common import BatchBase, BatchSampler, BatchT
from unienv_data.batches._tree import collate_to_torch, warn_slow_worker_transfer
from unienv_data.base.indexing import is_single_index, normalize_index
from unienv_interface.backends.pytorch import PyTorchComputeBackend
from unienv_interface.space import BinarySpace, BoxSpace, DictSpace, Space, TupleSpace
from unienv_interface.space.space_utils import batch_utils


# ---------------------------------------------------------------------------------------------------- unienv -> torch
class UniEnvAsPyTorchDataset(Dataset):  # type: ignore[type-arg]
    """A `BatchBase` as a map-style torch ``Dataset``.

    * ``ds[i]`` (an int) is one sample, ``batch.get_at(i)``; any other index (slice, list, array) gives a batch.
    * ``ds.__getitems__(indices)`` is what ``DataLoader`` calls for a whole batch: one ``batch.get_at(indices)``,
      i.e. one gather in the storage, already batched.
    * `collate_fn` therefore returns batched results unchanged; a plain list of samples (what a DataLoader hands
      over when the dataset is wrapped in something without ``__getitems__``) is stacked with torch's
      ``default_collate``.
    * ``include_metadata=True``: items are ``(data, metadata)`` pairs from ``get_at_with_metadata`` (metadata may
      be None).
    * A sampler (``StepSampler``, ``SliceSampler``, ``PrioritizedSampler``, ``MultiprocessingSampler``) serves
      every item it can draw, once, in order (``sampler.dataset_view()``): the steps of its data, or for a
      ``SliceSampler`` every window (``all_starts()`` order; the DataLoader shuffles). ``SegmentSampler`` is
      refused (episodes differ in length). The sampler is kept as ``.sampler``.

    Results are whatever the batch returns (torch tensors for a torch-backed buffer). With DataLoader workers and
    NumPy data, pass ``collate_fn=UniEnvAsPyTorchDataset.tensor_collate_fn``: batches become torch tensors (no copy)
    in the worker and travel in shared memory; NumPy arrays would be pickled through a pipe, which for camera
    batches is many times slower than no workers at all.
    """

    def __init__(self, batch: BatchBase, include_metadata: bool = False) -> None:
        if not isinstance(batch, BatchBase):
            raise TypeError(f"batch must be a BatchBase (e.g. a ReplayBuffer), got {type(batch).__name__}")
        self.sampler: Optional[BatchSampler] = None
        if isinstance(batch, BatchSampler):
            self.sampler = batch
            batch = batch.dataset_view()
        self.batch = batch
        self.include_metadata = bool(include_metadata)

    def __len__(self) -> int:
        return len(self.batch)

    def _read(self, index: Any) -> Any:
        if self.include_metadata:
            return self.batch.get_at_with_metadata(index)
        return self.batch.get_at(index)

    def __getitem__(self, index: Any) -> Any:
        if is_single_index(index):
            return self._read(index)
        if isinstance(index, (list, tuple)):
            index = np.asarray(index, dtype=np.int64)
        return self._read(index)

    def __getitems__(self, indices: Union[Sequence[int], np.ndarray, torch.Tensor]) -> Any:
        """The samples at `indices`, read with one batched `get_at` (already collated)."""
        if isinstance(indices, torch.Tensor):
            idx = indices.detach().cpu().numpy().astype(np.int64, copy=False)
        else:
            idx = np.asarray(indices, dtype=np.int64)
        if idx.ndim != 1:
            raise IndexError(f"__getitems__ needs a 1-D sequence of indices, got shape {idx.shape}")
        return self._read(idx)

    @staticmethod
    def collate_fn(data: Any) -> Any:
        """Identity for results of `__getitems__` (already batched); a list of single samples is stacked. In a
        DataLoader worker, a batch over 1 MiB warns once (it is pickled or copied through the worker's pipe)."""
        if type(data) is list:
            data = default_collate(data)
        warn_slow_worker_transfer(data, "through the worker's pipe (NumPy arrays are pickled, tensors copied into "
                                        "a new shared-memory segment each)")
        return data

    @staticmethod
    def tensor_collate_fn(data: Any) -> Any:
        """Like `collate_fn`, with NumPy arrays turned into torch tensors sharing their memory: in DataLoader
        workers, batches then travel through shared memory instead of being pickled."""
        out = collate_to_torch(data)
        warn_slow_worker_transfer(out, "as torch tensors (one new shared-memory segment and file descriptor per "
                                       "tensor)")
        return out


# ---------------------------------------------------------------------------------------------------- torch -> unienv
def _as_tensor(x: Any) -> Optional[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return x
    if isinstance(x, (np.ndarray, np.generic)):
        arr = np.asarray(x)
        if arr.dtype.hasobject:
            return None
        return torch.from_numpy(np.ascontiguousarray(arr))
    if isinstance(x, (bool, int, float)):
        return torch.as_tensor(x)
    return None


def _infer_space(x: Any, where: str) -> Space:
    """The space of one sample `x` (tensors, NumPy arrays, Python scalars, dicts, tuples and lists of them)."""
    B = PyTorchComputeBackend
    if isinstance(x, dict):
        if not all(isinstance(k, str) for k in x):
            raise TypeError(f"{where}: dict keys must be strings, got {list(x)!r}")
        return DictSpace(B, {k: _infer_space(v, f"{where}[{k!r}]") for k, v in x.items()})
    if isinstance(x, (tuple, list)):
        return TupleSpace(B, [_infer_space(v, f"{where}[{i}]") for i, v in enumerate(x)])
    t = _as_tensor(x)
    if t is None:
        raise TypeError(f"{where}: cannot infer a space from a {type(x).__name__}; items must be tensors, NumPy "
                        "arrays, Python numbers, or dicts / tuples / lists of them")
    device = None if t.device.type == "cpu" else t.device
    shape = tuple(t.shape)
    if t.dtype == torch.bool:
        return BinarySpace(B, shape, device=device)
    if t.dtype.is_floating_point:
        return BoxSpace(B, -np.inf, np.inf, t.dtype, device=device, shape=shape)
    if t.dtype.is_complex:
        raise TypeError(f"{where}: complex tensors ({t.dtype}) have no space")
    info = torch.iinfo(t.dtype)
    return BoxSpace(B, info.min, info.max, t.dtype, device=device, shape=shape)


def _conform(x: Any, space: Space, where: str) -> Any:
    """`x` as torch data of `space`; a structure, dtype or shape that differs from dataset[0]'s raises."""
    if isinstance(space, DictSpace):
        if not isinstance(x, dict) or set(x) != set(space.spaces):
            got = sorted(x) if isinstance(x, dict) else type(x).__name__
            raise ValueError(f"{where}: expected a dict with keys {sorted(space.spaces)} (like dataset[0]), got {got}")
        return {k: _conform(x[k], s, f"{where}[{k!r}]") for k, s in space.spaces.items()}
    if isinstance(space, TupleSpace):
        if not isinstance(x, (tuple, list)) or len(x) != len(space.spaces):
            raise ValueError(f"{where}: expected a sequence of {len(space.spaces)} items (like dataset[0]), got "
                             f"{type(x).__name__}{'' if not isinstance(x, (tuple, list)) else f' of {len(x)}'}")
        return tuple(_conform(v, s, f"{where}[{i}]") for i, (v, s) in enumerate(zip(x, space.spaces)))
    t = _as_tensor(x)
    if t is None:
        raise TypeError(f"{where}: expected a tensor, got {type(x).__name__}")
    want = space.dtype
    if t.dtype != want:
        if isinstance(x, (bool, int, float)) and not isinstance(x, torch.Tensor):
            t = torch.as_tensor(x, dtype=want)
            if t.item() != x:
                raise ValueError(f"{where}: {x!r} is not representable as {want}")
        else:
            raise ValueError(f"{where}: dtype {t.dtype} differs from dataset[0]'s {want}")
    if tuple(t.shape) != tuple(space.shape or ()):
        raise ValueError(f"{where}: shape {tuple(t.shape)} differs from dataset[0]'s {tuple(space.shape or ())}")
    return t


class PyTorchAsUniEnvDataset(BatchBase[BatchT, torch.Tensor, Union[torch.device, str], torch.dtype, torch.Generator]):
    """A map-style torch dataset as a read-only `BatchBase` on the PyTorch backend.

    The space is inferred from ``dataset[0]``: float tensors give unbounded Boxes, integer tensors Boxes over the
    whole dtype range, bool tensors BinarySpaces, dicts DictSpaces and tuples / lists TupleSpaces (so list items
    come back as tuples); NumPy arrays and Python numbers become tensors. Every item read later must have the same
    structure, dtypes and shapes (ValueError naming the key otherwise). A batch read stacks the items; for a
    `UniEnvAsPyTorchDataset` it is one gather in the underlying batch.
    """

    is_mutable = False

    def __init__(self, dataset: Any) -> None:
        if not hasattr(dataset, "__getitem__") or not hasattr(dataset, "__len__"):
            raise TypeError(f"dataset must be a map-style dataset (__getitem__ and __len__), got {type(dataset).__name__}")
        if len(dataset) == 0:
            raise ValueError("cannot infer a space from an empty dataset")
        space = _infer_space(dataset[0], "dataset[0]")
        super().__init__(space)
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def _item(self, i: int) -> Any:
        return _conform(self.dataset[i], self.single_space, f"dataset[{i}]")

    def get_at(self, idx: Any) -> Any:
        """Item(s) at `idx`: an int gives one sample, anything else (slice, int array, mask) a stacked batch."""
        n = len(self.dataset)
        norm = normalize_index(idx, n, type(self).__name__)
        if norm.single is not None:
            return self._item(norm.single)
        pos = norm.positions()
        if isinstance(self.dataset, UniEnvAsPyTorchDataset) and not self.dataset.include_metadata:
            return _conform(self.dataset.__getitems__(pos), self._batched_n(len(pos)), "batch")
        return batch_utils.concatenate(self._batched_space, [self._item(int(i)) for i in pos])

    def _batched_n(self, n: int) -> Space:
        return batch_utils.batch_space(self.single_space, n)


# ---------------------------------------------------------------------------------------------------- prefetching
def _map_tensors(x: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    if isinstance(x, torch.Tensor):
        return fn(x)
    if type(x) is dict:
        return {k: _map_tensors(v, fn) for k, v in x.items()}
    if isinstance(x, dict):  # OrderedDict and other mappings built from pairs
        return type(x)((k, _map_tensors(v, fn)) for k, v in x.items())
    if isinstance(x, tuple) and hasattr(x, "_fields"):  # namedtuple
        return type(x)(*(_map_tensors(v, fn) for v in x))
    if isinstance(x, (tuple, list)):
        return type(x)(_map_tensors(v, fn) for v in x)
    return x


def _pin(t: torch.Tensor) -> torch.Tensor:
    return t.pin_memory() if t.device.type == "cpu" and not t.is_pinned() else t


def _offer(q: "queue.Queue[Any]", item: Any, stop: threading.Event) -> bool:
    """Puts `item` unless `stop` is set first (checked every 50 ms while the queue is full)."""
    while not stop.is_set():
        try:
            q.put(item, timeout=0.05)
            return True
        except queue.Full:
            continue
    return False


def _produce(next_batch: Callable[[], Any], q: "queue.Queue[Any]", stop: threading.Event, pin: bool) -> None:
    try:
        while not stop.is_set():
            try:
                batch = next_batch()
            except StopIteration:
                _offer(q, ("end", None), stop)
                return
            if pin:
                batch = _map_tensors(batch, _pin)
            if not _offer(q, ("ok", batch), stop):
                return
    except BaseException as exc:  # handed to the consumer, which re-raises it
        _offer(q, ("err", exc), stop)


def _stop_producer(stop: threading.Event, q: "queue.Queue[Any]", thread: threading.Thread, timeout: float) -> None:
    stop.set()
    try:
        while True:
            q.get_nowait()
    except queue.Empty:
        pass
    if thread.is_alive() and thread is not threading.current_thread():
        thread.join(timeout)


class PinnedPrefetcher(ClosesOnExit):
    """Yields the batches of `source` in order, fetched up to `depth` ahead on a background thread.

    `source` is a sampler (anything with a callable ``sample()``: an endless stream of ``sample()`` calls, e.g. a
    StepSampler or a MultiprocessingSampler) or any iterable (a DataLoader, a list, a generator: iterated once).
    The background thread is the only caller of the source while the prefetcher runs.

    Pinning: with ``pin_memory=None`` (default) the tensors of each batch are copied into pinned memory when
    ``torch.cuda.is_available()``; on a machine without CUDA pinning is skipped and batches are passed through
    unchanged (still fetched ahead on the thread). ``pin_memory=True`` without CUDA raises ValueError. With
    `device`, each batch is moved there as it is handed out (``non_blocking`` when pinned, so the copy overlaps
    with compute). Only torch tensors are pinned or moved; other leaves pass through.

    An exception raised by the source is re-raised by the ``next()`` that would have returned that batch.
    `close()` (also ``with``, garbage collection and interpreter exit) stops the thread: it is told to stop, the
    queue is drained, and it is joined for up to `timeout` seconds; a thread stuck inside the source (e.g. waiting
    for a batch) is a daemon and does not keep the interpreter alive. The source itself is not closed.
    """

    def __init__(self, source: Union[Iterable[Any], Any], depth: int = 2, device: Any = None, *,
                 pin_memory: Optional[bool] = None, timeout: float = 5.0) -> None:
        if isinstance(depth, bool) or not isinstance(depth, (int, np.integer)) or depth <= 0:
            raise ValueError(f"depth must be a positive int, got {depth!r}")
        cuda = torch.cuda.is_available()
        if pin_memory and not cuda:
            raise ValueError("pin_memory=True needs CUDA, which is not available; pass pin_memory=None to pin only "
                             "when it is")
        self.pin_memory = cuda if pin_memory is None else bool(pin_memory)
        self.device = None if device is None else torch.device(device)
        self.depth = int(depth)
        self.timeout = float(timeout)
        sample = getattr(source, "sample", None)
        if callable(sample):
            next_batch: Callable[[], Any] = sample
        else:
            next_batch = iter(source).__next__
        self._queue: "queue.Queue[Any]" = queue.Queue(maxsize=self.depth)
        self._stop = threading.Event()
        self._exhausted = False
        self._thread = threading.Thread(target=_produce, args=(next_batch, self._queue, self._stop, self.pin_memory),
                                        name="unienv-pinned-prefetcher", daemon=True)
        self._thread.start()
        self._finalizer = weakref.finalize(self, _stop_producer, self._stop, self._queue, self._thread, self.timeout)

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        if self._exhausted:
            raise StopIteration
        while True:
            try:
                kind, payload = self._queue.get(timeout=0.1)
                break
            except queue.Empty:
                if not self._thread.is_alive() and self._queue.empty():
                    self._exhausted = True
                    raise StopIteration from None
        if kind == "end":
            self._exhausted = True
            self.close()
            raise StopIteration
        if kind == "err":
            self._exhausted = True
            self.close()
            raise payload
        if self.device is not None:
            dev, nb = self.device, self.pin_memory
            payload = _map_tensors(payload, lambda t: t.to(dev, non_blocking=nb))
        return payload

    def close(self) -> None:
        """Stops the background thread (idempotent)."""
        self._exhausted = True
        self._finalizer()

    @property
    def is_alive(self) -> bool:
        """Whether the background thread is still running."""
        return self._thread.is_alive()


from .torch_loader import shared_memory_dataloader  # noqa: E402  (re-exported: the DataLoader for workers)

__all__ = ["UniEnvAsPyTorchDataset", "PyTorchAsUniEnvDataset", "PinnedPrefetcher", "shared_memory_dataloader"]
