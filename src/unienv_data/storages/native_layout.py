"""The native layout: a `DictStorage` that keeps every leaf of a `DictSpace` in its own dtype.

`create_native_storage(space, capacity=..., cache_path=...)` is the recommended way to store trajectories whose
leaves have different dtypes, and anything with images. It builds one `DictStorage` with these children:

* **dtype groups**: low-dimensional Box leaves of one dtype (e.g. every float32 leaf: obs, action, reward) share
  one `FlattenedStorage` whose row has exactly that dtype, over the backend's array storage
  (`PytorchTensorStorage` for torch, `NumpyMemmapStorage` for NumPy). The child is a *group* of the
  `DictStorage` (key `"@float32"`, ...) whose space is the sub-dict of those leaves, nested as in the full space.
  A dtype with a single leaf skips the flat row and gets a plain array storage;
* **bool leaves** (`BinarySpace`): one bool array storage each (1 byte per element). They are not grouped: a flat
  row cannot hold bools without widening them to the default integer dtype (4 or 8 bytes each);
* **images**: uint8 Box leaves shaped `(H, W, C)` with `C` in 1, 3, 4, and any leaf whose `metadata["kind"]` is
  `"image"`: their own array storage, or with `image_storage="video"` a `VideoStorage` (lossy by default: pass
  `video_kwargs` to choose the codec);
* bfloat16 leaves get their own array storage each; other leaf types (Text, Tuple, ...) a `FlattenedStorage` each.

So no value is ever promoted (uint8 stays uint8, bool stays bool, an int64 above 2**53 survives), no
`FlattenPromotionWarning` is raised, and the bytes on disk are the native bytes of the data. The result behaves
like a single storage of the whole space: `get` returns the original nested dict (in the space's key order),
`set` / `append` / segment writers check the whole sample before writing any child, and segments are recorded in
every child alike. A batch read is one gather per child (three for the usual obs/action/reward/done/image step);
an append is one row write per child.

When to use which: `FlattenedStorage` alone is the right choice when every leaf has the same dtype (one array, one
gather, the least per-call overhead) or when the flat row is what the consumer wants (`get_flattened` without a
copy per key). As soon as the leaves mix dtypes, and always for images, use the native layout: a flat row
promotes to the widest dtype (uint8 images in float32 rows take 4x the bytes, 8x next to bool leaves on NumPy) and
integers above the float's mantissa can no longer be stored.

Reopen with `load_native_storage(path, space)` (the same as `DictStorage.load_from`: the groups are recorded in
the metadata).

A space on a backend without an array storage of its own (JAX) is stored on NumPy: `create_native_storage`
returns a `ToBackendOrDeviceStorage` around the NumPy native layout that converts every read to the space's backend
and device (through DLPack where it can) and every write to NumPy; `load_native_storage` reopens it the same way. With a replay buffer: `ReplayBuffer.create(DictStorage, space, capacity=..., cache_path=...,
**native_layout_kwargs(space))`.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Any, Dict, List, Mapping, Optional, Type, Union

from unienv_data.base.files import PathLike
from unienv_data.base.storage import SpaceStorage
from unienv_interface.space import BinarySpace, BoxSpace, DictSpace, Space, TextSpace

from ._dict_routing import leaf_items
from .backend_compat import ToBackendOrDeviceStorage
from .dict_storage import DictStorage
from .flattened import FlattenedStorage
from .metadata_routing import backend_array_storage

IMAGE_STORAGES = ("array", "video")


def is_image_leaf(space: Space) -> bool:
    """True for uint8 Box leaves shaped (H, W, C) with C in 1, 3, 4, and for leaves with `metadata["kind"] == "image"`."""
    if len(space.metadata) and space.metadata.get("kind") == "image":
        return True
    if not isinstance(space, BoxSpace) or space.backend.dtype_name(space.dtype) != "uint8":
        return False
    shape = tuple(space.shape)
    return len(shape) == 3 and shape[-1] in (1, 3, 4)


def _video_storage_cls() -> Type[SpaceStorage]:
    try:
        from .video_storage import VideoStorage
    except ImportError as exc:
        raise ModuleNotFoundError(
            "image_storage='video' needs unienv_data.storages.video_storage.VideoStorage and PyAV "
            f"(pip install 'unienv-storage[video]'); it could not be imported: {exc}") from exc
    return VideoStorage  # type: ignore[no-any-return]


def native_layout_kwargs(space: Space, *, image_storage: str = "array",
                         video_kwargs: Optional[Mapping[str, Any]] = None,
                         nested_separator: str = "/") -> Dict[str, Any]:
    """The `DictStorage.create` keyword arguments of the native layout of `space` (see the module docstring):
    `{"storage_cls_map", "groups", "key_kwargs", "nested_separator"}`."""
    if not isinstance(space, DictSpace):
        raise TypeError(f"the native layout stores a DictSpace, got {type(space).__name__}; a single Box or Binary "
                        "space goes straight into PytorchTensorStorage / NumpyMemmapStorage")
    if image_storage not in IMAGE_STORAGES:
        raise ValueError(f"image_storage must be one of {IMAGE_STORAGES}, got {image_storage!r}")
    array_cls = backend_array_storage(space)
    image_cls = _video_storage_cls() if image_storage == "video" else array_cls
    sep = nested_separator
    storage_cls_map: Dict[str, Type[SpaceStorage]] = {}
    key_kwargs: Dict[str, Dict[str, Any]] = {}
    by_dtype: "OrderedDict[str, List[str]]" = OrderedDict()
    for path, leaf in leaf_items(space):
        key = sep.join(path)
        if is_image_leaf(leaf):
            storage_cls_map[key] = image_cls
            if image_storage == "video" and video_kwargs:
                key_kwargs[key] = dict(video_kwargs)
        elif isinstance(leaf, BinarySpace):
            storage_cls_map[key] = array_cls
        elif isinstance(leaf, BoxSpace):
            name = leaf.backend.dtype_name(leaf.dtype)
            if name == "bfloat16":  # a flat row cannot be bfloat16; the array storage keeps its raw bits
                storage_cls_map[key] = array_cls
            else:
                by_dtype.setdefault(name, []).append(key)
        else:
            if isinstance(leaf, TextSpace) and leaf.charset is None:
                raise ValueError(f"key {key!r}: a TextSpace without a charset cannot be stored in the native layout "
                                 "(its characters are kept as integer codes of the charset); give it one, e.g. "
                                 f"TextSpace(backend, max_length={leaf.max_length}, charset=string.printable)")
            storage_cls_map[key] = FlattenedStorage
            key_kwargs[key] = {"inner_storage_cls": array_cls}
    groups: Dict[str, List[str]] = {}
    for name, keys in by_dtype.items():
        if len(keys) == 1:
            storage_cls_map[keys[0]] = array_cls
            continue
        group = "@" + name
        while group in space.spaces:
            group = "@" + group
        groups[group] = keys
        storage_cls_map[group] = FlattenedStorage
        key_kwargs[group] = {"inner_storage_cls": array_cls}
    return {"storage_cls_map": storage_cls_map, "groups": groups, "key_kwargs": key_kwargs,
            "nested_separator": sep}


_ARRAY_BACKENDS = ("numpy", "pytorch")


def _needs_host_backend(space: Space) -> bool:
    """True when no array storage serves the space's backend (JAX): the layout is then kept on NumPy."""
    return space.backend.simplified_name not in _ARRAY_BACKENDS


def create_native_storage(space: Space, *, capacity: Optional[int] = None, cache_path: Optional[PathLike] = None,
                          multiprocessing: bool = False, image_storage: str = "array",
                          video_kwargs: Optional[Mapping[str, Any]] = None, overwrite: bool = False
                          ) -> Union[DictStorage, ToBackendOrDeviceStorage]:
    """A `DictStorage` of `space` that keeps every leaf in its own dtype (see the module docstring).

    `capacity=None` makes it growable. With `cache_path` every child is memory-mapped (or a video directory) under
    that directory and the storage can be reopened with `load_native_storage(cache_path, space)`; without it the
    rows live in RAM (in shared memory with `multiprocessing=True`). `image_storage="video"` stores image leaves
    with `VideoStorage(**video_kwargs)` and needs a `cache_path`. A JAX space gets the NumPy layout wrapped in a
    `ToBackendOrDeviceStorage` that serves JAX arrays. A `cache_path` that already holds data is refused unless
    `overwrite=True`.
    """
    if image_storage == "video" and cache_path is None:
        raise ValueError("image_storage='video' writes video files and needs a cache_path")
    if _needs_host_backend(space):
        from unienv_interface.backends.numpy import NumpyComputeBackend

        host_kwargs = native_layout_kwargs(space.to(NumpyComputeBackend, None), image_storage=image_storage,
                                           video_kwargs=video_kwargs)
        cls_map = host_kwargs.pop("storage_cls_map")
        return ToBackendOrDeviceStorage.create(space, DictStorage, cls_map, capacity=capacity, cache_path=cache_path,
                                               multiprocessing=multiprocessing, backend="numpy", overwrite=overwrite,
                                               **host_kwargs)
    kwargs = native_layout_kwargs(space, image_storage=image_storage, video_kwargs=video_kwargs)
    return DictStorage.create(space, kwargs.pop("storage_cls_map"), capacity=capacity, cache_path=cache_path,
                              multiprocessing=multiprocessing, overwrite=overwrite, **kwargs)


def load_native_storage(path: PathLike, space: Space, *, capacity: Optional[int] = None, read_only: bool = True,
                        multiprocessing: bool = False, **kwargs: Any) -> Union[DictStorage, ToBackendOrDeviceStorage]:
    """Reopens a native-layout directory (`DictStorage.load_from`: the layout is recorded in its metadata; a JAX
    space's layout through `ToBackendOrDeviceStorage.load_from`)."""
    opener = ToBackendOrDeviceStorage if _needs_host_backend(space) else DictStorage
    return opener.load_from(path, space, capacity=capacity, read_only=read_only,  # type: ignore[no-any-return]
                            multiprocessing=multiprocessing, **kwargs)


def native_bytes_per_sample(space: Space) -> int:
    """Bytes one sample of `space` takes with every Box / Binary leaf in its own dtype."""
    total = 0
    for _path, leaf in leaf_items(space):
        if isinstance(leaf, (BoxSpace, BinarySpace)):
            n = 1
            for d in leaf.shape:
                n *= int(d)
            total += n * leaf.backend.itemsize(leaf.dtype)
    return total


__all__ = ["create_native_storage", "load_native_storage", "native_layout_kwargs", "is_image_leaf",
           "native_bytes_per_sample"]
