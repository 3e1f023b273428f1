"""`ToBackendOrDeviceBatch`: another batch's samples converted to a backend and / or device on read."""
from __future__ import annotations

from typing import Any, Generic, Optional, Tuple

from unienv_data.base.common import (BatchBase, BatchT, WrapperBArrayT, WrapperBatchT, WrapperBDeviceT,
                                     WrapperBDtypeT, WrapperBRngT)
from unienv_interface.backends.base import BArrayType, BDeviceType, BDtypeType, BRNGType
from unienv_data.base.indexing import is_single_index, normalize_index
from unienv_interface.space.space_utils import flatten_utils

from ._view import RowView


class ToBackendOrDeviceBatch(
    RowView,
    Generic[WrapperBatchT, WrapperBArrayT, WrapperBDeviceT, WrapperBDtypeT, WrapperBRngT,
            BatchT, BArrayType, BDeviceType, BDtypeType, BRNGType],
    BatchBase[WrapperBatchT, WrapperBArrayT, WrapperBDeviceT, WrapperBDtypeT, WrapperBRngT],
):
    """The samples of `batch` converted to `backend` (a ComputeBackend class) and / or `device` on every read
    (DLPack where the libraries allow it, else through NumPy); `None` keeps the batch's own.

    Indices may be arrays of either backend. Writes convert the value back and need a mutable `batch`.
    Metadata is converted too. Never closes `batch`.
    """

    def __init__(self, batch: BatchBase, backend: Any = None, device: Any = None) -> None:
        if not isinstance(batch, BatchBase):
            raise TypeError(f"batch must be a BatchBase, got {type(batch).__name__}")
        if backend is None and device is None:
            raise ValueError("give a backend, a device or both")
        space = batch.single_space.to(backend, device)
        meta = None if batch.single_metadata_space is None else batch.single_metadata_space.to(backend, device)
        super().__init__(space, meta)
        self.batch = batch
        self.target_backend = space.backend
        self.target_device = space.device
        self._flat_source: Optional[Any] = None

    @property
    def is_mutable(self) -> bool:  # type: ignore[override]
        return bool(self.batch.is_mutable)

    def _index(self, idx: Any) -> Any:
        """`idx` as an index the wrapped batch accepts (NumPy positions for arrays of any backend)."""
        if isinstance(idx, (int, slice)) or idx is Ellipsis:
            return idx
        norm = normalize_index(idx, len(self.batch), type(self).__name__)
        return norm.single if norm.single is not None else norm.numpy_key()

    def _out(self, data: Any, meta: bool = False) -> Any:
        if data is None:
            return None
        src = self.batch.single_metadata_space if meta else self.batch.single_space
        return src.data_to(data, backend=self.target_backend, device=self.target_device)  # type: ignore[union-attr]

    def get_at(self, idx: Any) -> Any:
        return self._out(self.batch.get_at(self._index(idx)))

    def get_at_with_metadata(self, idx: Any) -> Tuple[Any, Optional[Any]]:
        data, meta = self.batch.get_at_with_metadata(self._index(idx))
        return self._out(data), self._out(meta, meta=True)

    def get_flattened_at(self, idx: Any) -> Any:
        flat = self.batch.get_flattened_at(self._index(idx))
        if self._flat_source is None:
            self._flat_source = flatten_utils.flatten_space(self.batch.single_space)
        return self._flat_source.data_to(flat, backend=self.target_backend, device=self.target_device)

    def set_at(self, idx: Any, value: Any) -> None:
        """Converts `value` back to the wrapped batch's backend / device and writes it there."""
        if is_single_index(idx):
            back = self.single_space.data_to(value, backend=self.batch.backend, device=self.batch.device)
        else:
            back = self._batched_space.data_to(value, backend=self.batch.backend, device=self.batch.device)
        self.batch.set_at(self._index(idx), back)


__all__ = ["ToBackendOrDeviceBatch"]
