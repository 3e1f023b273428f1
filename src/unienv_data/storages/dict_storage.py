"""`DictStorage`: one child storage per key path of a `DictSpace` (reference-api §5.3).

Routing (`storage_cls_map`, keys are paths joined by `nested_separator`, "/" by default):

* an exact key (`"obs/image"`, or `"obs"` for a whole sub-dict) gives its child the space at that path;
* `"*"` / `"prefix/*"` gives its child the *residual* `DictSpace` under the prefix: every leaf no other entry
  claims (deeper wildcards claim first, so `"obs/*"` takes what is left under `obs` and `"*"` the rest);
* a *group* (a key named in `groups={"name": ["obs/pos", "action", ...]}`) gives its child the sub-`DictSpace` of
  exactly those paths, nested as in the full space. Groups let one child hold leaves from different places of the
  tree (the native layout stores all float32 leaves in one flat row this way). A group name must not be a path of
  the space.

Unlike the reference: a key that matches nothing raises KeyError naming it, a leaf claimed by no entry (or by two)
raises ValueError (nothing is dropped silently), `get` returns the sample in the space's own (sorted) key order,
and `set` / `append` / writer appends check the whole sample (keys, then every child's value) before any child
is written, so a refused write leaves every child untouched.

Segments live in the children: every segment operation goes through all of them, so they record the same
segments; `get_segments` checks that they agree. On `load_from`, segments that only some children recorded (a
crash between two children's metadata writes) are forgotten, keeping those every child holds.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple, Type, Union

import numpy as np

from unienv_data.base.errors import StorageFormatError, StorageStateError
from unienv_data.base.files import (FORMAT_VERSION, PathLike, atomic_write_json, check_format_version,
                                    confined_path, read_json, require_fields)
from unienv_data.base.indexing import is_single_index, normalize_index
from unienv_data.base.registry import register_storage, resolve_storage_class, storage_type_name
from unienv_data.base.segment_writer import BufferedSegmentWriter, SegmentWriter
from unienv_data.base.storage import SpaceStorage
from unienv_data.base.values import LeafConverter
from unienv_interface.space import DictSpace, Space
from unienv_interface.space.space_utils import batch_utils
from unienv_interface.space.space_utils.flatten_utils import flatten_data, flatten_space, unflatten_data
from unienv_interface.space.space_utils.serialization_utils import json_to_space, space_to_json

from ._array_storage import ArrayStorageBase
from .flattened import FlattenedStorage

METADATA_FILE = "dict_storage_metadata.json"

Path = Tuple[str, ...]
_Commit = Callable[[], None]


# ---------------------------------------------------------------------------------------------------- routing
@dataclass
class _Route:
    """Where one child's data sits in the full sample."""

    key: str                 #: the storage-map key
    kind: str                #: "node": the child holds the space at `root`; "pruned": a sub-dict of leaves under it
    root: Path               #: path of the node the child's data is relative to
    space: Space             #: the space the child stores
    leaves: List[Path]       #: absolute paths of the leaves it holds, in space order


def _join(path: Sequence[Any], sep: str) -> str:
    return sep.join(map(str, path)) or "<root>"


def _node_at(space: Space, path: Path) -> Optional[Space]:
    node = space
    for p in path:
        if not isinstance(node, DictSpace) or p not in node.spaces:
            return None
        node = node.spaces[p]
    return node


def _leaf_paths(space: Space, sep: str, path: Path = ()) -> List[Path]:
    """Absolute paths of the non-dict leaves of `space`, in space order (checks that keys are usable paths)."""
    if not isinstance(space, DictSpace):
        return [path]
    out: List[Path] = []
    for k, child in space.spaces.items():
        if not isinstance(k, str):
            raise TypeError(f"DictStorage needs string keys, got {k!r} under {_join(path, sep)!r}")
        if sep in k or k == "*" or not k:
            raise ValueError(f"space key {k!r} under {_join(path, sep)!r} cannot be part of a {sep!r}-separated "
                             "key path; choose another nested_separator")
        out.extend(_leaf_paths(child, sep, path + (k,)))
    return out


def _prune(node: DictSpace, keep: Set[Path]) -> DictSpace:
    """The sub-DictSpace of `node` holding exactly the leaves `keep` (paths relative to `node`)."""
    out: Dict[str, Space] = {}
    for k, child in node.spaces.items():
        sub = {p[1:] for p in keep if p and p[0] == k}
        if not sub:
            continue
        if () in sub or not isinstance(child, DictSpace):
            out[k] = child
        else:
            out[k] = _prune(child, sub)
    return DictSpace(node.backend, out, metadata=node.metadata)


def route_space(space: Space, keys: Sequence[str], groups: Mapping[str, Sequence[str]],
                sep: str) -> List[_Route]:
    """Assigns every leaf of `space` to exactly one storage-map key (see the module docstring)."""
    if not isinstance(space, DictSpace):
        raise TypeError(f"DictStorage stores a DictSpace, got {type(space).__name__}")
    if not isinstance(sep, str) or not sep or sep == "*":
        raise ValueError(f"nested_separator must be a non-empty string other than '*', got {sep!r}")
    all_leaves = _leaf_paths(space, sep)
    owner: Dict[Path, str] = {}
    routes: Dict[str, _Route] = {}

    def leaves_under(prefix: Path) -> List[Path]:
        n = len(prefix)
        return [lf for lf in all_leaves if lf[:n] == prefix]

    def claim(key: str, leaves: List[Path]) -> None:
        for lf in leaves:
            if lf in owner:
                raise ValueError(f"leaf {_join(lf, sep)!r} is claimed by both {owner[lf]!r} and {key!r}")
            owner[lf] = key

    for g in groups:
        if g not in keys:
            raise ValueError(f"group {g!r} has no entry in storage_cls_map (give it a storage class)")
    wildcards: List[Tuple[str, Path]] = []
    for key in keys:
        if not isinstance(key, str) or not key:
            raise TypeError(f"storage_cls_map keys must be non-empty strings, got {key!r}")
        if key in groups:
            if "*" in key:
                raise ValueError(f"group name {key!r} must not contain '*'")
            if _node_at(space, tuple(key.split(sep))) is not None:
                raise ValueError(f"group name {key!r} is also a key path of the space; rename the group")
            paths = groups[key]
            if isinstance(paths, str) or not isinstance(paths, Sequence) or not paths:
                raise TypeError(f"group {key!r} must list one or more key paths, got {paths!r}")
            leaves_set: Set[Path] = set()
            for p in paths:
                if not isinstance(p, str) or "*" in p:
                    raise ValueError(f"group {key!r}: {p!r} is not a key path")
                parts = tuple(p.split(sep))
                if _node_at(space, parts) is None:
                    raise KeyError(f"group {key!r}: key path {p!r} matches nothing in the space "
                                   f"(leaves: {[_join(lf, sep) for lf in all_leaves]})")
                leaves_set.update(leaves_under(parts))
            leaves = [lf for lf in all_leaves if lf in leaves_set]
            if not leaves:
                raise KeyError(f"group {key!r} matches no leaf of the space")
            claim(key, leaves)
            routes[key] = _Route(key, "pruned", (), _prune(space, set(leaves)), leaves)
            continue
        parts = tuple(key.split(sep))
        if "*" in parts:
            if parts[-1] != "*" or parts.count("*") != 1:
                raise ValueError(f"storage_cls_map key {key!r}: '*' may only be the last part ('*' or 'prefix{sep}*')")
            wildcards.append((key, parts[:-1]))
            continue
        node = _node_at(space, parts)
        leaves = leaves_under(parts) if node is not None else []
        if node is None or not leaves:
            raise KeyError(f"storage_cls_map key {key!r} matches nothing in the space "
                           f"(leaves: {[_join(lf, sep) for lf in all_leaves]})")
        claim(key, leaves)
        routes[key] = _Route(key, "node", parts, node, leaves)
    for key, prefix in sorted(wildcards, key=lambda kp: -len(kp[1])):
        node = _node_at(space, prefix)
        if not isinstance(node, DictSpace):
            raise KeyError(f"storage_cls_map key {key!r}: {_join(prefix, sep)!r} is not a sub-dict of the space")
        residual = [lf for lf in leaves_under(prefix) if lf not in owner]
        if not residual:
            raise KeyError(f"storage_cls_map key {key!r} matches nothing: every leaf under {_join(prefix, sep)!r} "
                           "is claimed by another entry")
        claim(key, residual)
        n = len(prefix)
        routes[key] = _Route(key, "pruned", prefix, _prune(node, {lf[n:] for lf in residual}), residual)
    unclaimed = [_join(lf, sep) for lf in all_leaves if lf not in owner]
    if unclaimed:
        raise ValueError(f"no storage_cls_map entry claims the key(s) {unclaimed}; add them (or a '*' entry) "
                         "to storage_cls_map")
    return [routes[k] for k in keys]


def child_relative_path(key: str, cls: Type[SpaceStorage], sep: str) -> str:
    """File or directory name of a child: the key with the separator as '.', '*' as '_default', plus its ext
    (a path separator left in a key, possible with another `nested_separator`, is written as '%2F')."""
    name = key.replace(sep, ".").replace("*", "_default") + (cls.single_file_ext or "")
    for s in {os.sep, os.altsep or os.sep, "/"}:
        name = name.replace(s, "%2F")
    bad = "\x00" in name or name in ("", ".", "..")
    if bad:
        raise ValueError(f"storage_cls_map key {key!r} does not give a usable file name ({name!r})")
    return name


# ---------------------------------------------------------------------------------------------------- staging
def _dig(value: Any, path: Path) -> Any:
    for p in path:
        value = value[p]
    return value


def _overrides_prepare(child: SpaceStorage) -> bool:
    return type(child)._prepare_single is not SpaceStorage._prepare_single


def _check_generic(child: SpaceStorage, value: Any, lead: Tuple[int, ...]) -> None:
    """Checks a value for a child of unknown type without writing: through the `LeafConverter` a single-leaf
    storage keeps as `_conv` (video, image storages), else through its `_prepare_single` hook (when it has one)."""
    conv = getattr(child, "_conv", None)
    if isinstance(conv, LeafConverter):
        if lead:
            conv.convert(value, lead)
        else:
            conv.convert_single(value)
        return
    if not _overrides_prepare(child):
        return
    if not lead:
        child._prepare_single(value)
        return
    n = lead[0]
    got = batch_utils.batch_size_data(value)
    if got != n:
        raise ValueError(f"expected a batch of {n} elements, got {got}")
    batched = batch_utils.batch_space(child.single_instance_space, n)
    for j in range(n):
        try:
            item = batch_utils.get_at(batched, value, j)
        except IndexError:
            raise ValueError(f"expected a batch of {n} elements in every leaf; element {j} is missing") from None
        child._prepare_single(item)


def _stage_set(child: SpaceStorage, key: Any, lead: Tuple[int, ...], value: Any) -> _Commit:
    """Checks `value` for `child.set(key, ...)` without writing; returns the write. Children of unknown type are
    checked as far as their hooks allow (their own `set` checks again; DictStorage writes them first)."""
    if isinstance(child, DictStorage):
        return child._stage_set(key, lead, value)
    if isinstance(child, ArrayStorageBase):
        arr = child._conv.convert(value, lead)
        return partial(child._write_rows_trusted, key, arr)
    if isinstance(child, FlattenedStorage) and child._fast:
        plan, inner = child._plan, child.inner_storage
        if lead:
            arrs = plan.check_batch(value, lead)
            if arrs is not None:
                return partial(inner._write_via, key, plan.write_checked_batch, arrs)  # type: ignore[attr-defined]
        rows = plan.pack(value, lead)
        return partial(inner._write_rows_trusted, key, rows)  # type: ignore[attr-defined]
    _check_generic(child, value, lead)
    return partial(child.set, key, value)


def _appender(child: SpaceStorage) -> Tuple[Callable[[Any], Any], Callable[[Any], None]]:
    """`(stage, commit)` for appends to `child`: `stage(value)` checks one element without writing and returns a
    payload; `commit(payload)` appends it at the child's open segment."""
    if isinstance(child, DictStorage):
        return child._stage_append_parts, child._commit_append_parts
    if isinstance(child, ArrayStorageBase):
        return child._conv.convert_single, child._append_row_trusted
    if isinstance(child, FlattenedStorage) and child._fast:
        return partial(_flat_stage_single, child._plan), partial(_flat_append, child.inner_storage)
    return partial(_generic_stage_single, child), child.append


def _flat_stage_single(plan: Any, value: Any) -> Tuple[Callable[[np.ndarray, Any], None], Any]:
    arrs = plan.check_single(value)
    if arrs is not None:
        plan.check_row_casts(arrs)
        return plan.write_checked, arrs
    return _copy_row, plan.pack(value)


def _copy_row(dst: np.ndarray, row: np.ndarray) -> None:
    dst[...] = row


def _flat_append(inner: Any, payload: Tuple[Callable[[np.ndarray, Any], None], Any]) -> None:
    inner._append_via(payload[0], payload[1])


def _generic_stage_single(child: SpaceStorage, value: Any) -> Any:
    _check_generic(child, value, ())
    return value


def _generic_prepare_single(child: SpaceStorage, value: Any) -> Any:
    if not _overrides_prepare(child):
        _check_generic(child, value, ())
    return child._prepare_single(value)


def _record_in(child: SpaceStorage, start: int, length: int) -> None:
    # FlattenedStorage keeps its segments in its inner storage but does not forward `_record_segment`
    if isinstance(child, FlattenedStorage):
        child.inner_storage._record_segment(start, length)
    else:
        child._record_segment(start, length)


# ---------------------------------------------------------------------------------------------------- writer
class _ChildFeed:
    """How a `_DictSegmentWriter` hands one sample part to one child writer: `prepare` checks it (before any
    child writer is touched), `push(prepared, raw)` appends it."""

    __slots__ = ("writer", "prepare", "push")

    def __init__(self, child: SpaceStorage) -> None:
        if isinstance(child, DictStorage):
            w: SegmentWriter = child.open_segment_writer()
            dw: _DictSegmentWriter = w  # type: ignore[assignment]
            self.prepare: Callable[[Any], Any] = dw._prepare
            self.push: Callable[[Any, Any], None] = lambda p, _raw: dw._push(p)
        elif isinstance(child, FlattenedStorage) and child._fast:
            # rows are packed (and checked) once, then buffered by a writer of the inner array storage
            w = child.inner_storage.open_segment_writer()
            bw: BufferedSegmentWriter = w  # type: ignore[assignment]
            self.prepare = child._plan.pack
            self.push = lambda p, _raw: bw.append_prepared(p)
        else:
            w = child.open_segment_writer()
            if isinstance(w, BufferedSegmentWriter):
                buffered = w
                self.prepare = partial(_generic_prepare_single, child)
                self.push = lambda p, _raw: buffered.append_prepared(p)
            else:
                other = w
                self.prepare = partial(_check_generic, child, lead=())
                self.push = lambda _p, raw: other.append(raw)
        self.writer = w


class _DictSegmentWriter(SegmentWriter):
    """One writer per child; appends check the whole sample first, `commit(start)` commits every child at `start`."""

    def __init__(self, storage: "DictStorage") -> None:
        super().__init__(storage)
        feeds = [_ChildFeed(c) for c in storage._storages]
        order = storage._write_order
        self._feeds = [feeds[i] for i in order]
        self._extract = [storage._extractors[i] for i in order]
        self._dict_storage = storage

    def _prepare(self, value: Any) -> List[Any]:
        self._dict_storage._check_structure(value)
        parts = [ex(value) for ex in self._extract]
        return [(f.prepare(p), p) for f, p in zip(self._feeds, parts)]

    def _push(self, prepared: List[Any]) -> None:
        if self.is_finished:
            raise StorageStateError(f"Cannot append to a {self.state} segment writer")
        for f, (p, raw) in zip(self._feeds, prepared):
            f.push(p, raw)
        self._length += 1

    def _append(self, value: Any) -> None:
        prepared = self._prepare(value)
        for f, (p, raw) in zip(self._feeds, prepared):
            f.push(p, raw)

    def finish(self) -> None:
        super().finish()
        for f in self._feeds:
            f.writer.finish()

    def _commit(self, start: int) -> None:
        for f in self._feeds:
            f.writer.commit(start)

    def abort(self) -> None:
        super().abort()
        for f in self._feeds:
            if f.writer.state != "committed":
                f.writer.abort()


# ---------------------------------------------------------------------------------------------------- storage
@register_storage
class DictStorage(SpaceStorage[Any, Any, Any, Any, Any]):
    """Stores a `DictSpace` as one child storage per key path (see the module docstring for the routing).

    `create(space, storage_cls_map, *args, capacity=None, cache_path=None, multiprocessing=False, key_kwargs={},
    type_kwargs={}, nested_separator='/', groups=None, **kwargs)`: each child is
    `cls.create(child_space, *args, capacity=..., cache_path=<cache_path>/<child path>, multiprocessing=...,
    **{**kwargs, **type_kwargs[cls], **key_kwargs[key]})`; the child path is the key with the separator as "." and
    "*" as "_default", plus the class's `single_file_ext`. With `cache_path` the metadata is written at once, so
    `load_from(cache_path, space)` reopens it.

    `load_from(path, space, *, capacity=None, read_only=True, multiprocessing=False, key_kwargs={}, type_kwargs={},
    **kwargs)` reads `dict_storage_metadata.json`; storage classes resolve only through the storage registry and
    child paths must stay inside `path`.

    Children must agree on capacity and length. `get` returns the sample in the space's key order; `get_column(key)`
    returns the child storage of a storage-map key. Closing closes the children this object created or loaded;
    garbage collection never closes children. Pickles (for worker processes) by pickling its children.
    """

    single_file_ext: Optional[str] = None

    def __init__(self, single_instance_space: Space, storages: Mapping[str, SpaceStorage], *,
                 nested_separator: str = "/", groups: Optional[Mapping[str, Sequence[str]]] = None,
                 storage_paths: Optional[Mapping[str, str]] = None,
                 cache_filename: Optional[Union[str, PathLike]] = None) -> None:
        if not isinstance(storages, Mapping) or not storages:
            raise ValueError("DictStorage needs at least one child storage (a mapping of key to storage)")
        groups = {str(k): list(v) for k, v in (groups or {}).items()}
        routes = route_space(single_instance_space, list(storages), groups, nested_separator)
        children = [storages[r.key] for r in routes]
        for r, child in zip(routes, children):
            if not isinstance(child, SpaceStorage):
                raise TypeError(f"child {r.key!r} must be a SpaceStorage, got {type(child).__name__}")
            if child.single_instance_space != r.space:
                raise ValueError(f"child {r.key!r} stores {_brief(child.single_instance_space)}, but the space at "
                                 f"that key is {_brief(r.space)}")
        caps = {r.key: c.capacity for r, c in zip(routes, children)}
        if len(set(caps.values())) != 1:
            raise ValueError(f"DictStorage children must share one capacity, got {caps}")
        lens = {r.key: len(c) for r, c in zip(routes, children)}
        if len(set(lens.values())) != 1:
            raise ValueError(f"DictStorage children must have the same length, got {lens}")
        super().__init__(single_instance_space)
        self.nested_separator = nested_separator
        self._groups = groups
        self._routes = routes
        self._storages: List[SpaceStorage] = children
        self._by_key: Dict[str, SpaceStorage] = {r.key: c for r, c in zip(routes, children)}
        paths = dict(storage_paths or {})
        self._paths: Dict[str, str] = {
            r.key: paths.get(r.key) or child_relative_path(r.key, type(c), nested_separator)
            for r, c in zip(routes, children)}
        if len(set(self._paths.values())) != len(self._paths):
            raise ValueError(f"two children would share a file name: {self._paths}")
        self._cache_filename = cache_filename
        self._owns_children = False
        self._compile()

    # ------------------------------------------------------------------ compiled access plans
    def _compile(self) -> None:
        sp = self.single_instance_space
        owner: Dict[Path, Tuple[int, Path]] = {}
        for i, r in enumerate(self._routes):
            for lf in r.leaves:
                owner[lf] = (i, lf[len(r.root):])
        self._dict_nodes: List[Tuple[Path, frozenset]] = []

        def nodes(node: Space, path: Path) -> None:
            if isinstance(node, DictSpace):
                self._dict_nodes.append((path, frozenset(node.spaces)))
                for k, child in node.spaces.items():
                    nodes(child, path + (k,))
        nodes(sp, ())
        self._root_keys = self._dict_nodes[0][1]
        self._flat_space = all(len(p) == 0 for p, _ in self._dict_nodes)

        def assembler(node: Space, path: Path) -> Callable[[List[Any]], Any]:
            if isinstance(node, DictSpace):
                items = [(k, assembler(child, path + (k,))) for k, child in node.spaces.items()]
                return lambda outs: {k: f(outs) for k, f in items}
            ci, rel = owner[path]
            if not rel:
                return lambda outs: outs[ci]
            if len(rel) == 1:
                k0 = rel[0]
                return lambda outs: outs[ci][k0]
            return lambda outs: _dig(outs[ci], rel)
        self._assemble = assembler(sp, ())

        def picker(node: DictSpace) -> Callable[[Any], Any]:
            items = [(k, picker(child) if isinstance(child, DictSpace) else None) for k, child in node.spaces.items()]
            if all(f is None for _, f in items):
                keys = [k for k, _ in items]
                return lambda v: {k: v[k] for k in keys}
            return lambda v: {k: (v[k] if f is None else f(v[k])) for k, f in items}

        self._extractors: List[Callable[[Any], Any]] = []
        for r in self._routes:
            root = r.root
            if r.kind == "node":
                if len(root) == 1:
                    self._extractors.append(partial(_getitem, key=root[0]))
                else:
                    self._extractors.append(partial(_dig, path=root))
            else:
                pick = picker(r.space)  # type: ignore[arg-type]
                self._extractors.append(pick if not root else partial(_pick_under, pick=pick, path=root))
        # children of unknown types are written first: if one refuses after all, no other child was touched
        known = (DictStorage, ArrayStorageBase, FlattenedStorage)
        generic = [i for i, c in enumerate(self._storages) if not isinstance(c, known)]
        self._write_order = generic + [i for i in range(len(self._storages)) if i not in generic]
        appenders = [_appender(self._storages[i]) for i in self._write_order]
        self._append_stages = [(a[0], self._extractors[i]) for a, i in zip(appenders, self._write_order)]
        self._append_commits = [a[1] for a in appenders]
        #: children opened read-only stay read-only (checked again by each child on write)
        self._all_mutable = all(c.is_mutable for c in self._storages)

    # ------------------------------------------------------------------ construction
    @classmethod
    def _merged_kwargs(cls, key: str, child_cls: Type[SpaceStorage], kwargs: Mapping[str, Any],
                       type_kwargs: Mapping[Any, Mapping[str, Any]],
                       key_kwargs: Mapping[str, Mapping[str, Any]]) -> Dict[str, Any]:
        return {**kwargs, **dict(type_kwargs.get(child_cls, {})), **dict(key_kwargs.get(key, {}))}

    @staticmethod
    def _check_key_kwargs(key_kwargs: Mapping[str, Any], keys: Sequence[str]) -> None:
        unknown = [k for k in key_kwargs if k not in keys]
        if unknown:
            raise KeyError(f"key_kwargs names key(s) {unknown} that are not in the storage map {list(keys)}")

    @classmethod
    def create(cls, single_instance_space: Space, storage_cls_map: Mapping[str, Type[SpaceStorage]],  # type: ignore[override]
               *args: Any, capacity: Optional[int] = None, cache_path: Optional[PathLike] = None,
               multiprocessing: bool = False, key_kwargs: Mapping[str, Mapping[str, Any]] = {},
               type_kwargs: Mapping[Any, Mapping[str, Any]] = {}, nested_separator: str = "/",
               groups: Optional[Mapping[str, Sequence[str]]] = None, **kwargs: Any) -> "DictStorage":
        """A new storage with one child per `storage_cls_map` entry (see the class docstring)."""
        if not isinstance(storage_cls_map, Mapping) or not storage_cls_map:
            raise ValueError("storage_cls_map must be a non-empty mapping of key path to storage class")
        for key, child_cls in storage_cls_map.items():
            if not (isinstance(child_cls, type) and issubclass(child_cls, SpaceStorage)):
                raise TypeError(f"storage_cls_map[{key!r}] must be a SpaceStorage class, got {child_cls!r}")
        keys = list(storage_cls_map)
        cls._check_key_kwargs(key_kwargs, keys)
        groups = {str(k): list(v) for k, v in (groups or {}).items()}
        routes = route_space(single_instance_space, keys, groups, nested_separator)
        paths = {r.key: child_relative_path(r.key, storage_cls_map[r.key], nested_separator) for r in routes}
        if len(set(paths.values())) != len(paths):
            raise ValueError(f"two storage_cls_map keys would share a file name: {paths}")
        if cache_path is not None:
            os.makedirs(cache_path, exist_ok=True)
        children: Dict[str, SpaceStorage] = {}
        try:
            for r in routes:
                child_cls = storage_cls_map[r.key]
                child_path = None if cache_path is None else os.path.join(os.fspath(cache_path), paths[r.key])
                children[r.key] = child_cls.create(
                    r.space, *args, capacity=capacity, cache_path=child_path, multiprocessing=multiprocessing,
                    **cls._merged_kwargs(r.key, child_cls, kwargs, type_kwargs, key_kwargs))
            st = cls(single_instance_space, children, nested_separator=nested_separator, groups=groups,
                     storage_paths=paths, cache_filename=cache_path)
        except BaseException:
            for child in children.values():
                try:
                    child.close()
                except Exception:  # noqa: BLE001 - cleanup after the real error
                    pass
            raise
        st._owns_children = True
        if cache_path is not None:
            st._write_metadata(cache_path)
        return st

    @classmethod
    def load_from(cls, path: PathLike, single_instance_space: Space, *, capacity: Optional[int] = None,
                  read_only: bool = True, multiprocessing: bool = False,
                  key_kwargs: Mapping[str, Mapping[str, Any]] = {}, type_kwargs: Mapping[Any, Mapping[str, Any]] = {},
                  **kwargs: Any) -> "DictStorage":
        """Opens a directory written by `dumps` (this library's or the reference's); see the class docstring."""
        path = os.fspath(path)
        if not os.path.isdir(path):
            raise FileNotFoundError(f"DictStorage directory not found: {path}")
        meta_path = os.path.join(path, METADATA_FILE)
        meta = read_json(meta_path, "DictStorage metadata")
        check_format_version(meta, meta_path)
        require_fields(meta, ("storage_type", "storage_map"), meta_path)
        if meta["storage_type"] != "DictStorage":
            raise StorageFormatError(f"{meta_path}: storage_type is {meta['storage_type']!r}, expected 'DictStorage'")
        sep = meta.get("nested_separator", "/")
        if not isinstance(sep, str) or not sep:
            raise StorageFormatError(f"{meta_path}: invalid nested_separator {sep!r}")
        smap = meta["storage_map"]
        if not isinstance(smap, dict) or not smap:
            raise StorageFormatError(f"{meta_path}: 'storage_map' must be a non-empty object")
        entries: Dict[str, Tuple[Type[SpaceStorage], str, str]] = {}
        for key, entry in smap.items():
            if not isinstance(entry, dict) or "type" not in entry or "path" not in entry:
                raise StorageFormatError(f"{meta_path}: storage_map[{key!r}] must be an object with 'type' and 'path'")
            child_cls = resolve_storage_class(entry["type"], f"{meta_path} storage_map[{key!r}]")
            if not (isinstance(child_cls, type) and issubclass(child_cls, SpaceStorage)):
                raise StorageFormatError(f"{meta_path}: storage_map[{key!r}] type {entry['type']!r} is not a storage")
            full = confined_path(path, entry["path"], f"{meta_path} storage_map[{key!r}]")
            entries[key] = (child_cls, entry["path"], full)
        groups_raw = meta.get("groups", {})
        if not isinstance(groups_raw, dict) or not all(
                isinstance(v, list) and all(isinstance(p, str) for p in v) for v in groups_raw.values()):
            raise StorageFormatError(f"{meta_path}: 'groups' must map names to lists of key paths")
        stored_cap = meta.get("capacity", None)
        if capacity is not None and "capacity" in meta and stored_cap != capacity:
            raise ValueError(f"{path} was written with capacity {stored_cap}, not {capacity}: pass "
                             f"capacity={stored_cap} or omit it")
        if "space" in meta:
            _check_stored_space(meta["space"], single_instance_space, path, meta_path, sep)
        keys = list(entries)
        cls._check_key_kwargs(key_kwargs, keys)
        routes = route_space(single_instance_space, keys, groups_raw, sep)
        children: Dict[str, SpaceStorage] = {}
        try:
            for r in routes:
                child_cls, _rel, full = entries[r.key]
                children[r.key] = child_cls.load_from(
                    full, r.space, capacity=capacity, read_only=read_only, multiprocessing=multiprocessing,
                    **cls._merged_kwargs(r.key, child_cls, kwargs, type_kwargs, key_kwargs))
            all_cached = all(c.cache_filename is not None for c in children.values())
            st = cls(single_instance_space, children, nested_separator=sep, groups=groups_raw,
                     storage_paths={k: v[1] for k, v in entries.items()}, cache_filename=path if all_cached else None)
        except BaseException:
            for child in children.values():
                try:
                    child.close()
                except Exception:  # noqa: BLE001 - cleanup after the real error
                    pass
            raise
        st._owns_children = True
        st._reconcile_segments()
        return st

    def _reconcile_segments(self) -> None:
        """Keeps only the segments every child recorded (the others were not fully committed everywhere)."""
        logs = [(c, c.get_segments()) for c in self._storages]
        known = [(c, segs) for c, segs in logs if segs is not None]
        if len(known) < 2:
            return
        common = set(known[0][1] or [])
        for _c, segs in known[1:]:
            common &= set(segs or [])
        cap = self.capacity
        for c, segs in known:
            for s, e in segs or []:
                if (s, e) not in common:
                    n = (e - s) % cap + 1 if cap else e - s + 1
                    c.forget_segments(s, n)

    # ------------------------------------------------------------------ properties
    @property
    def storages(self) -> Dict[str, SpaceStorage]:
        """The children by storage-map key (a copy of the mapping)."""
        return dict(self._by_key)

    @property
    def storage_paths(self) -> Dict[str, str]:
        """Each child's file or directory name relative to the storage directory."""
        return dict(self._paths)

    @property
    def groups(self) -> Dict[str, List[str]]:
        return {k: list(v) for k, v in self._groups.items()}

    @property
    def capacity(self) -> Optional[int]:
        return self._storages[0].capacity

    def __len__(self) -> int:
        return len(self._storages[0])

    @property
    def cache_filename(self) -> Optional[Union[str, PathLike]]:
        if self._cache_filename is None or any(c.cache_filename is None for c in self._storages):
            return None
        return self._cache_filename

    @property
    def is_mutable(self) -> bool:
        return all(c.is_mutable for c in self._storages)

    @property
    def is_multiprocessing_safe(self) -> bool:
        return all(c.is_multiprocessing_safe for c in self._storages)

    def get_column(self, nested_keys: Union[str, Sequence[str]]) -> SpaceStorage:
        """The child storage of a storage-map key (a path string, or a sequence of keys joined with the separator)."""
        key = nested_keys if isinstance(nested_keys, str) else self.nested_separator.join(map(str, nested_keys))
        try:
            return self._by_key[key]
        except KeyError:
            raise KeyError(f"no child storage under key {key!r}; the storage map has {list(self._by_key)}") from None

    def __repr__(self) -> str:
        kids = ", ".join(f"{k!r}: {type(c).__name__}" for k, c in self._by_key.items())
        return f"DictStorage({{{kids}}}, capacity={self.capacity if not self._closed else '?'})"

    # ------------------------------------------------------------------ structure checks
    def _check_structure(self, value: Any) -> None:
        """KeyError naming missing / extra keys, TypeError where a dict was expected (before anything is written)."""
        if self._flat_space:
            if type(value) is not dict and not isinstance(value, Mapping):
                raise TypeError(f"expected a dict with keys {sorted(self._root_keys)}, got {type(value).__name__}")
            if value.keys() != self._root_keys:
                self._key_error(value, (), self._root_keys)
            return
        for path, keyset in self._dict_nodes:
            v = value
            for p in path:
                v = v[p]
            if not isinstance(v, Mapping):
                where = f" at {_join(path, self.nested_separator)!r}" if path else ""
                raise TypeError(f"expected a dict{where} with keys {sorted(keyset)}, got {type(v).__name__}")
            if v.keys() != keyset:
                self._key_error(v, path, keyset)

    def _key_error(self, value: Mapping, path: Path, expected: frozenset) -> None:
        at = f" under {_join(path, self.nested_separator)!r}" if path else ""
        missing = sorted(map(str, expected - set(value.keys())))
        if missing:
            raise KeyError(f"missing key(s) {missing}{at}: the space expects {sorted(expected)}")
        extra = sorted(map(str, set(value.keys()) - expected))
        raise KeyError(f"unexpected key(s) {extra}{at}: the space expects {sorted(expected)} "
                       "(extra keys are never dropped silently)")

    # ------------------------------------------------------------------ reads
    def get(self, index: Any) -> Any:
        """Sample(s) at `index` as a dict in the space's key order (copies); an int-like index gives one sample."""
        self._check_open()
        if not (type(index) is int or isinstance(index, (slice, np.ndarray)) or index is Ellipsis):
            index = normalize_index(index, len(self), type(self).__name__).numpy_key()
        return self._assemble([c.get(index) for c in self._storages])

    def get_flattened(self, index: Any) -> Any:
        """The sample(s) at `index` flattened like `flatten_data` of the whole space (promoted row dtype)."""
        self._check_open()
        data = self.get(index)
        if is_single_index(index):
            return flatten_data(self.single_instance_space, data)
        n = batch_utils.batch_size_data(data)
        return flatten_data(batch_utils.batch_space(self.single_instance_space, n), data, start_dim=1)

    # ------------------------------------------------------------------ writes
    def _stage_set(self, key: Any, lead: Tuple[int, ...], value: Any) -> _Commit:
        self._check_writable()
        self._check_structure(value)
        commits = []
        for i in self._write_order:
            commits.append(_stage_set(self._storages[i], key, lead, self._extractors[i](value)))
        return partial(_run_all, commits)

    def set(self, index: Any, value: Any) -> None:
        """Checks the whole sample (keys, then every child's value) and writes it at `index`; on any error no child
        is written."""
        self._check_writable()
        norm = normalize_index(index, len(self), type(self).__name__)
        lead = () if norm.single is not None else (norm.count(),)
        self._stage_set(norm.numpy_key(), lead, value)()

    def set_flattened(self, index: Any, value: Any) -> None:
        """Writes flat rows (`flatten_data` layout of the whole space); a row whose columns do not read back to the
        same values (fractions into int leaves, non-0/1 into bool leaves, ...) is refused."""
        self._check_writable()
        norm = normalize_index(index, len(self), type(self).__name__)
        b = self.backend
        flat = value if b.is_backendarray(value) else b.from_numpy(np.asarray(value), device=self.device)
        width = int(flatten_space(self.single_instance_space).shape[0])
        expected = (width,) if norm.single is not None else (norm.count(), width)
        if tuple(flat.shape) != expected:
            raise ValueError(f"expected flat rows of shape {expected}, got {tuple(flat.shape)}")
        if norm.single is not None:
            space: Space = self.single_instance_space
            start_dim = 0
        else:
            space, start_dim = batch_utils.batch_space(self.single_instance_space, norm.count()), 1
        data = unflatten_data(space, flat, start_dim)
        back = np.asarray(b.to_numpy(flatten_data(space, data, start_dim)))
        given = np.asarray(b.to_numpy(flat))
        same = (back == given) | (np.isnan(back) & np.isnan(given)) if given.dtype.kind == "f" else back == given
        if not np.all(same):
            col = int(np.argwhere(~same)[0][-1])
            raise ValueError(f"flat column {col} holds a value that is not valid for its key (it would not read back "
                             "unchanged); convert the data explicitly")
        self._stage_set(norm.numpy_key(), () if norm.single is not None else (norm.count(),), data)()

    def _prepare_single(self, value: Any) -> Any:
        """Checks one sample for every child (nothing is written) and returns a copy of it (so a buffering writer
        keeps a snapshot); `_stack_prepared` / `_set_prepared` are the defaults (stack, then `set`)."""
        self._check_structure(value)
        for (stage, extract), i in zip(self._append_stages, self._write_order):
            child, part = self._storages[i], extract(value)
            if isinstance(child, DictStorage):
                child._prepare_single(part)  # its append stage also checks the segment state
            else:
                stage(part)
        return _copy_tree(value)

    # ------------------------------------------------------------------ segments
    def _stage_append_parts(self, value: Any) -> List[Any]:
        """Checks one sample for every child (state, keys, values) without writing; returns the children's payloads."""
        if self._closed or not self._all_mutable:
            self._check_writable()
        first = self._storages[0]
        if not first.has_open_segment:
            raise StorageStateError(f"Cannot append to {type(self).__name__} without an open segment; call "
                                    "mark_segment_start(start) first")
        cap = first.capacity
        if cap is not None and first.pending_segment_length >= cap:
            raise ValueError(f"the open segment already holds {cap} rows = the capacity {cap}; one more would "
                             "overwrite its own first row")
        self._check_structure(value)
        return [stage(extract(value)) for stage, extract in self._append_stages]

    def _commit_append_parts(self, payloads: List[Any]) -> None:
        for commit, payload in zip(self._append_commits, payloads):
            commit(payload)

    def append(self, value: Any) -> None:
        """Checks one sample for every child, then writes it at the open segment's next row in each child."""
        self._commit_append_parts(self._stage_append_parts(value))

    @property
    def has_open_segment(self) -> bool:
        states = [c.has_open_segment for c in self._storages]
        if any(s != states[0] for s in states):
            raise StorageStateError(f"DictStorage children disagree on whether a segment is open: "
                                    f"{dict(zip(self._by_key, states))}")
        return states[0]

    @property
    def pending_segment_length(self) -> int:
        return max(c.pending_segment_length for c in self._storages)

    def mark_segment_start(self, start_index: int) -> None:
        """Opens an append-built segment at `start_index` in every child."""
        self._check_writable()
        if self.has_open_segment:
            raise StorageStateError("a segment is already open; call mark_segment_end() or abort_segment() first")
        start = self._normalize_segment_start(start_index)
        for c in self._storages:
            c.mark_segment_start(start)

    def mark_segment_end(self) -> None:
        self._check_open()
        for c in self._storages:
            c.mark_segment_end()

    def abort_segment(self) -> None:
        self._check_open()
        for c in self._storages:
            c.abort_segment()

    def get_segments(self) -> Optional[List[Tuple[int, int]]]:
        """The segments every child records (they must agree; children keeping no segment information are
        ignored); None when no child keeps any."""
        self._check_open()
        found: Dict[str, List[Tuple[int, int]]] = {}
        for key, c in self._by_key.items():
            segs = c.get_segments()
            if segs is not None:
                found[key] = [tuple(s) for s in segs]  # type: ignore[misc]
        if not found:
            return None
        values = list(found.values())
        if any(v != values[0] for v in values[1:]):
            raise StorageStateError(f"DictStorage children record different segments: {found}")
        return list(values[0])

    def forget_segments(self, start: int, length: int) -> None:
        self._check_open()
        for c in self._storages:
            c.forget_segments(start, length)

    def _record_segment(self, start: int, length: int) -> None:
        for c in self._storages:
            _record_in(c, start, length)

    def open_segment_writer(self) -> SegmentWriter:
        """A writer holding one writer per child; `commit(start)` commits every child at `start`."""
        self._check_writable()
        return _DictSegmentWriter(self)

    # ------------------------------------------------------------------ size
    def extend_length(self, length: int) -> None:
        self._check_writable()
        for c in self._storages:
            c.extend_length(length)

    def shrink_length(self, length: int) -> None:
        self._check_writable()
        for c in self._storages:
            c.shrink_length(length)

    def clear(self) -> None:
        """Clears every child (aborts the open segment, forgets segments, resets or empties rows)."""
        self._check_writable()
        for c in self._storages:
            c.clear()

    # ------------------------------------------------------------------ persistence
    def _metadata(self) -> Dict[str, Any]:
        meta: Dict[str, Any] = {
            "storage_type": "DictStorage", "format_version": FORMAT_VERSION,
            "storage_map": {r.key: {"type": storage_type_name(type(c)), "path": self._paths[r.key]}
                            for r, c in zip(self._routes, self._storages)},
            "nested_separator": self.nested_separator, "capacity": self._storages[0].capacity,
        }
        if self._groups:
            meta["groups"] = {k: list(v) for k, v in self._groups.items()}
        try:
            meta["space"] = space_to_json(self.single_instance_space)
        except (TypeError, ValueError):
            pass
        return meta

    def _write_metadata(self, path: Union[str, PathLike]) -> None:
        atomic_write_json(os.path.join(os.fspath(path), METADATA_FILE), self._metadata())

    def flush(self) -> None:
        """Makes what the children hold durable in their files (data first), then writes the metadata."""
        self._check_open()
        for c in self._storages:
            flush = getattr(c, "flush", None)
            if flush is not None:
                flush()
        if self._cache_filename is not None and self.is_mutable:
            self._write_metadata(self._cache_filename)

    def dumps(self, path: PathLike) -> None:
        """Makes `path`, dumps every child to `<path>/<child path>`, then writes the metadata (atomically)."""
        self._check_open()
        os.makedirs(path, exist_ok=True)
        for r, c in zip(self._routes, self._storages):
            c.dumps(os.path.join(os.fspath(path), self._paths[r.key]))
        self._write_metadata(path)

    def close(self) -> None:
        """Closes the children this object created or loaded; idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._owns_children:
            errors = []
            for c in self._storages:
                try:
                    c.close()
                except Exception as exc:  # noqa: BLE001 - close the others, then report
                    errors.append(exc)
            if errors:
                raise errors[0]

    def __getstate__(self) -> Dict[str, Any]:
        self._check_open()
        return {"space": self.single_instance_space, "children": dict(self._by_key), "sep": self.nested_separator,
                "groups": self._groups, "paths": self._paths, "cache": self._cache_filename,
                "owns": self._owns_children}

    def __setstate__(self, state: Dict[str, Any]) -> None:
        DictStorage.__init__(self, state["space"], state["children"], nested_separator=state["sep"],
                             groups=state["groups"], storage_paths=state["paths"], cache_filename=state["cache"])
        self._owns_children = state["owns"]


def _copy_tree(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _copy_tree(v) for k, v in value.items()}
    if isinstance(value, np.ndarray):
        return value.copy()
    clone = getattr(value, "clone", None)
    return clone() if callable(clone) else value


def _brief(space: Any) -> str:
    try:
        return str(space.get_repr(True, False, False))
    except Exception:  # noqa: BLE001 - a description only
        return type(space).__name__


def _getitem(value: Any, key: str) -> Any:
    return value[key]


def _pick_under(value: Any, pick: Callable[[Any], Any], path: Path) -> Any:
    return pick(_dig(value, path))


def _run_all(commits: List[_Commit]) -> None:
    for commit in commits:
        commit()


def _check_stored_space(js: Any, space: Space, path: str, meta_path: str, sep: str) -> None:
    """ValueError naming the differences when the given space is not the one the data was written with."""
    try:
        stored = json_to_space(js, space.backend, space.device)
    except (ValueError, TypeError, KeyError) as exc:
        raise StorageFormatError(f"{meta_path}: stored space is malformed: {exc}") from None
    if stored == space:
        return
    s_leaves = {_join(p, sep): _node_at(stored, p) for p in _leaf_paths(stored, sep)} if isinstance(stored, DictSpace) else {}
    g_leaves = {_join(p, sep): _node_at(space, p) for p in _leaf_paths(space, sep)} if isinstance(space, DictSpace) else {}
    parts = []
    missing = sorted(set(s_leaves) - set(g_leaves))
    added = sorted(set(g_leaves) - set(s_leaves))
    if missing:
        parts.append(f"stored keys missing from the space: {missing}")
    if added:
        parts.append(f"space keys not in the stored data: {added}")
    for k in sorted(set(s_leaves) & set(g_leaves)):
        a, b = s_leaves[k], g_leaves[k]
        if a != b:
            parts.append(f"key {k!r}: stored {_brief(a)}, given {_brief(b)}")
    raise ValueError(f"the space does not match the one stored in {path}: {'; '.join(parts) or 'they differ'}")


__all__ = ["DictStorage", "METADATA_FILE", "route_space", "child_relative_path"]
