"""`ClosesOnExit`: the context-manager protocol of every object that holds resources until `close()`."""
from __future__ import annotations

from typing import Any, Callable, TypeVar

_T = TypeVar("_T", bound="ClosesOnExit")


class ClosesOnExit:
    """Mixin: `with obj:` gives `obj` and calls `obj.close()` when the block ends (also on an exception)."""

    close: Callable[[], None]

    def __enter__(self: _T) -> _T:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
