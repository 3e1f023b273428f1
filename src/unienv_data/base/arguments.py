"""Checks of the plain arguments storages take (capacities, row counts, option sizes) and the import of optional
dependencies: one definition each, for every storage."""
from __future__ import annotations

from typing import Any, Optional

import numpy as np

from unienv_interface._optional import import_optional


def check_capacity(capacity: Any) -> Optional[int]:
    """A positive int capacity (a ring), or None (growable); ValueError otherwise."""
    if capacity is None:
        return None
    if isinstance(capacity, (bool, np.bool_)) or not isinstance(capacity, (int, np.integer)) or int(capacity) <= 0:
        raise ValueError(f"capacity must be a positive int or None (growable), got {capacity!r}")
    return int(capacity)


def check_count(value: Any, what: str, *, minimum: int = 0, maximum: Optional[int] = None) -> int:
    """An int in `[minimum, maximum]` (bools refused); ValueError naming `what`, the range and the value otherwise."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or int(value) < minimum \
            or (maximum is not None and int(value) > maximum):
        rng = f"[{minimum}, {maximum}]" if maximum is not None else f">= {minimum}"
        raise ValueError(f"{what} needs an int in {rng}, got {value!r}")
    return int(value)


__all__ = ["check_capacity", "check_count", "import_optional"]
