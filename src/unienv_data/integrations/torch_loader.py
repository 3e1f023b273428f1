"""`shared_memory_dataloader`: a torch ``DataLoader`` whose worker processes hand batches over through a
preallocated shared-memory slot file, not through torch's per-tensor transfer (importing this imports torch).

Why. A DataLoader worker returns its batch through a pipe: NumPy arrays are pickled byte by byte, torch tensors
are moved into a fresh shared-memory segment per tensor and sent as file descriptors. For camera windows read
from memory-mapped files (a few MB per batch) either cost is many times the gather itself, so 2 workers were 15x
slower than none. Here:

* the parent creates one file of `n_slots` slots under ``/dev/shm`` (each room for one batch) before the workers
  start; the batch sampler, which runs in the parent, hands each index batch out together with a free slot;
* a worker reads its batch from the dataset (one read per key for a `WindowDataset`; memory-mapped storages are
  shared by file, so the rows come from the page cache) and copies the array leaves into its slot: that copy is
  the only one, and it runs in the worker;
* the worker sends only the slot number and a small description; the parent's tensors ARE the slot's memory
  (``torch.from_numpy`` of the parent's mapping): no copy in the parent;
* a slot returns to the free list when every tensor of its batch (and every view of them) has been freed, or,
  for batches that never arrive because an epoch was abandoned (``break``), when the DataLoader iterator is freed
  (after it stopped its workers; with ``persistent_workers=True`` the next epoch receives them first). When no
  slot is free (the training loop keeps many batches alive), batches fall back to torch's usual transfer: slower,
  never wrong, never blocking.

With ``num_workers=0`` it is a plain DataLoader over the same dataset (batches as torch tensors, no copy).
The slot file is removed when the loader is garbage-collected and at interpreter exit; a parent killed by SIGKILL
leaves it in ``/dev/shm`` (named ``unienv-sampler-<pid>-*.shm``). Works with ``fork`` and ``spawn``.
"""
from __future__ import annotations

import collections
import dataclasses
import weakref
from typing import Any, Deque, Dict, Iterator, List, Optional, Set, Tuple

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, get_worker_info

from unienv_data.base.common import BatchBase, BatchSampler
from unienv_data.batches._tree import collate_to_torch, map_leaves
from unienv_data.samplers._mp_packing import ALIGN, align, batch_layout, leaf_views, pack, unpack
from unienv_data.base.files import remove_quietly
from unienv_data.samplers._mp_slots import close_mapping, map_slots, new_slot_path

#: Slot files mapped by this process: path -> (mapping, (n_slots, slot_bytes) view, free list or None).
_MAPPED: Dict[str, Tuple[Any, np.ndarray, Optional[Deque[int]]]] = {}
#: In the parent: slots handed to a worker whose batch has not come back yet, per slot file.
_IN_FLIGHT: Dict[str, Set[int]] = {}


def _mapping(path: str, n_slots: int, slot_bytes: int) -> Tuple[Any, np.ndarray, Optional[Deque[int]]]:
    got = _MAPPED.get(path)
    if got is None:
        mm, view = map_slots(path, n_slots, slot_bytes, create=False)
        got = _MAPPED[path] = (mm, view, None)
    return got


def _release(free: Deque[int], slot: int) -> None:
    free.append(slot)


def _rebuild(path: str, n_slots: int, slot_bytes: int, slot: int, spec: Any) -> Any:
    """Runs in the parent when a worker's message is unpickled: the batch as tensors over the parent's mapping of
    the slot, which goes back to the free list once they are all gone."""
    mm, _, free = _mapping(path, n_slots, slot_bytes)
    _IN_FLIGHT.get(path, set()).discard(slot)
    owner = np.frombuffer(memoryview(mm)[slot * slot_bytes:(slot + 1) * slot_bytes], dtype=np.uint8)
    if free is not None:
        weakref.finalize(owner, _release, free, slot)
    return unpack(spec, owner, copy=False)


def _fallback(path: str, slot: Optional[int], data: Any) -> Any:
    """Runs in the parent for a batch that did not use its slot: the slot is free again at once."""
    got = _MAPPED.get(path)
    if got is not None and got[2] is not None and slot is not None:
        _IN_FLIGHT.get(path, set()).discard(slot)
        got[2].append(slot)
    return data


class _InSlot:
    """What a worker returns: pickles to the slot number and the batch description only."""

    def __init__(self, path: str, n_slots: int, slot_bytes: int, slot: int, spec: Any) -> None:
        self.args = (path, n_slots, slot_bytes, slot, spec)

    def __reduce__(self) -> Tuple[Any, Tuple[Any, ...]]:
        return _rebuild, self.args


class _NotInSlot:
    def __init__(self, path: str, slot: Optional[int], data: Any) -> None:
        self.args = (path, slot, data)

    def __reduce__(self) -> Tuple[Any, Tuple[Any, ...]]:
        return _fallback, self.args


def _read_batch(data: Any, idx: np.ndarray) -> Any:
    """One whole batch of `data` at `idx`: `get_at` of a `BatchBase`, else the dataset's own `__getitems__`."""
    if isinstance(data, BatchBase):
        return data.get_at(idx)
    return data.__getitems__(idx)


class _SlotDataset(Dataset):  # type: ignore[type-arg]
    """The dataset as the workers see it: `__getitems__((slot, indices))` fills the slot."""

    def __init__(self, batch: Any, path: str, n_slots: int, slot_bytes: int, item_spec: Any = None) -> None:
        self.batch = batch
        self.path = path
        self.n_slots = n_slots
        self.slot_bytes = slot_bytes
        # the layout of a one-item batch when the batch reads straight into arrays (`get_at_into`), else None
        self.item_spec = item_spec if callable(getattr(batch, "get_at_into", None)) else None
        self._layouts: Dict[int, Optional[Tuple[Any, int]]] = {}     # batch size -> batch_layout(item_spec, n)

    def __len__(self) -> int:
        return len(self.batch)

    def __getitem__(self, index: int) -> Any:
        return self.batch[index] if not isinstance(self.batch, BatchBase) else self.batch.get_at(index)

    def __getitems__(self, request: Any) -> Any:
        slot, idx = request if isinstance(request, tuple) else (None, request)
        idx = np.asarray(idx, dtype=np.int64)
        in_worker = get_worker_info() is not None
        if in_worker and slot is not None and self.item_spec is not None:
            n = int(idx.shape[0])
            laid = self._layouts.get(n)
            if laid is None and n not in self._layouts:
                laid = self._layouts[n] = batch_layout(self.item_spec, n)
            if laid is not None and laid[1] <= self.slot_bytes:
                # the reader gathers straight into the slot: the batch's only copy, made in the worker
                spec = laid[0]
                _, view, _ = _mapping(self.path, self.n_slots, self.slot_bytes)
                self.batch.get_at_into(idx, leaf_views(spec, view[slot]))  # type: ignore[attr-defined]
                return _InSlot(self.path, self.n_slots, self.slot_bytes, slot, spec)
        data = collate_to_torch(_read_batch(self.batch, idx))
        if not in_worker:
            if slot is not None:
                _fallback(self.path, slot, None)
            return data
        if slot is None:
            return data
        _, view, _ = _mapping(self.path, self.n_slots, self.slot_bytes)
        spec, payload = pack(data, view[slot])
        if payload is not None:                  # larger than a slot: the usual transfer
            return _NotInSlot(self.path, slot, data)
        return _InSlot(self.path, self.n_slots, self.slot_bytes, slot, spec)


@dataclasses.dataclass(eq=False)
class _SlotBatchSampler:
    """Index batches (shuffled with a seeded generator, a new permutation each epoch) paired with a free slot."""

    n: int
    batch_size: int
    shuffle: bool
    drop_last: bool
    seed: dataclasses.InitVar[Optional[int]]
    free: Optional[Deque[int]]
    path: str = ""
    persistent: bool = False

    def __post_init__(self, seed: Optional[int]) -> None:
        self.rng = np.random.default_rng(seed)

    def __len__(self) -> int:
        return self.n // self.batch_size if self.drop_last else -(-self.n // self.batch_size)

    def __iter__(self) -> Iterator[Any]:
        order = self.rng.permutation(self.n) if self.shuffle else np.arange(self.n)
        stop = len(self) * self.batch_size
        mine: Set[int] = set()
        in_flight = _IN_FLIGHT.setdefault(self.path, set())
        try:
            for s in range(0, min(stop, self.n), self.batch_size):
                idx = order[s:s + self.batch_size].tolist()
                if self.free is None:
                    yield idx
                    continue
                try:
                    # the most recently freed slot first (last in, first out): its pages are the likeliest to be
                    # in the CPU caches still, so the worker's copy into it is cheaper (here a 6 MB camera batch
                    # took 0.8 ms into one of the 4 slots in use most recently, 1.4 ms into the least recent of 8)
                    slot: Optional[int] = self.free.pop()
                except IndexError:
                    slot = None
                if slot is not None:
                    mine.add(slot)
                    in_flight.add(slot)
                yield (slot, idx)
        except GeneratorExit:
            # The epoch was abandoned: the DataLoader iterator that owned this generator is being freed, after
            # it shut its workers down (not so with persistent workers: they hand the batches in flight back
            # when the next epoch starts). Batches that never came back free their slots here.
            if not self.persistent and self.free is not None:
                for slot in sorted(mine & in_flight):
                    in_flight.discard(slot)
                    self.free.append(slot)
            raise


def _close_slots(path: str) -> None:
    got = _MAPPED.pop(path, None)
    _IN_FLIGHT.pop(path, None)
    remove_quietly(path)
    if got is not None:
        close_mapping(got[0])


def shared_memory_dataloader(data: Any, batch_size: int, *, shuffle: bool = True, drop_last: bool = False,
                             seed: Optional[int] = None, num_workers: int = 2, n_slots: Optional[int] = None,
                             prefetch_factor: int = 2, **dataloader_kwargs: Any) -> DataLoader:  # type: ignore[type-arg]
    """A DataLoader over `data` whose workers hand batches over through shared-memory slots (see the module
    docstring). Batches are dicts / tuples of torch tensors, read with one call per batch.

    `data`: a `BatchBase` (a `WindowDataset`, a `ReplayBuffer`, a batch view; read with `get_at(indices)`), a sampler
    (served through its `dataset_view()`), or a map-style dataset that reads whole batches: `len(data)` items and
    `data.__getitems__(indices)` returning a dict / tuple of arrays with the batch on the first axis (for example
    `LeRobotWindows`). Either kind may offer `get_at_into(indices, out)`, which fills the slot's arrays in place.

    `shuffle`, `drop_last`, `seed`: the order of the items (a fresh permutation per epoch from a NumPy generator
    seeded by `seed`). `n_slots`: batches that may be alive at once before the fallback (default:
    `num_workers * prefetch_factor + 4`). Other keyword arguments go to the DataLoader (``pin_memory``,
    ``persistent_workers``, ``multiprocessing_context``, ``timeout``, ...; not ``batch_size``, ``sampler``,
    ``batch_sampler``, ``collate_fn``, ``shuffle``)."""
    if isinstance(data, BatchSampler):
        data = data.dataset_view()
    if not isinstance(data, BatchBase) and not (callable(getattr(data, "__getitems__", None)) and
                                                callable(getattr(data, "__len__", None))):
        raise TypeError(f"data must be a BatchBase (a WindowDataset, a ReplayBuffer, a batch view), a sampler or a "
                        f"dataset with __len__ and __getitems__ (whole-batch reads), got {type(data).__name__}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    if isinstance(num_workers, bool) or not isinstance(num_workers, (int, np.integer)) or num_workers < 0:
        raise ValueError(f"num_workers must be a non-negative int, got {num_workers!r}")
    taken = {"batch_size", "sampler", "batch_sampler", "collate_fn", "shuffle"}.intersection(dataloader_kwargs)
    if taken:
        raise TypeError(f"shared_memory_dataloader sets {sorted(taken)} itself; pass batch_size=, shuffle=, seed= "
                        "to it instead")
    n = len(data)
    if n == 0:
        raise ValueError("the data is empty: there is nothing to load")
    if num_workers == 0:
        sampler = _SlotBatchSampler(n, int(batch_size), shuffle, drop_last, seed, None)
        return DataLoader(_SlotDataset(data, "", 0, 0), batch_sampler=sampler, collate_fn=_identity,
                          num_workers=0, **dataloader_kwargs)
    item_spec, per_item, leaves = _batch_bytes(collate_to_torch(_read_batch(data, np.zeros(1, dtype=np.int64))))
    slot_bytes = align(per_item * int(batch_size) + ALIGN * (leaves + 1))
    count = int(n_slots) if n_slots is not None else int(num_workers) * int(prefetch_factor) + 4
    if count < 1:
        raise ValueError(f"n_slots must be a positive int, got {n_slots!r}")
    path = new_slot_path()
    mm, view = map_slots(path, count, slot_bytes, create=True)
    free: Deque[int] = collections.deque(range(count))
    _MAPPED[path] = (mm, view, free)
    sampler = _SlotBatchSampler(n, int(batch_size), shuffle, drop_last, seed, free, path,
                                bool(dataloader_kwargs.get("persistent_workers", False)))
    loader: DataLoader = DataLoader(  # type: ignore[type-arg]
        _SlotDataset(data, path, count, slot_bytes, item_spec), batch_sampler=sampler, collate_fn=_identity,
        num_workers=int(num_workers), prefetch_factor=prefetch_factor, **dataloader_kwargs)
    weakref.finalize(loader, _close_slots, path)
    return loader


def _batch_bytes(batch: Any) -> Tuple[Any, int, int]:
    """`(description, bytes of the array leaves, number of leaves)` of a one-item batch."""
    spec, payload = pack(batch, None)
    leaves: List[int] = []
    map_leaves(batch, lambda leaf: leaves.append(1))
    return spec, (0 if payload is None else len(payload)), len(leaves)


def _identity(batch: Any) -> Any:
    return batch


__all__ = ["shared_memory_dataloader"]
