"""The replay buffer: a ring of samples over any SpaceStorage, with episode bookkeeping, and the env wrapper that
records transitions into it."""
from typing import Any

from .collection_wrapper import ReplayBufferCollectionWrapper
from unienv_data.base.hooks import install_hook

from .replay_buffer import ReplayBuffer


def _buffer_over_storage(storage: Any, storage_name: str, count: int) -> ReplayBuffer:
    """A `ReplayBuffer` over the first `count` rows of `storage`, without segment metadata (the raw-file loaders of
    `HDF5Storage` and `ParquetStorage` build it)."""
    return ReplayBuffer(storage, storage_name, count=count, offset=0, cache_path=None, maintain_segment_metadata=False)


install_hook("buffer.over_storage", _buffer_over_storage)

__all__ = ["ReplayBuffer", "ReplayBufferCollectionWrapper"]
