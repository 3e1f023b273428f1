"""Key routing of `DictStorage`: which child storage holds which leaves of a `DictSpace`, and how a sample is split
into the children's parts and put back together.

Rules (see `unienv_data.storages.dict_storage` for the user-facing description): an exact key path gives its child
the space at that path; `"*"` / `"prefix/*"` gives its child the residual `DictSpace` of the leaves no other entry
claims under the prefix (deeper wildcards claim first); a *group* gives its child the sub-`DictSpace` of exactly the
listed paths, nested as in the full space. Every leaf must be claimed by exactly one entry.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from operator import itemgetter
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple, Type

from unienv_data.base.errors import StorageFormatError
from unienv_data.base.storage import SpaceStorage
from unienv_interface.space import DictSpace, Space
from unienv_interface.space.space_utils.serialization_utils import json_to_space, same_space_json

Path = Tuple[Any, ...]


@dataclass
class Route:
    """Where one child's data sits in the full sample."""

    key: str                 #: the storage-map key
    kind: str                #: "node": the child holds the space at `root`; "pruned": a sub-dict of leaves under it
    root: Path               #: path of the node the child's data is relative to
    space: Space             #: the space the child stores
    leaves: List[Path]       #: absolute paths of the leaves it holds, in space order


def join_path(path: Sequence[Any], sep: str) -> str:
    return sep.join(map(str, path)) or "<root>"


def node_at(space: Space, path: Path) -> Optional[Space]:
    """The sub-space at `path`, or None when the path leads nowhere."""
    node = space
    for p in path:
        if not isinstance(node, DictSpace) or p not in node.spaces:
            return None
        node = node.spaces[p]
    return node


def leaf_items(space: Space, check_key: Optional[Callable[[Any, Path], None]] = None,
               path: Path = ()) -> List[Tuple[Path, Space]]:
    """`(path, leaf space)` of every non-dict leaf of `space`, in space order (a non-dict space is its own leaf);
    `check_key(key, parent_path)` sees every key on the way."""
    if not isinstance(space, DictSpace):
        return [(path, space)]
    out: List[Tuple[Path, Space]] = []
    for k, child in space.spaces.items():
        if check_key is not None:
            check_key(k, path)
        out.extend(leaf_items(child, check_key, path + (k,)))
    return out


def _check_key(key: Any, path: Path, sep: str) -> None:
    if not isinstance(key, str):
        raise TypeError(f"DictStorage needs string keys, got {key!r} under {join_path(path, sep)!r}")
    if sep in key or key == "*" or not key:
        raise ValueError(f"space key {key!r} under {join_path(path, sep)!r} cannot be part of a {sep!r}-separated "
                         "key path; choose another nested_separator")


def leaf_paths(space: Space, sep: str) -> List[Path]:
    """Absolute paths of the non-dict leaves of `space`, in space order (checks that keys are usable paths)."""
    return [p for p, _leaf in leaf_items(space, partial(_check_key, sep=sep))]


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


class _Router:
    """One `route_space` call: hands out leaves to storage-map keys, refusing a leaf claimed twice."""

    def __init__(self, space: DictSpace, sep: str) -> None:
        self.space, self.sep = space, sep
        self.all_leaves = leaf_paths(space, sep)
        self.owner: Dict[Path, str] = {}
        self.routes: Dict[str, Route] = {}

    def leaves_under(self, prefix: Path) -> List[Path]:
        n = len(prefix)
        return [lf for lf in self.all_leaves if lf[:n] == prefix]

    def nothing_matches(self, what: str) -> KeyError:
        return KeyError(f"{what} matches nothing in the space "
                        f"(leaves: {[join_path(lf, self.sep) for lf in self.all_leaves]})")

    def claim(self, route: Route) -> None:
        for lf in route.leaves:
            if lf in self.owner:
                raise ValueError(f"leaf {join_path(lf, self.sep)!r} is claimed by both {self.owner[lf]!r} and "
                                 f"{route.key!r}")
            self.owner[lf] = route.key
        self.routes[route.key] = route

    def group(self, key: str, paths: Any) -> None:
        if "*" in key:
            raise ValueError(f"group name {key!r} must not contain '*'")
        if node_at(self.space, tuple(key.split(self.sep))) is not None:
            raise ValueError(f"group name {key!r} is also a key path of the space; rename the group")
        if isinstance(paths, str) or not isinstance(paths, Sequence) or not paths:
            raise TypeError(f"group {key!r} must list one or more key paths, got {paths!r}")
        chosen: Set[Path] = set()
        for p in paths:
            if not isinstance(p, str) or "*" in p:
                raise ValueError(f"group {key!r}: {p!r} is not a key path")
            parts = tuple(p.split(self.sep))
            if node_at(self.space, parts) is None:
                raise self.nothing_matches(f"group {key!r}: key path {p!r}")
            chosen.update(self.leaves_under(parts))
        leaves = [lf for lf in self.all_leaves if lf in chosen]
        if not leaves:
            raise KeyError(f"group {key!r} matches no leaf of the space")
        self.claim(Route(key, "pruned", (), _prune(self.space, set(leaves)), leaves))

    def exact(self, key: str, parts: Path) -> None:
        node = node_at(self.space, parts)
        leaves = self.leaves_under(parts) if node is not None else []
        if node is None or not leaves:
            raise self.nothing_matches(f"storage_cls_map key {key!r}")
        self.claim(Route(key, "node", parts, node, leaves))

    def wildcard(self, key: str, prefix: Path) -> None:
        node = node_at(self.space, prefix)
        if not isinstance(node, DictSpace):
            raise KeyError(f"storage_cls_map key {key!r}: {join_path(prefix, self.sep)!r} is not a sub-dict of the "
                           "space")
        residual = [lf for lf in self.leaves_under(prefix) if lf not in self.owner]
        if not residual:
            raise KeyError(f"storage_cls_map key {key!r} matches nothing: every leaf under "
                           f"{join_path(prefix, self.sep)!r} is claimed by another entry")
        n = len(prefix)
        self.claim(Route(key, "pruned", prefix, _prune(node, {lf[n:] for lf in residual}), residual))


def route_space(space: Space, keys: Sequence[str], groups: Mapping[str, Sequence[str]], sep: str) -> List[Route]:
    """Assigns every leaf of `space` to exactly one storage-map key; the routes come in the order of `keys`."""
    if not isinstance(space, DictSpace):
        raise TypeError(f"DictStorage stores a DictSpace, got {type(space).__name__}")
    if not isinstance(sep, str) or not sep or sep == "*":
        raise ValueError(f"nested_separator must be a non-empty string other than '*', got {sep!r}")
    router = _Router(space, sep)
    for g in groups:
        if g not in keys:
            raise ValueError(f"group {g!r} has no entry in storage_cls_map (give it a storage class)")
    wildcards: List[Tuple[str, Path]] = []
    for key in keys:
        if not isinstance(key, str) or not key:
            raise TypeError(f"storage_cls_map keys must be non-empty strings, got {key!r}")
        if key in groups:
            router.group(key, groups[key])
            continue
        parts = tuple(key.split(sep))
        if "*" not in parts:
            router.exact(key, parts)
        elif parts[-1] != "*" or parts.count("*") != 1:
            raise ValueError(f"storage_cls_map key {key!r}: '*' may only be the last part ('*' or 'prefix{sep}*')")
        else:
            wildcards.append((key, parts[:-1]))
    for key, prefix in sorted(wildcards, key=lambda kp: -len(kp[1])):
        router.wildcard(key, prefix)
    unclaimed = [join_path(lf, sep) for lf in router.all_leaves if lf not in router.owner]
    if unclaimed:
        raise ValueError(f"no storage_cls_map entry claims the key(s) {unclaimed}; add them (or a '*' entry) "
                         "to storage_cls_map")
    return [router.routes[k] for k in keys]


def child_relative_path(key: str, cls: Type[SpaceStorage], sep: str) -> str:
    """File or directory name of a child: the key with the separator as '.', '*' as '_default', plus its ext
    (a path separator left in a key, possible with another `nested_separator`, is written as '%2F')."""
    name = key.replace(sep, ".").replace("*", "_default") + (cls.single_file_ext or "")
    for s in {os.sep, os.altsep or os.sep, "/"}:
        name = name.replace(s, "%2F")
    if "\x00" in name or name in ("", ".", ".."):
        raise ValueError(f"storage_cls_map key {key!r} does not give a usable file name ({name!r})")
    return name


# ---------------------------------------------------------------------------------------------------- splitting
def dig(value: Any, path: Path) -> Any:
    for p in path:
        value = value[p]
    return value


def _pick_under(value: Any, pick: Callable[[Any], Any], path: Path) -> Any:
    return pick(dig(value, path))


def _picker(node: DictSpace) -> Callable[[Any], Any]:
    """Copies the keys of `node` (recursively) out of a value: the part a "pruned" child stores."""
    items = [(k, _picker(child) if isinstance(child, DictSpace) else None) for k, child in node.spaces.items()]
    if all(f is None for _, f in items):
        keys = [k for k, _ in items]
        return lambda v: {k: v[k] for k in keys}
    return lambda v: {k: (v[k] if f is None else f(v[k])) for k, f in items}


def extractor(route: Route) -> Callable[[Any], Any]:
    """Takes a route's part out of a full sample (or batch)."""
    root = route.root
    if route.kind == "node":
        return itemgetter(root[0]) if len(root) == 1 else partial(dig, path=root)
    pick = _picker(route.space)  # type: ignore[arg-type]
    return pick if not root else partial(_pick_under, pick=pick, path=root)


def assembler(space: Space, routes: Sequence[Route]) -> Callable[[List[Any]], Any]:
    """Puts the children's outputs (in route order) back together as a sample of `space`, in its key order."""
    owner: Dict[Path, Tuple[int, Path]] = {}
    for i, r in enumerate(routes):
        for lf in r.leaves:
            owner[lf] = (i, lf[len(r.root):])

    def build(node: Space, path: Path) -> Callable[[List[Any]], Any]:
        if isinstance(node, DictSpace):
            items = [(k, build(child, path + (k,))) for k, child in node.spaces.items()]
            return lambda outs: {k: f(outs) for k, f in items}
        ci, rel = owner[path]
        if not rel:
            return lambda outs: outs[ci]
        if len(rel) == 1:
            k0 = rel[0]
            return lambda outs: outs[ci][k0]
        return lambda outs: dig(outs[ci], rel)
    return build(space, ())


# ---------------------------------------------------------------------------------------------------- stored space
def describe_space(space: Any) -> str:
    try:
        return str(space.get_repr(True, False, False))
    except Exception:  # noqa: BLE001 - a description only
        return type(space).__name__


def check_stored_space(js: Any, space: Space, path: str, meta_path: str, sep: str) -> None:
    """ValueError naming the differences when the given space is not the one the data was written with."""
    if same_space_json(space, js):
        return              # the same description: the same space (the common case, without rebuilding it)
    try:
        stored = json_to_space(js, space.backend, space.device)
    except (ValueError, TypeError, KeyError) as exc:
        raise StorageFormatError(f"{meta_path}: stored space is malformed: {exc}") from None
    if stored == space:
        return
    s_leaves = {join_path(p, sep): lf for p, lf in leaf_items(stored)} if isinstance(stored, DictSpace) else {}
    g_leaves = {join_path(p, sep): lf for p, lf in leaf_items(space)} if isinstance(space, DictSpace) else {}
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
            parts.append(f"key {k!r}: stored {describe_space(a)}, given {describe_space(b)}")
    if not parts and not (s_leaves and g_leaves):
        parts.append(f"stored {describe_space(stored)}, given {describe_space(space)}")
    raise ValueError(f"the space does not match the one stored in {path}: {'; '.join(parts) or 'they differ'}")


__all__ = ["Route", "Path", "route_space", "child_relative_path", "extractor", "assembler", "leaf_items",
           "leaf_paths", "node_at", "join_path", "dig", "describe_space", "check_stored_space"]
