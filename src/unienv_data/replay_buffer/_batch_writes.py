"""Batch helpers of the replay buffer: batch length, leaf slicing, and check-then-write of batches."""
from __future__ import annotations

from typing import Any, Dict

from unienv_data.base.storage import SpaceStorage
from unienv_data.batches._tree import map_leaves
from unienv_interface.space.space_utils import batch_utils


def _batch_length(value: Any, path: str = "") -> int:
    """The common leading size of every leaf of a batch; ValueError naming the key that disagrees."""
    sizes: Dict[str, int] = {}

    def visit(v: Any, p: str) -> None:
        if isinstance(v, dict):
            for k, x in v.items():
                visit(x, f"{p}/{k}" if p else str(k))
        elif isinstance(v, (tuple, list)) and not hasattr(v, "shape"):
            for i, x in enumerate(v):
                visit(x, f"{p}/{i}" if p else str(i))
        else:
            shape = getattr(v, "shape", None)
            if shape is None or len(shape) == 0:
                raise ValueError(f"batch leaf {p or '<value>'!r} has no leading batch axis (got {type(v).__name__})")
            sizes[p or "<value>"] = int(shape[0])

    visit(value, path)
    if not sizes:
        raise ValueError("empty batch: no leaves")
    if len(set(sizes.values())) > 1:
        raise ValueError(f"batch leaves disagree on the batch size: {sizes}")
    return next(iter(sizes.values()))


def _persists_segments(storage: SpaceStorage) -> bool:
    """Whether `storage` keeps its own persisted segment log (then it, not metadata.json, is authoritative)."""
    return bool(storage.has_persistent_segments())


def _checked_write(storage: SpaceStorage, index: Any, value: Any, before_write: Any) -> None:
    """Checks `value`, runs `before_write()` (drop the segments about to be overwritten, persisted), then writes:
    refused data changes nothing, and no metadata ever lists a segment whose rows were already overwritten."""
    stage = getattr(storage, "stage_set", None)
    if callable(stage):
        write = stage(index, value)
        before_write()
        write()
    else:                                   # storages that cannot check ahead: data first, then the segment list
        storage.set(index, value)
        before_write()


def _check_only(storage: SpaceStorage, batch: Any) -> None:
    """Checks a batch against the storage without writing it (staging when the storage offers it)."""
    n = _batch_length(batch)
    stage = getattr(storage, "stage_set", None)
    if callable(stage):
        stage(slice(0, n), batch)          # the returned writer is dropped: nothing is written
        return
    batch_space = batch_utils.batch_space(storage.single_instance_space, n)
    for i in range(n):
        item = batch_utils.get_at(batch_space, batch, i)
        if not storage.single_instance_space.contains(item):
            raise ValueError(f"row {i} of the batch is not an element of the space {storage.single_instance_space!r}")


def _slice_leaves(value: Any, slc: slice) -> Any:
    """`value` with every array leaf sliced along its batch axis (structure and keys unchanged)."""
    return map_leaves(value, lambda leaf: leaf[slc])
