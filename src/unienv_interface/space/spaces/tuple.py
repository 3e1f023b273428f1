"""`TupleSpace`: an ordered sequence of child spaces."""
from __future__ import annotations

from typing import Any, Iterator, Mapping, Optional, Sequence, Tuple

from unienv_interface.backends.base import BDeviceType, BDtypeType, BRNGType

from ..metadata import SpaceMetadata
from ..space import Space


class TupleSpace(Space[Tuple[Any, ...], BDeviceType, BDtypeType, BRNGType]):
    """Positional children sharing one backend. Equality is tuple equality of the children."""

    def __init__(self, backend: Any, spaces: Sequence[Space], device: Any = None,
                 metadata: Optional[Mapping[str, Any]] = None) -> None:
        children = []
        for i, sp in enumerate(spaces):
            if not isinstance(sp, Space):
                raise TypeError(f"TupleSpace child {i} must be a Space, got {type(sp).__name__}")
            if sp.backend is not backend:
                raise ValueError(f"TupleSpace child {i} uses backend {sp.backend}, expected {backend}")
            children.append(sp if device is None else sp.to(device=device))
        super().__init__(backend, shape=None, device=device, dtype=None, metadata=metadata)
        self.spaces: Tuple[Space, ...] = tuple(children)

    def _copy_with(self, metadata: SpaceMetadata) -> "TupleSpace":
        return TupleSpace(self._backend, self.spaces, self._device, metadata)

    def __getitem__(self, i: int) -> Space:
        return self.spaces[i]

    def __iter__(self) -> Iterator[Space]:
        return iter(self.spaces)

    def __len__(self) -> int:
        return len(self.spaces)

    def _moved(self, backend: Any, device: Any) -> "TupleSpace":
        return TupleSpace(backend, [s.to(backend, device) for s in self.spaces], device=device,
                          metadata=self._metadata)

    def is_bounded(self, manner: str = "both") -> bool:
        return all(s.is_bounded(manner) for s in self.spaces)

    def contains(self, x: Any) -> bool:
        return (isinstance(x, (tuple, list)) and len(x) == len(self.spaces)
                and all(s.contains(v) for s, v in zip(self.spaces, x)))

    def sample(self, rng: Any) -> Tuple[Any, Tuple[Any, ...]]:
        out = []
        for s in self.spaces:
            rng, v = s.sample(rng)
            out.append(v)
        return rng, tuple(out)

    def create_empty(self) -> Tuple[Any, ...]:
        return tuple(s.create_empty() for s in self.spaces)

    def clip(self, x: Any) -> Tuple[Any, ...]:
        return tuple(s.clip(v) for s, v in zip(self.spaces, x))

    def data_to(self, data: Any, backend: Any = None, device: Any = None) -> Tuple[Any, ...]:
        return tuple(s.data_to(v, backend, device) for s, v in zip(self.spaces, data))

    def get_repr(self, abbreviate: bool = False, include_backend: bool = True, include_device: bool = True,
                 include_dtype: bool = True) -> str:
        return "TupleSpace(" + ", ".join(s.get_repr(abbreviate, False, False, include_dtype) for s in self.spaces) + ")"

    def is_subspaceeq(self, other: Space) -> bool:
        """True when `other` is a TupleSpace of the same backend and length, each child a subspace of `other`'s."""
        return (isinstance(other, TupleSpace) and other.backend is self._backend and len(other) == len(self)
                and all(a.is_subspaceeq(b) for a, b in zip(self.spaces, other.spaces)))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TupleSpace) and other.backend is self._backend and other.spaces == self.spaces

    __hash__ = None  # type: ignore[assignment]
