"""`first_overlap` (the O(n log n) check that stored segment lists do not overlap) against the pairwise model, and
a SegmentLog built from stored runs equals one built run by run."""
from __future__ import annotations

import itertools
from typing import List, Optional, Tuple

from hypothesis import given, settings
from hypothesis import strategies as st

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
