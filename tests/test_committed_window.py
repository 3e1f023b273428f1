"""The committed window of a buffer on disk (issue 13 point 8): before a row the directory shows is overwritten,
its metadata.json gives that row up (`ReplayBuffer._guard_committed_rows`, arithmetic in
`base.ring.window_before_overwrite`), so a kill while a row is half written (HDF5Storage writes one dataset per
field) never reopens with that row visible. Checked here on copies of the directory taken between steps (what a
SIGKILL leaves); tests/test_crash_trials.py kills real writers inside those writes."""
from __future__ import annotations

import os
import shutil
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from unienv_data.base.ring import run_inside, runs_not_inside_sorted, window_before_overwrite
from unienv_data.base.segments import SegmentLog
from unienv_data.replay_buffer import ReplayBuffer
from unienv_data.replay_buffer._buffer_log import BUFFER_LOG_FILE
from unienv_data.replay_buffer._metadata import read_metadata
from unienv_data.replay_buffer.replay_buffer import GUARD_SLACK_ROWS
from unienv_data.storages._commit_log import read_records
from unienv_data.storages.flattened import FlattenedStorage
from unienv_data.storages.numpy_memmap import NumpyMemmapStorage
from unienv_interface.backends import NumpyComputeBackend as NB
from unienv_interface.space import BoxSpace, DictSpace

SPACE = DictSpace(NB, {"eid": BoxSpace(NB, 0, 10 ** 6, np.int64, shape=()),
                       "t": BoxSpace(NB, 0, 10 ** 6, np.int64, shape=()),
                       "x": BoxSpace(NB, -1e9, 1e9, np.float32, shape=(3,))})


# ------------------------------------------------------------------------------------------------ ring arithmetic
def test_window_gives_up_the_oldest_rows_through_the_victim() -> None:
    # rows 5..14 of a ring of 16; the victim is the oldest row
    assert window_before_overwrite(5, 10, (5, 1), 16) == (6, 9)
    assert window_before_overwrite(5, 10, (5, 1), 16, slack=3) == (9, 6)
    # a victim the window does not show changes nothing
    assert window_before_overwrite(5, 10, (15, 1), 16, [(5, 3)], 4) == (5, 10)
    assert window_before_overwrite(5, 0, (5, 1), 16) == (5, 0)
    # the run the victim hits is given up whole; the slack stops where the next run starts
    assert window_before_overwrite(5, 10, (5, 1), 16, [(5, 3), (8, 4), (12, 3)], 8) == (8, 7)
    assert window_before_overwrite(5, 10, (6, 1), 16, [(5, 3), (10, 2)], 8) == (10, 5)
    # a full ring, runs wrapping past its end
    assert window_before_overwrite(10, 16, (10, 2), 16, [(10, 4), (14, 4), (2, 3)]) == (14, 12)
    assert window_before_overwrite(10, 16, (14, 1), 16, [(14, 4), (2, 3)]) == (2, 8)
    # everything overwritten
    assert window_before_overwrite(3, 16, (0, 16), 16, [(3, 5)], 4) == (3, 0)


def _model_window(offset: int, count: int, victim: Tuple[int, int], cap: Optional[int], runs: List[Tuple[int, int]],
                  slack: int) -> Tuple[int, int]:
    """The rule of `window_before_overwrite`, row by row: a ring gives up its logical rows up to the newest victim
    row it shows, then keeps giving up while the cut lies inside a run, then up to `slack` rows that start no run;
    a growable array keeps its rows before the victim's first row and before every run that reaches the cut."""
    def rows(run: Tuple[int, int]) -> List[int]:
        return [(run[0] + k) % cap if cap else run[0] + k for k in range(run[1])]
    if count <= 0 or victim[1] <= 0:
        return offset, count
    if cap is None:
        if victim[0] >= count:
            return 0, count
        new = victim[0]
        while any(s < new < s + n for s, n in runs):
            new = max(s for s, n in runs if s < new < s + n)
        return 0, new
    logical = {p: (p - offset) % cap for p in range(cap)}
    shown = [logical[p] for p in rows(victim) if logical[p] < count]
    if not shown:
        return offset, count
    cut = max(shown) + 1
    owner = {}          # logical row -> the run holding it
    for i, run in enumerate(runs):
        for p in rows(run):
            if logical[p] < count:
                owner[logical[p]] = i
    while cut < count and cut in owner and cut - 1 in owner and owner[cut] == owner[cut - 1]:
        cut += 1        # the cut lies inside a run: that run goes whole
    starts = {logical[r[0]] for r in runs} | {logical[p] for r in runs for p in rows(r)
                                               if logical[p] < count and logical[p] - 1 not in owner}
    k = 0
    while cut < count and k < slack and cut not in starts:
        cut, k = cut + 1, k + 1
    return (offset + cut) % cap, count - cut


@st.composite
def windows_on_a_ring(draw: st.DrawFn) -> Tuple[int, int, Tuple[int, int], Optional[int], List[Tuple[int, int]], int]:
    cap = draw(st.sampled_from([None, 4, 9, 16]))
    limit = cap if cap is not None else 20
    log = SegmentLog(cap)
    for _ in range(draw(st.integers(0, 6))):
        start = draw(st.integers(0, limit - 1))
        log.add(start, draw(st.integers(1, cap if cap is not None else limit - start)))
    offset = draw(st.integers(0, limit - 1)) if cap is not None else 0
    count = draw(st.integers(0, limit))
    vstart = draw(st.integers(0, limit - 1))
    victim = (vstart, draw(st.integers(1, cap if cap is not None else limit - vstart)))
    return offset, count, victim, cap, log.runs(), draw(st.integers(0, 5))


@settings(max_examples=500, deadline=None)
@given(windows_on_a_ring())
def test_window_sweep_agrees_with_the_row_by_row_rule(case: Any) -> None:
    offset, count, victim, cap, runs, slack = case
    expected = _model_window(offset, count, victim, cap, runs, slack)
    assert window_before_overwrite(offset, count, victim, cap, runs, slack) == expected
    assert window_before_overwrite(offset, count, victim, cap, sorted(runs), slack, presorted=True) == expected
    assert runs_not_inside_sorted(sorted(runs), offset, count, cap) == \
        [r for r in sorted(runs) if not run_inside(r, offset, count, cap)]


def test_run_inside_a_window() -> None:
    assert run_inside((5, 3), 5, 10, 16) and run_inside((12, 3), 5, 10, 16)
    assert not run_inside((13, 3), 5, 10, 16) and not run_inside((4, 2), 5, 10, 16)
    assert run_inside((14, 4), 10, 8, 16) and not run_inside((14, 4), 10, 7, 16)    # wrapping past the end
    assert run_inside((2, 3), 0, 5, None) and not run_inside((2, 4), 0, 5, None)


def test_growable_window_keeps_the_rows_before_the_victim() -> None:
    assert window_before_overwrite(0, 10, (10, 1), None) == (0, 10)
    assert window_before_overwrite(0, 10, (8, 3), None) == (0, 8)
    assert window_before_overwrite(0, 10, (8, 3), None, [(6, 4), (0, 6)]) == (0, 6)
    assert window_before_overwrite(0, 10, (0, 10), None) == (0, 0)


# ------------------------------------------------------------------------------------------------ the buffer
def _create(kind: str, path: str, cap: int, maintain: bool) -> ReplayBuffer:
    if kind == "h5":
        pytest.importorskip("h5py")
        from unienv_data.storages.hdf5 import HDF5Storage
        return ReplayBuffer.create(HDF5Storage, SPACE, cache_path=path, capacity=cap,
                                   maintain_segment_metadata=maintain)
    return ReplayBuffer.create(FlattenedStorage, SPACE, NumpyMemmapStorage, cache_path=path, capacity=cap,
                               maintain_segment_metadata=maintain)


def _row(eid: int, t: int) -> Dict[str, Any]:
    return {"eid": np.int64(eid), "t": np.int64(t), "x": np.array([eid, t, eid * 1000 + t], np.float32)}


def _reopen_copy(path: str, snap: str) -> Tuple[List[Tuple[int, int]], List[Tuple[int, int]]]:
    """(eid, t) of every row a copy of the directory shows, and its segments."""
    shutil.rmtree(snap, ignore_errors=True)
    shutil.copytree(path, snap)
    back = ReplayBuffer.load_from(snap, backend=NB)
    try:
        n = len(back)
        rows = back.get_at(np.arange(n)) if n else None
        segs = list(back.episode_segments() or [])
    finally:
        back.close()
    shown = [] if rows is None else list(zip(rows["eid"].tolist(), rows["t"].tolist()))
    if rows is not None:
        assert np.array_equal(rows["x"][:, 2], rows["eid"] * 1000 + rows["t"])   # no row mixes two writes
    return shown, segs


@pytest.mark.parametrize("kind", ["h5", "flat"])
@pytest.mark.parametrize("maintain", [True, False])
def test_a_wrapping_ring_never_shows_a_row_written_after_its_last_commit(tmp_path: Any, kind: str,
                                                                         maintain: bool) -> None:
    """After every append past the wrap, a copy of the directory shows only rows of ended episodes (never the
    open one's, whose writes replaced the oldest rows), lists them whole, and keeps every ended episode the open
    one has not reached."""
    path, snap = os.fspath(tmp_path / "rb"), os.fspath(tmp_path / "snap")
    cap = 16
    rb = _create(kind, path, cap, maintain)
    lengths = [3, 5, 2, 4, 1, 6, 3, 4, 2, 5, 3, 4]
    ended: List[Tuple[int, int]] = []       # (eid, n), oldest first
    written = 0
    for e, n in enumerate(lengths):
        for t in range(n):
            rb.append(_row(e, t))
            written += 1
            if written <= cap:
                continue
            shown, segs = _reopen_copy(path, snap)
            assert all(eid != e for eid, _t in shown), (e, t, shown)
            for s, end in segs:
                got = shown[s:end]
                eid = got[0][0]
                assert got == [(eid, k) for k in range(dict(ended)[eid])], (e, t, s, end, got)
            # the open episode overwrote its t + 1 newest-written rows; the ended episodes after those are listed
            room = cap - (t + 1)
            acc = 0
            listed = {shown[s][0] for s, _end in segs}
            for eid, m in reversed(ended):
                acc += m
                if acc > room:
                    break
                assert eid in listed, (e, t, eid, segs)
        rb.mark_segment_end()
        ended.append((e, n))
    rb.close()


@pytest.mark.parametrize("kind", ["h5", "flat"])
def test_one_state_record_per_overwritten_episode(tmp_path: Any, kind: str) -> None:
    """While a full ring is overwritten episode by episode, the directory gives up the oldest episode's rows once, at
    the episode's first row (one record appended to `buffer_commit.log`, metadata.json untouched), and the commit
    point restores the full window with one more record."""
    path = os.fspath(tmp_path / "rb")
    rb = _create(kind, path, 16, True)
    meta = os.path.join(path, "metadata.json")
    log = os.path.join(path, BUFFER_LOG_FILE)
    for e in range(4):                          # four episodes of 4 fill the ring exactly
        for t in range(4):
            rb.append(_row(e, t))
        rb.mark_segment_end()
    inode = os.stat(meta).st_ino
    for e in range(4, 8):
        records = set()
        for t in range(4):
            rb.append(_row(e, t))
            records.add(len(read_records(log)))
            on_disk = read_metadata(path)
            assert (on_disk["offset"], on_disk["count"]) == ((4 * (e - 3)) % 16, 12), (e, t, on_disk)
        assert len(records) == 1, (e, records)  # given up once, at the episode's first row
        rb.mark_segment_end()
        assert read_metadata(path)["count"] == 16  # the commit point restores the full window
    assert os.stat(meta).st_ino == inode        # every commit point and give-up was a record of the log
    rb.close()
    assert not os.path.exists(log) and read_metadata(path)["count"] == 16   # close folds the log into the file


def test_a_ring_without_episodes_gives_up_the_slack_at_a_time(tmp_path: Any) -> None:
    path = os.fspath(tmp_path / "rb")
    cap = 4 * GUARD_SLACK_ROWS
    rb = _create("flat", path, cap, False)
    for i in range(cap):
        rb.append(_row(0, i))
    rb.abort_segment()
    rb.flush()
    meta = os.path.join(path, "metadata.json")
    seen = []
    for i in range(2 * GUARD_SLACK_ROWS):
        rb.append(_row(1, i))
        on_disk = read_metadata(path)
        seen.append((on_disk["offset"], on_disk["count"]))
    step = GUARD_SLACK_ROWS + 1                 # the row written, and the slack after it
    assert sorted(set(seen)) == [(step, cap - step), (2 * step, cap - 2 * step)]
    shown, _segs = _reopen_copy(path, os.fspath(tmp_path / "snap"))
    assert shown == [(0, i) for i in range(2 * step, cap)]
    rb.close()


@pytest.mark.parametrize("kind", ["h5", "flat"])
def test_clear_gives_up_every_row_before_zeroing_them(tmp_path: Any, kind: str) -> None:
    path = os.fspath(tmp_path / "rb")
    rb = _create(kind, path, 8, True)
    for t in range(5):
        rb.append(_row(3, t))
    rb.mark_segment_end()
    rb.clear()
    shown, segs = _reopen_copy(path, os.fspath(tmp_path / "snap"))
    assert (shown, segs) == ([], [])
    rb.close()


def test_a_copy_in_memory_never_rewrites_the_directory(tmp_path: Any) -> None:
    path = os.fspath(tmp_path / "rb")
    rb = _create("flat", path, 8, True)
    for e in range(4):
        for t in range(2):
            rb.append(_row(e, t))
        rb.mark_segment_end()
    rb.close()
    meta = os.path.join(path, "metadata.json")
    before = open(meta).read()
    ram = ReplayBuffer.load_from(path, backend=NB, read_only=False, is_memmap=False)
    for t in range(3):
        ram.append(_row(9, t))
    assert open(meta).read() == before          # the directory's rows did not change: nothing to give up
    ram.abort_segment()
