"""Low-level pieces of `HDF5Storage` (see `hdf5.py`): h5py access, hyperslab reads and writes, the leaf column
record, dataset creation (layouts, chunking, filters, allocation), the bookkeeping attribute, opening files with the
right locking, and inferring a space from a file written by someone else."""
from __future__ import annotations

import json
import os
import uuid
from typing import Any, Dict, List, Mapping, Optional, Tuple

import numpy as np

from unienv_data.base.errors import StorageFormatError, StorageNotFoundError, StorageStateError
from unienv_data.base.files import check_format_version
from unienv_interface.backends import NumpyComputeBackend
from unienv_interface.space import BinarySpace, BoxSpace, DictSpace, Space, TextSpace

from ._list_storage import Leaf, describe_leaf, require_module


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


def _h5py() -> Any:
    return require_module("h5py", "hdf5", "HDF5Storage")


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
    (so it can be memory-mapped); otherwise chunked, resizable up to the capacity (None: unlimited), and allocated
    at once too unless compressed or filtered (or text)."""
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
    kwargs = dict(extra or {})
    if compression is None and not extra and leaf.conv is not None:
        # every chunk allocated at once: writing rows later only writes data at fixed places, never HDF5's chunk
        # index (which a kill could leave half-written)
        dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
        dcpl.set_alloc_time(h5py.h5d.ALLOC_TIME_EARLY)
        kwargs["dcpl"] = dcpl
    return group.create_dataset(name, shape=shape, maxshape=(capacity,) + leaf.shape, dtype=dtype,
                                chunks=chunk_shape, compression=compression, compression_opts=compression_opts,
                                **kwargs)


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

def new_file(cache_path: Any, h5py_kwargs: Dict[str, Any], what: str) -> Tuple[Any, Optional[str]]:
    """`(open h5py File, path)` of a new file at `cache_path` (replacing one there), or of a file in memory
    (path None) without one."""
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
            raise IsADirectoryError(f"{what}: cache_path {path} is a directory; pass a file path (e.g. "
                                    f"{os.path.join(path, 'storage.hdf5')})")
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        try:
            f = h5py.File(path, "w", **h5py_kwargs)
        except OSError as exc:
            raise StorageStateError(f"{what}: cannot create {path} ({exc}); is it open elsewhere?") from None
    return f, path


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
