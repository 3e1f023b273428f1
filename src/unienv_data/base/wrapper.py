"""`WrappedStorage`: the part of the SpaceStorage contract a storage that wraps one inner storage forwards as is
(length, capacity, mutability, segments, growth). Composite storages (FlattenedStorage, TransformedStorage,
ToBackendOrDeviceStorage) subclass it and only map values on the way through."""
from __future__ import annotations

from .common import BatchT
from unienv_interface.backends.base import BArrayType, BDeviceType, BDtypeType, BRNGType
import os
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple, Type, TypeVar, Union, cast

from unienv_interface.space import Space

from .errors import StorageFormatError, StorageNotFoundError
from .files import (PathLike, atomic_write_json, check_format_version, check_no_interrupted_dump, confined_path,
                    dump_transaction, read_json, remove_if_present, require_fields)
from .forwarding import forwarded
from .registry import resolve_storage_class
from .segment_writer import MappedSegmentWriter, SegmentWriter
from .segments import SegmentLog
from .storage import SpaceStorage

_W = TypeVar("_W", bound="WrappedStorage[Any, Any, Any, Any, Any]")


class StoredWrapper(NamedTuple):
    """What `WrappedStorage._open_stored` read from a wrapper's directory."""
    path: str                               #: the directory
    meta: Dict[str, Any]                    #: its metadata JSON
    meta_path: str                          #: the metadata file (names it in errors)
    inner_cls: Type[SpaceStorage]           #: the inner storage's class (resolved through the registry)
    inner_full: str                         #: the inner storage's path, inside the directory
    version: int                            #: the metadata's format version


class WrappedStorage(SpaceStorage[BatchT, BArrayType, BDeviceType, BDtypeType, BRNGType]):
    """Forwards lengths, capacity, segments and growth to `self.inner_storage` (set by the subclass)."""

    forwards_load_options = True  # `load_from` passes extra options on to the inner storage's
    inner_storage: SpaceStorage
    inner_storage_path: Union[str, PathLike]
    _cache_filename: Optional[Union[str, PathLike]] = None
    #: whether `close()` closes the inner storage (True when this object created or loaded it)
    owns_inner_storage: bool = False
    #: name of the metadata file written next to the inner storage (set by each subclass)
    metadata_file: str = ""
    #: files a subclass keeps next to its metadata that describe its own directory only (a commit log): a dump into
    #: another directory removes them there, so they never describe the dumped inner storage
    local_state_files: Tuple[str, ...] = ()

    def __init__(self, single_instance_space: Space, inner_storage: SpaceStorage,
                 inner_storage_path: Union[str, PathLike], cache_filename: Optional[Union[str, PathLike]] = None) -> None:
        if not isinstance(inner_storage, SpaceStorage):
            raise TypeError(f"inner_storage must be a SpaceStorage, got {type(inner_storage).__name__}")
        super().__init__(single_instance_space)
        self.inner_storage = inner_storage
        self.inner_storage_path = inner_storage_path
        self._cache_filename = cache_filename
        self.owns_inner_storage = False

    def set_value_label(self, label: str) -> None:
        super().set_value_label(label)
        self.inner_storage.set_value_label(label)


    # ------------------------------------------------------------------ construction (the one wrapper template)
    @classmethod
    def _adopt(cls: Type[_W], head: Tuple[Any, ...], inner: SpaceStorage, inner_path: Union[str, PathLike],
               cache_filename: Optional[Union[str, PathLike]]) -> _W:
        """`cls(*head, inner, inner_path, cache_filename=...)`, owning `inner` (closed again when that fails)."""
        try:
            st = cast(Any, cls)(*head, inner, inner_path, cache_filename=cache_filename)
        except BaseException:
            inner.close()
            raise
        st.owns_inner_storage = True
        return cast(_W, st)

    @classmethod
    def _create_wrapped(cls: Type[_W], head: Tuple[Any, ...], inner_storage_cls: Type[SpaceStorage], inner_space: Space,
                        args: Sequence[Any], kwargs: Dict[str, Any], *, capacity: Optional[int],
                        cache_path: Optional[PathLike], multiprocessing: bool,
                        inner_prefix: str = "inner_storage") -> _W:
        """The `create` of every wrapper: `inner_storage_cls.create(inner_space, *args, capacity=..., cache_path=
        <cache_path>/<inner_prefix><ext>, multiprocessing=..., **kwargs)`, wrapped as `cls(*head, inner, ...)`; with
        `cache_path` the directory is created first and the metadata written at once."""
        if not (isinstance(inner_storage_cls, type) and issubclass(inner_storage_cls, SpaceStorage)):
            raise TypeError(f"inner_storage_cls must be a SpaceStorage class, got {inner_storage_cls!r}")
        inner_path = inner_prefix + (inner_storage_cls.single_file_ext or "")
        if cache_path is not None:
            os.makedirs(cache_path, exist_ok=True)
        inner = inner_storage_cls.create(
            inner_space, *args, capacity=capacity,
            cache_path=None if cache_path is None else os.path.join(cache_path, inner_path),
            multiprocessing=multiprocessing, **kwargs)
        st = cls._adopt(head, inner, inner_path, cache_path)
        if cache_path is not None:
            st.write_metadata(cache_path)
        return st

    @classmethod
    def _open_stored(cls, path: Union[str, PathLike], kind: str, fields: Sequence[str] = ()) -> StoredWrapper:
        """The first half of every wrapper's `load_from`: reads and checks `<path>/<metadata_file>` (a directory with
        no interrupted dump, a known format version, `storage_type == kind`, the inner storage's type and `fields`
        present, the inner path inside the directory and not the directory itself)."""
        path = os.fspath(path)
        if not os.path.isdir(path):
            raise StorageNotFoundError(f"{kind} directory not found: {path}")
        meta_path = os.path.join(path, cls.metadata_file)
        check_no_interrupted_dump(path, kind)
        meta = read_json(meta_path, f"{kind} metadata")
        version = check_format_version(meta, meta_path)
        require_fields(meta, ("storage_type", "inner_storage_type", "inner_storage_path", *fields), meta_path)
        if meta["storage_type"] != kind:
            raise StorageFormatError(f"{meta_path}: storage_type is {meta['storage_type']!r}, expected {kind!r}")
        inner_cls = resolve_storage_class(meta["inner_storage_type"], meta_path)
        inner_full = confined_path(path, meta["inner_storage_path"], meta_path)
        if os.path.realpath(inner_full) == os.path.realpath(path):
            raise StorageFormatError(f"{meta_path}: inner_storage_path {meta['inner_storage_path']!r} points at the "
                                     "directory itself")
        return StoredWrapper(path, meta, meta_path, inner_cls, inner_full, version)

    # ------------------------------------------------------------------ persistence (shared by every wrapper)
    def _metadata(self) -> Dict[str, Any]:
        """The JSON the subclass writes into `metadata_file`."""
        raise NotImplementedError

    def write_metadata(self, path: Union[str, PathLike]) -> None:
        """Writes this wrapper's own metadata file (`metadata_file`) into the directory `path`, atomically (`create`
        with a cache path, `flush` and `dumps` call it; the inner storage writes its own)."""
        atomic_write_json(os.path.join(os.fspath(path), self.metadata_file), self._metadata())

    def flush(self) -> None:
        """Makes committed rows and segments durable in the cache directory (inner data first, then metadata)."""
        self._check_open()
        flush = getattr(self.inner_storage, "flush", None)
        if flush is not None:
            flush()
        if self._cache_filename is not None and self.is_mutable:
            self.write_metadata(self._cache_filename)

    def dumps(self, path: Union[str, PathLike]) -> None:
        """Writes the inner storage to `<path>/<inner_storage_path>`, then the metadata (atomically). Into another
        directory this runs inside a dump marker, so a dump killed halfway leaves a directory that refuses to load."""
        self._check_open()
        inner_path = os.path.join(os.fspath(path), os.fspath(self.inner_storage_path))
        if self._is_own_directory(path):
            self.inner_storage.dumps(inner_path)
            self.write_metadata(path)
            return
        with dump_transaction(path, directory=True):
            for name in self.local_state_files:
                remove_if_present(os.path.join(os.fspath(path), name))
            self.inner_storage.dumps(inner_path)
            self.write_metadata(path)

    def _is_own_directory(self, path: Union[str, PathLike]) -> bool:
        """Whether `path` is this storage's own directory (its `cache_filename`)."""
        return self._cache_filename is not None and os.path.abspath(os.fspath(path)) == os.path.abspath(
            os.fspath(self._cache_filename))

    def close(self) -> None:
        """Closes the inner storage if this object created or loaded it; idempotent."""
        if self._closed:
            return
        self._closed = True
        if self.owns_inner_storage:
            self.inner_storage.close()

    # ------------------------------------------------------------------ forwarded contract

    @property
    def cache_filename(self) -> Optional[Union[str, PathLike]]:
        """This storage's directory when the inner storage is backed by a file, else None."""
        return self._cache_filename if self.inner_storage.cache_filename is not None else None

    is_mutable: bool = forwarded("inner_storage.is_mutable")
    is_multiprocessing_safe: bool = forwarded("inner_storage.is_multiprocessing_safe")
    capacity: Optional[int] = forwarded("inner_storage.capacity")
    has_open_segment: bool = forwarded("inner_storage.has_open_segment")
    pending_segment_length: int = forwarded("inner_storage.pending_segment_length")

    def __len__(self) -> int:
        return len(self.inner_storage)

    def extend_length(self, length: int) -> None:
        self._check_open()
        self.inner_storage.extend_length(length)

    def shrink_length(self, length: int) -> None:
        self._check_open()
        self.inner_storage.shrink_length(length)

    @property
    def follows_shared_growth(self) -> bool:
        return self.inner_storage.follows_shared_growth

    def follow_length(self, length: int, written: bool) -> None:
        self.inner_storage.follow_length(length, written)

    def mark_segment_start(self, start_index: int) -> None:
        self.check_writable()
        self.inner_storage.mark_segment_start(start_index)

    def mark_segment_end(self) -> None:
        self._check_open()
        self.inner_storage.mark_segment_end()

    def abort_segment(self) -> None:
        self._check_open()
        self.inner_storage.abort_segment()

    def get_segments(self) -> Optional[List[Any]]:
        """The inner storage's `get_segments()` (as unienv 0.0.1b16 forwards it)."""
        self._check_open()
        return self.inner_storage.get_segments()

    def episode_segments(self) -> Optional[List[Any]]:
        """The inner storage's `episode_segments()`."""
        self._check_open()
        return self.inner_storage.episode_segments()

    def clear(self) -> None:
        self.check_writable()
        self.inner_storage.clear()

    def forget_segments(self, start: int, length: int) -> None:
        self._check_open()
        self.inner_storage.forget_segments(start, length)

    def segment_log(self) -> Optional[SegmentLog]:
        return self.inner_storage.segment_log()

    def record_segment(self, start: int, length: int) -> None:
        self.inner_storage.record_segment(start, length)

    def has_persistent_segments(self) -> bool:
        return self.inner_storage.has_persistent_segments()

    def child_storages(self) -> List[SpaceStorage]:
        return [self.inner_storage]

    def persist_committed(self) -> None:
        self.inner_storage.persist_committed()   # this storage's own metadata does not change with segments

    def commit_log_leaf(self) -> Optional[SpaceStorage]:
        return self.inner_storage.commit_log_leaf()   # length and segments live in the inner storage


class ValueMappingStorage(WrappedStorage[BatchT, BArrayType, BDeviceType, BDtypeType, BRNGType]):
    """A wrapper whose every write maps the value (`_to_inner`) and the index (`_index_to_inner`, identity by
    default) onto the inner storage, which checks and writes it: TransformedStorage and ToBackendOrDeviceStorage."""

    def _to_inner(self, value: Any) -> Any:
        """`value` (one element or a batch) as the inner storage takes it; raises for a value that is not valid."""
        raise NotImplementedError

    def _index_to_inner(self, index: Any) -> Any:
        return index

    def set(self, index: Any, value: Any) -> None:
        """Maps `value` (checking it) and writes it at `index` in the inner storage; on any error nothing changes."""
        self.check_writable()
        self.inner_storage.set(self._index_to_inner(index), self._to_inner(value))

    def append(self, value: Any) -> None:
        """Maps one element and appends it to the inner storage's open segment."""
        self.check_writable()
        self.inner_storage.append(self._to_inner(value))

    def open_segment_writer(self) -> SegmentWriter:
        """A writer whose appended elements are mapped (and so checked) at once and written on `commit(start)`."""
        self.check_writable()
        return MappedSegmentWriter(self, self.inner_storage.open_segment_writer(), self._to_inner)

    # ------------------------------------------------------------------ hooks used by owners (ReplayBuffer, DictStorage)
    def prepare_element(self, value: Any) -> Any:
        """Checks one element completely (here and in the inner storage) without writing; returns it in the inner
        storage's prepared form (what `stack_prepared` / `set_prepared` take)."""
        return self.inner_storage.prepare_element(self._to_inner(value))

    def stack_prepared(self, items: List[Any]) -> Any:
        return self.inner_storage.stack_prepared(items)

    def set_prepared(self, index: Any, batch: Any) -> None:
        self.check_writable()
        self.inner_storage.set_prepared(self._index_to_inner(index), batch)
