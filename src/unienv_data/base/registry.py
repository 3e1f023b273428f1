"""Registry of storage classes by the name written into metadata files.

Metadata names classes as `module.QualName`. Such a name is looked up here and never imported by its dotted
path: only built-in storages (imported from this package's own modules on first use) and classes registered
explicitly by plugins resolve. An unknown name is a StorageFormatError.
"""
from __future__ import annotations

from typing import Any, Dict, Tuple, Type

from unienv_interface.registry import ClassRegistry, class_type_name

from .errors import StorageFormatError

_BUILTIN: Dict[str, Tuple[str, str]] = {
    "unienv_data.storages.flattened.FlattenedStorage": ("unienv_data.storages.flattened", "FlattenedStorage"),
    "unienv_data.storages.common.FlattenedStorage": ("unienv_data.storages.flattened", "FlattenedStorage"),
    "unienv_data.storages.pytorch.PytorchTensorStorage": ("unienv_data.storages.pytorch", "PytorchTensorStorage"),
    "unienv_data.storages.numpy_memmap.NumpyMemmapStorage": ("unienv_data.storages.numpy_memmap", "NumpyMemmapStorage"),
    "unienv_data.storages.dict_storage.DictStorage": ("unienv_data.storages.dict_storage", "DictStorage"),
    "unienv_data.storages.video_storage.VideoStorage": ("unienv_data.storages.video_storage", "VideoStorage"),
    "unienv_data.storages.image_storage.ImageStorage": ("unienv_data.storages.image_storage", "ImageStorage"),
    "unienv_data.storages.transformation.TransformedStorage": ("unienv_data.storages.transformation", "TransformedStorage"),
    "unienv_data.storages.backend_compat.ToBackendOrDeviceStorage": ("unienv_data.storages.backend_compat",
                                                                     "ToBackendOrDeviceStorage"),
    "unienv_data.storages.hdf5.HDF5Storage": ("unienv_data.storages.hdf5", "HDF5Storage"),
    "unienv_data.storages.npz_storage.NPZStorage": ("unienv_data.storages.npz_storage", "NPZStorage"),
    "unienv_data.storages.parquet.ParquetStorage": ("unienv_data.storages.parquet", "ParquetStorage"),
}
_STORAGES: ClassRegistry[Any] = ClassRegistry("storage", _BUILTIN, StorageFormatError,
                                           "a plugin storage must be registered with "
                                           "unienv_data.base.register_storage by importing its module first; from the "
                                           "command line: unienv-data --import MODULE <command> ...")


def storage_type_name(cls: Type[Any]) -> str:
    """The name metadata files use for `cls` (`module.QualName`)."""
    return class_type_name(cls)


def register_storage(cls: Type[Any], *aliases: str) -> Type[Any]:
    """Makes `cls` loadable from metadata under its own name and `aliases`. Usable as a class decorator."""
    return _STORAGES.register(cls, *aliases)


def resolve_storage_class(name: Any, what: str = "metadata") -> Type[Any]:
    """The storage class registered under `name`; StorageFormatError for anything unknown."""
    return _STORAGES.resolve(name, what)
