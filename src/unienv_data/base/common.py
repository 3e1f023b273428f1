"""Batches: `BatchBase` (a sized, indexable collection of samples of one space), `BatchSampler`, index types."""
from __future__ import annotations

from abc import ABC, abstractmethod
from types import EllipsisType
from typing import Any, Callable, Generic, Iterator, Optional, Sequence, Tuple, TypeVar, Union

import numpy as np

from unienv_interface.backends.base import BArrayType, BDeviceType, BDtypeType, BRNGType
from unienv_interface.space import Space
from unienv_interface.space.space_utils import batch_utils, flatten_utils

from .forwarding import forwarded
from .hooks import upper_layer
from .indexing import is_single_index, normalize_index

BatchT = TypeVar("BatchT")
SamplerBatchT = TypeVar("SamplerBatchT")
SamplerArrayType = TypeVar("SamplerArrayType")
SamplerDeviceType = TypeVar("SamplerDeviceType")
SamplerDtypeType = TypeVar("SamplerDtypeType")
SamplerRNGType = TypeVar("SamplerRNGType")
# the types a wrapping batch or storage serves (the wrapped one's are BatchT and the backend's type variables)
WrapperBatchT = TypeVar("WrapperBatchT")
WrapperBArrayT = TypeVar("WrapperBArrayT")
WrapperBDeviceT = TypeVar("WrapperBDeviceT")
WrapperBDtypeT = TypeVar("WrapperBDtypeT")
WrapperBRngT = TypeVar("WrapperBRngT")

#: An index addressing one sample (int) or several (slice, Ellipsis; storages also take integer arrays and masks).
IndexableType = Union[int, slice, EllipsisType]


def convert_index_to_backendarray(backend: Any, index: Any, length: int, device: Any = None) -> Any:
    """`index` (int, slice, Ellipsis, int array or mask) as a 1-D array of non-negative positions of `backend`."""
    norm = normalize_index(index, length)
    return backend.from_numpy(norm.positions(), dtype=backend.default_index_dtype, device=device)


class BatchBase(ABC, Generic[BatchT, BArrayType, BDeviceType, BDtypeType, BRNGType]):
    """A sized collection of samples of `single_space` (optionally with per-sample metadata).

    Subclasses implement `__len__` and either the structured (`get_at`) or the flattened (`get_flattened_at`)
    accessors; each default bridges to the other through flatten / unflatten.
    """

    is_mutable: bool = True

    def __init__(self, single_space: Space, single_metadata_space: Optional[Space] = None) -> None:
        self.single_space = single_space
        self.single_metadata_space = single_metadata_space
        self._batched_space = batch_utils.batch_space(single_space, 1)
        self._batched_metadata_space = (None if single_metadata_space is None
                                        else batch_utils.batch_space(single_metadata_space, 1))
        self._in_bridge = False

    backend: Any = forwarded("single_space.backend", "The compute backend of the samples (their space's).")
    device: Any = forwarded("single_space.device", "The device of the samples (their space's).")

    @abstractmethod
    def __len__(self) -> int:
        """Number of samples."""

    def _bridged(self, name: str, counterpart: Callable[[Any], Any], idx: Any) -> Any:
        """`counterpart(idx)` for the default `name`; NotImplementedError when the subclass implements neither (the
        counterpart's default would bridge back)."""
        if self._in_bridge:
            self._in_bridge = False
            raise NotImplementedError(f"{type(self).__name__} must implement {name} or its flattened counterpart")
        self._in_bridge = True
        try:
            return counterpart(idx)
        finally:
            self._in_bridge = False

    def get_at(self, idx: Any) -> BatchT:
        """Sample(s) at `idx` (an int gives one sample, anything else a batch)."""
        flat = self._bridged("get_at", self.get_flattened_at, idx)
        if is_single_index(idx):
            return flatten_utils.unflatten_data(self.single_space, flat)  # type: ignore[no-any-return]
        return flatten_utils.unflatten_data(self._batched_space, flat, start_dim=1)  # type: ignore[no-any-return]

    def get_flattened_at(self, idx: Any) -> Any:
        """Flat row(s) at `idx`."""
        data = self._bridged("get_flattened_at", self.get_at, idx)
        if is_single_index(idx):
            return flatten_utils.flatten_data(self.single_space, data)
        return flatten_utils.flatten_data(self._batched_space, data, start_dim=1)

    def get_at_with_metadata(self, idx: Any) -> Tuple[BatchT, Optional[Any]]:
        return self.get_at(idx), None

    def get_flattened_at_with_metadata(self, idx: Any) -> Tuple[Any, Optional[Any]]:
        return self.get_flattened_at(idx), None

    def __getitem__(self, idx: Any) -> BatchT:
        return self.get_at(idx)

    def set_at(self, idx: Any, value: Any) -> None:
        """Writes sample(s) at `idx`."""
        if is_single_index(idx):
            self.set_flattened_at(idx, flatten_utils.flatten_data(self.single_space, value))
        else:
            self.set_flattened_at(idx, flatten_utils.flatten_data(self._batched_space, value, start_dim=1))

    def set_flattened_at(self, idx: Any, value: Any) -> None:
        raise NotImplementedError(f"{type(self).__name__} does not support writes")

    def __setitem__(self, idx: Any, value: Any) -> None:
        self.set_at(idx, value)

    def remove_at(self, idx: Any) -> None:
        raise NotImplementedError(f"{type(self).__name__} does not support removal")

    def __delitem__(self, idx: Any) -> None:
        self.remove_at(idx)

    def append(self, value: Any) -> None:
        """Adds one sample at the end."""
        self.extend(batch_utils.concatenate(self._batched_space, [value]))

    def extend(self, value: Any) -> None:
        """Adds a batch of samples at the end."""
        self.extend_flattened(flatten_utils.flatten_data(self._batched_space, value, start_dim=1))

    def append_flattened(self, value: Any) -> None:
        self.extend_flattened(self.backend.reshape(value, (1, -1)))

    def extend_flattened(self, value: Any) -> None:
        raise NotImplementedError(f"{type(self).__name__} does not support extend")

    def extend_from(self, other: "BatchBase", chunk_size: int = 8, tqdm: bool = False) -> None:
        """Appends every sample of `other`, `chunk_size` at a time."""
        n = len(other)
        for s in range(0, n, chunk_size):
            self.extend(other.get_at(slice(s, min(n, s + chunk_size))))

    def get_slice(self, idx: Any) -> "BatchBase":
        """A view of the samples at `idx` (a `SubIndexedBatch`)."""
        return upper_layer("batch.slice")(self, idx)  # type: ignore[no-any-return]

    def get_column(self, nested_keys: Any) -> "BatchBase":
        """A read-only view of one nested field (a `SubItemBatch`)."""
        return upper_layer("batch.column")(self, nested_keys)  # type: ignore[no-any-return]

    def close(self) -> None:
        """Releases resources (default: nothing)."""

    def __iter__(self) -> Iterator[BatchT]:
        for i in range(len(self)):
            yield self.get_at(i)


class BatchSampler(
    Generic[SamplerBatchT, SamplerArrayType, SamplerDeviceType, SamplerDtypeType, SamplerRNGType,
            BatchT, BArrayType, BDeviceType, BDtypeType, BRNGType],
    BatchBase[SamplerBatchT, SamplerArrayType, SamplerDeviceType, SamplerDtypeType, SamplerRNGType],
):
    """Read-only batch that draws batches of `batch_size` samples from `data` (uniformly, with replacement).

    Type parameters, as in the reference: the five of the batches it yields, then the five of `data`."""

    is_mutable = False

    def __init__(self, single_space: Space, single_metadata_space: Optional[Space] = None, batch_size: int = 1) -> None:
        super().__init__(single_space, single_metadata_space)
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size <= 0:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        self.batch_size = int(batch_size)
        self.data: Any = None
        self.rng: Any = None
        self.data_rng: Any = None

    @property
    def sampled_space(self) -> Space:
        return batch_utils.batch_space(self.single_space, self.batch_size)

    @property
    def sampled_metadata_space(self) -> Optional[Space]:
        return None if self.single_metadata_space is None else batch_utils.batch_space(self.single_metadata_space, self.batch_size)

    def manual_seed(self, seed: int) -> None:
        if self.rng is not None:
            self.rng = self.backend.random.random_number_generator(seed, device=self.device)
        if self.data_rng is not None:
            self.data_rng = self.data.backend.random.random_number_generator(seed, device=self.data.device)

    def __len__(self) -> int:
        return len(self.data)

    def dataset_view(self) -> BatchBase:
        """The batch of every item this sampler can draw, each once, in order (what `UniEnvAsPyTorchDataset(sampler)`
        serves as a map-style dataset; a DataLoader then does the shuffling). Default: the sampled `data` itself."""
        if self.data is None:
            raise TypeError(f"{type(self).__name__} has no data to serve as a dataset")
        return self.data  # type: ignore[no-any-return]

    def sample_index(self) -> Any:
        n = len(self.data)
        if n == 0:
            raise IndexError("cannot sample from an empty batch")
        if self.data_rng is not None:
            self.data_rng, idx = self.data.backend.random.random_discrete_uniform(
                (self.batch_size,), 0, n, rng=self.data_rng, device=self.data.device)
        else:
            self.rng, idx = self.backend.random.random_discrete_uniform((self.batch_size,), 0, n, rng=self.rng,
                                                                        device=self.device)
        return idx

    def sample_flat(self) -> Any:
        return self.data.get_flattened_at(self.sample_index())

    def sample_flat_with_metadata(self) -> Tuple[Any, Optional[Any]]:
        return self.data.get_flattened_at_with_metadata(self.sample_index())

    def sample(self) -> Any:
        return self.data.get_at(self.sample_index())

    def sample_with_metadata(self) -> Tuple[Any, Optional[Any]]:
        return self.data.get_at_with_metadata(self.sample_index())

    def _epoch_indices(self) -> Iterator[Any]:
        """Batches of a random permutation of the data, drawn from the sampler's own (seeded) RNG, so samplers built
        with the same seed visit the data in the same order (and each epoch continues the RNG's sequence)."""
        n = len(self.data)
        if self.data_rng is not None:
            self.data_rng, perm = self.data.backend.random.random_permutation(n, rng=self.data_rng,
                                                                              device=self.data.device)
        elif self.rng is not None:
            self.rng, perm = self.backend.random.random_permutation(n, rng=self.rng, device=self.device)
        else:
            perm = np.random.default_rng().permutation(n)
        for s in range(0, n, self.batch_size):
            yield perm[s:s + self.batch_size]

    def _epoch_of(self, read: Callable[[Any], Any]) -> Iterator[Any]:
        """`read(indices)` for every batch of one epoch (`_epoch_indices`)."""
        for idx in self._epoch_indices():
            yield read(idx)

    def epoch_iter(self) -> Iterator[Any]:
        return self._epoch_of(self.data.get_at)

    def epoch_iter_with_metadata(self) -> Iterator[Tuple[Any, Optional[Any]]]:
        return self._epoch_of(self.data.get_at_with_metadata)

    def epoch_flat_iter(self) -> Iterator[Any]:
        return self._epoch_of(self.data.get_flattened_at)

    def epoch_flat_iter_with_metadata(self) -> Iterator[Tuple[Any, Optional[Any]]]:
        return self._epoch_of(self.data.get_flattened_at_with_metadata)

    def __iter__(self) -> Iterator[Any]:
        return self.epoch_iter()


__all__ = ["BatchT", "SamplerBatchT", "SamplerArrayType", "SamplerDeviceType", "SamplerDtypeType", "SamplerRNGType",
           "IndexableType", "convert_index_to_backendarray", "BatchBase", "BatchSampler"]
