"""`SpaceStorage`: the contract every storage keeps (create / load_from / get / set / segments / dumps / close)."""
from __future__ import annotations

import contextlib
import functools
import inspect
import os
import weakref
from abc import ABC, abstractmethod
from functools import partial
from typing import (TYPE_CHECKING, Any, Callable, ClassVar, ContextManager, Generic, Iterator, List, Optional,
                    Protocol, Tuple, TypeVar, Union)

import numpy as np

from unienv_interface.backends.base import BArrayType, BDeviceType, BDtypeType, BRNGType
from unienv_interface.space import BinarySpace, BoxSpace, Space
from unienv_interface.space.space_utils import batch_utils

from .errors import ReadOnlyStorageError, StorageClosedError, StorageStateError
from .files import PathLike, creating_dataset, replacing_allowed
from .forwarding import forwarded
from .indexing import NormalizedIndex, normalize_index
from .ring import runs_of_pairs
from .segments import SegmentLog
from .values import LeafConverter

if TYPE_CHECKING:
    from .segment_writer import SegmentWriter

BatchT = TypeVar("BatchT")


class _Durable(Protocol):
    durable: bool


_Owner = TypeVar("_Owner", bound=_Durable)

#: Options of one storage's `create` / `load_from` that the reference's callers hand to *every* storage they open:
#: its `ReplayBuffer.load_from(path, **storage_kwargs)` and its composite storages (dict, flattened, transformed,
#: backend) pass their keyword arguments on to each child, and its storages ignore what they do not take. The
#: reference's own tests load every buffer with ``compressed=False`` (an option of `NPZStorage.create`), and a
#: buffer with video and array keys is opened with the video decoder's options. A storage whose `load_from` does not
#: name one of these drops it (it has no meaning there); any other unknown option is still refused by the storage,
#: so a misspelling never passes silently. Options that would change what a storage writes (``codec``, ``fps``, ...)
#: are not on the list: a storage that cannot honour them refuses them.
CROSS_STORAGE_LOAD_OPTIONS = frozenset(("compressed", "is_memmap", "reduce_io", "seek_mode", "decode_backend",
                                        "hardware_acceleration", "cache_decoders"))


class SpaceStorage(ABC, Generic[BatchT, BArrayType, BDeviceType, BDtypeType, BRNGType]):
    """Stores elements of `single_instance_space` at integer positions.

    A storage has a fixed `capacity` (a ring: positions wrap) or none (`capacity is None`: growable through
    `extend_length` / `shrink_length`, and appends grow it). Besides random access (`get` / `set`) it records
    *segments* (episodes): built by `mark_segment_start` / `append` / `mark_segment_end`, or by segment writers
    (`open_segment_writer`) that buffer an episode and place it on `commit(start)`. Any number of writers may be open
    at once and committed in any order. A recorded segment whose rows are overwritten by a later segment is dropped.

    Errors: wrong data raises ValueError / TypeError / KeyError naming the key, the expected and the given; bad
    indices IndexError / TypeError; state violations `StorageStateError` (a ValueError and a RuntimeError).

    Writing a storage: the contract is the abstract methods (`capacity`, `get`, `set`, `dumps`), `create` /
    `load_from`, `__len__` / `extend_length` / `shrink_length` for a growable storage, and the named hooks below.
    The framework calls the hooks: segment building here, segment writers (`base.segment_writer`), the composite
    storages (`DictStorage`, the wrappers of `base.wrapper`) on their children, and `ReplayBuffer` on its storage.
    Each has a working default; a storage overrides the ones its defaults do not fit.

    * segments: `segment_log()` (the storage's own `SegmentLog`; override it to record segments at all),
      `record_segment(start, length)`, `normalize_segment_start(start)`, `has_persistent_segments()`;
    * commit points: `on_segment_committed()`, `persist_committed()`, `commit_log_leaf()`;
    * writes: `check_writable()`, `check_value(value, count)`, and the segment writers' three
      `prepare_element(value)` / `stack_prepared(items)` / `set_prepared(index, batch)`;
    * shared growth (multiprocessing buffers): `follows_shared_growth`, `follow_length(length, written)`;
    * error messages: `set_value_label(label)`;
    * files and state: `flush()` (the default `close()` runs it: a file-backed storage implements it),
      `on_segments_dropped()`, `cache_filename`, `is_mutable`, `is_multiprocessing_safe`, `_release()`;
    * what a storage calls and keeps: `check_open()` (reads), `check_writable()` (writes), `after_shrink(length)`
      (after a growable storage shrank).
    """

    #: File extension when the storage is one file (e.g. ".memmap"); None when it is a directory.
    single_file_ext: Optional[str] = None
    #: True for storages whose `load_from` hands its extra keyword arguments on to the storages inside it (dict,
    #: wrapper storages): they keep `CROSS_STORAGE_LOAD_OPTIONS` for those to take or drop.
    forwards_load_options: bool = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        legacy = cls.__dict__.get("_segments_dropped")
        if callable(legacy) and "on_segments_dropped" not in cls.__dict__:
            cls.on_segments_dropped = legacy  # type: ignore[method-assign]  # the hook's former, private name
        raw = cls.__dict__.get("create")
        if isinstance(raw, classmethod) and raw.__func__ not in _WRAPPED_BY_BASE:
            cls.create = classmethod(_refusing_existing(raw.__func__))  # type: ignore[method-assign,assignment]
        raw_load = cls.__dict__.get("load_from")
        if (isinstance(raw_load, classmethod) and not cls.forwards_load_options
                and raw_load.__func__ not in _WRAPPED_BY_BASE):
            cls.load_from = classmethod(_dropping_cross_options(raw_load.__func__))  # type: ignore[method-assign,assignment]

    def __init__(self, single_instance_space: Space) -> None:
        if not isinstance(single_instance_space, Space):
            raise TypeError(f"single_instance_space must be a Space, got {type(single_instance_space).__name__}")
        self.single_instance_space = single_instance_space
        self._closed = False
        self._seg_start: Optional[int] = None
        self._seg_len = 0
        self._seg_clear_rows = 0
        self._batched_space_cache: Optional[Space] = None

    # ------------------------------------------------------------------ construction (subclasses)
    @classmethod
    def create(cls, single_instance_space: Space, *args: Any, capacity: Optional[int] = None,
               cache_path: Optional[PathLike] = None, multiprocessing: bool = False, **kwargs: Any) -> "SpaceStorage":
        """Creates a new, empty storage (subclasses document their own keyword arguments)."""
        raise NotImplementedError(f"{cls.__name__} does not implement create()")

    @classmethod
    def load_from(cls, path: PathLike, single_instance_space: Space, *, capacity: Optional[int] = None,
                  read_only: bool = True, multiprocessing: bool = False, **kwargs: Any) -> "SpaceStorage":
        """Opens a storage written by `dumps` (or by `create` with a cache path)."""
        raise NotImplementedError(f"{cls.__name__} does not implement load_from()")

    # ------------------------------------------------------------------ properties
    backend: Any = forwarded("single_instance_space.backend", "The compute backend of the elements (their space's).")
    device: Any = forwarded("single_instance_space.device", "The device of the elements (their space's).")

    @property
    @abstractmethod
    def capacity(self) -> Optional[int]:
        """Fixed number of rows (a ring), or None when the storage grows."""

    @property
    def cache_filename(self) -> Optional[Union[str, "PathLike"]]:
        """Hook: the file or directory backing this storage (what `load_from` reopens, and what `dumps` to it
        flushes in place), or None (the default) when it lives only in memory or in a temporary place it deletes
        on close. Owners read it (`ReplayBuffer`, `DictStorage`); the kit reopens from it."""
        return None

    @property
    def is_mutable(self) -> bool:
        """Hook: False for a read-only storage (opened with ``load_from(..., read_only=True)``, the default there);
        `check_writable` then refuses every write with `ReadOnlyStorageError` and `close()` persists nothing.
        Default True: a storage that can be opened read-only overrides it."""
        return True

    @property
    def is_multiprocessing_safe(self) -> bool:
        """Hook: True when pickled copies of this storage (sent to other processes) read and write the *same*
        rows, so a `ReplayBuffer(multiprocessing=True)` may share it (memory-mapped files, shared memory). Default
        False (a pickled copy is independent). The kit's `shares_rows_when_pickled = True` requires it."""
        return False

    @property
    def is_closed(self) -> bool:
        return self._closed

    @property
    def _single_sample_batched_space(self) -> Space:
        if self._batched_space_cache is None:
            self._batched_space_cache = batch_utils.batch_space(self.single_instance_space, 1)
        return self._batched_space_cache

    def __len__(self) -> int:
        cap = self.capacity
        if cap is None:
            raise NotImplementedError(f"{type(self).__name__} with capacity=None must implement __len__")
        return cap

    # ------------------------------------------------------------------ data access (subclasses)
    @abstractmethod
    def get(self, index: Any) -> BatchT:
        """Element(s) at `index`: an int gives one element, anything else a batch (always copies)."""

    @abstractmethod
    def set(self, index: Any, value: Any) -> None:
        """Writes element(s) at `index` after checking them against the space; nothing is written on error."""

    @abstractmethod
    def dumps(self, path: PathLike) -> None:
        """Persists the storage at `path` (its own cache path flushes in place)."""

    def extend_length(self, length: int) -> None:
        """Adds `length` rows at the end of a growable storage (no-op for fixed capacity)."""

    def shrink_length(self, length: int) -> None:
        """Removes `length` rows from the end of a growable storage (no-op for fixed capacity)."""

    @property
    def follows_shared_growth(self) -> bool:
        """Hook (read by `ReplayBuffer`): whether `follow_length` works: a growable storage shared by several
        processes (a multiprocessing `ReplayBuffer`) can be grown by one of them and the others then see the new rows
        (False by default: a memory map or an open file another process resized cannot be followed). A storage that
        can follow overrides both."""
        return False

    def follow_length(self, length: int, written: bool) -> None:
        """Hook (called by a multiprocessing `ReplayBuffer`): a growable storage shared across processes is made
        `length` rows long in this process, without the owner's checks (the shared buffer's lock and counters are the authority). `written`: the new rows were
        written by another process (else they are about to be written here)."""
        raise StorageStateError(f"{type(self).__name__} cannot follow growth made by another process (its rows are "
                                f"mapped per process); share a fixed-capacity buffer instead")

    def clear(self) -> None:
        """Aborts the open segment, forgets every segment, and empties a growable storage."""
        self.check_writable()
        self.abort_segment()
        log = self.segment_log()
        if log is not None:
            before = log.version
            log.clear()
            self._seg_clear_rows = 0
            if log.version != before:
                self.on_segments_dropped()      # persisted before any row of a dropped segment is overwritten
        if self.capacity is None:
            n = len(self)
            if n:
                self.shrink_length(n)

    def flush(self) -> None:
        """Hook: makes what is committed (rows, length, segment list) durable in the storage's own files
        (`cache_filename`), so that `load_from(cache_filename, ...)` reopens it. Called by `persist_committed()`
        (commit points, `bulk()`), by owners, and by the default `close()` on a writable storage. Default: nothing
        (an in-memory storage). A file-backed storage that keeps its length or segment list in a metadata file
        MUST override it (or override `close()` to write that file), else a storage closed without `dumps` reopens
        with what was last written; `StorageConformance.test_close_persists_without_dumps` checks it."""

    def close(self) -> None:
        """Persists and releases: a writable storage runs `flush()` first (the commit), then the storage is marked
        closed and `_release()` frees what it owns; later use raises StorageClosedError. Idempotent. A storage
        that overrides it must still persist what `flush()` would (file-backed storages: see `flush`)."""
        if self._closed:
            return
        try:
            if self.is_mutable:
                self.flush()
        finally:
            self._closed = True
            self._release()

    def __del__(self) -> None:
        try:
            if not getattr(self, "_closed", True):
                self._release()
        except Exception:
            pass

    def _release(self) -> None:
        """Hook: frees what this object owns (a temporary directory, shared memory); called by the default `close()`
        and by garbage collection of a storage never closed. Default: nothing. It must free only what *this* object
        owns: a pickled copy (a worker's) must not free the original's resources (clear the ownership flag in
        `__getstate__` / `__setstate__`), and it never closes storages owned elsewhere. It may run more than once (a
        `close()` override that also calls it): make it idempotent."""

    def __enter__(self) -> "SpaceStorage":
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        """Ends the block: an append-built segment still open is recorded (a normal exit) or dropped from the
        segments (the block raised: its rows may be torn), then `close()` commits the metadata and releases files."""
        close_after_block(self, exc_type, lambda: not self._closed and self.is_mutable and self.has_open_segment,
                          self.abort_segment)

    # ------------------------------------------------------------------ durability (commit points)
    #: whether a commit point (a segment ended or committed) persists what changed at once (see `durable`)
    _durable: bool = True

    @property
    def durable(self) -> bool:
        """True (the default): every `mark_segment_end()` and segment writer `commit` of a disk-backed storage
        persists the small state that changed (row count, segment list: the metadata files, replaced atomically;
        the rows are in their files already), so a killed process loses at most the segment in progress. False
        (bulk loads): only `flush()`, `dumps()` and `close()` persist. Setting it sets every child storage too."""
        return self._durable

    @durable.setter
    def durable(self, value: bool) -> None:
        self._durable = bool(value)
        for child in self.child_storages():
            child.durable = value

    def bulk(self) -> ContextManager["SpaceStorage"]:
        """`with storage.bulk():` turns per-segment durability off for the block (a bulk load of many segments),
        then restores it and persists everything once (`flush()`), even when the block raises."""
        return suspended_durability(self, lambda: not self._closed, self.persist_committed)

    def child_storages(self) -> List["SpaceStorage"]:
        """The storages this one writes through (composite storages); a durability setting reaches them too."""
        return []

    def on_segment_committed(self) -> None:
        """Hook, a commit point (called by `mark_segment_end` and by a segment writer's `commit`, after
        `record_segment`): durable storages persist the segment now (`persist_committed`). A composite storage
        overrides it to make one commit point of its children's. When an owner's commit log holds this storage's
        state and listens for its commits (`commit_listener`), the listener is called instead: it records the
        commit."""
        if self._durable:
            listener = self.commit_listener
            if listener is not None:
                listener(self)
            else:
                self.persist_committed()

    def persist_committed(self) -> None:
        """Hook (called at commit points, by `bulk()` and by owners): persists committed rows and segments (default: `flush()`, when the storage is open and
        writable: leaf storages write their own small metadata; composite storages forward segment ends to their
        children, which persist themselves)."""
        if not self._closed and self.is_mutable:
            self.flush()

    # ------------------------------------------------------------------ guards
    def check_open(self) -> None:
        """Raises `StorageClosedError` (naming the storage, saying to reopen it) when the storage is closed; every
        read, `dumps` and `flush` starts with it (writes go through `check_writable`, which calls it). Storages
        call it and keep it."""
        if self._closed:
            raise closed_error(self)

    def _check_open(self) -> None:
        """`check_open()` (the name the built-in storages call)."""
        self.check_open()

    def check_writable(self) -> None:
        """Raises `StorageClosedError` for a closed storage and `ReadOnlyStorageError` for a read-only one; every
        write starts with it (segment writers and owners call it too). Storages keep the default."""
        self.check_open()
        if not self.is_mutable:
            raise ReadOnlyStorageError(f"cannot write to a read-only {type(self).__name__} (opened with read_only=True, "
                                       "load_from's default); to continue recording, reopen it writable: "
                                       "ReplayBuffer.load_from(path, backend=..., read_only=False)")

    # ------------------------------------------------------------------ segments
    def segment_log(self) -> Optional[SegmentLog]:
        """Hook: the storage's own segment log, or None (the default) when it keeps no segment information. Segment
        building, `clear`, `forget_segments` and `episode_segments` work through it; owners read it (a
        `ReplayBuffer`'s segment version, a `DictStorage` comparing its children). Override it to record
        segments."""
        return None

    @property
    def has_open_segment(self) -> bool:
        return self._seg_start is not None

    @property
    def pending_segment_length(self) -> int:
        """Rows appended to the open segment (they are already readable)."""
        return self._seg_len if self._seg_start is not None else 0

    #: whether `get_segments()` lists the recorded segments (unienv 0.0.1b16: video storages do, array, NPZ,
    #: HDF5, image, Parquet storages return None); `episode_segments()` lists them for every storage
    _lists_segments: ClassVar[bool] = False

    def get_segments(self) -> Optional[List[Tuple[int, int]]]:
        """The segments as unienv 0.0.1b16 reports them: inclusive physical `(start, end)` pairs in position order
        (end < start when a segment wraps the ring) for a storage that lists them there (a `VideoStorage`), None
        for the others (array, NPZ, HDF5, image, Parquet storages), which still record their episodes: see
        `episode_segments()`."""
        self._check_open()
        return self.episode_segments() if self._lists_segments else None

    def episode_segments(self) -> Optional[List[Tuple[int, int]]]:
        """Every recorded segment (append-built and writer-built episodes) as inclusive physical `(start, end)`
        pairs in position order (end < start when a segment wraps the ring), whatever `get_segments()` reports;
        None when the storage keeps no segment information. An extension of this project: samplers, windows and
        the integrations read episodes through it, so they work on every storage."""
        self._check_open()
        log = self.segment_log()
        return None if log is None else log.sorted_inclusive()

    def episode_runs(self) -> Optional[List[Tuple[int, int]]]:
        """`episode_segments()` as physical `(start, length)` runs, in position order; None when the storage keeps no
        segment information. Owners that need the runs at every commit point (a `ReplayBuffer` guarding the rows its
        directory shows) read them here: a copy of the segment log's position-ordered list, not built again."""
        self._check_open()
        log = self.segment_log()
        if log is not None:
            return log.sorted_runs()
        segs = self.episode_segments()
        return None if segs is None else runs_of_pairs(segs, self.capacity)

    def normalize_segment_start(self, start_index: Any) -> int:
        """The physical row a segment starting at `start_index` starts at (negative counts from the end; modulo the
        capacity of a ring); TypeError / IndexError for a bad one. `mark_segment_start` and segment writers'
        `commit` use it; storages keep the default."""
        if isinstance(start_index, (bool, np.bool_)) or not isinstance(start_index, (int, np.integer)):
            raise TypeError(f"segment start must be an int, got {start_index!r}")
        start = int(start_index)
        cap = self.capacity
        if cap is None:
            n = len(self)
            if start < 0:
                start += n
            if not 0 <= start <= n:
                raise IndexError(f"segment start {start_index} is out of range for a growable storage of length {n} "
                                 f"(valid: 0..{n})")
            return start
        if start < -cap:
            raise IndexError(f"segment start {start_index} is out of range for capacity {cap}")
        return start % cap

    def mark_segment_start(self, start_index: int) -> None:
        """Opens an append-built segment at physical position `start_index` (taken modulo the capacity)."""
        self.check_writable()
        if self._seg_start is not None:
            raise StorageStateError(f"a segment is already open at {self._seg_start}; call mark_segment_end() or "
                                    "abort_segment() first")
        self._seg_start = self.normalize_segment_start(start_index)
        self._seg_len = 0
        self._seg_clear_rows = 0

    def _next_write_position(self) -> int:
        if self._seg_start is None:
            raise StorageStateError(f"Cannot append to {type(self).__name__} without an open segment; call "
                                    "mark_segment_start(start) first")
        cap = self.capacity
        if cap is not None:
            if self._seg_len >= cap:
                raise ValueError(f"the open segment already holds {self._seg_len} rows = the capacity {cap}; "
                                 "one more would overwrite its own first row: create the storage with a capacity "
                                 "of at least the longest episode (or capacity=None, growable)")
            pos = (self._seg_start + self._seg_len) % cap
        else:
            pos = self._seg_start + self._seg_len
            if pos >= len(self):
                self.extend_length(pos + 1 - len(self))
        if self._seg_clear_rows == 0:
            self._seg_clear_rows = self._free_rows_from(pos)
        return pos

    def _free_rows_from(self, pos: int) -> int:
        """Cuts row `pos` out of the recorded segments (it is about to be overwritten by the open append-built
        segment); returns how many rows from `pos` on are free.

        The run left after the cut is the *eaten* run (`SegmentLog.eat`): the next append cuts it again. It is left
        out of what is persisted until the open segment ends, so the files are rewritten (`on_segments_dropped`)
        once per run the segment starts eating, not once per row."""
        log = self.segment_log()
        if log is None or not len(log):
            return 1 << 62
        _hit, fresh = log.eat(pos)
        if fresh:
            self.on_segments_dropped()
        return max(log.rows_before_next_start(pos), 1)

    def _advance_segment(self) -> None:
        self._seg_len += 1
        self._seg_clear_rows -= 1

    def append(self, value: Any) -> None:
        """Writes one element at the open segment's next row (growable storages grow). The value is checked first
        (as far as `check_value` can), so that a refused value neither grows the storage nor cuts a recorded segment."""
        self.check_append_state()
        self.check_value(value)
        pos = self._next_write_position()
        self.set(pos, value)
        self._advance_segment()

    def mark_segment_end(self) -> None:
        """Closes the open segment and records it (a no-op when none is open or it is empty)."""
        self._check_open()
        if self._seg_start is None:
            return
        log = self.segment_log()
        if log is not None:
            log.stop_eating()
        start, n = self._seg_start, self._seg_len
        self._seg_start, self._seg_len, self._seg_clear_rows = None, 0, 0
        self.record_segment(start, n)
        self.on_segment_committed()

    def abort_segment(self) -> None:
        """Forgets the open segment (rows already written keep their values but belong to no segment)."""
        self._seg_start, self._seg_len, self._seg_clear_rows = None, 0, 0
        log = self.segment_log()
        if log is not None:
            log.stop_eating()       # the run it was eating is persisted again at the next save

    def after_shrink(self, length: int) -> None:
        """A growable storage calls it after it shrank to `length` rows (in `shrink_length`, `clear`): forgets the
        recorded segments reaching past the new end and aborts an open append-built segment that did. A storage
        keeps the default. (Formerly the private `_shrunk_to`, still accepted.)"""
        log = self.segment_log()
        if log is not None:
            log.truncate(length)
        if self._seg_start is not None and self._seg_start + self._seg_len > length:
            self.abort_segment()

    def _shrunk_to(self, length: int) -> None:
        """The former, private name of `after_shrink`."""
        self.after_shrink(length)

    def forget_segments(self, start: int, length: int) -> None:
        """Drops recorded segments sharing a row with the physical run `[start, start + length)` (modulo the
        capacity): used by owners (e.g. a replay buffer) about to overwrite those rows with `set`."""
        log = self.segment_log()
        if log is not None:
            before = log.version
            log.drop_overlapping(int(start), int(length))
            self._seg_clear_rows = 0
            if log.version != before:
                self.on_segments_dropped()

    #: set by an owner that persists this storage's state in its own commit record (`DictStorage`'s and
    #: `FlattenedStorage`'s commit log): called with this storage instead of rewriting its own metadata when
    #: segments are dropped
    drop_listener: Optional[Callable[["SpaceStorage"], None]] = None
    #: set by an owner whose commit log holds this storage's state and that does not see this storage's commit points
    #: itself (`FlattenedStorage`: `mark_segment_end` and segment writers reach its inner storage): called with this
    #: storage at a durable commit point (`on_segment_committed`) instead of `persist_committed()`
    commit_listener: Optional[Callable[["SpaceStorage"], None]] = None

    def commit_log_leaf(self) -> Optional["SpaceStorage"]:
        """The storage whose state (length and segment list) an owner's commit log may hold for this one: a storage
        whose only per-commit metadata is that state, and which can take it back with `adopt_committed` (it calls
        `drop_listener` when set, instead of persisting dropped segments itself, and keeps the default
        `on_segment_committed`, which calls `commit_listener`). None (the default): the storage persists its commits
        itself."""
        return None

    def adopt_committed(self, length: int, runs: List[Tuple[int, int]], where: str) -> None:
        """Takes the committed length and segments an owner's commit log holds (see `commit_log_leaf`)."""
        raise NotImplementedError(f"{type(self).__name__} keeps no state in an owner's commit log")

    def on_segments_dropped(self) -> None:
        """Hook (called by `SpaceStorage` when an append-built segment or a segment writer's `commit` starts
        overwriting rows of recorded segments, and by `forget_segments`): the segments were dropped from
        `segment_log()` and their rows are about to be overwritten, BEFORE those rows are written. Default: nothing.
        A storage whose files hold its segment list (`has_persistent_segments()`) persists the shorter list here
        (typically its `flush()`, when open and writable), so a crash never leaves metadata listing a segment whose
        rows hold other data; `StorageConformance.test_dropped_segments_persisted_before_overwrite` checks it.
        (Formerly the private `_segments_dropped`; a subclass overriding that name still works.)"""

    def _segments_dropped(self) -> None:
        """The former, private name of `on_segments_dropped` (the default, nothing), kept so that a storage written
        against it (overriding it and calling ``super()._segments_dropped()``) still works."""

    def has_persistent_segments(self) -> bool:
        """Hook (asked by owners: `ReplayBuffer`, `DictStorage`, the Ray readers): whether this storage persists its
        own segment list (then owners' copies of it are not authoritative). False by default; a storage whose files
        hold its segments overrides it."""
        return False

    def record_segment(self, start: int, length: int) -> None:
        """Hook: records the segment of `length` rows at physical row `start` in `segment_log()` (called by
        `mark_segment_end`, segment writers' `commit`, and owners restoring a list they keep). A storage that must
        persist more at once overrides it and calls this one."""
        log = self.segment_log()
        if log is not None:
            log.add(start, length)
            self._seg_clear_rows = 0  # an open append-built segment must re-check what lies ahead of it

    def open_segment_writer(self) -> "SegmentWriter":
        """A writer that buffers one segment and writes it on `commit(start)`; several may be open at once."""
        self.check_writable()
        from .segment_writer import BufferedSegmentWriter
        return BufferedSegmentWriter(self)

    # ------------------------------------------------------------------ writer hooks
    # A `BufferedSegmentWriter` (and a composite storage for its children) keeps each appended element as
    # `prepare_element` returns it, then writes them all on `commit` as `set_prepared(index, stack_prepared(items))`.
    def prepare_element(self, value: Any) -> Any:
        """Hook: checks one element and returns it in the form `stack_prepared` takes (default: unchanged, so
        nothing is checked before `set`). A storage that overrides it checks (and copies) the element completely,
        raising as `set` would; owners then check values through it."""
        return value

    def stack_prepared(self, items: List[Any]) -> Any:
        """Hook: stacks prepared elements into one batch for `set_prepared` (default: concatenated as a batch of
        the space)."""
        return batch_utils.concatenate(batch_utils.batch_space(self.single_instance_space, len(items)), items)

    def set_prepared(self, index: Any, batch: Any) -> None:
        """Hook: writes a stacked batch of prepared elements at `index` (default: `set`); a storage whose
        `prepare_element` already checked them overrides it to skip the second check."""
        self.set(index, batch)

    # ------------------------------------------------------------------ staging (check now, write later)
    # Composite storages (DictStorage) write one sample into several children and must write none of them when
    # one refuses its part. Every storage therefore offers two-phase writes, public because owners call them on
    # their children (DictStorage on each child, FlattenedStorage on its inner storage): `stage_set`, `stage_append`
    # and the appends staged by `open_staged_writer` check the value and the storage's state *now* (raising as `set` /
    # `append` would, with nothing written) and return a callable that performs the write later. Call it at once:
    # the check holds only while nothing else changes the storage. The defaults check through `prepare_element`
    # when a storage overrides it, and otherwise cannot check at all: their callables simply run `set` / `append`,
    # which may still refuse the value (`staging_checks_all` is then False, and owners run them first).

    #: the conversion rules `check_value` checks a Box / Binary value with (built on first use)
    _stage_conv: Optional[LeafConverter] = None
    #: what error messages call a value of this storage ("value"; a DictStorage names a one-leaf child by its key)
    _value_label: str = "value"

    def set_value_label(self, label: str) -> None:
        """Hook: makes error messages about this storage's values say `label` (e.g. ``key 'obs/image'``) instead of
        "value": a `DictStorage` calls it on every child that holds a single leaf, so a refused write names the
        key. The default stores `label` (used by `check_value`) and sets ``where = label`` on the `LeafConverter`
        held in the attribute ``_conv`` (or ``_stage_conv``) when there is one: a storage that checks values with
        a `LeafConverter` stored under another name, or with a checker of its own, overrides it (call `super()`)
        so that its messages say `label` too."""
        self._value_label = label
        for name in ("_conv", "_stage_conv"):
            conv = getattr(self, name, None)
            if isinstance(conv, LeafConverter):
                conv.where = label

    @property
    def staging_checks_all(self) -> bool:
        """True when staging checks everything the write would: the callables `stage_set`, `stage_append` and
        `open_staged_writer` return never refuse the value. False for the defaults (storages that only check
        through `prepare_element`, or not at all)."""
        return False

    def check_append_state(self) -> None:
        """Raises what `append` would for the storage's state (closed, read-only, no open segment, an open segment
        as long as the ring); changes nothing."""
        if self._closed or not self.is_mutable:
            self.check_writable()
        if not self.has_open_segment:
            raise StorageStateError(f"Cannot append to {type(self).__name__} without an open segment; call "
                                    "mark_segment_start(start) first")
        cap = self.capacity
        if cap is not None and self.pending_segment_length >= cap:
            raise ValueError(f"the open segment already holds {cap} rows = the capacity {cap}; one more would "
                             "overwrite its own first row: create the storage with a capacity of at least the "
                             "longest episode (or capacity=None, growable)")

    def check_value(self, value: Any, count: Optional[int] = None) -> None:
        """Hook: a dry check of one element (or of a batch of `count`) as far as the storage allows, used by the staging
        defaults and by owners: through `prepare_element` when the storage overrides it, else, for a Box / Binary
        space, the shared conversion rules (`LeafConverter`); nothing otherwise."""
        if _checks_in_prepare(self):
            if count is None:
                self.prepare_element(value)
                return
            got = batch_utils.batch_size_data(value)
            if got != count:
                raise ValueError(f"expected a batch of {count} elements, got {got}")
            batched = batch_utils.batch_space(self.single_instance_space, count)
            for j in range(count):
                try:
                    item = batch_utils.get_at(batched, value, j)
                except IndexError:
                    raise ValueError(f"expected a batch of {count} elements in every leaf; element {j} is "
                                     "missing") from None
                self.prepare_element(item)
            return
        if isinstance(self.single_instance_space, (BoxSpace, BinarySpace)):
            conv = self._stage_conv
            if conv is None:
                conv = self._stage_conv = LeafConverter(self.single_instance_space, self._value_label)
            if count is None:
                conv.convert_single(value)
            else:
                conv.convert(value, (count,))

    def _stage_index(self, index: Any) -> NormalizedIndex:
        """`index` resolved against this storage's length; a `NormalizedIndex` is taken as already resolved (an
        owner resolves an index once for all its children, which share its length)."""
        if isinstance(index, NormalizedIndex):
            return index
        return normalize_index(index, len(self), type(self).__name__)

    def stage_set(self, index: Any, value: Any) -> Callable[[], None]:
        """Checks `set(index, value)` without writing (index, state, and the value as far as the storage can
        check it; see above) and returns the write. `index` may be a `NormalizedIndex` (see `_stage_index`)."""
        self.check_writable()
        norm = self._stage_index(index)
        self.check_value(value, None if norm.single is not None else norm.count())
        return partial(self.set, norm.numpy_key(), value)

    def stage_append(self, value: Any) -> Callable[[], None]:
        """Checks `append(value)` without writing (state, and the value as far as the storage can check it) and
        returns the append."""
        self.check_append_state()
        self.check_value(value)
        return partial(self.append, value)

    def open_staged_writer(self) -> Tuple["SegmentWriter", Callable[[Any], Callable[[], None]]]:
        """A new segment writer of this storage and `stage(value)`, which checks one element for it (nothing is
        buffered on error) and returns the callable that appends it to the writer. When a `BufferedSegmentWriter`
        can take what a checking `prepare_element` returns, the element is checked and prepared once; otherwise it is
        checked by `check_value` and the writer gets the raw value."""
        from .segment_writer import BufferedSegmentWriter
        writer = self.open_segment_writer()
        if isinstance(writer, BufferedSegmentWriter) and writer.storage is self and _checks_in_prepare(self):
            buffered, prepare = writer, self.prepare_element
            return writer, lambda value: partial(buffered.append_prepared, prepare(value))
        return writer, partial(_stage_raw_append, self, writer)


#: the `create` / `load_from` functions `SpaceStorage.__init_subclass__` made (`_refusing_existing`,
#: `_dropping_cross_options`): a class that reuses one is not wrapped twice
_WRAPPED_BY_BASE: "weakref.WeakSet[Callable[..., Any]]" = weakref.WeakSet()
def closed_error(storage: SpaceStorage) -> StorageClosedError:
    """The error using a closed storage raises (see `SpaceStorage.check_open`), naming the storage's type."""
    return StorageClosedError(f"{type(storage).__name__} is closed; reopen it with load_from()")
@contextlib.contextmanager
def suspended_durability(owner: _Owner, still_open: Callable[[], bool], persist: Callable[[], None]) -> Iterator[_Owner]:
    """The `bulk()` block of a storage or buffer: `owner.durable` is False inside it, then restored, and `persist()`
    writes everything once when `still_open()` (even when the block raised)."""
    before = owner.durable
    owner.durable = False
    try:
        yield owner
    finally:
        owner.durable = before
        if still_open():
            persist()


def close_after_block(owner: Any, exc_type: Any, has_open_episode: Callable[[], bool],
                      drop_episode: Callable[[], None]) -> None:
    """The end of a `with` block over a storage or buffer: an episode still open is ended with
    `owner.mark_segment_end()` on a normal exit or dropped with `drop_episode()` when the block raised (its rows may
    be torn); then `owner.close()`, whatever happened."""
    try:
        if has_open_episode():
            if exc_type is None:
                owner.mark_segment_end()
            else:
                drop_episode()
    finally:
        owner.close()


def _refusing_existing(create: Callable[..., Any]) -> Callable[..., Any]:
    """`create` taking one more keyword, `overwrite=False`: a `cache_path` that already holds data is refused
    (FileExistsError naming it and what to do) unless `overwrite=True`. Storages a composite storage or a replay
    buffer creates inside its own (checked) directory are not checked again. Applied to every storage class's
    `create` by `SpaceStorage.__init_subclass__`, so no storage can replace a dataset silently. A `create` that
    names an `overwrite` parameter itself gets True when what is at `cache_path` may be replaced: the caller
    passed `overwrite=True`, or an owner (a replay buffer or composite storage created with its own check) is
    creating it inside its directory."""
    takes_overwrite = "overwrite" in inspect.signature(create).parameters

    @functools.wraps(create)
    def checked(cls: Any, *args: Any, overwrite: bool = False, **kwargs: Any) -> Any:
        path = kwargs.get("cache_path")
        opener = f"{cls.__name__}.load_from({os.fspath(path)!r}, space)" if path is not None else ""
        if takes_overwrite:
            kwargs["overwrite"] = overwrite or replacing_allowed()
        with creating_dataset(path, overwrite, cls.__name__, opener):
            return create(cls, *args, **kwargs)
    _WRAPPED_BY_BASE.add(checked)
    return checked


def _dropping_cross_options(load_from: Callable[..., Any]) -> Callable[..., Any]:
    """`load_from` that drops the `CROSS_STORAGE_LOAD_OPTIONS` it does not name as parameters (see there); applied to
    every storage class's `load_from` by `SpaceStorage.__init_subclass__` except those that forward options on."""
    named = {p.name for p in inspect.signature(load_from).parameters.values()
             if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    foreign = CROSS_STORAGE_LOAD_OPTIONS - named
    if not foreign:
        return load_from

    @functools.wraps(load_from)
    def tolerant(cls: Any, *args: Any, **kwargs: Any) -> Any:
        for key in foreign.intersection(kwargs):
            del kwargs[key]
        return load_from(cls, *args, **kwargs)
    _WRAPPED_BY_BASE.add(tolerant)
    return tolerant


def _checks_in_prepare(storage: SpaceStorage) -> bool:
    """Whether the storage's `prepare_element` checks values (the default passes them through unchecked)."""
    return type(storage).prepare_element is not SpaceStorage.prepare_element


def _stage_raw_append(storage: SpaceStorage, writer: "SegmentWriter", value: Any) -> Callable[[], None]:
    storage.check_value(value)
    return partial(writer.append, value)
