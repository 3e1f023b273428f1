"""`ArrayStorageBase`: rows of one Box / Binary space in a single array (RAM, memory-mapped file or shared memory).

Shared by `PytorchTensorStorage` (torch tensors out) and `NumpyMemmapStorage` (NumPy arrays out); subclasses only
say which backend they serve and how a NumPy result becomes a backend array.

* Fixed `capacity` (a ring) or `capacity=None` (growable: `extend_length`, and appends grow it; the file or array
  grows geometrically so appends stay amortised O(1)).
* Reads always return fresh arrays (never views that alias the storage); batch reads are one NumPy gather.
* Writes are checked (shape, dtype, bounds) before anything is written.
* Segments are recorded and persisted with the row count in the sidecar `<file>.meta.json`.
"""
from __future__ import annotations

from unienv_data.base.common import BatchT
from unienv_interface.backends.base import BArrayType, BDeviceType, BDtypeType, BRNGType
import os
from functools import partial
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from unienv_data.base.errors import StorageFormatError, StorageNotFoundError
from unienv_data.base.files import (FORMAT_VERSION, PathLike, atomic_write_json, check_format_version,
                                    check_no_interrupted_dump, dump_transaction, is_durable, read_json,
                                    replacing_file, require_fields)
from unienv_data.base.indexing import NormalizedIndex, normalize_index
from unienv_data.base.registry import storage_type_name
from unienv_data.base.segments import SegmentLog
from unienv_data.base.leaf_storage import LeafStorage
from unienv_data.base.storage import SpaceStorage
from unienv_data.base.values import LeafConverter
from unienv_interface.space import BinarySpace, BoxSpace, Space

from ._array_file import MEMMAP, RAM, SHARED, ArrayBlock, file_rows, write_rows

META_SUFFIX = ".meta.json"


def sidecar_path(data_path: str) -> str:
    """Where the metadata of a raw data file lives."""
    return data_path + META_SUFFIX


def _check_capacity(capacity: Any) -> Optional[int]:
    if capacity is None:
        return None
    if isinstance(capacity, bool) or not isinstance(capacity, (int, np.integer)) or int(capacity) <= 0:
        raise ValueError(f"capacity must be a positive int or None (growable), got {capacity!r}")
    return int(capacity)


class ArrayStorageBase(LeafStorage[BatchT, BArrayType, BDeviceType, BDtypeType, BRNGType]):
    """Common implementation of the single-array storages (see the module docstring)."""

    single_file_ext: Optional[str] = ".memmap"
    #: simplified name of the backend this class serves ("pytorch" / "numpy")
    _backend_name = ""

    def __init__(self, single_instance_space: Space, block: ArrayBlock, capacity: Optional[int], length: int,
                 segments: Optional[SegmentLog] = None, read_only: bool = False, *,
                 persistent_segments: bool = True, source_file: Optional[str] = None) -> None:
        super().__init__(single_instance_space)
        self._block = block
        self._capacity = capacity
        self._length = capacity if capacity is not None else length
        self._read_only = read_only
        self._segments = segments if segments is not None else SegmentLog(capacity)
        self._conv = LeafConverter(single_instance_space, "value")
        #: the length changed since the metadata was last written (rows themselves need no metadata)
        self._meta_dirty = True
        self._saved_log_version = -1
        #: False only for a raw file written without metadata (the reference's format): no segment list of its own
        self._persistent_segments = persistent_segments
        #: the data file an in-RAM copy was read from (`load_from(..., is_memmap=False)`): an owner's commit log that
        #: is newer than the file's metadata takes more of its rows (see `adopt_committed`)
        self._source_file = source_file

    # ------------------------------------------------------------------ space checks
    @classmethod
    def _check_space(cls, space: Any) -> None:
        if not isinstance(space, (BoxSpace, BinarySpace)):
            raise TypeError(f"{cls.__name__} stores a BoxSpace or BinarySpace, got {type(space).__name__}; "
                            "use FlattenedStorage or DictStorage for structured spaces")
        if space.backend.simplified_name != cls._backend_name:
            raise TypeError(f"{cls.__name__} needs a space on the {cls._backend_name} backend, got {space.backend}: "
                            f"open it with space.to('{cls._backend_name}') and wrap it in ToBackendOrDeviceStorage "
                            "(ReplayBuffer.load_from(path, backend=...) does that by itself)")
        dev = space.device
        if dev is not None and str(dev) not in ("cpu", "cpu:0"):
            raise ValueError(f"{cls.__name__} keeps rows in host memory; the space's device must be cpu or None, "
                             f"got {dev!r} (wrap it to move batches to {dev})")

    @classmethod
    def _np_dtype(cls, space: Space) -> np.dtype:
        return np.dtype(space.backend.numpy_dtype(space.dtype))

    # ------------------------------------------------------------------ construction
    @classmethod
    def create(cls, single_instance_space: Space, *args: Any, capacity: Optional[int] = None,
               cache_path: Optional[PathLike] = None, multiprocessing: bool = False,
               is_memmap: Optional[bool] = None, memmap_existok: bool = True, **kwargs: Any) -> "ArrayStorageBase":
        """A new zero-filled storage.

        `is_memmap` defaults to "memory-map when `cache_path` is given"; `is_memmap=True` without a path is an error.
        With `multiprocessing=True` an in-RAM storage lives in shared memory so worker processes see its rows.
        An existing file at `cache_path` is refused unless `overwrite=True` (then replaced, never silently reused);
        `memmap_existok=False` refuses it even then.
        `capacity=None` makes a growable storage.
        """
        if args:
            raise TypeError(f"{cls.__name__}.create() takes no extra positional arguments, got {args!r}")
        if kwargs:
            raise TypeError(f"{cls.__name__}.create() got unexpected keyword argument(s) {sorted(kwargs)}")
        cls._check_space(single_instance_space)
        cap = _check_capacity(capacity)
        if is_memmap is None:
            is_memmap = cache_path is not None
        if is_memmap and cache_path is None:
            raise ValueError(f"{cls.__name__}.create(is_memmap=True) needs cache_path (the file to map)")
        dtype, shape = cls._np_dtype(single_instance_space), tuple(single_instance_space.shape or ())
        alloc = cap if cap is not None else 0
        if is_memmap:
            path = os.fspath(cache_path)  # type: ignore[arg-type]
            if os.path.exists(path) and not memmap_existok:
                raise FileExistsError(f"{path} already exists (memmap_existok=False)")
            block = ArrayBlock.new_file(MEMMAP, path, dtype, shape, alloc)
        elif multiprocessing:
            block = ArrayBlock.new_file(SHARED, None, dtype, shape, alloc)
        else:
            block = ArrayBlock(RAM, dtype, shape, alloc)
        st = cls(single_instance_space, block, cap, 0)
        if is_memmap:
            st.flush()   # the sidecar written and recorded as current: the first commit / dumps has nothing to rewrite
        return st

    @classmethod
    def load_from(cls, path: PathLike, single_instance_space: Space, *, capacity: Optional[int] = None,
                  read_only: bool = True, multiprocessing: bool = False, is_memmap: Optional[bool] = None,
                  **kwargs: Any) -> "ArrayStorageBase":
        """Opens a data file written by this library or by the reference (raw rows without metadata).

        The capacity comes from the sidecar metadata, or from the file size for reference files; a `capacity`
        argument must agree with it. The space must match the stored dtype and row shape exactly.
        `is_memmap=False` copies the rows into RAM (shared memory with `multiprocessing=True`).
        """
        if kwargs:
            raise TypeError(f"{cls.__name__}.load_from() got unexpected keyword argument(s) {sorted(kwargs)}")
        cls._check_space(single_instance_space)
        path = os.fspath(path)
        if not os.path.isfile(path):
            raise StorageNotFoundError(f"{cls.__name__} data file not found: {path}")
        check_no_interrupted_dump(path, cls.__name__)
        cap_arg = _check_capacity(capacity)
        dtype, shape = cls._np_dtype(single_instance_space), tuple(single_instance_space.shape or ())
        row_bytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        meta_file = sidecar_path(path)
        segments: Optional[SegmentLog] = None
        if os.path.exists(meta_file):
            meta = read_json(meta_file, f"{cls.__name__} metadata")
            check_format_version(meta, meta_file)
            require_fields(meta, ("dtype", "shape", "capacity", "length"), meta_file)
            if not isinstance(meta["dtype"], str) or not (
                    isinstance(meta["shape"], list) and all(type(d) is int and d >= 0 for d in meta["shape"])):
                raise StorageFormatError(f"{meta_file}: invalid row dtype {meta['dtype']!r} or shape {meta['shape']!r} "
                                         "(expected a dtype name and a list of sizes)")
            want_dtype = single_instance_space.backend.dtype_name(single_instance_space.dtype)
            if meta["dtype"] != want_dtype or list(meta["shape"]) != list(shape):
                raise ValueError(f"{path} holds rows of {meta['dtype']}{list(meta['shape'])}, but the space asks for "
                                 f"{want_dtype}{list(shape)}")
            stored_cap = meta["capacity"]
            length = meta["length"]
            if stored_cap is not None and (not isinstance(stored_cap, int) or stored_cap <= 0):
                raise StorageFormatError(f"{meta_file}: invalid capacity {stored_cap!r}")
            if not isinstance(length, int) or length < 0 or (stored_cap is not None and length != stored_cap):
                raise StorageFormatError(f"{meta_file}: invalid length {length!r} for capacity {stored_cap!r}")
            if cap_arg is not None and cap_arg != stored_cap:
                hint = "omit capacity (the storage is growable)" if stored_cap is None else f"pass capacity={stored_cap} or omit it"
                raise ValueError(f"{path} was written with capacity {stored_cap}, not {cap_arg}: {hint}")
            rows, extra = file_rows(path, row_bytes)
            if rows < length:
                raise StorageFormatError(f"{path} holds {rows} rows but its metadata promises {length}: the file is truncated")
            if extra or (stored_cap is not None and rows != stored_cap):
                # a fixed ring's file is exactly `capacity` rows; a growable one's whole rows (some allocated ahead)
                want = (f"{stored_cap * row_bytes} bytes ({stored_cap} rows of {row_bytes} bytes)" if stored_cap is not None
                        else f"a whole number of {row_bytes}-byte rows")
                raise StorageFormatError(f"data file {path} holds {os.path.getsize(path)} bytes, expected {want} as "
                                         f"{meta_file} says: bytes were appended to it or it belongs to another storage")
            cap = stored_cap
            segments = SegmentLog.from_json(meta.get("segments", []), cap, length, meta_file)
        else:
            rows, extra = file_rows(path, row_bytes)
            if extra:
                raise ValueError(f"{path} holds {os.path.getsize(path)} bytes, not a whole number of "
                                 f"{dtype.name}{list(shape)} rows ({row_bytes} bytes each): the space does not match the file")
            if cap_arg is not None and cap_arg != rows:
                raise ValueError(f"{path} holds {rows} rows of {dtype.name}{list(shape)}, not {cap_arg}: "
                                 f"pass capacity={rows} (or the space that wrote it)")
            cap, length = rows, rows
            if rows == 0:
                raise StorageFormatError(f"{path} is empty and has no metadata: cannot tell its capacity")
            segments = None
        n_rows = cap if cap is not None else length
        if is_memmap is False:
            block = ArrayBlock.read_file(path, dtype, shape, n_rows, shared=multiprocessing)
            st = cls(single_instance_space, block, cap, length, segments, read_only=read_only,
                     persistent_segments=segments is not None, source_file=path)
        else:
            block = ArrayBlock.open_file(path, dtype, shape, n_rows, writable=not read_only)
            st = cls(single_instance_space, block, cap, length, segments, read_only=read_only,
                     persistent_segments=segments is not None)
        return st

    # ------------------------------------------------------------------ properties
    @property
    def cache_filename(self) -> Optional[str]:
        return self._block.path if self._block.mode == MEMMAP else None

    @property
    def is_memmap(self) -> bool:
        return self._block.mode == MEMMAP

    @property
    def is_multiprocessing_safe(self) -> bool:
        return self._block.mode in (MEMMAP, SHARED)

    @property
    def _dirty(self) -> bool:
        """Whether the sidecar metadata is stale (length or segments changed since it was written)."""
        return self._meta_dirty or self._segments.version != self._saved_log_version

    @property
    def nbytes(self) -> int:
        """Bytes of the rows in use."""
        return self._block.nbytes(self._length)

    # ------------------------------------------------------------------ backend conversion (subclasses)
    def _wrap(self, arr: np.ndarray) -> Any:
        """A backend array owning `arr` (a fresh NumPy array)."""
        raise NotImplementedError

    # ------------------------------------------------------------------ reads
    def _norm(self, index: Any) -> NormalizedIndex:
        return normalize_index(index, self._length, type(self).__name__)

    @property
    def converter(self) -> LeafConverter:
        """The conversion rules every written value goes through (shape, dtype, bounds); composite storages use it
        to convert rows they write with `write_checked_rows`."""
        return self._conv

    def rows_view(self, index: slice) -> Optional[np.ndarray]:
        """A view (not a copy) of the rows `[0, len)[index]` for a slice of step 1, else None. It shares memory with
        the storage: valid until the next write or close, for a caller that copies what it keeps (FlattenedStorage
        unpacks every leaf into a new array)."""
        if self._closed:
            self._check_open()
        start, stop, step = index.indices(self._length)
        return self._block.data[start:stop] if step == 1 else None

    def get_numpy(self, index: Any) -> np.ndarray:
        """Rows at `index` as a fresh NumPy array in the storage dtype (raw bits for bfloat16)."""
        if self._closed:
            self._check_open()
        data = self._block.data
        if type(index) is slice:
            start, stop, step = index.indices(self._length)
            if step == 1:   # the common contiguous read: one copy, no general index resolution
                return data[start:stop].copy()   # empty when stop <= start
        elif not isinstance(index, (int, np.ndarray)) and type(index).__module__.startswith("torch"):
            try:
                index = index.numpy()
            except Exception:
                pass
        if isinstance(index, np.ndarray) and index.ndim == 1 and index.dtype.kind == "i":
            # fast path: NumPy's take checks the range itself (negatives included); a failure is re-diagnosed
            if self._length == self._block.alloc_rows:
                try:
                    return data.take(index, axis=0)
                except IndexError:
                    pass
        norm = self._norm(index)
        if norm.single is not None:
            return np.array(data[norm.single])
        if norm.slc is not None:
            return np.array(data[norm.slc])
        return data.take(norm.positions(), axis=0)

    def get_into(self, index: Any, out: np.ndarray) -> None:
        """Writes the rows at `index` (a 1-D int array) into `out`, a NumPy array of shape `(len(index), *row
        shape)` in the storage dtype (raw bits for bfloat16): the read of `get` without an intermediate array, e.g.
        straight into a shared-memory batch slot. Same index checks as `get`."""
        if self._closed:
            self._check_open()
        data = self._block.data
        idx = np.asarray(index)
        if idx.ndim != 1 or idx.dtype.kind not in "iu":
            raise IndexError(f"{type(self).__name__}.get_into needs a 1-D integer index array, got "
                             f"{idx.dtype} of shape {idx.shape}")
        want = (int(idx.shape[0]),) + tuple(data.shape[1:])
        if not isinstance(out, np.ndarray) or tuple(out.shape) != want or out.dtype != data.dtype:
            got = (f"{out.dtype} of shape {tuple(out.shape)}" if isinstance(out, np.ndarray)
                   else type(out).__name__)
            raise ValueError(f"{type(self).__name__}.get_into: out must be a NumPy {data.dtype} array of shape "
                             f"{want}, got {got}")
        pos = self._norm(idx).positions()      # checked against the length; negatives resolved
        # mode="clip" (a no-op on checked positions): NumPy buffers `out` under the default mode="raise"
        np.take(data, pos, axis=0, out=out, mode="clip")

    def get(self, index: Any) -> Any:
        """Element(s) at `index`: one element for an int-like index, else a batch; always a copy."""
        return self._wrap(self.get_numpy(index))

    def get_flattened(self, index: Any) -> Any:
        """Rows at `index` flattened to `(n, flat_dim)` (or `(flat_dim,)` for one element); a copy."""
        arr = self.get_numpy(index)
        lead = arr.shape[:arr.ndim - len(self._block.row_shape)]
        return self._wrap(arr.reshape(lead + (-1,)))

    # ------------------------------------------------------------------ writes
    def set(self, index: Any, value: Any) -> None:
        """Checks `value` (shape, dtype, bounds) and writes it at `index`; on error nothing is written."""
        self.check_writable()
        norm = self._norm(index)
        self._write(norm, self._conv.convert(value, norm.lead()))

    def set_flattened(self, index: Any, value: Any) -> None:
        """Writes flat rows (`(n, flat_dim)` or `(flat_dim,)`), checked like `set`."""
        self.check_writable()
        norm = self._norm(index)
        lead = norm.lead()
        arr, _weak = self._conv.to_numpy(value)
        width = int(np.prod(self._block.row_shape, dtype=np.int64))
        if tuple(arr.shape) != lead + (width,):
            raise ValueError(f"value: expected flat shape {lead + (width,)}, got {tuple(arr.shape)}")
        self._write(norm, self._conv.convert(arr.reshape(lead + self._block.row_shape), lead))

    def _write(self, norm: NormalizedIndex, arr: np.ndarray) -> None:
        data = self._block.data
        if norm.single is not None:
            data[norm.single] = arr
        elif norm.slc is not None:
            data[norm.slc] = arr
        else:
            idx = norm.array if norm.array is not None else np.zeros(0, np.int64)
            if idx.size > 1:
                uniq, first_rev = np.unique(idx[::-1], return_index=True)
                if uniq.size != idx.size:  # duplicates: the last occurrence wins, deterministically
                    keep = idx.size - 1 - first_rev
                    idx, arr = idx[keep], arr[keep]
            data[idx] = arr

    def write_rows_with(self, index: Any, writer: Any, payload: Any) -> None:
        """Writes checked data with `writer(rows_view, payload)`: straight into the storage for an int or a slice,
        through one staging array and one scatter for index arrays. Nothing `writer` writes is checked: the caller
        (a composite storage such as FlattenedStorage, which checked the sample) vouches for it."""
        self.check_writable()
        norm = self._norm(index)
        data = self._block.data
        if norm.single is not None:
            writer(data[norm.single:norm.single + 1], payload)
        elif norm.slc is not None:
            writer(data[norm.slc], payload)
        else:
            staging = np.empty((norm.count(),) + self._block.row_shape, dtype=self._block.dtype)
            writer(staging, payload)
            self._write(norm, staging)

    def write_checked_rows(self, index: Any, rows: np.ndarray) -> None:
        """Writes rows in the storage dtype without checking their values: the caller (a composite storage such as
        FlattenedStorage, which checked the sample) vouches for them. The index and the state are checked."""
        self.check_writable()
        norm = self._norm(index)
        self._write(norm, rows)

    # ------------------------------------------------------------------ segments and writers
    def prepare_element(self, value: Any) -> Any:
        return np.array(self._conv.convert(value, ()), copy=True)

    def stack_prepared(self, items: List[Any]) -> Any:
        return np.stack(items) if items else np.zeros((0,) + self._block.row_shape, self._block.dtype)

    def set_prepared(self, index: Any, batch: Any) -> None:
        self.write_checked_rows(index, batch)

    def append(self, value: Any) -> None:
        """Writes one element at the open segment's next row (growable storages grow)."""
        self.check_writable()
        arr = self._conv.convert_single(value)
        pos = self._next_write_position()
        self._block.data[pos] = arr
        self._advance_segment()

    def _claim_row(self) -> int:
        """The position the next append writes (raises what `append` would for the storage's state); the caller
        writes the row, then counts it with `_seg_len += 1; _seg_clear_rows -= 1` (composite storages)."""
        if self._closed or self._read_only:
            self.check_writable()
        n = self._seg_len
        if self._seg_clear_rows > 0 and n != self._capacity:
            # the common case: inside the open segment, with rows known to be free ahead and the ring not yet full
            # (`_seg_clear_rows` is 0 whenever no segment is open)
            pos = self._seg_start + n  # type: ignore[operator]
            cap = self._capacity
            if cap is None:
                if pos < self._length:
                    return pos
            else:
                return pos - cap if pos >= cap else pos
        return self._next_write_position()

    def append_checked_row(self, row: np.ndarray) -> None:
        """Appends one row in the storage dtype without checking its values (the caller, a composite storage such as
        FlattenedStorage, checked the sample); the state is checked as by `append`."""
        self.check_writable()
        pos = self._next_write_position()
        self._block.data[pos] = row
        self._advance_segment()

    # ------------------------------------------------------------------ staging (see SpaceStorage)
    @property
    def staging_checks_all(self) -> bool:
        return True

    def stage_set(self, index: Any, value: Any) -> Callable[[], None]:
        """Checks and converts `value` for `set(index, ...)` now; the returned write only copies the rows."""
        self.check_writable()
        norm = self._stage_index(index)
        arr = self._conv.convert(value, norm.lead())
        return partial(self._write, norm, arr)

    def check_append_state(self) -> None:
        # an open segment never holds more rows than the capacity: `==` is the full check (None: never)
        if self._closed or self._read_only or self._seg_start is None or self._seg_len == self._capacity:
            super().check_append_state()  # raises the error that fits

    def stage_append(self, value: Any) -> Callable[[], None]:
        """Checks the state and converts `value` now; the returned append only copies the row."""
        self.check_append_state()
        return partial(self._append_staged, self._conv.convert_single(value))

    def _append_staged(self, row: np.ndarray) -> None:
        """The append `stage_append` returns: state and row were checked when it was staged."""
        pos = self._next_write_position()  # may grow the block: read its data afterwards
        self._block.data[pos] = row
        self._seg_len += 1
        self._seg_clear_rows -= 1

    # ------------------------------------------------------------------ growth
    def _grow_rows(self, new_length: int) -> None:
        self._meta_dirty = True
        if new_length > self._block.alloc_rows:
            self._block.resize(max(new_length, 2 * self._block.alloc_rows, 16))
        self._length = new_length

    def _drop_rows(self, new_length: int) -> None:
        self._length = new_length
        self._meta_dirty = True
        self._block.data[new_length:] = 0
        self.after_shrink(new_length)

    def clear(self) -> None:
        """Aborts the open segment, forgets all segments, and resets every row to zero (growable: length 0)."""
        super().clear()
        self._meta_dirty = True
        if self._capacity is not None:
            self._block.data[...] = 0

    # ------------------------------------------------------------------ persistence
    def _metadata(self) -> Dict[str, Any]:
        sp = self.single_instance_space
        return {"storage_type": storage_type_name(type(self)), "format_version": FORMAT_VERSION,
                "dtype": sp.backend.dtype_name(sp.dtype), "shape": list(sp.shape or ()), "capacity": self._capacity,
                "length": self._length, "segments": self._segments.to_json()}

    def on_segments_dropped(self) -> None:
        if self._block.mode == MEMMAP and not self._read_only:
            if self.drop_listener is not None:
                self.drop_listener(self)       # the owner's commit log records the shorter list
                return
            self._save_own_sidecar()

    def commit_log_leaf(self) -> Optional["SpaceStorage"]:
        from_file = self._block.mode == MEMMAP or self._source_file is not None
        return self if from_file and self._persistent_segments else None

    def adopt_committed(self, length: int, runs: List[Tuple[int, int]], where: str) -> None:
        """Takes the length and segments of an owner's commit log (newer than this file's own metadata after a
        crash): a growable storage maps the rows its file already holds up to `length` (or drops its rows past it);
        the segments are validated against the capacity and length."""
        cap = self._capacity
        if cap is None and length != self._length:
            if length > self._block.alloc_rows:
                path = str(self._block.path if self._block.mode == MEMMAP else self._source_file)
                rows, _extra = file_rows(path, self._block.row_bytes)
                if rows < length:
                    raise StorageFormatError(f"{where} commits {length} rows, but {path} holds {rows}: the file is "
                                             "truncated")
                old = self._block
                if old.mode == MEMMAP:
                    old.release()
                    self._block = ArrayBlock.open_file(path, old.dtype, old.row_shape, length,
                                                       writable=not self._read_only)
                else:       # an in-RAM copy: copy the committed rows the file holds beyond its metadata too
                    self._block = ArrayBlock.read_file(path, old.dtype, old.row_shape, length, shared=old.mode == SHARED)
                    old.release()
            if length < self._length and not self._read_only:
                self._block.data[length:self._length] = 0       # an uncommitted tail (the commit never happened)
            self._length = length
            self._meta_dirty = True
        self._segments = SegmentLog.from_json([list(r) for r in runs], cap, self._length, where)
        self._saved_log_version = -1

    def _save_own_sidecar(self) -> None:
        """Rewrites the cache file's metadata and records that it is up to date."""
        self._write_sidecar(str(self._block.path))
        self._meta_dirty = False
        self._saved_log_version = self._segments.version

    def has_persistent_segments(self) -> bool:
        return self._persistent_segments

    def _write_sidecar(self, data_path: str) -> None:
        atomic_write_json(sidecar_path(data_path), self._metadata())

    def flush(self) -> None:
        """Makes everything written so far durable in the cache file: data pages first, then the metadata."""
        self._check_open()
        if self._block.mode == MEMMAP and not self._read_only:
            if is_durable():
                self._block.flush()
            self._save_own_sidecar()

    def dumps(self, path: PathLike) -> None:
        """Writes the rows (raw, reference layout) and the sidecar metadata to `path`; its own file flushes."""
        self._check_open()
        path = os.fspath(path)
        own = self._block.path
        if self._block.mode == MEMMAP and own is not None and os.path.abspath(own) == os.path.abspath(path):
            if self._read_only:
                return
            self.flush()
            return
        with dump_transaction(path, directory=False):   # new rows + old metadata never look like a dataset
            self._dump_rows(path)
            self._write_sidecar(path)

    def _dump_rows(self, path: str) -> None:
        with replacing_file(path) as tmp:
            with open(tmp, "wb") as f:
                write_rows(f, self._block.data[:self._length])   # no copy of the rows on the way

    def _persist_on_close(self) -> None:
        """Persists the metadata of a writable memory-mapped storage; `close` then releases the rows."""
        if self._block.mode == MEMMAP and not self._read_only:
            if self._capacity is None and self._block.alloc_rows != self._length:
                self._block.resize(self._length)    # drop the growth slack: the file holds exactly its rows
            if self._dirty or is_durable():
                self.flush()

    def _free(self) -> None:
        self._block.release()
        self._seg_clear_rows = 0   # composite appenders test only this counter on their fast path

    def _release(self) -> None:
        block = getattr(self, "_block", None)
        if block is not None:
            block.release()

    # ------------------------------------------------------------------ pickling (worker processes)
    def __getstate__(self) -> Dict[str, Any]:
        self._check_open()
        state: Dict[str, Any] = {"space": self.single_instance_space, "capacity": self._capacity, "length": self._length,
                 "segments": self._segments.to_json(), "read_only": self._read_only, "mode": self._block.mode,
                 "path": self._block.path}
        if self._block.mode == RAM:
            state["rows"] = np.array(self._block.data[:self._block.alloc_rows])
        return state

    def __setstate__(self, state: Dict[str, Any]) -> None:
        space = state["space"]
        dtype, shape = self._np_dtype(space), tuple(space.shape)
        n_rows = state["capacity"] if state["capacity"] is not None else state["length"]
        if state["mode"] == RAM:
            block = ArrayBlock(RAM, dtype, shape, state["rows"].shape[0])
            block.data[...] = state["rows"]
        else:
            block = ArrayBlock.open_file(state["path"], dtype, shape, n_rows, writable=not state["read_only"],
                                         mode=state["mode"])
        log = SegmentLog(state["capacity"], state["segments"])
        ArrayStorageBase.__init__(self, space, block, state["capacity"], state["length"], log, state["read_only"])


__all__ = ["ArrayStorageBase", "sidecar_path", "META_SUFFIX"]
