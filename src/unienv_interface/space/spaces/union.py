"""`UnionSpace`: an element of exactly one of several alternative spaces, tagged with the alternative's index."""
from __future__ import annotations

from typing import Any, Iterable, Iterator, Mapping, Optional, Tuple

import numpy as np

from unienv_interface.backends.base import BDeviceType, BDtypeType, BRNGType

from ..metadata import SpaceMetadata
from ..space import Space, check_backend, common_device


def _is_index(value: Any) -> bool:
    return isinstance(value, (int, np.integer))


class UnionSpace(Space[Tuple[int, Any], BDeviceType, BDtypeType, BRNGType]):
    """Elements are pairs `(index, value)` where `value` is an element of `spaces[index]`.

    At least one alternative; all share the backend. With `device` they are moved there, otherwise the device is
    the alternatives' common device (or None). Equality is tuple equality of the alternatives (order matters).
    """

    def __init__(self, backend: Any, spaces: Iterable[Space], device: Any = None,
                 metadata: Optional[Mapping[str, Any]] = None) -> None:
        backend = check_backend(backend)
        if isinstance(spaces, Space) or not isinstance(spaces, Iterable):
            raise TypeError(f"UnionSpace spaces must be an iterable of spaces, got {type(spaces).__name__}")
        children = []
        for i, sp in enumerate(spaces):
            if not isinstance(sp, Space):
                raise TypeError(f"UnionSpace alternative {i} must be a Space, got {type(sp).__name__}")
            if sp.backend is not backend:
                raise ValueError(f"UnionSpace alternative {i} uses backend {sp.backend}, expected {backend}")
            children.append(sp if device is None else sp.to(device=device))
        if not children:
            raise ValueError("UnionSpace needs at least one alternative space, got none")
        if device is None:
            device = common_device(children)
        super().__init__(backend, shape=None, device=device, dtype=None, metadata=metadata)
        self.spaces: Tuple[Space, ...] = tuple(children)

    def _copy_with(self, metadata: SpaceMetadata) -> "UnionSpace":
        return UnionSpace(self._backend, self.spaces, self._device, metadata)

    def _moved(self, backend: Any, device: Any) -> "UnionSpace":
        return UnionSpace(backend, [s.to(backend, device) for s in self.spaces], device=device,
                          metadata=self._metadata)

    def __getitem__(self, index: int) -> Space:
        return self.spaces[index]

    def __iter__(self) -> Iterator[Space]:
        return iter(self.spaces)

    def __len__(self) -> int:
        return len(self.spaces)

    def _check_pair(self, x: Any, what: str) -> Tuple[int, Any]:
        if not self.is_pair(x):
            raise ValueError(f"UnionSpace.{what}: expected an (index, value) tuple with 0 <= index < "
                             f"{len(self.spaces)}, got {x!r}")
        return int(x[0]), x[1]

    def is_pair(self, x: Any) -> bool:
        """Whether `x` is a tuple `(index, value)` with an integer index of an alternative (`value` unchecked)."""
        return isinstance(x, tuple) and len(x) == 2 and _is_index(x[0]) and 0 <= x[0] < len(self.spaces)

    def is_bounded(self, manner: str = "both") -> bool:
        return all(s.is_bounded(manner) for s in self.spaces)

    def contains(self, x: Any) -> bool:
        """True for a tuple `(index, value)` with a valid integer index whose alternative contains `value`."""
        return self.is_pair(x) and self.spaces[int(x[0])].contains(x[1])

    def clip(self, x: Any) -> Tuple[int, Any]:
        """`(index, value clipped by the alternative at index)`; ValueError for anything but such a pair."""
        index, value = self._check_pair(x, "clip")
        return index, self.spaces[index].clip(value)

    def sample(self, rng: Any) -> Tuple[Any, Tuple[int, Any]]:
        """`(rng, (index, value))`: the alternative uniformly, then a sample of it."""
        b = self._backend
        rng, idx = b.random.random_discrete_uniform((1,), 0, len(self.spaces), rng=rng)
        index = int(np.asarray(b.to_numpy(idx)).reshape(-1)[0])
        rng, value = self.spaces[index].sample(rng)
        return rng, (index, value)

    def create_empty(self) -> Tuple[int, Any]:
        """`(0, the first alternative's empty value)`."""
        return 0, self.spaces[0].create_empty()

    def data_to(self, data: Any, backend: Any = None, device: Any = None) -> Tuple[int, Any]:
        index, value = self._check_pair(data, "data_to")
        return index, self.spaces[index].data_to(value, backend, device)

    def get_repr(self, abbreviate: bool = False, include_backend: bool = True, include_device: bool = True,
                 include_dtype: bool = True) -> str:
        inner = ", ".join(s.get_repr(abbreviate, False, False, include_dtype) for s in self.spaces)
        extra = (f", backend={self._backend}" if include_backend else "") + (
            f", device={self._device}" if include_device and self._device is not None else "")
        return f"UnionSpace({inner}{extra})"

    def is_subspaceeq(self, other: Space) -> bool:
        """True when `other` is a UnionSpace of the same backend and number of alternatives, each alternative a
        subspace of `other`'s at the same index."""
        return (isinstance(other, UnionSpace) and other.backend is self._backend and len(other) == len(self)
                and all(a.is_subspaceeq(b) for a, b in zip(self.spaces, other.spaces)))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, UnionSpace) and other.backend is self._backend and other.spaces == self.spaces

    __hash__ = None  # type: ignore[assignment]
