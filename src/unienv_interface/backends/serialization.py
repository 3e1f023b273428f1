"""Backends and dtypes to and from JSON-friendly strings (every dtype, float16 and bfloat16 included)."""
from __future__ import annotations

import importlib
from typing import Any, Type

from .base import ComputeBackend
from .numpy import NumpyComputeBackend

_BACKEND_MODULES = {"numpy": ("numpy", "NumpyComputeBackend"), "pytorch": ("pytorch", "PyTorchComputeBackend"),
                    "jax": ("jax", "JaxComputeBackend")}


def serialize_backend(backend: Type[ComputeBackend]) -> str:
    """'numpy' | 'pytorch' | 'jax'."""
    name = getattr(backend, "simplified_name", None)
    if name not in _BACKEND_MODULES:
        raise ValueError(f"not a compute backend: {backend!r}")
    return str(name)


def deserialize_backend(name: str) -> Type[ComputeBackend]:
    """The backend class for a name written by `serialize_backend` (imports torch / jax only when named)."""
    if name == "numpy":
        return NumpyComputeBackend
    try:
        module, cls = _BACKEND_MODULES[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown backend {name!r}; expected one of {sorted(_BACKEND_MODULES)}") from None
    return getattr(importlib.import_module(f"unienv_interface.backends.{module}"), cls)  # type: ignore[no-any-return]


def serialize_dtype(dtype: Any, backend: Any = None) -> str:
    """Canonical dtype name ('float32', 'bfloat16', 'uint16', ...), whatever library the dtype comes from."""
    if backend is not None and not isinstance(backend, type):
        dtype, backend = backend, dtype  # tolerate (backend, dtype) argument order
    if backend is not None:
        return str(backend.dtype_name(dtype))
    if type(dtype).__module__.startswith("torch"):
        return str(deserialize_backend("pytorch").dtype_name(dtype))
    if getattr(dtype, "name", None) == "bfloat16" or dtype == "bfloat16":  # ml_dtypes' bfloat16 (JAX's)
        return "bfloat16"
    return NumpyComputeBackend.dtype_name(dtype)


def deserialize_dtype(backend: Type[ComputeBackend], name: str) -> Any:
    """The dtype of `backend` called `name`; ValueError if the backend has no such dtype."""
    if isinstance(backend, str) and not isinstance(name, str):
        backend, name = name, backend
    if not isinstance(name, str):
        raise TypeError(f"dtype name must be a str, got {type(name).__name__}")
    return backend.dtype_from_name(name.replace("torch.", ""))
