"""`DataTransformation`: a map from the data of a source space to the data of a target space.

A transformation is a small, stateless-looking object (its parameters are plain numbers and names) used as:

* `get_target_space_from_source(source_space)`: the space the transformed data belongs to;
* `transform(source_space, data)`: `data` (an element of `source_space`, optionally with extra leading batch axes)
  mapped to the target space. The input is checked: a value outside the source space (wrong shape, a dtype that
  cannot hold it exactly, out of bounds) raises ValueError / TypeError / KeyError naming what was expected and given;
* `has_inverse` / `direct_inverse(source_space)`: the inverse transformation (mapping the target space back onto
  the source space), or ValueError when there is none;
* JSON: `to_json()` gives the parameters, `transformation_to_json` / `json_to_transformation` (below,
  also importable from `serialization_utils`) add and resolve the registered type name. A name read from a file is looked up in a registry, never imported.

Subclasses implement `get_target_space_from_source`, `transform`, `to_json` and `from_json` (and `direct_inverse`
when `has_inverse`). A subclass written for the reference, which implements `serialize` (the parameters, without
the type name) and `deserialize_from` instead, works too: the default `to_json` / `from_json` call them. Two transformations are equal when they have the same type and the same JSON parameters.
"""
from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from typing import Any, Dict, Mapping, Optional, Tuple, Type

from unienv_interface.registry import ClassRegistry, class_type_name
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
    def to_json(self) -> Dict[str, Any]:
        """The parameters as a JSON-compatible dict (without the type name, which the registry adds).

        The default serves a subclass written for the reference, which implements `serialize` instead: its
        output (a `type` key dropped). NotImplementedError when the subclass implements neither."""
        cls = type(self)
        if not _overrides(cls, "serialize") or id(self) in _serializing():
            raise NotImplementedError(f"{cls.__name__} implements neither to_json nor serialize: implement one to "
                                      "save or compare it")
        _serializing().add(id(self))
        try:
            params = self.serialize()
        finally:
            _serializing().discard(id(self))
        if not isinstance(params, Mapping):
            raise TypeError(f"{cls.__name__}.serialize() must return a dict, got {type(params).__name__}")
        return {k: v for k, v in params.items() if k != "type"}

    @classmethod
    def from_json(cls, params: Mapping[str, Any]) -> "DataTransformation":
        """Rebuilds a transformation from `to_json()` output; ValueError / TypeError for invalid parameters.

        The default serves a subclass written for the reference, which implements `deserialize_from` instead
        (called with the parameters). NotImplementedError when the subclass implements neither."""
        if not _overrides(cls, "deserialize_from"):
            raise NotImplementedError(f"{cls.__name__} implements neither from_json nor deserialize_from: implement "
                                      "one to load it")
        return cls.deserialize_from(dict(params))

    def serialize(self, source_space: Optional[Any] = None) -> Dict[str, Any]:
        """The parameters as a JSON-compatible dict, without the type name (as unienv 0.0.1b16's `serialize`; the
        typed form is `transformation_to_json`). `source_space` is accepted and not needed."""
        return self.to_json()

    @classmethod
    def deserialize_from(cls, json_data: Mapping[str, Any], source_space: Optional[Any] = None, backend: Any = None,
                         device: Any = None) -> "DataTransformation":
        """Rebuilds a transformation from `serialize()` output (its parameters) or from `transformation_to_json`
        output (with a `type`, which must name `cls` or a subclass). Array parameters are built on `backend` /
        `device`, by default those of `source_space` (the reference's signature: `deserialize_from(json_data,
        source_space=None)`)."""
        if "type" not in json_data:
            return cls.from_json(json_data)
        out = json_to_transformation(json_data, backend, device, source_space=source_space)
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
        except (TypeError, ValueError, NotImplementedError):  # e.g. a member that cannot be serialized: only
            # identity is known
            return False

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        try:
            params = ", ".join(f"{k}={v!r}" for k, v in self.to_json().items())
        except (TypeError, ValueError, NotImplementedError):
            params = "..."
        return f"{type(self).__name__}({params})"


# ---------------------------------------------------------------------- registry and JSON
#: deepest nesting of composite transformations accepted from JSON
MAX_DEPTH = 32

_PKG = "unienv_interface.transformations"
_BUILTIN_CLASSES: Dict[str, Tuple[str, str]] = {
    "IdentityTransformation": (f"{_PKG}.identity", "IdentityTransformation"),
    "ChainedTransformation": (f"{_PKG}.chained_transform", "ChainedTransformation"),
    "DictTransformation": (f"{_PKG}.dict_transform", "DictTransformation"),
    "RescaleTransformation": (f"{_PKG}.rescale", "RescaleTransformation"),
    "DtypeTransformation": (f"{_PKG}.dtype_cast", "DtypeTransformation"),
    "BatchifyTransformation": (f"{_PKG}.batch_and_unbatch", "BatchifyTransformation"),
    "UnBatchifyTransformation": (f"{_PKG}.batch_and_unbatch", "UnBatchifyTransformation"),
    "CropTransformation": (f"{_PKG}.crop", "CropTransformation"),
    "DictIncludeKeyTransformation": (f"{_PKG}.filter_dict", "DictIncludeKeyTransformation"),
    "DictExcludeKeyTransformation": (f"{_PKG}.filter_dict", "DictExcludeKeyTransformation"),
    "FlattenDictTransformation": (f"{_PKG}.flatten_dict_transform", "FlattenDictTransformation"),
    "UnflattenDictTransformation": (f"{_PKG}.flatten_dict_transform", "UnflattenDictTransformation"),
    "ImageResizeTransformation": (f"{_PKG}.image_resize", "ImageResizeTransformation"),
    "IterativeTransformation": (f"{_PKG}.iter_transform", "IterativeTransformation"),
    "LeafwiseTransformation": (f"{_PKG}.iter_transform", "LeafwiseTransformation"),
}
_BUILTIN: Dict[str, Tuple[str, str]] = {}
for _short, (_module, _attr) in _BUILTIN_CLASSES.items():
    _BUILTIN[f"{_module}.{_attr}"] = (_module, _attr)
    _BUILTIN[_short] = (_module, _attr)
_REGISTRY: ClassRegistry[DataTransformation] = ClassRegistry(
    "transformation", _BUILTIN, TransformationFormatError,
    "plugins must call unienv_interface.transformations.register_transformation", base=DataTransformation)
_STATE = threading.local()


def _overrides(cls: type, name: str) -> bool:
    """Whether `cls` takes `name` from a subclass of DataTransformation rather than from DataTransformation."""
    owner = next((k for k in cls.__mro__ if name in vars(k)), None)
    return owner is not None and owner is not DataTransformation


def _serializing() -> set:
    """The ids of the transformations whose `serialize` the default `to_json` is running in this thread (a
    `serialize` that calls back into `to_json` is refused instead of recursing)."""
    ids = getattr(_STATE, "serializing", None)
    if ids is None:
        ids = _STATE.serializing = set()
    return ids


def transformation_type_name(cls: Type[DataTransformation]) -> str:
    """The name JSON uses for `cls` (`module.QualName`)."""
    return class_type_name(cls)


def register_transformation(cls: Type[DataTransformation], *aliases: str) -> Type[DataTransformation]:
    """Makes `cls` loadable from JSON under its own name and `aliases`. Usable as a class decorator."""
    return _REGISTRY.register(cls, *aliases)


def resolve_transformation_class(name: Any) -> Type[DataTransformation]:
    """The transformation class registered under `name`; TransformationFormatError for anything unknown."""
    return _REGISTRY.resolve(name)


def transformation_to_json(transformation: DataTransformation, source_space: Optional[Any] = None) -> Dict[str, Any]:
    """`{"type": <name>, **transformation.to_json()}`; the class must be registered (built-ins are). `source_space`
    (the reference's signature) is accepted and not needed."""
    if not isinstance(transformation, DataTransformation):
        raise TypeError(f"expected a DataTransformation, got {type(transformation).__name__}")
    cls = type(transformation)
    name = transformation_type_name(cls)
    if name not in _BUILTIN and _REGISTRY.registered_as(name) is not cls:
        raise ValueError(f"{cls.__name__} is not registered, so it could not be read back: decorate it with "
                         "unienv_interface.transformations.register_transformation")
    params = transformation.to_json()
    if "type" in params:
        raise ValueError(f"{cls.__name__}.to_json() must not use the reserved key 'type'")
    return {"type": name, **params}


def json_to_transformation(json_data: Mapping[str, Any], backend: Any = None, device: Any = None, *,
                           source_space: Optional[Any] = None) -> DataTransformation:
    """Rebuilds a transformation written by `transformation_to_json` (`backend` / `device` / `source_space` are
    accepted for reference compatibility; the built-in transformations are backend-neutral and ignore them)."""
    depth = getattr(_STATE, "depth", 0)
    if depth >= MAX_DEPTH:
        raise TransformationFormatError(f"transformation JSON is nested deeper than {MAX_DEPTH} levels")
    if not isinstance(json_data, Mapping):
        raise TransformationFormatError(f"a transformation must be described by a JSON object, got "
                                        f"{type(json_data).__name__}")
    if "type" not in json_data:
        raise TransformationFormatError(f"transformation JSON has no 'type' field: {str(dict(json_data))[:120]}")
    cls = resolve_transformation_class(json_data["type"])
    params = {k: v for k, v in json_data.items() if k != "type"}
    _STATE.depth = depth + 1
    try:
        return cls.from_json(params)
    except TransformationFormatError:
        raise
    except (TypeError, ValueError, KeyError) as exc:
        raise TransformationFormatError(f"invalid parameters for {cls.__name__}: {exc}") from None
    finally:
        _STATE.depth = depth


def check_param_names(params: Mapping[str, Any], allowed: Tuple[str, ...], required: Tuple[str, ...], who: str) -> None:
    """ValueError naming unknown or missing parameters (shared by the built-in `from_json` methods)."""
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        raise ValueError(f"{who}: unknown parameter(s) {unknown}; expected {list(allowed)}")
    missing = [p for p in required if p not in params]
    if missing:
        raise ValueError(f"{who}: missing parameter(s) {missing}")


def members_param(params: Mapping[str, Any], who: str, container: type, key: str = "transformations",
                  optional: Tuple[str, ...] = ()) -> Any:
    """The members (`key`, by default `transformations`) of a composite transformation's JSON, checked to be a
    `container` (`list`: a JSON array, `Mapping`: an object); `optional` names the other parameters allowed.
    ValueError / TypeError naming what is wrong."""
    check_param_names(params, (key,) + optional, (key,), who)
    items = params[key]
    if not isinstance(items, container):
        raise TypeError(f"{key!r} must be {'a list' if container is list else 'an object'}, got "
                        f"{type(items).__name__}")
    return items


def bool_param(params: Mapping[str, Any], key: str, default: bool) -> bool:
    """An optional boolean parameter of a transformation's JSON (TypeError for anything but true / false)."""
    value = params.get(key, default)
    if not isinstance(value, bool):
        raise TypeError(f"{key!r} must be true or false, got {value!r}")
    return value


__all__ = ["DataTransformation", "TransformationFormatError", "transformation_to_json", "json_to_transformation",
           "register_transformation", "resolve_transformation_class", "transformation_type_name", "MAX_DEPTH",
           "check_param_names", "members_param", "bool_param"]
