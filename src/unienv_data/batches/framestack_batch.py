"""The reference's import path `unienv_data.batches.framestack_batch` (the class lives in `slice_stacked.py`)."""
from .slice_stacked import FrameStackedBatch

__all__ = ["FrameStackedBatch"]
