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
from unienv_data.base.files import remove_quietly
from ._io_pool import IO_POOL_WORKERS, map_io

RAM, MEMMAP, SHARED = "ram", "memmap", "shared"


def _shm_dir() -> str:
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()


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


#: In-RAM blocks from this size on are private anonymous mappings (see `_ram_array`).
_ANON_MAP_BYTES = 64 << 20


def _nbytes(shape: Tuple[int, ...], dtype: np.dtype) -> int:
    return int(np.prod(shape, dtype=np.int64)) * dtype.itemsize


def _maps_anonymously(nbytes: int) -> bool:
    """Whether `_ram_array` puts `nbytes` in an anonymous mapping (see there) rather than a NumPy allocation."""
    return nbytes >= _ANON_MAP_BYTES and hasattr(mmap, "MAP_PRIVATE")


def _ram_array(shape: Tuple[int, ...], dtype: np.dtype, populate: bool = False) -> np.ndarray:
    """An uninitialised in-RAM array (zero-filled when it is a fresh mapping). From `_ANON_MAP_BYTES` on it lives in
    a private anonymous mapping with ordinary pages: NumPy asks the kernel for transparent huge pages for large
    arrays, and where the kernel's defrag setting is `madvise` (common on VMs) the first touch of a fresh 600 MB
    block then stalls in memory compaction (measured here: 1.5-2.4 s against 0.3-0.4 s with ordinary pages, the same
    as torch's allocator). Smaller blocks keep NumPy's allocation: there a stall is short and huge pages fill faster
    (a 6 MB load: 1.3 ms against 3.7 ms).

    `populate=True` (for a block about to be written whole) maps every page at once (`MAP_POPULATE`, where the
    platform has it) instead of one page fault per 4 KiB page on first touch: a 590 MB block is created in about
    half the time (150 ms against 310 ms for fault-and-zero here) and a file is read into it about 15% faster."""
    nbytes = _nbytes(shape, dtype)
    if not _maps_anonymously(nbytes):
        return np.empty(shape, dtype=dtype)
    flags = mmap.MAP_PRIVATE | (getattr(mmap, "MAP_POPULATE", 0) if populate else 0)
    mm = mmap.mmap(-1, nbytes, flags=flags)     # fileno -1: CPython adds MAP_ANONYMOUS
    return np.frombuffer(mm, dtype=dtype, count=nbytes // dtype.itemsize).reshape(shape)


def _prefaulted_zeros(shape: Tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """A zero-filled array whose pages are all touched now. `np.zeros` maps lazily zeroed pages, so the first write
    to each 4 KiB page later faults it in (several microseconds per page on a VM): appends and bulk writes into a
    new in-RAM storage would then pay for page faults at unpredictable moments. Mapping or writing the zeros at
    creation moves that cost to `create` (the reference's torch.zeros does the same). A populated anonymous mapping
    holds zeros already (the kernel zeroes its pages), so only a NumPy allocation is filled."""
    arr = _ram_array(shape, dtype, populate=True)
    if not (_maps_anonymously(_nbytes(shape, dtype)) and hasattr(mmap, "MAP_POPULATE")):
        arr.fill(0)
    return arr


def fill_from_stream(f: Any, out: np.ndarray, what: str) -> None:
    """Fills the C-contiguous array `out` with the next `out.nbytes` bytes of the binary stream `f` (`readinto`
    straight into `out`: one kernel copy, no intermediate buffer); StorageFormatError naming `what` when the stream
    ends first."""
    view = out.reshape(-1).view(np.uint8).data
    done = 0
    while done < len(view):
        n = f.readinto(view[done:])
        if not n:
            raise StorageFormatError(f"{what} ended after {done} of {len(view)} bytes: the file is truncated")
        done += n


#: Reads into RAM from this size on are split over the IO pool's threads (see `read_rows_into`).
_PARALLEL_READ_BYTES = 64 << 20


def _reads_in_parallel(nbytes: int) -> bool:
    return nbytes >= _PARALLEL_READ_BYTES and IO_POOL_WORKERS > 1 and hasattr(os, "preadv")


def read_rows_into(path: str, out: np.ndarray) -> None:
    """Fills the C-contiguous array `out` with the first `out.nbytes` bytes of a raw data file (no intermediate
    mapping or buffer); StorageFormatError when the file is shorter.

    From `_PARALLEL_READ_BYTES` on, the IO pool's threads each read one page-aligned part (`preadv` at its offset):
    a read from the page cache is a memory copy plus a page fault per fresh page of `out`, and both run on every
    core at once (a 590 MB block: 230 ms on 2 threads against 390 ms on one, here)."""
    what = f"data file {path}"
    view = out.reshape(-1).view(np.uint8).data
    if not _reads_in_parallel(len(view)):
        with open(path, "rb", buffering=0) as f:
            fill_from_stream(f, out, what)
        return
    k = IO_POOL_WORKERS
    cuts = [0] + [(len(view) * i // k) & ~(mmap.PAGESIZE - 1) for i in range(1, k)] + [len(view)]
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        def read_part(part: Tuple[int, int]) -> None:
            done, stop = part
            while done < stop:
                n = os.preadv(fd, [view[done:stop]], done)
                if not n:
                    raise StorageFormatError(f"{what} ended after {done} of {len(view)} bytes: the file is truncated")
                done += n
        map_io(read_part, list(zip(cuts[:-1], cuts[1:])), min_parallel=2)
    finally:
        os.close(fd)


def write_rows(f: Any, rows: np.ndarray) -> None:
    """Writes the raw bytes of `rows` to the binary file `f` without an intermediate copy when `rows` is
    C-contiguous (the rows of a storage are; a strided view is written in pieces of at most 64 MiB)."""
    if rows.flags.c_contiguous:
        f.write(rows.reshape(-1).view(np.uint8).data)
        return
    row_bytes = rows.itemsize * int(np.prod(rows.shape[1:], dtype=np.int64))
    step = max(1, (64 << 20) // max(1, row_bytes))
    for i in range(0, rows.shape[0], step):
        f.write(np.ascontiguousarray(rows[i:i + step]).reshape(-1).view(np.uint8).data)


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
            self.data = _prefaulted_zeros((alloc_rows,) + self.row_shape, self.dtype)
        else:
            if not (path is not None):
                raise RuntimeError("internal invariant violated: path is not None")
            self.data, self._mm = _map_file(path, self.dtype, self.row_shape, alloc_rows, writable)
            if mode == SHARED and owner:
                self._finalizer = weakref.finalize(self, remove_quietly, path)

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

    @classmethod
    def read_file(cls, path: str, dtype: np.dtype, row_shape: Tuple[int, ...], rows: int,
                  shared: bool = False) -> "ArrayBlock":
        """An in-RAM block (a fresh shared-memory file when `shared`) holding a copy of the first `rows` rows of an
        existing raw file, read straight into the block's array; StorageFormatError when the file is shorter."""
        if shared:
            block = cls.new_file(SHARED, None, dtype, row_shape, rows)
            try:
                read_rows_into(path, block.data)
            except BaseException:
                block.release()
                raise
            return block
        block = cls(RAM, dtype, row_shape, 0)
        # populated at once for one reader; parallel readers fault their own parts in, each on its own core
        nbytes = _nbytes((rows,) + block.row_shape, block.dtype)
        data = _ram_array((rows,) + block.row_shape, block.dtype, populate=not _reads_in_parallel(nbytes))
        read_rows_into(path, data)
        block.data, block.alloc_rows = data, rows
        return block

    # ---------------------------------------------------------------- size changes
    def resize(self, rows: int) -> None:
        """Changes the number of allocated rows, keeping the first `min(old, new)` rows."""
        if rows == self.alloc_rows:
            return
        if self.mode == RAM:
            new = np.zeros((rows,) + self.row_shape, dtype=self.dtype)   # growth slack stays lazily mapped
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


__all__ = ["ArrayBlock", "RAM", "MEMMAP", "SHARED", "file_rows", "read_rows_into", "fill_from_stream", "write_rows"]
