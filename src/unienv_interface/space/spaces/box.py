"""`BoxSpace`: a real-valued or integer array with element-wise bounds."""
from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence, Tuple

import numpy as np

from unienv_interface.backends.base import BArrayType, BDeviceType, BDtypeType, BRNGType

from ..dtype_facts import is_lossless
from ..metadata import SpaceMetadata
from ..space import Space, array_data_to, check_backend
from ._array import ArraySpaceMixin


def _int_list_to_numpy(value: Any) -> Optional[np.ndarray]:
    """A (nested) list of Python ints as an exact int64 / uint64 array (NumPy would pick float64 for a mix
    of negative values and values above 2**63); None when it is not all ints."""
    try:
        fast = np.array(value)
    except (OverflowError, ValueError):
        fast = None
    if fast is not None and fast.dtype != object:
        if fast.dtype.kind in "iu":
            return fast if fast.size else None          # NumPy picked an exact integer dtype
        # a float / bool / str dtype means some element is not an int, except for ints outside int64, which NumPy
        # turns into float64 (rounded): only those take the exact path below
        if fast.dtype.kind != "f" or not fast.size or not (np.abs(fast[np.isfinite(fast)]) >= 2.0 ** 63).any():
            return None
    try:
        obj = np.array(value, dtype=object)
    except ValueError:
        return None
    flat = obj.reshape(-1)
    if not flat.size or not all(isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)) for v in flat):
        return None
    ints = [int(v) for v in flat]
    lo, hi = min(ints), max(ints)
    if lo >= -(2 ** 63) and hi < 2 ** 63:
        return np.array(ints, dtype=np.int64).reshape(obj.shape)
    if lo >= 0 and hi < 2 ** 64:
        return np.array(ints, dtype=np.uint64).reshape(obj.shape)
    return None


def _bounds_to_numpy(backend: Any, value: Any) -> np.ndarray:
    if isinstance(value, (list, tuple)):
        exact = _int_list_to_numpy(value)
        if exact is not None:
            return exact
    if backend.is_backendarray(value):
        return np.asarray(backend.to_numpy(value))
    if type(value).__module__.split(".")[0] in ("torch", "jax", "jaxlib"):
        from unienv_interface.backends import get_backend_from_tensor
        return np.asarray(get_backend_from_tensor(value).to_numpy(value))
    return np.asarray(value)


def _bounds_array(b: np.ndarray, which: str) -> np.ndarray:
    """Bounds as an exact integer array when given as integers, else as float64; NaN is refused."""
    if b.dtype.kind in "iub":
        return b.astype(np.int64) if b.dtype.kind == "b" else b
    if b.dtype == object:
        try:
            return np.array(b.tolist(), dtype=np.int64)
        except (OverflowError, TypeError, ValueError):
            pass
    try:
        f = b.astype(np.float64)
    except (TypeError, ValueError):
        raise TypeError(f"BoxSpace {which} bounds must be numbers, got {b.dtype}") from None
    if np.isnan(f).any():
        raise ValueError("BoxSpace bounds must not be NaN")
    return f


def _int_bounds(b: np.ndarray, np_dt: np.dtype, which: str) -> np.ndarray:
    """Integer bounds of dtype `np_dt`, exactly: +-inf become the dtype limits; fractions and overflow are refused."""
    info = np.iinfo(np_dt)
    if b.dtype.kind in "iu":
        if b.size and (int(b.min()) < info.min or int(b.max()) > info.max):
            raise ValueError(f"BoxSpace {which} bounds exceed the range of {np_dt} [{info.min}, {info.max}]")
        return b.astype(np_dt)
    if which == "low" and np.isposinf(b).any() or which == "high" and np.isneginf(b).any():
        raise ValueError(f"integer BoxSpace ({np_dt}) bounds must be finite: low=+inf or high=-inf")
    finite = np.isfinite(b)
    vals = b[finite]
    if (np.floor(vals) != vals).any():
        raise ValueError(f"integer BoxSpace ({np_dt}) {which} bounds must be whole numbers")
    if (vals < float(info.min)).any() or (vals > float(info.max)).any():
        raise ValueError(f"BoxSpace {which} bounds exceed the range of {np_dt} [{info.min}, {info.max}]")
    out = np.empty(b.shape, dtype=np_dt)
    out[~finite & (b < 0)] = info.min
    out[~finite & (b > 0)] = info.max
    top = finite & (b >= float(info.max))        # float(info.max) rounds up for 64-bit types
    out[top] = info.max
    rest = finite & ~top
    out[rest] = b[rest].astype(np_dt)
    return out


# ------------------------------------------------------------------ element-wise bounds, shared by the box-like
# spaces (BoxSpace, DynamicBoxSpace): the bounds are NumPy arrays that broadcast to the data's shape
def as_member_array(backend: Any, x: Any) -> Optional[Any]:
    """`x` as an array of `backend` (a NumPy scalar counts as a 0-d NumPy array), or None when it is not one."""
    if isinstance(x, np.generic) and backend.simplified_name == "numpy":
        x = np.asarray(x)
    return x if backend.is_backendarray(x) else None


def values_within(backend: Any, x: Any, dtype: Any, low_np: np.ndarray, high_np: np.ndarray) -> bool:
    """True when array `x` has a dtype that casts to `dtype` without loss (the same dtype, or e.g. bool / uint8 in
    float32, as the reference's `can_cast`; float64 in a float32 space is not) and every value lies within the
    bounds (which broadcast to `x`'s shape)."""
    dst = backend.dtype_name(dtype)
    if x.dtype == dtype:
        src = dst
    else:
        try:
            src = backend.dtype_name(x.dtype)
        except ValueError:          # complex, strings, ...
            return False
        if not is_lossless(src, dst):
            return False
    a = backend.to_numpy(x)
    if src == "bfloat16":  # raw bits (torch) or ml_dtypes' bfloat16 values (JAX)
        a = (a.astype(np.uint32) << 16).view(np.float32) if a.dtype == np.uint16 else a.astype(np.float32)
    with np.errstate(invalid="ignore"):
        return bool(np.all(a >= low_np) and np.all(a <= high_np))


def clip_within(backend: Any, x: Any, low_np: np.ndarray, high_np: np.ndarray, dtype: Any, device: Any) -> Any:
    """`x` clamped element-wise into the bounds (which broadcast to its shape), as an array of `dtype`."""
    return backend.from_numpy(np.clip(backend.to_numpy(x), low_np, high_np).astype(low_np.dtype), dtype=dtype,
                              device=device)


def sample_within(backend: Any, rng: Any, low_np: np.ndarray, high_np: np.ndarray, dtype: Any,
                  device: Any) -> Tuple[Any, Any]:
    """`(rng, x)`: a random array of the bounds' shape and `dtype`, each element drawn independently: uniform in a
    finite interval (integers inclusive), shifted exponential on a half-open one, normal on an unbounded one."""
    b = backend
    shape = low_np.shape
    rng, u = b.random.random_uniform(shape, rng=rng, dtype=b.dtype_from_name("float64") if b.simplified_name != "jax" else None)
    rng, n = b.random.random_normal(shape, rng=rng)
    u = np.asarray(b.to_numpy(u), dtype=np.float64)
    n = np.asarray(b.to_numpy(n), dtype=np.float64)
    lo = low_np.astype(np.float64)
    hi = high_np.astype(np.float64)
    if low_np.dtype.kind in "iu":
        if low_np.size == 0 or (np.abs(lo).max() < 2 ** 52 and np.abs(hi).max() < 2 ** 52):
            out_i = np.minimum(np.floor(lo + u * (hi - lo + 1.0)), hi).astype(low_np.dtype)
        else:  # beyond float precision: offsets in float, bounds and sums as exact Python ints
            vals = [min(lv + int(np.floor(r * float(hv - lv + 1))), hv) for lv, hv, r in
                    zip(low_np.reshape(-1).tolist(), high_np.reshape(-1).tolist(), u.reshape(-1).tolist())]
            out_i = np.array(vals, dtype=low_np.dtype).reshape(shape)
        return rng, b.from_numpy(out_i, dtype=dtype, device=device)
    expo = -np.log1p(-np.minimum(u, 1 - 1e-12))
    fl, fh = np.isfinite(lo), np.isfinite(hi)
    with np.errstate(invalid="ignore", over="ignore"):
        out = np.where(fl & fh, lo + u * (hi - lo), np.where(fl, lo + expo, np.where(fh, hi - expo, n)))
    out = np.clip(out, lo, hi).astype(low_np.dtype)
    out = np.clip(out, low_np, high_np)
    return rng, b.from_numpy(out, dtype=dtype, device=device)


def bounds_repr(backend: Any, a: np.ndarray, abbreviate: bool) -> str:
    """Bounds for `get_repr`: the values (one number when constant) or `<array shape>` for many varying ones."""
    shown = backend.abbreviate_array(a) if abbreviate or a.size > 8 else a.tolist()
    if isinstance(shown, np.ndarray) or not isinstance(shown, (int, float, list)):
        return f"<array {a.shape}>"
    return str(shown)


class BoxSpace(ArraySpaceMixin, Space[BArrayType, BDeviceType, BDtypeType, BRNGType]):
    """An array of `shape` and `dtype` (real floating or integer) whose elements lie in `[low, high]`.

    `low` / `high` may be scalars or arrays broadcastable to `shape`; without `shape` the shape comes from the
    broadcast bounds. Integer boxes turn infinite scalar bounds into the dtype's limits. Equality compares
    class, backend, shape, dtype and the exact bounds; device and metadata are ignored (as for every space).
    """

    def __init__(self, backend: Any, low: Any, high: Any, dtype: Any, device: Any = None,
                 shape: Optional[Sequence[int]] = None, metadata: Optional[Mapping[str, Any]] = None) -> None:
        backend = check_backend(backend)
        if dtype is None:
            raise TypeError("BoxSpace needs a dtype (a real floating or integer dtype)")
        dt = backend.as_dtype(dtype)
        if not (backend.dtype_is_real_floating(dt) or backend.dtype_is_real_integer(dt)):
            raise TypeError(f"BoxSpace dtype must be a real floating or integer type, got {dtype!r} "
                            "(use BinarySpace for booleans)")
        np_dt = backend.numpy_dtype(dt)
        is_bf16 = backend.dtype_name(dt) == "bfloat16"
        lo = _bounds_array(_bounds_to_numpy(backend, low), "low")
        hi = _bounds_array(_bounds_to_numpy(backend, high), "high")
        if shape is None:
            try:
                shp = np.broadcast_shapes(lo.shape, hi.shape)
            except ValueError:
                raise ValueError(f"BoxSpace bounds of shapes {lo.shape} and {hi.shape} do not broadcast") from None
        else:
            shp = tuple(int(d) for d in shape)
            if any(d < 0 for d in shp):
                raise ValueError(f"BoxSpace shape must be non-negative, got {shp}")
        try:
            lo_full = np.broadcast_to(lo, shp)
            hi_full = np.broadcast_to(hi, shp)
        except ValueError:
            raise ValueError(f"BoxSpace bounds of shapes {lo.shape} / {hi.shape} do not broadcast to shape {shp}") from None
        if np_dt.kind in "iu" and not is_bf16:
            low_np = _int_bounds(lo_full, np_dt, "low")
            high_np = _int_bounds(hi_full, np_dt, "high")
        else:
            with np.errstate(over="ignore"):
                low_np = np.array(lo_full, dtype=np.float32 if is_bf16 else np_dt, order="C")
                high_np = np.array(hi_full, dtype=np.float32 if is_bf16 else np_dt, order="C")
        if (low_np > high_np).any():
            raise ValueError(f"BoxSpace needs low <= high everywhere; got low={lo.tolist()} high={hi.tolist()}")
        super().__init__(backend, shape=shp, device=device, dtype=dt, metadata=metadata)
        self._low_np = np.array(low_np, order="C")
        self._high_np = np.array(high_np, order="C")
        self._low_np.flags.writeable = False
        self._high_np.flags.writeable = False

    # bounds as backend arrays, built on first use
    @property
    def low(self) -> Any:
        """The lower bounds as a backend array of the full shape (a fresh copy: the space stays immutable)."""
        return self._bound_array(self._low_np)

    @property
    def high(self) -> Any:
        """The upper bounds as a backend array of the full shape (a fresh copy)."""
        return self._bound_array(self._high_np)

    def _bound_array(self, a: np.ndarray) -> Any:
        b = self._backend
        if b.dtype_name(self._dtype) == "bfloat16":
            return b.from_numpy(a.copy(), device=self._device).to(self._dtype)
        return b.from_numpy(a.copy(), dtype=self._dtype, device=self._device)

    @property
    def low_numpy(self) -> np.ndarray:
        """The lower bounds as a read-only NumPy array of the full shape (float32 stands in for bfloat16)."""
        return self._low_np

    @property
    def high_numpy(self) -> np.ndarray:
        """The upper bounds as a read-only NumPy array of the full shape."""
        return self._high_np

    def _copy_with(self, metadata: SpaceMetadata) -> "BoxSpace":
        return BoxSpace(self._backend, self._low_np, self._high_np, self._dtype, self._device, self.shape, metadata)

    def _moved(self, backend: Any, device: Any) -> "BoxSpace":
        dt = backend.dtype_from_name(self._backend.dtype_name(self._dtype))
        return BoxSpace(backend, self._low_np, self._high_np, dt, device, self.shape, self._metadata)

    def is_bounded(self, manner: str = "both") -> bool:
        if self._low_np.dtype.kind in "iu":
            return True
        below = bool(np.isfinite(self._low_np).all())
        above = bool(np.isfinite(self._high_np).all())
        if manner == "both":
            return below and above
        if manner == "below":
            return below
        if manner == "above":
            return above
        raise ValueError(f"manner must be 'both', 'below' or 'above', got {manner!r}")

    def contains(self, x: Any) -> bool:
        """True for an array of this backend with the box's shape, a dtype that casts to the box's without loss
        (the same dtype, or e.g. bool / uint8 in float32, as the reference accepts), and values within the
        bounds. A query only: storages apply their own conversion rules when writing."""
        x = as_member_array(self._backend, x)
        if x is None or tuple(x.shape) != self.shape:
            return False
        return values_within(self._backend, x, self._dtype, self._low_np, self._high_np)

    def clip(self, x: Any) -> Any:
        return clip_within(self._backend, x, self._low_np, self._high_np, self._dtype, self._device)

    def sample(self, rng: Any) -> Tuple[Any, Any]:
        return sample_within(self._backend, rng, self._low_np, self._high_np, self._dtype, self._device)

    def create_empty(self) -> Any:
        return self._backend.from_numpy(np.zeros(self.shape, dtype=self._low_np.dtype), dtype=self._dtype,
                                        device=self._device)

    def data_to(self, data: Any, backend: Any = None, device: Any = None) -> Any:
        return array_data_to(self, data, backend, device)

    def get_repr(self, abbreviate: bool = False, include_backend: bool = True, include_device: bool = True,
                 include_dtype: bool = True) -> str:
        lo = bounds_repr(self._backend, self._low_np, abbreviate)
        hi = bounds_repr(self._backend, self._high_np, abbreviate)
        parts = [f"low={lo}", f"high={hi}", f"shape={self.shape}"]
        if include_dtype:
            parts.append(f"dtype={self._backend.dtype_name(self._dtype)}")
        return self._repr("BoxSpace", parts, include_backend, include_device)

    def is_subspaceeq(self, other: Space) -> bool:
        """True when `other` is a Box of the same backend, shape and dtype whose bounds enclose this one's."""
        return (isinstance(other, BoxSpace) and other.backend is self._backend and other.shape == self.shape
                and other.dtype == self._dtype and bool(np.all(other.low_numpy <= self._low_np))
                and bool(np.all(other.high_numpy >= self._high_np)))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, BoxSpace) or type(other) is not type(self):
            return False
        return (other.backend is self._backend and other.shape == self.shape and other.dtype == self._dtype
                and np.array_equal(other.low_numpy, self._low_np) and np.array_equal(other.high_numpy, self._high_np))

    __hash__ = None  # type: ignore[assignment]
