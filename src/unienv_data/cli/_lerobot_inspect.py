"""The commands on a LeRobot dataset folder (one holding `meta/info.json` with a `codebase_version`): `info` (what
it holds, from its metadata and parquet files), `verify` (opens it with `LeRobotAsUniEnvDataset` and decodes every
frame), and `LeRobotSource`, the opened folder that `plot` and `convert --from lerobot` read like one of our
datasets. `info.py`, `verify.py`, `plot.py` and `convert.py` hook these in.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ._common import Progress, human_bytes, print_json, table


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


class LeRobotSource:
    """A LeRobot folder opened with `LeRobotAsUniEnvDataset`, with what the commands read from one of our datasets
    (`inspect.OpenedDataset`): `space`, `leaf_spaces`, `backend`, `len`, `episodes()`, `capacity`, `image_keys()`,
    `read(idx)` and `read_numpy(idx, keys)` (only the named features are read)."""

    def __init__(self, path: str, backend: str = "auto") -> None:
        from unienv_data.integrations.lerobot import LeRobotAsUniEnvDataset
        if backend == "pytorch":
            from unienv_interface.backends.pytorch import PyTorchComputeBackend as B
        else:
            from unienv_interface.backends.numpy import NumpyComputeBackend as B  # type: ignore[assignment]
        self.ds = LeRobotAsUniEnvDataset.from_local(path, B)
        space: Any = self.ds.single_space
        self.space = space
        self.leaf_spaces: Dict[str, Any] = dict(space.spaces)
        self.backend = B
        self.capacity = None

    def __len__(self) -> int:
        return len(self.ds)

    def episodes(self) -> List[Tuple[int, int]]:
        return self.ds.get_segments()

    def image_keys(self) -> List[str]:
        return [k for k in self.leaf_spaces if self.ds.schema.features[k].is_camera]

    def read(self, idx: Any) -> Any:
        return self.ds.get_at(idx)

    def read_numpy(self, idx: Any, keys: Optional[Sequence[str]] = None) -> Dict[str, np.ndarray]:
        view = self.ds if keys is None else self.ds._only(list(keys))
        return {k: np.asarray(self.backend.to_numpy(v)) for k, v in view.get_at(np.asarray(idx, np.int64)).items()}

    def close(self) -> None:
        self.ds.close()

    def __enter__(self) -> "LeRobotSource":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.ds.close()


def open_any(path: str, backend: str = "auto") -> Any:
    """`LeRobotSource` for a LeRobot folder, else `inspect.open_dataset` (one of our datasets)."""
    if is_lerobot_folder(path):
        return LeRobotSource(path, backend)
    from unienv_data.inspect import open_dataset
    return open_dataset(path, backend=backend)


def _bytes_by_top_dir(root: str) -> Dict[str, int]:
    out: Dict[str, int] = {}
    for d, _dirs, files in os.walk(root):
        rel = os.path.relpath(d, root)
        top = rel.split(os.sep)[0] if rel != "." else "."
        for f in files:
            try:
                out[top] = out.get(top, 0) + os.path.getsize(os.path.join(d, f))
            except OSError:
                pass
    return out


def describe_lerobot(path: str) -> Dict[str, Any]:
    """A JSON-ready summary of the LeRobot dataset at `path` (metadata and parquet files; no frame is decoded)."""
    from unienv_data.integrations._lerobot_format import load_layout, parse_info
    path = os.path.abspath(path)
    schema = parse_info(path)
    tabular = [k for k, f in schema.features.items() if not f.is_camera]
    layout = load_layout(path, tabular)
    eps = layout.episodes
    feats = []
    for name, f in schema.features.items():
        codec = (f.info or {}).get("video.codec") if f.is_video else None
        feats.append({"name": name, "dtype": f.dtype, "shape": list(f.hwc if f.is_camera else f.shape),
                      "codec": codec})
    return {"path": path, "kind": f"LeRobot {schema.codebase_version}", "codebase_version": schema.codebase_version,
            "fps": schema.fps, "robot_type": schema.robot_type, "length": layout.num_rows,
            "episodes": [[e.dataset_from_index, e.dataset_to_index] for e in eps],
            "episode_lengths": [e.length for e in eps], "episode_indices": [e.index for e in eps],
            "tasks": {str(k): v for k, v in sorted(layout.tasks.items())}, "features": feats,
            "bytes_by_dir": _bytes_by_top_dir(path), "total_bytes": sum(_bytes_by_top_dir(path).values())}


def render_info(d: Dict[str, Any]) -> List[str]:
    lines = [f"{d['path']}: {d['kind']} dataset, {d['fps']} fps, robot_type {d['robot_type']!r}"]
    lengths = d["episode_lengths"]
    lines.append(f"  length {d['length']} frames, {len(lengths)} episodes"
                 + (f", lengths {min(lengths)}..{max(lengths)} (mean {np.mean(lengths):.1f})" if lengths else ""))
    lines.append(f"  tasks {len(d['tasks'])}: " + "; ".join(f"{k}: {v!r}" for k, v in list(d["tasks"].items())[:5])
                 + (" ..." if len(d["tasks"]) > 5 else ""))
    lines.append("features:")
    rows = [[f["name"], f["dtype"], str(tuple(f["shape"])), f["codec"] or ""] for f in d["features"]]
    lines.extend(table(rows))
    lines.append("bytes:")
    lines.extend(table([[k, human_bytes(v)] for k, v in sorted(d["bytes_by_dir"].items())]))
    lines.append(f"  total {human_bytes(d['total_bytes'])} on disk")
    return lines


def run_info(args: argparse.Namespace) -> int:
    d = describe_lerobot(args.path)
    if args.json:
        print_json(d)
    else:
        for line in render_info(d):
            print(line)
    return 0


def verify_lerobot(path: str, read_rows: bool = True, progress: bool = False, chunk: int = 256) -> Dict[str, Any]:
    """Opens the LeRobot dataset (every parquet file read and checked against the episode metadata) and, with
    `read_rows`, reads every frame (every video decoded); returns a report like `verify.verify`'s."""
    from unienv_data.base.errors import StorageFormatError
    from unienv_data.integrations.lerobot import LeRobotAsUniEnvDataset
    from unienv_interface.backends.numpy import NumpyComputeBackend
    path = os.path.abspath(path)
    problems: List[str] = []
    warnings: List[str] = []
    checked: Dict[str, Any] = {}
    kind = "LeRobot"
    try:
        ds = LeRobotAsUniEnvDataset.from_local(path, NumpyComputeBackend)
    except (StorageFormatError, OSError, ValueError, KeyError) as exc:
        problems.append(f"{type(exc).__name__}: {exc}")
        return {"path": path, "root_dir": path, "kind": kind, "ok": False, "problems": problems,
                "warnings": warnings, "checked": checked, "files": []}
    with ds:
        kind = f"LeRobot {ds.schema.codebase_version}"
        n = len(ds)
        checked.update(opened=True, length=n, episodes=ds.num_episodes)
        info = ds.schema.info
        for key, actual in (("total_frames", n), ("total_episodes", ds.num_episodes)):
            if key in info and info[key] != actual:
                problems.append(f"{os.path.join(path, 'meta', 'info.json')}: {key} is {info[key]}, the data holds "
                                f"{actual}")
        if read_rows:
            t0 = time.perf_counter()
            try:
                with Progress(n, "reading every frame", "rows", enabled=progress) as bar:
                    for s in range(0, n, chunk):
                        ds.get_at(np.arange(s, min(n, s + chunk)))
                        bar.update(min(n, s + chunk) - s)
                checked.update(rows_read=n, storages_read=len(ds.schema.features),
                               read_seconds=time.perf_counter() - t0)
            except (StorageFormatError, OSError, ValueError) as exc:
                problems.append(f"{type(exc).__name__}: {exc}")
    return {"path": path, "root_dir": path, "kind": kind, "ok": not problems, "problems": problems,
            "warnings": warnings, "checked": checked, "files": []}


def render_verify(r: Dict[str, Any]) -> List[str]:
    c = r["checked"]
    lines = [f"verifying {r['path']} ({r['kind']})"]
    if c.get("opened"):
        lines.append(f"  opened: {c['length']} frames, {c['episodes']} episodes; every parquet file read and matched "
                     "against the episode metadata")
    if "rows_read" in c:
        lines.append(f"  rows: {c['rows_read']} rows of {c['storages_read']} features read (every frame decoded) in "
                     f"{c['read_seconds']:.2f} s")
    if r["ok"]:
        lines.append("OK")
    else:
        lines.append(f"DAMAGED: {len(r['problems'])} problem(s)")
        lines.extend(f"  {p}" for p in r["problems"])
    return lines


def run_verify(args: argparse.Namespace) -> int:
    if getattr(args, "write_checksums", False):
        from ._common import CLIError
        raise CLIError("--write-checksums is for this library's datasets; a LeRobot folder keeps its own files")
    report = verify_lerobot(args.path, read_rows=not args.quick, progress=not args.quiet)
    if args.json:
        print_json({k: v for k, v in report.items() if k != "files"})
    else:
        for line in render_verify(report):
            print(line)
    return 0 if report["ok"] else 1


__all__ = ["LeRobotSource", "open_any", "is_lerobot_folder", "describe_lerobot", "render_info", "run_info", "verify_lerobot", "render_verify",
           "run_verify"]
