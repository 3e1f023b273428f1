"""Array helpers shared by the built-in transformations: checked input conversion, bounds reports, dtype facts.

Input rules (the same as the storages'): the value may be an array of the space's backend, a NumPy array, another
library's array, a Python number or a (nested) list. Its shape must equal the space's shape, optionally behind
extra leading batch axes. A different dtype is accepted when the cast is lossless, when it narrows a float without
overflowing, or when every value survives the cast unchanged; anything else is ValueError naming the first value.
A value outside the source Box's bounds is not refused: it is mapped as the reference maps it, with one warning per
transformation (`ReportsInputBounds`). Computation uses the backend's Array-API namespace, so arrays stay on their device.
"""
from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Tuple

import numpy as np

from unienv_interface.errors import BoundsWarning
from unienv_interface.space import BinarySpace, BoxSpace, Space
from unienv_interface.space.dtype_facts import dtype_kind, int_range, is_lossless
from unienv_interface.warn import warn_user

def dtype_name(backend: Any, dtype: Any) -> str:
    return str(backend.dtype_name(dtype))


def _describe(value: Any) -> str:
    shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
    if shape is not None:
        return f"{type(value).__name__} of shape {tuple(shape)} and dtype {dtype}"
    return f"{type(value).__name__} {value!r}"[:120]


def as_backend_array(space: Space, data: Any, who: str) -> Any:
    """`data` as an array of the space's backend (no copy where the libraries allow it)."""
    b = space.backend
    if b.is_backendarray(data):
        return data
    if isinstance(data, (np.ndarray, np.generic)):
        arr = np.asarray(data)
        if arr.dtype.kind not in "biuf":
            raise TypeError(f"{who}: expected numbers, got {_describe(data)}")
        return b.from_numpy(arr)
    if isinstance(data, (bool, int, float, list, tuple)):
        try:
            arr = np.asarray(data)
        except (ValueError, TypeError):
            raise TypeError(f"{who}: expected an array, got a ragged {type(data).__name__}") from None
        if arr.dtype.kind not in "biuf":
            raise TypeError(f"{who}: expected numbers, got {_describe(data)}")
        return b.from_numpy(arr)
    if type(data).__module__.split(".")[0] in ("torch", "jax", "jaxlib"):
        from unienv_interface.backends import get_backend_from_tensor
        return b.from_other_backend(get_backend_from_tensor(data), data)
    shape = getattr(space, "shape", None)
    raise TypeError(f"{who}: expected an array of shape {shape} and dtype {dtype_name(b, space.dtype)}, "
                    f"got {_describe(data)}")


def check_shape(space: Space, arr: Any, who: str) -> None:
    """ValueError unless `arr` has the space's shape, optionally behind extra leading (batch) axes. Size-1 axes of
    the space (a space batched to size 1) also match any batch size."""
    got = tuple(int(d) for d in arr.shape)
    want = tuple(space.shape or ())
    try:
        ok = np.broadcast_shapes(got, want) == got
    except ValueError:
        ok = False
    if not ok or len(got) < len(want):
        raise ValueError(f"{who}: expected shape {want} (optionally with leading batch axes), got {got}")


def _first_false(backend: Any, arr: Any, ok: Any) -> Tuple[Tuple[int, ...], Any]:
    """Position and value of the first element of `arr` where the boolean array `ok` is False."""
    mask = np.asarray(backend.to_numpy(ok))
    mask = np.broadcast_to(mask, tuple(arr.shape))
    flat = int(np.flatnonzero(~mask.reshape(-1))[0])
    pos = tuple(int(p) for p in np.unravel_index(flat, mask.shape))
    return pos, arr[pos].item()


def all_true(backend: Any, ok: Any) -> bool:
    return bool(backend.all(ok))


def cast_checked(backend: Any, arr: Any, dst_dtype: Any, who: str) -> Any:
    """`arr` cast to `dst_dtype` of `backend` under the module's dtype rules (ValueError / TypeError otherwise)."""
    if arr.dtype == dst_dtype:
        return arr
    try:
        src = dtype_name(backend, arr.dtype)
    except ValueError:
        raise TypeError(f"{who}: unsupported dtype {arr.dtype}") from None
    dst = dtype_name(backend, dst_dtype)
    if dtype_kind(src) == "c":
        raise TypeError(f"{who}: expected dtype {dst}, got {src}")
    if is_lossless(src, dst):
        return backend.astype(arr, dst_dtype)
    with np.errstate(all="ignore"):
        out = backend.astype(arr, dst_dtype)
        if dtype_kind(src) == "f" and dtype_kind(dst) == "f":
            ok = backend.logical_or(backend.isfinite(out), backend.logical_not(backend.isfinite(arr)))
            if not all_true(backend, ok):
                pos, val = _first_false(backend, arr, ok)
                raise ValueError(f"{who}: value {val!r} at position {pos} overflows {dst}")
            return out
        ok = backend.astype(out, arr.dtype) == arr
    if not all_true(backend, ok):
        pos, val = _first_false(backend, arr, ok)
        raise ValueError(f"{who}: value {val!r} at position {pos} of dtype {src} cannot be stored as {dst} without "
                         "changing it (fractional, NaN or out of range); convert it explicitly")
    return out


def coerce(space: Space, data: Any, who: str) -> Any:
    """`data` as a backend array of the space's dtype and shape (optionally batched), checked but not bounds-checked."""
    arr = as_backend_array(space, data, who)
    check_shape(space, arr, who)
    return cast_checked(space.backend, arr, space.dtype, who)


# ---------------------------------------------------------------------------------------------------- bounds
_BOUNDS: Dict[int, Tuple[Space, Any, Any]] = {}
_BOUNDS_MAX = 64


def _constant(a: np.ndarray) -> Optional[Any]:
    if a.size and np.all(a == a.reshape(-1)[0]):
        return a.reshape(-1)[0].item()
    return None


def box_bounds(space: BoxSpace) -> Tuple[Any, Any]:
    """The bounds as Python numbers (when constant) or backend arrays of the space's dtype; `(None, None)` when the
    box is unbounded (a float box with infinite bounds, an int box at its dtype's limits)."""
    hit = _BOUNDS.get(id(space))
    if hit is not None and hit[0] is space:
        return hit[1], hit[2]
    lo_np, hi_np = space.low_numpy, space.high_numpy
    b = space.backend
    if lo_np.dtype.kind == "f":
        unbounded = bool(np.all(np.isneginf(lo_np)) and np.all(np.isposinf(hi_np)))
    else:
        dlo, dhi = int_range(dtype_name(b, space.dtype))
        unbounded = bool(np.all(lo_np == dlo) and np.all(hi_np == dhi))
    lo: Any = None
    hi: Any = None
    if not unbounded:
        lo, hi = _constant(lo_np), _constant(hi_np)
        if lo is None or hi is None:
            lo, hi = space.low, space.high
    if len(_BOUNDS) >= _BOUNDS_MAX:
        _BOUNDS.pop(next(iter(_BOUNDS)))
    _BOUNDS[id(space)] = (space, lo, hi)
    return lo, hi


def inside_mask(space: BoxSpace, arr: Any, allow_nan: bool = False) -> Optional[Any]:
    """None when every value of `arr` lies in the space's `[low, high]` (or the box is unbounded), else the boolean
    backend array that is True where a value does. NaN never lies inside a bounded box, unless `allow_nan` (for a
    transformation that replaces it)."""
    lo, hi = box_bounds(space)
    if lo is None:
        return None
    b = space.backend
    if not isinstance(lo, (int, float)):
        dev = b.device(arr)
        lo, hi = b.to_device(lo, dev), b.to_device(hi, dev)
    ok = b.logical_and(arr >= lo, arr <= hi)
    if allow_nan and b.dtype_is_real_floating(arr.dtype):
        ok = b.logical_or(ok, b.isnan(arr))
    return None if all_true(b, ok) else ok


class ReportsInputBounds:
    """For the transformations that map a Box: a value outside the source space's bounds (NaN included) is mapped
    as the reference maps it, with one `BoundsWarning` per transformation instance naming the transformation, the
    first such value's position, the value and the bounds, attributed to the user's line that led to it.
    `warnings.simplefilter("error", BoundsWarning)` turns it into a refusal (raised by `transform`, which then
    returns nothing; the warning is issued again on the next such input). An inverse built by `direct_inverse` starts
    silenced: it maps the forward map's outputs back, and an input outside the bounds was reported where it was
    mapped (a storage reading back a value it stored must not warn, let alone fail)."""

    _bounds_quiet: bool = False

    def silence_bounds_warnings(self) -> "ReportsInputBounds":
        """Stops reporting inputs outside the source bounds (they are still mapped the same way); returns self."""
        self._bounds_quiet = True
        return self

    @property
    def reports_bounds(self) -> bool:
        """False once a `BoundsWarning` was issued or after `silence_bounds_warnings`."""
        return not self._bounds_quiet

    def _bounds_state(self) -> Dict[str, Any]:
        """The pickled form of the reporting state (merged into a subclass's `__getstate__`)."""
        return {"reports_bounds": self.reports_bounds}

    def _restore_bounds_state(self, state: Mapping[str, Any]) -> None:
        """Restores `_bounds_state` (absent in earlier pickles: reporting)."""
        if not state.get("reports_bounds", True):
            self.silence_bounds_warnings()

    def _report_outside(self, space: BoxSpace, arr: Any, ok: Optional[Any], who: str, how: str) -> None:
        """Warns (once per instance) about the first value of `arr` where `ok` is False; `how` says what the
        transformation did with it. Nothing when `ok` is None (every value inside)."""
        if ok is None or self._bounds_quiet:
            return
        pos, val = _first_false(space.backend, arr, ok)
        shape = tuple(space.shape)
        lo_full = np.broadcast_to(space.low_numpy, shape)
        hi_full = np.broadcast_to(space.high_numpy, shape)
        inner = pos[len(pos) - len(shape):] if shape else ()
        inner = tuple(0 if s == 1 else p for p, s in zip(inner, shape))
        warn_user(f"{who}: value {val!r} at position {pos} is outside the source space bounds "
                  f"[{lo_full[inner].item()!r}, {hi_full[inner].item()!r}]; {how} (further values outside the bounds "
                  "are not reported by this transformation)", BoundsWarning)
        self._bounds_quiet = True     # only once the warning did not raise: an "error" filter refuses every time

    def _check_inside(self, space: BoxSpace, arr: Any, who: str, how: str) -> None:
        """`_report_outside` for `arr`'s values (nothing is computed once the warning was issued)."""
        if not self._bounds_quiet:
            self._report_outside(space, arr, inside_mask(space, arr), who, how)


def require_box(space: Any, who: str) -> BoxSpace:
    if isinstance(space, BinarySpace) or not isinstance(space, BoxSpace):
        raise TypeError(f"{who} applies to BoxSpace only, got {type(space).__name__}")
    return space


def _foreign_to_numpy(value: Any) -> Any:
    """A torch / JAX array as a NumPy array; anything else unchanged."""
    if type(value).__module__.split(".")[0] in ("torch", "jax", "jaxlib"):
        from unienv_interface.backends import get_backend_from_tensor
        return get_backend_from_tensor(value).to_numpy(value)
    return value


def param_dtype(value: Any) -> Optional[str]:
    """The dtype name of an array parameter (NumPy, torch or JAX array; 0-d arrays included), None for a Python
    number or a list: what `RescaleTransformation` promotes the source dtype with, as the reference does."""
    dtype = getattr(value, "dtype", None)
    if dtype is None or isinstance(value, np.generic):
        return None
    from unienv_interface.backends.serialization import serialize_dtype
    try:
        return serialize_dtype(dtype)
    except (TypeError, ValueError):
        return None


def params_array(value: Any, what: str, allow_inf: bool = False) -> np.ndarray:
    """A float64 parameter array (scalar, nested list, NumPy or backend array), finite unless `allow_inf` (NaN is
    always refused); axes along which it is constant are collapsed to size 1 (the rank, and so the broadcasting,
    is kept)."""
    value = _foreign_to_numpy(value)
    if isinstance(value, (bool, np.bool_)) or getattr(value, "dtype", None) == np.bool_:
        raise TypeError(f"{what} must be a number or an array of numbers, got {value!r}")
    try:
        arr = np.array(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise TypeError(f"{what} must be a number or an array of numbers, got {str(value)[:80]}") from None
    if np.any(np.isnan(arr)) or not (allow_inf or np.all(np.isfinite(arr))):
        raise ValueError(f"{what} must be {'a number (not NaN)' if allow_inf else 'finite'}, got {arr.tolist()}")
    for axis in range(arr.ndim):
        if arr.shape[axis] > 1:
            first = np.take(arr, [0], axis=axis)
            if np.array_equal(arr, np.broadcast_to(first, arr.shape)):
                arr = first
    return arr if arr.ndim == 0 else np.ascontiguousarray(arr)   # (ascontiguousarray makes a 0-d array 1-d)


def params_to_json(arr: np.ndarray) -> Any:
    return arr.item() if arr.ndim == 0 else arr.tolist()


#: the keys of the reference's JSON payload for a number or an array parameter
_PAYLOAD_KEYS = ("scalar", "value", "backend", "dtype")


def param_payload(arr: Optional[np.ndarray], dtype: Optional[str]) -> Optional[Dict[str, Any]]:
    """A parameter in the reference's JSON form: `{"scalar": true, "value": x, "backend": null}` for a number,
    `{"scalar": false, "value": [...], "backend": "numpy", "dtype": dtype}` for an array (`dtype` None: given as a
    list, promoted like a Python number); None stays None."""
    if arr is None:
        return None
    if dtype is None and arr.ndim == 0:
        return {"scalar": True, "value": arr.item(), "backend": None}
    return {"scalar": False, "value": arr.tolist(), "backend": "numpy", "dtype": dtype}


def typed_param(values: Any, dtype: Optional[str]) -> Any:
    """A parameter as given: a NumPy array of `dtype` (a dtype NumPy lacks, bfloat16, becomes float32), or for
    `dtype` None a Python number / nested list (promoted like a Python number)."""
    if dtype is None:
        return values.tolist() if isinstance(values, np.ndarray) else values
    try:
        np_dtype = np.dtype(dtype)
    except TypeError:
        np_dtype = np.dtype(np.float32)
    return np.array(values, dtype=np_dtype)


def param_from_json(value: Any, what: str) -> Any:
    """A parameter read from JSON (see `typed_param` for what comes back): the reference's payload (see
    `param_payload`; its backend name is checked, never imported) or a plain number / nested list (this project's
    earlier form)."""
    if not isinstance(value, Mapping):
        return value
    unknown = sorted(set(value) - set(_PAYLOAD_KEYS))
    if unknown or "value" not in value:
        raise ValueError(f"{what}: expected a number, a list or an object with keys {list(_PAYLOAD_KEYS)} (and "
                         f"'value'), got keys {sorted(value)}")
    backend, dtype = value.get("backend"), value.get("dtype")
    if backend is not None and backend not in ("numpy", "pytorch", "jax"):
        raise ValueError(f"{what}: unknown backend {backend!r}; expected 'numpy', 'pytorch', 'jax' or null")
    if value.get("scalar", False):
        v = value["value"]
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise TypeError(f"{what}: a scalar payload holds a number, got {v!r}")
        return v
    if dtype is None:
        return value["value"]
    name = dtype.replace("torch.", "") if isinstance(dtype, str) else ""
    if dtype_kind(name) not in "iuf":
        raise ValueError(f"{what}: an array payload's dtype must name a real integer or float dtype, got {dtype!r}")
    try:
        return typed_param(value["value"], name)
    except (TypeError, ValueError, OverflowError):
        raise TypeError(f"{what}: an array payload holds numbers, got {str(value['value'])[:80]}") from None


def per_space(cache: Dict[int, Tuple[Any, Any]], space: Any, build: Any, size: int = 16) -> Any:
    """`build(space)`, remembered in `cache` for the last `size` spaces (by identity: spaces are immutable)."""
    hit = cache.get(id(space))
    if hit is not None and hit[0] is space:
        return hit[1]
    value = build(space)
    if len(cache) >= size:
        cache.pop(next(iter(cache)))
    cache[id(space)] = (space, value)
    return value


def prefixed(exc: Exception, prefix: str) -> Exception:
    """An exception of the same kind as `exc` whose message starts with `prefix` (for errors of nested members)."""
    msg = f"{prefix}: {exc.args[0] if len(exc.args) == 1 else exc}"
    try:
        return type(exc)(msg)
    except Exception:  # noqa: BLE001 - exception types with other constructors
        return (TypeError if isinstance(exc, TypeError) else ValueError)(msg)
