"""Direct writes: collectors on the buffer actor's node write their episodes' rows into the buffer's files.

With one actor copying every episode into the buffer, the actor's copy bounds the throughput of all collectors
together. For memory-mapped storages a collector on the actor's node can copy the rows itself, in parallel with the
other collectors, while the actor keeps only the bookkeeping. An episode then goes in three steps:

1. **reserve** (a call): the actor places the episodes at the tail of the ring exactly as a commit would
   (`ReplayBuffer.commit_segment` with `ReservedRows`, a writer that writes nothing: the buffer advances, every
   segment the rows overlap is dropped and the drop persisted), announces the overwrite in the view file, records
   the reservation (`Reservation`) and returns the physical rows;
2. **write** (no call): the collector writes the rows into the files with ``os.pwrite`` (`DirectWriter`): each
   array file of the storage gets its leaf's bytes, flat rows are packed by the storage's own plan first;
3. **commit** (a call): the actor records each episode as a segment and makes it durable (group commit, as every
   commit). Only then do samplers see it.

A collector killed between reserve and commit leaves rows that no segment lists: no sampler draws them, and the
ring overwrites them in its next round. The actor never hands out rows a pending reservation still holds: a commit
or reservation that would overwrite them waits until that reservation is committed, or until its collector's
process is gone (the actor checks by pid: direct writers run on its node). Which storages qualify
(`file_targets`): a `DictStorage` (the native layout) or `FlattenedStorage` whose every child is a memory-mapped
array storage, or a flat row over one; anything else keeps the other transports. Collectors opt in with
``transport="direct"``.

Ray-free: the actor and the collectors import it alike.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from unienv_data.base.segment_writer import SegmentWriter
from unienv_data.base.storage import SpaceStorage
from unienv_data.replay_buffer import ReplayBuffer
from unienv_interface.backends import NumpyComputeBackend

from .episodes import EpisodeLayout

#: Largest single ``os.pwrite`` (Linux writes at most about 2 GiB per call).
_CHUNK = 1 << 30


@dataclass
class FileTarget:
    """One array file of the buffer's storage: where a collector writes the rows of one child."""

    #: the raw data file (rows of `row_bytes` bytes, C order, no header)
    path: str
    row_bytes: int
    #: `pack(data, n)`: the child's rows of an episode (a C-contiguous `(n, ...)` array of the file's dtype)
    pack: Callable[[Any, int], np.ndarray]


def _leaf_index(layout: EpisodeLayout) -> Dict[Tuple[str, ...], int]:
    return {path: i for i, path in enumerate(layout.paths)}


def _array_target(storage: SpaceStorage, pick: Callable[[Any], Any], dtype: np.dtype,
                  shape: Tuple[int, ...]) -> Optional[FileTarget]:
    """The target of a memory-mapped array storage whose rows are exactly the (already checked) leaf's rows."""
    from unienv_data.storages._array_storage import ArrayStorageBase

    if not isinstance(storage, ArrayStorageBase) or not storage.is_memmap:
        return None
    space = storage.single_instance_space
    file_dtype = np.dtype(space.backend.numpy_dtype(space.dtype))
    if file_dtype != dtype or tuple(space.shape or ()) != tuple(shape):
        return None
    row_bytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize

    def pack(data: Any, n: int) -> np.ndarray:
        rows = np.ascontiguousarray(pick(data))
        if rows.dtype != dtype or rows.shape != (n,) + tuple(shape):
            raise ValueError(f"rows of {path}: expected {dtype.name}{[n, *shape]}, got {rows.dtype.name}"
                             f"{list(rows.shape)}")
        return rows

    path = storage.cache_filename
    return None if path is None else FileTarget(os.fspath(path), row_bytes, pack)


def _flat_target(storage: SpaceStorage, pick: Callable[[Any], Any]) -> Optional[FileTarget]:
    """The target of a `FlattenedStorage` over a memory-mapped array storage: rows packed by the storage's plan."""
    from unienv_data.storages._array_storage import ArrayStorageBase
    from unienv_data.storages.flattened import FlattenedStorage

    if not isinstance(storage, FlattenedStorage):
        return None
    inner = storage.inner_storage
    plan = getattr(storage, "_plan", None)
    if not isinstance(inner, ArrayStorageBase) or not inner.is_memmap or not callable(getattr(plan, "pack", None)):
        return None
    space = inner.single_instance_space
    row_dtype = np.dtype(space.backend.numpy_dtype(space.dtype))
    width = int(np.prod(space.shape or (), dtype=np.int64))

    def pack(data: Any, n: int) -> np.ndarray:
        rows = np.ascontiguousarray(plan.pack(pick(data), (n,)))  # type: ignore[union-attr]
        if rows.dtype != row_dtype or rows.shape != (n, width):
            raise ValueError(f"flat rows of {inner.cache_filename}: expected {row_dtype.name}{[n, width]}, the "
                             f"storage's plan packed {rows.dtype.name}{list(rows.shape)}")
        return rows

    path = inner.cache_filename
    return None if path is None else FileTarget(os.fspath(path), width * row_dtype.itemsize, pack)


def file_targets(storage: SpaceStorage, layout: EpisodeLayout) -> Tuple[Optional[List[FileTarget]], str]:
    """`(targets, "")` when a collector can write episodes of `layout` straight into `storage`'s files, else
    `(None, why not)` (see the module docstring for which storages qualify)."""
    from unienv_data.storages._dict_routing import extractor
    from unienv_data.storages.dict_storage import DictStorage

    def whole(data: Any) -> Any:
        return data

    if isinstance(storage, DictStorage):
        index = _leaf_index(layout)
        targets: List[FileTarget] = []
        routes = getattr(storage, "_routes", None)
        children = getattr(storage, "_storages", None)
        if routes is None or children is None:
            return None, "this DictStorage does not expose its routes"
        for route, child in zip(routes, children):
            pick = extractor(route)
            target = None
            if len(route.leaves) == 1 and route.kind == "node" and tuple(route.leaves[0]) in index:
                i = index[tuple(route.leaves[0])]
                target = _array_target(child, pick, layout.dtypes[i], layout.shapes[i])
            if target is None:
                target = _flat_target(child, pick)
            if target is None:
                return None, (f"child {route.key!r} is a {type(child).__name__}, not a memory-mapped array storage "
                              "(or a flat row over one)")
            targets.append(target)
        return targets, ""
    flat = _flat_target(storage, whole)
    if flat is not None:
        return [flat], ""
    if len(layout.paths) == 1 and not layout.is_dict:
        single = _array_target(storage, whole, layout.dtypes[0], layout.shapes[0])
        if single is not None:
            return [single], ""
    return None, f"a {type(storage).__name__} is not made of memory-mapped array files"


class DirectWriter:
    """A collector's side: the buffer's array files, opened for writing (see the module docstring).

    `pack(data, n)` checks and converts an episode into each file's rows (before any row is reserved, so a refused
    episode changes nothing); `write(packed, start, capacity)` writes them at physical row `start` (wrapping the
    ring). Raises ValueError from the constructor when the storage does not qualify.
    """

    def __init__(self, directory: str, layout: EpisodeLayout) -> None:
        buffer = ReplayBuffer.load_from(directory, backend=NumpyComputeBackend, read_only=True)
        try:
            storage = buffer.storage
            targets, why = (None, "the buffer is closed") if storage is None else file_targets(storage, layout)
            self.capacity = buffer.capacity
        finally:
            buffer.close()
        if targets is None:
            raise ValueError(f"direct writes into {directory}: {why}")
        self.targets = targets
        self._fds: List[int] = []
        try:
            for t in targets:
                self._fds.append(os.open(t.path, os.O_WRONLY))
        except BaseException:
            self.close()
            raise

    def pack(self, data: Any, n: int) -> List[np.ndarray]:
        """Each file's rows of one episode (checked and converted by the storage's own rules)."""
        return [t.pack(data, n) for t in self.targets]

    def write(self, packed: Sequence[np.ndarray], start: int) -> None:
        """Writes packed rows at physical row `start` of every file (two runs when they wrap the ring)."""
        cap = self.capacity
        for fd, t, rows in zip(self._fds, self.targets, packed):
            n = rows.shape[0]
            first = n if cap is None else min(n, cap - start)
            raw = rows.reshape(-1).view(np.uint8).data
            _pwrite_all(fd, raw[:first * t.row_bytes], start * t.row_bytes)
            if first < n:
                _pwrite_all(fd, raw[first * t.row_bytes:], 0)

    def close(self) -> None:
        """Closes the files."""
        for fd in self._fds:
            os.close(fd)
        self._fds = []


def _pwrite_all(fd: int, data: memoryview, offset: int) -> None:
    pos = 0
    while pos < len(data):
        done = os.pwrite(fd, data[pos:pos + _CHUNK], offset + pos)
        if done <= 0:
            raise OSError(f"pwrite wrote {done} bytes at offset {offset + pos}")
        pos += done


class ReservedRows(SegmentWriter):
    """A segment writer that places `length` rows without writing them (the collector writes them) and records no
    segment (the commit does): `commit(start)` only grows a growable storage and drops, persistently, the segments
    those rows overlap. `start` is where the rows went."""

    def __init__(self, storage: SpaceStorage, length: int) -> None:
        super().__init__(storage)
        self._length = int(length)
        self.start = -1
        self.finish()

    def _append(self, value: Any) -> None:
        raise TypeError("reserved rows take no steps; the collector writes them into the files")

    def _commit(self, start: int) -> None:
        st = self.storage
        if st.capacity is None and start + self._length > len(st):
            st.extend_length(start + self._length - len(st))
        st.forget_segments(start, self._length)        # persisted as gone before the collector overwrites them
        self.start = start


@dataclass
class Reservation:
    """Rows the actor handed to a collector that has not committed them yet."""

    token: int
    #: absolute number of the first row (see `_view`), physical row, rows
    abs_start: int
    start: int
    length: int
    #: the collector's process (on the actor's node): when it is gone the rows are abandoned
    pid: int


__all__ = ["DirectWriter", "FileTarget", "Reservation", "ReservedRows", "file_targets"]
