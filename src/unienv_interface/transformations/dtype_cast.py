"""`DtypeTransformation`: an explicit, checked change of a Box's dtype, with the rounding the caller asks for."""
from __future__ import annotations

from typing import Any, Callable, Dict, Mapping, Optional, Tuple

import numpy as np

from unienv_interface.space import BoxSpace, Space
from unienv_interface.space.dtype_facts import FLOAT_MANTISSA, INT_NAMES, dtype_kind, int_range, is_lossless

from ._arrays import ReportsInputBounds, _first_false, all_true, coerce, dtype_name, require_box
from .serialization_utils import check_param_names
from .transformation import DataTransformation

_WHO = "DtypeTransformation"
ROUNDING_MODES = (None, "nearest", "floor", "ceil", "trunc")
_NP_ROUND: Dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "nearest": np.round, "floor": np.floor, "ceil": np.ceil, "trunc": np.trunc}


def _dtype_name_of(dtype: Any) -> str:
    if isinstance(dtype, str):
        name = dtype.replace("torch.", "")
    else:
        from unienv_interface.backends.serialization import serialize_dtype
        try:
            name = serialize_dtype(dtype)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{_WHO}: unsupported dtype {dtype!r} ({exc})") from None
    if name not in INT_NAMES and name not in FLOAT_MANTISSA:
        raise ValueError(f"{_WHO}: the target dtype must be a real integer or floating dtype, got {name!r}")
    return name


class DtypeTransformation(ReportsInputBounds, DataTransformation):
    """Casts a Box to `dtype`, never changing a value unless `rounding` says how.

    * `rounding=None` (the default): every value must survive the cast exactly (a fraction into an integer, an
      integer beyond the float's precision, a float64 not representable as float32, ... is ValueError).
    * float -> integer: `rounding` in `"nearest"` (half to even), `"floor"`, `"ceil"`, `"trunc"` rounds first.
      NaN, infinities and results outside the integer dtype's range are ValueError (never wrapped or saturated).
    * float -> narrower float: `rounding="nearest"` allows IEEE rounding (overflow to infinity is still ValueError).
    * integer -> integer: values outside the target's range are ValueError.

    The input's shape and dtype are checked against the source space first. A value outside the source bounds (NaN
    included) is cast under the same rules, with one `BoundsWarning` per instance (see `ReportsInputBounds`): the
    result then lies outside the target bounds, where the dtype can hold it (the rules above still refuse what it
    cannot). The target Box keeps the source bounds, mapped through the same rounding (`None` keeps the integers
    inside them) and limited to the target dtype's range.

    The inverse casts back to the source dtype exactly (`rounding=None`), without warning; values the forward cast
    produced always survive it. Example, a float image in [0, 1] stored as uint8: `ChainedTransformation([RescaleTransformation(0,
    255), DtypeTransformation("uint8", rounding="nearest")])`.
    """

    has_inverse = True

    def __init__(self, dtype: Any, rounding: Optional[str] = None) -> None:
        self.dtype = _dtype_name_of(dtype)
        if rounding not in ROUNDING_MODES:
            raise ValueError(f"{_WHO}: rounding must be one of {list(ROUNDING_MODES)}, got {rounding!r}")
        self.rounding = rounding

    # ------------------------------------------------------------------ spaces
    def _kinds(self, sp: BoxSpace) -> Tuple[str, str, str]:
        src = dtype_name(sp.backend, sp.dtype)
        ks, kd = dtype_kind(src), dtype_kind(self.dtype)
        if ks not in "iuf":
            raise TypeError(f"{_WHO} needs a real integer or floating source Box, got {src}")
        if self.rounding is not None:
            if ks == "f" and kd in "iu":
                pass
            elif ks == "f" and kd == "f" and self.rounding == "nearest":
                pass
            else:
                raise ValueError(f"{_WHO}: rounding={self.rounding!r} does not apply to a {src} -> {self.dtype} cast "
                                 "(float -> integer takes any mode, float -> narrower float only 'nearest')")
        return src, ks, kd

    def get_target_space_from_source(self, source_space: Space) -> BoxSpace:
        sp = require_box(source_space, _WHO)
        src, ks, kd = self._kinds(sp)
        b = sp.backend
        dt = b.dtype_from_name(self.dtype)
        lo: np.ndarray = np.array(sp.low_numpy)
        hi: np.ndarray = np.array(sp.high_numpy)
        if kd in "iu":
            dlo, dhi = int_range(self.dtype)
            if ks == "f":
                lo_r, hi_r = lo.astype(np.float64), hi.astype(np.float64)
                if self.rounding is None:
                    lo_r, hi_r = np.ceil(lo_r), np.floor(hi_r)
                else:
                    fn = _NP_ROUND[self.rounding]
                    lo_r, hi_r = fn(lo_r), fn(hi_r)
            else:
                lo_r, hi_r = lo.astype(object), hi.astype(object)  # Python ints: exact for every integer dtype
            if np.any(lo_r > hi_r) or np.any(lo_r > dhi) or np.any(hi_r < dlo):
                raise ValueError(f"{_WHO}: no {self.dtype} value lies within the source bounds of {sp!r}")
            if ks == "f":
                lo, hi = np.maximum(lo_r, float(dlo)), np.minimum(hi_r, float(dhi))
            else:
                # (np.asarray: on a 0-d object array np.clip returns a bare Python int)
                lo = np.array(np.asarray(np.clip(lo_r, dlo, dhi)).tolist(), dtype=np.dtype(self.dtype))
                hi = np.array(np.asarray(np.clip(hi_r, dlo, dhi)).tolist(), dtype=np.dtype(self.dtype))
        elif ks == "f":
            lo, hi = lo.astype(np.float64), hi.astype(np.float64)
        return BoxSpace(b, lo, hi, dt, device=sp.device, shape=tuple(sp.shape), metadata=sp.metadata)

    # ------------------------------------------------------------------ data
    def transform(self, source_space: Space, data: Any) -> Any:
        sp = require_box(source_space, _WHO)
        x = coerce(sp, data, _WHO)
        out = self._cast(sp, x)
        self._check_inside(sp, x, _WHO, "it is cast all the same")
        return out

    def _cast(self, sp: BoxSpace, x: Any) -> Any:
        """`x` (of the source dtype) cast to the target dtype under the rules of the class docstring."""
        src, ks, kd = self._kinds(sp)
        b = sp.backend
        dt = b.dtype_from_name(self.dtype)
        if src == self.dtype:
            return b.astype(x, dt)
        if ks == "f" and kd in "iu" and self.rounding is not None:
            return self._round_to_int(b, x, dt)
        if ks == "f" and kd == "f" and self.rounding == "nearest":
            with np.errstate(all="ignore"):
                out = b.astype(x, dt)
            ok = b.logical_or(b.isfinite(out), b.logical_not(b.isfinite(x)))
            if not all_true(b, ok):
                pos, val = _first_false(b, x, ok)
                raise ValueError(f"{_WHO}: value {val!r} at position {pos} overflows {self.dtype}")
            return out
        if is_lossless(src, self.dtype):
            return b.astype(x, dt)
        return _exact_cast(b, x, src, self.dtype, dt)

    def _round_to_int(self, b: Any, x: Any, dt: Any) -> Any:
        fn = {"nearest": b.round, "floor": b.floor, "ceil": b.ceil, "trunc": b.trunc}[str(self.rounding)]
        r = b.astype(fn(x), b.dtype_from_name("float64"))
        dlo, dhi = int_range(self.dtype)
        ok = b.logical_and(r >= float(dlo), r < float(dhi) + 1.0)  # both limits are exact powers of two in float64
        if not all_true(b, ok):
            pos, val = _first_false(b, x, ok)
            raise ValueError(f"{_WHO}: value {val!r} at position {pos} rounds ({self.rounding}) outside the range of "
                             f"{self.dtype} [{dlo}, {dhi}] (or is NaN / infinite)")
        return b.astype(r, dt)

    def direct_inverse(self, source_space: Optional[Space] = None) -> "DtypeTransformation":
        if source_space is None:
            raise ValueError(f"{_WHO}.direct_inverse needs the source space (the inverse casts back to its dtype)")
        sp = require_box(source_space, _WHO)
        self._kinds(sp)
        inverse = DtypeTransformation(dtype_name(sp.backend, sp.dtype), rounding=None)
        inverse.silence_bounds_warnings()
        return inverse

    # ------------------------------------------------------------------ JSON
    def to_json(self) -> Dict[str, Any]:
        return {"dtype": self.dtype, "rounding": self.rounding}

    @classmethod
    def from_json(cls, params: Mapping[str, Any]) -> "DtypeTransformation":
        check_param_names(params, ("dtype", "rounding"), ("dtype",), cls.__name__)
        if not isinstance(params["dtype"], str):
            raise TypeError(f"dtype must be a dtype name, got {params['dtype']!r}")
        return cls(params["dtype"], params.get("rounding"))


def _exact_cast(b: Any, x: Any, src: str, dst: str, dt: Any) -> Any:
    """`x` cast to `dt` when every value survives unchanged, else ValueError naming the first one that would not."""
    ks, kd = dtype_kind(src), dtype_kind(dst)
    if ks in "iu" and kd in "iu":
        (slo, shi), (dlo, dhi) = int_range(src), int_range(dst)
        conds = []
        if dlo > slo:
            conds.append(x >= dlo)
        if dhi < shi:
            conds.append(x <= dhi)
        ok = conds[0] if len(conds) == 1 else b.logical_and(conds[0], conds[1])
        if not all_true(b, ok):
            pos, val = _first_false(b, x, ok)
            raise ValueError(f"{_WHO}: value {val!r} at position {pos} is outside the range of {dst} [{dlo}, {dhi}]")
        return b.astype(x, dt)
    if kd in "iu":
        # float -> int without rounding: finite whole numbers inside the target range only
        f64 = b.astype(x, b.dtype_from_name("float64"))
        dlo, dhi = int_range(dst)
        ok = b.logical_and(b.logical_and(f64 >= float(dlo), f64 < float(dhi) + 1.0), b.floor(f64) == f64)
        if not all_true(b, ok):
            pos, val = _first_false(b, x, ok)
            raise ValueError(f"{_WHO}: value {val!r} at position {pos} is not a whole number in the range of {dst}; "
                             "pass rounding='nearest' / 'floor' / 'ceil' / 'trunc' to round it")
        return b.astype(f64, dt)
    return cast_checked_exact(b, x, src, dst, dt)


def cast_checked_exact(b: Any, x: Any, src: str, dst: str, dt: Any) -> Any:
    """int -> float or float -> narrower float: every value must be exactly representable."""
    with np.errstate(all="ignore"):
        out = b.astype(x, dt)
        if dtype_kind(src) == "f":
            same = b.astype(out, x.dtype) == x
            ok = b.logical_or(same, b.isnan(x))
        else:
            # compare in float64 (exact for both sides when the source has at most 53 value bits), else via the
            # integer: a float outside the integer range cannot have come from it
            dlo, dhi = int_range(src)
            back64 = b.astype(out, b.dtype_from_name("float64"))
            inside = b.logical_and(back64 >= float(dlo), back64 < float(dhi) + 1.0)
            safe = b.where(inside, out, b.zeros_like(out))
            ok = b.logical_and(inside, b.astype(safe, x.dtype) == x)
    if not all_true(b, ok):
        pos, val = _first_false(b, x, ok)
        raise ValueError(f"{_WHO}: value {val!r} at position {pos} of dtype {src} is not exactly representable as "
                         f"{dst}; pass rounding='nearest' to allow rounding" if dtype_kind(src) == "f" else
                         f"{_WHO}: value {val!r} at position {pos} of dtype {src} is not exactly representable as {dst}")
    return out


__all__ = ["DtypeTransformation", "ROUNDING_MODES"]
