"""Segment writers: build one segment (episode) apart from the storage and place it on commit.

State machine: open --append--> open --finish--> finished --commit--> committed; open/finished --abort--> aborted.
Appending after finish, committing twice, committing after abort, or committing more rows than the capacity raise
`StorageStateError` / ValueError and leave the storage untouched.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, Callable, List, Optional, Union

import numpy as np

from .errors import StorageStateError
from .ring import ring_index

if TYPE_CHECKING:  # storage.py builds writers; a writer only holds its storage
    from .storage import SpaceStorage

_OPEN, _FINISHED, _COMMITTED, _ABORTED = "open", "finished", "committed", "aborted"


class SegmentWriter(ABC):
    """Base writer: tracks length and state; subclasses keep the rows and write them in `_commit`."""

    def __init__(self, storage: SpaceStorage) -> None:
        self.storage = storage
        self._length = 0
        self._state = _OPEN

    @property
    def length(self) -> int:
        return self._length

    def __len__(self) -> int:
        return self._length

    @property
    def is_finished(self) -> bool:
        """True once no more rows can be appended (finished, committed or aborted)."""
        return self._state != _OPEN

    @property
    def state(self) -> str:
        """'open', 'finished', 'committed' or 'aborted'."""
        return self._state

    def append(self, value: Any) -> None:
        """Adds one element at the end of the segment (checked now, written on commit)."""
        if self._state != _OPEN:
            raise StorageStateError(f"Cannot append to a {self._state} segment writer")
        self._append(value)
        self._length += 1

    def finish(self) -> None:
        """Ends appending (idempotent); the segment can still be committed or aborted."""
        if self._state == _OPEN:
            self._state = _FINISHED

    def commit(self, start_index: int) -> None:
        """Writes the segment to rows `[start, start + length)` (modulo the capacity) and records it."""
        if self._state in (_COMMITTED, _ABORTED):
            raise StorageStateError(f"Cannot commit a segment writer that was already {self._state}")
        cap = self.storage.capacity
        if cap is not None and self._length > cap:
            raise ValueError(f"Cannot commit a segment of {self._length} rows into capacity {cap}: "
                             f"it would overwrite its own rows; create the storage with a capacity of at least "
                             f"{self._length} (or capacity=None, growable)")
        start = self.storage._normalize_segment_start(start_index)
        self.storage._check_writable()
        self._state = _FINISHED
        self._commit(start)
        self._state = _COMMITTED
        self._release_rows()

    def abort(self) -> None:
        """Drops the buffered rows; the writer can no longer be committed."""
        if self._state == _COMMITTED:
            raise StorageStateError("Cannot abort a segment writer that was already committed")
        self._state = _ABORTED
        self._release_rows()

    def _commit_indices(self, start: int) -> Union[slice, np.ndarray]:
        """The rows a commit at `start` covers: a slice, or an index array when the run wraps the ring."""
        return ring_index(start, self._length, self.storage.capacity)

    @abstractmethod
    def _append(self, value: Any) -> None:
        """Keeps one element."""

    @abstractmethod
    def _commit(self, start: int) -> None:
        """Writes the kept elements at `start` and records the segment."""

    def _release_rows(self) -> None:
        """Frees the kept elements."""


class BufferedSegmentWriter(SegmentWriter):
    """Keeps checked elements in memory and writes them with one batched storage write on commit."""

    def __init__(self, storage: SpaceStorage) -> None:
        super().__init__(storage)
        self._items: List[Any] = []

    def _append(self, value: Any) -> None:
        self._items.append(self.storage._prepare_single(value))

    def append_prepared(self, prepared: Any) -> None:
        """Adds an element already in the storage's prepared form (used by composite storages)."""
        if self._state != _OPEN:
            raise StorageStateError(f"Cannot append to a {self._state} segment writer")
        self._items.append(prepared)
        self._length += 1

    def _commit(self, start: int) -> None:
        st = self.storage
        if self._length:
            cap = st.capacity
            if cap is None and start + self._length > len(st):
                st.extend_length(start + self._length - len(st))
            st.forget_segments(start, self._length)   # persisted as gone before the rows are overwritten
            st._set_prepared(self._commit_indices(start), st._stack_prepared(self._items))
        st._record_segment(start, self._length)
        st._segment_committed()

    def _release_rows(self) -> None:
        self._items = []


class MappedSegmentWriter(SegmentWriter):
    """Forwards to a writer of an inner storage, mapping every appended element with `transform` first.

    `storage` is the outer storage; the inner writer records the segment in the inner storage.
    """

    def __init__(self, storage: SpaceStorage, inner_writer: SegmentWriter, transform: Callable[[Any], Any],
                 prepared: bool = False) -> None:
        super().__init__(storage)
        self.inner_writer = inner_writer
        self.transform = transform
        self._prepared = prepared and isinstance(inner_writer, BufferedSegmentWriter)

    def _append(self, value: Any) -> None:
        mapped = self.transform(value)
        if self._prepared:
            self.inner_writer.append_prepared(mapped)  # type: ignore[attr-defined]
        else:
            self.inner_writer.append(mapped)

    def finish(self) -> None:
        super().finish()
        self.inner_writer.finish()

    def commit(self, start_index: int) -> None:
        if self._state in (_COMMITTED, _ABORTED):
            raise StorageStateError(f"Cannot commit a segment writer that was already {self._state}")
        self.storage._check_writable()   # the outer storage may be closed while its inner one lives on
        self.inner_writer.commit(start_index)
        self._state = _COMMITTED

    def _commit(self, start: int) -> None:  # pragma: no cover - commit() is overridden
        self.inner_writer.commit(start)

    def abort(self) -> None:
        if self._state == _COMMITTED:
            raise StorageStateError("Cannot abort a segment writer that was already committed")
        self.inner_writer.abort()
        self._state = _ABORTED


__all__ = ["SegmentWriter", "BufferedSegmentWriter", "MappedSegmentWriter"]
