"""`ChainedTransformation`: several transformations applied one after the other."""
from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from unienv_interface.space import Space

from ._arrays import prefixed
from .serialization_utils import json_to_transformation, transformation_to_json
from .transformation import DataTransformation, members_param


class ChainedTransformation(DataTransformation):
    """Applies `transformations[0]`, then `transformations[1]`, ... Each one's target space is the next one's source
    space. Invertible when every member is; the inverse applies the members' inverses in reverse order. An empty
    chain is the identity."""

    def __init__(self, transformations: Sequence[DataTransformation]) -> None:
        if isinstance(transformations, DataTransformation) or not isinstance(transformations, (list, tuple)):
            raise TypeError("ChainedTransformation takes a list of transformations")
        for i, t in enumerate(transformations):
            if not isinstance(t, DataTransformation):
                raise TypeError(f"ChainedTransformation member {i} must be a DataTransformation, got {type(t).__name__}")
        self.transformations: Tuple[DataTransformation, ...] = tuple(transformations)
        self.has_inverse = all(t.has_inverse for t in self.transformations)
        self._spaces: Dict[int, Tuple[Space, List[Space]]] = {}

    def _space_chain(self, source_space: Space) -> List[Space]:
        """`[source, after member 0, after member 1, ...]`, cached for the last few source spaces."""
        hit = self._spaces.get(id(source_space))
        if hit is not None and hit[0] is source_space:
            return hit[1]
        chain = [source_space]
        for i, t in enumerate(self.transformations):
            try:
                chain.append(t.get_target_space_from_source(chain[-1]))
            except (TypeError, ValueError) as exc:
                raise prefixed(exc, f"ChainedTransformation member {i} ({type(t).__name__})") from None
        if len(self._spaces) >= 16:
            self._spaces.pop(next(iter(self._spaces)))
        self._spaces[id(source_space)] = (source_space, chain)
        return chain

    def get_target_space_from_source(self, source_space: Space) -> Space:
        return self._space_chain(source_space)[-1]

    def transform(self, source_space: Space, data: Any) -> Any:
        spaces = self._space_chain(source_space)
        for t, sp in zip(self.transformations, spaces):
            data = t.transform(sp, data)
        return data

    def direct_inverse(self, source_space: Optional[Space] = None) -> "ChainedTransformation":
        if not self.has_inverse:
            bad = [type(t).__name__ for t in self.transformations if not t.has_inverse]
            raise ValueError(f"ChainedTransformation has no inverse: {bad} cannot be inverted")
        if source_space is None:
            if not self.transformations:
                return ChainedTransformation([])
            raise ValueError("ChainedTransformation.direct_inverse needs the source space (to know the spaces "
                             "between the members)")
        spaces = self._space_chain(source_space)
        inverses = [t.direct_inverse(sp) for t, sp in zip(self.transformations, spaces)]
        return ChainedTransformation(inverses[::-1])

    def to_json(self) -> Dict[str, Any]:
        return {"transformations": [transformation_to_json(t) for t in self.transformations]}

    @classmethod
    def from_json(cls, params: Mapping[str, Any]) -> "ChainedTransformation":
        return cls([json_to_transformation(js) for js in members_param(params, cls.__name__, list)])

    def __getstate__(self) -> Dict[str, Any]:
        return {"transformations": self.transformations}

    def __setstate__(self, state: Dict[str, Any]) -> None:
        ChainedTransformation.__init__(self, list(state["transformations"]))


__all__ = ["ChainedTransformation"]
