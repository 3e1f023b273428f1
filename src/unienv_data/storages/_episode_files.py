"""What the storages that keep rows in files of their own share (`VideoStorage`: one file per written run,
`ImageStorage`: one file per row): optional imports, argument and image-space checks, new directories, temporary
files, atomic placement of files, run arithmetic, and `FileRowStorage`, their common base class (length, reads into
the space's backend, the checks of `create` / `load_from`, the row arithmetic of `set` / `shrink_length` / `dumps`).

Files are never modified in place: a file is written under a hidden temporary name and renamed into place, so
hard links (used by `dumps` into another directory) never see a later change.
"""
from __future__ import annotations

from unienv_data.base.common import BatchT
from unienv_interface.backends.base import BArrayType, BDeviceType, BDtypeType, BRNGType
import os
import threading
import uuid
from abc import abstractmethod
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple, TypeVar

import numpy as np

from unienv_data.base.arguments import check_capacity, check_count, import_optional
from unienv_data.base.errors import StorageFormatError, StorageNotFoundError
from unienv_data.base.files import (PathLike, check_format_version, link_or_copy, read_json, remove_quietly,
                                    replacing_allowed, same_file)
from unienv_data.base.indexing import normalize_index
from unienv_data.base.registry import storage_type_name
from unienv_data.base.ring import ring_rows
from unienv_data.base.segments import SegmentLog
from unienv_data.base.leaf_storage import LeafStorage
from unienv_data.base.values import LeafConverter
from unienv_interface.space import BoxSpace, Space

from ._list_helpers import MAX_MASK_ROWS, prepare_new_directory

T = TypeVar("T")
R = TypeVar("R")

#: Prefix of the hidden temporary files a storage writes before renaming them into place; loads ignore them.
TEMP_PREFIX = ".active-"


# ---------------------------------------------------------------------------------------------------- arguments
def image_shape(space: Any, user: str, dtypes: Sequence[str] = ("uint8",)) -> Tuple[int, int, int]:
    """`(height, width, channels)` of an image space: a uint8 BoxSpace of shape (H, W, 3) (RGB), or (H, W) or
    (H, W, 1) (grayscale, channels 1; values keep the space's own shape). Other dtypes of `dtypes` (uint16, for
    storages that keep 16-bit frames) are grayscale only.

    Anything else raises TypeError (not a Box) or ValueError (wrong dtype or shape), naming what is expected."""
    expected = "a uint8 BoxSpace of shape (H, W, 3) (RGB), (H, W) or (H, W, 1) (grayscale)"
    wide = [d for d in dtypes if d != "uint8"]
    if wide:
        expected += f", or a {'/'.join(wide)} BoxSpace of shape (H, W) or (H, W, 1) (16-bit grayscale)"
    if not isinstance(space, Space):
        raise TypeError(f"{user} stores images: expected {expected}, got {type(space).__name__}")
    if not isinstance(space, BoxSpace):
        raise TypeError(f"{user} stores images: expected {expected}, got a {type(space).__name__}")
    dtype_name = space.backend.dtype_name(space.dtype)
    if dtype_name not in dtypes:
        raise ValueError(f"{user} stores images: expected {expected}, got dtype {dtype_name} "
                         f"(convert frames to {' or '.join(dtypes)}, or store them in an array storage)")
    shape = tuple(int(d) for d in space.shape)
    if len(shape) == 3 and shape[2] in (1, 3):
        h, w, c = shape
    elif len(shape) == 2:
        (h, w), c = shape, 1
    else:
        raise ValueError(f"{user} stores images: expected {expected}, got shape {shape}"
                         + (" (channels-first? use HWC)" if len(shape) == 3 and shape[0] in (1, 3) else "")
                         + (" (RGBA is not supported: drop the alpha channel)" if len(shape) == 3 and shape[2] == 4 else ""))
    if h <= 0 or w <= 0:
        raise ValueError(f"{user} stores images: height and width must be positive, got shape {shape}")
    if dtype_name != "uint8" and c != 1:
        raise ValueError(f"{user} stores {dtype_name} frames as 16-bit grayscale only: expected shape (H, W) or "
                         f"(H, W, 1), got {shape} (store {dtype_name} color images in an array storage)")
    return h, w, c


def full_range(space: BoxSpace) -> bool:
    """Whether an unsigned integer box allows every value of its dtype (0..255 for uint8; else lossy reads are
    clipped into its bounds)."""
    top = np.iinfo(np.dtype(space.backend.dtype_name(space.dtype))).max
    return bool(np.all(space.low_numpy == 0) and np.all(space.high_numpy == top))


def reject_extra_args(user: str, args: Sequence[Any], kwargs: Dict[str, Any]) -> None:
    if args:
        raise TypeError(f"{user} takes no extra positional arguments, got {tuple(args)!r}")
    if kwargs:
        raise TypeError(f"{user} got unexpected keyword argument(s) {sorted(kwargs)}")


# ---------------------------------------------------------------------------------------------------- files
def temp_file_path(directory: str, ext: str) -> str:
    """A fresh hidden temporary file name inside `directory` (ignored by loads)."""
    return os.path.join(directory, f"{TEMP_PREFIX}{uuid.uuid4().hex}.tmp.{ext}")


def is_temp_name(name: str) -> bool:
    return name.startswith(TEMP_PREFIX)


def place_copy(src: str, dst: str) -> None:
    """Makes `dst` a copy of `src` atomically (`link_or_copy`), under a temporary name that loads ignore and clean
    up (`temp_file_path`)."""
    ext = dst.rsplit(".", 1)[-1] if "." in os.path.basename(dst) else "bin"
    link_or_copy(src, dst, temp_file_path(os.path.dirname(os.path.abspath(dst)), ext))


# ---------------------------------------------------------------------------------------------------- IO pool
_POOL: Optional[ThreadPoolExecutor] = None
_POOL_PID = -1
IO_WORKERS = max(1, min(8, os.cpu_count() or 1))
_POOL_PREFIX = "unienv-episode-io"
_POOL_LOCK = threading.Lock()


def io_map(fn: Callable[[T], R], items: List[T], min_parallel: int = 2) -> List[R]:
    """`[fn(x) for x in items]`, on a process-wide thread pool when there are at least `min_parallel` items
    (file decoding and encoding release the GIL). Recreated after a fork."""
    global _POOL, _POOL_PID
    if len(items) < min_parallel or IO_WORKERS == 1 or threading.current_thread().name.startswith(_POOL_PREFIX):
        return [fn(x) for x in items]  # small, or already on the pool (waiting on it from inside could deadlock)
    with _POOL_LOCK:
        if _POOL is None or _POOL_PID != os.getpid():
            _POOL = ThreadPoolExecutor(max_workers=IO_WORKERS, thread_name_prefix=_POOL_PREFIX)
            _POOL_PID = os.getpid()
        pool = _POOL
    return list(pool.map(fn, items))


# ---------------------------------------------------------------------------------------------------- runs
def last_occurrences(positions: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """`(unique sorted positions, index of each one's last occurrence in positions)`: duplicates, last one wins."""
    if positions.size <= 1:
        return positions.astype(np.int64, copy=True), np.arange(positions.size, dtype=np.int64)
    rev = positions[::-1]
    uniq, first_rev = np.unique(rev, return_index=True)
    return uniq.astype(np.int64), (positions.size - 1 - first_rev).astype(np.int64)


def copy_repeats(out: np.ndarray, rows: np.ndarray, first: np.ndarray, inverse: np.ndarray) -> None:
    """Fills the rows of repeated keys from their first occurrence: `first` / `inverse` come from
    `np.unique(keys, return_index=True, return_inverse=True)`, `keys[k]` is read into `out[rows[k]]`, and only the
    rows `rows[first]` are filled yet."""
    if first.size != rows.size:
        src = rows[first[inverse]]
        dup = src != rows
        out[rows[dup]] = out[src[dup]]


def consecutive_runs(sorted_positions: np.ndarray) -> List[Tuple[int, int]]:
    """`(offset, length)` of each maximal run of consecutive values in a sorted unique array."""
    n = int(sorted_positions.size)
    if n == 0:
        return []
    breaks = np.flatnonzero(np.diff(sorted_positions) != 1) + 1
    edges = [0] + breaks.tolist() + [n]
    return [(edges[i], edges[i + 1] - edges[i]) for i in range(len(edges) - 1)]


def mask_to_runs(mask: np.ndarray) -> List[List[int]]:
    """`[[start, length], ...]` of the True stretches of a boolean mask."""
    if mask.size == 0:
        return []
    padded = np.concatenate(([False], mask, [False])).astype(np.int8)
    d = np.diff(padded)
    starts, ends = np.flatnonzero(d == 1), np.flatnonzero(d == -1)
    return [[int(s), int(e - s)] for s, e in zip(starts, ends)]


def runs_to_mask(runs: Any, n: int, where: str) -> np.ndarray:
    """The inverse of `mask_to_runs`, validating every `[start, length]` pair against `n` rows."""
    if not isinstance(runs, list):
        raise StorageFormatError(f"{where}: expected a list of [start, length] pairs, got {type(runs).__name__}")
    mask = np.zeros(n, dtype=bool)
    for i, item in enumerate(runs):
        ok = isinstance(item, list) and len(item) == 2 and all(
            isinstance(v, int) and not isinstance(v, bool) for v in item)
        if ok:
            s, k = item
            ok = 0 <= s and 0 < k and s + k <= n
        if not ok:
            raise StorageFormatError(f"{where}: entry {i} = {item!r} is not a valid [start, length] run within {n} rows")
        mask[item[0]:item[0] + item[1]] = True
    return mask


#: Physical rows of a run of `length` rows from `start` (wrapping a ring of `capacity`).
ring_positions = ring_rows


def describe_rows(positions: Iterable[int]) -> str:
    rows = sorted(set(int(p) for p in positions))
    if len(rows) > 6:
        return f"{rows[:3]} ... {rows[-2:]} ({len(rows)} rows)"
    return str(rows)


# ---------------------------------------------------------------------------------------------------- storage base
def check_stored_shape(meta: Dict[str, Any], space: Space, directory: str, what: str) -> None:
    """The metadata's "shape" and "dtype" must be the space's shape and dtype (ValueError otherwise)."""
    want = list(space.shape or ())
    want_dtype = space.backend.dtype_name(space.dtype)
    shape, dtype = meta["shape"], meta["dtype"]
    if not (isinstance(shape, list) and all(type(d) is int and d > 0 for d in shape) and isinstance(dtype, str)):
        raise StorageFormatError(f"{directory}: the metadata's frame shape {shape!r} or dtype {dtype!r} is damaged "
                                 "(expected a list of sizes and a dtype name)")
    if meta["shape"] != want or meta["dtype"] != want_dtype:
        raise ValueError(f"{directory} holds {meta['dtype']} {what} of shape {meta['shape']}, but the space asks for "
                         f"{want_dtype} {want}")


def check_rows_fields(meta: Dict[str, Any], where: str) -> Tuple[Optional[int], int]:
    """`(capacity, length)` of a storage's metadata: a positive int or None, and an int >= 0 equal to a fixed
    capacity; anything else raises StorageFormatError naming `where`."""
    cap, length = meta["capacity"], meta["length"]
    if cap is not None and (not isinstance(cap, int) or isinstance(cap, bool) or cap <= 0):
        raise StorageFormatError(f"{where}: invalid capacity {cap!r}")
    if not isinstance(length, int) or isinstance(length, bool) or length < 0 or (cap is not None and length != cap):
        raise StorageFormatError(f"{where}: invalid length {length!r} for capacity {cap!r}")
    if max(length, cap or 0) > MAX_MASK_ROWS:
        raise StorageFormatError(f"{where}: {max(length, cap or 0)} rows is beyond what a file-backed image storage "
                                 f"holds ({MAX_MASK_ROWS}): the metadata is damaged")
    return cap, length


class FileRowStorage(LeafStorage[BatchT, BArrayType, BDeviceType, BDtypeType, BRNGType]):
    """The part `VideoStorage` and `ImageStorage` share: the rows of an image space (`frame_dtypes`) kept in files of one
    directory, with a fixed capacity (a ring) or growable, written by one process and read by any number (read-only
    opens and pickled copies). Subclasses keep the files and the metadata (`write_metadata`) and read rows
    (`get_numpy`)."""

    single_file_ext: Optional[str] = None
    #: dtypes of the image spaces the storage keeps (see `image_shape`: anything but uint8 is grayscale only)
    frame_dtypes: Tuple[str, ...] = ("uint8",)

    def __init__(self, single_instance_space: Space, directory: str, capacity: Optional[int], length: int,
                 segments: SegmentLog, read_only: bool, exact: bool, value_name: str) -> None:
        super().__init__(single_instance_space)
        self._shape = self._image_shape(single_instance_space)
        self._dtype = np.dtype(single_instance_space.backend.dtype_name(single_instance_space.dtype))
        self._frame_shape = tuple(int(d) for d in (single_instance_space.shape or ()))
        self._dir = directory
        self._capacity = capacity
        self._length = capacity if capacity is not None else length
        self._segments = segments
        self._read_only = read_only
        self._conv = LeafConverter(single_instance_space, value_name)
        box: BoxSpace = single_instance_space  # type: ignore[assignment]
        self._clip = None if (exact or full_range(box)) else (box.low_numpy, box.high_numpy)
        self._meta_dirty = False

    # ------------------------------------------------------------------ arguments of create / load_from
    @classmethod
    def _image_shape(cls, space: Any) -> Tuple[int, int, int]:
        """`image_shape(space)` for the dtypes this storage keeps (`frame_dtypes`)."""
        return image_shape(space, cls.__name__, cls.frame_dtypes)

    @classmethod
    def _check_create_args(cls, space: Space, args: Sequence[Any], kwargs: Dict[str, Any], capacity: Any,
                           multiprocessing: bool) -> Tuple[Tuple[int, int, int], Optional[int]]:
        """`(image shape, capacity)` for `create()`, refusing extra arguments and a multiprocessing writer."""
        reject_extra_args(f"{cls.__name__}.create()", args, kwargs)
        shape = cls._image_shape(space)
        cap = check_capacity(capacity)
        if multiprocessing:
            raise ValueError(f"{cls.__name__} is written by one process: create it with multiprocessing=False and hand "
                             "read-only copies (load_from(read_only=True) or pickling) to reader processes")
        return shape, cap

    @classmethod
    def _check_load_args(cls, space: Space, kwargs: Dict[str, Any], read_only: bool,
                         multiprocessing: bool) -> Tuple[int, int, int]:
        """The image shape for `load_from()`, refusing extra arguments and a writable multiprocessing open."""
        if kwargs:
            raise TypeError(f"{cls.__name__}.load_from() got unexpected keyword argument(s) {sorted(kwargs)}")
        shape = cls._image_shape(space)
        if multiprocessing and not read_only:
            raise ValueError(f"{cls.__name__} is written by one process: multiprocessing=True needs read_only=True")
        return shape

    @classmethod
    def _read_directory(cls, path: PathLike, metadata_file: str) -> Tuple[str, str, Dict[str, Any], int]:
        """`(directory, metadata path, metadata, format version)` of an existing storage directory."""
        directory = os.fspath(path)
        if not os.path.isdir(directory):
            raise StorageNotFoundError(f"{cls.__name__} directory not found: {directory}")
        meta_path = os.path.join(directory, metadata_file)
        meta = read_json(meta_path, f"{cls.__name__} metadata")
        return directory, meta_path, meta, check_format_version(meta, meta_path)

    @classmethod
    def _check_storage_type(cls, meta: Dict[str, Any], where: str) -> None:
        if meta["storage_type"] not in (storage_type_name(cls), cls.__name__):
            article = "an" if cls.__name__[:1] in "AEIOU" else "a"
            raise StorageFormatError(f"{where} describes a {meta['storage_type']!r}, not {article} {cls.__name__}")

    # ------------------------------------------------------------------ properties
    @property
    def cache_filename(self) -> Optional[str]:
        return self._dir

    # ------------------------------------------------------------------ metadata
    @abstractmethod
    def write_metadata(self) -> None:
        """Writes the metadata file of the storage directory (atomically)."""

    @property
    def _dirty(self) -> bool:
        """Whether the metadata file is behind the storage."""
        return self._meta_dirty

    def flush(self) -> None:
        """Writes pending metadata (changes a commit did not write already)."""
        self._check_open()
        if not self._read_only and self._dirty:
            self.write_metadata()

    # ------------------------------------------------------------------ reads
    @abstractmethod
    def get_numpy(self, index: Any) -> np.ndarray:
        """Rows at `index` as a fresh NumPy array of the space's dtype (with a leading batch axis unless the index is an
        int)."""

    def _zeros(self, n: Optional[int]) -> np.ndarray:
        return np.zeros(self._frame_shape if n is None else (n,) + self._frame_shape, dtype=self._dtype)

    def _finish_read(self, out: np.ndarray) -> np.ndarray:
        if self._clip is not None:
            np.clip(out, self._clip[0], self._clip[1], out=out)
        return out

    def get(self, index: Any) -> Any:
        """Row(s) at `index` as arrays of the space's backend (`get_numpy`); rows never written read as zeros."""
        sp = self.single_instance_space
        return sp.backend.from_numpy(self.get_numpy(index), device=sp.device)

    # ------------------------------------------------------------------ writes
    def _rows_to_write(self, index: Any, value: Any) -> Optional[Tuple[np.ndarray, np.ndarray]]:
        """`(rows, values)` that `set(index, value)` writes: the values checked (shape, dtype), the rows of a batch
        unique and sorted (duplicates: the last one wins); None when the index addresses no row."""
        norm = normalize_index(index, self._length, type(self).__name__)
        if norm.single is not None:
            return np.array([norm.single], dtype=np.int64), self._conv.convert(value, ())[None]
        n = norm.count()
        arr = self._conv.convert(value, (n,))
        if n == 0:
            return None
        pos = norm.positions()
        if n > 1:
            pos, src = last_occurrences(pos)
            if pos.size != n or np.any(src != np.arange(n)):
                arr = arr[src]
        return pos, arr

    def _dump_target(self, path: PathLike) -> Optional[str]:
        """The directory `dumps(path)` writes into (created), or None when `path` is this storage's own directory
        (then only pending metadata is written)."""
        self._check_open()
        target = os.fspath(path)
        if os.path.isdir(target) and same_file(target, self._dir):
            if not self._read_only:
                self.write_metadata()
            return None
        os.makedirs(target, exist_ok=True)
        return target

def check_loaded_capacity(storage: "FileRowStorage", capacity: Any) -> None:
    """A `capacity` passed to `load_from()` must be the one `storage` (just opened) was written with."""
    cap_arg = check_capacity(capacity)
    cap = storage.capacity
    if cap_arg is not None and cap_arg != cap:
        hint = "omit capacity (the storage is growable)" if cap is None else f"pass capacity={cap} or omit it"
        raise ValueError(f"{storage.cache_filename} was written with capacity {cap}, not {cap_arg}: {hint}")


__all__ = ["TEMP_PREFIX", "check_loaded_capacity", "import_optional", "check_capacity", "check_count", "image_shape", "full_range",
           "reject_extra_args", "prepare_new_directory", "temp_file_path", "is_temp_name", "remove_quietly", "place_copy",
           "same_file", "io_map", "last_occurrences", "copy_repeats", "consecutive_runs", "mask_to_runs", "runs_to_mask",
           "ring_positions", "describe_rows", "check_stored_shape", "check_rows_fields", "FileRowStorage"]
