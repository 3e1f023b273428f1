"""Summaries of a walked dataset: episodes in logical order, bytes per key, and `describe` (what `info` prints)."""
from __future__ import annotations

import os
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

from ._metadata import _int_or_none
from ._records import ARRAY_KINDS, METADATA_BUCKET, StorageNode
from ._space_json import leaf_items, leaf_nbytes, space_tree_lines
from ._walk import _UNEXPECTED, node_runs, walk


def rotation(runs: Optional[List[Tuple[int, int]]], capacity: Optional[int]) -> int:
    """The row a bare storage's logical order starts at: the start of a segment wrapping the ring, else 0."""
    if not capacity or not runs:
        return 0
    for s, n in runs:
        if s + n > capacity:
            return s
    return 0


def logical_episodes(root: StorageNode) -> List[Tuple[int, int]]:
    """Episodes as logical half-open `(start, end)` ranges, oldest first (see the module docstring)."""
    runs = root.runs if root.kind != "DictStorage" else node_runs(root)
    if not runs:
        return []
    cap = root.capacity
    out = []
    if root.kind == "ReplayBuffer":
        offset = _int_or_none(root.meta.get("offset")) or 0
        count = root.length or 0
        for s, n in runs:
            start = (s - offset) % cap if cap else s
            if start + n <= count:
                out.append((start, start + n))
    else:
        rot = rotation(runs, cap)
        for s, n in runs:
            start = (s - rot) % cap if cap else s
            out.append((start, start + n))
    return sorted(out)


# ---------------------------------------------------------------------------------------------------- bytes per key
def bytes_per_key(root: StorageNode) -> Dict[str, int]:
    """Bytes on disk per leaf key path; a flat row is split by each leaf's share of the row, metadata files are
    counted under `"(metadata)"`, and a storage holding several leaves it does not split under its key."""
    out: Dict[str, int] = {}

    def add(key: str, n: int, _sources: List[StorageNode]) -> None:
        out[key] = out.get(key, 0) + n

    _visit_key_bytes(root, add)
    return out


def preallocated_rows_per_key(root: StorageNode) -> Dict[str, int]:
    """The keys whose bytes are all in fixed-capacity array files (a ring's memory maps, created at their full
    size), each with the rows those files are allocated for (the capacity)."""
    caps: Dict[str, Optional[int]] = {}

    def add(key: str, n: int, sources: List[StorageNode]) -> None:
        if key == METADATA_BUCKET or not n:
            return
        for src in sources:
            cap = src.capacity if src.kind in ARRAY_KINDS else None
            caps[key] = cap if caps.get(key, cap) == cap else None

    _visit_key_bytes(root, add)
    return {k: c for k, c in caps.items() if c is not None}


def _visit_key_bytes(root: StorageNode, add: Callable[[str, int, List[StorageNode]], None]) -> None:
    """Calls `add(key, bytes, storages holding them)` for every share of the files below `root` (see
    `bytes_per_key`)."""

    def visit(node: StorageNode) -> None:
        for f in node.files:
            if f.role == "metadata":
                add(METADATA_BUCKET, f.size or 0, [node])
        data = sum(f.size or 0 for f in node.files if f.role != "metadata")
        if node.kind == "FlattenedStorage" and isinstance(node.meta.get("layout"), list):
            for c in node.children:
                for sub in c.iter():
                    for rec in sub.files:
                        if rec.role == "metadata":
                            add(METADATA_BUCKET, rec.size or 0, [sub])
            holders = [n for c in node.children for n in c.iter() if any(f.role != "metadata" for f in n.files)]
            inner = sum(f.size or 0 for n in holders for f in n.files if f.role != "metadata")
            entries = [e for e in node.meta["layout"] if isinstance(e, dict)]
            width = sum(int(e.get("size", 0)) for e in entries) or 1
            given = 0
            for i, e in enumerate(entries):
                key_parts = node.prefix + tuple(p for p in str(e.get("key") or "").split("/") if p)
                share = inner - given if i == len(entries) - 1 else inner * int(e.get("size", 0)) // width
                given += share
                add("/".join(key_parts) or "<value>", share, holders)
            return
        if data:
            leaves = node.leaves
            add(leaves[0] if len(leaves) == 1 else (node.key or "{" + ", ".join(leaves) + "}"), data, [node])
        for c in node.children:
            visit(c)

    visit(root)


def raw_bytes_per_key(space_json: Optional[Dict[str, Any]], rows: int) -> Dict[str, int]:
    """What each Box / Binary leaf takes for `rows` samples in its own dtype, uncompressed."""
    return {"/".join(p) or "<value>": leaf_nbytes(js) * rows for p, js in leaf_items(space_json)}


def allocated_bytes(path: str, root: StorageNode) -> int:
    """Bytes the dataset's files take on the disk (allocated blocks): less than their sizes where a preallocated
    file (a ring's memory map) still has rows never written, which the file system leaves as holes."""
    base = path if os.path.isdir(path) else os.path.dirname(path)
    total = 0
    for f in {f.rel: f for n in root.iter() for f in n.files if f.size is not None}.values():
        try:
            st = os.stat(os.path.join(base, f.rel))
        except OSError:
            continue
        blocks = getattr(st, "st_blocks", None)       # not on Windows: the size is what is allocated there
        total += st.st_size if blocks is None else int(blocks) * 512
    return total


def describe(path: str) -> Dict[str, Any]:
    """A JSON-ready summary of the dataset at `path` (metadata only; see `walk`). Damaged metadata never makes it
    raise: what cannot be worked out is left empty and said under "problems"."""
    root = walk(path)
    problems = [p for n in root.iter() for p in n.problems]

    def safe(fn: Any, default: Any, what: str) -> Any:
        try:
            return fn()
        except _UNEXPECTED as exc:
            problems.append(f"{what}: cannot be worked out from the metadata ({type(exc).__name__}: {str(exc)[:200]})")
            return default

    episodes = safe(lambda: logical_episodes(root), [], "episodes")
    lengths = [e - s for s, e in episodes]
    rows = root.length if root.length is not None else 0
    storages = []
    for node, depth in _with_depth(root):
        storages.append({"path": node.rel, "kind": node.kind, "storage_type": node.storage_type, "depth": depth,
                         "key": node.key, "keys": safe(lambda: node.leaves, [], f"{node.rel}: keys"),
                         "format_version": node.format_version, "capacity": node.capacity, "length": node.length,
                         "segments": len(node.runs) if node.runs is not None else None,
                         "bytes": sum(f.size or 0 for f in node.files), "total_bytes": node.nbytes(),
                         "details": safe(lambda: node_details(node), "", f"{node.rel}: details"),
                         "notes": node.notes})
    versions = {n.metadata_rel: n.format_version for n in root.iter() if n.metadata_rel is not None}
    space = root.space_json
    return {
        "path": os.path.abspath(path), "kind": root.kind, "format_versions": versions,
        "capacity": root.capacity, "length": root.length,
        "offset": root.meta.get("offset") if root.kind == "ReplayBuffer" else None,
        "episodes": [list(e) for e in episodes], "episode_lengths": lengths,
        "space": space, "space_tree": safe(lambda: space_tree_lines(space) if space else [], [], "space tree"),
        "storages": storages, "bytes_per_key": safe(lambda: bytes_per_key(root), {}, "bytes per key"),
        "raw_bytes_per_key": safe(lambda: raw_bytes_per_key(space, rows), {}, "raw bytes per key"),
        "preallocated_rows_per_key": safe(lambda: preallocated_rows_per_key(root), {}, "preallocated rows per key"),
        "total_bytes": root.nbytes(), "allocated_bytes": safe(lambda: allocated_bytes(path, root), None,
                                                               "allocated bytes"),
        "problems": problems,
    }


def _with_depth(node: StorageNode, depth: int = 0) -> Iterator[Tuple[StorageNode, int]]:
    yield node, depth
    for c in node.children:
        yield from _with_depth(c, depth + 1)


def node_details(node: StorageNode) -> str:
    """A short description of how a node stores its data (row layout, codec, image format, ...)."""
    m = node.meta
    if node.kind in ARRAY_KINDS and m:
        return f"{m.get('dtype')}{list(m.get('shape') or [])} per row"
    if node.kind == "FlattenedStorage" and isinstance(m.get("row"), dict):
        return f"flat rows of {m['row'].get('width')} x {m['row'].get('dtype')}"
    if node.kind == "VideoStorage":
        files: Dict[str, Any] = m["files"] if isinstance(m.get("files"), dict) else {}
        return (f"{m.get('codec')} {m.get('file_pixel_format')} {'lossless' if m.get('lossless') else 'lossy'}, "
                f"{m.get('fps')} fps, {len(files)} files")
    if node.kind == "ImageStorage":
        return f"{m.get('format')} files, {'lossless' if m.get('lossless') else 'lossy'}"
    if node.kind == "DictStorage" and isinstance(m.get("groups"), dict) and m["groups"]:
        return "groups: " + "; ".join(f"{g} = {', '.join(map(str, v))}" for g, v in m["groups"].items())
    if node.kind == "ReplayBuffer":
        return f"count {m.get('count')}, offset {m.get('offset')}"
    return ""
