"""`NumpyComputeBackend`: the NumPy adapter (the only backend the package needs to import)."""
from __future__ import annotations

from typing import Any, Optional, Tuple, Union

import array_api_compat.numpy as _xnp
import numpy as np

from .base import ComputeBackend

NumpyArrayType = np.ndarray
NumpyDeviceType = Any
NumpyDtypeType = np.dtype
NumpyRNGType = np.random.Generator

_NUMPY_NAMES = {
    "bool": np.dtype(np.bool_), "int8": np.dtype(np.int8), "int16": np.dtype(np.int16),
    "int32": np.dtype(np.int32), "int64": np.dtype(np.int64), "uint8": np.dtype(np.uint8),
    "uint16": np.dtype(np.uint16), "uint32": np.dtype(np.uint32), "uint64": np.dtype(np.uint64),
    "float16": np.dtype(np.float16), "float32": np.dtype(np.float32), "float64": np.dtype(np.float64),
    "complex64": np.dtype(np.complex64), "complex128": np.dtype(np.complex128),
}


class _NumpyRandom:
    """Functional RNG over `np.random.Generator`: every draw returns `(rng, value)`."""

    @staticmethod
    def random_number_generator(seed: Optional[int] = None, *, device: Any = None) -> np.random.Generator:
        return np.random.default_rng(seed)

    @staticmethod
    def random_discrete_uniform(shape: Union[int, Tuple[int, ...]], from_num: int, to_num: int, *,
                                rng: np.random.Generator, dtype: Any = None, device: Any = None) -> Tuple[np.random.Generator, np.ndarray]:
        dt = np.dtype(np.int64) if dtype is None else np.dtype(dtype)
        return rng, rng.integers(from_num, to_num, size=shape, dtype=dt if dt.kind in "iu" else np.int64).astype(dt, copy=False)

    @staticmethod
    def random_uniform(shape: Union[int, Tuple[int, ...]], *, rng: np.random.Generator, low: Any = 0.0, high: Any = 1.0,
                       dtype: Any = None, device: Any = None) -> Tuple[np.random.Generator, np.ndarray]:
        dt = np.dtype(np.float64) if dtype is None else np.dtype(dtype)
        return rng, rng.uniform(low, high, size=shape).astype(dt, copy=False)

    @staticmethod
    def random_normal(shape: Union[int, Tuple[int, ...]], *, rng: np.random.Generator, mean: Any = 0.0, std: Any = 1.0,
                      dtype: Any = None, device: Any = None) -> Tuple[np.random.Generator, np.ndarray]:
        dt = np.dtype(np.float64) if dtype is None else np.dtype(dtype)
        return rng, rng.normal(mean, std, size=shape).astype(dt, copy=False)

    @staticmethod
    def random_exponential(shape: Union[int, Tuple[int, ...]], *, rng: np.random.Generator, lambd: float = 1.0,
                           dtype: Any = None, device: Any = None) -> Tuple[np.random.Generator, np.ndarray]:
        dt = np.dtype(np.float64) if dtype is None else np.dtype(dtype)
        return rng, rng.exponential(1.0 / lambd, size=shape).astype(dt, copy=False)

    @staticmethod
    def random_geometric(shape: Union[int, Tuple[int, ...]], *, rng: np.random.Generator, p: float = 0.5,
                         dtype: Any = None, device: Any = None) -> Tuple[np.random.Generator, np.ndarray]:
        dt = np.dtype(np.int64) if dtype is None else np.dtype(dtype)
        return rng, rng.geometric(p, size=shape).astype(dt, copy=False)

    @staticmethod
    def random_permutation(n: int, *, rng: np.random.Generator, dtype: Any = None,
                           device: Any = None) -> Tuple[np.random.Generator, np.ndarray]:
        dt = np.dtype(np.int64) if dtype is None else np.dtype(dtype)
        return rng, rng.permutation(n).astype(dt, copy=False)


class NumpyComputeBackend(ComputeBackend[np.ndarray, Any, np.dtype, np.random.Generator]):
    """NumPy arrays on the host. Devices are always None (or "cpu")."""

    _xp = _xnp
    simplified_name = "numpy"
    library_name = "NumPy"
    _dtypes_by_name = _NUMPY_NAMES
    array_type = np.ndarray
    default_integer_dtype = np.dtype(np.int64)
    default_index_dtype = np.dtype(np.int64)
    default_floating_dtype = np.dtype(np.float64)
    default_boolean_dtype = np.dtype(np.bool_)
    random = _NumpyRandom

    @classmethod
    def from_numpy(cls, a: np.ndarray, dtype: Any = None, device: Any = None) -> np.ndarray:
        a = np.asarray(a)
        return a if dtype is None else a.astype(cls.as_dtype(dtype), copy=False)

    @classmethod
    def to_numpy(cls, x: Any) -> np.ndarray:
        return np.asarray(x)

    @classmethod
    def _from_foreign(cls, x: Any, device: Any) -> np.ndarray:
        mod = type(x).__module__
        if mod.startswith("torch"):
            t = x.detach()
            if t.device.type != "cpu":
                t = t.cpu()
            if str(t.dtype) == "torch.bfloat16":
                raise TypeError("NumPy has no bfloat16: convert the tensor to float32 first")
            return t.numpy()
        return np.asarray(x)

    @classmethod
    def device(cls, x: Any) -> Any:
        return "cpu"

    @classmethod
    def to_device(cls, x: Any, device: Any) -> Any:
        cls.check_device(device)
        return x

    @classmethod
    def check_device(cls, device: Any) -> Any:
        if device not in (None, "cpu"):
            raise ValueError(f"NumPy arrays live on the host; device must be None or 'cpu', got {device!r}")
        return device

    @classmethod
    def dtype_name(cls, dtype: Any) -> str:
        dt = np.dtype(dtype)
        name = {"?": "bool"}.get(dt.char, dt.name)
        if name not in _NUMPY_NAMES:
            raise ValueError(f"unsupported NumPy dtype {dt!r}; expected one of {sorted(_NUMPY_NAMES)}")
        return name

    @classmethod
    def as_dtype(cls, dtype: Any) -> np.dtype:
        if isinstance(dtype, str):
            return cls.dtype_from_name(dtype)
        if type(dtype).__module__.startswith("torch"):
            return cls.dtype_from_name(str(dtype).replace("torch.", ""))
        try:
            return np.dtype(dtype)
        except TypeError:
            raise TypeError(f"not a NumPy dtype: {dtype!r}") from None

    @classmethod
    def numpy_dtype(cls, dtype: Any) -> np.dtype:
        return np.dtype(dtype)

    @classmethod
    def promote_types(cls, *dtypes: Any) -> np.dtype:
        if not dtypes:
            raise ValueError("promote_types needs at least one dtype")
        return np.result_type(*[np.dtype(d) for d in dtypes])
