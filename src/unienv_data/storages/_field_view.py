"""`FieldView`: one field (a leaf or a sub-dict) inside a child storage that holds several keys, such as a native
layout's per-dtype group `@float32` holding `action` and `obs/pos`. What `DictStorage.get_column` returns for a key
that is not a child of its own.

Reads take the child's rows and pick the field; writes read the child's rows, replace the field and write them
back (the other fields of the child keep their values). Length, capacity and segments are the parent's and change
only through it.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

from unienv_data.base.errors import StorageStateError
from unienv_data.base.storage import SpaceStorage
from unienv_interface.space import DictSpace, Space


def field_space(space: Space, path: Sequence[str]) -> Optional[Space]:
    """The sub-space at `path` of a (nested) `DictSpace`, or None when there is none."""
    for p in path:
        if not isinstance(space, DictSpace) or p not in space.spaces:
            return None
        space = space.spaces[p]
    return space


class FieldView(SpaceStorage[Any, Any, Any, Any, Any]):
    """The field at `path` (keys inside `child`'s space) of `child`, a storage whose space is a `DictSpace`."""

    def __init__(self, child: SpaceStorage, path: Sequence[str]) -> None:
        space = field_space(child.single_instance_space, path)
        if space is None:
            raise KeyError(f"{type(child).__name__} holds no field {'/'.join(path)!r}")
        super().__init__(space)
        self._child = child
        self._path: Tuple[str, ...] = tuple(path)

    @property
    def capacity(self) -> Optional[int]:
        return self._child.capacity

    def __len__(self) -> int:
        return len(self._child)

    @property
    def is_mutable(self) -> bool:
        return self._child.is_mutable

    @property
    def is_multiprocessing_safe(self) -> bool:
        return self._child.is_multiprocessing_safe

    def _check_open(self) -> None:
        super()._check_open()
        self._child._check_open()

    def get_segments(self) -> Optional[List[Tuple[int, int]]]:
        self._check_open()
        return self._child.get_segments()

    def episode_segments(self) -> Optional[List[Tuple[int, int]]]:
        self._check_open()
        return self._child.episode_segments()

    def _pick(self, data: Any) -> Any:
        for p in self._path:
            data = data[p]
        return data

    def get(self, index: Any) -> Any:
        self._check_open()
        return self._pick(self._child.get(index))

    def set(self, index: Any, value: Any) -> None:
        self._check_writable()
        rows = self._child.get(index)
        node: Dict[str, Any] = rows
        for p in self._path[:-1]:
            node = node[p]
        node[self._path[-1]] = value
        self._child.set(index, rows)

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

    def dumps(self, path: Any) -> None:
        raise StorageStateError("a column view is saved with its parent storage; call dumps on the parent")

    def close(self) -> None:
        self._closed = True


__all__ = ["FieldView", "field_space"]
