"""`ParquetPieces`: the half of `ParquetStorage` that holds its rows: its state, the decoded columns in memory
(filled piece by piece as pieces are touched), reading and writing leaf columns, and reading or writing one piece
file. `ParquetStorage` (in `parquet`) adds construction, the storage API, the length, persistence and pickling."""
from __future__ import annotations

from unienv_data.base.common import BatchT
from unienv_interface.backends.base import BArrayType, BDeviceType, BDtypeType, BRNGType
import os
from typing import Any, Dict, List, Optional, Sequence, Set

import numpy as np

from unienv_data.base.errors import StorageFormatError, StorageNotFoundError, StorageStateError
from unienv_data.base.files import link_or_copy
from unienv_data.base.forwarding import forwarded
from unienv_data.base.indexing import NormalizedIndex, normalize_index
from unienv_data.base.segments import SegmentLog
from unienv_data.base.leaf_storage import LeafStorage
from unienv_interface.space import Space

from ._io_pool import map_io
from ._list_leaves import LeafTreeWrites
from ._list_helpers import numbered_files
from ._list_storage import LeafTree, replace_file
from ._parquet_format import (_PIECE, DEFAULT_KEY, _arrow_type, _encode_piece, _n_pieces, _pa, _pq,
                              piece_filename)


class ParquetPieces(LeafTreeWrites, LeafStorage[BatchT, BArrayType, BDeviceType, BDtypeType, BRNGType]):
    """Rows of a `ParquetStorage` in memory and in its piece files; the base of `ParquetStorage`, not used alone."""

    def __init__(self, single_instance_space: Space, directory: str, capacity: Optional[int], length: int,
                 piece_size: int, compression: Any = "snappy", segments: Optional[SegmentLog] = None, *,
                 read_only: bool = False, owner: bool = True, on_disk_rows: Optional[int] = None,
                 new_directory: bool = False) -> None:
        """`new_directory`: the storage is being created in an empty `directory` (`create`): a fixed capacity's zero
        rows are written as pieces at once, and the metadata counts as unsaved until the first `flush()`."""
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
        if new_directory:
            self._write_zero_pieces()

    def _write_zero_pieces(self) -> None:
        """The piece files of a new storage, so its directory is complete at once: with a fixed capacity every full
        piece holds zeros and is the same file (written once, then linked or copied), then the partial last one."""
        cap = self._capacity
        if cap is not None:
            full, ps = cap // self._piece_size, self._piece_size
            if full:
                self._write_piece(0)
                first = os.path.join(self._dir, piece_filename(0))
                map_io(lambda p: link_or_copy(first, os.path.join(self._dir, piece_filename(p))), list(range(1, full)))
            if cap % ps:
                self._write_piece(full)
        self._meta_dirty = True

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

    # ------------------------------------------------------------------ properties
    cache_filename: Optional[str] = forwarded("_dir")
    piece_size: int = forwarded("_piece_size")
    compression: Any = forwarded("_compression")

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

    # ------------------------------------------------------------------ leaf columns
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

    def _write_leaves(self, norm: NormalizedIndex, values: Sequence[Any], which: Optional[Sequence[int]] = None) -> None:
        self.check_writable()
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

    # ------------------------------------------------------------------ piece files
    def _grow_loaded(self, n_pieces: int) -> None:
        for k, loaded in enumerate(self._loaded):
            if loaded.shape[0] < n_pieces:
                grown = np.ones(max(n_pieces, 2 * loaded.shape[0]), dtype=bool)  # new pieces hold zeros
                grown[:loaded.shape[0]] = loaded
                self._loaded[k] = grown

    def _write_piece(self, piece: int) -> None:
        start = piece * self._piece_size
        end = min(start + self._piece_size, self._length)
        arrays = [self._column(k)[start:end] for k in range(len(self._tree.leaves))]
        replace_file(lambda tmp: _encode_piece(tmp, self._tree, arrays, self._compression),
                     os.path.join(self._dir, piece_filename(piece)))

    def _piece_files(self, directory: str) -> Dict[int, str]:
        return numbered_files(directory, _PIECE)
