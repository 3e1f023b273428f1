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
import itertools
import multiprocessing
import multiprocessing.connection
import os
import pickle
import time
import warnings
import weakref
from typing import Any, Deque, Dict, Iterator, List, NoReturn, Optional, Sequence, Set, Tuple

import numpy as np

from unienv_data.base.closing import ClosesOnExit
from unienv_data.base.common import (BatchBase, BatchSampler, BatchT, SamplerArrayType, SamplerBatchT,
                                     SamplerDeviceType, SamplerDtypeType, SamplerRNGType)
from unienv_interface.backends.base import BArrayType, BDeviceType, BDtypeType, BRNGType

from ._mp_packing import unpack
from ._mp_pool import WorkerPool
from ._mp_slots import slot_size
from ._mp_worker import SAMPLE_KINDS


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


class MultiprocessingSampler(
    ClosesOnExit,
    BatchSampler[SamplerBatchT, SamplerArrayType, SamplerDeviceType, SamplerDtypeType, SamplerRNGType,
                 BatchT, BArrayType, BDeviceType, BDtypeType, BRNGType],
):
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
        self._ready: Dict[str, Deque[Any]] = {k: collections.deque() for k in SAMPLE_KINDS}
        self._done: Dict[int, Any] = {}                                 # finished epoch chunks
        self._stale: Set[int] = set()                                   # requests whose result is dropped
        self._specs: Dict[Tuple[int, int], Any] = {}                    # batch descriptions by (worker, id)
        self._warned_slot_size = False
        self._n_ready_workers = 0
        self._free_slots: List[int] = []
        self.slot_bytes: Optional[int] = None
        pool = WorkerPool()
        self._pool = pool
        self._finalizer = weakref.finalize(self, pool.shutdown)
        try:
            self._start(daemon, slot_bytes)
        except BaseException:
            self.close()
            raise

    def _start(self, daemon: Optional[bool], slot_bytes: Optional[int]) -> None:
        if self.shared_memory:
            self.slot_bytes = slot_size(self.sampler, slot_bytes)
            self._free_slots = list(range(self.n_buffers))
        self._pool.start(self.ctx, self.sampler, self.n_workers, self.n_buffers, self.slot_bytes, self._base_seed,
                         self.doze_time, daemon)

    # ------------------------------------------------------------------ state
    @property
    def closed(self) -> bool:
        return self._pool.closed

    def _check_open(self) -> None:
        if self._pool.closed:
            raise RuntimeError("the MultiprocessingSampler is closed")
        if os.getpid() != self._pool.owner_pid:
            raise RuntimeError("a MultiprocessingSampler can only be used by the process that created it (this is a "
                               "forked copy); create one in this process instead")

    def __getstate__(self) -> Dict[str, Any]:
        raise TypeError("a MultiprocessingSampler owns worker processes and cannot be pickled; pickle the wrapped "
                        "sampler instead")

    def close(self, timeout: float = 5.0) -> None:
        """Stops the workers (a stop message each, join for up to `timeout` s, then terminate, then kill) and frees
        the shared memory. The wrapped sampler and its data stay open. Idempotent."""
        if self._finalizer.detach() is not None:
            self._pool.shutdown(timeout)
        self._pending.clear()
        self._done.clear()
        self._stale.clear()
        for d in self._ready.values():
            d.clear()

    @property
    def worker_pids(self) -> List[Optional[int]]:
        """Process ids of the running workers (empty once closed)."""
        return [] if self._pool.closed else [p.pid for p in self._pool.procs]

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
                self._pool.conns[w].send(bundle)
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
            tag, worker, rid, body, payload = self._pool.conns[w].recv()
        except (EOFError, OSError):
            self._worker_died(w)
            return
        if tag == "ready":
            self._n_ready_workers += 1
            if self._n_ready_workers == self.n_workers:
                self._pool.unlink_slot_file()  # every worker has mapped it: the name is no longer needed
            return
        if tag == "fatal":
            self._failed_to_start(worker, body)
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
                    if slot is None or self._pool.slots is None:
                        raise RuntimeError("internal invariant violated: a slot result without a slot")
                    result = unpack(spec, self._pool.slots[slot], copy=True)
                else:
                    if slot is not None and not self._warned_slot_size:
                        self._warned_slot_size = True
                        warnings.warn(f"a {kind} batch of {len(payload)} bytes does not fit in a shared-memory slot of "
                                      f"{self.slot_bytes} bytes and goes through the pipe instead; pass a larger "
                                      "slot_bytes= to MultiprocessingSampler", RuntimeWarning, stacklevel=4)
                    result = unpack(spec, np.frombuffer(payload, dtype=np.uint8), copy=False)
        finally:
            if slot is not None:
                self._free_slots.append(slot)
        if kind in SAMPLE_KINDS:
            self._ready[kind].append(result)
        else:
            self._done[rid] = result

    def _failed_to_start(self, worker: int, body: Tuple[Optional[bytes], str]) -> NoReturn:
        text = _Failure(worker, body).text
        self.close()
        raise SamplerWorkerError(f"sampler worker {worker} failed to start", text)

    def _worker_died(self, w: Optional[int] = None) -> NoReturn:
        procs = self._pool.procs
        for c in self._pool.conns:  # a worker that failed to start said why before it exited: report that
            try:
                while c.poll():
                    tag, worker, _rid, body, _payload = c.recv()
                    if tag == "fatal":
                        self._failed_to_start(worker, body)
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
        conns = self._pool.conns
        got = False
        for w, c in enumerate(conns):
            if c.poll():
                got = True
                self._receive(w)
        if got:
            return
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        sentinels = [p.sentinel for p in self._pool.procs]
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
            if kind in SAMPLE_KINDS:
                self._stale.add(rid)
        for d in self._ready.values():
            d.clear()

    def dataset_view(self) -> BatchBase:
        """The wrapped sampler's dataset view (see `BatchSampler.dataset_view`)."""
        return self.sampler.dataset_view()

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
