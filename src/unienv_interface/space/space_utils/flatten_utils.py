"""Flattening: a structured space (and its data) to one 1-D Box row, and back.

Row layout (kept byte-compatible with the reference API): dict children in sorted key order, tuple children in
position order, each leaf reshaped to its element count; the row dtype is the backend's promotion of every
flattened leaf dtype (Binary leaves flatten to the backend's default integer dtype first, Text leaves to the
default integer dtype). `start_dim` keeps that many leading (batch) axes in front of the flat axis.

A DynamicBoxSpace leaf is padded with its fill value to `shape_high` (unflattening cuts trailing padding again,
never below `shape_low`). A UnionSpace leaf (start_dim 0 only) is `[index, the alternative's flat data, zeros]`
in the default floating dtype, as wide as the widest alternative plus one. Graph and Batched spaces have no flat
form: `flat_dim` gives None and `flatten_space` raises NotImplementedError ("Unknown space").
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np

from ..space import Space
from ..spaces import BinarySpace, BoxSpace, DictSpace, DynamicBoxSpace, TextSpace, TupleSpace, UnionSpace


@dataclass(frozen=True)
class FlatLeaf:
    """One leaf of a flattened space: where its values sit in the flat row."""

    path: Tuple[Any, ...]        #: keys / positions from the root to the leaf
    space: Space                 #: the leaf space (Box, Binary, Text, DynamicBox or Union)
    offset: int                  #: first column in the flat row
    size: int                    #: number of columns
    flat_dtype: Any              #: the leaf's own flattened dtype (before promotion to the row dtype)

    @property
    def name(self) -> str:
        """The leaf path joined with '/' ("" for a non-nested space)."""
        return "/".join(str(p) for p in self.path)


def _prod(shape: Sequence[int]) -> int:
    return int(math.prod(shape))


def flat_dim(space: Space, start_dim: int = 0) -> Optional[int]:
    """Number of columns of the flat row, or None when `space` cannot be flattened."""
    if isinstance(space, (BoxSpace, BinarySpace)):
        return _prod(space.shape[start_dim:])
    if isinstance(space, DictSpace):
        dims = [flat_dim(s, start_dim) for s in space.spaces.values()]
        return None if any(d is None for d in dims) else sum(d for d in dims if d is not None)
    if isinstance(space, TupleSpace):
        dims = [flat_dim(s, start_dim) for s in space.spaces]
        return None if any(d is None for d in dims) else sum(d for d in dims if d is not None)
    if isinstance(space, TextSpace):
        return space.max_length if start_dim == 0 and space.charset is not None else None
    if isinstance(space, DynamicBoxSpace):
        return _prod(space.shape_high[start_dim:])
    if isinstance(space, UnionSpace):
        if start_dim != 0:
            return None
        dims = [flat_dim(s, 0) for s in space.spaces]
        return None if any(d is None for d in dims) else 1 + max(d for d in dims if d is not None)
    return None


def is_flattenable(space: Space, start_dim: int = 0) -> bool:
    """True when `flatten_space(space, start_dim)` works."""
    return flat_dim(space, start_dim) is not None


def flat_leaves(space: Space) -> List[FlatLeaf]:
    """The leaves of `space` in row order with their column offsets (ValueError for unflattenable spaces)."""
    out: List[FlatLeaf] = []

    def visit(sp: Space, path: Tuple[Any, ...], offset: int) -> int:
        if isinstance(sp, DictSpace):
            for k, child in sp.spaces.items():
                offset = visit(child, path + (k,), offset)
            return offset
        if isinstance(sp, TupleSpace):
            for i, child in enumerate(sp.spaces):
                offset = visit(child, path + (i,), offset)
            return offset
        if isinstance(sp, BoxSpace):
            size, dt = _prod(sp.shape), sp.dtype
        elif isinstance(sp, BinarySpace):
            size, dt = _prod(sp.shape), sp.backend.default_integer_dtype
        elif isinstance(sp, TextSpace):
            if sp.charset is None:
                raise ValueError(f"Text space at {'/'.join(map(str, path)) or '<root>'} can only be flattened "
                                 "with a defined character set")
            size, dt = sp.max_length, sp.backend.default_integer_dtype
        elif isinstance(sp, DynamicBoxSpace):
            size, dt = _prod(sp.shape_high), sp.dtype
        elif isinstance(sp, UnionSpace):
            for child in sp.spaces:
                flatten_space(child)       # an alternative without a flat form raises its own error
            size, dt = flat_dim(sp) or 0, sp.backend.default_floating_dtype
        else:
            raise NotImplementedError(f"Unknown space: `{sp}` (at {'/'.join(map(str, path)) or '<root>'}) has no "
                                      "flat form")
        out.append(FlatLeaf(path, sp, offset, size, dt))
        return offset + size

    visit(space, (), 0)
    return out


def _leaf_flat_bounds(leaf: FlatLeaf) -> Tuple[np.ndarray, np.ndarray]:
    sp = leaf.space
    if isinstance(sp, BoxSpace):
        return sp.low_numpy.reshape(-1), sp.high_numpy.reshape(-1)
    if isinstance(sp, BinarySpace):
        return np.zeros(leaf.size, dtype=np.int64), np.ones(leaf.size, dtype=np.int64)
    if isinstance(sp, DynamicBoxSpace):
        low, high = sp.padded_bounds()
        return low.reshape(-1), high.reshape(-1)
    if isinstance(sp, UnionSpace):
        return _union_bounds(sp)
    if not (isinstance(sp, TextSpace) and sp.charset is not None):
        raise RuntimeError("internal invariant violated: isinstance(sp, TextSpace) and sp.charset is not None")
    return np.zeros(leaf.size, dtype=np.int64), np.full(leaf.size, len(sp.charset), dtype=np.int64)


def _union_bounds(space: UnionSpace) -> Tuple[np.ndarray, np.ndarray]:
    """Flat bounds of a union: the index in `[0, n - 1]`, then every slot within the overall minimum / maximum of
    all alternatives' flat bounds, 0 included (unused slots hold 0)."""
    lows, highs = [0.0], [0.0]
    for child in space.spaces:
        box = flatten_space(child)
        if box.low_numpy.size:
            lows.append(float(box.low_numpy.min()))
            highs.append(float(box.high_numpy.max()))
    width = (flat_dim(space) or 1) - 1
    low = np.concatenate([[0.0], np.full(width, min(lows))])
    high = np.concatenate([[float(len(space.spaces) - 1)], np.full(width, max(highs))])
    return low, high


def _only_at_start_dim_0(space: Space, start_dim: int) -> None:
    if start_dim != 0 and isinstance(space, (TextSpace, UnionSpace)):
        raise ValueError(f"{type(space).__name__} can only be flattened at start_dim 0, got start_dim={start_dim}")


def _row_dtype(space: Space) -> Any:
    """`flatten_space(space).dtype` of a composite space, without building the row's bounds."""
    leaves = flat_leaves(space)
    if not leaves:
        raise ValueError(f"cannot flatten an empty {type(space).__name__}: it has no leaves")
    return space.backend.promote_types(*[leaf.flat_dtype for leaf in leaves])


def flatten_space(space: Space, start_dim: int = 0) -> BoxSpace:
    """The 1-D Box (after `start_dim` leading axes) that holds flattened elements of `space`; no metadata."""
    b = space.backend
    if isinstance(space, BoxSpace):
        shape = space.shape[:start_dim] + (_prod(space.shape[start_dim:]),)
        return BoxSpace(b, space.low_numpy.reshape(shape), space.high_numpy.reshape(shape), space.dtype, space.device, shape)
    if isinstance(space, BinarySpace):
        shape = space.shape[:start_dim] + (_prod(space.shape[start_dim:]),)
        return BoxSpace(b, 0, 1, b.default_integer_dtype, space.device, shape)
    if isinstance(space, DynamicBoxSpace):
        shape = space.shape_high[:start_dim] + (_prod(space.shape_high[start_dim:]),)
        low, high = space.padded_bounds()
        return BoxSpace(b, low.reshape(shape), high.reshape(shape), space.dtype, space.device, shape)
    _only_at_start_dim_0(space, start_dim)
    if start_dim != 0:
        lead = _lead_shape(space, start_dim)
        single = flatten_space(_strip_lead(space, start_dim), 0)
        return BoxSpace(b, single.low_numpy.reshape((1,) * start_dim + (-1,)),
                        single.high_numpy.reshape((1,) * start_dim + (-1,)), single.dtype, single.device,
                        lead + single.shape)
    leaves = flat_leaves(space)
    if not leaves:
        raise ValueError(f"cannot flatten an empty {type(space).__name__}: it has no leaves")
    dtype = b.promote_types(*[leaf.flat_dtype for leaf in leaves])
    row_np = b.numpy_dtype(dtype)
    lows, highs = zip(*[_leaf_flat_bounds(leaf) for leaf in leaves])
    low = np.concatenate([np.asarray(x, dtype=np.float64) if row_np.kind == "f" else x for x in lows])
    high = np.concatenate([np.asarray(x, dtype=np.float64) if row_np.kind == "f" else x for x in highs])
    if row_np.kind in "iu":
        info = np.iinfo(row_np)
        low = np.clip(low, info.min, info.max)
        high = np.clip(high, info.min, info.max)
    elif b.dtype_name(dtype) != "bfloat16":
        with np.errstate(over="ignore"):
            low = low.astype(row_np).astype(np.float64)
            high = high.astype(row_np).astype(np.float64)
    return BoxSpace(b, low, high, dtype, space.device, (low.shape[0],))


def _lead_shape(space: Space, start_dim: int) -> Tuple[int, ...]:
    if isinstance(space, (BoxSpace, BinarySpace)):
        return space.shape[:start_dim]
    if isinstance(space, DynamicBoxSpace):
        return space.shape_high[:start_dim]
    _only_at_start_dim_0(space, start_dim)
    children = list(space.spaces.values()) if isinstance(space, DictSpace) else list(getattr(space, "spaces", ()))
    if not children:
        raise ValueError(f"cannot flatten an empty {type(space).__name__}: it has no leaves")
    return _lead_shape(children[0], start_dim)


def _strip_lead(space: Space, start_dim: int) -> Space:
    if isinstance(space, BoxSpace):
        return BoxSpace(space.backend, space.low_numpy.reshape(space.shape)[(0,) * start_dim],
                        space.high_numpy.reshape(space.shape)[(0,) * start_dim], space.dtype, space.device,
                        space.shape[start_dim:])
    if isinstance(space, BinarySpace):
        return BinarySpace(space.backend, space.shape[start_dim:], space.dtype, space.device)
    if isinstance(space, DynamicBoxSpace):
        if any(a < start_dim for a in space.variable_axes):
            raise ValueError(f"cannot flatten {space} at start_dim={start_dim}: a kept leading axis varies in length")
        return DynamicBoxSpace(space.backend, space.low_numpy[(0,) * start_dim], space.high_numpy[(0,) * start_dim],
                               space.shape_low[start_dim:], space.shape_high[start_dim:], space.dtype, space.device,
                               space.fill_value)
    if isinstance(space, DictSpace):
        return DictSpace(space.backend, {k: _strip_lead(s, start_dim) for k, s in space.spaces.items()}, space.device)
    if isinstance(space, TupleSpace):
        return TupleSpace(space.backend, [_strip_lead(s, start_dim) for s in space.spaces], space.device)
    _only_at_start_dim_0(space, start_dim)
    raise NotImplementedError(f"Unknown space: `{space}` has no flat form at start_dim={start_dim}")


def _text_to_indices(space: TextSpace, text: Any) -> np.ndarray:
    if not isinstance(text, str):
        raise TypeError(f"TextSpace data must be a str, got {type(text).__name__}")
    if len(text) > space.max_length:
        raise ValueError(f"text of length {len(text)} exceeds max_length {space.max_length}")
    if not (space.charset is not None):
        raise RuntimeError("internal invariant violated: space.charset is not None")
    pad = len(space.charset)
    return np.array([space.char_index(c) for c in text] + [pad] * (space.max_length - len(text)), dtype=np.int64)


def _indices_to_text(space: TextSpace, idx: np.ndarray) -> str:
    chars = space.charset_list or []
    return "".join(chars[int(i)] for i in idx if 0 <= int(i) < len(chars))


def flatten_data(space: Space, data: Any, start_dim: int = 0) -> Any:
    """`data` of `space` as flat rows of `flatten_space(space, start_dim)` (same backend, row dtype).

    Raises KeyError for a missing or an extra dict key, TypeError for data that is not an array of the space's
    backend, ValueError for a shape that does not match. Values are not checked against bounds here.
    """
    b = space.backend
    if isinstance(space, (BoxSpace, BinarySpace)):
        if not b.is_backendarray(data):
            raise TypeError(f"expected a {b} array for {space.get_repr(True, False, False)}, got {type(data).__name__}")
        tail = space.shape[start_dim:]
        if tuple(data.shape[start_dim:]) != tuple(tail):
            raise ValueError(f"expected shape (*batch, {', '.join(map(str, tail))}) for {type(space).__name__}, got "
                             f"{tuple(data.shape)}")
        out = b.reshape(data, tuple(data.shape[:start_dim]) + (-1,))
        if isinstance(space, BinarySpace):
            out = b.astype(out, b.default_integer_dtype)
        return out
    _only_at_start_dim_0(space, start_dim)
    if isinstance(space, TextSpace):
        return b.from_numpy(_text_to_indices(space, data), dtype=b.default_integer_dtype, device=space.device)
    if isinstance(space, DynamicBoxSpace):
        return _flatten_dynamic(space, data, start_dim)
    if isinstance(space, UnionSpace):
        return _flatten_union(space, data)
    row_dtype = _row_dtype(space) if start_dim == 0 else flatten_space(space, start_dim).dtype
    if isinstance(space, DictSpace):
        if not hasattr(data, "keys"):
            raise TypeError(f"expected a mapping for DictSpace, got {type(data).__name__}")
        extra = set(data.keys()) - set(space.spaces)
        if extra:
            raise KeyError(f"unexpected key(s) {sorted(map(str, extra))} for DictSpace with keys {list(space.spaces)}")
        parts = []
        for k, s in space.spaces.items():
            if k not in data:
                raise KeyError(f"missing key {k!r}: DictSpace expects keys {list(space.spaces)}")
            parts.append(b.astype(flatten_data(s, data[k], start_dim), row_dtype))
    elif isinstance(space, TupleSpace):
        if not isinstance(data, (tuple, list)) or len(data) != len(space.spaces):
            raise ValueError(f"expected a sequence of {len(space.spaces)} items for TupleSpace")
        parts = [b.astype(flatten_data(s, v, start_dim), row_dtype) for s, v in zip(space.spaces, data)]
    else:
        raise NotImplementedError(f"cannot flatten data of a space of type {type(space).__name__}")
    return b.concat(parts, axis=start_dim)


def _flatten_dynamic(space: DynamicBoxSpace, data: Any, start_dim: int) -> Any:
    b = space.backend
    if not b.is_backendarray(data):
        raise TypeError(f"expected a {b} array for {space.get_repr(True, False, False)}, got {type(data).__name__}")
    shape = tuple(int(d) for d in data.shape)
    if len(shape) != len(space.shape_low) or not all(
            lo <= d <= hi for lo, d, hi in list(zip(space.shape_low, shape, space.shape_high))[start_dim:]):
        raise ValueError(f"expected a shape between {space.shape_low} and {space.shape_high} (from axis "
                         f"{start_dim} on) for DynamicBoxSpace, got {shape}")
    return b.reshape(space.pad_data(data, start_axis=start_dim), shape[:start_dim] + (-1,))


def _union_pair(space: UnionSpace, data: Any) -> Tuple[int, Any]:
    if not space.is_pair(data):
        raise ValueError(f"expected an (index, value) tuple with 0 <= index < {len(space.spaces)} for UnionSpace, "
                         f"got {data!r}")
    return int(data[0]), data[1]


def _flatten_union(space: UnionSpace, data: Any) -> Any:
    b = space.backend
    index, value = _union_pair(space, data)
    dt = b.default_floating_dtype
    flat = b.astype(flatten_data(space.spaces[index], value), dt)
    flat = b.pad_dim(flat, 0, (flat_dim(space) or 1) - 1, 0)
    head = b.from_numpy(np.array([index], dtype=np.float64), dtype=dt, device=b.device(flat))
    return b.concat([head, flat], axis=0)


def _unflatten_union(space: UnionSpace, data: Any) -> Any:
    b = space.backend
    first = float(np.asarray(b.to_numpy(data[0:1]), dtype=np.float64)[0])
    if not first.is_integer() or not 0 <= first < len(space.spaces):
        raise ValueError(f"flat UnionSpace data starts with {first}, not the index of one of its "
                         f"{len(space.spaces)} alternatives")
    index = int(first)
    child = space.spaces[index]
    width = flat_dim(child)
    if width is None:
        raise RuntimeError("internal invariant violated: a flattened union alternative has no flat_dim")
    return index, unflatten_data(child, data[1:1 + width])


def unflatten_data(space: Space, data: Any, start_dim: int = 0) -> Any:
    """Inverse of `flatten_data`: flat rows back to structured data with every leaf in its own dtype (copies)."""
    b = space.backend
    if isinstance(space, (BoxSpace, BinarySpace)):
        lead = tuple(data.shape[:start_dim])
        out = b.reshape(data, lead + tuple(space.shape[start_dim:]))
        return b.astype(out, space.dtype, copy=True)
    _only_at_start_dim_0(space, start_dim)
    if isinstance(space, TextSpace):
        return _indices_to_text(space, np.asarray(b.to_numpy(data)).reshape(-1))
    if isinstance(space, DynamicBoxSpace):
        lead = tuple(data.shape[:start_dim])
        padded = b.astype(b.reshape(data, lead + tuple(space.shape_high[start_dim:])), space.dtype, copy=True)
        return space.unpad_data(padded, start_axis=start_dim)
    if isinstance(space, UnionSpace):
        return _unflatten_union(space, data)
    children = list(space.spaces.items()) if isinstance(space, DictSpace) else list(enumerate(getattr(space, "spaces", ())))
    if not isinstance(space, (DictSpace, TupleSpace)):
        raise NotImplementedError(f"cannot unflatten data of a space of type {type(space).__name__}")
    out = {}
    start = 0
    for k, s in children:
        d = flat_dim(s, start_dim)
        if d is None:
            raise ValueError(f"child {k!r} cannot be flattened")
        idx = (slice(None),) * start_dim + (slice(start, start + d),)
        out[k] = unflatten_data(s, data[idx], start_dim)
        start += d
    if start != data.shape[start_dim]:
        raise ValueError(f"flat data has {data.shape[start_dim]} columns, the space needs {start}")
    return out if isinstance(space, DictSpace) else tuple(out.values())


__all__ = ["FlatLeaf", "flat_dim", "is_flattenable", "flat_leaves", "flatten_space", "flatten_data", "unflatten_data"]
