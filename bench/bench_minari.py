#!/usr/bin/env python
"""MinariAsUniEnvDataset against the raw h5py / pyarrow limit, on a synthetic Minari dataset.

The dataset (written with this project's own Minari writer, `integrations.minari_export`): `--episodes` episodes
of `--steps` steps, float64 observations of 17, float32 actions of 6, float64 rewards (the shape of a MuJoCo
locomotion dataset), in the HDF5 and the Arrow format.

Operations (median of `--repeats`, each on a freshly opened dataset):

  scan    every step, episode by episode (get_episode)                        us per step
  batch   200 batches of 256 random rows across the dataset (get_at), warm    us per batch

Limits: scan, the same reads with h5py (`f["episode_i/observations"][:]`, ...) or pyarrow (`read_all()` per
episode and `to_numpy` per column) and nothing else (no checks, no space); batch, every step already in memory as
one array per key, rows picked with one NumPy fancy index per key.
The table prints ratio = ours / limit (1.0 is the limit; lower is better).

    PYTHONPATH=src python bench/bench_minari.py [--episodes 200] [--steps 500] [--repeats 3]
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from typing import Any, Callable, Dict, List

import numpy as np


class _Source:
    """A synthetic step source with the face `write_minari` reads."""

    def __init__(self, episodes: int, steps: int) -> None:
        from unienv_interface.backends import NumpyComputeBackend as B
        from unienv_interface.space import BinarySpace, BoxSpace, DictSpace
        rng = np.random.default_rng(0)
        self.n = episodes * steps
        self.obs = rng.standard_normal((self.n, 17))
        self.next_obs = rng.standard_normal((self.n, 17))
        self.act = rng.uniform(-1, 1, (self.n, 6)).astype(np.float32)
        self.rew = rng.standard_normal(self.n)
        self.term = np.zeros(self.n, bool)
        self.term[steps - 1::steps] = True
        box = BoxSpace(B, -np.inf, np.inf, np.float64, shape=(17,))
        self.space = DictSpace(B, {"observations": box, "next_observations": box,
                                   "actions": BoxSpace(B, -1, 1, np.float32, shape=(6,)),
                                   "rewards": BoxSpace(B, -np.inf, np.inf, np.float64, shape=()),
                                   "terminations": BinarySpace(B, ()), "truncations": BinarySpace(B, ())})
        self.backend = B
        self._eps = [(s, s + steps) for s in range(0, self.n, steps)]

    def __len__(self) -> int:
        return self.n

    def episodes(self) -> List[Any]:
        return list(self._eps)

    def read(self, rows: np.ndarray) -> Dict[str, Any]:
        return {"observations": self.obs[rows], "next_observations": self.next_obs[rows], "actions": self.act[rows],
                "rewards": self.rew[rows], "terminations": self.term[rows], "truncations": np.zeros(rows.size, bool)}


def _ours_scan(path: str) -> float:
    from unienv_data.integrations.minari import MinariAsUniEnvDataset
    d = MinariAsUniEnvDataset.from_local(path)
    t = time.perf_counter()
    for e in range(d.num_episodes):
        d.get_episode(e)
    dt = time.perf_counter() - t
    d.close()
    return dt


def _ours_batch(path: str, batches: List[np.ndarray]) -> float:
    from unienv_data.integrations.minari import MinariAsUniEnvDataset
    d = MinariAsUniEnvDataset.from_local(path)
    for idx in batches[:5]:
        d.get_at(idx)          # warm the column cache
    t = time.perf_counter()
    for idx in batches:
        d.get_at(idx)
    dt = time.perf_counter() - t
    d.close()
    return dt


def _raw_episodes(path: str, fmt: str, episodes: int) -> Callable[[int], Dict[str, np.ndarray]]:
    if fmt == "hdf5":
        import h5py
        f = h5py.File(os.path.join(path, "data", "main_data.hdf5"), "r")

        def read(e: int) -> Dict[str, np.ndarray]:
            g = f[f"episode_{e}"]
            return {k: g[k][:] for k in ("observations", "actions", "rewards", "terminations", "truncations")}
        return read
    import pyarrow as pa
    import pyarrow.ipc  # noqa: F401

    def read_arrow(e: int) -> Dict[str, np.ndarray]:
        with pa.memory_map(os.path.join(path, "data", str(e), "part-0.arrow"), "r") as src:
            t = pa.ipc.open_file(src).read_all()
        out = {}
        for k in ("observations", "actions", "rewards", "terminations", "truncations"):
            col = t.column(k).combine_chunks()
            if pa.types.is_fixed_size_list(col.type):
                out[k] = col.flatten().to_numpy().reshape(len(col), -1)
            else:
                out[k] = col.to_numpy(zero_copy_only=False)
        return out
    return read_arrow


def _raw_scan(path: str, fmt: str, episodes: int) -> float:
    read = _raw_episodes(path, fmt, episodes)
    t = time.perf_counter()
    for e in range(episodes):
        read(e)
    return time.perf_counter() - t


def _raw_batch(path: str, fmt: str, episodes: int, steps: int, batches: List[np.ndarray]) -> float:
    read = _raw_episodes(path, fmt, episodes)
    parts = [read(e) for e in range(episodes)]   # the limit: every step already in memory, one array per key
    keys = ("observations", "actions", "rewards", "terminations", "truncations")
    whole = {k: np.concatenate([p[k][:steps] for p in parts]) for k in keys}
    t = time.perf_counter()
    for idx in batches:
        for k in keys:
            whole[k][idx]
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--episodes", type=int, default=200)
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    from unienv_data.integrations.minari_export import write_minari
    src = _Source(args.episodes, args.steps)
    rng = np.random.default_rng(1)
    batches = [rng.integers(0, src.n, 256) for _ in range(200)]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for fmt in ("hdf5", "arrow"):
            path = os.path.join(tmp, f"bench-{fmt}-v0")
            write_minari(src, path, data_format=fmt)
            ours_s = statistics.median(_ours_scan(path) for _ in range(args.repeats))
            raw_s = statistics.median(_raw_scan(path, fmt, args.episodes) for _ in range(args.repeats))
            ours_b = statistics.median(_ours_batch(path, batches) for _ in range(args.repeats))
            raw_b = statistics.median(_raw_batch(path, fmt, args.episodes, args.steps, batches)
                                      for _ in range(args.repeats))
            rows.append((fmt, "scan", ours_s / src.n * 1e6, raw_s / src.n * 1e6, "us/step"))
            rows.append((fmt, "batch", ours_b / len(batches) * 1e6, raw_b / len(batches) * 1e6, "us/batch"))
    print(f"Minari reads, {args.episodes} episodes x {args.steps} steps, median of {args.repeats}")
    print(f"{'format':8}{'op':8}{'ours':>12}{'limit':>12}{'ratio':>8}  unit")
    for fmt, op, ours, lim, unit in rows:
        print(f"{fmt:8}{op:8}{ours:12.2f}{lim:12.2f}{ours / lim:8.2f}  {unit}")


if __name__ == "__main__":
    main()
