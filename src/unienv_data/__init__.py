"""unienv_data: storages, segment writers, replay buffers and samplers for trajectory data.

Importing it needs only NumPy and array-api-compat; storages import their optional libraries when used.
"""
from .base import *  # noqa: F401,F403
from .batches import *  # noqa: F401,F403
from .replay_buffer import *  # noqa: F401,F403
from .samplers import *  # noqa: F401,F403

__version__ = "0.1.0"
