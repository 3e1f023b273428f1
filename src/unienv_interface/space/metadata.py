"""`SpaceMetadata`: a read-only, JSON-serializable mapping attached to a space (ignored by equality)."""
from __future__ import annotations

import json
from typing import Any, Iterator, Mapping, Optional


class SpaceMetadata(Mapping[str, Any]):
    """Immutable key/value annotations of a space (e.g. `{"kind": "image"}`); values must be JSON-serializable."""

    __slots__ = ("_data",)

    def __init__(self, data: Optional[Mapping[str, Any]] = None) -> None:
        items = dict(data or {})
        try:
            json.dumps(items, allow_nan=True)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"space metadata must be JSON-serializable: {exc}") from None
        self._data = items

    def __getitem__(self, key: str) -> Any:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def to_dict(self) -> dict:
        """A plain (mutable) copy."""
        return json.loads(json.dumps(self._data))

    def __repr__(self) -> str:
        return f"SpaceMetadata({self._data!r})"
