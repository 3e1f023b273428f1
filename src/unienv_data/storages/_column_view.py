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
    """Leaves `which` (named `keys`) of `parent`, a storage with `_norm`, `_read_leaves`, `_write_leaves` and a
    `_tree` whose `subtree(keys)` gives `(space, which)`."""

    def __init__(self, parent: Any, space: Space, which: Sequence[int], keys: Sequence[str]) -> None:
        super().__init__(space)
        self._parent = parent
        self._which = list(which)
        self._keys = list(keys)
        self._tree = LeafTree(space, f"{type(parent).__name__} column {'/'.join(keys)!r}", parent.DEFAULT_KEY)

    def set(self, index: Any, value: Any) -> None:
        self._check_writable()
        norm = self._parent._norm(index)
        self._parent._write_leaves(norm, self._tree.split(value, norm.lead()), self._which)

    def __getstate__(self) -> Dict[str, Any]:
        return {"parent": self._parent, "keys": self._keys}

    def __setstate__(self, state: Dict[str, Any]) -> None:
        parent = state["parent"]
        space, which = parent._tree.subtree(state["keys"])
        ColumnView.__init__(self, parent, space, which, state["keys"])
