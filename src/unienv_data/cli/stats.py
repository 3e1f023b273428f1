"""`unienv-data stats PATH`: per-feature normalisation statistics, written beside the dataset as `stats.json`.

For every numeric key: mean, std, min, max and the quantiles q01, q10, q50, q90, q99, streamed over the dataset
`--chunk` steps at a time (memory stays bounded). Keys with 0 or 1 axes per step get one value per entry; keys
with more axes (cameras) get one value per entry of their last axis (per channel). Quantiles are exact while a
key has at most `--reservoir` values per entry, else estimated from a uniform random sample of that many values.
`WindowDataset(..., stats=PATH, normalize={...})` and `unienv_data.stats.read_stats(PATH)` read the file back.
"""
from __future__ import annotations

import argparse
import os
from typing import Any, List

import numpy as np

from ._common import CLIError, Progress, add_backend_flag, add_output_flags, print_json, table


def add_parser(sub: Any) -> None:
    p = sub.add_parser("stats", help="per-key mean, std, min, max and quantiles, written to PATH/stats.json",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("path", metavar="PATH", help="dataset directory (or one .memmap array file)")
    p.add_argument("--keys", default=None, help="comma-separated keys (default: every numeric key)")
    p.add_argument("--chunk", type=int, default=1024, help="steps read at a time (default 1024)")
    p.add_argument("--reservoir", type=int, default=100_000,
                   help="values kept per entry for the quantiles (default 100000; exact below that)")
    p.add_argument("--seed", type=int, default=0, help="seed of the quantile sample (default 0)")
    p.add_argument("--out", metavar="FILE", default=None,
                   help="where to write the statistics (default: stats.json beside the dataset)")
    add_backend_flag(p)
    add_output_flags(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from unienv_data.inspect import open_dataset
    from unienv_data.stats import compute_stats, stats_path, write_stats
    path = os.path.abspath(args.path)
    if args.chunk < 1 or args.reservoir < 1:
        raise CLIError("--chunk and --reservoir must be positive", code=2)
    with open_dataset(path, backend=args.backend) as ds:
        images = set(ds.image_keys())
        numeric = [k for k, sp in ds.leaf_spaces.items() if _is_numeric(sp)]
        if args.keys:
            wanted = [k.strip() for k in args.keys.split(",") if k.strip()]
            unknown = [k for k in wanted if k not in ds.leaf_spaces]
            if unknown:
                raise CLIError(f"unknown key(s) {unknown}; the dataset's keys are {sorted(ds.leaf_spaces)}")
            keys = wanted
        else:
            keys = numeric
        if not keys:
            raise CLIError("the dataset has no numeric key to compute statistics of")
        if len(ds) == 0:
            raise CLIError("the dataset is empty: there is nothing to compute statistics of")
        bar = Progress(len(ds), "stats", enabled=not args.quiet)
        doc = compute_stats(ds.obj, keys=keys, chunk_size=args.chunk, reservoir_size=args.reservoir, seed=args.seed,
                            read_chunk=lambda idx: ds.read_numpy(idx, keys), progress=bar.update)
        bar.close()
    target = os.path.abspath(args.out) if args.out else stats_path(path)
    write_stats(target, doc)
    if args.json:
        print_json({"path": target, **doc})
        return 0
    rows: List[List[str]] = [["key", "shape", "mean", "std", "min", "max", "q50"]]
    for k, f in doc["features"].items():
        rows.append([k + (" (per channel)" if k in images else ""), str(np.shape(f["mean"])),
                     _fmt(f["mean"]), _fmt(f["std"]), _fmt(f["min"]), _fmt(f["max"]), _fmt(f["q50"])])
    print(f"{doc['steps']} steps; statistics written to {target}")
    print("\n".join(table(rows)))
    return 0


def _is_numeric(space: Any) -> bool:
    dtype = getattr(space, "dtype", None)
    if dtype is None:
        return False
    try:
        return np.dtype(space.backend.numpy_dtype(dtype)).kind in "biuf"
    except (TypeError, ValueError, AttributeError):
        return False


def _fmt(v: Any) -> str:
    arr = np.asarray(v, dtype=np.float64).reshape(-1)
    if arr.size == 1:
        return f"{arr[0]:.4g}"
    return f"[{arr.min():.3g}..{arr.max():.3g}]"
