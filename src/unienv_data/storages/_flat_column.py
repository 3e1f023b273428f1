"""`FlatLeafColumn`: one leaf of a `FlattenedStorage`, read from its own columns of the flat rows.

A flat row holds every leaf side by side, so reading one leaf through whole rows copies (and converts) every other
leaf too: a training window of 16 actions over rows that also hold a camera frame read 226 MB per batch of 64 (a
new user's trial: 0.7 s per batch, against 0.1 ms for the same read of the native layout). A column gathers only
the leaf's `[start, stop)` columns of the rows asked for (one NumPy gather of a strided block), then converts them
as `FlatRowPlan.unpack` does.
"""
from __future__ import annotations

from typing import Any, Optional, Tuple

import numpy as np

from unienv_data.base.errors import ReadOnlyStorageError
from unienv_interface.space import Space

from ._array_storage import ArrayStorageBase
from ._flat_layout import FlatRowPlan


class FlatLeafColumn:
    """A read-only column of one non-text leaf `path` of a FlattenedStorage over an in-process array storage.
    `get(index)` reads the leaf at rows `index` (any index the storage takes; a 1-D int array reads only the leaf's
    columns, other indices read whole rows through `owner.get`). Writes go through the owner (`set` whole samples)."""

    def __init__(self, owner: Any, inner: ArrayStorageBase, plan: FlatRowPlan, position: int) -> None:
        self._owner = owner
        self._inner = inner
        self._plan = plan
        self._position = position
        self._leaf = plan.leaves[position]
        self.single_instance_space: Space = self._leaf.info.space

    @classmethod
    def find(cls, owner: Any, inner: Any, plan: FlatRowPlan, nested_keys: Any) -> Optional["FlatLeafColumn"]:
        """The column of the leaf `nested_keys` names (a key, or a sequence of keys / tuple positions), or None when
        it names no single non-text leaf or the inner storage is not an in-process array storage."""
        if not isinstance(inner, ArrayStorageBase):
            return None
        path: Tuple[Any, ...] = tuple(nested_keys) if isinstance(nested_keys, (list, tuple)) else (nested_keys,)
        for i, lf in enumerate(plan.leaves):
            if tuple(lf.path) == path and lf.text is None:
                return cls(owner, inner, plan, i)
        return None

    def _leaf_of(self, sample: Any) -> Any:
        for k in self._leaf.path:
            sample = sample[k]
        return sample

    def get(self, index: Any) -> Any:
        """The leaf at rows `index`, in its own dtype, as arrays of the storage's backend (a copy)."""
        idx = index if isinstance(index, np.ndarray) and index.ndim == 1 and index.dtype.kind in "iu" else None
        rows = self._inner.rows_view(slice(None)) if idx is not None else None
        if rows is None or idx is None:
            return self._leaf_of(self._owner.get(index))
        n = rows.shape[0]
        if idx.size and (int(idx.min()) < -n or int(idx.max()) >= n):
            bad = int(idx.min()) if int(idx.min()) < -n else int(idx.max())
            raise IndexError(f"index {bad} is out of range for a storage of {n} rows")
        lf = self._leaf
        part = rows[idx, lf.start:lf.stop]             # only this leaf's columns (a fresh array)
        if lf.is_binary:
            arr = part != 0
        elif lf.same_dtype:
            arr = part
        else:
            arr = part.astype(lf.leaf_np)
        arr = arr.reshape((idx.shape[0],) + lf.shape)
        wrap = self._plan.leaf_wrappers[self._position]
        return arr if wrap is None else wrap(arr)

    def set(self, index: Any, value: Any) -> None:
        """Refused: a column of flat rows is read-only (write whole samples with the storage's `set`)."""
        raise ReadOnlyStorageError(f"the column {'/'.join(map(str, self._leaf.path))!r} of a FlattenedStorage is "
                                   "read-only; write whole samples with set() / append() on the storage or buffer")


__all__ = ["FlatLeafColumn"]
