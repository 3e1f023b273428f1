"""Routing the leaves of a `DictSpace` to child storages by their `Space.metadata["kind"]` (reference-api §5.3).

`dict_storage_kwargs_from_space(space, ...)` returns the `storage_cls_map` / `key_kwargs` / `nested_separator`
arguments of `DictStorage.create`; `create_dict_storage_from_space(space, capacity=..., cache_path=...)` builds the
storage at once.

Defaults (where this library differs from the reference, it says why):

* leaves with `metadata["kind"] == "image"` that are `(H, W, 3)` uint8 go to the image storage class: `ImageStorage`
  (`unienv_data.storages.image_storage`) when it can be imported, else the backend's array storage
  (`PytorchTensorStorage` for torch, `NumpyMemmapStorage` for NumPy). `create_dict_storage_from_space` without a
  `cache_path` uses the array storage, since a file-per-frame storage needs a directory;
* every other leaf goes to `"*"`, stored by `FlattenedStorage` over the backend's array storage. The reference
  defaulted to `HDF5Storage`, which this library does not have yet. A flat row promotes mixed dtypes (see
  `FlattenPromotionWarning`); for mixed-dtype data prefer `unienv_data.storages.native_layout`, which keeps
  every leaf in its own dtype.
"""
from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Type

from unienv_data.base.files import PathLike
from unienv_data.base.storage import SpaceStorage
from unienv_interface.space import BoxSpace, DictSpace, Space

from ._dict_routing import leaf_items
from .dict_storage import DictStorage
from .flattened import FlattenedStorage


def backend_array_storage(space: Space) -> Type[SpaceStorage]:
    """The single-array storage class serving the space's backend (imported on first use)."""
    name = space.backend.simplified_name
    if name == "pytorch":
        from .pytorch import PytorchTensorStorage
        return PytorchTensorStorage
    if name == "numpy":
        from .numpy_memmap import NumpyMemmapStorage
        return NumpyMemmapStorage
    raise TypeError(f"no array storage serves the {name} backend: use create_native_storage (it wraps the NumPy "
                    "layout in ToBackendOrDeviceStorage) or ToBackendOrDeviceStorage.create(space, ..., "
                    "backend='numpy')")


def default_image_storage(space: Space) -> Type[SpaceStorage]:
    """`ImageStorage` when `unienv_data.storages.image_storage` imports, else the backend's array storage."""
    try:
        from . import image_storage
        cls = getattr(image_storage, "ImageStorage", None)
    except ImportError:
        cls = None
    if isinstance(cls, type) and issubclass(cls, SpaceStorage):
        return cls
    return backend_array_storage(space)


def _is_hw3_uint8(space: Space) -> bool:
    if not isinstance(space, BoxSpace) or space.backend.dtype_name(space.dtype) != "uint8":
        return False
    shape = tuple(space.shape)
    return len(shape) == 3 and shape[-1] == 3


def dict_storage_kwargs_from_space(
        space: Space, *, kind_storage_cls: Optional[Mapping[str, Type[SpaceStorage]]] = None,
        key_storage_cls: Optional[Mapping[str, Type[SpaceStorage]]] = None,
        default_storage_cls: Optional[Type[SpaceStorage]] = None,
        kind_kwargs: Optional[Mapping[str, Mapping[str, Any]]] = None,
        key_kwargs: Optional[Mapping[str, Mapping[str, Any]]] = None,
        default_kwargs: Optional[Mapping[str, Any]] = None, nested_separator: str = "/") -> Dict[str, Any]:
    """`{"storage_cls_map", "key_kwargs", "nested_separator"}` for `DictStorage.create(space, **result, ...)`.

    * `key_storage_cls` (`{"obs/depth": SomeStorage}`) routes exact key paths first;
    * `kind_storage_cls` (default `{"image": <default image storage>}`) routes leaves by `metadata["kind"]`; the
      "image" kind only takes `(H, W, 3)` uint8 leaves (others fall through to the default);
    * everything else goes to `"*"` with `default_storage_cls` (default `FlattenedStorage` over the backend's array
      storage, with `default_kwargs` default `{"inner_storage_cls": <array storage>}`); no `"*"` entry is made when
      nothing is left for it.

    Per-key kwargs: `kind_kwargs[kind]` for kind-routed leaves, `default_kwargs` for `"*"`, then `key_kwargs[key]`
    on top (a key in `key_kwargs` that no entry uses raises KeyError).
    """
    if not isinstance(space, DictSpace):
        raise TypeError(f"routing needs a DictSpace, got {type(space).__name__}")
    kinds: Dict[str, Type[SpaceStorage]] = (dict(kind_storage_cls) if kind_storage_cls is not None
                                            else {"image": default_image_storage(space)})
    by_key = dict(key_storage_cls or {})
    kind_kw = {k: dict(v) for k, v in (kind_kwargs or {}).items()}
    if default_storage_cls is None:
        default_storage_cls = FlattenedStorage
        if default_kwargs is None:
            default_kwargs = {"inner_storage_cls": backend_array_storage(space)}
    storage_cls_map: Dict[str, Type[SpaceStorage]] = {}
    out_kwargs: Dict[str, Dict[str, Any]] = {}
    residual = False
    for raw_path, leaf in leaf_items(space):
        path = tuple(map(str, raw_path))
        key = nested_separator.join(path)
        if any(nested_separator.join(path[:i]) in by_key for i in range(1, len(path) + 1)):
            continue  # routed explicitly (the leaf itself or a sub-dict holding it)
        kind = leaf.metadata.get("kind") if len(leaf.metadata) else None
        if isinstance(kind, str) and kind in kinds and (kind != "image" or _is_hw3_uint8(leaf)):
            storage_cls_map[key] = kinds[kind]
            if kind in kind_kw:
                out_kwargs[key] = dict(kind_kw[kind])
        else:
            residual = True
    for key, cls in by_key.items():
        storage_cls_map[key] = cls  # DictStorage.create names a key that matches nothing
    if residual:
        storage_cls_map["*"] = default_storage_cls
        if default_kwargs:
            out_kwargs["*"] = dict(default_kwargs)
    for key, kw in (key_kwargs or {}).items():
        if key not in storage_cls_map:
            raise KeyError(f"key_kwargs names {key!r}, which no storage_cls_map entry uses: {list(storage_cls_map)}")
        out_kwargs[key] = {**out_kwargs.get(key, {}), **dict(kw)}
    return {"storage_cls_map": storage_cls_map, "key_kwargs": out_kwargs, "nested_separator": nested_separator}


def create_dict_storage_from_space(space: Space, *, capacity: Optional[int] = None,
                                   cache_path: Optional[PathLike] = None, multiprocessing: bool = False,
                                   **routing: Any) -> DictStorage:
    """`DictStorage.create(space, **dict_storage_kwargs_from_space(space, **routing), capacity=..., ...)`.

    Without `cache_path` (an in-memory storage) and without an explicit `kind_storage_cls`, image leaves use the
    backend's array storage instead of `ImageStorage` (files per frame need a directory).
    """
    if cache_path is None and "kind_storage_cls" not in routing:
        routing["kind_storage_cls"] = {"image": backend_array_storage(space)}
    kwargs = dict_storage_kwargs_from_space(space, **routing)
    return DictStorage.create(space, kwargs.pop("storage_cls_map"), capacity=capacity, cache_path=cache_path,
                              multiprocessing=multiprocessing, **kwargs)


__all__ = ["dict_storage_kwargs_from_space", "create_dict_storage_from_space", "backend_array_storage",
           "default_image_storage"]
