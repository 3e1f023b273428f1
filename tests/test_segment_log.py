"""`first_overlap` (the O(n log n) check that stored segment lists do not overlap) against the pairwise model, a
SegmentLog built from stored runs equals one built run by run, and the indexed SegmentLog against the plain model
(every operation on a list of runs, clipped run by run with `clip_runs`)."""
from __future__ import annotations

import itertools
from typing import List, Optional, Tuple

from hypothesis import given, settings
from hypothesis import strategies as st

from unienv_data.base.ring import clip_runs, inclusive_end
from unienv_data.base.segments import SegmentLog, first_overlap, ring_positions_overlap


@st.composite
def runs_on_a_ring(draw: st.DrawFn) -> Tuple[Optional[int], List[Tuple[int, int]]]:
    cap = draw(st.sampled_from([None, 1, 5, 8, 13]))
    limit = cap if cap is not None else 30
    runs = []
    for _ in range(draw(st.integers(0, 7))):
        start = draw(st.integers(0, limit - 1))
        most = cap if cap is not None else limit - start
        runs.append((start, draw(st.integers(1, most))))
    return cap, runs


@settings(max_examples=400, deadline=None)
@given(runs_on_a_ring())
def test_first_overlap_agrees_with_pairwise_check(case: Tuple[Optional[int], List[Tuple[int, int]]]) -> None:
    cap, runs = case
    pairwise = [(i, j) for i, j in itertools.combinations(range(len(runs)), 2)
                if ring_positions_overlap(runs[i], runs[j], cap)]
    found = first_overlap(runs, cap)
    assert (found is None) == (not pairwise)
    if found is not None:
        assert found in pairwise


@settings(max_examples=200, deadline=None)
@given(runs_on_a_ring())
def test_log_from_stored_runs_equals_log_built_run_by_run(case: Tuple[Optional[int], List[Tuple[int, int]]]) -> None:
    cap, runs = case
    one_by_one = SegmentLog(cap)
    for s, n in runs:
        one_by_one.add(s, n)
    assert SegmentLog(cap, runs).runs() == one_by_one.runs()


@st.composite
def operations_on_a_ring(draw: st.DrawFn) -> Tuple[Optional[int], List[Tuple[str, int, int]]]:
    cap = draw(st.sampled_from([None, 1, 2, 5, 8, 13]))
    limit = cap if cap is not None else 30
    ops = []
    for _ in range(draw(st.integers(0, 40))):
        kind = draw(st.sampled_from(["add", "add", "add", "drop", "truncate", "clear"]))
        start = draw(st.integers(0, limit - 1))
        most = cap if cap is not None else limit - start
        ops.append((kind, start, draw(st.integers(1, most))))
    return cap, ops


def _model_rows_before_next_start(runs: List[Tuple[int, int]], row: int, cap: Optional[int]) -> int:
    best = 1 << 62
    for s, _n in runs:
        d = (s - row) % cap if cap else (s - row if s >= row else 1 << 62)
        best = min(best, d)
    return best


@settings(max_examples=400, deadline=None)
@given(operations_on_a_ring())
def test_indexed_log_agrees_with_the_plain_model(case: Tuple[Optional[int], List[Tuple[str, int, int]]]) -> None:
    cap, ops = case
    log, model = SegmentLog(cap), []      # type: ignore[var-annotated]
    limit = cap if cap is not None else 30
    for kind, start, n in ops:
        before, pbefore = log.version, log.pstate
        if kind == "add":
            log.add(start, n)
            model = clip_runs(model, (start, n), cap) + [(start, n)]
            assert log.ops_since(pbefore) == [("add", start, n)]
        elif kind == "drop":
            expected = clip_runs(model, (start, n), cap)
            log.drop_overlapping(start, n)
            assert (log.version != before) == (expected != model)
            model = expected
        elif kind == "truncate" and cap is None:
            log.truncate(start)
            model = [(s, m) for s, m in model if s + m <= start]
        elif kind == "clear":
            log.clear()
            model = []
        assert log.runs() == model
        assert log.to_json() == [list(r) for r in model]
        assert log.sorted_runs() == sorted(model)
        assert log.sorted_inclusive() == sorted((s, inclusive_end(s, m, cap)) for s, m in model)
        for row in range(limit):
            holding = [r for r in model if ring_positions_overlap(r, (row, 1), cap)]
            assert log.run_at(row) == (holding[0] if holding else None)
            assert log.rows_before_next_start(row) == _model_rows_before_next_start(model, row, cap)
        assert log.overlapping(start, n) == sorted(r for r in model if ring_positions_overlap(r, (start, n), cap))
        if kind == "drop" and log.version != before:
            assert log.ops_since(pbefore) == [("cut", start, n)]
        if kind in ("truncate", "clear") and log.version != before:
            assert log.ops_since(pbefore) is None


@st.composite
def appends_and_writers(draw: st.DrawFn) -> Tuple[Optional[int], List[Tuple[str, int, int]]]:
    cap = draw(st.sampled_from([None, 3, 8, 13]))
    limit = cap if cap is not None else 30
    ops = []
    for _ in range(draw(st.integers(0, 60))):
        kind = draw(st.sampled_from(["add", "add", "drop", "eat", "eat", "eat", "eat", "stop", "truncate"]))
        start = draw(st.integers(0, limit - 1))
        most = cap if cap is not None else limit - start
        ops.append((kind, start, draw(st.integers(1, most))))
    return cap, ops


@settings(max_examples=400, deadline=None)
@given(appends_and_writers())
def test_journal_ops_replay_every_persisted_list(case: Tuple[Optional[int], List[Tuple[str, int, int]]]) -> None:
    """What a commit log relies on: for any earlier state, the ops `ops_since` gives (when it gives any), replayed
    on the list persisted then, give the list persisted now, through appends eating runs row by row (`eat`),
    episodes ending (`stop_eating`), writer commits and drops."""
    cap, ops = case
    log = SegmentLog(cap)
    snapshots = [(log.pstate, log.to_json())]
    row = 0
    for kind, start, n in ops:
        if kind == "add":
            log.stop_eating()
            log.add(start, n)
        elif kind == "drop":
            log.drop_overlapping(start, n)
        elif kind == "eat":             # the next append-built row, as an open segment writes them
            log.eat(row)
            row = row + 1 if cap is None else (row + 1) % cap
        elif kind == "stop":
            log.stop_eating()
            row = start
        elif kind == "truncate" and cap is None:
            log.truncate(start)
        snapshots.append((log.pstate, log.to_json()))
        eaten = log.eaten
        assert log.to_json() == [list(r) for r in log.runs() if r != eaten]
    now = log.to_json()
    for pstate, persisted in snapshots:
        replay_ops = log.ops_since(pstate)
        if replay_ops is None:
            continue
        replay = SegmentLog(cap, [(s, n) for s, n in persisted])
        for op in replay_ops:
            replay.apply_op(op)
        assert replay.to_json() == now, (pstate, persisted, replay_ops)
