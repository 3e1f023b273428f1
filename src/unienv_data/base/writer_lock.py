"""One writer per dataset directory.

Two objects recording into the same directory at once lose data: each keeps its own count and segment list in
memory and writes them at its commit points, so the later one overwrites the rows and the episodes of the other
(measured in a new-user trial: an episode gone and a row reading 0 where 2 was written, with `verify` saying OK).
A writable open therefore holds the directory's writer lock until it is closed:

* across processes, a POSIX record lock (`fcntl.lockf`) on ``<dir>/.writer.lock``: a second process opening the
  directory writable gets a `WriterLockError` naming the process that holds it. The kernel drops the lock when that
  process exits, however it exits (SIGKILL included), so a crash never leaves a stale lock. Forked children do not
  inherit it (processes sharing one buffer with ``multiprocessing=True`` are the holder's own children);
* within one process, the newer open takes over: the older object is closed first (its committed state written as
  at any close), so code that reopens a directory without closing the old object keeps working and sees everything
  the old object committed, and the old object refuses further use instead of writing over the new one.

Readers (``read_only=True``) take no lock. Where `fcntl` does not exist (Windows) only the in-process rule applies.
"""
from __future__ import annotations

import os
import threading
import weakref
from typing import Any, Callable, Dict, Optional

from .errors import StorageFormatError, StorageStateError

try:
    import fcntl
except ImportError:  # pragma: no cover - not on POSIX
    fcntl = None  # type: ignore[assignment]

#: name of the lock file inside a dataset directory (ignored by readers and by unienv 0.0.1b16)
LOCK_FILE = ".writer.lock"


class WriterLockError(StorageStateError):
    """Another process holds the directory open for writing."""


class WriterLock:
    """A writable open's hold on one directory (see the module docstring); `release()` gives it up (idempotent)."""

    def __init__(self, key: str, fd: Optional[int]) -> None:
        self.key = key
        self._fd = fd
        self._pid = os.getpid()
        self._owner: Optional["weakref.ReferenceType[Any]"] = None

    def attach(self, owner: Any) -> None:
        """Names the object that holds the lock: a later writable open in this process closes it first; the lock
        is released when it is garbage-collected without `close()`."""
        self._owner = weakref.ref(owner)
        weakref.finalize(owner, self.release)

    def owner(self) -> Any:
        """The holding object, or None when it is gone (or none was attached)."""
        return None if self._owner is None else self._owner()

    @property
    def held_here(self) -> bool:
        """True while this process holds the lock through this object (False once released, or in a forked
        child)."""
        return self._pid == os.getpid()

    def release(self) -> None:
        """Drops the lock (closing its file drops the POSIX lock). In a forked child it does nothing: the lock
        belongs to the parent."""
        if self._pid != os.getpid():
            return
        self._pid = -1
        with _LOCK:
            if _HELD.get(self.key) is self:
                del _HELD[self.key]
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)


_HELD: Dict[str, WriterLock] = {}
_LOCK = threading.Lock()


def _key(path: Any) -> str:
    return os.path.realpath(os.fspath(path))


def _holder_pid(fd: int) -> str:
    try:
        return os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
    except OSError:
        return "unknown"


def take_writer_lock(path: Any, close_other: Callable[[Any], None]) -> WriterLock:
    """The writer lock of the existing dataset directory `path`, for an object about to write there (call
    `attach(obj)` on the result once it exists, and `release()` when it closes).

    An older writer of the same directory in this process is closed first with `close_other(old)`; a writer in
    another process makes this raise `WriterLockError` (nothing changes then)."""
    key = _key(path)
    with _LOCK:
        old = _HELD.get(key)
    if old is not None:
        holder = old.owner()
        if old.held_here and holder is not None:
            close_other(holder)         # writes its committed state; its close releases the lock
        old.release()                   # (a no-op when done, or in a forked child: the parent's lock)
        with _LOCK:
            if _HELD.get(key) is old:
                del _HELD[key]
    fd: Optional[int] = None
    if fcntl is not None:
        lock_path = os.path.join(key, LOCK_FILE)
        flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0)
        try:        # never through a link: the lock file is written, and nothing outside the dataset may change
            fd = os.open(lock_path, flags, 0o666)
        except OSError as exc:
            if isinstance(exc, (PermissionError, FileNotFoundError)):
                raise
            raise StorageFormatError(f"{lock_path} is not a plain file ({exc.strerror}): the dataset directory is "
                                     "damaged (the writer lock lives there); remove it to open the dataset for "
                                     "writing") from None
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            pid = _holder_pid(fd)
            os.close(fd)
            raise WriterLockError(f"{key} is open for writing in another process (pid {pid}): two writers would "
                                  "overwrite each other's rows and episodes. Close it there first, or open it here "
                                  "with read_only=True") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode("ascii"), 0)
    lock = WriterLock(key, fd)
    with _LOCK:
        _HELD[key] = lock
    return lock


__all__ = ["take_writer_lock", "WriterLock", "WriterLockError", "LOCK_FILE"]
