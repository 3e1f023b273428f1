"""Ring arithmetic: where rows live in a fixed-capacity ring (or a growable array), and what is left of a run of
rows when some of them are overwritten.

Every fact about the ring lives here once, and the replay buffer, the segment logs and the storages use it:

- Logical row `i` (0 = oldest) of a ring holding `count` rows from physical row `offset` is physical row
  `(offset + i) % capacity`; the tail (the next row to write) is `(offset + count) % capacity`.
- Writing `n <= capacity` rows at the tail of a full (or filling) ring pushes the oldest `count + n - capacity`
  rows out (the *outflow*): the offset moves past them and the count stops at the capacity.
- A *run* is `(start, length)`: `length` consecutive physical rows from `start`, wrapping past the end of the
  ring (its inclusive end is then smaller than its start). On a growable storage (`capacity is None`) runs never
  wrap and `offset` is always 0.
- Overwriting rows *clips* every run that holds them: what survives of a run are the rows not overwritten, in
  one or two runs (unienv 0.0.1b16's rule: the oldest episode of a ring that wrapped keeps its newest rows).
"""
from __future__ import annotations

from bisect import bisect_left
from typing import Iterable, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

Run = Tuple[int, int]


def physical_row(offset: int, logical: int, capacity: Optional[int]) -> int:
    """The physical row of logical row `logical` (0 = oldest)."""
    return logical if capacity is None else (offset + logical) % capacity


def tail_row(offset: int, count: int, capacity: Optional[int]) -> int:
    """The physical row the next write at the tail goes to."""
    return count if capacity is None else (offset + count) % capacity


def logical_row(offset: int, physical: int, capacity: Optional[int]) -> int:
    """The logical row (0 = oldest) held at physical row `physical`."""
    return physical if capacity is None else (physical - offset) % capacity


def run_length(start: int, end: int, capacity: Optional[int]) -> int:
    """Rows in the run with inclusive physical end `end` (smaller than `start` when it wraps)."""
    return end - start + 1 if capacity is None else (end - start) % capacity + 1


def inclusive_end(start: int, length: int, capacity: Optional[int]) -> int:
    """The inclusive physical end of the run `(start, length)`."""
    return start + length - 1 if capacity is None else (start + length - 1) % capacity


def runs_of_pairs(pairs: Iterable[Tuple[int, int]], capacity: Optional[int]) -> List[Run]:
    """`(start, length)` of each inclusive `(start, end)` pair."""
    return [(s, run_length(s, e, capacity)) for s, e in pairs]


def ring_rows(start: int, length: int, capacity: Optional[int]) -> np.ndarray:
    """The physical rows of the run `(start, length)`, in write order, as int64."""
    rows = np.arange(start, start + length, dtype=np.int64)
    return rows if capacity is None else rows % capacity


def ring_index(start: int, length: int, capacity: Optional[int]) -> "slice | np.ndarray":
    """An index for writing the run `(start, length)`: a slice when it does not wrap, else its rows."""
    if capacity is None or start + length <= capacity:
        return slice(start, start + length)
    return ring_rows(start, length, capacity)


def ring_intervals(start: int, length: int, capacity: Optional[int]) -> List[Tuple[int, int]]:
    """Half-open physical intervals the run covers, in write order (two when it wraps)."""
    if length <= 0:
        return []
    if capacity is None or start + length <= capacity:
        return [(start, start + length)]
    return [(start, capacity), (0, start + length - capacity)]


def runs_overlap(a: Run, b: Run, capacity: Optional[int]) -> bool:
    """True when runs `a` and `b` share a physical row."""
    (s1, n1), (s2, n2) = a, b
    if n1 <= 0 or n2 <= 0:
        return False
    if capacity is None or (s1 + n1 <= capacity and s2 + n2 <= capacity):
        return s1 < s2 + n2 and s2 < s1 + n1        # neither wraps (the common case): one interval each
    for s1, e1 in ring_intervals(a[0], a[1], capacity):
        for s2, e2 in ring_intervals(b[0], b[1], capacity):
            if s1 < e2 and s2 < e1:
                return True
    return False


def overlapping_sorted(runs: Sequence[Run], start: int, length: int, capacity: Optional[int]) -> List[Run]:
    """The runs of `runs` (runs sharing no row, sorted by start) that share a physical row with the run
    `(start, length)`, in position order; O(log n) plus the runs found.

    Runs sharing no row are ordered by their ends too, and at most one of them, the last, wraps the ring: bisection
    finds the last run starting before each interval of the query, and the runs before it overlap while they end
    after the interval's start."""
    if length <= 0 or not runs:
        return []
    found = set()
    for lo, hi in ring_intervals(start, length, capacity):
        j = bisect_left(runs, (hi,)) - 1
        while j >= 0 and runs[j][0] + runs[j][1] > lo:
            found.add(j)
            j -= 1
        if capacity is not None:        # the head piece `[0, end)` of the one run that wraps
            s, n = runs[-1]
            if s + n > capacity and lo < s + n - capacity:
                found.add(len(runs) - 1)
    return [runs[j] for j in sorted(found)]


def next_start_distance(runs: Sequence[Run], row: int, capacity: Optional[int]) -> int:
    """Rows from physical `row` to the nearest start of a run of `runs` (sorted by start) at or after it, following
    the ring past its end; `1 << 62` when there is none ahead."""
    if not runs:
        return 1 << 62
    i = bisect_left(runs, (row,))
    if i < len(runs):
        return runs[i][0] - row
    return 1 << 62 if capacity is None else runs[0][0] + capacity - row


def subtract_run(run: Run, victim: Run, capacity: Optional[int]) -> List[Run]:
    """What is left of `run` once the rows of `victim` are overwritten: zero, one or two runs, in write order
    (pieces that continue each other across the end of the ring are joined back into one run)."""
    pieces: List[Tuple[int, int]] = []
    cut = ring_intervals(victim[0], victim[1], capacity)
    for lo, hi in ring_intervals(run[0], run[1], capacity):
        current = [(lo, hi)]
        for vlo, vhi in cut:
            nxt = []
            for x, y in current:
                if vhi <= x or vlo >= y:
                    nxt.append((x, y))
                    continue
                if x < vlo:
                    nxt.append((x, vlo))
                if vhi < y:
                    nxt.append((vhi, y))
            current = nxt
        pieces.extend(current)
    out: List[Run] = []
    for x, y in pieces:
        if out:
            ps, pn = out[-1]
            if tail_row(ps, pn, capacity) == x and (capacity is None or pn + (y - x) <= capacity):
                out[-1] = (ps, pn + y - x)
                continue
        out.append((x, y - x))
    return out


def clip_runs(runs: Iterable[Run], victim: Run, capacity: Optional[int]) -> List[Run]:
    """`runs` with the rows of `victim` cut out of every run (order kept; runs left empty disappear)."""
    out: List[Run] = []
    for r in runs:
        if runs_overlap(r, victim, capacity):
            out.extend(subtract_run(r, victim, capacity))
        else:
            out.append(r)
    return out


class TailWrite(NamedTuple):
    """Where `n` rows written at the tail go, and the ring's counters afterwards."""
    start: int          #: physical row of the first written row
    held: int           #: rows held afterwards (the new count)
    offset: int         #: physical row of the oldest row afterwards
    outflow: Run        #: the run of old rows pushed out (length 0 when none)


def tail_write(count: int, offset: int, n: int, capacity: Optional[int]) -> TailWrite:
    """Placement of `n` rows (`n <= capacity`) written at the tail of a ring holding `count` rows from `offset`."""
    if capacity is None:
        return TailWrite(count, count + n, 0, (0, 0))
    if n > capacity:
        raise ValueError(f"{n} rows do not fit in a ring of capacity {capacity}; write the last {capacity} rows")
    start = (offset + count) % capacity
    out = max(0, count + n - capacity)
    return TailWrite(start, min(count + n, capacity), (offset + out) % capacity, (offset, out))


def logical_ranges(runs: Iterable[Run], offset: int, count: int, capacity: Optional[int]) -> List[Tuple[int, int]]:
    """Logical half-open `(start, end)` ranges of physical runs, limited to the `count` rows held, sorted.

    A run whose rows are not logically contiguous (only possible when it straddles the ring's oldest row) gives
    one range per logically contiguous piece."""
    out: List[Tuple[int, int]] = []
    for s, n in runs:
        if n <= 0:
            continue
        if capacity is None:
            if s < count:
                out.append((s, min(s + n, count)))
            continue
        pieces = []
        for lo, hi in ring_intervals(s, n, capacity):
            # physical [lo, hi) split at `offset`: rows at or after it are logical row - offset, rows before it
            # are logical row + capacity - offset
            a, b = max(lo, offset), hi
            if a < b:
                pieces.append((a - offset, b - offset))
            a, b = lo, min(hi, offset)
            if a < b:
                pieces.append((a + capacity - offset, b + capacity - offset))
        pieces = sorted((a, min(b, count)) for a, b in pieces if a < count)
        merged: List[Tuple[int, int]] = []
        for a, b in pieces:
            if merged and merged[-1][1] == a:
                merged[-1] = (merged[-1][0], b)
            else:
                merged.append((a, b))
        out.extend(merged)
    return sorted(out)


def run_inside(run: Run, offset: int, count: int, capacity: Optional[int]) -> bool:
    """True when every row of `run` is among the `count` rows held from `offset`."""
    if run[1] <= 0:
        return True
    if capacity is None:
        return 0 <= run[0] and run[0] + run[1] <= count
    return (run[0] - offset) % capacity + run[1] <= count


def runs_not_inside_sorted(runs: Sequence[Run], offset: int, count: int, capacity: Optional[int]) -> List[Run]:
    """The runs of `runs` (sharing no row, sorted by start) not wholly among the `count` rows held from `offset`, in
    O(log n) plus the runs found: a run not wholly in the window holds a row of the rows outside it, or (a full ring)
    the window's newest and oldest rows; the few runs found there are checked with `run_inside`."""
    if not runs:
        return []
    if count <= 0:
        return [r for r in runs if r[1] > 0]
    if capacity is None:
        last = runs[-1][0] + runs[-1][1]
        found = overlapping_sorted(runs, count, last - count, None) if last > count else []
    elif count < capacity:
        found = overlapping_sorted(runs, (offset + count) % capacity, capacity - count, capacity)
    else:
        found = overlapping_sorted(runs, (offset - 1) % capacity, 2, capacity)
    return [r for r in found if not run_inside(r, offset, count, capacity)]


def window_before_overwrite(offset: int, count: int, victim: Run, capacity: Optional[int],
                            whole: Iterable[Run] = (), slack: int = 0, *, presorted: bool = False) -> Tuple[int, int]:
    """The part of a committed window (`count` rows from `offset`) that stays intact while the rows of `victim`
    are overwritten, as a new `(offset, count)`; the window itself when `victim` misses it.

    A ring gives up its oldest rows, through the newest victim row in the window (tail writes replace the oldest
    rows, so the newest rows survive), then through the end of every run of `whole` the cut reaches (such a run
    is lost as a whole once any of its rows is), then up to `slack` more rows that belong to no run of `whole`
    (so that the next writes at the tail fall in rows already given up). A growable array (offset 0) keeps its
    rows before the victim's first one and before every run of `whole` that reaches it.

    `whole` holds runs sharing no row; `presorted`: they are sorted by start already (else they are sorted here).
    Only the runs holding the cut are looked at (bisection), so the cost does not grow with their number."""
    if count <= 0 or victim[1] <= 0:
        return offset, count
    runs: Sequence[Run] = whole if presorted and isinstance(whole, (list, tuple)) else sorted(whole)
    if capacity is None:
        new = min(count, victim[0])
        if new == count:
            return 0, count         # a victim past the window changes nothing
        holder = overlapping_sorted(runs, new, 1, None)
        if holder and holder[0][0] < new:
            new = holder[0][0]      # the run holding the cut row is lost whole: keep the rows before it
        return 0, new
    hit = logical_ranges([victim], offset, count, capacity)
    if not hit:
        return offset, count
    cut = max(b for _a, b in hit)
    while cut < count:              # the run holding the cut row and the row before it is lost whole
        holder = overlapping_sorted(runs, (offset + cut) % capacity, 1, capacity)
        ends = [b for a, b in logical_ranges(holder, offset, count, capacity) if a < cut < b]
        if not ends:
            break
        cut = max(ends)
    if cut < count and slack > 0:
        # up to the next run start at or after the cut (the nearest in ring order from the cut's row)
        ahead = cut + next_start_distance(runs, (offset + cut) % capacity, capacity)
        cut = min(ahead if ahead < capacity else count, count, cut + slack)
    return physical_row(offset, cut, capacity), count - cut
