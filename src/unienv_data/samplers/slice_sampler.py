"""`SliceSampler`: random windows of consecutive steps (for sequence models), never crossing an episode edge.

Anchoring policy. A window is the `window` consecutive frames `[s, s + window)`. The segments (episodes) are the
batch's `episode_segments()` partition (logical ranges, right across a ring buffer's wrap-around; frames outside every
recorded segment are grouped as `unrecorded` says, see `unienv_data.batches._segments`; a batch without segments
is one segment). By default (`partial=False`) `s` is drawn uniformly among all starts whose whole window lies in
one segment, so every fitting window is equally likely (an episode of length `L` contributes `L - window + 1`
starts; episodes shorter than `window` contribute none) and the mask is all True. With `partial=True` every frame
of every segment may start a window; frames past the segment's end are invalid (mask False) and hold the
segment's last frame (edge padding). When no window fits anywhere, `sample()` raises ValueError.

All `batch_size * window` frames are read with one batched read of the data.
"""
from __future__ import annotations

from typing import Any, Dict, Iterator, Optional, Tuple

import numpy as np

from unienv_data.base.common import BatchBase, BatchSampler
from unienv_data.batches._segments import SegmentIndex, check_unrecorded
from unienv_data.batches.slice_stacked import MASK_KEY, FrameStackedBatch
from unienv_data.batches.sub_indexed import SubIndexedBatch
from unienv_interface.space.space_utils import batch_utils, flatten_utils


class SliceSampler(BatchSampler[Any, Any, Any, Any, Any, Any, Any, Any, Any, Any]):
    """Draws `batch_size` windows of `window` consecutive steps from `data` (see the module docstring).

    `sample()` returns `(windows, valid_mask)`: every leaf shaped `(batch_size, window, ...)` and a
    `(batch_size, window)` boolean backend array. `sample_with_metadata()` returns `(windows, metadata)` with the
    mask under `"slice_valid_mask"` and the window starts under `"start"` (NumPy int64, logical indices).
    `include_unrecorded=False` draws only from recorded segments. `seed` seeds a NumPy generator; with `device`
    batches are moved there.
    """

    def __init__(self, data: BatchBase, batch_size: int, window: int, seed: Optional[int] = None, *,
                 partial: bool = False, unrecorded: str = "run", include_unrecorded: bool = True,
                 device: Any = None) -> None:
        if isinstance(window, bool) or not isinstance(window, (int, np.integer)) or window < 1:
            raise ValueError(f"window must be a positive int, got {window!r}")
        super().__init__(batch_utils.batch_space(data.single_space, int(window)), None, batch_size)
        self.data = data
        self.window = int(window)
        self.partial = bool(partial)
        self.unrecorded = check_unrecorded(unrecorded)
        self.include_unrecorded = bool(include_unrecorded)
        self.device_out = device
        self.np_rng = np.random.default_rng(seed)
        self._frames: FrameStackedBatch[Any, Any, Any, Any, Any] = FrameStackedBatch(data, 0, self.window - 1, unrecorded=self.unrecorded, deduplicate=False)
        self._table_for: Optional[SegmentIndex] = None
        self._table_cache: Tuple[np.ndarray, np.ndarray, np.ndarray, int] = (
            np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64), 0)

    def manual_seed(self, seed: int) -> None:
        self.np_rng = np.random.default_rng(seed)

    # ------------------------------------------------------------------ anchors
    def _starts_table(self, seg: SegmentIndex) -> Tuple[np.ndarray, np.ndarray]:
        """`(segment starts, number of window starts per segment)`."""
        starts, ends = seg.pieces(self.include_unrecorded)
        lengths = ends - starts
        counts = lengths if self.partial else np.maximum(lengths - self.window + 1, 0)
        return starts, counts

    def _segments(self, n: int) -> SegmentIndex:
        return self._frames.segment_index(n)

    def num_windows(self) -> int:
        """How many distinct windows can currently be drawn."""
        _, counts = self._starts_table(self._segments(len(self.data)))
        return int(counts.sum())

    def _table(self, seg: SegmentIndex) -> Tuple[np.ndarray, np.ndarray, np.ndarray, int]:
        """`(starts, counts, cumulative counts, total)`, reused while the segment partition is the same object."""
        if self._table_for is not seg:
            starts, counts = self._starts_table(seg)
            cum = np.cumsum(counts)
            self._table_cache = (starts, counts, cum, int(cum[-1]) if cum.size else 0)
            self._table_for = seg
        return self._table_cache

    def _draw(self, seg: SegmentIndex) -> np.ndarray:
        starts, counts, cum, total = self._table(seg)
        if total == 0:
            lengths = seg.pieces(self.include_unrecorded)
            longest = int((lengths[1] - lengths[0]).max()) if lengths[0].size else 0
            raise ValueError(f"no window of {self.window} steps fits in any segment of the data (longest segment: "
                             f"{longest} steps, {seg.length} steps in all); use a shorter window or partial=True")
        r = self.np_rng.integers(0, total, size=self.batch_size)
        k = np.searchsorted(cum, r, side="right")
        return starts[k] + (r - (cum[k] - counts[k]))

    def sample_index(self) -> np.ndarray:
        """`batch_size` window starts (logical indices of the first frame)."""
        return self._draw(self._segments(len(self.data)))

    # ------------------------------------------------------------------ batches
    def _move(self, tree: Any) -> Any:
        if self.device_out is None:
            return tree
        if isinstance(tree, dict):
            return {k: self._move(v) for k, v in tree.items()}
        if isinstance(tree, tuple):
            return tuple(self._move(v) for v in tree)
        if isinstance(tree, np.ndarray):
            return tree
        return self.data.backend.to_device(tree, self.device_out)

    def _read(self, starts: np.ndarray, seg: SegmentIndex, with_metadata: bool) -> Tuple[Any, Dict[str, Any]]:
        data, meta = self._frames.read_windows(starts, with_metadata=with_metadata, length=seg.length, segments=seg,
                                               known_valid=not self.partial)
        return self._move(data), self._move(meta)

    def sample_with_metadata(self) -> Tuple[Any, Dict[str, Any]]:  # type: ignore[override]
        n = len(self.data)
        seg = self._segments(n)
        starts = self._draw(seg)
        data, meta = self._read(starts, seg, True)
        meta["start"] = starts
        return data, meta

    def sample(self) -> Tuple[Any, Any]:
        """`(windows, valid_mask)`."""
        n = len(self.data)
        seg = self._segments(n)
        data, meta = self._read(self._draw(seg), seg, False)
        return data, meta[MASK_KEY]

    def _flat(self, data: Any) -> Any:
        return flatten_utils.flatten_data(self.sampled_space, data, start_dim=1)

    def sample_flat(self) -> Any:
        """The windows of `sample()` flattened, one row per window (the mask is dropped)."""
        return self._flat(self.sample()[0])

    def sample_flat_with_metadata(self) -> Tuple[Any, Dict[str, Any]]:
        data, meta = self.sample_with_metadata()
        return self._flat(data), meta

    def all_starts(self) -> np.ndarray:
        """Every start a window can be drawn from, in order."""
        starts, counts = self._starts_table(self._segments(len(self.data)))
        if counts.sum() == 0:
            return np.zeros(0, dtype=np.int64)
        return np.concatenate([np.arange(s, s + c, dtype=np.int64) for s, c in zip(starts.tolist(), counts.tolist())
                               if c > 0])

    def dataset_view(self) -> BatchBase:
        """Every window `all_starts()` can draw, once, in order: item `j` is the window starting at
        `all_starts()[j]` (its mask, all True unless `partial=True`, is in the metadata under "slice_valid_mask").
        A snapshot of the current segments: build it again after the data grew."""
        return SubIndexedBatch(self._frames, self.all_starts())

    def epoch_iter(self) -> Iterator[Tuple[Any, Any]]:  # type: ignore[override]
        """Every drawable window once, in random order: `(windows, valid_mask)` per batch (the last may be short)."""
        n = len(self.data)
        seg = self._segments(n)
        starts = self.all_starts()
        perm = starts[self.np_rng.permutation(starts.shape[0])]
        for s in range(0, perm.shape[0], self.batch_size):
            data, meta = self._read(perm[s:s + self.batch_size], seg, False)
            yield data, meta[MASK_KEY]

    def epoch_iter_with_metadata(self) -> Iterator[Tuple[Any, Dict[str, Any]]]:  # type: ignore[override]
        n = len(self.data)
        seg = self._segments(n)
        starts = self.all_starts()
        perm = starts[self.np_rng.permutation(starts.shape[0])]
        for s in range(0, perm.shape[0], self.batch_size):
            chunk = perm[s:s + self.batch_size]
            data, meta = self._read(chunk, seg, True)
            meta["start"] = chunk
            yield data, meta

    def epoch_flat_iter(self) -> Iterator[Any]:
        for data, _ in self.epoch_iter():
            yield self._flat(data)

    def epoch_flat_iter_with_metadata(self) -> Iterator[Tuple[Any, Dict[str, Any]]]:
        for data, meta in self.epoch_iter_with_metadata():
            yield self._flat(data), meta

    def __iter__(self) -> Iterator[Tuple[Any, Any]]:  # type: ignore[override]
        return self.epoch_iter()


__all__ = ["SliceSampler"]
