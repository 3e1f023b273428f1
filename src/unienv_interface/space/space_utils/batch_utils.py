"""Batching of spaces and of their data: a batch adds leading axes to every array leaf."""
from __future__ import annotations

from typing import Any, Dict, Iterator, List, Sequence, Tuple

import numpy as np

from ..space import Space
from ..spaces import BatchedSpace, BinarySpace, BoxSpace, DictSpace, TextSpace, TupleSpace
from ._mapping import check_dict_value


def batch_space(space: Space, n: int = 1) -> Space:
    """The space of `n` stacked elements of `space` (Box / Binary get a leading axis of size `n`)."""
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
    if isinstance(space, BatchedSpace):
        return BatchedSpace(space.single_space, (n,) + space.batch_shape, space.metadata)
    if isinstance(space, TextSpace):
        return BatchedSpace(space, (n,))
    raise TypeError(f"cannot batch a space of type {type(space).__name__}")


def batch_size(batched_space: Space) -> int:
    """The leading batch size of a batched space."""
    if isinstance(batched_space, (BoxSpace, BinarySpace)):
        if not batched_space.shape:
            raise ValueError("a 0-d space has no batch axis")
        return batched_space.shape[0]
    if isinstance(batched_space, BatchedSpace):
        return batched_space.batch_shape[0]
    if isinstance(batched_space, DictSpace):
        for s in batched_space.spaces.values():
            return batch_size(s)
    if isinstance(batched_space, TupleSpace):
        for s in batched_space.spaces:
            return batch_size(s)
    raise ValueError(f"cannot tell the batch size of {batched_space!r}")


def batch_size_data(data: Any) -> int:
    """The leading size of the first array leaf of `data`."""
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
    if isinstance(batched_space, BatchedSpace):
        out_arr = np.empty((len(items),) + batched_space.batch_shape[1:], dtype=object)
        for i, it in enumerate(items):
            out_arr[i] = it
        return out_arr
    raise TypeError(f"cannot concatenate data of a space of type {type(batched_space).__name__}")


def get_at(batched_space: Space, items: Any, index: Any) -> Any:
    """Entry or entries `index` along the batch axis of batched data `items`."""
    if isinstance(batched_space, DictSpace):
        check_dict_value(batched_space, items, "get_at", allow_extra=True)
        return {k: get_at(s, items[k], index) for k, s in batched_space.spaces.items()}
    if isinstance(batched_space, TupleSpace):
        return tuple(get_at(s, items[i], index) for i, s in enumerate(batched_space.spaces))
    out = items[index]
    if isinstance(out, np.generic):  # NumPy turns a single element into a scalar: keep it a 0-d array
        out = np.asarray(out)
    return out


def set_at(batched_space: Space, items: Any, index: Any, value: Any) -> Any:
    """Writes `value` at `index` of batched `items` (in place for mutable arrays) and returns `items`."""
    if isinstance(batched_space, DictSpace):
        return {k: set_at(s, items[k], index, value[k]) for k, s in batched_space.spaces.items()}
    if isinstance(batched_space, TupleSpace):
        return tuple(set_at(s, items[i], index, value[i]) for i, s in enumerate(batched_space.spaces))
    return batched_space.backend.at(items)[index].set(value)


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
