"""`HDF5Storage`: samples of a (nested) DictSpace of Box / Binary / Text leaves in one HDF5 file, one dataset per
leaf (reference-api §5.8). NumPy backend; needs the `hdf5` extra (h5py).

File layout (the reference's): a DictSpace maps to groups and datasets by key (`obs/pos` is the dataset `pos` in the
group `obs`); a non-dict space is the dataset `data`. Row `i` of the storage is row `i` of every dataset.

* Fixed capacity, no compression, no chunks (the default): contiguous datasets of exactly `capacity` rows,
  allocated at creation. Opened from a file on disk, such datasets are **memory-mapped**: reads and writes are NumPy
  copies into / out of the file's pages, with no HDF5 call per access (HDF5 still owns the file structure).
* Compression (`compression="gzip" | "lzf" | ...`, `compression_level`) or `chunks` (a tuple of leading rows, padded
  with the row shape; `True` lets the storage pick whole-row chunks of about 64 KiB): chunked datasets; each option
  may be a mapping from a key path (`"obs/pos"`, or a top-level key) to its value, `"*"` for the rest.
* `capacity=None`: growable (resizable, chunked) datasets. Appends grow them geometrically; `flush` / `dumps` /
  `close` trim them to the length again, so the file always describes exactly its rows when it is at rest.
* This library's bookkeeping is the JSON root attribute `unienv_storage` (`format_version`, `capacity`, `length`,
  `segments`, `space`): the reference ignores it, and files without it (the reference's) open with no segments.

Batch reads sort and de-duplicate the indices (h5py needs increasing selections), read dense spans as one block
and sparse ones with one selection, then restore the caller's order. Writes check the whole value first (keys,
shapes, dtypes, bounds), so a refused write changes nothing; with duplicate indices the last occurrence wins.

Processes: a pickled HDF5Storage is a read-only reader that reopens the file lazily where it is unpickled; a
storage inherited through `fork` reopens the file (read-only) on first use in the child and never touches the
parent's handle; writable storages are flushed before every `fork`. Only the storage that created or opened the
file writable may write it (`multiprocessing=True` only for read-only loads).

Differences from the reference, on purpose: errors are exceptions that say what to pass instead (`pass
capacity=4`) rather than assertions; a file whose datasets do not match the space is refused with every mismatch
named; segments are recorded and persisted; text leaves are stored as variable-length UTF-8 strings (the reference
reads them); an in-memory storage (no `cache_path`) is allowed and `dumps` writes it to a file.
"""
from __future__ import annotations

import json
import mmap
import os
import uuid
import weakref
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from unienv_data.base.errors import StorageFormatError, StorageNotFoundError, StorageStateError
from unienv_data.base.files import FORMAT_VERSION, PathLike, check_format_version, is_durable
from unienv_data.base.indexing import NormalizedIndex, normalize_index
from unienv_data.base.registry import register_storage, storage_type_name
from unienv_data.base.segments import SegmentLog
from unienv_data.base.storage import SpaceStorage
from unienv_interface.backends import NumpyComputeBackend
from unienv_interface.space import BinarySpace, BoxSpace, DictSpace, Space, TextSpace
from unienv_interface.space.space_utils.serialization_utils import json_to_space, space_to_json

from ._column_view import ColumnView
from ._list_storage import (Leaf, LeafTree, check_capacity, check_count, check_stored_space, describe_leaf,
                            require_module, temp_name)

META_ATTR = "unienv_storage"
DEFAULT_KEY = "data"
#: Target bytes of one chunk when the storage picks the chunk shape.
CHUNK_TARGET_BYTES = 64 * 1024
#: A sparse batch read fetches the whole [min, max] row span when it is at most this many bytes ...
_SPAN_READ_BYTES = 1 << 20
#: ... or at most this many times the bytes actually asked for.
_SPAN_READ_FACTOR = 4
#: Rows copied per block by dumps / clear.
_BLOCK_BYTES = 64 << 20

_ABANDONED: List[Any] = []          # h5py handles inherited through fork: never closed in the child
_WRITERS: "weakref.WeakSet[HDF5Storage]" = weakref.WeakSet()


def _h5py() -> Any:
    return require_module("h5py", "hdf5", "HDF5Storage")


def _flush_writers_before_fork() -> None:
    for st in list(_WRITERS):
        try:
            if not st._closed and st._file is not None and st._pid == os.getpid():
                st.flush()
        except Exception:  # noqa: BLE001 - a failing flush must not break fork()
            pass


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_flush_writers_before_fork)


# ---------------------------------------------------------------------------------------------------- low level
def _ll_read(ds: Any, start: int, n: int, shape: Tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """Rows `[start, start + n)` of a numeric dataset through one HDF5 hyperslab read."""
    out = np.empty((n,) + shape, dtype=dtype)
    if n == 0 or out.size == 0:
        return out
    h5s = _h5py().h5s
    fs = ds.id.get_space()
    fs.select_hyperslab((start,) + (0,) * len(shape), (n,) + shape)
    ds.id.read(h5s.create_simple(out.shape), fs, out)
    return out


def _ll_write(ds: Any, start: int, arr: np.ndarray) -> None:
    """`ds[start:start + len(arr)] = arr` through one HDF5 hyperslab write (arr already in the dataset's dtype)."""
    if arr.size == 0:
        return
    if not arr.flags.c_contiguous:
        arr = np.array(arr, order="C")
    h5s = _h5py().h5s
    fs = ds.id.get_space()
    fs.select_hyperslab((start,) + (0,) * (arr.ndim - 1), arr.shape)
    ds.id.write(h5s.create_simple(arr.shape), fs, arr)


def _runs(sorted_unique: np.ndarray) -> List[Tuple[int, int]]:
    """`(first position, count)` of every run of consecutive values in a sorted, duplicate-free array."""
    if not sorted_unique.size:
        return []
    breaks = np.flatnonzero(np.diff(sorted_unique) != 1) + 1
    starts = np.concatenate(([0], breaks))
    ends = np.concatenate((breaks, [sorted_unique.size]))
    return list(zip(starts.tolist(), (ends - starts).tolist()))


def _last_wins(pos: np.ndarray) -> Tuple[np.ndarray, Optional[np.ndarray]]:
    """`(sorted unique positions, which value to write at each)` with the last occurrence of a duplicate winning;
    the second item is None when `pos` already is sorted and unique."""
    if pos.size <= 1 or bool(np.all(pos[1:] > pos[:-1])):
        return pos, None
    uniq, first_rev = np.unique(pos[::-1], return_index=True)
    return uniq, pos.size - 1 - first_rev


class _Column:
    """One leaf's dataset, and its rows as an array over the file's memory map when the dataset is contiguous in a
    file on disk (`arr`; None otherwise)."""

    __slots__ = ("leaf", "ds", "arr", "shape", "dtype", "row_bytes")

    def __init__(self, leaf: Leaf, ds: Any, arr: Optional[np.ndarray]) -> None:
        self.leaf = leaf
        self.ds = ds
        self.arr = arr
        self.shape = leaf.shape
        self.dtype = leaf.dtype
        self.row_bytes = max(1, leaf.row_bytes)


def _leaf_spec(leaf: Leaf) -> str:
    return describe_leaf(leaf.space)


def _dataset_spec(ds: Any) -> str:
    h5py = _h5py()
    if h5py.check_string_dtype(ds.dtype) is not None:
        return "text"
    return f"{ds.dtype}{list(ds.shape[1:])}"


def _option_for(option: Any, leaf: Leaf, what: str) -> Any:
    """A per-leaf value of a create() option: the option itself, or from a mapping by key path / top key / '*'."""
    if not isinstance(option, Mapping):
        return option
    for key in (leaf.name, leaf.path[0] if leaf.path else DEFAULT_KEY, "*"):
        if key in option:
            return option[key]
    return None


def _auto_chunks(leaf: Leaf, capacity: Optional[int]) -> Tuple[int, ...]:
    rows = max(1, CHUNK_TARGET_BYTES // max(1, leaf.row_bytes))
    if capacity is not None:
        rows = min(rows, capacity)
    return (rows,) + leaf.shape


def _chunk_shape(chunks: Any, leaf: Leaf, capacity: Optional[int]) -> Optional[Tuple[int, ...]]:
    """The chunk shape of a leaf's dataset (None: contiguous)."""
    if chunks is None or chunks is True:
        return _auto_chunks(leaf, capacity) if chunks is True else None
    if chunks is False:
        return None
    if isinstance(chunks, (int, np.integer)) and not isinstance(chunks, bool):
        chunks = (int(chunks),)
    if not isinstance(chunks, (tuple, list)) or not chunks or not all(
            isinstance(c, (int, np.integer)) and not isinstance(c, bool) and c > 0 for c in chunks):
        raise ValueError(f"chunks for {leaf.name!r} must be None, True, False or a tuple of positive ints, got {chunks!r}")
    full = (tuple(int(c) for c in chunks) + (leaf.shape if leaf.conv is not None else ())[len(chunks) - 1:])
    rank = 1 + len(leaf.shape)
    if len(full) != rank:
        raise ValueError(f"chunks {tuple(chunks)!r} for {leaf.name!r} have more dimensions than its rows "
                         f"({rank}: rows x {list(leaf.shape)})")
    if capacity is not None and full[0] > capacity:
        raise ValueError(f"chunks for {leaf.name!r} hold {full[0]} rows, more than the capacity {capacity}; pass at most "
                         f"chunks=({capacity},)")
    if any(c > s for c, s in zip(full[1:], leaf.shape)):
        raise ValueError(f"chunks {full!r} for {leaf.name!r} exceed its row shape {list(leaf.shape)}")
    return full


def _create_dataset(group: Any, name: str, leaf: Leaf, rows: int, capacity: Optional[int], *,
                    compression: Any = None, compression_opts: Any = None, chunks: Any = None,
                    extra: Optional[Dict[str, Any]] = None, on_disk: bool = True) -> Any:
    """Creates one leaf's dataset. Fixed capacity without filters or chunks: contiguous and allocated at once
    (so it can be memory-mapped); otherwise chunked, resizable up to the capacity (None: unlimited)."""
    h5py = _h5py()
    if leaf.conv is None:
        dtype: Any = h5py.string_dtype("utf-8")
    else:
        dtype = leaf.dtype
    shape = (rows,) + leaf.shape
    contiguous = capacity is not None and compression is None and chunks is None and not extra
    if contiguous:
        h5d, h5p, h5s, h5t = h5py.h5d, h5py.h5p, h5py.h5s, h5py.h5t
        dcpl = h5p.create(h5p.DATASET_CREATE)
        dcpl.set_alloc_time(h5d.ALLOC_TIME_EARLY)
        # on disk, space beyond the old end of file reads as zeros already; in memory, HDF5 writes the zeros
        dcpl.set_fill_time(h5d.FILL_TIME_NEVER if on_disk and leaf.conv is not None else h5d.FILL_TIME_ALLOC)
        tid = h5t.py_create(np.dtype(dtype), logical=True)
        h5d.create(group.id, name.encode("utf-8"), tid, h5s.create_simple(shape), dcpl=dcpl)
        return group[name]
    chunk_shape = chunks if chunks is not None else _auto_chunks(leaf, capacity)
    return group.create_dataset(name, shape=shape, maxshape=(capacity,) + leaf.shape, dtype=dtype,
                                chunks=chunk_shape, compression=compression, compression_opts=compression_opts,
                                **(extra or {}))


def _walk_datasets(group: Any, prefix: str = "") -> List[str]:
    """Every dataset path under `group` (names starting with '.' or '_' skipped, as the reference does)."""
    h5py = _h5py()
    out = []
    for key, item in group.items():
        if key.startswith(".") or key.startswith("_"):
            continue
        if isinstance(item, h5py.Dataset):
            out.append(prefix + key)
        elif isinstance(item, h5py.Group):
            out.extend(_walk_datasets(item, prefix + key + "/"))
    return out


def _read_meta(f: Any, where: str) -> Optional[Dict[str, Any]]:
    raw = f.attrs.get(META_ATTR)
    if raw is None:
        return None
    if isinstance(raw, bytes):
        raw = raw.decode("utf-8", "replace")
    try:
        meta = json.loads(str(raw))
    except json.JSONDecodeError as exc:
        raise StorageFormatError(f"{where}: the attribute {META_ATTR!r} is damaged (not valid JSON: {exc})") from None
    if not isinstance(meta, dict):
        raise StorageFormatError(f"{where}: the attribute {META_ATTR!r} must hold a JSON object")
    check_format_version(meta, where)
    return meta


_LOCKING_ARG = {(1, 0): True, (0, 0): False, (1, 1): "best-effort"}


def _locking_in_process(path: str, wanted: Any) -> Any:
    """The `locking` argument for opening `path`: HDF5 shares one file object per process and refuses a second open
    whose locking flags differ, so a file already open here is opened again with its own flags."""
    h5f = _h5py().h5f
    try:
        if not h5f.get_obj_count(types=h5f.OBJ_FILE):
            return wanted
        ids = h5f.get_obj_ids(types=h5f.OBJ_FILE)
    except Exception:  # noqa: BLE001 - no open files, or an h5py without this call
        return wanted
    for fid in ids:
        try:
            name = fid.name.decode("utf-8", "surrogateescape") if isinstance(fid.name, bytes) else str(fid.name)
            if not os.path.exists(name) or not os.path.samefile(name, path):
                continue
            flags = tuple(int(v) for v in fid.get_access_plist().get_file_locking())
        except Exception:  # noqa: BLE001 - a file id that cannot tell: keep looking
            continue
        return _LOCKING_ARG.get(flags, wanted)  # type: ignore[arg-type]
    return wanted


def _open_file(path: str, mode: str, what: str, **kwargs: Any) -> Any:
    """`h5py.File(path, mode)`; readers do not take HDF5's file lock (they coexist with the one writer process),
    unless `kwargs` says otherwise. Errors name the file and what is wrong with it."""
    h5py = _h5py()
    if "locking" not in kwargs:
        wanted = False if mode == "r" else None
        got = _locking_in_process(path, wanted)
        if got is not None:
            kwargs["locking"] = got
    try:
        return h5py.File(path, mode, **kwargs)
    except TypeError as exc:
        raise TypeError(f"{what}: {exc} (extra keyword arguments are passed to h5py.File)") from None
    except FileNotFoundError:
        raise StorageNotFoundError(f"{what}: file not found: {path}") from None
    except PermissionError:
        raise
    except OSError as exc:
        msg = str(exc)
        if "already open" in msg or "file locking" in msg or "unable to lock" in msg.lower():
            raise StorageStateError(f"{what}: cannot open {path} ({msg}); another handle holds it") from None
        raise StorageFormatError(f"{what}: {path} is not a readable HDF5 file ({msg}); it may be truncated or "
                                 "corrupted") from None


# ---------------------------------------------------------------------------------------------------- storage
@register_storage
class HDF5Storage(SpaceStorage[Any, Any, Any, Any, Any]):
    """Samples of a NumPy DictSpace / Box / Binary / Text space in one HDF5 file (see the module docstring).

    `create(single_instance_space, capacity=None, cache_path=None, multiprocessing=False, initial_capacity=None,
    compression=None, compression_level=None, chunks=None, reduce_io=True, use_mmap=True, **h5py_File_kwargs)`:
    `capacity` is positional-or-keyword (None: growable, starting with `initial_capacity` zero rows); without
    `cache_path` the file lives in memory until `dumps`. `compression_level` without `compression` means gzip. `load_from(path, space, *, capacity=None,
    read_only=True, multiprocessing=False, reduce_io=True, use_mmap=True, **h5py_File_kwargs)` takes the capacity
    from the file (a `capacity` argument must agree). `get_column(keys)` gives a view of a sub-dict or leaf.
    """

    single_file_ext: Optional[str] = ".hdf5"
    DEFAULT_KEY = DEFAULT_KEY

    def __init__(self, single_instance_space: Space, path: Optional[str], capacity: Optional[int], length: int,
                 segments: Optional[SegmentLog] = None, *, read_only: bool = False, reduce_io: bool = True,
                 use_mmap: bool = True, h5py_kwargs: Optional[Dict[str, Any]] = None, image: Optional[bytes] = None,
                 owner: bool = True) -> None:
        super().__init__(single_instance_space)
        self._tree = self._make_tree(single_instance_space)
        self._path = path
        self._capacity = capacity
        self._length = capacity if capacity is not None else length
        self._segments = segments if segments is not None else SegmentLog(capacity)
        self._read_only = read_only
        self._reduce_io = bool(reduce_io)
        self._use_mmap = bool(use_mmap)
        self._h5_kwargs = dict(h5py_kwargs or {})
        self._owner = owner
        self._image = image
        self._file: Any = None
        self._pid = os.getpid()
        self._cols: Optional[List[_Column]] = None
        self._mmap: Optional[mmap.mmap] = None
        self._alloc = self._length
        self._meta_dirty = False
        self._saved_log_version = self._segments.version
        if not read_only and owner:
            _WRITERS.add(self)

    @classmethod
    def _make_tree(cls, space: Space) -> LeafTree:
        if not isinstance(space, Space):
            raise TypeError(f"single_instance_space must be a Space, got {type(space).__name__}")
        if space.backend is not NumpyComputeBackend and getattr(space.backend, "simplified_name", "") != "numpy":
            raise TypeError(f"{cls.__name__} stores NumPy-backend spaces, got {space.backend}; wrap it with "
                            "ToBackendOrDeviceStorage to serve another backend")
        dev = space.device
        if dev is not None and str(dev) not in ("cpu", "cpu:0"):
            raise ValueError(f"{cls.__name__} keeps rows on the CPU; the space's device must be cpu or None, got {dev!r}")
        return LeafTree(space, cls.__name__, DEFAULT_KEY)

    # ------------------------------------------------------------------ construction
    @classmethod
    def create(cls, single_instance_space: Space, capacity: Optional[int] = None,  # type: ignore[override]
               cache_path: Optional[PathLike] = None, multiprocessing: bool = False,
               initial_capacity: Optional[int] = None, compression: Any = None, compression_level: Any = None,
               chunks: Any = None, reduce_io: bool = True, use_mmap: bool = True, **h5py_kwargs: Any) -> "HDF5Storage":
        """A new storage; an existing file at `cache_path` is replaced (see the class docstring)."""
        tree = cls._make_tree(single_instance_space)
        cap = check_capacity(capacity)
        if multiprocessing:
            raise ValueError(f"{cls.__name__} is written by one process: create it with multiprocessing=False, then "
                             "give reader processes pickled copies or load_from(path, read_only=True, "
                             "multiprocessing=True)")
        if cap is not None:
            if initial_capacity is not None and initial_capacity != cap:
                raise ValueError(f"initial_capacity ({initial_capacity!r}) applies to growable storages; with "
                                 f"capacity={cap} omit it or pass initial_capacity={cap}")
            rows = cap
        else:
            rows = check_count(0 if initial_capacity is None else initial_capacity, "initial_capacity")
        h5py = _h5py()
        if cache_path is None:
            if "driver" in h5py_kwargs:
                raise ValueError("pass cache_path to use an HDF5 driver; without it the file lives in memory")
            f = h5py.File(f"unienv-memory-{uuid.uuid4().hex}.hdf5", "w", driver="core", backing_store=False,
                          **h5py_kwargs)
            path = None
        else:
            path = os.fspath(cache_path)
            if os.path.isdir(path):
                raise IsADirectoryError(f"{cls.__name__}: cache_path {path} is a directory; pass a file path (e.g. "
                                        f"{os.path.join(path, 'storage.hdf5')})")
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            try:
                f = h5py.File(path, "w", **h5py_kwargs)
            except OSError as exc:
                raise StorageStateError(f"{cls.__name__}: cannot create {path} ({exc}); is it open elsewhere?") from None
        try:
            on_disk = path is not None and f.driver == "sec2"
            for leaf in tree.leaves:
                comp = _option_for(compression, leaf, "compression")
                level = _option_for(compression_level, leaf, "compression_level")
                chunk = _chunk_shape(_option_for(chunks, leaf, "chunks"), leaf, cap)
                if comp is None and level is not None:
                    comp = "gzip"
                group = f
                for p in leaf.path[:-1]:
                    group = group.require_group(p)
                name = leaf.path[-1] if leaf.path else DEFAULT_KEY
                if cap is None or comp is not None or leaf.conv is None:
                    if chunk is None:
                        chunk = _auto_chunks(leaf, cap)
                try:
                    _create_dataset(group, name, leaf, rows, cap, compression=comp, compression_opts=level,
                                    chunks=chunk, on_disk=on_disk)
                except (ValueError, TypeError) as exc:
                    raise ValueError(f"{cls.__name__}: cannot create the dataset {leaf.name!r} with compression={comp!r}, "
                                     f"compression_level={level!r}, chunks={chunk!r}: {exc}") from None
            st = cls(single_instance_space, path, cap, rows, read_only=False, reduce_io=reduce_io, use_mmap=use_mmap,
                     h5py_kwargs=h5py_kwargs)
            st._attach(f)
            st._meta_dirty = True
            st.flush()
        except BaseException:
            f.close()
            raise
        return st

    @classmethod
    def load_from(cls, path: PathLike, single_instance_space: Space, *, capacity: Optional[int] = None,
                  read_only: bool = True, multiprocessing: bool = False, reduce_io: bool = True, use_mmap: bool = True,
                  **h5py_kwargs: Any) -> "HDF5Storage":
        """Opens an HDF5 file written by this library or by the reference, checking it against the space."""
        tree = cls._make_tree(single_instance_space)
        cap_arg = check_capacity(capacity)
        if multiprocessing and not read_only:
            raise ValueError(f"{cls.__name__} cannot be written by several processes: load it with read_only=True for "
                             "reader processes, or multiprocessing=False to write it from this one")
        path = os.fspath(path)
        if not os.path.isfile(path):
            raise StorageNotFoundError(f"{cls.__name__} file not found: {path}")
        if not read_only and not os.access(path, os.W_OK):
            raise PermissionError(f"{path} is not writable; load it with read_only=True")
        f = _open_file(path, "r" if read_only else "r+", cls.__name__, **h5py_kwargs)
        try:
            cap, length, segments = cls._check_file(f, tree, cap_arg, read_only, path)
            st = cls(single_instance_space, path, cap, length, segments, read_only=read_only, reduce_io=reduce_io,
                     use_mmap=use_mmap, h5py_kwargs=h5py_kwargs)
            st._alloc = cls._rows_in_file(f, tree)
            st._attach(f)
        except BaseException:
            f.close()
            raise
        return st

    @staticmethod
    def _rows_in_file(f: Any, tree: LeafTree) -> int:
        return int(f[tree.leaves[0].name].shape[0])

    @classmethod
    def _check_file(cls, f: Any, tree: LeafTree, cap_arg: Optional[int], read_only: bool,
                    path: str) -> Tuple[Optional[int], int, SegmentLog]:
        """Checks every dataset against the space; returns (capacity, length, segments)."""
        h5py = _h5py()
        problems: List[str] = []
        rows: Dict[str, Tuple[int, Optional[int]]] = {}
        for leaf in tree.leaves:
            item = f.get(leaf.name)
            if item is None:
                problems.append(f"no dataset {leaf.name!r} (the space has {_leaf_spec(leaf)})")
                continue
            if not isinstance(item, h5py.Dataset):
                problems.append(f"{leaf.name!r} is a group, not a dataset (the space has {_leaf_spec(leaf)})")
                continue
            if item.ndim < 1:
                problems.append(f"dataset {leaf.name!r} is a scalar, not rows")
                continue
            is_text = h5py.check_string_dtype(item.dtype) is not None
            if leaf.conv is None:
                if not is_text or item.ndim != 1:
                    problems.append(f"dataset {leaf.name!r} holds {_dataset_spec(item)}, the space has text")
            elif is_text or item.dtype != leaf.dtype or tuple(item.shape[1:]) != leaf.shape:
                problems.append(f"dataset {leaf.name!r} holds {_dataset_spec(item)}, the space has {_leaf_spec(leaf)}")
            rows[leaf.name] = (int(item.shape[0]), item.maxshape[0])
        known = {leaf.name for leaf in tree.leaves}
        extra = [n for n in _walk_datasets(f) if n not in known and not any(n.startswith(k + "/") for k in known)]
        if extra and not read_only:
            problems.append(f"the file also holds datasets the space lacks: {extra} (pass the full space, or load with "
                            "read_only=True to read a subset)")
        if problems:
            raise ValueError(f"{path} does not match the space: " + "; ".join(problems))
        shapes = set(rows.values())
        if len(shapes) != 1:
            raise StorageFormatError(f"{path}: the datasets disagree on their number of rows: "
                                     + ", ".join(f"{k}: {n} (max {m})" for k, (n, m) in rows.items())
                                     + "; the file is damaged")
        n_rows, max_rows = shapes.pop()
        if max_rows is not None and max_rows != n_rows:
            raise StorageFormatError(f"{path}: datasets hold {n_rows} rows but may grow to {max_rows}; this layout is not "
                                     "a storage (fixed capacity needs equal current and maximum rows)")
        meta = _read_meta(f, path)
        file_cap = max_rows
        length = n_rows
        segments = SegmentLog(file_cap)
        if meta is not None:
            stored_cap = meta.get("capacity")
            if stored_cap != file_cap:
                raise StorageFormatError(f"{path}: the metadata says capacity {stored_cap!r}, the datasets {file_cap!r}; "
                                         "the file is damaged")
            mlen = meta.get("length", n_rows)
            if isinstance(mlen, bool) or not isinstance(mlen, int) or not 0 <= mlen <= n_rows \
                    or (file_cap is not None and mlen != file_cap):
                raise StorageFormatError(f"{path}: the metadata length {mlen!r} does not fit the {n_rows} rows of the "
                                         "datasets; the file is damaged")
            length = mlen
            segments = SegmentLog.from_json(meta.get("segments", []), file_cap, length, f"{path}:{META_ATTR}")
            if "space" in meta:
                check_stored_space(meta["space"], tree, path)
        if cap_arg is not None and cap_arg != file_cap:
            if file_cap is None:
                raise ValueError(f"{path} is growable (its datasets have no fixed number of rows; it holds {length}): "
                                 f"omit capacity, not capacity={cap_arg}")
            raise ValueError(f"{path} holds a fixed capacity of {file_cap} rows, not {cap_arg}: pass capacity={file_cap} "
                             "or omit it")
        return file_cap, length, segments

    # ------------------------------------------------------------------ file handle
    def _attach(self, f: Any) -> None:
        """Uses the open file `f` and resolves (and memory-maps where possible) every leaf's dataset."""
        on_disk = self._path is not None and f.driver == "sec2" and self._use_mmap
        datasets = [f[leaf.name] for leaf in self._tree.leaves]
        places = [self._contiguous_place(ds, leaf) if on_disk else None for ds, leaf in zip(datasets, self._tree.leaves)]
        self._mmap = None
        if any(p is not None for p in places):
            f.flush()  # early-allocated datasets reach the end of the file on disk
            self._mmap = self._map_file(max(off + n for off, n in (p for p in places if p is not None)))
        cols = []
        for ds, leaf, place in zip(datasets, self._tree.leaves, places):
            arr = None
            if place is not None and self._mmap is not None:
                arr = np.ndarray(tuple(ds.shape), dtype=ds.dtype, buffer=self._mmap, offset=place[0])
            cols.append(_Column(leaf, ds, arr))
        self._file = f
        self._cols = cols
        self._pid = os.getpid()

    @staticmethod
    def _contiguous_place(ds: Any, leaf: Leaf) -> Optional[Tuple[int, int]]:
        """`(file offset, bytes)` of a dataset whose rows lie contiguous in the file in the leaf's native dtype."""
        if leaf.conv is None or ds.chunks is not None or ds.compression is not None or ds.dtype != leaf.dtype \
                or not ds.dtype.isnative or ds.size == 0:
            return None
        try:
            if ds.id.get_create_plist().get_external_count():
                return None
            offset = ds.id.get_offset()
            nbytes = int(ds.size) * ds.dtype.itemsize
            if offset is None or ds.id.get_storage_size() < nbytes:
                return None
        except Exception:  # noqa: BLE001 - anything unusual: read through HDF5
            return None
        return int(offset), nbytes

    def _map_file(self, end: int) -> Optional[mmap.mmap]:
        """One shared memory map of the file (read-only when the storage is), or None when the file is shorter
        than `end` bytes (then every leaf is read through HDF5)."""
        if self._path is None:
            raise RuntimeError("internal invariant violated: only files on disk are memory-mapped")
        fd = os.open(self._path, os.O_RDONLY if self._read_only else os.O_RDWR)
        try:
            size = os.fstat(fd).st_size
            if size < end:
                return None
            return mmap.mmap(fd, size, access=mmap.ACCESS_READ if self._read_only else mmap.ACCESS_WRITE)
        finally:
            os.close(fd)

    def _columns(self) -> List[_Column]:
        """The leaf columns, (re)opening the file where needed (after unpickling, or in a forked child)."""
        if self._closed:
            self._check_open()
        cols = self._cols
        if cols is not None and self._pid == os.getpid():
            return cols
        if self._file is not None and self._path is None:
            self._pid = os.getpid()  # an in-memory file is a private copy in a forked child: keep using it
            return self._cols  # type: ignore[return-value]
        if self._file is not None:
            _ABANDONED.append(self._file)  # the parent's handle: closing it here could write into the parent's file
            self._file = None
            self._cols = None
            self._read_only = True
            self._owner = False
        self._reopen()
        return self._cols  # type: ignore[return-value]

    def _reopen(self) -> None:
        h5py = _h5py()
        if self._path is None:
            if self._image is None:
                raise StorageStateError(f"{type(self).__name__}: the in-memory file is gone")
            fapl = h5py.h5p.create(h5py.h5p.FILE_ACCESS)
            fapl.set_fapl_core(backing_store=False)
            fapl.set_file_image(self._image)
            name = f"unienv-memory-{uuid.uuid4().hex}.hdf5".encode()
            flags = h5py.h5f.ACC_RDONLY if self._read_only else h5py.h5f.ACC_RDWR
            f = h5py.File(h5py.h5f.open(name, flags, fapl=fapl))
            self._image = None
        else:
            f = _open_file(self._path, "r" if self._read_only else "r+", type(self).__name__, **self._h5_kwargs)
            self._check_file(f, self._tree, None, True, self._path)
        self._attach(f)
        self._alloc = self._rows_in_file(f, self._tree)

    # ------------------------------------------------------------------ properties
    @property
    def capacity(self) -> Optional[int]:
        return self._capacity

    def __len__(self) -> int:
        return self._length

    @property
    def cache_filename(self) -> Optional[str]:
        return self._path

    @property
    def is_mutable(self) -> bool:
        return not self._read_only

    @property
    def is_multiprocessing_safe(self) -> bool:
        return self._read_only

    @property
    def reduce_io(self) -> bool:
        return self._reduce_io

    @property
    def memory_mapped_keys(self) -> List[str]:
        """The leaves read and written through a memory map (contiguous datasets of a file on disk)."""
        return [c.leaf.name for c in self._columns() if c.arr is not None]

    def _segment_log(self) -> Optional[SegmentLog]:
        return self._segments

    @property
    def _dirty(self) -> bool:
        return self._meta_dirty or self._segments.version != self._saved_log_version

    def _norm(self, index: Any) -> NormalizedIndex:
        return normalize_index(index, self._length, type(self).__name__)

    # ------------------------------------------------------------------ reads
    def _read_sorted(self, col: _Column, uniq: np.ndarray) -> np.ndarray:
        n = int(uniq.size)
        if n == 0:
            return np.zeros((0,) + col.shape, dtype=col.dtype)
        lo, hi = int(uniq[0]), int(uniq[-1]) + 1
        if hi - lo == n:
            return _ll_read(col.ds, lo, n, col.shape, col.dtype)
        if not self._reduce_io:
            return np.asarray(col.ds[uniq])
        if (hi - lo) * col.row_bytes <= max(_SPAN_READ_BYTES, _SPAN_READ_FACTOR * n * col.row_bytes):
            return _ll_read(col.ds, lo, hi - lo, col.shape, col.dtype)[uniq - lo]
        return np.asarray(col.ds[uniq])

    def _read_text(self, col: _Column, norm: NormalizedIndex) -> Any:
        strs = col.ds.asstr()
        if norm.single is not None:
            return str(strs[norm.single])
        pos = norm.positions()
        out = np.empty(pos.size, dtype=object)
        if pos.size:
            uniq, inv = np.unique(pos, return_inverse=True)
            got = strs[uniq]
            vals = np.empty(uniq.size, dtype=object)
            vals[:] = [str(v) for v in got]
            out[:] = vals[inv.reshape(-1)]
        return out

    def _read_col(self, col: _Column, norm: NormalizedIndex) -> Any:
        arr = col.arr
        if arr is not None:
            if norm.single is not None:
                return np.array(arr[norm.single])
            if norm.slc is not None:
                return np.array(arr[norm.slc])
            return arr.take(norm.array, axis=0)  # type: ignore[arg-type]
        if col.leaf.conv is None:
            return self._read_text(col, norm)
        try:
            if norm.single is not None:
                return _ll_read(col.ds, norm.single, 1, col.shape, col.dtype).reshape(col.shape)
            if norm.slc is not None and norm.slc.step == 1:
                return _ll_read(col.ds, norm.slc.start, norm.slc.stop - norm.slc.start, col.shape, col.dtype)
            pos = norm.positions()
            uniq, inv = np.unique(pos, return_inverse=True)
            block = self._read_sorted(col, uniq)
            if uniq.size == pos.size and np.array_equal(uniq, pos):
                return block
            return block[inv.reshape(-1)]
        except OSError as exc:
            raise StorageFormatError(f"{self._path or 'in-memory file'}: cannot read dataset {col.leaf.name!r} ({exc}); "
                                     "the file is damaged") from None

    def _read_leaves(self, norm: NormalizedIndex, which: Optional[Sequence[int]] = None) -> List[Any]:
        cols = self._columns()
        if which is None:
            return [self._read_col(c, norm) for c in cols]
        return [self._read_col(cols[i], norm) for i in which]

    def get(self, index: Any) -> Any:
        """Sample(s) at `index`: one for an int-like index, else a batch (fresh NumPy arrays; str for text)."""
        self._check_open()
        norm = self._norm(index)
        return self._tree.assemble(self._read_leaves(norm))

    # ------------------------------------------------------------------ writes
    def _write_col(self, col: _Column, norm: NormalizedIndex, value: Any) -> None:
        arr = col.arr
        if arr is not None:
            if norm.single is not None:
                arr[norm.single] = value
            elif norm.slc is not None:
                arr[norm.slc] = value
            else:
                pos, keep = _last_wins(norm.array)  # type: ignore[arg-type]
                arr[pos] = value if keep is None else value[keep]
            return
        ds = col.ds
        if col.leaf.conv is None:
            if norm.single is not None:
                ds[norm.single] = value
                return
            pos = norm.positions()
            pos, keep = _last_wins(pos)
            vals = value if keep is None else value[keep]
            if pos.size:
                ds[pos] = np.asarray(list(vals), dtype=object)
            return
        try:
            if norm.single is not None:
                _ll_write(ds, norm.single, np.asarray(value)[None])
            elif norm.slc is not None and norm.slc.step == 1:
                _ll_write(ds, norm.slc.start, np.asarray(value))
            else:
                pos, keep = _last_wins(norm.positions())
                vals = value if keep is None else value[keep]
                runs = _runs(pos)
                if len(runs) <= 32 or not self._reduce_io:
                    for first, n in runs:
                        _ll_write(ds, int(pos[first]), vals[first:first + n])
                else:
                    ds[pos] = vals
        except OSError as exc:
            raise StorageFormatError(f"{self._path or 'in-memory file'}: cannot write dataset {col.leaf.name!r} ({exc})") \
                from None

    def _write_leaves(self, norm: NormalizedIndex, values: Sequence[Any], which: Optional[Sequence[int]] = None) -> None:
        cols = self._columns()
        self._check_writable()
        targets = cols if which is None else [cols[i] for i in which]
        for col, v in zip(targets, values):
            self._write_col(col, norm, v)

    def set(self, index: Any, value: Any) -> None:
        """Checks the whole value (keys, shapes, dtypes, bounds), then writes every leaf; on error nothing changes."""
        self._check_writable()
        norm = self._norm(index)
        lead = () if norm.single is not None else (norm.count(),)
        self._write_leaves(norm, self._tree.split(value, lead))

    def _prepare_single(self, value: Any) -> Any:
        return self._tree.split_copy(value)

    def _stack_prepared(self, items: List[Any]) -> Any:
        out = []
        for k, leaf in enumerate(self._tree.leaves):
            if leaf.conv is None:
                col = np.empty(len(items), dtype=object)
                col[:] = [it[k] for it in items]
                out.append(col)
            else:
                out.append(np.stack([it[k] for it in items]) if items else leaf.zeros(0))
        return out

    def _set_prepared(self, index: Any, batch: Any) -> None:
        self._check_writable()
        self._write_leaves(self._norm(index), batch)

    # ------------------------------------------------------------------ length
    def _check_owner(self, what: str) -> None:
        if not self._owner:
            raise StorageStateError(f"{what} is not allowed on a reader copy of {type(self).__name__}")

    def _resize(self, rows: int) -> None:
        for col in self._columns():
            col.ds.resize(rows, axis=0)
        self._alloc = rows

    def _zero_rows(self, start: int, stop: int) -> None:
        if stop <= start:
            return
        for col in self._columns():
            block = max(1, _BLOCK_BYTES // col.row_bytes)
            for s in range(start, stop, block):
                e = min(stop, s + block)
                zeros = col.leaf.zeros(e - s)
                if col.arr is not None:
                    col.arr[s:e] = zeros
                elif col.leaf.conv is None:
                    col.ds[s:e] = zeros
                else:
                    _ll_write(col.ds, s, zeros)

    def extend_length(self, length: int) -> None:
        """Adds `length` zero rows at the end of a growable storage (a no-op for a fixed capacity)."""
        self._check_writable()
        if self._capacity is not None:
            return
        n = check_count(length, "extend_length")
        if not n:
            return
        self._check_owner("extend_length")
        new_len = self._length + n
        if new_len > self._alloc:
            self._columns()
            self._resize(max(new_len, 2 * self._alloc, 64) if n == 1 else new_len)
        self._length = new_len
        self._meta_dirty = True

    def shrink_length(self, length: int) -> None:
        """Removes `length` rows from the end of a growable storage; their segments are forgotten."""
        self._check_writable()
        if self._capacity is not None:
            return
        n = check_count(length, "shrink_length", self._length)
        if not n:
            return
        self._check_owner("shrink_length")
        new_len = self._length - n
        self._zero_rows(new_len, self._length)
        self._length = new_len
        self._meta_dirty = True
        self._segments.truncate(new_len)
        if self._seg_start is not None and self._seg_start + self._seg_len > new_len:
            self.abort_segment()

    def clear(self) -> None:
        """Aborts the open segment, forgets all segments, zeroes every row (growable: length 0)."""
        self._check_writable()
        self._check_owner("clear")
        super().clear()
        if self._capacity is not None:
            self._zero_rows(0, self._capacity)
        self._meta_dirty = True

    # ------------------------------------------------------------------ persistence
    def _metadata(self) -> Dict[str, Any]:
        return {"storage_type": storage_type_name(type(self)), "format_version": FORMAT_VERSION,
                "capacity": self._capacity, "length": self._length, "segments": self._segments.to_json(),
                "space": space_to_json(self.single_instance_space)}

    def flush(self) -> None:
        """Trims growable datasets to the length, writes the bookkeeping attribute and flushes the file (and, when
        durable, the memory maps and the file to disk). A no-op for read-only storages and reader copies."""
        self._check_open()
        if self._read_only or not self._owner:
            return
        cols = self._columns()
        f = self._file
        if self._capacity is None and self._alloc != self._length:
            self._resize(self._length)
        f.attrs[META_ATTR] = json.dumps(self._metadata())
        self._meta_dirty = False
        self._saved_log_version = self._segments.version
        if is_durable() and self._mmap is not None:
            self._mmap.flush()
        f.flush()
        if is_durable() and self._path is not None:
            fd = os.open(self._path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def _write_file(self, path: str, which: Optional[Sequence[int]] = None, tree: Optional[LeafTree] = None) -> None:
        """Writes the rows of the leaves `which` (all by default) as a new file at `path` (temporary name, then
        rename), with each dataset's layout and filters; `tree` names the leaves in the new file."""
        h5py = _h5py()
        cols = self._columns()
        chosen = cols if which is None else [cols[i] for i in which]
        tree = tree or self._tree
        os.makedirs(os.path.dirname(os.path.abspath(path)) or ".", exist_ok=True)
        tmp = temp_name(path)
        try:
            with h5py.File(tmp, "w") as out:
                for col, leaf in zip(chosen, tree.leaves):
                    group = out
                    for p in leaf.path[:-1]:
                        group = group.require_group(p)
                    name = leaf.path[-1] if leaf.path else DEFAULT_KEY
                    src = col.ds
                    extra = {k: v for k, v in (("shuffle", src.shuffle), ("fletcher32", src.fletcher32),
                                               ("scaleoffset", src.scaleoffset)) if v}
                    chunks = None if src.chunks is None else tuple(src.chunks)
                    if chunks is not None and self._capacity is not None and chunks[0] > self._capacity:
                        chunks = (self._capacity,) + chunks[1:]
                    if self._capacity is None and chunks is None:
                        chunks = _auto_chunks(leaf, None)
                    dst = _create_dataset(group, name, leaf, self._length, self._capacity, compression=src.compression,
                                          compression_opts=src.compression_opts, chunks=chunks, extra=extra)
                    step = max(1, _BLOCK_BYTES // col.row_bytes)
                    for s in range(0, self._length, step):
                        e = min(self._length, s + step)
                        block = self._read_col(col, NormalizedIndex(slc=slice(s, e, 1)))
                        if leaf.conv is None:
                            dst[s:e] = np.asarray(list(block), dtype=object)
                        else:
                            _ll_write(dst, s, block)
                meta = self._metadata()
                meta["space"] = space_to_json(tree.space)
                out.attrs[META_ATTR] = json.dumps(meta)
                out.flush()
                if is_durable():
                    os.fsync(out.id.get_vfd_handle())
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise

    def dumps(self, path: PathLike) -> None:
        """Persists to `path`: its own file flushes; any other path gets a new file with the same layout (written
        under a temporary name and renamed, so a reader sees the old or the new file)."""
        self._check_open()
        path = os.fspath(path)
        if self._path is not None and os.path.exists(path) and os.path.samefile(path, self._path):
            self.flush()
            return
        if os.path.isdir(path):
            raise IsADirectoryError(f"{type(self).__name__}.dumps: {path} is a directory; pass a file path")
        if not self._read_only and self._owner:
            self.flush()
        self._write_file(path)

    def close(self) -> None:
        """Flushes a writable storage, then closes the file; later use raises StorageClosedError. Idempotent."""
        if self._closed:
            return
        try:
            if self._file is not None and self._pid == os.getpid() and not self._read_only and self._owner:
                self.flush()
        finally:
            self._closed = True
            self._drop_handle()

    def _drop_handle(self) -> None:
        f, self._file, self._cols, self._mmap = self._file, None, None, None  # the map closes with its last view
        _WRITERS.discard(self)
        if f is None:
            return
        if self._pid != os.getpid():
            _ABANDONED.append(f)
            return
        try:
            f.close()
        except Exception:  # noqa: BLE001 - closing a dead handle
            pass

    def _release(self) -> None:
        try:
            if self._file is not None and self._pid == os.getpid() and not self._read_only and self._owner \
                    and self._dirty:
                self.flush()
        except Exception:  # noqa: BLE001 - garbage collection must not raise
            pass
        self._drop_handle()

    # ------------------------------------------------------------------ columns
    def get_column(self, nested_keys: Union[str, Sequence[str]]) -> "HDF5ColumnView":
        """A view of the sub-dict or leaf at `nested_keys` (e.g. `["obs", "pos"]` or `"obs/pos"`): it reads and
        writes only those datasets of this file, and shares this storage's length, capacity and segments."""
        self._check_open()
        sub_space, which = self._tree.subtree(nested_keys)
        keys = list(nested_keys.split("/")) if isinstance(nested_keys, str) else list(nested_keys)
        return HDF5ColumnView(self, sub_space, which, keys)

    # ------------------------------------------------------------------ pickling
    def __getstate__(self) -> Dict[str, Any]:
        self._check_open()
        self._columns()
        if not self._read_only and self._owner:
            self.flush()
        state: Dict[str, Any] = {
            "space": self.single_instance_space, "path": self._path, "capacity": self._capacity,
            "length": self._length, "segments": self._segments.to_json(), "reduce_io": self._reduce_io,
            "use_mmap": self._use_mmap, "h5py_kwargs": self._h5_kwargs, "read_only": True, "owner": False,
        }
        if self._path is None:
            state["image"] = bytes(self._file.id.get_file_image())
            state["read_only"] = self._read_only
            state["owner"] = True
        return state

    def __setstate__(self, state: Dict[str, Any]) -> None:
        log = SegmentLog(state["capacity"])
        log._runs = [(int(s), int(n)) for s, n in state["segments"]]
        HDF5Storage.__init__(self, state["space"], state["path"], state["capacity"], state["length"], log,
                             read_only=state["read_only"], reduce_io=state["reduce_io"], use_mmap=state["use_mmap"],
                             h5py_kwargs=state["h5py_kwargs"], image=state.get("image"), owner=state["owner"])
        if state.get("image") is not None:
            self._reopen()

    # ------------------------------------------------------------------ raw files
    @staticmethod
    def build_space_from_hdf5_file(root: Any) -> Tuple[int, Optional[int], Space]:
        """`(count, capacity, space)` of an HDF5 file (a path, or an open h5py File / Group / Dataset).

        Files written by this library give back their stored space. Otherwise the space is inferred: a group with
        only `data` (or a dataset) is one leaf, other groups are DictSpaces (names starting with '.' or '_'
        skipped); bool datasets are Binary, numbers are unbounded Boxes, strings are Text. `capacity` is None for
        resizable datasets.
        """
        h5py = _h5py()
        if isinstance(root, (str, os.PathLike)):
            with _open_file(os.fspath(root), "r", "build_space_from_hdf5_file") as f:
                return HDF5Storage.build_space_from_hdf5_file(f)
        if isinstance(root, h5py.Group):
            meta = _read_meta(root, root.file.filename) if isinstance(root, h5py.File) else None
            if meta is not None and "space" in meta:
                try:
                    space = json_to_space(meta["space"], NumpyComputeBackend, None)
                except (ValueError, TypeError, KeyError) as exc:
                    raise StorageFormatError(f"{root.file.filename}: the stored space is malformed: {exc}") from None
                tree = LeafTree(space, "HDF5Storage", DEFAULT_KEY)
                n = int(root[tree.leaves[0].name].shape[0])
                return int(meta.get("length", n)), meta.get("capacity"), space
        return _infer_space(root)

    @staticmethod
    def load_replay_buffer_from_raw_hdf5(path: PathLike) -> Any:
        """A read-only ReplayBuffer over every row of an HDF5 file (space inferred by `build_space_from_hdf5_file`)."""
        from unienv_data.replay_buffer import ReplayBuffer
        count, capacity, space = HDF5Storage.build_space_from_hdf5_file(path)
        storage = HDF5Storage.load_from(path, space, read_only=True)
        return ReplayBuffer(storage, "storage" + (HDF5Storage.single_file_ext or ""), count=count, offset=0,
                            cache_path=None, maintain_segment_metadata=False)


def _infer_space(root: Any) -> Tuple[int, Optional[int], Space]:
    h5py = _h5py()
    B = NumpyComputeBackend
    if isinstance(root, h5py.Dataset):
        if root.ndim < 1:
            raise StorageFormatError(f"dataset {root.name!r} is a scalar, not rows")
        info = h5py.check_string_dtype(root.dtype)
        space: Space
        if info is not None:
            space = TextSpace(B, max_length=root.dtype.itemsize if info.length is not None else 4096)
        elif root.dtype.kind == "b":
            space = BinarySpace(B, tuple(root.shape[1:]))
        elif root.dtype.kind in "iuf":
            space = BoxSpace(B, -np.inf, np.inf, root.dtype.newbyteorder("="), shape=tuple(root.shape[1:]))
        else:
            raise StorageFormatError(f"dataset {root.name!r} has the unsupported dtype {root.dtype}")
        return int(root.shape[0]), root.maxshape[0], space
    if not isinstance(root, h5py.Group):
        raise TypeError(f"expected a path or an h5py File / Group / Dataset, got {type(root).__name__}")
    keys = [k for k in root.keys() if not (k.startswith(".") or k.startswith("_"))]
    if DEFAULT_KEY in keys and len(keys) == 1:
        return _infer_space(root[DEFAULT_KEY])
    found: Dict[str, Tuple[int, Optional[int], Space]] = {k: _infer_space(root[k]) for k in keys}
    if not found:
        raise StorageFormatError(f"group {root.name!r} holds no datasets")
    sizes = {(n, c) for n, c, _ in found.values()}
    if len(sizes) != 1:
        raise StorageFormatError(f"group {root.name!r}: datasets disagree on rows / capacity: "
                                 + ", ".join(f"{k}: {n} rows, capacity {c}" for k, (n, c, _) in found.items()))
    n, c = sizes.pop()
    return n, c, DictSpace(B, {k: s for k, (_, _, s) in found.items()})


class HDF5ColumnView(ColumnView):
    """A sub-dict or leaf of an `HDF5Storage` (from `get_column`): reads and writes those datasets of the parent's
    file. Length, capacity and segments are the parent's; segments and the length are changed through the parent."""

    single_file_ext: Optional[str] = ".hdf5"

    def get(self, index: Any) -> Any:
        self._check_open()
        norm = self._parent._norm(index)
        return self._tree.assemble(self._parent._read_leaves(norm, self._which))

    def dumps(self, path: PathLike) -> None:
        """Writes these leaves as a standalone HDF5Storage file for this view's space."""
        self._check_open()
        path = os.fspath(path)
        own = self._parent.cache_filename
        if own is not None and os.path.exists(path) and os.path.samefile(path, own):
            raise ValueError(f"cannot dump a column view onto the file it is a view of ({own})")
        self._parent._write_file(path, self._which, self._tree)


__all__ = ["HDF5Storage", "HDF5ColumnView", "META_ATTR", "CHUNK_TARGET_BYTES"]
