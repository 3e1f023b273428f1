"""`RescaleTransformation`: the affine map of a bounded Box onto new bounds."""
from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Tuple

import numpy as np

from unienv_interface.errors import BoundsWarning
from unienv_interface.space import BoxSpace, Space
from unienv_interface.space.dtype_facts import dtype_kind, int_range
from unienv_interface.warn import warn_user

from ._arrays import (ReportsInputBounds, _first_false, all_true, coerce, dtype_name, inside_mask, param_dtype,
                      param_from_json, param_payload, params_array, params_to_json, per_space, require_box, typed_param)
from .serialization_utils import check_param_names
from .transformation import DataTransformation

_WHO = "RescaleTransformation"


def _dtype_name(dtype: Any) -> Optional[str]:
    """The name of a real integer or float `new_dtype` (None stays None)."""
    if dtype is None:
        return None
    if isinstance(dtype, str):
        name = dtype.replace("torch.", "")
    else:
        from unienv_interface.backends.serialization import serialize_dtype
        try:
            name = serialize_dtype(dtype)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{_WHO}: unsupported new_dtype {dtype!r} ({exc})") from None
    if dtype_kind(name) not in "iuf":
        raise ValueError(f"{_WHO}: new_dtype must be a real integer or floating dtype, got {name!r}")
    return name


def _coef(backend: Any, arr: np.ndarray, device: Any) -> Any:
    """A Python float when `arr` is constant, else a float64 backend array."""
    flat = arr.reshape(-1)
    if flat.size and np.all(flat == flat[0]):
        return float(flat[0])
    return backend.from_numpy(np.ascontiguousarray(arr), dtype=backend.dtype_from_name("float64"), device=device)


class RescaleTransformation(ReportsInputBounds, DataTransformation):
    """Maps a bounded Box with bounds `[low, high]` affinely onto `[new_low, new_high]`, element-wise:
    `y = x * a + b` with `a = (new_high - new_low) / (high - low)` and `b = new_low - low * a`, computed in float64.
    An element whose source bounds are equal (`low == high`) maps to `new_low`.

    * `new_low` / `new_high`: finite numbers or arrays broadcastable (right-aligned) to the space's shape, with
      `new_low <= new_high` everywhere.
    * `new_dtype`: the target dtype. By default a float source keeps its dtype and an integer source gets the
      backend's default float dtype; array bounds take part in the promotion as in the reference (a float64 NumPy
      `new_low` makes a float32 source's target float64). An integer `new_dtype` rounds the result half to even, and
      the target bounds become the integers inside `[new_low, new_high]`.
    * `nan_to`: a number or array (broadcastable like the bounds) that replaces NaN in the result (rounded half to
      even for an integer `new_dtype`, where it must lie in the dtype's range). A `nan_to` outside the target bounds
      is used all the same, with a `BoundsWarning` when the target space is first computed for a source space.
    * The source must be a real integer or float Box with finite bounds.
    * `transform` checks its input's shape and dtype. A value inside the source bounds maps inside the target bounds
      (float64 rounding near a bound is clamped to it; the result is rounded once to the target dtype). A value
      outside them, or NaN without `nan_to`, is mapped as the reference maps it, with one `BoundsWarning` per
      instance (see `ReportsInputBounds`): the linear map extrapolates (the result lies outside the target bounds)
      and NaN stays NaN. For an integer `new_dtype` the dtype rules stay strict: a result that rounds outside the
      dtype's range, or NaN, is ValueError (the reference's cast wraps it around or makes up a value).
    * The inverse (`direct_inverse(source_space)`, which needs the source space for its bounds) maps the target
      space back onto exactly the source space (an integer source gets an integer `new_dtype`, so values are rounded
      back), extrapolating too, without warning (see `ReportsInputBounds`). A round trip is exact when the
      arithmetic is (scales that are powers of two with zero offsets, e.g. `[-1, 1] -> [-2, 2]`); otherwise it is
      within a rounding of the value. Note that zero maps to `b`, so a storage's never-written rows read back as the
      inverse image of zero.
    """

    has_inverse = True

    def __init__(self, new_low: Any = -1.0, new_high: Any = 1.0, new_dtype: Any = None, nan_to: Any = None) -> None:
        self.new_low = params_array(new_low, "new_low")
        self.new_high = params_array(new_high, "new_high")
        try:
            np.broadcast_shapes(self.new_low.shape, self.new_high.shape)
        except ValueError:
            raise ValueError(f"new_low of shape {self.new_low.shape} and new_high of shape {self.new_high.shape} do "
                             "not broadcast together") from None
        if np.any(self.new_low > self.new_high):
            raise ValueError(f"{_WHO} needs new_low <= new_high everywhere, got new_low={params_to_json(self.new_low)} "
                             f"new_high={params_to_json(self.new_high)}")
        self.new_dtype = _dtype_name(new_dtype)
        self.nan_to: Optional[np.ndarray] = None if nan_to is None else params_array(nan_to, "nan_to")
        #: dtype names of the bounds given as arrays (None for numbers and lists), for the target dtype and JSON
        self.bound_dtypes: Tuple[Optional[str], Optional[str]] = (param_dtype(new_low), param_dtype(new_high))
        self._cache: Dict[int, Tuple[Any, Any]] = {}

    # ------------------------------------------------------------------ spaces
    def _check_source(self, source_space: Space) -> BoxSpace:
        sp = require_box(source_space, _WHO)
        name = dtype_name(sp.backend, sp.dtype)
        if dtype_kind(name) not in "iuf":
            raise TypeError(f"{_WHO} needs a real integer or floating-point source Box, got {name}")
        lo, hi = sp.low_numpy.astype(np.float64), sp.high_numpy.astype(np.float64)
        if not (np.all(np.isfinite(lo)) and np.all(np.isfinite(hi))):
            raise ValueError(f"{_WHO} needs finite source bounds, got {sp!r}")
        return sp

    def _target_dtype(self, sp: BoxSpace) -> Any:
        b = sp.backend
        if self.new_dtype is not None:
            return b.dtype_from_name(self.new_dtype)
        dt = b.promote_types(sp.dtype, *(b.dtype_from_name(d) for d in self.bound_dtypes if d is not None))
        return dt if b.dtype_is_real_floating(dt) else b.default_floating_dtype

    def get_target_space_from_source(self, source_space: Space) -> BoxSpace:
        return per_space(self._cache, source_space, self._plan)[0]  # type: ignore[no-any-return]

    def _plan(self, source_space: Space) -> Tuple[Any, ...]:
        """`(target space, a, b, map low, map high, nan_to, integer bounds or None)` for a source space (the
        constants as Python floats or float64 backend arrays); ValueError / TypeError when the map does not apply."""
        sp = self._check_source(source_space)
        b = sp.backend
        shape = tuple(sp.shape)
        try:
            nl = np.broadcast_to(self.new_low, shape)
            nh = np.broadcast_to(self.new_high, shape)
        except ValueError:
            raise ValueError(f"new bounds of shapes {self.new_low.shape} / {self.new_high.shape} do not broadcast to "
                             f"the space's shape {shape}") from None
        dt = self._target_dtype(sp)
        to_int = b.dtype_is_real_integer(dt)
        if to_int:
            tname = dtype_name(b, dt)
            dlo, dhi = int_range(tname)
            tl, th = np.ceil(nl), np.floor(nh)
            if np.any(tl > th) or np.any(tl < dlo) or np.any(th > dhi):
                raise ValueError(f"{_WHO}: the new bounds [{params_to_json(self.new_low)}, "
                                 f"{params_to_json(self.new_high)}] hold no {tname} value everywhere, or exceed the "
                                 f"range of {tname} [{dlo}, {dhi}]")
            target: BoxSpace[Any, Any, Any, Any] = BoxSpace(b, tl, th, dt, device=sp.device, shape=shape,
                                                            metadata=sp.metadata)
            ml, mh = nl, nh            # map onto the given bounds, then round into the integer ones
        else:
            target = BoxSpace(b, nl, nh, dt, device=sp.device, shape=shape, metadata=sp.metadata)
            if np.any((target.low_numpy >= target.high_numpy) & (nl < nh)):
                raise ValueError(f"the new bounds collapse when stored as {dtype_name(b, dt)} (new_low == new_high "
                                 "somewhere they differ): the map would not be invertible")
            ml, mh = target.low_numpy.astype(np.float64), target.high_numpy.astype(np.float64)
        lo, hi = sp.low_numpy.astype(np.float64), sp.high_numpy.astype(np.float64)
        with np.errstate(over="ignore", under="ignore", invalid="ignore", divide="ignore"):
            span, new_span = hi - lo, mh - ml
            flat = span == 0
            scale = np.where(flat, 0.0, new_span / np.where(flat, 1.0, span))
            back = np.where(flat | (new_span == 0), 0.0, span / np.where(new_span == 0, 1.0, new_span))
            offset = ml - lo * scale
        moving = ~flat & (new_span > 0)
        if not (np.all(np.isfinite(span)) and np.all(np.isfinite(new_span)) and np.all(np.isfinite(scale))
                and np.all(scale[moving] > 0) and np.all(np.isfinite(back)) and np.all(np.isfinite(offset))):
            raise ValueError(f"{_WHO}: mapping {sp!r} onto [{self.new_low}, {self.new_high}] needs a scale or offset "
                             "beyond float64 (the spans differ by more than ~1e308, or one overflows): values would "
                             "be lost; choose closer bounds")
        nan_to = None
        if self.nan_to is not None:
            try:
                fill = np.broadcast_to(self.nan_to, shape)
            except ValueError:
                raise ValueError(f"nan_to of shape {self.nan_to.shape} does not broadcast to the space's shape "
                                 f"{shape}") from None
            if to_int:
                fill = np.round(fill)
                dlo, dhi = int_range(dtype_name(b, dt))
                if np.any(fill < dlo) or np.any(fill > dhi):
                    raise ValueError(f"{_WHO}: nan_to={params_to_json(self.nan_to)} rounds outside the range of "
                                     f"{dtype_name(b, dt)} [{dlo}, {dhi}]")
            if np.any(fill < target.low_numpy) or np.any(fill > target.high_numpy):
                warn_user(f"{_WHO}: nan_to={params_to_json(self.nan_to)} lies outside the target bounds "
                          f"[{params_to_json(self.new_low)}, {params_to_json(self.new_high)}]: NaN inputs become "
                          "values outside the target space", BoundsWarning)
            nan_to = _coef(b, np.asarray(fill, np.float64), sp.device)
        dev = sp.device
        ints = None
        if to_int:   # the rounded result is clamped into the integer bounds
            ints = (_coef(b, target.low_numpy.astype(np.float64), dev),
                    _coef(b, target.high_numpy.astype(np.float64), dev))
        return (target, _coef(b, scale, dev), _coef(b, offset, dev), _coef(b, ml, dev), _coef(b, mh, dev), nan_to,
                ints)

    # ------------------------------------------------------------------ data
    def transform(self, source_space: Space, data: Any) -> Any:
        target, a, off, nl, nh, nan_to, ints = per_space(self._cache, source_space, self._plan)
        sp = require_box(source_space, _WHO)
        b = sp.backend
        x = coerce(sp, data, _WHO)
        ok = inside_mask(sp, x, allow_nan=nan_to is not None)      # None: every value inside (the usual case)
        il, ih = ints if ints is not None else (None, None)
        consts = (a, off, nl, nh, nan_to, il, ih)
        if any(c is not None and not isinstance(c, float) for c in consts):
            dev = b.device(x)
            a, off, nl, nh, nan_to, il, ih = (c if c is None or isinstance(c, float) else b.to_device(c, dev)
                                              for c in consts)
        y = b.astype(x, b.dtype_from_name("float64")) * a + off
        # values inside the source bounds are clamped into the target bounds (float64 rounding); others extrapolate
        y = b.clip(y, nl, nh) if ok is None else b.where(ok, b.clip(y, nl, nh), y)
        if ints is not None:
            y = b.round(y)
            y = b.clip(y, il, ih) if ok is None else b.where(ok, b.clip(y, il, ih), y)
        if nan_to is not None:
            y = b.where(b.isnan(y), nan_to, y)
        if ints is not None and ok is not None:
            self._check_int_range(b, x, y, dtype_name(b, target.dtype))
        self._report_outside(sp, x, ok, _WHO, "it is mapped by the same linear map (extrapolated; NaN stays NaN)")
        return b.astype(y, target.dtype)

    @staticmethod
    def _check_int_range(b: Any, x: Any, y: Any, name: str) -> None:
        """ValueError naming the first input whose (rounded, float64) image `y` is NaN or outside `name`'s range."""
        dlo, dhi = int_range(name)
        fits = b.logical_and(y >= float(dlo), y < float(dhi) + 1.0)   # both limits are powers of two in float64
        if not all_true(b, fits):
            pos, val = _first_false(b, x, fits)
            raise ValueError(f"{_WHO}: value {val!r} at position {pos} maps to {y[pos].item()!r}, which {name} cannot "
                             f"hold (its range is [{dlo}, {dhi}]; NaN has no integer value)")

    def direct_inverse(self, source_space: Optional[Space] = None) -> "RescaleTransformation":
        if source_space is None:
            raise ValueError(f"{_WHO}.direct_inverse needs the source space: its bounds are the inverse's new bounds")
        sp = self._check_source(source_space)
        self.get_target_space_from_source(sp)
        inverse = RescaleTransformation(new_low=sp.low_numpy, new_high=sp.high_numpy,
                                        new_dtype=dtype_name(sp.backend, sp.dtype))
        inverse.silence_bounds_warnings()
        return inverse

    # ------------------------------------------------------------------ JSON and pickling
    def to_json(self) -> Dict[str, Any]:
        """The reference's form: each bound (and `nan_to`) as `{"scalar": true, "value": x, "backend": null}` or, for
        an array, `{"scalar": false, "value": [...], "backend": "numpy", "dtype": name}`; `new_dtype` when set."""
        out: Dict[str, Any] = {"new_low": param_payload(self.new_low, self.bound_dtypes[0]),
                               "new_high": param_payload(self.new_high, self.bound_dtypes[1]),
                               "nan_to": param_payload(self.nan_to, None if self.nan_to is None or
                                                       self.nan_to.ndim == 0 else "float64")}
        if self.new_dtype is not None:
            out["new_dtype"] = self.new_dtype
        return out

    @classmethod
    def from_json(cls, params: Mapping[str, Any]) -> "RescaleTransformation":
        """Reads `to_json` output, the reference's, or this project's earlier form (plain numbers and lists)."""
        check_param_names(params, ("new_low", "new_high", "new_dtype", "nan_to"), ("new_low", "new_high"),
                          cls.__name__)
        new_dtype = params.get("new_dtype")
        if new_dtype is not None and not isinstance(new_dtype, str):
            raise TypeError(f"new_dtype must be a dtype name or null, got {new_dtype!r}")
        return cls(param_from_json(params["new_low"], "new_low"), param_from_json(params["new_high"], "new_high"),
                   new_dtype, param_from_json(params.get("nan_to"), "nan_to"))

    def __getstate__(self) -> Dict[str, Any]:
        return {"new_low": typed_param(self.new_low, self.bound_dtypes[0]),
                "new_high": typed_param(self.new_high, self.bound_dtypes[1]), "new_dtype": self.new_dtype,
                "nan_to": self.nan_to, **self._bounds_state()}

    def __setstate__(self, state: Dict[str, Any]) -> None:
        RescaleTransformation.__init__(self, state["new_low"], state["new_high"], state["new_dtype"],
                                       state.get("nan_to"))
        self._restore_bounds_state(state)


__all__ = ["RescaleTransformation"]
