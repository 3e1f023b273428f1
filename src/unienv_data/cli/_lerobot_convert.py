"""`unienv-data convert` to and from LeRobot: `--to lerobot` (a LeRobot v3.0 dataset, `LeRobotV3Writer`) and
`--from lerobot` (a LeRobot folder into our layouts, through `LeRobotAsUniEnvDataset`); the options and the dispatch
that `convert.py` hooks in.
"""
from __future__ import annotations

import argparse
import os
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from ._common import CLIError, Progress, human_bytes, prepare_output_dir, print_json, rate

#: formats `--from` / `--to` accept (besides our own layouts)
FROM_FORMATS = ("lerobot",)
TO_FORMATS = ("lerobot",)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--from", dest="from_format", choices=FROM_FORMATS, default=None,
                   help="SRC is a dataset of this format (default: one of ours)")
    p.add_argument("--to", dest="to_format", choices=TO_FORMATS, default=None,
                   help="write DST in this format instead of one of our layouts")
    p.add_argument("--fps", type=int, default=None, help="--to lerobot: frames per second of the dataset (required)")
    p.add_argument("--map", action="append", default=[], metavar="OURS=THEIRS",
                   help="--to lerobot: write our key OURS (a/b or a.b) as the feature THEIRS (repeatable)")
    p.add_argument("--task", default="", help="--to lerobot: the task text of every episode (default empty)")
    p.add_argument("--task-key", default=None, metavar="KEY",
                   help="--to lerobot: SRC key holding each frame's task index (e.g. task_index of data converted "
                        "from LeRobot); --task-names gives the texts")
    p.add_argument("--task-names", default=None, metavar="FILE|DIR",
                   help="--to lerobot: texts of the --task-key indices: a JSON list or {index: text} object, or the "
                        "LeRobot folder the data came from")
    p.add_argument("--robot-type", default=None, help="--to lerobot: robot_type of info.json")
    p.add_argument("--exclude", action="append", default=[], metavar="KEY",
                   help="--to lerobot: leave our key KEY out (repeatable)")


def format_run(args: argparse.Namespace) -> Optional[Callable[[argparse.Namespace, str, str], int]]:
    """The conversion for `--from` / `--to`, or None for a conversion between our own layouts."""
    if args.from_format and args.to_format:
        raise CLIError("give --from or --to, not both (convert between two other formats through our layout)")
    if args.to_format == "lerobot":
        return to_lerobot
    if args.from_format == "lerobot":
        return from_lerobot
    return None


# ---------------------------------------------------------------------------------------------------- --to lerobot
def _parse_map(items: List[str]) -> Dict[str, str]:
    out: Dict[str, str] = {}
    for item in items:
        ours, sep, theirs = item.partition("=")
        if not sep or not ours or not theirs:
            raise CLIError(f"--map {item!r}: expected OURS=THEIRS, e.g. --map obs/image=observation.images.top")
        out[ours.replace(".", "/")] = theirs
    return out


def lerobot_features(leaf_spaces: Dict[str, Any], mapping: Dict[str, str], exclude: List[str]
                     ) -> Tuple[Dict[str, Tuple[str, Tuple[int, ...]]], Dict[str, str], List[str]]:
    """`(features, our key -> feature name, skipped notes)` for the leaves of SRC's space."""
    from unienv_data.integrations.lerobot_export import RESERVED
    from unienv_interface.space import BinarySpace, BoxSpace
    exclude_keys = {k.replace(".", "/") for k in exclude}
    unknown = [k for k in list(mapping) + sorted(exclude_keys) if k not in leaf_spaces]
    if unknown:
        raise CLIError(f"--map/--exclude name key(s) {unknown} that SRC does not have; its keys are "
                       f"{sorted(leaf_spaces)}")
    features: Dict[str, Tuple[str, Tuple[int, ...]]] = {}
    names: Dict[str, str] = {}
    notes: List[str] = []
    bad: List[str] = []
    for key, space in leaf_spaces.items():
        if key in exclude_keys:
            continue
        name = mapping.get(key, key.replace("/", "."))
        if name in RESERVED and key not in mapping:
            notes.append(f"{key}: not copied ({name} is written by the exporter)")
            continue
        if name in features:
            raise CLIError(f"two keys of SRC become the feature {name!r}; rename one with --map")
        shape = tuple(int(s) for s in space.shape)
        if isinstance(space, BinarySpace):
            dtype = "bool"
        elif isinstance(space, BoxSpace):
            dtype = str(np.dtype(space.backend.numpy_dtype(space.dtype)))
        else:
            bad.append(f"{key} ({type(space).__name__})")
            continue
        if dtype == "uint8" and len(shape) == 3 and shape[2] == 3:
            features[name] = ("video", shape)
        elif len(shape) <= 1:
            features[name] = (dtype, shape)
        else:
            bad.append(f"{key} ({dtype} {shape}: LeRobot tabular features are scalars or 1-D; cameras are uint8 "
                       "(H, W, 3))")
            continue
        names[key] = name
    if bad:
        raise CLIError("these keys of SRC cannot become LeRobot features: " + "; ".join(bad) +
                       ". Leave them out with --exclude KEY")
    return features, names, notes


def _task_names(source: str) -> Dict[int, str]:
    """Task texts by index from a JSON file (a list, or an object keyed by index) or a LeRobot folder."""
    import json
    if os.path.isdir(source):
        from unienv_data.integrations._lerobot_format import load_tasks
        return load_tasks(source)
    try:
        with open(source, "r", encoding="utf-8") as f:
            raw = json.load(f)
    except (OSError, ValueError) as exc:
        raise CLIError(f"--task-names {source}: cannot be read as JSON ({exc})") from None
    if isinstance(raw, list) and all(isinstance(t, str) for t in raw):
        return dict(enumerate(raw))
    if isinstance(raw, dict) and all(isinstance(t, str) for t in raw.values()):
        try:
            return {int(k): v for k, v in raw.items()}
        except ValueError:
            pass
    raise CLIError(f"--task-names {source}: expected a JSON list of task texts or an object {{index: text}}")


def _texts_of(indices: np.ndarray, names: Dict[int, str], key: str) -> List[str]:
    flat = np.asarray(indices).reshape(indices.shape[0], -1)[:, 0].tolist()
    missing = sorted({int(i) for i in flat if int(i) not in names})
    if missing:
        raise CLIError(f"--task-key {key}: task index(es) {missing[:10]} have no text in --task-names")
    return [names[int(i)] for i in flat]


def to_lerobot(args: argparse.Namespace, src: str, dst: str) -> int:
    from unienv_data.inspect import open_dataset
    from unienv_data.integrations.lerobot_export import LeRobotV3Writer
    from .convert import pieces
    if args.fps is None or args.fps <= 0:
        raise CLIError("--to lerobot needs --fps N (a positive integer: LeRobot stores timestamps as frame / fps)")
    if args.layout is not None:
        raise CLIError("--layout chooses one of our layouts; with --to lerobot leave it out")
    codec = {"auto": "libsvtav1"}.get(args.codec, args.codec)
    options = None if args.crf is None else {"crf": str(args.crf)}
    if args.lossless:
        raise CLIError("--lossless is not available with --to lerobot (LeRobot videos are lossy mp4)")
    if (args.task_key is None) != (args.task_names is None):
        raise CLIError("--task-key and --task-names go together (the indices and their texts)")
    task_names = _task_names(args.task_names) if args.task_names is not None else {}
    task_key = None if args.task_key is None else args.task_key.replace(".", "/")
    with open_dataset(src, backend=args.backend) as ds:
        if task_key is not None and task_key not in ds.leaf_spaces:
            raise CLIError(f"--task-key {args.task_key}: SRC has no such key; its keys are {sorted(ds.leaf_spaces)}")
        features, names, notes = lerobot_features(ds.leaf_spaces, _parse_map(args.map), args.exclude)
        n = len(ds)
        episodes = ds.episodes() or [(0, n)]
        parts = pieces(n, episodes)
        outside = sum(1 for p in parts if not p[2])
        if outside:
            notes.append(f"{outside} stretch(es) of rows outside any episode became episodes of their own")
        prepare_output_dir(dst, set(), "convert", force=args.force)
        writer = LeRobotV3Writer(dst, args.fps, features, robot_type=args.robot_type, codec=codec,
                                 encoder_options=options)
        t0 = time.perf_counter()
        try:
            with Progress(n, "converting to LeRobot v3.0", "rows", enabled=not args.quiet) as bar:
                for s, e, _is_episode in parts:
                    writer.begin_episode(args.task)
                    for c in range(s, e, args.chunk):
                        idx = np.arange(c, min(e, c + args.chunk), dtype=np.int64)
                        wanted = list(names) + ([task_key] if task_key and task_key not in names else [])
                        data = ds.read_numpy(idx, wanted)
                        texts = None if task_key is None else _texts_of(data[task_key], task_names, args.task_key)
                        writer.add_frames({names[k]: v for k, v in data.items() if k in names}, texts)
                        bar.update(idx.size)
                    writer.end_episode()
            writer.finish()
        except BaseException:
            writer.abort()
            raise
        seconds = time.perf_counter() - t0
    size = _folder_bytes(dst)
    summary: Dict[str, Any] = {"src": src, "dst": dst, "format": "lerobot v3.0", "rows": n, "episodes": len(parts),
               "features": {k: list(v[1]) if v[0] == "video" else v[0] for k, v in features.items()},
               "seconds": seconds, "rows_per_s": rate(n, seconds), "bytes_after": size, "notes": notes}
    if args.json:
        print_json(summary)
    else:
        print(f"converted {src} -> {dst} (LeRobot v3.0, {args.fps} fps): {n} rows, {len(parts)} episodes in "
              f"{seconds:.2f} s ({summary['rows_per_s']:,.0f} rows/s), {human_bytes(size)}")
        for note in notes:
            print(f"  note: {note}")
    return 0


# ---------------------------------------------------------------------------------------------------- --from lerobot
def _folder_bytes(path: str) -> int:
    total = 0
    for d, _dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.path.getsize(os.path.join(d, f))
            except OSError:
                pass
    return total


def from_lerobot(args: argparse.Namespace, src: str, dst: str) -> int:
    from ._lerobot_inspect import LeRobotSource
    from .convert import copy_to_buffer
    if args.layout is None:
        args.layout = "native-video"
    with LeRobotSource(src, args.backend) as ds:
        before = {"total_bytes": _folder_bytes(src), "episodes": [list(e) for e in ds.episodes()]}
        return copy_to_buffer(ds, src, dst, args, before)


__all__ = ["add_arguments", "format_run", "to_lerobot", "from_lerobot", "lerobot_features", "FROM_FORMATS",
           "TO_FORMATS"]
