"""`unienv_data.stats` and `unienv-data stats`: streamed statistics against NumPy on the whole data."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any, Dict, Iterator

import numpy as np
import pytest

from unienv_data.base.errors import StorageFormatError, StorageNotFoundError
from unienv_data.replay_buffer import ReplayBuffer
from unienv_data.stats import (QUANTILES, STAT_NAMES, StatsAccumulator, compute_stats, read_stats, stats_path,
                               write_stats)
from unienv_data.storages.dict_storage import DictStorage
from unienv_data.storages.numpy_memmap import NumpyMemmapStorage
from unienv_interface.backends import NumpyComputeBackend as B
from unienv_interface.space import BinarySpace, BoxSpace, DictSpace

N = 517


def space() -> DictSpace:
    return DictSpace(B, {
        "observation.image": BoxSpace(B, 0, 255, B.dtype_from_name("uint8"), shape=(6, 5, 3)),
        "obs": DictSpace(B, {"pos": BoxSpace(B, -np.inf, np.inf, B.dtype_from_name("float64"), shape=(4,))}),
        "reward": BoxSpace(B, -np.inf, np.inf, B.dtype_from_name("float32"), shape=()),
        "done": BinarySpace(B, ()),
    })


def values(seed: int = 0) -> Dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"observation.image": rng.integers(0, 256, (N, 6, 5, 3), dtype=np.uint8),
            "obs/pos": rng.normal([1, -2, 3, 1e6], [0.1, 5, 1, 3], size=(N, 4)),
            "reward": rng.exponential(2.0, N).astype(np.float32),
            "done": rng.random(N) < 0.1}


@pytest.fixture
def dataset(tmp_path: Path) -> Iterator[Any]:
    v = values()
    path = tmp_path / "ds"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rb = ReplayBuffer.create(DictStorage, space(), {"observation.image": NumpyMemmapStorage,
                                                        "obs/pos": NumpyMemmapStorage, "reward": NumpyMemmapStorage,
                                                        "done": NumpyMemmapStorage}, cache_path=path, capacity=N)
    rb.extend({"observation.image": v["observation.image"], "obs": {"pos": v["obs/pos"]}, "reward": v["reward"],
               "done": v["done"]})
    rb.dumps(path)
    yield rb, v, path
    rb.close()


def numpy_stats(x: np.ndarray) -> Dict[str, np.ndarray]:
    x = np.asarray(x, dtype=np.float64)
    flat = x.reshape(-1, x.shape[-1]) if x.ndim > 2 else x
    out = {"mean": flat.mean(0), "std": flat.std(0), "min": flat.min(0), "max": flat.max(0)}
    for name, q in QUANTILES.items():
        out[name] = np.quantile(flat, q, axis=0)
    return out


@pytest.mark.parametrize("chunk", [1, 64, 10_000])
def test_streamed_stats_equal_numpy_on_the_whole_data(dataset: Any, chunk: int) -> None:
    rb, v, _ = dataset
    doc = compute_stats(rb, chunk_size=chunk)
    assert doc["steps"] == N and set(doc["features"]) == set(v)
    for key, x in v.items():
        want = numpy_stats(x)
        got = doc["features"][key]
        for name in STAT_NAMES:
            np.testing.assert_allclose(got[name], want[name], rtol=1e-9, atol=1e-9, err_msg=f"{key} {name}")
    assert np.shape(doc["features"]["observation.image"]["mean"]) == (3,)      # per channel
    assert np.shape(doc["features"]["obs/pos"]["std"]) == (4,)
    assert np.shape(doc["features"]["reward"]["q50"]) == ()
    assert doc["features"]["observation.image"]["count"] == N * 30


def test_quantiles_from_a_bounded_reservoir_are_close() -> None:
    rng = np.random.default_rng(1)
    x = rng.normal(size=(200_000, 2)) * [1.0, 10.0]
    acc = StatsAccumulator(reservoir_size=20_000, seed=0)
    for s in range(0, x.shape[0], 7_000):
        acc.update({"x": x[s:s + 7_000]})
    res = acc.result()["x"]
    assert acc.leaves["x"].reservoir.shape == (20_000, 2)
    for name, q in QUANTILES.items():
        exact = np.quantile(x, q, axis=0)
        rank = np.array([(x[:, j] <= res[name][j]).mean() for j in range(2)])
        assert np.all(np.abs(rank - q) < 0.01), (name, rank, exact)
    np.testing.assert_allclose(res["mean"], x.mean(0), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(res["std"], x.std(0), rtol=1e-10)


def test_written_beside_the_dataset_atomically_and_read_back(dataset: Any) -> None:
    rb, v, path = dataset
    doc = compute_stats(rb, keys=["reward", "obs/pos"])
    target = write_stats(path, doc)
    assert target == str(path / "stats.json") == stats_path(path)
    assert not [p for p in os.listdir(path) if p.endswith(".tmp")]
    back = read_stats(path)
    assert set(back) == {"reward", "obs/pos"}
    np.testing.assert_allclose(back["obs/pos"]["mean"], v["obs/pos"].mean(0), rtol=1e-12)
    assert ReplayBuffer.load_from(path, backend=B).get_at(0)["reward"] == v["reward"][0]     # dataset still loads
    with pytest.raises(KeyError, match="no key"):
        compute_stats(rb, keys=["nope"])


def test_missing_or_damaged_stats_files(tmp_path: Path) -> None:
    with pytest.raises(StorageNotFoundError, match="unienv-data stats"):
        read_stats(tmp_path)
    (tmp_path / "stats.json").write_text(json.dumps({"format_version": 99, "features": {}}))
    with pytest.raises(StorageFormatError, match="format_version 99"):
        read_stats(tmp_path)
    (tmp_path / "stats.json").write_text(json.dumps({"format_version": 1, "features": {"a": {"mean": 1}}}))
    with pytest.raises(StorageFormatError, match="lacks"):
        read_stats(tmp_path)


def test_cli_stats_writes_the_file_and_matches_numpy(dataset: Any) -> None:
    rb, v, path = dataset
    rb.close()
    env = dict(os.environ)
    proc = subprocess.run([sys.executable, "-m", "unienv_data", "stats", str(path), "--json", "-q", "--chunk", "100"],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["path"] == str(path / "stats.json") and (path / "stats.json").is_file()
    back = read_stats(path)
    for key, x in v.items():
        want = numpy_stats(x)
        for name in STAT_NAMES:
            np.testing.assert_allclose(back[key][name], want[name], rtol=1e-9, atol=1e-9, err_msg=f"{key} {name}")
    text = subprocess.run([sys.executable, "-m", "unienv_data", "stats", str(path), "--keys", "reward", "-q"],
                          capture_output=True, text=True, timeout=300, env=env)
    assert text.returncode == 0 and "reward" in text.stdout and "obs/pos" not in text.stdout
    bad = subprocess.run([sys.executable, "-m", "unienv_data", "stats", str(path), "--keys", "nope"],
                         capture_output=True, text=True, timeout=300, env=env)
    assert bad.returncode == 1 and "unknown key(s) ['nope']" in bad.stderr
