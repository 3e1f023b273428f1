"""`PyTorchComputeBackend`: the PyTorch adapter (needs the `torch` extra)."""
from __future__ import annotations

from typing import Any, Optional, Tuple, Union

import numpy as np

from unienv_interface._optional import import_optional

from .base import ComputeBackend, as_shape

import_optional("torch", "torch", "unienv_interface.backends.pytorch")
import torch  # noqa: E402
import array_api_compat.torch as _xtorch  # noqa: E402

PyTorchArrayType = torch.Tensor
PyTorchDeviceType = Union[torch.device, str]
PyTorchDtypeType = torch.dtype
PyTorchRNGType = torch.Generator

_TORCH_NAMES = {
    "bool": torch.bool, "int8": torch.int8, "int16": torch.int16, "int32": torch.int32, "int64": torch.int64,
    "uint8": torch.uint8, "uint16": torch.uint16, "uint32": torch.uint32, "uint64": torch.uint64,
    "float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32, "float64": torch.float64,
    "complex64": torch.complex64, "complex128": torch.complex128,
}
_NAME_OF = {v: k for k, v in _TORCH_NAMES.items()}


def _dev(device: Any) -> Optional[torch.device]:
    return None if device is None else torch.device(device)


def _empty64(shape: Union[int, Tuple[int, ...]], device: Any) -> torch.Tensor:
    """An uninitialised float64 tensor of `shape` on `device`, for an in-place draw in double precision."""
    return torch.empty(as_shape(shape), dtype=torch.float64, device=_dev(device))


class _TorchRandom:
    """Functional RNG over `torch.Generator`: every draw returns `(rng, value)`."""

    @staticmethod
    def random_number_generator(seed: Optional[int] = None, *, device: Any = None) -> torch.Generator:
        g = torch.Generator(device=_dev(device) or "cpu")
        if seed is None:
            g.seed()
        else:
            g.manual_seed(int(seed))
        return g

    @staticmethod
    def random_discrete_uniform(shape: Union[int, Tuple[int, ...]], from_num: int, to_num: int, *, rng: torch.Generator,
                                dtype: Any = None, device: Any = None) -> Tuple[torch.Generator, torch.Tensor]:
        out = torch.randint(int(from_num), int(to_num), as_shape(shape), generator=rng, dtype=torch.int64, device=_dev(device))
        return rng, out if dtype is None else out.to(dtype)

    @staticmethod
    def random_uniform(shape: Union[int, Tuple[int, ...]], *, rng: torch.Generator, low: Any = 0.0, high: Any = 1.0,
                       dtype: Any = None, device: Any = None) -> Tuple[torch.Generator, torch.Tensor]:
        u = torch.rand(as_shape(shape), generator=rng, dtype=torch.float64, device=_dev(device))
        out = torch.as_tensor(low, dtype=torch.float64) + u * (torch.as_tensor(high, dtype=torch.float64) - torch.as_tensor(low, dtype=torch.float64))
        return rng, out.to(dtype or torch.float32)

    @staticmethod
    def random_normal(shape: Union[int, Tuple[int, ...]], *, rng: torch.Generator, mean: Any = 0.0, std: Any = 1.0,
                      dtype: Any = None, device: Any = None) -> Tuple[torch.Generator, torch.Tensor]:
        out = torch.randn(as_shape(shape), generator=rng, dtype=torch.float64, device=_dev(device)) * std + mean
        return rng, out.to(dtype or torch.float32)

    @staticmethod
    def random_exponential(shape: Union[int, Tuple[int, ...]], *, rng: torch.Generator, lambd: float = 1.0,
                           dtype: Any = None, device: Any = None) -> Tuple[torch.Generator, torch.Tensor]:
        return rng, _empty64(shape, device).exponential_(lambd, generator=rng).to(dtype or torch.float32)

    @staticmethod
    def random_geometric(shape: Union[int, Tuple[int, ...]], *, rng: torch.Generator, p: float = 0.5,
                         dtype: Any = None, device: Any = None) -> Tuple[torch.Generator, torch.Tensor]:
        return rng, _empty64(shape, device).geometric_(p, generator=rng).to(dtype or torch.int64)

    @staticmethod
    def random_permutation(n: int, *, rng: torch.Generator, dtype: Any = None,
                           device: Any = None) -> Tuple[torch.Generator, torch.Tensor]:
        return rng, torch.randperm(int(n), generator=rng, dtype=dtype or torch.int64, device=_dev(device))


#: devices `check_device` has already placed a tensor on
_REACHABLE_DEVICES: set = set()


class PyTorchComputeBackend(ComputeBackend[torch.Tensor, Union[torch.device, str], torch.dtype, torch.Generator]):
    """PyTorch tensors on any device. The default integer dtype is int32 (so Binary leaves flatten to int32)."""

    _xp = _xtorch
    simplified_name = "pytorch"
    library_name = "PyTorch"
    _dtypes_by_name = _TORCH_NAMES
    array_type = torch.Tensor
    default_integer_dtype = torch.int32
    default_index_dtype = torch.int64
    default_floating_dtype = torch.float32
    default_boolean_dtype = torch.bool
    random = _TorchRandom

    @classmethod
    def from_numpy(cls, a: np.ndarray, dtype: Any = None, device: Any = None) -> torch.Tensor:
        a = np.asarray(a)
        if not a.flags.writeable:
            a = a.copy()
        t = torch.from_numpy(a)
        if dtype is not None and cls.as_dtype(dtype) != t.dtype:
            t = t.to(cls.as_dtype(dtype))
        if device is not None:
            t = t.to(device)
        return t

    @classmethod
    def to_numpy(cls, x: Any) -> np.ndarray:
        if isinstance(x, torch.Tensor):
            t = x.detach()
            if t.device.type != "cpu":
                t = t.cpu()
            if t.dtype == torch.bfloat16:
                return t.view(torch.int16).numpy().view(np.uint16)
            return t.numpy()
        return np.asarray(x)

    @classmethod
    def _from_foreign(cls, x: Any, device: Any) -> torch.Tensor:
        if isinstance(x, np.ndarray):
            return cls.from_numpy(x, device=device)
        try:
            t = torch.from_dlpack(x)
        except Exception:
            t = torch.as_tensor(np.asarray(x))
        return t if device is None else t.to(device)

    @classmethod
    def device(cls, x: Any) -> torch.device:
        return x.device

    @classmethod
    def to_device(cls, x: Any, device: Any) -> torch.Tensor:
        return x if device is None else x.to(device)

    @classmethod
    def dtype_name(cls, dtype: Any) -> str:
        try:
            return _NAME_OF[dtype]
        except (KeyError, TypeError):
            raise ValueError(f"unsupported PyTorch dtype {dtype!r}; expected one of {sorted(_TORCH_NAMES)}") from None

    @classmethod
    def as_dtype(cls, dtype: Any) -> torch.dtype:
        if isinstance(dtype, torch.dtype):
            return dtype
        if isinstance(dtype, str):
            return cls.dtype_from_name(dtype.replace("torch.", ""))
        if dtype is int:
            return torch.int64
        if dtype is float:
            return torch.float32
        if dtype is bool:
            return torch.bool
        try:
            return cls.dtype_from_name(np.dtype(dtype).name)
        except TypeError:
            raise TypeError(f"not a PyTorch dtype: {dtype!r}") from None

    @classmethod
    def promote_types(cls, *dtypes: Any) -> torch.dtype:
        if not dtypes:
            raise ValueError("promote_types needs at least one dtype")
        out = dtypes[0]
        for d in dtypes[1:]:
            out = torch.promote_types(out, d)
        return out

    @classmethod
    def serialize_device(cls, device: Any) -> Optional[str]:
        return None if device is None else str(torch.device(device))

    @classmethod
    def deserialize_device(cls, device: Optional[str]) -> Optional[torch.device]:
        return None if device is None else torch.device(device)

    @classmethod
    def check_device(cls, device: Any) -> Any:
        if device is None:
            return None
        key = str(device)
        if key in _REACHABLE_DEVICES:
            return device
        try:
            torch.empty(0, device=device)   # what a read would do first; torch asserts for a missing CUDA
        except (AssertionError, RuntimeError, TypeError, ValueError) as exc:
            cuda = "available" if torch.cuda.is_available() else "not available"
            raise ValueError(f"PyTorch cannot place tensors on device {device!r} here ({exc}); CUDA is {cuda} "
                             f"(torch {torch.__version__}): pass device=None or 'cpu', or a device this machine "
                             "has") from None
        _REACHABLE_DEVICES.add(key)
        return device
