"""`BinarySpace`: a boolean array."""
from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence, Tuple

import numpy as np

from unienv_interface.backends.base import BArrayType, BDeviceType, BDtypeType, BRNGType

from ..metadata import SpaceMetadata
from ..space import Space, array_data_to, check_backend
from ._array import ArraySpaceMixin


class BinarySpace(ArraySpaceMixin, Space[BArrayType, BDeviceType, BDtypeType, BRNGType]):
    """A boolean array of `shape`. Equality compares backend, shape and dtype (device ignored, as for BoxSpace)."""

    def __init__(self, backend: Any, shape: Sequence[int], dtype: Any = None, device: Any = None,
                 metadata: Optional[Mapping[str, Any]] = None) -> None:
        backend = check_backend(backend)
        dt = backend.default_boolean_dtype if dtype is None else backend.as_dtype(dtype)
        if not backend.dtype_is_boolean(dt):
            raise TypeError(f"BinarySpace dtype must be boolean, got {dtype!r}")
        if isinstance(shape, int):
            shape = (shape,)
        shp = tuple(int(d) for d in shape)
        if any(d < 0 for d in shp):
            raise ValueError(f"BinarySpace shape must be non-negative, got {shp}")
        super().__init__(backend, shape=shp, device=device, dtype=dt, metadata=metadata)

    def _copy_with(self, metadata: SpaceMetadata) -> "BinarySpace":
        return BinarySpace(self._backend, self.shape, self._dtype, self._device, metadata)

    def _moved(self, backend: Any, device: Any) -> "BinarySpace":
        return BinarySpace(backend, self.shape, backend.default_boolean_dtype, device, self._metadata)

    def is_bounded(self, manner: str = "both") -> bool:
        return True

    def contains(self, x: Any) -> bool:
        b = self._backend
        if isinstance(x, np.generic) and b.simplified_name == "numpy":
            x = np.asarray(x)
        return bool(b.is_backendarray(x) and tuple(x.shape) == self.shape and x.dtype == self._dtype)

    def sample(self, rng: Any) -> Tuple[Any, Any]:
        b = self._backend
        rng, v = b.random.random_discrete_uniform(self.shape, 0, 2, rng=rng)
        return rng, b.from_numpy(np.asarray(b.to_numpy(v)) != 0, dtype=self._dtype, device=self._device)

    def create_empty(self) -> Any:
        return self._backend.from_numpy(np.zeros(self.shape, dtype=bool), dtype=self._dtype, device=self._device)

    def data_to(self, data: Any, backend: Any = None, device: Any = None) -> Any:
        return array_data_to(self, data, backend, device)

    def get_repr(self, abbreviate: bool = False, include_backend: bool = True, include_device: bool = True,
                 include_dtype: bool = True) -> str:
        parts = [f"shape={self.shape}"]
        return self._repr("BinarySpace", parts, include_backend, include_device)

    def is_subspaceeq(self, other: Space) -> bool:
        """A binary space holds every boolean array of its shape: a subspace only of an equal one."""
        return self == other

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, BinarySpace) and other.backend is self._backend and other.shape == self.shape
                and other.dtype == self._dtype)

    __hash__ = None  # type: ignore[assignment]
