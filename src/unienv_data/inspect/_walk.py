"""Walking a dataset: `detect` what a path holds, `walk` it into a tree of `StorageNode`s, following the storages
that a replay buffer, `DictStorage`, `FlattenedStorage` or wrapper storage names (see the package docstring)."""
from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from unienv_data.base.errors import StorageFormatError, StorageNotFoundError
from unienv_data.base.ring import run_length
from unienv_data.replay_buffer._buffer_log import BUFFER_LOG_FILE, apply_buffer_log
from unienv_data.storages._commit_log import DICT_LOG_FILE, FLATTENED_LOG_FILE, read_log

from ._fill_leaves import _apply_generic_meta, _fill_array, _fill_generic, _fill_hdf5, _fill_image, _fill_video
from ._metadata import _inside, _int_or_none, _read_meta, _short
from ._records import ARRAY_KINDS, DIRECTORY_METADATA, HDF5_EXTENSIONS, SIDECAR_SUFFIX, FileRecord, StorageNode
from ._space_json import _prune_json, _sub_json, itemsize, leaf_items


def detect(path: str) -> Tuple[str, str]:
    """`(kind, metadata file)` of what `path` holds; StorageNotFoundError / StorageFormatError otherwise."""
    if os.path.isfile(path):
        if path.endswith(HDF5_EXTENSIONS) and not os.path.isfile(path + SIDECAR_SUFFIX):
            return "HDF5Storage", path
        side = path + SIDECAR_SUFFIX
        if os.path.isfile(side):
            try:
                with open(side) as f:
                    kind = _short(json.load(f).get("storage_type", "array"))
            except (OSError, ValueError, AttributeError):
                kind = "array"
            return kind, side
        raise StorageFormatError(f"{path} is a file without a {SIDECAR_SUFFIX} sidecar: not a dataset this tool "
                                 "can recognise (pass the dataset directory)")
    if not os.path.isdir(path):
        raise StorageNotFoundError(f"no such file or directory: {path}")
    for name, kind in DIRECTORY_METADATA:
        if os.path.isfile(os.path.join(path, name)):
            return kind, os.path.join(path, name)
    for name in sorted(os.listdir(path)):
        if name.endswith(".json") and "metadata" in name:
            try:
                with open(os.path.join(path, name)) as f:
                    st = json.load(f).get("storage_type")
            except (OSError, ValueError, AttributeError):
                continue
            if isinstance(st, str):
                return _short(st), os.path.join(path, name)
    known = ", ".join(n for n, _ in DIRECTORY_METADATA)
    unfinished = ""
    if os.path.isdir(os.path.join(path, "storage")) or os.path.exists(os.path.join(path, ".writer.lock")):
        unfinished = ("; it looks like a ReplayBuffer.create() that did not finish (the process died while creating "
                      "it): nothing in it was committed; create it again with ReplayBuffer.create(..., "
                      f"cache_path={path!r}, overwrite=True)")
    raise StorageFormatError(f"{path} holds no dataset metadata (looked for {known}, or a file with a "
                             f"{SIDECAR_SUFFIX} sidecar){unfinished}")


def walk(path: str) -> StorageNode:
    """The storage tree of the dataset at `path` (a directory, or one array file); see the module docstring.

    Problems found in the metadata are recorded on the nodes (`StorageNode.problems`), not raised, so a damaged
    dataset can still be described; only a path that holds no recognisable dataset raises."""
    path = os.path.abspath(os.fspath(path))
    kind, meta_file = detect(path)
    if os.path.isfile(path):
        root, rel = os.path.dirname(path), os.path.basename(path)
    else:
        root, rel = path, "."
    node = StorageNode(rel=rel, kind=kind, storage_type=kind)
    _fill(root, node, os.path.relpath(meta_file, root), None)
    node.rel = "." if rel == "." else rel
    return node


#: how deep storages may nest (a deeper chain is reported as a problem: metadata that points in a circle)
MAX_DEPTH = 32
_UNEXPECTED = (TypeError, ValueError, KeyError, AttributeError, IndexError, OverflowError, RecursionError)


def _fill(root: str, node: StorageNode, meta_rel: Optional[str], space_json: Optional[Dict[str, Any]]) -> None:
    """Reads the node's metadata and everything below it; metadata of an unexpected shape becomes a problem."""
    try:
        _fill_node(root, node, meta_rel, space_json)
    except _UNEXPECTED as exc:
        where = node.metadata_rel or meta_rel or node.rel
        node.problems.append(f"{where}: unexpected metadata content ({type(exc).__name__}: {str(exc)[:200]})")


def _fill_node(root: str, node: StorageNode, meta_rel: Optional[str], space_json: Optional[Dict[str, Any]]) -> None:
    if node.kind in ARRAY_KINDS or node.kind == "array":
        _fill_array(root, node, space_json)
        return
    if node.kind == "HDF5Storage":
        _fill_hdf5(root, node, space_json)
        return
    if meta_rel is None:
        for name, kind in DIRECTORY_METADATA:
            if kind == node.kind:
                meta_rel = os.path.normpath(os.path.join(node.rel, name))
        if meta_rel is None:
            _fill_generic(root, node, space_json)
            return
    meta = _read_meta(root, meta_rel, node)
    if meta is None:
        return
    filler = {"ReplayBuffer": _fill_buffer, "DictStorage": _fill_dict, "FlattenedStorage": _fill_flattened,
              "VideoStorage": _fill_video, "ImageStorage": _fill_image, "TransformedStorage": _fill_wrapper,
              "ToBackendOrDeviceStorage": _fill_wrapper}.get(node.kind)
    if filler is None:
        _apply_generic_meta(root, node, meta, space_json)
        return
    filler(root, node, meta, space_json)


def _child(root: str, parent: StorageNode, storage_type: Any, rel: Any, what: str, key: Optional[str],
           prefix: Tuple[str, ...], space_json: Optional[Dict[str, Any]]) -> None:
    joined = _inside(root, rel, parent, what)
    if joined is None:
        return
    if joined == parent.rel or parent.depth >= MAX_DEPTH:
        parent.problems.append(f"{parent.metadata_rel}: {what} path {rel!r} points back into the storage that names "
                               "it (or storages nest deeper than this tool follows)")
        return
    if not isinstance(storage_type, str):
        parent.problems.append(f"{parent.metadata_rel}: {what} has no storage type")
        return
    child = StorageNode(rel=joined, kind=_short(storage_type), storage_type=storage_type, key=key, prefix=prefix,
                        depth=parent.depth + 1)
    parent.children.append(child)
    if not os.path.exists(os.path.join(root, joined)):
        child.problems.append(f"{joined}: {what} is missing ({parent.metadata_rel} names it)")
        child.space_json = space_json
        return
    _fill(root, child, None, space_json)


def _fill_buffer(root: str, node: StorageNode, meta: Dict[str, Any], _space: Any) -> None:
    if meta.get("type") != "ReplayBuffer":
        node.problems.append(f"{node.metadata_rel}: type is {meta.get('type')!r}, expected 'ReplayBuffer'")
        return
    node.storage_type = "ReplayBuffer"
    log_rel = os.path.normpath(os.path.join(node.rel, BUFFER_LOG_FILE))
    if os.path.isfile(os.path.join(root, log_rel)):
        node.files.append(FileRecord(log_rel, "metadata", os.path.getsize(os.path.join(root, log_rel))))
        try:        # the commit points since metadata.json was written, as `load_from` applies them
            logged = apply_buffer_log(os.path.join(root, node.rel), meta)
        except StorageFormatError as exc:
            node.problems.append(str(exc).replace(os.path.join(root, log_rel), log_rel))
        else:
            if logged is not meta:
                meta = node.meta = logged       # what the summary reads too (offset, count)
                node.notes.append(f"{log_rel}: the buffer's count, offset and episodes come from this commit log, "
                                  "newer than metadata.json (the buffer was not closed)")
    node.space_json = meta.get("single_instance_space") if isinstance(meta.get("single_instance_space"), dict) else None
    if node.space_json is None:
        node.problems.append(f"{node.metadata_rel}: single_instance_space is missing")
    node.capacity = _int_or_none(meta.get("capacity"))
    node.length = _int_or_none(meta.get("count"))
    cap = node.capacity
    segs = meta.get("physical_segments")
    if segs is None:
        segs = meta.get("buffer_segments")     # the list of a buffer that does not maintain segment metadata
    if isinstance(segs, list):
        node.runs = [(int(s), run_length(int(s), int(e), cap or None))
                     for s, e in (p for p in segs if isinstance(p, list) and len(p) == 2)]
    for field_name in ("count", "offset"):
        if _int_or_none(meta.get(field_name)) is None or meta[field_name] < 0:
            node.problems.append(f"{node.metadata_rel}: {field_name!r} must be a non-negative int, got "
                                 f"{meta.get(field_name)!r}")
    if cap is not None and node.length is not None and node.length > cap:
        node.problems.append(f"{node.metadata_rel}: count {node.length} exceeds capacity {cap}")
    _child(root, node, meta.get("storage_cls"), meta.get("storage_path_relative"), "the buffer's storage", None, (),
           node.space_json)
    if node.runs is None and node.children:
        node.runs = node_runs(node.children[0])


def _fill_dict(root: str, node: StorageNode, meta: Dict[str, Any], space_json: Optional[Dict[str, Any]]) -> None:
    if isinstance(meta.get("space"), dict):
        space_json = meta["space"]
    node.space_json = space_json
    node.capacity = _int_or_none(meta.get("capacity"))
    sep = meta.get("nested_separator", "/")
    smap = meta.get("storage_map")
    groups_raw = meta.get("groups")
    groups: Dict[str, Any] = groups_raw if isinstance(groups_raw, dict) else {}
    if not isinstance(smap, dict) or not smap or not isinstance(sep, str) or not sep:
        node.problems.append(f"{node.metadata_rel}: 'storage_map' must be a non-empty object")
        return
    all_leaves = [p for p, _ in leaf_items(space_json)] if space_json else []
    claimed: set = set()
    pending_wild: List[Tuple[str, Any]] = []
    for key, entry in smap.items():
        if not isinstance(entry, dict):
            node.problems.append(f"{node.metadata_rel}: storage_map[{key!r}] must be an object")
            continue
        parts = tuple(str(key).split(sep))
        if key in groups and space_json is not None:
            wanted: List[Tuple[str, ...]] = []
            for p in groups[key]:
                pp = tuple(str(p).split(sep))
                wanted.extend(lf for lf in all_leaves if lf[:len(pp)] == pp)
            claimed.update(wanted)
            _child(root, node, entry.get("type"), entry.get("path"), f"storage_map[{key!r}]", key, node.prefix,
                   _prune_json(space_json, wanted))
        elif parts[-1] == "*":
            pending_wild.append((key, entry))
        else:
            claimed.update(lf for lf in all_leaves if lf[:len(parts)] == parts)
            _child(root, node, entry.get("type"), entry.get("path"), f"storage_map[{key!r}]", key,
                   node.prefix + parts, _sub_json(space_json, parts) if space_json is not None else None)
    for key, entry in sorted(pending_wild, key=lambda ke: -len(ke[0])):
        prefix = tuple(str(key).split(sep))[:-1]
        sub: Optional[Dict[str, Any]] = None
        if space_json is not None:
            rest = [lf[len(prefix):] for lf in all_leaves if lf[:len(prefix)] == prefix and lf not in claimed]
            claimed.update(prefix + r for r in rest)
            base = _sub_json(space_json, prefix)
            sub = _prune_json(base, rest) if base is not None else None
        _child(root, node, entry.get("type"), entry.get("path"), f"storage_map[{key!r}]", key, node.prefix + prefix,
               sub)
    for c in node.children:
        if node.capacity is not None and c.capacity is not None and c.capacity != node.capacity:
            node.problems.append(f"{c.rel}: capacity {c.capacity} differs from the DictStorage's {node.capacity}")
    _apply_commit_log(root, node, DICT_LOG_FILE, node.children)
    lengths = {c.length for c in node.children if c.length is not None}
    node.length = lengths.pop() if len(lengths) == 1 else node.length
    if len(lengths) > 1:
        node.problems.append(f"{node.rel}: children disagree on their length: "
                             f"{ {c.key: c.length for c in node.children} }")
    node.runs = node_runs(node)


#: storages that keep no length or segments of their own: they report their inner storage's
_WRAPPER_KINDS = ("FlattenedStorage", "TransformedStorage", "ToBackendOrDeviceStorage")


def _log_chain(node: StorageNode) -> List[StorageNode]:
    """The nodes from a DictStorage child (or a FlattenedStorage's inner storage) down to the storage whose state the
    owner's commit log holds (the metadata-side view of `SpaceStorage.commit_log_leaf`: an array file whose sidecar
    keeps a segment list, under any wrappers); empty when the child persists its state itself (video, images,
    HDF5)."""
    chain = [node]
    while node.kind in _WRAPPER_KINDS and node.children:
        node = node.children[0]
        chain.append(node)
    if node.kind in ARRAY_KINDS and node.runs is not None:
        return chain
    return []


def _apply_commit_log(root: str, node: StorageNode, log_file: str, children: List[StorageNode]) -> None:
    """Takes the committed length and segments from the commit log `log_file` of a DictStorage or FlattenedStorage
    onto the children it holds them for, as their `load_from` does (after a crash the log is newer than those
    children's own files). The log is read by the storages' own reader (`_commit_log.read_log`); a damaged log is
    recorded as a problem."""
    rel = os.path.normpath(os.path.join(node.rel, log_file))
    full = os.path.join(root, rel)
    if not os.path.isfile(full):
        return
    node.files.append(FileRecord(rel, "metadata", os.path.getsize(full)))
    try:
        logged = read_log(full, node.capacity)
    except StorageFormatError as exc:
        node.problems.append(str(exc).replace(full, rel))
        return
    if logged is None:
        return
    length, runs = logged
    newer = False
    for child in children:
        chain = _log_chain(child)
        if not chain:
            continue
        leaf = chain[-1]
        newer = newer or leaf.length != length or leaf.runs != runs
        leaf.length, leaf.runs = length, list(runs)
        if leaf.capacity is None:           # a growable file must hold the committed rows
            dtype, shape = leaf.meta.get("dtype"), leaf.meta.get("shape")
            row_bytes = itemsize(dtype) * int(np.prod(shape or [], dtype=np.int64)) if dtype is not None else 0
            for f in leaf.files:
                if f.role == "data" and row_bytes:
                    f.minimum = length * row_bytes
                    f.detail = f"at least {length} rows ({row_bytes} bytes each; {rel} commits them)"
        for wrapper in reversed(chain[:-1]):
            inner = wrapper.children[0]
            wrapper.length, wrapper.runs = inner.length, inner.runs
    if newer:
        whose = ("the children's", "their own metadata files") if node.kind == "DictStorage" else (
            "the inner storage's", "its own metadata file")
        node.notes.append(f"{rel}: {whose[0]} length and segments come from this commit log, newer than {whose[1]} "
                          "(the storage was not closed)")


def _fill_flattened(root: str, node: StorageNode, meta: Dict[str, Any], space_json: Optional[Dict[str, Any]]) -> None:
    if isinstance(meta.get("space"), dict):
        space_json = meta["space"]
    node.space_json = space_json
    node.capacity = _int_or_none(meta.get("capacity"))
    row: Dict[str, Any] = meta["row"] if isinstance(meta.get("row"), dict) else {}
    layout: List[Any] = meta["layout"] if isinstance(meta.get("layout"), list) else []
    width = sum(int(e.get("size", 0)) for e in layout if isinstance(e, dict))
    if row and layout and row.get("width") != width:
        node.problems.append(f"{node.metadata_rel}: row width {row.get('width')} differs from its layout ({width})")
    flat_json = None
    if row:
        flat_json = {"type": "BoxSpace", "shape": [row.get("width", width)], "dtype": row.get("dtype"), "low": 0,
                     "high": 0}
    _child(root, node, meta.get("inner_storage_type"), meta.get("inner_storage_path"), "inner storage", None,
           node.prefix, flat_json)
    if node.children:
        _apply_commit_log(root, node, FLATTENED_LOG_FILE, node.children[:1])
        inner = node.children[0]
        node.length = inner.length
        node.capacity = node.capacity if node.capacity is not None else inner.capacity
        node.runs = inner.runs


def _fill_wrapper(root: str, node: StorageNode, meta: Dict[str, Any], space_json: Optional[Dict[str, Any]]) -> None:
    if isinstance(meta.get("space"), dict):
        space_json = meta["space"]
    node.space_json = space_json
    inner_space = None if node.kind == "TransformedStorage" else space_json
    _child(root, node, meta.get("inner_storage_type"), meta.get("inner_storage_path"), "inner storage", None,
           node.prefix, inner_space)
    if node.children:
        inner = node.children[0]
        node.capacity, node.length, node.runs = inner.capacity, inner.length, inner.runs


def node_runs(node: StorageNode) -> Optional[List[Tuple[int, int]]]:
    """Segments of a node as physical (start, length) runs; a DictStorage keeps those all its children hold."""
    if node.kind == "DictStorage":
        sets = [set(c.runs) for c in node.children if c.runs is not None]
        if not sets:
            return None
        common = set.intersection(*sets)
        return sorted(common)
    return node.runs
