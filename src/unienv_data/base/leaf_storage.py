"""`LeafStorage`: the skeleton of a storage that owns its rows (arrays, files, datasets).

Every such storage keeps the same state: a capacity (a ring of that many rows, or None: growable), a length, a
read-only flag and its segment log. The skeleton answers the properties from that state and holds the one template
of `extend_length` / `shrink_length`: check the storage is writable, do nothing on a fixed capacity, check the
count, then call the storage's hook. A storage subclassing it sets `_capacity`, `_length`, `_read_only` and
`_segments` in its constructor and, when it can grow, implements:

* `_grow_rows(new_length)`: make rows `[len(self), new_length)` exist, reading as zeros (and set `_length`);
* `_drop_rows(new_length)`: remove rows from `new_length` on (set `_length`, forget segments reaching past it -
  `after_shrink` does that - and free their bytes, in the order its crash safety needs).

`_check_owner(what)` runs before either hook (a storage that a multiprocessing buffer shares refuses growth from a
process that does not own it; the default accepts).
"""
from __future__ import annotations

from typing import Optional

from unienv_interface.backends.base import BArrayType, BDeviceType, BDtypeType, BRNGType

from .arguments import check_count
from .common import BatchT
from .segments import SegmentLog
from .storage import SpaceStorage


class LeafStorage(SpaceStorage[BatchT, BArrayType, BDeviceType, BDtypeType, BRNGType]):
    """A `SpaceStorage` owning its rows: capacity, length, mutability and segments from `_capacity`, `_length`,
    `_read_only`, `_segments`; `extend_length` / `shrink_length` through the `_grow_rows` / `_drop_rows` hooks (see
    the module docstring)."""

    _capacity: Optional[int]
    _length: int
    _read_only: bool
    _segments: SegmentLog

    @property
    def capacity(self) -> Optional[int]:
        return self._capacity

    def __len__(self) -> int:
        return self._length

    @property
    def is_mutable(self) -> bool:
        return not self._read_only

    @property
    def is_multiprocessing_safe(self) -> bool:
        """True when opened read-only: readers in other processes then see the same files (several writing processes
        would race on the metadata). Storages that share their rows otherwise say so themselves."""
        return self._read_only

    def segment_log(self) -> Optional[SegmentLog]:
        return self._segments

    def close(self) -> None:
        """Writes what a writable storage still holds in memory (`_persist_on_close`), then frees its files, maps and
        handles (`_free`); later use raises StorageClosedError. Idempotent."""
        if self._closed:
            return
        try:
            self._persist_on_close()
        finally:
            self._closed = True
            self._free()

    def _persist_on_close(self) -> None:
        """Hook: what `close` writes first (metadata, rows kept in memory); default nothing."""

    def _free(self) -> None:
        """Hook: what `close` frees last, even when writing failed; default nothing."""

    def _check_owner(self, what: str) -> None:
        """Raises when this process may not change the storage's length (default: it may)."""

    def extend_length(self, length: int) -> None:
        """Adds `length` rows (reading as zeros) at the end of a growable storage; a no-op for a fixed capacity."""
        self.check_writable()
        if self._capacity is not None:
            return
        n = check_count(length, "extend_length")
        if n:
            self._check_owner("extend_length")
            self._grow_rows(self._length + n)

    def shrink_length(self, length: int) -> None:
        """Removes `length` rows from the end of a growable storage (their segments are forgotten); a no-op for a
        fixed capacity."""
        self.check_writable()
        if self._capacity is not None:
            return
        n = check_count(length, "shrink_length", maximum=self._length)
        if n:
            self._check_owner("shrink_length")
            self._drop_rows(self._length - n)

    def _grow_rows(self, new_length: int) -> None:
        """Hook: rows `[len(self), new_length)` now exist and read as zeros (growable storages implement it)."""
        raise NotImplementedError(f"{type(self).__name__} cannot grow")

    def _drop_rows(self, new_length: int) -> None:
        """Hook: rows from `new_length` on are gone, with their segments (growable storages implement it)."""
        raise NotImplementedError(f"{type(self).__name__} cannot shrink")


__all__ = ["LeafStorage"]
