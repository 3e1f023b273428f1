"""`FlattenDictTransformation` / `UnflattenDictTransformation`: nested DictSpaces to one level of joined keys
(`{"robot": {"arm": x}}` <-> `{"robot/arm": x}`) and back."""
from __future__ import annotations

from typing import Any, Dict, Mapping, Optional

from unienv_interface.space import DictSpace, Space

from ._keys import check_separator, flatten_items, lookup, split_key, unflatten_items
from .serialization_utils import check_param_names
from .transformation import DataTransformation


def flatten_nested_mapping(data: Mapping[str, Any], nested_separator: str) -> Dict[str, Any]:
    """`{joined key: leaf}` of nested mappings (DictSpaces count as mappings); ValueError for a key that holds the
    separator."""
    sep = check_separator(nested_separator)
    return dict(flatten_items(data, sep, lambda v: isinstance(v, (Mapping, DictSpace)), "flatten_nested_mapping"))


def unflatten_mapping(data: Mapping[str, Any], nested_separator: str) -> Dict[str, Any]:
    """Nested plain dicts from `{joined key: leaf}`; ValueError when a key is both a leaf and a prefix of another."""
    return unflatten_items(data.items(), check_separator(nested_separator), "unflatten_mapping")


def _check_dict(who: str, source_space: Space, data: Any = None, check_data: bool = False) -> DictSpace:
    if not isinstance(source_space, DictSpace):
        raise TypeError(f"{who} applies to DictSpace only, got {type(source_space).__name__}")
    if check_data and not isinstance(data, Mapping):
        raise TypeError(f"{who} expects a dict with keys {list(source_space.spaces)}, got {type(data).__name__}")
    return source_space


def _nested_spaces(backend: Any, device: Any, tree: Mapping[str, Any]) -> Dict[str, Space]:
    """DictSpaces (without metadata) for the plain dicts of an unflattened tree of spaces."""
    return {k: DictSpace(backend, _nested_spaces(backend, device, v), device=device) if isinstance(v, dict) else v
            for k, v in tree.items()}


class FlattenDictTransformation(DataTransformation):
    """Flattens nested DictSpaces into one DictSpace whose keys join the path with `nested_separator` (a key that
    already holds the separator is ValueError: it could not be split back). Leaves and the outer DictSpace keep
    their metadata; the inner DictSpaces' metadata is dropped, and an empty inner DictSpace disappears. Data follows
    the space: every key it names must be in the data (KeyError), and the data may not hold others (ValueError).
    The inverse is `UnflattenDictTransformation`."""

    has_inverse = True

    def __init__(self, nested_separator: str = "/") -> None:
        self.nested_separator = check_separator(nested_separator)

    def get_target_space_from_source(self, source_space: Space) -> DictSpace:
        sp = _check_dict(type(self).__name__, source_space)
        leaves = flatten_items(sp, self.nested_separator, lambda v: isinstance(v, DictSpace), type(self).__name__)
        return DictSpace(sp.backend, dict(leaves), device=sp.device, metadata=sp.metadata)

    def transform(self, source_space: Space, data: Any) -> Dict[str, Any]:
        sp = _check_dict(type(self).__name__, source_space, data, check_data=True)
        sep = self.nested_separator
        keys = [k for k, _ in flatten_items(sp, sep, lambda v: isinstance(v, DictSpace), type(self).__name__)]
        out = {k: lookup(data, split_key(k, sep), sep)[1] for k in keys}
        _refuse_extra(type(self).__name__, data, sp)
        return out

    def direct_inverse(self, source_space: Optional[Space] = None) -> "UnflattenDictTransformation":
        return UnflattenDictTransformation(nested_separator=self.nested_separator)

    def to_json(self) -> Dict[str, Any]:
        return {"nested_separator": self.nested_separator}

    @classmethod
    def from_json(cls, params: Mapping[str, Any]) -> "FlattenDictTransformation":
        check_param_names(params, ("nested_separator",), (), cls.__name__)
        return cls(params.get("nested_separator", "/"))


class UnflattenDictTransformation(DataTransformation):
    """Splits each key of a DictSpace at `nested_separator` into nested DictSpaces (new inner DictSpaces have no
    metadata; leaves and the outer DictSpace keep theirs). A key that is both a leaf and a prefix of another is
    ValueError. Data follows the space: every key must be in the data (KeyError), and no other (ValueError). The
    inverse is `FlattenDictTransformation`."""

    has_inverse = True

    def __init__(self, nested_separator: str = "/") -> None:
        self.nested_separator = check_separator(nested_separator)

    def get_target_space_from_source(self, source_space: Space) -> DictSpace:
        sp = _check_dict(type(self).__name__, source_space)
        tree = unflatten_items(sp.spaces.items(), self.nested_separator, type(self).__name__)
        return DictSpace(sp.backend, _nested_spaces(sp.backend, sp.device, tree), device=sp.device,
                         metadata=sp.metadata)

    def transform(self, source_space: Space, data: Any) -> Dict[str, Any]:
        sp = _check_dict(type(self).__name__, source_space, data, check_data=True)
        missing = [k for k in sp.spaces if k not in data]
        if missing:
            raise KeyError(f"{type(self).__name__}: missing key(s) {missing} (expected keys {list(sp.spaces)})")
        _refuse_extra(type(self).__name__, data, sp)
        return unflatten_items(((k, data[k]) for k in sp.spaces), self.nested_separator, type(self).__name__)

    def direct_inverse(self, source_space: Optional[Space] = None) -> FlattenDictTransformation:
        return FlattenDictTransformation(nested_separator=self.nested_separator)

    def to_json(self) -> Dict[str, Any]:
        return {"nested_separator": self.nested_separator}

    @classmethod
    def from_json(cls, params: Mapping[str, Any]) -> "UnflattenDictTransformation":
        check_param_names(params, ("nested_separator",), (), cls.__name__)
        return cls(params.get("nested_separator", "/"))


def _refuse_extra(who: str, data: Mapping[str, Any], space: DictSpace) -> None:
    """ValueError when nested `data` holds a key its DictSpace lacks."""
    extra = [k for k in data if k not in space.spaces]
    if extra:
        raise ValueError(f"{who}: the data has key(s) {extra} that the space lacks (space keys: {list(space.spaces)})")
    for k, child in space.spaces.items():
        if isinstance(child, DictSpace) and isinstance(data[k], Mapping):
            _refuse_extra(who, data[k], child)


__all__ = ["FlattenDictTransformation", "UnflattenDictTransformation", "flatten_nested_mapping", "unflatten_mapping"]
