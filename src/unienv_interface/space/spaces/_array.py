"""`FixedShape`: what the array spaces (`BoxSpace`, `BinarySpace`) share beyond `Space`."""
from __future__ import annotations

from typing import Optional, Tuple


class FixedShape:
    """Mixin (listed before `Space`) for a space whose shape is always set: `shape` is a tuple, never None."""

    _shape: Optional[Tuple[int, ...]]

    @property
    def shape(self) -> Tuple[int, ...]:
        if self._shape is None:
            raise RuntimeError("internal invariant violated: an array space has no shape")
        return self._shape
