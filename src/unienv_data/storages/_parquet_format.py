"""The on-disk format of `ParquetStorage` (see `parquet`'s module docstring): file names, the Arrow type of each
leaf, encoding one piece, checking the metadata against a space, and the space of a directory that records none."""
from __future__ import annotations

import json
import os
import re
from typing import Any, Dict, Optional, Sequence, Tuple

import numpy as np

from unienv_data.base.errors import StorageFormatError
from unienv_data.base.files import PathLike, check_format_version, read_json
from unienv_interface.backends import NumpyComputeBackend
from unienv_interface.space import BinarySpace, BoxSpace, DictSpace, Space, TextSpace
from unienv_interface.space.space_utils.serialization_utils import json_to_space

from ._list_storage import Leaf, LeafTree, describe_leaf, require_module

METADATA_FILE = "_metadata.json"
DEFAULT_KEY = "data"
_PIECE = re.compile(r"^part-(\d{6,})\.parquet$")


def _pa() -> Any:
    return require_module("pyarrow", "parquet", "ParquetStorage")


def _pq() -> Any:
    _pa()
    return require_module("pyarrow.parquet", "parquet", "ParquetStorage")


def piece_filename(piece: int) -> str:
    """The file name of piece number `piece` (`part-000000.parquet`, ...)."""
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


def check_metadata(meta: Dict[str, Any], where: str, tree: LeafTree, read_only: bool) -> Dict[str, Any]:
    """`{"piece_size", "num_rows"}` of a storage's metadata (read from `where`), after checking its fields and its
    columns against `tree`: StorageFormatError for a malformed field, ValueError naming every column mismatch."""
    for field in ("piece_size", "num_rows", "column_shapes"):
        if field not in meta:
            raise StorageFormatError(f"{where} is missing the field {field!r}")
    ps, rows, shapes = meta["piece_size"], meta["num_rows"], meta["column_shapes"]
    if isinstance(ps, bool) or not isinstance(ps, int) or not 0 < ps < 2 ** 53:
        raise StorageFormatError(f"{where}: piece_size must be a positive int below 2**53, got {ps!r}")
    if isinstance(rows, bool) or not isinstance(rows, int) or not 0 <= rows < 2 ** 53:
        raise StorageFormatError(f"{where}: num_rows must be a non-negative int below 2**53, got {rows!r}")
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


def directory_space(path: PathLike) -> Tuple[int, Optional[int], Space]:
    """`(count, capacity, space)` of a storage directory (see `ParquetStorage.build_space_from_parquet_file`)."""
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
        return count, count, space   # the capacity is the row count, as the reference gives it
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
