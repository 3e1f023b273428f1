"""`IdentityTransformation`: leaves data and space unchanged."""
from __future__ import annotations

from typing import Any, Dict, Mapping, Optional

from unienv_interface.space import Space

from .serialization_utils import check_param_names
from .transformation import DataTransformation


class IdentityTransformation(DataTransformation):
    """The target space is the source space and `transform` returns `data` itself (not a copy, and unchecked:
    whoever consumes the data checks it). Its own inverse."""

    has_inverse = True

    def get_target_space_from_source(self, source_space: Space) -> Space:
        if not isinstance(source_space, Space):
            raise TypeError(f"expected a Space, got {type(source_space).__name__}")
        return source_space

    def transform(self, source_space: Space, data: Any) -> Any:
        return data

    def direct_inverse(self, source_space: Optional[Space] = None) -> "IdentityTransformation":
        return IdentityTransformation()

    def to_json(self) -> Dict[str, Any]:
        return {}

    @classmethod
    def from_json(cls, params: Mapping[str, Any]) -> "IdentityTransformation":
        check_param_names(params, (), (), cls.__name__)
        return cls()


__all__ = ["IdentityTransformation"]
