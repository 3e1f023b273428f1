"""The replay buffer: a ring of samples over any SpaceStorage, with episode bookkeeping, and the env wrapper that
records transitions into it."""
from .collection_wrapper import ReplayBufferCollectionWrapper
from .replay_buffer import ReplayBuffer

__all__ = ["ReplayBuffer", "ReplayBufferCollectionWrapper"]
