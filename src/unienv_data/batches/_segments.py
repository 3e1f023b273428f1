"""Which frames of a batch belong together: the recorded segments (episodes) as a vectorised lookup.

A batch reports its episodes with `episode_segments()` (this project's extension; a batch of another library with
`get_segments()`) as logical half-open `(start, end)` ranges (a `ReplayBuffer` does, whatever its storage and
without `maintain_segment_metadata`, and stays right after its ring wraps), or None when it keeps no segment
information. This module turns that into a partition of `[0, len(batch))`:

* neither method, or it returns None: the whole batch is one segment;
* every recorded range is one segment, and so is an episode still being appended at a replay buffer's tail
  (for windows; it is not a complete episode, so whole-episode sampling leaves it out by default);
* frames outside every recorded range ("unrecorded": the surviving tail of an episode whose start the ring
  overwrote, rows written with `extend`, rows of an aborted episode) are grouped by `unrecorded`:
  `"run"` (default): each maximal run of consecutive unrecorded frames is one segment;
  `"single"`: each unrecorded frame is a segment of its own (windows anchored there hold only the anchor).

Recorded ranges reaching past `len(batch)` (a concurrent writer moved the ring between the two reads) are
dropped; malformed ranges (not int pairs, empty, negative, overlapping) raise ValueError.
"""
from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

import numpy as np

from unienv_data.base.segments import episode_segments_of

UNRECORDED_POLICIES = ("run", "single")


def check_unrecorded(policy: str) -> str:
    if policy not in UNRECORDED_POLICIES:
        raise ValueError(f"unrecorded must be one of {UNRECORDED_POLICIES}, got {policy!r}")
    return policy


def open_episode_rows(batch: Any, length: int) -> int:
    """How many rows at the tail of `batch` belong to an episode still being appended (0 when unknown).

    A batch may report it as `open_segment_length`; for a replay buffer (anything with `index_with_offset`
    and a `storage`) it is the storage's open append-built segment, which always ends at the buffer's tail."""
    own = getattr(batch, "open_segment_length", None)
    if isinstance(own, (int, np.integer)) and not isinstance(own, bool):
        return max(0, min(int(own), length))
    if not hasattr(batch, "index_with_offset"):
        return 0
    st = getattr(batch, "storage", None)
    if st is None or not getattr(st, "has_open_segment", False):
        return 0
    pending = getattr(st, "open_segment_length", getattr(st, "pending_segment_length", 0))
    if isinstance(pending, bool) or not isinstance(pending, (int, np.integer)):
        return 0
    return max(0, min(int(pending), length))


def _raw_segments(batch: Any) -> Optional[Any]:
    return episode_segments_of(batch)


def recorded_segments(batch: Any, length: int) -> Optional[np.ndarray]:
    """The batch's recorded segments as a sorted `(S, 2)` int64 array of `[start, end)` inside `[0, length)`,
    or None when it keeps no segment information."""
    segs = _raw_segments(batch)
    return None if segs is None else validate_segments(segs, length, type(batch).__name__)


def validate_segments(segs: Any, length: int, owner: str = "batch") -> np.ndarray:
    """`segs` (pairs of ints) as a sorted `(S, 2)` int64 array; ranges reaching past `length` are dropped."""
    try:
        arr = np.asarray(segs) if len(segs) else np.zeros((0, 2), dtype=np.int64)
    except (TypeError, ValueError):
        raise ValueError(f"{owner}.get_segments() returned {segs!r}; expected (start, end) pairs") from None
    has_bool = arr.dtype == object or (not isinstance(segs, np.ndarray) and arr.ndim == 2 and any(
        isinstance(v, (bool, np.bool_)) for pair in segs for v in pair))
    if arr.ndim != 2 or arr.shape[1] != 2 or arr.dtype.kind not in "iu" or has_bool:
        raise ValueError(f"{owner}.get_segments() must give integer (start, end) pairs; got {list(segs)[:4]!r}...")
    arr = arr.astype(np.int64, copy=False)
    s, e = arr[:, 0], arr[:, 1]
    bad = (s < 0) | (e <= s)
    if bad.any():
        j = int(np.flatnonzero(bad)[0])
        raise ValueError(f"{owner}.get_segments() returned the range ({int(s[j])}, {int(e[j])}); expected "
                         "0 <= start < end")
    arr = arr[e <= length]
    if arr.shape[0] > 1:
        if (np.diff(arr[:, 0]) < 0).any():
            arr = arr[np.argsort(arr[:, 0], kind="stable")]
        over = arr[1:, 0] < arr[:-1, 1]
        if over.any():
            j = int(np.flatnonzero(over)[0])
            raise ValueError(f"{owner}.get_segments() returned overlapping ranges ({arr[j, 0]}, {arr[j, 1]}) and "
                             f"({arr[j + 1, 0]}, {arr[j + 1, 1]})")
    return arr


UNRECORDED, RECORDED, OPEN = 0, 1, 2


class SegmentIndex:
    """The segment partition of `[0, length)` (see the module docstring), with vectorised lookups.

    `recorded`: the recorded `[start, end)` ranges (sorted, disjoint; an `(S, 2)` array or pairs) or None (no
    segment information: the whole range is one segment). `open_rows`: rows at the end that belong to an episode
    still being appended; they form one segment of their own for windows, but are not a complete episode
    (`pieces(include_unrecorded=False)` leaves them out)."""

    def __init__(self, length: int, recorded: Any, unrecorded: str = "run", open_rows: int = 0) -> None:
        n = self.length = int(length)
        self.unrecorded = check_unrecorded(unrecorded)
        self.has_segments = recorded is not None
        if recorded is None:
            rec = np.array([[0, n]] if n > 0 else np.zeros((0, 2)), dtype=np.int64).reshape(-1, 2)
        else:
            rec = np.asarray(recorded, dtype=np.int64).reshape(-1, 2)
        self.recorded = rec
        kinds_of_rec = np.full(rec.shape[0], RECORDED, dtype=np.int8)
        open_start = n - int(open_rows)
        if recorded is not None and 0 < open_rows and (rec.shape[0] == 0 or rec[-1, 1] <= open_start):
            rec = np.concatenate([rec, [[open_start, n]]]).astype(np.int64)
            kinds_of_rec = np.concatenate([kinds_of_rec, [OPEN]]).astype(np.int8)
        # full partition of [0, length): every boundary of a segment starts or ends a piece; a piece starting at
        # a segment's start is that segment (segments are disjoint), any other piece is an unrecorded run
        bounds = np.unique(np.concatenate([np.array([0, n], dtype=np.int64), rec.reshape(-1)]))
        self.starts = bounds[:-1]
        self.ends = bounds[1:]
        k = np.searchsorted(rec[:, 0], self.starts)
        kc = np.minimum(k, max(rec.shape[0] - 1, 0))
        hit = (k < rec.shape[0]) & (rec[kc, 0] == self.starts) if rec.shape[0] else np.zeros(self.starts.shape, bool)
        self.kinds = np.where(hit, kinds_of_rec[kc] if rec.shape[0] else UNRECORDED, UNRECORDED).astype(np.int8)
        self.is_recorded = self.kinds == RECORDED

    @classmethod
    def of(cls, batch: Any, length: Optional[int] = None, unrecorded: str = "run") -> "SegmentIndex":
        n = len(batch) if length is None else int(length)
        recorded = recorded_segments(batch, n)
        return cls(n, recorded, unrecorded, open_episode_rows(batch, n) if recorded is not None else 0)

    def piece_of(self, frames: np.ndarray) -> np.ndarray:
        """Position in the partition of each frame (frames must lie in `[0, length)`)."""
        return np.searchsorted(self.starts, frames, side="right") - 1

    def bounds(self, frames: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        """`(lo, hi)`: the half-open segment holding each frame (frames must lie in `[0, length)`)."""
        k = self.piece_of(frames)
        lo = self.starts[k]
        hi = self.ends[k]
        if self.unrecorded == "single" and (self.kinds == UNRECORDED).any():
            alone = self.kinds[k] == UNRECORDED
            lo = np.where(alone, frames, lo)
            hi = np.where(alone, frames + 1, hi)
        return lo, hi

    def pieces(self, include_unrecorded: bool = True) -> Tuple[np.ndarray, np.ndarray]:
        """`(starts, ends)` of every segment. `include_unrecorded=False` keeps only the recorded (complete)
        segments; otherwise unrecorded runs and the open episode are included (with the "single" policy the
        unrecorded runs are split into one-frame segments)."""
        if not include_unrecorded:
            return self.starts[self.is_recorded], self.ends[self.is_recorded]
        loose = self.kinds == UNRECORDED
        if self.unrecorded == "run" or not loose.any():
            return self.starts, self.ends
        parts_s = [self.starts[~loose]] + [np.arange(s, e, dtype=np.int64)
                                           for s, e in zip(self.starts[loose].tolist(), self.ends[loose].tolist())]
        parts_e = [self.ends[~loose]] + [np.arange(s + 1, e + 1, dtype=np.int64)
                                         for s, e in zip(self.starts[loose].tolist(), self.ends[loose].tolist())]
        st, en = np.concatenate(parts_s), np.concatenate(parts_e)
        order = np.argsort(st, kind="stable")
        return st[order], en[order]

    def partition(self) -> List[Tuple[int, int]]:
        """Every segment as a `(start, end)` pair, covering `[0, length)` ("run" grouping of unrecorded frames)."""
        return list(zip(self.starts.tolist(), self.ends.tolist()))


class SegmentCache:
    """Remembers the last `SegmentIndex` built for a batch and reuses it while the batch reports the same length,
    segments and open episode (one list comparison instead of a rebuild). A batch that offers an int
    `segments_version` (changed whenever its segments, length or ring position change) is not even asked for its
    segments while that number stays the same."""

    def __init__(self, unrecorded: str = "run") -> None:
        self.unrecorded = check_unrecorded(unrecorded)
        self._key: Any = None
        self._vkey: Any = None
        self._index: Optional[SegmentIndex] = None

    def get(self, batch: Any, length: Optional[int] = None) -> SegmentIndex:
        n = len(batch) if length is None else int(length)
        version = getattr(batch, "segments_version", None)
        if isinstance(version, (int, np.integer)) and not isinstance(version, bool):
            vkey = (id(batch), n, int(version), open_episode_rows(batch, n))
            if self._index is not None and self._vkey == vkey:
                return self._index
        else:
            vkey = None
        self._vkey = vkey
        segs = _raw_segments(batch)
        open_rows = open_episode_rows(batch, n) if segs is not None else 0
        if isinstance(segs, np.ndarray):
            segs = segs.tolist()
        elif segs is not None:
            segs = list(segs)
        key = (n, open_rows, segs)
        if self._index is not None:
            try:
                same = bool(self._key == key)
            except (TypeError, ValueError):     # elements that do not compare to one bool: rebuild
                same = False
            if same:
                return self._index
        recorded = None if segs is None else validate_segments(segs, n, type(batch).__name__)
        self._index = SegmentIndex(n, recorded, self.unrecorded, open_rows)
        self._key = key
        return self._index


__all__ = ["SegmentIndex", "SegmentCache", "recorded_segments", "open_episode_rows", "validate_segments",
           "check_unrecorded", "UNRECORDED_POLICIES"]
