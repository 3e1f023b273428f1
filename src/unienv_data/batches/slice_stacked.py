"""`SliceStackedBatch` and `FrameStackedBatch`: read-only views whose sample `i` is a window of frames around `i`.

Validity. Frame `i + o` of the window anchored at `i` is *valid* when it lies in `[0, len(batch))` and in the
same segment as the anchor `i`. Without a mask function the segments come from `batch.episode_segments()` (logical
half-open ranges, so windows stay right across a ring buffer's wrap-around); see `_segments.py` for frames that
belong to no recorded segment. With `get_valid_mask_function` its result replaces the segment test, but is still
combined (AND) with the range test: a frame outside the written range is never valid.

Filling (`fill_invalid_data=True`, the default): an invalid frame takes the value of the nearest valid frame
*between it and the anchor* (frames before the anchor take the first valid frame after them, frames after it the
last valid frame before them). When validity is contiguous around the anchor, as with segments, this is edge
padding: the episode's first / last frame repeated. The anchor frame itself is always real data. With
`fill_invalid_data=False`, an invalid frame holds the row its index clipped into `[0, len)` points to (possibly
another episode's data); only the mask tells. The mask is returned in the metadata under `"slice_valid_mask"`
(`get_at_with_metadata`), shape `(B, T)` for a batch index and `(T,)` for an int index.

Reads. One call makes ONE batched read of the underlying batch for all `B * T` frames (filled indices are
resolved before the read when the mask comes from segments). With `deduplicate=True` only the distinct frames are
read (worth it for storages that decode per row, e.g. video); the default `None` deduplicates when windows are
known to overlap heavily (a slice index with a step smaller than the window span, or more frames asked for than
the batch holds).

Chosen keys (`keys=[...]`): only those fields (keys or `"a/b"` paths, see `_columns.py`) are stacked; every other
field holds the anchor frame alone, with its shape unchanged. The read is still one batched read of all frames.

Consistency: a call reads `len(batch)`, the segments and the rows one after the other; if another process
overwrites the ring meanwhile, a window may mix old and new rows.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from unienv_data.base.common import BatchBase, BatchT
from unienv_interface.backends.base import BArrayType, BDeviceType, BDtypeType, BRNGType
from unienv_data.base.indexing import normalize_index
from unienv_interface.space import Space
from unienv_interface.space.spaces import BinarySpace, DictSpace, TupleSpace
from unienv_interface.space.space_utils import batch_utils

from . import _tree
from ._view import RowView
from ._columns import KeyPath, resolve_key
from ._segments import SegmentCache, SegmentIndex, check_unrecorded

MASK_KEY = "slice_valid_mask"

#: `fn(view, expanded_idx (B, T) backend ints clipped into [0, len), data (B, T, ...), metadata or None)` returning a
#: `(B, T)` boolean mask (backend or NumPy array).
ValidMaskFunction = Callable[["SliceStackedBatch", Any, Any, Optional[Dict[str, Any]]], Any]


def fill_positions(mask: np.ndarray, zero: int) -> np.ndarray:
    """For a `(B, T)` validity mask and the anchor column `zero`: the column each entry takes its data from
    (itself when valid, else the nearest valid column between it and the anchor; the anchor when none is)."""
    B, T = mask.shape
    pos = np.arange(T, dtype=np.int64)
    m = mask.copy()
    m[:, zero] = True
    left = np.where(m[:, :zero + 1], pos[:zero + 1], zero)
    left = np.minimum.accumulate(left[:, ::-1], axis=1)[:, ::-1]
    right = np.where(m[:, zero:], pos[zero:], zero)
    right = np.maximum.accumulate(right, axis=1)
    return np.concatenate([left[:, :zero], right], axis=1)


def _as_offsets(fixed_offset: Any, backend: Any) -> np.ndarray:
    if isinstance(fixed_offset, (list, tuple, range)):
        arr = np.asarray(list(fixed_offset))
    elif isinstance(fixed_offset, np.ndarray):
        arr = fixed_offset
    else:
        arr = np.asarray(backend.to_numpy(fixed_offset))
    if arr.ndim != 1 or arr.shape[0] == 0:
        raise ValueError(f"fixed_offset must be a non-empty 1-D sequence of ints, got shape {arr.shape}")
    if arr.dtype.kind not in "iu":
        if arr.dtype.kind == "f" and np.all(arr == np.round(arr)):
            arr = arr.astype(np.int64)
        else:
            raise ValueError(f"fixed_offset must hold integers, got dtype {arr.dtype}")
    arr = arr.astype(np.int64)
    if not np.any(arr == 0):
        raise ValueError(f"fixed_offset must contain 0 (the anchor frame), got {arr.tolist()}")
    if np.any(np.diff(arr) < 0):
        raise ValueError(f"fixed_offset must be sorted in increasing order, got {arr.tolist()}")
    return arr


def _stack_space(space: Space, paths: List[KeyPath], T: int, prefix: KeyPath = ()) -> Space:
    """`space` with the fields at `paths` batched over `T` frames and every other field unchanged."""
    if prefix in paths:
        return batch_utils.batch_space(space, T)
    if isinstance(space, DictSpace) and any(p[:len(prefix)] == prefix for p in paths):
        return DictSpace(space.backend, {k: _stack_space(s, paths, T, prefix + (k,)) for k, s in space.spaces.items()},
                         device=space.device)
    if isinstance(space, TupleSpace) and any(p[:len(prefix)] == prefix for p in paths):
        return TupleSpace(space.backend, [_stack_space(s, paths, T, prefix + (i,)) for i, s in enumerate(space.spaces)],
                          device=space.device)
    return space


def _keep_stacked(data: Any, paths: List[KeyPath], z: int, prefix: KeyPath = ()) -> Any:
    """`data` (every leaf `(B, T, ...)`) with the fields outside `paths` reduced to the anchor column `z`."""
    if prefix in paths:
        return data
    if not any(p[:len(prefix)] == prefix for p in paths):
        return _tree.select_column(data, z)
    if isinstance(data, dict):
        return {k: _keep_stacked(v, paths, z, prefix + (k,)) for k, v in data.items()}
    return tuple(_keep_stacked(v, paths, z, prefix + (i,)) for i, v in enumerate(data))


class SliceStackedBatch(RowView, BatchBase[BatchT, BArrayType, BDeviceType, BDtypeType, BRNGType]):
    """Read-only view: sample `i` stacks the frames `i + o` for every `o` in `fixed_offset` on a new axis
    (axis 1 of a batch, axis 0 of one sample); see the module docstring for validity, filling and reads.

    `fixed_offset`: sorted 1-D ints containing 0 (e.g. `[-4, -2, 0, 1]`). `get_valid_mask_function`: optional
    `fn(view, expanded_idx, data, metadata) -> (B, T) bool`. `stack_metadata`: stack the underlying metadata over
    the window too (default: the anchor frame's metadata only). `unrecorded`: "run" or "single", how frames outside
    every recorded segment are grouped. `deduplicate`: read each distinct frame once (None: automatic).
    `keys`: stack only these fields (the others hold the anchor frame); None stacks every field.

    The view never closes the batch it wraps.
    """

    is_mutable = False

    def __init__(self, batch: BatchBase, fixed_offset: Any, get_valid_mask_function: Optional[ValidMaskFunction] = None,
                 fill_invalid_data: bool = True, stack_metadata: bool = False, *, unrecorded: str = "run",
                 deduplicate: Optional[bool] = None, keys: Optional[Sequence[Any]] = None) -> None:
        if not isinstance(batch, BatchBase):
            raise TypeError(f"batch must be a BatchBase, got {type(batch).__name__}")
        offsets = _as_offsets(fixed_offset, batch.backend)
        if keys is not None:
            if isinstance(keys, (str, bytes)) or not isinstance(keys, Sequence) or not keys:
                raise TypeError(f"keys must be a non-empty list of keys to stack (e.g. ['image']), got {keys!r}")
            self.stacked_paths: Optional[List[KeyPath]] = [resolve_key(batch.single_space, k) for k in keys]
        else:
            self.stacked_paths = None
        T = int(offsets.shape[0])
        base_meta = batch.single_metadata_space
        if base_meta is not None and not isinstance(base_meta, DictSpace):
            raise TypeError(f"{type(self).__name__} adds {MASK_KEY!r} to the metadata, so the wrapped batch's metadata "
                            f"space must be a DictSpace or None, got {type(base_meta).__name__}")
        meta_fields: Dict[str, Space] = {}
        if base_meta is not None:
            if MASK_KEY in base_meta.spaces:
                raise ValueError(f"the wrapped batch's metadata already has a {MASK_KEY!r} key")
            for k, s in base_meta.spaces.items():
                meta_fields[k] = batch_utils.batch_space(s, T) if stack_metadata else s
        meta_fields[MASK_KEY] = BinarySpace(batch.backend, (T,), device=batch.device)
        stacked = (batch_utils.batch_space(batch.single_space, T) if self.stacked_paths is None
                   else _stack_space(batch.single_space, self.stacked_paths, T))
        super().__init__(stacked, DictSpace(batch.backend, meta_fields, device=batch.device))
        self.batch = batch
        self.fixed_offset = batch.backend.from_numpy(offsets, dtype=batch.backend.default_index_dtype,
                                                     device=batch.device)
        self._offsets = offsets
        self._idx_zero = int(np.flatnonzero(offsets == 0)[0])
        self._span = int(offsets[-1] - offsets[0]) + 1
        self.get_valid_mask_function = get_valid_mask_function
        self.fill_invalid_data = bool(fill_invalid_data)
        self.stack_metadata = bool(stack_metadata)
        self.unrecorded = check_unrecorded(unrecorded)
        self.deduplicate = deduplicate
        self._seg_cache = SegmentCache(self.unrecorded)

    # ------------------------------------------------------------------ basics

    @property
    def anchor_position(self) -> int:
        """Where the anchor frame (offset 0) sits on the window axis: the index of 0 in `fixed_offset`."""
        return self._idx_zero

    @property
    def window_length(self) -> int:
        """Frames per window (`len(fixed_offset)`)."""
        return int(self._offsets.shape[0])

    def expand_index(self, idx: Any) -> Any:
        """The `(B, T)` frame indices of the windows at `idx`, clipped into `[0, len)` (backend int array)."""
        n = len(self.batch)
        anchors = normalize_index(idx, n, type(self).__name__).positions()
        expanded = np.clip(anchors[:, None] + self._offsets[None, :], 0, max(n - 1, 0))
        return self.backend.from_numpy(expanded, dtype=self.backend.default_index_dtype, device=self.device)

    def segment_index(self, length: Optional[int] = None) -> SegmentIndex:
        """The current segment partition of the wrapped batch (with this view's `unrecorded` policy); `length`:
        the wrapped batch's length when the caller already knows it (saves a `len()` call)."""
        return self._seg_cache.get(self.batch, length)

    def valid_mask_at(self, idx: Any) -> np.ndarray:
        """The segment-based validity mask of the windows at `idx` as a NumPy bool array, without reading data
        (ignores `get_valid_mask_function`)."""
        n = len(self.batch)
        norm = normalize_index(idx, n, type(self).__name__)
        anchors = norm.positions()
        frames = anchors[:, None] + self._offsets[None, :]
        lo, hi = self._seg_cache.get(self.batch, n).bounds(anchors)
        mask = (frames >= lo[:, None]) & (frames < hi[:, None])
        return mask[0] if norm.single is not None else mask

    # ------------------------------------------------------------------ reads
    def get_at(self, idx: Any) -> Any:
        return self._get(idx, with_metadata=False)[0]

    def get_at_with_metadata(self, idx: Any) -> Tuple[Any, Dict[str, Any]]:
        return self._get(idx, with_metadata=True)

    def get_at_with_mask(self, idx: Any) -> Tuple[Any, Any]:
        """`(windows, valid_mask)`: the data of `get_at` and the mask of `get_at_with_metadata`, from one read."""
        data, meta = self._get(idx, with_metadata=False)
        return data, meta[MASK_KEY]

    def get_flattened_at(self, idx: Any) -> Any:
        return self.get_flattened_at_with_metadata(idx)[0]

    def get_flattened_at_with_metadata(self, idx: Any) -> Tuple[Any, Dict[str, Any]]:
        """Flat rows of the stacked windows (the flattening of this view's `single_space`) and the metadata."""
        data, meta = self._get(idx, with_metadata=True)
        return self._flatten_rows(idx, data), meta

    def _get(self, idx: Any, with_metadata: bool) -> Tuple[Any, Dict[str, Any]]:
        n = len(self.batch)
        norm = normalize_index(idx, n, type(self).__name__)
        anchors = norm.positions()
        auto_dedup = norm.slc is not None and norm.slc.step < self._span
        data, meta = self.read_windows(anchors, with_metadata=with_metadata, length=n, dedup_hint=auto_dedup)
        if norm.single is not None:
            data = _tree.take_row(data, 0)
            meta = _tree.take_row(meta, 0)
        return data, meta

    def read_windows(self, anchors: np.ndarray, *, with_metadata: bool = True, length: Optional[int] = None,
                     segments: Optional[SegmentIndex] = None, dedup_hint: bool = False,
                     known_valid: bool = False) -> Tuple[Any, Dict[str, Any]]:
        """Windows anchored at `anchors` (1-D int64 in `[0, len)`): `(data (B, T, ...), metadata)` with the mask
        under `"slice_valid_mask"`. `segments` may pass a precomputed partition; `known_valid=True` promises that
        every window lies inside one segment (samplers that only draw fitting windows skip the mask work)."""
        n = len(self.batch) if length is None else length
        anchors = np.asarray(anchors, dtype=np.int64)
        B, T, z = int(anchors.shape[0]), self.window_length, self._idx_zero
        frames = anchors[:, None] + self._offsets[None, :]
        need_meta = with_metadata and self.batch.single_metadata_space is not None
        if self.get_valid_mask_function is None:
            if known_valid:
                mask = np.ones((B, T), dtype=bool)
            else:
                seg = segments if segments is not None else self._seg_cache.get(self.batch, n)
                lo, hi = seg.bounds(anchors)
                mask = (frames >= lo[:, None]) & (frames < hi[:, None])
            if known_valid:
                read_idx = frames
            elif self.fill_invalid_data:
                read_idx = frames if mask.all() else np.take_along_axis(frames, fill_positions(mask, z), axis=1)
            else:
                read_idx = np.clip(frames, 0, n - 1)
            data, meta = self._read(read_idx, need_meta, dedup_hint)
        else:
            clipped = np.clip(frames, 0, n - 1)
            data, meta = self._read(clipped, need_meta, dedup_hint)
            expanded = self.backend.from_numpy(clipped, dtype=self.backend.default_index_dtype, device=self.device)
            user = self.get_valid_mask_function(self, expanded, data, meta)
            user_np = np.asarray(user if isinstance(user, np.ndarray) else self.backend.to_numpy(user))
            if user_np.shape != (B, T):
                raise ValueError(f"get_valid_mask_function returned shape {user_np.shape}, expected {(B, T)}")
            mask = user_np.astype(bool) & (frames >= 0) & (frames < n)
            if self.fill_invalid_data and not mask.all():
                cols = fill_positions(mask, z)
                rows = np.arange(B, dtype=np.int64)[:, None]
                data = _tree.gather_2d(data, rows, cols, self.backend)
                if meta is not None and self.stack_metadata:
                    meta = _tree.gather_2d(meta, rows, cols, self.backend)
        if self.stacked_paths is not None:
            data = _keep_stacked(data, self.stacked_paths, z)
        out_meta: Dict[str, Any] = {}
        if meta is not None:
            if not self.stack_metadata:
                meta = _tree.select_column(meta, z)
            out_meta.update(meta)
        out_meta[MASK_KEY] = self.backend.from_numpy(mask, device=self.device)
        return data, out_meta

    def _read(self, frames: np.ndarray, need_meta: bool, dedup_hint: bool) -> Tuple[Any, Optional[Any]]:
        """One batched read of the `(B, T)` rows `frames` of the wrapped batch (distinct rows only when
        deduplicating): `(B, T, ...)` data and metadata (None unless `need_meta`)."""
        flat_idx = frames.reshape(-1)
        dedup = self.deduplicate
        if dedup is None:
            dedup = dedup_hint or flat_idx.shape[0] > 2 * max(len(self.batch), 1)
        inverse = None
        if dedup and flat_idx.shape[0] > 1:
            uniq, inverse = np.unique(flat_idx, return_inverse=True)
            if uniq.shape[0] == flat_idx.shape[0]:
                inverse = None
            else:
                flat_idx = uniq
        if need_meta:
            data, meta = self.batch.get_at_with_metadata(flat_idx)
        else:
            data, meta = self.batch.get_at(flat_idx), None
        inv = None if inverse is None else inverse.reshape(-1).astype(np.int64)

        def rows(tree: Any) -> Any:
            if inv is not None:
                tree = _tree.take_rows(tree, inv, self.backend)
            return _tree.reshape_lead(tree, frames.shape)

        return rows(data), (None if meta is None else rows(meta))

    # ------------------------------------------------------------------ ready-made mask functions
    @staticmethod
    def get_valid_mask_function_with_episodeid_key(episode_id_key: Any = "episode_id",
                                                   is_in_metadata: bool = False) -> ValidMaskFunction:
        """A mask function: frames whose `episode_id_key` field equals the anchor's are valid."""
        path = _tree.normalize_nested_keys(episode_id_key)

        def fn(view: "SliceStackedBatch", expanded_idx: Any, data: Any, metadata: Optional[Dict[str, Any]]) -> Any:
            src = metadata if is_in_metadata else data
            if src is None:
                raise ValueError("the episode id is read from the metadata, but the batch has none")
            ids = np.asarray(view.backend.to_numpy(_tree.sub_data(src, path)))
            ids = ids.reshape(ids.shape[:2] + (-1,))
            return np.all(ids == ids[:, view.anchor_position:view.anchor_position + 1], axis=2)
        return fn

    @staticmethod
    def get_valid_mask_function_with_episode_end_key(episode_end_key: Any = "done",
                                                     is_in_metadata: bool = False) -> ValidMaskFunction:
        """A mask function: a frame is valid when no episode end (a true `episode_end_key` flag, set on the last
        frame of an episode) lies between it and the anchor."""
        path = _tree.normalize_nested_keys(episode_end_key)

        def fn(view: "SliceStackedBatch", expanded_idx: Any, data: Any, metadata: Optional[Dict[str, Any]]) -> Any:
            src = metadata if is_in_metadata else data
            if src is None:
                raise ValueError("the episode end flag is read from the metadata, but the batch has none")
            flags = np.asarray(view.backend.to_numpy(_tree.sub_data(src, path))).astype(bool)
            ends = flags.reshape(flags.shape[:2] + (-1,)).any(axis=2).astype(np.int64)
            z = view.anchor_position
            before = np.concatenate([np.zeros((ends.shape[0], 1), np.int64), np.cumsum(ends, axis=1)], axis=1)
            T = ends.shape[1]
            t = np.arange(T)
            lo = np.minimum(t, z)
            hi = np.maximum(t, z)
            # ends among frames [lo, hi): an end flag on frame f separates f from f + 1
            crossing = before[:, hi] - before[:, lo]
            return crossing == 0
        return fn


class FrameStackedBatch(SliceStackedBatch[BatchT, BArrayType, BDeviceType, BDtypeType, BRNGType]):
    """A `SliceStackedBatch` over the contiguous window `[i - prefetch_horizon, i + postfetch_horizon]`;
    `keys=[...]` stacks only those fields (e.g. the camera), the others hold the anchor frame."""

    def __init__(self, batch: BatchBase, prefetch_horizon: int = 0, postfetch_horizon: int = 0,
                 get_valid_mask_function: Optional[ValidMaskFunction] = None, fill_invalid_data: bool = True,
                 stack_metadata: bool = False, *, unrecorded: str = "run", deduplicate: Optional[bool] = None,
                 keys: Optional[Sequence[Any]] = None) -> None:
        for name, v in (("prefetch_horizon", prefetch_horizon), ("postfetch_horizon", postfetch_horizon)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
                raise ValueError(f"{name} must be a non-negative int, got {v!r}")
        self.prefetch_horizon = int(prefetch_horizon)
        self.postfetch_horizon = int(postfetch_horizon)
        super().__init__(batch, np.arange(-self.prefetch_horizon, self.postfetch_horizon + 1, dtype=np.int64),
                         get_valid_mask_function, fill_invalid_data, stack_metadata, unrecorded=unrecorded,
                         deduplicate=deduplicate, keys=keys)


__all__ = ["SliceStackedBatch", "FrameStackedBatch", "MASK_KEY", "fill_positions", "ValidMaskFunction"]
