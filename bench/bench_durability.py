#!/usr/bin/env python
"""The cost of per-episode durability (issue 17): W2-like recording with and without it, in the same run.

A step is W2's "camera" sample: obs f32[64], action f32[8], reward f32, terminated bool, image uint8[128,128,3];
an episode is 100 steps (append per step, `mark_segment_end()` per episode) into a `ReplayBuffer` on disk:

  native     ReplayBuffer over the native layout (DictStorage: the float32 leaves in one memory-mapped row, the bool
             leaf and the image in their own memory-mapped arrays), NumPy backend
  flattened  ReplayBuffer over FlattenedStorage on a memory-mapped NumpyMemmapStorage (one float32 row per step;
             the image is promoted to float32, 4x its bytes)

Each configuration records the same episodes twice per repeat, durable (the default: every ended episode rewrites
the buffer's metadata.json and appends one record to the storage's commit log, `dict_commit.log` /
`flattened_commit.log`, for the memory-mapped leaves) and not (`buffer.durable = False`; one
`flush()` at the end, counted), alternating which goes first; each run gets a new directory. Reported: the median
time per episode of each, their ratio (target: durable <= 1.05x), and the median time of one commit point
(`mark_segment_end()`) with durability. The commit point writes a few small files (create + write + rename each),
so its cost is the file system's metadata latency, not the data: compare the numbers with --dir on tmpfs.

Usage:  .venv/bin/python bench/bench_durability.py [--episodes 10] [--repeats 5] [--dir DIR]
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

STEPS = 100


def make_space() -> Any:
    from unienv_interface.backends import NumpyComputeBackend as B
    from unienv_interface.space import BinarySpace, BoxSpace, DictSpace
    return DictSpace(B, {"obs": BoxSpace(B, -np.inf, np.inf, np.float32, shape=(64,)),
                         "action": BoxSpace(B, -1, 1, np.float32, shape=(8,)),
                         "reward": BoxSpace(B, -np.inf, np.inf, np.float32, shape=()),
                         "terminated": BinarySpace(B, shape=()),
                         "image": BoxSpace(B, 0, 255, np.uint8, shape=(128, 128, 3))})


def make_steps(seed: int = 0) -> List[Dict[str, Any]]:
    rng = np.random.default_rng(seed)
    return [{"obs": rng.standard_normal(64).astype(np.float32), "action": rng.uniform(-1, 1, 8).astype(np.float32),
             "reward": np.float32(rng.standard_normal()), "terminated": np.bool_(t == STEPS - 1),
             "image": rng.integers(0, 256, (128, 128, 3), dtype=np.uint8)} for t in range(STEPS)]


def create(layout: str, path: str, capacity: int) -> Any:
    import warnings

    from unienv_data.replay_buffer import ReplayBuffer
    from unienv_data.storages.dict_storage import DictStorage
    from unienv_data.storages.flattened import FlattenedStorage
    from unienv_data.storages.native_layout import native_layout_kwargs
    from unienv_data.storages.numpy_memmap import NumpyMemmapStorage
    space = make_space()
    if layout == "native":
        return ReplayBuffer.create(DictStorage, space, cache_path=path, capacity=capacity,
                                   **native_layout_kwargs(space))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")     # FlattenPromotionWarning: the image is promoted to float32, on purpose
        return ReplayBuffer.create(FlattenedStorage, space, NumpyMemmapStorage, cache_path=path, capacity=capacity)


def record(layout: str, path: str, steps: List[Dict[str, Any]], episodes: int, durable: bool
           ) -> Tuple[float, List[float]]:
    """Seconds per episode (the final flush of a non-durable run included) and the commit point times."""
    rb = create(layout, path, episodes * STEPS)
    rb.durable = durable
    commits = []
    t0 = time.perf_counter()
    for _ in range(episodes):
        for s in steps:
            rb.append(s)
        c0 = time.perf_counter()
        rb.mark_segment_end()
        commits.append(time.perf_counter() - c0)
    if not durable:
        rb.flush()
    total = time.perf_counter() - t0
    assert len(rb.episode_segments()) == episodes
    rb.close()
    return total / episodes, commits


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--episodes", type=int, default=10, help="episodes per run (default 10)")
    ap.add_argument("--repeats", type=int, default=5, help="runs per configuration and mode (median; default 5)")
    ap.add_argument("--dir", default=None, help="where to write (default: the system temporary directory)")
    ap.add_argument("--layouts", default="native,flattened")
    args = ap.parse_args(argv)
    steps = make_steps()
    root = tempfile.mkdtemp(prefix="bench-durability-", dir=args.dir)
    print(f"per-episode durability, {args.episodes} episodes x {STEPS} steps per run (image uint8[128,128,3] + "
          f"obs/action/reward/terminated), {args.repeats} repeats, in {root}")
    print(f"{'layout':<10} {'durable ms/ep':>14} {'off ms/ep':>10} {'ratio':>7} {'commit ms':>10}  target <= 1.05x")
    worst = 0.0
    try:
        for layout in args.layouts.split(","):
            times: Dict[bool, List[float]] = {True: [], False: []}
            ratios, commit_times = [], []
            record(layout, os.path.join(root, "warmup"), steps, 2, True)        # untimed: imports, page cache
            shutil.rmtree(os.path.join(root, "warmup"))
            for r in range(args.repeats):
                pair = {}
                for durable in ((True, False) if r % 2 == 0 else (False, True)):
                    path = os.path.join(root, f"{layout}-{r}-{durable}")
                    per_ep, commits = record(layout, path, steps, args.episodes, durable)
                    shutil.rmtree(path)
                    times[durable].append(per_ep)
                    pair[durable] = per_ep
                    if durable:
                        commit_times += commits
                ratios.append(pair[True] / pair[False])
            on, off = statistics.median(times[True]), statistics.median(times[False])
            ratio = statistics.median(ratios)
            worst = max(worst, ratio)
            print(f"{layout:<10} {on * 1e3:>14.2f} {off * 1e3:>10.2f} {ratio:>6.3f}x "
                  f"{statistics.median(commit_times) * 1e3:>10.3f}")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"worst ratio {worst:.3f}x ({'meets' if worst <= 1.05 else 'misses'} the 1.05x target)")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))
    raise SystemExit(main())
