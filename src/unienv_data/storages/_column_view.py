"""`ColumnView`: a sub-dict or leaf of a per-leaf file storage (HDF5, Parquet), from its `get_column`.

It reads and writes only those leaves of the parent's files. Length, capacity and segments are the parent's;
segments and the length change only through the parent. Subclasses say how rows are read and dumped.
"""
from __future__ import annotations

from typing import Any, Dict, Sequence

from unienv_interface.space import Space

from ._field_view import ParentView
from ._list_storage import LeafTree


class ColumnView(ParentView):
    """Leaves `which` (named `keys`, of sub-space `space`) of `parent`, a storage with `read_columns` and
    `write_columns` (`LeafTreeWrites`)."""

    def __init__(self, parent: Any, space: Space, which: Sequence[int], keys: Sequence[str]) -> None:
        super().__init__(space)
        self._parent = parent
        self._which = list(which)
        self._keys = list(keys)
        self._tree = LeafTree(space, f"{type(parent).__name__} column {'/'.join(keys)!r}", parent.DEFAULT_KEY)

    def set(self, index: Any, value: Any) -> None:
        self.check_writable()
        self._parent.write_columns(index, value, self._tree, self._which)

    def __getstate__(self) -> Dict[str, Any]:
        return {"parent": self._parent, "space": self.single_instance_space, "which": self._which, "keys": self._keys}

    def __setstate__(self, state: Dict[str, Any]) -> None:
        ColumnView.__init__(self, state["parent"], state["space"], state["which"], state["keys"])
