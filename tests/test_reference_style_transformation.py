"""A `DataTransformation` subclass written for unienv 0.0.1b16 implements `serialize` / `deserialize_from`
instead of this project's `to_json` / `from_json`: it must be instantiable, usable, comparable and saved
through the registry."""
from __future__ import annotations

from typing import Any, Dict, Mapping, Optional

import numpy as np
import pytest

from unienv_interface.backends import NumpyComputeBackend as NB
from unienv_interface.space import BoxSpace, Space
from unienv_interface.transformations import (DataTransformation, json_to_transformation, register_transformation,
                                              transformation_to_json)


class _Shift(DataTransformation):
    """Adds `by` (reference style: only serialize / deserialize_from)."""

    def __init__(self, by: float = 1.0) -> None:
        self.by = by

    def get_target_space_from_source(self, source_space: Space) -> Space:
        return source_space

    def transform(self, source_space: Space, data: Any) -> Any:
        return data + self.by

    def serialize(self, source_space: Optional[Space] = None) -> Dict[str, Any]:   # type: ignore[override]
        return {"by": self.by}

    @classmethod
    def deserialize_from(cls, json_data: Mapping[str, Any],          # type: ignore[override]
                         source_space: Optional[Space] = None) -> "_Shift":
        return cls(float(json_data["by"]))


class _Neither(DataTransformation):
    def get_target_space_from_source(self, source_space: Space) -> Space:
        return source_space

    def transform(self, source_space: Space, data: Any) -> Any:
        return data


def test_reference_style_subclass_works() -> None:
    t = _Shift(2.0)                                   # instantiable: to_json / from_json are not abstract
    space = BoxSpace(NB, -10.0, 10.0, np.float32, shape=(2,))
    assert t.transform(space, np.ones(2, np.float32)).tolist() == [3.0, 3.0]
    assert t.to_json() == {"by": 2.0}
    assert t == _Shift(2.0) and t != _Shift(3.0) and repr(t) == "_Shift(by=2.0)"
    assert _Shift.from_json({"by": 4}) == _Shift(4.0)
    register_transformation(_Shift)
    saved = transformation_to_json(t)
    assert saved["by"] == 2.0 and json_to_transformation(saved) == t


def test_subclass_with_neither_says_what_to_implement() -> None:
    t = _Neither()
    assert t.transform(BoxSpace(NB, 0.0, 1.0, np.float32, shape=()), 0.5) == 0.5
    with pytest.raises(NotImplementedError, match="neither to_json nor serialize"):
        t.to_json()
    with pytest.raises(NotImplementedError, match="neither from_json nor deserialize_from"):
        _Neither.from_json({})
    assert t == t and t != _Neither() and repr(t) == "_Neither(...)"


def test_the_reference_serialization_calls() -> None:
    """unienv 0.0.1b16's calls: `t.serialize(source_space=...)` gives the parameters without a type,
    `transformation_to_json(t, source_space=...)` adds it, `json_to_transformation(js, source_space=...)` and
    `type(t).deserialize_from(params, source_space)` rebuild it; the space utilities are importable from
    `space_utils` and `Space` from `space.spaces`, as there."""
    import numpy as np
    from unienv_interface.backends.numpy import NumpyComputeBackend as B
    from unienv_interface.space.space_utils import flatten_data, space_to_json, batch_space  # noqa: F401
    from unienv_interface.space.spaces import BoxSpace, Space
    from unienv_interface.transformations import (IdentityTransformation, json_to_transformation,
                                                  transformation_to_json)
    space = BoxSpace(B, -1.0, 1.0, np.float32, shape=(2,))
    assert isinstance(space, Space)
    t = IdentityTransformation()
    params = t.serialize(source_space=space)
    assert "type" not in params
    js = transformation_to_json(t, source_space=space)
    assert "type" in js
    assert type(json_to_transformation(js, source_space=space)) is IdentityTransformation
    assert type(IdentityTransformation.deserialize_from(params, space)) is IdentityTransformation
    assert type(IdentityTransformation.deserialize_from(js)) is IdentityTransformation
