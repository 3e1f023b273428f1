"""`MultiprocessingSampler`: another sampler's batches, produced ahead of time by worker processes.

How it works
------------
* Each of `n_workers` processes holds its own copy of the wrapped sampler: inherited under ``fork``, unpickled under
  ``spawn`` / ``forkserver`` (array storages pickle by file name or shared-memory name, so every worker maps the
  same rows as the parent; an in-RAM storage without ``multiprocessing=True`` is copied, i.e. a snapshot).
* Every worker is reseeded (the wrapped sampler's ``manual_seed`` plus Python's, NumPy's and torch's global RNGs)
  with a seed derived from ``(seed, worker index)``, so no two workers draw the same indices.
* The parent keeps up to `n_buffers` requests in flight. A request names what to produce (``sample``,
  ``sample_flat``, their ``_with_metadata`` forms, or ``get_at*`` for the epoch iterators) and, with
  ``shared_memory=True``, the free slot to write it into. Each worker has its own pipe; a request goes to the
  worker with the fewest requests in flight, which answers on the same pipe (a dead worker shows as EOF there).
  Requests are refilled in bundles (one message per worker) once half of the room is free, to save system calls.
* ``shared_memory=True``: `n_buffers` slots are preallocated in one shared-memory file (under ``/dev/shm``). A
  worker copies the array leaves of its batch (torch CPU tensors, NumPy arrays) into the slot it was handed and
  sends only the slot index plus a small description of the batch structure; the parent copies the leaves out and
  puts the slot back on its free list. The free list is the back-pressure: a slot is handed out with each request
  and there are never more requests in flight than slots. The file is unlinked as soon as the parent has heard
  from every worker that it mapped the file (and at ``close()``), so nothing is left in ``/dev/shm`` if the parent
  is killed later. Leaves of any other kind (CUDA tensors, Python objects) and batches larger than a slot travel
  through the pipe instead (with a one-time RuntimeWarning suggesting a larger `slot_bytes`).
* Without shared memory, the array leaves are packed into one byte buffer that is sent through the worker's pipe
  (never through torch's per-tensor shared-memory reduction, which costs a file descriptor per tensor).

Results
-------
``sample()`` and friends return the next finished batch of that kind (batches are i.i.d., so arrival order does
not matter); the epoch iterators yield their batches in the order of the epoch's permutation. Returned arrays are
always owned by the caller: nothing aliases a slot that a worker may overwrite.

Errors and shutdown
-------------------
An exception raised by the wrapped sampler inside a worker is re-raised in the parent by the call that asked for
that batch: the same exception type when it can be pickled (its ``__cause__`` holds the worker's traceback text),
else a `SamplerWorkerError` that quotes it; the worker keeps serving, and the batches of that kind already
requested are dropped, so that the next call asks afresh instead of replaying errors (an empty buffer that is
being filled raises once, not `n_buffers` times). A failure while a worker starts (unpickling the sampler,
seeding it) raises `SamplerWorkerError` with the worker's traceback and closes the sampler; so does a worker that
dies (crash, ``os._exit``, signal), with its exit code. ``close()``
sends one stop message per worker, joins them with a timeout, then terminates (and finally kills) any that remain;
it also runs from a ``weakref.finalize`` hook when the sampler is garbage-collected and at interpreter exit, and
from ``__exit__``. Workers ignore SIGINT (the parent handles Ctrl-C and closes them) and exit by themselves when
their parent process disappears. Only the creating process may use the sampler; a forked copy raises.

Sampling while other processes write
------------------------------------
Workers read through the wrapped sampler and its data like any other reader: with a ``ReplayBuffer`` created with
``multiprocessing=True`` (counters, segment table and storage shared by every process) they take the buffer's
lock only to turn logical indices into rows, not while copying the rows. What this sampler guarantees is:

* a batch only contains rows that were committed when the batch's indices were resolved: the buffer reserves and
  writes rows under its lock and a reader reads ``count`` / ``offset`` under the same lock, so rows being written
  are never sampled, and rows appended later become visible to the workers without restarting them;
* if the ring wraps while a worker is copying, a row of a batch may already hold newer data than the row that was
  chosen (it is still a committed row), and a row overwritten *during* the copy may mix elements of the old and
  the new sample. Keep the capacity well above what is written during one ``sample()`` to make that negligible.
  Rows that are not overwritten during the copy are exactly the committed rows that were chosen.

With a buffer that is not ``multiprocessing=True`` (its counters are private to the process), each worker sees
the length and ring offset the buffer had when the worker started; rows rewritten later in a memory-mapped or
shared-memory storage are visible (without synchronisation: a row read while it is being written may mix old and
new values, and after the ring wraps a worker's stale offset maps its indices to other rows), rows appended later
are not. Use such a buffer from workers only while nobody writes to it, or create it with
``multiprocessing=True``.

This class is not thread-safe: call it from one thread at a time (a `PinnedPrefetcher` may be that thread).
"""
from __future__ import annotations

import collections
import io
import itertools
import mmap
import multiprocessing
import multiprocessing.connection
import os
import pickle
import random
import signal
import sys
import tempfile
import time
import traceback
import uuid
import warnings
import weakref
from multiprocessing.reduction import ForkingPickler
from typing import Any, Deque, Dict, Iterator, List, Optional, Sequence, Set, Tuple

import numpy as np

from unienv_data.base.common import BatchSampler
from unienv_interface.space import BinarySpace, BoxSpace, DictSpace, Space, TupleSpace
from unienv_interface.space.space_utils import flatten_utils

_ALIGN = 64

_SAMPLE_KINDS = ("sample", "sample_flat", "sample_with_metadata", "sample_flat_with_metadata")
_EPOCH_KINDS = ("get_at", "get_flattened_at", "get_at_with_metadata", "get_flattened_at_with_metadata")


class SamplerWorkerError(RuntimeError):
    """A sampler worker died, failed to start, or raised an exception that could not be sent back as itself.

    `remote_traceback` holds the worker's traceback text when there is one."""

    def __init__(self, message: str, remote_traceback: Optional[str] = None) -> None:
        if remote_traceback:
            message = f"{message}\n\nWorker traceback:\n{remote_traceback}"
        super().__init__(message)
        self.remote_traceback = remote_traceback


class _RemoteTraceback(Exception):
    """Carries a worker's traceback text as the `__cause__` of an exception re-raised in the parent."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return f'\n"""\n{self.text}"""'


# ---------------------------------------------------------------------------------------------------- packing
def _align(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def _torch_leaf(x: Any) -> bool:
    torch = sys.modules.get("torch")
    return (torch is not None and type(x) is torch.Tensor and x.layout == torch.strided
            and x.device.type == "cpu" and not x.is_quantized)


def _plan_tree(x: Any, sources: List[Tuple[Any, int, Any]], cursor: List[int]) -> Any:
    """The description of `x` (a hashable tuple: structure, dtypes, shapes, byte offsets). Every array leaf is
    appended to `sources` as `(leaf spec, offset, source array)`, and `cursor[0]` advances past it.

    Leaf tags: "N" NumPy array, "T" CPU tensor of a NumPy-representable dtype (copied through its NumPy view),
    "B" other CPU tensor (bfloat16, ...; copied as raw bytes), "O" anything else (sent by pickle)."""
    if type(x) is dict:
        return ("D", tuple((k, _plan_tree(v, sources, cursor)) for k, v in x.items()))
    if type(x) is tuple or type(x) is list:
        return ("U" if type(x) is tuple else "L", tuple(_plan_tree(v, sources, cursor) for v in x))
    if type(x) is np.ndarray and not x.dtype.hasobject:
        tag, arr, dtype = "N", x, x.dtype
    elif _torch_leaf(x):
        t = x.detach()
        try:
            tag, arr = "T", t.numpy()
            dtype = arr.dtype
        except TypeError:  # no NumPy dtype (bfloat16, ...): raw bytes
            import torch
            tag, arr, dtype = "B", t.contiguous().reshape(-1).view(torch.uint8).numpy(), t.dtype
        x = arr if tag == "T" else t
    else:
        return ("O", x)
    n = int(arr.nbytes)
    off = cursor[0]
    cursor[0] = off + _align(n)
    spec = (tag, dtype, tuple(x.shape), off, n)
    if n:
        sources.append((spec, off, arr))
    return spec


def _pack(batch: Any, slot: Optional[np.ndarray]) -> Tuple[Any, Optional[bytearray]]:
    """`(description, payload)`: the array leaves are copied into `slot` when they fit (payload None), else into
    a new bytearray (the payload)."""
    sources: List[Tuple[Any, int, Any]] = []
    cursor = [0]
    spec = _plan_tree(batch, sources, cursor)
    total = cursor[0]
    payload: Optional[bytearray] = None
    if slot is not None and total <= slot.shape[0]:
        dst = slot
    else:
        payload = bytearray(total)
        dst = np.frombuffer(payload, dtype=np.uint8)
    for (tag, dtype, shape, off, n), _, src in sources:
        if tag == "B":
            dst[off:off + n] = src
        else:
            dst[off:off + n].view(src.dtype).reshape(src.shape)[...] = src
    return spec, payload


def _unpack(spec: Any, buf: Optional[np.ndarray], copy: bool) -> Any:
    """Rebuilds a batch described by `spec` from `buf`; with `copy`, every array owns its memory."""
    tag = spec[0]
    if tag == "D":
        return {k: _unpack(v, buf, copy) for k, v in spec[1]}
    if tag == "U":
        return tuple(_unpack(v, buf, copy) for v in spec[1])
    if tag == "L":
        return [_unpack(v, buf, copy) for v in spec[1]]
    if tag == "O":
        return spec[1]
    _, dtype, shape, off, n = spec
    if tag == "B":
        import torch
        if n == 0:
            return torch.empty(shape, dtype=dtype)
        if buf is None:
            raise RuntimeError("internal invariant violated: an array leaf without a buffer")
        raw = buf[off:off + n]
        return torch.from_numpy(raw.copy() if copy else raw).view(dtype).reshape(shape)
    if n == 0:
        arr = np.empty(shape, dtype=dtype)
    else:
        if buf is None:
            raise RuntimeError("internal invariant violated: an array leaf without a buffer")
        arr = buf[off:off + n].view(dtype).reshape(shape)
        if copy:
            arr = arr.copy()
    if tag == "N":
        return arr
    import torch
    return torch.from_numpy(arr)


# ---------------------------------------------------------------------------------------------------- space sizes
def _space_nbytes(space: Space) -> Optional[int]:
    """Bytes of one element of `space` (None when a leaf has no fixed size)."""
    if isinstance(space, (BoxSpace, BinarySpace)):
        itemsize = np.dtype(space.backend.numpy_dtype(space.dtype)).itemsize
        return int(np.prod(space.shape or (), dtype=np.int64)) * itemsize
    if isinstance(space, DictSpace):
        sizes = [_space_nbytes(s) for s in space.spaces.values()]
    elif isinstance(space, TupleSpace):
        sizes = [_space_nbytes(s) for s in space.spaces]
    else:
        return None
    if any(s is None for s in sizes):
        return None
    return sum(s for s in sizes if s is not None)


def _count_leaves(space: Optional[Space]) -> int:
    if isinstance(space, DictSpace):
        return sum(_count_leaves(s) for s in space.spaces.values())
    if isinstance(space, TupleSpace):
        return sum(_count_leaves(s) for s in space.spaces)
    return 1


def _default_slot_bytes(sampler: Any) -> Optional[int]:
    """Room for one batch of the wrapped sampler, structured or flattened, with its metadata."""
    space = sampler.single_space
    n = int(sampler.batch_size)
    structured = _space_nbytes(space)
    if structured is None:
        return None
    try:
        flat_sp = flatten_utils.flatten_space(space)
        flat = _space_nbytes(flat_sp) or 0
    except (TypeError, ValueError):
        flat = 0
    per = max(structured, flat)
    leaves = _count_leaves(space)
    meta_space = getattr(sampler, "single_metadata_space", None)
    if meta_space is not None:
        meta = _space_nbytes(meta_space)
        if meta is None:
            return None
        per += meta
        leaves += _count_leaves(meta_space)
    return _align(n * per + _ALIGN * (leaves + 1))


# ---------------------------------------------------------------------------------------------------- shared slots
def _shm_dir() -> str:
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()


def _map_slots(path: str, n_slots: int, slot_bytes: int, create: bool) -> Tuple[mmap.mmap, np.ndarray]:
    size = n_slots * slot_bytes
    flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
    fd = os.open(path, flags, 0o600)
    try:
        if create:
            os.ftruncate(fd, size)
        mm = mmap.mmap(fd, size, access=mmap.ACCESS_WRITE)
    finally:
        os.close(fd)
    return mm, np.frombuffer(mm, dtype=np.uint8).reshape(n_slots, slot_bytes)


def _unlink_quietly(path: Optional[str]) -> None:
    if path is None:
        return
    try:
        os.unlink(path)
    except OSError:
        pass


# ---------------------------------------------------------------------------------------------------- worker side
class _ByValuePickler(ForkingPickler):
    """multiprocessing's pickler (shared locks, shared arrays and file descriptors go to the child) without torch's
    tensor reductions: tensors travel by value. torch would move each tensor to shared memory and pass a file
    descriptor that is closed again as soon as the tensor is freed, which for temporaries (the state tensor a
    `torch.Generator` pickles itself as) happens before the child is launched."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.dispatch_table = {t: r for t, r in self.dispatch_table.items()
                               if not str(getattr(t, "__module__", "")).startswith("torch")}


class _Carrier:
    """Hands the wrapped sampler to a worker. Under fork the object is inherited; otherwise it is pickled when the
    process is started and unpickled inside the worker, so a failure there is reported with its traceback."""

    def __init__(self, obj: Any) -> None:
        self._obj = obj
        self._blob: Optional[bytes] = None

    def __reduce__(self) -> Any:
        buf = io.BytesIO()
        _ByValuePickler(buf, pickle.HIGHEST_PROTOCOL).dump(self._obj)
        return (_Carrier._from_blob, (buf.getvalue(),))

    @staticmethod
    def _from_blob(blob: bytes) -> "_Carrier":
        c = _Carrier(None)
        c._blob = blob
        return c

    def get(self) -> Any:
        if self._blob is not None:
            obj, self._blob = pickle.loads(self._blob), None
            return obj
        return self._obj


def _derive_seed(base: int, worker: int) -> int:
    """The seed of `worker`: a function of the base seed and the worker index only, so `manual_seed(s)` restarts
    exactly the streams of a sampler created with `seed=s`."""
    return int(np.random.SeedSequence([base, worker, 0x5A3D]).generate_state(1)[0])


def _reseed(sampler: Any, seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.manual_seed(seed)
    reseed = getattr(sampler, "manual_seed", None)
    if callable(reseed):
        reseed(seed)


def _exception_payload(exc: BaseException) -> Tuple[Optional[bytes], str]:
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    try:
        blob: Optional[bytes] = pickle.dumps(exc)
        pickle.loads(blob)  # type: ignore[arg-type]
    except Exception:
        blob = None
    return blob, text


def _reply(conn: Any, message: Any) -> bool:
    """Sends `message` to the parent; False when the parent's end is gone."""
    try:
        conn.send(message)
        return True
    except OSError:
        return False


class _Server:
    """The state of one worker: its sampler, its slots, its seed, the batch layouts it has described."""

    def __init__(self, worker: int, sampler: Any, conn: Any, slots: Optional[np.ndarray], base_seed: int) -> None:
        self.worker = worker
        self.sampler = sampler
        self.conn = conn
        self.slots = slots
        self.seed_state: Any = (0, base_seed)
        self.perm_key: Any = None
        self.perm = np.zeros(0, dtype=np.int64)
        self.spec_ids: Dict[Any, int] = {}
        _reseed(sampler, _derive_seed(base_seed, worker))

    def serve(self, task: Any) -> bool:
        """Answers one request; False when the parent's end of the pipe is gone."""
        req_id, kind, args, slot, seed_state = task
        try:
            if seed_state != self.seed_state:  # manual_seed() in the parent: the new base seed comes along
                self.seed_state = seed_state
                _reseed(self.sampler, _derive_seed(seed_state[1], self.worker))
            if kind in _SAMPLE_KINDS:
                out = getattr(self.sampler, kind)()
            elif kind not in _EPOCH_KINDS:
                raise ValueError(f"unknown request {kind!r}")
            else:  # one chunk of an epoch: the permutation is recomputed from its seed, so requests stay small
                epoch_seed, n, start, stop = args
                if self.perm_key != (epoch_seed, n):
                    self.perm, self.perm_key = np.random.default_rng(epoch_seed).permutation(n), (epoch_seed, n)
                out = getattr(self.sampler.data, kind)(self.perm[start:stop])
            spec, payload = _pack(out, None if slot is None or self.slots is None else self.slots[slot])
            del out
            try:
                sid = self.spec_ids.get(spec)
                described: Any = ((sid, None) if sid is not None
                                  else (self.spec_ids.setdefault(spec, len(self.spec_ids)), spec))
            except TypeError:  # a leaf that is not hashable: send the full description every time
                described = (-1, spec)
            message = ForkingPickler.dumps(("ok", self.worker, req_id, described, payload))
        except BaseException as exc:  # reported to the parent, which re-raises it
            return _reply(self.conn, ("err", self.worker, req_id, _exception_payload(exc), None))
        try:
            self.conn.send_bytes(message)
            return True
        except OSError:
            return False


def _worker_main(worker: int, carrier: _Carrier, conn: Any, shm_path: Optional[str], n_slots: int,
                 slot_bytes: int, base_seed: int, doze_time: float, parent_pid: int) -> None:
    """A worker: answers the requests that arrive on its pipe `conn` (a list of requests per message) until a
    stop message, or until its parent is gone (checked every `doze_time` seconds while idle)."""
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    except ValueError:
        pass
    mm: Optional[mmap.mmap] = None
    slots: Optional[np.ndarray] = None
    try:
        sampler = carrier.get()
        torch = sys.modules.get("torch")
        if torch is not None:
            torch.set_num_threads(1)
        if shm_path is not None:
            mm, slots = _map_slots(shm_path, n_slots, slot_bytes, create=False)
        server = _Server(worker, sampler, conn, slots, base_seed)
    except BaseException as exc:
        _reply(conn, ("fatal", worker, None, _exception_payload(exc), None))
        return
    running = _reply(conn, ("ready", worker, None, None, None))
    while running:
        try:
            if not conn.poll(doze_time):
                running = os.getppid() == parent_pid
                continue
            tasks = conn.recv()
        except (EOFError, OSError):
            break
        if tasks is None:
            break
        for task in tasks:
            if not server.serve(task):
                running = False
                break
    server.slots = slots = None
    if mm is not None:
        try:
            mm.close()
        except BufferError:
            pass


# ---------------------------------------------------------------------------------------------------- parent side
class _Failure:
    """An error reported by a worker for one request, raised when the caller consumes that request."""

    def __init__(self, worker: int, payload: Tuple[Optional[bytes], str]) -> None:
        self.worker = worker
        self.blob, self.text = payload

    def exception(self) -> BaseException:
        if self.blob is not None:
            try:
                exc = pickle.loads(self.blob)
                if isinstance(exc, BaseException):
                    exc.__cause__ = _RemoteTraceback(self.text)
                    try:
                        exc.remote_traceback = self.text  # type: ignore[attr-defined]
                    except AttributeError:
                        pass
                    return exc
            except Exception:
                pass
        return SamplerWorkerError(f"sampler worker {self.worker} raised an exception", self.text)


class _Resources:
    """Everything the workers hold, owned by the parent. `shutdown` may run from a finalizer, so nothing here
    refers back to the sampler."""

    def __init__(self) -> None:
        self.owner_pid = os.getpid()
        self.procs: List[Any] = []
        self.conns: List[Any] = []
        self.shm_path: Optional[str] = None
        self.mm: Optional[mmap.mmap] = None
        self.slots: Optional[np.ndarray] = None
        self.closed = False

    def shutdown(self, timeout: float = 5.0) -> None:
        if self.closed:
            return
        self.closed = True
        if os.getpid() != self.owner_pid:  # a forked copy of the parent must not touch the parent's workers
            return
        try:
            for c in self.conns:
                try:
                    c.send(None)
                except (OSError, ValueError):
                    pass
            deadline = time.monotonic() + timeout
            alive = [p for p in self.procs if p.is_alive()]
            while alive and time.monotonic() < deadline:
                self._drain()  # a worker blocked on a full pipe would never read its stop message
                multiprocessing.connection.wait([p.sentinel for p in alive], timeout=0.02)
                alive = [p for p in alive if p.is_alive()]
            for p in alive:
                p.terminate()
            for p in alive:
                p.join(1.0)
                if p.is_alive():
                    p.kill()
                    p.join(1.0)
        finally:
            for c in self.conns:
                try:
                    c.close()
                except OSError:
                    pass
            for p in self.procs:
                try:
                    p.close()
                except ValueError:
                    pass
            self.slots = None
            if self.mm is not None:
                try:
                    self.mm.close()
                except BufferError:  # an array still refers to it; the mapping goes with that array
                    pass
                self.mm = None
            _unlink_quietly(self.shm_path)
            self.shm_path = None

    def _drain(self) -> None:
        for c in self.conns:
            try:
                while c.poll():
                    c.recv()
            except (EOFError, OSError):
                pass


class MultiprocessingSampler(BatchSampler[Any, Any, Any, Any, Any]):
    """Runs `sampler` in `n_workers` worker processes that keep up to `n_buffers` batches ready (module docstring).

    Arguments beyond the reference API (keyword-only): `seed` (base of the per-worker seeds; None draws fresh
    entropy), `slot_bytes` (size of one shared-memory slot; default: room for one structured or flattened batch of
    the sampler's space) and `timeout` (seconds one call may wait for a batch; None waits as long as the workers
    live). `ctx` is a multiprocessing context or a start-method name (``"fork"``, ``"spawn"``, ``"forkserver"``);
    None uses the default context. `daemon=None` makes the workers daemonic (they are terminated when the parent
    exits even if `close()` was never called). `doze_time` is how often an idle worker checks that its parent is
    still alive (the parent never polls: it waits on the workers' pipes and process sentinels).
    """

    def __init__(self, sampler: BatchSampler, n_workers: int = 4, n_buffers: int = 8, ctx: Any = None,
                 doze_time: float = 0.005, daemon: Optional[bool] = None, shared_memory: bool = False, *,
                 seed: Optional[int] = None, slot_bytes: Optional[int] = None,
                 timeout: Optional[float] = None) -> None:
        if not isinstance(sampler, BatchSampler):
            raise TypeError(f"sampler must be a BatchSampler (e.g. a StepSampler), got {type(sampler).__name__}")
        if isinstance(sampler, MultiprocessingSampler):
            raise TypeError("cannot wrap a MultiprocessingSampler in another one; wrap the inner sampler")
        for name, v in (("n_workers", n_workers), ("n_buffers", n_buffers)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v <= 0:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        if isinstance(doze_time, bool) or not isinstance(doze_time, (int, float)) or not doze_time > 0:
            raise ValueError(f"doze_time must be a positive number of seconds, got {doze_time!r}")
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0):
            raise ValueError(f"timeout must be a positive number of seconds or None, got {timeout!r}")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0):
            raise ValueError(f"seed must be a non-negative int or None, got {seed!r}")
        super().__init__(sampler.single_space, sampler.single_metadata_space, sampler.batch_size)
        self.sampler = sampler
        self.data = sampler.data
        self.n_workers = int(n_workers)
        self.n_buffers = int(n_buffers)
        self.doze_time = float(doze_time)
        self.shared_memory = bool(shared_memory)
        self.timeout = timeout
        if ctx is None:
            ctx = multiprocessing.get_context()
        elif isinstance(ctx, str):
            ctx = multiprocessing.get_context(ctx)
        self.ctx = ctx
        self._base_seed = int(np.random.SeedSequence().entropy if seed is None else seed)  # type: ignore[arg-type]
        self._seed_state: Tuple[int, int] = (0, self._base_seed)   # (generation, base seed) sent with requests
        self._epoch_rng = np.random.default_rng([self._base_seed, 0x3E70C4])
        self._req_ids = itertools.count()
        self._pending: Dict[int, Tuple[str, Optional[int], int]] = {}   # request -> (kind, slot, worker)
        self._inflight: Dict[str, int] = collections.Counter()          # requests in flight per kind
        self._load = [0] * self.n_workers                               # requests in flight per worker
        self._ready: Dict[str, Deque[Any]] = {k: collections.deque() for k in _SAMPLE_KINDS}
        self._done: Dict[int, Any] = {}                                 # finished epoch chunks
        self._stale: Set[int] = set()                                   # requests whose result is dropped
        self._specs: Dict[Tuple[int, int], Any] = {}                    # batch descriptions by (worker, id)
        self._warned_slot_size = False
        self._n_ready_workers = 0
        self._free_slots: List[int] = []
        self.slot_bytes: Optional[int] = None
        res = _Resources()
        self._res = res
        self._finalizer = weakref.finalize(self, res.shutdown)
        try:
            self._start(daemon, slot_bytes)
        except BaseException:
            self.close()
            raise

    def _start(self, daemon: Optional[bool], slot_bytes: Optional[int]) -> None:
        res = self._res
        if self.shared_memory:
            size = slot_bytes if slot_bytes is not None else _default_slot_bytes(self.sampler)
            if size is None:
                raise ValueError("cannot size the shared-memory slots from the sampler's space; pass slot_bytes=")
            if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size <= 0:
                raise ValueError(f"slot_bytes must be a positive int, got {size!r}")
            self.slot_bytes = _align(int(size))
            res.shm_path = os.path.join(_shm_dir(), f"unienv-sampler-{os.getpid()}-{uuid.uuid4().hex}.shm")
            res.mm, res.slots = _map_slots(res.shm_path, self.n_buffers, self.slot_bytes, create=True)
            self._free_slots = list(range(self.n_buffers))
        carrier = _Carrier(self.sampler)
        for w in range(self.n_workers):
            mine, theirs = self.ctx.Pipe(duplex=True)
            p = self.ctx.Process(
                target=_worker_main, name=f"unienv-sampler-worker-{w}",
                args=(w, carrier, theirs, res.shm_path, self.n_buffers, self.slot_bytes or 0,
                      self._base_seed, self.doze_time, os.getpid()),
                daemon=True if daemon is None else bool(daemon))
            res.procs.append(p)
            res.conns.append(mine)
            try:
                p.start()
            finally:
                theirs.close()  # only the worker holds its end: its death shows as EOF here

    # ------------------------------------------------------------------ state
    @property
    def closed(self) -> bool:
        return self._res.closed

    def _check_open(self) -> None:
        if self._res.closed:
            raise RuntimeError("the MultiprocessingSampler is closed")
        if os.getpid() != self._res.owner_pid:
            raise RuntimeError("a MultiprocessingSampler can only be used by the process that created it (this is a "
                               "forked copy); create one in this process instead")

    def __getstate__(self) -> Dict[str, Any]:
        raise TypeError("a MultiprocessingSampler owns worker processes and cannot be pickled; pickle the wrapped "
                        "sampler instead")

    def __enter__(self) -> "MultiprocessingSampler":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self, timeout: float = 5.0) -> None:
        """Stops the workers (a stop message each, join for up to `timeout` s, then terminate, then kill) and frees
        the shared memory. The wrapped sampler and its data stay open. Idempotent."""
        if self._finalizer.detach() is not None:
            self._res.shutdown(timeout)
        self._pending.clear()
        self._done.clear()
        self._stale.clear()
        for d in self._ready.values():
            d.clear()

    @property
    def worker_pids(self) -> List[Optional[int]]:
        """Process ids of the running workers (empty once closed)."""
        return [] if self._res.closed else [p.pid for p in self._res.procs]

    # ------------------------------------------------------------------ requests and results
    def _submit(self, requests: Sequence[Tuple[str, Any]]) -> List[int]:
        """Sends `(kind, args)` requests, each to the worker with the fewest in flight, in one message per worker;
        returns their ids."""
        rids: List[int] = []
        bundles: Dict[int, List[Any]] = {}
        for kind, args in requests:
            rid = next(self._req_ids)
            slot = self._free_slots.pop() if self._free_slots else None
            w = min(range(self.n_workers), key=self._load.__getitem__)
            bundles.setdefault(w, []).append((rid, kind, args, slot, self._seed_state))
            self._pending[rid] = (kind, slot, w)
            self._inflight[kind] += 1
            self._load[w] += 1
            rids.append(rid)
        for w, bundle in bundles.items():
            try:
                self._res.conns[w].send(bundle)
            except (OSError, ValueError):
                self._worker_died(w)
        return rids

    def _top_up(self, kind: str) -> None:
        """Keeps up to `n_buffers` requests in flight and at most `n_buffers` batches of `kind` prefetched.
        Refills once half the room is free (or nothing is coming), so that requests travel in bundles."""
        ready = self._ready[kind]
        room = min(self.n_buffers - len(self._pending), self.n_buffers - self._inflight[kind] - len(ready))
        if room <= 0:
            return
        if room >= max(1, self.n_buffers // 2) or (not ready and not self._inflight[kind]):
            self._submit([(kind, None)] * room)

    def _receive(self, w: int) -> None:
        try:
            tag, worker, rid, body, payload = self._res.conns[w].recv()
        except (EOFError, OSError):
            self._worker_died(w)
            return
        if tag == "ready":
            self._n_ready_workers += 1
            if self._n_ready_workers == self.n_workers:
                _unlink_quietly(self._res.shm_path)  # every worker has mapped it: the name is no longer needed
            return
        if tag == "fatal":
            text = _Failure(worker, body).text
            self.close()
            raise SamplerWorkerError(f"sampler worker {worker} failed to start", text)
        kind, slot, _ = self._pending.pop(rid)
        self._inflight[kind] -= 1
        self._load[w] -= 1
        try:
            if tag == "ok":
                sid, spec = body
                if spec is None:
                    spec = self._specs[(worker, sid)]
                elif sid >= 0:  # a new description: later results of the same layout refer to it by id
                    self._specs[(worker, sid)] = spec
            if rid in self._stale:
                self._stale.discard(rid)
                return
            if tag == "err":
                result: Any = _Failure(worker, body)
            else:
                if payload is None:
                    if slot is None or self._res.slots is None:
                        raise RuntimeError("internal invariant violated: a slot result without a slot")
                    result = _unpack(spec, self._res.slots[slot], copy=True)
                else:
                    if slot is not None and not self._warned_slot_size:
                        self._warned_slot_size = True
                        warnings.warn(f"a {kind} batch of {len(payload)} bytes does not fit in a shared-memory slot of "
                                      f"{self.slot_bytes} bytes and goes through the pipe instead; pass a larger "
                                      "slot_bytes= to MultiprocessingSampler", RuntimeWarning, stacklevel=4)
                    result = _unpack(spec, np.frombuffer(payload, dtype=np.uint8), copy=False)
        finally:
            if slot is not None:
                self._free_slots.append(slot)
        if kind in _SAMPLE_KINDS:
            self._ready[kind].append(result)
        else:
            self._done[rid] = result

    def _worker_died(self, w: Optional[int] = None) -> None:
        procs = self._res.procs
        for c in self._res.conns:  # a worker that failed to start said why before it exited: report that
            try:
                while c.poll():
                    tag, worker, _rid, body, _payload = c.recv()
                    if tag == "fatal":
                        text = _Failure(worker, body).text
                        self.close()
                        raise SamplerWorkerError(f"sampler worker {worker} failed to start", text)
            except (EOFError, OSError):
                pass
        if w is not None:
            procs[w].join(1.0)  # its pipe reached EOF, so it is exiting: collect the exit code
        dead = [(i, p) for i, p in enumerate(procs) if p.exitcode is not None]
        desc = ", ".join(f"worker {i} (pid {p.pid}) exited with code {p.exitcode}" for i, p in dead)
        self.close()
        raise SamplerWorkerError(f"MultiprocessingSampler: {desc or f'worker {w} closed its pipe'}; "
                                 "the sampler is closed")

    def _pump(self, deadline: Optional[float]) -> None:
        """Handles every message that has arrived; when none has, waits for one (or a dead worker, or the
        deadline)."""
        conns = self._res.conns
        got = False
        for w, c in enumerate(conns):
            if c.poll():
                got = True
                self._receive(w)
        if got:
            return
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        sentinels = [p.sentinel for p in self._res.procs]
        ready = multiprocessing.connection.wait(list(conns) + sentinels, timeout=timeout)
        for r in ready:
            if r in sentinels and not any(c.poll() for c in conns):
                self._worker_died(sentinels.index(r))
        for w, c in enumerate(conns):
            if c.poll():
                got = True
                self._receive(w)
        if not got and deadline is not None and time.monotonic() >= deadline:
            raise TimeoutError(f"no batch from the sampler workers within {self.timeout} s")

    def _deadline(self) -> Optional[float]:
        return None if self.timeout is None else time.monotonic() + self.timeout

    def _next_of(self, kind: str) -> Any:
        self._check_open()
        ready = self._ready[kind]
        deadline = self._deadline()
        while not ready:
            self._top_up(kind)  # requests of other kinds that finish make room for this kind
            self._pump(deadline)
        result = ready.popleft()
        if isinstance(result, _Failure):
            # batches asked for before this error was seen would likely repeat it (an empty buffer that is being
            # filled, ...): drop them, so that the next call asks afresh
            for rid, (k, _slot, _w) in self._pending.items():
                if k == kind:
                    self._stale.add(rid)
            self._ready[kind] = collections.deque(r for r in ready if not isinstance(r, _Failure))
            raise result.exception()
        self._top_up(kind)
        return result

    # ------------------------------------------------------------------ sampling
    def sample(self) -> Any:
        """One batch of the wrapped sampler's `sample()`, made by a worker."""
        return self._next_of("sample")

    def sample_flat(self) -> Any:
        """One batch of the wrapped sampler's `sample_flat()`, made by a worker."""
        return self._next_of("sample_flat")

    def sample_with_metadata(self) -> Tuple[Any, Optional[Any]]:
        return self._next_of("sample_with_metadata")  # type: ignore[no-any-return]

    def sample_flat_with_metadata(self) -> Tuple[Any, Optional[Any]]:
        return self._next_of("sample_flat_with_metadata")  # type: ignore[no-any-return]

    def sample_index(self) -> Any:
        """Indices drawn by the wrapped sampler in this (the parent) process."""
        return self.sampler.sample_index()

    def manual_seed(self, seed: int) -> None:
        """Reseeds every worker (seeds derived from `seed` and the worker index) and the epoch permutations;
        batches prefetched with the old seeds are dropped."""
        self._check_open()
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise ValueError(f"seed must be a non-negative int, got {seed!r}")
        self._base_seed = int(seed)
        self._seed_state = (self._seed_state[0] + 1, self._base_seed)
        self._epoch_rng = np.random.default_rng([self._base_seed, 0x3E70C4])
        for rid, (kind, _slot, _w) in self._pending.items():
            if kind in _SAMPLE_KINDS:
                self._stale.add(rid)
        for d in self._ready.values():
            d.clear()

    def __len__(self) -> int:
        return len(self.data)

    # ------------------------------------------------------------------ epochs
    def _epoch(self, kind: str) -> Iterator[Any]:
        self._check_open()
        n = len(self.data)
        epoch_seed = int(self._epoch_rng.integers(0, 2 ** 63 - 1))
        starts = list(range(0, n, self.batch_size))
        order: Deque[int] = collections.deque()
        nxt = 0
        try:
            while nxt < len(starts) or order:
                batch: List[Tuple[str, Any]] = []
                while nxt < len(starts) and len(self._pending) + len(batch) < self.n_buffers:
                    s = starts[nxt]
                    batch.append((kind, (epoch_seed, n, s, min(n, s + self.batch_size))))
                    nxt += 1
                if batch:
                    order.extend(self._submit(batch))
                rid = order[0]
                deadline = self._deadline()
                while rid not in self._done:
                    self._pump(deadline)
                order.popleft()
                result = self._done.pop(rid)
                if isinstance(result, _Failure):
                    raise result.exception()
                yield result
        finally:  # abandoned early: drop what is still coming
            for rid in order:
                if self._done.pop(rid, None) is None and rid in self._pending:
                    self._stale.add(rid)

    def epoch_iter(self) -> Iterator[Any]:
        """One pass over the data in a random order, `batch_size` samples at a time (`get_at` in the workers),
        yielded in the order of the permutation."""
        return self._epoch("get_at")

    def epoch_iter_with_metadata(self) -> Iterator[Tuple[Any, Optional[Any]]]:
        return self._epoch("get_at_with_metadata")

    def epoch_flat_iter(self) -> Iterator[Any]:
        return self._epoch("get_flattened_at")

    def epoch_flat_iter_with_metadata(self) -> Iterator[Tuple[Any, Optional[Any]]]:
        return self._epoch("get_flattened_at_with_metadata")

    def __iter__(self) -> Iterator[Any]:
        return self.epoch_iter()


__all__ = ["MultiprocessingSampler", "SamplerWorkerError"]
