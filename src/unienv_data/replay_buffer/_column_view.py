"""`ColumnView`: one column of a `ReplayBuffer` (what `get_column` returns), indexed logically like the buffer."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, List, Optional, Tuple

import numpy as np

from unienv_data.base.common import BatchBase
from unienv_data.base.storage import SpaceStorage
from unienv_data.batches._tree import copy_into

if TYPE_CHECKING:
    from .replay_buffer import ReplayBuffer


class ColumnView(BatchBase[Any, Any, Any, Any, Any]):
    """One column of a buffer, indexed logically (shares the buffer's counters)."""

    def __init__(self, buffer: "ReplayBuffer", column_storage: SpaceStorage) -> None:
        super().__init__(column_storage.single_instance_space)
        self._buffer = buffer
        self._column = column_storage

    def __len__(self) -> int:
        return len(self._buffer)

    def get_at(self, idx: Any) -> Any:
        return self._column.get(self._buffer.index_with_offset(idx))

    def get_at_into(self, idx: Any, out: Any) -> None:
        """Writes the column's samples at logical `idx` (a 1-D int array) into `out` (NumPy, the column's layout):
        straight from the storage when it reads into arrays (`get_into`), else through `get_at`."""
        index = self._buffer.index_with_offset(idx)
        fn = getattr(self._column, "get_into", None)
        if fn is not None:
            if isinstance(index, slice):      # a contiguous read: its rows as an index array
                index = np.arange(index.start, index.stop, index.step or 1, dtype=np.int64)
            fn(index, out)
            return
        copy_into(out, self._column.get(index))

    def set_at(self, idx: Any, value: Any) -> None:
        self._column.set(self._buffer.index_with_offset(idx), value)

    def get_segments(self) -> Optional[List[Tuple[int, int]]]:
        """The buffer's `get_segments()` (a column is a live view of it, as in unienv 0.0.1b16)."""
        return self._buffer.get_segments()

    def episode_segments(self) -> Optional[List[Tuple[int, int]]]:
        """The buffer's `episode_segments()`."""
        return self._buffer.episode_segments()


__all__ = ["ColumnView"]
