"""`ArraySpaceMixin`: what the array spaces (`BoxSpace`, `BinarySpace`) share beyond `Space`, and the common end of
every array-like space's `get_repr`."""
from __future__ import annotations

from typing import Any, List, Optional, Tuple


def format_repr(name: str, parts: List[str], backend: Any, device: Any, include_backend: bool,
                include_device: bool) -> str:
    """`name(parts..., backend=..., device=...)` (the device only when one is set)."""
    if include_backend:
        parts.append(f"backend={backend}")
    if include_device and device is not None:
        parts.append(f"device={device}")
    return f"{name}({', '.join(parts)})"


class ArraySpaceMixin:
    """Mixin (listed before `Space`) for a space of arrays: its shape is always set, and its `get_repr` ends alike."""

    _shape: Optional[Tuple[int, ...]]
    _backend: Any
    _device: Any

    @property
    def shape(self) -> Tuple[int, ...]:
        if self._shape is None:
            raise RuntimeError("internal invariant violated: an array space has no shape")
        return self._shape

    def _repr(self, name: str, parts: List[str], include_backend: bool, include_device: bool) -> str:
        """`name(parts..., backend=..., device=...)`: the end of `get_repr` (the device only when one is set)."""
        return format_repr(name, parts, self._backend, self._device, include_backend, include_device)
