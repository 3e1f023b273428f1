"""The reference's import path `unienv_data.batches.subitem_batch` (the class lives in `sub_item.py`)."""
from .sub_item import SubItemBatch

__all__ = ["SubItemBatch"]
