"""Looking inside a stored dataset without knowing how it was written (used by the `unienv-data` commands).

`walk(path)` reads only metadata files: it detects what `path` holds (a `ReplayBuffer` directory, a `DictStorage`,
`FlattenedStorage`, `VideoStorage`, `ImageStorage`, a transformed or backend-adapter storage, or one raw `.memmap`
array file with its `.meta.json` sidecar), follows every nested storage the metadata names, and returns a tree of
`StorageNode`s: kind, registry name, format version, capacity, length, segments, the key paths each storage
holds, and every file with the size its metadata promises. Nothing is imported by a name read from a file and
no path outside the dataset directory is followed.

`describe(path)` turns that tree into a JSON-ready summary (space tree, storage per key, bytes per key, episodes,
format versions); `open_dataset(path)` opens the data itself read-only through the library's own `load_from`
(so every check the storages make on load applies) and reads rows or single keys by logical index.

Logical order: a `ReplayBuffer` is read oldest first (its own logical indices). A bare storage is read in row
order; when one of its segments wraps the ring, rows are rotated so that segment starts the order and no
recorded episode is split.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from unienv_data.base.errors import StorageFormatError, StorageNotFoundError
from unienv_data.base.files import FORMAT_VERSION

#: metadata file name -> short kind, in the order a directory is probed
DIRECTORY_METADATA: Tuple[Tuple[str, str], ...] = (
    ("metadata.json", "ReplayBuffer"),
    ("dict_storage_metadata.json", "DictStorage"),
    ("flattened_metadata.json", "FlattenedStorage"),
    ("video_metadata.json", "VideoStorage"),
    ("image_metadata.json", "ImageStorage"),
    ("transformed_metadata.json", "TransformedStorage"),
    ("backend_metadata.json", "ToBackendOrDeviceStorage"),
)
SIDECAR_SUFFIX = ".meta.json"
ARRAY_KINDS = ("PytorchTensorStorage", "NumpyMemmapStorage")
IMAGE_EXTENSIONS = {"PNG": "png", "JPEG": "jpeg", "WEBP": "webp"}
#: where `unienv-data verify --write-checksums` puts checksums (`sha256sum` format, paths relative to the root)
CHECKSUM_FILE = "checksums.sha256"
HDF5_EXTENSIONS = (".hdf5", ".h5")
#: the root attribute where HDF5Storage keeps this library's bookkeeping (JSON)
HDF5_ATTRIBUTE = "unienv_storage"
METADATA_BUCKET = "(metadata)"


# ---------------------------------------------------------------------------------------------------- records
@dataclass
class FileRecord:
    """One file of a storage: its size now and what the metadata promises (None: no promise)."""

    rel: str                               #: path relative to the dataset root
    role: str                              #: "metadata", "data", "video", "image" or "other"
    size: Optional[int]                    #: bytes on disk, None when missing
    expected: Optional[int] = None         #: exact size promised by the metadata
    minimum: Optional[int] = None          #: smallest size that holds what the metadata promises
    detail: str = ""                       #: what the promise is (e.g. "500 rows of uint8[64, 64, 3]")
    sha256: Optional[str] = None           #: checksum recorded in the metadata, if any


@dataclass
class StorageNode:
    """One storage (or the replay buffer) found while walking a dataset."""

    rel: str                               #: its file or directory, relative to the dataset root ("." for the root)
    kind: str                              #: short class name ("DictStorage", "PytorchTensorStorage", ...)
    storage_type: str                      #: the name its metadata uses (registry name)
    format_version: Optional[int] = None
    metadata_rel: Optional[str] = None
    meta: Dict[str, Any] = field(default_factory=dict)
    key: Optional[str] = None              #: its key in the parent DictStorage's storage map
    prefix: Tuple[str, ...] = ()           #: where its space sits in the dataset's space
    space_json: Optional[Dict[str, Any]] = None
    capacity: Optional[int] = None
    length: Optional[int] = None
    runs: Optional[List[Tuple[int, int]]] = None  #: recorded segments as physical (start, length)
    files: List[FileRecord] = field(default_factory=list)
    children: List["StorageNode"] = field(default_factory=list)
    problems: List[str] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)
    depth: int = 0                         #: how many storages lie above it

    def iter(self) -> Iterator["StorageNode"]:
        """This node and every node below it, depth first."""
        yield self
        for c in self.children:
            yield from c.iter()

    @property
    def leaves(self) -> List[str]:
        """Key paths (joined with "/") of the space leaves this storage holds."""
        if self.space_json is None:
            return ["/".join(self.prefix)] if self.prefix else []
        return ["/".join(self.prefix + p) or "<value>" for p, _ in leaf_items(self.space_json)]

    def nbytes(self, roles: Sequence[str] = ("data", "video", "image", "other", "metadata")) -> int:
        """Bytes on disk of this node's files and those below it (only the given roles)."""
        return sum(f.size or 0 for n in self.iter() for f in n.files if f.role in roles)


# ---------------------------------------------------------------------------------------------------- spaces (JSON)
def leaf_items(space_json: Any, path: Tuple[str, ...] = ()) -> List[Tuple[Tuple[str, ...], Dict[str, Any]]]:
    """`[(key path, leaf JSON)]` of a space JSON, in its key order (tuples index their entries "0", "1", ...)."""
    if not isinstance(space_json, dict):
        return []
    kind = space_json.get("type")
    if kind == "DictSpace" and isinstance(space_json.get("spaces"), dict):
        out: List[Tuple[Tuple[str, ...], Dict[str, Any]]] = []
        for k, v in space_json["spaces"].items():
            out.extend(leaf_items(v, path + (str(k),)))
        return out
    if kind == "TupleSpace" and isinstance(space_json.get("spaces"), list):
        out = []
        for i, v in enumerate(space_json["spaces"]):
            out.extend(leaf_items(v, path + (str(i),)))
        return out
    return [(path, space_json)]


def itemsize(dtype_name: Any) -> int:
    """Bytes per element of a dtype written in metadata (bfloat16 included); 0 when unknown."""
    name = str(dtype_name).replace("torch.", "")
    if name == "bfloat16":
        return 2
    try:
        return int(np.dtype(name).itemsize)
    except TypeError:
        return 0


def leaf_nbytes(leaf: Dict[str, Any]) -> int:
    """Bytes of one sample of a Box / Binary leaf in its own dtype (0 for other leaves)."""
    if leaf.get("type") not in ("BoxSpace", "BinarySpace"):
        return 0
    n = 1
    for d in leaf.get("shape") or []:
        n *= int(d)
    return n * itemsize(leaf.get("dtype", "bool"))


def is_image_leaf(leaf: Dict[str, Any]) -> bool:
    """uint8 Box leaves shaped (H, W), (H, W, 1), (H, W, 3) or (H, W, 4), and leaves marked `kind: image`."""
    meta = leaf.get("metadata")
    if isinstance(meta, dict) and meta.get("kind") == "image":
        return True
    if leaf.get("type") != "BoxSpace" or str(leaf.get("dtype")) != "uint8":
        return False
    shape = list(leaf.get("shape") or [])
    return (len(shape) == 3 and shape[-1] in (1, 3, 4) and min(shape[:2]) >= 8) or (
        len(shape) == 2 and min(shape) >= 8)


def _bound_text(v: Any) -> str:
    if isinstance(v, list):
        flat = np.asarray(v, dtype=np.float64).ravel()
        return f"{_num(flat.min())}..{_num(flat.max())}" if flat.size else "[]"
    return _num(v)


def _num(v: Any) -> str:
    if isinstance(v, (int, np.integer)) and not isinstance(v, bool):
        return str(int(v))
    try:
        f = float(v)
    except (TypeError, ValueError):
        return str(v)
    if np.isinf(f):
        return "inf" if f > 0 else "-inf"
    return f"{f:g}"


def describe_leaf(leaf: Dict[str, Any]) -> str:
    """One line describing a leaf space JSON, e.g. `Box float32 (2,) [-1, 1]`."""
    kind = leaf.get("type", "?")
    shape = tuple(leaf.get("shape") or [])
    if kind == "BoxSpace":
        return f"Box {leaf.get('dtype')} {shape} [{_bound_text(leaf.get('low'))}, {_bound_text(leaf.get('high'))}]"
    if kind == "BinarySpace":
        return f"Binary {leaf.get('dtype', 'bool')} {shape}"
    if kind == "TextSpace":
        return f"Text length {leaf.get('min_length')}..{leaf.get('max_length')}"
    return str(kind)


def space_tree_lines(space_json: Any, indent: str = "  ") -> List[str]:
    """The space as indented lines: sub-dicts as `key/`, leaves as `key  <description>`."""
    lines: List[str] = []

    def visit(js: Any, depth: int, name: Optional[str]) -> None:
        kind = js.get("type") if isinstance(js, dict) else None
        if kind in ("DictSpace", "TupleSpace") and isinstance(js.get("spaces"), (dict, list)):
            if name is not None:
                lines.append(f"{indent * depth}{name}/")
                depth += 1
            items = js["spaces"].items() if isinstance(js["spaces"], dict) else enumerate(js["spaces"])
            for k, v in items:
                visit(v, depth, str(k))
            return
        lines.append(f"{indent * depth}{name if name is not None else '<value>'}  {describe_leaf(js or {})}")

    visit(space_json, 0, None)
    return lines


def _sub_json(space_json: Optional[Dict[str, Any]], path: Tuple[str, ...]) -> Optional[Dict[str, Any]]:
    node = space_json
    for p in path:
        if not isinstance(node, dict) or node.get("type") != "DictSpace" or p not in (node.get("spaces") or {}):
            return None
        node = node["spaces"][p]
    return node


def _prune_json(space_json: Dict[str, Any], keep: List[Tuple[str, ...]]) -> Dict[str, Any]:
    """The sub-dict JSON holding exactly the leaves `keep` (paths relative to `space_json`)."""
    if () in keep or space_json.get("type") != "DictSpace":
        return space_json
    out: Dict[str, Any] = {}
    for k, v in (space_json.get("spaces") or {}).items():
        sub = [p[1:] for p in keep if p and p[0] == k]
        if sub:
            out[k] = _prune_json(v, sub)
    return {"type": "DictSpace", "spaces": out}


# ---------------------------------------------------------------------------------------------------- reading metadata
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


# ---------------------------------------------------------------------------------------------------- walking
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
    raise StorageFormatError(f"{path} holds no dataset metadata (looked for {known}, or a file with a "
                             f"{SIDECAR_SUFFIX} sidecar)")


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
    node.space_json = meta.get("single_instance_space") if isinstance(meta.get("single_instance_space"), dict) else None
    if node.space_json is None:
        node.problems.append(f"{node.metadata_rel}: single_instance_space is missing")
    node.capacity = _int_or_none(meta.get("capacity"))
    node.length = _int_or_none(meta.get("count"))
    cap = node.capacity
    segs = meta.get("physical_segments")
    if isinstance(segs, list):
        node.runs = [(int(s), (int(e) - int(s)) % cap + 1 if cap else int(e) - int(s) + 1)
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
    lengths = {c.length for c in node.children if c.length is not None}
    node.length = lengths.pop() if len(lengths) == 1 else node.length
    if len(lengths) > 1:
        node.problems.append(f"{node.rel}: children disagree on their length: "
                             f"{ {c.key: c.length for c in node.children} }")
    node.runs = node_runs(node)


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


def _fill_array(root: str, node: StorageNode, space_json: Optional[Dict[str, Any]]) -> None:
    side = node.rel + SIDECAR_SUFFIX
    size = _size(root, node.rel)
    dtype: Any = None
    shape: Optional[List[int]] = None
    if os.path.isfile(os.path.join(root, side)):
        meta = _read_meta(root, side, node)
        if meta is None:
            node.files.append(FileRecord(node.rel, "data", size))
            return
        if isinstance(meta.get("storage_type"), str):
            node.storage_type = meta["storage_type"]
            node.kind = _short(meta["storage_type"])
        dtype, shape = meta.get("dtype"), meta.get("shape")
        node.capacity = _int_or_none(meta.get("capacity"))
        node.length = _int_or_none(meta.get("length"))
        node.runs = _runs(meta.get("segments"))
        if space_json is not None and space_json.get("type") in ("BoxSpace", "BinarySpace") and dtype is not None \
                and str(space_json.get("dtype", "bool")) != str(dtype):
            node.problems.append(f"{side}: stores {dtype}, but the space above asks for {space_json.get('dtype')}")
        if space_json is None or space_json.get("type") not in ("BoxSpace", "BinarySpace"):
            space_json = _array_space_json(dtype, shape)
    else:
        node.format_version = 0
        node.notes.append(f"{node.rel}: no {SIDECAR_SUFFIX} sidecar (written by the reference unienv): the row "
                          "count comes from the file size")
        if space_json is not None:
            dtype, shape = space_json.get("dtype", "bool"), space_json.get("shape")
    node.space_json = space_json
    row_bytes = itemsize(dtype) * int(np.prod(shape or [], dtype=np.int64)) if dtype is not None and \
        shape is not None else 0
    rec = FileRecord(node.rel, "data", size)
    if row_bytes:
        what = f"{dtype}{list(shape or [])}"
        if node.capacity is not None:
            rec.expected = node.capacity * row_bytes
            rec.detail = f"{node.capacity} rows of {what} ({row_bytes} bytes each)"
        elif node.length is not None:
            rec.minimum = node.length * row_bytes
            rec.detail = f"at least {node.length} rows of {what} ({row_bytes} bytes each)"
        elif size is not None:
            rows, left = divmod(size, row_bytes)
            node.capacity = node.length = rows
            if left:
                node.problems.append(f"{node.rel}: holds {size} bytes, not a whole number of {what} rows "
                                     f"({row_bytes} bytes each)")
    node.files.append(rec)


def _array_space_json(dtype: Any, shape: Any) -> Dict[str, Any]:
    if dtype == "bool":
        return {"type": "BinarySpace", "shape": list(shape or []), "dtype": "bool"}
    if dtype == "uint8":
        return {"type": "BoxSpace", "shape": list(shape or []), "dtype": "uint8", "low": 0, "high": 255}
    return {"type": "BoxSpace", "shape": list(shape or []), "dtype": dtype, "low": float("-inf"), "high": float("inf")}


def _fill_video(root: str, node: StorageNode, meta: Dict[str, Any], space_json: Optional[Dict[str, Any]]) -> None:
    node.capacity = _int_or_none(meta.get("capacity"))
    node.length = _int_or_none(meta.get("length"))
    node.runs = _runs(meta.get("segments"))
    node.space_json = space_json or {"type": "BoxSpace", "shape": meta.get("shape"), "dtype": "uint8", "low": 0,
                                     "high": 255}
    files = meta.get("files")
    if node.format_version == 0:
        node.notes.append(f"{node.rel}: written by the reference unienv (opens read-only)")
        ext = "." + str(meta.get("file_ext", "mp4")).lstrip(".")
        for name in sorted(n for n in os.listdir(os.path.join(root, node.rel)) if n.endswith(ext)):
            rel = os.path.normpath(os.path.join(node.rel, name))
            node.files.append(FileRecord(rel, "video", _size(root, rel)))
        return
    if not isinstance(files, dict):
        node.problems.append(f"{node.metadata_rel}: 'files' must be an object")
        return
    for name, info in files.items():
        file_rel = _inside(root, name, node, f"video file {name!r}")
        if file_rel is None:
            continue
        info = info if isinstance(info, dict) else {}
        node.files.append(FileRecord(file_rel, "video", _size(root, file_rel), expected=_int_or_none(info.get("bytes")),
                                     detail=f"{info.get('frames')} frames, {info.get('bytes')} bytes when written",
                                     sha256=info.get("sha256") if isinstance(info.get("sha256"), str) else None))
    live = set(files)
    ext = "." + str(meta.get("file_ext", "mp4")).lstrip(".")
    for name in sorted(os.listdir(os.path.join(root, node.rel))):
        if name not in live and (name.endswith(ext) or ".tmp" in name):
            orphan = os.path.normpath(os.path.join(node.rel, name))
            node.notes.append(f"{orphan}: not listed in the metadata (left over; VideoStorage.remove_orphan_files() "
                              "deletes it)")


def _fill_image(root: str, node: StorageNode, meta: Dict[str, Any], space_json: Optional[Dict[str, Any]]) -> None:
    node.capacity = _int_or_none(meta.get("capacity"))
    node.length = _int_or_none(meta.get("length"))
    node.runs = _runs(meta.get("segments"))
    node.space_json = space_json or {"type": "BoxSpace", "shape": meta.get("shape"), "dtype": "uint8", "low": 0,
                                     "high": 255}
    ext = IMAGE_EXTENSIONS.get(str(meta.get("format", "")).upper())
    written = _checked_rows(node, _runs(meta.get("written")) or [], "written")
    if ext is None:
        node.problems.append(f"{node.metadata_rel}: unknown image format {meta.get('format')!r}")
        return
    for s, n in written:
        for r in range(s, s + n):
            rel = os.path.normpath(os.path.join(node.rel, f"{r}.{ext}"))
            node.files.append(FileRecord(rel, "image", _size(root, rel), minimum=1,
                                         detail=f"the image of row {r} (recorded as written)"))


def _checked_rows(node: StorageNode, runs: List[Tuple[int, int]], what: str) -> List[Tuple[int, int]]:
    """`runs` of `[start, length]` when every one lies within the node's rows; else a problem and no runs."""
    rows = node.capacity if node.capacity is not None else node.length
    for s, n in runs:
        if rows is None or s < 0 or n <= 0 or s + n > rows:
            node.problems.append(f"{node.metadata_rel}: {what} run [{s}, {n}] lies outside the storage's "
                                 f"{rows if rows is not None else 'unknown number of'} rows")
            return []
    return runs


def _fill_hdf5(root: str, node: StorageNode, space_json: Optional[Dict[str, Any]]) -> None:
    """One HDF5 file; its bookkeeping is a JSON root attribute, read with h5py when it is installed."""
    node.files.append(FileRecord(node.rel, "data", _size(root, node.rel)))
    node.space_json = space_json
    try:
        import h5py
    except ImportError:
        node.notes.append(f"{node.rel}: h5py is not installed, so the file's own metadata is not read "
                          "(pip install 'unienv-storage[hdf5]')")
        return
    try:
        with h5py.File(os.path.join(root, node.rel), "r") as f:
            raw = f.attrs.get(HDF5_ATTRIBUTE)
    except (OSError, ValueError) as exc:
        node.problems.append(f"{node.rel}: not a readable HDF5 file ({exc})")
        return
    if raw is None:
        node.format_version = 0
        node.notes.append(f"{node.rel}: no {HDF5_ATTRIBUTE!r} attribute (written by the reference unienv)")
        return
    try:
        meta = json.loads(raw.decode() if isinstance(raw, bytes) else str(raw))
    except ValueError as exc:
        node.problems.append(f"{node.rel}: the {HDF5_ATTRIBUTE!r} attribute is not valid JSON ({exc})")
        return
    if not isinstance(meta, dict):
        node.problems.append(f"{node.rel}: the {HDF5_ATTRIBUTE!r} attribute must hold a JSON object")
        return
    v = meta.get("format_version", 0)
    if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= FORMAT_VERSION:
        node.problems.append(f"{node.rel}: unsupported format_version {v!r} (this library reads up to "
                             f"{FORMAT_VERSION})")
        return
    node.format_version = v
    node.metadata_rel = f"{node.rel} (attribute {HDF5_ATTRIBUTE})"
    node.meta = meta
    node.capacity = _int_or_none(meta.get("capacity"))
    node.length = _int_or_none(meta.get("length"))
    node.runs = _runs(meta.get("segments"))
    if node.space_json is None and isinstance(meta.get("space"), dict):
        node.space_json = meta["space"]


def _fill_generic(root: str, node: StorageNode, space_json: Optional[Dict[str, Any]]) -> None:
    """A storage type this tool does not know: its metadata (a `*metadata*.json` or sidecar) and files."""
    full = os.path.join(root, node.rel)
    meta_rel = None
    if os.path.isfile(full) and os.path.isfile(full + SIDECAR_SUFFIX):
        meta_rel = node.rel + SIDECAR_SUFFIX
    elif os.path.isdir(full):
        for name in sorted(os.listdir(full)):
            if name.endswith(".json") and "metadata" in name:
                meta_rel = os.path.normpath(os.path.join(node.rel, name))
                break
    meta = _read_meta(root, meta_rel, node) if meta_rel is not None else None
    _apply_generic_meta(root, node, meta or {}, space_json)


def _apply_generic_meta(root: str, node: StorageNode, meta: Dict[str, Any],
                        space_json: Optional[Dict[str, Any]]) -> None:
    """Capacity, length, segments, space and files of a storage known only by its common metadata fields. A
    `written` list of `[start, length]` row runs with one `<row>.<ext>` file per row (NPZ-style storages) is
    checked file by file."""
    node.space_json = space_json
    node.capacity = _int_or_none(meta.get("capacity"))
    node.length = _int_or_none(meta.get("length", meta.get("num_rows")))
    node.runs = _runs(meta.get("segments"))
    if node.space_json is None and isinstance(meta.get("space"), dict):
        node.space_json = meta["space"]
    elif node.space_json is None and isinstance(meta.get("dtype"), str) and isinstance(meta.get("shape"), list):
        node.space_json = _array_space_json(meta["dtype"], meta["shape"])
    written = _checked_rows(node, _runs(meta.get("written")) or [], "written")
    full = os.path.join(root, node.rel)
    per_row = False
    if written and os.path.isdir(full):
        first = f"{written[0][0]}."
        exts = [n[len(first):] for n in os.listdir(full) if n.startswith(first) and "." not in n[len(first):]]
        if exts:
            per_row = True
            for s, n in written:
                for r in range(s, s + n):
                    rel = os.path.normpath(os.path.join(node.rel, f"{r}.{exts[0]}"))
                    node.files.append(FileRecord(rel, "data", _size(root, rel), minimum=1,
                                                 detail=f"row {r} (recorded as written)"))
    _generic_files(root, node)
    node.notes.append(f"{node.rel}: {node.kind} is checked by its own load_from and by reading every row; its files "
                      "are listed" + (", and one file per row recorded as written must exist" if per_row else ""))


def _generic_files(root: str, node: StorageNode) -> None:
    full = os.path.join(root, node.rel)
    known = {f.rel for f in node.files}
    if os.path.isfile(full):
        if node.rel not in known:
            node.files.append(FileRecord(node.rel, "other", _size(root, node.rel)))
        return
    for d, _dirs, names in os.walk(full):
        for name in sorted(names):
            rel = os.path.relpath(os.path.join(d, name), root)
            if rel not in known:
                node.files.append(FileRecord(rel, "other", _size(root, rel)))


def node_runs(node: StorageNode) -> Optional[List[Tuple[int, int]]]:
    """Segments of a node as physical (start, length) runs; a DictStorage keeps those all its children hold."""
    if node.kind == "DictStorage":
        sets = [set(c.runs) for c in node.children if c.runs is not None]
        if not sets:
            return None
        common = set.intersection(*sets)
        return sorted(common)
    return node.runs


# ---------------------------------------------------------------------------------------------------- episodes
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

    def add(key: str, n: int) -> None:
        out[key] = out.get(key, 0) + n

    def visit(node: StorageNode) -> None:
        for f in node.files:
            if f.role == "metadata":
                add(METADATA_BUCKET, f.size or 0)
        data = sum(f.size or 0 for f in node.files if f.role != "metadata")
        if node.kind == "FlattenedStorage" and isinstance(node.meta.get("layout"), list):
            for c in node.children:
                for sub in c.iter():
                    for rec in sub.files:
                        if rec.role == "metadata":
                            add(METADATA_BUCKET, rec.size or 0)
            inner = sum(f.size or 0 for c in node.children for n in c.iter() for f in n.files if f.role != "metadata")
            entries = [e for e in node.meta["layout"] if isinstance(e, dict)]
            width = sum(int(e.get("size", 0)) for e in entries) or 1
            given = 0
            for i, e in enumerate(entries):
                key_parts = node.prefix + tuple(p for p in str(e.get("key") or "").split("/") if p)
                share = inner - given if i == len(entries) - 1 else inner * int(e.get("size", 0)) // width
                given += share
                add("/".join(key_parts) or "<value>", share)
            return
        if data:
            leaves = node.leaves
            add(leaves[0] if len(leaves) == 1 else (node.key or "{" + ", ".join(leaves) + "}"), data)
        for c in node.children:
            visit(c)

    visit(root)
    return out


def raw_bytes_per_key(space_json: Optional[Dict[str, Any]], rows: int) -> Dict[str, int]:
    """What each Box / Binary leaf takes for `rows` samples in its own dtype, uncompressed."""
    return {"/".join(p) or "<value>": leaf_nbytes(js) * rows for p, js in leaf_items(space_json)}


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
        "total_bytes": root.nbytes(), "problems": problems,
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


# ---------------------------------------------------------------------------------------------------- opening data
def choose_backend(root: StorageNode, name: str = "auto") -> Any:
    """The compute backend to open a dataset with: `name` ("numpy" / "pytorch"), or for "auto" the one its
    array storages serve (PyTorch when any `PytorchTensorStorage` is found, else NumPy)."""
    if name == "auto":
        name = "pytorch" if any(n.kind == "PytorchTensorStorage" for n in root.iter()) else "numpy"
    if name == "pytorch":
        try:
            from unienv_interface.backends.pytorch import PyTorchComputeBackend
        except ImportError as exc:
            raise ModuleNotFoundError(f"this dataset is stored with PyTorch tensors; install the extra: pip install "
                                      f"'unienv-storage[torch]' ({exc})") from None
        return PyTorchComputeBackend
    if name == "numpy":
        from unienv_interface.backends import NumpyComputeBackend
        return NumpyComputeBackend
    raise ValueError(f"backend must be 'auto', 'numpy' or 'pytorch', got {name!r}")


def flatten_tree(value: Any, prefix: Tuple[str, ...] = ()) -> Dict[str, Any]:
    """`{key path: leaf}` of a nested dict (tuples and lists index their entries)."""
    if isinstance(value, dict):
        out: Dict[str, Any] = {}
        for k, v in value.items():
            out.update(flatten_tree(v, prefix + (str(k),)))
        return out
    if isinstance(value, (tuple, list)) and not hasattr(value, "shape"):
        out = {}
        for i, v in enumerate(value):
            out.update(flatten_tree(v, prefix + (str(i),)))
        return out
    return {"/".join(prefix) or "<value>": value}


def _space_leaves(space: Any, prefix: Tuple[str, ...] = ()) -> Dict[str, Any]:
    from unienv_interface.space import DictSpace, TupleSpace
    if isinstance(space, DictSpace):
        out: Dict[str, Any] = {}
        for k, v in space.spaces.items():
            out.update(_space_leaves(v, prefix + (str(k),)))
        return out
    if isinstance(space, TupleSpace):
        out = {}
        for i, v in enumerate(space.spaces):
            out.update(_space_leaves(v, prefix + (str(i),)))
        return out
    return {"/".join(prefix) or "<value>": space}


class OpenedDataset:
    """A dataset opened read-only: rows by logical index, single keys, episodes (see the module docstring)."""

    def __init__(self, path: str, root: StorageNode, obj: Any, backend: Any) -> None:
        self.path = path
        self.root = root
        self.obj = obj
        self.backend = backend
        self.is_buffer = root.kind == "ReplayBuffer"
        self.storage = obj.storage if self.is_buffer else obj
        self.space = obj.single_space if self.is_buffer else obj.single_instance_space
        self.capacity: Optional[int] = self.storage.capacity
        self._rot = 0 if self.is_buffer else rotation(root.runs, self.capacity)
        self.leaf_spaces: Dict[str, Any] = _space_leaves(self.space)
        self._columns = self._plan_columns()

    def __len__(self) -> int:
        return len(self.obj)

    @property
    def kind(self) -> str:
        return self.root.kind

    def episodes(self) -> List[Tuple[int, int]]:
        """Recorded episodes as logical half-open ranges, oldest first."""
        if self.is_buffer:
            return sorted(self.obj.get_segments() or [])
        segs = self.storage.get_segments() or []
        cap = self.capacity
        runs = [(s, (e - s) % cap + 1 if cap else e - s + 1) for s, e in segs]
        return sorted(((s - self._rot) % cap if cap else s, ((s - self._rot) % cap if cap else s) + n)
                      for s, n in runs)

    def physical(self, logical: np.ndarray) -> np.ndarray:
        """Storage rows of logical indices (an int64 array)."""
        idx = np.asarray(logical, dtype=np.int64)
        if self.is_buffer:
            phys = self.obj.index_with_offset(idx)
            if isinstance(phys, slice):
                return np.arange(phys.start, phys.stop, phys.step or 1, dtype=np.int64)
            return np.asarray(phys, dtype=np.int64)
        if self.capacity and self._rot:
            return (idx + self._rot) % self.capacity
        return idx

    def image_keys(self) -> List[str]:
        """Leaf keys holding camera frames (see `is_image_leaf`)."""
        from unienv_interface.space.space_utils.serialization_utils import space_to_json
        out = []
        for k, sp in self.leaf_spaces.items():
            try:
                js = space_to_json(sp)
            except (TypeError, ValueError):
                continue
            if is_image_leaf(js):
                out.append(k)
        return out

    def _plan_columns(self) -> List[Tuple[Any, Tuple[str, ...], List[str]]]:
        """`(child storage, prefix of its values, leaf keys it holds)` per child of a DictStorage; one entry for
        the whole storage otherwise."""
        st = self.storage
        try:
            from unienv_data.storages.dict_storage import DictStorage
        except ImportError:
            return [(st, (), list(self.leaf_spaces))]
        if not isinstance(st, DictStorage):
            return [(st, (), list(self.leaf_spaces))]
        sep = st.nested_separator
        groups = st.groups
        out = []
        for key, child in st.storages.items():
            if key in groups:
                prefix: Tuple[str, ...] = ()
            else:
                parts = tuple(key.split(sep))
                prefix = parts[:-1] if parts[-1] == "*" else parts
            keys = list(_space_leaves(child.single_instance_space, prefix))
            out.append((child, prefix, keys))
        return out

    def columns(self) -> List[Tuple[Any, Tuple[str, ...], List[str]]]:
        """`(storage, key prefix of its values, leaf keys it holds)` for each child storage of a `DictStorage`
        (one entry for the whole storage otherwise); rows of these storages are physical rows."""
        return list(self._columns)

    def read(self, logical: Any) -> Any:
        """Samples at logical indices, as the storage returns them (backend arrays in nested dicts)."""
        if self.is_buffer:
            return self.obj.get_at(logical)
        return self.storage.get(self.physical(np.asarray(logical, dtype=np.int64)))

    def read_numpy(self, logical: Any, keys: Optional[Sequence[str]] = None) -> Dict[str, np.ndarray]:
        """`{leaf key: NumPy array}` at logical indices, reading only the child storages that hold `keys`."""
        wanted = set(self.leaf_spaces) if keys is None else set(keys)
        unknown = wanted - set(self.leaf_spaces)
        if unknown:
            raise KeyError(f"no key(s) {sorted(unknown)} in the dataset; its keys are {sorted(self.leaf_spaces)}")
        phys = self.physical(np.asarray(logical, dtype=np.int64))
        out: Dict[str, np.ndarray] = {}
        for child, prefix, ckeys in self._columns:
            if not wanted.intersection(ckeys):
                continue
            for k, v in flatten_tree(child.get(phys), prefix).items():
                if k in wanted:
                    out[k] = np.asarray(self.backend.to_numpy(v))
        return out

    def close(self) -> None:
        self.obj.close()

    def __enter__(self) -> "OpenedDataset":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def open_dataset(path: str, backend: str = "auto", root: Optional[StorageNode] = None) -> OpenedDataset:
    """Opens the dataset at `path` read-only with the library's own `load_from` (see the module docstring)."""
    from unienv_data.base.registry import resolve_storage_class
    from unienv_interface.space.space_utils.serialization_utils import json_to_space
    path = os.path.abspath(os.fspath(path))
    root = root or walk(path)
    problems = [p for n in root.iter() for p in n.problems]
    if problems:
        raise StorageFormatError("the dataset's metadata is damaged: " + "; ".join(problems))
    B = choose_backend(root, backend)
    if root.kind == "ReplayBuffer":
        from unienv_data.replay_buffer import ReplayBuffer
        obj: Any = ReplayBuffer.load_from(path, backend=B, read_only=True)
    else:
        if root.space_json is None:
            raise StorageFormatError(f"{path}: its metadata does not record the space, so it cannot be opened "
                                     "without code (load it with <StorageClass>.load_from(path, space))")
        name = (root.storage_type if "." in root.storage_type
                else f"unienv_data.storages.{_module_of(root.kind)}.{root.kind}")
        cls = resolve_storage_class(name, root.metadata_rel or path)
        obj = cls.load_from(path, json_to_space(root.space_json, B), read_only=True)
    return OpenedDataset(path, root, obj, B)


def _module_of(kind: str) -> str:
    return {"DictStorage": "dict_storage", "FlattenedStorage": "flattened", "VideoStorage": "video_storage",
            "ImageStorage": "image_storage", "TransformedStorage": "transformation",
            "ToBackendOrDeviceStorage": "backend_compat", "PytorchTensorStorage": "pytorch",
            "NumpyMemmapStorage": "numpy_memmap", "NPZStorage": "npz_storage", "HDF5Storage": "hdf5",
            "ParquetStorage": "parquet"}.get(kind, kind.lower())


__all__ = ["FileRecord", "StorageNode", "OpenedDataset", "walk", "detect", "describe", "open_dataset",
           "bytes_per_key", "raw_bytes_per_key", "logical_episodes", "space_tree_lines", "describe_leaf",
           "leaf_items", "is_image_leaf", "choose_backend", "flatten_tree", "CHECKSUM_FILE", "METADATA_BUCKET"]
