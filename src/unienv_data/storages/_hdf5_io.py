"""Row I/O of `HDF5Storage` (see `hdf5.py`): reading and writing one leaf's rows (through a memory map for contiguous
datasets of a file on disk, else HDF5 hyperslabs), and writing a whole new file (`write_copy`: `dumps` to another
path, and a growable storage moving to a bigger file).

A new file is written under a temporary name, flushed (and fsync'ed when durable), then renamed over the target,
so the target path always holds either the old or the new complete file.
"""
from __future__ import annotations

import json
import mmap
import os
from typing import Any, Callable, List, Optional, Sequence, Tuple

import numpy as np

from unienv_data.base.errors import StorageFormatError
from unienv_data.base.files import PathLike, replacing_file
from unienv_data.base.indexing import NormalizedIndex

from ._hdf5_file import (_BLOCK_BYTES, _SPAN_READ_BYTES, _SPAN_READ_FACTOR, DEFAULT_KEY, META_ATTR, _auto_chunks,
                         _chunk_shape, _Column, _create_dataset, _h5py, _last_wins, _ll_read, _ll_write, _option_for,
                         _runs)
from ._column_view import ColumnView
from ._list_storage import Leaf, LeafTree


def _read_sorted(col: _Column, uniq: np.ndarray, reduce_io: bool) -> np.ndarray:
    n = int(uniq.size)
    if n == 0:
        return np.zeros((0,) + col.shape, dtype=col.dtype)
    lo, hi = int(uniq[0]), int(uniq[-1]) + 1
    if hi - lo == n:
        return _ll_read(col.ds, lo, n, col.shape, col.dtype)
    if not reduce_io:
        return np.asarray(col.ds[uniq])
    if (hi - lo) * col.row_bytes <= max(_SPAN_READ_BYTES, _SPAN_READ_FACTOR * n * col.row_bytes):
        return _ll_read(col.ds, lo, hi - lo, col.shape, col.dtype)[uniq - lo]
    return np.asarray(col.ds[uniq])

def _read_text(col: _Column, norm: NormalizedIndex) -> Any:
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

def read_col(col: _Column, norm: NormalizedIndex, reduce_io: bool, where: str) -> Any:
    """The rows `norm` of one leaf (through its memory map when it has one); OSError becomes StorageFormatError."""
    arr = col.arr
    if arr is not None:
        if norm.single is not None:
            return np.array(arr[norm.single])
        if norm.slc is not None:
            return np.array(arr[norm.slc])
        return arr.take(norm.array, axis=0)  # type: ignore[arg-type]
    if col.leaf.conv is None:
        return _read_text(col, norm)
    try:
        if norm.single is not None:
            return _ll_read(col.ds, norm.single, 1, col.shape, col.dtype).reshape(col.shape)
        if norm.slc is not None and norm.slc.step == 1:
            return _ll_read(col.ds, norm.slc.start, norm.slc.stop - norm.slc.start, col.shape, col.dtype)
        pos = norm.positions()
        uniq, inv = np.unique(pos, return_inverse=True)
        block = _read_sorted(col, uniq, reduce_io)
        if uniq.size == pos.size and np.array_equal(uniq, pos):
            return block
        return block[inv.reshape(-1)]
    except OSError as exc:
        raise StorageFormatError(f"{where}: cannot read dataset {col.leaf.name!r} ({exc}); "
                                 "the file is damaged") from None


def write_col(col: _Column, norm: NormalizedIndex, value: Any, reduce_io: bool, where: str) -> None:
    """Writes rows `norm` of one leaf (duplicates: the last one wins); OSError becomes StorageFormatError."""
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
            if len(runs) <= 32 or not reduce_io:
                for first, n in runs:
                    _ll_write(ds, int(pos[first]), vals[first:first + n])
            else:
                ds[pos] = vals
    except OSError as exc:
        raise StorageFormatError(f"{where}: cannot write dataset {col.leaf.name!r} ({exc})") \
            from None


def contiguous_place(ds: Any, leaf: Leaf) -> Optional[Tuple[int, int]]:
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


def write_copy(path: str, cols: Sequence[_Column], tree: LeafTree, rows: int, length: int, capacity: Optional[int],
               meta: Any, read: Callable[[_Column, NormalizedIndex], Any]) -> None:
    """Writes a new file at `path` (temporary name, flush, rename): one dataset per leaf of `tree` with the layout
    and filters of the matching column of `cols` and `rows` rows, of which the first `length` are copied with
    `read`; the bookkeeping attribute is `meta`. Growable datasets without filters are allocated at once, so that
    writing their rows later never changes the file's structure."""
    h5py = _h5py()
    os.makedirs(os.path.dirname(os.path.abspath(path)) or ".", exist_ok=True)
    with replacing_file(path) as tmp:
        with h5py.File(tmp, "w") as out:
            for col, leaf in zip(cols, tree.leaves):
                group = out
                for p in leaf.path[:-1]:
                    group = group.require_group(p)
                name = leaf.path[-1] if leaf.path else DEFAULT_KEY
                src = col.ds
                extra = {k: v for k, v in (("shuffle", src.shuffle), ("fletcher32", src.fletcher32),
                                           ("scaleoffset", src.scaleoffset)) if v}
                chunks = None if src.chunks is None else tuple(src.chunks)
                if chunks is not None and capacity is not None and chunks[0] > capacity:
                    chunks = (capacity,) + chunks[1:]
                if capacity is None and chunks is None:
                    chunks = _auto_chunks(leaf, None)
                dst = _create_dataset(group, name, leaf, rows, capacity, compression=src.compression,
                                      compression_opts=src.compression_opts, chunks=chunks, extra=extra)
                step = max(1, _BLOCK_BYTES // col.row_bytes)
                for s in range(0, length, step):
                    e = min(length, s + step)
                    block = read(col, NormalizedIndex(slc=slice(s, e, 1)))
                    if leaf.conv is None:
                        dst[s:e] = np.asarray(list(block), dtype=object)
                    else:
                        _ll_write(dst, s, block)
            out.attrs[META_ATTR] = json.dumps(meta)


def create_datasets(f: Any, tree: LeafTree, cap: Optional[int], rows: int, compression: Any, compression_level: Any,
                    chunks: Any, what: str, on_disk: bool) -> None:
    """Creates every leaf's dataset in the new file `f` with its per-key options (see `HDF5Storage.create`)."""
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
            raise ValueError(f"{what}: cannot create the dataset {leaf.name!r} with compression={comp!r}, "
                             f"compression_level={level!r}, chunks={chunk!r}: {exc}") from None


def map_columns(f: Any, tree: LeafTree, path: Optional[str], use_mmap: bool,
                read_only: bool) -> Tuple[List[_Column], Optional[mmap.mmap]]:
    """Every leaf's column of the open file `f`, with its rows memory-mapped where the dataset is contiguous in a
    file on disk: `(columns, the one shared map or None)`."""
    on_disk = path is not None and f.driver == "sec2" and use_mmap
    datasets = [f[leaf.name] for leaf in tree.leaves]
    places = [contiguous_place(ds, leaf) if on_disk else None for ds, leaf in zip(datasets, tree.leaves)]
    mapped = None
    if path is not None and any(p is not None for p in places):
        f.flush()  # early-allocated datasets reach the end of the file on disk
        mapped = _map_file(path, max(off + n for off, n in (p for p in places if p is not None)), read_only)
    cols = []
    for ds, leaf, place in zip(datasets, tree.leaves, places):
        arr = None
        if place is not None and mapped is not None:
            arr = np.ndarray(tuple(ds.shape), dtype=ds.dtype, buffer=mapped, offset=place[0])
        cols.append(_Column(leaf, ds, arr))
    return cols, mapped


def _map_file(path: str, end: int, read_only: bool) -> Optional[mmap.mmap]:
    """One shared memory map of the file (read-only when the storage is), or None when the file is shorter than
    `end` bytes (then every leaf is read through HDF5)."""
    fd = os.open(path, os.O_RDONLY if read_only else os.O_RDWR)
    try:
        size = os.fstat(fd).st_size
        if size < end:
            return None
        return mmap.mmap(fd, size, access=mmap.ACCESS_READ if read_only else mmap.ACCESS_WRITE)
    finally:
        os.close(fd)


class HDF5ColumnView(ColumnView):
    """A sub-dict or leaf of an `HDF5Storage` (from `get_column`): reads and writes those datasets of the parent's
    file. Length, capacity and segments are the parent's; segments and the length are changed through the parent."""

    single_file_ext: Optional[str] = ".hdf5"

    def get(self, index: Any) -> Any:
        self._check_open()
        return self._tree.assemble(self._parent.read_columns(index, self._which))

    def dumps(self, path: PathLike) -> None:
        """Writes these leaves as a standalone HDF5Storage file for this view's space."""
        self._check_open()
        path = os.fspath(path)
        own = self._parent.cache_filename
        if own is not None and os.path.exists(path) and os.path.samefile(path, own):
            raise ValueError(f"cannot dump a column view onto the file it is a view of ({own})")
        self._parent.dump_columns(path, self._which, self._tree)


__all__ = ["HDF5ColumnView", "read_col", "write_col", "contiguous_place", "write_copy", "create_datasets",
           "map_columns"]
