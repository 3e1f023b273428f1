"""Compute backends: one namespace class per array library (NumPy always; PyTorch and JAX when installed)."""
from typing import Any

from .base import (ArrayAPIArray, ArrayAPIGetIndex, ArrayAPISetIndex, BArrayType, BDeviceType, BDtypeType,
                   BRNGType, ComputeBackend)
from .numpy import NumpyComputeBackend
from .resolve import resolve_backend
from .serialization import deserialize_backend, deserialize_dtype, serialize_backend, serialize_dtype


def get_backend_from_tensor(x: Any) -> Any:
    """The backend class whose arrays `x` belongs to (TypeError for anything else)."""
    import numpy as np
    if isinstance(x, np.ndarray):
        return NumpyComputeBackend
    mod = type(x).__module__
    if mod.startswith("torch"):
        return deserialize_backend("pytorch")
    if mod.startswith("jax") or mod.startswith("jaxlib"):
        return deserialize_backend("jax")
    raise TypeError(f"not an array of a known backend: {type(x).__name__}")


__all__ = ["ComputeBackend", "BArrayType", "BDeviceType", "BDtypeType", "BRNGType", "ArrayAPIArray",
           "ArrayAPIGetIndex", "ArrayAPISetIndex", "get_backend_from_tensor", "NumpyComputeBackend",
           "serialize_backend", "deserialize_backend", "resolve_backend", "serialize_dtype", "deserialize_dtype"]
