"""Datasets of other tools that `info`, `verify` and `plot` read directly (a LeRobot or Minari folder).

`FOREIGN` names, per format, a detector `module:function(path) -> bool` and an opener
`module:function(path, backend, args) -> BatchSource`. `detect(path)` gives the first format whose detector
accepts the path (None for anything else, which the commands then read as a dataset of this library).
`describe_foreign` builds the summary `info` prints and `verify_foreign` the report `verify` prints; `plot` reads
the opened source like an `OpenedDataset`.
"""
from __future__ import annotations

import argparse
import importlib
import os
import time
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from ._batch_source import BatchSource, folder_bytes

#: format -> (detector, opener), each "module:function"
FOREIGN: Dict[str, Tuple[str, str]] = {
    "lerobot": ("unienv_data.cli._lerobot:is_lerobot_folder", "unienv_data.cli._lerobot:open_lerobot"),
    "minari": ("unienv_data.cli._minari_hf:is_minari_folder", "unienv_data.cli._minari_hf:open_minari"),
}


def _resolve(spec: str) -> Any:
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


def detect(path: str) -> Optional[str]:
    """The foreign format of `path`, or None."""
    for fmt, (detector, _opener) in FOREIGN.items():
        try:
            if _resolve(detector)(path):
                return fmt
        except (OSError, ValueError):
            continue
    return None


def open_foreign(fmt: str, path: str, backend: str = "auto") -> BatchSource:
    """`path` opened read-only through the format's opener (steps only: no `next_observations`)."""
    from ._batch_source import backend_class
    args = argparse.Namespace(no_next_obs=True)
    return _resolve(FOREIGN[fmt][1])(os.path.abspath(path), backend_class(backend), args)


def describe_foreign(fmt: str, path: str) -> Dict[str, Any]:
    """The summary `info` prints (the keys of `unienv_data.inspect.describe`) for a foreign dataset."""
    from unienv_data.inspect import raw_bytes_per_key, space_tree_lines
    from unienv_interface.space.space_utils.serialization_utils import space_to_json
    path = os.path.abspath(path)
    with open_foreign(fmt, path) as ds:
        episodes = ds.episodes()
        space = space_to_json(ds.space)
        n = len(ds)
        version = ds.format_version
        kind = ds.kind
        details = ds.details
        problems = list(ds.problems)
    files: List[Dict[str, Any]] = []
    for root, _dirs, names in os.walk(path):
        for name in sorted(names):
            full = os.path.join(root, name)
            size = os.path.getsize(full)
            files.append({"path": os.path.relpath(full, path), "kind": os.path.splitext(name)[1].lstrip(".") or "file",
                          "storage_type": None, "depth": 0, "key": None, "format_version": None, "capacity": None,
                          "length": None, "segments": None, "bytes": size, "total_bytes": size, "details": "",
                          "notes": []})
    return {"path": path, "kind": kind, "format_versions": {fmt: version} if version else {}, "capacity": None,
            "length": n, "offset": None, "episodes": [list(e) for e in episodes],
            "episode_lengths": [e - s for s, e in episodes], "space": space, "space_tree": space_tree_lines(space),
            "storages": files, "bytes_per_key": {}, "raw_bytes_per_key": raw_bytes_per_key(space, n),
            "total_bytes": folder_bytes(path), "details": details, "problems": problems}


def _outside_bounds(space: Any, values: np.ndarray) -> int:
    from unienv_interface.space import BoxSpace
    if not isinstance(space, BoxSpace) or values.dtype == object:
        return 0
    b = space.backend
    low = np.asarray(b.to_numpy(space.low)) if not isinstance(space.low, np.ndarray) else space.low
    high = np.asarray(b.to_numpy(space.high)) if not isinstance(space.high, np.ndarray) else space.high
    with np.errstate(invalid="ignore"):
        bad = (values < low) | (values > high)
    return int(bad.reshape(bad.shape[0], -1).any(axis=1).sum()) if bad.size else 0


def verify_foreign(fmt: str, path: str, read_rows: bool = True, backend: str = "auto",
                   progress: bool = False, chunk: int = 1024) -> Dict[str, Any]:
    """The report `verify` prints for a foreign dataset: it opens (every file the format's reader checks on open),
    and unless `read_rows` is False reads every row (decoding every frame) and counts values outside the space's
    bounds (a note, as for this library's datasets)."""
    from unienv_data.base.errors import StorageFormatError
    from ._common import Progress
    path = os.path.abspath(path)
    problems: List[str] = []
    warnings: List[str] = []
    checked: Dict[str, Any] = {}
    kind = fmt
    try:
        ds = open_foreign(fmt, path, backend)
    except (StorageFormatError, OSError, ValueError, TypeError) as exc:
        problems.append(str(exc))
        return {"path": path, "root_dir": path, "kind": kind, "ok": False, "problems": problems,
                "warnings": warnings, "checked": checked, "files": []}
    with ds:
        kind = ds.kind
        problems.extend(ds.problems)
        checked.update(opened=True, length=len(ds), episodes=len(ds.episodes()))
        if read_rows:
            t0 = time.perf_counter()
            outside: Dict[str, int] = {}
            n = len(ds)
            try:
                with Progress(n, "verifying", "rows", enabled=progress) as bar:
                    for s in range(0, n, chunk):
                        got = ds.read_numpy(np.arange(s, min(n, s + chunk), dtype=np.int64))
                        for k, v in got.items():
                            bad = _outside_bounds(ds.leaf_spaces[k], v)
                            if bad:
                                outside[k] = outside.get(k, 0) + bad
                        bar.update(min(n, s + chunk) - s)
            except (StorageFormatError, OSError, ValueError) as exc:
                problems.append(str(exc))
            checked.update(rows_read=n, storages_read=1, read_seconds=time.perf_counter() - t0)
            for k, c in sorted(outside.items()):
                warnings.append(f"{k}: {c} rows hold values outside the space's declared bounds")
    return {"path": path, "root_dir": path, "kind": kind, "ok": not problems, "problems": problems,
            "warnings": warnings, "checked": checked, "files": []}


__all__ = ["FOREIGN", "detect", "open_foreign", "describe_foreign", "verify_foreign"]
