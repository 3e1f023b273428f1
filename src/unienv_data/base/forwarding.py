"""`forwarded`: an attribute that only passes on another attribute of the object, declared in one line."""
from __future__ import annotations

from operator import attrgetter
from typing import Any, Optional


def forwarded(path: str, doc: Optional[str] = None) -> Any:
    """A read-only property returning `self.<path>` (a dotted path: ``"inner_storage.capacity"``, ``"_plan.fps"``).

    For the many properties that only pass on another attribute: one line each in the class body, annotated with the
    type they give (``capacity: Optional[int] = forwarded("inner_storage.capacity")``). Read through
    `operator.attrgetter`, it costs no more than a hand-written property. Never forward another object's private
    attribute with it (``"inner._x"``): that is still a private access."""
    return property(attrgetter(path), doc=doc)


__all__ = ["forwarded"]
