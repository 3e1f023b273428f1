"""What the file-format storages (HDF5, NPZ, Parquet) share.

* `LeafTree`: checks a structured value (a nested dict of Box / Binary / Text leaves, or one leaf) against its
  space and splits it into one checked NumPy array per leaf, and assembles leaf arrays back into a value.
* `ListStorageBase`: one file per sample (`<dir>/<row>.<ext>`) plus a JSON metadata file: the base of `NPZStorage`
  (reference-api §5.6, `unienv_data.storages._list_storage.ListStorageBase`).
* small helpers: optional imports with an error naming the extra, capacity checks, atomic file replacement.

Differences from the reference list storages, on purpose:

* A row is *known written* (recorded in the metadata; its file must exist: a missing or damaged file raises an
  error naming it) or *unknown* (never written by this storage: its file is read if another process wrote one,
  otherwise the row reads as zeros, like a fresh array storage). Reference-written directories record nothing, so
  there a row without a file is an error unless `load_from(..., missing_ok=True)` asks for the reference's zeros.
* `dumps(path)` into another directory works (row files are hard-linked when possible, else copied; stale row
  files of an older dump there are removed), then the metadata is written atomically.
* Row files are written under a temporary name and renamed into place: a reader sees the old or the new file.
* Segments are recorded and persisted in the metadata (`flush`, `dumps`, `close`).
* A pickled copy (a worker process) reads and writes rows but never changes the length, the segments or the
  metadata: those stay with the original.
"""
from __future__ import annotations

import importlib
import os
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from unienv_data.base.errors import StorageFormatError, StorageNotFoundError, StorageStateError
from unienv_data.base.files import (FORMAT_VERSION, PathLike, atomic_write_json, check_format_version, is_durable,
                                    read_json, require_fields)
from unienv_data.base.indexing import NormalizedIndex, normalize_index
from unienv_data.base.segments import SegmentLog
from unienv_data.base.storage import SpaceStorage
from unienv_data.base.values import LeafConverter
from unienv_interface.space import BinarySpace, BoxSpace, DictSpace, Space, TextSpace

from ._io_pool import map_io


# ---------------------------------------------------------------------------------------------------- helpers
def require_module(module: str, extra: str, who: str) -> Any:
    """Imports an optional dependency; ModuleNotFoundError naming the extra to install when it is missing."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ModuleNotFoundError(f"{who} needs the optional dependency {module.split('.')[0]!r}; install the "
                                  f"extra: pip install 'unienv-storage[{extra}]' ({exc})") from exc


def check_capacity(capacity: Any) -> Optional[int]:
    """A positive int, or None (growable); ValueError otherwise."""
    if capacity is None:
        return None
    if isinstance(capacity, (bool, np.bool_)) or not isinstance(capacity, (int, np.integer)) or int(capacity) <= 0:
        raise ValueError(f"capacity must be a positive int or None (growable), got {capacity!r}")
    return int(capacity)


def check_count(value: Any, what: str, upper: Optional[int] = None) -> int:
    """A non-negative int (at most `upper`); ValueError naming `what` otherwise."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or int(value) < 0 \
            or (upper is not None and int(value) > upper):
        rng = f"[0, {upper}]" if upper is not None else ">= 0"
        raise ValueError(f"{what} needs an int in {rng}, got {value!r}")
    return int(value)


def temp_name(final: str) -> str:
    """A temporary file name next to `final` (same directory, so a rename replaces it atomically)."""
    d, base = os.path.split(final)
    return os.path.join(d, f".{base}.{uuid.uuid4().hex[:12]}.tmp")


def replace_file(write: Callable[[str], None], final: str) -> None:
    """Writes a file through `write(tmp_path)` and renames it over `final` (fsync'ed when durable)."""
    tmp = temp_name(final)
    try:
        write(tmp)
        if is_durable():
            fd = os.open(tmp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        os.replace(tmp, final)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def link_or_copy(src: str, dst: str) -> None:
    """Places a copy of `src` at `dst` (replacing it): a hard link when the file system allows, else a copy.
    Safe because storages never modify a file in place (they replace it)."""
    if os.path.exists(dst) and os.path.samefile(src, dst):
        return  # already a link to the same file (rename() between two links of one file would do nothing)
    tmp = temp_name(dst)
    try:
        try:
            os.link(src, tmp)
        except OSError:
            import shutil
            shutil.copyfile(src, tmp)
        os.replace(tmp, dst)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def mask_to_runs(mask: np.ndarray) -> List[List[int]]:
    """`[[start, length], ...]` of the True runs of a 1-D bool array."""
    if not mask.size:
        return []
    padded = np.concatenate(([False], mask.astype(bool), [False]))
    edges = np.flatnonzero(padded[1:] != padded[:-1])
    return [[int(s), int(e - s)] for s, e in zip(edges[0::2], edges[1::2])]


def runs_to_mask(runs: Any, length: int, where: str) -> np.ndarray:
    """The bool mask of `[[start, length], ...]` runs (StorageFormatError naming a bad entry)."""
    mask = np.zeros(length, dtype=bool)
    if not isinstance(runs, list):
        raise StorageFormatError(f"{where}: 'written' must be a list of [start, length] pairs")
    for i, r in enumerate(runs):
        ok = (isinstance(r, list) and len(r) == 2 and all(isinstance(v, int) and not isinstance(v, bool) for v in r)
              and r[0] >= 0 and r[1] > 0 and r[0] + r[1] <= length)
        if not ok:
            raise StorageFormatError(f"{where}: 'written' entry {i} = {r!r} is not a [start, length] run within "
                                     f"{length} rows")
        mask[r[0]:r[0] + r[1]] = True
    return mask


def _contiguous(arr: np.ndarray) -> np.ndarray:
    """`arr` as a C-contiguous array of the same shape (np.ascontiguousarray would make a 0-d array 1-d)."""
    return arr if arr.flags.c_contiguous else np.array(arr, order="C")


class ValueConverter(LeafConverter):
    """`LeafConverter` that also accepts NaN at the positions of a Box whose bounds there are (-inf, inf), when other
    positions are bounded (a flat row of FlattenedStorage mixes bounded and unbounded leaves; `LeafConverter`
    accepts NaN only when every bound is infinite)."""

    __slots__ = ("free",)

    def __init__(self, space: Space, where: str) -> None:
        super().__init__(space, where)
        self.free: Optional[np.ndarray] = None
        if self.lo is not None and self.hi is not None and self.kind == "f" and not self.is_bf16:
            shape = self.shape
            free = np.isneginf(np.broadcast_to(self.lo, shape)) & np.isposinf(np.broadcast_to(self.hi, shape))
            if free.any():
                self.free = free

    def check_bounds(self, arr: np.ndarray) -> None:
        free = self.free
        if free is not None and arr.size:
            nan = np.isnan(arr)
            if nan.any():
                ok = nan & np.broadcast_to(free, arr.shape)
                if ok.any():
                    arr = np.where(ok, np.zeros((), dtype=arr.dtype), arr)
        super().check_bounds(arr)


def describe_leaf(space: Space) -> str:
    """`float32[3]`, `bool[]`, `text<=16`: how error messages name a leaf's type."""
    if isinstance(space, TextSpace):
        return f"text<={space.max_length}"
    return f"{space.backend.dtype_name(space.dtype)}{list(space.shape or ())}"


# ---------------------------------------------------------------------------------------------------- leaf tree
@dataclass
class Leaf:
    """One leaf of a structured space."""

    path: Tuple[str, ...]          #: keys from the root ('()' for a non-dict space)
    name: str                      #: the path joined with '/', or the storage's default key for a non-dict space
    space: Space
    conv: Optional["ValueConverter"]  #: None for Text leaves
    dtype: np.dtype                #: storage dtype (object for Text)
    shape: Tuple[int, ...]         #: element shape (() for Text)

    @property
    def is_text(self) -> bool:
        return self.conv is None

    @property
    def row_bytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * (self.dtype.itemsize if not self.is_text else 8)

    def zeros(self, n: Optional[int] = None) -> np.ndarray:
        """Zero rows (empty strings for Text): `n` of them, or one element when `n` is None."""
        shape = self.shape if n is None else (n,) + self.shape
        if self.is_text:
            out = np.empty(shape, dtype=object)
            out[...] = ""
            return out
        return np.zeros(shape, dtype=self.dtype)


def _check_text(leaf: Leaf, value: Any, lead: Tuple[int, ...]) -> Any:
    sp: TextSpace = leaf.space  # type: ignore[assignment]
    if not lead:
        if isinstance(value, np.ndarray) and value.ndim == 0:
            value = value.item()
        if isinstance(value, np.str_):
            value = str(value)
        if not isinstance(value, str):
            raise TypeError(f"{leaf.name or 'value'}: expected a str, got {type(value).__name__}")
        if not sp.contains(value):
            raise ValueError(f"{leaf.name or 'value'}: {value[:40]!r} (length {len(value)}) is not in {sp!r}")
        return value
    if isinstance(value, str) or not isinstance(value, (list, tuple, np.ndarray)):
        raise TypeError(f"{leaf.name or 'value'}: expected a batch of {lead[0]} strings, got {type(value).__name__}")
    if len(value) != lead[0] or (isinstance(value, np.ndarray) and value.ndim != 1):
        raise ValueError(f"{leaf.name or 'value'}: expected a batch of shape {lead}, got {np.shape(value)}")
    out = np.empty(lead, dtype=object)
    for i, v in enumerate(value):
        out[i] = _check_text(leaf, v, ())
    return out


class LeafTree:
    """The leaves of a (nested) DictSpace of Box / Binary / Text leaves, or of one such leaf.

    `split(value, lead)` checks a value (dict keys exactly, then every leaf with `LeafConverter`: shape, dtype,
    bounds) and returns one array per leaf, in leaf order; `assemble(arrays)` builds the value back.
    """

    def __init__(self, space: Space, who: str, default_key: str = "data", allow_nested: bool = True,
                 allow_text: bool = True) -> None:
        self.space = space
        self.who = who
        self.is_dict = isinstance(space, DictSpace)
        self.leaves: List[Leaf] = []
        self._nodes: List[Tuple[Tuple[str, ...], frozenset]] = []
        if isinstance(space, DictSpace):
            self._walk(space, (), allow_nested, allow_text)
            if not self.leaves:
                raise ValueError(f"{who} needs at least one leaf; the DictSpace is empty")
        else:
            self.leaves.append(self._leaf(space, (), default_key, allow_text))

    def _walk(self, space: DictSpace, path: Tuple[str, ...], allow_nested: bool, allow_text: bool) -> None:
        keys = list(space.spaces)
        for k in keys:
            if not isinstance(k, str) or not k or "/" in k or k in (".", ".."):
                raise ValueError(f"{self.who}: key {k!r} at {'/'.join(path) or 'the root'} cannot name a column "
                                 "(keys must be non-empty strings without '/')")
        self._nodes.append((path, frozenset(keys)))
        for k, sub in space.spaces.items():
            if isinstance(sub, DictSpace):
                if not allow_nested:
                    raise TypeError(f"{self.who} stores a flat DictSpace; key {'/'.join(path + (k,))!r} holds a nested "
                                    "DictSpace (use DictStorage to give it its own storage)")
                self._walk(sub, path + (k,), allow_nested, allow_text)
            else:
                self.leaves.append(self._leaf(sub, path + (k,), "/".join(path + (k,)), allow_text))

    def _leaf(self, space: Space, path: Tuple[str, ...], name: str, allow_text: bool) -> Leaf:
        if isinstance(space, TextSpace):
            if not allow_text:
                raise TypeError(f"{self.who} does not store TextSpace leaves ({name!r})")
            return Leaf(path, name, space, None, np.dtype(object), ())
        if not isinstance(space, (BoxSpace, BinarySpace)):
            raise TypeError(f"{self.who} stores Box, Binary and Text leaves (in a DictSpace); {name or 'the space'!r} "
                            f"is a {type(space).__name__}")
        if space.backend.dtype_name(space.dtype) == "bfloat16":
            raise TypeError(f"{self.who}: {name or 'the space'!r} is bfloat16, which NumPy cannot hold; store it in "
                            "PytorchTensorStorage or convert it to float32")
        conv = ValueConverter(space, name or "value")
        return Leaf(path, name, space, conv, np.dtype(conv.np_dtype), tuple(int(d) for d in (space.shape or ())))

    # -------------------------------------------------------------- values
    def _check_keys(self, value: Any) -> None:
        for path, keys in self._nodes:
            node = value
            for p in path:
                node = node[p]
            if not isinstance(node, Mapping):
                where = "/".join(path) or "the value"
                raise TypeError(f"{self.who}: {where} must be a dict with keys {sorted(keys)}, got {type(node).__name__}")
            if node.keys() != keys:
                got = set(node.keys())
                missing = sorted(keys - got)
                extra = sorted(map(str, got - keys))
                prefix = "/".join(path) + "/" if path else ""
                parts = []
                if missing:
                    parts.append(f"missing key(s) {[prefix + k for k in missing]}")
                if extra:
                    parts.append(f"unexpected key(s) {[prefix + k for k in extra]}")
                raise KeyError(f"{self.who}: {' and '.join(parts)}")

    def leaf_values(self, value: Any) -> List[Any]:
        """The raw (unchecked) leaf values of a structured value, after checking its dict keys."""
        if not self.is_dict:
            return [value]
        self._check_keys(value)
        out = []
        for leaf in self.leaves:
            node = value
            for p in leaf.path:
                node = node[p]
            out.append(node)
        return out

    def convert_leaf(self, leaf: Leaf, value: Any, lead: Tuple[int, ...]) -> Any:
        if leaf.conv is None:
            return _check_text(leaf, value, lead)
        if not lead:
            return leaf.conv.convert_single(value)
        return leaf.conv.convert(value, lead)

    def split(self, value: Any, lead: Tuple[int, ...] = ()) -> List[Any]:
        """Checked arrays (or strings) per leaf; they may share memory with `value`."""
        raw = self.leaf_values(value)
        return [self.convert_leaf(leaf, v, lead) for leaf, v in zip(self.leaves, raw)]

    def split_copy(self, value: Any) -> List[Any]:
        """`split` of one element into arrays that share no memory with `value` (segment writers keep them)."""
        return [v if isinstance(v, str) else np.array(v, copy=True) for v in self.split(value, ())]

    def assemble(self, arrays: Sequence[Any]) -> Any:
        """A structured value (nested dicts in space order) from one array per leaf."""
        if not self.is_dict:
            return arrays[0]
        out: Dict[str, Any] = {}
        for leaf, arr in zip(self.leaves, arrays):
            node = out
            for p in leaf.path[:-1]:
                node = node.setdefault(p, {})
            node[leaf.path[-1]] = arr
        return out

    def subtree(self, keys: Sequence[str]) -> Tuple[Space, List[int]]:
        """The space at a key path and the positions of its leaves in this tree (KeyError when absent)."""
        if isinstance(keys, str):
            keys = [k for k in keys.split("/") if k]
        keys = tuple(keys)
        sp = self.space
        for i, k in enumerate(keys):
            if not isinstance(sp, DictSpace) or k not in sp.spaces:
                raise KeyError(f"{self.who}: no key {'/'.join(keys[:i + 1])!r} in the space (keys: "
                               f"{[leaf.name for leaf in self.leaves]})")
            sp = sp.spaces[k]
        idx = [i for i, leaf in enumerate(self.leaves) if leaf.path[:len(keys)] == keys]
        return sp, idx


def check_stored_space(raw: Any, tree: "LeafTree", where: str) -> None:
    """Compares the space a file stored (JSON) with the given one, leaf by leaf (leaves the file lacks are checked
    elsewhere): ValueError naming each leaf whose stored space differs (e.g. other bounds), StorageFormatError when
    the stored JSON is malformed."""
    from unienv_interface.space.space_utils.serialization_utils import json_to_space, space_to_json
    if raw == space_to_json(tree.space):
        return  # the same space: nothing to compare leaf by leaf
    try:
        stored = json_to_space(raw, tree.space.backend, None)
    except (ValueError, TypeError, KeyError) as exc:
        raise StorageFormatError(f"{where}: the stored space is malformed: {exc}") from None
    diffs = []
    for leaf in tree.leaves:
        node: Any = stored
        for p in leaf.path:
            node = node.spaces.get(p) if isinstance(node, DictSpace) else None
        if node is None:
            continue
        if node != leaf.space:
            diffs.append(f"{leaf.name}: stored {node!r}, given {leaf.space!r}")
    if diffs:
        raise ValueError(f"the space does not match the one stored in {where} (same layout, other bounds): "
                         + "; ".join(diffs))


# ---------------------------------------------------------------------------------------------------- list storage
_ROW_FILE = re.compile(r"^(\d+)\.([A-Za-z0-9]+)$")


class ListStorageBase(SpaceStorage[Any, Any, Any, Any, Any]):
    """One file per row of a Box / Binary space in a directory, plus `<metadata_file>` (see the module docstring).

    Subclasses set `file_ext`, `metadata_file` and `reference_type` (the `storage_type` the reference writes), and
    implement `_encode(path, array)` / `_decode(path) -> array` for one row; they add their own options through
    `_options()` (persisted in the metadata) and `create` / `load_from`.
    """

    single_file_ext: Optional[str] = None
    file_ext: str = ""
    metadata_file: str = ""
    reference_type: str = ""

    def __init__(self, single_instance_space: Space, directory: str, capacity: Optional[int], length: int,
                 written: Optional[np.ndarray] = None, segments: Optional[SegmentLog] = None, *,
                 read_only: bool = False, zero_unwritten: bool = True, owner: bool = True) -> None:
        super().__init__(single_instance_space)
        if not isinstance(single_instance_space, (BoxSpace, BinarySpace)):
            raise TypeError(f"{type(self).__name__} stores a BoxSpace or BinarySpace, got "
                            f"{type(single_instance_space).__name__}; use FlattenedStorage or DictStorage for "
                            "structured spaces")
        if single_instance_space.backend.dtype_name(single_instance_space.dtype) == "bfloat16":
            raise TypeError(f"{type(self).__name__} cannot store bfloat16 (NumPy has no such dtype); use "
                            "PytorchTensorStorage or float32")
        self._dir = directory
        self._capacity = capacity
        self._length = capacity if capacity is not None else length
        self._written = np.zeros(self._length, dtype=bool) if written is None else written
        self._segments = segments if segments is not None else SegmentLog(capacity)
        self._read_only = read_only
        self._zero_unwritten = zero_unwritten
        self._owner = owner
        self._conv = ValueConverter(single_instance_space, "value")
        self._np_dtype = np.dtype(self._conv.np_dtype)
        self._shape = tuple(int(d) for d in (single_instance_space.shape or ()))
        self._meta_dirty = False
        self._saved_log_version = self._segments.version

    # ------------------------------------------------------------------ subclass hooks
    def _encode(self, path: str, arr: np.ndarray) -> None:
        raise NotImplementedError

    def _decode(self, path: str) -> np.ndarray:
        raise NotImplementedError

    def _options(self) -> Dict[str, Any]:
        """Subclass options persisted in the metadata (reference fields first)."""
        return {}

    # ------------------------------------------------------------------ shared construction
    @classmethod
    def _prepare_directory(cls, cache_path: Optional[PathLike]) -> str:
        if cache_path is None:
            raise ValueError(f"{cls.__name__} keeps one file per row: pass cache_path=<a new or empty directory>")
        path = os.fspath(cache_path)
        if os.path.exists(path):
            if not os.path.isdir(path):
                raise FileExistsError(f"{cls.__name__}: {path} exists and is not a directory")
            if os.listdir(path):
                raise FileExistsError(f"{cls.__name__}: {path} already holds files; pass a new or empty directory "
                                      "(or open the existing storage with load_from)")
        os.makedirs(path, exist_ok=True)
        return path

    @classmethod
    def _read_metadata(cls, path: PathLike, single_instance_space: Space, capacity: Optional[int],
                       missing_ok: bool) -> Dict[str, Any]:
        """Reads and checks the metadata; returns the constructor arguments it determines."""
        path = os.fspath(path)
        if not os.path.isdir(path):
            raise StorageNotFoundError(f"{cls.__name__} directory not found: {path}")
        meta_path = os.path.join(path, cls.metadata_file)
        meta = read_json(meta_path, f"{cls.__name__} metadata")
        version = check_format_version(meta, meta_path)
        require_fields(meta, ("storage_type", "length"), meta_path)
        if meta["storage_type"] not in (cls.reference_type, f"{cls.__module__}.{cls.__qualname__}"):
            raise StorageFormatError(f"{meta_path}: storage_type is {meta['storage_type']!r}, expected "
                                     f"{cls.reference_type!r}")
        stored_cap = meta.get("capacity")
        length = meta["length"]
        if stored_cap is not None and (isinstance(stored_cap, bool) or not isinstance(stored_cap, int) or stored_cap <= 0):
            raise StorageFormatError(f"{meta_path}: invalid capacity {stored_cap!r}")
        if isinstance(length, bool) or not isinstance(length, int) or length < 0:
            raise StorageFormatError(f"{meta_path}: invalid length {length!r}")
        if stored_cap is not None:
            length = stored_cap
        cap_arg = check_capacity(capacity)
        if cap_arg is not None and cap_arg != stored_cap:
            hint = ("omit capacity (the storage is growable)" if stored_cap is None
                    else f"pass capacity={stored_cap} or omit it")
            raise ValueError(f"{path} was written with capacity {stored_cap}, not {cap_arg}: {hint}")
        sp = single_instance_space
        if version >= 1:
            require_fields(meta, ("dtype", "shape"), meta_path)
            want = (sp.backend.dtype_name(sp.dtype), list(sp.shape or ()))
            if (meta["dtype"], meta["shape"]) != want:
                raise ValueError(f"{path} holds rows of {meta['dtype']}{meta['shape']}, but the space asks for "
                                 f"{want[0]}{want[1]}: pass the space the storage was written with")
            written = runs_to_mask(meta.get("written", []), length, meta_path)
            segments = SegmentLog.from_json(meta.get("segments", []), stored_cap, length, meta_path)
            zero_unwritten = True
        else:
            written = np.zeros(length, dtype=bool)
            segments = SegmentLog(stored_cap)
            zero_unwritten = bool(missing_ok)
        return {"meta": meta, "version": version, "capacity": stored_cap, "length": length, "written": written,
                "segments": segments, "zero_unwritten": zero_unwritten}

    # ------------------------------------------------------------------ properties
    @property
    def capacity(self) -> Optional[int]:
        return self._capacity

    def __len__(self) -> int:
        return self._length

    @property
    def cache_filename(self) -> Optional[str]:
        return self._dir

    @property
    def is_mutable(self) -> bool:
        return not self._read_only

    @property
    def is_multiprocessing_safe(self) -> bool:
        return True

    def _segment_log(self) -> Optional[SegmentLog]:
        return self._segments

    @property
    def _dirty(self) -> bool:
        return self._meta_dirty or self._segments.version != self._saved_log_version

    def row_path(self, row: int) -> str:
        """The file of one row."""
        return os.path.join(self._dir, f"{row}.{self.file_ext}")

    def _norm(self, index: Any) -> NormalizedIndex:
        return normalize_index(index, self._length, type(self).__name__)

    def _wrap(self, arr: np.ndarray) -> Any:
        b = self.single_instance_space.backend
        if b.simplified_name == "numpy":
            return arr
        return b.from_numpy(arr, dtype=self.single_instance_space.dtype, device=self.single_instance_space.device)

    def _check_owner(self, what: str) -> None:
        if not self._owner:
            raise StorageStateError(f"{what} is not allowed on a pickled copy of {type(self).__name__}: the length "
                                    "and segments belong to the original storage")

    # ------------------------------------------------------------------ rows
    def _read_row(self, row: int) -> np.ndarray:
        path = self.row_path(row)
        try:
            arr = self._decode(path)
        except FileNotFoundError:
            if self._written[row]:
                raise StorageNotFoundError(f"{type(self).__name__}: row {row} was written but its file {path} is "
                                           "missing (deleted or lost); the storage is damaged") from None
            if self._zero_unwritten:
                return np.zeros(self._shape, dtype=self._np_dtype)
            raise StorageNotFoundError(
                f"{type(self).__name__}: there is no file {path} for row {row}. The directory was written by the "
                "reference unienv, which writes no file for a row that was never set, so the row was either never "
                "set or its file was lost; pass missing_ok=True to load_from to read such rows as zeros") from None
        if arr.dtype != self._np_dtype or tuple(arr.shape) != self._shape:
            raise StorageFormatError(f"{path} holds {arr.dtype}{list(arr.shape)}, but the space asks for "
                                     f"{self._np_dtype}{list(self._shape)}: the file belongs to another storage")
        if not self._written[row]:
            self._written[row] = True
        return arr

    def get_numpy(self, index: Any) -> np.ndarray:
        """Rows at `index` as a fresh NumPy array."""
        self._check_open()
        norm = self._norm(index)
        if norm.single is not None:
            return self._read_row(norm.single)
        pos = norm.positions()
        if pos.size == 0:
            return np.zeros((0,) + self._shape, dtype=self._np_dtype)
        uniq, inverse = np.unique(pos, return_inverse=True)
        rows = map_io(self._read_row, uniq.tolist())
        stacked = np.stack(rows)
        if uniq.size == pos.size and np.array_equal(uniq, pos):
            return stacked
        return stacked[inverse.reshape(-1)]

    def get(self, index: Any) -> Any:
        """Row(s) at `index`: one for an int-like index, else a batch (files read on the shared IO pool)."""
        return self._wrap(self.get_numpy(index))

    def _try_write_row(self, job: Tuple[int, np.ndarray]) -> Optional[BaseException]:
        """Writes one row file (under a temporary name, then renamed); returns the error instead of raising it."""
        row, arr = job
        try:
            replace_file(lambda tmp: self._encode(tmp, arr), self.row_path(row))
        except Exception as exc:  # noqa: BLE001 - collected and re-raised by _write_rows
            return exc
        return None

    def _write_rows(self, norm: NormalizedIndex, arr: np.ndarray) -> None:
        if norm.single is not None:
            jobs = [(norm.single, _contiguous(arr))]
        else:
            pos = norm.positions()
            if pos.size > 1:
                uniq, first_rev = np.unique(pos[::-1], return_index=True)
                keep = pos.size - 1 - first_rev  # the last occurrence of every row wins
                pos, arr = uniq, arr[keep]
            jobs = [(int(p), _contiguous(arr[k])) for k, p in enumerate(pos.tolist())]
        if not jobs:
            return
        errors = map_io(self._try_write_row, jobs)
        done = np.fromiter((j[0] for j, e in zip(jobs, errors) if e is None), dtype=np.int64)
        if done.size and not self._written[done].all():
            self._written[done] = True
            self._meta_dirty = True
        for e in errors:
            if e is not None:
                raise e

    def set(self, index: Any, value: Any) -> None:
        """Checks `value` (shape, dtype, bounds) and writes one file per row; on a check error nothing is written."""
        self._check_writable()
        norm = self._norm(index)
        lead = () if norm.single is not None else (norm.count(),)
        self._write_rows(norm, self._conv.convert(value, lead))

    def _prepare_single(self, value: Any) -> Any:
        return np.array(self._conv.convert_single(value), copy=True)

    def _stack_prepared(self, items: List[Any]) -> Any:
        return np.stack(items) if items else np.zeros((0,) + self._shape, dtype=self._np_dtype)

    def _set_prepared(self, index: Any, batch: Any) -> None:
        self._check_writable()
        self._write_rows(self._norm(index), batch)

    def append(self, value: Any) -> None:
        """Writes one row at the open segment's next position (growable storages grow)."""
        self._check_writable()
        arr = self._conv.convert_single(value)
        pos = self._next_write_position()
        self._write_rows(NormalizedIndex(single=pos), arr)
        self._advance_segment()

    # ------------------------------------------------------------------ length
    def _delete_rows(self, rows: Sequence[int]) -> None:
        def rm(row: int) -> None:
            try:
                os.unlink(self.row_path(row))
            except FileNotFoundError:
                pass
        map_io(rm, list(rows))

    def _row_files(self, directory: str) -> Dict[int, str]:
        out: Dict[int, str] = {}
        try:
            names = os.listdir(directory)
        except FileNotFoundError:
            return out
        for name in names:
            m = _ROW_FILE.match(name)
            if m and m.group(2) == self.file_ext:
                out[int(m.group(1))] = name
        return out

    def extend_length(self, length: int) -> None:
        """Adds `length` rows (reading as zeros) at the end of a growable storage; a no-op for a fixed capacity."""
        self._check_writable()
        if self._capacity is not None:
            return
        n = check_count(length, "extend_length")
        if not n:
            return
        self._check_owner("extend_length")
        new_len = self._length + n
        if new_len > self._written.shape[0]:  # grows geometrically, so appends stay amortised O(1)
            grown = np.zeros(max(new_len, 2 * self._written.shape[0], 64), dtype=bool)
            grown[:self._length] = self._written[:self._length]
            self._written = grown
        self._length = new_len
        self._meta_dirty = True

    def shrink_length(self, length: int) -> None:
        """Removes `length` rows (and their files) from the end of a growable storage."""
        self._check_writable()
        if self._capacity is not None:
            return
        n = check_count(length, "shrink_length", self._length)
        if not n:
            return
        self._check_owner("shrink_length")
        new_len = self._length - n
        self._length = new_len
        self._meta_dirty = True
        self._segments.truncate(new_len)
        if self._seg_start is not None and self._seg_start + self._seg_len > new_len:
            self.abort_segment()
        # metadata first (a crash leaves extra files, never a row recorded as written without its file)
        self._written[new_len:] = False
        if self._owner:
            self.flush()
        self._delete_rows([r for r in self._row_files(self._dir) if r >= new_len])

    def clear(self) -> None:
        """Aborts the open segment, forgets all segments and deletes every row file (growable: length 0)."""
        self._check_writable()
        self._check_owner("clear")
        super().clear()
        if self._capacity is not None:
            self._delete_rows(sorted(self._row_files(self._dir)))
            self._written[:] = False
            self._meta_dirty = True
            self.flush()

    # ------------------------------------------------------------------ persistence
    def _metadata(self) -> Dict[str, Any]:
        sp = self.single_instance_space
        return {"storage_type": self.reference_type, **self._options(), "capacity": self._capacity,
                "length": self._length, "format_version": FORMAT_VERSION, "dtype": sp.backend.dtype_name(sp.dtype),
                "shape": list(self._shape), "written": mask_to_runs(self._written[:self._length]),
                "segments": self._segments.to_json()}

    def flush(self) -> None:
        """Writes the metadata (row files are written at once); a no-op for read-only storages and copies."""
        self._check_open()
        if self._read_only or not self._owner:
            return
        atomic_write_json(os.path.join(self._dir, self.metadata_file), self._metadata())
        self._meta_dirty = False
        self._saved_log_version = self._segments.version

    def dumps(self, path: PathLike) -> None:
        """Writes the storage to the directory `path`: its own directory flushes; elsewhere every written row file is
        hard-linked or copied there (stale row files of an older dump removed), then the metadata is written."""
        self._check_open()
        path = os.fspath(path)
        if os.path.isdir(path) and os.path.samefile(path, self._dir):
            if self._owner and not self._read_only:
                self.flush()
            return
        if os.path.exists(path) and not os.path.isdir(path):
            raise FileExistsError(f"{type(self).__name__}.dumps: {path} exists and is not a directory")
        os.makedirs(path, exist_ok=True)
        present = self._row_files(self._dir)
        rows = [r for r in sorted(present) if r < self._length]
        missing = [r for r in np.flatnonzero(self._written[:self._length]).tolist() if r not in present]
        if missing:
            raise StorageNotFoundError(f"{type(self).__name__}: rows {missing[:8]} were written but their files are "
                                       f"missing from {self._dir}; cannot dump a damaged storage")
        map_io(lambda r: link_or_copy(os.path.join(self._dir, present[r]),
                                      os.path.join(path, f"{r}.{self.file_ext}")), rows)
        keep = set(rows)
        stale = [name for r, name in self._row_files(path).items() if r not in keep]
        for name in stale:
            try:
                os.unlink(os.path.join(path, name))
            except FileNotFoundError:
                pass
        meta = self._metadata()
        mask = np.zeros(self._length, dtype=bool)
        mask[rows] = True
        meta["written"] = mask_to_runs(mask)
        atomic_write_json(os.path.join(path, self.metadata_file), meta)

    def close(self) -> None:
        """Writes the metadata of a writable storage if it changed; later use raises StorageClosedError."""
        if self._closed:
            return
        try:
            if not self._read_only and self._owner and self._dirty and os.path.isdir(self._dir):
                self.flush()
        finally:
            self._closed = True

    def _release(self) -> None:
        try:
            if not self._read_only and self._owner and self._dirty and os.path.isdir(self._dir):
                self.flush()
        except Exception:
            pass

    # ------------------------------------------------------------------ pickling
    def __getstate__(self) -> Dict[str, Any]:
        self._check_open()
        if self._owner and not self._read_only and self._dirty:
            self.flush()
        return {"space": self.single_instance_space, "dir": self._dir, "capacity": self._capacity,
                "length": self._length, "written": self._written[:self._length].copy(),
                "segments": self._segments.to_json(), "read_only": self._read_only,
                "zero_unwritten": self._zero_unwritten, "options": self._options()}

    def _restore_options(self, options: Dict[str, Any]) -> None:
        """Sets subclass options from `_options()` output (pickling)."""

    def __setstate__(self, state: Dict[str, Any]) -> None:
        log = SegmentLog(state["capacity"])
        log._runs = [(int(s), int(n)) for s, n in state["segments"]]
        ListStorageBase.__init__(self, state["space"], state["dir"], state["capacity"], state["length"],
                                 state["written"], log, read_only=state["read_only"],
                                 zero_unwritten=state["zero_unwritten"], owner=False)
        self._restore_options(state["options"])


__all__ = ["ListStorageBase", "LeafTree", "Leaf", "ValueConverter", "require_module", "check_capacity", "check_count",
           "replace_file", "link_or_copy", "temp_name", "mask_to_runs", "runs_to_mask", "describe_leaf",
           "check_stored_space"]
