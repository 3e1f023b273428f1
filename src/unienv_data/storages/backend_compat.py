"""`ToBackendOrDeviceStorage`: a storage whose elements live on one backend / device, served on another."""
from __future__ import annotations

import os
from typing import Any, Callable, Dict, Generic, Mapping, Optional, Type, Union

import numpy as np

from unienv_data.base.common import (BatchT, WrapperBArrayT, WrapperBatchT, WrapperBDeviceT, WrapperBDtypeT,
                                     WrapperBRngT)
from unienv_data.base.errors import StorageFormatError
from unienv_data.base.files import FORMAT_VERSION, PathLike
from unienv_data.base.registry import register_storage, storage_type_name
from unienv_data.base.storage import SpaceStorage
from unienv_data.base.wrapper import ValueMappingStorage
from unienv_interface.backends.base import BArrayType, BDeviceType, BDtypeType, BRNGType
from unienv_interface.backends.resolve import resolve_backend
from unienv_interface.backends.serialization import deserialize_backend, serialize_backend
from unienv_interface.space import BinarySpace, BoxSpace, DictSpace, Space, TupleSpace

METADATA_FILE = "backend_metadata.json"
INNER_PREFIX = "inner_storage"


def _backend_arg(backend: Any) -> Optional[Any]:
    return None if backend is None else resolve_backend(backend)


def _same_device(backend: Any, a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return bool(backend.serialize_device(a) == backend.serialize_device(b))


def _inner_space(space: Space, backend: Any, device: Any) -> Space:
    """`space.to(backend, device)`, with an error that names what the target backend lacks."""
    try:
        return space.to(backend=backend, device=device)
    except (ValueError, TypeError) as exc:
        target = backend if backend is not None else space.backend
        raise ValueError(f"cannot keep {space!r} on backend {target} / device {device!r}: {exc}") from None


def _map_leaves(space: Space, data: Any, fn: Callable[[Any], Any]) -> Any:
    """Applies `fn` to every array leaf of `data`, following the structure of `space`. Anything that does not fit
    the structure (missing or extra keys, a wrong container) is passed on unchanged for the inner storage to
    reject with its own error."""
    if isinstance(space, DictSpace):
        if not isinstance(data, Mapping):
            return data
        return {k: (_map_leaves(space.spaces[k], v, fn) if k in space.spaces else v) for k, v in data.items()}
    if isinstance(space, TupleSpace):
        if not isinstance(data, (tuple, list)) or len(data) != len(space.spaces):
            return data
        return tuple(_map_leaves(s, v, fn) for s, v in zip(space.spaces, data))
    if isinstance(space, (BoxSpace, BinarySpace)):
        return fn(data)
    return data


@register_storage
class ToBackendOrDeviceStorage(
    ValueMappingStorage[WrapperBatchT, WrapperBArrayT, WrapperBDeviceT, WrapperBDtypeT, WrapperBRngT],
    Generic[WrapperBatchT, WrapperBArrayT, WrapperBDeviceT, WrapperBDtypeT, WrapperBRngT,
            BatchT, BArrayType, BDeviceType, BDtypeType, BRNGType],
):
    """Serves an inner storage that keeps its elements on another backend and/or device: e.g. a NumPy-backend
    `NumpyMemmapStorage` read and written as torch tensors, or torch tensors stored on the CPU served on a GPU.

    * The outer space (`single_instance_space`) says what callers see; the inner storage holds
      `space.to(backend, device)`, with every dtype mapped by name (a dtype the inner backend lacks, e.g. bfloat16 on
      NumPy, is a ValueError at `create`).
    * `get` converts the inner result to the outer backend / device, `set` / `append` / segment writers convert
      arrays of the outer backend to the inner one; index arrays of the outer backend are converted too. Conversions
      keep dtypes and values, and share memory where the libraries allow it (`torch.from_numpy`, `Tensor.numpy()`,
      DLPack); results are still new arrays, never views into the storage. Values of other libraries (NumPy arrays,
      Python numbers, ...) go to the inner storage unchanged, which checks them as usual.
    * Everything else (capacity, length, segments, `clear`, `flush`, mutability) is the inner storage's.
    * Files: `<dir>/backend_metadata.json` = `{"storage_type": "ToBackendOrDeviceStorage", "inner_storage_type",
      "inner_storage_path" ("inner_storage<ext>"), "inner_backend", "inner_device", "format_version": 1}` (written
      atomically) and the inner storage beside it; type names resolve through the registry, never by import, and the
      inner path must stay inside the directory.

    Unlike the reference, `create` ALWAYS returns a ToBackendOrDeviceStorage, even when the backend and device equal
    the space's (the reference then returns the inner storage itself), so the type of the result is predictable;
    the wrapper then passes values through without converting them. `load_from` likewise always returns one.
    Closing it closes the inner storage only when it created or loaded it; garbage collection never closes anything.
    """

    metadata_file = METADATA_FILE

    def __init__(self, single_instance_space: Space, inner_storage: SpaceStorage, inner_storage_path: Union[str, PathLike],
                 cache_filename: Optional[Union[str, PathLike]] = None) -> None:
        super().__init__(single_instance_space, inner_storage, inner_storage_path, cache_filename)
        inner_space = inner_storage.single_instance_space
        expected = _inner_space(single_instance_space, inner_space.backend, inner_space.device)
        if expected != inner_space:
            raise ValueError(f"the inner storage holds {inner_space!r}, which is not the space on backend "
                             f"{inner_space.backend}: expected {expected!r}")
        self.inner_backend = inner_space.backend
        self.inner_device = inner_space.device
        outer = single_instance_space.backend
        self._same_backend = self.inner_backend is outer
        self._passthrough = self._same_backend and _same_device(outer, self.device, self.inner_device)

    # ------------------------------------------------------------------ construction
    @classmethod
    def create(cls, single_instance_space: Space, inner_storage_cls: Type[SpaceStorage], *args: Any,  # type: ignore[override]
               capacity: Optional[int] = None, cache_path: Optional[PathLike] = None, multiprocessing: bool = False,
               backend: Any = None, device: Any = None, inner_storage_kwargs: Dict[str, Any] = {},
               **kwargs: Any) -> "ToBackendOrDeviceStorage":
        """A new storage: `inner_storage_cls.create(space.to(backend, device), *args, capacity=..., cache_path=
        <cache_path>/inner_storage<ext>, multiprocessing=..., **kwargs, **inner_storage_kwargs)`, wrapped.

        `backend` / `device` are the INNER storage's (None keeps the space's own). Always returns a
        ToBackendOrDeviceStorage (see the class docstring). With `cache_path` the directory and its metadata are
        written at once, so it can be reopened with `load_from(cache_path, space)`.
        """
        if not isinstance(single_instance_space, Space):
            raise TypeError(f"single_instance_space must be a Space, got {type(single_instance_space).__name__}")
        inner_space = _inner_space(single_instance_space, _backend_arg(backend), device)
        return cls._create_wrapped((single_instance_space,), inner_storage_cls, inner_space, args,
                                   {**kwargs, **inner_storage_kwargs}, capacity=capacity, cache_path=cache_path,
                                   multiprocessing=multiprocessing, inner_prefix=INNER_PREFIX)

    @classmethod
    def load_from(cls, path: Union[str, PathLike], single_instance_space: Space, *, capacity: Optional[int] = None,
                  read_only: bool = True, multiprocessing: bool = False, **kwargs: Any) -> "ToBackendOrDeviceStorage":
        """Opens a directory written by `dumps` (this library's or the reference's). The inner backend and device
        come from the metadata; extra kwargs go to the inner storage's `load_from`."""
        path, meta, meta_path, inner_cls, inner_full, _version = cls._open_stored(
            path, "ToBackendOrDeviceStorage", ("inner_backend", "inner_device"))
        if not isinstance(meta["inner_backend"], str):
            raise StorageFormatError(f"{meta_path}: inner_backend must be a backend name, got {meta['inner_backend']!r}")
        try:
            inner_backend = deserialize_backend(meta["inner_backend"])
        except ValueError as exc:
            raise StorageFormatError(f"{meta_path}: {exc}") from None
        dev = meta["inner_device"]
        if dev is not None and not isinstance(dev, str):
            raise StorageFormatError(f"{meta_path}: inner_device must be a string or null, got {dev!r}")
        try:
            inner_device = inner_backend.deserialize_device(dev)
            if inner_backend.simplified_name == "numpy" and dev not in (None, "cpu"):
                raise ValueError("NumPy arrays live on the host ('cpu' or null)")
        except Exception as exc:  # noqa: BLE001 - each library raises its own type for a bad device string
            raise StorageFormatError(f"{meta_path}: invalid inner_device {dev!r} for {inner_backend}: {exc}") from None
        inner_space = _inner_space(single_instance_space, inner_backend, inner_device)
        try:
            inner = inner_cls.load_from(inner_full, inner_space, capacity=capacity, read_only=read_only,
                                        multiprocessing=multiprocessing, **kwargs)
        except TypeError as exc:
            if kwargs:
                raise       # may be the caller's keyword arguments
            # the recorded inner backend is one the recorded inner storage class does not take: damaged metadata
            raise StorageFormatError(f"{meta_path}: inner_backend {meta['inner_backend']!r} does not fit the inner "
                                     f"storage {inner_cls.__name__} ({exc})") from None
        return cls._adopt((single_instance_space,), inner, meta["inner_storage_path"],
                          path if inner.cache_filename is not None else None)

    # ------------------------------------------------------------------ conversion
    def _to_inner_leaf(self, x: Any) -> Any:
        outer, inner = self.backend, self.inner_backend
        if not outer.is_backendarray(x):
            return x
        if self._same_backend:
            return inner.to_device(x, self.inner_device)
        return inner.from_other_backend(outer, x, device=self.inner_device)

    def _to_outer_leaf(self, y: Any) -> Any:
        outer, inner = self.backend, self.inner_backend
        if self._same_backend:
            return outer.to_device(y, self.device) if self.device is not None else y
        if not inner.is_backendarray(y):
            return y
        out = outer.from_other_backend(inner, y, device=self.device)
        if outer.dtype_name(out.dtype) != inner.dtype_name(y.dtype):
            raise TypeError(f"converting {inner.dtype_name(y.dtype)} from {inner} to {outer} gave "
                            f"{outer.dtype_name(out.dtype)}; refusing to change the dtype")
        return out

    def _to_inner(self, value: Any) -> Any:
        if self._passthrough:
            return value
        return _map_leaves(self.single_instance_space, value, self._to_inner_leaf)

    def _to_outer(self, value: Any) -> Any:
        if self._passthrough:
            return value
        return _map_leaves(self.inner_storage.single_instance_space, value, self._to_outer_leaf)

    def _index_to_inner(self, index: Any) -> Any:
        if self._passthrough or isinstance(index, (int, slice, list, tuple, np.generic)) or index is Ellipsis:
            return index
        return self._to_inner_leaf(index)

    # ------------------------------------------------------------------ delegated properties

    # ------------------------------------------------------------------ data
    def get(self, index: Any) -> Any:
        """Element(s) at `index` on the outer backend / device (new arrays)."""
        self._check_open()
        return self._to_outer(self.inner_storage.get(self._index_to_inner(index)))

    def get_into(self, index: Any, out: Any) -> None:
        """Writes the rows at `index` into the NumPy array `out` (see `ArrayStorageBase.get_into`): straight from
        the inner storage when it reads into arrays (conversions keep dtypes and values), else through `get`."""
        self._check_open()
        fn = getattr(self.inner_storage, "get_into", None)
        if fn is not None:
            fn(self._index_to_inner(index), out)
            return
        from unienv_data.batches._tree import copy_into
        copy_into(out, self.get(index))

    def get_column(self, nested_keys: Any) -> "ToBackendOrDeviceStorage":
        """One column of the inner storage (its `get_column`), served on this storage's backend / device: a live
        view that reads and converts only that field (so a column reader over a buffer opened on another backend
        does not read whole rows). NotImplementedError when the inner storage has no `get_column`."""
        self._check_open()
        fn = getattr(self.inner_storage, "get_column", None)
        if fn is None:
            raise NotImplementedError(f"{type(self.inner_storage).__name__} (the inner storage) has no get_column")
        inner_col = fn(nested_keys)
        outer = _inner_space(inner_col.single_instance_space, self.backend, self.device)
        return ToBackendOrDeviceStorage(outer, inner_col, self.inner_storage_path)

    # ------------------------------------------------------------------ persistence
    def _metadata(self) -> Dict[str, Any]:
        ib = self.inner_backend
        return {"storage_type": "ToBackendOrDeviceStorage", "inner_storage_type": storage_type_name(type(self.inner_storage)),
                "inner_storage_path": os.fspath(self.inner_storage_path), "inner_backend": serialize_backend(ib),
                "inner_device": ib.serialize_device(self.inner_device), "format_version": FORMAT_VERSION}

    def __getstate__(self) -> Dict[str, Any]:
        self._check_open()
        return {"space": self.single_instance_space, "inner": self.inner_storage, "inner_path": self.inner_storage_path,
                "cache": self._cache_filename, "owns": self.owns_inner_storage}

    def __setstate__(self, state: Dict[str, Any]) -> None:
        ToBackendOrDeviceStorage.__init__(self, state["space"], state["inner"], state["inner_path"], state["cache"])
        self.owns_inner_storage = state["owns"]



__all__ = ["ToBackendOrDeviceStorage", "METADATA_FILE"]
