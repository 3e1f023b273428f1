"""Filling the `StorageNode` of a storage that holds files rather than other storages: array files with a
`.meta.json` sidecar, video and image directories, HDF5 files, and storage types this tool knows only by their
common metadata fields."""
from __future__ import annotations

import json
import os
import shlex
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from unienv_data.base.files import FORMAT_VERSION

from ._metadata import _inside, _int_or_none, _read_meta, _runs, _short, _size
from ._records import HDF5_ATTRIBUTE, IMAGE_EXTENSIONS, SIDECAR_SUFFIX, FileRecord, StorageNode
from ._space_json import itemsize


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


def _fill_frames(node: StorageNode, meta: Dict[str, Any], space_json: Optional[Dict[str, Any]]) -> None:
    """What a video and an image storage record alike: capacity, length, segments, and the space (uint8 frames
    of the recorded `shape` when the metadata has no space)."""
    node.capacity = _int_or_none(meta.get("capacity"))
    node.length = _int_or_none(meta.get("length"))
    node.runs = _runs(meta.get("segments"))
    node.space_json = space_json or {"type": "BoxSpace", "shape": meta.get("shape"), "dtype": "uint8", "low": 0,
                                     "high": 255}


def _fill_video(root: str, node: StorageNode, meta: Dict[str, Any], space_json: Optional[Dict[str, Any]]) -> None:
    _fill_frames(node, meta, space_json)
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
            node.notes.append(f"{orphan}: not listed in the metadata (left over by a crash or an interrupted write); "
                              f"`unienv-data verify --remove-orphans {shlex.quote(root)}` deletes it (in code: "
                              "VideoStorage.remove_orphan_files() of that storage)")


def _fill_image(root: str, node: StorageNode, meta: Dict[str, Any], space_json: Optional[Dict[str, Any]]) -> None:
    _fill_frames(node, meta, space_json)
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
        # locking=False: `info` / `verify` must work while a recorder holds the file open for writing (only an
        # attribute written once with the file is read; rows and segments come from the state sidecar)
        with h5py.File(os.path.join(root, node.rel), "r", locking=False) as f:
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
    state_rel = node.rel + ".state.json"     # commit points keep length and segments here (see storages/_hdf5_state)
    state = _read_meta(root, state_rel, node) if os.path.isfile(os.path.join(root, state_rel)) else None
    if isinstance(state, dict) and meta.get("file_id") and state.get("file_id") == meta.get("file_id"):
        node.metadata_rel = state_rel
        meta = {**meta, **{k: state[k] for k in ("length", "segments") if k in state}}
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
