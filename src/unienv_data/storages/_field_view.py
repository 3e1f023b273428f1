"""`ParentView`, a view of part of another storage, and `FieldView`: one field (a leaf or a sub-dict) inside a child storage that holds several keys, such as a native
layout's per-dtype group `@float32` holding `action` and `obs/pos`. What `DictStorage.get_column` returns for a key
that is not a child of its own.

Reads take the child's rows and pick the field; writes read the child's rows, replace the field and write them
back (the other fields of the child keep their values). Length, capacity and segments are the parent's and change
only through it.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

from unienv_data.base.errors import StorageStateError
from unienv_data.base.storage import SpaceStorage, closed_error
from unienv_interface.space import DictSpace, Space


def field_space(space: Space, path: Sequence[str]) -> Optional[Space]:
    """The sub-space at `path` of a (nested) `DictSpace`, or None when there is none."""
    for p in path:
        if not isinstance(space, DictSpace) or p not in space.spaces:
            return None
        space = space.spaces[p]
    return space


class ParentView(SpaceStorage[Any, Any, Any, Any, Any]):
    """A view of part of another storage (`_parent`): its length, capacity, mutability, multiprocessing safety and
    segments are the parent's, and segments and the length change only through the parent (those calls raise
    StorageStateError). Subclasses read and write rows (`get` / `set`) through the parent."""

    _parent: Any        # a SpaceStorage (subclasses call its storage-specific row methods)

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
        if self._parent.is_closed:
            raise closed_error(self._parent)

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

    def close(self) -> None:
        self._closed = True


class FieldView(ParentView):
    """The field at `path` (keys inside `child`'s space) of `child`, a storage whose space is a `DictSpace`."""

    def __init__(self, child: SpaceStorage, path: Sequence[str]) -> None:
        space = field_space(child.single_instance_space, path)
        if space is None:
            raise KeyError(f"{type(child).__name__} holds no field {'/'.join(path)!r}")
        super().__init__(space)
        self._parent = child
        self._path: Tuple[str, ...] = tuple(path)

    def _pick(self, data: Any) -> Any:
        for p in self._path:
            data = data[p]
        return data

    def get(self, index: Any) -> Any:
        self._check_open()
        return self._pick(self._parent.get(index))

    def set(self, index: Any, value: Any) -> None:
        self.check_writable()
        rows = self._parent.get(index)
        node: Dict[str, Any] = rows
        for p in self._path[:-1]:
            node = node[p]
        node[self._path[-1]] = value
        self._parent.set(index, rows)

    def dumps(self, path: Any) -> None:
        raise StorageStateError("a column view is saved with its parent storage; call dumps on the parent")


__all__ = ["ParentView", "FieldView", "field_space"]
