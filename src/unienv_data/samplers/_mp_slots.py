"""The shared-memory slot file of `MultiprocessingSampler`: how big a slot is, where the file lives, mapping it
(in the parent, which creates it, and in every worker) and unlinking it.

The file holds `n_slots` slots of `slot_bytes` bytes each, seen as a `(n_slots, slot_bytes)` uint8 array; a worker
packs a batch into the slot it was handed (`_mp_packing`) and the parent copies it out.
"""
from __future__ import annotations

import mmap
import os
import tempfile
import uuid
from typing import Any, Optional, Tuple

import numpy as np

from unienv_interface.space import BinarySpace, BoxSpace, DictSpace, Space, TupleSpace
from unienv_interface.space.space_utils import flatten_utils


from ._mp_packing import ALIGN, align


def _space_nbytes(space: Space) -> Optional[int]:
    """Bytes of one element of `space` (None when a leaf has no fixed size)."""
    if isinstance(space, (BoxSpace, BinarySpace)):
        itemsize = np.dtype(space.backend.numpy_dtype(space.dtype)).itemsize
        return int(np.prod(space.shape or (), dtype=np.int64)) * itemsize
    if isinstance(space, DictSpace):
        sizes = [_space_nbytes(s) for s in space.spaces.values()]
    elif isinstance(space, TupleSpace):
        sizes = [_space_nbytes(s) for s in space.spaces]
    else:
        return None
    if any(s is None for s in sizes):
        return None
    return sum(s for s in sizes if s is not None)


def _count_leaves(space: Optional[Space]) -> int:
    if isinstance(space, DictSpace):
        return sum(_count_leaves(s) for s in space.spaces.values())
    if isinstance(space, TupleSpace):
        return sum(_count_leaves(s) for s in space.spaces)
    return 1


def _default_slot_bytes(sampler: Any) -> Optional[int]:
    """Room for one batch of the wrapped sampler, structured or flattened, with its metadata."""
    space = sampler.single_space
    n = int(sampler.batch_size)
    structured = _space_nbytes(space)
    if structured is None:
        return None
    try:
        flat_sp = flatten_utils.flatten_space(space)
        flat = _space_nbytes(flat_sp) or 0
    except (TypeError, ValueError):
        flat = 0
    per = max(structured, flat)
    leaves = _count_leaves(space)
    meta_space = getattr(sampler, "single_metadata_space", None)
    if meta_space is not None:
        meta = _space_nbytes(meta_space)
        if meta is None:
            return None
        per += meta
        leaves += _count_leaves(meta_space)
    return align(n * per + ALIGN * (leaves + 1))


def slot_size(sampler: Any, slot_bytes: Optional[int]) -> int:
    """The size of one slot: `slot_bytes` (checked) or room for one batch of `sampler`, rounded up to `ALIGN`."""
    size = slot_bytes if slot_bytes is not None else _default_slot_bytes(sampler)
    if size is None:
        raise ValueError("cannot size the shared-memory slots from the sampler's space; pass slot_bytes=")
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size <= 0:
        raise ValueError(f"slot_bytes must be a positive int, got {size!r}")
    return align(int(size))


def new_slot_path() -> str:
    """A fresh file name under ``/dev/shm`` (or the temporary directory where there is no writable one)."""
    shm = "/dev/shm"
    folder = shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else tempfile.gettempdir()
    return os.path.join(folder, f"unienv-sampler-{os.getpid()}-{uuid.uuid4().hex}.shm")


def map_slots(path: str, n_slots: int, slot_bytes: int, create: bool) -> Tuple[mmap.mmap, np.ndarray]:
    """Maps the slot file at `path` (creating it, exclusively, with `create`); returns the mapping and the
    `(n_slots, slot_bytes)` uint8 view of it."""
    size = n_slots * slot_bytes
    flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
    fd = os.open(path, flags, 0o600)
    try:
        if create:
            os.ftruncate(fd, size)
        mm = mmap.mmap(fd, size, access=mmap.ACCESS_WRITE)
    finally:
        os.close(fd)
    return mm, np.frombuffer(mm, dtype=np.uint8).reshape(n_slots, slot_bytes)


def close_mapping(mm: Optional[mmap.mmap]) -> None:
    """Closes `mm` unless an array still refers to it (the mapping then goes with that array)."""
    if mm is None:
        return
    try:
        mm.close()
    except BufferError:
        pass


__all__ = ["slot_size", "new_slot_path", "map_slots", "close_mapping"]
