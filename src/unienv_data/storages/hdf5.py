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
* `capacity=None`: growable (resizable, chunked) datasets. A file on disk grows geometrically by moving to a new
  file with more rows (never resized in place); `close` moves it once more to exactly its rows, so at rest the
  file describes exactly its rows.
* This library's bookkeeping: the JSON root attribute `unienv_storage` (`format_version`, `file_id`, `capacity`,
  `length`, `segments`, `space`), written once with the file, and the state sidecar `<file>.state.json` that every
  commit point replaces atomically (see `_hdf5_state` and docs/guarantees.md, "HDF5": a kill at any instant never
  damages a file of an uncompressed layout). The reference ignores both; files without them open with no segments.

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
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from unienv_data.base.errors import StorageNotFoundError, StorageStateError
from unienv_data.base.files import FORMAT_VERSION, PathLike, is_durable
from unienv_data.base.forwarding import forwarded
from unienv_data.base.indexing import NormalizedIndex, normalize_index
from unienv_data.base.registry import register_storage, storage_type_name
from unienv_data.base.segments import SegmentLog
from unienv_data.base.leaf_storage import LeafStorage
from unienv_interface.backends import NumpyComputeBackend
from unienv_interface.space import Space
from unienv_interface.space.space_utils.serialization_utils import space_to_json

from ._hdf5_file import (_BLOCK_BYTES, CHUNK_TARGET_BYTES, DEFAULT_KEY, META_ATTR, _Column, _h5py, _ll_write,
                         _open_file, _read_meta, new_file)
from ._hdf5_io import HDF5ColumnView, create_datasets, map_columns, read_col, write_col, write_copy
from ._hdf5_state import STATE_SUFFIX, build_space, check_file, new_file_id, raw_replay_buffer, write_state
from ._list_leaves import LeafTreeWrites
from ._list_storage import LeafTree, check_capacity, check_count

_ABANDONED: List[Any] = []          # h5py handles inherited through fork: never closed in the child
#: the before-fork flush of every writable storage of this process, by the storage's id (weak: a storage that is
#: collected leaves the registry; `close` removes it too)
_WRITERS: Dict[int, "weakref.WeakMethod[Callable[[], None]]"] = {}


def _flush_writers_before_fork() -> None:
    for ref in list(_WRITERS.values()):
        flush = ref()
        try:
            if flush is not None:
                flush()
        except Exception:  # noqa: BLE001 - a failing flush must not break fork()
            pass


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_flush_writers_before_fork)


# ---------------------------------------------------------------------------------------------------- storage
@register_storage
class HDF5Storage(
    LeafTreeWrites,
    LeafStorage[Union[Dict[str, Any], np.ndarray, str], np.ndarray, Any, np.dtype, np.random.Generator],
):
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
                 owner: bool = True, file: Any = None, file_id: Optional[str] = None, new_file: bool = False) -> None:
        """The storage of `path` (None: in memory). `create` and `load_from` pass the h5py `file` they opened and
        checked (with `new_file` when `create` just made it, else the stored `file_id`); without `file`, the file
        opens on first use (unpickled reader copies)."""
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
        self._file_id: Optional[str] = file_id
        if not read_only and owner:
            key = id(self)
            _WRITERS[key] = weakref.WeakMethod(self._flush_before_fork, lambda _ref: _WRITERS.pop(key, None))
        if file is not None:
            self._take_file(file, new_file)

    def _flush_before_fork(self) -> None:
        """Flushes a storage writing its file in this process (a forked child must find the file consistent)."""
        if not self._closed and self._file is not None and self._pid == os.getpid():
            self.flush()

    def _take_file(self, f: Any, new_file: bool) -> None:
        """Uses the open file `f`. A new file (`create`) gets its id and metadata attribute (written once, with the
        file: see _hdf5_state) and its first state; an existing one maps its allocated rows, and a writable file
        without an id (from before state sidecars, or the reference's) is named once (the only in-place rewrite
        of its attribute), so that commit points can keep its state in the sidecar from now on."""
        if new_file:
            self._file_id = new_file_id()
            f.attrs[META_ATTR] = json.dumps(self._metadata())
            self._attach(f)
            self._meta_dirty = True
            self.flush()
            return
        self._alloc = self._rows_in_file(f, self._tree)
        if self._file_id is None and not self._read_only:
            self._file_id = new_file_id()
            meta = _read_meta(f, self._path or "") or {}
            meta.update(self._metadata())
            f.attrs[META_ATTR] = json.dumps(meta)
            f.flush()
        self._attach(f)

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
        f, path = new_file(cache_path, h5py_kwargs, cls.__name__)
        try:
            create_datasets(f, tree, cap, rows, compression, compression_level, chunks, cls.__name__,
                            on_disk=path is not None and f.driver == "sec2")
            st = cls(single_instance_space, path, cap, rows, read_only=False, reduce_io=reduce_io, use_mmap=use_mmap,
                     h5py_kwargs=h5py_kwargs, file=f, new_file=True)
        except BaseException:
            f.close()
            raise
        return st

    @classmethod
    def load_from(cls, path: PathLike, single_instance_space: Space, *, capacity: Optional[int] = None,
                  read_only: bool = True, multiprocessing: bool = False, reduce_io: bool = True, use_mmap: bool = True,
                  **h5py_kwargs: Any) -> "HDF5Storage":
        """Opens an HDF5 file written by this library or by the reference, checking it against the space."""
        tree, cap_arg = cls._check_load_args(single_instance_space, capacity, read_only, multiprocessing)
        path = os.fspath(path)
        if not os.path.isfile(path):
            raise StorageNotFoundError(f"{cls.__name__} file not found: {path}")
        if not read_only and not os.access(path, os.W_OK):
            raise PermissionError(f"{path} is not writable; load it with read_only=True")
        f = _open_file(path, "r" if read_only else "r+", cls.__name__, **h5py_kwargs)
        try:
            cap, length, segments, file_id = check_file(f, tree, cap_arg, read_only, path)
            st = cls(single_instance_space, path, cap, length, segments, read_only=read_only, reduce_io=reduce_io,
                     use_mmap=use_mmap, h5py_kwargs=h5py_kwargs, file=f, file_id=file_id)
        except BaseException:
            f.close()
            raise
        return st

    @staticmethod
    def _rows_in_file(f: Any, tree: LeafTree) -> int:
        return int(f[tree.leaves[0].name].shape[0])

    # ------------------------------------------------------------------ file handle
    def _attach(self, f: Any) -> None:
        """Uses the open file `f` and resolves (and memory-maps where possible) every leaf's dataset."""
        self._cols, self._mmap = map_columns(f, self._tree, self._path, self._use_mmap, self._read_only)
        self._file = f
        self._pid = os.getpid()

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
            check_file(f, self._tree, None, True, self._path)
        self._attach(f)
        self._alloc = self._rows_in_file(f, self._tree)

    # ------------------------------------------------------------------ properties
    cache_filename: Optional[str] = forwarded("_path")
    reduce_io: bool = forwarded("_reduce_io")

    @property
    def memory_mapped_keys(self) -> List[str]:
        """The leaves read and written through a memory map (contiguous datasets of a file on disk)."""
        return [c.leaf.name for c in self._columns() if c.arr is not None]

    @property
    def _dirty(self) -> bool:
        return self._meta_dirty or self._segments.version != self._saved_log_version

    def _norm(self, index: Any) -> NormalizedIndex:
        return normalize_index(index, self._length, type(self).__name__)

    # ------------------------------------------------------------------ reads
    def _read_leaves(self, norm: NormalizedIndex, which: Optional[Sequence[int]] = None) -> List[Any]:
        cols = self._columns()
        if which is None:
            return [self._read_col(c, norm) for c in cols]
        return [self._read_col(cols[i], norm) for i in which]

    def _read_col(self, col: _Column, norm: NormalizedIndex) -> Any:
        return read_col(col, norm, self._reduce_io, self._path or "in-memory file")

    def get(self, index: Any) -> Any:
        """Sample(s) at `index`: one for an int-like index, else a batch (fresh NumPy arrays; str for text)."""
        self._check_open()
        norm = self._norm(index)
        return self._tree.assemble(self._read_leaves(norm))

    # ------------------------------------------------------------------ writes
    def _write_leaves(self, norm: NormalizedIndex, values: Sequence[Any], which: Optional[Sequence[int]] = None) -> None:
        cols = self._columns()
        self.check_writable()
        targets = cols if which is None else [cols[i] for i in which]
        for col, v in zip(targets, values):
            write_col(col, norm, v, self._reduce_io, self._path or "in-memory file")

    # ------------------------------------------------------------------ length
    def _check_owner(self, what: str) -> None:
        if not self._owner:
            raise StorageStateError(f"{what} is not allowed on a reader copy of {type(self).__name__}")

    def _resize(self, rows: int) -> None:
        """Gives the datasets `rows` rows. A file on disk is never resized in place (that rewrites HDF5's chunk index
        and dataset extents, which a kill could leave half-written): a new file with `rows` allocated rows, this
        state in its attribute, replaces it atomically (`_move_to_new_file`). Growth is geometric, so appends
        copy each row a bounded number of times."""
        if self._path is None:
            for col in self._columns():
                col.ds.resize(rows, axis=0)
            self._alloc = rows
            return
        self._move_to_new_file(rows)

    def _move_to_new_file(self, rows: int) -> None:
        cols = self._columns()
        old_id, self._file_id = self._file_id, new_file_id()
        try:
            write_copy(self._path or "", cols, self._tree, rows, min(self._length, rows), self._capacity,
                       self._metadata(), self._read_col)
        except BaseException:
            self._file_id = old_id
            raise
        old, self._file, self._cols, self._mmap = self._file, None, None, None
        try:
            old.close()     # names the replaced file now; nothing of it is dirty
        except Exception:  # noqa: BLE001
            pass
        self._attach(_open_file(self._path, "r+", type(self).__name__, **self._h5_kwargs))  # type: ignore[arg-type]
        self._alloc = rows
        self._meta_dirty = False    # the new file's attribute holds this state; the old sidecar is ignored
        self._saved_log_version = self._segments.version

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

    def _grow_rows(self, new_len: int) -> None:
        if new_len > self._alloc:
            self._columns()
            self._resize(max(new_len, 2 * self._alloc, 64) if new_len == self._length + 1 else new_len)
        self._length = new_len
        self._meta_dirty = True

    def _drop_rows(self, new_len: int) -> None:
        if self._seg_start is not None and self._seg_start + self._seg_len > new_len:
            self.abort_segment()
        before = self._segments.version
        self._segments.truncate(new_len)
        if self._segments.version != before:
            self.on_segments_dropped()        # persisted before their rows are zeroed
        self._zero_rows(new_len, self._length)
        self._length = new_len
        self._meta_dirty = True

    def clear(self) -> None:
        """Aborts the open segment, forgets all segments, zeroes every row (growable: length 0)."""
        self.check_writable()
        self._check_owner("clear")
        self.abort_segment()
        if len(self._segments):
            self._segments.clear()
            self.on_segments_dropped()        # persisted before their rows are zeroed
        if self._capacity is None:
            self.shrink_length(self._length)
        else:
            self._zero_rows(0, self._capacity)
        self._meta_dirty = True

    # ------------------------------------------------------------------ persistence
    def _metadata(self) -> Dict[str, Any]:
        return {"storage_type": storage_type_name(type(self)), "format_version": FORMAT_VERSION,
                "file_id": self._file_id, "capacity": self._capacity, "length": self._length,
                "segments": self._segments.to_json(), "space": space_to_json(self.single_instance_space)}

    def flush(self) -> None:
        """A commit point: flushes the rows into the file (and, when durable, fsyncs it), then replaces the state
        sidecar `<file>.state.json` atomically (see `_hdf5_state`); an in-memory file keeps its state in its
        attribute. A no-op for read-only storages and reader copies."""
        self._check_open()
        if self._read_only or not self._owner:
            return
        self._columns()
        f = self._file
        if is_durable() and self._mmap is not None:
            self._mmap.flush()
        f.flush()
        if self._path is None:
            f.attrs[META_ATTR] = json.dumps(self._metadata())
        else:
            if is_durable():
                fd = os.open(self._path, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
            if self._file_id is None:
                raise StorageStateError(f"{self._path}: internal invariant violated: a writable file without an id")
            write_state(self._path, self._file_id, self._capacity, self._length, self._segments.to_json())
        self._meta_dirty = False
        self._saved_log_version = self._segments.version

    def on_segments_dropped(self) -> None:
        # rows of a recorded segment are about to be overwritten: persist the shorter list first
        if self._path is not None and not self._read_only and self._owner and not self._closed \
                and self._file is not None and self._pid == os.getpid():
            self.flush()

    def has_persistent_segments(self) -> bool:
        return self._file_id is not None

    def dump_columns(self, path: str, which: Optional[Sequence[int]] = None, tree: Optional[LeafTree] = None) -> None:
        """Writes the rows of the leaves `which` (all by default) as a new HDF5Storage file at `path` (temporary
        name, then rename), with each dataset's layout and filters; `tree` (the storage's own by default) names the
        leaves and gives the space of the new file. What `dumps` and a column view's `dumps` write."""
        self._check_open()
        cols = self._columns()
        chosen = cols if which is None else [cols[i] for i in which]
        tree = tree or self._tree
        meta = self._metadata()
        meta["file_id"] = new_file_id()
        meta["space"] = space_to_json(tree.space)
        write_copy(path, chosen, tree, self._length, self._length, self._capacity, meta, self._read_col)

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
        self.dump_columns(path)

    def _persist_on_close(self) -> None:
        """Flushes a writable storage; `close` then closes the file."""
        if self._file is not None and self._pid == os.getpid() and not self._read_only and self._owner:
            if self._path is not None and self._capacity is None and self._alloc != self._length:
                self._move_to_new_file(self._length)    # at rest the file describes exactly its rows
            self.flush()

    def _free(self) -> None:
        self._drop_handle()

    def _drop_handle(self) -> None:
        f, self._file, self._cols, self._mmap = self._file, None, None, None  # the map closes with its last view
        _WRITERS.pop(id(self), None)
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
        log = SegmentLog(state["capacity"], state["segments"])
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
        return build_space(root)

    @staticmethod
    def load_replay_buffer_from_raw_hdf5(path: PathLike) -> Any:
        """A read-only ReplayBuffer over every row of an HDF5 file (space inferred by `build_space_from_hdf5_file`)."""
        return raw_replay_buffer(HDF5Storage, path)


__all__ = ["HDF5Storage", "HDF5ColumnView", "META_ATTR", "STATE_SUFFIX", "CHUNK_TARGET_BYTES"]
