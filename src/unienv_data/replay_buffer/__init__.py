"""The replay buffer: a ring of samples over any SpaceStorage, with episode bookkeeping."""
from .replay_buffer import ReplayBuffer

__all__ = ["ReplayBuffer"]
