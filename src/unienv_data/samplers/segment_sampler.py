"""`SegmentSampler`: whole segments (episodes), uniformly over episodes or weighted by their length.

Which segments. By default the recorded segments of `data.episode_segments()` (complete episodes; logical ranges
that stay right after a ring buffer wraps). Frames outside every recorded segment (an episode whose start the ring
overwrote, an episode still being written) are left out unless `include_unrecorded=True`, which adds each maximal
run of them as one segment. A batch without segment information is one segment. Segments shorter than
`min_length` are never drawn.

Weighting. `"uniform"`: every eligible segment has probability `1 / S`. `"length"`: probability proportional to
its length (so every step is equally likely to be in the drawn episode).

Output. Episodes differ in length, so `sample()` returns them padded to a common length `L` (`max_length` when
given, else the longest drawn episode): every leaf shaped `(batch_size, L, ...)`, plus a `(batch_size, L)` mask
that is True on real steps. Steps past an episode's end repeat its last step (edge padding). An episode longer
than `max_length` is cropped to `max_length` steps (`crop`: "random" start, "start" or "end" of the episode).
`sample_list()` returns the episodes unpadded, one batch each. Every call makes one batched read of the data.
"""
from __future__ import annotations

from functools import partial
from typing import Any, Dict, Iterator, List, Optional, Tuple

import numpy as np

from unienv_data.base.common import BatchBase, BatchSampler
from unienv_data.batches import _tree
from unienv_data.batches._segments import SegmentCache

WEIGHTINGS = ("uniform", "length")
CROPS = ("random", "start", "end")


class SegmentSampler(BatchSampler[Any, Any, Any, Any, Any, Any, Any, Any, Any, Any]):
    """Draws `batch_size` segments (episodes) of `data` with replacement (see the module docstring)."""

    def __init__(self, data: BatchBase, batch_size: int, seed: Optional[int] = None, *, weighting: str = "uniform",
                 max_length: Optional[int] = None, crop: str = "random", min_length: int = 1,
                 include_unrecorded: bool = False, device: Any = None) -> None:
        if weighting not in WEIGHTINGS:
            raise ValueError(f"weighting must be one of {WEIGHTINGS}, got {weighting!r}")
        if crop not in CROPS:
            raise ValueError(f"crop must be one of {CROPS}, got {crop!r}")
        if max_length is not None and (isinstance(max_length, bool) or not isinstance(max_length, (int, np.integer))
                                       or max_length < 1):
            raise ValueError(f"max_length must be a positive int or None, got {max_length!r}")
        if isinstance(min_length, bool) or not isinstance(min_length, (int, np.integer)) or min_length < 1:
            raise ValueError(f"min_length must be a positive int, got {min_length!r}")
        super().__init__(data.single_space, None, batch_size)
        self.data = data
        self.weighting = weighting
        self.max_length = None if max_length is None else int(max_length)
        self.crop = crop
        self.min_length = int(min_length)
        self.include_unrecorded = bool(include_unrecorded)
        self.device_out = device
        self.np_rng = np.random.default_rng(seed)
        self._seg_cache = SegmentCache("run")

    def dataset_view(self) -> BatchBase:
        """Refused: whole episodes differ in length, so they are no map-style dataset of equal items."""
        raise TypeError("SegmentSampler draws whole episodes of different lengths, which a map-style dataset cannot "
                        "batch; use SliceSampler(data, batch_size, window) or WindowDataset for fixed-length windows, "
                        "or iterate SegmentSampler.sample() (e.g. through PinnedPrefetcher)")

    def manual_seed(self, seed: int) -> None:
        self.np_rng = np.random.default_rng(seed)

    def segments(self) -> Tuple[np.ndarray, np.ndarray]:
        """`(starts, ends)` of the segments that can be drawn now (logical half-open ranges)."""
        seg = self._seg_cache.get(self.data)
        starts, ends = seg.pieces(self.include_unrecorded)
        keep = (ends - starts) >= self.min_length
        return starts[keep], ends[keep]

    def probabilities(self) -> np.ndarray:
        """The probability of each segment of `segments()` being drawn."""
        starts, ends = self.segments()
        if starts.size == 0:
            return np.zeros(0)
        w = (ends - starts).astype(np.float64) if self.weighting == "length" else np.ones(starts.shape[0])
        return w / w.sum()

    def sample_segments(self) -> np.ndarray:
        """`(batch_size, 2)` int64 `[start, end)` ranges of the drawn segments, after cropping to `max_length`."""
        starts, ends = self.segments()
        S = starts.shape[0]
        if S == 0:
            raise ValueError(f"no segment of at least {self.min_length} steps to sample from "
                             f"({len(self.data)} steps in the data"
                             + ("" if self.include_unrecorded else "; unrecorded steps are left out") + ")")
        if self.weighting == "uniform":
            k = self.np_rng.integers(0, S, size=self.batch_size)
        else:
            cum = np.cumsum(ends - starts)
            k = np.searchsorted(cum, self.np_rng.integers(0, int(cum[-1]), size=self.batch_size), side="right")
        return self._crop_all(starts[k], ends[k])

    def sample_index(self) -> np.ndarray:
        """The first step of each drawn segment."""
        return self.sample_segments()[:, 0]

    def _move(self, tree: Any) -> Any:
        if self.device_out is None:
            return tree
        return _tree.map_leaves(tree, lambda x: x if isinstance(x, np.ndarray)
                                else self.data.backend.to_device(x, self.device_out))

    def _padded(self, ranges: np.ndarray, with_metadata: bool) -> Tuple[Any, Optional[Any], np.ndarray]:
        lengths = ranges[:, 1] - ranges[:, 0]
        L = self.max_length if self.max_length is not None else int(lengths.max())
        t = np.arange(L, dtype=np.int64)
        mask = t[None, :] < lengths[:, None]
        idx = ranges[:, :1] + np.minimum(t[None, :], lengths[:, None] - 1)
        flat = idx.reshape(-1)
        if with_metadata:
            data, meta = self.data.get_at_with_metadata(flat)
        else:
            data, meta = self.data.get_at(flat), None
        B = ranges.shape[0]
        data = _tree.reshape_lead(data, (B, L))
        if meta is not None:
            meta = _tree.reshape_lead(meta, (B, L))
        return data, meta, mask

    def sample(self) -> Tuple[Any, Any]:
        """`(episodes, valid_mask)`: leaves `(batch_size, L, ...)`, mask `(batch_size, L)` (backend bool)."""
        data, _, mask = self._padded(self.sample_segments(), False)
        return self._move(data), self._move(self.data.backend.from_numpy(mask, device=self.data.device))

    def sample_with_metadata(self) -> Tuple[Any, Dict[str, Any]]:  # type: ignore[override]
        """`(episodes, metadata)`: the mask under `"valid_mask"`, the `[start, end)` ranges under `"segment"`, and
        the data's own metadata (stacked like the data) under `"metadata"` when it has any."""
        ranges = self.sample_segments()
        data, meta, mask = self._padded(ranges, True)
        out: Dict[str, Any] = {"valid_mask": self._move(self.data.backend.from_numpy(mask, device=self.data.device)),
                               "segment": ranges}
        if meta is not None:
            out["metadata"] = self._move(meta)
        return self._move(data), out

    def _crop_all(self, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
        ranges = np.stack([starts, ends], axis=1).astype(np.int64)
        if self.max_length is None:
            return ranges
        long = (ranges[:, 1] - ranges[:, 0]) > self.max_length
        slack = (ranges[:, 1] - ranges[:, 0] - self.max_length)[long]
        shift = {"random": lambda: self.np_rng.integers(0, slack + 1), "start": lambda: np.zeros_like(slack),
                 "end": lambda: slack}[self.crop]()
        ranges[long, 0] += shift
        ranges[long, 1] = ranges[long, 0] + self.max_length
        return ranges

    def epoch_iter(self) -> Iterator[Tuple[Any, Any]]:  # type: ignore[override]
        """Every eligible segment once, in random order: `(episodes, valid_mask)` batches (the last may be short)."""
        starts, ends = self.segments()
        ranges = self._crop_all(starts, ends)[self.np_rng.permutation(starts.shape[0])]
        for a in range(0, ranges.shape[0], self.batch_size):
            data, _, mask = self._padded(ranges[a:a + self.batch_size], False)
            yield self._move(data), self._move(self.data.backend.from_numpy(mask, device=self.data.device))

    def __iter__(self) -> Iterator[Tuple[Any, Any]]:  # type: ignore[override]
        return self.epoch_iter()

    def sample_list(self) -> List[Any]:
        """The drawn episodes unpadded: a list of `batch_size` batches (one read for all of them)."""
        ranges = self.sample_segments()
        lengths = ranges[:, 1] - ranges[:, 0]
        flat = np.concatenate([np.arange(s, e, dtype=np.int64) for s, e in ranges.tolist()])
        data = self._move(self.data.get_at(flat))
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        return [_tree.map_leaves(data, partial(_rows_between, int(a), int(b))) for a, b in zip(offsets[:-1], offsets[1:])]


def _rows_between(a: int, b: int, leaf: Any) -> Any:
    return leaf[a:b]


__all__ = ["SegmentSampler"]
