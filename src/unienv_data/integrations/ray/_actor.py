"""What runs inside the buffer-service actor: a disk-backed `ReplayBuffer` opened from (or created in) a directory.

Ray-free on purpose: `service.py` wraps `BufferActor` with ``ray.remote`` at run time, as a threaded actor (several
calls at once). One lock guards every use of the buffer, so commits, adoptions and samples never interleave: a
sample always sees whole committed episodes. Commits that arrive together share one durable point (group commit,
`BufferActor._make_durable`); each returns only once its episodes are durable (`ReplayBuffer.dumps()`: data,
then metadata by atomic rename). After every durable point the actor publishes which episodes are committed in
the directory's view file (`_view`), which `LocalSampler` reads. When Ray restarts the actor after a crash it calls
``__init__`` again with the same arguments, which finds the directory's buffer and reopens it with every committed
episode.
"""
from __future__ import annotations

import os
import shutil
import threading
import time
import uuid
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from unienv_data.base.processes import pid_alive
from unienv_data.base.storage import SpaceStorage
from unienv_data.replay_buffer import ReplayBuffer
from unienv_data.replay_buffer._metadata import read_metadata
from unienv_interface.backends import NumpyComputeBackend
from unienv_interface.space import DictSpace, Space
from unienv_interface.space.space_utils.serialization_utils import json_to_space, space_to_json

from ._direct import Reservation, ReservedRows, file_targets
from ._slabs import SlabCache
from ._view import ViewWriter
from .episodes import Episode, EpisodeLayout, commit_episodes

#: How the service lays out a new buffer: "native" (a DictStorage keeping each leaf in its own dtype, images in
#: their own arrays), "flat" (one FlattenedStorage row over a memory-mapped array), or (storage class, kwargs).
StorageSpec = Union[str, Tuple[type, Dict[str, Any]]]

STORAGE_LAYOUTS = ("native", "flat")
#: Seconds a commit or reservation waits for rows a collector reserved and has not committed yet (while that
#: collector's process still runs) before it gives up with a TimeoutError.
RESERVED_WAIT_S = 120.0


def numpy_space(space_json: Dict[str, Any]) -> Space:
    """The space described by `space_json`, on the NumPy backend (what the service stores and returns)."""
    return json_to_space(space_json, NumpyComputeBackend)


def storage_args(space: Space, storage: StorageSpec) -> Tuple[type, Dict[str, Any]]:
    """`(storage class, keyword arguments)` for `ReplayBuffer.create` of `storage` (see `StorageSpec`)."""
    if isinstance(storage, str):
        if storage == "native":
            from unienv_data.storages.dict_storage import DictStorage
            from unienv_data.storages.native_layout import native_layout_kwargs

            if not isinstance(space, DictSpace):
                raise ValueError(f"storage='native' needs a DictSpace, got {type(space).__name__}; use storage='flat'")
            return DictStorage, native_layout_kwargs(space)
        if storage == "flat":
            from unienv_data.storages.flattened import FlattenedStorage
            from unienv_data.storages.numpy_memmap import NumpyMemmapStorage

            return FlattenedStorage, {"inner_storage_cls": NumpyMemmapStorage}
        raise ValueError(f"storage must be one of {STORAGE_LAYOUTS} or (storage_cls, kwargs), got {storage!r}")
    if (isinstance(storage, tuple) and len(storage) == 2 and isinstance(storage[0], type)
            and issubclass(storage[0], SpaceStorage) and isinstance(storage[1], dict)):
        return storage[0], dict(storage[1])
    raise TypeError(f"storage must be one of {STORAGE_LAYOUTS} or (SpaceStorage subclass, dict of kwargs), got "
                    f"{storage!r}")


def open_or_create(directory: str, space_json: Optional[Dict[str, Any]], storage: StorageSpec,
                   capacity: Optional[int]) -> Tuple[ReplayBuffer, bool]:
    """`(buffer, reopened)`: the writable buffer in `directory` (a given space must equal the stored one), or a new
    one laid out by `storage` when the directory holds none (then `space_json` is required)."""
    if ReplayBuffer.is_loadable_from(directory):
        if space_json is not None:      # checked before the open: another process may hold the writer lock
            stored = space_to_json(json_to_space(read_metadata(directory)["single_instance_space"],
                                                 NumpyComputeBackend))
            given = space_to_json(numpy_space(space_json))
            if stored != given:
                raise ValueError(f"the buffer in {directory} stores another space:\n  given:  {given}\n  stored: "
                                 f"{stored}")
        return ReplayBuffer.load_from(directory, backend=NumpyComputeBackend, read_only=False), True
    if os.path.isdir(directory) and os.listdir(directory):
        raise FileExistsError(f"{directory} is not empty and holds no replay buffer (no valid metadata.json); "
                              "give an empty or new directory")
    if space_json is None:
        raise ValueError(f"{directory} holds no buffer yet: pass the space to create one")
    space = numpy_space(space_json)
    storage_cls, kwargs = storage_args(space, storage)
    buffer = ReplayBuffer.create(storage_cls, space, cache_path=directory, capacity=capacity, **kwargs)
    buffer.dumps()
    return buffer, False


def _tree_index(value: Any, index: Any) -> Any:
    if isinstance(value, dict):
        return {k: _tree_index(v, index) for k, v in value.items()}
    return value[index]


def _contiguous(value: Any) -> Any:
    """Every array leaf C-contiguous: Ray hands contiguous NumPy arrays over zero-copy through the object store,
    while views (e.g. one key of a flattened group) are pickled in-band, several times slower than a copy."""
    if isinstance(value, dict):
        return {k: _contiguous(v) for k, v in value.items()}
    return np.ascontiguousarray(value) if isinstance(value, np.ndarray) else value


class BufferActor:
    """The service's state: one writable `ReplayBuffer` in `directory` (see the module docstring).

    Ray may run several calls at once on it (a threaded actor): every use of the buffer holds one lock, and commits
    share their durable points (group commit): a commit writes its episodes under the lock, then waits until a dump
    that started after its write has finished; while one call dumps, the calls queued behind it write, and the next
    dump makes all of them durable at once. Every call still returns only once its episodes are durable."""

    def __init__(self, directory: str, space_json: Optional[Dict[str, Any]], storage: StorageSpec,
                 capacity: Optional[int]) -> None:
        self.directory = os.path.abspath(directory)
        self.commits = 0
        #: dumps this incarnation ran for commits (fewer than `commits` when calls shared them)
        self.dumps = 0
        #: seconds this incarnation spent writing committed episodes, and dumping them
        self.write_s = 0.0
        self.dump_s = 0.0
        self._lock = threading.RLock()           # every use of the buffer
        self._dump_lock = threading.Lock()       # one dumper at a time; the others wait for its dump
        self._slab_lock = threading.Lock()       # the slab cache
        self._slabs: Optional[SlabCache] = None  # slabs of collectors on this node, mapped on first use
        self._rows_freed = threading.Condition(self._lock)   # a reservation was committed or cancelled
        self._pending: Dict[int, Reservation] = {}           # direct writes reserved, not committed yet
        self._tokens = 0
        #: tells reservations of this incarnation from those of an earlier one (lost with it)
        self.incarnation = uuid.uuid4().hex
        #: rows reserved by collectors that died (or gave up) before committing them; `rolled_back_rows` of them
        #: were the newest rows and left the buffer again, the others stay unlisted until the ring overwrites them
        self.abandoned_rows = 0
        self.rolled_back_rows = 0
        # reservations since the last other write, oldest first, with the buffer's (count, offset, total_written)
        # before each: an abandoned reservation at the top is rolled back
        self._advances: List[Tuple[int, Tuple[int, int, int]]] = []
        self._dead: set = set()
        self.reserve_s = 0.0
        self._direct: Optional[Tuple[bool, str]] = None
        self._sample_cache: Tuple[Any, Any] = (None, None)
        self._written = 0                        # commit calls whose rows are written ...
        self._durable = 0                        # ... and those a finished dump covered
        # An exception in an actor's constructor surfaces in Ray as a bare "actor died"; keep it and raise it from
        # every call instead, so the caller sees the ValueError / FileExistsError that says what is wrong.
        self.open_error: Optional[BaseException] = None
        try:
            self._buffer, self.reopened = open_or_create(self.directory, space_json, storage, capacity)
        except Exception as exc:
            self.open_error = exc
            return
        # The actor's group commit (`_make_durable`) is the buffer's commit point: with the buffer's own per-episode
        # durability on, every episode would rewrite the metadata files under the lock first (work the shared dump
        # repeats), stretching each write and shrinking the window in which calls share a dump.
        self._buffer.durable = False
        self.space_json = space_to_json(self._buffer.single_space)
        self.layout = EpisodeLayout(self._buffer.single_space)
        # the view local samplers read (see _view): absolute row numbers continue those of an earlier incarnation
        buffer = self._buffer
        self._view = ViewWriter(self.directory)
        tail = self._view.start(len(buffer), buffer.offset, buffer.capacity, buffer.episode_segments() or [])
        self._abs_base = tail - buffer.total_written

    @property
    def buffer(self) -> ReplayBuffer:
        """The open buffer (raises what opening it raised)."""
        if self.open_error is not None:
            raise self.open_error
        return self._buffer

    def _tail(self) -> int:
        """Absolute number of the next row written at the tail."""
        return self._abs_base + self.buffer.total_written

    def _write(self, episodes: Sequence[Episode]) -> int:
        """Writes `episodes` at the tail (announcing the rows they overwrite first), then returns their rows once a
        dump covers them. An episode the storage refuses raises after the ones before it are durable."""
        buffer = self.buffer
        error: Optional[BaseException] = None
        rows = 0
        with self._lock:
            t0 = time.perf_counter()
            self._wait_rows_free(self._tail() + sum(e.length for e in episodes))
            self._view.reserve(self._tail() + sum(e.length for e in episodes))
            self._advances, self._dead = [], set()   # reservations below these rows can no longer roll back
            try:
                rows = commit_episodes(buffer, episodes, durable=False)
            except BaseException as exc:         # the episodes before it stay committed: make them durable too
                error = exc
            self._written += 1
            ticket = self._written
            self.write_s += time.perf_counter() - t0
        self._make_durable(ticket)
        if error is not None:
            raise error
        return rows

    def _make_durable(self, ticket: int) -> None:
        """Returns once a dump that started after write `ticket` finished (running one if none did)."""
        with self._dump_lock:
            if self._durable >= ticket:
                return                           # a dump that began after this write covered it
            with self._lock:
                t0 = time.perf_counter()
                upto = self._written
                buffer = self.buffer
                buffer.dumps()                   # data, then metadata by atomic rename
                self._view.publish(self._tail(), len(buffer), buffer.capacity, buffer.episode_segments() or [])
                self.dumps += 1
                self.dump_s += time.perf_counter() - t0
            self._durable = upto

    def _wait_rows_free(self, end: int) -> None:
        """Waits (the lock held, released while waiting) until writing up to absolute row `end` overwrites no row of
        a pending reservation; reservations whose collector's process is gone are abandoned (their rows stay unlisted).
        TimeoutError after `RESERVED_WAIT_S` while such a collector still runs."""
        cap = self.buffer.capacity
        deadline: Optional[float] = None
        while cap is not None and self._pending:
            blocking = [r for r in self._pending.values() if r.abs_start < end - cap]
            if not blocking:
                return
            gone = [r for r in blocking if not pid_alive(r.pid)]
            for r in gone:
                self._abandon(r.token)
            if gone:
                continue
            now = time.monotonic()
            deadline = now + RESERVED_WAIT_S if deadline is None else deadline
            if now >= deadline:
                r = blocking[0]
                raise TimeoutError(f"rows {r.start}..{r.start + r.length - 1} are still reserved by collector pid "
                                   f"{r.pid} (not committed after {RESERVED_WAIT_S} s); the ring cannot reuse them")
            self._rows_freed.wait(min(0.25, deadline - now))

    def _abandon(self, token: int) -> None:
        """Gives up a pending reservation (lock held): its rows belong to no segment; when it is the newest advance of
        the buffer (with every reservation above it abandoned too) the buffer's tail goes back over it."""
        r = self._pending.pop(token, None)
        if r is None:
            return
        self.abandoned_rows += r.length
        self._dead.add(token)
        buffer = self.buffer
        while self._advances and self._advances[-1][0] in self._dead:
            top, (count, offset, written) = self._advances.pop()
            self._dead.discard(top)
            self.rolled_back_rows += buffer.total_written - written
            buffer.rewind(count, offset, written)
        self._rows_freed.notify_all()

    def _reap(self) -> None:
        """Abandons the reservations whose collector's process is gone (lock held)."""
        for r in [r for r in self._pending.values() if not pid_alive(r.pid)]:
            self._abandon(r.token)

    def _settled(self) -> None:
        """Makes every written commit durable before a read, so reads never show an episode a crash could lose, and
        abandons reservations of collectors that are gone."""
        if self._pending:
            with self._lock:
                self._reap()
        if self._written > self._durable:
            self._make_durable(self._written)

    # ------------------------------------------------------------------ facts
    def info(self) -> Dict[str, Any]:
        """Length, capacity, segment count, space (JSON), whether this incarnation reopened the directory, pid,
        commit calls, the dumps they shared, seconds spent writing episodes (`write_s`) and dumping (`dump_s`)."""
        _ = self.buffer
        self._settled()
        with self._lock:
            buffer = self.buffer
            segs = buffer.episode_segments()
            return {"length": len(buffer), "capacity": buffer.capacity, "directory": self.directory,
                    "segments": None if segs is None else len(segs), "space": self.space_json,
                    "reopened": self.reopened, "pid": os.getpid(), "commits": self.commits, "dumps": self.dumps,
                    "write_s": self.write_s, "dump_s": self.dump_s, "reserve_s": self.reserve_s,
                    "pending_reservations": len(self._pending), "abandoned_rows": self.abandoned_rows,
                    "rolled_back_rows": self.rolled_back_rows}

    def length(self) -> int:
        """Rows in the buffer."""
        _ = self.buffer
        self._settled()
        with self._lock:
            return len(self.buffer)

    def segments(self) -> Optional[List[Tuple[int, int]]]:
        """The buffer's logical `(start, end)` episode ranges, oldest first."""
        _ = self.buffer
        self._settled()
        with self._lock:
            return self.buffer.episode_segments()

    def read(self, start: int, stop: int) -> Any:
        """Logical rows `[start, stop)` (a copy, NumPy arrays in the space's structure)."""
        _ = self.buffer
        self._settled()
        with self._lock:
            return _contiguous(self.buffer.get_at(slice(int(start), int(stop))))

    # ------------------------------------------------------------------ writes
    def commit(self, episodes: Sequence[Tuple[Any, int]]) -> int:
        """Checks and writes `(data, length)` episodes at the tail; returns the buffer's length once they are
        durable (one dump for the call, or shared with calls that came at the same time).

        Every episode is checked (keys, shapes, dtypes, bounds) before any is written, so a refused batch changes
        nothing."""
        _ = self.buffer                          # raises what opening it raised
        checked: List[Episode] = []
        for i, (data, length) in enumerate(episodes):
            leaves, n = self.layout.check_batch(data, f"episode {i} of the commit")
            if n != int(length) or n == 0:
                raise ValueError(f"episode {i} of the commit: declared {length} steps, holds {n}")
            checked.append(Episode(self.layout.assemble(leaves), n))
        self._write(checked)
        with self._lock:
            self.commits += 1
            return len(self.buffer)

    def commit_slabs(self, items: Sequence[Tuple[str, int, int]]) -> int:
        """`commit` for episodes a collector on this node built in shared-memory slabs (`_slabs`): each item is
        ``(slab path, slab rows, episode length)``; the rows are checked like any commit and copied into the buffer
        before this returns (the collector reuses the slab afterwards)."""
        _ = self.buffer
        checked: List[Episode] = []
        with self._slab_lock:
            if self._slabs is None:
                self._slabs = SlabCache(self.layout.shapes, self.layout.dtypes)
            for i, (path, rows, length) in enumerate(items):
                data = self.layout.assemble(self._slabs.leaves(path, rows, length))
                leaves, n = self.layout.check_batch(data, f"episode {i} of the commit")
                checked.append(Episode(self.layout.assemble(leaves), n))
        self._write(checked)
        with self._lock:
            self.commits += 1
            return len(self.buffer)

    # ------------------------------------------------------------------ direct writes (see _direct)
    def direct_info(self) -> Dict[str, Any]:
        """Whether collectors on this node may write episodes into the buffer's files themselves (`supported`,
        else `why` not), the buffer `directory` and this actor's `incarnation`."""
        buffer = self.buffer
        with self._lock:
            if self._direct is None:
                storage = buffer.storage
                if storage is None or buffer.multiprocessing or storage.episode_segments() is None:
                    self._direct = (False, "the storage keeps no segment list of its own")
                else:
                    targets, why = file_targets(storage, self.layout)
                    self._direct = (targets is not None, why)
            ok, why = self._direct
        return {"supported": ok, "why": why, "directory": self.directory, "incarnation": self.incarnation}

    def reserve(self, lengths: Sequence[int], pid: int) -> Tuple[str, List[Tuple[int, int]]]:
        """Places episodes of `lengths` rows at the tail for a collector (process `pid` on this node) that writes them
        into the files itself; returns this actor's incarnation and `(token, physical start)` per episode. The segments those rows overlap are
        dropped (persistently) and the overwrite announced in the view first; nothing lists the rows until
        `commit_reserved`."""
        buffer = self.buffer
        if not self.direct_info()["supported"]:
            raise ValueError(f"direct writes are not possible into {self.directory}: {self._direct[1]}")  # type: ignore[index]
        sizes = [int(n) for n in lengths]
        cap = buffer.capacity
        if not sizes or min(sizes) < 1:
            raise ValueError(f"reserve: every episode needs at least one row, got lengths {sizes}")
        if cap is not None and sum(sizes) > cap:
            raise ValueError(f"reserve: {sum(sizes)} rows at once do not fit in the capacity {cap}")
        out: List[Tuple[int, int]] = []
        with self._lock:
            t0 = time.perf_counter()
            end = self._tail() + sum(sizes)
            self._wait_rows_free(end)
            self._view.reserve(end)
            storage = buffer.storage
            for n in sizes:
                abs_start = self._tail()
                before = (buffer.count, buffer.offset, buffer.total_written)
                writer = ReservedRows(storage, n)  # type: ignore[arg-type]
                buffer.commit_segment(writer)
                self._tokens += 1
                self._pending[self._tokens] = Reservation(self._tokens, abs_start, writer.start, n, int(pid))
                self._advances.append((self._tokens, before))
                out.append((self._tokens, writer.start))
            self.reserve_s += time.perf_counter() - t0
        return self.incarnation, out

    def commit_reserved(self, incarnation: str, tokens: Sequence[int]) -> int:
        """Records the reserved, written episodes `tokens` as segments and returns the buffer's length once they are
        durable (group commit). All or nothing: ValueError when one of them is unknown (reserved by an earlier
        incarnation of the actor, or abandoned); the others are then cancelled."""
        buffer = self.buffer
        with self._lock:
            missing = [t for t in tokens if incarnation != self.incarnation or t not in self._pending]
            if missing:
                self._cancel(incarnation, tokens)
                raise ValueError(f"commit: reservations {missing} are unknown to this incarnation of the buffer actor "
                                 "(it restarted since, or their collector was declared gone): those episodes were "
                                 "not committed")
            storage = buffer.storage
            for t in tokens:
                r = self._pending.pop(t)
                storage.record_segment(r.start, r.length)  # type: ignore[union-attr]
            if not self._pending:
                self._advances, self._dead = [], set()
            self._rows_freed.notify_all()
            self._written += 1
            ticket = self._written
        self._make_durable(ticket)
        with self._lock:
            self.commits += 1
            return len(buffer)

    def cancel_reserved(self, incarnation: str, tokens: Sequence[int]) -> None:
        """Gives up reservations (the collector failed to write them): their rows stay unlisted until overwritten."""
        with self._lock:
            self._cancel(incarnation, tokens)

    def _cancel(self, incarnation: str, tokens: Sequence[int]) -> None:
        if incarnation != self.incarnation:
            return
        for t in tokens:
            self._abandon(t)
        self._rows_freed.notify_all()

    def forget_slabs(self, paths: Sequence[str]) -> None:
        """Unmaps slabs their collector closed."""
        with self._slab_lock:
            if self._slabs is not None:
                self._slabs.forget(paths)

    def node_id(self) -> Optional[str]:
        """The Ray node this actor runs on (None outside Ray): collectors on the same node use slabs."""
        try:
            import ray

            return str(ray.get_runtime_context().get_node_id())
        except Exception:       # not inside Ray
            return None

    def adopt(self, path: str, remove: bool = False) -> Tuple[int, int]:
        """Copies every episode (segment) of the buffer directory `path` to the tail, dumps once; returns
        `(episodes, rows)`. The shard must store the same space; with `remove` its directory is deleted after the
        adopted episodes are durable here."""
        _ = self.buffer
        shard = ReplayBuffer.load_from(path, backend=NumpyComputeBackend, read_only=True)
        try:
            if space_to_json(shard.single_space) != self.space_json:
                raise ValueError(f"shard {path} stores another space than the service:\n  shard:   "
                                 f"{space_to_json(shard.single_space)}\n  service: {self.space_json}")
            segs = shard.episode_segments() or []
            episodes = []
            if segs:
                lo, hi = min(s for s, _ in segs), max(e for _, e in segs)
                rows = shard.get_at(slice(lo, hi))        # one read of the shard
                episodes = [Episode(_tree_index(rows, slice(s - lo, e - lo)), e - s) for s, e in segs]
        finally:
            shard.close()
        written = self._write(episodes)
        with self._lock:
            self.commits += 1
        if remove:
            shutil.rmtree(path, ignore_errors=True)
        return len(episodes), written

    # ------------------------------------------------------------------ reads
    def sample(self, batch_size: int, n_batches: int, seed: Optional[Sequence[int]]) -> Any:
        """`n_batches * batch_size` rows drawn uniformly (with replacement) from the whole buffer with one gather
        per array; the client cuts them into `n_batches` batches."""
        rng = np.random.default_rng(None if seed is None else list(seed))
        _ = self.buffer
        self._settled()
        with self._lock:
            index = self._draw(rng, int(batch_size) * int(n_batches))
            return _contiguous(self.buffer.get_at(index))

    def _draw(self, rng: np.random.Generator, size: int) -> np.ndarray:
        """`size` logical rows drawn uniformly from the whole committed episodes (every row when the storage keeps
        no segments): rows reserved and not committed, or of dropped episodes, are never drawn."""
        buffer = self.buffer
        n = len(buffer)
        version = (buffer.segments_version, n, buffer.offset, buffer.total_written)
        key, table = self._sample_cache
        if key != version:
            segs = buffer.episode_segments()
            table = None
            if segs is not None and segs != [(0, n)]:
                starts = np.asarray([s for s, _ in segs], dtype=np.int64)
                lengths = np.asarray([e - s for s, e in segs], dtype=np.int64)
                table = (starts, lengths, np.cumsum(lengths))
            self._sample_cache = (version, table)
        total = n if table is None else (int(table[2][-1]) if table[2].size else 0)
        if total == 0:
            raise ValueError("sample: the buffer holds no committed episode; commit an episode first")
        if table is None:
            return rng.integers(0, n, size=size, dtype=np.int64)
        starts, lengths, cum = table
        u = rng.integers(0, total, size=size, dtype=np.int64)
        seg = np.searchsorted(cum, u, side="right")
        return starts[seg] + u - (cum[seg] - lengths[seg])  # type: ignore[no-any-return]

    def flush(self) -> None:
        """Dumps the buffer (every commit already did)."""
        with self._lock:
            self.buffer.dumps()

    def close(self) -> int:
        """Dumps and closes the buffer; returns its final length. The actor is useless afterwards."""
        with self._lock:
            n = len(self.buffer)
            self.buffer.dumps()
            self.buffer.close()
            self._view.close()
            return n
