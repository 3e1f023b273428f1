"""Next-observation and n-step return views (`unienv_data.batches.transitions`) and `FrameStackedBatch(keys=...)`
on real replay buffers, against brute-force loops over the recorded episodes."""
from __future__ import annotations

import warnings
from typing import Any, Dict, Iterator, List, Sequence, Tuple

import numpy as np
import pytest

from unienv_data.batches import FrameStackedBatch, NextObservationBatch, NStepReturnBatch
from unienv_data.replay_buffer import ReplayBuffer
from unienv_data.storages.flattened import FlattenedStorage
from unienv_data.storages.numpy_memmap import NumpyMemmapStorage
from unienv_interface.backends import NumpyComputeBackend as B
from unienv_interface.space import BinarySpace, BoxSpace, DictSpace

# (length, ends terminal?); mid-episode truncation flags are set on some steps below
EPISODES: Sequence[Tuple[int, bool]] = ((6, True), (1, True), (5, False), (9, True), (2, False))


def space() -> DictSpace:
    f32 = B.dtype_from_name("float32")
    return DictSpace(B, {"observation": BoxSpace(B, -np.inf, np.inf, f32, shape=(2,)),
                         "reward": BoxSpace(B, -np.inf, np.inf, f32, shape=()),
                         "terminated": BinarySpace(B, ()), "truncated": BinarySpace(B, ()),
                         "image": BoxSpace(B, 0, 255, B.dtype_from_name("uint8"), shape=(2, 2))})


class Data:
    def __init__(self, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self.rb = ReplayBuffer.create(FlattenedStorage, space(), inner_storage_cls=NumpyMemmapStorage,
                                          capacity=100)
        self.rows: List[Dict[str, Any]] = []
        self.episodes: List[Tuple[int, int]] = []
        g = 0
        for L, term in EPISODES:
            for t in range(L):
                row = {"observation": np.array([g, t], np.float32), "reward": np.float32(rng.normal()),
                       "terminated": np.array(term and t == L - 1), "truncated": np.array(False),
                       "image": np.full((2, 2), g % 256, np.uint8)}
                self.rb.append(row)
                self.rows.append(row)
            self.rb.mark_segment_end()
            self.episodes.append((g, g + L))
            g += L

    def episode_of(self, i: int) -> Tuple[int, int]:
        return next((s, e) for s, e in self.episodes if s <= i < e)


@pytest.fixture
def data() -> Iterator[Data]:
    d = Data()
    yield d
    d.rb.close()


def test_next_observation_is_the_following_row_of_the_same_episode(data: Data) -> None:
    view = NextObservationBatch(data.rb)
    n = len(data.rows)
    got = view.get_at(np.arange(n))
    for i in range(n):
        s, e = data.episode_of(i)
        valid = i + 1 < e
        assert bool(got["next_valid"][i]) == valid
        want = data.rows[i + 1 if valid else i]["observation"]
        np.testing.assert_array_equal(got["next_observation"][i], want)
        np.testing.assert_array_equal(got["observation"][i], data.rows[i]["observation"])
    one = view[3]
    assert view.single_space.contains(one) and one["next_observation"].tolist() == [0, 4]
    with pytest.raises(ValueError, match="already have the key"):
        NextObservationBatch(data.rb, "observation", next_key="reward")


def brute_n_step(data: Data, i: int, n: int, gamma: float) -> Dict[str, Any]:
    s, e = data.episode_of(i)
    ret, m, done, flagged = 0.0, 0, False, False
    for k in range(n):
        j = i + k
        if j >= e:
            break
        ret += gamma ** k * float(data.rows[j]["reward"])
        m += 1
        if bool(data.rows[j]["terminated"]):
            done = flagged = True
            break
        if bool(data.rows[j]["truncated"]):
            flagged = True
            break
    valid = i + m < e and not flagged
    return {"n_step_return": ret, "n_step_count": m, "n_step_done": done, "next_valid": valid,
            "n_step_discount": 0.0 if done else gamma ** m,
            "next_observation": data.rows[i + m if valid else i + m - 1]["observation"]}


@pytest.mark.parametrize("n", [1, 3, 7])
def test_n_step_returns_match_a_loop_over_each_episode(data: Data, n: int) -> None:
    view = NStepReturnBatch(data.rb, n, 0.9, truncated_key="truncated")
    got = view.get_at(np.arange(len(data.rows)))
    for i in range(len(data.rows)):
        want = brute_n_step(data, i, n, 0.9)
        np.testing.assert_allclose(got["n_step_return"][i], want["n_step_return"], rtol=1e-5, atol=1e-6)
        for k in ("n_step_count", "n_step_done", "next_valid"):
            assert got[k][i] == want[k], (i, k)
        np.testing.assert_allclose(got["n_step_discount"][i], want["n_step_discount"], rtol=1e-6)
        np.testing.assert_array_equal(got["next_observation"][i], want["next_observation"])
    assert got["n_step_return"].dtype == np.float32
    assert view.single_space.contains(view[0])


def test_a_truncation_flag_mid_episode_stops_the_sum_without_terminating() -> None:
    d = Data()
    try:
        i = 14                                 # inside the 9-step episode (rows 12..20)
        d.rb.set_at(i, {**d.rows[i], "truncated": np.array(True)})
        d.rows[i] = {**d.rows[i], "truncated": np.array(True)}
        got = NStepReturnBatch(d.rb, 4, 0.5, truncated_key="truncated").get_at(np.arange(12, 16))
        assert got["n_step_count"].tolist() == [3, 2, 1, 4]
        assert not got["n_step_done"].any() and got["next_valid"].tolist() == [False, False, False, True]
        np.testing.assert_allclose(got["n_step_discount"], [0.125, 0.25, 0.5, 0.0625])
    finally:
        d.rb.close()


def test_n_step_argument_errors(data: Data) -> None:
    with pytest.raises(ValueError, match="n must be a positive int"):
        NStepReturnBatch(data.rb, 0, 0.9)
    with pytest.raises(ValueError, match="gamma"):
        NStepReturnBatch(data.rb, 2, 1.5)
    with pytest.raises(KeyError, match="terminated_key=None"):
        NStepReturnBatch(data.rb, 2, 0.9, terminated_key="done")


def test_frame_stacking_of_chosen_keys_only(data: Data) -> None:
    fs = FrameStackedBatch(data.rb, 2, 0, keys=["image"])
    assert fs.single_space["image"].shape == (3, 2, 2)
    assert fs.single_space["observation"].shape == (2,)
    got = fs.get_at(np.arange(len(data.rows)))
    everything = FrameStackedBatch(data.rb, 2, 0).get_at(np.arange(len(data.rows)))
    np.testing.assert_array_equal(got["image"], everything["image"])          # stacked like before
    for k in ("observation", "reward", "terminated"):
        np.testing.assert_array_equal(got[k], everything[k][:, -1])            # only the anchor frame
    one = fs[7]
    assert one["image"].shape == (3, 2, 2) and one["observation"].shape == (2,)
    assert fs.single_space.contains(one)
    flat = fs.get_flattened_at(np.arange(3))
    assert flat.shape == (3, 2 + 1 + 1 + 1 + 12)
    with pytest.raises(KeyError, match="'depth'"):
        FrameStackedBatch(data.rb, 1, 0, keys=["depth"])
    with pytest.raises(TypeError, match="list of keys"):
        FrameStackedBatch(data.rb, 1, 0, keys="image")
