"""Batch views: concatenation, index subsets, one nested field, windows of frames, lazy transformations and
backend / device conversion, next observations and n-step returns, and training windows (`WindowDataset`).
Every view is a `BatchBase` over another batch and never closes what it wraps. Guide: docs/batches.md."""
from unienv_data.base.hooks import install_hook

from .backend_compat import ToBackendOrDeviceBatch
from .combined import CombinedBatch
from .slice_stacked import FrameStackedBatch, SliceStackedBatch
from .sub_indexed import SubIndexedBatch
from .sub_item import SubItemBatch
from .transformed import TransformedBatch
from .transitions import NextObservationBatch, NStepReturnBatch
from .windows import WindowDataset

install_hook("batch.slice", SubIndexedBatch)
install_hook("batch.column", SubItemBatch)

__all__ = ["CombinedBatch", "SubIndexedBatch", "SubItemBatch", "SliceStackedBatch", "FrameStackedBatch",
           "TransformedBatch", "ToBackendOrDeviceBatch", "NextObservationBatch", "NStepReturnBatch", "WindowDataset"]
