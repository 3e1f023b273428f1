"""Batch views (`unienv_data.batches`) on real replay buffers: windows at episode edges and across the ring seam,
masks and fill policy, and the combined / sub-indexed / sub-item / transformed / backend views.

The window oracle is independent of the segment bookkeeping: every stored step carries its episode id, and a
window frame must be valid exactly when it is in range and has the anchor's episode id.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from unienv_data.base.common import BatchBase
from unienv_data.batches import (CombinedBatch, FrameStackedBatch, SliceStackedBatch, SubIndexedBatch, SubItemBatch,
                                 ToBackendOrDeviceBatch, TransformedBatch)
from unienv_data.batches._segments import OPEN, RECORDED, UNRECORDED, SegmentIndex, validate_segments
from unienv_data.batches.slice_stacked import MASK_KEY, fill_positions
from unienv_data.replay_buffer import ReplayBuffer
from unienv_data.storages.flattened import FlattenedStorage
from unienv_data.storages.numpy_memmap import NumpyMemmapStorage
from unienv_interface.backends import NumpyComputeBackend
from unienv_interface.space import BinarySpace, BoxSpace, DictSpace
from unienv_interface.space.space_utils import flatten_utils

torch = pytest.importorskip("torch")
from unienv_data.storages.pytorch import PytorchTensorStorage  # noqa: E402
from unienv_interface.backends.pytorch import PyTorchComputeBackend  # noqa: E402

BACKENDS = {"torch": (PyTorchComputeBackend, PytorchTensorStorage), "numpy": (NumpyComputeBackend, NumpyMemmapStorage)}


# ---------------------------------------------------------------------------------------------- fixtures
def step_space(B: Any) -> DictSpace:
    f32, i64 = B.dtype_from_name("float32"), B.dtype_from_name("int64")
    return DictSpace(B, {"obs": BoxSpace(B, -np.inf, np.inf, f32, shape=(3,)),
                         "ep": BoxSpace(B, -1, 10 ** 6, i64, shape=()),
                         "t": BoxSpace(B, -1, 10 ** 6, i64, shape=()),
                         "done": BinarySpace(B, ())})


def make_step(B: Any, ep: int, t: int, last: bool) -> Dict[str, Any]:
    return {"obs": B.from_numpy(np.full(3, ep * 1000 + t, dtype=np.float32)),
            "ep": B.from_numpy(np.array(ep, dtype=np.int64)), "t": B.from_numpy(np.array(t, dtype=np.int64)),
            "done": B.from_numpy(np.array(last))}


class Recorded:
    """A replay buffer filled episode by episode plus a plain list model of its logical contents."""

    def __init__(self, backend: str, capacity: int, lengths: Sequence[int], open_tail: int = 0) -> None:
        self.B, inner = BACKENDS[backend]
        self.rb = ReplayBuffer.create(FlattenedStorage, step_space(self.B), inner_storage_cls=inner, capacity=capacity)
        self.frames: List[Tuple[int, int]] = []          # (episode, step) of every row ever written, in order
        for ep, L in enumerate(lengths):
            for t in range(L):
                self.rb.append(make_step(self.B, ep, t, t == L - 1))
                self.frames.append((ep, t))
            self.rb.mark_segment_end()
        for t in range(open_tail):                        # an episode still being written
            self.rb.append(make_step(self.B, len(lengths), t, False))
            self.frames.append((len(lengths), t))
        n = len(self.rb)
        assert n == min(capacity, len(self.frames))
        self.logical = self.frames[len(self.frames) - n:]   # logical index 0 = oldest kept row

    @property
    def eps(self) -> np.ndarray:
        return np.array([e for e, _ in self.logical], dtype=np.int64)

    @property
    def ts(self) -> np.ndarray:
        return np.array([t for _, t in self.logical], dtype=np.int64)


def to_np(B: Any, x: Any) -> np.ndarray:
    return np.asarray(x if isinstance(x, np.ndarray) else B.to_numpy(x))


def oracle_windows(eps: np.ndarray, anchors: np.ndarray, offsets: np.ndarray, fill: bool = True
                   ) -> Tuple[np.ndarray, np.ndarray]:
    """Expected `(mask, source frame)` of every window entry, by brute force over the episode ids."""
    n = eps.shape[0]
    z = int(np.flatnonzero(offsets == 0)[0])
    mask = np.zeros((len(anchors), len(offsets)), dtype=bool)
    src = np.zeros_like(mask, dtype=np.int64)
    for b, a in enumerate(anchors):
        for j, o in enumerate(offsets):
            f = a + o
            mask[b, j] = 0 <= f < n and eps[f] == eps[a]
        for j, o in enumerate(offsets):
            if mask[b, j]:
                src[b, j] = a + o
            elif not fill:
                src[b, j] = min(max(a + o, 0), n - 1)
            else:       # nearest valid entry between j and the anchor
                step = 1 if j < z else -1
                k = j
                while not mask[b, k] and k != z:
                    k += step
                src[b, k] = src[b, k]
                src[b, j] = a + offsets[k]
    return mask, src


def check_windows(rec: Recorded, view: SliceStackedBatch, anchors: np.ndarray, fill: bool = True) -> None:
    data, meta = view.get_at_with_metadata(anchors)
    mask, src = oracle_windows(rec.eps, anchors, view._offsets, fill)
    got_mask = to_np(rec.B, meta[MASK_KEY])
    np.testing.assert_array_equal(got_mask, mask)
    np.testing.assert_array_equal(to_np(rec.B, data["ep"]), rec.eps[src])
    np.testing.assert_array_equal(to_np(rec.B, data["t"]), rec.ts[src])
    obs = to_np(rec.B, data["obs"])
    assert obs.shape == (len(anchors), len(view._offsets), 3)
    np.testing.assert_array_equal(obs[..., 0], rec.eps[src] * 1000 + rec.ts[src])


class CountingBatch(BatchBase):
    """Wraps a batch and counts / records the reads that reach it (optionally with metadata, without segments)."""

    def __init__(self, inner: BatchBase, metadata: bool = False, segments: Optional[bool] = True) -> None:
        self.inner = inner
        self.meta_space = None
        if metadata:
            self.meta_space = DictSpace(inner.backend, {"row": BoxSpace(inner.backend, 0, 10 ** 6,
                                                                       inner.backend.dtype_from_name("int64"), shape=())})
        super().__init__(inner.single_space, self.meta_space)
        self.reads: List[int] = []
        self._segments = segments

    def __len__(self) -> int:
        return len(self.inner)

    def get_at(self, idx: Any) -> Any:
        if isinstance(idx, slice):
            self.reads.append(len(range(*idx.indices(len(self)))))
        else:
            self.reads.append(1 if isinstance(idx, (int, np.integer)) else len(np.asarray(idx)))
        return self.inner.get_at(idx)

    def get_at_with_metadata(self, idx: Any) -> Tuple[Any, Optional[Any]]:
        data = self.get_at(idx)
        if self.meta_space is None:
            return data, None
        rows = np.asarray(idx, dtype=np.int64)
        return data, {"row": self.backend.from_numpy(rows)}

    def get_segments(self) -> Any:
        if self._segments is None:
            return None
        return self.inner.episode_segments()  # type: ignore[attr-defined]


class ArrayBatch(BatchBase):
    """A plain in-memory batch over a dict of NumPy arrays, with no segment information at all."""

    def __init__(self, n: int, start: int = 0) -> None:
        B = NumpyComputeBackend
        super().__init__(DictSpace(B, {"x": BoxSpace(B, -10 ** 9, 10 ** 9, np.int64, shape=())}))
        self.x = np.arange(start, start + n, dtype=np.int64)

    def __len__(self) -> int:
        return int(self.x.shape[0])

    def get_at(self, idx: Any) -> Any:
        out = self.x[idx]
        return {"x": np.asarray(out)}

    def set_at(self, idx: Any, value: Any) -> None:
        self.x[idx] = value["x"]


# ---------------------------------------------------------------------------------------------- fill helper
def test_fill_positions_takes_nearest_valid_toward_anchor() -> None:
    mask = np.array([[False, True, False, True, False, False],
                     [False, False, True, False, True, False],
                     [True, True, True, True, True, True]])
    got = fill_positions(mask, 2)
    np.testing.assert_array_equal(got, [[1, 1, 2, 3, 3, 3], [2, 2, 2, 2, 4, 4], [0, 1, 2, 3, 4, 5]])


def test_segment_index_partition_and_validation() -> None:
    idx = SegmentIndex(10, [(2, 4), (6, 9)], open_rows=1)
    assert idx.partition() == [(0, 2), (2, 4), (4, 6), (6, 9), (9, 10)]
    assert idx.kinds.tolist() == [UNRECORDED, RECORDED, UNRECORDED, RECORDED, OPEN]
    lo, hi = idx.bounds(np.arange(10))
    assert lo.tolist() == [0, 0, 2, 2, 4, 4, 6, 6, 6, 9] and hi.tolist() == [2, 2, 4, 4, 6, 6, 9, 9, 9, 10]
    rec_s, rec_e = idx.pieces(include_unrecorded=False)
    assert list(zip(rec_s.tolist(), rec_e.tolist())) == [(2, 4), (6, 9)]
    single = SegmentIndex(10, [(2, 4), (6, 9)], unrecorded="single", open_rows=1)
    s, e = single.pieces()
    assert list(zip(s.tolist(), e.tolist())) == [(0, 1), (1, 2), (2, 4), (4, 5), (5, 6), (6, 9), (9, 10)]
    assert single.bounds(np.array([5, 9]))[0].tolist() == [5, 9]
    assert SegmentIndex(5, None).partition() == [(0, 5)] and SegmentIndex(0, None).partition() == []
    assert SegmentIndex(6, []).partition() == [(0, 6)]
    assert SegmentIndex(6, [(0, 3)], open_rows=4).partition() == [(0, 3), (3, 6)], "an overlapping open tail is ignored"
    np.testing.assert_array_equal(validate_segments([(5, 7), (0, 2), (7, 12)], 10), [[0, 2], [5, 7]])
    for bad, msg in (([(0, 3), (2, 5)], "overlapping"), ([(3, 3)], "start < end"), ([(-1, 2)], "start < end"),
                     ([(0.5, 2)], "integer"), ([(True, 2)], "integer"), ([1, 2], "integer")):
        with pytest.raises(ValueError, match=msg):
            validate_segments(bad, 10)


def test_segment_cache_follows_changes_and_segments_version() -> None:
    class Seg(ArrayBatch):
        def __init__(self) -> None:
            super().__init__(10)
            self.segs = [(0, 4), (4, 10)]
            self.calls = 0

        def get_segments(self) -> Any:
            self.calls += 1
            return list(self.segs)

    b = Seg()
    view = FrameStackedBatch(b, 1, 1)
    first = view.segment_index()
    assert view.segment_index() is first, "unchanged segments reuse the partition"
    b.segs = [(0, 3), (3, 10)]
    assert view.segment_index().partition() == [(0, 3), (3, 10)]
    b.segments_version = 1  # type: ignore[attr-defined]
    view.segment_index()
    calls = b.calls
    view.segment_index(), view.get_at(np.arange(10))
    assert b.calls == calls, "an unchanged segments_version skips get_segments"
    b.segs = [(0, 5), (5, 10)]
    b.segments_version = 2  # type: ignore[attr-defined]
    assert view.segment_index().partition() == [(0, 5), (5, 10)]


# ---------------------------------------------------------------------------------------------- windows on a ring
@pytest.mark.parametrize("backend", ["torch", "numpy"])
@pytest.mark.parametrize("pre,post", [(3, 0), (0, 4), (2, 2), (5, 5)])
def test_frame_stack_matches_oracle_across_wrap(backend: str, pre: int, post: int) -> None:
    # 7 + 3 + 9 + 5 + 6 = 30 rows into capacity 17: the ring wraps, the oldest kept episode is cut (recorded with
    # the rows it keeps, as unienv 0.0.1b16 clips it), and an open episode sits at the tail.
    rec = Recorded(backend, 17, [7, 3, 9, 5, 6], open_tail=2)
    rb = rec.rb
    assert rb.offset != 0, "the ring must have wrapped for this test"
    segs = rb.episode_segments()
    assert segs and segs[0][0] == 0 and rec.ts[0] > 0, "expected the oldest episode clipped to its last steps"
    view = FrameStackedBatch(rb, pre, post)
    assert len(view) == len(rb)
    check_windows(rec, view, np.arange(len(rb)))


@pytest.mark.parametrize("backend", ["torch", "numpy"])
def test_windows_straddle_the_physical_seam(backend: str) -> None:
    rec = Recorded(backend, 12, [5, 6, 8])          # 19 rows into 12: the last episode wraps physically
    rb = rec.rb
    seam = (rb.capacity - rb.offset) % rb.capacity  # logical index stored at physical row 0
    assert 0 < seam < len(rb)
    ep = rec.eps[seam]
    first, last = np.flatnonzero(rec.eps == ep)[[0, -1]]
    assert first < seam, "the episode must span the seam"
    # anchors whose +-2 window lies inside the episode and crosses the seam
    anchors = np.array([a for a in range(first + 2, last - 1) if a - 2 < seam <= a + 2])
    assert anchors.size
    view = FrameStackedBatch(rb, 2, 2)
    data, meta = view.get_at_with_metadata(anchors)
    assert to_np(rec.B, meta[MASK_KEY]).all()
    for row, a in zip(to_np(rec.B, data["t"]), anchors):
        np.testing.assert_array_equal(row, rec.ts[a - 2:a + 3])
    check_windows(rec, view, np.arange(len(rb)))


def test_non_contiguous_offsets_and_fill_policy() -> None:
    rec = Recorded("torch", 40, [6, 4, 10])
    view = SliceStackedBatch(rec.rb, [-4, -2, 0, 3, 7])
    check_windows(rec, view, np.arange(len(rec.rb)))
    nofill = SliceStackedBatch(rec.rb, [-4, -2, 0, 3, 7], fill_invalid_data=False)
    check_windows(rec, nofill, np.arange(len(rec.rb)), fill=False)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cap=st.integers(3, 30), open_tail=st.integers(0, 3), pre=st.integers(0, 4), post=st.integers(0, 4),
       data=st.data())
def test_windows_property(cap: int, open_tail: int, pre: int, post: int, data: Any) -> None:
    lengths = data.draw(st.lists(st.integers(1, min(9, cap)), min_size=1, max_size=8))
    rec = Recorded(data.draw(st.sampled_from(["numpy", "torch"])), cap, lengths, open_tail)
    n = len(rec.rb)
    anchors = np.array(data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=12)), dtype=np.int64)
    check_windows(rec, FrameStackedBatch(rec.rb, pre, post), anchors)


def test_frames_outside_the_written_range_are_never_valid() -> None:
    # no segment information at all: the whole batch is one segment, but the window still stops at its ends
    arr = ArrayBatch(6)
    view = FrameStackedBatch(arr, 3, 3)
    data, meta = view.get_at_with_metadata(np.array([0, 5]))
    np.testing.assert_array_equal(meta[MASK_KEY], [[False, False, False, True, True, True, True],
                                                   [True, True, True, True, False, False, False]])
    np.testing.assert_array_equal(data["x"], [[0, 0, 0, 0, 1, 2, 3], [2, 3, 4, 5, 5, 5, 5]])
    # a mask function saying "all valid" is still combined with the range test
    everything = SliceStackedBatch(arr, [-2, 0, 2], get_valid_mask_function=lambda v, i, d, m: np.ones(i.shape, bool))
    _, meta = everything.get_at_with_metadata(np.array([0, 1, 4]))
    np.testing.assert_array_equal(meta[MASK_KEY], [[False, True, True], [False, True, True], [True, True, False]])


def test_extend_only_buffer_is_one_segment() -> None:
    B = NumpyComputeBackend
    rb = ReplayBuffer.create(FlattenedStorage, step_space(B), inner_storage_cls=NumpyMemmapStorage, capacity=8)
    steps = {"obs": np.zeros((5, 3), np.float32), "ep": np.zeros(5, np.int64), "t": np.arange(5),
             "done": np.zeros(5, bool)}
    rb.extend(steps)
    assert rb.episode_segments() == []
    view = FrameStackedBatch(rb, 1, 1)
    _, meta = view.get_at_with_metadata(np.arange(5))
    np.testing.assert_array_equal(meta[MASK_KEY][:, 1], True)
    np.testing.assert_array_equal(meta[MASK_KEY][:, 0], [False, True, True, True, True])
    np.testing.assert_array_equal(meta[MASK_KEY][:, 2], [True, True, True, True, False])


@pytest.mark.parametrize("backend", ["torch", "numpy"])
def test_open_episode_is_its_own_segment(backend: str) -> None:
    # the episode being appended overwrote row 0 of the only recorded episode: what is left of that episode
    # (clipped to its last three rows) and the open episode sit side by side, and must not be joined
    rec = Recorded(backend, 4, [4], open_tail=1)
    assert rec.rb.episode_segments() == [(0, 3)]
    view = FrameStackedBatch(rec.rb, 1, 1)
    np.testing.assert_array_equal(view.valid_mask_at(np.array([2, 3])), [[True, True, False], [False, True, False]])
    check_windows(rec, view, np.arange(4))


def test_unrecorded_single_policy_isolates_unrecorded_frames() -> None:
    rec = Recorded("numpy", 10, [4, 3, 5])          # the first episode clipped to 2 rows at the head ...
    rec.rb.storage.forget_segments(rec.rb.offset, 2)  # ... made rows of no segment (as extend-written rows are)
    segs = rec.rb.episode_segments()
    assert segs[0][0] == 2
    run = FrameStackedBatch(rec.rb, 1, 1)
    single = FrameStackedBatch(rec.rb, 1, 1, unrecorded="single")
    np.testing.assert_array_equal(run.valid_mask_at(np.array([0, 1])), [[False, True, True], [True, True, False]])
    np.testing.assert_array_equal(single.valid_mask_at(np.array([0, 1])), [[False, True, False], [False, True, False]])
    np.testing.assert_array_equal(single.valid_mask_at(np.array([3])), run.valid_mask_at(np.array([3])))
    with pytest.raises(ValueError, match="unrecorded"):
        FrameStackedBatch(rec.rb, 1, 1, unrecorded="merge")


@pytest.mark.parametrize("backend", ["torch", "numpy"])
def test_mask_functions_from_episode_keys_agree_with_segments(backend: str) -> None:
    rec = Recorded(backend, 25, [6, 2, 7, 9, 4])
    anchors = np.arange(len(rec.rb))
    by_seg = FrameStackedBatch(rec.rb, 3, 3)
    by_id = FrameStackedBatch(rec.rb, 3, 3, SliceStackedBatch.get_valid_mask_function_with_episodeid_key("ep"))
    by_end = FrameStackedBatch(rec.rb, 3, 3, SliceStackedBatch.get_valid_mask_function_with_episode_end_key("done"))
    # the remnant at the head has no "done" flag before it, so compare away from it
    first_full = rec.rb.episode_segments()[0][0]
    for view in (by_id, by_end):
        d1, m1 = by_seg.get_at_with_metadata(anchors[first_full:])
        d2, m2 = view.get_at_with_metadata(anchors[first_full:])
        np.testing.assert_array_equal(to_np(rec.B, m1[MASK_KEY]), to_np(rec.B, m2[MASK_KEY]))
        np.testing.assert_array_equal(to_np(rec.B, d1["t"]), to_np(rec.B, d2["t"]))
    check_windows(rec, by_id, anchors)


def test_one_batched_read_per_call() -> None:
    rec = Recorded("torch", 30, [8, 8, 8])
    counted = CountingBatch(rec.rb)
    for view in (FrameStackedBatch(counted, 4, 3, deduplicate=False),
                 FrameStackedBatch(counted, 4, 3, SliceStackedBatch.get_valid_mask_function_with_episodeid_key("ep"),
                                   deduplicate=False)):
        counted.reads.clear()
        view.get_at(np.arange(20))
        view.get_at_with_metadata(np.array([3, 1, 2]))
        view.get_at(5)
        assert counted.reads == [20 * 8, 3 * 8, 8]


def test_deduplicated_reads() -> None:
    rec = Recorded("numpy", 40, [20, 20])
    counted = CountingBatch(rec.rb)
    view = FrameStackedBatch(counted, 0, 7)
    counted.reads.clear()
    d_auto = view.get_at(slice(0, 30))                         # consecutive anchors: automatic deduplication
    assert counted.reads == [37]
    forced = FrameStackedBatch(counted, 0, 7, deduplicate=True)
    never = FrameStackedBatch(counted, 0, 7, deduplicate=False)
    counted.reads.clear()
    d_forced = forced.get_at(np.array([0, 1, 1, 2]))
    d_never = never.get_at(slice(0, 30))
    assert counted.reads == [10, 240]
    np.testing.assert_array_equal(d_auto["t"], d_never["t"])
    np.testing.assert_array_equal(d_forced["t"], never.get_at(np.array([0, 1, 1, 2]))["t"])


def test_single_index_flattened_and_spaces() -> None:
    rec = Recorded("torch", 30, [5, 9])
    view = FrameStackedBatch(rec.rb, 2, 1)
    one, meta = view.get_at_with_metadata(6)
    assert tuple(one["obs"].shape) == (4, 3) and tuple(meta[MASK_KEY].shape) == (4,)
    assert view.single_space["obs"].shape == (4, 3)
    assert view.single_metadata_space[MASK_KEY].shape == (4,)
    assert view.single_space.contains(one)
    many = view.get_at(np.array([6, 7]))
    d2, m2 = view.get_at_with_mask(np.array([6, 7]))
    np.testing.assert_array_equal(d2["t"].numpy(), many["t"].numpy())
    np.testing.assert_array_equal(m2.numpy(), view.get_at_with_metadata(np.array([6, 7]))[1][MASK_KEY].numpy())
    assert tuple(view.get_at_with_mask(6)[1].shape) == (4,)
    flat = view.get_flattened_at(np.array([6, 7]))
    np.testing.assert_array_equal(flat.numpy(), flatten_utils.flatten_data(view._batched_space, many, start_dim=1).numpy())
    np.testing.assert_array_equal(view.get_flattened_at(6).numpy(), flat[0].numpy())
    assert not view.is_mutable
    with pytest.raises(NotImplementedError):
        view.set_at(0, one)


def test_metadata_anchor_or_stacked() -> None:
    rec = Recorded("numpy", 30, [5, 9])
    counted = CountingBatch(rec.rb, metadata=True)
    anchor_only = FrameStackedBatch(counted, 1, 1)
    stacked = FrameStackedBatch(counted, 1, 1, stack_metadata=True)
    _, m1 = anchor_only.get_at_with_metadata(np.array([0, 4, 5]))
    _, m2 = stacked.get_at_with_metadata(np.array([0, 4, 5]))
    np.testing.assert_array_equal(m1["row"], [0, 4, 5])
    # stacked metadata is filled like the data (edge padding inside the episode)
    np.testing.assert_array_equal(m2["row"], [[0, 0, 1], [3, 4, 4], [5, 5, 6]])
    assert stacked.single_metadata_space["row"].shape == (3,)


def test_offset_validation() -> None:
    rb = ArrayBatch(5)
    for bad, msg in (([1, 2], "contain 0"), ([0, -1], "sorted"), ([], "non-empty"), ([[0]], "1-D"),
                     ([0.5, 0], "integers")):
        with pytest.raises(ValueError, match=msg):
            SliceStackedBatch(rb, bad)
    with pytest.raises(ValueError, match="non-negative"):
        FrameStackedBatch(rb, -1, 0)
    with pytest.raises(TypeError, match="BatchBase"):
        FrameStackedBatch([1, 2, 3], 1, 0)  # type: ignore[arg-type]
    view = FrameStackedBatch(rb, 0, 0)
    np.testing.assert_array_equal(view.get_at(np.array([2, 3]))["x"], [[2], [3]])
    with pytest.raises(IndexError):
        view.get_at(5)


def test_empty_index_and_bool_mask() -> None:
    rec = Recorded("torch", 20, [4, 6])
    view = FrameStackedBatch(rec.rb, 1, 1)
    d, m = view.get_at_with_metadata(np.zeros(0, dtype=np.int64))
    assert tuple(d["obs"].shape) == (0, 3, 3) and tuple(m[MASK_KEY].shape) == (0, 3)
    sel = np.zeros(len(rec.rb), dtype=bool)
    sel[[1, 7]] = True
    np.testing.assert_array_equal(view.get_at(sel)["t"].numpy(), view.get_at(np.array([1, 7]))["t"].numpy())


# ---------------------------------------------------------------------------------------------- CombinedBatch
def test_combined_reads_in_caller_order_with_one_read_per_source() -> None:
    a, b = Recorded("torch", 12, [4, 5]), Recorded("torch", 20, [7, 3, 6])
    ca, cb = CountingBatch(a.rb), CountingBatch(b.rb)
    comb = CombinedBatch([ca, cb])
    na, nb = len(a.rb), len(b.rb)
    assert len(comb) == na + nb
    idx = np.array([na + 2, 0, na + 5, 3, 1, na])
    ca.reads.clear(), cb.reads.clear()
    got = comb.get_at(idx)
    assert ca.reads == [3] and cb.reads == [3]
    exp_t = np.concatenate([a.ts, b.ts])[idx]
    np.testing.assert_array_equal(got["t"].numpy(), exp_t)
    np.testing.assert_array_equal(comb.get_at(slice(na - 2, na + 3))["t"].numpy(), np.concatenate([a.ts, b.ts])[na - 2:na + 3])
    assert int(comb.get_at(na + 1)["t"]) == b.ts[1]
    assert int(comb.get_at(-1)["t"]) == b.ts[-1]
    np.testing.assert_array_equal(comb.get_flattened_at(idx).numpy(),
                                  np.concatenate([a.rb.get_flattened_at(slice(None)).numpy(),
                                                  b.rb.get_flattened_at(slice(None)).numpy()])[idx])
    pooled = CombinedBatch([a.rb, b.rb], use_thread_pool=True)
    np.testing.assert_array_equal(pooled.get_at(idx)["t"].numpy(), exp_t)
    pooled.close()
    assert len(a.rb) == na, "closing a view never closes the batches it wraps"


def test_combined_grows_with_its_sources_and_routes_writes() -> None:
    a, b = ArrayBatch(3), ArrayBatch(4, start=100)
    comb = CombinedBatch([a, b])
    comb.set_at(np.array([5, 0, 2]), {"x": np.array([-5, -1, -3])})
    np.testing.assert_array_equal(a.x, [-1, 1, -3])
    np.testing.assert_array_equal(b.x, [100, 101, -5, 103])
    a.x = np.arange(5)
    assert len(comb) == 9
    np.testing.assert_array_equal(comb.get_at(np.array([4, 5]))["x"], [4, 100])
    assert comb.episode_segments() == [(0, 5), (5, 9)]


def test_combined_segments_keep_windows_inside_one_source() -> None:
    a, b = Recorded("numpy", 12, [4, 5], open_tail=2), Recorded("numpy", 9, [3, 6])
    comb = CombinedBatch([a.rb, b.rb])
    segs = comb.episode_segments()
    na = len(a.rb)
    assert segs == [(s, e) for s, e in a.rb.episode_segments()] + [(na - 2, na)] + \
        [(na + s, na + e) for s, e in b.rb.episode_segments()] or segs[0][0] == 0
    view = FrameStackedBatch(comb, 3, 3)
    eps = np.concatenate([a.eps, b.eps + 1000])
    _, meta = view.get_at_with_metadata(np.arange(len(comb)))
    mask, _ = oracle_windows(eps, np.arange(len(comb)), view._offsets)
    np.testing.assert_array_equal(meta[MASK_KEY], mask)


def test_combined_validation_and_metadata() -> None:
    rec = Recorded("torch", 10, [4])
    other = Recorded("numpy", 10, [4])
    with pytest.raises(ValueError, match="backend"):
        CombinedBatch([rec.rb, other.rb])
    with pytest.raises(ValueError, match="at least one"):
        CombinedBatch([])
    with pytest.raises(ValueError, match="space"):
        CombinedBatch([ArrayBatch(2), other.rb])
    with_meta = CountingBatch(rec.rb, metadata=True)
    assert CombinedBatch([with_meta, with_meta]).single_metadata_space is not None
    assert CombinedBatch([with_meta, rec.rb]).single_metadata_space is None
    _, meta = CombinedBatch([with_meta, with_meta]).get_at_with_metadata(np.array([5, 1]))
    np.testing.assert_array_equal(meta["row"].numpy(), [1, 1])


# ---------------------------------------------------------------------------------------------- SubIndexed / SubItem
def test_sub_indexed_batch() -> None:
    rec = Recorded("torch", 30, [5, 6, 4])
    sub = SubIndexedBatch(rec.rb, np.array([1, 2, 3, 4, 5, 6, 14, 13]))
    assert len(sub) == 8
    np.testing.assert_array_equal(sub.get_at(np.array([0, 7]))["t"].numpy(), rec.ts[[1, 13]])
    assert int(sub.get_at(-2)["t"]) == rec.ts[14]
    np.testing.assert_array_equal(sub.get_flattened_at(slice(0, 2)).numpy(),
                                  rec.rb.get_flattened_at(np.array([1, 2])).numpy())
    # episode 0 is frames 0..4, so 1..4 | 5, 6 | 14 | 13 split into runs
    assert sub.episode_segments() == [(0, 4), (4, 6), (6, 7), (7, 8)]
    step = make_step(rec.B, 77, 7, False)
    sub.set_at(1, step)
    assert int(rec.rb.get_at(2)["ep"]) == 77
    assert SubIndexedBatch(rec.rb, slice(2, 8, 2)).sub_indexes.tolist() == [2, 4, 6]
    mask = np.zeros(len(rec.rb), dtype=bool)
    mask[[3, 9]] = True
    assert SubIndexedBatch(rec.rb, mask).sub_indexes.tolist() == [3, 9]
    with pytest.raises(TypeError, match="single int"):
        SubIndexedBatch(rec.rb, 3)
    with pytest.raises(IndexError):
        SubIndexedBatch(rec.rb, np.array([0, 99]))
    windows = FrameStackedBatch(sub, 1, 1)
    np.testing.assert_array_equal(windows.valid_mask_at(np.array([0, 4, 6])),
                                  [[False, True, True], [False, True, True], [False, True, False]])


def test_sub_item_batch() -> None:
    rec = Recorded("torch", 30, [5, 6])
    col = SubItemBatch(rec.rb, "t")
    assert col.single_space == rec.rb.single_space["t"]
    np.testing.assert_array_equal(col.get_at(np.array([0, 6])).numpy(), rec.ts[[0, 6]])
    assert int(col.get_at(3)) == rec.ts[3]
    np.testing.assert_array_equal(col.get_flattened_at(np.array([1, 2])).numpy(), rec.ts[[1, 2]].reshape(2, 1))
    assert col.episode_segments() == rec.rb.episode_segments()
    assert not col.is_mutable
    with pytest.raises(NotImplementedError, match="read-only"):
        col.set_at(0, torch.tensor(1))
    with pytest.raises(KeyError, match="available keys"):
        SubItemBatch(rec.rb, "reward")
    with pytest.raises(TypeError, match="no nested fields"):
        SubItemBatch(rec.rb, ("t", "x"))
    B = NumpyComputeBackend
    nested = ArrayBatch(3)
    nested.single_space = DictSpace(B, {"x": DictSpace(B, {"y": BoxSpace(B, 0, 1, np.float32, shape=(2,))})})
    assert SubItemBatch(nested, ["x", "y"]).single_space.shape == (2,)
    windows = FrameStackedBatch(col, 1, 0)
    np.testing.assert_array_equal(windows.get_at(np.array([5]))[0].numpy(), [rec.ts[5], rec.ts[5]])


# ---------------------------------------------------------------------------------------------- Transformed / backend
def test_transformed_batch_plain_callable_with_inverse() -> None:
    rec = Recorded("torch", 20, [5, 6])

    def double(d: Dict[str, Any]) -> Dict[str, Any]:
        return {**d, "obs": d["obs"] * 2}

    def halve(d: Dict[str, Any]) -> Dict[str, Any]:
        return {**d, "obs": d["obs"] / 2}

    view = TransformedBatch(rec.rb, double, inverse=halve)
    assert view.single_space == rec.rb.single_space and view.is_mutable
    np.testing.assert_array_equal(view.get_at(np.array([1, 2]))["obs"].numpy()[:, 0], 2 * (rec.ts[[1, 2]]))
    one = view.get_at(3)
    assert tuple(one["obs"].shape) == (3,) and float(one["obs"][0]) == 2 * rec.ts[3]
    view.set_at(3, {**one, "obs": torch.full((3,), 50.0)})
    assert float(rec.rb.get_at(3)["obs"][0]) == 25.0
    view.set_at(np.array([0, 1]), {**view.get_at(np.array([0, 1])), "obs": torch.full((2, 3), 8.0)})
    np.testing.assert_array_equal(rec.rb.get_at(np.array([0, 1]))["obs"].numpy(), 4.0)
    assert view.episode_segments() == rec.rb.episode_segments()
    read_only = TransformedBatch(rec.rb, double)
    assert not read_only.is_mutable
    with pytest.raises(NotImplementedError, match="inverse"):
        read_only.set_at(0, one)
    with pytest.raises(TypeError, match="callable"):
        TransformedBatch(rec.rb, 3)


def test_transformed_batch_with_target_space_and_protocol_object() -> None:
    rec = Recorded("numpy", 20, [5, 6])
    B = rec.B
    target = BoxSpace(B, -np.inf, np.inf, np.float32, shape=())
    view = TransformedBatch(rec.rb, lambda d: d["obs"].sum(axis=-1), target_space=target)
    assert view.single_space == target
    np.testing.assert_array_equal(view.get_at(np.array([2, 3])), 3 * (rec.ts[[2, 3]]).astype(np.float32))
    assert view.get_at(2).shape == ()

    class AddOne:
        has_inverse = True

        def get_target_space_from_source(self, space: Any) -> Any:
            return space

        def transform(self, space: Any, data: Any) -> Any:
            assert space is rec.rb.single_space["obs"] or space is rec.rb.single_space
            return {**data, "obs": data["obs"] + 1}

        def direction_inverse(self, space: Any = None) -> Any:
            outer = self

            class Minus:
                def get_target_space_from_source(self, s: Any) -> Any:
                    return s

                def transform(self, s: Any, data: Any) -> Any:
                    return {**data, "obs": data["obs"] - 1}
            return Minus()

    proto = TransformedBatch(rec.rb, AddOne())
    assert proto.is_mutable
    np.testing.assert_array_equal(proto.get_at(np.array([0]))["obs"][0], rec.ts[0] + 1)
    proto.set_at(0, {**proto.get_at(0), "obs": np.full(3, 9, np.float32)})
    np.testing.assert_array_equal(rec.rb.get_at(0)["obs"], 8)


def test_to_backend_or_device_batch() -> None:
    rec = Recorded("numpy", 20, [5, 6])
    view = ToBackendOrDeviceBatch(rec.rb, backend=PyTorchComputeBackend)
    assert view.backend is PyTorchComputeBackend
    got = view.get_at(torch.tensor([1, 7]))
    assert isinstance(got["t"], torch.Tensor) and got["t"].tolist() == rec.ts[[1, 7]].tolist()
    assert isinstance(view.get_flattened_at(np.array([1])), torch.Tensor)
    assert view.episode_segments() == rec.rb.episode_segments()
    view.set_at(2, {**view.get_at(2), "ep": torch.tensor(42)})
    assert int(rec.rb.get_at(2)["ep"]) == 42
    view.set_at(np.array([3, 4]), {**view.get_at(np.array([3, 4])), "ep": torch.tensor([7, 8])})
    np.testing.assert_array_equal(rec.rb.get_at(np.array([3, 4]))["ep"], [7, 8])
    windows = FrameStackedBatch(view, 1, 1)
    d, m = windows.get_at_with_metadata(np.array([0, 4]))
    assert isinstance(d["obs"], torch.Tensor) and m[MASK_KEY].dtype == torch.bool
    with pytest.raises(ValueError, match="backend"):
        ToBackendOrDeviceBatch(rec.rb)
