"""Samplers on real replay buffers: `SliceSampler` (windows inside one episode, across the ring seam),
`SegmentSampler` (whole episodes, uniform or length-weighted) and `PrioritizedSampler` (sum tree against brute force,
importance weights, priorities that follow their samples when the ring overwrites rows).

Non-uniform sampling is checked statistically: a chi-square statistic over many draws (fixed seeds) must stay
below the 0.9995 quantile of its distribution (Wilson-Hilferty approximation).
"""
from __future__ import annotations

from collections import Counter
from typing import Any, Dict, List, Optional

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from unienv_data.batches import FrameStackedBatch
from unienv_data.replay_buffer import ReplayBuffer
from unienv_data.samplers.prioritized import PrioritizedSampler, SumTree
from unienv_data.samplers.segment_sampler import SegmentSampler
from unienv_data.samplers.slice_sampler import SliceSampler
from unienv_data.storages.flattened import FlattenedStorage
from unienv_data.storages.numpy_memmap import NumpyMemmapStorage
from unienv_interface.backends import NumpyComputeBackend
from unienv_interface.space import BoxSpace, DictSpace

from test_batches import ArrayBatch, Recorded, oracle_windows, to_np  # noqa: E402

torch = pytest.importorskip("torch")


def chi2_ok(observed: np.ndarray, probs: np.ndarray) -> float:
    """Asserts the counts fit the probabilities (zero-probability bins must be empty); returns the statistic."""
    observed = np.asarray(observed, dtype=np.float64)
    probs = np.asarray(probs, dtype=np.float64)
    n = observed.sum()
    zero = probs == 0
    assert observed[zero].sum() == 0, "a zero-probability outcome was drawn"
    exp = probs[~zero] * n
    assert exp.min() >= 5, "too few draws for a chi-square test"
    stat = float(((observed[~zero] - exp) ** 2 / exp).sum())
    df = int((~zero).sum()) - 1
    z = 3.29                                   # one-sided 0.9995 normal quantile
    crit = df * (1 - 2 / (9 * df) + z * np.sqrt(2 / (9 * df))) ** 3
    assert stat < crit, f"chi-square {stat:.1f} exceeds {crit:.1f} (df={df})"
    return stat


def window_starts_oracle(eps: np.ndarray, T: int) -> np.ndarray:
    n = eps.shape[0]
    return np.array([s for s in range(n - T + 1) if (eps[s:s + T] == eps[s]).all()], dtype=np.int64)


# ---------------------------------------------------------------------------------------------- SliceSampler
@pytest.mark.parametrize("backend", ["torch", "numpy"])
def test_slice_windows_stay_inside_one_episode_across_the_seam(backend: str) -> None:
    rec = Recorded(backend, 40, [9, 4, 12, 7, 15, 6], open_tail=5)   # 58 rows into 40: wrapped, remnant, open tail
    rb = rec.rb
    T = 5
    sampler = SliceSampler(rb, 64, T, seed=3)
    expected = window_starts_oracle(rec.eps, T)
    np.testing.assert_array_equal(np.sort(sampler.all_starts()), expected)
    assert sampler.num_windows() == expected.size
    seam = (rb.capacity - rb.offset) % rb.capacity
    crossing = [s for s in expected if s < seam < s + T]
    assert crossing, "some window must cross the physical seam"
    seen = set()
    for _ in range(30):
        data, meta = sampler.sample_with_metadata()
        mask = to_np(rec.B, meta["slice_valid_mask"])
        assert mask.shape == (64, T) and mask.all()
        eps, ts = to_np(rec.B, data["ep"]), to_np(rec.B, data["t"])
        assert (eps == eps[:, :1]).all()
        assert (np.diff(ts, axis=1) == 1).all()
        np.testing.assert_array_equal(ts[:, 0], rec.ts[meta["start"]])
        seen.update(meta["start"].tolist())
    assert set(crossing) <= seen
    assert seen <= set(expected.tolist())


def test_slice_starts_are_uniform_over_fitting_windows() -> None:
    rec = Recorded("numpy", 60, [5, 12, 3, 20, 9])
    sampler = SliceSampler(rec.rb, 500, 4, seed=11)
    starts = sampler.all_starts()
    counts: Counter = Counter()
    for _ in range(40):
        counts.update(sampler.sample_index().tolist())
    chi2_ok(np.array([counts[s] for s in starts]), np.full(starts.size, 1 / starts.size))
    assert set(counts) == set(starts.tolist())


def test_partial_windows_are_edge_padded_and_masked() -> None:
    rec = Recorded("torch", 30, [6, 3, 8])
    sampler = SliceSampler(rec.rb, 200, 5, seed=0, partial=True)
    assert sampler.num_windows() == len(rec.rb)
    data, meta = sampler.sample_with_metadata()
    starts = meta["start"]
    mask, src = oracle_windows(rec.eps, starts, np.arange(5))
    np.testing.assert_array_equal(meta["slice_valid_mask"].numpy(), mask)
    np.testing.assert_array_equal(data["t"].numpy(), rec.ts[src])
    assert (~mask).any(), "some window must run past its episode's end"
    windows, m = sampler.sample()
    assert tuple(windows["obs"].shape) == (200, 5, 3) and m.dtype == torch.bool


def test_slice_sampler_errors_seeds_and_epochs() -> None:
    rec = Recorded("numpy", 30, [3, 4, 2])
    with pytest.raises(ValueError, match="no window of 5 steps fits.*longest segment: 4"):
        SliceSampler(rec.rb, 4, 5).sample()
    with pytest.raises(ValueError, match="window"):
        SliceSampler(rec.rb, 4, 0)
    a, b = SliceSampler(rec.rb, 8, 2, seed=5), SliceSampler(rec.rb, 8, 2, seed=5)
    np.testing.assert_array_equal(a.sample_index(), b.sample_index())
    a.manual_seed(1), b.manual_seed(1)
    np.testing.assert_array_equal(a.sample()[0]["t"], b.sample()[0]["t"])
    got = []
    for data, mask in SliceSampler(rec.rb, 2, 2, seed=0).epoch_iter():
        assert mask.all()
        got.extend(data["ep"][:, 0] * 100 + data["t"][:, 0])
    assert sorted(got) == sorted(int(e) * 100 + int(t) for e, t in zip(rec.eps, rec.ts) if t + 1 < [3, 4, 2][e])
    flat = SliceSampler(rec.rb, 3, 2, seed=0).sample_flat()
    assert flat.shape == (3, 2 * 6)


def test_slice_sampler_recorded_only_and_device() -> None:
    rec = Recorded("torch", 12, [5, 6, 4])                 # the first episode is partly overwritten (clipped) ...
    rec.rb.storage.forget_segments(rec.rb.offset, 3)      # ... and its rows made rows of no segment
    first_recorded = rec.rb.episode_segments()[0][0]
    assert first_recorded > 0
    only = SliceSampler(rec.rb, 32, 2, seed=0, include_unrecorded=False)
    assert only.all_starts().min() >= first_recorded
    allw = SliceSampler(rec.rb, 32, 2, seed=0, device="cpu")
    assert allw.all_starts().min() == 0
    data, mask = allw.sample()
    assert data["obs"].device.type == "cpu" and mask.device.type == "cpu"


# ---------------------------------------------------------------------------------------------- SegmentSampler
@pytest.mark.parametrize("weighting", ["uniform", "length"])
def test_segment_sampler_distribution(weighting: str) -> None:
    lengths = [3, 12, 5, 25, 8, 1]
    rec = Recorded("numpy", 100, lengths)
    sampler = SegmentSampler(rec.rb, 400, seed=7, weighting=weighting)
    starts, ends = sampler.segments()
    assert (ends - starts).tolist() == lengths
    probs = sampler.probabilities()
    expect = np.ones(6) / 6 if weighting == "uniform" else np.array(lengths) / sum(lengths)
    np.testing.assert_allclose(probs, expect)
    counts = Counter()
    for _ in range(25):
        counts.update(sampler.sample_index().tolist())
    chi2_ok(np.array([counts[s] for s in starts.tolist()]), probs)


def test_segment_sampler_padding_and_lists() -> None:
    rec = Recorded("torch", 40, [4, 9, 6], open_tail=3)
    sampler = SegmentSampler(rec.rb, 16, seed=2)
    data, meta = sampler.sample_with_metadata()
    ranges = meta["segment"]
    lengths = ranges[:, 1] - ranges[:, 0]
    L = int(lengths.max())
    mask = meta["valid_mask"].numpy()
    assert mask.shape == (16, L) and tuple(data["t"].shape) == (16, L)
    for row, (s, e) in enumerate(ranges.tolist()):
        np.testing.assert_array_equal(mask[row], np.arange(L) < e - s)
        np.testing.assert_array_equal(data["t"][row].numpy(), rec.ts[np.minimum(np.arange(L) + s, e - 1)])
        assert len(set(rec.eps[s:e].tolist())) == 1
    assert rec.eps[len(rec.rb) - 1] not in {int(rec.eps[s]) for s, _ in ranges.tolist()}, \
        "the open episode is not a recorded segment"
    eps = sampler.sample_list()
    assert len(eps) == 16 and all(int(e["t"][0]) == 0 and (np.diff(e["t"].numpy()) == 1).all() for e in eps)
    with_open = SegmentSampler(rec.rb, 4, seed=0, include_unrecorded=True)
    assert with_open.segments()[1][-1] == len(rec.rb)
    seen = [int(d["ep"][0, 0]) for d, _ in SegmentSampler(rec.rb, 1, seed=0).epoch_iter()]
    assert sorted(seen) == [0, 1, 2]


@pytest.mark.parametrize("crop", ["random", "start", "end"])
def test_segment_sampler_max_length_crop(crop: str) -> None:
    rec = Recorded("numpy", 50, [10, 3, 7])
    sampler = SegmentSampler(rec.rb, 64, seed=4, max_length=5, crop=crop)
    data, mask = sampler.sample()
    assert data["t"].shape == (64, 5)
    for row, m in zip(data["t"], mask):
        real = row[m]
        assert (np.diff(real) == 1).all()
        if m.all() and crop == "start":
            assert real[0] == 0
        if m.all() and crop == "end":
            assert real[-1] in (9, 6)
    if crop == "random":
        firsts = {int(r[0]) for r, m in zip(data["t"], mask) if m.all() and r[-1] <= 9}
        assert len(firsts) > 1


def test_segment_sampler_validation() -> None:
    rec = Recorded("numpy", 20, [2, 3])
    with pytest.raises(ValueError, match="weighting"):
        SegmentSampler(rec.rb, 2, weighting="steps")
    with pytest.raises(ValueError, match="no segment of at least 4"):
        SegmentSampler(rec.rb, 2, min_length=4).sample()
    with pytest.raises(ValueError, match="max_length"):
        SegmentSampler(rec.rb, 2, max_length=0)
    only_long = SegmentSampler(rec.rb, 8, min_length=3, seed=0)
    assert (only_long.sample_segments()[:, 1] - only_long.sample_segments()[:, 0] == 3).all()


# ---------------------------------------------------------------------------------------------- SumTree
@settings(max_examples=150, deadline=None)
@given(cap=st.integers(1, 40), ops=st.lists(st.tuples(st.lists(st.integers(0, 39), min_size=1, max_size=8),
                                                      st.lists(st.integers(0, 6), min_size=1, max_size=8)),
                                            min_size=1, max_size=12), data=st.data())
def test_sum_tree_against_brute_force(cap: int, ops: List[Any], data: Any) -> None:
    tree = SumTree(cap)
    model = np.zeros(cap)
    for idx, vals in ops:
        idx = [i % cap for i in idx]
        vals = (vals * len(idx))[:len(idx)]
        tree.update(np.array(idx), np.array(vals, dtype=np.float64))
        for i, v in zip(idx, vals):          # the last write of a repeated index wins
            model[i] = v
        np.testing.assert_array_equal(tree.values(), model)
        assert tree.total == model.sum()
        pos = model[model > 0]
        assert tree.min == (pos.min() if pos.size else np.inf)
        if model.sum() > 0:
            cum = np.cumsum(model)
            qs = np.concatenate([cum[:-1][model[1:] >= 0], [0.0, model.sum() - 0.5],
                                 np.array(data.draw(st.lists(st.floats(0, 1, exclude_max=True), max_size=5)))
                                 * model.sum()])
            qs = qs[(qs >= 0) & (qs < model.sum())]
            expect = np.searchsorted(cum, qs, side="right")
            np.testing.assert_array_equal(tree.find(qs), expect)
            assert (model[tree.find(qs)] > 0).all()


def test_sum_tree_validation_and_sampling() -> None:
    tree = SumTree(5)
    with pytest.raises(ValueError, match="non-negative"):
        tree.update([0], [-1.0])
    with pytest.raises(ValueError, match="finite"):
        tree.update([0], [np.nan])
    with pytest.raises(IndexError, match="out of range"):
        tree.update([5], [1.0])
    with pytest.raises(ValueError, match="all 0"):
        tree.sample(np.random.default_rng(0), 3)
    with pytest.raises(ValueError, match="positive int"):
        SumTree(0)
    tree.update([0, 3, 4], [1.0, 3.0, 0.0])
    got = np.bincount(tree.sample(np.random.default_rng(0), 40_000), minlength=5)
    chi2_ok(got, np.array([0.25, 0, 0, 0.75, 0]))


# ---------------------------------------------------------------------------------------------- PrioritizedSampler
ID_SPACE = DictSpace(NumpyComputeBackend, {"id": BoxSpace(NumpyComputeBackend, -1, 10 ** 9, np.int64, shape=())})


class CountingReplayBuffer(ReplayBuffer):
    """A ReplayBuffer with a monotone `total_written` counter (rows written by extend / append)."""

    total_written = 0

    def extend(self, value: Any) -> None:
        super().extend(value)
        self.total_written += int(np.asarray(value["id"]).shape[0])

    def append(self, value: Any) -> None:
        super().append(value)
        self.total_written += 1


def id_buffer(capacity: int, n: int = 0, cls: type = ReplayBuffer, start: int = 0) -> ReplayBuffer:
    rb = cls.create(FlattenedStorage, ID_SPACE, inner_storage_cls=NumpyMemmapStorage, capacity=capacity)
    if n:
        rb.extend({"id": np.arange(start, start + n, dtype=np.int64)})
    return rb


def ids(rb: ReplayBuffer) -> np.ndarray:
    return np.asarray(rb.get_at(slice(None))["id"])


@pytest.mark.parametrize("alpha", [1.0, 0.5])
def test_prioritized_distribution(alpha: float) -> None:
    rb = id_buffer(64, 40)
    sampler = PrioritizedSampler(rb, 512, alpha=alpha, beta=0.4, eps=0.0, seed=1)
    pr = (np.arange(40) % 7).astype(np.float64)          # every 7th sample has priority 0: never drawn
    assert sampler.update_priorities(sampler.keys_for(np.arange(40)), pr) == 40
    q = pr ** alpha
    np.testing.assert_allclose(sampler.probabilities(), q / q.sum())
    counts = np.zeros(40)
    for _ in range(40):
        batch, info = sampler.sample()
        np.testing.assert_array_equal(batch["id"], info["logical_index"])
        counts += np.bincount(info["logical_index"], minlength=40)
    chi2_ok(counts, q / q.sum())


@pytest.mark.parametrize("normalization", ["buffer", "batch"])
def test_importance_weights(normalization: str) -> None:
    rb = id_buffer(32, 20)
    sampler = PrioritizedSampler(rb, 64, alpha=0.7, beta=0.6, eps=0.01, seed=0, weight_normalization=normalization)
    pr = np.linspace(0.1, 3.0, 20)
    sampler.update_priorities(sampler.keys_for(np.arange(20)), pr)
    keys, logical, w = sampler.sample_keys()
    q = (pr + 0.01) ** 0.7
    P = q / q.sum()
    raw = (20 * P[logical]) ** -0.6
    max_w = (20 * P.min()) ** -0.6 if normalization == "buffer" else raw.max()
    np.testing.assert_allclose(w, raw / max_w, rtol=1e-12)
    assert w.max() <= 1.0 + 1e-12
    if normalization == "batch":
        assert w.max() == pytest.approx(1.0)
    _, info = sampler.sample()
    assert info["weight"].dtype == np.float32 and info["weight"].shape == (64,)


def test_new_samples_get_max_priority_and_priorities_follow_their_samples() -> None:
    rb = id_buffer(10, 6)
    sampler = PrioritizedSampler(rb, 4, alpha=1.0, eps=0.0, seed=0)
    keys = sampler.keys_for(np.arange(6))
    sampler.update_priorities(keys, [1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    assert sampler.max_priority == 6.0
    rb.extend({"id": np.arange(100, 107, dtype=np.int64)})   # 13 rows into 10: ids 0, 1, 2 are overwritten
    np.testing.assert_array_equal(ids(rb), [3, 4, 5, 100, 101, 102, 103, 104, 105, 106])
    expected = np.array([4.0, 5.0, 6.0] + [6.0] * 7)
    np.testing.assert_allclose(sampler.probabilities(), expected / expected.sum())
    np.testing.assert_array_equal(sampler.logical_indices_of(keys), [-1, -1, -1, 0, 1, 2])
    np.testing.assert_array_equal(sampler.priorities_of(keys)[3:], [4.0, 5.0, 6.0])
    assert np.isnan(sampler.priorities_of(keys)[:3]).all()
    # a late update for an overwritten sample is ignored; the one for a surviving sample lands on it
    assert sampler.update_priorities(keys[[0, 4]], [50.0, 0.5]) == 1
    expected[1] = 0.5
    np.testing.assert_allclose(sampler.probabilities(), expected / expected.sum())
    assert sampler.max_priority == 6.0


def test_total_written_counter_catches_a_full_lap() -> None:
    # exactly `capacity` rows between two calls leave count and offset unchanged: only a write counter can tell
    counted = id_buffer(8, 8, cls=CountingReplayBuffer)
    plain = id_buffer(8, 8)
    for rb in (counted, plain):
        s = PrioritizedSampler(rb, 4, alpha=1.0, eps=0.0, seed=0)
        s.update_priorities(s.keys_for(np.arange(8)), np.full(8, 0.25))
        s.update_priorities(s.keys_for(np.array([0])), [2.0])          # max priority is now 2
        rb.extend({"id": np.arange(50, 58, dtype=np.int64)})
        pr = s.priorities_of(s.keys_for(np.arange(8)))
        # ReplayBuffer keeps `total_written`, so a full lap is seen: every row is new and gets the max priority
        np.testing.assert_array_equal(pr, 2.0)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cap=st.integers(2, 12), ops=st.lists(st.one_of(
    st.tuples(st.just("add"), st.integers(1, 11)),
    st.tuples(st.just("update"), st.lists(st.tuples(st.integers(0, 30), st.integers(0, 9)), min_size=1, max_size=5)),
    st.tuples(st.just("late"), st.integers(0, 9))), min_size=1, max_size=15), counted=st.booleans())
def test_prioritized_against_brute_force_model(cap: int, ops: List[Any], counted: bool) -> None:
    """Priorities are tracked by sample id in the model; the sampler must agree after every step, wrap or not.
    Without a `total_written` counter, fewer than `capacity` rows are written between two calls (the documented
    requirement)."""
    rb = id_buffer(cap, 1, cls=CountingReplayBuffer if counted else ReplayBuffer)
    sampler = PrioritizedSampler(rb, 3, alpha=1.0, eps=0.0, seed=0)
    prio: Dict[int, float] = {0: 1.0}
    max_p = 1.0
    next_id = 1
    old_keys: Optional[np.ndarray] = None
    for op in ops:
        if op[0] == "add":
            k = op[1] if counted else min(op[1], cap - 1)
            rb.extend({"id": np.arange(next_id, next_id + k, dtype=np.int64)})
            for i in range(next_id, next_id + k):
                prio[i] = max_p
            next_id += k
        elif op[0] == "update":
            live = ids(rb)
            pos = np.array([p % len(live) for p, _ in op[1]])
            vals = np.array([float(v) for _, v in op[1]])
            sampler.update_priorities(sampler.keys_for(pos), vals)
            for p, v in zip(pos.tolist(), vals.tolist()):
                prio[int(live[p])] = v
            max_p = max(max_p, float(vals.max()))
            old_keys = sampler.keys_for(np.arange(len(live)))
        elif old_keys is not None:                   # late update with keys taken before later writes
            live_now = set(ids(rb).tolist())
            logical_then = sampler.logical_indices_of(old_keys)
            v = float(op[1])
            applied = sampler.update_priorities(old_keys, np.full(old_keys.shape[0], v))
            assert applied == int((logical_then >= 0).sum())
            for li in logical_then[logical_then >= 0].tolist():
                prio[int(ids(rb)[li])] = v
            max_p = max(max_p, v) if applied else max_p
            assert all(int(i) in live_now for i in ids(rb))
        live = ids(rb)
        q = np.array([prio[int(i)] for i in live])
        got = sampler.probabilities()
        if q.sum() > 0:
            np.testing.assert_allclose(got, q / q.sum(), atol=1e-12)
        else:
            assert got.sum() == 0


def test_prioritized_linear_mode_grows_and_resets() -> None:
    arr = ArrayBatch(3)
    sampler = PrioritizedSampler(arr, 2, alpha=1.0, eps=0.0, seed=0)
    sampler.update_priorities(sampler.keys_for(np.arange(3)), [0.0, 1.0, 3.0])
    arr.x = np.arange(2000)
    p = sampler.probabilities()
    assert p.shape == (2000,) and p[0] == 0 and p[1] == pytest.approx(p[2] / 3) and p[5] == p[2]  # new: max
    arr.x = np.arange(2)                               # shrank: cleared, every priority restarts
    np.testing.assert_allclose(sampler.probabilities(), [0.5, 0.5])
    batch, info = sampler.sample()
    np.testing.assert_array_equal(batch["x"], info["logical_index"])


def test_prioritized_through_a_window_view_keeps_the_ring() -> None:
    rec = Recorded("torch", 16, [6, 5, 7])
    view = FrameStackedBatch(rec.rb, 2, 0)
    sampler = PrioritizedSampler(view, 32, alpha=1.0, eps=0.0, seed=0)
    assert sampler._ring is rec.rb
    keys = sampler.keys_for(np.arange(len(view)))
    sampler.update_priorities(keys, np.arange(len(view), dtype=np.float64))
    (data, info) = sampler.sample()
    assert tuple(data["t"].shape) == (32, 3) and isinstance(info["weight"], torch.Tensor)
    np.testing.assert_array_equal(data["t"][:, -1].numpy(), rec.ts[info["logical_index"]])
    assert 0 not in info["logical_index"]


def test_prioritized_validation() -> None:
    rb = id_buffer(8, 4)
    s = PrioritizedSampler(rb, 2, seed=0)
    keys = s.keys_for(np.arange(4))
    with pytest.raises(ValueError, match="finite and >= 0"):
        s.update_priorities(keys, [1.0, -1.0, 1.0, 1.0])
    with pytest.raises(ValueError, match="finite and >= 0"):
        s.update_priorities(keys, [1.0, np.nan, 1.0, 1.0])
    with pytest.raises(ValueError, match="4 indices but 2 priorities"):
        s.update_priorities(keys, [1.0, 2.0])
    with pytest.raises(TypeError, match="integers"):
        s.update_priorities(np.array([0.5]), [1.0])
    with pytest.raises(ValueError, match="non-negative"):
        s.update_priorities(np.array([-1]), [1.0])
    for kw in ({"alpha": -1}, {"beta": np.inf}, {"eps": -1e-3}, {"max_priority": 0}, {"weight_normalization": "x"}):
        with pytest.raises(ValueError):
            PrioritizedSampler(rb, 2, **kw)
    assert s.update_priorities(torch.tensor(keys), torch.tensor([1.0, 2.0, 3.0, 4.0])) == 4
    s.alpha = 0.0
    np.testing.assert_allclose(s.probabilities(), 0.25)
    empty = PrioritizedSampler(id_buffer(4), 2)
    with pytest.raises(IndexError, match="empty"):
        empty.sample()
    zero = PrioritizedSampler(rb, 2, eps=0.0)
    zero.update_priorities(zero.keys_for(np.arange(4)), np.zeros(4))
    with pytest.raises(IndexError, match="every priority is 0"):
        zero.sample()


def test_segment_cache_is_not_fooled_by_a_clear_that_restores_the_counters() -> None:
    """Regression: `segments_version` was a weighted sum of the buffer's counters, and clear() resets one of them,
    so a cleared and refilled buffer could show the version of its state before the clear; the segment cache then
    kept the old table and SegmentSampler returned one 'episode' spanning two. The counts below are the ones that
    made the old sum collide."""
    space = DictSpace(NumpyComputeBackend, {"ep": BoxSpace(NumpyComputeBackend, 0, 100, np.int64, shape=())})
    cap = 10

    def episode(rb: ReplayBuffer, ep: int, n: int) -> None:
        w = rb.open_segment_writer()
        for _ in range(n):
            w.append({"ep": np.int64(ep)})
        rb.commit_segment(w)

    def old_sum(rb: ReplayBuffer) -> int:      # the former formula
        log = None if rb._own_segments else rb.storage.segment_log()
        return (rb._state.version * 1_000_003 + rb.total_written * 7919 + len(rb) * 31
                + (0 if log is None else log.version))

    def scenario(n: int, k: int, sample_before_clear: bool) -> Any:
        rb = ReplayBuffer.create(FlattenedStorage, space, inner_storage_cls=NumpyMemmapStorage, capacity=cap)
        sampler = SegmentSampler(rb, 4, seed=0)
        rb.extend({"ep": np.zeros(n, np.int64)})
        episode(rb, 1, cap)
        before = old_sum(rb)
        if sample_before_clear:
            sampler.sample()                      # caches the segment table
        rb.clear()
        episode(rb, 2, 5)
        episode(rb, 3, 5)
        for _ in range(k):
            rb._state.version += 1    # what an empty commit did before empty commits became no-ops (the reference's)
        return rb, sampler, before, old_sum(rb)

    _, _, a1, a2 = scenario(cap, 0, False)
    k = next(k for k in range(7919) if (a2 - a1 + k * 1_000_003) % 7919 == 0)
    n = cap + (a2 - a1 + k * 1_000_003) // 7919
    rb, sampler, before, after = scenario(n, k, True)
    assert before == after                        # the old formula would not have told the two states apart
    assert rb.episode_segments() == [(0, 5), (5, 10)]
    data, meta = sampler.sample_with_metadata()
    for (s, e), eps in zip(meta["segment"].tolist(), np.asarray(data["ep"])):
        assert (s, e) in [(0, 5), (5, 10)] and len(set(eps[: e - s].tolist())) == 1
