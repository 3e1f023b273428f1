"""Segment (episode) bookkeeping on a ring of physical rows, shared by every storage that records segments.

A segment is a run of `length` consecutive physical rows starting at `start`; on a fixed-capacity ring it may
wrap past the end (then its inclusive end is smaller than its start). Recording a segment, or overwriting rows,
clips every older segment holding those rows to its rows that were not overwritten (the ring arithmetic lives in
`ring.py`), so the log only ever describes rows that hold what it says, and the oldest episode of a ring that
wrapped keeps its newest rows, as in unienv 0.0.1b16.
"""
from __future__ import annotations

from typing import Any, Iterable, List, Optional, Tuple

from .errors import StorageFormatError
from .ring import clip_runs, inclusive_end, ring_intervals, runs_overlap

def episode_segments_of(obj: Any) -> Optional[Any]:
    """The episodes `obj` (a storage, buffer or batch) records: its `episode_segments()` (this project's
    extension, every recorded episode), else its `get_segments()` (a batch of another library), else None."""
    fn = getattr(obj, "episode_segments", None)
    if fn is None:
        fn = getattr(obj, "get_segments", None)
    return None if fn is None else fn()


#: Whether two runs share a physical row (kept under its old name for callers of this module).
ring_positions_overlap = runs_overlap


def first_overlap(runs: List[Tuple[int, int]], capacity: Optional[int]) -> Optional[Tuple[int, int]]:
    """Indices `(i, j)`, `i < j`, of two runs that share a physical row, or None; O(n log n) (sorted sweep over
    the runs' intervals, a wrapping run contributing two)."""
    pieces = sorted((lo, hi, i) for i, (s, n) in enumerate(runs) if n > 0 for lo, hi in ring_intervals(s, n, capacity))
    reach, owner = -1, -1
    for lo, hi, i in pieces:
        if lo < reach and owner != i:
            return (min(owner, i), max(owner, i))
        if hi > reach:
            reach, owner = hi, i
    return None


class SegmentLog:
    """Committed segments as `(start, length)` runs, oldest first."""

    def __init__(self, capacity: Optional[int], runs: Iterable[Tuple[int, int]] = ()) -> None:
        self.capacity = capacity
        self._runs: List[Tuple[int, int]] = []
        #: bumped on every change, so owners know when their persisted copy is stale
        self.version = 0
        #: the run an open append-built segment is overwriting row by row (clipped at every row): left out of
        #: what is persisted (`to_json`) until that segment ends, so the files never list a row about to be
        #: overwritten, and persisting once per run eaten (not once per row) is enough
        self.eaten: Optional[Tuple[int, int]] = None
        given = [(int(s), int(n)) for s, n in runs]
        if all(n > 0 and (capacity is None or n <= capacity) for _s, n in given) and first_overlap(given, capacity) is None:
            self._runs = given          # the usual case (a stored log): no overlap to resolve, O(n log n)
        else:
            for s, n in given:
                self.add(s, n)

    def __len__(self) -> int:
        return len(self._runs)

    def runs(self) -> List[Tuple[int, int]]:
        """`(start, length)` of every recorded segment, oldest first."""
        return list(self._runs)

    def add(self, start: int, length: int) -> None:
        """Records a segment; older segments sharing rows with it are clipped to their other rows. Empty segments
        are ignored."""
        if length <= 0:
            return
        if self.capacity is not None and length > self.capacity:
            raise ValueError(f"a segment of {length} rows does not fit in capacity {self.capacity}")
        new = (int(start), int(length))
        self._runs = clip_runs(self._runs, new, self.capacity)
        self._runs.append(new)
        self.eaten = None
        self.version += 1

    def drop_overlapping(self, start: int, length: int) -> None:
        """Cuts the rows `[start, start + length)` (about to be overwritten) out of every segment: a segment keeps
        its other rows (one or two runs) and disappears when none is left."""
        if length <= 0:
            return
        run = (int(start), int(length))
        if any(runs_overlap(r, run, self.capacity) for r in self._runs):
            self._runs = clip_runs(self._runs, run, self.capacity)
            self.version += 1

    def truncate(self, length: int) -> None:
        """Forgets segments reaching past row `length` (a growable storage shrank)."""
        kept = [(s, n) for s, n in self._runs if s + n <= length]
        if len(kept) != len(self._runs):
            self._runs = kept
            self.version += 1

    def clear(self) -> None:
        self.eaten = None
        if self._runs:
            self._runs = []
            self.version += 1

    def inclusive_ranges(self) -> List[Tuple[int, int]]:
        """`(start, end)` with an inclusive physical end (end < start when the segment wraps), oldest first."""
        cap = self.capacity
        return [(s, inclusive_end(s, n, cap)) for s, n in self._runs]

    def to_json(self) -> List[List[int]]:
        """What is persisted: every run but the one an open append-built segment is overwriting."""
        return [[s, n] for s, n in self._runs if (s, n) != self.eaten]

    @classmethod
    def from_json(cls, data: Any, capacity: Optional[int], length: int, where: str) -> "SegmentLog":
        """Validates stored runs against the capacity / length; StorageFormatError names the bad entry."""
        if not isinstance(data, list):
            raise StorageFormatError(f"{where}: 'segments' must be a list of [start, length] pairs, got {type(data).__name__}")
        runs = []
        start_limit = max(capacity if capacity is not None else length, 1)
        for i, item in enumerate(data):
            # JSON gives exact types: `type(v) is int` keeps ints and refuses bools, floats and strings
            if type(item) is list and len(item) == 2:
                s, n = item
                if (type(s) is int and type(n) is int and 0 <= s < start_limit
                        and 0 < n <= (capacity if capacity is not None else length - s)):
                    runs.append((s, n))
                    continue
            raise StorageFormatError(f"{where}: segment entry {i} = {item!r} is not a valid [start, length] pair "
                                     f"for {'capacity ' + str(capacity) if capacity is not None else 'length ' + str(length)}")
        clash = first_overlap(runs, capacity)
        if clash is not None:
            i, j = clash
            raise StorageFormatError(f"{where}: segment entries {i} = {list(runs[i])} and {j} = {list(runs[j])} share "
                                     "rows (a segment log never holds overlapping segments): the metadata is damaged")
        return cls(capacity, runs)
