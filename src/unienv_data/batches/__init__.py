"""Batch views: concatenation, index subsets, one nested field, windows of frames, lazy transformations and
backend / device conversion. Every view is a `BatchBase` over another batch and never closes what it wraps."""
from .backend_compat import ToBackendOrDeviceBatch
from .combined import CombinedBatch
from .slice_stacked import FrameStackedBatch, SliceStackedBatch
from .sub_indexed import SubIndexedBatch
from .sub_item import SubItemBatch
from .transformed import TransformedBatch

__all__ = ["CombinedBatch", "SubIndexedBatch", "SubItemBatch", "SliceStackedBatch", "FrameStackedBatch",
           "TransformedBatch", "ToBackendOrDeviceBatch"]
