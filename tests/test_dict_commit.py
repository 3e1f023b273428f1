"""A DictStorage segment-writer commit is all or nothing (issue 14): a child that fails while preparing or while
publishing leaves no child holding the segment, and the writer can be committed again or aborted in the same
process. The failure is real: a small memory-mapped child storage whose writer raises OSError(ENOSPC) in its
prepare / publish hook while a flag is set (as a second camera's encoder on a full disk would)."""
from __future__ import annotations

import errno
import os
import sys
from typing import Any, Dict, List

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))

from unienv_data.base import StorageStateError, register_storage  # noqa: E402
from unienv_data.base.segment_writer import BufferedSegmentWriter  # noqa: E402
from unienv_data.storages.dict_storage import DictStorage  # noqa: E402
from unienv_data.storages.numpy_memmap import NumpyMemmapStorage  # noqa: E402
from unienv_interface.backends import NumpyComputeBackend as NB  # noqa: E402
from unienv_interface.space import BoxSpace, DictSpace  # noqa: E402

#: which hook of FailingStorage's writer raises next: "prepare", "publish" or None
FAIL: Dict[str, Any] = {"at": None}


class _FailingWriter(BufferedSegmentWriter):
    def _prepare(self, start: int) -> None:
        super()._prepare(start)     # the rows are written (and the storage grown) before the disk "fills up"
        if FAIL["at"] == "prepare":
            raise OSError(errno.ENOSPC, "No space left on device (injected)")

    def _publish(self, start: int) -> None:
        super()._publish(start)
        if FAIL["at"] == "publish":
            raise OSError(errno.ENOSPC, "No space left on device (injected)")


@register_storage
class FailingStorage(NumpyMemmapStorage):
    """A memory-mapped storage whose segment writer fails on demand (see FAIL)."""

    def open_segment_writer(self) -> BufferedSegmentWriter:
        self.check_writable()
        return _FailingWriter(self)


def _space() -> DictSpace:
    return DictSpace(NB, {"a": BoxSpace(NB, -10, 10, np.float32, shape=(2,)),
                          "z_cam": BoxSpace(NB, 0, 255, np.uint8, shape=(4, 4, 3))})


def _episode(eid: int, n: int) -> List[Dict[str, np.ndarray]]:
    return [{"a": np.full(2, eid + t / 100, np.float32), "z_cam": np.full((4, 4, 3), eid * 10 + t, np.uint8)}
            for t in range(n)]


def _create(path: str, capacity: Any) -> DictStorage:
    # "z_cam" routes after "a": the failing child is the second one written
    return DictStorage.create(_space(), {"a": NumpyMemmapStorage, "z_cam": FailingStorage}, capacity=capacity,
                              cache_path=path)


@pytest.fixture(autouse=True)
def _reset() -> Any:
    FAIL["at"] = None
    yield
    FAIL["at"] = None


def _writer(st: DictStorage, eid: int, n: int) -> Any:
    w = st.open_segment_writer()
    for step in _episode(eid, n):
        w.append(step)
    return w


def _assert_rows(st: DictStorage, start: int, eid: int, n: int) -> None:
    got = st.get(slice(start, start + n))
    want = _episode(eid, n)
    np.testing.assert_array_equal(got["a"], np.stack([s["a"] for s in want]))
    np.testing.assert_array_equal(got["z_cam"], np.stack([s["z_cam"] for s in want]))


@pytest.mark.parametrize("capacity", [None, 20])
@pytest.mark.parametrize("phase", ["prepare", "publish"])
def test_failed_child_commit_rolls_back_and_retry_works(tmp_path: Any, capacity: Any, phase: str) -> None:
    path = str(tmp_path / "ds")
    st = _create(path, capacity)
    w0 = _writer(st, 0, 5)
    w0.commit(0)
    length_before = len(st)
    w = _writer(st, 1, 4)
    FAIL["at"] = phase
    with pytest.raises(OSError, match="No space left"):
        w.commit(5)
    # no child keeps the segment; they agree; the growable storage did not keep the rows
    assert st.episode_segments() == [(0, 4)]
    for key, child in st.storages.items():
        assert child.episode_segments() == [(0, 4)], key
    assert len(st) == length_before
    assert w.state == "finished"
    # retry in the same process
    FAIL["at"] = None
    w.commit(5)
    assert st.episode_segments() == [(0, 4), (5, 8)]
    _assert_rows(st, 5, 1, 4)
    _assert_rows(st, 0, 0, 5)
    st.close()
    again = DictStorage.load_from(path, _space())
    assert again.episode_segments() == [(0, 4), (5, 8)]
    _assert_rows(again, 5, 1, 4)
    again.close()


def test_failed_commit_then_abort_leaves_storage_usable(tmp_path: Any) -> None:
    path = str(tmp_path / "ds")
    st = _create(path, None)
    _writer(st, 0, 3).commit(0)
    w = _writer(st, 1, 4)
    FAIL["at"] = "prepare"
    with pytest.raises(OSError):
        w.commit(3)
    w.abort()
    assert w.state == "aborted"
    with pytest.raises(StorageStateError, match="already aborted"):
        w.commit(3)
    FAIL["at"] = None
    assert len(st) == 3 and st.episode_segments() == [(0, 2)]
    _writer(st, 2, 2).commit(3)           # the storage goes on as if the failed episode never happened
    assert st.episode_segments() == [(0, 2), (3, 4)]
    _assert_rows(st, 3, 2, 2)
    st.close()
    again = DictStorage.load_from(path, _space())
    assert len(again) == 5 and again.episode_segments() == [(0, 2), (3, 4)]
    again.close()


def test_failed_ring_overwrite_keeps_children_agreeing(tmp_path: Any) -> None:
    """On a full ring a failed commit has overwritten rows in the first child: the old segment those rows held is
    clipped to its other rows in every child (not only in some), and the others stay listed."""
    st = _create(str(tmp_path / "ds"), 10)
    _writer(st, 0, 5).commit(0)
    _writer(st, 1, 5).commit(5)
    w = _writer(st, 2, 3)
    FAIL["at"] = "prepare"
    with pytest.raises(OSError):
        w.commit(0)
    assert st.episode_segments() == [(3, 4), (5, 9)]
    assert all(c.episode_segments() == [(3, 4), (5, 9)] for c in st.storages.values())
    FAIL["at"] = None
    w.commit(0)
    assert st.episode_segments() == [(0, 2), (3, 4), (5, 9)]
    _assert_rows(st, 0, 2, 3)
    st.close()


def test_dumps_writes_the_dump_marker_protocol(tmp_path: Any) -> None:
    """A DictStorage dump into another directory is a transaction: a dump killed halfway is refused on load."""
    from unienv_data.base.files import dump_transaction
    st = _create(str(tmp_path / "ds"), None)
    _writer(st, 0, 3).commit(0)
    out = str(tmp_path / "copy")
    st.dumps(out)
    again = DictStorage.load_from(out, _space())
    assert again.episode_segments() == [(0, 2)]
    again.close()
    # a dump interrupted inside the transaction leaves the marker behind: loading refuses it
    with pytest.raises(RuntimeError):
        with dump_transaction(out, directory=True):
            raise RuntimeError("killed")
    with pytest.raises(Exception, match="(?i)dump|interrupted|incomplete"):
        DictStorage.load_from(out, _space())
    st.close()


def test_video_child_keeps_its_finished_file_for_the_retry(tmp_path: Any) -> None:
    """The camera child (VideoStorage) finished its file in the prepare; the next child fails: nothing is placed,
    the hidden file is kept for the retry, which commits both; abort would delete it."""
    pytest.importorskip("av")
    from unienv_data.storages.video_storage import VideoStorage
    path = str(tmp_path / "ds")
    space = DictSpace(NB, {"a_cam": BoxSpace(NB, 0, 255, np.uint8, shape=(16, 16, 3)),
                           "b": BoxSpace(NB, -10, 10, np.float32, shape=(2,))})
    st = DictStorage.create(space, {"a_cam": VideoStorage, "b": FailingStorage}, capacity=None, cache_path=path,
                            key_kwargs={"a_cam": {"lossless": True}})
    frames = [np.full((16, 16, 3), 40 * t, np.uint8) for t in range(3)]
    w = st.open_segment_writer()
    for t in range(3):
        w.append({"a_cam": frames[t], "b": np.full(2, t, np.float32)})
    FAIL["at"] = "prepare"
    video_dir = os.path.join(path, st.storage_paths["a_cam"])
    with pytest.raises(OSError):
        w.commit(0)
    assert st.episode_segments() is None or st.episode_segments() == []
    assert len(st) == 0
    FAIL["at"] = None
    w.commit(0)
    assert st.episode_segments() == [(0, 2)]
    np.testing.assert_array_equal(st.get(slice(0, 3))["a_cam"], np.stack(frames))
    st.close()
    again = DictStorage.load_from(path, space)
    assert again.episode_segments() == [(0, 2)]
    np.testing.assert_array_equal(again.get(slice(0, 3))["a_cam"], np.stack(frames))
    again.close()
    # and an abort after a failed commit deletes the finished file
    st = DictStorage.load_from(path, space, read_only=False)
    committed_files = set(os.listdir(video_dir))
    w = st.open_segment_writer()
    w.append({"a_cam": frames[0], "b": np.zeros(2, np.float32)})
    FAIL["at"] = "prepare"
    with pytest.raises(OSError):
        w.commit(3)
    FAIL["at"] = None
    w.abort()
    assert set(os.listdir(video_dir)) == committed_files      # the finished hidden file is gone
    assert st.episode_segments() == [(0, 2)] and len(st) == 3
    st.close()


# ---------------------------------------------------------------------------------------------------- commit log
def _record_and_die(path: str, episodes: int, torn_tail: bool = False) -> None:
    """In a forked process: records `episodes` append-built episodes (durable commit points), then exits at once
    (os._exit: no close, no flush), as a SIGKILL right after the last commit point would."""
    pid = os.fork()
    if pid == 0:
        try:
            st = DictStorage.create(_space(), {"a": NumpyMemmapStorage, "z_cam": NumpyMemmapStorage},
                                    capacity=None, cache_path=path)
            pos = 0
            for e in range(episodes):
                st.mark_segment_start(pos)
                for step in _episode(e, 3 + e):
                    st.append(step)
                st.mark_segment_end()
                pos += 3 + e
            if torn_tail:       # a record being appended when the process died
                with open(os.path.join(path, "dict_commit.log"), "ab") as f:
                    f.write(b'0badc0de {"t":"add","len":999')
        finally:
            os._exit(0)
    os.waitpid(pid, 0)


@pytest.mark.parametrize("torn_tail", [False, True])
def test_commit_log_is_the_commit_point(tmp_path: Any, torn_tail: bool) -> None:
    """Children that keep only a length and a segment list do not rewrite their metadata per commit: the one
    commit-log record does, and a reopen after a kill (read-only and writable) sees every committed episode."""
    import json
    path = str(tmp_path / "ds")
    _record_and_die(path, 3, torn_tail)
    with open(os.path.join(path, "a.memmap.meta.json")) as f:
        assert json.load(f)["length"] == 0             # the child's own file was not rewritten per commit
    with open(os.path.join(path, "dict_commit.log"), "rb") as f:
        assert len(f.read().splitlines()) == 4 + torn_tail      # base + one record per episode
    want = [(0, 2), (3, 6), (7, 11)]
    for read_only in (True, False):
        st = DictStorage.load_from(path, _space(), read_only=read_only)
        assert len(st) == 12 and st.episode_segments() == want
        for e, (s, _end) in enumerate(want):
            _assert_rows(st, s, e, 3 + e)
        if not read_only:       # recording goes on; close() writes every child's own file and compacts the log
            st.mark_segment_start(12)
            for step in _episode(3, 2):
                st.append(step)
            st.mark_segment_end()
        st.close()
    with open(os.path.join(path, "a.memmap.meta.json")) as f:
        meta = json.load(f)
    assert meta["length"] == 14 and meta["segments"] == [[0, 3], [3, 4], [7, 5], [12, 2]]
    with open(os.path.join(path, "dict_commit.log"), "rb") as f:
        assert len(f.read().splitlines()) == 1
    st = DictStorage.load_from(path, _space())
    assert st.episode_segments() == want + [(12, 13)]
    _assert_rows(st, 12, 3, 2)
    st.close()


def test_commit_log_records_dropped_segments_before_rows_are_overwritten(tmp_path: Any) -> None:
    """A ring overwriting an old episode: the shorter segment list is in the log before any child's row changes,
    so a kill after the rows were written (before the commit record) lists no overwritten episode."""
    path = str(tmp_path / "ds")
    st = DictStorage.create(_space(), {"a": NumpyMemmapStorage, "z_cam": NumpyMemmapStorage}, capacity=8,
                            cache_path=path)
    for e, start in ((0, 0), (1, 4)):
        w = _writer(st, e, 4)
        w.commit(start)
    w = _writer(st, 2, 3)
    w.prepare_commit(0)             # rows written in every child, nothing recorded: a kill here
    with open(os.path.join(path, "dict_commit.log"), "rb") as f:
        lines = f.read().splitlines()
    assert b'"t":"cut","len":8,"run":[0,3]' in lines[-1]     # the drop, as the rows cut (one short line)
    again = DictStorage.load_from(path, _space())
    assert again.episode_segments() == [(3, 3), (4, 7)]       # episode 0 clipped to its row that was not overwritten
    again.close()
    w.rollback_commit()
    st.close()


def test_verify_reports_visible_rows_outside_every_episode(tmp_path: Any) -> None:
    """`unienv-data verify` names the visible rows of a buffer that belong to no episode (an interrupted commit
    leaves such rows, possibly mixing two episodes' values)."""
    from unienv_data.cli.verify import verify
    from unienv_data.replay_buffer import ReplayBuffer
    from unienv_data.storages.native_layout import native_layout_kwargs
    path = str(tmp_path / "rb")
    rb = ReplayBuffer.create(DictStorage, _space(), cache_path=path, capacity=None, **native_layout_kwargs(_space()))
    for step in _episode(0, 3):
        rb.append(step)
    rb.mark_segment_end()
    for step in _episode(1, 2):
        rb.append(step)
    rb.dumps()              # the open episode's rows are saved, but it is not an episode
    report = verify(path)
    assert report["checked"]["rows_outside_episodes"] == 2
    assert any("2 of 5 visible rows belong to no episode (rows 3..4)" in w for w in report["warnings"])
    rb.abort_segment()
    rb.close()
