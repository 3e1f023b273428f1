"""Transformations to and from JSON, through a registry of transformation classes.

Format: `{"type": "<module>.<ClassName>", **parameters}` (the parameters are what `to_json()` returns). Reading
looks the type name up in this registry: the built-in transformations (imported from this package's own modules
on first use, also under their short class names) and classes registered explicitly with
`register_transformation`. A name is never imported as a dotted path, so a hostile file cannot make the library
import or run anything. Unknown names, malformed objects and invalid parameters raise
`TransformationFormatError` (a ValueError); nesting deeper than `MAX_DEPTH` is refused.
"""
from __future__ import annotations

import importlib
import threading
from typing import Any, Dict, Mapping, Tuple, Type

from .transformation import DataTransformation, TransformationFormatError

#: deepest nesting of composite transformations accepted from JSON
MAX_DEPTH = 32

_PKG = "unienv_interface.transformations"
_BUILTIN_CLASSES: Dict[str, Tuple[str, str]] = {
    "IdentityTransformation": (f"{_PKG}.identity", "IdentityTransformation"),
    "ChainedTransformation": (f"{_PKG}.chained_transform", "ChainedTransformation"),
    "DictTransformation": (f"{_PKG}.dict_transform", "DictTransformation"),
    "RescaleTransformation": (f"{_PKG}.rescale", "RescaleTransformation"),
    "DtypeTransformation": (f"{_PKG}.dtype_cast", "DtypeTransformation"),
}
_BUILTIN: Dict[str, Tuple[str, str]] = {}
for _short, (_module, _attr) in _BUILTIN_CLASSES.items():
    _BUILTIN[f"{_module}.{_attr}"] = (_module, _attr)
    _BUILTIN[_short] = (_module, _attr)
_REGISTERED: Dict[str, Type[DataTransformation]] = {}
_STATE = threading.local()


def transformation_type_name(cls: Type[DataTransformation]) -> str:
    """The name JSON uses for `cls` (`module.QualName`)."""
    return f"{cls.__module__}.{cls.__qualname__}"


def register_transformation(cls: Type[DataTransformation], *aliases: str) -> Type[DataTransformation]:
    """Makes `cls` loadable from JSON under its own name and `aliases`. Usable as a class decorator."""
    if not (isinstance(cls, type) and issubclass(cls, DataTransformation)):
        raise TypeError(f"only DataTransformation subclasses can be registered, got {cls!r}")
    for name in (transformation_type_name(cls),) + aliases:
        _REGISTERED[name] = cls
    return cls


def resolve_transformation_class(name: Any) -> Type[DataTransformation]:
    """The transformation class registered under `name`; TransformationFormatError for anything unknown."""
    if not isinstance(name, str):
        raise TransformationFormatError(f"transformation type must be a string, got {type(name).__name__}")
    if name in _REGISTERED:
        return _REGISTERED[name]
    if name in _BUILTIN:
        module, attr = _BUILTIN[name]
        cls = getattr(importlib.import_module(module), attr)
        _REGISTERED[name] = cls
        return cls  # type: ignore[no-any-return]
    known = sorted(set(_BUILTIN) | set(_REGISTERED))
    raise TransformationFormatError(f"unknown transformation type {name!r}; known: {known} (plugins must call "
                                    "unienv_interface.transformations.register_transformation)")


def transformation_to_json(transformation: DataTransformation) -> Dict[str, Any]:
    """`{"type": <name>, **transformation.to_json()}`; the class must be registered (built-ins are)."""
    if not isinstance(transformation, DataTransformation):
        raise TypeError(f"expected a DataTransformation, got {type(transformation).__name__}")
    cls = type(transformation)
    name = transformation_type_name(cls)
    if name not in _BUILTIN and _REGISTERED.get(name) is not cls:
        raise ValueError(f"{cls.__name__} is not registered, so it could not be read back: decorate it with "
                         "unienv_interface.transformations.register_transformation")
    params = transformation.to_json()
    if "type" in params:
        raise ValueError(f"{cls.__name__}.to_json() must not use the reserved key 'type'")
    return {"type": name, **params}


def json_to_transformation(json_data: Mapping[str, Any], backend: Any = None, device: Any = None) -> DataTransformation:
    """Rebuilds a transformation written by `transformation_to_json` (`backend` / `device` are accepted for
    reference compatibility; the built-in transformations are backend-neutral and ignore them)."""
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


__all__ = ["transformation_to_json", "json_to_transformation", "register_transformation",
           "resolve_transformation_class", "transformation_type_name", "MAX_DEPTH"]
