"""Exception types raised by storages, beyond the built-in ValueError / TypeError / IndexError / KeyError, and
`BoundsWarning` (defined in `unienv_interface.errors`, re-exported here: the same class)."""
from __future__ import annotations

from unienv_interface.errors import BoundsWarning  # one class for storages and transformations alike


class StorageStateError(ValueError, RuntimeError):
    """An operation is not allowed in the storage's or writer's current state (closed, read-only, no open
    segment, writer already committed, ...). Subclasses both ValueError and RuntimeError so callers written for
    either keep working."""


class StorageClosedError(StorageStateError):
    """The storage was closed; reopen it with `load_from`."""


class ReadOnlyStorageError(StorageStateError):
    """A write was attempted on a storage opened read-only."""


class StorageFormatError(ValueError):
    """Files on disk are missing, damaged or do not match what the caller asked for."""


class StorageNotFoundError(StorageFormatError, FileNotFoundError):
    """A file a storage needs does not exist."""


__all__ = ["BoundsWarning", "ReadOnlyStorageError", "StorageClosedError", "StorageFormatError",
           "StorageNotFoundError", "StorageStateError"]
