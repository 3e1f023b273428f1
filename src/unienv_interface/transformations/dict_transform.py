"""`DictTransformation`: one transformation per (nested) key of a DictSpace; the other keys pass through unchanged."""
from __future__ import annotations

from typing import Any, Callable, Dict, Mapping, Optional, Tuple

from unienv_interface.space import DictSpace, Space

from ._arrays import prefixed
from ._keys import check_disjoint, check_separator, lookup, replace, split_key
from .serialization_utils import json_to_transformation, transformation_to_json
from .transformation import DataTransformation, bool_param, members_param

_WHO = "DictTransformation"


def _constant(value: Any) -> Callable[[Any], Any]:
    """A function that returns `value` whatever it is given."""
    return lambda _old: value


class DictTransformation(DataTransformation):
    """Applies `mapping[key]` to the child `key` of a DictSpace (and of its data). A key may name a nested child,
    its parts joined by `nested_separator` (`"robot/arm"`); no key may lie inside another. Keys without a
    transformation keep their space and values (values are passed on unchecked: whoever consumes the data checks
    them). A key the space (or the data) lacks is ValueError (KeyError for data) unless `ignore_missing_keys`, which
    skips it. Data is never modified in place: the result is a new dict sharing the untouched values. Invertible
    when every member is.

    JSON: `{"mapping": {key: <transformation JSON>}, "ignore_missing_keys", "nested_separator"}` (the reference's
    form; this project's earlier `{"transformations": {...}}` is read too).
    """

    def __init__(self, mapping: Mapping[str, DataTransformation], ignore_missing_keys: bool = False,
                 nested_separator: str = "/") -> None:
        if not isinstance(mapping, Mapping):
            raise TypeError(f"{_WHO} takes a mapping of key -> transformation, got {type(mapping).__name__}")
        if not isinstance(ignore_missing_keys, bool):
            raise TypeError(f"ignore_missing_keys must be a bool, got {ignore_missing_keys!r}")
        self.nested_separator = check_separator(nested_separator)
        self.ignore_missing_keys = ignore_missing_keys
        self._paths: Dict[str, Tuple[str, ...]] = {}
        for k, t in mapping.items():
            self._paths[k] = split_key(k, self.nested_separator)
            if not isinstance(t, DataTransformation):
                raise TypeError(f"{_WHO}[{k!r}] must be a DataTransformation, got {type(t).__name__}")
        check_disjoint(list(self._paths.values()), self.nested_separator, _WHO)
        self.mapping: Dict[str, DataTransformation] = dict(mapping)
        self.has_inverse = all(t.has_inverse for t in self.mapping.values())

    @property
    def transformations(self) -> Dict[str, DataTransformation]:
        """The members by key (this project's earlier name for `mapping`)."""
        return self.mapping

    def _check_space(self, source_space: Space) -> DictSpace:
        if not isinstance(source_space, DictSpace):
            raise TypeError(f"{_WHO} applies to DictSpace only, got {type(source_space).__name__}")
        return source_space

    def _members(self, sp: DictSpace) -> Dict[str, Space]:
        """The child space of every key the space holds (all keys, unless `ignore_missing_keys`)."""
        out = {}
        for k, path in self._paths.items():
            found, child = lookup(sp, path, self.nested_separator, missing_ok=self.ignore_missing_keys)
            if found:
                out[k] = child
        return out

    def get_target_space_from_source(self, source_space: Space) -> DictSpace:
        sp = self._check_space(source_space)
        out: Any = sp
        for k, child in self._members(sp).items():
            try:
                target = self.mapping[k].get_target_space_from_source(child)
            except (TypeError, ValueError) as exc:
                raise prefixed(exc, f"key {k!r}") from None
            out = replace(out, self._paths[k], _constant(target), self.nested_separator)
        return out  # type: ignore[no-any-return]

    def transform(self, source_space: Space, data: Any) -> Any:
        sp = self._check_space(source_space)
        if not isinstance(data, Mapping):
            raise TypeError(f"{_WHO} expects a dict with keys {list(sp.spaces)}, got {type(data).__name__}")
        out: Any = dict(data)
        for k, child in self._members(sp).items():
            found, _value = lookup(out, self._paths[k], self.nested_separator, missing_ok=self.ignore_missing_keys)
            if not found:
                continue
            t = self.mapping[k]

            def apply(value: Any, t: DataTransformation = t, child: Space = child, k: str = k) -> Any:
                try:
                    return t.transform(child, value)
                except (TypeError, ValueError) as exc:
                    raise prefixed(exc, f"key {k!r}") from None
            out = replace(out, self._paths[k], apply, self.nested_separator)
        return out

    def direct_inverse(self, source_space: Optional[Space] = None) -> "DictTransformation":
        if not self.has_inverse:
            bad = ", ".join(f"{k!r} ({type(t).__name__})" for k, t in self.mapping.items() if not t.has_inverse)
            raise ValueError(f"{_WHO} has no inverse: the transformations of key(s) {bad} cannot be inverted")
        if source_space is None:
            inverses = {k: t.direct_inverse(None) for k, t in self.mapping.items()}
        else:
            members = self._members(self._check_space(source_space))
            inverses = {k: self.mapping[k].direct_inverse(child) for k, child in members.items()}
        return DictTransformation(inverses, self.ignore_missing_keys, self.nested_separator)

    def close(self) -> None:
        for t in self.mapping.values():
            t.close()

    def to_json(self) -> Dict[str, Any]:
        return {"mapping": {k: transformation_to_json(t) for k, t in self.mapping.items()},
                "ignore_missing_keys": self.ignore_missing_keys, "nested_separator": self.nested_separator}

    @classmethod
    def from_json(cls, params: Mapping[str, Any]) -> "DictTransformation":
        key = "transformations" if "transformations" in params and "mapping" not in params else "mapping"
        items = members_param(params, cls.__name__, Mapping, key, ("ignore_missing_keys", "nested_separator"))
        sep = params.get("nested_separator", "/")
        return cls({k: json_to_transformation(js) for k, js in items.items()},
                   bool_param(params, "ignore_missing_keys", False), sep)


__all__ = ["DictTransformation"]
