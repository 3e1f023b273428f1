"""The reference's import path `unienv_data.batches.combined_batch` (the class lives in `combined.py`)."""
from .combined import CombinedBatch

__all__ = ["CombinedBatch"]
