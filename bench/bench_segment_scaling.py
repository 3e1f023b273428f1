#!/usr/bin/env python
"""What an episode costs as the buffer holds more of them: bookkeeping that must not grow with the episode count.

A durable `ReplayBuffer` on disk (native layout or FlattenedStorage over memory-mapped files, W2's camera step:
obs f32[64], action f32[8], reward, terminated, image uint8[128,128,3]) is filled with `held` short episodes
(`--steps` steps each) until its ring wraps, then records `--measure` more episodes; every episode then overwrites
the oldest ones (the ring's steady state: the capacity is no multiple of the episode length, so an episode starts
part way into the oldest one, clips it, then drops the next; the commit logs record each change). Reported per `held`: the median time of one episode (its appends and its
`mark_segment_end()`), of its commit point alone, and the ratio of the episode time to the raw limit measured in the
same run (the same rows written into plain `np.memmap` arrays, no bookkeeping). Before segment bookkeeping was
indexed (2026-12-03) a 2-step episode cost 3.5 ms of commit and 10 ms of appends at 2,400 episodes held and grew
linearly; what is left grows by a few list copies per episode.

Usage:  .venv/bin/python bench/bench_segment_scaling.py [--held 100,1000,4000] [--steps 2] [--measure 200]
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_durability import create, make_steps  # noqa: E402


def raw_episode_time(root: str, steps: List[Dict[str, Any]], capacity: int, episodes: int) -> float:
    """Median seconds to write one episode's rows into plain memory-mapped arrays (the limit)."""
    arrays = {k: np.lib.format.open_memmap(os.path.join(root, f"raw-{k}.npy"), mode="w+",
                                           dtype=np.asarray(v).dtype, shape=(capacity,) + np.shape(v))
              for k, v in steps[0].items()}
    row, times = 0, []
    for _ in range(episodes):
        t0 = time.perf_counter()
        for s in steps:
            for k, v in s.items():
                arrays[k][row] = v
            row = (row + 1) % capacity
        times.append(time.perf_counter() - t0)
    del arrays
    return statistics.median(times)


def record(layout: str, path: str, steps: List[Dict[str, Any]], held: int, measure: int) -> Tuple[float, float, int]:
    """(median seconds per episode, median seconds per commit point, episodes listed at the end) once the ring of
    `held` episodes has wrapped."""
    # a capacity that is no multiple of the episode length: every episode clips the oldest one part way (the usual
    # case; episodes that line up with the ring would only ever drop whole ones)
    rb = create(layout, path, held * len(steps) + max(1, len(steps) // 2))
    per_episode, commits = [], []
    for ep in range(held + measure):
        t0 = time.perf_counter()
        for s in steps:
            rb.append(s)
        c0 = time.perf_counter()
        rb.mark_segment_end()
        t1 = time.perf_counter()
        if ep >= held:
            per_episode.append(t1 - t0)
            commits.append(t1 - c0)
    listed = len(rb.episode_segments())
    rb.close()
    return statistics.median(per_episode), statistics.median(commits), listed


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--held", default="100,1000,4000", help="episodes the ring holds, comma-separated")
    ap.add_argument("--steps", type=int, default=2, help="steps per episode (default 2: bookkeeping dominates)")
    ap.add_argument("--measure", type=int, default=200, help="episodes timed after the ring wrapped (default 200)")
    ap.add_argument("--layouts", default="native,flattened")
    ap.add_argument("--dir", default=None, help="where to write (default: the system temporary directory)")
    args = ap.parse_args(argv)
    steps = make_steps()[:args.steps]
    root = tempfile.mkdtemp(prefix="bench-segment-scaling-", dir=args.dir)
    helds = [int(h) for h in args.held.split(",")]
    print(f"{args.steps}-step episodes into a wrapped ring holding N of them; median of {args.measure} episodes")
    print(f"{'layout':<10} {'N held':>7} {'ms/episode':>11} {'commit ms':>10} {'raw ms':>8} {'x raw':>7}")
    try:
        for layout in args.layouts.split(","):
            for held in helds:
                raw = raw_episode_time(root, steps, held * args.steps, args.measure)
                path = os.path.join(root, f"{layout}-{held}")
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    per_ep, commit, listed = record(layout, path, steps, held, args.measure)
                shutil.rmtree(path)
                print(f"{layout:<10} {held:>7} {per_ep * 1e3:>11.3f} {commit * 1e3:>10.3f} {raw * 1e3:>8.3f} "
                      f"{per_ep / raw:>6.1f}x   ({listed} episodes listed)")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))
    raise SystemExit(main())
