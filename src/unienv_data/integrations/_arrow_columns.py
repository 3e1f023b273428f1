"""Arrow columns as NumPy arrays of a known element shape and dtype (shared by the Hugging Face `datasets` and the
Minari Arrow readers).

A column of N rows whose elements have shape `(d1, ..., dk)` is stored as k nested list levels (list, large list
or fixed-size list; an extension type such as `datasets`' `Array2D` wraps them) around a primitive array.
`column_to_numpy` peels the levels, checks that every row has the expected length at every level, and returns one
`(N, d1, ..., dk)` array in the expected dtype. A row of another length, a null, or a primitive of another dtype
(other than a lossless widening the caller allows) raises ValueError naming the column and the first bad row: the
data is never padded, cut or cast silently. pyarrow is imported by the caller (it is an optional dependency).
"""
from __future__ import annotations

from typing import Any, Sequence, Tuple

import numpy as np


def _list_kind(pa: Any, typ: Any) -> str:
    if pa.types.is_fixed_size_list(typ):
        return "fixed"
    if pa.types.is_list(typ) or pa.types.is_large_list(typ):
        return "list"
    return ""


def unwrap(pa: Any, arr: Any) -> Any:
    """One contiguous `pa.Array` of `arr` (a ChunkedArray is combined; an extension array gives its storage)."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks() if arr.num_chunks != 1 else arr.chunk(0)
    if isinstance(arr, pa.ExtensionArray):
        arr = arr.storage
    return arr


def column_to_numpy(pa: Any, arr: Any, shape: Sequence[int], dtype: Any, where: str, row0: int = 0) -> np.ndarray:
    """`arr` (N rows) as an `(N, *shape)` array of `dtype` (see the module docstring). `where` names the column in
    errors; `row0` is the dataset row of `arr`'s first row (for the row numbers in errors)."""
    import pyarrow.compute as pc
    values = unwrap(pa, arr)
    n = len(values)
    want = np.dtype(dtype)
    shape = tuple(int(d) for d in shape)
    if values.null_count:
        bad = int(np.flatnonzero(values.is_null().to_numpy(zero_copy_only=False))[0])
        raise ValueError(f"{where}: row {row0 + bad} is null; nulls cannot be read into a {want} array (fill or "
                         "drop them first)")
    rows_per_value = 1
    for level, dim in enumerate(shape):
        kind = _list_kind(pa, values.type)
        if not kind:
            raise ValueError(f"{where}: expected elements of shape {shape}, but the Arrow type {arr.type} has only "
                             f"{level} list level(s)")
        if kind == "fixed":
            got = values.type.list_size
            if got != dim:
                raise ValueError(f"{where}: level {level} holds lists of length {got}, expected {dim} (element shape "
                                 f"{shape})")
        else:
            lengths = pc.list_value_length(values).to_numpy(zero_copy_only=False)
            bad_rows = np.flatnonzero(lengths != dim)
            if bad_rows.size:
                j = int(bad_rows[0])
                raise ValueError(f"{where}: row {row0 + j // rows_per_value} has a list of length {int(lengths[j])} "
                                 f"at level {level}, expected {dim} (element shape {shape}, taken from the "
                                 "dataset's features or its first row)")
        values = unwrap(pa, values.flatten())
        rows_per_value *= dim
        if values.null_count:
            bad = int(np.flatnonzero(values.is_null().to_numpy(zero_copy_only=False))[0])
            raise ValueError(f"{where}: row {row0 + bad // rows_per_value} holds a null inside its element; nulls "
                             f"cannot be read into a {want} array")
    if _list_kind(pa, values.type):
        raise ValueError(f"{where}: the Arrow type {arr.type} nests deeper than the element shape {shape}")
    out = values.to_numpy(zero_copy_only=False)
    if out.dtype != want:
        if not np.can_cast(out.dtype, want, casting="safe"):
            raise ValueError(f"{where}: the column holds {out.dtype}, expected {want}; it is not cast silently")
        out = out.astype(want)
    return out.reshape((n,) + shape)


def first_row_shape(pa: Any, arr: Any, depth: int) -> Tuple[int, ...]:
    """The list lengths of row 0 of `arr` over its first `depth` list levels (the shape of a variable-length
    element as the first row has it)."""
    values = unwrap(pa, arr)[:1]
    dims = []
    for _ in range(depth):
        kind = _list_kind(pa, values.type)
        if not kind:
            break
        if kind == "fixed":
            dims.append(int(values.type.list_size))
            values = unwrap(pa, values.flatten())[:dims[-1]]
        else:
            length = len(values[0]) if len(values) else 0
            dims.append(int(length))
            values = unwrap(pa, values.flatten())[:length]
    return tuple(dims)


__all__ = ["column_to_numpy", "first_row_shape", "unwrap"]
