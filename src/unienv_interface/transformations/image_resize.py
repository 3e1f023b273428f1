"""`ImageResizeTransformation`: resizes `(..., H, W, C)` images with an antialiased bilinear (triangle) filter.

The filter is computed here, in the backend's own array namespace (so arrays stay on their device and no image
library is needed): each output pixel is a weighted mean of the input pixels whose centres lie within one output
pixel (downscaling) or the two nearest input pixels (upscaling), with pixel centres at `i + 0.5` (OpenCV's and
PyTorch's `align_corners=False`) and the weights renormalised at the borders. This is what the reference computes on
PyTorch (`interpolate(mode="bilinear", antialias=True)`) and JAX (`jax.image.resize(..., "bilinear",
antialias=True)`); the reference's NumPy path calls OpenCV's `INTER_LINEAR`, which does not antialias, so a
downscaled NumPy image differs from the reference's there (upscaling agrees on every backend).
"""
from __future__ import annotations

import functools
from typing import Any, Dict, Mapping, Optional, Tuple

import numpy as np

from unienv_interface.space import BoxSpace, Space
from unienv_interface.space.dtype_facts import int_range

from ._arrays import ReportsInputBounds, box_bounds, coerce, dtype_name, inside_mask, per_space, require_box
from .serialization_utils import check_param_names
from .transformation import DataTransformation

_WHO = "ImageResizeTransformation"


@functools.lru_cache(maxsize=64)
def resize_taps(n_in: int, n_out: int) -> Tuple[np.ndarray, np.ndarray]:
    """`(index, weight)`, each of shape `(n_out, taps)`: output pixel `i` is `sum_t weight[i, t] * in[index[i, t]]`
    (the antialiased triangle filter of the module docstring; unused taps have weight 0 and repeat a used index)."""
    scale = n_in / n_out
    width = max(scale, 1.0)                       # the filter's half width in input pixels
    centres = (np.arange(n_out, dtype=np.float64) + 0.5) * scale
    first = np.floor(centres - width - 0.5).astype(np.int64)
    taps = int(np.ceil(2 * width)) + 2
    index = first[:, None] + np.arange(taps)[None, :]
    weight = np.maximum(0.0, 1.0 - np.abs(index + 0.5 - centres[:, None]) / width)
    weight[(index < 0) | (index >= n_in)] = 0.0
    weight /= weight.sum(axis=1, keepdims=True)
    index = np.clip(index, 0, n_in - 1)
    used = weight.any(axis=0)
    index, weight = np.ascontiguousarray(index[:, used]), np.ascontiguousarray(weight[:, used])
    index.flags.writeable = weight.flags.writeable = False      # shared by every caller (cached)
    return index, weight


def _compute_dtype(name: str) -> str:
    """The float dtype the filter runs in for images of dtype `name`."""
    if name in ("float32", "float64"):
        return name
    if name in ("float16", "bfloat16", "int8", "uint8", "int16", "uint16"):
        return "float32"
    return "float64"


class ImageResizeTransformation(ReportsInputBounds, DataTransformation):
    """Resizes the images of a Box of shape `(..., H, W, C)` to `(..., new_height, new_width, C)` (see the module
    docstring for the filter). The target Box has the source dtype, and per channel the lowest low and highest
    high of the source (the reference's bounds); integer images are rounded half to even. Data may carry leading
    batch axes; its shape and dtype are checked against the source space. Pixels outside the source bounds (NaN
    included) are resized like any other, with one `BoundsWarning` per instance (see `ReportsInputBounds`): the
    weighted means near them may then lie outside the target bounds (a NaN spreads to the nearby output pixels),
    as in the reference.

    Resizing loses detail: like the reference, the inverse resizes back to the source size (`direct_inverse`
    needs the source space), which restores the shape, not the pixels; it does not warn.
    """

    has_inverse = True

    def __init__(self, new_height: int, new_width: int) -> None:
        for name, v in (("new_height", new_height), ("new_width", new_width)):
            if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
                raise TypeError(f"{_WHO}: {name} must be an int, got {v!r}")
            if v <= 0:
                raise ValueError(f"{_WHO}: {name} must be positive, got {v}")
        self.new_height = int(new_height)
        self.new_width = int(new_width)
        self._cache: Dict[int, Tuple[Any, Any]] = {}

    def _check(self, source_space: Space) -> BoxSpace:
        sp = require_box(source_space, _WHO)
        shape = tuple(sp.shape)
        if len(shape) < 3:
            raise ValueError(f"{_WHO} needs a Box of shape (..., H, W, C), got shape {shape}")
        if shape[-3] <= 0 or shape[-2] <= 0:
            raise ValueError(f"{_WHO} needs a positive height and width, got shape {shape}")
        return sp

    def get_target_space_from_source(self, source_space: Space) -> BoxSpace:
        return per_space(self._cache, source_space, self._target)  # type: ignore[no-any-return]

    def _target(self, source_space: Space) -> BoxSpace:
        sp = self._check(source_space)
        shape = tuple(sp.shape)
        new_shape = shape[:-3] + (self.new_height, self.new_width, shape[-1])
        low = sp.low_numpy.min(axis=(-3, -2), keepdims=True)
        high = sp.high_numpy.max(axis=(-3, -2), keepdims=True)
        return BoxSpace(sp.backend, low, high, sp.dtype, device=sp.device, shape=new_shape, metadata=sp.metadata)

    def transform(self, source_space: Space, data: Any) -> Any:
        sp = self._check(source_space)
        target = self.get_target_space_from_source(sp)
        b = sp.backend
        x = coerce(sp, data, _WHO)
        ok = inside_mask(sp, x)      # None: every pixel inside (the usual case)
        h, w, c = (int(d) for d in sp.shape[-3:])
        lead = tuple(int(d) for d in x.shape[:-3])
        n = int(np.prod(lead, dtype=np.int64))
        name = dtype_name(b, sp.dtype)
        y = b.astype(x, b.dtype_from_name(_compute_dtype(name)))
        y = b.reshape(y, (n, h, w, c))
        y = self._resize_axis(b, y, 1, h, self.new_height)
        y = self._resize_axis(b, y, 2, w, self.new_width)
        if b.dtype_is_real_integer(sp.dtype):
            y = b.round(y)
        lo, hi = box_bounds(target)
        if ok is not None:   # a mean may lie outside the bounds now: keep it (an integer one inside its dtype)
            lo, hi = (float(v) for v in int_range(name)) if b.dtype_is_real_integer(sp.dtype) else (None, None)
        if lo is not None:
            if not isinstance(lo, (int, float)):
                dev = b.device(y)
                lo, hi = b.astype(b.to_device(lo, dev), y.dtype), b.astype(b.to_device(hi, dev), y.dtype)
            y = b.clip(y, lo, hi)      # a mean of values in bounds is in bounds; this only absorbs float rounding
        y = b.astype(y, target.dtype)
        self._report_outside(sp, x, ok, _WHO, "it is resized like any other pixel")
        return b.reshape(y, lead + (self.new_height, self.new_width, c))

    @staticmethod
    def _resize_axis(b: Any, y: Any, axis: int, n_in: int, n_out: int) -> Any:
        """`y` (4-d) resized along `axis` from `n_in` to `n_out` samples."""
        if n_in == n_out:
            return y
        index, weight = resize_taps(n_in, n_out)
        taps = index.shape[1]
        dev = b.device(y)
        idx = b.from_numpy(index.reshape(-1), device=dev)
        wt = b.astype(b.from_numpy(weight, device=dev), y.dtype)
        gathered = b.take(y, idx, axis=axis)                       # (..., n_out * taps, ...)
        shape = tuple(int(d) for d in y.shape)
        shape = shape[:axis] + (n_out, taps) + shape[axis + 1:]
        gathered = b.reshape(gathered, shape)
        wshape = (1,) * axis + (n_out, taps) + (1,) * (len(shape) - axis - 2)
        return b.sum(gathered * b.reshape(wt, wshape), axis=axis + 1)

    def direct_inverse(self, source_space: Optional[Space] = None) -> "ImageResizeTransformation":
        if source_space is None:
            raise ValueError(f"{_WHO}.direct_inverse needs the source space (the inverse resizes back to its size)")
        sp = self._check(source_space)
        inverse = ImageResizeTransformation(new_height=int(sp.shape[-3]), new_width=int(sp.shape[-2]))
        inverse.silence_bounds_warnings()
        return inverse

    def to_json(self) -> Dict[str, Any]:
        return {"new_height": self.new_height, "new_width": self.new_width}

    @classmethod
    def from_json(cls, params: Mapping[str, Any]) -> "ImageResizeTransformation":
        check_param_names(params, ("new_height", "new_width"), ("new_height", "new_width"), cls.__name__)
        return cls(params["new_height"], params["new_width"])

    def __getstate__(self) -> Dict[str, Any]:
        return {"new_height": self.new_height, "new_width": self.new_width, **self._bounds_state()}

    def __setstate__(self, state: Dict[str, Any]) -> None:
        ImageResizeTransformation.__init__(self, state["new_height"], state["new_width"])
        self._restore_bounds_state(state)


__all__ = ["ImageResizeTransformation", "resize_taps"]
