"""Segment (episode) bookkeeping on a ring of physical rows, shared by every storage that records segments.

A segment is a run of `length` consecutive physical rows starting at `start`; on a fixed-capacity ring it may
wrap past the end (then its inclusive end is smaller than its start). Recording a segment, or overwriting rows,
clips every older segment holding those rows to its rows that were not overwritten (the ring arithmetic lives in
`ring.py`), so the log only ever describes rows that hold what it says, and the oldest episode of a ring that
wrapped keeps its newest rows, as in unienv 0.0.1b16.
"""
from __future__ import annotations

from bisect import bisect_left
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

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


#: one op of a segment log's journal (`SegmentLog.ops_since`): `("add", s, n)`, `("cut", s, n)`, `("back", s, n, i)`
Op = Tuple[Any, ...]
#: changes of what is persisted a segment log remembers (an owner further behind persists the whole list)
_JOURNAL_LENGTH = 256


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
        #: the number of changes of what is persisted (`to_json`) so far; `_journal` says what the latest were
        self.pstate = 0
        #: `(pstate after, op)` of the latest changes of what is persisted, oldest first: `op` replays the change on
        #: the list persisted before it (`apply_op`), or is None when it cannot (see `ops_since`)
        self._journal: List[Tuple[int, Optional[Op]]] = []
        #: the run an open append-built segment is overwriting row by row (clipped at every row): left out of
        #: what is persisted (`to_json`) until that segment ends, so the files never list a row about to be
        #: overwritten, and persisting once per run eaten (not once per row) is enough
        self.eaten: Optional[Tuple[int, int]] = None
        self._eaten_at = 0      # where the eaten run was last seen in `_runs` (checked before use)
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
        if "_journal" not in state:
            self.pstate, self._journal = 0, []
        self.__dict__.setdefault("_eaten_at", 0)

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

    def _holds(self, run: Tuple[int, int]) -> bool:
        """Whether `run` is one of the recorded runs (bisection)."""
        i = bisect_left(self._by_start, run)
        return i < len(self._by_start) and self._by_start[i] == run

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

    def _replace(self, victims: List[Tuple[int, int]], cut: Tuple[int, int]) -> List[Tuple[int, int]]:
        """Replaces each of `victims` (recorded runs overlapping `cut`) by what is left of it once the rows of
        `cut` are gone, in place (a run keeps its place in commit order); returns those pieces."""
        cap = self.capacity
        left: List[Tuple[int, int]] = []
        for v in victims:
            pieces = subtract_run(v, cut, cap)
            i = self._runs.index(v)
            self._runs[i:i + 1] = pieces
            self._as_lists[i:i + 1] = [list(p) for p in pieces]
            self._index_remove(v[0])
            for s, n in pieces:
                self._index_add(s, n)
            left += pieces
        return left

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
        eating = self.eaten is not None
        self._replace(self.overlapping(*new), new)
        self._runs.append(new)
        self._as_lists.append(list(new))
        self._index_add(*new)
        self.eaten = None
        self._persisted(None if eating else ("add", new[0], new[1]))
        self._changed()

    def drop_overlapping(self, start: int, length: int) -> None:
        """Cuts the rows `[start, start + length)` (about to be overwritten) out of every segment: a segment keeps
        its other rows (one or two runs) and disappears when none is left."""
        if length <= 0:
            return
        run = (int(start), int(length))
        victims = self.overlapping(*run)
        if victims:
            eating = self.eaten is not None
            self._replace(victims, run)
            self._persisted(None if eating else ("cut", run[0], run[1]))
            self._changed()

    def eat(self, row: int) -> Tuple[Optional[Tuple[int, int]], bool]:
        """Cuts physical `row` out of the run holding it: an open append-built segment is about to overwrite it.
        The rest of that run after `row` becomes the *eaten* run (`eaten`), left out of what is persisted until
        the segment ends (`stop_eating`), so the files never list a row about to be overwritten while the next
        appends cut it row by row without changing what is persisted. Returns the run that held `row` (None when
        none did) and whether it is a run this segment had not started eating (its owner persists the change)."""
        eaten = self.eaten
        if eaten is not None and row == eaten[0] and self._eat_first_row():
            return eaten, False
        hit = self.run_at(row)
        if hit is None:
            return None, False
        cap = self.capacity
        fresh = hit != eaten
        pieces = self._replace([hit], (row, 1))
        after = row + 1 if cap is None else (row + 1) % cap
        tail = next(((s, n) for s, n in pieces if s == after), None)
        head = hit[0] != row
        self.eaten = tail
        if fresh and eaten is None:     # persisted: the run's rows from `row` through its end are gone
            self._persisted(("cut", row, 1 + (tail[1] if tail is not None else 0)))
        elif fresh or head:             # an unusual path (a run left half eaten, a cut inside the eaten run)
            self._persisted(None)
        self._changed()
        return hit, fresh

    def _eat_first_row(self) -> bool:
        """`eat` of the eaten run's first row, the row every append of a segment eating a run takes next: the run
        loses its first row in place (its position in both orders stays), in O(log n) with no list rebuilt; what is
        persisted does not change (the eaten run is left out of it). False (nothing done) where the general path is
        needed: the run's next row would be row 0 of the ring (its place in position order changes)."""
        eaten = self.eaten
        if eaten is None:
            return False
        s, n = eaten
        if self.capacity is not None and s + 1 >= self.capacity and n > 1:
            return False
        i = bisect_left(self._by_start, eaten)
        if i >= len(self._by_start) or self._by_start[i] != eaten:
            return False
        j = self._eaten_index()
        if n == 1:
            del self._runs[j], self._as_lists[j], self._by_start[i], self._sorted[i]
            self.eaten = None
        else:
            rest = (s + 1, n - 1)
            self._runs[j], self._as_lists[j], self._by_start[i] = rest, [s + 1, n - 1], rest
            self._sorted[i] = (s + 1, self._sorted[i][1])
            self.eaten, self._eaten_at = rest, j
        self._changed()
        return True

    def _eaten_index(self) -> int:
        """The eaten run's place in `_runs` (where it was last seen, else looked up)."""
        j = self._eaten_at
        if not (j < len(self._runs) and self._runs[j] == self.eaten):
            j = self._runs.index(self.eaten)    # type: ignore[arg-type]
        return j

    def stop_eating(self) -> None:
        """The open append-built segment ended or was aborted: the rest of the run it was eating is persisted again,
        in its place."""
        eaten = self.eaten
        if eaten is not None and self._holds(eaten):
            self._persisted(("back", eaten[0], eaten[1], self._eaten_index()))
            self._changed()
        self.eaten = None

    def restore(self, start: int, length: int, index: int) -> None:
        """Puts back the run `(start, length)` at position `index` of the commit order (replays `stop_eating` on a
        persisted list, which lacked it); ValueError when it shares a row with a recorded run."""
        run = (int(start), int(length))
        if length <= 0 or (self.capacity is not None and length > self.capacity) or self.overlapping(*run):
            raise ValueError(f"run {list(run)} cannot be put back: it is empty, too long or shares rows")
        index = max(0, min(int(index), len(self._runs)))
        self._runs.insert(index, run)
        self._as_lists.insert(index, list(run))
        self._index_add(*run)
        self._persisted(("back", run[0], run[1], index))
        self._changed()

    def apply_op(self, op: Sequence[Any]) -> None:
        """Replays one journal op (`ops_since`) on this log: `["add", s, n]`, `["cut", s, n]` or
        `["back", s, n, index]`; ValueError for anything else."""
        kind = op[0] if isinstance(op, (list, tuple)) and op else None
        if kind == "add" and len(op) == 3:
            self.add(int(op[1]), int(op[2]))
        elif kind == "cut" and len(op) == 3:
            self.drop_overlapping(int(op[1]), int(op[2]))
        elif kind == "back" and len(op) == 4:
            self.restore(int(op[1]), int(op[2]), int(op[3]))
        else:
            raise ValueError(f"unknown segment log op {op!r}")

    def ops_since(self, pstate: int) -> Optional[List[Op]]:
        """The ops that turn the list persisted at `pstate` into the list persisted now (`[]`: unchanged), or None
        when the journal no longer holds them all or one of them cannot be replayed (then persist the whole list)."""
        if pstate == self.pstate:
            return []
        journal = self._journal
        if pstate > self.pstate or not journal or journal[0][0] > pstate + 1:
            return None
        i = bisect_left(journal, (pstate + 1,))
        ops = [op for _p, op in journal[i:]]
        return None if any(op is None for op in ops) else ops  # type: ignore[return-value]

    def _persisted(self, op: Optional[Op]) -> None:
        """What is persisted changed by `op` (None: by a change no op replays)."""
        self.pstate += 1
        self._journal.append((self.pstate, op))
        if len(self._journal) > _JOURNAL_LENGTH:
            del self._journal[:len(self._journal) - _JOURNAL_LENGTH // 2]

    def truncate(self, length: int) -> None:
        """Forgets segments reaching past row `length` (a growable storage shrank)."""
        kept = [(s, n) for s, n in self._runs if s + n <= length]
        if len(kept) != len(self._runs):
            self._runs = kept
            self._index_all()
            self._persisted(None)
            self._changed()

    def clear(self) -> None:
        if self.eaten is not None:
            self.eaten = None
            self._persisted(None)
        if self._runs:
            self._runs = []
            self._index_all()
            self._persisted(None)
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
        if self.eaten is not None and self._holds(self.eaten):
            runs.remove(list(self.eaten))
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
