"""Space utilities: batching, flattening and JSON serialization."""
from . import batch_utils, flatten_utils, serialization_utils

__all__ = ["batch_utils", "flatten_utils", "serialization_utils"]
