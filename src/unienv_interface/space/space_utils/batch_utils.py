"""Batching of spaces and of their data: a batch adds leading axes to every array leaf."""
from __future__ import annotations

from typing import Any, Dict, Iterator, List, Sequence, Tuple

import numpy as np

from ..space import Space
from ..spaces import (BatchedSpace, BinarySpace, BoxSpace, DictSpace, DynamicBoxSpace, GraphInstance, GraphSpace,
                      TextSpace, TupleSpace, UnionSpace)
from ._mapping import check_dict_value


def batch_space(space: Space, n: int = 1) -> Space:
    """The space of `n` stacked elements of `space`: Box / Binary / DynamicBox get a leading axis of size `n`, a
    GraphSpace a leading batch axis, Dict / Tuple batch each child, Text / Union become `BatchedSpace(space, (n,))`
    (a NumPy object array of elements) and a BatchedSpace gets a leading batch axis."""
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
        raise ValueError(f"batch size must be a non-negative int, got {n!r}")
    n = int(n)
    if isinstance(space, BoxSpace):
        return BoxSpace(space.backend, space.low_numpy[None], space.high_numpy[None], space.dtype, space.device,
                        (n,) + space.shape, space.metadata)
    if isinstance(space, BinarySpace):
        return BinarySpace(space.backend, (n,) + space.shape, space.dtype, space.device, space.metadata)
    if isinstance(space, DictSpace):
        return DictSpace(space.backend, {k: batch_space(s, n) for k, s in space.spaces.items()}, space.device,
                         space.metadata)
    if isinstance(space, TupleSpace):
        return TupleSpace(space.backend, [batch_space(s, n) for s in space.spaces], space.device, space.metadata)
    if isinstance(space, DynamicBoxSpace):
        return DynamicBoxSpace(space.backend, space.low_numpy[None], space.high_numpy[None], (n,) + space.shape_low,
                               (n,) + space.shape_high, space.dtype, space.device, space.fill_value, space.metadata)
    if isinstance(space, GraphSpace):
        return space.replace(batch_shape=(n,) + space.batch_shape)
    if isinstance(space, BatchedSpace):
        return BatchedSpace(space.single_space, (n,) + space.batch_shape, space.metadata)
    if isinstance(space, (TextSpace, UnionSpace)):
        return BatchedSpace(space, (n,), space.metadata)
    raise TypeError(f"cannot batch a space of type {type(space).__name__}")


def batch_size(batched_space: Space) -> int:
    """The leading batch size of a batched space."""
    if isinstance(batched_space, (BoxSpace, BinarySpace)):
        if not batched_space.shape:
            raise ValueError("a 0-d space has no batch axis")
        return batched_space.shape[0]
    if isinstance(batched_space, DynamicBoxSpace):
        if not batched_space.shape_low or 0 in batched_space.variable_axes:
            raise ValueError(f"{batched_space} has no fixed leading (batch) axis")
        return batched_space.shape_low[0]
    if isinstance(batched_space, (BatchedSpace, GraphSpace)):
        if not batched_space.batch_shape:
            raise ValueError(f"{batched_space} has no batch axis")
        return batched_space.batch_shape[0]
    if isinstance(batched_space, DictSpace):
        for s in batched_space.spaces.values():
            return batch_size(s)
    if isinstance(batched_space, TupleSpace):
        for s in batched_space.spaces:
            return batch_size(s)
    raise ValueError(f"cannot tell the batch size of {batched_space!r}")


def batch_size_data(data: Any) -> int:
    """The leading size of the first array leaf of `data` (of `n_nodes` for a GraphInstance)."""
    if isinstance(data, GraphInstance):
        return batch_size_data(data.n_nodes)
    if isinstance(data, dict):
        for v in data.values():
            return batch_size_data(v)
        raise ValueError("empty dict has no batch size")
    if isinstance(data, (tuple, list)):
        if not data:
            raise ValueError("empty sequence has no batch size")
        return batch_size_data(data[0])
    shape = getattr(data, "shape", None)
    if shape is None or len(shape) == 0:
        raise ValueError(f"data of type {type(data).__name__} has no batch axis")
    return int(shape[0])


def unbatch_spaces(batched_space: Space) -> Iterator[Space]:
    """The single-element spaces of a batched space (one per batch entry)."""
    n = batch_size(batched_space)
    single = get_single_space(batched_space)
    for _ in range(n):
        yield single


def get_single_space(batched_space: Space) -> Space:
    """The element space of a batched space (the leading axis removed)."""
    if isinstance(batched_space, BoxSpace):
        return BoxSpace(batched_space.backend, batched_space.low_numpy[0], batched_space.high_numpy[0],
                        batched_space.dtype, batched_space.device, batched_space.shape[1:], batched_space.metadata)
    if isinstance(batched_space, BinarySpace):
        return BinarySpace(batched_space.backend, batched_space.shape[1:], batched_space.dtype, batched_space.device,
                           batched_space.metadata)
    if isinstance(batched_space, DictSpace):
        return DictSpace(batched_space.backend, {k: get_single_space(s) for k, s in batched_space.spaces.items()},
                         batched_space.device, batched_space.metadata)
    if isinstance(batched_space, TupleSpace):
        return TupleSpace(batched_space.backend, [get_single_space(s) for s in batched_space.spaces],
                          batched_space.device, batched_space.metadata)
    if isinstance(batched_space, DynamicBoxSpace):
        batch_size(batched_space)  # a fixed leading axis, or ValueError
        return DynamicBoxSpace(batched_space.backend, batched_space.low_numpy[0], batched_space.high_numpy[0],
                               batched_space.shape_low[1:], batched_space.shape_high[1:], batched_space.dtype,
                               batched_space.device, batched_space.fill_value, batched_space.metadata)
    if isinstance(batched_space, GraphSpace):
        batch_size(batched_space)
        return batched_space.replace(batch_shape=batched_space.batch_shape[1:])
    if isinstance(batched_space, BatchedSpace):
        if len(batched_space.batch_shape) == 1:
            return batched_space.single_space
        return BatchedSpace(batched_space.single_space, batched_space.batch_shape[1:], batched_space.metadata)
    raise TypeError(f"cannot unbatch a space of type {type(batched_space).__name__}")


def concatenate(batched_space: Space, items: Sequence[Any], axis: int = 0) -> Any:
    """Stacks single elements `items` into one batch of `batched_space` (the reference name for stacking)."""
    items = list(items)
    if isinstance(batched_space, (BoxSpace, BinarySpace)):
        if not items:
            return batched_space.backend.from_numpy(
                np.zeros((0,) + batched_space.shape[1:], dtype=batched_space.backend.numpy_dtype(batched_space.dtype)),
                dtype=batched_space.dtype, device=batched_space.device)
        return batched_space.backend.stack(items, axis=axis)
    if isinstance(batched_space, DictSpace):
        out = {}
        for k, s in batched_space.spaces.items():
            try:
                vals = [it[k] for it in items]
            except KeyError:
                raise KeyError(f"missing key {k!r} in an item to concatenate (expected keys {list(batched_space.spaces)})") from None
            out[k] = concatenate(s, vals, axis)
        return out
    if isinstance(batched_space, TupleSpace):
        return tuple(concatenate(s, [it[i] for it in items], axis) for i, s in enumerate(batched_space.spaces))
    if isinstance(batched_space, DynamicBoxSpace):
        return _stack_dynamic(batched_space, items, axis)
    if isinstance(batched_space, GraphSpace):
        return _stack_graphs(batched_space, items, axis)
    if isinstance(batched_space, (BatchedSpace, TextSpace, UnionSpace)):
        # elements without an array form (strings, union pairs) go one by one into a NumPy object array
        inner = batched_space.batch_shape[1:] if isinstance(batched_space, BatchedSpace) else ()
        out_arr = np.empty((len(items),) + inner, dtype=object)
        for i, it in enumerate(items):
            out_arr[i] = it
        return out_arr
    raise TypeError(f"cannot concatenate data of a space of type {type(batched_space).__name__}")


def _single_axes(batched_space: DynamicBoxSpace, items: Sequence[Any], what: str) -> List[int]:
    """The variable axes of one element of `batched_space` (after checking every item is such an array)."""
    b = batched_space.backend
    ndim = len(batched_space.shape_low) - 1
    for i, it in enumerate(items):
        if not b.is_backendarray(it) or len(it.shape) != ndim:
            raise ValueError(f"{what}: item {i} must be a {b} array with {ndim} axes for {batched_space}, got "
                             f"{type(it).__name__} of shape {tuple(getattr(it, 'shape', ()))}")
    return [a - 1 for a in batched_space.variable_axes if a > 0]


def _stack_dynamic(batched_space: DynamicBoxSpace, items: List[Any], axis: int) -> Any:
    """Elements of differing lengths padded with the fill value to the longest on each variable axis, stacked."""
    b = batched_space.backend
    if not items:
        return b.from_numpy(np.zeros((0,) + batched_space.shape_low[1:], dtype=batched_space.low_numpy.dtype),
                            dtype=batched_space.dtype, device=batched_space.device)
    for a in _single_axes(batched_space, items, "concatenate"):
        size = max(int(it.shape[a]) for it in items)
        items = [b.pad_dim(it, a, size, batched_space.fill_value) for it in items]
    return b.stack(items, axis=axis)


def _stack_graphs(batched_space: GraphSpace, items: List[Any], axis: int) -> GraphInstance:
    """Graphs padded to the most node and edge slots among them, each field stacked (None when any lacks it)."""
    b = batched_space.backend
    for i, it in enumerate(items):
        if not isinstance(it, GraphInstance):
            raise TypeError(f"concatenate: item {i} must be a GraphInstance, got {type(it).__name__}")
    slots = [batched_space.instance_slots(it) for it in items]
    nodes = max((n for n, _ in slots), default=0)
    edges = max((e for _, e in slots), default=0)
    items = [batched_space.pad_instance(it, nodes, edges) for it in items]

    def stack(name: str) -> Any:
        fields = [getattr(it, name) for it in items]
        return None if not fields or any(f is None for f in fields) else b.stack(fields, axis=axis)

    return GraphInstance(n_nodes=stack("n_nodes"), n_edges=stack("n_edges"), nodes_features=stack("nodes_features"),
                         edges_features=stack("edges_features"), edges=stack("edges"))


def get_at(batched_space: Space, items: Any, index: Any) -> Any:
    """Entry or entries `index` along the batch axis of batched data `items`."""
    if isinstance(batched_space, DictSpace):
        check_dict_value(batched_space, items, "get_at", allow_extra=True)
        return {k: get_at(s, items[k], index) for k, s in batched_space.spaces.items()}
    if isinstance(batched_space, TupleSpace):
        return tuple(get_at(s, items[i], index) for i, s in enumerate(batched_space.spaces))
    if isinstance(batched_space, GraphSpace):
        if not isinstance(items, GraphInstance):
            raise TypeError(f"get_at: GraphSpace data must be a GraphInstance, got {type(items).__name__}")
        picked: GraphInstance = GraphInstance(**{name: None if getattr(items, name) is None else _index(getattr(items, name), index)
                                  for name in _GRAPH_FIELDS})
        return batched_space.trim_instance(picked)  # drop the padding the selected graphs do not need
    return _index(items, index)


_GRAPH_FIELDS = ("n_nodes", "n_edges", "nodes_features", "edges_features", "edges")


def _index(array: Any, index: Any) -> Any:
    out = array[index]
    if isinstance(out, np.generic):  # NumPy turns a single element into a scalar: keep it a 0-d array
        out = np.asarray(out)
    return out


def set_at(batched_space: Space, items: Any, index: Any, value: Any) -> Any:
    """Writes `value` at `index` of batched `items` (in place for mutable arrays) and returns `items`."""
    if isinstance(batched_space, DictSpace):
        return {k: set_at(s, items[k], index, value[k]) for k, s in batched_space.spaces.items()}
    if isinstance(batched_space, TupleSpace):
        return tuple(set_at(s, items[i], index, value[i]) for i, s in enumerate(batched_space.spaces))
    if isinstance(batched_space, DynamicBoxSpace):
        items, value = _align_dynamic(batched_space, items, value)
    elif isinstance(batched_space, GraphSpace):
        return _set_graphs(batched_space, items, index, value)
    elif isinstance(batched_space, BatchedSpace):
        out = items.copy()   # an object array: each element is one value (a union pair stays one element)
        out[index] = value
        return out
    return batched_space.backend.at(items)[index].set(value)


def _align_dynamic(batched_space: DynamicBoxSpace, items: Any, value: Any) -> Tuple[Any, Any]:
    """`items` and `value` (one element, or a batch of them) padded with the fill value to the same length on each
    variable axis, so that `value` fits into the batch (the batch grows when `value` is longer)."""
    b = batched_space.backend
    if not b.is_backendarray(items) or not b.is_backendarray(value):
        raise TypeError(f"set_at: DynamicBoxSpace data and value must be {b} arrays")
    shift = len(items.shape) - len(value.shape)
    if shift not in (0, 1):
        raise ValueError(f"set_at: a value of shape {tuple(value.shape)} does not fit a batch of shape "
                         f"{tuple(items.shape)}")
    for a in batched_space.variable_axes:
        if a == 0 or a - shift < 0:
            continue
        size = max(int(items.shape[a]), int(value.shape[a - shift]))
        items = b.pad_dim(items, a, size, batched_space.fill_value)
        value = b.pad_dim(value, a - shift, size, batched_space.fill_value)
    return items, value


def _set_graphs(batched_space: GraphSpace, items: Any, index: Any, value: Any) -> GraphInstance:
    """Graph `value` (one or a batch) written at `index` of batched graphs `items`, both padded to common node and
    edge slots first; padding no graph needs any more is dropped afterwards."""
    for what, g in (("data", items), ("value", value)):
        if not isinstance(g, GraphInstance):
            raise TypeError(f"set_at: GraphSpace {what} must be a GraphInstance, got {type(g).__name__}")
    (n1, e1), (n2, e2) = batched_space.instance_slots(items), batched_space.instance_slots(value)
    items = batched_space.pad_instance(items, max(n1, n2), max(e1, e2))
    value = batched_space.pad_instance(value, max(n1, n2), max(e1, e2))
    at = batched_space.backend.at
    fields = {}
    for name in _GRAPH_FIELDS:
        mine, theirs = getattr(items, name), getattr(value, name)
        if (mine is None) != (theirs is None):
            raise ValueError(f"set_at: the graphs and the value disagree on whether {name} is given")
        fields[name] = None if mine is None else at(mine)[index].set(theirs)
    return batched_space.trim_instance(GraphInstance(**fields))


def iterate(batched_space: Space, items: Any) -> Iterator[Any]:
    """Yields the single elements of batched `items` in order."""
    n = batch_size_data(items) if not isinstance(batched_space, BatchedSpace) else len(items)
    for i in range(n):
        yield get_at(batched_space, items, i)


def swap_batch_dims(space: Space, dim0: int, dim1: int) -> Space:
    """A Box / Binary (or nested) space with batch axes `dim0` and `dim1` swapped."""
    if isinstance(space, DictSpace):
        return DictSpace(space.backend, {k: swap_batch_dims(s, dim0, dim1) for k, s in space.spaces.items()}, space.device)
    if isinstance(space, BoxSpace):
        axes = list(range(len(space.shape)))
        axes[dim0], axes[dim1] = axes[dim1], axes[dim0]
        return BoxSpace(space.backend, np.transpose(space.low_numpy, axes), np.transpose(space.high_numpy, axes),
                        space.dtype, space.device, metadata=space.metadata)
    if isinstance(space, BinarySpace):
        shape = list(space.shape)
        shape[dim0], shape[dim1] = shape[dim1], shape[dim0]
        return BinarySpace(space.backend, shape, space.dtype, space.device, space.metadata)
    raise TypeError(f"cannot swap batch dims of {type(space).__name__}")


__all__: List[str] = ["batch_space", "batch_size", "batch_size_data", "unbatch_spaces", "get_single_space",
                      "concatenate", "get_at", "set_at", "iterate", "swap_batch_dims"]
