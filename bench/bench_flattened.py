#!/usr/bin/env python
"""FlattenedStorage against the raw-numpy limit, on workload W1, in one process.

Configs (each a FlattenedStorage over one inner storage, capacity = number of steps):

  torch-memmap  PytorchTensorStorage, memory-mapped (cache_path)     limit: raw-disk
  torch-ram     PytorchTensorStorage, in RAM                         limit: raw-ram
  numpy-memmap  NumpyMemmapStorage, memory-mapped (numpy backend)    limit: raw-disk

Limits (one plain ndarray per key, native dtype, no checks; bench/_flat_limits.py):

  raw-disk  np.memmap(..., mode="w+") per key, used through .view(np.ndarray); reopen = small json + np.memmap("r")
  raw-ram   np.empty + fill(0) per key (pages faulted in up front); reopen = np.save per key + np.load
  Both are fed NumPy per-step rows: the issue's definition, and the ratio the verdict uses. The torch configs are
  fed torch tensors, so they also get a second limit row, raw-disk-torch / raw-ram-torch: the same plain arrays fed
  the same torch tensors (`a[i] = t.numpy()` per key, batches returned as tensors, slices cloned as plain tensors),
  which shows what is left once the cost of torch inputs themselves is set aside.

Operations (each timed over the whole plan, reported per unit):

  append  mark_segment_start / append per step / mark_segment_end per episode     us per step
  bulk    set(slice(s, e), chunk) in chunks of 1,000 steps, on a fresh storage     us per step
  batch   get(idx), 200 batches of 256 random indices (torch int64 / numpy index)  us per batch
  slice   get(slice(o, o + 64)), 200 slices, every leaf copied out (clone)        us per slice
  reopen  dumps + close + load_from(path, space) + one get (the first batch)      us per reopen

An untimed warm-up pass first runs every op once per config (lazy imports, first-use caches) and checks the
contents against the workload after append, bulk and reopen. Then every repeat runs every config and both limits
(order reversed on odd repeats); the table shows the median per op and ratio = median(ours) / median(limit).

Files: _flat_workloads.py (W1, read plan, contender interface), _flat_limits.py, _flat_contenders.py (ours),
_flat_report.py (timing, profiling); this script runs them and prints the table.

Usage:  .venv/bin/python bench/bench_flattened.py [--quick] [--repeats N] [--json PATH] [--profile]
"""
from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from typing import Any, Dict, List, Optional  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)
try:
    torch.set_num_interop_threads(1)
except RuntimeError:
    pass

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _flat_contenders import CONFIGS, Flat, FlatNumpyMemmap, FlatTorchMemmap, FlatTorchRam  # noqa: E402,F401
from _flat_limits import LIMITS, RawDisk, RawRam  # noqa: E402,F401
from _flat_report import fmt_us, one_repeat, profile_op  # noqa: E402
from _flat_workloads import (EPISODES, OPS, QUICK_EPISODES, TARGETS, UNITS, Contender,  # noqa: E402,F401
                             load_plan)

def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help=f"smoke run: {QUICK_EPISODES} episodes instead of {EPISODES}")
    ap.add_argument("--repeats", type=int, default=3, help="repeats per config (median is reported); default 3")
    ap.add_argument("--json", metavar="PATH", help="write all measurements and ratios to PATH")
    ap.add_argument("--configs", default="torch-memmap,torch-ram,numpy-memmap",
                    help="comma-separated subset of torch-memmap,torch-ram,numpy-memmap")
    ap.add_argument("--no-warmup", action="store_true",
                    help="skip the untimed warm-up pass (it loads lazy imports and checks every config's contents)")
    ap.add_argument("--profile", action="store_true",
                    help="after the table, cProfile every op whose ratio is over its target")
    args = ap.parse_args(argv)
    if args.repeats < 1:
        ap.error("--repeats must be >= 1")

    t_start = time.perf_counter()
    plan = load_plan(args.quick)
    available = CONFIGS
    wanted = [s.strip() for s in args.configs.split(",") if s.strip()]
    for w in wanted:
        if w not in available:
            ap.error(f"unknown config {w!r}; choose from {sorted(available)}")
    ours: List[Contender] = [available[w]() for w in wanted]
    limits: Dict[str, Contender] = {}
    for c in ours:
        for name in (c.limit, c.same_limit):
            if name and name not in limits:
                limits[name] = LIMITS[name]()
    everyone: List[Contender] = ours + list(limits.values())
    for c in everyone:
        c.prepare(plan)
    gc.collect()
    gc.freeze()   # the prepared per-step inputs are never walked by the collector

    samples: Dict[str, Dict[str, List[float]]] = {c.name: {op: [] for op in OPS} for c in everyone}
    root = tempfile.mkdtemp(prefix="bench-flattened-")
    try:
        if not args.no_warmup:
            for c in everyone:
                one_repeat(c, plan, root, -1, verify=True)
        for r in range(args.repeats):
            order = everyone if r % 2 == 0 else everyone[::-1]
            for c in order:
                for op, us in one_repeat(c, plan, root, r, verify=(r == 0 and args.no_warmup)).items():
                    samples[c.name][op].append(us)

        med = {name: {op: statistics.median(v) for op, v in ops.items()} for name, ops in samples.items()}
        results: Dict[str, Any] = {}
        for c in ours:
            rows = {}
            for op in OPS:
                ratio = med[c.name][op] / med[c.limit][op]
                rows[op] = {"unit": UNITS[op], "ours_us": med[c.name][op], "limit_us": med[c.limit][op],
                            "ratio": ratio, "target": TARGETS[op], "pass": ratio <= TARGETS[op],
                            "ours_samples_us": samples[c.name][op], "limit_samples_us": samples[c.limit][op]}
                if c.same_limit:
                    rows[op].update({"same_input_limit_us": med[c.same_limit][op],
                                     "same_input_ratio": med[c.name][op] / med[c.same_limit][op],
                                     "same_input_limit_samples_us": samples[c.same_limit][op]})
            results[c.name] = {"label": c.label, "medium": c.medium, "limit": c.limit,
                               "same_input_limit": c.same_limit or None, "ops": rows,
                               "warnings": list(getattr(c, "caught", []))}

        print(f"FlattenedStorage vs raw-numpy limit, W1: {plan.n} steps ({len(plan.episodes)} episodes), "
              f"{args.repeats} repeat(s), medians; single-threaded")
        print(f"data: {plan.source}")
        print(f"numpy {np.__version__}, torch {torch.__version__}, python {platform.python_version()}, "
              f"{os.cpu_count()} cpu(s), temp dir {root}")
        for c in ours:
            lim = limits[c.limit]
            print(f"\n{c.label}   vs   {lim.name}: {lim.label}")
            same = limits[c.same_limit] if c.same_limit else None
            if same is not None:
                print(f"  same-input limit {same.name}: {same.label}")
            extra = f" {'same-in':>9} {'ratio':>8}" if same is not None else ""
            print(f"  {'op':<7} {'unit':<10} {'ours':>9} {'limit':>9} {'ratio':>8} {'target':>7}  verdict{extra}")
            for op, row in results[c.name]["ops"].items():
                tail = (f" {fmt_us(row['same_input_limit_us']):>9} {row['same_input_ratio']:>7.2f}x"
                        if same is not None else "")
                print(f"  {op:<7} {row['unit']:<10} {fmt_us(row['ours_us']):>9} {fmt_us(row['limit_us']):>9} "
                      f"{row['ratio']:>7.2f}x {'<=' + format(row['target'], '.1f') + 'x':>7}  "
                      f"{'PASS' if row['pass'] else 'over':<7}{tail}")
            for w in results[c.name]["warnings"]:
                print(f"  note: {w[:300]}")
        over = [(c, op) for c in ours for op in OPS if not results[c.name]["ops"][op]["pass"]]
        print(f"\n{len(over)} of {len(ours) * len(OPS)} ratios over target"
              + (": " + ", ".join(f"{c.name}/{op}" for c, op in over) if over else ""))
        print("ratio = median(ours) / median(limit); verdicts use the NumPy-fed limit (the issue's definition); "
              "same-in = the same plain arrays fed the same torch tensors. Under ~1.5x apart in one run can be "
              "noise on a shared machine.")
        try:
            print(f"load average (1, 5, 15 min) at the end: {os.getloadavg()}")
        except OSError:
            pass

        profiles: Dict[str, str] = {}
        if args.profile and over:
            for c, op in over:
                text = profile_op(c, op, root)
                profiles[f"{c.name}/{op}"] = text
                print("\n" + text)

        elapsed = time.perf_counter() - t_start
        print(f"\ntotal {elapsed:.1f} s")
        if args.json:
            doc = {"workload": "W1", "n_steps": plan.n, "episodes": len(plan.episodes), "quick": args.quick,
                   "repeats": args.repeats, "data_source": plan.source, "targets": TARGETS, "units": UNITS,
                   "versions": {"numpy": np.__version__, "torch": torch.__version__,
                                "python": platform.python_version()},
                   "results": results, "limits": {name: med[name] for name in limits}, "profiles": profiles,
                   "elapsed_s": elapsed}
            os.makedirs(os.path.dirname(os.path.abspath(args.json)) or ".", exist_ok=True)
            with open(args.json, "w") as f:
                json.dump(doc, f, indent=2)
            print(f"wrote {args.json}")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
