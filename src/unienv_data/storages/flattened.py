"""`FlattenedStorage`: every structured sample packed into one flat 1-D row of an inner storage."""
from __future__ import annotations

from unienv_data.base.common import BatchT
from unienv_interface.backends.base import BArrayType, BDeviceType, BDtypeType, BRNGType
import os
from functools import partial
from typing import Any, Callable, Dict, List, Optional, Set, Tuple, Type, Union

import numpy as np

from unienv_data.base.errors import StorageFormatError
from unienv_data.base.files import FORMAT_VERSION, PathLike, encoded_json
from unienv_data.base.indexing import normalize_index
from unienv_data.base.registry import storage_type_name
from unienv_data.base.segment_writer import BufferedSegmentWriter, MappedSegmentWriter, SegmentWriter
from unienv_data.base.storage import SpaceStorage
from unienv_data.base.warn import warn_user
from unienv_data.base.wrapper import WrappedStorage
from unienv_interface.space import BoxSpace, Space
from unienv_interface.space.space_utils.serialization_utils import json_to_space, same_space_json, space_to_json

from ._array_storage import ArrayStorageBase, sidecar_path
from ._commit_log import FLATTENED_LOG_FILE, LeafCommitLog, adopt_log
from ._flat_column import FlatLeafColumn
from ._flat_layout import FlatRowPlan

METADATA_FILE = "flattened_metadata.json"


class FlattenPromotionWarning(UserWarning):
    """The flat row's common dtype makes samples at least twice their native size."""


_WARNED: Set[str] = set()
_LAST_PLAN: List[Any] = [None, None]


def _plan_for(space: Space) -> FlatRowPlan:
    """The row plan of `space`, reused by the `__init__` that follows a create / load_from of the same space."""
    if _LAST_PLAN[0] is space:
        return _LAST_PLAN[1]  # type: ignore[no-any-return]
    plan = FlatRowPlan(space)
    _LAST_PLAN[0], _LAST_PLAN[1] = space, plan
    return plan


def _warn_promotion(plan: FlatRowPlan) -> None:
    native, row = plan.native_bytes(), plan.row_bytes()
    if native == 0 or row < 2 * native:
        return
    sig = repr((plan.backend.simplified_name, plan.layout_json()))
    if sig in _WARNED:
        return
    _WARNED.add(sig)
    keys = ", ".join(f"{k!r} ({dt} stored as {plan.row_dtype.name}, {f}x)" for k, dt, f in plan.inflated_leaves())
    warn_user(
        f"FlattenedStorage promotes every leaf to one {plan.row_dtype.name} row: {row} bytes per sample for {native} "
        f"bytes of data ({row / native:.1f}x). Inflated keys: {keys}. Keep them in their own storage (a DictStorage "
        "with one array storage per key, or VideoStorage for images) and flatten only the low-dimensional keys.",
        FlattenPromotionWarning)


def _describe_layout_difference(stored: List[Dict[str, Any]], wanted: List[Dict[str, Any]]) -> str:
    s = {e.get("key"): e for e in stored if isinstance(e, dict)}
    w = {e["key"]: e for e in wanted}
    parts = []
    missing = sorted(set(s) - set(w), key=str)
    added = sorted(set(w) - set(s), key=str)
    if missing:
        parts.append(f"stored keys missing from the space: {missing}")
    if added:
        parts.append(f"space keys not in the stored data: {added}")
    for k in sorted(set(s) & set(w), key=str):
        for field in ("dtype", "shape", "offset"):
            if s[k].get(field) != w[k][field]:
                parts.append(f"key {k!r}: stored {field} {s[k].get(field)!r}, space gives {w[k][field]!r}")
    return "; ".join(parts) or "the layouts differ"


class FlattenedStorage(WrappedStorage[BatchT, BArrayType, BDeviceType, BDtypeType, BRNGType]):
    """Stores every sample flattened into one 1-D BoxSpace row of an inner storage (e.g. PytorchTensorStorage), so
    a read or write of any number of samples is one row operation on a single array.

    The flat row has one common dtype, promoted from all leaves (torch: bool leaves count as int32, NumPy: int64):
    uint8 images next to float32 keys are stored as float32 (4x the bytes). A `FlattenPromotionWarning` names such
    keys; keep them in their own storage and flatten only the low-dimensional keys.

    Beyond the reference API:
    * every write is checked against the space (keys, shapes, dtypes, bounds, exact representability in the row
      dtype) before anything is written; `get` / `get_flattened` always return copies;
    * `load_from(path, space)` needs no capacity, and checks the stored layout (keys, dtypes, shapes, bounds)
      against the given space, naming what differs;
    * closing or garbage-collecting a FlattenedStorage built around an existing inner storage never closes that
      inner storage; `close()` closes only an inner storage it created or loaded itself;
    * on disk, a commit point is one line appended to `flattened_commit.log` in its directory, not a rewrite of the
      inner storage's metadata file: after `start_commit_log()` (`create` / `load_from` call it in one process) a
      writable storage with a `cache_filename` over an inner storage whose only per-commit state is its length and
      segments (a memory-mapped array storage) keeps that state in the log (see `_commit_log`); `flush()`,
      `close()` and `dumps()` into its directory write the inner storage's own metadata and compact the log, so
      the files alone describe the storage again. The file is written at the first commit point: as the child
      of a `DictStorage` that keeps a commit log, the DictStorage's log holds that state instead and this one is
      never written.
    """

    metadata_file = METADATA_FILE
    local_state_files = (FLATTENED_LOG_FILE,)

    def __init__(self, single_instance_space: Space, inner_storage: SpaceStorage, inner_storage_path: Union[str, PathLike],
                 cache_filename: Optional[Union[str, PathLike]] = None) -> None:
        super().__init__(single_instance_space, inner_storage, inner_storage_path, cache_filename)
        plan = _plan_for(single_instance_space)
        # the plan's leaf converters are this storage's own from now on (they remember which keys were warned
        # about out-of-bounds values: once per key and storage), so the next storage builds its own plan
        _LAST_PLAN[0] = _LAST_PLAN[1] = None
        inner_space = inner_storage.single_instance_space
        if inner_space.backend is not single_instance_space.backend:
            raise ValueError(f"inner storage backend {inner_space.backend} differs from the space's "
                             f"{single_instance_space.backend}")
        if not isinstance(inner_space, BoxSpace) or inner_space != plan.flat_space:
            fs = plan.flat_space
            got = (f"{inner_space.backend.dtype_name(inner_space.dtype)}{list(inner_space.shape)}"
                   if isinstance(inner_space, BoxSpace) else type(inner_space).__name__)
            if isinstance(inner_space, BoxSpace) and got == f"{fs.backend.dtype_name(fs.dtype)}{list(fs.shape)}":
                got += " with different bounds"
            raise ValueError(f"inner storage holds {got}, but the space flattens to "
                             f"{fs.backend.dtype_name(fs.dtype)}{list(fs.shape)}")
        self._plan = plan
        self._fast = isinstance(inner_storage, ArrayStorageBase)
        #: the compiled unflattening of a batch of rows, when the inner storage is an array storage (read by `get`)
        self._fast_unpack = plan.codec.unpack_batch if self._fast else None
        #: the same, making every leaf a new array, so it may read a view of the storage's rows (contiguous slices)
        self._fast_unpack_view = plan.codec.unpack_view if self._fast else None
        make_append = plan.codec.make_append
        if self._fast and make_append is not None and type(self).append is FlattenedStorage.append:
            # the per-step hot path: the plan's compiled check-and-write of one sample into the inner storage's next
            # row, bound to this inner storage and installed over the `append` method (removed again by `close`)
            self.append = make_append(inner_storage)  # type: ignore[method-assign,assignment]
        self._log: Optional[LeafCommitLog] = None      # the commit log (see `start_commit_log`), when keeping one

    # ------------------------------------------------------------------ construction
    @classmethod
    def create(cls, single_instance_space: Space, inner_storage_cls: Type[SpaceStorage], *args: Any,  # type: ignore[override]
               capacity: Optional[int] = None, cache_path: Optional[PathLike] = None, multiprocessing: bool = False,
               inner_storage_kwargs: Dict[str, Any] = {}, **kwargs: Any) -> "FlattenedStorage":
        """A new storage: `inner_storage_cls.create(flatten_space(space), *args, capacity=..., cache_path=
        <cache_path>/inner_storage<ext>, multiprocessing=..., **kwargs, **inner_storage_kwargs)`.

        With `cache_path` the directory is created and its metadata written at once, so it can be reopened with
        `load_from(cache_path, space)` (call `dumps(cache_path)` or `flush()` to persist segments).
        """
        plan = _plan_for(single_instance_space)
        _warn_promotion(plan)
        st = cls._create_wrapped((single_instance_space,), inner_storage_cls, plan.flat_space, args,
                                 {**kwargs, **inner_storage_kwargs}, capacity=capacity, cache_path=cache_path,
                                 multiprocessing=multiprocessing)
        if not multiprocessing:
            st.start_commit_log()
        return st

    @classmethod
    def load_from(cls, path: Union[str, PathLike], single_instance_space: Space, *, capacity: Optional[int] = None,
                  read_only: bool = True, multiprocessing: bool = False, **kwargs: Any) -> "FlattenedStorage":
        """Opens a directory written by `dumps` (this library's or the reference's).

        The stored layout is checked against `single_instance_space` (ValueError naming each difference); the
        capacity comes from the files (a `capacity` argument must agree). Extra kwargs go to the inner `load_from`.
        The inner storage takes the committed length and segments from `flattened_commit.log` when there is one
        (after a crash it is newer than the inner storage's own metadata).
        """
        path, meta, meta_path, inner_cls, inner_full, version = cls._open_stored(path, "FlattenedStorage")
        plan = _plan_for(single_instance_space)
        if version >= 1:
            stored_layout = meta.get("layout")
            if not isinstance(stored_layout, list):
                raise StorageFormatError(f"{meta_path}: 'layout' must be a list")
            for i, entry in enumerate(stored_layout):
                if not (isinstance(entry, dict) and isinstance(entry.get("key"), str)):
                    raise StorageFormatError(f"{meta_path}: layout entry {i} = {entry!r} is malformed (expected an "
                                             "object with a string 'key')")
            row = meta.get("row", {})
            want_row = plan.backend.dtype_name(plan.flat_space.dtype)
            if stored_layout != plan.layout_json() or not isinstance(row, dict) or row.get("dtype") != want_row:
                diff = _describe_layout_difference(stored_layout, plan.layout_json())
                if isinstance(row, dict) and row.get("dtype") != want_row:
                    diff += f"; row dtype: stored {row.get('dtype')!r}, space gives {want_row!r}"
                raise ValueError(f"the space does not match the data stored in {path}: {diff}")
            if "space" in meta and not same_space_json(single_instance_space, meta["space"]):
                try:
                    stored_space = json_to_space(meta["space"], single_instance_space.backend, single_instance_space.device)
                except ValueError as exc:
                    raise StorageFormatError(f"{meta_path}: stored space is malformed: {exc}") from None
                if stored_space != single_instance_space:
                    raise ValueError(f"the space does not match the one stored in {path}: same layout but different "
                                     f"bounds; stored {stored_space!r}, given {single_instance_space!r}")
            stored_cap = meta.get("capacity")
            if capacity is not None and stored_cap is not None and capacity != stored_cap:
                raise ValueError(f"{path} was written with capacity {stored_cap}, not {capacity}: pass "
                                 f"capacity={stored_cap} or omit it")
        inner = inner_cls.load_from(inner_full, plan.flat_space, capacity=capacity, read_only=read_only,
                                    multiprocessing=multiprocessing, **kwargs)
        if version >= 1:
            problem = None
            if isinstance(inner, ArrayStorageBase) and not inner.has_persistent_segments():
                problem = (f"the metadata of its rows ({os.path.basename(sidecar_path(inner_full))}: length and "
                           "segments) is missing")
            elif "capacity" in meta and inner.capacity != meta["capacity"]:
                problem = (f"{meta_path} promises capacity {meta['capacity']}, but "
                           f"{os.path.basename(inner_full)} holds {inner.capacity}")
            if problem is not None:
                inner.close()
                raise StorageFormatError(f"{path}: {problem}; the directory is damaged (restore it from a copy)")
        leaf = inner.commit_log_leaf()
        if leaf is not None:
            log_path = os.path.join(path, FLATTENED_LOG_FILE)
            try:
                adopt_log(log_path, inner.capacity, [(log_path, leaf)])
            except BaseException:
                inner.close()
                raise
        st = cls._adopt((single_instance_space,), inner, meta["inner_storage_path"],
                        path if inner.cache_filename is not None else None)
        if not multiprocessing:
            st.start_commit_log()
        return st

    # ------------------------------------------------------------------ delegated properties

    @property
    def flat_space(self) -> BoxSpace:
        """The 1-D Box each sample is flattened to."""
        return self._plan.flat_space

    # ------------------------------------------------------------------ data
    def _rows_numpy(self, index: Any) -> np.ndarray:
        if self._fast:
            return self.inner_storage.get_numpy(index)  # type: ignore[attr-defined,no-any-return]
        return np.asarray(self.backend.to_numpy(self.inner_storage.get(index)))

    def get(self, index: Any) -> Any:
        """Sample(s) at `index` with every leaf in its own dtype (copies): an int-like index gives one sample.

        The leaves of one call are views of one fresh copy of the rows (never of the storage)."""
        if self._closed:
            self._check_open()
        unpack = self._fast_unpack
        if unpack is not None:
            inner: Any = self.inner_storage
            if type(index) is slice and self._fast_unpack_view is not None:
                # every leaf is copied or cast into a new array: unpack a view of the rows of a contiguous slice,
                # with no row copy first (the inner storage's own rows `[0, len)`, as its `get_numpy` reads them)
                view = inner.rows_view(index)
                if view is not None:
                    return self._fast_unpack_view(view)
            rows = inner.get_numpy(index)
            return unpack(rows) if rows.ndim == 2 else self._plan.unpack(rows, to_backend=True)
        return self._plan.unpack(self._rows_numpy(index), to_backend=True)

    def get_column(self, nested_keys: Any) -> FlatLeafColumn:
        """A read-only column of one leaf (a key, or a sequence of keys for a nested leaf) that reads only that
        leaf's columns of the flat rows (`FlatLeafColumn`): a `ReplayBuffer`'s `get_column`, and the windows and
        samplers that read chosen keys, then copy a few bytes per row instead of whole rows.
        NotImplementedError for a text leaf, a subtree, or an inner storage that is not an in-process array
        storage (callers then read whole rows)."""
        self._check_open()
        column = FlatLeafColumn.find(self, self.inner_storage, self._plan, nested_keys)
        if column is None:
            raise NotImplementedError(f"FlattenedStorage has no column view of {nested_keys!r} (a text leaf, a "
                                      "subtree, or an inner storage that is not an array storage)")
        return column

    def get_flattened(self, index: Any) -> Any:
        """The flat row(s) at `index` (a copy, never a view into the storage)."""
        self._check_open()
        return self.inner_storage.get(index)

    def _write_rows(self, index: Any, rows: np.ndarray) -> None:
        if self._fast:
            self.inner_storage.write_checked_rows(index, rows)  # type: ignore[attr-defined]
        else:
            self.inner_storage.set(index, self.backend.from_numpy(rows, dtype=self._plan.flat_space.dtype,
                                                                  device=self.device))

    def set(self, index: Any, value: Any) -> None:
        """Checks `value` against the space and writes it at `index`; on any error nothing is written."""
        self.check_writable()
        norm = normalize_index(index, len(self.inner_storage), type(self).__name__)
        lead = norm.lead()
        if self._fast and lead:
            arrs = self._plan.check_batch(value, lead)
            if arrs is not None:
                self.inner_storage.write_rows_with(norm.numpy_key(), self._plan.write_checked_batch, arrs)  # type: ignore[attr-defined]
                return
        self._write_rows(norm.numpy_key(), self._plan.pack(value, lead))

    def set_flattened(self, index: Any, value: Any) -> None:
        """Writes flat rows after checking that every leaf reads back to a valid value."""
        self.check_writable()
        norm = normalize_index(index, len(self.inner_storage), type(self).__name__)
        lead = norm.lead()
        rows = self.inner_storage.converter.to_numpy(value)[0] if self._fast else np.asarray(self.backend.to_numpy(value))  # type: ignore[attr-defined]
        if tuple(rows.shape) != lead + (self._plan.width,):
            raise ValueError(f"expected flat rows of shape {lead + (self._plan.width,)}, got {tuple(rows.shape)}")
        if rows.dtype != self._plan.row_dtype:
            rows = self.inner_storage.converter.convert(rows, lead) if self._fast else rows.astype(self._plan.row_dtype)  # type: ignore[attr-defined]
        self._write_rows(norm.numpy_key(), self._plan.check_rows(rows))

    def prepare_element(self, value: Any) -> Any:
        return self._plan.pack(value)

    def append(self, value: Any) -> None:
        """Checks one sample and writes it at the open segment's next row."""
        if self._closed:
            self._check_open()
        if self._fast:
            self.inner_storage.append_checked_row(self._plan.pack(value))  # type: ignore[attr-defined]
        else:
            self.check_writable()
            row = self._plan.pack(value)
            self.inner_storage.append(self.backend.from_numpy(row, dtype=self._plan.flat_space.dtype, device=self.device))

    def close(self) -> None:
        """Closes the storage (and the inner storage when this storage created or loaded it, which writes its own
        metadata; then the commit log is compacted). Idempotent."""
        self.__dict__.pop("append", None)   # the compiled appender (see __init__): `append` now refuses
        log, self._log = self._log, None
        if log is None:
            super().close()
        else:
            log.close(super().close, compact=self.owns_inner_storage)

    # ------------------------------------------------------------------ commit points (see _commit_log)
    def start_commit_log(self) -> None:
        """Keeps the commit points in `flattened_commit.log` from now on (see the class docstring), when this
        storage is open, writable, has a `cache_filename`, and its inner storage keeps nothing but its length and
        segments per commit (`commit_log_leaf()`); otherwise, or when it keeps one already, does nothing. One
        process only: pickled copies keep none. The file is written at the first commit point (or drop of a
        segment), so a `DictStorage` that takes this storage as a child and keeps its own log (which then holds
        the inner storage's state) leaves no file of this one."""
        leaf = self.inner_storage.commit_log_leaf()
        if (self._log is not None or self._closed or leaf is None or self.cache_filename is None
                or not self.is_mutable):
            return
        self._log = LeafCommitLog(os.fspath(self.cache_filename), FLATTENED_LOG_FILE, [leaf], lazy=True,
                                  listen_commits=True)

    def persist_committed(self) -> None:
        super().persist_committed()
        if self._log is not None:
            self._log.compact()

    def flush(self) -> None:
        """Makes committed rows and segments durable in the cache directory (the inner storage's data, then its own
        metadata and this storage's), then compacts the commit log."""
        super().flush()
        if self._log is not None:
            self._log.compact()

    def dumps(self, path: Union[str, PathLike]) -> None:
        """Writes the inner storage to `<path>/<inner_storage_path>`, then the metadata (atomically); into its own
        directory, then compacts the commit log (another directory gets no log: its files describe it)."""
        super().dumps(path)
        if self._log is not None and self._is_own_directory(path):
            self._log.compact()

    def open_segment_writer(self) -> SegmentWriter:
        """A writer whose appended samples are checked and flattened at once and written on `commit(start)`."""
        self.check_writable()
        inner_writer = self.inner_storage.open_segment_writer()
        if self._fast:
            return MappedSegmentWriter(self, inner_writer, self._plan.pack, prepared=True)
        return MappedSegmentWriter(
            self, inner_writer,
            lambda v: self.backend.from_numpy(self._plan.pack(v), dtype=self._plan.flat_space.dtype, device=self.device))

    # ------------------------------------------------------------------ staging (see SpaceStorage)
    @property
    def staging_checks_all(self) -> bool:
        return self._fast or self.inner_storage.staging_checks_all

    def _rows_to_inner(self, rows: np.ndarray) -> Any:
        return self.backend.from_numpy(rows, dtype=self._plan.flat_space.dtype, device=self.device)

    def stage_set(self, index: Any, value: Any) -> Callable[[], None]:
        """Checks and packs `value` for `set(index, ...)` now (a checked batch over an array storage is written
        leaf by leaf into its rows later, without a packed copy); the inner storage stages its rows."""
        self.check_writable()
        norm = self._stage_index(index)
        key, lead = norm.numpy_key(), norm.lead()
        if not self._fast:
            return self.inner_storage.stage_set(norm, self._rows_to_inner(self._plan.pack(value, lead)))
        inner: Any = self.inner_storage
        if lead:
            arrs = self._plan.check_batch(value, lead)
            if arrs is not None:
                return partial(inner.write_rows_with, key, self._plan.write_checked_batch, arrs)
        return partial(inner.write_checked_rows, key, self._plan.pack(value, lead))

    def stage_append(self, value: Any) -> Callable[[], None]:
        """Checks the state and the sample now; over an array storage the append only copies the packed row."""
        if self._closed:
            self._check_open()
        inner: Any = self.inner_storage
        if not self._fast:
            return inner.stage_append(self._rows_to_inner(self._plan.pack(value)))
        inner.check_append_state()  # the rows, and so the segment state, live in the inner storage (as in append)
        return partial(inner.append_checked_row, self._plan.pack(value))

    def open_staged_writer(self) -> Tuple[SegmentWriter, Callable[[Any], Callable[[], None]]]:
        """A writer of the inner storage (which holds this storage's segments) and `stage(value)`, which packs the
        sample (the check) and hands the row to it."""
        pack = self._plan.pack
        if self._fast:
            writer = self.inner_storage.open_segment_writer()
            if isinstance(writer, BufferedSegmentWriter):
                buffered = writer
                return writer, lambda value: partial(buffered.append_prepared, pack(value))
            writer.abort()
        inner_writer, inner_stage = self.inner_storage.open_staged_writer()
        return inner_writer, lambda value: inner_stage(self._rows_to_inner(pack(value)))

    # ------------------------------------------------------------------ persistence
    def _metadata(self) -> Dict[str, Any]:
        # the space's JSON and the row layout never change for a storage: computed once (most of the cost of a
        # `dumps` into the storage's own directory), the rest per call
        static = self.__dict__.get("_static_metadata")
        if static is None:
            static = self._static_metadata = {
                "row": {"dtype": self.backend.dtype_name(self._plan.flat_space.dtype), "width": self._plan.width},
                "layout": encoded_json(self._plan.layout_json()),
                "space": encoded_json(space_to_json(self.single_instance_space))}
        return {"storage_type": "FlattenedStorage", "inner_storage_type": storage_type_name(type(self.inner_storage)),
                "inner_storage_path": os.fspath(self.inner_storage_path), "format_version": FORMAT_VERSION,
                "capacity": self.inner_storage.capacity, **static}

    def __getstate__(self) -> Dict[str, Any]:
        return {"space": self.single_instance_space, "inner": self.inner_storage, "inner_path": self.inner_storage_path,
                "cache": self._cache_filename, "owns": self.owns_inner_storage}

    def __setstate__(self, state: Dict[str, Any]) -> None:
        FlattenedStorage.__init__(self, state["space"], state["inner"], state["inner_path"], state["cache"])
        self.owns_inner_storage = state["owns"]
