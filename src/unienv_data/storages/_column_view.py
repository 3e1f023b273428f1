"""`ColumnView`: a sub-dict or leaf of a per-leaf file storage (HDF5, Parquet), from its `get_column`.

It reads and writes only those leaves of the parent's files. Length, capacity and segments are the parent's;
segments and the length change only through the parent. Subclasses say how rows are read and dumped.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

from unienv_data.base.errors import StorageStateError
from unienv_data.base.storage import SpaceStorage
from unienv_interface.space import Space

from ._list_storage import LeafTree


class ColumnView(SpaceStorage[Any, Any, Any, Any, Any]):
    """Leaves `which` (named `keys`) of `parent`, a storage with `_norm`, `_read_leaves`, `_write_leaves` and a
    `_tree` whose `subtree(keys)` gives `(space, which)`."""

    def __init__(self, parent: Any, space: Space, which: Sequence[int], keys: Sequence[str]) -> None:
        super().__init__(space)
        self._parent = parent
        self._which = list(which)
        self._keys = list(keys)
        self._tree = LeafTree(space, f"{type(parent).__name__} column {'/'.join(keys)!r}", parent.DEFAULT_KEY)

    @property
    def parent(self) -> Any:
        return self._parent

    @property
    def capacity(self) -> Optional[int]:
        return self._parent.capacity  # type: ignore[no-any-return]

    def __len__(self) -> int:
        return len(self._parent)

    @property
    def is_mutable(self) -> bool:
        return self._parent.is_mutable  # type: ignore[no-any-return]

    @property
    def is_multiprocessing_safe(self) -> bool:
        return self._parent.is_multiprocessing_safe  # type: ignore[no-any-return]

    def _check_open(self) -> None:
        super()._check_open()
        self._parent._check_open()

    def get_segments(self) -> Optional[List[Tuple[int, int]]]:
        self._check_open()
        return self._parent.get_segments()  # type: ignore[no-any-return]

    def episode_segments(self) -> Optional[List[Tuple[int, int]]]:
        self._check_open()
        return self._parent.episode_segments()  # type: ignore[no-any-return]

    def _refuse(self, *args: Any, **kwargs: Any) -> None:
        self._check_open()
        raise StorageStateError("a column view reads and writes rows only; build segments and change the length "
                                "through the parent storage")

    mark_segment_start = _refuse  # type: ignore[assignment]
    extend_length = _refuse  # type: ignore[assignment]
    shrink_length = _refuse  # type: ignore[assignment]
    clear = _refuse  # type: ignore[assignment]

    def open_segment_writer(self) -> Any:
        self._refuse()

    def set(self, index: Any, value: Any) -> None:
        self._check_writable()
        norm = self._parent._norm(index)
        lead = () if norm.single is not None else (norm.count(),)
        self._parent._write_leaves(norm, self._tree.split(value, lead), self._which)

    def close(self) -> None:
        self._closed = True

    def __getstate__(self) -> Dict[str, Any]:
        return {"parent": self._parent, "keys": self._keys}

    def __setstate__(self, state: Dict[str, Any]) -> None:
        parent = state["parent"]
        space, which = parent._tree.subtree(state["keys"])
        ColumnView.__init__(self, parent, space, which, state["keys"])
