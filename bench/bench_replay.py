#!/usr/bin/env python
"""ReplayBuffer sampling against a plain NumPy gather of the same rows, measured in the same process.

  W1 (flat)    ReplayBuffer(FlattenedStorage(PytorchTensorStorage, memmap)), obs f32[64], action f32[8],
               reward f32, terminated bool; 50 episodes x 400 steps
  W2 (native)  ReplayBuffer(DictStorage from native_layout_kwargs), W1 + image uint8[128,128,3]; 10 x 300 steps
  limit        one np.memmap array per key (native dtype), rng.integers + fancy index per key

Reported: sample(256) (StepSampler), window sampling 16 x 256 (SliceSampler) against the same 16*256-row gather,
each as median us per call and ratio to the limit measured interleaved with it.

Usage:  .venv/bin/python bench/bench_replay.py [--quick] [--repeats N]
"""
from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from typing import Any, Callable, Dict, List, Tuple  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)

from unienv_interface.backends.pytorch import PyTorchComputeBackend as TB  # noqa: E402
from unienv_interface.space import BinarySpace, BoxSpace, DictSpace  # noqa: E402
from unienv_data.replay_buffer import ReplayBuffer  # noqa: E402
from unienv_data.samplers import SliceSampler, StepSampler  # noqa: E402
from unienv_data.storages.dict_storage import DictStorage  # noqa: E402
from unienv_data.storages.flattened import FlattenedStorage  # noqa: E402
from unienv_data.storages.native_layout import native_layout_kwargs  # noqa: E402
from unienv_data.storages.pytorch import PytorchTensorStorage  # noqa: E402


def make_data(episodes: int, steps: int, image: bool, seed: int = 0) -> Dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    n = episodes * steps
    data = {"obs": rng.standard_normal((n, 64), dtype=np.float32),
            "action": rng.uniform(-1, 1, (n, 8)).astype(np.float32),
            "reward": rng.standard_normal(n, dtype=np.float32),
            "terminated": (np.arange(n) % steps) == steps - 1}
    if image:
        data["image"] = rng.integers(0, 256, (n, 128, 128, 3), dtype=np.uint8)
    return data


def make_space(image: bool) -> DictSpace:
    sp = {"obs": BoxSpace(TB, -np.inf, np.inf, torch.float32, shape=(64,)),
          "action": BoxSpace(TB, -1.0, 1.0, torch.float32, shape=(8,)),
          "reward": BoxSpace(TB, -np.inf, np.inf, torch.float32, shape=()),
          "terminated": BinarySpace(TB, ())}
    if image:
        sp["image"] = BoxSpace(TB, 0, 255, torch.uint8, shape=(128, 128, 3))
    return DictSpace(TB, sp)


def fill(rb: ReplayBuffer, data: Dict[str, np.ndarray], steps: int) -> None:
    n = len(next(iter(data.values())))
    for s in range(0, n, steps):
        w = rb.open_segment_writer()
        chunk = {k: torch.from_numpy(v[s:s + steps]) for k, v in data.items()}
        for i in range(steps):
            w.append({k: t[i] for k, t in chunk.items()})
        rb.commit_segment(w)


def raw_arrays(root: str, data: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
    out = {}
    for k, v in data.items():
        a = np.memmap(os.path.join(root, k + ".bin"), mode="w+", dtype=v.dtype, shape=v.shape).view(np.ndarray)
        a[...] = v
        out[k] = a
    return out


def timed(fn: Callable[[], Any], calls: int) -> float:
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls * 1e6


def run(name: str, rb: ReplayBuffer, raw: Dict[str, np.ndarray], repeats: int, calls: int) -> List[Tuple[str, float, float]]:
    n = len(rb)
    step = StepSampler(rb, 256, seed=0)
    window = SliceSampler(rb, 256, 16, seed=0)
    rng = np.random.default_rng(0)

    def raw_sample() -> Any:
        idx = rng.integers(0, n, 256)
        return {k: a[idx] for k, a in raw.items()}

    def raw_window() -> Any:
        starts = rng.integers(0, n - 16, 256)
        idx = (starts[:, None] + np.arange(16)).reshape(-1)
        return {k: a[idx] for k, a in raw.items()}

    rows: Dict[str, Tuple[List[float], List[float]]] = {"sample(256)": ([], []), "window 16x256": ([], [])}
    for r in range(repeats):
        pairs = [("sample(256)", step.sample, raw_sample), ("window 16x256", window.sample, raw_window)]
        for op, ours, lim in (pairs if r % 2 == 0 else pairs[::-1]):
            rows[op][0].append(timed(ours, calls))
            rows[op][1].append(timed(lim, calls))
    out = []
    for op, (o, lim) in rows.items():
        out.append((f"{name} {op}", statistics.median(o), statistics.median(lim)))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller workloads and fewer calls")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="unienv-bench-replay-")
    results = []
    try:
        eps1, eps2 = (10, 3) if args.quick else (50, 10)
        calls = 20 if args.quick else 100
        d1 = make_data(eps1, 400, False)
        rb1 = ReplayBuffer.create(FlattenedStorage, make_space(False), inner_storage_cls=PytorchTensorStorage,
                                  cache_path=os.path.join(root, "w1"), capacity=eps1 * 400, is_memmap=True)
        fill(rb1, d1, 400)
        results += run("W1 flat", rb1, raw_arrays(tempfile.mkdtemp(dir=root), d1), args.repeats, calls)
        rb1.close()
        d2 = make_data(eps2, 300, True)
        sp2 = make_space(True)
        with warnings.catch_warnings():
            warnings.simplefilter("error")      # the native layout must not promote anything
            rb2 = ReplayBuffer.create(DictStorage, sp2, cache_path=os.path.join(root, "w2"), capacity=eps2 * 300,
                                      **native_layout_kwargs(sp2))
        fill(rb2, d2, 300)
        results += run("W2 native", rb2, raw_arrays(tempfile.mkdtemp(dir=root), d2), args.repeats, max(5, calls // 5))
        rb2.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"{'op':28s} {'ours us':>10s} {'limit us':>10s} {'ratio':>7s}  target")
    for op, ours, lim in results:
        target = "<=1.5x" if "sample" in op else "report"
        print(f"{op:28s} {ours:10.1f} {lim:10.1f} {ours / lim:6.2f}x  {target}")
    print("ratio = median(ours) / median(limit), measured interleaved in this process; under ~1.5x apart can be noise.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
