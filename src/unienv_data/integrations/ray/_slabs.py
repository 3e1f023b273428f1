"""Shared-memory slabs: how a collector on the actor's node hands whole episodes over without the object store.

Putting an episode into Ray's object store serializes it and copies it into freshly mapped shared memory on every
call (for 15 MB image episodes that costs the collector several milliseconds, more than building the episode). On
the actor's node a collector can instead build each episode straight into a *slab*: a file under ``/dev/shm``
holding every leaf's array for up to `rows` steps. A commit then sends only ``(path, rows, length)``; the actor maps
the slab once (`SlabCache`, kept for the next episodes), checks the rows like any commit and writes them into the
buffer. The collector reuses a slab only after the call that carried it returned, so the actor never reads a slab
being overwritten. Pages stay mapped on both sides, so after the first episodes no page is faulted in again.

Slab files are named ``unienv-slab-<collector pid>-<random>``: the collector removes its files when its builder is
closed or collected; the actor removes files of collectors that no longer run (killed ones) when it starts and
every `GC_EVERY` slab commits. Ray-free.
"""
from __future__ import annotations

import collections
import mmap
import os
import uuid
import weakref
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np

from unienv_data.base.processes import pid_alive
from unienv_data.base.files import remove_quietly

#: File-name prefix of every slab.
SLAB_PREFIX = "unienv-slab-"
#: The actor collects the slabs of dead collectors every this many slab commits.
GC_EVERY = 64
#: Slabs an actor keeps mapped (least recently used ones are unmapped first).
CACHE_SLABS = 64
_ALIGN = 64


def slab_dir() -> Optional[str]:
    """The shared-memory directory slabs live in (None where the node has none: use the object store)."""
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


def slab_offsets(shapes: Sequence[Tuple[int, ...]], dtypes: Sequence[np.dtype], rows: int) -> Tuple[List[int], int]:
    """Byte offset of each leaf's `(rows, *shape)` array in a slab, and the slab's size (64-byte aligned)."""
    offsets, pos = [], 0
    for shape, dtype in zip(shapes, dtypes):
        offsets.append(pos)
        pos += -(-rows * int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize // _ALIGN) * _ALIGN
    return offsets, max(pos, _ALIGN)


def _views(buf: Any, shapes: Sequence[Tuple[int, ...]], dtypes: Sequence[np.dtype], rows: int) -> List[np.ndarray]:
    offsets, _ = slab_offsets(shapes, dtypes, rows)
    return [np.frombuffer(buf, dtype=d, count=rows * int(np.prod(s, dtype=np.int64)), offset=o).reshape((rows,) + s)
            for s, d, o in zip(shapes, dtypes, offsets)]


class Slab:
    """One slab file mapped by its collector: `arrays` are its leaves' `(rows, ...)` arrays."""

    def __init__(self, directory: str, shapes: Sequence[Tuple[int, ...]], dtypes: Sequence[np.dtype],
                 rows: int) -> None:
        self.rows = int(rows)
        self.path = os.path.join(directory, f"{SLAB_PREFIX}{os.getpid()}-{uuid.uuid4().hex}")
        _, size = slab_offsets(shapes, dtypes, self.rows)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, size)
            self._mm: Optional[mmap.mmap] = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self._finalizer = weakref.finalize(self, remove_quietly, self.path)
        self.arrays = _views(self._mm, shapes, dtypes, self.rows)

    def close(self) -> None:
        """Removes the file (the actor may keep its mapping until it evicts it)."""
        self.arrays = []
        self._finalizer()


class SlabPool:
    """A collector's slabs: `take(rows)` hands out a free slab of at least `rows` rows (a new one if none is free),
    `give(slab)` returns it once the call that carried it returned. `close()` removes every file."""

    def __init__(self, shapes: Sequence[Tuple[int, ...]], dtypes: Sequence[np.dtype], directory: str) -> None:
        self.shapes = [tuple(s) for s in shapes]
        self.dtypes = [np.dtype(d) for d in dtypes]
        self.directory = directory
        self._free: List[Slab] = []
        self._all: List[Slab] = []

    def take(self, rows: int) -> Slab:
        fits = [s for s in self._free if s.rows >= rows]
        if fits:
            slab = min(fits, key=lambda s: s.rows)
            self._free.remove(slab)
            return slab
        slab = Slab(self.directory, self.shapes, self.dtypes, max(1, rows))
        self._all.append(slab)
        return slab

    @property
    def paths(self) -> List[str]:
        """The file of every slab this pool made (until `close()`)."""
        return [slab.path for slab in self._all]

    def give(self, slab: Slab) -> None:
        if slab not in self._free:
            self._free.append(slab)

    def close(self) -> None:
        for slab in self._all:
            slab.close()
        self._all, self._free = [], []


class SlabCache:
    """The actor's side: slabs mapped by path (least recently used first out), validated, and the files of dead
    collectors removed."""

    def __init__(self, shapes: Sequence[Tuple[int, ...]], dtypes: Sequence[np.dtype]) -> None:
        self.shapes = [tuple(s) for s in shapes]
        self.dtypes = [np.dtype(d) for d in dtypes]
        self._maps: "collections.OrderedDict[Tuple[str, int], Tuple[mmap.mmap, List[np.ndarray]]]" = \
            collections.OrderedDict()
        self._uses = 0
        self.collect_dead()

    def leaves(self, path: str, rows: int, length: int) -> List[np.ndarray]:
        """The first `length` rows of every leaf of the slab `path` holding `rows` rows (read-only views).

        Raises:
            ValueError: `path` is not a slab file, or is smaller than `rows` rows need, or `length` > `rows`.
            FileNotFoundError: the slab is gone (its collector ended).
        """
        rows, length = int(rows), int(length)
        if not 0 < length <= rows:
            raise ValueError(f"slab {path}: length {length} outside [1, {rows}]")
        key = (os.fspath(path), rows)
        hit = self._maps.get(key)
        if hit is None:
            hit = self._map(key[0], rows)
            self._maps[key] = hit
            while len(self._maps) > CACHE_SLABS:
                self._maps.popitem(last=False)         # the views die with the entry; the mapping with them
        else:
            self._maps.move_to_end(key)
        self._uses += 1
        if self._uses % GC_EVERY == 0:
            self.collect_dead()
        return [a[:length] for a in hit[1]]

    def _map(self, path: str, rows: int) -> Tuple[mmap.mmap, List[np.ndarray]]:
        directory = slab_dir()
        name = os.path.basename(path)
        if directory is None or os.path.dirname(path) != directory or not name.startswith(SLAB_PREFIX) \
                or "/" in name or name in (".", ".."):
            raise ValueError(f"{path!r} is not a slab file (expected {directory}/{SLAB_PREFIX}...)")
        _, size = slab_offsets(self.shapes, self.dtypes, rows)
        fd = os.open(path, os.O_RDONLY)
        try:
            if os.fstat(fd).st_size < size:
                raise ValueError(f"slab {path}: {os.fstat(fd).st_size} bytes, {rows} rows of this space need {size}")
            mm = mmap.mmap(fd, size, access=mmap.ACCESS_READ)
        finally:
            os.close(fd)
        return mm, _views(mm, self.shapes, self.dtypes, rows)

    def forget(self, paths: Sequence[str]) -> None:
        """Unmaps the given slabs (their collector closed them)."""
        gone = set(paths)
        for key in [k for k in self._maps if k[0] in gone]:
            del self._maps[key]

    def collect_dead(self) -> int:
        """Removes the slab files of collectors that no longer run on this node, and unmaps slabs whose file is
        gone; returns how many files it removed."""
        directory = slab_dir()
        if directory is None:
            return 0
        for key in [k for k in self._maps if not os.path.exists(k[0])]:
            del self._maps[key]
        removed = 0
        for name in os.listdir(directory):
            if not name.startswith(SLAB_PREFIX):
                continue
            try:
                pid = int(name[len(SLAB_PREFIX):].split("-", 1)[0])
            except ValueError:
                continue                                # not ours to judge: leave it
            if not pid_alive(pid):
                remove_quietly(os.path.join(directory, name))
                removed += 1
        return removed


__all__ = ["CACHE_SLABS", "GC_EVERY", "SLAB_PREFIX", "Slab", "SlabCache", "SlabPool", "slab_dir", "slab_offsets"]
