"""The reference's import path `unienv_data.batches.slicestack_batch` (the class lives in `slice_stacked.py`)."""
from .slice_stacked import SliceStackedBatch

__all__ = ["SliceStackedBatch"]
