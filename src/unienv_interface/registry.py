"""A registry of classes by the name that files write for them.

Files (storage metadata, transformation JSON) name a class as `module.QualName`. Such a name is looked up here
and never imported by its dotted path: only the owner's built-in classes (imported from the owner's own modules on
first use) and classes registered explicitly by plugins resolve, so a hostile file cannot make the library import
or run anything. `unienv_data.base.registry` (storages) and `unienv_interface.transformations` (transformations)
each hold one `ClassRegistry`.
"""
from __future__ import annotations

import importlib
from typing import Callable, Dict, Generic, Mapping, Optional, Tuple, Type, TypeVar

T = TypeVar("T")


def class_type_name(cls: type) -> str:
    """The name files use for `cls` (`module.QualName`)."""
    return f"{cls.__module__}.{cls.__qualname__}"


class ClassRegistry(Generic[T]):
    """Classes by name: built-ins imported lazily from `(module, attribute)` pairs, plus registered plugins.

    `what` names the kind of class in messages ("storage", "transformation"); `error` is the exception type raised
    for an unknown or malformed name (the owner's format error); `hint` says how a plugin registers itself.
    """

    def __init__(self, what: str, builtins: Mapping[str, Tuple[str, str]], error: Callable[[str], Exception],
                 hint: str, base: Optional[type] = None) -> None:
        self.what = what
        self._builtin: Dict[str, Tuple[str, str]] = dict(builtins)
        self._registered: Dict[str, Type[T]] = {}
        self._error = error
        self._hint = hint
        self._base = base

    def register(self, cls: Type[T], *aliases: str) -> Type[T]:
        """Makes `cls` resolvable under its own name and `aliases`; returns it (usable as a class decorator)."""
        if self._base is not None and not (isinstance(cls, type) and issubclass(cls, self._base)):
            raise TypeError(f"only {self._base.__name__} subclasses can be registered as a {self.what}, got {cls!r}")
        for name in (class_type_name(cls),) + aliases:
            self._registered[name] = cls
        return cls

    def is_known(self, name: str) -> bool:
        """Whether `name` resolves (a built-in name or a registered one)."""
        return name in self._builtin or name in self._registered

    def registered_as(self, name: str) -> Optional[Type[T]]:
        """The class registered (or already resolved) under `name`, without importing anything."""
        return self._registered.get(name)

    def resolve(self, name: object, where: str = "") -> Type[T]:
        """The class under `name`; the owner's format error (naming `where`, the name and the known names) for
        anything else."""
        prefix = f"{where}: " if where else ""
        if not isinstance(name, str):
            raise self._error(f"{prefix}{self.what} type must be a string, got {type(name).__name__}")
        found = self._registered.get(name)
        if found is not None:
            return found
        if name in self._builtin:
            module, attr = self._builtin[name]
            cls: Type[T] = getattr(importlib.import_module(module), attr)
            self._registered[name] = cls
            return cls
        known = sorted(set(self._builtin) | set(self._registered))
        raise self._error(f"{prefix}unknown {self.what} type {name!r}; known: {known} ({self._hint})")


__all__ = ["ClassRegistry", "class_type_name"]
