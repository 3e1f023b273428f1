"""The storage-author contract for a file-backed plugin storage written from the docs: `close()` commits through the
`flush()` hook, `on_segments_dropped()` persists dropped segments before their rows are overwritten, and the kit's
checks for both fail with a message naming the hook when a storage leaves them out."""
from __future__ import annotations

import json
import os
import tempfile
from typing import Any, Optional

import numpy as np
import pytest

from unienv_data.base import SpaceStorage
from unienv_data.base.indexing import normalize_index
from unienv_data.base.segments import SegmentLog
from unienv_data.base.values import LeafConverter
from unienv_data.testing import StorageConformance
from unienv_interface.backends.numpy import NumpyComputeBackend as NB
from unienv_interface.space import BoxSpace

META = "meta.json"


class RowFilesStorage(SpaceStorage):
    """One Box leaf; rows in `rows.npy` (rewritten on every set), length and segments in `meta.json`. Implements
    `flush()` and `on_segments_dropped()`, never `close()`."""

    def __init__(self, space: Any, directory: str, capacity: Optional[int], rows: np.ndarray, runs: Any = (),
                 read_only: bool = False) -> None:
        super().__init__(space)
        self._conv = LeafConverter(space, "value")
        self.directory, self._capacity, self.rows, self.read_only = directory, capacity, rows, read_only
        self.log = SegmentLog(capacity, runs)

    @classmethod
    def create(cls, space: Any, *args: Any, capacity: Optional[int] = None, cache_path: Any = None,
               **kwargs: Any) -> "RowFilesStorage":
        d = tempfile.mkdtemp() if cache_path is None else os.fspath(cache_path)
        os.makedirs(d, exist_ok=True)
        conv = LeafConverter(space, "value")
        st = cls(space, d, capacity, np.zeros((capacity or 0,) + tuple(conv.shape), conv.np_dtype))
        st._write(d)
        return st

    @classmethod
    def load_from(cls, path: Any, space: Any, *, capacity: Optional[int] = None, read_only: bool = True,
                  **kwargs: Any) -> "RowFilesStorage":
        d = os.fspath(path)
        with open(os.path.join(d, META)) as f:
            meta = json.load(f)
        rows = np.load(os.path.join(d, "rows.npy"))[:meta["length"]]
        log = SegmentLog.from_json(meta["segments"], meta["capacity"], meta["length"], d)
        return cls(space, d, meta["capacity"], rows, log.runs(), read_only=read_only)

    capacity = property(lambda self: self._capacity)
    is_mutable = property(lambda self: not self.read_only)
    cache_filename = property(lambda self: self.directory)

    def __len__(self) -> int:
        return len(self.rows)

    def segment_log(self) -> SegmentLog:
        return self.log

    def has_persistent_segments(self) -> bool:
        return True

    def prepare_element(self, value: Any) -> np.ndarray:
        return np.array(self._conv.convert(value), copy=True)

    def get(self, index: Any) -> np.ndarray:
        self.check_open()
        norm = normalize_index(index, len(self), type(self).__name__)
        return self.rows[norm.single if norm.single is not None else norm.numpy_key()].copy()

    def set(self, index: Any, value: Any) -> None:
        self.check_writable()
        norm = normalize_index(index, len(self), type(self).__name__)
        arr = np.array(self._conv.convert(value, norm.lead()), copy=True)
        if norm.single is not None:
            self.rows[norm.single] = arr
        else:
            for j, p in enumerate(norm.positions().tolist()):
                self.rows[p] = arr[j]
        np.save(os.path.join(self.directory, "rows.npy"), self.rows)

    def _write(self, d: str) -> None:
        np.save(os.path.join(d, "rows.npy"), self.rows)
        with open(os.path.join(d, META), "w") as f:
            json.dump({"capacity": self._capacity, "length": len(self), "segments": self.log.to_json()}, f)

    def flush(self) -> None:
        self.check_open()
        if self.is_mutable:
            self._write(self.directory)

    def on_segments_dropped(self) -> None:
        if self.is_mutable and not self.is_closed:
            self._write(self.directory)

    def dumps(self, path: Any) -> None:
        self.check_open()
        os.makedirs(os.fspath(path), exist_ok=True)
        self._write(os.fspath(path))

    def clear(self) -> None:
        super().clear()
        self.rows[...] = 0
        self.flush()

    def extend_length(self, length: int) -> None:
        if self._capacity is None:
            self.check_writable()
            self.rows = np.concatenate([self.rows, np.zeros((length,) + self.rows.shape[1:], self.rows.dtype)])

    def shrink_length(self, length: int) -> None:
        if not 0 <= length <= len(self):
            raise ValueError(f"shrink_length: expected 0..{len(self)}, got {length}")
        if self._capacity is None:
            self.check_writable()
            self.rows = self.rows[:len(self) - length].copy()
            self.after_shrink(len(self))


class TestRowFilesStorage(StorageConformance):
    supports_growable = True
    state_machine_examples = 3
    state_machine_steps = 10

    def make_space(self) -> Any:
        return BoxSpace(NB, -1.0, 1.0, np.float32, shape=(2,))

    def create(self, tmp_path: Any, capacity: Optional[int]) -> RowFilesStorage:
        return RowFilesStorage.create(self.space, capacity=capacity, cache_path=os.path.join(tmp_path, "rows"))

    def load(self, path: Any, read_only: bool) -> RowFilesStorage:
        return RowFilesStorage.load_from(path, self.space, read_only=read_only)


def _space() -> Any:
    return BoxSpace(NB, -1.0, 1.0, np.float32, shape=(2,))


def test_default_close_commits_a_growable_plugin_storage(tmp_path: Any) -> None:
    st = RowFilesStorage.create(_space(), capacity=None, cache_path=tmp_path / "d")
    st.extend_length(2)
    st.set(1, np.full(2, 0.5, np.float32))
    st.close()
    back = RowFilesStorage.load_from(tmp_path / "d", _space())
    assert len(back) == 2
    np.testing.assert_array_equal(back.get(1), np.full(2, 0.5, np.float32))


class _NoFlush(RowFilesStorage):
    def flush(self) -> None:      # as a storage that never implemented the hook
        pass


class _NoDropHook(RowFilesStorage):
    on_segments_dropped = SpaceStorage.on_segments_dropped


class _LegacyDropHook(RowFilesStorage):
    """Overrides the hook's former private name (and calls it on super(), as storages written against it did)."""
    calls = 0

    def _segments_dropped(self) -> None:
        super()._segments_dropped()
        type(self).calls += 1
        RowFilesStorage.on_segments_dropped(self)


def _kit_for(cls: Any) -> Any:
    class Kit(TestRowFilesStorage):
        def create(self, tmp_path: Any, capacity: Optional[int]) -> Any:
            return cls.create(self.space, capacity=capacity, cache_path=os.path.join(tmp_path, "rows"))
    return Kit()


def _run(kit: Any, name: str, tmp_path: Any) -> None:
    kit.setup_method(None)
    try:
        getattr(kit, name)(tmp_path)
    finally:
        kit.teardown_method(None)


def test_kit_names_flush_when_close_does_not_persist(tmp_path: Any) -> None:
    with pytest.raises(AssertionError, match=r"implement the `flush\(\)` hook"):
        _run(_kit_for(_NoFlush), "test_close_persists_without_dumps", tmp_path)


def test_kit_names_on_segments_dropped_when_drops_are_not_persisted(tmp_path: Any) -> None:
    with pytest.raises(AssertionError, match=r"on_segments_dropped\(\)"):
        _run(_kit_for(_NoDropHook), "test_dropped_segments_persisted_before_overwrite", tmp_path)


def test_the_former_private_drop_hook_is_still_called(tmp_path: Any) -> None:
    _run(_kit_for(_LegacyDropHook), "test_dropped_segments_persisted_before_overwrite", tmp_path)
    assert _LegacyDropHook.calls >= 1


class _ChecksItsDirectory(RowFilesStorage):
    """A plugin `create` that checks its directory itself, taking `overwrite` (as the author's did)."""

    @classmethod
    def create(cls, space: Any, *args: Any, capacity: Optional[int] = None, cache_path: Any = None,
               overwrite: bool = False, **kwargs: Any) -> "RowFilesStorage":
        if cache_path is not None and os.path.isdir(cache_path) and os.listdir(cache_path):
            if not overwrite:
                raise FileExistsError(f"{cache_path} already holds files; pass overwrite=True")
            for name in os.listdir(cache_path):
                os.remove(os.path.join(cache_path, name))
        return RowFilesStorage.create.__func__(cls, space, *args, capacity=capacity,  # type: ignore[attr-defined]
                                               cache_path=cache_path, **kwargs)


def test_replay_buffer_overwrite_reaches_a_plugin_create(tmp_path: Any) -> None:
    from unienv_data.replay_buffer import ReplayBuffer
    for _ in range(2):      # the second create replaces what the first wrote, plugin files included
        with ReplayBuffer.create(_ChecksItsDirectory, _space(), cache_path=tmp_path / "rb", capacity=None,
                                 overwrite=True) as rb:
            rb.append(np.zeros(2, np.float32))
            rb.mark_segment_end()
    with pytest.raises(FileExistsError, match="overwrite=True"):
        ReplayBuffer.create(_ChecksItsDirectory, _space(), cache_path=tmp_path / "rb", capacity=None)
    with pytest.raises(FileExistsError):
        _ChecksItsDirectory.create(_space(), capacity=None, cache_path=tmp_path / "rb" / "storage")


def test_the_create_helpers_are_public() -> None:
    from unienv_data.base import refuse_existing_dataset, replacing_allowed
    assert not replacing_allowed()
    assert callable(refuse_existing_dataset)


def test_kit_says_what_to_implement_for_shared_rows(tmp_path: Any) -> None:
    kit = _kit_for(RowFilesStorage)
    kit.shares_rows_when_pickled = True
    with pytest.raises(AssertionError, match="overrides the `is_multiprocessing_safe` property"):
        _run(kit, "test_pickled_copy_shares_rows", tmp_path)
