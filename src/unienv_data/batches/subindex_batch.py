"""The reference's import path `unienv_data.batches.subindex_batch` (the class lives in `sub_indexed.py`)."""
from .sub_indexed import SubIndexedBatch

__all__ = ["SubIndexedBatch"]
