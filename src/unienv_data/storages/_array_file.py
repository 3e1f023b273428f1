"""`ArrayBlock`: the rows of an array storage in one NumPy array, in RAM, in a memory-mapped file, or in shared
memory (a file under /dev/shm mapped by every process that unpickles the storage).

On disk the data file is the reference layout: raw C-order element bytes, no header. What the bytes mean (dtype,
row shape, capacity, length, segments) goes into a sidecar `<file>.meta.json` written atomically.
"""
from __future__ import annotations

import mmap
import os
import tempfile
import uuid
import weakref
from typing import Any, Optional, Tuple

import numpy as np

from unienv_data.base.errors import StorageFormatError, StorageNotFoundError

RAM, MEMMAP, SHARED = "ram", "memmap", "shared"


def _shm_dir() -> str:
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _map_file(path: str, dtype: np.dtype, row_shape: Tuple[int, ...], rows: int,
              writable: bool) -> Tuple[np.ndarray, Optional[mmap.mmap]]:
    """A plain ndarray view over `rows` rows of a raw file, and its mapping (the view keeps it alive)."""
    shape = (rows,) + row_shape
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if nbytes == 0:
        return np.zeros(shape, dtype=dtype), None
    with open(path, "r+b" if writable else "rb") as f:
        mm = mmap.mmap(f.fileno(), nbytes, access=mmap.ACCESS_WRITE if writable else mmap.ACCESS_READ)
    return np.frombuffer(mm, dtype=dtype, count=nbytes // dtype.itemsize).reshape(shape), mm


class ArrayBlock:
    """Owns the bytes of `alloc_rows` rows of `row_shape` / `dtype` in one of three media."""

    def __init__(self, mode: str, dtype: np.dtype, row_shape: Tuple[int, ...], alloc_rows: int,
                 path: Optional[str] = None, writable: bool = True, owner: bool = True) -> None:
        self.mode = mode
        self.dtype = np.dtype(dtype)
        self.row_shape = tuple(row_shape)
        self.row_bytes = int(np.prod(self.row_shape, dtype=np.int64)) * self.dtype.itemsize
        self.path = path
        self.writable = writable
        self.alloc_rows = alloc_rows
        self._finalizer: Optional[weakref.finalize] = None
        self._mm: Optional[mmap.mmap] = None
        if mode == RAM:
            self.data = np.zeros((alloc_rows,) + self.row_shape, dtype=self.dtype)
        else:
            if not (path is not None):
                raise RuntimeError("internal invariant violated: path is not None")
            self.data, self._mm = _map_file(path, self.dtype, self.row_shape, alloc_rows, writable)
            if mode == SHARED and owner:
                self._finalizer = weakref.finalize(self, _unlink_quietly, path)

    # ---------------------------------------------------------------- construction
    @classmethod
    def new_file(cls, mode: str, path: Optional[str], dtype: np.dtype, row_shape: Tuple[int, ...], rows: int) -> "ArrayBlock":
        """A zero-filled file of `rows` rows at `path` (a fresh /dev/shm name for shared memory); an existing
        file is replaced, never reused."""
        if mode == SHARED:
            path = os.path.join(_shm_dir(), f"unienv-{os.getpid()}-{uuid.uuid4().hex}.shm")
        if not (path is not None):
            raise RuntimeError("internal invariant violated: path is not None")
        parent = os.path.dirname(os.path.abspath(path))
        os.makedirs(parent, exist_ok=True)
        row_bytes = int(np.prod(row_shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        tmp = path + f".{uuid.uuid4().hex[:8]}.creating"
        with open(tmp, "wb") as f:
            f.truncate(rows * row_bytes)
        os.replace(tmp, path)
        return cls(mode, dtype, row_shape, rows, path=path)

    @classmethod
    def open_file(cls, path: str, dtype: np.dtype, row_shape: Tuple[int, ...], rows: int, writable: bool,
                  mode: str = MEMMAP) -> "ArrayBlock":
        """Maps `rows` rows of an existing file; StorageFormatError when the file is smaller than that."""
        if not os.path.isfile(path):
            raise StorageNotFoundError(f"data file not found: {path}")
        row_bytes = int(np.prod(row_shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        size = os.path.getsize(path)
        if size < rows * row_bytes:
            raise StorageFormatError(f"data file {path} holds {size} bytes, but {rows} rows of {np.dtype(dtype).name}"
                                     f"{list(row_shape)} need {rows * row_bytes}: the file is truncated or the space differs")
        return cls(mode, dtype, row_shape, rows, path=path, writable=writable, owner=False)

    # ---------------------------------------------------------------- size changes
    def resize(self, rows: int) -> None:
        """Changes the number of allocated rows, keeping the first `min(old, new)` rows."""
        if rows == self.alloc_rows:
            return
        if self.mode == RAM:
            new = np.zeros((rows,) + self.row_shape, dtype=self.dtype)
            keep = min(rows, self.alloc_rows)
            new[:keep] = self.data[:keep]
            self.data = new
        else:
            if not (self.path is not None):
                raise RuntimeError("internal invariant violated: self.path is not None")
            self.data, self._mm = np.zeros((0,) + self.row_shape, dtype=self.dtype), None
            with open(self.path, "r+b") as f:
                f.truncate(rows * self.row_bytes)
            self.data, self._mm = _map_file(self.path, self.dtype, self.row_shape, rows, True)
        self.alloc_rows = rows

    def flush(self) -> None:
        """Writes dirty pages of a memory-mapped file to disk (msync)."""
        if self.mode == MEMMAP and self.writable and self._mm is not None:
            self._mm.flush()

    def release(self) -> None:
        """Drops the mapping (and unlinks a shared-memory file this process created)."""
        self.data, self._mm = np.zeros((0,) + self.row_shape, dtype=self.dtype), None
        if self._finalizer is not None:
            self._finalizer()

    def nbytes(self, rows: int) -> int:
        return rows * self.row_bytes


def file_rows(path: str, row_bytes: int) -> Tuple[int, int]:
    """`(rows, leftover_bytes)` of a raw data file."""
    size = os.path.getsize(path)
    if row_bytes == 0:
        return 0, size
    return size // row_bytes, size % row_bytes


__all__ = ["ArrayBlock", "RAM", "MEMMAP", "SHARED", "file_rows"]
