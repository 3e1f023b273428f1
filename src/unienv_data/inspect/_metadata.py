"""Reading one metadata file onto a `StorageNode` (problems recorded, not raised), and the small checks the walk
applies to what it reads: paths that must stay inside the dataset, ints, segment runs."""
from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Optional, Tuple

from unienv_data.base.files import FORMAT_VERSION

from ._records import FileRecord, StorageNode


def _read_meta(root: str, rel: str, node: StorageNode) -> Optional[Dict[str, Any]]:
    """Parses a metadata file; records a problem naming the file when it is missing or damaged."""
    full = os.path.join(root, rel)
    try:
        with open(full, "r") as f:
            data = json.load(f)
    except FileNotFoundError:
        node.problems.append(f"{rel}: metadata file is missing")
        return None
    except (ValueError, RecursionError) as exc:       # JSONDecodeError and UnicodeDecodeError are ValueErrors
        node.problems.append(f"{rel}: metadata is damaged (not valid JSON: {str(exc)[:200]})")
        return None
    except OSError as exc:
        node.problems.append(f"{rel}: cannot read metadata ({exc})")
        return None
    node.files.append(FileRecord(rel, "metadata", os.path.getsize(full)))
    if not isinstance(data, dict):
        node.problems.append(f"{rel}: metadata must be a JSON object, got {type(data).__name__}")
        return None
    v = data.get("format_version", 0)
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        node.problems.append(f"{rel}: invalid format_version {v!r}")
        return None
    if v > FORMAT_VERSION:
        node.problems.append(f"{rel}: format_version {v} is newer than this library supports ({FORMAT_VERSION})")
        return None
    node.format_version = v
    node.metadata_rel = rel
    node.meta = data
    return data


def _short(storage_type: Any) -> str:
    return str(storage_type).rsplit(".", 1)[-1]


def _size(root: str, rel: str) -> Optional[int]:
    try:
        return os.path.getsize(os.path.join(root, rel))
    except OSError:
        return None


def _inside(root: str, rel: Any, node: StorageNode, what: str) -> Optional[str]:
    """`rel` joined below the directory of `node`, or None (and a problem) when it would leave the dataset."""
    if not isinstance(rel, str) or not rel or "\x00" in rel or os.path.isabs(rel):
        node.problems.append(f"{node.metadata_rel}: {what} has an invalid path {rel!r}")
        return None
    base = node.rel if os.path.isdir(os.path.join(root, node.rel)) else os.path.dirname(node.rel)
    joined = os.path.normpath(os.path.join(base, rel))
    real_root = os.path.realpath(root)
    real = os.path.realpath(os.path.join(root, joined))
    if joined.startswith("..") or not (real == real_root or real.startswith(real_root + os.sep)):
        node.problems.append(f"{node.metadata_rel}: {what} path {rel!r} points outside the dataset directory")
        return None
    return joined


def _int_or_none(v: Any) -> Optional[int]:
    return int(v) if isinstance(v, int) and not isinstance(v, bool) else None


def _runs(data: Any) -> Optional[List[Tuple[int, int]]]:
    if not isinstance(data, list):
        return None
    out = []
    for item in data:
        if isinstance(item, list) and len(item) == 2 and all(isinstance(v, int) for v in item):
            out.append((int(item[0]), int(item[1])))
    return out
