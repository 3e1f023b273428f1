"""`StepSampler`: uniform random batches of steps (with replacement) from any batch, e.g. a ReplayBuffer."""
from __future__ import annotations

from typing import Any, Optional

from unienv_data.base.common import BatchBase, BatchSampler, BatchT
from unienv_interface.backends.base import BArrayType, BDeviceType, BDtypeType, BRNGType


class StepSampler(BatchSampler[BatchT, BArrayType, BDeviceType, BDtypeType, BRNGType,
                               BatchT, BArrayType, BDeviceType, BDtypeType, BRNGType]):
    """Draws `batch_size` indices uniformly in `[0, len(data))` with the data backend's RNG (seeded by `seed`) and
    returns `data.get_at(indices)`; with `device`, batches are moved there."""

    def __init__(self, data: BatchBase, batch_size: int, seed: Optional[int] = None, device: Any = None) -> None:
        super().__init__(data.single_space, getattr(data, "single_metadata_space", None), batch_size)
        self.data = data
        self.device_out = device
        self.data_rng = data.backend.random.random_number_generator(seed, device=data.device)

    def _move(self, batch: Any) -> Any:
        if self.device_out is None:
            return batch
        return self.single_space.data_to(batch, device=self.device_out)  # type: ignore[attr-defined]

    def sample(self) -> Any:
        """One batch of `batch_size` random samples."""
        return self._move(self.data.get_at(self.sample_index()))

    def sample_flat(self) -> Any:
        return self._move(self.data.get_flattened_at(self.sample_index()))

    def manual_seed(self, seed: int) -> None:
        self.data_rng = self.data.backend.random.random_number_generator(seed, device=self.data.device)
