"""`JaxComputeBackend`: the JAX adapter (needs the `jax` extra)."""
from __future__ import annotations

from typing import Any, Dict, Optional, Tuple, Union

import numpy as np

from unienv_interface._optional import import_optional

from .base import ComputeBackend, as_shape

import_optional("jax", "jax", "unienv_interface.backends.jax")
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import array_api_compat  # noqa: E402

JaxArrayType = jax.Array
JaxDeviceType = Any
JaxDtypeType = Any
JaxRNGType = jax.Array

_JAX_NAMES = {n: jnp.dtype(n) for n in (
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float16", "bfloat16", "float32", "float64", "complex64", "complex128")}


class _JaxRandom:
    """Functional RNG over JAX PRNG keys: every draw splits the key and returns `(new_key, value)`."""

    @staticmethod
    def random_number_generator(seed: Optional[int] = None, *, device: Any = None) -> jax.Array:
        return jax.random.PRNGKey(int(np.random.SeedSequence(seed).generate_state(1)[0]) if seed is None else int(seed))

    @staticmethod
    def random_discrete_uniform(shape: Union[int, Tuple[int, ...]], from_num: int, to_num: int, *, rng: jax.Array,
                                dtype: Any = None, device: Any = None) -> Tuple[jax.Array, jax.Array]:
        rng, sub = jax.random.split(rng)
        return rng, jax.random.randint(sub, as_shape(shape), from_num, to_num, dtype=dtype or jnp.int32)

    @staticmethod
    def random_uniform(shape: Union[int, Tuple[int, ...]], *, rng: jax.Array, low: Any = 0.0, high: Any = 1.0,
                       dtype: Any = None, device: Any = None) -> Tuple[jax.Array, jax.Array]:
        rng, sub = jax.random.split(rng)
        return rng, jax.random.uniform(sub, as_shape(shape), dtype=dtype or jnp.float32, minval=low, maxval=high)

    @staticmethod
    def random_normal(shape: Union[int, Tuple[int, ...]], *, rng: jax.Array, mean: Any = 0.0, std: Any = 1.0,
                      dtype: Any = None, device: Any = None) -> Tuple[jax.Array, jax.Array]:
        rng, sub = jax.random.split(rng)
        return rng, jax.random.normal(sub, as_shape(shape), dtype=dtype or jnp.float32) * std + mean

    @staticmethod
    def random_exponential(shape: Union[int, Tuple[int, ...]], *, rng: jax.Array, lambd: float = 1.0,
                           dtype: Any = None, device: Any = None) -> Tuple[jax.Array, jax.Array]:
        rng, sub = jax.random.split(rng)
        return rng, jax.random.exponential(sub, as_shape(shape), dtype=dtype or jnp.float32) / lambd

    @staticmethod
    def random_geometric(shape: Union[int, Tuple[int, ...]], *, rng: jax.Array, p: float = 0.5,
                         dtype: Any = None, device: Any = None) -> Tuple[jax.Array, jax.Array]:
        rng, sub = jax.random.split(rng)
        return rng, jax.random.geometric(sub, p, as_shape(shape), dtype=dtype or jnp.int32)

    @staticmethod
    def random_permutation(n: int, *, rng: jax.Array, dtype: Any = None, device: Any = None) -> Tuple[jax.Array, jax.Array]:
        rng, sub = jax.random.split(rng)
        return rng, jax.random.permutation(sub, int(n)).astype(dtype or jnp.int32)


# True when JAX runs with 64-bit types enabled (JAX_ENABLE_X64); read once, as JAX fixes it at start-up.
_X64: bool = bool(jax.config.read("jax_enable_x64"))

# Without x64 JAX has no 64-bit arrays and would narrow these silently; we narrow only when no value changes.
_NARROWER: Dict[str, np.dtype] = {"int64": np.dtype(np.int32), "uint64": np.dtype(np.uint32), "float64": np.dtype(np.float32),
             "complex128": np.dtype(np.complex64)}


def _fit_for_jax(a: np.ndarray) -> np.ndarray:
    """`a` itself, or, when JAX runs without x64 and `a` is 64-bit, `a` narrowed to 32 bits if every value survives:
    integers must lie in the 32-bit range, finite floats must not overflow float32 (rounding is allowed, as for
    every float narrowing in this library). Otherwise ValueError, naming the dtype and JAX_ENABLE_X64."""
    narrow = None if _X64 else _NARROWER.get(a.dtype.name)
    if narrow is None or a.size == 0:
        return a if narrow is None else a.astype(narrow)
    if narrow.kind in "iu":
        info = np.iinfo(narrow)
        ok = bool(a.min() >= info.min) and bool(a.max() <= info.max)
    else:
        parts = (a.real, a.imag) if a.dtype.kind == "c" else (a,)
        limit = float(np.finfo(narrow).max)
        ok = all(bool(np.all(~np.isfinite(x) | (np.abs(x) <= limit))) for x in parts)
    if not ok:
        raise ValueError(f"JAX runs without 64-bit types, and these {a.dtype.name} values do not fit in "
                         f"{narrow.name}; set JAX_ENABLE_X64=1 before importing jax to keep them")
    return a.astype(narrow)


class JaxComputeBackend(ComputeBackend[Any, Any, Any, Any]):
    """JAX arrays (immutable: storages return fresh arrays, `at(x)[i].set(v)` returns a new array)."""

    _xp = array_api_compat.array_namespace(jnp.zeros(1))
    simplified_name = "jax"
    library_name = "JAX"
    _dtypes_by_name = _JAX_NAMES
    array_type = jax.Array
    default_integer_dtype = jnp.dtype("int64") if _X64 else jnp.dtype("int32")
    default_index_dtype = default_integer_dtype
    default_floating_dtype = jnp.dtype("float64") if _X64 else jnp.dtype("float32")
    default_boolean_dtype = jnp.dtype("bool")
    random = _JaxRandom

    @classmethod
    def at(cls, x: Any) -> Any:
        return x.at

    @classmethod
    def from_numpy(cls, a: np.ndarray, dtype: Any = None, device: Any = None) -> Any:
        """A JAX array of `a` (on `device`); 64-bit data needs JAX_ENABLE_X64 unless it fits 32 bits exactly."""
        if dtype is None:
            a = _fit_for_jax(np.asarray(a))
        out = jnp.asarray(a, dtype=None if dtype is None else cls.as_dtype(dtype))
        return out if device is None else jax.device_put(out, device)

    @classmethod
    def to_numpy(cls, x: Any) -> np.ndarray:
        return np.asarray(x)

    @classmethod
    def _from_foreign(cls, x: Any, device: Any) -> Any:
        wide = not _X64 and any(name in str(getattr(x, "dtype", "")) for name in _NARROWER)
        try:
            if wide:  # DLPack would hand over 64-bit buffers that JAX then narrows without a check
                raise TypeError("64-bit data goes through the checked NumPy path")
            out = jnp.from_dlpack(x)
        except Exception:
            host = x.numpy(force=True) if hasattr(x, "numpy") and not isinstance(x, np.ndarray) else np.asarray(x)
            out = jnp.asarray(_fit_for_jax(np.asarray(host)))
        return out if device is None else jax.device_put(out, device)

    @classmethod
    def device(cls, x: Any) -> Any:
        return next(iter(x.devices()))

    @classmethod
    def to_device(cls, x: Any, device: Any) -> Any:
        return x if device is None else jax.device_put(x, device)

    @classmethod
    def dtype_name(cls, dtype: Any) -> str:
        name = jnp.dtype(dtype).name
        if name not in _JAX_NAMES:
            raise ValueError(f"unsupported JAX dtype {dtype!r}")
        return name

    @classmethod
    def as_dtype(cls, dtype: Any) -> Any:
        if isinstance(dtype, str):
            return cls.dtype_from_name(dtype)
        return jnp.dtype(dtype)

    @classmethod
    def promote_types(cls, *dtypes: Any) -> Any:
        out = jnp.dtype(dtypes[0])
        for d in dtypes[1:]:
            out = jnp.promote_types(out, d)
        return out
