"""Exception types raised by storages, beyond the built-in ValueError / TypeError / IndexError / KeyError."""
from __future__ import annotations


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


class BoundsWarning(UserWarning, ValueError):
    """A stored value lies outside its Box's declared `[low, high]` (it was stored all the same, as unienv 0.0.1b16
    and gymnasium do). Issued once per key and storage; `warnings.simplefilter("error", BoundsWarning)` turns it
    into a refusal: the write then changes nothing, and what it raises is also a `ValueError` (the error any other
    refused value raises), so code that catches ValueError keeps working."""
