"""Checking and converting user values for one Box / Binary leaf: the single place that decides what is accepted.

Rules (what "no silent casts" means here):
* The value may be an array of the space's backend, a NumPy array, another backend's array, a Python scalar or a
  (nested) list; it becomes a NumPy array of the leaf's storage dtype. Nothing else is accepted (TypeError).
* The shape must match exactly (ValueError): no reshape, no broadcast, even for the same element count.
* dtype: the same dtype passes; a widening cast passes; a float to a narrower float passes when no finite value
  overflows; every other cast (float to int, int to a narrower int, int to float, anything to bool) passes only
  when every value survives it unchanged, else ValueError naming the first value that would change.
* Bounds: a value outside the Box's `[low, high]` (NaN in a float leaf with finite bounds included) is stored,
  with a `BoundsWarning` naming the first offending position, once per leaf converter (that is, per key and
  storage). `warnings.simplefilter("error", BoundsWarning)` makes it a refusal: the warning is raised before
  anything is written. The dtype rules above stay strict whatever the bounds say.
"""
from __future__ import annotations

import difflib
import warnings
from typing import Any, Iterable, Optional, Tuple

import numpy as np

from unienv_interface.space import BinarySpace, BoxSpace, Space

from .errors import BoundsWarning
from .warn import warn_user


def _bf16_to_f32(raw: np.ndarray) -> np.ndarray:
    return (raw.astype(np.uint32) << 16).view(np.float32)


def _f32_to_bf16_exact(values: np.ndarray) -> Optional[np.ndarray]:
    """Raw bfloat16 bits of float32 values, or None if any value is not exactly representable."""
    f = np.array(values, dtype=np.float32, order="C")
    bits = f.view(np.uint32)
    if np.any(bits & 0xFFFF):
        return None
    return (bits >> 16).astype(np.uint16)


_MANTISSA = {2: 11, 4: 24, 8: 53}


def is_lossless_cast(src: np.dtype, dst: np.dtype) -> bool:
    """True when every value of `src` survives a cast to `dst` unchanged (stricter than NumPy's 'safe', which
    calls int64 -> float64 safe although 2**53 + 1 does not survive it)."""
    src, dst = np.dtype(src), np.dtype(dst)
    if src == dst or src.kind == "b":
        return True
    if src.kind in "iu" and dst.kind == "f":
        bits = src.itemsize * 8 - (1 if src.kind == "i" else 0)
        return bits <= _MANTISSA.get(dst.itemsize, 0)
    return bool(np.can_cast(src, dst, "safe"))


def _describe(value: Any) -> str:
    shape = getattr(value, "shape", None)
    dtype = getattr(value, "dtype", None)
    if shape is not None:
        return f"{type(value).__name__} of shape {tuple(shape)} and dtype {dtype}"
    return f"{type(value).__name__} {value!r}"[:120]


def bounds_warning_is_error() -> bool:
    """Whether the warning filters in force now turn a `BoundsWarning` into an error (the first filter whose
    category covers it says "error"). A converter that warned once checks values again while this holds, so
    `warnings.simplefilter("error", BoundsWarning)` refuses out-of-bounds values even after a lenient warning."""
    for action, _message, category, _module, _lineno in warnings.filters:
        if issubclass(BoundsWarning, category):
            return bool(action == "error")
    return False


class LeafConverter:
    """Converts values for one Box / Binary leaf into checked NumPy arrays of its storage dtype."""

    __slots__ = ("space", "where", "shape", "np_dtype", "is_bf16", "lo", "hi", "lo_s", "hi_s", "kind", "small",
                 "warned")

    def __init__(self, space: Space, where: str) -> None:
        if not isinstance(space, (BoxSpace, BinarySpace)):
            raise TypeError(f"{where}: only Box and Binary leaves hold arrays, got {type(space).__name__}")
        self.space = space
        self.where = where
        self.shape: Tuple[int, ...] = tuple(space.shape)
        b = space.backend
        self.is_bf16 = b.dtype_name(space.dtype) == "bfloat16"
        self.np_dtype = b.numpy_dtype(space.dtype)
        self.kind = "b" if isinstance(space, BinarySpace) else ("f" if self.is_bf16 else self.np_dtype.kind)
        self.lo: Optional[np.ndarray] = None
        self.hi: Optional[np.ndarray] = None
        self.lo_s: Any = None
        self.hi_s: Any = None
        #: a BoundsWarning was issued (and not turned into an error): later values are checked again only while
        #: the filters turn it into an error (`bounds_warning_is_error`)
        self.warned = False
        if isinstance(space, BoxSpace):
            lo, hi = space.low_numpy, space.high_numpy
            if self.kind == "f":
                bounded = not (np.all(np.isneginf(lo)) and np.all(np.isposinf(hi)))
            else:
                info = np.iinfo(self.np_dtype)
                bounded = not (np.all(lo == info.min) and np.all(hi == info.max))
            if bounded:
                self.lo, self.hi = lo, hi
                if lo.size and np.all(lo == lo.flat[0]) and np.all(hi == hi.flat[0]):
                    self.lo_s, self.hi_s = lo.flat[0].item(), hi.flat[0].item()
        #: bounds of small leaves are checked with Python min/max (cheaper than NumPy reductions on a few values)
        self.small = self.lo_s is not None and int(np.prod(self.shape, dtype=np.int64)) <= 64 and not self.is_bf16

    # -------------------------------------------------------------- conversion
    def to_numpy(self, value: Any) -> Tuple[np.ndarray, bool]:
        """`(array, weak)`: the value as NumPy; `weak` marks Python scalars / lists (no dtype of their own)."""
        if isinstance(value, np.ndarray):
            return value, False
        mod = type(value).__module__
        if mod.startswith("torch"):
            try:
                t = value.detach()
                if t.device.type != "cpu":
                    t = t.cpu()
            except (RuntimeError, NotImplementedError, TypeError) as exc:
                raise TypeError(f"{self.where}: cannot read the tensor's data ({exc}); pass a CPU tensor") from None
            name = str(t.dtype)
            if name == "torch.bfloat16":
                if self.is_bf16:
                    return t.view(dtype=__import__("torch").int16).numpy().view(np.uint16), False
                return t.float().numpy(), False
            if self.is_bf16 and name.startswith("torch.float"):
                raw = _f32_to_bf16_exact(t.float().numpy())
                if raw is None:
                    raise ValueError(f"{self.where}: {name} values are not exactly representable as bfloat16; "
                                     "convert with .to(torch.bfloat16) first")
                return raw, False
            return t.numpy(), False
        if isinstance(value, np.generic):
            return np.asarray(value), False
        if isinstance(value, (bool, int, float)) or isinstance(value, (list, tuple)):
            try:
                arr = np.asarray(value)
            except (ValueError, TypeError):
                raise TypeError(f"{self.where}: expected an array of shape {self.shape}, got a ragged {type(value).__name__}") from None
            if arr.dtype == object or arr.dtype.kind not in "biuf":
                raise TypeError(f"{self.where}: expected numbers, got {_describe(value)}")
            return arr, True
        if mod.startswith("jax") or mod.startswith("jaxlib"):
            return np.asarray(value), False
        raise TypeError(f"{self.where}: expected an array of shape {self.shape} and dtype "
                        f"{self.space.backend.dtype_name(self.space.dtype)}, got {_describe(value)}")

    def convert_single(self, value: Any) -> np.ndarray:
        """`convert(value)` for one element, with a fast path for exact-dtype NumPy arrays and CPU tensors."""
        if isinstance(value, np.ndarray):
            arr = value
        else:
            try:
                arr = value.numpy()  # CPU tensors without grad; anything else takes the general path
            except Exception:
                return self.convert(value, ())
            if not isinstance(arr, np.ndarray) or self.is_bf16:
                return self.convert(value, ())
        if arr.dtype != self.np_dtype or arr.shape != self.shape:
            return self.convert(value, ())
        if self.small:
            vals = arr.tolist()
            if type(vals) is list:
                if vals and isinstance(vals[0], list):
                    vals = arr.reshape(-1).tolist()
                if vals:
                    mn, mx, total = min(vals), max(vals), sum(vals)
                    if mn >= self.lo_s and mx <= self.hi_s and total == total:
                        return arr
                    self.check_bounds(arr)
                return arr
            if self.lo_s <= vals <= self.hi_s:
                return arr
            self.check_bounds(arr)
        elif self.lo is not None:
            self.check_bounds(arr)
        return arr

    def convert(self, value: Any, lead: Tuple[int, ...] = ()) -> np.ndarray:
        """A checked array of shape `lead + shape` in the storage dtype (may share memory with `value`)."""
        arr, weak = self.to_numpy(value)
        expected = lead + self.shape
        if arr.shape != expected:
            raise ValueError(f"{self.where}: expected shape {expected}, got {tuple(arr.shape)}")
        if arr.dtype != self.np_dtype:
            arr = self.cast(arr, weak)
        if self.lo is not None:
            self.check_bounds(arr)
        return arr

    def cast(self, arr: np.ndarray, weak: bool) -> np.ndarray:
        """`arr` (and `weak`) from `to_numpy`, of another dtype, in the storage dtype; TypeError / ValueError when
        the values do not fit it. Bounds are not checked (`convert` checks them)."""
        target = self.np_dtype
        src_kind = arr.dtype.kind
        exp_name = self.space.backend.dtype_name(self.space.dtype)
        if src_kind not in "biuf":
            raise TypeError(f"{self.where}: expected dtype {exp_name}, got {arr.dtype}")
        if self.kind == "b":
            if src_kind == "b":
                return arr.astype(np.bool_)
            with np.errstate(invalid="ignore"):
                bad = ~((arr == 0) | (arr == 1))
            if bad.any():
                first = arr.reshape(-1)[int(np.flatnonzero(bad.reshape(-1))[0])].item()
                raise ValueError(f"{self.where}: expected booleans (dtype bool), got {arr.dtype} value {first!r}")
            return arr.astype(np.bool_)
        if self.is_bf16:
            raw = _f32_to_bf16_exact(arr.astype(np.float32)) if src_kind != "f" or arr.dtype.itemsize <= 4 else None
            if raw is None or not np.array_equal(_bf16_to_f32(raw).astype(arr.dtype), arr):
                raise ValueError(f"{self.where}: {arr.dtype} values are not exactly representable as bfloat16")
            return raw
        if src_kind == "b" or is_lossless_cast(arr.dtype, target):
            return arr.astype(target)
        with np.errstate(all="ignore"):
            out = arr.astype(target)
            if src_kind == "f" and self.kind == "f":
                ok = np.isfinite(out) | ~np.isfinite(arr)
            else:
                ok = out.astype(arr.dtype) == arr
                if src_kind == "f":
                    ok &= np.isfinite(arr)
                elif src_kind in "iu" and self.kind in "iu":
                    # a wrap-around cast survives the round trip (uint64 2**64-1 -> int16 -1 -> 2**64-1): compare signs
                    ok &= (out < 0) == (arr < 0)
        if not ok.all():
            first = arr.reshape(-1)[int(np.flatnonzero(~ok.reshape(-1))[0])].item()
            raise ValueError(f"{self.where}: value {first!r} of dtype {arr.dtype} cannot be stored as {exp_name} "
                             "without changing it (fractional, NaN or out of range); convert it explicitly")
        return out

    def check_bounds(self, arr: np.ndarray) -> None:
        """A `BoundsWarning` naming the first value outside `[low, high]` (NaN included), once per converter."""
        if self.lo is None or self.hi is None or (self.warned and not bounds_warning_is_error()):
            return
        vals = _bf16_to_f32(arr) if self.is_bf16 else arr
        if vals.size == 0:
            return
        if self.lo_s is not None:
            if vals.min() >= self.lo_s and vals.max() <= self.hi_s:
                return
        lo = np.broadcast_to(self.lo, vals.shape)
        hi = np.broadcast_to(self.hi, vals.shape)
        with np.errstate(invalid="ignore"):
            ok = (vals >= lo) & (vals <= hi)
        if ok.all():
            return
        bad = int(np.flatnonzero(~ok.reshape(-1))[0])
        pos = tuple(int(p) for p in np.unravel_index(bad, vals.shape))
        warn_user(f"{self.where}: value {vals.reshape(-1)[bad].item()!r} at position {pos} is outside the space "
                      f"bounds [{lo.reshape(-1)[bad].item()!r}, {hi.reshape(-1)[bad].item()!r}]; it is stored as given "
                      "(further values outside the bounds of this key are not reported)", BoundsWarning)
        self.warned = True      # only once the warning did not raise: an "error" filter refuses every time


def key_set_error(given: Iterable[Any], expected: Iterable[Any], at: str = "") -> KeyError:
    """The KeyError for a dict value whose keys are not the space's: the missing AND the unexpected keys in one
    message (a misspelt key is both), a likely intended key for each unexpected one, and the expected set. `at`
    says where the dict sits (e.g. " under 'obs'")."""
    got, want = set(given), set(expected)
    missing = sorted(map(str, want - got))
    extra = sorted(map(str, got - want))
    parts = ([f"missing key(s) {missing}"] if missing else []) + ([f"unexpected key(s) {extra}"] if extra else [])
    guesses = [f"{m[0]!r} for {e!r}" for e in extra for m in [difflib.get_close_matches(e, missing, n=1)] if m]
    hint = f" (did you mean {', '.join(guesses)}?)" if guesses else ""
    return KeyError(f"{', '.join(parts)}{at}{hint}: the space expects {sorted(map(str, want))} (extra keys are "
                    "never dropped silently)")
