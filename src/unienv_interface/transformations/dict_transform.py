"""`DictTransformation`: one transformation per key of a DictSpace; the other keys pass through unchanged."""
from __future__ import annotations

from typing import Any, Dict, Mapping, Optional

from unienv_interface.space import DictSpace, Space

from ._arrays import prefixed
from .serialization_utils import json_to_transformation, transformation_to_json
from .transformation import DataTransformation, members_param


class DictTransformation(DataTransformation):
    """Applies `transformations[key]` to the child `key` of a DictSpace (and of its data). Keys without a
    transformation keep their space and values (values are passed on unchecked: whoever consumes the data checks
    them). Every key named must exist in the space. Nest DictTransformations for nested dicts. Invertible when
    every member is."""

    def __init__(self, transformations: Mapping[str, DataTransformation]) -> None:
        if not isinstance(transformations, Mapping):
            raise TypeError("DictTransformation takes a mapping of key -> transformation")
        for k, t in transformations.items():
            if not isinstance(k, str):
                raise TypeError(f"DictTransformation keys must be strings, got {k!r}")
            if not isinstance(t, DataTransformation):
                raise TypeError(f"DictTransformation[{k!r}] must be a DataTransformation, got {type(t).__name__}")
        self.transformations: Dict[str, DataTransformation] = dict(sorted(transformations.items()))
        self.has_inverse = all(t.has_inverse for t in self.transformations.values())

    def _check_space(self, source_space: Space) -> DictSpace:
        if not isinstance(source_space, DictSpace):
            raise TypeError(f"DictTransformation applies to DictSpace only, got {type(source_space).__name__}")
        missing = sorted(set(self.transformations) - set(source_space.spaces))
        if missing:
            raise ValueError(f"DictTransformation names key(s) {missing} that the space lacks "
                             f"(space keys: {list(source_space.spaces)})")
        return source_space

    def get_target_space_from_source(self, source_space: Space) -> DictSpace:
        sp = self._check_space(source_space)
        children = {}
        for k, child in sp.spaces.items():
            t = self.transformations.get(k)
            if t is None:
                children[k] = child
                continue
            try:
                children[k] = t.get_target_space_from_source(child)
            except (TypeError, ValueError) as exc:
                raise prefixed(exc, f"key {k!r}") from None
        return DictSpace(sp.backend, children, device=sp.device, metadata=sp.metadata)

    def transform(self, source_space: Space, data: Any) -> Any:
        sp = self._check_space(source_space)
        if not isinstance(data, Mapping):
            raise TypeError(f"DictTransformation expects a dict with keys {list(sp.spaces)}, got {type(data).__name__}")
        out = dict(data)
        for k, t in self.transformations.items():
            if k not in data:
                raise KeyError(f"missing key {k!r} (expected keys {list(sp.spaces)})")
            try:
                out[k] = t.transform(sp.spaces[k], data[k])
            except (TypeError, ValueError) as exc:
                raise prefixed(exc, f"key {k!r}") from None
        return out

    def direct_inverse(self, source_space: Optional[Space] = None) -> "DictTransformation":
        if not self.has_inverse:
            bad = ", ".join(f"{k!r} ({type(t).__name__})" for k, t in self.transformations.items() if not t.has_inverse)
            raise ValueError(f"DictTransformation has no inverse: the transformations of key(s) {bad} cannot be inverted")
        if source_space is None:
            return DictTransformation({k: t.direct_inverse(None) for k, t in self.transformations.items()})
        sp = self._check_space(source_space)
        return DictTransformation({k: t.direct_inverse(sp.spaces[k]) for k, t in self.transformations.items()})

    def to_json(self) -> Dict[str, Any]:
        return {"transformations": {k: transformation_to_json(t) for k, t in self.transformations.items()}}

    @classmethod
    def from_json(cls, params: Mapping[str, Any]) -> "DictTransformation":
        items = members_param(params, cls.__name__, Mapping)
        return cls({k: json_to_transformation(js) for k, js in items.items()})


__all__ = ["DictTransformation"]
