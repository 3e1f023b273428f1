"""`SubIndexedBatch`: a view over a fixed subset (or reordering) of another batch's indices."""
from __future__ import annotations

from unienv_data.base.common import BatchT
from unienv_interface.backends.base import BArrayType, BDeviceType, BDtypeType, BRNGType
from typing import Any, List, Optional, Tuple

import numpy as np

from unienv_data.base.common import BatchBase
from unienv_data.base.indexing import normalize_index

from ._segments import SegmentIndex


class SubIndexedBatch(BatchBase[BatchT, BArrayType, BDeviceType, BDtypeType, BRNGType]):
    """Index `j` of the view is index `sub_indexes[j]` of `batch`.

    `sub_indexes` (a slice, Ellipsis, an int array / list / tensor, or a boolean mask) is resolved against
    `len(batch)` once, at construction; the view then keeps those positions, so over a ring buffer it follows the
    *logical* positions (after the ring moves, they hold newer samples). Reads and writes go through to `batch`
    (writes need `batch` to be mutable); metadata is passed through. `get_segments()` splits the view wherever two
    neighbouring view positions are not neighbouring frames of one segment of `batch`. Never closes `batch`.
    """

    def __init__(self, batch: BatchBase, sub_indexes: Any) -> None:
        if not isinstance(batch, BatchBase):
            raise TypeError(f"batch must be a BatchBase, got {type(batch).__name__}")
        norm = normalize_index(sub_indexes, len(batch), "SubIndexedBatch")
        if norm.single is not None:
            raise TypeError("sub_indexes must select a batch of indices (slice, array or mask), not a single int")
        super().__init__(batch.single_space, batch.single_metadata_space)
        self.batch = batch
        positions = np.array(norm.positions(), dtype=np.int64, copy=True)
        positions.setflags(write=False)
        self.sub_indexes = positions

    def __len__(self) -> int:
        return int(self.sub_indexes.shape[0])

    @property
    def is_mutable(self) -> bool:  # type: ignore[override]
        return bool(self.batch.is_mutable)

    def _map(self, idx: Any) -> Any:
        norm = normalize_index(idx, len(self), type(self).__name__)
        if norm.single is not None:
            return int(self.sub_indexes[norm.single])
        return self.sub_indexes[norm.numpy_key()]

    def get_at(self, idx: Any) -> Any:
        return self.batch.get_at(self._map(idx))

    def get_at_with_metadata(self, idx: Any) -> Tuple[Any, Optional[Any]]:
        return self.batch.get_at_with_metadata(self._map(idx))

    def get_flattened_at(self, idx: Any) -> Any:
        return self.batch.get_flattened_at(self._map(idx))

    def get_flattened_at_with_metadata(self, idx: Any) -> Tuple[Any, Optional[Any]]:
        return self.batch.get_flattened_at_with_metadata(self._map(idx))

    def set_at(self, idx: Any, value: Any) -> None:
        self.batch.set_at(self._map(idx), value)

    def set_flattened_at(self, idx: Any, value: Any) -> None:
        self.batch.set_flattened_at(self._map(idx), value)

    def episode_segments(self) -> List[Tuple[int, int]]:
        """Maximal runs of view positions that are consecutive frames of one segment of `batch`."""
        m = len(self)
        if m == 0:
            return []
        n = len(self.batch)
        sub = self.sub_indexes
        if sub.size and int(sub.max()) >= n:
            raise IndexError(f"SubIndexedBatch: index {int(sub.max())} is out of range for the wrapped batch of "
                             f"length {n} (it shrank)")
        piece = SegmentIndex.of(self.batch, n).piece_of(sub)
        breaks = np.flatnonzero((np.diff(sub) != 1) | (np.diff(piece) != 0)) + 1
        starts = np.concatenate([[0], breaks]).tolist()
        ends = np.concatenate([breaks, [m]]).tolist()
        return list(zip(starts, ends))

    def get_segments(self) -> List[Tuple[int, int]]:
        """The same as `episode_segments()` (a batch of this project; unienv 0.0.1b16 has no such method here)."""
        return self.episode_segments()


__all__ = ["SubIndexedBatch"]
