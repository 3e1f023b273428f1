"""Counters of a replay buffer, either private to one process or shared by every process that receives the buffer.

Shared state lives in a `multiprocessing` RawArray guarded by a spawn-context RLock; both travel to child
processes with the buffer when it is passed as a `Process` argument (fork or spawn). Segments of a shared buffer
are kept in the same shared memory (a table of `(start, length)` runs), so every process sees every commit.
"""
from __future__ import annotations

import contextlib
import multiprocessing as mp
from typing import Any, List, Optional, Tuple

_COUNT, _OFFSET, _NSEG, _WRITTEN, _VERSION, _HEADER = 0, 1, 2, 3, 4, 5
_NO_LOCK = contextlib.nullcontext()


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
        self._lock = ctx.RLock()
        self._max = max(1, int(max_segments))
        self._arr = ctx.RawArray("q", _HEADER + 2 * self._max)
        self._arr[_COUNT] = count
        self._arr[_OFFSET] = offset
        self._arr[_WRITTEN] = count
        self._keeps_segments = segments is not None
        self.set_segments(segments or [])

    def locked(self) -> Any:
        """The inter-process lock (re-entrant), used as a context manager."""
        return self._lock

    @property
    def count(self) -> int:
        return int(self._arr[_COUNT])

    @count.setter
    def count(self, v: int) -> None:
        self._arr[_COUNT] = v

    @property
    def offset(self) -> int:
        return int(self._arr[_OFFSET])

    @offset.setter
    def offset(self, v: int) -> None:
        self._arr[_OFFSET] = v

    @property
    def total_written(self) -> int:
        return int(self._arr[_WRITTEN])

    @total_written.setter
    def total_written(self, v: int) -> None:
        self._arr[_WRITTEN] = v

    @property
    def version(self) -> int:
        return int(self._arr[_VERSION])

    @version.setter
    def version(self, v: int) -> None:
        self._arr[_VERSION] = v

    def get_segments(self) -> Optional[List[Tuple[int, int]]]:
        if not self._keeps_segments:
            return None
        n = int(self._arr[_NSEG])
        a = self._arr
        return [(int(a[_HEADER + 2 * i]), int(a[_HEADER + 2 * i + 1])) for i in range(n)]

    def set_segments(self, runs: List[Tuple[int, int]]) -> None:
        runs = list(runs)[-self._max:]
        for i, (s, n) in enumerate(runs):
            self._arr[_HEADER + 2 * i] = s
            self._arr[_HEADER + 2 * i + 1] = n
        self._arr[_NSEG] = len(runs)
        self._arr[_VERSION] += 1

    def __getstate__(self) -> Any:
        return {"lock": self._lock, "arr": self._arr, "max": self._max, "keeps": self._keeps_segments}

    def __setstate__(self, st: Any) -> None:
        self._lock, self._arr, self._max, self._keeps_segments = st["lock"], st["arr"], st["max"], st["keeps"]
