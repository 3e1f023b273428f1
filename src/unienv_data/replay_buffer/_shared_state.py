"""Counters of a replay buffer, either private to one process or shared by every process that receives the buffer.

Shared state lives in a `multiprocessing` RawArray guarded by a spawn-context lock; both travel to child
processes with the buffer when it is passed as a `Process` argument (fork or spawn). The lock is re-entrant per
thread, and the array records which process holds it: a process killed while holding it never releases it, and
whoever waits for it then raises `StorageStateError` naming that process (within `LOCK_POLL_S`) instead of waiting
forever. Segments of a shared buffer
are kept in the same shared memory (a table of `(start, length)` runs), so every process sees every commit.

A disk-backed shared buffer (`cache_path`) also persists that table at every change (`persist_shared`): the
metadata is rewritten (atomically) when segments are dropped, before their rows are overwritten, and when an
episode is committed, after its rows were written. So an episode whose `commit_segment` / `mark_segment_end`
returned survives a kill of every process, and the metadata never lists rows that hold something else. Each
process's storage keeps a private copy of its segment list, so the metadata of such a buffer says
`"shared_segments": true` and its table, not the storage's own list, counts when the directory is reopened
(`adopt_shared_segments`).
"""
from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import threading
from typing import Any, Dict, List, Optional, Tuple

from unienv_data.base.errors import StorageStateError
from unienv_data.base.files import atomic_write_json, is_durable
from unienv_data.base.processes import pid_alive
from unienv_data.base.ring import inclusive_end

from ._metadata import METADATA_FILE

_COUNT, _OFFSET, _NSEG, _WRITTEN, _VERSION, _HOLDER, _HEADER = 0, 1, 2, 3, 4, 5, 6
_NO_LOCK = contextlib.nullcontext()
#: How often (seconds) a process waiting for a shared buffer's lock checks that the process holding it still runs.
LOCK_POLL_S = 0.5


def _shared_counter(slot: int) -> Any:
    """A read-write int property kept in slot `slot` of a `SharedState`'s shared array (every process sees it)."""
    def get(self: "SharedState") -> int:
        return int(self._arr[slot])

    def put(self: "SharedState", value: int) -> None:
        self._arr[slot] = value
    return property(get, put)


class LocalState:
    """count / offset / segments of a single-process buffer."""

    shared = False

    def __init__(self, count: int, offset: int, segments: Optional[List[Tuple[int, int]]]) -> None:
        self.count = count
        self.offset = offset
        self.total_written = count
        self.version = 0
        self._segments = None if segments is None else list(segments)

    def locked(self) -> Any:
        """A no-op context (a single process needs no lock)."""
        return _NO_LOCK

    def get_segments(self) -> Optional[List[Tuple[int, int]]]:
        return None if self._segments is None else list(self._segments)

    def set_segments(self, runs: List[Tuple[int, int]]) -> None:
        self._segments = list(runs)
        self.version += 1


class SharedState:
    """count / offset / segments in shared memory, under one inter-process lock."""

    shared = True

    def __init__(self, count: int, offset: int, segments: Optional[List[Tuple[int, int]]], max_segments: int) -> None:
        ctx = mp.get_context("spawn")
        self._lock = ctx.Lock()
        self._held = threading.local()
        self._max = max(1, int(max_segments))
        self._arr = ctx.RawArray("q", _HEADER + 2 * self._max)
        self._arr[_COUNT] = count
        self._arr[_OFFSET] = offset
        self._arr[_WRITTEN] = count
        self._keeps_segments = segments is not None
        self.set_segments(segments or [])

    def locked(self) -> Any:
        """The inter-process lock (re-entrant per thread), used as a context manager.

        Raises:
            StorageStateError: the process holding it died (it can never be released; see the module docstring).
        """
        return self

    def __enter__(self) -> "SharedState":
        held = self._held
        depth = getattr(held, "depth", 0)
        if depth:
            held.depth = depth + 1
            return self
        lock = self._lock
        while not lock.acquire(timeout=LOCK_POLL_S):
            holder = int(self._arr[_HOLDER])
            if holder and holder != os.getpid() and not pid_alive(holder):
                raise StorageStateError(
                    f"process {holder} was killed while it held the lock of this shared replay buffer (inside a "
                    "commit, extend or dumps), so no process can take it again: stop the processes using the buffer "
                    "and reopen its directory (ReplayBuffer.load_from), which keeps every episode committed before")
        self._arr[_HOLDER] = os.getpid()
        held.depth = 1
        return self

    def __exit__(self, *exc: Any) -> None:
        held = self._held
        held.depth -= 1
        if not held.depth:
            self._arr[_HOLDER] = 0
            self._lock.release()

    count: int = _shared_counter(_COUNT)
    offset: int = _shared_counter(_OFFSET)
    total_written: int = _shared_counter(_WRITTEN)
    version: int = _shared_counter(_VERSION)

    def get_segments(self) -> Optional[List[Tuple[int, int]]]:
        if not self._keeps_segments:
            return None
        n = int(self._arr[_NSEG])
        a = self._arr
        return [(int(a[_HEADER + 2 * i]), int(a[_HEADER + 2 * i + 1])) for i in range(n)]

    def set_segments(self, runs: List[Tuple[int, int]]) -> None:
        runs = list(runs)
        if len(runs) > self._max:      # a ring never holds more segments than rows; a growable table is bounded
            raise StorageStateError(f"this shared buffer's segment table holds at most {self._max} episodes and "
                                    f"{len(runs)} were recorded; reopen the directory (ReplayBuffer.load_from) with "
                                    "room for more, or give the buffer a fixed capacity")
        for i, (s, n) in enumerate(runs):
            self._arr[_HEADER + 2 * i] = s
            self._arr[_HEADER + 2 * i + 1] = n
        self._arr[_NSEG] = len(runs)
        self._arr[_VERSION] += 1

    def __getstate__(self) -> Any:
        return {"lock": self._lock, "arr": self._arr, "max": self._max, "keeps": self._keeps_segments}

    def __setstate__(self, st: Any) -> None:
        self._lock, self._arr, self._max, self._keeps_segments = st["lock"], st["arr"], st["max"], st["keeps"]
        self._held = threading.local()


def persist_shared(buffer: Any, drop: Optional[Tuple[int, int]] = None, hidden: int = 0) -> None:
    """Rewrites the metadata of a disk-backed `multiprocessing=True` buffer now (called under its lock after its
    shared segment table changed, or with `drop=(start, n)` before rows `[start, start + n)` are overwritten: the
    segments they belong to are left out); with durable commit points the storage's rows are flushed first.

    `hidden`: the newest rows of the (already advanced) count that are about to be written, left out of the
    persisted count. A commit that overwrites rows of a full ring writes them child by child (the state, then the
    camera, ...); until its commit record (the metadata written after every child's rows) they must not be visible,
    or a killed collector leaves rows mixing its episode's state with an old episode's camera frame."""
    if not (buffer.multiprocessing and buffer.cache_path is not None and buffer._own_segments):
        return
    st = buffer._st()
    if not st.is_mutable or st.cache_filename is None:
        return
    log = buffer._log()
    if drop is not None:
        log.drop_overlapping(*drop)
        if not log.version and not hidden:
            return      # no listed segment holds those rows and no visible row is overwritten: the disk stays true
    if is_durable():
        st.flush()
    meta = buffer._metadata()
    if drop is not None:
        cap = st.capacity
        meta[buffer._segments_key()] = [[s, inclusive_end(s, n, cap)] for s, n in log.runs()]
    if hidden:
        meta["count"] = max(int(meta["count"]) - hidden, 0)
    atomic_write_json(os.path.join(os.fspath(buffer.cache_path), METADATA_FILE), buffer._meta_for_file(meta))


def adopt_shared_segments(buffer: Any, meta: Dict[str, Any], runs: Optional[List[Tuple[int, int]]],
                          read_only: bool) -> None:
    """Reopening (in one process) a directory written by a shared buffer: its metadata's segment table, persisted
    at every commit, replaces the storage's own list (which no process kept complete); a writable reopen writes
    the adopted list back at once (`dumps()`), so the storage's list is the authority again."""
    if not meta.get("shared_segments") or runs is None or buffer.multiprocessing:
        return
    st = buffer._st()
    if st.episode_segments() is None:
        return          # the buffer keeps its own list: it was built from the metadata already
    cap = st.capacity
    st.forget_segments(0, cap if cap is not None else max(len(st), 1))
    for s, n in runs:
        st._record_segment(s, n)
    if not read_only and buffer.cache_path is not None:
        buffer.dumps()
