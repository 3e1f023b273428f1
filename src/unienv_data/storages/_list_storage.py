"""What the file-format storages (HDF5, NPZ, Parquet) share.

* `LeafTree`: checks a structured value (a nested dict of Box / Binary / Text leaves, or one leaf) against its
  space and splits it into one checked NumPy array per leaf, and assembles leaf arrays back into a value.
* `ListStorageBase`: one file per sample (`<dir>/<row>.<ext>`) plus a JSON metadata file: the base of `NPZStorage`
  (reference-api §5.6, `unienv_data.storages._list_storage.ListStorageBase`).
* small helpers: optional imports with an error naming the extra, capacity checks, atomic file replacement.

`LeafTree` and its kin live in `_list_leaves`, the helpers in `_list_helpers`; both are importable from here.

Differences from the reference list storages, on purpose:

* A row is *known written* (recorded in the metadata; its file must exist: a missing or damaged file raises an
  error naming it) or *unknown* (never written by this storage: its file is read if another process wrote one,
  otherwise the row reads as zeros, like a fresh array storage). Reference-written directories record nothing, so
  there a row without a file is an error unless `load_from(..., missing_ok=True)` asks for the reference's zeros.
* `dumps(path)` into another directory works (row files are hard-linked when possible, else copied; stale row
  files of an older dump there are removed), then the metadata is written atomically.
* Row files are written under a temporary name and renamed into place: a reader sees the old or the new file.
* Segments are recorded and persisted in the metadata (`flush`, `dumps`, `close`).
* A pickled copy (a worker process) reads and writes rows but never changes the length, the segments or the
  metadata: those stay with the original.
"""
from __future__ import annotations

from unienv_data.base.common import BatchT
from unienv_interface.backends.base import BArrayType, BDeviceType, BDtypeType, BRNGType
import os
import re
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from unienv_data.base.errors import StorageFormatError, StorageNotFoundError, StorageStateError
from unienv_data.base.files import (FORMAT_VERSION, PathLike, atomic_write_json, check_format_version, read_json,
                                    require_fields)
from unienv_data.base.indexing import NormalizedIndex, normalize_index
from unienv_data.base.segments import SegmentLog
from unienv_data.base.leaf_storage import LeafStorage
from unienv_interface.space import BinarySpace, BoxSpace, Space

from ._io_pool import map_io
from ._list_helpers import (_contiguous, check_capacity, check_count, link_or_copy, mask_to_runs, numbered_files,
                            replace_file, require_module, runs_to_mask)
from ._list_leaves import Leaf, LeafTree, ValueConverter, check_stored_space, describe_leaf


_ROW_FILE = re.compile(r"^(\d+)\.([A-Za-z0-9]+)$")


class ListStorageBase(LeafStorage[BatchT, BArrayType, BDeviceType, BDtypeType, BRNGType]):
    """One file per row of a Box / Binary space in a directory, plus `<metadata_file>` (see the module docstring).

    Subclasses set `file_ext`, `metadata_file` and `reference_type` (the `storage_type` the reference writes), and
    implement `_encode(path, array)` / `_decode(path) -> array` for one row; they add their own options through
    `_options()` (persisted in the metadata) and `create` / `load_from`.
    """

    single_file_ext: Optional[str] = None
    file_ext: str = ""
    metadata_file: str = ""
    reference_type: str = ""

    def __init__(self, single_instance_space: Space, directory: str, capacity: Optional[int], length: int,
                 written: Optional[np.ndarray] = None, segments: Optional[SegmentLog] = None, *,
                 read_only: bool = False, zero_unwritten: bool = True, owner: bool = True) -> None:
        super().__init__(single_instance_space)
        if not isinstance(single_instance_space, (BoxSpace, BinarySpace)):
            raise TypeError(f"{type(self).__name__} stores a BoxSpace or BinarySpace, got "
                            f"{type(single_instance_space).__name__}; use FlattenedStorage or DictStorage for "
                            "structured spaces")
        if single_instance_space.backend.dtype_name(single_instance_space.dtype) == "bfloat16":
            raise TypeError(f"{type(self).__name__} cannot store bfloat16 (NumPy has no such dtype); use "
                            "PytorchTensorStorage or float32")
        self._dir = directory
        self._capacity = capacity
        self._length = capacity if capacity is not None else length
        self._written = np.zeros(self._length, dtype=bool) if written is None else written
        self._segments = segments if segments is not None else SegmentLog(capacity)
        self._read_only = read_only
        self._zero_unwritten = zero_unwritten
        self._owner = owner
        self._conv = ValueConverter(single_instance_space, "value")
        self._np_dtype = np.dtype(self._conv.np_dtype)
        self._shape = tuple(int(d) for d in (single_instance_space.shape or ()))
        self._meta_dirty = False
        self._saved_log_version = self._segments.version

    # ------------------------------------------------------------------ subclass hooks
    def _encode(self, path: str, arr: np.ndarray) -> None:
        raise NotImplementedError

    def _decode(self, path: str) -> np.ndarray:
        raise NotImplementedError

    def _options(self) -> Dict[str, Any]:
        """Subclass options persisted in the metadata (reference fields first)."""
        return {}

    # ------------------------------------------------------------------ shared construction
    @classmethod
    def _read_metadata(cls, path: PathLike, single_instance_space: Space, capacity: Optional[int],
                       missing_ok: bool) -> Dict[str, Any]:
        """Reads and checks the metadata; returns the constructor arguments it determines."""
        path = os.fspath(path)
        if not os.path.isdir(path):
            raise StorageNotFoundError(f"{cls.__name__} directory not found: {path}")
        meta_path = os.path.join(path, cls.metadata_file)
        meta = read_json(meta_path, f"{cls.__name__} metadata")
        version = check_format_version(meta, meta_path)
        require_fields(meta, ("storage_type", "length"), meta_path)
        if meta["storage_type"] not in (cls.reference_type, f"{cls.__module__}.{cls.__qualname__}"):
            raise StorageFormatError(f"{meta_path}: storage_type is {meta['storage_type']!r}, expected "
                                     f"{cls.reference_type!r}")
        stored_cap = meta.get("capacity")
        length = meta["length"]
        if stored_cap is not None and (isinstance(stored_cap, bool) or not isinstance(stored_cap, int) or stored_cap <= 0):
            raise StorageFormatError(f"{meta_path}: invalid capacity {stored_cap!r}")
        if isinstance(length, bool) or not isinstance(length, int) or length < 0:
            raise StorageFormatError(f"{meta_path}: invalid length {length!r}")
        if stored_cap is not None:
            length = stored_cap
        cap_arg = check_capacity(capacity)
        if cap_arg is not None and cap_arg != stored_cap:
            hint = ("omit capacity (the storage is growable)" if stored_cap is None
                    else f"pass capacity={stored_cap} or omit it")
            raise ValueError(f"{path} was written with capacity {stored_cap}, not {cap_arg}: {hint}")
        sp = single_instance_space
        if version >= 1:
            require_fields(meta, ("dtype", "shape"), meta_path)
            want = (sp.backend.dtype_name(sp.dtype), list(sp.shape or ()))
            if (meta["dtype"], meta["shape"]) != want:
                raise ValueError(f"{path} holds rows of {meta['dtype']}{meta['shape']}, but the space asks for "
                                 f"{want[0]}{want[1]}: pass the space the storage was written with")
            written = runs_to_mask(meta.get("written", []), length, meta_path)
            segments = SegmentLog.from_json(meta.get("segments", []), stored_cap, length, meta_path)
            zero_unwritten = True
        else:
            written = np.zeros(length, dtype=bool)
            segments = SegmentLog(stored_cap)
            zero_unwritten = bool(missing_ok)
        return {"meta": meta, "version": version, "capacity": stored_cap, "length": length, "written": written,
                "segments": segments, "zero_unwritten": zero_unwritten}

    # ------------------------------------------------------------------ properties
    @property
    def cache_filename(self) -> Optional[str]:
        return self._dir

    @property
    def is_multiprocessing_safe(self) -> bool:
        return True

    @property
    def _dirty(self) -> bool:
        return self._meta_dirty or self._segments.version != self._saved_log_version

    def row_path(self, row: int) -> str:
        """The file of one row."""
        return os.path.join(self._dir, f"{row}.{self.file_ext}")

    def _norm(self, index: Any) -> NormalizedIndex:
        return normalize_index(index, self._length, type(self).__name__)

    def _wrap(self, arr: np.ndarray) -> Any:
        b = self.single_instance_space.backend
        if b.simplified_name == "numpy":
            return arr
        return b.from_numpy(arr, dtype=self.single_instance_space.dtype, device=self.single_instance_space.device)

    def _check_owner(self, what: str) -> None:
        if not self._owner:
            raise StorageStateError(f"{what} is not allowed on a pickled copy of {type(self).__name__}: the length "
                                    "and segments belong to the original storage")

    # ------------------------------------------------------------------ rows
    def _read_row(self, row: int) -> np.ndarray:
        path = self.row_path(row)
        try:
            arr = self._decode(path)
        except FileNotFoundError:
            if self._written[row]:
                raise StorageNotFoundError(f"{type(self).__name__}: row {row} was written but its file {path} is "
                                           "missing (deleted or lost); the storage is damaged") from None
            if self._zero_unwritten:
                return np.zeros(self._shape, dtype=self._np_dtype)
            raise StorageNotFoundError(
                f"{type(self).__name__}: there is no file {path} for row {row}. The directory was written by the "
                "reference unienv, which writes no file for a row that was never set, so the row was either never "
                "set or its file was lost; pass missing_ok=True to load_from to read such rows as zeros") from None
        if arr.dtype != self._np_dtype or tuple(arr.shape) != self._shape:
            raise StorageFormatError(f"{path} holds {arr.dtype}{list(arr.shape)}, but the space asks for "
                                     f"{self._np_dtype}{list(self._shape)}: the file belongs to another storage")
        if not self._written[row]:
            self._written[row] = True
        return arr

    def get_numpy(self, index: Any) -> np.ndarray:
        """Rows at `index` as a fresh NumPy array."""
        self._check_open()
        norm = self._norm(index)
        if norm.single is not None:
            return self._read_row(norm.single)
        pos = norm.positions()
        if pos.size == 0:
            return np.zeros((0,) + self._shape, dtype=self._np_dtype)
        uniq, inverse = np.unique(pos, return_inverse=True)
        rows = map_io(self._read_row, uniq.tolist())
        stacked = np.stack(rows)
        if uniq.size == pos.size and np.array_equal(uniq, pos):
            return stacked
        return stacked[inverse.reshape(-1)]

    def get(self, index: Any) -> Any:
        """Row(s) at `index`: one for an int-like index, else a batch (files read on the shared IO pool)."""
        return self._wrap(self.get_numpy(index))

    def _try_write_row(self, job: Tuple[int, np.ndarray]) -> Optional[BaseException]:
        """Writes one row file (under a temporary name, then renamed); returns the error instead of raising it."""
        row, arr = job
        try:
            replace_file(lambda tmp: self._encode(tmp, arr), self.row_path(row))
        except Exception as exc:  # noqa: BLE001 - collected and re-raised by _write_rows
            return exc
        return None

    def _write_rows(self, norm: NormalizedIndex, arr: np.ndarray) -> None:
        if norm.single is not None:
            jobs = [(norm.single, _contiguous(arr))]
        else:
            pos = norm.positions()
            if pos.size > 1:
                uniq, first_rev = np.unique(pos[::-1], return_index=True)
                keep = pos.size - 1 - first_rev  # the last occurrence of every row wins
                pos, arr = uniq, arr[keep]
            jobs = [(int(p), _contiguous(arr[k])) for k, p in enumerate(pos.tolist())]
        if not jobs:
            return
        errors = map_io(self._try_write_row, jobs)
        done = np.fromiter((j[0] for j, e in zip(jobs, errors) if e is None), dtype=np.int64)
        if done.size and not self._written[done].all():
            self._written[done] = True
            self._meta_dirty = True
        for e in errors:
            if e is not None:
                raise e

    def set(self, index: Any, value: Any) -> None:
        """Checks `value` (shape, dtype, bounds) and writes one file per row; on a check error nothing is written."""
        self.check_writable()
        norm = self._norm(index)
        self._write_rows(norm, self._conv.convert(value, norm.lead()))

    def prepare_element(self, value: Any) -> Any:
        return np.array(self._conv.convert_single(value), copy=True)

    def stack_prepared(self, items: List[Any]) -> Any:
        return np.stack(items) if items else np.zeros((0,) + self._shape, dtype=self._np_dtype)

    def set_prepared(self, index: Any, batch: Any) -> None:
        self.check_writable()
        self._write_rows(self._norm(index), batch)

    def append(self, value: Any) -> None:
        """Writes one row at the open segment's next position (growable storages grow)."""
        self.check_writable()
        arr = self._conv.convert_single(value)
        pos = self._next_write_position()
        self._write_rows(NormalizedIndex(single=pos), arr)
        self._advance_segment()

    # ------------------------------------------------------------------ length
    def _delete_rows(self, rows: Sequence[int]) -> None:
        def rm(row: int) -> None:
            try:
                os.unlink(self.row_path(row))
            except FileNotFoundError:
                pass
        map_io(rm, list(rows))

    def _row_files(self, directory: str) -> Dict[int, str]:
        return numbered_files(directory, _ROW_FILE, self.file_ext)

    def _grow_rows(self, new_length: int) -> None:
        self._grow_to(new_length, False)

    def _grow_to(self, new_len: int, written: bool) -> None:
        if new_len > self._written.shape[0]:  # grows geometrically, so appends stay amortised O(1)
            grown = np.zeros(max(new_len, 2 * self._written.shape[0], 64), dtype=bool)
            grown[:self._length] = self._written[:self._length]
            self._written = grown
        self._written[self._length:new_len] = written
        self._length = new_len
        self._meta_dirty = True

    @property
    def follows_shared_growth(self) -> bool:
        return True     # rows are files and the length lives in memory: another process's growth is followed

    def follow_length(self, length: int, written: bool) -> None:
        """Makes a growable storage shared by a multiprocessing buffer `length` rows long in this process (the
        buffer's shared counters are the authority, so a pickled copy may do it too). Rows another process added
        (`written`) count as written: their files exist, and a lost one is reported, not read as zeros."""
        self.check_writable()
        if self._capacity is not None or length <= self._length:
            return
        self._grow_to(length, bool(written))

    def _drop_rows(self, new_len: int) -> None:
        """Removes rows from `new_len` on, and their files."""
        self._length = new_len
        self._meta_dirty = True
        self.after_shrink(new_len)
        # metadata first (a crash leaves extra files, never a row recorded as written without its file)
        self._written[new_len:] = False
        if self._owner:
            self.flush()
        self._delete_rows([r for r in self._row_files(self._dir) if r >= new_len])

    def clear(self) -> None:
        """Aborts the open segment, forgets all segments and deletes every row file (growable: length 0)."""
        self.check_writable()
        self._check_owner("clear")
        super().clear()
        if self._capacity is not None:
            self._delete_rows(sorted(self._row_files(self._dir)))
            self._written[:] = False
            self._meta_dirty = True
            self.flush()

    # ------------------------------------------------------------------ persistence
    def _metadata(self) -> Dict[str, Any]:
        sp = self.single_instance_space
        return {"storage_type": self.reference_type, **self._options(), "capacity": self._capacity,
                "length": self._length, "format_version": FORMAT_VERSION, "dtype": sp.backend.dtype_name(sp.dtype),
                "shape": list(self._shape), "written": mask_to_runs(self._written[:self._length]),
                "segments": self._segments.to_json()}

    def flush(self) -> None:
        """Writes the metadata (row files are written at once); a no-op for read-only storages and copies."""
        self._check_open()
        if self._read_only or not self._owner:
            return
        atomic_write_json(os.path.join(self._dir, self.metadata_file), self._metadata())
        self._meta_dirty = False
        self._saved_log_version = self._segments.version

    def dumps(self, path: PathLike) -> None:
        """Writes the storage to the directory `path`: its own directory flushes; elsewhere every written row file is
        hard-linked or copied there (stale row files of an older dump removed), then the metadata is written."""
        self._check_open()
        path = os.fspath(path)
        if os.path.isdir(path) and os.path.samefile(path, self._dir):
            if self._owner and not self._read_only:
                self.flush()
            return
        if os.path.exists(path) and not os.path.isdir(path):
            raise FileExistsError(f"{type(self).__name__}.dumps: {path} exists and is not a directory")
        os.makedirs(path, exist_ok=True)
        present = self._row_files(self._dir)
        rows = [r for r in sorted(present) if r < self._length]
        missing = [r for r in np.flatnonzero(self._written[:self._length]).tolist() if r not in present]
        if missing:
            raise StorageNotFoundError(f"{type(self).__name__}: rows {missing[:8]} were written but their files are "
                                       f"missing from {self._dir}; cannot dump a damaged storage")
        map_io(lambda r: link_or_copy(os.path.join(self._dir, present[r]),
                                      os.path.join(path, f"{r}.{self.file_ext}")), rows)
        keep = set(rows)
        stale = [name for r, name in self._row_files(path).items() if r not in keep]
        for name in stale:
            try:
                os.unlink(os.path.join(path, name))
            except FileNotFoundError:
                pass
        meta = self._metadata()
        mask = np.zeros(self._length, dtype=bool)
        mask[rows] = True
        meta["written"] = mask_to_runs(mask)
        atomic_write_json(os.path.join(path, self.metadata_file), meta)

    def _persist_on_close(self) -> None:
        """Writes the metadata of a writable storage if it changed (unless its directory is gone)."""
        if not self._read_only and self._owner and self._dirty and os.path.isdir(self._dir):
            self.flush()

    def _release(self) -> None:
        try:
            self._persist_on_close()
        except Exception:  # noqa: BLE001 - garbage collection must not raise
            pass

    # ------------------------------------------------------------------ pickling
    def __getstate__(self) -> Dict[str, Any]:
        self._check_open()
        if self._owner and not self._read_only and self._dirty:
            self.flush()
        return {"space": self.single_instance_space, "dir": self._dir, "capacity": self._capacity,
                "length": self._length, "written": self._written[:self._length].copy(),
                "segments": self._segments.to_json(), "read_only": self._read_only,
                "zero_unwritten": self._zero_unwritten, "options": self._options()}

    def _restore_options(self, options: Dict[str, Any]) -> None:
        """Sets subclass options from `_options()` output (pickling)."""

    def __setstate__(self, state: Dict[str, Any]) -> None:
        log = SegmentLog(state["capacity"], state["segments"])
        ListStorageBase.__init__(self, state["space"], state["dir"], state["capacity"], state["length"],
                                 state["written"], log, read_only=state["read_only"],
                                 zero_unwritten=state["zero_unwritten"], owner=False)
        self._restore_options(state["options"])


__all__ = ["ListStorageBase", "LeafTree", "Leaf", "ValueConverter", "require_module", "check_capacity", "check_count",
           "replace_file", "link_or_copy", "mask_to_runs", "runs_to_mask", "describe_leaf",
           "check_stored_space"]
