"""The reference's import path `unienv_data.batches.transformations` (the class lives in `transformed.py`)."""
from .transformed import TransformedBatch

__all__ = ["TransformedBatch"]
