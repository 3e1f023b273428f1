"""The LeRobot hooks of the commands (`convert --from lerobot` / `--to lerobot`, and `info`, `verify`, `plot` on a
LeRobot folder), plugged into the generic tables: `convert.IMPORTERS` / `EXPORTERS` / `FORMAT_ARGUMENTS` and
`_foreign.FOREIGN`.

`open_lerobot` turns a LeRobot folder (v2.0, v2.1, v3.0) into a `BatchSource` over `LeRobotAsUniEnvDataset`;
`export_lerobot` writes a dataset `convert` opened as a LeRobot v3.0 folder (`LeRobotV3Writer`).
"""
from __future__ import annotations

import argparse
import json
import os
from typing import Any, Callable, Dict, List, Tuple

import numpy as np

from ._batch_source import BatchSource
from ._common import CLIError


def add_lerobot_arguments(p: argparse.ArgumentParser) -> None:
    """The options of `--to lerobot`."""
    k = p.add_argument_group("keys (--to lerobot / --to minari)")
    k.add_argument("--map", action="append", default=[], metavar="OURS=THEIRS",
                   help="write our key OURS (a/b or a.b) as THEIRS (repeatable): a LeRobot feature name, or a Minari "
                        "field (observations, actions, rewards, terminations, truncations, next_observations; a "
                        "ReplayBufferCollectionWrapper recording's obs, action, ... need no --map)")
    k.add_argument("--exclude", action="append", default=[], metavar="KEY",
                   help="leave our key KEY out (repeatable)")
    g = p.add_argument_group("LeRobot (--from lerobot / --to lerobot)")
    g.add_argument("--fps", type=int, default=None,
                   help="--to lerobot: frames per second of the dataset (default: SRC's, when it has one)")
    g.add_argument("--task", default="", help="--to lerobot: the task text of every episode (default empty)")
    g.add_argument("--task-key", default=None, metavar="KEY",
                   help="--to lerobot: SRC key holding each frame's task index (e.g. task_index of data converted "
                        "from LeRobot); --task-names gives the texts")
    g.add_argument("--task-names", default=None, metavar="FILE|DIR",
                   help="--to lerobot: texts of the --task-key indices: a JSON list or {index: text} object, or the "
                        "LeRobot folder the data came from")
    g.add_argument("--robot-type", default=None, help="--to lerobot: robot_type of info.json")


# ---------------------------------------------------------------------------------------------------- reading
def is_lerobot_folder(path: str) -> bool:
    """True for a directory whose `meta/info.json` names a `codebase_version` (a LeRobot dataset)."""
    info = os.path.join(path, "meta", "info.json")
    if not os.path.isfile(info):
        return False
    try:
        with open(info, "r", encoding="utf-8") as f:
            return "codebase_version" in json.load(f)
    except (OSError, ValueError):
        return True   # a damaged info.json of a LeRobot folder: `verify` reports it


def open_lerobot(path: str, backend: Any, args: argparse.Namespace) -> BatchSource:
    """A LeRobot folder as a source: one episode per LeRobot episode, its fps (a `native-video` copy records it), its
    tasks, robot type and video codecs as details for `info`, and the counts of `meta/info.json` that the data does
    not match as problems for `verify`."""
    from unienv_data.integrations.lerobot import LeRobotAsUniEnvDataset
    ds = LeRobotAsUniEnvDataset.from_local(path, backend)
    schema = ds.schema
    problems: List[str] = []
    for key, actual in (("total_frames", len(ds)), ("total_episodes", ds.num_episodes)):
        if key in schema.info and schema.info[key] != actual:
            problems.append(f"{os.path.join(path, 'meta', 'info.json')}: {key} is {schema.info[key]}, the data "
                            f"holds {actual}")
    codecs = {name: (f.info or {}).get("video.codec") for name, f in schema.features.items() if f.is_video}
    details: Dict[str, Any] = {"fps": schema.fps, "robot_type": schema.robot_type,
                               "tasks": {str(k): v for k, v in sorted(ds.tasks.items())}, "video_codecs": codecs}
    return BatchSource(ds, path, f"LeRobot {schema.codebase_version}", fps=schema.fps,
                       format_version=schema.codebase_version, details=details, problems=problems)


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


def check_lerobot_export(ds: Any, args: argparse.Namespace) -> int:
    """The options of `--to lerobot` checked before anything is written (CLIError naming the option); returns the
    fps (`--fps`, else the source's)."""
    fps = args.fps if args.fps is not None else getattr(ds, "fps", None)
    if fps is None or int(fps) != fps or fps <= 0:
        raise CLIError("--to lerobot needs --fps N (a positive integer: LeRobot stores timestamps as frame / fps)")
    if args.lossless:
        raise CLIError("--lossless is not available with --to lerobot (LeRobot videos are lossy mp4)")
    if (args.task_key is None) != (args.task_names is None):
        raise CLIError("--task-key and --task-names go together (the indices and their texts)")
    return int(fps)


def lossy_video_notice(codec: str, crf: Any) -> str:
    """The one line `--to lerobot` prints when it writes cameras: their video is lossy, and what to do about it."""
    from unienv_data.integrations.lerobot_export import DEFAULT_ENCODER_OPTIONS
    quality = f"crf {crf if crf is not None else DEFAULT_ENCODER_OPTIONS['crf']}"
    return (f"cameras are written as lossy video ({codec}, {quality}, yuv420p): decoded frames differ from SRC's. "
            "LeRobot videos have no lossless option; a lower --crf only narrows the average error, --layout native "
            "(or native-video --lossless) keeps an exact copy")


def export_lerobot(ds: Any, dst: str, args: argparse.Namespace, progress: Callable[[int], None]) -> Dict[str, Any]:
    """Writes the opened dataset `ds` as a LeRobot v3.0 folder at `dst`: one LeRobot episode per episode of `ds` (a
    stretch of rows outside every episode becomes an episode of its own); returns the summary."""
    from unienv_data.integrations.lerobot_export import LeRobotV3Writer
    from .convert import pieces
    fps = check_lerobot_export(ds, args)
    codec = {"auto": "libsvtav1"}.get(args.codec, args.codec)
    options = None if args.crf is None else {"crf": str(args.crf)}
    task_names = _task_names(args.task_names) if args.task_names is not None else {}
    task_key = None if args.task_key is None else args.task_key.replace(".", "/")
    if task_key is not None and task_key not in ds.leaf_spaces:
        raise CLIError(f"--task-key {args.task_key}: SRC has no such key; its keys are {sorted(ds.leaf_spaces)}")
    features, names, notes = lerobot_features(ds.leaf_spaces, _parse_map(args.map), args.exclude)
    n = len(ds)
    parts = pieces(n, ds.episodes() or [(0, n)])
    outside = sum(1 for p in parts if not p[2])
    if outside:
        notes.append(f"{outside} stretch(es) of rows outside any episode became episodes of their own")
    wanted = list(names) + ([task_key] if task_key and task_key not in names else [])
    gop = {} if getattr(args, "gop", None) is None else {"gop": args.gop}
    spaces = {names[k]: ds.leaf_spaces[k] for k in names if features[names[k]][0] != "video"}
    cameras = [k for k, v in features.items() if v[0] == "video"]
    if cameras:
        notice = lossy_video_notice(codec, args.crf)
        notes.append(notice)
    writer = LeRobotV3Writer(dst, fps, features, robot_type=args.robot_type, codec=codec, encoder_options=options,
                             spaces=spaces, **gop)
    try:
        for s, e, _is_episode in parts:
            writer.begin_episode(args.task)
            for c in range(s, e, args.chunk):
                idx = np.arange(c, min(e, c + args.chunk), dtype=np.int64)
                data = ds.read_numpy(idx, wanted)
                texts = None if task_key is None else _texts_of(data[task_key], task_names, args.task_key)
                writer.add_frames({names[k]: v for k, v in data.items() if k in names}, texts)
                progress(idx.size)
            writer.end_episode()
        writer.finish()
    except BaseException:
        writer.abort()
        raise
    return {"format": f"LeRobot v3.0, {fps} fps", "fps": fps, "episodes": len(parts), "lossy_video": bool(cameras),
            "features": {k: list(v[1]) if v[0] == "video" else v[0] for k, v in features.items()}, "notes": notes}


__all__ = ["add_lerobot_arguments", "check_lerobot_export", "is_lerobot_folder", "open_lerobot", "export_lerobot",
           "lerobot_features", "lossy_video_notice"]
