"""`WrappedStorage`: the part of the SpaceStorage contract a storage that wraps one inner storage forwards as is
(length, capacity, mutability, segments, growth). Composite storages (FlattenedStorage, TransformedStorage,
ToBackendOrDeviceStorage) subclass it and only map values on the way through."""
from __future__ import annotations

from typing import Any, List, Optional, Union

from .files import PathLike
from .segments import SegmentLog
from .storage import SpaceStorage


class WrappedStorage(SpaceStorage[Any, Any, Any, Any, Any]):
    """Forwards lengths, capacity, segments and growth to `self.inner_storage` (set by the subclass)."""

    inner_storage: SpaceStorage
    _cache_filename: Optional[Union[str, PathLike]] = None

    @property
    def cache_filename(self) -> Optional[Union[str, PathLike]]:
        """This storage's directory when the inner storage is backed by a file, else None."""
        return self._cache_filename if self.inner_storage.cache_filename is not None else None

    @property
    def is_mutable(self) -> bool:
        return self.inner_storage.is_mutable

    @property
    def is_multiprocessing_safe(self) -> bool:
        return self.inner_storage.is_multiprocessing_safe

    @property
    def capacity(self) -> Optional[int]:
        return self.inner_storage.capacity

    def __len__(self) -> int:
        return len(self.inner_storage)

    @property
    def has_open_segment(self) -> bool:
        return self.inner_storage.has_open_segment

    @property
    def pending_segment_length(self) -> int:
        return self.inner_storage.pending_segment_length

    def extend_length(self, length: int) -> None:
        self._check_open()
        self.inner_storage.extend_length(length)

    def shrink_length(self, length: int) -> None:
        self._check_open()
        self.inner_storage.shrink_length(length)

    def mark_segment_start(self, start_index: int) -> None:
        self._check_writable()
        self.inner_storage.mark_segment_start(start_index)

    def mark_segment_end(self) -> None:
        self._check_open()
        self.inner_storage.mark_segment_end()

    def abort_segment(self) -> None:
        self._check_open()
        self.inner_storage.abort_segment()

    def get_segments(self) -> Optional[List[Any]]:
        self._check_open()
        return self.inner_storage.get_segments()

    def clear(self) -> None:
        self._check_writable()
        self.inner_storage.clear()

    def forget_segments(self, start: int, length: int) -> None:
        self._check_open()
        self.inner_storage.forget_segments(start, length)

    def _segment_log(self) -> Optional[SegmentLog]:
        return self.inner_storage._segment_log()

    def _record_segment(self, start: int, length: int) -> None:
        self.inner_storage._record_segment(start, length)

    def _has_persistent_segments(self) -> bool:
        return self.inner_storage._has_persistent_segments()
