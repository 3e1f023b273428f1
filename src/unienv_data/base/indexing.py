"""Index normalisation shared by every storage: one place decides what an index means.

Accepted forms: Python int and NumPy integers and 0-d integer arrays / tensors (one sample, unbatched result);
slice; Ellipsis (everything); 1-D integer arrays, tensors or lists (a batch, negatives allowed); 1-D boolean masks of
exactly the storage length. Rejected with TypeError: bool scalars, floats, float arrays, None, strings, tuples (NumPy
reads a tuple as one index per dimension), >1-D arrays.
Out-of-range entries raise IndexError naming the first offending position and the valid range.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Tuple, Union

import numpy as np

_INT_KINDS = "iu"


@dataclass(frozen=True)
class NormalizedIndex:
    """An index resolved against a length: exactly one of `single`, `slc` or `array` is set."""

    single: Optional[int] = None            #: non-negative position of one sample
    slc: Optional[slice] = None             #: slice with non-negative start/stop and positive step
    array: Optional[np.ndarray] = None      #: 1-D int64 array of non-negative positions

    @property
    def is_single(self) -> bool:
        return self.single is not None

    def count(self) -> int:
        """Number of rows addressed (1 for a single index)."""
        if self.single is not None:
            return 1
        if self.slc is not None:
            return len(range(self.slc.start, self.slc.stop, self.slc.step))
        if not (self.array is not None):
            raise RuntimeError("internal invariant violated: self.array is not None")
        return int(self.array.shape[0])

    def lead(self) -> Tuple[int, ...]:
        """The leading (batch) shape of a value for this index: `()` for one sample, else `(count,)`."""
        return () if self.single is not None else (self.count(),)

    def positions(self) -> np.ndarray:
        """All addressed positions as an int64 array."""
        if self.single is not None:
            return np.array([self.single], dtype=np.int64)
        if self.slc is not None:
            return np.arange(self.slc.start, self.slc.stop, self.slc.step, dtype=np.int64)
        if not (self.array is not None):
            raise RuntimeError("internal invariant violated: self.array is not None")
        return self.array

    def numpy_key(self) -> Union[int, slice, np.ndarray]:
        """The index in a form NumPy indexes with directly."""
        if self.single is not None:
            return self.single
        if self.slc is not None:
            return self.slc
        if not (self.array is not None):
            raise RuntimeError("internal invariant violated: self.array is not None")
        return self.array


def _to_numpy_index(index: Any) -> Any:
    mod = type(index).__module__
    if mod.startswith("torch"):
        t = index.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        return t.numpy()
    if mod.startswith("jax") or mod.startswith("jaxlib"):
        return np.asarray(index)
    return index


def is_single_index(index: Any) -> bool:
    """True for an index that selects one sample (int, NumPy integer, 0-d integer array or tensor)."""
    if isinstance(index, bool) or isinstance(index, np.bool_):
        return False
    if isinstance(index, (int, np.integer)):
        return True
    shape = getattr(index, "shape", None)
    dtype = getattr(index, "dtype", None)
    if shape is not None and len(shape) == 0 and dtype is not None:
        kind = np.asarray(_to_numpy_index(index)).dtype.kind
        return kind in _INT_KINDS
    return False


def normalize_index(index: Any, length: int, what: str = "storage") -> NormalizedIndex:
    """Resolves `index` against `length` rows (see the module docstring for the accepted forms)."""
    if isinstance(index, (bool, np.bool_)):
        raise TypeError(f"index must be an int, slice, Ellipsis, integer array or boolean mask; got the bool {index!r}")
    if isinstance(index, (int, np.integer)):
        i = int(index)
        if not -length <= i < length:
            raise IndexError(f"index {i} is out of range for {what} of length {length} (valid: {-length}..{length - 1})")
        return NormalizedIndex(single=i + length if i < 0 else i)
    if isinstance(index, slice):
        start, stop, step = index.indices(length)
        if step < 0:
            raise IndexError(f"negative slice steps are not supported (got step {step}); index with an integer array")
        if stop < start:
            stop = start
        return NormalizedIndex(slc=slice(start, stop, step))
    if index is Ellipsis:
        return NormalizedIndex(slc=slice(0, length, 1))
    if index is None or isinstance(index, (str, bytes, float, np.floating)):
        raise TypeError(f"index must be an int, slice, Ellipsis, integer array or boolean mask; got {index!r}")
    if isinstance(index, tuple):
        # in NumPy a tuple indexes several dimensions (x[(0, 1)] is x[0, 1]); rows are the only dimension here
        raise TypeError(f"a tuple index {index!r} is not a list of rows (NumPy would read it as one index per "
                        f"dimension); pass a list {list(index)!r} or an integer array to select rows of {what}")
    arr = _to_numpy_index(index)
    if isinstance(arr, list):
        if any(isinstance(v, (bool, np.bool_)) for v in arr) and not all(isinstance(v, (bool, np.bool_)) for v in arr):
            raise TypeError("an index list must hold only ints or only bools")
        arr = np.asarray(arr) if len(arr) else np.zeros(0, dtype=np.int64)
    if not isinstance(arr, np.ndarray):
        raise TypeError(f"index must be an int, slice, Ellipsis, integer array or boolean mask; got {type(index).__name__}")
    if arr.ndim == 0:
        if arr.dtype.kind in _INT_KINDS:
            return normalize_index(int(arr), length, what)
        raise TypeError(f"a 0-d index must be an integer, got dtype {arr.dtype}")
    if arr.ndim != 1:
        raise IndexError(f"index arrays must be 1-D, got shape {arr.shape}")
    if arr.dtype.kind == "b":
        if arr.shape[0] != length:
            raise IndexError(f"boolean mask of length {arr.shape[0]} does not match {what} length {length}")
        return NormalizedIndex(array=np.flatnonzero(arr).astype(np.int64, copy=False))
    if arr.dtype.kind not in _INT_KINDS:
        raise TypeError(f"index arrays must hold integers or booleans, got dtype {arr.dtype}")
    if arr.dtype.kind == "u" and arr.size and int(arr.max()) >= length:
        bad = int(np.flatnonzero(arr >= length)[0])
        raise IndexError(f"index {int(arr[bad])} (at position {bad} of the index array) is out of range for "
                         f"{what} of length {length} (valid: {-length}..{length - 1})")
    out = arr.astype(np.int64, copy=True)
    if out.size:
        lo, hi = int(out.min()), int(out.max())
        if lo < -length or hi >= length:
            bad = int(np.flatnonzero((out < -length) | (out >= length))[0])
            raise IndexError(f"index {int(out[bad])} (at position {bad} of the index array) is out of range for "
                             f"{what} of length {length} (valid: {-length}..{length - 1})")
        if lo < 0:
            out[out < 0] += length
    return NormalizedIndex(array=out)
