"""`BatchedSpace`: a NumPy object-array batch of a space that has no array form (e.g. TextSpace)."""
from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence, Tuple

import numpy as np

from unienv_interface.backends.base import BDeviceType, BDtypeType, BRNGType

from ..metadata import SpaceMetadata
from ..space import Space


class BatchedSpace(Space[np.ndarray, BDeviceType, BDtypeType, BRNGType]):
    """A batch of `batch_shape` elements of `single_space`, held in a NumPy object array."""

    def __init__(self, single_space: Space, batch_shape: Sequence[int], metadata: Optional[Mapping[str, Any]] = None) -> None:
        super().__init__(single_space.backend, shape=tuple(int(d) for d in batch_shape), device=single_space.device,
                         dtype=None, metadata=metadata)
        self.single_space = single_space
        self.batch_shape: Tuple[int, ...] = tuple(int(d) for d in batch_shape)

    def _copy_with(self, metadata: SpaceMetadata) -> "BatchedSpace":
        return BatchedSpace(self.single_space, self.batch_shape, metadata)

    def to(self, backend: Any = None, device: Any = None) -> "BatchedSpace":
        return BatchedSpace(self.single_space.to(backend, device), self.batch_shape, self._metadata)

    def is_bounded(self, manner: str = "both") -> bool:
        return self.single_space.is_bounded(manner)

    def contains(self, x: Any) -> bool:
        return (isinstance(x, np.ndarray) and x.shape == self.batch_shape
                and all(self.single_space.contains(v) for v in x.reshape(-1)))

    def sample(self, rng: Any) -> Tuple[Any, np.ndarray]:
        out = np.empty(self.batch_shape, dtype=object)
        for idx in np.ndindex(*self.batch_shape):
            rng, out[idx] = self.single_space.sample(rng)
        return rng, out

    def create_empty(self) -> np.ndarray:
        out = np.empty(self.batch_shape, dtype=object)
        for idx in np.ndindex(*self.batch_shape):
            out[idx] = self.single_space.create_empty()
        return out

    def data_to(self, data: Any, backend: Any = None, device: Any = None) -> Any:
        return data

    def get_repr(self, abbreviate: bool = False, include_backend: bool = True, include_device: bool = True,
                 include_dtype: bool = True) -> str:
        return f"BatchedSpace({self.single_space.get_repr(abbreviate, False, False, include_dtype)}, {self.batch_shape})"

    def is_subspaceeq(self, other: Space) -> bool:
        """True when `other` is a BatchedSpace of the same batch shape whose element space holds this one's."""
        return (isinstance(other, BatchedSpace) and other.backend is self._backend
                and other.batch_shape == self.batch_shape and self.single_space.is_subspaceeq(other.single_space))

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, BatchedSpace) and other.batch_shape == self.batch_shape
                and other.single_space == self.single_space)

    __hash__ = None  # type: ignore[assignment]
