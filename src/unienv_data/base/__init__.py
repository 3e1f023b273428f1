"""The storage contract: `SpaceStorage`, segment writers, batches, and the helpers every storage shares."""
from .common import (BatchBase, BatchSampler, BatchT, IndexableType, SamplerArrayType, SamplerBatchT,
                     SamplerDeviceType, SamplerDtypeType, SamplerRNGType, convert_index_to_backendarray)
from .errors import (BoundsWarning, ReadOnlyStorageError, StorageClosedError, StorageFormatError, StorageNotFoundError,
                     StorageStateError)
from .files import refuse_existing_dataset, replacing_allowed
from .registry import register_storage, resolve_storage_class
from .segment_writer import BufferedSegmentWriter, MappedSegmentWriter, SegmentWriter
from .storage import SpaceStorage

__all__ = ["BatchT", "SamplerBatchT", "SamplerArrayType", "SamplerDeviceType", "SamplerDtypeType", "SamplerRNGType",
           "BatchBase", "BatchSampler", "IndexableType", "convert_index_to_backendarray", "SpaceStorage",
           "SegmentWriter", "BufferedSegmentWriter", "MappedSegmentWriter", "StorageStateError", "StorageClosedError",
           "ReadOnlyStorageError", "StorageFormatError", "BoundsWarning", "StorageNotFoundError", "register_storage",
           "resolve_storage_class", "refuse_existing_dataset", "replacing_allowed"]
