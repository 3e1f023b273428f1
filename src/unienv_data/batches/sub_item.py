"""`SubItemBatch`: a read-only view of one nested field of another batch's samples."""
from __future__ import annotations

from unienv_data.base.common import BatchT
from unienv_interface.backends.base import BArrayType, BDeviceType, BDtypeType, BRNGType
from typing import Any, Optional, Tuple

from unienv_data.base.common import BatchBase

from . import _tree
from ._view import RowView


class SubItemBatch(RowView, BatchBase[BatchT, BArrayType, BDeviceType, BDtypeType, BRNGType]):
    """Sample `i` of the view is the field `nested_keys` of sample `i` of `batch`.

    `nested_keys` is a dict key, a tuple position, or a sequence of them (a path: `("obs", "joint_pos")`); a missing
    key raises KeyError naming the available ones. Reads fetch the samples from `batch` and keep the field; metadata
    is passed through. Read-only (write the containing batch instead). Never closes `batch`.
    """

    is_mutable = False

    def __init__(self, batch: BatchBase, nested_keys: Any) -> None:
        if not isinstance(batch, BatchBase):
            raise TypeError(f"batch must be a BatchBase, got {type(batch).__name__}")
        path = _tree.normalize_nested_keys(nested_keys)
        space = _tree.sub_space(batch.single_space, path)
        super().__init__(space, batch.single_metadata_space)
        self.batch = batch
        self.nested_keys = path

    def get_at(self, idx: Any) -> Any:
        return _tree.sub_data(self.batch.get_at(idx), self.nested_keys)

    def get_at_with_metadata(self, idx: Any) -> Tuple[Any, Optional[Any]]:
        data, meta = self.batch.get_at_with_metadata(idx)
        return _tree.sub_data(data, self.nested_keys), meta

    def get_flattened_at_with_metadata(self, idx: Any) -> Tuple[Any, Optional[Any]]:
        data, meta = self.get_at_with_metadata(idx)
        return self._flatten_rows(idx, data), meta

    def set_flattened_at(self, idx: Any, value: Any) -> None:
        raise NotImplementedError("SubItemBatch is read-only; write the containing batch instead")


__all__ = ["SubItemBatch"]
