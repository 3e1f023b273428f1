"""`TransformedBatch`: a lazily transformed view of another batch."""
from __future__ import annotations

from unienv_data.base.common import BatchT
from unienv_interface.backends.base import BArrayType, BDeviceType, BDtypeType, BRNGType
from typing import Any, Callable, Optional, Tuple

import numpy as np

from unienv_data.base.common import BatchBase
from unienv_data.base.indexing import is_single_index, normalize_index
from unienv_interface.space import Space
from unienv_interface.space.space_utils import flatten_utils

from . import _tree
from ._view import RowView


def _is_protocol(t: Any) -> bool:
    """A `DataTransformation`-like object: `transform(space, data)` and `get_target_space_from_source(space)`."""
    return hasattr(t, "transform") and hasattr(t, "get_target_space_from_source")


class _Applier:
    """Applies a plain callable (`fn(batched_data)`) or a DataTransformation-like object to batched data."""

    def __init__(self, t: Any, source_space: Optional[Space], what: str) -> None:
        if not (callable(t) or _is_protocol(t)):
            raise TypeError(f"{what} must be a callable or an object with transform() and "
                            f"get_target_space_from_source(), got {type(t).__name__}")
        self.t = t
        self.protocol = _is_protocol(t)
        self.source_space = source_space

    def target_space(self, given: Optional[Space]) -> Optional[Space]:
        if given is not None:
            return given
        if self.protocol and self.source_space is not None:
            return self.t.get_target_space_from_source(self.source_space)  # type: ignore[no-any-return]
        return self.source_space

    def __call__(self, data: Any) -> Any:
        if not self.protocol:
            return self.t(data)
        # DataTransformation.transform takes the single-sample space and data with leading batch axes
        return self.t.transform(self.source_space, data)


class TransformedBatch(RowView, BatchBase[BatchT, BArrayType, BDeviceType, BDtypeType, BRNGType]):
    """Sample `i` of the view is `transformation` applied to sample `i` of `batch`, computed on every read.

    `transformation` is either a plain callable, called with a *batch* (every leaf has a leading axis; an int index
    is read as a batch of one and unbatched after), or a `DataTransformation`-like object with
    `transform(source_space, data)` and `get_target_space_from_source(space)` (a
    `unienv_interface.transformations.DataTransformation`; it is called with the single-sample source space and
    batched data, and `has_inverse` / `direction_inverse(space)` give the inverse). For a plain callable, `target_space` describes one transformed
    sample (default: the source space, i.e. a transformation that keeps keys, shapes and dtypes; pass it when it
    does not), and `inverse` (optional) maps transformed batches back. `metadata_transformation` works the same on
    the metadata (`target_metadata_space` defaults to the source metadata space).

    Writes (`set_at`) go through the inverse and need one and a mutable `batch`. Never closes `batch`.
    """

    def __init__(self, batch: BatchBase, transformation: Any, metadata_transformation: Any = None, *,
                 inverse: Optional[Callable[[Any], Any]] = None, target_space: Optional[Space] = None,
                 target_metadata_space: Optional[Space] = None) -> None:
        if not isinstance(batch, BatchBase):
            raise TypeError(f"batch must be a BatchBase, got {type(batch).__name__}")
        self._fwd = _Applier(transformation, batch.single_space, "transformation")
        self._meta_fwd = (None if metadata_transformation is None
                          else _Applier(metadata_transformation, batch.single_metadata_space, "metadata_transformation"))
        space = self._fwd.target_space(target_space)
        meta_space = (self._meta_fwd.target_space(target_metadata_space) if self._meta_fwd is not None
                      else (target_metadata_space or batch.single_metadata_space))
        super().__init__(space, meta_space)  # type: ignore[arg-type]
        self.batch = batch
        self.transformation = transformation
        self.metadata_transformation = metadata_transformation
        self._inv: Optional[_Applier] = None
        if inverse is not None:
            if self._fwd.protocol:
                raise ValueError("inverse= is for plain callables; a DataTransformation brings its own "
                                 "direction_inverse()")
            self._inv = _Applier(inverse, space, "inverse")
        elif self._fwd.protocol and getattr(transformation, "has_inverse", False):
            self._inv = _Applier(transformation.direction_inverse(batch.single_space), space, "inverse")

    @property
    def is_mutable(self) -> bool:  # type: ignore[override]
        return self._inv is not None and bool(self.batch.is_mutable)

    def _as_batch_index(self, idx: Any) -> Tuple[Any, bool]:
        if is_single_index(idx):
            i = normalize_index(idx, len(self.batch), type(self).__name__).single
            return np.array([i], dtype=np.int64), True
        return idx, False

    def get_at(self, idx: Any) -> Any:
        bidx, single = self._as_batch_index(idx)
        out = self._fwd(self.batch.get_at(bidx))
        return _tree.take_row(out, 0) if single else out

    def get_at_with_metadata(self, idx: Any) -> Tuple[Any, Optional[Any]]:
        bidx, single = self._as_batch_index(idx)
        data, meta = self.batch.get_at_with_metadata(bidx)
        data = self._fwd(data)
        if meta is not None and self._meta_fwd is not None:
            meta = self._meta_fwd(meta)
        if single:
            return _tree.take_row(data, 0), (None if meta is None else _tree.take_row(meta, 0))
        return data, meta

    def get_flattened_at_with_metadata(self, idx: Any) -> Tuple[Any, Optional[Any]]:
        data, meta = self.get_at_with_metadata(idx)
        return self._flatten_rows(idx, data), meta

    def set_at(self, idx: Any, value: Any) -> None:
        """Writes `inverse(value)` to the wrapped batch."""
        if self._inv is None:
            raise NotImplementedError("TransformedBatch has no inverse transformation, so it cannot be written")
        bidx, single = self._as_batch_index(idx)
        if single:
            self.batch.set_at(bidx, self._inv(_tree.add_lead_axis(value)))
        else:
            self.batch.set_at(bidx, self._inv(value))

    def set_flattened_at(self, idx: Any, value: Any) -> None:
        if is_single_index(idx):
            self.set_at(idx, flatten_utils.unflatten_data(self.single_space, value))
        else:
            self.set_at(idx, flatten_utils.unflatten_data(self._batched_space, value, start_dim=1))


__all__ = ["TransformedBatch"]
