"""Whole episodes as batches of NumPy arrays: built locally step by step, checked, and committed to a buffer at once.

This module does not import Ray: the buffer service uses it on both sides (collectors build `Episode`s with an
`EpisodeBuilder`; the service actor writes them with `commit_episodes`), and a single process can use it too.

* `EpisodeLayout` describes the leaves of a space (a `BoxSpace` / `BinarySpace`, or a possibly nested `DictSpace` of
  them): key path, shape, NumPy dtype, and the library's conversion rules (`LeafConverter`: no value-changing cast,
  exact shapes, bounds).
* `EpisodeBuilder` appends steps into preallocated NumPy arrays (growing by doubling): one row copy per leaf and
  step, no per-step allocation; `finish()` checks the bounds of the whole episode at once and returns an `Episode`.
* `commit_episodes(buffer, episodes)` writes each episode with ONE batched storage write at the buffer's tail and
  records it as a segment (`ReplayBuffer.commit_segment`), then, with `durable=True`, makes them all durable with
  one `buffer.dumps()` (data, then metadata by atomic rename).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from unienv_data.base.segment_writer import SegmentWriter
from unienv_data.base.storage import SpaceStorage
from unienv_data.base.values import LeafConverter
from unienv_data.batches._tree import set_path
from unienv_data.replay_buffer import ReplayBuffer
from unienv_interface.space import BinarySpace, BoxSpace, DictSpace, Space

#: A leaf's key path inside the (nested) dict; () for a space that is a single Box / Binary leaf.
KeyPath = Tuple[str, ...]


def _leaf_name(path: KeyPath) -> str:
    return "/".join(path) if path else "<value>"


class EpisodeLayout:
    """The leaves of a space, in the space's key order, with one `LeafConverter` each.

    Raises:
        TypeError: the space holds something other than Box / Binary leaves (Text, Tuple, ...): build those
            episodes with the buffer's own segment writers instead.
    """

    def __init__(self, space: Space) -> None:
        self.space = space
        self.paths: List[KeyPath] = []
        self.converters: List[LeafConverter] = []
        self._collect(space, ())
        self.shapes: List[Tuple[int, ...]] = [c.shape for c in self.converters]
        self.dtypes: List[np.dtype] = [c.np_dtype for c in self.converters]
        self.is_dict = isinstance(space, DictSpace)
        #: bytes of one step over every leaf
        self.step_bytes = int(sum(int(np.prod(s, dtype=np.int64)) * d.itemsize for s, d in zip(self.shapes, self.dtypes)))

    def _collect(self, space: Space, path: KeyPath) -> None:
        if isinstance(space, DictSpace):
            for key, child in space.items():
                self._collect(child, path + (str(key),))
            return
        if not isinstance(space, (BoxSpace, BinarySpace)):
            raise TypeError(f"episode leaf {_leaf_name(path)!r}: only Box and Binary leaves (in nested dicts) can be "
                            f"built as NumPy episodes, got {type(space).__name__}")
        self.converters.append(LeafConverter(space, f"episode leaf {_leaf_name(path)!r}"))
        self.paths.append(path)

    # ------------------------------------------------------------------ structure <-> leaves
    def leaves_of(self, value: Any, what: str = "step") -> List[Any]:
        """The leaf values of one (nested) dict in layout order; KeyError / TypeError naming a missing, extra or
        misplaced key."""
        if not self.is_dict:
            return [value]
        out: List[Any] = []
        self._leaves(self.space, value, (), out, what)
        return out

    def _leaves(self, space: Space, value: Any, path: KeyPath, out: List[Any], what: str) -> None:
        if not isinstance(space, DictSpace):
            out.append(value)
            return
        where = _leaf_name(path) if path else "the top level"
        if not isinstance(value, Mapping):
            raise TypeError(f"{what}: expected a dict at {where} with keys {list(space.keys())}, got "
                            f"{type(value).__name__}")
        if len(value) != len(space) or any(k not in value for k in space.keys()):
            missing = [k for k in space.keys() if k not in value]
            extra = [k for k in value.keys() if k not in space.keys()]
            raise KeyError(f"{what}: wrong keys at {where}: missing {missing}, unexpected {extra} "
                           f"(expected {list(space.keys())})")
        for key, child in space.items():
            self._leaves(child, value[key], path + (str(key),), out, what)

    def assemble(self, leaves: Sequence[Any]) -> Any:
        """The nested dict (or the single leaf) holding `leaves` in layout order."""
        if not self.is_dict:
            return leaves[0]
        root: Dict[str, Any] = {}
        for path, leaf in zip(self.paths, leaves):
            set_path(root, path, leaf)
        return root

    def check_batch(self, value: Any, what: str = "episode") -> Tuple[List[np.ndarray], int]:
        """Every leaf of a batch (nested dict of `(n, *shape)` arrays) converted and checked (shape, dtype cast
        rules, bounds); returns the leaves and `n`. Raises KeyError / TypeError / ValueError naming the leaf."""
        leaves = self.leaves_of(value, what)
        n: Optional[int] = None
        out: List[np.ndarray] = []
        for conv, leaf, path in zip(self.converters, leaves, self.paths):
            arr, _ = conv.to_numpy(leaf)
            if arr.ndim == 0:
                raise ValueError(f"{what}: leaf {_leaf_name(path)!r} has no leading step axis (a 0-d value)")
            if n is None:
                n = int(arr.shape[0])
            elif int(arr.shape[0]) != n:
                raise ValueError(f"{what}: leaf {_leaf_name(path)!r} has {arr.shape[0]} steps, the first leaf {n}")
            out.append(np.ascontiguousarray(conv.convert(arr, (n,))))
        if n is None:
            raise ValueError(f"{what}: the space has no leaves")
        return out, n


@dataclass
class Episode:
    """One finished episode: a checked batch in the space's structure (`data`, leaves of shape `(length, ...)`)."""

    data: Any
    length: int
    #: caller-chosen tag kept with the episode until it is committed (not stored in the buffer)
    info: Dict[str, Any] = field(default_factory=dict)
    #: the shared-memory slab holding `data` when a builder with a slab pool made it (the service's transport)
    slab: Any = field(default=None, repr=False, compare=False)

    @property
    def nbytes(self) -> int:
        """Bytes of every leaf together."""
        return int(sum(a.nbytes for a in _iter_arrays(self.data)))


def _iter_arrays(value: Any) -> Iterator[np.ndarray]:
    if isinstance(value, Mapping):
        for v in value.values():
            yield from _iter_arrays(v)
    else:
        yield value


def episode_from_batch(layout: EpisodeLayout, value: Any) -> Episode:
    """A checked `Episode` from a whole batch (e.g. arrays a vectorised env produced); errors name the leaf."""
    leaves, n = layout.check_batch(value)
    if n == 0:
        raise ValueError("episode: an episode needs at least one step, got 0")
    return Episode(layout.assemble(leaves), n)


class EpisodeBuilder:
    """Builds one episode at a time in local NumPy arrays.

    `append(step)` checks the step's keys, shapes and dtypes (the library's cast rules) and copies each leaf into
    a preallocated row; `finish()` checks the bounds of the whole episode in one pass per leaf and returns the
    `Episode` (the arrays are handed over: the builder starts a fresh episode). A step that is refused leaves the
    episode as it was. `abort()` drops the episode being built. With a `pool` (the service's shared-memory slabs)
    the arrays live in slabs taken from it, and each finished episode carries its slab (`Episode.slab`).
    """

    def __init__(self, layout: EpisodeLayout, initial_steps: int = 256, pool: Any = None) -> None:
        if initial_steps < 1:
            raise ValueError(f"initial_steps must be >= 1, got {initial_steps}")
        self.layout = layout
        self._initial = int(initial_steps)
        #: where the arrays come from: None (NumPy allocations) or a slab pool (`_slabs.SlabPool`: `take(rows)`
        #: gives a slab whose `arrays` hold `rows` rows per leaf, `give(slab)` takes one back)
        self.pool = pool
        self._slab: Any = None
        self._bufs: List[np.ndarray] = []
        self._n = 0
        self._reset(self._initial)

    def _alloc(self, rows: int) -> List[np.ndarray]:
        if self.pool is None:
            return [np.empty((rows,) + s, dtype=d) for s, d in zip(self.layout.shapes, self.layout.dtypes)]
        self._slab = self.pool.take(rows)
        return list(self._slab.arrays)

    def _reset(self, rows: int) -> None:
        self._bufs = self._alloc(rows)
        self._n = 0

    def __len__(self) -> int:
        return self._n

    def append(self, step: Any) -> None:
        """Adds one step (a nested dict of the space's leaves, or the single leaf's value)."""
        leaves = self.layout.leaves_of(step, "step")
        n = self._n
        converted: List[np.ndarray] = []
        for conv, leaf in zip(self.layout.converters, leaves):   # check every leaf before writing any
            if isinstance(leaf, np.ndarray) and leaf.dtype == conv.np_dtype and leaf.shape == conv.shape:
                converted.append(leaf)
            else:
                arr, weak = conv.to_numpy(leaf)
                if arr.shape != conv.shape:
                    raise ValueError(f"{conv.where}: expected shape {conv.shape}, got {tuple(arr.shape)}")
                converted.append(arr if arr.dtype == conv.np_dtype else conv._cast(arr, weak))
        if n == self._bufs[0].shape[0]:
            self._grow()
        for buf, arr in zip(self._bufs, converted):
            buf[n] = arr
        self._n = n + 1

    def _grow(self) -> None:
        rows = max(1, self._bufs[0].shape[0]) * 2
        old_slab = self._slab
        new = self._alloc(rows)
        for dst, src in zip(new, self._bufs):
            dst[:self._n] = src[:self._n]
        self._bufs = new
        if old_slab is not None:
            self.pool.give(old_slab)

    def finish(self, info: Optional[Dict[str, Any]] = None) -> Episode:
        """The finished episode (bounds checked now: ValueError naming the leaf and position); the builder is
        empty afterwards. ValueError when no step was appended."""
        n = self._n
        if n == 0:
            raise ValueError("finish(): the episode has no steps")
        leaves = [b[:n] for b in self._bufs]
        for conv, arr in zip(self.layout.converters, leaves):
            conv.check_bounds(arr)
        episode = Episode(self.layout.assemble(leaves), n, dict(info or {}), self._slab)
        self._reset(max(self._initial, n))      # the episode keeps its slab until its commit returns
        return episode

    def abort(self) -> None:
        """Drops the steps appended so far."""
        self._n = 0


class _BatchSegmentWriter(SegmentWriter):
    """A segment writer holding a whole checked batch: `commit(start)` writes it with one storage write."""

    def __init__(self, storage: SpaceStorage, batch: Any, length: int) -> None:
        super().__init__(storage)
        self._batch = batch
        self._length = int(length)
        self.finish()

    def _append(self, value: Any) -> None:
        raise TypeError("a batch segment writer is already complete; it takes no more steps")

    def _commit(self, start: int) -> None:
        st = self.storage
        index = self._commit_indices(start)
        stage = getattr(st, "_stage_set", None)
        write = stage(index, self._batch) if callable(stage) else None   # refused data: nothing written
        if st.capacity is None and start + self._length > len(st):
            st.extend_length(start + self._length - len(st))
        st.forget_segments(start, self._length)       # persisted as gone before their rows are overwritten
        if write is not None:
            write()
        else:
            st.set(index, self._batch)
        st._record_segment(start, self._length)

    def _release_rows(self) -> None:
        self._batch = None


def commit_episodes(buffer: ReplayBuffer, episodes: Sequence[Episode], durable: bool = True) -> int:
    """Writes `episodes` at the tail of `buffer`, each as one segment, in order; returns the rows written.

    Each episode is one batched `set` of the storage (array storages: one copy per array; video: one encoded
    file per episode), checked before anything of it is written. With `durable` (and a buffer with a directory) the buffer is
    dumped once at the end: every episode is on disk (data, then metadata by atomic rename) when this returns.
    An episode the storage refuses raises before anything of it is written; the episodes before it stay
    committed (and are dumped).
    """
    storage = buffer.storage
    if storage is None:
        raise ValueError("commit_episodes: the buffer is closed")
    rows = 0
    try:
        for episode in episodes:
            buffer.commit_segment(_BatchSegmentWriter(storage, episode.data, episode.length))
            rows += episode.length
    finally:
        if durable and rows and buffer.cache_path is not None:
            buffer.dumps()
    return rows


__all__ = ["Episode", "EpisodeBuilder", "EpisodeLayout", "commit_episodes", "episode_from_batch"]
