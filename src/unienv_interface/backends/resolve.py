"""`resolve_backend`: the one place that turns what a caller passes as a backend into a `ComputeBackend` class."""
from __future__ import annotations

import types
from typing import Any, Dict, Type

from .base import ComputeBackend
from .serialization import deserialize_backend

#: every spelling of a backend name accepted from callers (the serialized names are the values)
BACKEND_ALIASES: Dict[str, str] = {
    "numpy": "numpy", "np": "numpy",
    "pytorch": "pytorch", "torch": "pytorch",
    "jax": "jax", "jax.numpy": "jax", "jnp": "jax",
}


def resolve_backend(backend: Any) -> Type[ComputeBackend]:
    """The `ComputeBackend` class `backend` names. Accepted: a backend class (`NumpyComputeBackend`, ...), a name
    ("numpy" / "np", "torch" / "pytorch", "jax" / "jax.numpy" / "jnp", any case) and an array module (`numpy`,
    `torch`, `jax`, `jax.numpy`). torch and JAX are imported only when named. TypeError / ValueError for anything
    else, listing what is accepted."""
    if isinstance(backend, type) and issubclass(backend, ComputeBackend):
        return backend
    if isinstance(backend, str):
        name = BACKEND_ALIASES.get(backend.strip().lower())
        if name is None:
            raise ValueError(f"unknown backend name {backend!r}; expected one of {sorted(BACKEND_ALIASES)} (or a "
                             "ComputeBackend class, or the array module: numpy, torch, jax.numpy)")
        return deserialize_backend(name)
    if isinstance(backend, types.ModuleType):
        root = backend.__name__.split(".")[0]
        name = BACKEND_ALIASES.get(root)
        if name is not None:
            return deserialize_backend(name)
        raise ValueError(f"module {backend.__name__!r} is not an array library with a backend; expected numpy, "
                         "torch or jax.numpy")
    raise TypeError(f"backend must be a ComputeBackend class (e.g. NumpyComputeBackend), a name ('numpy', 'torch', "
                    f"'jax') or an array module (numpy, torch, jax.numpy); got {backend!r}")


__all__ = ["resolve_backend", "BACKEND_ALIASES"]
