"""Reading and validating a replay buffer's `metadata.json` (shared by `load_from` and the static helpers)."""
from __future__ import annotations

import os
import shlex
from typing import Any, Dict, List, Tuple

from unienv_data.base.errors import StorageFormatError, StorageNotFoundError
from unienv_data.base.files import (PathLike, check_format_version, check_no_interrupted_dump, read_json,
                                    require_fields)
from unienv_data.base.ring import logical_row, run_length
from unienv_data.base.segments import first_overlap

from ._buffer_log import GENERATION_KEY, apply_buffer_log

METADATA_FILE = "metadata.json"


def _int_field(meta: Dict[str, Any], name: str, where: str, minimum: int = 0) -> int:
    v = meta.get(name)
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise StorageFormatError(f"{where}: {name!r} must be an int >= {minimum}, got {v!r}")
    return v


#: a LeRobot dataset's schema file, relative to its folder
LEROBOT_INFO = os.path.join("meta", "info.json")


def _refuse_foreign_folder(path: str, meta_path: str) -> None:
    """A directory without `metadata.json` that holds a LeRobot dataset: StorageNotFoundError saying how to read it
    (in place, or converted), instead of only that the metadata is missing."""
    if os.path.isfile(os.path.join(path, LEROBOT_INFO)):
        raise StorageNotFoundError(
            f"ReplayBuffer metadata not found: {meta_path}; {path} holds a LeRobot dataset ({LEROBOT_INFO}), not a "
            "ReplayBuffer: read it in place with unienv_data.integrations.lerobot.LeRobotAsUniEnvDataset.from_local("
            f"{path!r}, backend), or convert it once with `unienv-data convert {shlex.quote(path)} DST --from lerobot` and open DST "
            "with ReplayBuffer.load_from")
    if os.listdir(path):
        raise StorageNotFoundError(
            f"ReplayBuffer metadata not found: {meta_path}, though {path} holds files: a ReplayBuffer.create() that "
            "did not finish (the process died while creating it) leaves such a directory, and nothing in it was "
            "committed. Create the buffer again with ReplayBuffer.create(..., cache_path=" + repr(path) + ", "
            "overwrite=True), or pass a new directory")


def read_metadata(path: PathLike) -> Dict[str, Any]:
    """Reads and validates a buffer's metadata.json (count, offset, capacity, segments), with the commit points its
    `buffer_commit.log` holds applied; StorageFormatError names what is wrong, FileNotFoundError when the directory
    is missing."""
    meta_path = os.path.join(os.fspath(path), METADATA_FILE)
    if not os.path.isdir(path):
        raise FileNotFoundError(f"ReplayBuffer directory not found: {path}")
    check_no_interrupted_dump(path, "ReplayBuffer")
    if not os.path.exists(meta_path):
        _refuse_foreign_folder(os.fspath(path), meta_path)
    meta = read_json(meta_path, "ReplayBuffer metadata")
    check_format_version(meta, meta_path)
    require_fields(meta, ("type", "count", "offset", "capacity", "storage_cls", "storage_path_relative",
                          "single_instance_space"), meta_path)
    if meta["type"] != "ReplayBuffer":
        raise StorageFormatError(f"{meta_path}: type is {meta['type']!r}, expected 'ReplayBuffer'")
    if GENERATION_KEY in meta:
        _int_field(meta, GENERATION_KEY, meta_path)
    meta = apply_buffer_log(os.fspath(path), meta)      # commit points since metadata.json was last written
    count = _int_field(meta, "count", meta_path)
    offset = _int_field(meta, "offset", meta_path)
    cap = meta["capacity"]
    if cap is not None:
        cap = _int_field(meta, "capacity", meta_path, 1)
        if count > cap:
            raise StorageFormatError(f"{meta_path}: count {count} exceeds capacity {cap}")
        if offset >= cap:
            raise StorageFormatError(f"{meta_path}: offset {offset} is outside [0, capacity {cap})")
    elif offset != 0:
        raise StorageFormatError(f"{meta_path}: a growable buffer must have offset 0, got {offset}")
    for key in ("physical_segments", "buffer_segments"):
        _check_segments(meta, key, count, offset, cap, meta_path)
    return meta


def _check_segments(meta: Dict[str, Any], key: str, count: int, offset: int, cap: Any, meta_path: str) -> None:
    """Validates a stored list of inclusive physical `[start, end]` segments (StorageFormatError naming the bad one)."""
    segs = meta.get(key)
    if segs is None:
        return
    if not isinstance(segs, list) or not all(
            isinstance(p, list) and len(p) == 2 and all(isinstance(v, int) and not isinstance(v, bool) for v in p)
            for p in segs):
        raise StorageFormatError(f"{meta_path}: {key} must be a list of [start, end] pairs")
    limit = cap if cap is not None else count
    runs: List[Tuple[int, int]] = []
    for s, e in segs:
        if not (0 <= s < max(limit, 1) and 0 <= e < max(limit, 1)) or (cap is None and e < s):
            raise StorageFormatError(f"{meta_path}: segment [{s}, {e}] lies outside the buffer")
        n = run_length(s, e, cap)
        if logical_row(offset, s, cap) + n > count:
            raise StorageFormatError(f"{meta_path}: segment [{s}, {e}] covers rows that hold no data "
                                     f"(count {count}, offset {offset})")
        runs.append((s, n))
    clash = first_overlap(runs, cap)
    if clash is not None:
        a, b = (segs[i] for i in clash)
        raise StorageFormatError(f"{meta_path}: segments {list(a)} and {list(b)} overlap")
