"""Counters of a replay buffer, either private to one process or shared by every process that receives the buffer.

Shared state lives in a `multiprocessing` RawArray guarded by a spawn-context lock; both travel to child
processes with the buffer when it is passed as a `Process` argument (fork or spawn). The lock is re-entrant per
thread, and the array records which process holds it: a process killed while holding it never releases it, and
whoever waits for it then raises `StorageStateError` naming that process (within `LOCK_POLL_S`) instead of waiting
forever. Segments of a shared buffer
are kept in the same shared memory (a table of `(start, length)` runs), so every process sees every commit.

A disk-backed shared buffer (`cache_path`) also persists that table at every change (`_persist_shared`): the
metadata is rewritten (atomically) when segments are dropped, before their rows are overwritten, and when an
episode is committed, after its rows were written. So an episode whose `commit_segment` / `mark_segment_end`
returned survives a kill of every process, and the metadata never lists rows that hold something else. Each
process's storage keeps a private copy of its segment list, so the metadata of such a buffer says
`"shared_segments": true` and its table, not the storage's own list, counts when the directory is reopened
(`adopt_shared_segments`).

A growable shared buffer is handed to the child of an `os.fork()` as it is to a process it is pickled for
(`ReplayBuffer._hand_off`, called by `BEFORE_FORK`); the child forgets the episode its parent had open
(`AFTER_FORK_IN_CHILD`).
"""
from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import threading
import weakref
from typing import Any, Callable, Dict, List, Optional, Tuple

from unienv_data.base.errors import StorageStateError
from unienv_data.base.processes import pid_alive
from unienv_data.base.storage import SpaceStorage

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


def adopt_shared_segments(buffer: Any, st: SpaceStorage, meta: Dict[str, Any], runs: Optional[List[Tuple[int, int]]],
                          read_only: bool) -> None:
    """Reopening (in one process) a directory written by a shared buffer: its metadata's segment table, persisted
    at every commit, replaces the list of the buffer's storage `st` (which no process kept complete); a writable
    reopen writes the adopted list back at once (`dumps()`), so the storage's list is the authority again."""
    if not meta.get("shared_segments") or runs is None or buffer.multiprocessing:
        return
    if st.episode_segments() is None:
        return          # the buffer keeps its own list: it was built from the metadata already
    cap = st.capacity
    st.forget_segments(0, cap if cap is not None else max(len(st), 1))
    for s, n in runs:
        st.record_segment(s, n)
    if not read_only and buffer.cache_path is not None:
        buffer.dumps()


class ForkCallbacks:
    """Methods called around `os.fork()` in this process, held without keeping their objects alive (one
    method an object).
    A method that raises is passed over (a fork hook cannot raise)."""

    def __init__(self) -> None:
        self._calls: "weakref.WeakKeyDictionary[Any, Callable[[Any], Any]]" = weakref.WeakKeyDictionary()

    def add(self, method: Callable[[], Any]) -> None:
        """Calls the bound `method` at every fork until `discard` (of its object) or until its object is gone."""
        obj, func = getattr(method, "__self__"), getattr(method, "__func__")
        self._calls[obj] = func

    def discard(self, obj: Any) -> None:
        """Stops calling `obj`'s method."""
        self._calls.pop(obj, None)

    def __call__(self) -> None:
        for obj, func in list(self._calls.items()):
            try:
                func(obj)
            except Exception:  # noqa: BLE001 - a fork hook cannot raise
                pass


#: shared growable buffers of this process not handed to another process yet: their `_hand_off` before a fork
BEFORE_FORK = ForkCallbacks()
#: every shared buffer of this process: in a forked child, their `_drop_inherited_episode`
AFTER_FORK_IN_CHILD = ForkCallbacks()

if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=BEFORE_FORK, after_in_child=AFTER_FORK_IN_CHILD)
