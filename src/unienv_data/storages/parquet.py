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

import json
import os
import re
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple, Union

import numpy as np

from unienv_data.base.errors import StorageFormatError, StorageNotFoundError, StorageStateError
from unienv_data.base.files import FORMAT_VERSION, PathLike, atomic_write_json, check_format_version, read_json
from unienv_data.base.indexing import NormalizedIndex, normalize_index
from unienv_data.base.registry import register_storage
from unienv_data.base.segments import SegmentLog
from unienv_data.base.storage import SpaceStorage
from unienv_interface.backends import NumpyComputeBackend
from unienv_interface.space import BinarySpace, BoxSpace, DictSpace, Space, TextSpace
from unienv_interface.space.space_utils.serialization_utils import json_to_space, space_to_json

from ._column_view import ColumnView
from ._list_storage import (Leaf, LeafTree, check_capacity, check_count, check_stored_space, describe_leaf,
                            link_or_copy, replace_file, require_module)
from ._io_pool import map_io

METADATA_FILE = "_metadata.json"
DEFAULT_KEY = "data"
_PIECE = re.compile(r"^part-(\d{6,})\.parquet$")


def _pa() -> Any:
    return require_module("pyarrow", "parquet", "ParquetStorage")


def _pq() -> Any:
    _pa()
    return require_module("pyarrow.parquet", "parquet", "ParquetStorage")


def piece_filename(piece: int) -> str:
    return f"part-{piece:06d}.parquet"


def _n_pieces(rows: int, piece_size: int) -> int:
    return (rows + piece_size - 1) // piece_size


def _dtype_name(leaf: Leaf) -> str:
    return "object" if leaf.conv is None else leaf.dtype.name


def _arrow_type(leaf: Leaf) -> Any:
    pa = _pa()
    if leaf.conv is None:
        return pa.string()
    base = pa.from_numpy_dtype(leaf.dtype)
    n = int(np.prod(leaf.shape, dtype=np.int64))
    return base if not leaf.shape else pa.list_(base, n)


def _check_codec(codec: Any, where: str) -> None:
    if codec is None:
        return
    if not isinstance(codec, str):
        raise ValueError(f"{where}: a compression codec must be a string or None, got {codec!r}")
    if codec.upper() == "NONE":
        return
    pa = _pa()
    try:
        ok = pa.Codec.is_available(codec.lower())
    except (ValueError, TypeError):
        ok = False
    if not ok:
        raise ValueError(f"{where}: unknown or unavailable compression {codec!r} (e.g. 'snappy', 'zstd', 'gzip', "
                         "'lz4', 'brotli' or None)")


def _encode_piece(path: str, tree: LeafTree, arrays: Sequence[np.ndarray], compression: Any) -> None:
    pa, pq = _pa(), _pq()
    cols, fields = [], []
    for leaf, arr in zip(tree.leaves, arrays):
        typ = _arrow_type(leaf)
        if leaf.conv is None:
            col = pa.array([str(v) for v in arr], type=pa.string())
        elif not leaf.shape:
            col = pa.array(arr, type=typ)
        else:
            n = int(np.prod(leaf.shape, dtype=np.int64))
            col = pa.FixedSizeListArray.from_arrays(pa.array(np.ascontiguousarray(arr).reshape(-1), type=typ.value_type), n)
        cols.append(col)
        fields.append(pa.field(leaf.name, typ))
    shapes = {leaf.name: list(leaf.shape) for leaf in tree.leaves}
    schema = pa.schema(fields).with_metadata({b"column_shapes": json.dumps(shapes).encode("utf-8")})
    table = pa.Table.from_arrays(cols, schema=schema)
    if isinstance(compression, dict):
        codec: Any = {}
        for leaf in tree.leaves:
            c = compression.get(leaf.name, compression.get("*"))
            codec[f"{leaf.name}.list.element" if leaf.shape else leaf.name] = "NONE" if c is None else c
    else:
        codec = "NONE" if compression is None else compression
    # dictionary encoding only pays for strings; on sensor floats it costs ~40% of the write for nothing
    text = [leaf.name for leaf in tree.leaves if leaf.conv is None]
    with pa.OSFile(path, "wb") as sink:  # a native file: skips pyarrow's per-call file system resolution
        pq.write_table(table, sink, compression=codec, use_dictionary=text or False)


# ---------------------------------------------------------------------------------------------------- storage
@register_storage
class ParquetStorage(SpaceStorage[Any, Any, Any, Any, Any]):
    """Samples of a flat NumPy DictSpace / Box / Binary / Text space in Parquet pieces (see the module docstring).

    `create(space, *, capacity=None, cache_path (a new or empty directory), multiprocessing=False,
    piece_size=1024, compression="snappy")`: `compression` is a codec name, None, or a dict from column name (or
    "*") to codec. `load_from(path, space, *, capacity=None, read_only=True, multiprocessing=False)` takes the
    capacity from the metadata (reference directories record none: they load growable unless `capacity` equals
    their row count). `get_column([key])` gives a view of one column.
    """

    single_file_ext: Optional[str] = None
    DEFAULT_KEY = DEFAULT_KEY

    def __init__(self, single_instance_space: Space, directory: str, capacity: Optional[int], length: int,
                 piece_size: int, compression: Any = "snappy", segments: Optional[SegmentLog] = None, *,
                 read_only: bool = False, owner: bool = True, on_disk_rows: Optional[int] = None) -> None:
        super().__init__(single_instance_space)
        self._tree = self._make_tree(single_instance_space)
        self._dir = directory
        self._capacity = capacity
        self._length = capacity if capacity is not None else length
        self._piece_size = int(piece_size)
        self._compression = compression
        self._segments = segments if segments is not None else SegmentLog(capacity)
        self._read_only = read_only
        self._owner = owner
        #: rows whose content the piece files on disk hold (rows past it are new, zeros until written)
        self._disk_valid = self._length if on_disk_rows is None else on_disk_rows
        #: rows the metadata on disk records (and the piece files cover)
        self._disk_rows = self._disk_valid
        n_leaves = len(self._tree.leaves)
        self._alloc = self._length
        self._cols: List[Optional[np.ndarray]] = [None] * n_leaves
        self._loaded: List[np.ndarray] = [self._initial_loaded() for _ in range(n_leaves)]
        self._dirty: Set[int] = set()
        self._meta_dirty = False
        self._saved_log_version = self._segments.version

    def _initial_loaded(self) -> np.ndarray:
        n = _n_pieces(self._length, self._piece_size)
        loaded = np.zeros(max(n, 1), dtype=bool)
        loaded[_n_pieces(self._disk_valid, self._piece_size):] = True  # pieces past the disk's rows hold zeros
        return loaded

    @classmethod
    def _make_tree(cls, space: Space) -> LeafTree:
        if not isinstance(space, Space):
            raise TypeError(f"single_instance_space must be a Space, got {type(space).__name__}")
        if getattr(space.backend, "simplified_name", "") != "numpy":
            raise TypeError(f"{cls.__name__} stores NumPy-backend spaces, got {space.backend}; wrap it with "
                            "ToBackendOrDeviceStorage to serve another backend")
        tree = LeafTree(space, cls.__name__, DEFAULT_KEY, allow_nested=False)
        for leaf in tree.leaves:
            if leaf.conv is not None and leaf.shape and int(np.prod(leaf.shape)) == 0:
                raise ValueError(f"{cls.__name__}: {leaf.name!r} has no elements (shape {list(leaf.shape)}); Parquet "
                                 "columns need at least one value per row")
        return tree

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
        st = cls(single_instance_space, path, cap, 0, int(piece_size), compression, on_disk_rows=0)
        if cap is not None:  # zero pieces, so the directory is complete at once: every full one is the same file
            full, ps = cap // st._piece_size, st._piece_size
            if full:
                st._write_piece(0)
                first = os.path.join(path, piece_filename(0))
                map_io(lambda p: link_or_copy(first, os.path.join(path, piece_filename(p))), list(range(1, full)))
            if cap % ps:
                st._write_piece(full)
        st._meta_dirty = True
        st.flush()
        return st

    @classmethod
    def load_from(cls, path: PathLike, single_instance_space: Space, *, capacity: Optional[int] = None,
                  read_only: bool = True, multiprocessing: bool = False, **kwargs: Any) -> "ParquetStorage":
        """Opens a directory written by this library or by the reference, checking its columns against the space."""
        if kwargs:
            raise TypeError(f"{cls.__name__}.load_from() got unexpected keyword argument(s) {sorted(kwargs)}")
        tree = cls._make_tree(single_instance_space)
        cap_arg = check_capacity(capacity)
        if multiprocessing and not read_only:
            raise ValueError(f"{cls.__name__} cannot be written by several processes: load it with read_only=True for "
                             "reader processes")
        path = os.fspath(path)
        if not os.path.isdir(path):
            raise StorageNotFoundError(f"{cls.__name__} directory not found: {path}")
        meta_path = os.path.join(path, METADATA_FILE)
        meta = read_json(meta_path, f"{cls.__name__} metadata")
        version = check_format_version(meta, meta_path)
        info = cls._check_metadata(meta, meta_path, tree, read_only)
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

    @classmethod
    def _check_metadata(cls, meta: Dict[str, Any], where: str, tree: LeafTree, read_only: bool) -> Dict[str, Any]:
        for field in ("piece_size", "num_rows", "column_shapes"):
            if field not in meta:
                raise StorageFormatError(f"{where} is missing the field {field!r}")
        ps, rows, shapes = meta["piece_size"], meta["num_rows"], meta["column_shapes"]
        if isinstance(ps, bool) or not isinstance(ps, int) or ps <= 0:
            raise StorageFormatError(f"{where}: piece_size must be a positive int, got {ps!r}")
        if isinstance(rows, bool) or not isinstance(rows, int) or rows < 0:
            raise StorageFormatError(f"{where}: num_rows must be a non-negative int, got {rows!r}")
        if not isinstance(shapes, dict):
            raise StorageFormatError(f"{where}: column_shapes must be an object, got {type(shapes).__name__}")
        dtypes = meta.get("column_dtypes")
        if dtypes is not None and not isinstance(dtypes, dict):
            raise StorageFormatError(f"{where}: column_dtypes must be an object, got {type(dtypes).__name__}")
        problems = []
        for leaf in tree.leaves:
            if leaf.name not in shapes:
                problems.append(f"no column {leaf.name!r} (the space has {describe_leaf(leaf.space)})")
                continue
            if shapes[leaf.name] != list(leaf.shape):
                problems.append(f"column {leaf.name!r} holds elements of shape {shapes[leaf.name]}, the space has "
                                f"{list(leaf.shape)}")
            if dtypes is not None and leaf.name in dtypes and dtypes[leaf.name] != _dtype_name(leaf):
                problems.append(f"column {leaf.name!r} holds {dtypes[leaf.name]}, the space has {_dtype_name(leaf)}")
        extra = sorted(set(shapes) - {leaf.name for leaf in tree.leaves})
        if extra and not read_only:
            problems.append(f"the directory also holds columns the space lacks: {extra} (pass the full space, or load "
                            "with read_only=True to read a subset)")
        if problems:
            raise ValueError(f"{os.path.dirname(where)} does not match the space: " + "; ".join(problems))
        return {"piece_size": ps, "num_rows": rows}

    # ------------------------------------------------------------------ properties
    @property
    def capacity(self) -> Optional[int]:
        return self._capacity

    def __len__(self) -> int:
        return self._length

    @property
    def cache_filename(self) -> Optional[str]:
        return self._dir

    @property
    def is_mutable(self) -> bool:
        return not self._read_only

    @property
    def is_multiprocessing_safe(self) -> bool:
        return self._read_only

    @property
    def piece_size(self) -> int:
        return self._piece_size

    @property
    def compression(self) -> Any:
        return self._compression

    def _segment_log(self) -> Optional[SegmentLog]:
        return self._segments

    @property
    def _dirty_meta(self) -> bool:
        return (self._meta_dirty or bool(self._dirty) or self._segments.version != self._saved_log_version
                or self._disk_rows != self._length)

    def _norm(self, index: Any) -> NormalizedIndex:
        return normalize_index(index, self._length, type(self).__name__)

    def _check_owner(self, what: str) -> None:
        if not self._owner:
            raise StorageStateError(f"{what} is not allowed on a reader copy of {type(self).__name__}")

    # ------------------------------------------------------------------ memory
    def _column(self, k: int) -> np.ndarray:
        arr = self._cols[k]
        if arr is None or arr.shape[0] < self._alloc:
            leaf = self._tree.leaves[k]
            grown = leaf.zeros(self._alloc)
            if arr is not None:
                grown[:arr.shape[0]] = arr
            self._cols[k] = arr = grown
        return arr

    def _pieces_of(self, norm: NormalizedIndex) -> np.ndarray:
        ps = self._piece_size
        if norm.single is not None:
            return np.array([norm.single // ps])
        if norm.slc is not None:
            s = norm.slc
            if s.stop <= s.start:
                return np.zeros(0, dtype=np.int64)
            if s.step == 1:
                return np.arange(s.start // ps, (s.stop - 1) // ps + 1)
        return np.unique(norm.positions() // ps)

    def _ensure_loaded(self, pieces: np.ndarray, which: Sequence[int]) -> None:
        """Decodes the pieces `pieces` of the columns `which` that are not in memory yet."""
        todo: Dict[int, List[int]] = {}
        for k in which:
            loaded = self._loaded[k]
            if pieces.size and not loaded[pieces].all():
                for p in pieces[~loaded[pieces]].tolist():
                    todo.setdefault(int(p), []).append(k)
        if not todo:
            return
        items = sorted(todo.items())
        tables = map_io(lambda item: self._read_piece(item[0], item[1]), items)
        for (p, ks), arrays in zip(items, tables):
            start = p * self._piece_size
            valid = min(self._disk_valid, self._length, start + self._piece_size) - start
            for k, arr in zip(ks, arrays):
                if valid > 0:
                    self._column(k)[start:start + valid] = arr[:valid]
                self._loaded[k][p] = True

    def _read_piece(self, piece: int, which: Sequence[int]) -> List[np.ndarray]:
        """The columns `which` of one piece file, checked against the space and the piece's row count."""
        pa, pq = _pa(), _pq()
        path = os.path.join(self._dir, piece_filename(piece))
        expect = min(self._piece_size, self._disk_rows - piece * self._piece_size)
        names = [self._tree.leaves[k].name for k in which]
        try:
            table = pq.read_table(path, columns=names, memory_map=False)
        except FileNotFoundError:
            raise StorageNotFoundError(f"{type(self).__name__}: piece file {path} is missing") from None
        except (pa.ArrowException, OSError, ValueError, KeyError) as exc:
            raise StorageFormatError(f"{path} is not a readable piece of this storage ({type(exc).__name__}: {exc}); it "
                                     "is truncated, damaged or lacks a column") from None
        if table.num_rows != expect:
            raise StorageFormatError(f"{path} holds {table.num_rows} rows, expected {expect}; the piece is truncated or "
                                     "belongs to another dataset")
        out = []
        for k, name in zip(which, names):
            leaf = self._tree.leaves[k]
            col = table.column(name)
            if col.null_count:
                raise StorageFormatError(f"{path}: column {name!r} holds {col.null_count} null values")
            want = _arrow_type(leaf)
            if not col.type.equals(want) and not (leaf.conv is None and pa.types.is_large_string(col.type)):
                raise StorageFormatError(f"{path}: column {name!r} is {col.type}, the space needs {want}")
            arr = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
            if leaf.conv is None:
                vals = np.empty(len(arr), dtype=object)
                vals[:] = arr.to_pylist()
                out.append(vals)
            elif leaf.shape:
                flat = arr.flatten().to_numpy(zero_copy_only=False)
                out.append(flat.reshape((len(arr),) + leaf.shape))
            else:
                out.append(arr.to_numpy(zero_copy_only=False))
        return out

    # ------------------------------------------------------------------ reads
    def _read_leaves(self, norm: NormalizedIndex, which: Optional[Sequence[int]] = None) -> List[Any]:
        self._check_open()
        ks = range(len(self._tree.leaves)) if which is None else which
        self._ensure_loaded(self._pieces_of(norm), ks)
        out: List[Any] = []
        for k in ks:
            col = self._column(k)
            leaf = self._tree.leaves[k]
            if norm.single is not None:
                v = col[norm.single]
                out.append(v if leaf.conv is None else np.array(v))
            elif norm.slc is not None:
                out.append(col[norm.slc].copy())
            else:
                out.append(col.take(norm.array, axis=0))  # type: ignore[arg-type]
        return out

    def get(self, index: Any) -> Any:
        """Sample(s) at `index`: one for an int-like index, else a batch (fresh NumPy arrays; str for text)."""
        self._check_open()
        return self._tree.assemble(self._read_leaves(self._norm(index)))

    # ------------------------------------------------------------------ writes
    def _write_leaves(self, norm: NormalizedIndex, values: Sequence[Any], which: Optional[Sequence[int]] = None) -> None:
        self._check_writable()
        pieces = self._pieces_of(norm)
        self._ensure_loaded(pieces, range(len(self._tree.leaves)))  # a flush rewrites whole pieces
        ks = range(len(self._tree.leaves)) if which is None else which
        for k, v in zip(ks, values):
            col = self._column(k)
            if norm.single is not None:
                col[norm.single] = v
            elif norm.slc is not None:
                col[norm.slc] = v
            else:
                pos = norm.positions()
                if pos.size > 1:
                    uniq, first_rev = np.unique(pos[::-1], return_index=True)
                    if uniq.size != pos.size:  # the last occurrence of a duplicate wins
                        keep = pos.size - 1 - first_rev
                        pos, v = uniq, v[keep]
                col[pos] = v
        self._dirty.update(pieces.tolist())

    def set(self, index: Any, value: Any) -> None:
        """Checks the whole value (keys, shapes, dtypes, bounds), then writes it; on error nothing changes."""
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
    def _grow_loaded(self, n_pieces: int) -> None:
        for k, loaded in enumerate(self._loaded):
            if loaded.shape[0] < n_pieces:
                grown = np.ones(max(n_pieces, 2 * loaded.shape[0]), dtype=bool)  # new pieces hold zeros
                grown[:loaded.shape[0]] = loaded
                self._loaded[k] = grown

    def extend_length(self, length: int) -> None:
        """Adds `length` zero rows at the end of a growable storage (a no-op for a fixed capacity)."""
        self._check_writable()
        if self._capacity is not None:
            return
        n = check_count(length, "extend_length")
        if not n:
            return
        self._check_owner("extend_length")
        ps = self._piece_size
        old, new = self._length, self._length + n
        first = old // ps
        self._grow_loaded(_n_pieces(new, ps))
        if old % ps:
            self._ensure_loaded(np.array([first]), range(len(self._tree.leaves)))  # it is rewritten with more rows
        if new > self._alloc:
            self._alloc = max(new, 2 * self._alloc, ps) if n == 1 else new
        self._length = new
        self._dirty.update(range(first, _n_pieces(new, ps)))

    def shrink_length(self, length: int) -> None:
        """Removes `length` rows from the end of a growable storage; their segments are forgotten."""
        self._check_writable()
        if self._capacity is not None:
            return
        n = check_count(length, "shrink_length", self._length)
        if not n:
            return
        self._check_owner("shrink_length")
        ps = self._piece_size
        old, new = self._length, self._length - n
        if new % ps:
            self._ensure_loaded(np.array([new // ps]), range(len(self._tree.leaves)))
            self._dirty.add(new // ps)
        for k, col in enumerate(self._cols):
            if col is not None:
                col[new:old] = self._tree.leaves[k].zeros(old - new)
        self._dirty = {p for p in self._dirty if p < _n_pieces(new, ps)}
        first_gone = _n_pieces(new, ps)
        for loaded in self._loaded:
            loaded[first_gone:] = True  # rows past the new end hold zeros from now on
        self._length = new
        self._disk_valid = min(self._disk_valid, new)
        self._segments.truncate(new)
        if self._seg_start is not None and self._seg_start + self._seg_len > new:
            self.abort_segment()

    def clear(self) -> None:
        """Aborts the open segment, forgets all segments, zeroes every row (growable: length 0)."""
        self._check_writable()
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

    def _write_piece(self, piece: int) -> None:
        start = piece * self._piece_size
        end = min(start + self._piece_size, self._length)
        arrays = [self._column(k)[start:end] for k in range(len(self._tree.leaves))]
        replace_file(lambda tmp: _encode_piece(tmp, self._tree, arrays, self._compression),
                     os.path.join(self._dir, piece_filename(piece)))

    def _piece_files(self, directory: str) -> Dict[int, str]:
        out: Dict[int, str] = {}
        try:
            names = os.listdir(directory)
        except FileNotFoundError:
            return out
        for name in names:
            m = _PIECE.match(name)
            if m:
                out[int(m.group(1))] = name
        return out

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

    def close(self) -> None:
        """Flushes a writable storage (unless its directory is gone), then drops the decoded pieces. Idempotent."""
        if self._closed:
            return
        try:
            if not self._read_only and self._owner and self._dirty_meta and os.path.isdir(self._dir):
                self.flush()
        finally:
            self._closed = True
            self._cols = [None] * len(self._tree.leaves)

    def _release(self) -> None:
        try:
            if not self._read_only and self._owner and self._dirty_meta and os.path.isdir(self._dir):
                self.flush()
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
        log = SegmentLog(state["capacity"])
        log._runs = [(int(s), int(n)) for s, n in state["segments"]]
        ParquetStorage.__init__(self, state["space"], state["dir"], state["capacity"], state["length"],
                                state["piece_size"], state["compression"], log, read_only=True, owner=False)

    # ------------------------------------------------------------------ raw directories
    @staticmethod
    def build_space_from_parquet_file(path: PathLike) -> Tuple[int, Optional[int], Space]:
        """`(count, capacity, space)` of a storage directory. Directories written by this library give back their
        stored space and capacity; otherwise the space is inferred from the column dtypes and shapes (unbounded
        Boxes, Binary for bool, Text for strings) and the capacity is the row count (as the reference does)."""
        path = os.fspath(path)
        meta_path = os.path.join(path, METADATA_FILE)
        meta = read_json(meta_path, "ParquetStorage metadata")
        check_format_version(meta, meta_path)
        count = meta.get("num_rows")
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise StorageFormatError(f"{meta_path}: num_rows must be a non-negative int, got {count!r}")
        if "space" in meta:
            try:
                space = json_to_space(meta["space"], NumpyComputeBackend, None)
            except (ValueError, TypeError, KeyError) as exc:
                raise StorageFormatError(f"{meta_path}: the stored space is malformed: {exc}") from None
            return count, meta.get("capacity", count), space
        shapes = meta.get("column_shapes")
        dtypes = meta.get("column_dtypes")
        if not isinstance(shapes, dict):
            raise StorageFormatError(f"{meta_path}: column_shapes must be an object")
        if not isinstance(dtypes, dict):
            dtypes = _dtypes_from_schema(path)
        B = NumpyComputeBackend
        spaces: Dict[str, Space] = {}
        for name, shape in shapes.items():
            dt = dtypes.get(name)
            if dt is None:
                raise StorageFormatError(f"{meta_path}: no dtype known for column {name!r}")
            if dt == "object":
                spaces[name] = TextSpace(B, max_length=4096)
            elif dt == "bool":
                spaces[name] = BinarySpace(B, tuple(shape))
            else:
                spaces[name] = BoxSpace(B, -np.inf, np.inf, np.dtype(dt), shape=tuple(shape))
        if list(spaces) == [DEFAULT_KEY]:
            return count, count, spaces[DEFAULT_KEY]
        return count, count, DictSpace(B, spaces)

    @staticmethod
    def load_replay_buffer_from_raw_parquet(path: PathLike) -> Any:
        """A read-only ReplayBuffer over every row of a storage directory (space from `build_space_from_parquet_file`)."""
        from unienv_data.replay_buffer import ReplayBuffer
        count, _cap, space = ParquetStorage.build_space_from_parquet_file(path)
        storage = ParquetStorage.load_from(path, space, read_only=True)
        return ReplayBuffer(storage, "storage", count=count, offset=0, cache_path=None, maintain_segment_metadata=False)


def _dtypes_from_schema(path: str) -> Dict[str, str]:
    pa, pq = _pa(), _pq()
    first = os.path.join(path, piece_filename(0))
    if not os.path.isfile(first):
        raise StorageFormatError(f"{path}: no column_dtypes in the metadata and no piece to read them from")
    try:
        schema = pq.read_schema(first)
    except (pa.ArrowException, OSError) as exc:
        raise StorageFormatError(f"{first} is not a readable Parquet file: {exc}") from None
    out = {}
    for field in schema:
        t = field.type
        if pa.types.is_string(t) or pa.types.is_large_string(t):
            out[field.name] = "object"
            continue
        if pa.types.is_fixed_size_list(t) or pa.types.is_list(t):
            t = t.value_type
        out[field.name] = np.dtype(t.to_pandas_dtype()).name
    return out


class ParquetColumnView(ColumnView):
    """One column of a `ParquetStorage` (from `get_column`). Reads decode only this column; writes change only it.
    Length, capacity and segments are the parent's and change through the parent."""

    single_file_ext: Optional[str] = None

    def get(self, index: Any) -> Any:
        self._check_open()
        return self._parent._read_leaves(self._parent._norm(index), self._which)[0]

    def dumps(self, path: PathLike) -> None:
        """Dumps the whole parent storage (a column is not a storage directory of its own)."""
        self._parent.dumps(path)


__all__ = ["ParquetStorage", "ParquetColumnView", "piece_filename", "METADATA_FILE"]
