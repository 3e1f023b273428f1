"""`DataTransformation`: a map from the data of a source space to the data of a target space.

A transformation is a small, stateless-looking object (its parameters are plain numbers and names) used as:

* `get_target_space_from_source(source_space)`: the space the transformed data belongs to;
* `transform(source_space, data)`: `data` (an element of `source_space`, optionally with extra leading batch axes)
  mapped to the target space. The input is checked: a value outside the source space (wrong shape, a dtype that
  cannot hold it exactly, out of bounds) raises ValueError / TypeError / KeyError naming what was expected and given;
* `has_inverse` / `direct_inverse(source_space)`: the inverse transformation (mapping the target space back onto
  the source space), or ValueError when there is none;
* JSON: `to_json()` gives the parameters, `serialization_utils.transformation_to_json` / `json_to_transformation`
  add and resolve the registered type name. A name read from a file is looked up in a registry, never imported.

Subclasses implement `get_target_space_from_source`, `transform`, `to_json` and `from_json` (and `direct_inverse`
when `has_inverse`). Two transformations are equal when they have the same type and the same JSON parameters.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Dict, Mapping, Optional

from unienv_interface.space import Space


class TransformationFormatError(ValueError):
    """A transformation's JSON description is malformed, names an unknown type, or has invalid parameters."""


class DataTransformation(ABC):
    """Maps data of a source space to a target space (see the module docstring)."""

    #: whether `direct_inverse` gives the inverse transformation (composite transformations set it per instance)
    has_inverse: bool = False

    @abstractmethod
    def get_target_space_from_source(self, source_space: Space) -> Space:
        """The space of transformed elements of `source_space` (ValueError / TypeError if it does not apply)."""

    @abstractmethod
    def transform(self, source_space: Space, data: Any) -> Any:
        """`data` (an element of `source_space`, with optional leading batch axes) mapped to the target space."""

    def direct_inverse(self, source_space: Optional[Space] = None) -> "DataTransformation":
        """The transformation mapping `get_target_space_from_source(source_space)` back onto `source_space`.

        Transformations whose inverse depends on the source space (e.g. a rescale needs the original bounds)
        require `source_space`. Raises ValueError when the transformation has no inverse."""
        raise ValueError(f"{type(self).__name__} has no inverse transformation")

    def direction_inverse(self, source_space: Optional[Space] = None) -> "DataTransformation":
        """Alias of `direct_inverse` (the name some versions of the reference API use)."""
        return self.direct_inverse(source_space)

    # ------------------------------------------------------------------ JSON
    @abstractmethod
    def to_json(self) -> Dict[str, Any]:
        """The parameters as a JSON-compatible dict (without the type name, which the registry adds)."""

    @classmethod
    @abstractmethod
    def from_json(cls, params: Mapping[str, Any]) -> "DataTransformation":
        """Rebuilds a transformation from `to_json()` output; ValueError / TypeError for invalid parameters."""

    def serialize(self) -> Dict[str, Any]:
        """`{"type": <registered name>, **parameters}` (see `serialization_utils.transformation_to_json`)."""
        from .serialization_utils import transformation_to_json
        return transformation_to_json(self)

    @classmethod
    def deserialize_from(cls, json_data: Mapping[str, Any], backend: Any = None, device: Any = None) -> "DataTransformation":
        """Rebuilds a transformation written by `serialize`; the named type must be `cls` or a subclass of it."""
        from .serialization_utils import json_to_transformation
        out = json_to_transformation(json_data, backend, device)
        if not isinstance(out, cls):
            raise TransformationFormatError(f"expected a {cls.__name__} description, got a {type(out).__name__}")
        return out

    def close(self) -> None:
        """Releases resources (none for the built-in transformations)."""

    # ------------------------------------------------------------------ comparison and display
    def __eq__(self, other: object) -> bool:
        if other is self:
            return True
        if type(other) is not type(self):
            return False
        try:
            return self.to_json() == other.to_json()  # type: ignore[attr-defined]
        except (TypeError, ValueError):  # e.g. a member that cannot be serialized: only identity is known
            return False

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        try:
            params = ", ".join(f"{k}={v!r}" for k, v in self.to_json().items())
        except (TypeError, ValueError):
            params = "..."
        return f"{type(self).__name__}({params})"


__all__ = ["DataTransformation", "TransformationFormatError"]
