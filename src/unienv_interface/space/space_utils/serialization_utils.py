"""Spaces to and from JSON-compatible dicts, so a stored dataset describes itself.

Format: `{"type": "BoxSpace", "shape": [...], "low": <nested list, uniform axes cut to length 1>, "high": ...,
"dtype": "float32", "metadata": {...}}`; Binary has shape and dtype; Dict has `spaces` (a mapping); Tuple and Union have
`spaces` (a list); Text has min_length, max_length, charset; DynamicBox has low, high (cut as a Box's, at
`shape_low` with 1 on the variable axes), shape_low, shape_high, dtype, fill_value; Graph has min/max_nodes,
min/max_edges, is_edge, node_feature_space, edge_feature_space (null without) and batch_shape; Batched has
single_space and batch_shape. Infinite bounds are written as JSON `Infinity`. Every dtype is supported,
float16 and bfloat16 included. The JSON is backend-neutral: `json_to_space` rebuilds it on any backend, and reads
bounds given as a scalar or any shape that broadcasts to the Box's (files written by earlier versions).
"""
from __future__ import annotations

from typing import Any, Dict, Mapping

import numpy as np

from unienv_interface.backends.resolve import resolve_backend

from ..space import Space
from ..spaces import (BatchedSpace, BinarySpace, BoxSpace, DictSpace, DynamicBoxSpace, GraphSpace, TextSpace,
                      TupleSpace, UnionSpace)


def _bounds(a: np.ndarray) -> Any:
    """Bounds as a nested list with the Box's number of dimensions, each axis along which they do not vary cut to
    length 1 (a scalar for a 0-d Box): `[[[0]]]` for a uint8 image, `[-1.0]` for a uniform (8,) action. This is the
    form unienv 0.0.1b16 writes; it rejects a bare scalar for a Box of shape (3,) but broadcasts axes of length 1.
    A 128x128x3 image Box is then a few bytes of JSON instead of ~300 KB. Reading takes any broadcastable form."""
    for axis in range(a.ndim):
        if a.shape[axis] > 1:
            first = a.take([0], axis=axis)
            if bool((a == first).all()):
                a = first
    return a.tolist()


def space_to_json(space: Space) -> Dict[str, Any]:
    """A JSON-compatible dict describing `space` (its backend and device are not part of it)."""
    b = space.backend
    out: Dict[str, Any]
    if isinstance(space, BoxSpace):
        out = {"type": "BoxSpace", "shape": list(space.shape), "low": _bounds(space.low_numpy),
               "high": _bounds(space.high_numpy), "dtype": b.dtype_name(space.dtype)}
    elif isinstance(space, BinarySpace):
        out = {"type": "BinarySpace", "shape": list(space.shape), "dtype": b.dtype_name(space.dtype)}
    elif isinstance(space, DictSpace):
        out = {"type": "DictSpace", "spaces": {str(k): space_to_json(s) for k, s in space.spaces.items()}}
    elif isinstance(space, TupleSpace):
        out = {"type": "TupleSpace", "spaces": [space_to_json(s) for s in space.spaces]}
    elif isinstance(space, TextSpace):
        out = {"type": "TextSpace", "min_length": space.min_length, "max_length": space.max_length,
               "charset": None if space.charset_list is None else "".join(space.charset_list)}
    elif isinstance(space, BatchedSpace):
        out = {"type": "BatchedSpace", "single_space": space_to_json(space.single_space),
               "batch_shape": list(space.batch_shape)}
    elif isinstance(space, DynamicBoxSpace):
        out = {"type": "DynamicBoxSpace", "low": _bounds(space.low_numpy), "high": _bounds(space.high_numpy),
               "shape_low": list(space.shape_low), "shape_high": list(space.shape_high),
               "dtype": b.dtype_name(space.dtype), "fill_value": space.fill_value}
    elif isinstance(space, UnionSpace):
        out = {"type": "UnionSpace", "spaces": [space_to_json(s) for s in space.spaces]}
    elif isinstance(space, GraphSpace):
        edge = space.edge_feature_space
        out = {"type": "GraphSpace", "max_nodes": space.max_nodes, "min_nodes": space.min_nodes,
               "max_edges": space.max_edges, "min_edges": space.min_edges, "is_edge": space.is_edge,
               "node_feature_space": space_to_json(space.node_feature_space),
               "edge_feature_space": None if edge is None else space_to_json(edge),
               "batch_shape": list(space.batch_shape)}
    else:
        raise TypeError(f"cannot serialize a space of type {type(space).__name__}")
    if len(space.metadata):
        out["metadata"] = space.metadata.to_dict()
    return out


def _field(js: Mapping[str, Any], name: str, kind: str) -> Any:
    try:
        return js[name]
    except KeyError:
        raise ValueError(f"malformed {kind} JSON: missing field {name!r}") from None


#: Largest element count of one leaf accepted from JSON (a guard against damaged or hostile metadata: a Box keeps
#: full-shape float64 bounds, 16 bytes per element). 2**26 holds a 4K RGB frame (25M elements) with room to spare.
MAX_JSON_LEAF_ELEMENTS = 1 << 26


def _shape(js: Mapping[str, Any], kind: str, name: str = "shape") -> tuple:
    shape = _field(js, name, kind)
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise ValueError(f"malformed {kind} JSON: {name} must be a list of non-negative ints, got {str(shape)[:80]}")
    total = 1
    for d in shape:
        total *= d
    if total > MAX_JSON_LEAF_ELEMENTS:
        raise ValueError(f"malformed {kind} JSON: {name} {shape} has {total} elements per sample, more than the "
                         f"{MAX_JSON_LEAF_ELEMENTS} this library accepts from a file")
    return tuple(shape)


def _holds_no_number(value: Any) -> bool:
    return isinstance(value, list) and all(_holds_no_number(v) for v in value)


def _bound_field(js: Mapping[str, Any], name: str, kind: str, bounds_shape: tuple) -> Any:
    """Bounds `name` as written; for a space of no elements (a 0 in `bounds_shape`) the written `[]` (which has
    lost the number of axes) becomes a scalar, since there is no element to bound."""
    value = _field(js, name, kind)
    if 0 in bounds_shape and _holds_no_number(value):
        return 0
    return value


def json_to_space(js: Mapping[str, Any], backend: Any, device: Any = None) -> Space:
    """Rebuilds a space written by `space_to_json` on `backend` / `device`; ValueError for malformed JSON."""
    backend = resolve_backend(backend)
    if not isinstance(js, Mapping) or "type" not in js:
        raise ValueError(f"malformed space JSON: expected an object with a 'type' field, got {str(js)[:80]}")
    kind = js["type"]
    meta = js.get("metadata")
    try:
        if kind == "BoxSpace":
            dtype = backend.dtype_from_name(str(_field(js, "dtype", kind)).replace("torch.", ""))
            # bounds go to BoxSpace as parsed (ints stay exact Python ints, Infinity becomes float inf)
            shape = _shape(js, kind)
            return BoxSpace(backend, _bound_field(js, "low", kind, shape), _bound_field(js, "high", kind, shape),
                            dtype, device, shape, meta)
        if kind == "BinarySpace":
            return BinarySpace(backend, _shape(js, kind), backend.default_boolean_dtype, device, meta)
        if kind == "DictSpace":
            spaces = _field(js, "spaces", kind)
            if not isinstance(spaces, Mapping):
                raise ValueError("malformed DictSpace JSON: 'spaces' must be an object")
            return DictSpace(backend, {k: json_to_space(v, backend, device) for k, v in spaces.items()}, device, meta)
        if kind == "TupleSpace":
            return TupleSpace(backend, [json_to_space(v, backend, device) for v in _field(js, "spaces", kind)], device, meta)
        if kind == "TextSpace":
            return TextSpace(backend, int(_field(js, "max_length", kind)), min_length=int(js.get("min_length", 0)),
                             charset=js.get("charset"), device=device, metadata=meta)
        if kind == "BatchedSpace":
            return BatchedSpace(json_to_space(_field(js, "single_space", kind), backend, device),
                                tuple(_field(js, "batch_shape", kind)), meta)
        if kind == "DynamicBoxSpace":
            dtype = backend.dtype_from_name(str(_field(js, "dtype", kind)).replace("torch.", ""))
            lows, highs = _shape(js, kind, "shape_low"), _shape(js, kind, "shape_high")
            fixed = tuple(lo for lo, hi in zip(lows, highs) if lo == hi)
            return DynamicBoxSpace(backend, _bound_field(js, "low", kind, fixed), _bound_field(js, "high", kind, fixed),
                                   lows, highs, dtype, device, js.get("fill_value", 0), meta)
        if kind == "UnionSpace":
            return UnionSpace(backend, [json_to_space(v, backend, device) for v in _field(js, "spaces", kind)], device,
                              meta)
        if kind == "GraphSpace":
            edge = js.get("edge_feature_space")
            node = json_to_space(_field(js, "node_feature_space", kind), backend, device)
            return GraphSpace(backend, node,  # type: ignore[arg-type]  # GraphSpace checks it is a BoxSpace
                              None if edge is None else json_to_space(edge, backend, device),  # type: ignore[arg-type]
                              is_edge=_field(js, "is_edge", kind), min_nodes=_field(js, "min_nodes", kind),
                              max_nodes=js.get("max_nodes"), min_edges=_field(js, "min_edges", kind),
                              max_edges=js.get("max_edges"), batch_shape=tuple(js.get("batch_shape", ())),
                              device=device, metadata=meta)
    except (TypeError, KeyError) as exc:
        raise ValueError(f"malformed {kind} JSON: {exc}") from None
    raise ValueError(f"unknown space type {kind!r} in space JSON")


def same_space_json(space: Space, js: Any) -> bool:
    """Whether `js` is exactly `space_to_json(space)` (then the space it describes equals `space`, without rebuilding
    it); False as well when `space` has no JSON form. A file written with another bounds form (full-shape, from
    earlier versions) compares unequal here; callers then rebuild the stored space and compare leaf by leaf."""
    try:
        return bool(space_to_json(space) == js)
    except (ValueError, TypeError):
        return False


__all__ = ["space_to_json", "json_to_space", "same_space_json"]
