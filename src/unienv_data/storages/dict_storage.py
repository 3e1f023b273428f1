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

Children are written only through the staging protocol of `SpaceStorage` (`stage_set`, `stage_append`,
`open_staged_writer`: check now, write when called), never through the internals of particular storage types; see
`_dict_staging`. A child type without its own staging gets the `SpaceStorage` defaults, which check what they can
(`prepare_element`, or the Box / Binary conversion rules) and are staged and written before the other children, so
a value such a child still refuses when written leaves the others untouched too. Routing (which child holds which
leaves, how a sample is split and reassembled) lives in `_dict_routing`.

Segments live in the children: every segment operation goes through all of them, so they record the same
segments; `get_segments` checks that they agree. On `load_from`, segments that only some children recorded (a
crash between two children's metadata writes) are forgotten, keeping those every child holds.
"""
from __future__ import annotations

from unienv_interface.backends.base import BArrayType, BDeviceType, BDtypeType, BRNGType
import os
from collections.abc import Mapping
from functools import partial
from types import MappingProxyType
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple, Type, Union

import numpy as np

from unienv_data.base.errors import StorageFormatError, StorageStateError
from unienv_data.base.files import (FORMAT_VERSION, PathLike, atomic_write_json, check_format_version,
                                    check_no_interrupted_dump, confined_path, dump_transaction, read_json,
                                    remove_if_present, require_fields)
from unienv_data.base.indexing import is_single_index, normalize_index
from unienv_data.base.registry import register_storage, resolve_storage_class, storage_type_name
from unienv_data.base.segment_writer import SegmentWriter
from unienv_data.base.storage import SpaceStorage
from unienv_interface.space import DictSpace, Space, TupleSpace
from unienv_interface.space.space_utils import batch_utils
from unienv_interface.space.space_utils.flatten_utils import flatten_data, flatten_space, unflatten_data
from unienv_interface.space.space_utils.serialization_utils import space_to_json

from ._commit_log import DICT_LOG_FILE, LeafCommitLog, adopt_log
from ._dict_routing import (assembler, check_stored_space, child_relative_path, describe_space, extractor, join_path,
                            route_space)
from ._dict_staging import Commit, DictSegmentWriter, Stager, StructureCheck, children_commit, run_all

METADATA_FILE = "dict_storage_metadata.json"


@register_storage
class DictStorage(SpaceStorage[Dict[str, Any], BArrayType, BDeviceType, BDtypeType, BRNGType]):
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

    Children must agree on capacity and length. The one exception is a growable storage reopened after a process
    died between two children's commits: the rows every child has persisted are the committed ones; a writable
    `load_from` trims the longer children's uncommitted tail, a read-only one hides it. `get` returns the sample in the space's key order; `get_column(key)`
    returns the child storage of a storage-map key. Closing closes the children this object created or loaded
    (`owns_children=True`, which `create` / `load_from` pass); garbage collection never closes children. With
    `commit_log=True` (`create` / `load_from` in one process) a writable storage with a `cache_filename` keeps one
    commit record for the children whose only per-commit state is their length and segments (`_commit_log`).
    Pickles (for worker processes) by pickling its children.
    """

    forwards_load_options = True  # `load_from` passes extra options on to every child's

    single_file_ext: Optional[str] = None

    def __init__(self, single_instance_space: Space, storages: Mapping[str, SpaceStorage], *,
                 nested_separator: str = "/", groups: Optional[Mapping[str, Sequence[str]]] = None,
                 storage_paths: Optional[Mapping[str, str]] = None,
                 cache_filename: Optional[Union[str, PathLike]] = None,
                 committed_length: Optional[int] = None, owns_children: bool = False,
                 commit_log: bool = False) -> None:
        if not isinstance(storages, Mapping) or not storages:
            raise ValueError("DictStorage needs at least one child storage (a mapping of key to storage)")
        groups = {str(k): list(v) for k, v in (groups or {}).items()}
        routes = route_space(single_instance_space, list(storages), groups, nested_separator)
        children = [storages[r.key] for r in routes]
        for r, child in zip(routes, children):
            if not isinstance(child, SpaceStorage):
                raise TypeError(f"child {r.key!r} must be a SpaceStorage, got {type(child).__name__}")
            if child.single_instance_space != r.space:
                raise ValueError(f"child {r.key!r} stores {describe_space(child.single_instance_space)}, but the "
                                 f"space at that key is {describe_space(r.space)}")
        caps = {r.key: c.capacity for r, c in zip(routes, children)}
        if len(set(caps.values())) != 1:
            raise ValueError(f"DictStorage children must share one capacity, got {caps}")
        lens = {r.key: len(c) for r, c in zip(routes, children)}
        self._committed_length: Optional[int] = None
        if len(set(lens.values())) != 1:
            # only a growable storage reopened read-only after a crash may hold an uncommitted tail in some
            # children (see `_committed_children_length`); everything else must agree exactly
            if (committed_length is None or next(iter(caps.values())) is not None
                    or min(lens.values()) != committed_length):
                raise ValueError(f"DictStorage children must have the same length, got {lens}")
            self._committed_length = int(committed_length)
        super().__init__(single_instance_space)
        self.nested_separator = nested_separator
        self._groups = groups
        self._routes = routes
        self._storages: List[SpaceStorage] = children
        self._by_key: Dict[str, SpaceStorage] = {r.key: c for r, c in zip(routes, children)}
        #: the child storage of every key (or group), as the reference names it; read it, do not replace children
        self.storage_map: Mapping[str, SpaceStorage] = MappingProxyType(self._by_key)
        paths = dict(storage_paths or {})
        self._paths: Dict[str, str] = {
            r.key: paths.get(r.key) or child_relative_path(r.key, type(c), nested_separator)
            for r, c in zip(routes, children)}
        if len(set(self._paths.values())) != len(self._paths):
            raise ValueError(f"two children would share a file name: {self._paths}")
        self._cache_filename = cache_filename
        self._owns_children = owns_children
        for r, child in zip(routes, children):
            if not isinstance(r.space, (DictSpace, TupleSpace)):     # one leaf: errors name its key path
                child.set_value_label(f"key {join_path(r.leaves[0] if r.leaves else r.root, nested_separator)!r}")
        self._log: Optional[LeafCommitLog] = None    # the commit log (see `_commit_log`), when writing one
        self._compile()
        if commit_log:
            self._start_log()

    # ------------------------------------------------------------------ compiled access plans
    def _compile(self) -> None:
        self._assemble = assembler(self.single_instance_space, self._routes)
        check = StructureCheck(self.single_instance_space, self.nested_separator).check
        self._stager = Stager(self, self._storages, [extractor(r) for r in self._routes], check)
        self._staged_appends = self._stager.stage_append

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
                     storage_paths=paths, cache_filename=cache_path, owns_children=True,
                     commit_log=not multiprocessing)
        except BaseException:
            _close_all(children.values(), quiet=True)
            raise
        if cache_path is not None:
            st.write_metadata(cache_path)
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
        check_no_interrupted_dump(path, "DictStorage")
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
        root_real = os.path.realpath(path)
        for key, entry in smap.items():
            if not isinstance(entry, dict) or "type" not in entry or "path" not in entry:
                raise StorageFormatError(f"{meta_path}: storage_map[{key!r}] must be an object with 'type' and 'path'")
            child_cls = resolve_storage_class(entry["type"], f"{meta_path} storage_map[{key!r}]")
            if not (isinstance(child_cls, type) and issubclass(child_cls, SpaceStorage)):
                raise StorageFormatError(f"{meta_path}: storage_map[{key!r}] type {entry['type']!r} is not a storage")
            full = confined_path(path, entry["path"], f"{meta_path} storage_map[{key!r}]", root_real)
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
            check_stored_space(meta["space"], single_instance_space, path, meta_path, sep)
        keys = list(entries)
        cls._check_key_kwargs(key_kwargs, keys)
        try:
            routes = route_space(single_instance_space, keys, groups_raw, sep)
        except (KeyError, ValueError, TypeError) as exc:
            if "space" not in meta:
                raise               # no stored space: the caller's space may be the one that does not fit
            # the space is the stored one (checked above): the storage map or the groups themselves are damaged
            raise StorageFormatError(f"{meta_path}: 'storage_map' / 'groups' do not fit the stored space "
                                     f"({exc.args[0] if exc.args else exc})") from None
        children: Dict[str, SpaceStorage] = {}
        try:
            for r in routes:
                child_cls, _rel, full = entries[r.key]
                children[r.key] = child_cls.load_from(
                    full, r.space, capacity=capacity, read_only=read_only, multiprocessing=multiprocessing,
                    **cls._merged_kwargs(r.key, child_cls, kwargs, type_kwargs, key_kwargs))
            log_path = os.path.join(path, DICT_LOG_FILE)    # newer than its leaves' own files after a crash: it wins
            adopt_log(log_path, stored_cap if "capacity" in meta else None,
                      [(f"{log_path} (child {key!r})", leaf) for key, leaf in
                       ((key, c.commit_log_leaf()) for key, c in children.items()) if leaf is not None])
            committed = _committed_children_length(children)
            if committed is not None and all(c.is_mutable for c in children.values()):
                for c in children.values():     # a writable open trims the uncommitted tail
                    if len(c) > committed:
                        c.shrink_length(len(c) - committed)
                committed = None
            _reconcile_segments(list(children.values()))
            all_cached = all(c.cache_filename is not None for c in children.values())
            st = cls(single_instance_space, children, nested_separator=sep, groups=groups_raw,
                     storage_paths={k: v[1] for k, v in entries.items()}, cache_filename=path if all_cached else None,
                     committed_length=committed, owns_children=True, commit_log=not multiprocessing)
        except BaseException:
            _close_all(children.values(), quiet=True)
            raise
        return st

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
        if self._committed_length is not None:
            return self._committed_length
        return len(self._storages[0])

    def child_lengths(self) -> Dict[str, int]:
        """Each child's own length by its file or directory name (they differ only in a growable storage reopened
        read-only after a crash: rows past `len(self)` are an uncommitted tail that is never read)."""
        return {self._paths[r.key]: len(c) for r, c in zip(self._routes, self._storages)}

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
        """The child storage of a storage-map key (a path string, or a sequence of keys joined with the separator),
        or a `FieldView` of a key held inside one child: a leaf of a group such as the native layout's `@float32`
        (`get_column("action")`), or a key below a child's key (`"obs/pos"` of a child `"obs"`)."""
        from ._field_view import FieldView, field_space
        sep = self.nested_separator
        key = nested_keys if isinstance(nested_keys, str) else sep.join(map(str, nested_keys))
        if key in self._by_key:
            return self._by_key[key]
        def under(p: str) -> bool:
            return p == key or p.startswith(key + sep)

        holders = [name for name, paths in self._groups.items() if any(under(p) for p in paths)]
        holders += [name for name in self._by_key if name not in self._groups and under(name)]
        if len(holders) == 1 and holders[0] in self._groups:      # the whole key lives inside one group
            name = holders[0]
            if field_space(self._by_key[name].single_instance_space, key.split(sep)) is not None:
                return FieldView(self._by_key[name], key.split(sep))
        for name, child in self._by_key.items():
            if name not in self._groups and key.startswith(name + sep):
                rest = key[len(name) + len(sep):].split(sep)
                if field_space(child.single_instance_space, rest) is not None:
                    return FieldView(child, rest)
        raise KeyError(f"no column {key!r}: it is neither a child storage of the storage map {list(self._by_key)} "
                       f"nor a key inside one (groups: {self.groups})")

    def __repr__(self) -> str:
        kids = ", ".join(f"{k!r}: {type(c).__name__}" for k, c in self._by_key.items())
        return f"DictStorage({{{kids}}}, capacity={self.capacity if not self._closed else '?'})"

    # ------------------------------------------------------------------ reads
    def get(self, index: Any) -> Any:
        """Sample(s) at `index` as a dict in the space's key order (copies); an int-like index gives one sample."""
        self._check_open()
        if self._committed_length is not None or not (
                type(index) is int or isinstance(index, (slice, np.ndarray)) or index is Ellipsis):
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

    # ------------------------------------------------------------------ writes (staged: see _dict_staging)
    @property
    def staging_checks_all(self) -> bool:
        return all(c.staging_checks_all for c in self._storages)

    def stage_set(self, index: Any, value: Any) -> Commit:
        """Checks the whole sample or batch for `set(index, ...)` (keys, then every child's part) without writing;
        returns the writes."""
        self.check_writable()
        return self._stager.stage_set(self._stage_index(index), value)

    def set(self, index: Any, value: Any) -> None:
        """Checks the whole sample (keys, then every child's value) and writes it at `index`; on any error no child
        is written."""
        self.stage_set(index, value)()

    def set_flattened(self, index: Any, value: Any) -> None:
        """Writes flat rows (`flatten_data` layout of the whole space); a row whose columns do not read back to the
        same values (fractions into int leaves, non-0/1 into bool leaves, ...) is refused."""
        self.check_writable()
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
        self._stager.stage_set(norm, data)()

    def prepare_element(self, value: Any) -> Any:
        """Checks one sample for every child (nothing is written, no segment state involved) and returns a copy of
        it (so a buffering writer keeps a snapshot); `stack_prepared` / `set_prepared` are the defaults (stack,
        then `set`)."""
        return self._stager.prepare_single(value)

    # ------------------------------------------------------------------ segments
    def stage_append(self, value: Any) -> Commit:
        """Checks one sample for every child (state, keys, values) without writing; returns the appends."""
        return partial(run_all, self._staged_appends(value))

    def append(self, value: Any) -> None:
        """Checks one sample for every child, then writes it at the open segment's next row in each child."""
        for commit in self._staged_appends(value):
            commit()

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
        self.check_writable()
        if self.has_open_segment:
            raise StorageStateError("a segment is already open; call mark_segment_end() or abort_segment() first")
        start = self.normalize_segment_start(start_index)
        for c in self._storages:
            c.mark_segment_start(start)

    def _each_child(self, method: str, *args: Any, write: bool = False) -> None:
        """Checks this storage (open, or writable with `write`), then calls `method(*args)` on every child."""
        if write:
            self.check_writable()
        else:
            self._check_open()
        for c in self._storages:
            getattr(c, method)(*args)

    def mark_segment_end(self) -> None:
        """Ends the open segment in every child, then persists them at one commit point (when durable)."""
        self._check_open()
        if not self.has_open_segment:
            return
        with children_commit(self._storages):
            for c in self._storages:
                c.mark_segment_end()
        self.on_segment_committed()

    def abort_segment(self) -> None:
        self._each_child("abort_segment")

    def get_segments(self) -> Optional[List[Tuple[int, int]]]:
        """The children's `get_segments()` (they must agree; children returning None are ignored, as in unienv
        0.0.1b16); None when every child returns None."""
        return self._children_segments("get_segments")

    def episode_segments(self) -> Optional[List[Tuple[int, int]]]:
        """The segments every child records (`episode_segments()`; they must agree; children keeping no segment
        information are ignored); None when no child keeps any."""
        return self._children_segments("episode_segments")

    def episode_runs(self) -> Optional[List[Tuple[int, int]]]:
        """The runs every child records (`episode_runs()`; they must agree); None when no child keeps any."""
        return self._children_segments("episode_runs")

    def _children_segments(self, method: str) -> Optional[List[Tuple[int, int]]]:
        self._check_open()
        found: Dict[str, List[Tuple[int, int]]] = {}
        for key, c in self._by_key.items():
            segs = getattr(c, method)()
            if segs is not None:
                found[key] = list(map(tuple, segs))  # type: ignore[arg-type]
        if not found:
            return None
        values = list(found.values())
        if any(v != values[0] for v in values[1:]):
            raise StorageStateError(f"DictStorage children record different segments: {found}")
        return list(values[0])

    def forget_segments(self, start: int, length: int) -> None:
        self._each_child("forget_segments", start, length)

    def has_persistent_segments(self) -> bool:
        # every child persists its own list: their reconciled lists (not an owner's copy) are authoritative
        return bool(self._storages) and all(c.has_persistent_segments() for c in self._storages)

    def record_segment(self, start: int, length: int) -> None:
        for c in self._storages:
            c.record_segment(start, length)

    def child_storages(self) -> List[SpaceStorage]:
        return list(self._storages)

    def persist_committed(self) -> None:
        for c in self._storages:          # the children hold the rows and the segments; this metadata is static
            c.persist_committed()
        if self._log is not None:
            self._log.compact()

    def on_segment_committed(self) -> None:
        """The commit point of a segment recorded in every child: children that persist themselves do so, then
        (with a commit log) one record covers the others; it is written after every child's rows, so it is the
        commit. Without a log every child persists itself."""
        if not self._durable:
            return
        if self._log is None:
            self.persist_committed()
            return
        for c in self._storages:
            if c.commit_log_leaf() is None:
                c.persist_committed()
        self._log.record_commit()

    # ------------------------------------------------------------------ commit log (see _commit_log)
    def _log_leaves(self) -> List[SpaceStorage]:
        return [leaf for leaf in (c.commit_log_leaf() for c in self._storages) if leaf is not None]

    def _start_log(self) -> None:
        """Starts the commit log of a writable storage in its own directory (when a child can use it): the base
        record is the current state, and the children's dropped segments are recorded in it from now on (a log a
        child keeps of its own for the same leaf is retired: this one holds the leaf's state)."""
        leaves = self._log_leaves()
        if self._cache_filename is None or not leaves or not self.is_mutable:
            return
        self._log = LeafCommitLog(self._cache_filename, DICT_LOG_FILE, leaves)

    def open_segment_writer(self) -> SegmentWriter:
        """A writer holding one writer per child; `commit(start)` commits every child at `start`."""
        self.check_writable()
        return DictSegmentWriter(self, self._stager)

    def open_staged_writer(self) -> Tuple[SegmentWriter, Callable[[Any], Commit]]:
        writer = DictSegmentWriter(self, self._stager)
        return writer, writer.stage

    # ------------------------------------------------------------------ size
    def extend_length(self, length: int) -> None:
        self._each_child("extend_length", length, write=True)

    def shrink_length(self, length: int) -> None:
        self._each_child("shrink_length", length, write=True)

    def clear(self) -> None:
        """Clears every child (aborts the open segment, forgets segments, resets or empties rows)."""
        self._each_child("clear", write=True)

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

    def write_metadata(self, path: Union[str, PathLike]) -> None:
        """Writes this storage's own metadata file into the directory `path`, atomically (the children write their
        own)."""
        atomic_write_json(os.path.join(os.fspath(path), METADATA_FILE), self._metadata())

    def flush(self) -> None:
        """Makes what the children hold durable in their files (data first), then writes the metadata."""
        self._check_open()
        for c in self._storages:
            flush = getattr(c, "flush", None)
            if flush is not None:
                flush()
        if self._cache_filename is not None and self.is_mutable:
            self.write_metadata(self._cache_filename)
            if self._log is not None:
                self._log.compact()

    def dumps(self, path: PathLike) -> None:
        """Makes `path`, dumps every child to `<path>/<child path>`, then writes the metadata (atomically). A dump
        into another directory is marked while it runs (`dump_transaction`): one killed halfway refuses to load."""
        self._check_open()
        own = self._cache_filename is not None and os.path.abspath(os.fspath(path)) == os.path.abspath(
            os.fspath(self._cache_filename))
        if own:         # its own directory: every child flushes in place
            for r, c in zip(self._routes, self._storages):
                c.dumps(os.path.join(os.fspath(path), self._paths[r.key]))
            self.write_metadata(path)
            if self._log is not None:
                self._log.compact()
            return
        with dump_transaction(path, directory=True):    # a dump killed halfway refuses to load
            # a log left by an earlier storage in that directory must not describe the dumped children
            remove_if_present(os.path.join(os.fspath(path), DICT_LOG_FILE))
            for r, c in zip(self._routes, self._storages):
                c.dumps(os.path.join(os.fspath(path), self._paths[r.key]))
            self.write_metadata(path)

    def close(self) -> None:
        """Closes the children this object created or loaded; idempotent."""
        if self._closed:
            return
        log, self._log = self._log, None
        self._closed = True
        # each child writes its own metadata file; then the log is compacted: the children's files describe them
        close_children = partial(_close_all, self._storages) if self._owns_children else None
        if log is not None:
            log.close(close_children, compact=self._owns_children)
        elif close_children is not None:
            close_children()

    def __getstate__(self) -> Dict[str, Any]:
        self._check_open()
        return {"space": self.single_instance_space, "children": dict(self._by_key), "sep": self.nested_separator,
                "groups": self._groups, "paths": self._paths, "cache": self._cache_filename,
                "owns": self._owns_children, "committed": self._committed_length}

    def __setstate__(self, state: Dict[str, Any]) -> None:
        DictStorage.__init__(self, state["space"], state["children"], nested_separator=state["sep"],
                             groups=state["groups"], storage_paths=state["paths"], cache_filename=state["cache"],
                             committed_length=state.get("committed"), owns_children=state["owns"])


def _committed_children_length(children: Mapping[str, SpaceStorage]) -> Optional[int]:
    """The committed length of growable children that disagree, else None.

    Each child persists its own rows and length when an episode is committed, one child after the other, so a
    process killed between two children leaves some of them one commit longer than the others. What every child
    has persisted (the shortest length) is what was committed; the rows past it are an uncommitted tail, and its
    segments are listed by only some children (`_reconcile_segments` drops them). A fixed-capacity storage has no
    such tail: its children must agree."""
    lens = [len(c) for c in children.values()]
    if len(set(lens)) <= 1 or any(c.capacity is not None for c in children.values()):
        return None
    return min(lens)


def _reconcile_segments(children: Sequence[SpaceStorage]) -> None:
    """Keeps only the segments every child recorded (the others were not fully committed everywhere: a crash
    between two children's commits)."""
    logs = [(c, c.episode_segments()) for c in children]
    known = [(c, segs) for c, segs in logs if segs is not None]
    if len(known) < 2:
        return
    common = set(known[0][1] or [])
    for _c, segs in known[1:]:
        common &= set(segs or [])
    cap = children[0].capacity
    for c, segs in known:
        for s, e in segs or []:
            if (s, e) not in common:
                n = (e - s) % cap + 1 if cap else e - s + 1
                c.forget_segments(s, n)


def _close_all(storages: Iterable[SpaceStorage], quiet: bool = False) -> None:
    """Closes every storage, then raises the first error (none with `quiet`: cleanup after another error)."""
    errors = []
    for c in storages:
        try:
            c.close()
        except Exception as exc:  # noqa: BLE001 - close the others first
            errors.append(exc)
    if errors and not quiet:
        raise errors[0]


__all__ = ["DictStorage", "METADATA_FILE", "route_space", "child_relative_path"]
