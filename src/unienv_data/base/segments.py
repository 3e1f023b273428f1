"""Segment (episode) bookkeeping on a ring of physical rows, shared by every storage that records segments.

A segment is a run of `length` consecutive physical rows starting at `start`; on a fixed-capacity ring it may
wrap past the end (then its inclusive end is smaller than its start). Recording a segment, or overwriting rows,
clips every older segment holding those rows to its rows that were not overwritten (the ring arithmetic lives in
`ring.py`), so the log only ever describes rows that hold what it says, and the oldest episode of a ring that
wrapped keeps its newest rows, as in unienv 0.0.1b16.
"""
from __future__ import annotations

from bisect import bisect_left
from typing import Any, Dict, Iterable, List, Optional, Tuple

from .errors import StorageFormatError
from .ring import inclusive_end, next_start_distance, overlapping_sorted, ring_intervals, runs_overlap, subtract_run

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
    """Committed segments as `(start, length)` runs, oldest first.

    Besides the runs in commit order it keeps them sorted by physical start (recorded runs
    never share a row, so they are ordered by their ends too, and at most one, the one with the largest start, wraps
    the ring). Recording a segment or cutting rows out therefore touches only the runs it overlaps, found by
    bisection, and the position-ordered listing is kept up to date, so a commit costs the same whether the log holds
    ten episodes or a hundred thousand (`clip_runs` over the whole list is the plain model it is tested against)."""

    def __init__(self, capacity: Optional[int], runs: Iterable[Tuple[int, int]] = ()) -> None:
        self.capacity = capacity
        self._runs: List[Tuple[int, int]] = []
        self._by_start: List[Tuple[int, int]] = []    # the runs sorted by start (position order)
        self._sorted: List[Tuple[int, int]] = []      # `(start, inclusive end)` in position order (as `_by_start`)
        self._as_lists: List[List[int]] = []     # `_runs` as JSON lists (kept up to date: `to_json` copies it)
        #: bumped on every change, so owners know when their persisted copy is stale
        self.version = 0
        #: `(version before, run)` of the latest `add`: an owner that persisted the list of that version can record
        #: the change as the one added run (see `added_since`)
        self.last_add: Optional[Tuple[int, Tuple[int, int]]] = None
        #: `(version before, run)` of the latest `drop_overlapping` that changed the list (see `cut_since`)
        self.last_cut: Optional[Tuple[int, Tuple[int, int]]] = None
        #: the run an open append-built segment is overwriting row by row (clipped at every row): left out of
        #: what is persisted (`to_json`) until that segment ends, so the files never list a row about to be
        #: overwritten, and persisting once per run eaten (not once per row) is enough
        self.eaten: Optional[Tuple[int, int]] = None
        given = [(int(s), int(n)) for s, n in runs]
        if all(n > 0 and (capacity is None or n <= capacity) for _s, n in given) and first_overlap(given, capacity) is None:
            self._runs = given          # the usual case (a stored log): no overlap to resolve, O(n log n)
            self._index_all()
        else:
            for s, n in given:
                self.add(s, n)

    def __len__(self) -> int:
        return len(self._runs)

    def __setstate__(self, state: Dict[str, Any]) -> None:
        # a log pickled before the index existed is indexed again
        self.__dict__.update(state)
        if "_by_start" not in state:
            self._index_all()
            self.last_add = self.last_cut = None

    def runs(self) -> List[Tuple[int, int]]:
        """`(start, length)` of every recorded segment, oldest first."""
        return list(self._runs)

    # ------------------------------------------------------------------ the index
    def overlapping(self, start: int, length: int) -> List[Tuple[int, int]]:
        """The recorded runs sharing a physical row with the run `(start, length)`, in position order; O(log n) plus
        the runs found."""
        return overlapping_sorted(self._by_start, int(start), int(length), self.capacity)

    def run_at(self, row: int) -> Optional[Tuple[int, int]]:
        """The recorded run holding physical row `row`, or None."""
        hit = self.overlapping(row, 1)
        return hit[0] if hit else None

    def rows_before_next_start(self, row: int) -> int:
        """Rows from physical `row` to the nearest recorded run start at or after it (following the ring past its
        end), `1 << 62` when there is none ahead."""
        return next_start_distance(self._by_start, row, self.capacity)

    def sorted_runs(self) -> List[Tuple[int, int]]:
        """`(start, length)` of every recorded segment, in position order (a copy of a list kept up to date)."""
        return list(self._by_start)

    def _index_all(self) -> None:
        """Builds the index from `_runs`."""
        self._by_start = sorted(self._runs)
        self._sorted = [(s, inclusive_end(s, n, self.capacity)) for s, n in self._by_start]
        self._as_lists = list(map(list, self._runs))

    def _index_add(self, start: int, length: int) -> None:
        i = bisect_left(self._by_start, (start,))
        self._by_start.insert(i, (start, length))
        self._sorted.insert(i, (start, inclusive_end(start, length, self.capacity)))

    def _index_remove(self, start: int) -> None:
        i = bisect_left(self._by_start, (start,))
        del self._by_start[i], self._sorted[i]

    def _replace(self, victims: List[Tuple[int, int]], cut: Tuple[int, int]) -> None:
        """Replaces each of `victims` (recorded runs overlapping `cut`) by what is left of it once the rows of
        `cut` are gone, in place (a run keeps its place in commit order)."""
        cap = self.capacity
        for v in victims:
            pieces = subtract_run(v, cut, cap)
            i = self._runs.index(v)
            self._runs[i:i + 1] = pieces
            self._as_lists[i:i + 1] = [list(p) for p in pieces]
            self._index_remove(v[0])
            for s, n in pieces:
                self._index_add(s, n)

    def _changed(self) -> None:
        self.version += 1

    # ------------------------------------------------------------------ changes
    def add(self, start: int, length: int) -> None:
        """Records a segment; older segments sharing rows with it are clipped to their other rows. Empty segments
        are ignored."""
        if length <= 0:
            return
        if self.capacity is not None and length > self.capacity:
            raise ValueError(f"a segment of {length} rows does not fit in capacity {self.capacity}")
        new = (int(start), int(length))
        self._replace(self.overlapping(*new), new)
        self._runs.append(new)
        self._as_lists.append(list(new))
        self._index_add(*new)
        self.eaten = None
        self.last_add = (self.version, new)
        self._changed()

    def added_since(self, version: int) -> Optional[Tuple[int, int]]:
        """The run recorded by `add` when the only change since `version` is that add (and no run is being
        eaten), else None: the list now is then the list of `version` with that run added as `add` does."""
        last = self.last_add
        if last is not None and last[0] == version and self.version == version + 1 and self.eaten is None:
            return last[1]
        return None

    def drop_overlapping(self, start: int, length: int) -> None:
        """Cuts the rows `[start, start + length)` (about to be overwritten) out of every segment: a segment keeps
        its other rows (one or two runs) and disappears when none is left."""
        if length <= 0:
            return
        run = (int(start), int(length))
        victims = self.overlapping(*run)
        if victims:
            self._replace(victims, run)
            self.last_cut = (self.version, run)
            self._changed()

    def cut_since(self, version: int) -> Optional[Tuple[int, int]]:
        """When the only change since `version` (with no run being eaten then) is one `drop_overlapping`, the rows
        that change removed from what is persisted (`to_json`) as one run: `drop_overlapping` of it turns the list
        persisted at `version` into the list persisted now. That is the cut itself when no run is being eaten now,
        or the cut row through the end of the run it started eating (an append-built segment eating the next
        run: `SpaceStorage._free_rows_from`). None otherwise."""
        last = self.last_cut
        if last is None or last[0] != version or self.version != version + 1:
            return None
        (start, length), eaten = last[1], self.eaten
        if eaten is None:
            return last[1]
        cap = self.capacity
        after = start + length if cap is None else (start + length) % cap
        if eaten[0] != after or length + eaten[1] > (cap if cap is not None else 1 << 62):
            return None
        return (start, length + eaten[1])

    def truncate(self, length: int) -> None:
        """Forgets segments reaching past row `length` (a growable storage shrank)."""
        kept = [(s, n) for s, n in self._runs if s + n <= length]
        if len(kept) != len(self._runs):
            self._runs = kept
            self._index_all()
            self._changed()

    def clear(self) -> None:
        self.eaten = None
        if self._runs:
            self._runs = []
            self._index_all()
            self._changed()

    def inclusive_ranges(self) -> List[Tuple[int, int]]:
        """`(start, end)` with an inclusive physical end (end < start when the segment wraps), oldest first."""
        cap = self.capacity
        return [(s, inclusive_end(s, n, cap)) for s, n in self._runs]

    def sorted_inclusive(self) -> List[Tuple[int, int]]:
        """`(start, end)` with an inclusive physical end, in position order (kept up to date: a copy of a list)."""
        return list(self._sorted)

    def to_json(self) -> List[List[int]]:
        """What is persisted: every run but the one an open append-built segment is overwriting (a new list; its
        `[start, length]` items are shared, not to be changed)."""
        runs = list(self._as_lists)
        eaten = self.eaten
        if eaten is not None:
            i = bisect_left(self._by_start, eaten)
            if i < len(self._by_start) and self._by_start[i] == eaten:
                runs.remove(list(eaten))
        return runs

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
