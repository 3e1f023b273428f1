"""JSON descriptions of transformations (the reference's import path).

`transformation_to_json(t)` writes `{"type": <registered name>, **t.to_json()}`; `json_to_transformation(js)` looks
the type name up in a registry (the built-in transformations, imported from this package's own modules on first use,
and classes registered with `register_transformation`). A name is never imported as a dotted path, so a hostile file
cannot make the library import or run anything. Unknown names, malformed objects and invalid parameters raise
`TransformationFormatError`. The implementation sits beside `DataTransformation` in `transformation.py`.
"""
from .transformation import (MAX_DEPTH, check_param_names, json_to_transformation, register_transformation,
                             resolve_transformation_class, transformation_to_json, transformation_type_name)

__all__ = ["transformation_to_json", "json_to_transformation", "register_transformation",
           "resolve_transformation_class", "transformation_type_name", "MAX_DEPTH", "check_param_names"]
