"""`ComputeBackend`: a stateless namespace class that adapts one array library.

A backend is never instantiated: the class itself is the namespace (`NumpyComputeBackend.zeros(...)`).
Every name of the library's Array-API namespace (from `array-api-compat`) is reachable on the class through
the metaclass, and the members below add what spaces and storages need on top: conversion between
libraries, dtype classification and names, devices, a functional random-number API and small helpers.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Generic, Optional, Sequence, Tuple, TypeVar, Union

import numpy as np

BArrayType = TypeVar("BArrayType")
BDeviceType = TypeVar("BDeviceType")
BDtypeType = TypeVar("BDtypeType")
BRNGType = TypeVar("BRNGType")

ArrayAPIArray = Any
ArrayAPIGetIndex = Any
ArrayAPISetIndex = Any

#: Canonical dtype names every backend understands when it has the dtype (serialization vocabulary).
DTYPE_NAMES: Tuple[str, ...] = (
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float16", "bfloat16", "float32", "float64", "complex64", "complex128",
)

#: The kind of number each canonical dtype holds: "b" boolean, "i" integer (signed or unsigned), "f" real
#: floating point, "c" complex. The dtype predicates of every backend read it.
DTYPE_KINDS: Dict[str, str] = {name: ("b" if name == "bool" else "i" if "int" in name else "c" if "complex" in name
                                      else "f") for name in DTYPE_NAMES}


def _kind_test(kind: str, what: str) -> Any:
    """A `dtype_is_*` classmethod: whether a dtype of the backend is one of `kind` (see `DTYPE_KINDS`)."""
    def test(cls: Any, dtype: Any) -> bool:
        return cls.dtype_kind(dtype) == kind
    test.__doc__ = f"True when `dtype` is a {what} dtype of this backend."
    return classmethod(test)


class _BackendMeta(type):
    """Makes a backend class behave as a namespace: no instances, readable repr, Array-API fall-through."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(
            f"{cls.__name__} is a namespace and is never instantiated; use the class itself, e.g. {cls.__name__}.zeros(...)"
        )

    def __repr__(cls) -> str:
        return str(cls.__dict__.get("simplified_name", cls.__name__))

    __str__ = __repr__

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        xp = type.__getattribute__(cls, "_xp")
        if xp is None:
            raise AttributeError(f"{cls.__name__} has no attribute {name!r}")
        try:
            return getattr(xp, name)
        except AttributeError:
            raise AttributeError(f"{cls.__name__} has no attribute {name!r}") from None


class _AtSetter:
    """`B.at(x)[idx].set(v)`: functional-looking index update; in place for mutable arrays."""

    __slots__ = ("_x", "_idx")

    def __init__(self, x: Any, idx: Any = None) -> None:
        self._x = x
        self._idx = idx

    def __getitem__(self, idx: Any) -> "_AtSetter":
        return _AtSetter(self._x, idx)

    def set(self, value: Any) -> Any:
        self._x[self._idx] = value
        return self._x

    def add(self, value: Any) -> Any:
        self._x[self._idx] += value
        return self._x


class _NamespaceInfo:
    """`B.__array_namespace_info__()`: the Array-API inspection object, with every dtype the backend has."""

    def __init__(self, backend: Any, xp: Any) -> None:
        self._backend = backend
        self._xp = xp  # the wrapped Array-API namespace, or None for an abstract backend

    def dtypes(self, *, device: Any = None, kind: Any = None) -> Dict[str, Any]:
        names = self._backend.dtype_names()
        if kind is None:
            return names
        b = self._backend
        pick = {"bool": b.dtype_is_boolean, "integral": b.dtype_is_real_integer, "real floating": b.dtype_is_real_floating}
        test = pick.get(kind)
        return names if test is None else {n: d for n, d in names.items() if test(d)}

    def default_dtypes(self, *, device: Any = None) -> Dict[str, Any]:
        b = self._backend
        return {"real floating": b.default_floating_dtype, "integral": b.default_integer_dtype,
                "indexing": b.default_index_dtype}

    def devices(self) -> list:
        xp = self._xp
        return list(xp.__array_namespace_info__().devices()) if xp is not None else []


class ComputeBackend(Generic[BArrayType, BDeviceType, BDtypeType, BRNGType], metaclass=_BackendMeta):
    """Base of every backend namespace. Subclasses set `_xp` and implement the library-specific members."""

    _xp: Any = None
    simplified_name: str = "abstract"
    array_type: type = object
    default_integer_dtype: Any = None
    default_index_dtype: Any = None
    default_floating_dtype: Any = None
    default_boolean_dtype: Any = None
    #: the library's name in messages, and its dtypes by canonical name (a subset of `DTYPE_NAMES`)
    library_name: str = "this backend"
    _dtypes_by_name: Dict[str, Any] = {}
    inf: float = float("inf")
    nan: float = float("nan")
    random: Any = None

    @classmethod
    def __array_namespace_info__(cls) -> _NamespaceInfo:
        return _NamespaceInfo(cls, cls._xp)

    # ----------------------------------------------------------------- arrays
    @classmethod
    def is_backendarray(cls, x: Any) -> bool:
        """True when `x` is an array of this backend's library."""
        return isinstance(x, cls.array_type)

    @classmethod
    def from_numpy(cls, a: np.ndarray, dtype: Any = None, device: Any = None) -> Any:
        raise NotImplementedError

    @classmethod
    def to_numpy(cls, x: Any) -> np.ndarray:
        raise NotImplementedError

    @classmethod
    def to_dlpack(cls, x: Any) -> Any:
        """A DLPack capsule of `x` (zero-copy hand-over to another library)."""
        return x.__dlpack__()

    @classmethod
    def from_other_backend(cls, other: Any, x: Any, device: Any = None) -> Any:
        """Converts an array of backend `other` into this backend (DLPack where possible, else through NumPy)."""
        if other is cls:
            return x if device is None else cls.to_device(x, device)
        return cls._from_foreign(x, device)

    @classmethod
    def _from_foreign(cls, x: Any, device: Any) -> Any:
        raise NotImplementedError

    # ----------------------------------------------------------------- dtypes
    @classmethod
    def dtype_name(cls, dtype: Any) -> str:
        """Canonical name of a dtype of this backend ('float32', 'bfloat16', ...); ValueError for another."""
        raise NotImplementedError

    @classmethod
    def dtype_from_name(cls, name: str) -> Any:
        """The dtype called `name` (one of `DTYPE_NAMES`); ValueError if this backend lacks it."""
        try:
            return cls._dtypes_by_name[name]
        except KeyError:
            raise ValueError(f"{cls.library_name} has no dtype named {name!r}; expected one of "
                             f"{sorted(cls._dtypes_by_name)}") from None

    @classmethod
    def dtype_kind(cls, dtype: Any) -> str:
        """`DTYPE_KINDS` of `dtype`, or "" when it is not a dtype of this backend."""
        try:
            return DTYPE_KINDS[cls.dtype_name(dtype)]
        except (TypeError, ValueError):
            return ""

    dtype_is_real_integer = _kind_test("i", "signed or unsigned integer")
    dtype_is_real_floating = _kind_test("f", "real floating-point")
    dtype_is_boolean = _kind_test("b", "boolean")

    @classmethod
    def as_dtype(cls, dtype: Any) -> Any:
        """Normalises a dtype-like value (Python `int`/`float`/`bool`, a name, a NumPy dtype) to this backend's dtype."""
        raise NotImplementedError

    @classmethod
    def numpy_dtype(cls, dtype: Any) -> np.dtype:
        """The NumPy dtype holding the same bytes (bfloat16 maps to its raw 16-bit pattern, uint16)."""
        name = cls.dtype_name(dtype)
        return np.dtype(np.uint16) if name == "bfloat16" else np.dtype(name)

    @classmethod
    def promote_types(cls, *dtypes: Any) -> Any:
        """The dtype this library's concatenation promotes `dtypes` to."""
        raise NotImplementedError

    @classmethod
    def itemsize(cls, dtype: Any) -> int:
        return int(cls.numpy_dtype(dtype).itemsize)

    # ----------------------------------------------------------------- devices
    @classmethod
    def serialize_device(cls, device: Any) -> Optional[str]:
        return None if device is None else str(device)

    @classmethod
    def deserialize_device(cls, device: Optional[str]) -> Any:
        return device

    @classmethod
    def check_device(cls, device: Any) -> Any:
        """`device` when arrays of this backend can be placed there on this machine (None: the default device);
        ValueError naming the device and what is available otherwise, so a dataset opened for a missing device
        fails where it is opened, not at its first read."""
        return device

    # ----------------------------------------------------------------- helpers
    @classmethod
    def at(cls, x: Any) -> _AtSetter:
        return _AtSetter(x)

    @classmethod
    def abbreviate_array(cls, x: Any, try_cast_scalar: bool = True) -> Any:
        """Collapses every axis along which `x` is constant to size 1; a constant array becomes a scalar
        (Python number) when `try_cast_scalar`."""
        a = cls.to_numpy(x)
        for axis in range(a.ndim):
            if a.shape[axis] > 1:
                first = np.take(a, [0], axis=axis)
                if np.array_equal(a, np.broadcast_to(first, a.shape), equal_nan=a.dtype.kind == "f"):
                    a = first
        if try_cast_scalar and a.size == 1:
            return a.reshape(()).item()
        return cls.from_numpy(np.array(a, order="C"), device=cls.device(x) if cls.is_backendarray(x) else None)

    @classmethod
    def map_fn_over_arrays(cls, data: Any, fn: Callable[[Any], Any]) -> Any:
        """Applies `fn` to every array leaf of a nested dict / list / tuple."""
        if cls.is_backendarray(data):
            return fn(data)
        if isinstance(data, dict):
            return {k: cls.map_fn_over_arrays(v, fn) for k, v in data.items()}
        if isinstance(data, (list, tuple)):
            return type(data)(cls.map_fn_over_arrays(v, fn) for v in data)
        return data

    @classmethod
    def pad_dim(cls, x: Any, dim: int, size: int, value: Any = 0) -> Any:
        """Pads axis `dim` of `x` at the end up to `size` with `value`."""
        cur = x.shape[dim]
        if cur >= size:
            return x
        pad_shape = list(x.shape)
        pad_shape[dim] = size - cur
        pad = cls._xp.full(tuple(pad_shape), value, dtype=x.dtype, device=cls.device(x))
        return cls._xp.concat([x, pad], axis=dim)

    @classmethod
    def dtype_names(cls) -> Dict[str, Any]:
        """Every dtype this backend has, by canonical name."""
        return {n: cls._dtypes_by_name[n] for n in DTYPE_NAMES if n in cls._dtypes_by_name}


def as_shape(shape: Union[int, Sequence[int]]) -> Tuple[int, ...]:
    """A shape argument of the random API as a tuple (an int `n` means `(n,)`)."""
    return (shape,) if isinstance(shape, int) else tuple(shape)


def check_shape(shape: Sequence[int]) -> Tuple[int, ...]:
    """Validates and normalises a shape tuple (non-negative ints)."""
    out = []
    for d in shape:
        if isinstance(d, bool) or not isinstance(d, (int, np.integer)) or int(d) < 0:
            raise ValueError(f"shape entries must be non-negative integers, got {tuple(shape)!r}")
        out.append(int(d))
    return tuple(out)
