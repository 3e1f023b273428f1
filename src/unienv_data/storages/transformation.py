"""`TransformedStorage`: stores `transform(x)` in an inner storage and reads back through the inverse."""
from __future__ import annotations

from unienv_data.base.common import BatchT
from unienv_interface.backends.base import BArrayType, BDeviceType, BDtypeType, BRNGType
import os
from typing import Any, Dict, Optional, Tuple, Type, Union

import numpy as np

from unienv_data.base.errors import StorageFormatError
from unienv_data.base.files import FORMAT_VERSION, PathLike, require_fields
from unienv_data.base.indexing import is_single_index
from unienv_data.base.registry import register_storage, storage_type_name
from unienv_data.base.storage import SpaceStorage
from unienv_data.base.wrapper import ValueMappingStorage
from unienv_interface.space import BinarySpace, BoxSpace, DictSpace, Space, TupleSpace
from unienv_interface.space.space_utils import flatten_utils
from unienv_interface.space.space_utils.serialization_utils import json_to_space, space_to_json
from unienv_interface.transformations import (DataTransformation, TransformationFormatError, json_to_transformation,
                                              transformation_to_json)

# registers this library's own transformations (image compression) so stored metadata naming them reloads
import unienv_data.transformations  # noqa: F401,E402

METADATA_FILE = "transformed_metadata.json"
#: written by the reference implementation; never read (unpickling a file can run arbitrary code)
LEGACY_PICKLE_FILE = "data_transformation.pkl"
INNER_PREFIX = "transformed_inner_storage"


def _describe_space(space: Space) -> str:
    text = repr(space)
    return text if len(text) <= 200 else text[:197] + "..."


def _inverse_mismatch(source: Space, back: Space, where: str = "") -> Optional[str]:
    """Why values of `back` (what the inverse produces) are not values of `source`, or None when they are: same
    structure, leaf types, shapes and dtypes, and Box bounds of `back` inside those of `source`."""
    at = where or "<root>"
    if isinstance(source, DictSpace) or isinstance(back, DictSpace):
        if not (isinstance(source, DictSpace) and isinstance(back, DictSpace)):
            return f"{at}: {type(back).__name__} instead of {type(source).__name__}"
        if set(source.spaces) != set(back.spaces):
            return f"{at}: keys {sorted(back.spaces)} instead of {sorted(source.spaces)}"
        for k in source.spaces:
            why = _inverse_mismatch(source.spaces[k], back.spaces[k], f"{where}/{k}" if where else str(k))
            if why:
                return why
        return None
    if isinstance(source, TupleSpace) or isinstance(back, TupleSpace):
        if not (isinstance(source, TupleSpace) and isinstance(back, TupleSpace)) or len(source.spaces) != len(back.spaces):
            return f"{at}: the tuple structure differs"
        for i, (s, t) in enumerate(zip(source.spaces, back.spaces)):
            why = _inverse_mismatch(s, t, f"{where}/{i}" if where else str(i))
            if why:
                return why
        return None
    if type(source) is not type(back):
        return f"{at}: {type(back).__name__} instead of {type(source).__name__}"
    if isinstance(source, (BoxSpace, BinarySpace)) and isinstance(back, (BoxSpace, BinarySpace)):
        if tuple(source.shape) != tuple(back.shape) or source.dtype != back.dtype:
            b = source.backend
            return (f"{at}: {b.dtype_name(back.dtype)}{list(back.shape)} instead of "
                    f"{b.dtype_name(source.dtype)}{list(source.shape)}")
        if isinstance(source, BoxSpace) and isinstance(back, BoxSpace):
            with np.errstate(invalid="ignore"):
                inside = bool(np.all(back.low_numpy >= source.low_numpy) and np.all(back.high_numpy <= source.high_numpy))
            if not inside:
                return f"{at}: it reads back values in {_describe_space(back)}, outside {_describe_space(source)}"
        return None
    if source != back:
        return f"{at}: {_describe_space(back)} instead of {_describe_space(source)}"
    return None


@register_storage
class TransformedStorage(ValueMappingStorage[BatchT, BArrayType, BDeviceType, BDtypeType, BRNGType]):
    """Stores every element as `data_transformation.transform(space, x)` in an inner storage (of the transformed
    space) and reads it back through the inverse transformation, e.g. float images in [0, 1] kept as uint8, or
    actions kept rescaled.

    * `set` / `append` / segment writers check and transform the value first (the transformation checks it against
      the space, the inner storage checks the transformed value); on any error nothing is written.
    * `get` reads the inner rows and applies the inverse (new arrays, never views). Rows never written read back as
      the inverse image of the inner storage's zeros.
    * Everything else (capacity, length, segments, `clear`, `flush`, mutability) is the inner storage's.
    * Files: `<dir>/transformed_metadata.json` = `{"storage_type": "TransformedStorage", "inner_storage_type",
      "inner_storage_path" ("transformed_inner_storage<ext>"), "data_transformation": <transformation JSON>,
      "space": <space JSON>, "format_version": 1}`, written atomically, and the inner storage beside it. The
      transformation is rebuilt through the transformation registry; the inner storage type through the storage
      registry; nothing named in the file is imported, and its path must stay inside the directory.

    Beyond the reference: the transformation is stored as JSON, never pickled. A directory holding only the
    reference's `data_transformation.pkl` is refused (loading a pickle can run arbitrary code): re-create it from
    its data with a JSON-serializable transformation. `load_from` checks the given space against the stored one.
    Closing a TransformedStorage closes the inner storage only when it created or loaded it; garbage collection
    never closes anything.
    """

    metadata_file = METADATA_FILE

    def __init__(self, single_instance_space: Space, data_transformation: DataTransformation,
                 inner_storage: SpaceStorage, inner_storage_path: Union[str, PathLike],
                 cache_filename: Optional[Union[str, PathLike]] = None) -> None:
        super().__init__(single_instance_space, inner_storage, inner_storage_path, cache_filename)
        target, inverse = self._plan(single_instance_space, data_transformation)
        inner_space = inner_storage.single_instance_space
        if inner_space.backend is not target.backend or inner_space != target:
            raise ValueError(f"the inner storage holds {_describe_space(inner_space)}, but the transformation maps the "
                             f"space to {_describe_space(target)}")
        self.data_transformation = data_transformation
        self.inv_data_transformation = inverse
        self.transformed_space = target

    @staticmethod
    def _plan(space: Space, transformation: Any) -> Tuple[Space, DataTransformation]:
        """`(target space, inverse transformation)`, validating that the transformation can back a storage."""
        if not isinstance(space, Space):
            raise TypeError(f"single_instance_space must be a Space, got {type(space).__name__}")
        if not isinstance(transformation, DataTransformation):
            raise TypeError(f"data_transformation must be a DataTransformation, got {type(transformation).__name__}")
        if not transformation.has_inverse:
            try:
                transformation.direct_inverse(space)
                detail = f"{type(transformation).__name__} has no inverse"
            except (ValueError, TypeError) as exc:
                detail = str(exc)
            raise ValueError(f"TransformedStorage needs an invertible transformation (stored values are read back "
                             f"through the inverse): {detail}")
        target = transformation.get_target_space_from_source(space)
        inverse = transformation.direct_inverse(space)
        back = inverse.get_target_space_from_source(target)
        why = _inverse_mismatch(space, back)
        if why:
            raise ValueError(f"the inverse of {type(transformation).__name__} does not map back onto the space: {why}")
        return target, inverse

    # ------------------------------------------------------------------ construction
    @classmethod
    def create(cls, single_instance_space: Space, inner_storage_cls: Type[SpaceStorage], *args: Any,  # type: ignore[override]
               data_transformation: DataTransformation, capacity: Optional[int] = None,
               cache_path: Optional[PathLike] = None, multiprocessing: bool = False,
               inner_storage_kwargs: Dict[str, Any] = {}, **kwargs: Any) -> "TransformedStorage":
        """A new storage: `inner_storage_cls.create(<transformed space>, *args, capacity=..., cache_path=
        <cache_path>/transformed_inner_storage<ext>, multiprocessing=..., **kwargs, **inner_storage_kwargs)`.

        `data_transformation` is required and must be invertible (ValueError otherwise); it is checked before
        anything is created. With `cache_path` the directory and its metadata are written at once, so it can be
        reopened with `load_from(cache_path, space)`.
        """
        target, _inverse = cls._plan(single_instance_space, data_transformation)
        if cache_path is not None:
            transformation_to_json(data_transformation)  # refuse what could not be written back before creating files
        return cls._create_wrapped((single_instance_space, data_transformation), inner_storage_cls, target, args,
                                   {**kwargs, **inner_storage_kwargs}, capacity=capacity, cache_path=cache_path,
                                   multiprocessing=multiprocessing, inner_prefix=INNER_PREFIX)

    @classmethod
    def load_from(cls, path: Union[str, PathLike], single_instance_space: Space, *, capacity: Optional[int] = None,
                  read_only: bool = True, multiprocessing: bool = False, **kwargs: Any) -> "TransformedStorage":
        """Opens a directory written by `dumps` (or `create` with a cache path). The transformation comes from the
        metadata JSON; extra kwargs go to the inner storage's `load_from`."""
        path = os.fspath(path)
        legacy = os.path.exists(os.path.join(path, LEGACY_PICKLE_FILE))
        if legacy and not os.path.exists(os.path.join(path, METADATA_FILE)):
            raise StorageFormatError(cls._pickle_refusal(path))
        path, meta, meta_path, inner_cls, inner_full, _version = cls._open_stored(path, "TransformedStorage")
        if "data_transformation" not in meta and legacy:
            raise StorageFormatError(cls._pickle_refusal(path))
        require_fields(meta, ("data_transformation",), meta_path)
        try:
            transformation = json_to_transformation(meta["data_transformation"])
        except TransformationFormatError as exc:
            raise StorageFormatError(f"{meta_path}: data_transformation: {exc}") from None
        if not transformation.has_inverse:
            raise StorageFormatError(f"{meta_path}: the stored {type(transformation).__name__} has no inverse, so the "
                                     "stored values cannot be read back")
        if "space" in meta:
            try:
                stored = json_to_space(meta["space"], single_instance_space.backend, single_instance_space.device)
            except (ValueError, TypeError) as exc:
                raise StorageFormatError(f"{meta_path}: stored space is malformed: {exc}") from None
            if stored != single_instance_space:
                raise ValueError(f"the space does not match the one stored in {path}: stored "
                                 f"{_describe_space(stored)}, given {_describe_space(single_instance_space)}")
        try:
            target, _inverse = cls._plan(single_instance_space, transformation)
        except (ValueError, TypeError) as exc:
            # the space is the stored one when the metadata records it: then the stored transformation is damaged
            if "space" not in meta:
                raise
            raise StorageFormatError(f"{meta_path}: the stored transformation does not apply to the stored space "
                                     f"({exc})") from None
        inner = inner_cls.load_from(inner_full, target, capacity=capacity, read_only=read_only,
                                    multiprocessing=multiprocessing, **kwargs)
        return cls._adopt((single_instance_space, transformation), inner, meta["inner_storage_path"],
                          path if inner.cache_filename is not None else None)

    @staticmethod
    def _pickle_refusal(path: str) -> str:
        return (f"{path} stores its transformation as a pickle ({LEGACY_PICKLE_FILE}); it is not loaded because "
                f"unpickling a file can run arbitrary code. Rebuild the storage with a JSON-serializable "
                f"transformation (this library writes it into {METADATA_FILE}).")

    # ------------------------------------------------------------------ delegated properties

    # ------------------------------------------------------------------ data
    def get(self, index: Any) -> Any:
        """Element(s) at `index`, read from the inner storage and mapped back through the inverse transformation."""
        self._check_open()
        return self.inv_data_transformation.transform(self.transformed_space, self.inner_storage.get(index))

    def get_flattened(self, index: Any) -> Any:
        """Element(s) at `index` flattened like `flatten_data(space, ...)` (the source space's layout; new arrays)."""
        data = self.get(index)
        if is_single_index(index):
            return flatten_utils.flatten_data(self.single_instance_space, data)
        return flatten_utils.flatten_data(self._single_sample_batched_space, data, start_dim=1)

    def set_flattened(self, index: Any, value: Any) -> None:
        """Writes flat row(s) in the source space's layout. Every column must read back unchanged from the element
        it describes (no fraction in an integer leaf, no 2 in a boolean one), else ValueError; then as `set`."""
        self.check_writable()
        b = self.backend
        single = is_single_index(index)
        space = self.single_instance_space if single else self._single_sample_batched_space
        start = 0 if single else 1
        if isinstance(value, np.ndarray) and not b.is_backendarray(value):
            value = b.from_numpy(value)
        if not b.is_backendarray(value):
            raise TypeError(f"flat rows must be a {b} or NumPy array, got {type(value).__name__}")
        width = flatten_utils.flat_dim(self.single_instance_space)
        shape = tuple(value.shape)
        if len(shape) != start + 1 or shape[-1] != width:
            want = f"({width},)" if single else f"(n, {width})"
            raise ValueError(f"expected flat rows of shape {want}, got {shape}")
        with np.errstate(all="ignore"):
            data = flatten_utils.unflatten_data(space, value, start_dim=start)
            again = flatten_utils.flatten_data(space, data, start_dim=start)
            flat = b.astype(value, again.dtype) if value.dtype != again.dtype else value
            same = again == flat
            if b.dtype_is_real_floating(again.dtype):
                same = b.logical_or(same, b.logical_and(b.isnan(again), b.isnan(flat)))
        if not bool(b.all(same)):
            raise ValueError("flat rows hold values their leaves cannot represent (a fraction in an integer leaf, a "
                             "value other than 0/1 in a boolean leaf, or one beyond the leaf dtype's range)")
        self.set(index, data)

    def _to_inner(self, value: Any) -> Any:
        return self.data_transformation.transform(self.single_instance_space, value)

    # ------------------------------------------------------------------ persistence
    def _metadata(self) -> Dict[str, Any]:
        return {"storage_type": "TransformedStorage", "inner_storage_type": storage_type_name(type(self.inner_storage)),
                "inner_storage_path": os.fspath(self.inner_storage_path),
                "data_transformation": transformation_to_json(self.data_transformation),
                "space": space_to_json(self.single_instance_space), "format_version": FORMAT_VERSION}

    def __getstate__(self) -> Dict[str, Any]:
        self._check_open()
        return {"space": self.single_instance_space, "transformation": self.data_transformation,
                "inner": self.inner_storage, "inner_path": self.inner_storage_path, "cache": self._cache_filename,
                "owns": self.owns_inner_storage}

    def __setstate__(self, state: Dict[str, Any]) -> None:
        TransformedStorage.__init__(self, state["space"], state["transformation"], state["inner"], state["inner_path"],
                                    state["cache"])
        self.owns_inner_storage = state["owns"]



__all__ = ["TransformedStorage", "METADATA_FILE", "LEGACY_PICKLE_FILE"]
