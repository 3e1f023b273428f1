"""Segment writers: build one segment (episode) apart from the storage and place it on commit.

State machine: open --append--> open --finish--> finished --commit--> committed; open/finished --abort--> aborted.
Appending after finish, committing twice, committing after abort, or committing more rows than the capacity raise
`StorageStateError` / ValueError and leave the storage untouched.

A commit runs in two phases, so a composite storage (`DictStorage`) can commit several child writers all or
nothing: `prepare_commit(start)` does the work that may fail (growing, writing the rows, finishing an encoded
file) without recording anything; `publish_commit()` records the segment (and persists it when durable). A
failed prepare is rolled back by the writer itself (`rollback_commit()`: the rows it added go, the writer stays
finished and can be committed again or aborted); a composite rolls back every child it prepared, and the
children it already published when a later one fails to publish.
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
        self._prepared_at: Optional[int] = None
        self._published = False

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
        """Writes the segment to rows `[start, start + length)` (modulo the capacity) and records it. On an error
        nothing is recorded and the writer stays finished: commit it again or abort it."""
        self.prepare_commit(start_index)
        self.publish_commit()

    def prepare_commit(self, start_index: int) -> int:
        """Phase one of a commit: checks, then writes the rows at `start_index` without recording the segment;
        returns the normalized start. On an error the writer rolls its own work back and re-raises."""
        if self._state in (_COMMITTED, _ABORTED):
            raise StorageStateError(f"Cannot commit a segment writer that was already {self._state}")
        if self._prepared_at is not None:
            raise StorageStateError("this writer's commit is already prepared; publish_commit() or rollback_commit()")
        cap = self.storage.capacity
        if cap is not None and self._length > cap:
            raise ValueError(f"Cannot commit a segment of {self._length} rows into capacity {cap}: "
                             f"it would overwrite its own rows; create the storage with a capacity of at least "
                             f"{self._length} (or capacity=None, growable)")
        start = self.storage.normalize_segment_start(start_index)
        self.storage.check_writable()
        self._state = _FINISHED
        try:
            self._prepare(start)
        except BaseException:
            self._rollback_prepare(start)
            raise
        self._prepared_at = start
        return start

    def publish_commit(self, *, release: bool = True) -> None:
        """Phase two: records the prepared segment (persisting it when the storage is durable). On an error the
        writer's own publication is undone (`_unpublish`) and its prepared rows are rolled back. With
        `release=False` the writer keeps its rows (a composite releases them with `finish_commit()` once every
        child has published)."""
        start = self._prepared_at
        if start is None:
            raise StorageStateError("publish_commit() needs a prepared commit (prepare_commit(start) first)")
        try:
            self._publish(start)
        except BaseException:
            self.rollback_commit(published=True)
            raise
        self._published = True
        if release:
            self.finish_commit()

    def finish_commit(self) -> None:
        """Marks a published commit done and frees the kept rows."""
        self._prepared_at = None
        self._published = False
        self._state = _COMMITTED
        self._release_rows()

    def rollback_commit(self, published: Optional[bool] = None) -> None:
        """Undoes a prepared (and possibly published) commit: the segment is forgotten again, the rows the prepare
        added are removed; the writer stays finished (commit again or abort). No-op without a prepared commit."""
        start = self._prepared_at
        if start is None:
            return
        published = self._published if published is None else published
        self._prepared_at = None
        self._published = False
        try:
            if published:
                self._unpublish(start)
        finally:
            self._rollback_prepare(start)

    def _prepare(self, start: int) -> None:
        """Phase one hook (default: nothing; the whole commit happens in `_publish`)."""

    def _publish(self, start: int) -> None:
        """Phase two hook (default: `_commit`, for writers that commit in one step)."""
        self._commit(start)

    def _rollback_prepare(self, start: int) -> None:
        """Undoes what `_prepare` (possibly partly) did (default: nothing)."""

    def _unpublish(self, start: int) -> None:
        """Undoes a publication: the segment just recorded at `start` is forgotten (and persisted so)."""
        if self._length:
            self.storage.forget_segments(start, self._length)

    def abort(self) -> None:
        """Drops the buffered rows; the writer can no longer be committed."""
        if self._state == _COMMITTED:
            raise StorageStateError("Cannot abort a segment writer that was already committed")
        self.rollback_commit()
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
        self._items.append(self.storage.prepare_element(value))

    def append_prepared(self, prepared: Any) -> None:
        """Adds an element already in the storage's prepared form (used by composite storages)."""
        if self._state != _OPEN:
            raise StorageStateError(f"Cannot append to a {self._state} segment writer")
        self._items.append(prepared)
        self._length += 1

    def _prepare(self, start: int) -> None:
        st = self.storage
        self._grown = 0
        if self._length:
            cap = st.capacity
            if cap is None and start + self._length > len(st):
                self._grown = start + self._length - len(st)
                st.extend_length(self._grown)
            st.forget_segments(start, self._length)   # persisted as gone before the rows are overwritten
            st.set_prepared(self._commit_indices(start), st.stack_prepared(self._items))

    def _publish(self, start: int) -> None:
        st = self.storage
        st.record_segment(start, self._length)
        st.on_segment_committed()

    def _rollback_prepare(self, start: int) -> None:
        st = self.storage
        grown, self._grown = getattr(self, "_grown", 0), 0
        if grown and not st.is_closed and len(st) >= start + self._length:
            st.shrink_length(grown)            # the rows this commit added at the end go again

    def _commit(self, start: int) -> None:
        self._prepare(start)
        self._publish(start)

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

    def prepare_commit(self, start_index: int) -> int:
        if self._state in (_COMMITTED, _ABORTED):
            raise StorageStateError(f"Cannot commit a segment writer that was already {self._state}")
        self.storage.check_writable()   # the outer storage may be closed while its inner one lives on
        start = self.inner_writer.prepare_commit(start_index)
        self._state = _FINISHED
        self._prepared_at = start
        return start

    def publish_commit(self, *, release: bool = True) -> None:
        self.inner_writer.publish_commit(release=release)
        if release:
            self._prepared_at = None
            self._state = _COMMITTED
        else:
            self._published = True

    def finish_commit(self) -> None:
        self.inner_writer.finish_commit()
        self._prepared_at = None
        self._published = False
        self._state = _COMMITTED

    def rollback_commit(self, published: Optional[bool] = None) -> None:
        self._prepared_at = None
        self._published = False
        self.inner_writer.rollback_commit(published)

    def _commit(self, start: int) -> None:  # pragma: no cover - commit() is overridden
        self.inner_writer.commit(start)

    def abort(self) -> None:
        if self._state == _COMMITTED:
            raise StorageStateError("Cannot abort a segment writer that was already committed")
        self.inner_writer.abort()
        self._state = _ABORTED


__all__ = ["SegmentWriter", "BufferedSegmentWriter", "MappedSegmentWriter"]
