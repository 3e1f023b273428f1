"""Data transformations: maps from the data of a source space to a target space, with inverses and JSON.

* `DataTransformation` (base): `get_target_space_from_source(space)`, `transform(space, data)`, `has_inverse`,
  `direct_inverse(space)`, `to_json()` / `from_json(params)`.
* Built-ins (each in the module the reference uses, `unienv_interface.transformations.<module>`):
  `IdentityTransformation`; `ChainedTransformation` (members in order); `DictTransformation` (one per (nested)
  key); `RescaleTransformation` (affine map of a bounded Box onto new bounds, optional integer target and
  `nan_to`); `DtypeTransformation` (checked dtype change with an explicit rounding mode, this project's);
  `CropTransformation` (clip into bounds); `BatchifyTransformation` / `UnBatchifyTransformation` (add / remove a
  size-1 axis); `DictIncludeKeyTransformation` / `DictExcludeKeyTransformation` (keep / drop keys);
  `FlattenDictTransformation` / `UnflattenDictTransformation` (nested dicts <-> joined keys);
  `ImageResizeTransformation` (antialiased bilinear resize of `(..., H, W, C)` images);
  `IterativeTransformation` (one transformation on every leaf) and `LeafwiseTransformation` (one per leaf).
* JSON: `transformation_to_json(t)` / `json_to_transformation(js)` resolve type names through a registry
  (`register_transformation` for your own classes); names read from files are never imported. The built-ins write
  the reference's JSON, so a stored transformation loads on either side.

Every transformation checks its input (shape, dtype, bounds) and raises ValueError / TypeError / KeyError naming
what was expected and what was given; none clips, wraps or rounds a value unless its parameters say so.
"""
from .batch_and_unbatch import BatchifyTransformation, UnBatchifyTransformation
from .chained_transform import ChainedTransformation
from .crop import CropTransformation
from .dict_transform import DictTransformation
from .dtype_cast import DtypeTransformation
from .filter_dict import DictExcludeKeyTransformation, DictIncludeKeyTransformation
from .flatten_dict_transform import FlattenDictTransformation, UnflattenDictTransformation
from .identity import IdentityTransformation
from .image_resize import ImageResizeTransformation
from .iter_transform import IterativeTransformation, LeafwiseTransformation
from .rescale import RescaleTransformation
from .serialization_utils import (json_to_transformation, register_transformation, resolve_transformation_class,
                                  transformation_to_json, transformation_type_name)
from .transformation import DataTransformation, TransformationFormatError

__all__ = ["DataTransformation", "TransformationFormatError", "IdentityTransformation", "ChainedTransformation",
           "DictTransformation", "RescaleTransformation", "DtypeTransformation", "CropTransformation",
           "BatchifyTransformation", "UnBatchifyTransformation", "DictIncludeKeyTransformation",
           "DictExcludeKeyTransformation", "FlattenDictTransformation", "UnflattenDictTransformation",
           "ImageResizeTransformation", "IterativeTransformation", "LeafwiseTransformation", "transformation_to_json",
           "json_to_transformation", "register_transformation", "resolve_transformation_class",
           "transformation_type_name"]
