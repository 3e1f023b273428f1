"""Leaves of a structured space, for the storages that keep one column or dataset per leaf (HDF5, Parquet;
re-exported by `_list_storage`).

* `LeafTree`: checks a structured value (a nested dict of Box / Binary / Text leaves, or one leaf) against its
  space and splits it into one checked NumPy array per leaf, and assembles leaf arrays back into a value.
* `ValueConverter`: `LeafConverter` that also accepts NaN where a Box is unbounded.
* `check_stored_space`: compares the space a file stored with the given one, leaf by leaf.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from unienv_data.base.errors import StorageFormatError
from unienv_data.base.values import LeafConverter
from unienv_data.batches._tree import set_path
from unienv_interface.space import BinarySpace, BoxSpace, DictSpace, Space, TextSpace


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
            set_path(out, leaf.path, arr)
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
    from unienv_interface.space.space_utils.serialization_utils import json_to_space, same_space_json
    if same_space_json(tree.space, raw):
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


class LeafTreeWrites:
    """The write entry points shared by storages that keep one column per leaf of a `LeafTree` (HDF5, Parquet).

    The class using it provides `_tree` (a `LeafTree`), `_norm(index)` (a normalised index), `_write_leaves(norm,
    leaves)` (checked columns, written all or nothing) and `_check_writable()`.
    """

    _tree: LeafTree

    if TYPE_CHECKING:  # provided by the storage class (declared here for the type checker only)
        def _norm(self, index: Any) -> Any: ...

        def _write_leaves(self, norm: Any, leaves: Any) -> None: ...

        def _check_writable(self) -> None: ...

        def _check_append_state(self) -> None: ...

        def _next_write_position(self) -> int: ...

        def _advance_segment(self) -> None: ...

    def set(self, index: Any, value: Any) -> None:
        """Checks the whole value (keys, shapes, dtypes, bounds), then writes every leaf; on error nothing changes."""
        self._check_writable()
        norm = self._norm(index)
        lead = () if norm.single is not None else (norm.count(),)
        self._write_leaves(norm, self._tree.split(value, lead))

    def append(self, value: Any) -> None:
        """Checks the whole value first, then writes it at the open segment's next row (growable storages grow): a
        refused value neither grows the storage nor cuts the recorded segment that held that row."""
        self._check_append_state()
        leaves = self._tree.split(value, ())
        pos = self._next_write_position()
        self._write_leaves(self._norm(pos), leaves)
        self._advance_segment()

    def _prepare_single(self, value: Any) -> Any:
        return self._tree.split_copy(value)

    def _stack_prepared(self, items: List[Any]) -> Any:
        out = []
        for k, leaf in enumerate(self._tree.leaves):
            if leaf.conv is None:  # text leaves: object columns
                col = np.empty(len(items), dtype=object)
                col[:] = [it[k] for it in items]
                out.append(col)
            else:
                out.append(np.stack([it[k] for it in items]) if items else leaf.zeros(0))
        return out

    def _set_prepared(self, index: Any, batch: Any) -> None:
        self._check_writable()
        self._write_leaves(self._norm(index), batch)
