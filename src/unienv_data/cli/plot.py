"""`unienv-data plot PATH`: PNG pictures of a dataset (charts with matplotlib, frames with Pillow).

Writes into `--out` (default `PATH/plots`):

* `episode_lengths.png`: one bar per episode (oldest first), coloured by how it ended when the dataset has
  `terminated` / `truncated` flags, with the mean length;
* `value_ranges.png` (and `value_ranges_2.png`, ... for many keys): every low-dimensional key over time (dataset
  order, episode starts as faint vertical lines): one line per dimension, or the min..max band over the
  dimensions and their mean for wide keys; finite space bounds as dashed lines;
* `frames_<key>.png` for every camera key: a contact sheet, one row per episode (spread over the dataset), frames
  spread over each episode.

Long datasets are subsampled to at most `--max-points` time steps per chart.
"""
from __future__ import annotations

import argparse
import os
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from ._common import CLIError, Progress, add_backend_flag, add_output_flags, optional_import, print_json

KEYS_PER_FIGURE = 8


def add_parser(sub: Any) -> None:
    p = sub.add_parser("plot", help="PNGs of episode lengths, value ranges over time and a contact sheet of frames",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("path", metavar="PATH", help="dataset directory (or one .memmap array file)")
    p.add_argument("--out", metavar="DIR", default=None, help="where to write the PNGs (default: PATH/plots)")
    p.add_argument("--keys", default=None, help="comma-separated keys to chart (default: every low-dimensional key)")
    p.add_argument("--max-points", type=int, default=20000, help="time steps per chart at most (default 20000)")
    p.add_argument("--sheet-rows", type=int, default=6, help="episodes in a contact sheet (default 6)")
    p.add_argument("--sheet-cols", type=int, default=8, help="frames per episode in a contact sheet (default 8)")
    add_backend_flag(p)
    add_output_flags(p)
    p.set_defaults(run=run)


def _pyplot() -> Any:
    mpl = optional_import("matplotlib", "plot", "matplotlib", "cli")
    mpl.use("Agg")
    return optional_import("matplotlib.pyplot", "plot", "matplotlib", "cli")


def run(args: argparse.Namespace) -> int:
    from unienv_data.inspect import open_dataset
    from ._images import episode_sheet
    plt = _pyplot()
    path = os.path.abspath(args.path)
    out = os.path.abspath(args.out) if args.out else (
        os.path.join(path, "plots") if os.path.isdir(path) else path + "-plots")
    os.makedirs(out, exist_ok=True)
    written: List[str] = []
    from ._foreign import detect, open_foreign
    fmt = detect(path)   # another tool's dataset (a LeRobot or Minari folder)
    with (open_foreign(fmt, path, args.backend) if fmt else open_dataset(path, backend=args.backend)) as ds:
        episodes = ds.episodes()
        images = ds.image_keys()
        lowdim = [k for k, sp in ds.leaf_spaces.items() if k not in images and _is_numeric(sp)]
        if args.keys:
            wanted = [k.strip() for k in args.keys.split(",") if k.strip()]
            unknown = [k for k in wanted if k not in ds.leaf_spaces]
            if unknown:
                raise CLIError(f"unknown key(s) {unknown}; the dataset's keys are {sorted(ds.leaf_spaces)}")
            lowdim = [k for k in wanted if k in lowdim]
            images = [k for k in wanted if k in images]
        name = os.path.basename(path.rstrip(os.sep))
        written.append(plot_episode_lengths(plt, ds, episodes, os.path.join(out, "episode_lengths.png"), name))
        if lowdim:
            rows, values = read_series(ds, lowdim, args.max_points, not args.quiet)
            for i in range(0, len(lowdim), KEYS_PER_FIGURE):
                part = lowdim[i:i + KEYS_PER_FIGURE]
                fname = "value_ranges.png" if i == 0 else f"value_ranges_{i // KEYS_PER_FIGURE + 1}.png"
                written.append(plot_value_ranges(plt, ds, part, rows, values, episodes, os.path.join(out, fname), name))
        for key in images:
            target = os.path.join(out, f"frames_{key.replace('/', '.')}.png")
            sheet = episode_sheet(ds, key, episodes, max_rows=args.sheet_rows, max_cols=args.sheet_cols,
                                  title=f"{name}: {key}, {len(episodes)} episodes (rows), frames over each episode")
            sheet.save(target)
            written.append(target)
        summary = {"path": path, "out": out, "files": written, "episodes": len(episodes), "steps": len(ds),
                   "charted_keys": lowdim, "image_keys": images}
    if args.json:
        print_json(summary)
    else:
        print(f"wrote {len(written)} PNG files to {out}:")
        for w in written:
            print(f"  {os.path.basename(w)}")
    return 0


def _is_numeric(space: Any) -> bool:
    from unienv_interface.space import BinarySpace, BoxSpace
    return isinstance(space, (BoxSpace, BinarySpace))


def read_series(ds: Any, keys: List[str], max_points: int, progress: bool) -> Tuple[np.ndarray, Dict[str, np.ndarray]]:
    """`(logical rows, {key: values})`: every row, or an even subsample of `max_points` rows."""
    n = len(ds)
    rows = np.arange(n, dtype=np.int64)
    if n > max(2, max_points):
        rows = np.unique(np.linspace(0, n - 1, max_points).round().astype(np.int64))
    parts: Dict[str, List[np.ndarray]] = {k: [] for k in keys}
    chunk = 16384
    with Progress(rows.size, "reading", "rows", enabled=progress) as bar:
        for s in range(0, rows.size, chunk):
            got = ds.read_numpy(rows[s:s + chunk], keys)
            for k in keys:
                parts[k].append(got[k])
            bar.update(min(chunk, rows.size - s))
    empty = {k: np.zeros((0,) + tuple(ds.leaf_spaces[k].shape)) for k in keys}
    return rows, {k: (np.concatenate(v) if v else empty[k]) for k, v in parts.items()}


def _end_flags(ds: Any, episodes: List[Tuple[int, int]]) -> Optional[Dict[str, np.ndarray]]:
    names = {"terminated": "terminated", "truncated": "truncated", "terminations": "terminated",
             "truncations": "truncated"}   # this library's keys, and Minari's
    flags = [k for k in names if k in ds.leaf_spaces]
    if not flags or not episodes:
        return None
    last = np.asarray([e - 1 for _, e in episodes], dtype=np.int64)
    got = ds.read_numpy(last, flags)
    return {names[k]: np.asarray(np.asarray(v).reshape(len(episodes), -1).any(axis=1)) for k, v in got.items()}


def plot_episode_lengths(plt: Any, ds: Any, episodes: List[Tuple[int, int]], target: str, name: str) -> str:
    lengths = np.asarray([e - s for s, e in episodes], dtype=np.int64)
    fig, ax = plt.subplots(figsize=(9, 3.6), dpi=110)
    if lengths.size == 0:
        ax.text(0.5, 0.5, f"{name}: no episodes recorded ({len(ds)} steps without segments)",
                ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
    else:
        x = np.arange(lengths.size)
        flags = _end_flags(ds, episodes)
        if flags is not None and "terminated" in flags:
            term = flags["terminated"]
            trunc = flags.get("truncated", np.zeros_like(term)) & ~term
            other = ~term & ~trunc
            for mask, color, label in ((term, "#3a8f5c", "terminated"), (trunc, "#d08a2e", "truncated"),
                                       (other, "#8a8a8a", "other end")):
                if mask.any():
                    ax.bar(x[mask], lengths[mask], color=color, label=f"{label} ({int(mask.sum())})", width=0.85)
        else:
            ax.bar(x, lengths, color="#4a78b5", width=0.85, label="episode")
        ax.axhline(lengths.mean(), color="#333333", lw=1, ls="--", label=f"mean {lengths.mean():.1f}")
        ax.set_xlabel("episode (oldest first)")
        ax.set_ylabel("steps")
        ax.set_title(f"{name}: {lengths.size} episodes, {int(lengths.sum())} steps "
                     f"(min {lengths.min()}, max {lengths.max()})")
        ax.legend(loc="upper right", fontsize=8, framealpha=0.9)
        ax.set_xlim(-0.6, lengths.size - 0.4)
        ax.set_ylim(0, lengths.max() * 1.25)
    fig.tight_layout()
    fig.savefig(target)
    plt.close(fig)
    return target


def plot_value_ranges(plt: Any, ds: Any, keys: List[str], rows: np.ndarray, values: Dict[str, np.ndarray],
                      episodes: List[Tuple[int, int]], target: str, name: str) -> str:
    from unienv_interface.space import BoxSpace
    fig, axes = plt.subplots(len(keys), 1, figsize=(10, 1.9 * len(keys) + 0.8), dpi=100, sharex=True, squeeze=False)
    starts = [s for s, _ in episodes] if len(episodes) <= 300 else []
    for ax, key in zip(axes[:, 0], keys):
        v = np.asarray(values[key])
        sp = ds.leaf_spaces[key]
        flat = v.reshape(v.shape[0], -1).astype(np.float64) if v.size else np.zeros((0, 1))
        dims = flat.shape[1]
        for s in starts:
            ax.axvline(s, color="#000000", alpha=0.08, lw=0.8)
        step = "steps-post" if v.dtype == bool else "default"
        if dims <= 8:
            for d in range(dims):
                ax.plot(rows, flat[:, d], lw=0.9, drawstyle=step, label=f"[{d}]" if dims > 1 else None)
            if dims > 1:
                ax.legend(loc="upper right", fontsize=7, ncol=min(dims, 8), framealpha=0.8)
        else:
            ax.fill_between(rows, flat.min(axis=1), flat.max(axis=1), color="#4a78b5", alpha=0.3, lw=0,
                            label=f"min..max over {dims} dims")
            ax.plot(rows, flat.mean(axis=1), color="#1f3f6e", lw=0.9, label="mean")
            ax.legend(loc="upper right", fontsize=7, framealpha=0.8)
        if isinstance(sp, BoxSpace):
            lo, hi = float(np.min(sp.low_numpy)), float(np.max(sp.high_numpy))
            for b in (lo, hi):
                if np.isfinite(b):
                    ax.axhline(b, color="#aa3333", ls="--", lw=0.8, alpha=0.7)
        observed = f"[{np.nanmin(flat):.3g}, {np.nanmax(flat):.3g}]" if flat.size else "no rows"
        dtype = ds.backend.dtype_name(sp.dtype) if hasattr(sp, "dtype") else "?"
        ax.set_title(f"{key}   {dtype}{tuple(sp.shape)}   observed {observed}", fontsize=9, loc="left")
        ax.tick_params(labelsize=8)
    axes[-1, 0].set_xlabel("step (dataset order; faint lines: episode starts)")
    fig.suptitle(f"{name}: values over time", fontsize=10)
    fig.tight_layout()
    fig.savefig(target)
    plt.close(fig)
    return target
