"""`Forwarded`: a wrapper attribute read from (and optionally written to) the env the wrapper wraps."""
from __future__ import annotations

from typing import Any, Generic, Optional, Type, TypeVar, overload

T = TypeVar("T")


class Forwarded(Generic[T]):
    """A class attribute of a wrapper (anything with an `env`) whose value is `self.env.<name>`.

    `override=True`: assigning sets the value for this layer only (kept in `self._<name>`, which the wrapper's
    `__init__` sets to None); assigning None goes back to forwarding. `write_through=True`: assigning writes the
    wrapped env's attribute. Neither: the attribute is read-only (AttributeError on assignment)."""

    def __init__(self, *, override: bool = False, write_through: bool = False) -> None:
        if override and write_through:
            raise ValueError("a forwarded attribute either overrides the wrapped env's value or writes through to it")
        self.override = override
        self.write_through = write_through
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name
        self.own = "_" + name

    @overload
    def __get__(self, obj: None, owner: Optional[Type[Any]] = None) -> "Forwarded[T]": ...

    @overload
    def __get__(self, obj: object, owner: Optional[Type[Any]] = None) -> T: ...

    def __get__(self, obj: Any, owner: Optional[Type[Any]] = None) -> Any:
        if obj is None:
            return self
        if self.override:
            own = getattr(obj, self.own)
            if own is not None:
                return own
        return getattr(obj.env, self.name)

    def __set__(self, obj: Any, value: Optional[T]) -> None:
        if self.override:
            setattr(obj, self.own, value)
        elif self.write_through:
            setattr(obj.env, self.name, value)
        else:
            raise AttributeError(f"{type(obj).__name__}.{self.name} is the wrapped env's and cannot be assigned")
