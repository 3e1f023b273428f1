"""`DynamicBoxSpace`: a bounded array whose length along some axes varies between a lower and an upper shape."""
from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from unienv_interface.backends.base import BArrayType, BDeviceType, BDtypeType, BRNGType

from ..metadata import SpaceMetadata
from ..space import Space, array_data_to, check_backend
from ._array import format_repr
from .box import BoxSpace, as_member_array, bounds_repr, clip_within, sample_within, values_within


def _shape_arg(shape: Any, name: str) -> Tuple[int, ...]:
    if isinstance(shape, (int, np.integer)) and not isinstance(shape, (bool, np.bool_)):
        shape = (shape,)
    try:
        dims = tuple(shape)
    except TypeError:
        raise TypeError(f"DynamicBoxSpace {name} must be a sequence of ints, got {shape!r}") from None
    for d in dims:
        if isinstance(d, (bool, np.bool_)) or not isinstance(d, (int, np.integer)):
            raise TypeError(f"DynamicBoxSpace {name} must be a sequence of ints, got {dims!r}")
        if d < 0:
            raise ValueError(f"DynamicBoxSpace {name} must be non-negative, got {dims!r}")
    return tuple(int(d) for d in dims)


def _fill_value_arg(fill_value: Any, np_dtype: np.dtype) -> Union[int, float]:
    """`fill_value` as a Python number that the dtype holds exactly (ValueError / TypeError otherwise)."""
    if isinstance(fill_value, np.generic):
        fill_value = fill_value.item()
    if isinstance(fill_value, bool) or not isinstance(fill_value, (int, float)):
        raise TypeError(f"DynamicBoxSpace fill_value must be an int or a float, got {fill_value!r}")
    if np_dtype.kind in "iu":
        info = np.iinfo(np_dtype)
        if not float(fill_value).is_integer() or not int(info.min) <= int(fill_value) <= int(info.max):
            raise ValueError(f"DynamicBoxSpace fill_value must be a whole number in [{info.min}, {info.max}] for "
                             f"dtype {np_dtype}, got {fill_value!r}")
    elif fill_value != fill_value:
        raise ValueError("DynamicBoxSpace fill_value must not be NaN (padding is found again by comparing with it)")
    return fill_value


class DynamicBoxSpace(Space[BArrayType, BDeviceType, BDtypeType, BRNGType]):
    """Arrays of `dtype` (real floating or integer) whose shape lies between `shape_low` and `shape_high` (axis by
    axis, both inclusive), with element-wise bounds `[low, high]`.

    At least one axis must be variable (`shape_low[i] < shape_high[i]`; otherwise use `BoxSpace`). The bounds
    broadcast to `shape_low` with size 1 on the variable axes: they may vary along fixed axes only. Flattened,
    an element is padded with `fill_value` to `shape_high`; unflattened, trailing positions of a variable axis
    that hold only `fill_value` are cut again, never below `shape_low`. `shape` is None. Equality compares the
    backend, both shapes, the dtype, the exact bounds and `fill_value`; device and metadata are ignored.
    """

    def __init__(self, backend: Any, low: Any, high: Any, shape_low: Sequence[int], shape_high: Sequence[int],
                 dtype: Any, device: Any = None, fill_value: Union[int, float] = 0,
                 metadata: Optional[Mapping[str, Any]] = None) -> None:
        backend = check_backend(backend)
        lo_shape = _shape_arg(shape_low, "shape_low")
        hi_shape = _shape_arg(shape_high, "shape_high")
        if len(lo_shape) != len(hi_shape):
            raise ValueError(f"DynamicBoxSpace shape_low and shape_high must have the same length, got {lo_shape} "
                             f"and {hi_shape}")
        if any(a > b for a, b in zip(lo_shape, hi_shape)):
            raise ValueError(f"DynamicBoxSpace needs shape_low <= shape_high on every axis, got {lo_shape} and "
                             f"{hi_shape}")
        variable = tuple(i for i, (a, b) in enumerate(zip(lo_shape, hi_shape)) if a != b)
        if not variable:
            raise ValueError(f"DynamicBoxSpace needs an axis where shape_low and shape_high differ, got {lo_shape} "
                             "for both (use BoxSpace for a fixed shape)")
        bounds_shape = tuple(1 if i in variable else d for i, d in enumerate(lo_shape))
        try:
            bounds: BoxSpace = BoxSpace(backend, low, high, dtype, device, bounds_shape)
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"DynamicBoxSpace: {exc} (its bounds broadcast to {bounds_shape}: size 1 on the "
                            f"variable axes {list(variable)})") from None
        self._fill_value = _fill_value_arg(fill_value, bounds.low_numpy.dtype)
        super().__init__(backend, shape=None, device=device, dtype=bounds.dtype, metadata=metadata)
        self._bounds = bounds
        self._shape_low = lo_shape
        self._shape_high = hi_shape
        self._variable = variable

    # ------------------------------------------------------------------ description
    @property
    def shape_low(self) -> Tuple[int, ...]:
        """The smallest shape of an element."""
        return self._shape_low

    @property
    def shape_high(self) -> Tuple[int, ...]:
        """The largest shape of an element (the shape of a flattened, padded one)."""
        return self._shape_high

    @property
    def variable_axes(self) -> Tuple[int, ...]:
        """The axes whose length varies (`shape_low[i] < shape_high[i]`)."""
        return self._variable

    @property
    def fill_value(self) -> Union[int, float]:
        """The value that pads an element to `shape_high`."""
        return self._fill_value

    @property
    def low(self) -> Any:
        """Lower bounds as a backend array of `shape_low` with size 1 on the variable axes (broadcasts to any
        element's shape)."""
        return self._bounds.low

    @property
    def high(self) -> Any:
        """Upper bounds, shaped as `low`."""
        return self._bounds.high

    @property
    def low_numpy(self) -> np.ndarray:
        """The lower bounds as a read-only NumPy array, shaped as `low`."""
        return self._bounds.low_numpy

    @property
    def high_numpy(self) -> np.ndarray:
        """The upper bounds as a read-only NumPy array, shaped as `low`."""
        return self._bounds.high_numpy

    def get_low(self, shape: Sequence[int]) -> Any:
        """The lower bounds broadcast to `shape` (a backend array)."""
        return self._bounds_at(shape).low

    def get_high(self, shape: Sequence[int]) -> Any:
        """The upper bounds broadcast to `shape` (a backend array)."""
        return self._bounds_at(shape).high

    def _bounds_at(self, shape: Sequence[int]) -> BoxSpace:
        return BoxSpace(self._backend, self.low_numpy, self.high_numpy, self._dtype, self._device, tuple(shape))

    def padded_bounds(self) -> Tuple[np.ndarray, np.ndarray]:
        """`(low, high)` NumPy bounds of shape `shape_high`, widened to include `fill_value` at every position that
        may hold padding (an index at or past `shape_low` on a variable axis): the bounds of a flattened element."""
        low = np.array(np.broadcast_to(self.low_numpy, self._shape_high))
        high = np.array(np.broadcast_to(self.high_numpy, self._shape_high))
        pad = np.zeros(self._shape_high, dtype=bool)
        for axis in self._variable:
            index = (slice(None),) * axis + (slice(self._shape_low[axis], None),)
            pad[index] = True
        fill = np.asarray(self._fill_value).astype(low.dtype)
        low[pad] = np.minimum(low[pad], fill)
        high[pad] = np.maximum(high[pad], fill)
        return low, high

    def shape_contains(self, shape: Sequence[int]) -> bool:
        """Whether `shape` lies between `shape_low` and `shape_high` on every axis."""
        return len(shape) == len(self._shape_low) and all(
            a <= int(d) <= b for a, d, b in zip(self._shape_low, shape, self._shape_high))

    # ------------------------------------------------------------------ copies
    def _copy_with(self, metadata: SpaceMetadata) -> "DynamicBoxSpace":
        return DynamicBoxSpace(self._backend, self.low_numpy, self.high_numpy, self._shape_low, self._shape_high,
                               self._dtype, self._device, self._fill_value, metadata)

    def _moved(self, backend: Any, device: Any) -> "DynamicBoxSpace":
        dt = backend.dtype_from_name(self._backend.dtype_name(self._dtype))
        return DynamicBoxSpace(backend, self.low_numpy, self.high_numpy, self._shape_low, self._shape_high, dt,
                               device, self._fill_value, self._metadata)

    # ------------------------------------------------------------------ elements
    def is_bounded(self, manner: str = "both") -> bool:
        return self._bounds.is_bounded(manner)

    def contains(self, x: Any) -> bool:
        """True for an array of this backend whose shape lies in the range, whose dtype casts to the space's
        without loss (as for BoxSpace) and whose values lie within the bounds (padding is not treated apart)."""
        x = as_member_array(self._backend, x)
        if x is None or not self.shape_contains(tuple(x.shape)):
            return False
        return values_within(self._backend, x, self._dtype, self.low_numpy, self.high_numpy)

    def clip(self, x: Any) -> Any:
        """`x` projected into the space: axes longer than `shape_high` cut to it, values clamped to the bounds.
        ValueError for another number of axes or an axis shorter than `shape_low` (values cannot be invented)."""
        b = self._backend
        arr = as_member_array(b, x)
        if arr is None:
            raise TypeError(f"DynamicBoxSpace.clip expects a {b} array, got {type(x).__name__}")
        shape = tuple(int(d) for d in arr.shape)
        if len(shape) != len(self._shape_low):
            raise ValueError(f"DynamicBoxSpace.clip: expected {len(self._shape_low)} axes, got shape {shape}")
        if any(d < a for d, a in zip(shape, self._shape_low)):
            raise ValueError(f"DynamicBoxSpace.clip: shape {shape} is shorter than shape_low {self._shape_low}")
        arr = arr[tuple(slice(0, min(d, h)) for d, h in zip(shape, self._shape_high))]
        return clip_within(b, arr, self.low_numpy, self.high_numpy, self._dtype, self._device)

    def sample(self, rng: Any) -> Tuple[Any, Any]:
        """`(rng, x)`: the shape uniform in the range (each axis independently), then the values as BoxSpace draws
        them."""
        b = self._backend
        ndim = len(self._shape_low)
        rng, u = b.random.random_uniform((ndim,), rng=rng)
        u = np.asarray(b.to_numpy(u), dtype=np.float64).reshape(-1)
        shape = tuple(min(a + int(np.floor(r * (h - a + 1))), h)
                      for a, h, r in zip(self._shape_low, self._shape_high, u))
        return sample_within(b, rng, np.broadcast_to(self.low_numpy, shape), np.broadcast_to(self.high_numpy, shape),
                             self._dtype, self._device)

    def create_empty(self) -> Any:
        """A zero-filled array of `shape_high`."""
        return self._backend.from_numpy(np.zeros(self._shape_high, dtype=self.low_numpy.dtype), dtype=self._dtype,
                                        device=self._device)

    def data_to(self, data: Any, backend: Any = None, device: Any = None) -> Any:
        return array_data_to(self, data, backend, device)

    # ------------------------------------------------------------------ padding
    @staticmethod
    def pad_array_on_axis(backend: Any, data: Any, axis: int, target_size: int,
                          fill_value: Union[int, float] = 0) -> Any:
        """`data` padded at the end of `axis` with `fill_value` up to `target_size` (ValueError when longer)."""
        if data.shape[axis] > target_size:
            raise ValueError(f"cannot pad axis {axis} of length {data.shape[axis]} to the shorter {target_size}")
        return backend.pad_dim(data, axis, target_size, fill_value)

    @staticmethod
    def get_array_axis_length(backend: Any, data: Any, axis: int, fill_value: Union[int, float] = 0,
                              min_length: int = 0) -> int:
        """The length of `axis` without its trailing positions that hold only `fill_value` (over every other
        axis), but at least `min_length`."""
        n = int(data.shape[axis])
        if n <= min_length:
            return n
        is_fill = np.asarray(backend.to_numpy(data == fill_value), dtype=bool)
        per_position: np.ndarray = np.asarray(np.moveaxis(is_fill, axis, 0).reshape(n, -1).all(axis=1))
        while n > min_length and per_position[n - 1]:
            n -= 1
        return n

    @staticmethod
    def unpad_array_on_axis(backend: Any, data: Any, axis: int, fill_value: Union[int, float] = 0,
                            min_length: int = 0) -> Any:
        """`data` with the trailing padding of `axis` cut (see `get_array_axis_length`)."""
        if axis < 0:
            axis += len(data.shape)
        n = DynamicBoxSpace.get_array_axis_length(backend, data, axis, fill_value, min_length)
        return data[(slice(None),) * axis + (slice(0, n),)]

    def _padding_axes(self, data: Any, start_axis: Optional[int], end_axis: Optional[int], what: str) -> range:
        if not self._backend.is_backendarray(data):
            raise TypeError(f"DynamicBoxSpace.{what} expects a {self._backend} array, got {type(data).__name__}")
        if len(data.shape) != len(self._shape_low):
            raise ValueError(f"DynamicBoxSpace.{what}: expected {len(self._shape_low)} axes, got shape "
                             f"{tuple(data.shape)}")
        return range(*slice(start_axis, end_axis).indices(len(self._shape_low)))

    def pad_data(self, data: Any, start_axis: Optional[int] = None, end_axis: Optional[int] = None) -> Any:
        """`data` padded with `fill_value` to `shape_high` on the variable axes in `[start_axis, end_axis)`."""
        for axis in self._padding_axes(data, start_axis, end_axis, "pad_data"):
            if axis in self._variable:
                data = self.pad_array_on_axis(self._backend, data, axis, self._shape_high[axis], self._fill_value)
        return data

    def unpad_data(self, data: Any, start_axis: Optional[int] = None, end_axis: Optional[int] = None) -> Any:
        """`data` with the trailing `fill_value` padding of the variable axes in `[start_axis, end_axis)` cut,
        never below `shape_low`."""
        for axis in self._padding_axes(data, start_axis, end_axis, "unpad_data"):
            if axis in self._variable:
                data = self.unpad_array_on_axis(self._backend, data, axis, self._fill_value, self._shape_low[axis])
        return data

    # ------------------------------------------------------------------ comparison
    def get_repr(self, abbreviate: bool = False, include_backend: bool = True, include_device: bool = True,
                 include_dtype: bool = True) -> str:
        parts = [f"low={bounds_repr(self._backend, self.low_numpy, abbreviate)}",
                 f"high={bounds_repr(self._backend, self.high_numpy, abbreviate)}",
                 f"shape_low={self._shape_low}", f"shape_high={self._shape_high}", f"fill_value={self._fill_value}"]
        if include_dtype:
            parts.append(f"dtype={self._backend.dtype_name(self._dtype)}")
        return format_repr("DynamicBoxSpace", parts, self._backend, self._device, include_backend, include_device)

    def is_subspaceeq(self, other: Space) -> bool:
        """True when `other` is a DynamicBoxSpace of the same backend, dtype and number of axes whose shape range
        and bounds enclose this one's."""
        if not (isinstance(other, DynamicBoxSpace) and other.backend is self._backend and other.dtype == self._dtype
                and len(other.shape_low) == len(self._shape_low)):
            return False
        if not all(ol <= sl and sh <= oh for sl, sh, ol, oh in
                   zip(self._shape_low, self._shape_high, other.shape_low, other.shape_high)):
            return False
        try:
            return bool(np.all(other.low_numpy <= self.low_numpy) and np.all(other.high_numpy >= self.high_numpy))
        except ValueError:  # bounds that do not broadcast together
            return False

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, DynamicBoxSpace) and other.backend is self._backend
                and other.shape_low == self._shape_low and other.shape_high == self._shape_high
                and other.dtype == self._dtype and other.fill_value == self._fill_value
                and np.array_equal(other.low_numpy, self.low_numpy)
                and np.array_equal(other.high_numpy, self.high_numpy))

    __hash__ = None  # type: ignore[assignment]
