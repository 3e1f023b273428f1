"""`NumpyMemmapStorage`: rows of a NumPy Box / Binary space in one array (memory-mapped file, RAM or shared
memory), returned as NumPy arrays. Needs no torch; files use the same raw layout as `PytorchTensorStorage`."""
from __future__ import annotations

from unienv_data.base.common import BatchT
from unienv_interface.backends.base import BArrayType, BDeviceType, BDtypeType, BRNGType
from typing import Any

import numpy as np

from unienv_data.base.registry import register_storage

from ._array_storage import ArrayStorageBase


@register_storage
class NumpyMemmapStorage(ArrayStorageBase[BatchT, BArrayType, BDeviceType, BDtypeType, BRNGType]):
    """A `(capacity, *shape)` NumPy array of a NumPy Box / Binary space.

    Same constructor, loading, indexing and persistence as `PytorchTensorStorage`; results are NumPy arrays.
    """

    _backend_name = "numpy"

    def _wrap(self, arr: np.ndarray) -> Any:
        return arr
