"""`RowView`: what every view whose row `i` is built from row `i` of one wrapped batch shares (length, segments,
the batch samplers index, the flattening of rows read at an index)."""
from __future__ import annotations

from typing import Any, Optional

from unienv_data.base.common import BatchBase
from unienv_data.base.indexing import is_single_index
from unienv_data.base.segments import episode_segments_of
from unienv_interface.space import Space
from unienv_interface.space.space_utils import flatten_utils


class RowView:
    """Mixin (listed before `BatchBase`) for a view of `self.batch` that keeps its indices: row `i` of the view is
    built from row `i` of `batch`, so the view has the batch's length, segments and recorded episodes."""

    batch: BatchBase
    single_space: Space
    _batched_space: Space

    @property
    def index_source(self) -> BatchBase:
        """The batch whose indices this view's indices are (used by samplers to find a ring buffer)."""
        return self.batch

    def __len__(self) -> int:
        return len(self.batch)

    def get_segments(self) -> Optional[Any]:
        """The wrapped batch's segments (a view row belongs to the segment of the batch row it is built from)."""
        fn = getattr(self.batch, "get_segments", None)
        return None if fn is None else fn()

    def episode_segments(self) -> Optional[Any]:
        """The wrapped batch's recorded episodes (`episode_segments()`, else `get_segments()`)."""
        return episode_segments_of(self.batch)

    def _flatten_rows(self, idx: Any, data: Any) -> Any:
        """`data` read from this view at `idx` as flat row(s): one row for a single index, else a batch of rows."""
        if is_single_index(idx):
            return flatten_utils.flatten_data(self.single_space, data)
        return flatten_utils.flatten_data(self._batched_space, data, start_dim=1)
