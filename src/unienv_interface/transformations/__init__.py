"""Data transformations: maps from the data of a source space to a target space, with inverses and JSON.

* `DataTransformation` (base): `get_target_space_from_source(space)`, `transform(space, data)`, `has_inverse`,
  `direct_inverse(space)`, `to_json()` / `from_json(params)`.
* Built-ins: `IdentityTransformation`, `ChainedTransformation` (members in order), `DictTransformation` (one per
  key), `RescaleTransformation` (affine map of a bounded float Box onto new bounds), `DtypeTransformation`
  (checked dtype change with an explicit rounding mode).
* JSON: `transformation_to_json(t)` / `json_to_transformation(js)` resolve type names through a registry
  (`register_transformation` for your own classes); names read from files are never imported.

Every transformation checks its input (shape, dtype, bounds) and raises ValueError / TypeError / KeyError naming
what was expected and what was given; none clips, wraps or rounds a value unless its parameters say so.
"""
from .chained_transform import ChainedTransformation
from .dict_transform import DictTransformation
from .dtype_cast import DtypeTransformation
from .identity import IdentityTransformation
from .rescale import RescaleTransformation
from .serialization_utils import (json_to_transformation, register_transformation, resolve_transformation_class,
                                  transformation_to_json, transformation_type_name)
from .transformation import DataTransformation, TransformationFormatError

__all__ = ["DataTransformation", "TransformationFormatError", "IdentityTransformation", "ChainedTransformation",
           "DictTransformation", "RescaleTransformation", "DtypeTransformation", "transformation_to_json",
           "json_to_transformation", "register_transformation", "resolve_transformation_class",
           "transformation_type_name"]
