"""`DictSpace`: a mapping of named child spaces (keys kept sorted)."""
from __future__ import annotations

from typing import Any, Dict, Iterator, Mapping, Optional, Sequence, Tuple, Union

from unienv_interface.backends.base import BDeviceType, BDtypeType, BRNGType

from ..metadata import SpaceMetadata
from ..space import Space, common_device


def _sorted_items(items: Sequence[Tuple[Any, Any]]) -> Sequence[Tuple[Any, Any]]:
    try:
        return sorted(items, key=lambda kv: kv[0])
    except TypeError:
        return list(items)


class DictSpace(Space[Dict[str, Any], BDeviceType, BDtypeType, BRNGType]):
    """Named children, stored in sorted key order (insertion order when keys do not sort).

    Nested plain mappings become nested DictSpaces. All children share the backend; with `device` they are moved
    there, otherwise the device is the children's common device (or None). Equality is dict equality of children.
    """

    def __init__(self, backend: Any, spaces: Union[None, Mapping[str, Any], Sequence[Tuple[str, Any]]] = None,
                 device: Any = None, metadata: Optional[Mapping[str, Any]] = None) -> None:
        if spaces is None:
            items: Sequence[Tuple[Any, Any]] = []
        elif isinstance(spaces, Mapping):
            items = list(spaces.items())
        else:
            items = list(spaces)
        children: Dict[str, Space] = {}
        for key, sp in _sorted_items(items):
            if isinstance(sp, Mapping):
                sp = DictSpace(backend, sp, device=device)
            if not isinstance(sp, Space):
                raise TypeError(f"DictSpace child {key!r} must be a Space, got {type(sp).__name__}")
            if sp.backend is not backend:
                raise ValueError(f"DictSpace child {key!r} uses backend {sp.backend}, expected {backend}")
            if device is not None:
                sp = sp.to(device=device)
            if key in children:
                raise ValueError(f"duplicate DictSpace key {key!r}")
            children[key] = sp
        if device is None:
            device = common_device(children.values())
        super().__init__(backend, shape=None, device=device, dtype=None, metadata=metadata)
        self.spaces: Dict[str, Space] = children

    def _copy_with(self, metadata: SpaceMetadata) -> "DictSpace":
        return DictSpace(self._backend, self.spaces, self._device, metadata)

    def __getitem__(self, key: str) -> Space:
        return self.spaces[key]

    def __setitem__(self, key: str, value: Space) -> None:
        if not isinstance(value, Space) or value.backend is not self._backend:
            raise TypeError(f"DictSpace[{key!r}] must be a Space on backend {self._backend}")
        self.spaces[key] = value
        self.spaces = dict(_sorted_items(list(self.spaces.items())))

    def __iter__(self) -> Iterator[str]:
        return iter(self.spaces)

    def __len__(self) -> int:
        return len(self.spaces)

    def keys(self) -> Any:
        return self.spaces.keys()

    def values(self) -> Any:
        return self.spaces.values()

    def items(self) -> Any:
        return self.spaces.items()

    def _moved(self, backend: Any, device: Any) -> "DictSpace":
        return DictSpace(backend, {k: s.to(backend, device) for k, s in self.spaces.items()}, device=device,
                         metadata=self._metadata)

    def is_bounded(self, manner: str = "both") -> bool:
        return all(s.is_bounded(manner) for s in self.spaces.values())

    def contains(self, x: Any) -> bool:
        if not isinstance(x, Mapping) or set(x.keys()) != set(self.spaces.keys()):
            return False
        return all(s.contains(x[k]) for k, s in self.spaces.items())

    def sample(self, rng: Any) -> Tuple[Any, Dict[str, Any]]:
        out = {}
        for k, s in self.spaces.items():
            rng, out[k] = s.sample(rng)
        return rng, out

    def create_empty(self) -> Dict[str, Any]:
        return {k: s.create_empty() for k, s in self.spaces.items()}

    def clip(self, x: Any) -> Dict[str, Any]:
        return {k: s.clip(x[k]) for k, s in self.spaces.items()}

    def data_to(self, data: Any, backend: Any = None, device: Any = None) -> Dict[str, Any]:
        return {k: s.data_to(data[k], backend, device) for k, s in self.spaces.items()}

    def get_repr(self, abbreviate: bool = False, include_backend: bool = True, include_device: bool = True,
                 include_dtype: bool = True) -> str:
        inner = ", ".join(f"{k!r}: {s.get_repr(abbreviate, False, False, include_dtype)}" for k, s in self.spaces.items())
        return f"DictSpace({{{inner}}}" + (f", backend={self._backend}" if include_backend else "") + ")"

    def is_subspaceeq(self, other: Space) -> bool:
        """True when `other` is a DictSpace of the same backend with every key of this one (it may have more),
        each child a subspace of `other`'s (the "required observation keys" check)."""
        return (isinstance(other, DictSpace) and other.backend is self._backend
                and all(k in other.spaces and s.is_subspaceeq(other.spaces[k]) for k, s in self.spaces.items()))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DictSpace) and other.backend is self._backend and other.spaces == self.spaces

    __hash__ = None  # type: ignore[assignment]
