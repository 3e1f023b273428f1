"""What `get_segments()` reports (unienv 0.0.1b16's rules) and what `episode_segments()` (this project's always-on
episode log) lists, on storages, wrappers and replay buffers; `dumps()` with an open episode; growable buffers
shared by several processes (NPZ rows are files: every process follows the growth under the buffer's lock).

The reference's own answers are pinned in tests/test_reference_semantics.py (run on both sides); here the same
rules are checked over every storage kind of this project, with real files and real processes.
"""
from __future__ import annotations

import json
import multiprocessing as mp
import os
from typing import Any, List

import numpy as np
import pytest

from unienv_data.base.errors import StorageStateError
from unienv_data.replay_buffer import ReplayBuffer
from unienv_data.samplers import SegmentSampler
from unienv_data.storages.dict_storage import DictStorage
from unienv_data.storages.flattened import FlattenedStorage
from unienv_data.storages.hdf5 import HDF5Storage
from unienv_data.storages.image_storage import ImageStorage
from unienv_data.storages.npz_storage import NPZStorage
from unienv_data.storages.numpy_memmap import NumpyMemmapStorage
from unienv_interface.backends import NumpyComputeBackend as NB
from unienv_interface.space import BoxSpace, DictSpace

VEC = BoxSpace(NB, -1e6, 1e6, np.float32, shape=(2,))
IMG = BoxSpace(NB, 0, 255, np.uint8, shape=(4, 4, 3))


def vec(i: float) -> np.ndarray:
    return np.full(2, i, np.float32)


def two_episodes(st: Any, value: Any) -> None:
    """Episodes of 3 rows at 0 and 2 rows at 3, built with mark_segment_start / append / mark_segment_end."""
    st.mark_segment_start(0)
    for i in range(3):
        st.append(value(i))
    st.mark_segment_end()
    st.mark_segment_start(3)
    for i in range(2):
        st.append(value(10 + i))
    st.mark_segment_end()


def storages(tmp_path: Any) -> List[Any]:
    return [
        ("memmap", NumpyMemmapStorage.create(VEC, capacity=8, cache_path=str(tmp_path / "mm")), vec),
        ("npz", NPZStorage.create(VEC, capacity=8, cache_path=str(tmp_path / "npz"), compressed=False), vec),
        ("hdf5", HDF5Storage.create(VEC, capacity=8, cache_path=str(tmp_path / "h5.h5")), vec),
        ("image", ImageStorage.create(IMG, capacity=8, cache_path=str(tmp_path / "img")),
         lambda i: np.full((4, 4, 3), int(i), np.uint8)),
        ("flattened", FlattenedStorage.create(DictSpace(NB, {"x": VEC}), NumpyMemmapStorage, capacity=8),
         lambda i: {"x": vec(i)}),
        ("dict", DictStorage.create(DictSpace(NB, {"a": VEC, "b": VEC}), {"a": NumpyMemmapStorage, "b": NPZStorage},
                                    capacity=8,
                                    cache_path=str(tmp_path / "dict")), lambda i: {"a": vec(i), "b": vec(-i)}),
    ]


def test_array_like_storages_report_none_and_record_their_episodes(tmp_path: Any) -> None:
    for name, st, value in storages(tmp_path):
        try:
            two_episodes(st, value)
            assert st.get_segments() is None, name           # as unienv 0.0.1b16
            assert not st.has_open_segment, name
            assert st.episode_segments() == [(0, 2), (3, 4)], name
        finally:
            st.close()


def test_wrappers_forward_both_methods(tmp_path: Any) -> None:
    st = FlattenedStorage.create(DictSpace(NB, {"x": VEC}), NPZStorage, capacity=None,
                                 cache_path=str(tmp_path / "flat"), compressed=False)
    two_episodes(st, lambda i: {"x": vec(i)})
    assert st.get_segments() is None and st.inner_storage.get_segments() is None
    assert st.episode_segments() == st.inner_storage.episode_segments() == [(0, 2), (3, 4)]
    st.close()


def test_buffer_without_maintained_segments_reports_the_storage_answer(tmp_path: Any) -> None:
    d = tmp_path / "rb"
    rb = ReplayBuffer.create(NPZStorage, VEC, cache_path=str(d), capacity=None, compressed=False)
    for n in (3, 2):
        for i in range(n):
            rb.append(vec(i))
        rb.mark_segment_end()
    rb.extend(np.zeros((2, 2), np.float32))
    assert rb.get_segments() is None
    assert rb.episode_segments() == [(0, 3), (3, 5)]
    # the episode-aware samplers read episode_segments(): two whole episodes, never the extended rows
    ranges = SegmentSampler(rb, batch_size=64, seed=0).sample_segments()
    assert {tuple(r) for r in ranges.tolist()} == {(0, 3), (3, 5)}
    rb.dumps()
    meta = json.loads((d / "metadata.json").read_text())
    assert meta["physical_segments"] is None and meta["maintain_segment_metadata"] is False
    rb.close()
    again = ReplayBuffer.load_from(str(d), backend=NB)
    assert again.get_segments() is None and again.episode_segments() == [(0, 3), (3, 5)] and len(again) == 7
    again.close()


def test_buffer_with_maintained_segments_lists_them_in_both(tmp_path: Any) -> None:
    d = tmp_path / "rb"
    rb = ReplayBuffer.create(NPZStorage, VEC, cache_path=str(d), capacity=None, compressed=False,
                             maintain_segment_metadata=True)
    rb.extend(np.zeros((2, 2), np.float32))
    for i in range(3):
        rb.append(vec(i))
    rb.mark_segment_end()
    assert rb.get_segments() == rb.episode_segments() == [(0, 2), (2, 5)]
    rb.dumps()
    assert json.loads((d / "metadata.json").read_text())["physical_segments"] == [[0, 1], [2, 4]]
    rb.close()


def test_dumps_with_an_open_episode_and_no_segment_metadata_writes_its_rows(tmp_path: Any) -> None:
    d = tmp_path / "rb"               # reference-api.md section 7 item 25: a periodic checkpoint must not need the end
    rb = ReplayBuffer.create(NPZStorage, VEC, cache_path=str(d), capacity=None, compressed=False)
    rb.append(vec(1))
    rb.append(vec(2))
    rb.dumps()
    rb.dumps(str(tmp_path / "elsewhere"))
    for where in (d, tmp_path / "elsewhere"):
        seen = ReplayBuffer.load_from(str(where), backend=NB)
        assert seen.get_at(slice(None))[:, 0].tolist() == [1.0, 2.0] and seen.episode_segments() == []
        seen.close()
    rb.append(vec(3))
    rb.mark_segment_end()             # the episode is recorded when it ends
    rb.close()
    again = ReplayBuffer.load_from(str(d), backend=NB)
    assert again.episode_segments() == [(0, 3)] and again.get_at(slice(None))[:, 0].tolist() == [1.0, 2.0, 3.0]
    again.close()


def test_dumps_with_segment_metadata_refuses_an_open_episode(tmp_path: Any) -> None:
    d = tmp_path / "rb"
    rb = ReplayBuffer.create(NPZStorage, VEC, cache_path=str(d), capacity=None, compressed=False,
                             maintain_segment_metadata=True)
    rb.append(vec(1))
    rb.append(vec(2))
    with pytest.raises(RuntimeError, match="mark_segment_end"):
        rb.dumps()
    with pytest.raises(StorageStateError):      # also a ValueError subclass: the project's error family
        rb.dumps(str(tmp_path / "elsewhere"))
    assert not (tmp_path / "elsewhere").exists()
    rb.mark_segment_end()
    rb.dumps()
    rb.close()
    again = ReplayBuffer.load_from(str(d), backend=NB)
    assert again.episode_segments() == [(0, 2)] and again.get_at(slice(None))[:, 0].tolist() == [1.0, 2.0]
    again.close()


def _writer(rb: ReplayBuffer, k: int) -> None:
    for e in range(3):
        for t in range(4):
            rb.append(np.array([100 * k + 10 * e + t, k], np.float32))
        rb.mark_segment_end()


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_growable_shared_npz_buffer_keeps_every_row(tmp_path: Any, method: str) -> None:
    """Two processes grow a shared growable NPZ buffer while the parent holds it: every row of every episode is
    readable in the parent afterwards, each episode contiguous, and a reopened directory holds them all."""
    d = tmp_path / "rb"
    rb = ReplayBuffer.create(NPZStorage, VEC, cache_path=str(d), capacity=None, compressed=False,
                             multiprocessing=True)
    assert rb.is_multiprocessing_safe and not rb.maintain_segment_metadata
    for t in range(2):
        rb.append(np.array([t, 0], np.float32))
    rb.mark_segment_end()
    ctx = mp.get_context(method)
    procs = [ctx.Process(target=_writer, args=(rb, k)) for k in (1, 2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert len(rb) == 2 + 2 * 3 * 4
    rows = rb.get_at(slice(None))
    expected = {(t, 0) for t in range(2)} | {(100 * k + 10 * e + t, k) for k in (1, 2) for e in range(3)
                                              for t in range(4)}
    assert {(int(a), int(b)) for a, b in rows.tolist()} == expected
    segs = rb.episode_segments()
    assert segs is not None and len(segs) == 7
    for s, e in segs:                       # every episode contiguous and written by one process, in order
        ids = rows[s:e]
        assert len(set(ids[:, 1].tolist())) == 1 and np.all(np.diff(ids[:, 0]) == 1)
    rb.close()
    again = ReplayBuffer.load_from(str(d), backend=NB)
    assert len(again) == 26 and again.episode_segments() == segs
    assert {(int(a), int(b)) for a, b in again.get_at(slice(None)).tolist()} == expected
    again.close()


def test_growable_shared_buffer_over_a_memory_map_is_refused(tmp_path: Any) -> None:
    with pytest.raises(ValueError, match="NumpyMemmapStorage"):
        ReplayBuffer.create(NumpyMemmapStorage, VEC, cache_path=str(tmp_path / "rb"), capacity=None,
                            multiprocessing=True)
    assert ReplayBuffer.create(NumpyMemmapStorage, VEC, cache_path=str(tmp_path / "rb2"), capacity=4,
                               multiprocessing=True).is_multiprocessing_safe


def test_a_storage_that_cannot_follow_growth_says_so(tmp_path: Any) -> None:
    st = NumpyMemmapStorage.create(VEC, capacity=None, cache_path=str(tmp_path / "mm"))
    with pytest.raises(StorageStateError, match="another process"):
        st.follow_length(4, True)
    st.close()


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_appends_are_readable_at_once_until_the_buffer_goes_to_another_process(tmp_path: Any, method: str) -> None:
    """As in unienv 0.0.1b16, an append to a shared buffer is readable at once while no other process has it. An
    episode open when the buffer is handed to a process moves into a private writer (the count steps back over its
    rows) and is written whole, still contiguous, when it ends; no row is lost."""
    rb = ReplayBuffer.create(NPZStorage, VEC, cache_path=str(tmp_path / "rb"), capacity=None, compressed=False,
                             multiprocessing=True)
    rb.append(np.array([0, 0], np.float32))
    rb.append(np.array([1, 0], np.float32))
    assert len(rb) == 2 and rb.get_at(1).tolist() == [1.0, 0.0] and rb.open_segment_length == 2
    rb.dumps()                              # the open rows are written; the episode is recorded when it ends
    p = mp.get_context(method).Process(target=_writer, args=(rb, 1))
    p.start()                               # the buffer goes to the child: the open episode turns private
    p.join(60)
    assert p.exitcode == 0
    rb.append(np.array([2, 0], np.float32))
    assert rb.pending_segment_length == 3   # kept by this process until it ends
    rb.mark_segment_end()
    assert len(rb) == 3 + 12
    rows = rb.get_at(slice(None))
    segs = rb.episode_segments()
    assert segs is not None and len(segs) == 4
    mine = [(s, e) for s, e in segs if rows[s, 1] == 0]
    assert len(mine) == 1 and rows[mine[0][0]:mine[0][1], 0].tolist() == [0.0, 1.0, 2.0]
    rb.dumps()
    rb.close()
