"""`RescaleTransformation`: the affine map of a bounded float Box onto new bounds."""
from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Tuple

import numpy as np

from unienv_interface.space import BoxSpace, Space
from unienv_interface.space.dtype_facts import dtype_kind

from ._arrays import check_bounds, coerce, dtype_name, params_array, params_to_json, require_box
from .serialization_utils import check_param_names
from .transformation import DataTransformation

_WHO = "RescaleTransformation"


def _float_dtype_name(dtype: Any) -> Optional[str]:
    if dtype is None:
        return None
    if isinstance(dtype, str):
        name = dtype.replace("torch.", "")
    else:
        from unienv_interface.backends.serialization import serialize_dtype
        name = serialize_dtype(dtype)
    if dtype_kind(name) != "f":
        raise ValueError(f"{_WHO} produces floating-point values, so new_dtype must be a float dtype, got {name!r}; "
                         "for integer storage chain a DtypeTransformation (with the rounding you want) after it")
    return name


def _coef(backend: Any, arr: np.ndarray, device: Any) -> Any:
    """A Python float when `arr` is constant, else a float64 backend array."""
    flat = arr.reshape(-1)
    if flat.size and np.all(flat == flat[0]):
        return float(flat[0])
    return backend.from_numpy(np.ascontiguousarray(arr), dtype=backend.dtype_from_name("float64"), device=device)


class RescaleTransformation(DataTransformation):
    """Maps a bounded floating-point Box with bounds `[low, high]` affinely onto `[new_low, new_high]`, element-wise:
    `y = x * a + b` with `a = (new_high - new_low) / (high - low)` and `b = new_low - low * a`, computed in float64.

    * `new_low` / `new_high`: finite numbers or arrays broadcastable (right-aligned) to the space's shape, with
      `new_low < new_high` everywhere. `new_dtype`: the target float dtype (default: the source dtype). Integer
      targets are refused: chain a `DtypeTransformation` with an explicit rounding mode instead.
    * The source must be a float Box with finite bounds and `low < high` everywhere.
    * `transform` checks its input (shape, dtype, bounds; NaN is out of bounds) and never produces a value outside
      the target bounds (float64 rounding near a bound is clamped to it; the result is rounded once to the target
      dtype).
    * The inverse (`direct_inverse(source_space)`, which needs the source space for its bounds) maps the target
      space back onto exactly the source space. A round trip is exact when the arithmetic is (scales that are
      powers of two with zero offsets, e.g. `[-1, 1] -> [-2, 2]`); otherwise it is within a rounding of the value.
      Note that zero maps to `b`, so a storage's never-written rows read back as the inverse image of zero.
    """

    has_inverse = True

    def __init__(self, new_low: Any = -1.0, new_high: Any = 1.0, new_dtype: Any = None) -> None:
        self.new_low = params_array(new_low, "new_low")
        self.new_high = params_array(new_high, "new_high")
        try:
            np.broadcast_shapes(self.new_low.shape, self.new_high.shape)
        except ValueError:
            raise ValueError(f"new_low of shape {self.new_low.shape} and new_high of shape {self.new_high.shape} do not "
                             "broadcast together") from None
        if np.any(self.new_low >= self.new_high):
            raise ValueError(f"{_WHO} needs new_low < new_high everywhere, got new_low={params_to_json(self.new_low)} "
                             f"new_high={params_to_json(self.new_high)}")
        self.new_dtype = _float_dtype_name(new_dtype)
        self._cache: Dict[int, Tuple[Space, Tuple[Any, ...]]] = {}

    # ------------------------------------------------------------------ spaces
    def _check_source(self, source_space: Space) -> BoxSpace:
        sp = require_box(source_space, _WHO)
        name = dtype_name(sp.backend, sp.dtype)
        if dtype_kind(name) != "f":
            raise TypeError(f"{_WHO} needs a floating-point source Box, got {name}; convert integers with a "
                            "DtypeTransformation first (in a ChainedTransformation)")
        lo, hi = sp.low_numpy.astype(np.float64), sp.high_numpy.astype(np.float64)
        if not (np.all(np.isfinite(lo)) and np.all(np.isfinite(hi))):
            raise ValueError(f"{_WHO} needs finite source bounds, got {sp!r}")
        if np.any(hi <= lo):
            raise ValueError(f"{_WHO} needs source bounds with low < high everywhere (a constant element cannot be "
                             f"rescaled invertibly), got {sp!r}")
        return sp

    def get_target_space_from_source(self, source_space: Space) -> BoxSpace:
        sp = self._check_source(source_space)
        b = sp.backend
        shape = tuple(sp.shape)
        try:
            nl = np.broadcast_to(self.new_low, shape)
            nh = np.broadcast_to(self.new_high, shape)
        except ValueError:
            raise ValueError(f"new bounds of shapes {self.new_low.shape} / {self.new_high.shape} do not broadcast to "
                             f"the space's shape {shape}") from None
        dt = sp.dtype if self.new_dtype is None else b.dtype_from_name(self.new_dtype)
        target: BoxSpace[Any, Any, Any, Any] = BoxSpace(b, nl, nh, dt, device=sp.device, shape=shape, metadata=sp.metadata)
        if np.any(target.low_numpy >= target.high_numpy):
            raise ValueError(f"the new bounds collapse when stored as {dtype_name(b, dt)} (new_low == new_high "
                             "somewhere): the map would not be invertible")
        lo, hi = sp.low_numpy.astype(np.float64), sp.high_numpy.astype(np.float64)
        tl, th = target.low_numpy.astype(np.float64), target.high_numpy.astype(np.float64)
        with np.errstate(over="ignore", under="ignore", invalid="ignore", divide="ignore"):
            span, new_span = hi - lo, th - tl
            scale, back = new_span / span, span / new_span
            offset = tl - lo * scale
        if not (np.all(np.isfinite(span)) and np.all(np.isfinite(new_span)) and np.all(np.isfinite(scale))
                and np.all(scale > 0) and np.all(np.isfinite(back)) and np.all(np.isfinite(offset))):
            raise ValueError(f"{_WHO}: mapping {sp!r} onto [{self.new_low}, {self.new_high}] needs a scale or offset "
                             "beyond float64 (the spans differ by more than ~1e308, or one overflows): values would "
                             "be lost; choose closer bounds")
        return target

    def _coefficients(self, sp: Space) -> Tuple[Any, ...]:
        """`(target space, a, b, target low, target high)`, cached for the last few source spaces."""
        hit = self._cache.get(id(sp))
        if hit is not None and hit[0] is sp:
            return hit[1]
        target = self.get_target_space_from_source(sp)
        box = require_box(sp, _WHO)
        lo, hi = box.low_numpy.astype(np.float64), box.high_numpy.astype(np.float64)
        nl, nh = target.low_numpy.astype(np.float64), target.high_numpy.astype(np.float64)
        a = (nh - nl) / (hi - lo)
        off = nl - lo * a
        b, dev = sp.backend, sp.device
        entry = (target, _coef(b, a, dev), _coef(b, off, dev), _coef(b, nl, dev), _coef(b, nh, dev))
        if len(self._cache) >= 16:
            self._cache.pop(next(iter(self._cache)))
        self._cache[id(sp)] = (sp, entry)
        return entry

    # ------------------------------------------------------------------ data
    def transform(self, source_space: Space, data: Any) -> Any:
        target, a, off, nl, nh = self._coefficients(source_space)
        sp = require_box(source_space, _WHO)
        b = sp.backend
        x = coerce(sp, data, _WHO)
        check_bounds(sp, x, _WHO)
        if any(not isinstance(c, float) for c in (a, off, nl, nh)):
            dev = b.device(x)
            a, off, nl, nh = (c if isinstance(c, float) else b.to_device(c, dev) for c in (a, off, nl, nh))
        y = b.astype(x, b.dtype_from_name("float64")) * a + off
        y = b.clip(y, nl, nh)
        return b.astype(y, target.dtype)

    def direct_inverse(self, source_space: Optional[Space] = None) -> "RescaleTransformation":
        if source_space is None:
            raise ValueError(f"{_WHO}.direct_inverse needs the source space: its bounds are the inverse's new bounds")
        sp = self._check_source(source_space)
        self.get_target_space_from_source(sp)
        return RescaleTransformation(new_low=sp.low_numpy, new_high=sp.high_numpy,
                                     new_dtype=dtype_name(sp.backend, sp.dtype))

    # ------------------------------------------------------------------ JSON and pickling
    def to_json(self) -> Dict[str, Any]:
        return {"new_low": params_to_json(self.new_low), "new_high": params_to_json(self.new_high),
                "new_dtype": self.new_dtype}

    @classmethod
    def from_json(cls, params: Mapping[str, Any]) -> "RescaleTransformation":
        check_param_names(params, ("new_low", "new_high", "new_dtype"), ("new_low", "new_high"), cls.__name__)
        new_dtype = params.get("new_dtype")
        if new_dtype is not None and not isinstance(new_dtype, str):
            raise TypeError(f"new_dtype must be a dtype name or null, got {new_dtype!r}")
        return cls(params["new_low"], params["new_high"], new_dtype)

    def __getstate__(self) -> Dict[str, Any]:
        return {"new_low": self.new_low, "new_high": self.new_high, "new_dtype": self.new_dtype}

    def __setstate__(self, state: Dict[str, Any]) -> None:
        RescaleTransformation.__init__(self, state["new_low"], state["new_high"], state["new_dtype"])


__all__ = ["RescaleTransformation"]
