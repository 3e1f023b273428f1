"""Reading chosen fields of a batch at chosen frames: key paths resolved against its space, and one read per key.

Key paths. A key is a tuple of dict keys / tuple positions, or a string: a string that is a top-level key of the
batch's DictSpace is that key as is (so LeRobot-style flat keys with dots, `"observation.image"`, work), any other
string is split on `"/"` (`"obs/joint_pos"` is `("obs", "joint_pos")`). Dots never split a key.

Reads. `ColumnReader.read` reads every key at its own frames: keys the batch serves as a column view
(`get_column`, e.g. a `ReplayBuffer` over a `DictStorage` with a child per key) are read from that column alone,
one gather per key; the other keys share one read of whole rows at the union of their frames.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from unienv_data.base.common import BatchBase
from unienv_interface.space import Space
from unienv_interface.space.spaces import DictSpace, TupleSpace

from . import _tree

KeyPath = Tuple[_tree.NestedKey, ...]


def leaf_paths(space: Space, prefix: KeyPath = ()) -> List[KeyPath]:
    """Every leaf path of `space` (dict keys and tuple positions), in order."""
    if isinstance(space, DictSpace):
        return [p for k, s in space.spaces.items() for p in leaf_paths(s, prefix + (k,))]
    if isinstance(space, TupleSpace):
        return [p for i, s in enumerate(space.spaces) for p in leaf_paths(s, prefix + (i,))]
    return [prefix]


def path_name(path: KeyPath) -> str:
    """The `"a/b"` spelling of a key path (the name statistics files and the CLI use)."""
    return "/".join(str(k) for k in path) or "<value>"


def resolve_key(space: Space, key: Any) -> KeyPath:
    """`key` (a string or a sequence of keys, see the module docstring) as a validated path into `space`."""
    if isinstance(key, str):
        if isinstance(space, DictSpace) and key in space.spaces:
            return (key,)
        path: KeyPath = tuple(key.split("/")) if key else ()
        if not path or any(p == "" for p in path):
            raise KeyError(f"key {key!r} is not a key path; use 'a/b' for nested keys (available leaves: "
                           f"{[path_name(p) for p in leaf_paths(space)][:20]})")
    else:
        path = _tree.normalize_nested_keys(key)
    try:
        _tree.sub_space(space, path)
    except (KeyError, IndexError, TypeError) as exc:
        raise KeyError(f"key {key!r} is not in the data: {exc.args[0] if exc.args else exc} (available leaves: "
                       f"{[path_name(p) for p in leaf_paths(space)][:20]})") from None
    return path


def _column_of(batch: BatchBase, path: KeyPath) -> Optional[BatchBase]:
    """A column view of `path` that reads only that field, or None when the batch offers none."""
    from .sub_item import SubItemBatch
    fn = getattr(batch, "get_column", None)
    if fn is None:
        return None
    try:
        col = fn(path[0] if len(path) == 1 else list(path))
    except (KeyError, TypeError, ValueError, NotImplementedError, AttributeError):
        return None
    if not isinstance(col, BatchBase) or isinstance(col, SubItemBatch):
        return None
    try:
        if col.single_space != _tree.sub_space(batch.single_space, path):
            return None
    except Exception:   # noqa: BLE001 - a space that cannot compare: read whole rows instead
        return None
    return col


class ColumnReader:
    """Reads the fields `paths` of `batch` at per-key frames (see the module docstring)."""

    def __init__(self, batch: BatchBase, paths: Sequence[KeyPath]) -> None:
        self.batch = batch
        self.paths = list(paths)
        self.columns: Dict[KeyPath, Optional[BatchBase]] = {p: _column_of(batch, p) for p in self.paths}

    def __getstate__(self) -> Dict[str, Any]:
        state = dict(self.__dict__)
        state["columns"] = None       # column views are rebuilt from the batch after unpickling
        return state

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.columns = {p: _column_of(self.batch, p) for p in self.paths}

    def read(self, frames: Dict[KeyPath, np.ndarray]) -> Dict[KeyPath, Any]:
        """`{path: data of that field at frames[path]}` (1-D int64 frame arrays, any lengths)."""
        out: Dict[KeyPath, Any] = {}
        rest = [p for p in frames if self.columns.get(p) is None]
        for p, idx in frames.items():
            col = self.columns.get(p)
            if col is not None:
                out[p] = col.get_at(np.asarray(idx, dtype=np.int64))
        if rest:
            allf = np.concatenate([np.asarray(frames[p], dtype=np.int64) for p in rest])
            uniq, inverse = np.unique(allf, return_inverse=True)
            rows = self.batch.get_at(uniq)
            start = 0
            backend = self.batch.backend
            for p in rest:
                m = int(np.asarray(frames[p]).shape[0])
                out[p] = _tree.take_rows(_tree.sub_data(rows, p), inverse.reshape(-1)[start:start + m].astype(np.int64),
                                         backend)
                start += m
        return out

    def read_into(self, frames: Dict[KeyPath, np.ndarray], out: Dict[KeyPath, Any]) -> None:
        """Like `read`, but writes each field into `out[path]` (NumPy, leading axis `len(frames[path])`): a column
        that reads into arrays (`get_at_into`: a buffer column over an array storage) is read straight into it,
        every other field is read as by `read` and copied."""
        rest: Dict[KeyPath, np.ndarray] = {}
        for p, idx in frames.items():
            fn = getattr(self.columns.get(p), "get_at_into", None)
            if fn is not None and isinstance(out[p], np.ndarray):
                fn(np.asarray(idx, dtype=np.int64), out[p])
            else:
                rest[p] = idx
        if rest:
            got = self.read(rest)
            for p in rest:
                _tree.copy_into(out[p], got[p])


__all__ = ["KeyPath", "ColumnReader", "resolve_key", "leaf_paths", "path_name"]
