"""`DictIncludeKeyTransformation` / `DictExcludeKeyTransformation`: keep only, or drop, some (nested) keys of a
DictSpace and its data."""
from __future__ import annotations

from typing import Any, Dict, FrozenSet, Iterable, List, Mapping, Tuple

from unienv_interface.space import DictSpace, Space

from ._keys import KeyTree, check_separator, split_key
from .serialization_utils import check_param_names
from .transformation import DataTransformation, bool_param


class _KeyFilter(DataTransformation):
    """The shared part: a set of nested keys, a separator and `ignore_missing_keys`. Not invertible (the dropped
    values are gone)."""

    has_inverse = False
    _param = ""          # the JSON / constructor name of the key set

    def __init__(self, keys: Iterable[str], *, ignore_missing_keys: bool = False, nested_separator: str = "/") -> None:
        if isinstance(keys, (str, bytes)) or not isinstance(keys, Iterable):
            raise TypeError(f"{type(self).__name__}: {self._param} must be an iterable of key strings, got "
                            f"{type(keys).__name__}")
        if not isinstance(ignore_missing_keys, bool):
            raise TypeError(f"ignore_missing_keys must be a bool, got {ignore_missing_keys!r}")
        self.nested_separator = check_separator(nested_separator)
        self.ignore_missing_keys = ignore_missing_keys
        keys = frozenset(keys)
        self._paths: List[Tuple[str, ...]] = [split_key(k, self.nested_separator) for k in sorted(keys, key=str)]
        self._keys: FrozenSet[str] = keys
        self._tree = KeyTree.of(self._paths)

    def _check(self, source_space: Space) -> DictSpace:
        if not isinstance(source_space, DictSpace):
            raise TypeError(f"{type(self).__name__} applies to DictSpace only, got {type(source_space).__name__}")
        return source_space

    def _apply(self, root: Any) -> Any:
        raise NotImplementedError

    def get_target_space_from_source(self, source_space: Space) -> DictSpace:
        return self._apply(self._check(source_space))  # type: ignore[no-any-return]

    def transform(self, source_space: Space, data: Any) -> Any:
        sp = self._check(source_space)
        if not isinstance(data, Mapping):
            raise TypeError(f"{type(self).__name__} expects a dict with keys {list(sp.spaces)}, got "
                            f"{type(data).__name__}")
        return self._apply(data)

    def to_json(self) -> Dict[str, Any]:
        return {self._param: sorted(self._keys), "nested_separator": self.nested_separator,
                "ignore_missing_keys": self.ignore_missing_keys}

    @classmethod
    def from_json(cls, params: Mapping[str, Any]) -> "_KeyFilter":
        check_param_names(params, (cls._param, "nested_separator", "ignore_missing_keys"), (cls._param,), cls.__name__)
        keys = params[cls._param]
        if not isinstance(keys, list):
            raise TypeError(f"{cls._param!r} must be a list of keys, got {type(keys).__name__}")
        return cls(keys, ignore_missing_keys=bool_param(params, "ignore_missing_keys", False),
                   nested_separator=params.get("nested_separator", "/"))


class DictIncludeKeyTransformation(_KeyFilter):
    """Keeps only the keys in `enabled_keys` (nested keys joined by `nested_separator`; a key keeps its whole
    sub-tree, and the DictSpaces on its path keep their metadata). A key the space lacks is ValueError (KeyError for
    data) unless `ignore_missing_keys`. The result is new dicts sharing the kept values. No inverse."""

    _param = "enabled_keys"

    def __init__(self, enabled_keys: Iterable[str], *, ignore_missing_keys: bool = False,
                 nested_separator: str = "/") -> None:
        super().__init__(enabled_keys, ignore_missing_keys=ignore_missing_keys, nested_separator=nested_separator)

    @property
    def enabled_keys(self) -> FrozenSet[str]:
        """The keys kept."""
        return self._keys

    def _apply(self, root: Any) -> Any:
        return self._tree.include(root, self.nested_separator, self.ignore_missing_keys)


class DictExcludeKeyTransformation(_KeyFilter):
    """Drops the keys in `excluded_keys` (nested keys joined by `nested_separator`; a key drops its whole sub-tree,
    and keys below it are covered). A key the space lacks is ValueError (KeyError for data) unless
    `ignore_missing_keys`. The result is new dicts sharing the other values. No inverse."""

    _param = "excluded_keys"

    def __init__(self, excluded_keys: Iterable[str], *, ignore_missing_keys: bool = False,
                 nested_separator: str = "/") -> None:
        super().__init__(excluded_keys, ignore_missing_keys=ignore_missing_keys, nested_separator=nested_separator)

    @property
    def excluded_keys(self) -> FrozenSet[str]:
        """The keys dropped."""
        return self._keys

    def _apply(self, root: Any) -> Any:
        return self._tree.exclude(root, self.nested_separator, self.ignore_missing_keys)


__all__ = ["DictIncludeKeyTransformation", "DictExcludeKeyTransformation"]
