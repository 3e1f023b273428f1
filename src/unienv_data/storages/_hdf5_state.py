"""The bookkeeping of an `HDF5Storage` file (see `hdf5.py`): checking a file against a space, and where its
length and segments live.

Two places hold them:

* the JSON root attribute `unienv_storage`, written once when the file itself is written (by `create`, by
  `dumps` to another path, by a growable storage that moves to a bigger file) and never rewritten in place: a
  rewritten attribute changes HDF5's own structures (object header, heaps), which HDF5 updates in place without
  a journal, so a kill during that update could leave a file that no longer opens. It carries a random
  `file_id` naming that one file;
* the state sidecar `<file>.state.json` (`STATE_SUFFIX`), replaced atomically by every commit point
  (`flush`, `dumps` to its own path, `close`) *after* the rows have been flushed into the file. It counts only
  when its `file_id` is the file's: a sidecar left by an earlier file at that path is ignored, and then the
  attribute (written with the file) is the state.

So a reader (or a reopen after a crash) sees the state of the last commit point that finished, and the HDF5
structures of a file with a fixed layout are never modified after the file was written.
"""
from __future__ import annotations

import os
import uuid
from typing import Any, Dict, List, Optional, Tuple

from unienv_data.base.errors import StorageFormatError
from unienv_data.base.files import FORMAT_VERSION, atomic_write_json, check_format_version, read_json
from unienv_data.base.hooks import upper_layer
from unienv_data.base.segments import SegmentLog
from unienv_interface.backends import NumpyComputeBackend
from unienv_interface.space import Space
from unienv_interface.space.space_utils.serialization_utils import json_to_space

from ._hdf5_file import (DEFAULT_KEY, META_ATTR, _dataset_spec, _h5py, _infer_space, _leaf_spec, _open_file,
                         _read_meta, _walk_datasets)
from ._list_storage import LeafTree, check_stored_space

#: Suffix of the state sidecar next to an HDF5 file written by this library.
STATE_SUFFIX = ".state.json"


def state_path(path: str) -> str:
    """The state sidecar of the HDF5 file at `path`."""
    return path + STATE_SUFFIX


def new_file_id() -> str:
    """A fresh id for a newly written file (what ties a state sidecar to that file)."""
    return uuid.uuid4().hex


def write_state(path: str, file_id: str, capacity: Optional[int], length: int, segments: List[Any]) -> None:
    """Replaces the state sidecar of `path` atomically (the rows must already be in the file)."""
    atomic_write_json(state_path(path), {"storage_type": "HDF5Storage", "format_version": FORMAT_VERSION,
                                         "file_id": file_id, "capacity": capacity, "length": length,
                                         "segments": segments})


def _read_state(path: str, file_id: Optional[str]) -> Optional[Dict[str, Any]]:
    """The state sidecar of `path` when it belongs to this file (its `file_id`), else None."""
    sp = state_path(path)
    if file_id is None or not os.path.isfile(sp):
        return None
    data = read_json(sp, "HDF5Storage state")
    check_format_version(data, sp)
    if data.get("file_id") != file_id:
        return None     # left by an earlier file at this path: the file's own attribute is newer
    return data


def _check_datasets(f: Any, tree: LeafTree, read_only: bool, path: str) -> Tuple[int, Optional[int]]:
    """Every leaf's dataset against the space; `(rows, maximum rows)` of the datasets."""
    h5py = _h5py()
    problems: List[str] = []
    rows: Dict[str, Tuple[int, Optional[int]]] = {}
    for leaf in tree.leaves:
        item = f.get(leaf.name)
        if item is None:
            problems.append(f"no dataset {leaf.name!r} (the space has {_leaf_spec(leaf)})")
            continue
        if not isinstance(item, h5py.Dataset):
            problems.append(f"{leaf.name!r} is a group, not a dataset (the space has {_leaf_spec(leaf)})")
            continue
        if item.ndim < 1:
            problems.append(f"dataset {leaf.name!r} is a scalar, not rows")
            continue
        is_text = h5py.check_string_dtype(item.dtype) is not None
        if leaf.conv is None:
            if not is_text or item.ndim != 1:
                problems.append(f"dataset {leaf.name!r} holds {_dataset_spec(item)}, the space has text")
        elif is_text or item.dtype != leaf.dtype or tuple(item.shape[1:]) != leaf.shape:
            problems.append(f"dataset {leaf.name!r} holds {_dataset_spec(item)}, the space has {_leaf_spec(leaf)}")
        rows[leaf.name] = (int(item.shape[0]), item.maxshape[0])
    known = {leaf.name for leaf in tree.leaves}
    extra = [n for n in _walk_datasets(f) if n not in known and not any(n.startswith(k + "/") for k in known)]
    if extra and not read_only:
        problems.append(f"the file also holds datasets the space lacks: {extra} (pass the full space, or load with "
                        "read_only=True to read a subset)")
    if problems:
        raise ValueError(f"{path} does not match the space: " + "; ".join(problems))
    shapes = set(rows.values())
    if len(shapes) != 1:
        raise StorageFormatError(f"{path}: the datasets disagree on their number of rows: "
                                 + ", ".join(f"{k}: {n} (max {m})" for k, (n, m) in rows.items())
                                 + "; the file is damaged")
    n_rows, max_rows = shapes.pop()
    if max_rows is not None and max_rows != n_rows:
        raise StorageFormatError(f"{path}: datasets hold {n_rows} rows but may grow to {max_rows}; this layout is not "
                                 "a storage (fixed capacity needs equal current and maximum rows)")
    return n_rows, max_rows


def _checked_length(where: str, mlen: Any, n_rows: int, file_cap: Optional[int]) -> int:
    if isinstance(mlen, bool) or not isinstance(mlen, int) or not 0 <= mlen <= n_rows \
            or (file_cap is not None and mlen != file_cap):
        raise StorageFormatError(f"{where}: the length {mlen!r} does not fit the {n_rows} rows of the datasets; the "
                                 "file is damaged")
    return mlen


def check_file(f: Any, tree: LeafTree, cap_arg: Optional[int], read_only: bool,
               path: str) -> Tuple[Optional[int], int, SegmentLog, Optional[str]]:
    """Checks every dataset and the bookkeeping (attribute, and the state sidecar of a file on disk) against the
    space; returns `(capacity, length, segments, file_id)`. HDF5's own errors while reading a damaged file's
    structure (h5py raises RuntimeError, OSError, KeyError, TypeError or UnicodeDecodeError for a bad B-tree, heap
    or attribute) become StorageFormatError naming the file."""
    try:
        return _check_file(f, tree, cap_arg, read_only, path)
    except (StorageFormatError, FileNotFoundError):
        raise
    except (RuntimeError, OSError, KeyError, TypeError, UnicodeDecodeError) as exc:
        raise StorageFormatError(f"{path}: HDF5 cannot read the file's structure ({type(exc).__name__}: {exc}); "
                                 "the file is damaged") from None


def _check_file(f: Any, tree: LeafTree, cap_arg: Optional[int], read_only: bool,
                path: str) -> Tuple[Optional[int], int, SegmentLog, Optional[str]]:
    n_rows, file_cap = _check_datasets(f, tree, read_only, path)
    meta = _read_meta(f, path)
    length = n_rows
    segments = SegmentLog(file_cap)
    file_id: Optional[str] = None
    if meta is not None:
        stored_cap = meta.get("capacity")
        if stored_cap != file_cap:
            raise StorageFormatError(f"{path}: the metadata says capacity {stored_cap!r}, the datasets {file_cap!r}; "
                                     "the file is damaged")
        fid = meta.get("file_id")
        file_id = fid if isinstance(fid, str) and fid else None
        where = f"{path}:{META_ATTR}"
        raw_segments = meta.get("segments", [])
        length = _checked_length(where, meta.get("length", n_rows), n_rows, file_cap)
        state = _read_state(path, file_id) if os.path.isfile(path) else None
        if state is not None:
            where = state_path(path)
            if state.get("capacity") != file_cap:
                raise StorageFormatError(f"{where}: capacity {state.get('capacity')!r} does not match the file's "
                                         f"{file_cap!r}")
            length = _checked_length(where, state.get("length"), n_rows, file_cap)
            raw_segments = state.get("segments", [])
        segments = SegmentLog.from_json(raw_segments, file_cap, length, where)
        if "space" in meta:
            check_stored_space(meta["space"], tree, path)
    if cap_arg is not None and cap_arg != file_cap:
        if file_cap is None:
            raise ValueError(f"{path} is growable (its datasets have no fixed number of rows; it holds {length}): "
                             f"omit capacity, not capacity={cap_arg}")
        raise ValueError(f"{path} holds a fixed capacity of {file_cap} rows, not {cap_arg}: pass capacity={file_cap} "
                         "or omit it")
    return file_cap, length, segments, file_id


def build_space(root: Any) -> Tuple[int, Optional[int], Space]:
    """`(count, capacity, space)` of an HDF5 file (see `HDF5Storage.build_space_from_hdf5_file`); the count of a
    file with a state sidecar of its own is the sidecar's length."""
    h5py = _h5py()
    if isinstance(root, (str, os.PathLike)):
        with _open_file(os.fspath(root), "r", "build_space_from_hdf5_file") as f:
            return build_space(f)
    if isinstance(root, h5py.Group):
        meta = _read_meta(root, root.file.filename) if isinstance(root, h5py.File) else None
        if meta is not None and "space" in meta:
            try:
                space = json_to_space(meta["space"], NumpyComputeBackend, None)
            except (ValueError, TypeError, KeyError) as exc:
                raise StorageFormatError(f"{root.file.filename}: the stored space is malformed: {exc}") from None
            tree = LeafTree(space, "HDF5Storage", DEFAULT_KEY)
            n = int(root[tree.leaves[0].name].shape[0])
            fid = meta.get("file_id")
            name = root.file.filename
            state = _read_state(name, fid if isinstance(fid, str) else None) if os.path.isfile(name) else None
            length = (state or meta).get("length", n)
            return int(length) if isinstance(length, int) and 0 <= length <= n else n, meta.get("capacity"), space
    return _infer_space(root)


def raw_replay_buffer(cls: Any, path: Any) -> Any:
    """A read-only ReplayBuffer over every row of an HDF5 file, its space inferred by `build_space` (see
    `HDF5Storage.load_replay_buffer_from_raw_hdf5`)."""
    count, _capacity, space = build_space(path)
    storage = cls.load_from(path, space, read_only=True)
    return upper_layer("buffer.over_storage")(storage, "storage" + (cls.single_file_ext or ""), count)


__all__ = ["STATE_SUFFIX", "state_path", "new_file_id", "write_state", "check_file", "build_space",
           "raw_replay_buffer"]
