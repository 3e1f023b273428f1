"""`JaxComputeBackend`: the JAX adapter (needs the `jax` extra)."""
from __future__ import annotations

from typing import Any, Optional, Tuple, Union

import numpy as np

try:
    import jax
    import jax.numpy as jnp
    import array_api_compat
except ImportError as exc:  # pragma: no cover - exercised only without jax
    raise ModuleNotFoundError(
        "unienv_interface.backends.jax needs JAX; install the extra: pip install 'unienv-storage[jax]'"
    ) from exc

from .base import ComputeBackend

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
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        return rng, jax.random.randint(sub, shape, from_num, to_num, dtype=dtype or jnp.int32)

    @staticmethod
    def random_uniform(shape: Union[int, Tuple[int, ...]], *, rng: jax.Array, low: Any = 0.0, high: Any = 1.0,
                       dtype: Any = None, device: Any = None) -> Tuple[jax.Array, jax.Array]:
        rng, sub = jax.random.split(rng)
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        return rng, jax.random.uniform(sub, shape, dtype=dtype or jnp.float32, minval=low, maxval=high)

    @staticmethod
    def random_normal(shape: Union[int, Tuple[int, ...]], *, rng: jax.Array, mean: Any = 0.0, std: Any = 1.0,
                      dtype: Any = None, device: Any = None) -> Tuple[jax.Array, jax.Array]:
        rng, sub = jax.random.split(rng)
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        return rng, jax.random.normal(sub, shape, dtype=dtype or jnp.float32) * std + mean

    @staticmethod
    def random_permutation(n: int, *, rng: jax.Array, dtype: Any = None, device: Any = None) -> Tuple[jax.Array, jax.Array]:
        rng, sub = jax.random.split(rng)
        return rng, jax.random.permutation(sub, int(n)).astype(dtype or jnp.int32)


class JaxComputeBackend(ComputeBackend[Any, Any, Any, Any]):
    """JAX arrays (immutable: storages return fresh arrays, `at(x)[i].set(v)` returns a new array)."""

    _xp = array_api_compat.array_namespace(jnp.zeros(1))
    simplified_name = "jax"
    array_type = jax.Array
    default_integer_dtype = jnp.dtype("int64") if jax.config.jax_enable_x64 else jnp.dtype("int32")
    default_index_dtype = default_integer_dtype
    default_floating_dtype = jnp.dtype("float64") if jax.config.jax_enable_x64 else jnp.dtype("float32")
    default_boolean_dtype = jnp.dtype("bool")
    random = _JaxRandom

    @classmethod
    def at(cls, x: Any) -> Any:
        return x.at

    @classmethod
    def from_numpy(cls, a: np.ndarray, dtype: Any = None, device: Any = None) -> Any:
        out = jnp.asarray(a, dtype=None if dtype is None else cls.as_dtype(dtype))
        return out if device is None else jax.device_put(out, device)

    @classmethod
    def to_numpy(cls, x: Any) -> np.ndarray:
        return np.asarray(x)

    @classmethod
    def _from_foreign(cls, x: Any, device: Any) -> Any:
        try:
            out = jnp.from_dlpack(x)
        except Exception:
            out = jnp.asarray(np.asarray(x))
        return out if device is None else jax.device_put(out, device)

    @classmethod
    def device(cls, x: Any) -> Any:
        return next(iter(x.devices()))

    @classmethod
    def to_device(cls, x: Any, device: Any) -> Any:
        return x if device is None else jax.device_put(x, device)

    @classmethod
    def dtype_is_real_integer(cls, dtype: Any) -> bool:
        return jnp.dtype(dtype).kind in "iu"

    @classmethod
    def dtype_is_real_floating(cls, dtype: Any) -> bool:
        return jnp.issubdtype(jnp.dtype(dtype), jnp.floating)

    @classmethod
    def dtype_is_boolean(cls, dtype: Any) -> bool:
        return jnp.dtype(dtype) == jnp.dtype("bool")

    @classmethod
    def dtype_name(cls, dtype: Any) -> str:
        name = jnp.dtype(dtype).name
        if name not in _JAX_NAMES:
            raise ValueError(f"unsupported JAX dtype {dtype!r}")
        return name

    @classmethod
    def dtype_from_name(cls, name: str) -> Any:
        try:
            return _JAX_NAMES[name]
        except KeyError:
            raise ValueError(f"JAX has no dtype named {name!r}; expected one of {sorted(_JAX_NAMES)}") from None

    @classmethod
    def as_dtype(cls, dtype: Any) -> Any:
        if isinstance(dtype, str):
            return cls.dtype_from_name(dtype)
        return jnp.dtype(dtype)

    @classmethod
    def numpy_dtype(cls, dtype: Any) -> np.dtype:
        d = jnp.dtype(dtype)
        return np.dtype(np.uint16) if d.name == "bfloat16" else np.dtype(d.name)

    @classmethod
    def promote_types(cls, *dtypes: Any) -> Any:
        out = jnp.dtype(dtypes[0])
        for d in dtypes[1:]:
            out = jnp.promote_types(out, d)
        return out
