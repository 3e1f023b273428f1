"""`ReplayBuffer`: a ring buffer of samples over any `SpaceStorage`, with episode (segment) bookkeeping.

Logical index `i` (0 = oldest) lives at physical row `(offset + i) % capacity` (the ring arithmetic is
`unienv_data.base.ring`). A full ring overwrites its oldest rows, and a segment that loses rows keeps the others
(it is clipped), as in unienv 0.0.1b16. `get_segments()` (the reference's rules) and `episode_segments()` (every
recorded episode, an extension) report logical half-open `(start, end)` ranges.

Episodes come from one of two places. With `maintain_segment_metadata=True` the buffer keeps its own list, as
the reference does: every `extend(batch)`, every committed writer and every append-built episode is a segment,
saved as `physical_segments` in metadata.json. Otherwise the storage's own segment log counts (storages of this
project record append-built and writer-built episodes), or, for a storage that keeps none and for a
multiprocessing buffer, a list kept by the buffer (saved under `buffer_segments`, a key the reference ignores).
`get_segments()` lists the buffer's own list with `maintain_segment_metadata=True`, else what the storage's
`get_segments()` lists (None for array, NPZ, HDF5, image and Parquet storages, as in the reference);
`episode_segments()` lists every episode in either case.

An append-built episode longer than the capacity is not refused: like the reference, the buffer keeps its newest
`capacity` rows (the storage's segment is closed at the capacity and a new one opened), so an off-policy loop
that appends forever and never marks episodes just rings.

Multiprocessing (`multiprocessing=True`): count, offset and the segment table live in shared memory under one
inter-process lock, and travel with the buffer when it is passed to a `multiprocessing.Process` (fork or spawn).
Until a growable buffer goes to another process (pickled, or inherited by `os.fork()`), `append` writes each row
at once, as in a single process and in the reference. A ring (fixed capacity) and a buffer handed to another process
append into a private episode buffer in each process; `mark_segment_end()` (or `commit_segment(writer)`) reserves the rows at the tail and writes the whole
episode under the lock, so concurrent writers never lose rows and every episode stays contiguous (an episode open
at the hand-off moves into the private buffer, see `_hand_off`). Readers see a row once the commit that wrote it
has returned. A growable shared buffer needs a storage that follows growth made by another process (NPZStorage):
each process adopts the shared count as the storage's length under the lock before it reads, writes or saves.
"""
from __future__ import annotations

import os
import weakref
from bisect import bisect_left
from typing import Any, ContextManager, Dict, Iterator, List, Optional, Tuple, Type, Union

import numpy as np

from unienv_data.base.common import BatchBase, BatchT
from unienv_data.base.errors import StorageFormatError, StorageStateError
from unienv_data.base.files import (FORMAT_VERSION, EncodedJSON, PathLike, atomic_write_json, confined_path,
                                    creating_dataset, dump_transaction, encoded_json, is_durable, remove_if_present)
from unienv_data.base.forwarding import forwarded
from unienv_data.base.writer_lock import WriterLock, take_writer_lock
from unienv_data.base.indexing import NormalizedIndex, normalize_index
from unienv_data.base.registry import resolve_storage_class, storage_type_name
from unienv_data.base.ring import (inclusive_end, logical_ranges, ring_index, run_length, runs_overlap, tail_row,
                                   runs_not_inside_sorted, tail_write,
                                   window_before_overwrite)
from unienv_data.base.segment_writer import SegmentWriter
from unienv_data.base.segments import SegmentLog
from unienv_data.base.storage import SpaceStorage, close_after_block, suspended_durability
from unienv_interface.backends.base import BArrayType, BDeviceType, BDtypeType, BRNGType
from unienv_interface.backends.resolve import resolve_backend
from unienv_interface.space import Space
from unienv_interface.space.space_utils.serialization_utils import json_to_space, space_to_json

from ._buffer_log import BUFFER_LOG_FILE, GENERATION_KEY, BufferCommitLog
from ._batch_writes import _batch_length, _check_only, _checked_write, _persists_segments, _slice_leaves
from ._column_view import ColumnView
from ._load_as import describe_buffer, load_storage_as, stored_space_difference
from ._metadata import METADATA_FILE, read_metadata
from ._shared_state import AFTER_FORK_IN_CHILD, BEFORE_FORK, LocalState, SharedState, adopt_shared_segments


_FIELD_MASK = (1 << 64) - 1
#: Rows outside every segment that a guarded metadata rewrite gives up beyond the rows about to be overwritten
#: (see `ReplayBuffer._guard_committed_rows`): a ring that records no episodes rewrites its metadata once per this
#: many appends, and a kill hides at most this many intact rows besides those being written.
GUARD_SLACK_ROWS = 64


#: episodes a shared (`multiprocessing=True`) growable buffer can record (a shared-memory table of 16 bytes each;
#: reopening the directory makes room for twice as many as it holds)
GROWABLE_SHARED_SEGMENTS = 65536


def _storage_runs(storage: SpaceStorage) -> List[Tuple[int, int]]:
    """The episodes the storage's own segment log lists, as physical `(start, length)` runs."""
    return storage.episode_runs() or []



def _served_space(meta: Dict[str, Any], path: PathLike, backend: Any, device: Any,
                  single_instance_space: Optional[Space]) -> Space:
    """The space a buffer opened from `meta` (its metadata.json) serves: the stored one on `backend` / `device`, or
    the caller's `single_instance_space`, which must equal it (a ValueError names the first key that differs)."""
    meta_path = os.path.join(os.fspath(path), METADATA_FILE)
    try:
        space = json_to_space(meta["single_instance_space"], backend, device)
    except ValueError as exc:
        raise StorageFormatError(f"{meta_path}: stored space is malformed: {exc}") from None
    if single_instance_space is None:
        return space
    if single_instance_space != space:
        raise ValueError(stored_space_difference(meta["single_instance_space"], single_instance_space,
                                                 os.fspath(path), meta_path))
    return single_instance_space

class ReplayBuffer(BatchBase[BatchT, BArrayType, BDeviceType, BDtypeType, BRNGType]):
    """A ring buffer over `storage` (see the module docstring). `len(buffer)` is the number of stored samples."""

    def __init__(self, storage: SpaceStorage, storage_path_relative: str, count: int = 0, offset: int = 0,
                 cache_path: Optional[PathLike] = None, multiprocessing: bool = False, *,
                 maintain_segment_metadata: bool = False,
                 physical_segments: Optional[List[Tuple[int, int]]] = None) -> None:
        if not isinstance(storage, SpaceStorage):
            raise TypeError(f"storage must be a SpaceStorage, got {type(storage).__name__}")
        cap = storage.capacity
        if cap is not None and not 0 <= count <= cap:
            raise ValueError(f"count {count} is outside [0, capacity {cap}]")
        if cap is not None and not 0 <= offset < cap:
            raise ValueError(f"offset {offset} is outside [0, capacity {cap})")
        if cap is None and (offset != 0 or count > len(storage)):
            raise ValueError(f"a growable buffer needs offset 0 and count <= len(storage) ({len(storage)}); got "
                             f"count {count}, offset {offset}")
        if multiprocessing and maintain_segment_metadata and storage.is_mutable:
            # the reference's rule (its error type and wording): a shared writable buffer keeps its segments in
            # shared memory on its own (see the module docstring), so the per-buffer list is refused
            raise RuntimeError("ReplayBuffer does not support maintain_segment_metadata=True with multiprocessing=True "
                               "for mutable buffers; load the buffer read-only or disable multiprocessing (a shared "
                               "buffer records its episodes without it)")
        if multiprocessing and storage.is_mutable and not storage.is_multiprocessing_safe:
            raise ValueError(f"multiprocessing=True needs a storage that processes can share (memory-mapped or "
                             f"created with multiprocessing=True); {type(storage).__name__} is not")
        if multiprocessing and cap is None and storage.is_mutable and not storage.follows_shared_growth:
            raise ValueError(f"multiprocessing=True over a writable growable {type(storage).__name__} is not "
                             "supported: its rows are mapped per process, so a process could not see rows another "
                             "one added; give it a fixed capacity, open it with read_only=True, or use a storage "
                             "that follows shared growth (NPZStorage)")
        super().__init__(storage.single_instance_space)
        self.storage: Optional[SpaceStorage] = storage
        self.storage_path_relative = storage_path_relative
        self.cache_path = None if cache_path is None else os.fspath(cache_path)
        self.multiprocessing = bool(multiprocessing)
        self._writer_lock: Optional[WriterLock] = None
        self._reopened_elsewhere = False
        self._maintain = bool(maintain_segment_metadata)
        # segments: the buffer's own list with maintain_segment_metadata (the reference's rule) or when the
        # storage keeps none; else the storage's own log (single process). A multiprocessing buffer keeps its
        # list in shared memory (storage logs are per process).
        self._own_segments = self._maintain or self.multiprocessing or storage.episode_segments() is None
        segs = None
        if self._own_segments:
            segs = list(physical_segments or [])
            if physical_segments is None and not self._maintain and storage.episode_segments():
                segs = _storage_runs(storage)
        elif physical_segments is not None and not _persists_segments(storage):
            # a storage without segment metadata of its own (e.g. written by the reference): the buffer's list counts
            storage.forget_segments(0, cap if cap is not None else max(len(storage), 1))
            for s, n in physical_segments:
                storage.record_segment(s, n)
        if self.multiprocessing:
            # a ring holds at most `cap` segments; a growable one gets a bounded table with room to grow
            room = cap if cap is not None else max(GROWABLE_SHARED_SEGMENTS, 2 * len(segs or ()))
            self._state: Union[LocalState, SharedState] = SharedState(count, offset, segs, room)
        else:
            self._state = LocalState(count, offset, segs)
        self._owns_storage = False
        self._writer: Optional[SegmentWriter] = None      # multiprocessing: this process's open episode
        #: multiprocessing: the buffer went to another process (pickled or forked); until then appends are written
        #: at once, as in a single process
        self._handed_off = False
        self._seg_open = False                            # single process: an append-built segment is open
        self._seg_start = 0
        self._seg_len = 0
        self._disk_meta: Optional[Dict[str, Any]] = None    # what this buffer last wrote to its own metadata.json
        #: `_disk_meta`, the segment runs its state shows and those of them reaching outside its window (see
        #: `_guard_committed_rows`)
        #: `(meta, runs, stray, by_start)`: what the directory shows (see `_remember_disk`)
        self._disk_runs: Optional[Tuple[Dict[str, Any], List[Tuple[int, int]], List[Tuple[int, int]],
                                        List[Tuple[int, int]]]] = None
        self._durable = True
        #: the `commit_generation` of the metadata.json this buffer last wrote (or opened), and the log of the commit
        #: points since (single process, on disk, writable; see `_buffer_log`)
        self._meta_gen = 0
        self._buffer_log: Optional[BufferCommitLog] = None
        self._space_json: Optional[Dict[str, Any]] = None
        self._space_encoded: Optional[EncodedJSON] = None
        #: the storage as it lies on disk, when `load_from` wrapped it to serve another backend / device
        self._stored_storage: Optional[SpaceStorage] = None
        if self.multiprocessing:
            storage.durable = False     # commits persist the shared metadata instead (see `_persist_shared`)
            AFTER_FORK_IN_CHILD.add(self._drop_inherited_episode)
            if storage.capacity is not None:
                # a ring keeps every episode private from the start: a row appended in place could overwrite a
                # row the persisted metadata still shows, and a kill mid-episode would leave it torn (the private
                # episode is written whole under the commit protocol, whose crash safety covers that)
                self._handed_off = True
            else:
                BEFORE_FORK.add(self._hand_off)     # `os.fork()` hands it to the child

    def _hand_off(self) -> None:
        """A shared buffer goes to another process: from now on each process keeps its open episode privately and
        writes it whole when it ends (so episodes stay contiguous). An episode this process was appending in place
        is still at the tail (no other process had the buffer): its rows move into a private writer (the count
        steps back over them; no row is lost), and the episode goes on there."""
        if self._handed_off:
            return
        self._handed_off = True
        BEFORE_FORK.discard(self)
        if not self._seg_open or self.storage is None:
            return
        st = self._st()
        cap = st.capacity
        with self._state.locked():
            writer = st.open_segment_writer()
            for i in range(self._seg_len):
                row = self._seg_start + i
                writer.append(st.get(row if cap is None else row % cap))
            st.abort_segment()
            self._state.count -= self._seg_len
            self._state.total_written -= self._seg_len
            self._state.version += 1
            self._seg_open = False
            self._writer = writer

    def _drop_inherited_episode(self) -> None:
        """In the child of `os.fork()`: the open episode is the parent's, so the child starts with none."""
        self._writer = None
        self._seg_open = False

    # ------------------------------------------------------------------ construction
    @classmethod
    def create(cls, storage_cls: Type[SpaceStorage], single_instance_space: Space, *args: Any,
               cache_path: Optional[PathLike] = None, capacity: Optional[int] = None, multiprocessing: bool = False,
               maintain_segment_metadata: bool = False, overwrite: bool = False, **kwargs: Any) -> "ReplayBuffer":
        """A new buffer: `storage_cls.create(space, *args, cache_path=<cache_path>/storage<ext>, capacity=...,
        multiprocessing=..., **kwargs)`; with `cache_path` the directory is created and metadata written at once.

        A `cache_path` that already holds files is refused (FileExistsError) unless `overwrite=True`: open an
        existing dataset with `load_from`. Use the result in a `with` block to close (and commit) it at the end."""
        if not (isinstance(storage_cls, type) and issubclass(storage_cls, SpaceStorage)):
            raise TypeError(f"storage_cls must be a SpaceStorage class, got {storage_cls!r}")
        rel = "storage" + (storage_cls.single_file_ext or "")
        with creating_dataset(cache_path, overwrite, "ReplayBuffer",
                              f"ReplayBuffer.load_from({os.fspath(cache_path)!r}, backend=...)" if cache_path else ""):
            lock = None
            if cache_path is not None:
                os.makedirs(cache_path, exist_ok=True)
                lock = take_writer_lock(cache_path, cls._close_for_reopen)    # before anything there changes
            try:
                if cache_path is not None:
                    try:                    # old metadata must never describe the new storage's files
                        os.unlink(os.path.join(os.fspath(cache_path), METADATA_FILE))
                    except FileNotFoundError:
                        pass
                storage = storage_cls.create(
                    single_instance_space, *args,
                    cache_path=None if cache_path is None else os.path.join(os.fspath(cache_path), rel),
                    capacity=capacity, multiprocessing=multiprocessing, **kwargs)
            except BaseException:
                if lock is not None:
                    lock.release()
                raise
        rb = cls(storage, rel, 0, 0, cache_path, multiprocessing, maintain_segment_metadata=maintain_segment_metadata)
        if lock is not None:
            cls._hold_writer_lock(rb, lock)
        cls._take_storage(rb, storage, cache_path)
        return rb

    def _hold_writer_lock(self, lock: WriterLock) -> None:
        """How `create` / `load_from` hand the directory's writer lock to the buffer they built (called through the
        class); `close()` releases it."""
        lock.attach(self)
        self._writer_lock = lock

    def _close_for_reopen(self) -> None:
        """Closes this buffer because its directory is being opened for writing again in this process (see
        `base.writer_lock`): what it committed is written as at any close, and using it afterwards says why."""
        self._reopened_elsewhere = True
        self.close()

    def _take_storage(self, stored: SpaceStorage, cache_path: Optional[PathLike] = None) -> None:
        """How `create` / `load_from` finish the buffer they built (called through the class, on the new buffer):
        it owns its storage (`close()` closes it) and `stored`, the storage as it lies on disk (another object than
        `storage` when `load_from` serves it on another backend / device); with `cache_path` its metadata is written
        there at once."""
        self._owns_storage = True
        if stored is not self.storage:
            self._stored_storage = stored
        if cache_path is not None:
            self._write_metadata(cache_path)

    @classmethod
    def load_from(cls, path: PathLike, *, backend: Any, device: Any = None, read_only: bool = True,
                  multiprocessing: bool = False, single_instance_space: Optional[Space] = None,
                  **storage_kwargs: Any) -> "ReplayBuffer":
        """Opens a buffer written by `dumps` (this library's or the reference's), served on `backend` / `device`.

        `backend`: a ComputeBackend class, a name ("numpy", "torch", "jax") or the array module. Any backend and
        device serves any dataset: data recorded on another backend (or kept on the CPU) is converted on every read
        and write (`ToBackendOrDeviceStorage`, without a copy where DLPack allows). A given
        `single_instance_space` must equal the stored one (a ValueError names the first key that differs). The
        stored metadata is validated (count, offset, capacity, segments) and the storage class comes from the
        registry, never from an import.
        """
        backend = resolve_backend(backend)      # the caller's typo is theirs, not the file's: checked first
        backend.check_device(device)            # a device this machine lacks fails here, not at the first read
        if "capacity" in storage_kwargs:
            raise TypeError(f"ReplayBuffer.load_from does not take capacity= (got {storage_kwargs['capacity']!r}): the "
                            f"capacity is fixed when the buffer is created and read from {METADATA_FILE}; to change "
                            f"it, create a new buffer with the capacity you want and extend it with this one's rows")
        # a writer holds the directory's writer lock from before its metadata is read until it closes (see
        # base.writer_lock): an older writer in this process is closed first, one in another process refuses
        lock = None
        if not read_only and os.path.isdir(os.fspath(path)):
            if single_instance_space is not None:   # the caller's mistake first, even when another process writes
                _served_space(read_metadata(path), path, backend, device, single_instance_space)
            lock = take_writer_lock(path, cls._close_for_reopen)
        try:
            rb = cls._open_directory(path, backend, device, read_only, multiprocessing, single_instance_space,
                                     storage_kwargs)
        except BaseException:
            if lock is not None:
                lock.release()
            raise
        if lock is not None:
            cls._hold_writer_lock(rb, lock)
        return rb

    @classmethod
    def _open_directory(cls, path: PathLike, backend: Any, device: Any, read_only: bool, multiprocessing: bool,
                        single_instance_space: Optional[Space], storage_kwargs: Dict[str, Any]) -> "ReplayBuffer":
        """The body of `load_from` (its arguments checked, the writer lock taken)."""
        meta = read_metadata(path)
        meta_path = os.path.join(os.fspath(path), METADATA_FILE)
        space = _served_space(meta, path, backend, device, single_instance_space)
        storage_cls = resolve_storage_class(meta["storage_cls"], meta_path)
        rel = meta["storage_path_relative"]
        full = confined_path(path, rel, meta_path)
        cap = meta["capacity"]
        try:
            storage, stored = load_storage_as(storage_cls, full, space, meta["single_instance_space"], capacity=cap,
                                              read_only=read_only, multiprocessing=multiprocessing, **storage_kwargs)
        except NotImplementedError as exc:      # e.g. a stored space the storage cannot hold
            raise StorageFormatError(f"{meta_path}: the stored space cannot be opened with "
                                     f"{storage_cls.__name__}: {exc}") from None
        except StorageFormatError:
            raise
        except ValueError as exc:
            if not read_only or multiprocessing or storage_kwargs:
                raise                           # may be about the caller's own arguments
            # space and capacity both came from metadata.json: the storage's files disagree with it
            raise StorageFormatError(f"{meta_path} does not agree with the storage's own files in {full} ({exc}): "
                                     "the directory is damaged or mixed from two buffers") from None
        if storage.capacity != cap:
            raise StorageFormatError(f"{meta_path}: capacity {cap} does not match the storage's {storage.capacity}")
        if cap is None and meta["count"] > len(storage):
            # name the files that hold fewer rows than the buffer committed (a DictStorage knows its children's)
            lengths = getattr(stored, "child_lengths", None)
            short = ({os.path.join(full, k): n for k, n in lengths().items() if n < meta["count"]}
                     if callable(lengths) else {full: len(storage)})
            raise StorageFormatError(f"{meta_path}: count {meta['count']} exceeds the storage length {len(storage)} "
                                     f"(rows held by {short}): the directory is damaged; committed rows are missing")
        # the reference's rule: stored `physical_segments` mean the buffer keeps its own list; `buffer_segments`
        # (this project's key) is the list of a buffer that did not maintain one itself
        listed = meta.get("physical_segments")
        maintain = bool(meta.get("maintain_segment_metadata", listed is not None))
        if listed is None:
            listed = meta.get("buffer_segments")
        runs = None if listed is None else [(s, run_length(s, e, cap)) for s, e in listed]
        if multiprocessing and maintain and not read_only:
            raise RuntimeError("ReplayBuffer.load_from() does not support multiprocessing=True with maintained "
                               f"segment metadata unless read_only=True ({meta_path} has maintain_segment_metadata)")
        rb = cls(storage, rel, meta["count"], meta["offset"], path, multiprocessing,
                 maintain_segment_metadata=maintain, physical_segments=runs)
        cls._take_storage(rb, stored)
        if not read_only:
            cls._remember_opened_directory(rb, meta, runs)
        adopt_shared_segments(rb, storage, meta, runs, read_only)
        cls._continue_generation(rb, meta, path, fold=multiprocessing and not read_only)
        return rb

    def _continue_generation(self, meta: Dict[str, Any], path: PathLike, fold: bool) -> None:
        """A buffer opened from `path` (called through the class by `load_from`): continues the commit log's
        generation of `meta`. With `fold` (a shared buffer, which persists by rewriting metadata.json), the log's
        commits go into metadata.json first (a new generation) and the log is removed; a single process appends
        to the log where the last one stopped."""
        self._meta_gen = int(meta.get(GENERATION_KEY, 0))
        if fold and os.path.exists(os.path.join(os.fspath(path), BUFFER_LOG_FILE)):
            self._write_metadata(path)

    # ------------------------------------------------------------------ static helpers
    @staticmethod
    def is_loadable_from(path: PathLike) -> bool:
        """True when `path` holds valid ReplayBuffer metadata."""
        try:
            read_metadata(path)
            return True
        except (OSError, ValueError):
            return False

    @staticmethod
    def get_length_from_path(path: PathLike) -> int:
        return int(read_metadata(path)["count"])

    @staticmethod
    def get_capacity_from_path(path: PathLike) -> Optional[int]:
        return read_metadata(path)["capacity"]  # type: ignore[no-any-return]

    @staticmethod
    def get_space_from_path(path: PathLike, *, backend: Any, device: Any = None) -> Space:
        backend = resolve_backend(backend)
        return json_to_space(read_metadata(path)["single_instance_space"], backend, device)

    # ------------------------------------------------------------------ properties
    def _st(self) -> SpaceStorage:
        if self.storage is None:
            if self._reopened_elsewhere:
                raise StorageStateError(f"this ReplayBuffer was closed because {self.cache_path} was opened for "
                                        "writing again in this process (one writer per directory): use the buffer "
                                        "that the later create() / load_from(read_only=False) returned")
            raise StorageStateError("the ReplayBuffer is closed")
        return self.storage

    @property
    def capacity(self) -> Optional[int]:
        return self._st().capacity

    count: int = forwarded("_state.count")
    offset: int = forwarded("_state.offset")
    total_written: int = forwarded(
        "_state.total_written", "Rows ever written at the tail (never decreases except on `clear`; shared across "
        "processes).")
    is_multiprocessing_safe: bool = forwarded("multiprocessing")
    maintain_segment_metadata: bool = forwarded(
        "_maintain", "Whether the buffer keeps its own segment list (every extend, commit and ended episode is a "
        "segment).")

    def __len__(self) -> int:
        return self._state.count

    @property
    def segments_version(self) -> int:
        """Changes whenever the segments, the length or the ring position change (for caches of `get_segments`)."""
        st = self.storage
        log = None if st is None or self._own_segments else st.segment_log()
        # the four counters side by side in 64-bit fields (never summed: a weighted sum let two different states,
        # e.g. before and after clear(), give the same number and a sampler reuse a stale segment table)
        version = self._state.version
        for part in (self._state.total_written, self._state.count, 0 if log is None else log.version):
            version = (version << 64) | (int(part) & _FIELD_MASK)
        return version

    @property
    def has_open_segment(self) -> bool:
        """True while an append-built episode is open (in this process)."""
        return self._seg_open or (self._writer is not None and len(self._writer) > 0)

    @property
    def open_segment_length(self) -> int:
        """Rows appended to the open episode (readable at the tail in a single process; kept by this process,
        not yet in the buffer, for a multiprocessing buffer)."""
        if self._seg_open:
            return self._seg_len
        return 0 if self._writer is None else len(self._writer)

    @property
    def pending_segment_length(self) -> int:
        """Rows appended but not readable yet (only a multiprocessing buffer's open episode)."""
        return 0 if self._writer is None else len(self._writer)

    @property
    def is_mutable(self) -> bool:  # type: ignore[override]
        return self.storage is not None and self.storage.is_mutable

    def index_with_offset(self, index: Any) -> Union[int, slice, np.ndarray]:
        """Physical storage index of logical `index` (an int, a slice when contiguous, else an int64 array)."""
        with self._state.locked():
            count, offset = self._state.count, self._state.offset
            self._follow_growth()
        fast = self._fast_array_index(index, count, offset)
        if fast is not None:
            return fast
        return self._physical(normalize_index(index, count, "ReplayBuffer"), offset)

    def _fast_array_index(self, index: Any, count: int, offset: int) -> Optional[np.ndarray]:
        """Physical rows of a 1-D integer index array when the ring is full (the sampling hot path), else None."""
        if type(index).__module__.startswith("torch"):
            try:
                index = index.numpy()
            except Exception:
                return None
        if not (isinstance(index, np.ndarray) and index.ndim == 1 and index.dtype.kind == "i" and index.size):
            return None
        st = self.storage
        cap = None if st is None else st.capacity
        if cap is None or count != cap:
            return None
        if offset == 0:
            return index          # the storage's own gather checks the range (negatives count from the end)
        lo, hi = int(index.min()), int(index.max())
        if lo < -count or hi >= count:
            return None           # the slow path names the offending index
        return (index.astype(np.int64, copy=False) + offset) % cap

    def _physical(self, norm: NormalizedIndex, offset: int) -> Union[int, slice, np.ndarray]:
        cap = self._st().capacity
        if norm.single is not None:
            return norm.single if cap is None else (norm.single + offset) % cap
        if norm.slc is not None and (cap is None or (norm.slc.step == 1 and offset + norm.slc.stop <= cap)):
            if cap is None or offset == 0:
                return norm.slc
            return slice(norm.slc.start + offset, norm.slc.stop + offset, norm.slc.step)
        pos = norm.positions()
        return pos if cap is None or offset == 0 else (pos + offset) % cap

    # ------------------------------------------------------------------ reads and writes by logical index
    def get_at(self, idx: Any) -> Any:
        """Sample(s) at logical `idx` (0 = oldest)."""
        return self._st().get(self.index_with_offset(idx))

    def get_flattened_at(self, idx: Any) -> Any:
        st = self._st()
        if hasattr(st, "get_flattened"):
            return st.get_flattened(self.index_with_offset(idx))  # type: ignore[attr-defined]
        return super().get_flattened_at(idx)

    def set_at(self, idx: Any, value: Any) -> None:
        """Overwrites sample(s) at logical `idx` (checked by the storage)."""
        self._st().set(self.index_with_offset(idx), value)

    def set_flattened_at(self, idx: Any, value: Any) -> None:
        st = self._st()
        if not hasattr(st, "set_flattened"):
            raise NotImplementedError(f"{type(st).__name__} has no set_flattened")
        st.set_flattened(self.index_with_offset(idx), value)  # type: ignore[attr-defined]

    def get_column(self, nested_keys: Any) -> Any:
        """A live view of one column, when the storage offers `get_column`."""
        st = self._st()
        if not hasattr(st, "get_column"):
            return super().get_column(nested_keys)   # a read-only view that selects the field on every read
        try:
            column = st.get_column(nested_keys)  # type: ignore[attr-defined]
        except NotImplementedError:   # a wrapper whose inner storage has no columns
            return super().get_column(nested_keys)
        return ColumnView(self, column)

    # ------------------------------------------------------------------ segments
    def _log(self) -> SegmentLog:
        return SegmentLog(self._st().capacity, self._state.get_segments() or [])

    def get_segments(self) -> Optional[List[Tuple[int, int]]]:
        """The segments as unienv 0.0.1b16 reports them: logical half-open `(start, end)` ranges, oldest data
        first, of the buffer's own list with `maintain_segment_metadata=True`, else of the storage's
        `get_segments()` (None for array, NPZ, HDF5, image and Parquet storages; a `VideoStorage` lists its
        segments). Every recorded episode, whatever the storage: `episode_segments()`."""
        if not self._maintain and self._st().get_segments() is None:
            return None
        return self.episode_segments()

    def episode_segments(self) -> Optional[List[Tuple[int, int]]]:
        """Logical half-open `(start, end)` ranges of every recorded episode (append-built, writer-built, and with
        `maintain_segment_metadata=True` every extended batch), oldest data first, on every storage; None when
        neither the buffer nor its storage keeps segments. An extension of this project (`get_segments()` keeps
        the reference's rules): samplers, windows and the integrations read episodes through it."""
        st = self._st()
        with self._state.locked():
            count, offset = self._state.count, self._state.offset
            runs = self._state.get_segments() if self._own_segments else _storage_runs(st)
        if runs is None:
            return None
        return logical_ranges(runs, offset, count, st.capacity)

    def _follow_growth(self) -> None:
        """A shared growable buffer (under the lock): rows other processes added become readable here."""
        st = self.storage
        if self.multiprocessing and st is not None and st.capacity is None and len(st) < self._state.count:
            st.follow_length(self._state.count, True)

    def _advance(self, n: int) -> Tuple[int, int]:
        """Reserves `n` rows at the tail (under the lock): returns their physical start, updates count/offset."""
        st = self._st()
        cap = st.capacity
        count, offset = self._state.count, self._state.offset
        if cap is None and count + n > len(st):
            if self.multiprocessing:        # every process grows the shared storage (no single owner)
                self._follow_growth()
                st.follow_length(count + n, False)
            else:
                st.extend_length(count + n - len(st))
        placed = tail_write(count, offset, n, cap)
        self._state.count, self._state.offset = placed.held, placed.offset
        self._state.total_written += n
        self._state.version += 1
        return placed.start, n

    def rewind(self, count: int, offset: int, total_written: int) -> None:
        """Moves the tail back to where `count`, `offset` and `total_written` (read earlier) put it: the rows placed
        since leave the buffer. For a service that placed rows with `commit_segment` for a writer that reserved them
        and then gave the reservation up; the caller makes sure no segment lists those rows."""
        with self._state.locked():
            self._state.count, self._state.offset, self._state.total_written = count, offset, total_written
            self._state.version += 1

    def _drop_own_segments(self, start: int, n: int) -> None:
        if self._own_segments:
            log = self._log()
            log.drop_overlapping(start, n)
            self._state.set_segments(log.runs())

    def _forget_rows(self, start: int, n: int, hidden: int = 0) -> None:
        """Drops every segment (the storage's and the buffer's) that rows `[start, start + n)` belong to; a shared
        buffer persists that, with its newest `hidden` rows (about to be written) left out of the count."""
        self._guard_committed_rows(start, n)
        self._st().forget_segments(start, n)
        self._drop_own_segments(start, n)
        self._persist_shared(hidden=hidden)     # before those rows are overwritten

    def _persist_shared(self, drop: Optional[Tuple[int, int]] = None, hidden: int = 0) -> None:
        """Rewrites the metadata of a disk-backed `multiprocessing=True` buffer now (called under its lock after its
        shared segment table changed, or with `drop=(start, n)` before rows `[start, start + n)` are overwritten:
        the segments they belong to are left out); with durable commit points the storage's rows are flushed first.

        `hidden`: the newest rows of the (already advanced) count that are about to be written, left out of the
        persisted count. A commit that overwrites rows of a full ring writes them child by child (the state, then
        the camera, ...); until its commit record (the metadata written after every child's rows) they must not be
        visible, or a killed collector leaves rows mixing its episode's state with an old episode's camera frame."""
        if not (self.multiprocessing and self.cache_path is not None and self._own_segments):
            return
        st = self._st()
        if not st.is_mutable or st.cache_filename is None:
            return
        log = self._log()
        if drop is not None:
            log.drop_overlapping(*drop)
            if not log.version and not hidden:
                return      # no listed segment holds those rows and no visible row is overwritten: the disk stays true
        if is_durable():
            st.flush()
        meta = self._metadata()
        if drop is not None:
            cap = st.capacity
            meta[self._segments_key()] = [[s, inclusive_end(s, n, cap)] for s, n in log.runs()]
        if hidden:
            meta["count"] = max(int(meta["count"]) - hidden, 0)
        atomic_write_json(os.path.join(self.cache_path, METADATA_FILE), self._meta_for_file(meta))

    def _add_own_segment(self, start: int, n: int, *, extend: bool = False) -> None:
        """Records a segment in the buffer's own list (an extended batch only with maintain_segment_metadata)."""
        if self._own_segments and n > 0 and (self._maintain or not extend):
            log = self._log()
            log.add(start, n)
            self._state.set_segments(log.runs())
            self._persist_shared()      # the episode survives a crash once its commit returns

    def extend(self, value: Any) -> None:
        """Adds a batch at the tail; a full ring overwrites its oldest rows (and drops their segments)."""
        st = self._st()
        self._require_no_open_segment("extend")
        n = _batch_length(value)
        if n == 0:
            return
        cap = st.capacity
        with self._state.locked():
            if cap is not None and n >= cap:
                for s in range(0, n - cap, cap):        # rows that will be overwritten at once are checked too
                    _check_only(st, _slice_leaves(value, slice(s, min(s + cap, n - cap))))
                tail_values = _slice_leaves(value, slice(n - cap, n))   # keeps every key: set() checks the key set
                _checked_write(st, slice(0, cap), tail_values,
                               lambda: self._forget_rows(0, cap, hidden=self._state.count))
                self._state.count, self._state.offset = cap, 0
                self._state.total_written += n
                self._state.version += 1
                self._add_own_segment(0, cap, extend=True)
                self._persist_shared()          # the commit record: the rows are written
                return
            old = (self._state.count, self._state.offset)
            written = self._state.total_written
            start, _ = self._advance(n)
            try:
                hidden = n if cap is not None and old[0] + n > cap else 0
                _checked_write(st, ring_index(start, n, cap), value, lambda: self._forget_rows(start, n, hidden))
            except BaseException:
                self._state.count, self._state.offset = old
                self._state.total_written = written
                raise
            self._add_own_segment(start, n, extend=True)
            if hidden:
                self._persist_shared()          # the commit record: the overwritten rows are visible again

    def append(self, value: Any) -> None:
        """Adds one sample to the current episode (opened at the tail on the first append).

        Single process: the row is written at once and counts in `len()`. Multiprocessing: the episode is kept
        by this process and written as a whole by `mark_segment_end()`."""
        st = self._st()
        cap = st.capacity
        if self.multiprocessing and (self._handed_off or self._writer is not None):
            if self._writer is not None and cap is not None and len(self._writer) >= cap:
                # an episode as long as the ring: written now (it could not be committed once longer), and the
                # appends go on in a new one, as the reference closes its storage's segment at the capacity
                w, self._writer = self._writer, None
                self._commit(w)
            if self._writer is None:
                self._writer = st.open_segment_writer()
            self._writer.append(value)
            return
        with self._state.locked():
            opened = False
            kept = (self._seg_start, self._seg_len)
            if self._seg_open and cap is not None and self._seg_len >= cap:
                # the open episode fills the ring: it keeps its newest rows (the row written now replaces its
                # oldest), and the storage's segment is closed at the capacity and a new one opened at the tail
                if st.pending_segment_length >= cap:
                    st.mark_segment_end()
                    st.mark_segment_start(tail_row(self._state.offset, self._state.count, cap))
                self._seg_start, self._seg_len = (self._seg_start + 1) % cap, cap - 1
            if not self._seg_open:
                tail = tail_row(self._state.offset, self._state.count, cap)
                st.mark_segment_start(tail)
                self._seg_open, self._seg_start, self._seg_len = True, tail, 0
                opened = True
            if cap is not None and self._state.count == cap:
                self._guard_committed_rows(tail_row(self._state.offset, self._state.count, cap), 1)
            try:
                st.append(value)
            except BaseException:
                if opened:          # a refused first step leaves no empty episode behind
                    st.abort_segment()
                    self._seg_open = False
                else:               # a refused step past the capacity leaves the open episode as it was
                    self._seg_start, self._seg_len = kept
                raise
            pos = tail_row(self._seg_start, self._seg_len, cap)
            if self._own_segments and self._state.count == cap:
                self._drop_own_segments(pos, 1)
            self._seg_len += 1
            self._advance(1)

    def mark_segment_end(self) -> None:
        """Ends the current episode and records it (writes it, for a multiprocessing buffer)."""
        st = self._st()
        if self.multiprocessing and not self._seg_open:
            w, self._writer = self._writer, None
            if w is not None and len(w):
                self._commit(w)
            return
        if not self._seg_open:
            return
        with self._state.locked():
            st.mark_segment_end()
            self._add_own_segment(self._seg_start, self._seg_len)
            self._seg_open = False
        self._commit_point()

    def abort_segment(self) -> None:
        """Forgets the current episode (single process: its rows stay in the buffer but belong to no segment)."""
        if self._writer is not None:
            self._writer.abort()
            self._writer = None
        if self._seg_open:
            self._st().abort_segment()
            self._seg_open = False

    def _require_no_open_segment(self, what: str) -> None:
        if self._seg_open:
            raise StorageStateError(f"Cannot {what} while an append-built episode is open; call mark_segment_end() "
                                    "(or abort_segment()) first")

    def open_segment_writer(self) -> SegmentWriter:
        """A writer for one episode; place it with `commit_segment(writer)` (any number, committed in any order)."""
        return self._st().open_segment_writer()

    def commit_segment(self, writer: SegmentWriter) -> None:
        """Writes a finished episode at the tail (placement is decided now, under the lock) and records it."""
        if getattr(writer, "storage", None) is not self._st():
            raise ValueError("the writer was not opened on this buffer's storage (use buffer.open_segment_writer())")
        if len(writer) == 0 and writer.state in ("open", "finished"):
            writer.abort()      # an empty episode places nothing (as in the reference, even while one is open)
            return
        self._require_no_open_segment("commit a segment")
        self._commit(writer)

    def _commit(self, writer: SegmentWriter) -> None:
        st = self._st()
        n = len(writer)
        cap = st.capacity
        if cap is not None and n > cap:
            raise ValueError(f"Cannot commit an episode of {n} rows into a buffer of capacity {cap}: create the "
                             f"buffer with a capacity of at least {n} (or capacity=None, growable), or record it "
                             f"with append(), which keeps its newest {cap} rows")
        with self._state.locked():
            old = (self._state.count, self._state.offset)
            written = self._state.total_written
            start, _ = self._advance(n)
            # rows a full ring overwrites were visible: until the commit record below they are left out of the
            # persisted count (offset already past them), as are the segments they belong to
            hidden = n if cap is not None and old[0] + n > cap else 0
            try:
                self._persist_shared(drop=(start, n), hidden=hidden)
                self._guard_committed_rows(start, n)
                writer.commit(start)
            except BaseException:
                self._state.count, self._state.offset = old
                self._state.total_written = written
                raise
            self._drop_own_segments(start, n)
            self._add_own_segment(start, n)
        self._commit_point()

    # ------------------------------------------------------------------ lifecycle
    def clear(self) -> None:
        """Empties the buffer (and its storage)."""
        st = self._st()
        with self._state.locked():
            self.abort_segment()
            self._guard_committed_rows(0, st.capacity or max(len(st), 1))   # every row is zeroed
            st.clear()
            self._state.count, self._state.offset = 0, 0
            self._state.total_written = 0
            self._state.version += 1
            if self._own_segments:
                self._state.set_segments([])

    def _metadata(self) -> Dict[str, Any]:
        return self._metadata_and_runs()[0]

    def _metadata_and_runs(self) -> Tuple[Dict[str, Any], List[Tuple[int, int]]]:
        """The metadata of the state now, and the segment runs (physical `(start, length)`) that state shows,
        wherever they are kept (the buffer's list or the storage's)."""
        st = self._st()
        cap = st.capacity
        with self._state.locked():
            count, offset = self._state.count, self._state.offset
            runs = self._state.get_segments() if self._own_segments else _storage_runs(st)
        segs = ([[s, inclusive_end(s, n, cap)] for s, n in runs]      # only a list the metadata holds is built
                if runs is not None and (self._maintain or self._own_segments) else None)
        if self._space_json is None:
            self._space_json = space_to_json(self.single_space if self._stored_storage is None
                                             else self._stored_storage.single_instance_space)
        stored = st if self._stored_storage is None else self._stored_storage
        meta = {"type": "ReplayBuffer", "format_version": FORMAT_VERSION, "count": count, "offset": offset,
                "capacity": cap, "storage_cls": storage_type_name(type(stored)),
                "storage_path_relative": self.storage_path_relative,
                "single_instance_space": self._space_json,
                "physical_segments": segs if self._maintain else None,
                "maintain_segment_metadata": self._maintain, "shared_segments": self.multiprocessing,
                GENERATION_KEY: self._meta_gen}
        if not self._maintain and self._own_segments:
            meta["buffer_segments"] = segs      # the reference reads `physical_segments` only
        return meta, list(runs or ())

    def _segments_key(self) -> str:
        """The metadata key holding the buffer's own segment list."""
        return "physical_segments" if self._maintain else "buffer_segments"

    def _space_text(self) -> EncodedJSON:
        """The stored space's JSON, encoded once per buffer (it never changes; see `EncodedJSON`)."""
        text = getattr(self, "_space_encoded", None)    # buffers pickled by an older version lack it
        if text is None:
            if self._space_json is None:
                self._metadata()
            text = self._space_encoded = encoded_json(self._space_json)
        return text

    def _meta_for_file(self, meta: Dict[str, Any]) -> Dict[str, Any]:
        """`meta` as written: the space spliced in already encoded."""
        return dict(meta, single_instance_space=self._space_text())

    def _write_metadata(self, path: PathLike) -> None:
        """Writes metadata.json into `path`. Into the buffer's own directory while it holds a commit log, the file
        starts a new generation and the log, whose records it now holds, is removed (see `_buffer_log`); without
        a log an unchanged state rewrites nothing."""
        own = self.cache_path is not None and os.path.abspath(os.fspath(path)) == os.path.abspath(self.cache_path)
        log_path = os.path.join(os.fspath(path), BUFFER_LOG_FILE)
        fold = own and os.path.exists(log_path)
        if fold:
            self._meta_gen += 1
        meta, runs = self._metadata_and_runs()
        atomic_write_json(os.path.join(os.fspath(path), METADATA_FILE), self._meta_for_file(meta))
        if fold:
            if self._buffer_log is None:
                remove_if_present(log_path)
            else:
                self._buffer_log.remove()
        if own:
            self._remember_disk(meta, runs)

    def _persist_state(self, meta: Dict[str, Any], runs: List[Tuple[int, int]],
                       stray: Optional[List[Tuple[int, int]]] = None) -> None:
        """Makes `meta` (of the current generation) what the buffer's own directory shows: one appended record of
        the commit log when the buffer keeps one (single process, writable, what the directory shows is known),
        else metadata.json rewritten with it."""
        shown = getattr(self, "_disk_meta", None)
        if shown is not None and not self.multiprocessing and self.cache_path is not None:
            if self._buffer_log is None:
                self._buffer_log = BufferCommitLog(os.fspath(self.cache_path))
            key = self._segments_key()
            self._buffer_log.record(meta, shown, key if (meta.get(key) is not None or shown.get(key) is not None)
                                    else None)
        else:           # a new generation, as `_write_metadata` starts: no record of the old one applies to it
            self._meta_gen += 1
            meta = dict(meta, **{GENERATION_KEY: self._meta_gen})
            atomic_write_json(os.path.join(os.fspath(self.cache_path), METADATA_FILE),  # type: ignore[arg-type]
                              self._meta_for_file(meta))
            remove_if_present(os.path.join(os.fspath(self.cache_path), BUFFER_LOG_FILE))  # type: ignore[arg-type]
        self._remember_disk(meta, runs, stray)

    def _remember_opened_directory(self, meta: Dict[str, Any], listed: Optional[List[Tuple[int, int]]]) -> None:
        """A writable buffer just opened from its directory (`load_from`): remembers what the directory shows,
        `meta` and the runs it lists (`listed`, when the buffer keeps its own list, else the storage's), so its
        rows are guarded before they are overwritten."""
        try:
            shown = list(listed or ()) if self._own_segments else _storage_runs(self._st())
        except StorageStateError:   # children that disagree list no segment a guard must keep whole
            shown = []
        self._remember_disk(meta, shown)

    def _remember_disk(self, meta: Dict[str, Any], runs: List[Tuple[int, int]],
                       stray: Optional[List[Tuple[int, int]]] = None) -> None:
        """Records what this buffer's own metadata.json says now: `meta`, and the segment runs that state shows
        (kept in it, or in the storage's files), for `_guard_committed_rows`; `stray`: those of `runs` not inside
        the window, when the caller knows them. The runs are kept in position order too (the storage lists them so;
        the buffer's own list is in commit order), so the guard finds the few it needs by bisection."""
        by_start = runs if self._own_segments is False else sorted(runs)
        if stray is None:
            stray = runs_not_inside_sorted(by_start, meta["offset"], meta["count"], meta["capacity"])
        self._disk_meta = meta
        self._disk_runs = (meta, runs, stray, by_start)

    def _guard_committed_rows(self, start: int, n: int) -> None:
        """Before physical rows `[start, start + n)` are overwritten: when the metadata.json of this buffer's own
        directory shows any of them (its count / offset window) or lists a segment holding any of them, it is
        rewritten (atomically) first, with the window shrunk to the rows that stay intact and without the segments
        those rows belong to (`window_before_overwrite`). A kill while a row is being written (a storage writes a
        row's fields one by one) or before the next commit point then reopens without that row: every row a
        reopened directory shows holds what the last commit point, or an earlier one, left there.

        The window gives up whole segments at a time (a segment that loses a row is gone anyway), and up to
        `GUARD_SLACK_ROWS` rows outside every segment, so a ring that wraps rewrites the file about once per
        overwritten episode, not once per row; the next commit point (`mark_segment_end`, `dumps`) restores the
        full window."""
        meta = getattr(self, "_disk_meta", None)
        if meta is None or self.multiprocessing or n <= 0:
            return
        cap = meta["capacity"]
        run = (start, n)
        window = (meta["offset"], meta["count"])
        known = getattr(self, "_disk_runs", None)
        runs, stray, by_start = (known[1], known[2], known[3]) if known is not None and known[0] is meta else ([], [], [])
        if not runs_overlap(window, run, cap) and not any(runs_overlap(r, run, cap) for r in stray):
            return                  # the common case: a row the directory does not show
        if (self._st() if self._stored_storage is None else self._stored_storage).cache_filename is None:
            return                  # a copy in memory: the directory's rows do not change
        offset, count = window_before_overwrite(window[0], window[1], run, cap, by_start, GUARD_SLACK_ROWS,
                                                presorted=True)
        gone = runs_not_inside_sorted(by_start, offset, count, cap)     # the new window holds no victim row
        if not gone:
            kept = runs
        elif runs is by_start:              # a copy without the few runs given up (no pass over the others)
            kept = list(runs)
            for r in gone:
                del kept[bisect_left(kept, r)]
        else:
            lost = set(gone)
            kept = [r for r in runs if r not in lost]
        meta = dict(meta, offset=offset, count=count)
        key = self._segments_key()
        if meta.get(key) is not None:
            meta[key] = [[s, inclusive_end(s, k, cap)] for s, k in kept]
        self._persist_state(meta, kept, [])     # every kept run is inside the new window

    def dumps(self, path: Optional[PathLike] = None) -> None:
        """Writes the storage to `<path>/<storage_path_relative>`, then the metadata (atomically). An ended episode of
        a buffer with a `cache_path` is on disk already (see `durable`).

        While this process has an episode open (appended but not ended): with `maintain_segment_metadata=True`,
        refused with `StorageStateError` (a `RuntimeError`, as in unienv 0.0.1b16: the buffer's segment list has no
        place for an open episode), so call `mark_segment_end()` (or `abort_segment()`) first; without it (the
        default), the open episode's rows are written and it is recorded when it ends (a periodic checkpoint of a
        running collector works; unienv 0.0.1b16 refused it, reference-api.md section 7 item 25)."""
        path = self.cache_path if path is None else path
        if path is None:
            raise ValueError("dumps() needs a path for a buffer without cache_path")
        st = self._st()
        if self._maintain and (self._seg_open or (self._writer is not None and len(self._writer))):
            raise StorageStateError("ReplayBuffer.dumps() with maintain_segment_metadata=True cannot be called while "
                                    "an episode is open (appended but not ended); call mark_segment_end() (or "
                                    "abort_segment()) before dumping")
        if self.multiprocessing and self._own_segments:
            # every process kept its own copy of the storage's segment log: the shared table is the truth
            with self._state.locked():
                runs = self._state.get_segments() or []
            cap = st.capacity
            st.forget_segments(0, cap if cap is not None else max(len(st), 1))
            for s, n in runs:
                st.record_segment(s, n)
        own = self.cache_path is not None and os.path.abspath(os.fspath(path)) == os.path.abspath(self.cache_path)
        st = st if self._stored_storage is None else self._stored_storage
        with self._state.locked():      # rows and counters from one instant, even while other processes commit
            self._follow_growth()
            if own:
                st.dumps(os.path.join(os.fspath(path), self.storage_path_relative))
                self._write_metadata(path)
                return
            with dump_transaction(path, directory=True):    # a dump killed halfway refuses to load
                remove_if_present(os.path.join(os.fspath(path), BUFFER_LOG_FILE))   # another buffer's commits
                st.dumps(os.path.join(os.fspath(path), self.storage_path_relative))
                self._write_metadata(path)

    def close(self) -> None:
        """Releases the buffer; closes the storage when the buffer created or loaded it. Idempotent."""
        if (self.multiprocessing and self.storage is not None and self._owns_storage and self.storage.capacity is None
                and self.storage.is_mutable and not self.storage.is_closed):
            try:
                with self._state.locked():
                    self._follow_growth()   # the storage's metadata records every row other processes added
            except StorageStateError:
                pass                        # a lock holder was killed: what the last commit persisted stays
        st, self.storage = self.storage, None
        if st is not None and self._owns_storage:
            on_disk = st if self._stored_storage is None else self._stored_storage
            if self.cache_path is not None and st.is_mutable and not st.is_closed and on_disk.cache_filename is not None:
                try:
                    self._write_metadata_for(st)
                except (OSError, StorageStateError):
                    # a full disk, or a shared buffer whose lock died with a killed process: what the last commit
                    # persisted stays on disk, and the storage is released all the same
                    pass
            st.close()
        if self._buffer_log is not None:
            self._buffer_log.close()
        if self._writer_lock is not None:
            self._writer_lock.release()

    def _write_metadata_for(self, st: SpaceStorage) -> None:
        self.storage = st
        try:
            self._write_metadata(self.cache_path)  # type: ignore[arg-type]
        finally:
            self.storage = None

    def __getstate__(self) -> Dict[str, Any]:
        if not self.multiprocessing:
            # the lock and the open log file stay with the process that took them
            return {**self.__dict__, "_writer_lock": None, "_buffer_log": None}
        self._hand_off()
        state = dict(self.__dict__)
        state["_writer_lock"] = None
        state["_buffer_log"] = None
        state["_writer"] = None
        state["_owns_storage"] = False
        return state

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self.__dict__.update(state)
        if self.multiprocessing:
            AFTER_FORK_IN_CHILD.add(self._drop_inherited_episode)
            if self.storage is not None:
                self.storage.durable = False    # commits persist the shared metadata (see `_persist_shared`)

    # ------------------------------------------------------------------ durability and `with`
    @property
    def durable(self) -> bool:
        """True (the default): every ended episode (`mark_segment_end()`, `commit_segment(writer)`) of a buffer
        with a `cache_path` is persisted at once, so a killed process loses at most the episode in progress. Only
        the small state that changed is written (metadata.json and the storages' metadata files, each replaced
        atomically); the rows are in their files already. False: only `flush()`, `dumps()` and `close()` persist
        (bulk loads; see `bulk()`). See docs/guarantees.md for what survives a crash and a power loss."""
        return self._durable

    @durable.setter
    def durable(self, value: bool) -> None:
        self._durable = bool(value)
        if self.storage is not None and not self.multiprocessing:
            self.storage.durable = value

    def bulk(self) -> ContextManager["ReplayBuffer"]:
        """`with buffer.bulk():` loads many episodes without persisting each one; on leaving the block (also on an
        exception) durability is restored and everything is persisted once (`flush()`)."""
        return suspended_durability(self, lambda: self.storage is not None, self.flush)

    def flush(self) -> None:
        """A commit point now: the storage's files, then metadata.json (a no-op without a `cache_path` or for a
        read-only buffer). Rows of an episode still open count in `len()` but are not recorded as an episode."""
        st = self._st()
        if self.cache_path is not None and st.is_mutable:
            self.dumps()

    def _commit_point(self) -> None:
        """An episode was recorded: a durable single-process buffer on disk rewrites its metadata now (the storage
        persisted its own state when the episode ended in it; a shared buffer persisted under its lock)."""
        if not self._durable or self.multiprocessing or self.cache_path is None:
            return
        st = self.storage if self._stored_storage is None else self._stored_storage
        if st is not None and st.is_mutable and st.cache_filename is not None:
            self._persist_state(*self._metadata_and_runs())

    def _drop_open_episode(self) -> None:
        """Forgets the episode in progress and its rows (the tail of the buffer), as a crash would."""
        if self._writer is not None:
            self._writer.abort()
            self._writer = None
        if not self._seg_open:
            return
        with self._state.locked():
            n = min(self._seg_len, self._state.count)
            self._st().abort_segment()
            self._seg_open = False
            self._state.count -= n
            self._state.version += 1

    def __enter__(self) -> "ReplayBuffer":
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        """Closes the buffer, committing it. An episode still open is ended and kept on a normal exit; when the
        block raised, it is dropped (its rows leave the buffer), as a crash would drop it."""
        close_after_block(self, exc_type, lambda: self.storage is not None and self.is_mutable,
                          self._drop_open_episode)

    def __repr__(self) -> str:
        return describe_buffer(self, self._stored_storage)
