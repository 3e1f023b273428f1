"""The abstract `Space`: the type of one sample (backend, device, dtype, shape and metadata)."""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, Generic, Iterable, Mapping, Optional, Tuple, TypeVar, Union

from unienv_interface.backends.base import BArrayType, BDeviceType, BDtypeType, BRNGType
from unienv_interface.backends.resolve import resolve_backend

from .metadata import SpaceMetadata

if TYPE_CHECKING:
    from typing_extensions import Self

SpaceDataT = TypeVar("SpaceDataT")


class Space(ABC, Generic[SpaceDataT, BDeviceType, BDtypeType, BRNGType]):
    """A typed description of one sample. Subclasses define checking, sampling and conversion.

    Spaces are immutable values; equality is defined by each subclass (metadata never takes part in it).
    """

    def __init__(self, backend: Any, shape: Optional[Tuple[int, ...]] = None, device: Any = None,
                 dtype: Any = None, metadata: Optional[Mapping[str, Any]] = None) -> None:
        backend = check_backend(backend)
        self._backend = backend
        self._shape = None if shape is None else tuple(int(d) for d in shape)
        self._device = device
        self._dtype = dtype
        self._metadata = metadata if isinstance(metadata, SpaceMetadata) else SpaceMetadata(metadata)

    @property
    def backend(self) -> Any:
        return self._backend

    @property
    def shape(self) -> Optional[Tuple[int, ...]]:
        return self._shape

    @property
    def device(self) -> Any:
        return self._device

    @property
    def dtype(self) -> Any:
        return self._dtype

    @property
    def metadata(self) -> SpaceMetadata:
        return self._metadata

    def to(self, backend: Any = None, device: Any = None) -> Self:
        """The same space on another backend and/or device (this space itself when both stay as they are)."""
        tb, td = resolve_backend_device(self, backend, device)
        if tb is self._backend and td == self._device:
            return self
        return self._moved(tb, td)

    def _moved(self, backend: Any, device: Any) -> Self:
        """A copy of this space on `backend` / `device` (resolved; at least one differs from this space's)."""
        raise NotImplementedError(f"{type(self).__name__} must implement _moved (or to)")

    @abstractmethod
    def sample(self, rng: Any) -> Tuple[Any, SpaceDataT]:
        """`(new_rng, sample)`: a random element of the space."""

    @abstractmethod
    def create_empty(self) -> SpaceDataT:
        """A zero-filled element-shaped value (not necessarily inside the bounds)."""

    @abstractmethod
    def is_bounded(self, manner: str = "both") -> bool:
        """Whether every element has a finite lower ('below'), upper ('above') or both bounds."""

    @abstractmethod
    def contains(self, x: Any) -> bool:
        """True when `x` is an element of this space (type, shape, dtype and bounds)."""

    @abstractmethod
    def get_repr(self, abbreviate: bool = False, include_backend: bool = True, include_device: bool = True,
                 include_dtype: bool = True) -> str:
        """A readable one-line description."""

    @abstractmethod
    def data_to(self, data: Any, backend: Any = None, device: Any = None) -> Any:
        """`data` (an element of this space) converted to another backend / device."""

    def _copy_with(self, metadata: SpaceMetadata) -> "Space":
        """The same space with other metadata (each concrete space implements it; `with_metadata` needs it)."""
        raise NotImplementedError(f"{type(self).__name__} must implement _copy_with (or with_metadata)")

    def with_metadata(self, metadata: Optional[Mapping[str, Any]] = None, **updates: Any) -> "Space":
        """A copy of this space whose metadata is `metadata` (or the current one) updated with `updates`."""
        merged = dict(self._metadata if metadata is None else metadata)
        merged.update(updates)
        return self._copy_with(SpaceMetadata(merged))

    def clip(self, x: Any) -> Any:
        """`x` clipped into the space (identity for spaces without bounds)."""
        return x

    def is_subspaceeq(self, other: "Space") -> bool:
        """Whether every element of this space is an element of `other` (self ⊆ other; equal spaces count).

        Structural: the backends must be the same, dtypes equal, and the device is ignored; a space of another
        type gives False. Each concrete space implements it; this base raises NotImplementedError (as the
        reference does), so an unsupported comparison is never mistaken for False."""
        raise NotImplementedError(f"{type(self).__name__} does not implement is_subspaceeq")

    def is_subspace(self, other: "Space") -> bool:
        """Whether this space is a strict subspace of `other` (self ⊂ other): `self ⊆ other` and not
        `other ⊆ self`. NotImplementedError from either side propagates."""
        return self.is_subspaceeq(other) and not other.is_subspaceeq(self)

    def __contains__(self, x: Any) -> bool:
        return self.contains(x)

    def __repr__(self) -> str:
        return self.get_repr()

    __hash__ = None  # type: ignore[assignment]


def check_backend(backend: Any) -> Any:
    """The ComputeBackend class `backend` names (a class, a name such as "numpy" / "torch", or an array module; see
    `resolve_backend`); TypeError / ValueError for anything else."""
    return resolve_backend(backend)


def array_data_to(space: Space, data: Any, backend: Any, device: Any) -> Any:
    """`data` (an array of `space`'s backend) moved to `backend` / `device` (shared by the array spaces)."""
    tb, td = resolve_backend_device(space, backend, device)
    if tb is space.backend:
        return tb.to_device(data, td) if td is not None else data
    return tb.from_other_backend(space.backend, data, device=td)


def common_device(spaces: Iterable[Space]) -> Any:
    """The device every space of `spaces` that has one shares (None when none has one, or they differ)."""
    devices = [sp.device for sp in spaces if sp.device is not None]
    if devices and len({str(d) for d in devices}) == 1:
        return devices[0]
    return None


def resolve_backend_device(space: Space, backend: Any, device: Any) -> Tuple[Any, Any]:
    """The `(backend, device)` a `to(backend, device)` call targets (None keeps the space's own)."""
    target_backend = space.backend if backend is None else resolve_backend(backend)
    if device is None:
        device = space.device if target_backend is space.backend else None
    else:
        target_backend.check_device(device)
    return target_backend, device


BSpace = Union[Space]
