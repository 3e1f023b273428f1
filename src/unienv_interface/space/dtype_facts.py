"""Facts about dtypes, by name (`backend.dtype_name(dtype)`): their kind, integer ranges, float precision, and
which casts keep every value. The one place these are decided for spaces and transformations."""
from __future__ import annotations

from typing import Tuple

import numpy as np

#: mantissa bits (implicit bit included) and the largest binary exponent of each float dtype
FLOAT_MANTISSA = {"float16": 11, "bfloat16": 8, "float32": 24, "float64": 53}
FLOAT_MAX_EXP = {"float16": 16, "bfloat16": 128, "float32": 128, "float64": 1024}
INT_NAMES = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")


def dtype_kind(name: str) -> str:
    """'b' (bool), 'i' / 'u' (signed / unsigned integer), 'f' (real float) or 'c' (anything else)."""
    if name == "bool":
        return "b"
    if name in FLOAT_MANTISSA:
        return "f"
    if name in INT_NAMES:
        return "u" if name.startswith("u") else "i"
    return "c"


def int_range(name: str) -> Tuple[int, int]:
    """`(min, max)` of an integer dtype, as Python ints."""
    info = np.iinfo(np.dtype(name))
    return int(info.min), int(info.max)


def _value_bits(name: str) -> int:
    lo, hi = int_range(name)
    return max(hi.bit_length(), (-lo).bit_length() if lo < 0 else 0)


def is_lossless(src: str, dst: str) -> bool:
    """True when every value of dtype `src` survives a cast to `dst` unchanged."""
    ks, kd = dtype_kind(src), dtype_kind(dst)
    if src == dst or (ks == "b" and kd in "iuf"):
        return True
    if ks in "iu" and kd in "iu":
        (slo, shi), (dlo, dhi) = int_range(src), int_range(dst)
        return dlo <= slo and shi <= dhi
    if ks in "iu" and kd == "f":
        return _value_bits(src) <= FLOAT_MANTISSA[dst]
    if ks == "f" and kd == "f":
        return FLOAT_MANTISSA[dst] >= FLOAT_MANTISSA[src] and FLOAT_MAX_EXP[dst] >= FLOAT_MAX_EXP[src]
    return False
