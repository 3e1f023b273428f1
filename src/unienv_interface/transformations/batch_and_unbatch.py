"""`BatchifyTransformation` / `UnBatchifyTransformation`: add or remove a size-1 axis of every array in a space.

Both work leaf by leaf through DictSpace and TupleSpace. A Box or Binary leaf gets (loses) a size-1 axis at `axis` of
its shape (negative axes count from the end, as in `numpy.expand_dims` / `squeeze`); data may carry extra leading
batch axes, which stay in front. A BatchedSpace leaf (a batch of texts, say) changes its batch shape the same way.
Any other space (a TextSpace, or a space type this module does not know) takes only `axis=0`, through
`space_utils.batch_utils` (`batch_space(space, 1)` / `concatenate`, and `get_single_space` / `get_at`), so a space
type that batch_utils learns is supported here too.

The reference swaps axis 0 with `axis` in the target *space* while inserting the axis into the *data*; for
`axis >= 2` the two disagree there. Here space and data both insert (remove) the axis, so they always agree; for
`axis` 0 and 1 (and a leaf's last position) this is the reference's result.
"""
from __future__ import annotations

from typing import Any, Dict, Mapping, Optional

import numpy as np

from unienv_interface.space import BatchedSpace, BinarySpace, BoxSpace, DictSpace, Space, TupleSpace
from unienv_interface.space.space_utils import batch_utils

from ._arrays import as_backend_array
from .serialization_utils import check_param_names
from .transformation import DataTransformation


def _axis_param(axis: Any, who: str) -> int:
    if isinstance(axis, (bool, np.bool_)) or not isinstance(axis, (int, np.integer)):
        raise TypeError(f"{who}: axis must be an int, got {axis!r}")
    return int(axis)


def _position(axis: int, ndim: int, who: str, space: Space) -> int:
    """`axis` as a position in `range(ndim)` (negative axes count from the end); ValueError outside it."""
    pos = axis + ndim if axis < 0 else axis
    if not 0 <= pos < ndim:
        raise ValueError(f"{who}: axis {axis} is out of range for {type(space).__name__} of shape "
                         f"{tuple(space.shape or ())} (valid: {-ndim} .. {ndim - 1})")
    return pos


def _leading(space: Space, arr: Any, who: str) -> int:
    """How many leading batch axes `arr` has before the space's shape; ValueError when its trailing shape differs."""
    want = tuple(space.shape or ())
    got = tuple(int(d) for d in arr.shape)
    lead = len(got) - len(want)
    if lead < 0 or got[lead:] != want:
        raise ValueError(f"{who}: expected shape {want} (optionally with leading batch axes), got {got}")
    return lead


def _container(space: Space, data: Any, fn: Any, who: str) -> Any:
    """`fn(child space, child data)` over a DictSpace / TupleSpace and its data (None for other spaces)."""
    if isinstance(space, DictSpace):
        if not isinstance(data, Mapping):
            raise TypeError(f"{who}: expected a dict with keys {list(space.spaces)}, got {type(data).__name__}")
        missing = [k for k in space.spaces if k not in data]
        if missing:
            raise KeyError(f"{who}: missing key(s) {missing} (expected keys {list(space.spaces)})")
        return {k: fn(s, data[k]) for k, s in space.spaces.items()}
    if not isinstance(space, TupleSpace):
        raise TypeError(f"{who}: expected a DictSpace or TupleSpace, got {type(space).__name__}")
    if not isinstance(data, (tuple, list)) or len(data) != len(space.spaces):
        raise TypeError(f"{who}: expected a tuple of {len(space.spaces)} elements, got {type(data).__name__}"
                        f"{f' of {len(data)}' if isinstance(data, (tuple, list)) else ''}")
    return tuple(fn(s, d) for s, d in zip(space.spaces, data))


def insert_axis(space: Space, axis: int, who: str = "BatchifyTransformation") -> Space:
    """`space` with a size-1 axis at `axis` of every array leaf (see the module docstring)."""
    if isinstance(space, DictSpace):
        return DictSpace(space.backend, {k: insert_axis(s, axis, who) for k, s in space.spaces.items()},
                         device=space.device, metadata=space.metadata)
    if isinstance(space, TupleSpace):
        return TupleSpace(space.backend, [insert_axis(s, axis, who) for s in space.spaces], device=space.device,
                          metadata=space.metadata)
    if isinstance(space, (BoxSpace, BinarySpace, BatchedSpace)):
        shape = tuple(space.shape or ())
        pos = _position(axis, len(shape) + 1, who, space)
        new_shape = shape[:pos] + (1,) + shape[pos:]
        if isinstance(space, BoxSpace):
            return BoxSpace(space.backend, np.expand_dims(space.low_numpy, pos), np.expand_dims(space.high_numpy, pos),
                            space.dtype, device=space.device, shape=new_shape, metadata=space.metadata)
        if isinstance(space, BinarySpace):
            return BinarySpace(space.backend, new_shape, space.dtype, device=space.device, metadata=space.metadata)
        return BatchedSpace(space.single_space, new_shape, metadata=space.metadata)
    if axis != 0:
        raise TypeError(f"{who}: a {type(space).__name__} can only be batched at axis 0, got axis={axis}")
    return batch_utils.batch_space(space, 1)


def remove_axis(space: Space, axis: int, who: str = "UnBatchifyTransformation") -> Space:
    """`space` without the size-1 axis at `axis` of every array leaf; ValueError when that axis is not of size 1."""
    if isinstance(space, DictSpace):
        return DictSpace(space.backend, {k: remove_axis(s, axis, who) for k, s in space.spaces.items()},
                         device=space.device, metadata=space.metadata)
    if isinstance(space, TupleSpace):
        return TupleSpace(space.backend, [remove_axis(s, axis, who) for s in space.spaces], device=space.device,
                          metadata=space.metadata)
    if isinstance(space, (BoxSpace, BinarySpace, BatchedSpace)):
        shape = tuple(space.shape or ())
        pos = _position(axis, len(shape), who, space)
        if shape[pos] != 1:
            raise ValueError(f"{who}: cannot unbatch axis {axis} of size {shape[pos]} (shape {shape}); it must be 1")
        new_shape = shape[:pos] + shape[pos + 1:]
        if isinstance(space, BoxSpace):
            return BoxSpace(space.backend, np.squeeze(space.low_numpy, pos), np.squeeze(space.high_numpy, pos),
                            space.dtype, device=space.device, shape=new_shape, metadata=space.metadata)
        if isinstance(space, BinarySpace):
            return BinarySpace(space.backend, new_shape, space.dtype, device=space.device, metadata=space.metadata)
        if not new_shape:
            return space.single_space
        return BatchedSpace(space.single_space, new_shape, metadata=space.metadata)
    if axis != 0:
        raise TypeError(f"{who}: a {type(space).__name__} can only be unbatched at axis 0, got axis={axis}")
    if batch_utils.batch_size(space) != 1:
        raise ValueError(f"{who}: cannot unbatch a batch of {batch_utils.batch_size(space)}; it must be 1")
    return batch_utils.get_single_space(space)


def _insert_data(space: Space, data: Any, axis: int, who: str) -> Any:
    if isinstance(space, (DictSpace, TupleSpace)):
        return _container(space, data, lambda s, d: _insert_data(s, d, axis, who), who)
    if isinstance(space, BatchedSpace):
        arr = np.asarray(data, dtype=object) if not isinstance(data, np.ndarray) else data
        lead = _leading(space, arr, who)
        return np.expand_dims(arr, lead + _position(axis, len(space.batch_shape) + 1, who, space))
    if isinstance(space, (BoxSpace, BinarySpace)):
        arr = as_backend_array(space, data, who)
        lead = _leading(space, arr, who)
        return space.backend.expand_dims(arr, axis=lead + _position(axis, len(space.shape) + 1, who, space))
    return batch_utils.concatenate(insert_axis(space, axis, who), [data])


def _remove_data(space: Space, data: Any, axis: int, who: str) -> Any:
    if isinstance(space, (DictSpace, TupleSpace)):
        return _container(space, data, lambda s, d: _remove_data(s, d, axis, who), who)
    if isinstance(space, (BoxSpace, BinarySpace, BatchedSpace)):
        remove_axis(space, axis, who)  # checks the axis
        if isinstance(space, BatchedSpace):
            arr = np.asarray(data, dtype=object) if not isinstance(data, np.ndarray) else data
            lead = _leading(space, arr, who)
            out = np.squeeze(arr, lead + _position(axis, len(space.batch_shape), who, space))
            return out[()] if out.ndim == 0 else out
        arr = as_backend_array(space, data, who)
        lead = _leading(space, arr, who)
        return space.backend.squeeze(arr, axis=lead + _position(axis, len(space.shape), who, space))
    remove_axis(space, axis, who)
    return batch_utils.get_at(space, data, 0)


class BatchifyTransformation(DataTransformation):
    """Adds a size-1 axis at `axis` to every array of the space and its data: an element becomes a batch of one
    (see the module docstring). The inverse is `UnBatchifyTransformation(axis)`."""

    has_inverse = True

    def __init__(self, axis: int = 0) -> None:
        self.axis = _axis_param(axis, "BatchifyTransformation")

    def get_target_space_from_source(self, source_space: Space) -> Space:
        return insert_axis(source_space, self.axis, "BatchifyTransformation")

    def transform(self, source_space: Space, data: Any) -> Any:
        return _insert_data(source_space, data, self.axis, "BatchifyTransformation")

    def direct_inverse(self, source_space: Optional[Space] = None) -> "UnBatchifyTransformation":
        return UnBatchifyTransformation(axis=self.axis)

    def to_json(self) -> Dict[str, Any]:
        return {"axis": self.axis}

    @classmethod
    def from_json(cls, params: Mapping[str, Any]) -> "BatchifyTransformation":
        check_param_names(params, ("axis",), (), cls.__name__)
        return cls(params.get("axis", 0))


class UnBatchifyTransformation(DataTransformation):
    """Removes the size-1 axis at `axis` of every array of the space and its data (ValueError when that axis is
    not of size 1): a batch of one becomes its element. The inverse is `BatchifyTransformation(axis)`."""

    has_inverse = True

    def __init__(self, axis: int = 0) -> None:
        self.axis = _axis_param(axis, "UnBatchifyTransformation")

    def get_target_space_from_source(self, source_space: Space) -> Space:
        return remove_axis(source_space, self.axis, "UnBatchifyTransformation")

    def transform(self, source_space: Space, data: Any) -> Any:
        return _remove_data(source_space, data, self.axis, "UnBatchifyTransformation")

    def direct_inverse(self, source_space: Optional[Space] = None) -> BatchifyTransformation:
        return BatchifyTransformation(axis=self.axis)

    def to_json(self) -> Dict[str, Any]:
        return {"axis": self.axis}

    @classmethod
    def from_json(cls, params: Mapping[str, Any]) -> "UnBatchifyTransformation":
        check_param_names(params, ("axis",), (), cls.__name__)
        return cls(params.get("axis", 0))


__all__ = ["BatchifyTransformation", "UnBatchifyTransformation"]
