"""`CropTransformation`: clips a Box's values into `[crop_low, crop_high]`."""
from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Tuple

import numpy as np

from unienv_interface.space import BoxSpace, Space
from unienv_interface.space.dtype_facts import int_range

from ._arrays import (ReportsInputBounds, all_true, box_bounds, coerce, dtype_name, param_dtype, param_from_json,
                      param_payload, params_array, params_to_json, per_space, require_box, typed_param)
from .identity import IdentityTransformation
from .serialization_utils import check_param_names
from .transformation import DataTransformation

_WHO = "CropTransformation"


class CropTransformation(ReportsInputBounds, DataTransformation):
    """Clips every value of a Box into `[crop_low, crop_high]` (numbers or arrays broadcastable, right-aligned, to
    the space's shape; `-inf` / `inf` leave that side open; `crop_low <= crop_high` everywhere).

    * The target Box has the crop bounds and the source dtype. For an integer Box they become the integers inside
      them (`ceil(crop_low)`, `floor(crop_high)`, limited to the dtype's range), so a clipped value is always a
      value of the target (the reference truncates instead, which can leave a value outside the bounds it reports).
    * `transform` checks the input's shape and dtype; values outside the source bounds are clipped like any other
      (clipping is the point, no warning). NaN stays NaN, as in the reference, with one `BoundsWarning` per
      instance (see `ReportsInputBounds`): it lies in no clipped range.
    * Cropping loses information: like the reference, `direct_inverse` is the `IdentityTransformation` (the
      cropped values stay cropped), so a storage can hold cropped data when the crop bounds equal the space's.
    """

    has_inverse = True

    def __init__(self, crop_low: Any, crop_high: Any) -> None:
        self.crop_low = params_array(crop_low, "crop_low", allow_inf=True)
        self.crop_high = params_array(crop_high, "crop_high", allow_inf=True)
        try:
            np.broadcast_shapes(self.crop_low.shape, self.crop_high.shape)
        except ValueError:
            raise ValueError(f"crop_low of shape {self.crop_low.shape} and crop_high of shape {self.crop_high.shape} "
                             "do not broadcast together") from None
        if np.any(self.crop_low > self.crop_high):
            raise ValueError(f"{_WHO} needs crop_low <= crop_high everywhere, got crop_low="
                             f"{params_to_json(self.crop_low)} crop_high={params_to_json(self.crop_high)}")
        #: dtype names of the bounds given as arrays (None for numbers and lists), kept for JSON
        self.bound_dtypes: Tuple[Optional[str], Optional[str]] = (param_dtype(crop_low), param_dtype(crop_high))
        self._cache: Dict[int, Tuple[Any, Any]] = {}

    def get_target_space_from_source(self, source_space: Space) -> BoxSpace:
        return per_space(self._cache, source_space, self._target)  # type: ignore[no-any-return]

    def _target(self, source_space: Space) -> BoxSpace:
        sp = require_box(source_space, _WHO)
        b = sp.backend
        shape = tuple(sp.shape)
        try:
            lo = np.broadcast_to(self.crop_low, shape)
            hi = np.broadcast_to(self.crop_high, shape)
        except ValueError:
            raise ValueError(f"crop bounds of shapes {self.crop_low.shape} / {self.crop_high.shape} do not broadcast "
                             f"to the space's shape {shape}") from None
        if b.dtype_is_real_integer(sp.dtype):
            name = dtype_name(b, sp.dtype)
            dlo, dhi = int_range(name)
            lo = np.clip(np.ceil(lo), float(dlo), float(dhi))
            hi = np.clip(np.floor(hi), float(dlo), float(dhi))
            if np.any(lo > hi):
                raise ValueError(f"{_WHO}: no {name} value lies in [{params_to_json(self.crop_low)}, "
                                 f"{params_to_json(self.crop_high)}] somewhere")
        return BoxSpace(b, lo, hi, sp.dtype, device=sp.device, shape=shape, metadata=sp.metadata)

    def transform(self, source_space: Space, data: Any) -> Any:
        target = self.get_target_space_from_source(source_space)
        sp = require_box(source_space, _WHO)
        b = sp.backend
        x = coerce(sp, data, _WHO)
        lo, hi = box_bounds(target)
        if lo is None:
            return x
        if not isinstance(lo, (int, float)):
            dev = b.device(x)
            lo, hi = b.to_device(lo, dev), b.to_device(hi, dev)
        out = b.astype(b.clip(x, lo, hi), target.dtype)
        if self.reports_bounds and b.dtype_is_real_floating(x.dtype):
            not_nan = b.logical_not(b.isnan(x))
            self._report_outside(sp, x, None if all_true(b, not_nan) else not_nan, _WHO, "NaN stays NaN")
        return out

    def direct_inverse(self, source_space: Optional[Space] = None) -> IdentityTransformation:
        return IdentityTransformation()

    def to_json(self) -> Dict[str, Any]:
        """The reference's form: each bound as `{"scalar": true, "value": x, "backend": null}` or, for an array,
        `{"scalar": false, "value": [...], "backend": "numpy", "dtype": name}`."""
        return {"crop_low": param_payload(self.crop_low, self.bound_dtypes[0]),
                "crop_high": param_payload(self.crop_high, self.bound_dtypes[1])}

    @classmethod
    def from_json(cls, params: Mapping[str, Any]) -> "CropTransformation":
        check_param_names(params, ("crop_low", "crop_high"), ("crop_low", "crop_high"), cls.__name__)
        return cls(param_from_json(params["crop_low"], "crop_low"), param_from_json(params["crop_high"], "crop_high"))

    def __getstate__(self) -> Dict[str, Any]:
        return {"crop_low": typed_param(self.crop_low, self.bound_dtypes[0]),
                "crop_high": typed_param(self.crop_high, self.bound_dtypes[1]), **self._bounds_state()}

    def __setstate__(self, state: Dict[str, Any]) -> None:
        CropTransformation.__init__(self, state["crop_low"], state["crop_high"])
        self._restore_bounds_state(state)


__all__ = ["CropTransformation"]
