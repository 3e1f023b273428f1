"""`ParquetStorage`: samples of a flat DictSpace (or one Box / Binary / Text leaf) as a directory of Parquet files of
`piece_size` rows each (reference-api §5.9). NumPy backend; needs the `parquet` extra (pyarrow).

Layout (the reference's, plus fields it ignores)::

    _metadata.json         {"piece_size", "num_rows", "column_shapes", "compression", "column_dtypes",
                            "format_version", "capacity", "segments", "space"}
    part-000000.parquet    rows [0, piece_size); one column per key ("data" for a non-dict space): scalars as plain
    part-000001.parquet    columns, other shapes as fixed-size lists of the flattened element, text as strings;
    ...                    the schema metadata "column_shapes" holds the element shapes

The storage keeps what it reads in memory, decoded (one array per column, filled piece by piece as pieces are
touched; a column view decodes only its column). Writes go to memory and mark their pieces dirty; `flush`,
`dumps`, `close` and pickling write each dirty piece under a temporary name and rename it into place, then the
metadata: the directory always describes complete pieces. Reading files is cheap to share: reader processes
(pickled copies, `load_from(read_only=True)`) read the pieces from disk themselves.

Differences from the reference, on purpose: errors are exceptions that say what to pass instead; a directory whose
columns do not match the space is refused with every mismatch named, a missing, truncated or damaged piece is an
error naming the file; the capacity and segments are persisted; `dumps(path)` elsewhere hard-links (or copies)
the pieces and replaces stale ones of an older dump there; writes through a column view touch only that column.
"""
from __future__ import annotations

import os
from typing import Any, Dict, Optional, Sequence, Tuple, Union

import numpy as np

from unienv_data.base.errors import StorageFormatError, StorageNotFoundError, StorageStateError
from unienv_data.base.files import FORMAT_VERSION, PathLike, atomic_write_json, check_format_version, read_json
from unienv_data.base.hooks import upper_layer
from unienv_data.base.registry import register_storage
from unienv_data.base.segments import SegmentLog
from unienv_interface.space import Space
from unienv_interface.space.space_utils.serialization_utils import space_to_json

from ._column_view import ColumnView
from ._io_pool import map_io
from ._list_storage import check_capacity, check_stored_space, link_or_copy
from ._parquet_format import (DEFAULT_KEY, METADATA_FILE, _check_codec, _dtype_name, _n_pieces, check_metadata,
                              directory_space, piece_filename)
from ._parquet_pieces import ParquetPieces


# ---------------------------------------------------------------------------------------------------- storage
@register_storage
class ParquetStorage(
    ParquetPieces[Union[Dict[str, Any], np.ndarray, str], np.ndarray, Any, np.dtype, np.random.Generator],
):
    """Samples of a flat NumPy DictSpace / Box / Binary / Text space in Parquet pieces (see the module docstring).

    `create(space, *, capacity=None, cache_path (a new or empty directory), multiprocessing=False,
    piece_size=1024, compression="snappy")`: `compression` is a codec name, None, or a dict from column name (or
    "*") to codec. `load_from(path, space, *, capacity=None, read_only=True, multiprocessing=False)` takes the
    capacity from the metadata (reference directories record none: they load growable unless `capacity` equals
    their row count). `get_column([key])` gives a view of one column.
    """

    single_file_ext: Optional[str] = None
    DEFAULT_KEY = DEFAULT_KEY

    # ------------------------------------------------------------------ construction
    @classmethod
    def create(cls, single_instance_space: Space, *args: Any, capacity: Optional[int] = None,
               cache_path: Optional[PathLike] = None, multiprocessing: bool = False, piece_size: int = 1024,
               compression: Any = "snappy", **kwargs: Any) -> "ParquetStorage":
        """A new storage in the directory `cache_path` (created; it must be new or empty)."""
        if args:
            raise TypeError(f"{cls.__name__}.create() takes no extra positional arguments, got {args!r}")
        if kwargs:
            raise TypeError(f"{cls.__name__}.create() got unexpected keyword argument(s) {sorted(kwargs)}")
        tree = cls._make_tree(single_instance_space)
        cap = check_capacity(capacity)
        if multiprocessing:
            raise ValueError(f"{cls.__name__} is written by one process: create it with multiprocessing=False, then "
                             "give reader processes pickled copies or load_from(path, read_only=True)")
        if isinstance(piece_size, bool) or not isinstance(piece_size, (int, np.integer)) or piece_size <= 0:
            raise ValueError(f"piece_size must be a positive int, got {piece_size!r}")
        if isinstance(compression, dict):
            names = {leaf.name for leaf in tree.leaves} | {"*"}
            unknown = sorted(set(compression) - names)
            if unknown:
                raise KeyError(f"compression names unknown columns {unknown}; columns: {sorted(names - {'*'})}")
            for k, c in compression.items():
                _check_codec(c, f"compression[{k!r}]")
        else:
            _check_codec(compression, "compression")
        if cache_path is None:
            raise ValueError(f"{cls.__name__} is a directory of files: pass cache_path=<a new or empty directory>")
        path = os.fspath(cache_path)
        if os.path.exists(path) and (not os.path.isdir(path) or os.listdir(path)):
            raise FileExistsError(f"{cls.__name__}: {path} already holds files; pass a new or empty directory (or open "
                                  "the existing storage with load_from)")
        os.makedirs(path, exist_ok=True)
        st = cls(single_instance_space, path, cap, 0, int(piece_size), compression, on_disk_rows=0, new_directory=True)
        st.flush()
        return st

    @classmethod
    def load_from(cls, path: PathLike, single_instance_space: Space, *, capacity: Optional[int] = None,
                  read_only: bool = True, multiprocessing: bool = False, **kwargs: Any) -> "ParquetStorage":
        """Opens a directory written by this library or by the reference, checking its columns against the space."""
        if kwargs:
            raise TypeError(f"{cls.__name__}.load_from() got unexpected keyword argument(s) {sorted(kwargs)}")
        tree, cap_arg = cls._check_load_args(single_instance_space, capacity, read_only, multiprocessing)
        path = os.fspath(path)
        if not os.path.isdir(path):
            raise StorageNotFoundError(f"{cls.__name__} directory not found: {path}")
        meta_path = os.path.join(path, METADATA_FILE)
        meta = read_json(meta_path, f"{cls.__name__} metadata")
        version = check_format_version(meta, meta_path)
        info = check_metadata(meta, meta_path, tree, read_only)
        rows, piece_size = info["num_rows"], info["piece_size"]
        if version >= 1 and "capacity" in meta:
            stored_cap = meta["capacity"]
            if stored_cap is not None and (isinstance(stored_cap, bool) or not isinstance(stored_cap, int)
                                           or stored_cap != rows):
                raise StorageFormatError(f"{meta_path}: capacity {stored_cap!r} does not match num_rows {rows}")
            if cap_arg is not None and cap_arg != stored_cap:
                hint = ("omit capacity (the storage is growable)" if stored_cap is None
                        else f"pass capacity={stored_cap} or omit it")
                raise ValueError(f"{path} was written with capacity {stored_cap}, not {cap_arg}: {hint}")
            cap = stored_cap
        else:
            if cap_arg is not None and cap_arg != rows:
                raise ValueError(f"{path} holds {rows} rows, so it cannot be loaded with capacity={cap_arg}: pass "
                                 f"capacity={rows} for a fixed-capacity ring, or omit it (growable)")
            cap = cap_arg
        segments = SegmentLog(cap)
        if version >= 1:
            segments = SegmentLog.from_json(meta.get("segments", []), cap, rows, meta_path)
            if "space" in meta:
                check_stored_space(meta["space"], tree, meta_path)
        missing = [piece_filename(p) for p in range(_n_pieces(rows, piece_size))
                   if not os.path.isfile(os.path.join(path, piece_filename(p)))]
        if missing:
            raise StorageFormatError(f"{path}: piece file(s) {missing[:5]} of the {rows} rows are missing; the storage is "
                                     "incomplete")
        return cls(single_instance_space, path, cap, rows, piece_size, meta.get("compression", "snappy"), segments,
                   read_only=read_only)

    # ------------------------------------------------------------------ reads
    def get(self, index: Any) -> Any:
        """Sample(s) at `index`: one for an int-like index, else a batch (fresh NumPy arrays; str for text)."""
        self._check_open()
        return self._tree.assemble(self._read_leaves(self._norm(index)))

    # ------------------------------------------------------------------ length
    def _grow_rows(self, new: int) -> None:
        ps = self._piece_size
        old = self._length
        n = new - old
        first = old // ps
        self._grow_loaded(_n_pieces(new, ps))
        if old % ps:
            self._ensure_loaded(np.array([first]), range(len(self._tree.leaves)))  # it is rewritten with more rows
        if new > self._alloc:
            self._alloc = max(new, 2 * self._alloc, ps) if n == 1 else new
        self._length = new
        self._dirty.update(range(first, _n_pieces(new, ps)))

    def _drop_rows(self, new: int) -> None:
        ps = self._piece_size
        old = self._length
        if new % ps:
            self._ensure_loaded(np.array([new // ps]), range(len(self._tree.leaves)))
            self._dirty.add(new // ps)
        for k, col in enumerate(self._cols):
            if col is not None:
                end = min(old, len(col))    # a loaded column may stop short of rows extend_length added
                if end > new:
                    col[new:end] = self._tree.leaves[k].zeros(end - new)
        self._dirty = {p for p in self._dirty if p < _n_pieces(new, ps)}
        first_gone = _n_pieces(new, ps)
        for loaded in self._loaded:
            loaded[first_gone:] = True  # rows past the new end hold zeros from now on
        self._length = new
        self._disk_valid = min(self._disk_valid, new)
        self.after_shrink(new)

    def clear(self) -> None:
        """Aborts the open segment, forgets all segments, zeroes every row (growable: length 0)."""
        self.check_writable()
        self._check_owner("clear")
        super().clear()
        if self._capacity is not None:
            for k, leaf in enumerate(self._tree.leaves):
                self._cols[k] = None
                self._loaded[k][:] = True
            self._disk_valid = 0
            self._dirty.update(range(_n_pieces(self._capacity, self._piece_size)))
        self._meta_dirty = True

    # ------------------------------------------------------------------ persistence
    def _metadata(self, rows: int) -> Dict[str, Any]:
        return {"piece_size": self._piece_size, "num_rows": rows,
                "column_shapes": {leaf.name: list(leaf.shape) for leaf in self._tree.leaves},
                "compression": self._compression,
                "column_dtypes": {leaf.name: _dtype_name(leaf) for leaf in self._tree.leaves},
                "format_version": FORMAT_VERSION, "storage_type": "unienv_data.storages.parquet.ParquetStorage",
                "capacity": self._capacity, "segments": self._segments.to_json(),
                "space": space_to_json(self.single_instance_space)}

    def flush(self) -> None:
        """Writes every dirty piece (temporary name, then rename), then the metadata, then removes pieces past the
        end. A no-op for read-only storages and reader copies."""
        self._check_open()
        if self._read_only or not self._owner:
            return
        dirty = sorted(self._dirty)
        map_io(self._write_piece, dirty)
        self._dirty.clear()
        atomic_write_json(os.path.join(self._dir, METADATA_FILE), self._metadata(self._length))
        n = _n_pieces(self._length, self._piece_size)
        for p, name in self._piece_files(self._dir).items():
            if p >= n:
                try:
                    os.unlink(os.path.join(self._dir, name))
                except FileNotFoundError:
                    pass
        self._disk_rows = self._disk_valid = self._length
        self._meta_dirty = False
        self._saved_log_version = self._segments.version

    def dumps(self, path: PathLike) -> None:
        """Persists to the directory `path`: its own directory flushes; elsewhere the pieces are hard-linked (or
        copied) there, stale pieces of an older dump removed, then the metadata written."""
        self._check_open()
        path = os.fspath(path)
        if os.path.isdir(path) and os.path.samefile(path, self._dir):
            self.flush()
            return
        if os.path.exists(path) and not os.path.isdir(path):
            raise FileExistsError(f"{type(self).__name__}.dumps: {path} exists and is not a directory")
        if self._read_only or not self._owner:
            if self._disk_rows != self._length:
                raise StorageStateError(f"{type(self).__name__}: this reader copy differs from its directory; dump the "
                                        "original storage")
        else:
            self.flush()
        os.makedirs(path, exist_ok=True)
        n = _n_pieces(self._length, self._piece_size)
        map_io(lambda p: link_or_copy(os.path.join(self._dir, piece_filename(p)), os.path.join(path, piece_filename(p))),
               list(range(n)))
        for p, name in self._piece_files(path).items():
            if p >= n:
                os.unlink(os.path.join(path, name))
        atomic_write_json(os.path.join(path, METADATA_FILE), self._metadata(self._length))

    def _persist_on_close(self) -> None:
        """Flushes a writable storage (unless its directory is gone); `close` then drops the decoded pieces."""
        if not self._read_only and self._owner and self._dirty_meta and os.path.isdir(self._dir):
            self.flush()

    def _free(self) -> None:
        self._cols = [None] * len(self._tree.leaves)

    def _release(self) -> None:
        try:
            self._persist_on_close()
        except Exception:  # noqa: BLE001 - garbage collection must not raise
            pass

    # ------------------------------------------------------------------ columns
    def get_column(self, nested_keys: Union[str, Sequence[str]]) -> "ParquetColumnView":
        """A view of one column (`["obs"]` or `"obs"`): reads decode only that column of each piece."""
        self._check_open()
        keys = [nested_keys] if isinstance(nested_keys, str) else list(nested_keys)
        if len(keys) != 1:
            raise KeyError(f"{type(self).__name__} holds a flat DictSpace: get_column takes one key, got {keys}")
        if not self._tree.is_dict:
            raise KeyError(f"{type(self).__name__} of a single {type(self.single_instance_space).__name__} has no columns "
                           "to select")
        sub, which = self._tree.subtree(keys)
        return ParquetColumnView(self, sub, which[:1], keys[:1])

    # ------------------------------------------------------------------ pickling
    def __getstate__(self) -> Dict[str, Any]:
        self._check_open()
        if not self._read_only and self._owner:
            self.flush()
        return {"space": self.single_instance_space, "dir": self._dir, "capacity": self._capacity,
                "length": self._disk_rows, "piece_size": self._piece_size, "compression": self._compression,
                "segments": self._segments.to_json()}

    def __setstate__(self, state: Dict[str, Any]) -> None:
        log = SegmentLog(state["capacity"], state["segments"])
        ParquetStorage.__init__(self, state["space"], state["dir"], state["capacity"], state["length"],
                                state["piece_size"], state["compression"], log, read_only=True, owner=False)

    # ------------------------------------------------------------------ raw directories
    @staticmethod
    def build_space_from_parquet_file(path: PathLike) -> Tuple[int, Optional[int], Space]:
        """`(count, capacity, space)` of a storage directory; the capacity is the row count (as the reference gives
        it, also for unbounded storages). Directories written by this library give back their stored space;
        otherwise the space is inferred from the column dtypes and shapes (unbounded Boxes, Binary for bool, Text for
        strings)."""
        return directory_space(path)

    @staticmethod
    def load_replay_buffer_from_raw_parquet(path: PathLike) -> Any:
        """A read-only ReplayBuffer over every row of a storage directory (space from `build_space_from_parquet_file`)."""
        count, _cap, space = ParquetStorage.build_space_from_parquet_file(path)
        storage = ParquetStorage.load_from(path, space, read_only=True)
        return upper_layer("buffer.over_storage")(storage, "storage", count)


class ParquetColumnView(ColumnView):
    """One column of a `ParquetStorage` (from `get_column`). Reads decode only this column; writes change only it.
    Length, capacity and segments are the parent's and change through the parent."""

    single_file_ext: Optional[str] = None

    def get(self, index: Any) -> Any:
        self._check_open()
        return self._parent.read_columns(index, self._which)[0]

    def dumps(self, path: PathLike) -> None:
        """Dumps the whole parent storage (a column is not a storage directory of its own)."""
        self._parent.dumps(path)


__all__ = ["ParquetStorage", "ParquetColumnView", "piece_filename", "METADATA_FILE"]
