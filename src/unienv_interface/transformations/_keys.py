"""Nested keys of dicts and DictSpaces, shared by the dict transformations (`DictTransformation`, the key
filters and the flatten / unflatten pair).

A nested key is a string split at a separator (`"robot/arm/pos"` with `"/"`). Every function returns new
containers and never mutates its input: a DictSpace is rebuilt with the same backend, device and metadata, a data
dict as a plain dict. A key missing from a space is ValueError, from data KeyError; an intermediate key that holds
something other than a dict is ValueError (space) / TypeError (data); each names the whole key.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from unienv_interface.space import DictSpace, Space


def check_separator(sep: Any) -> str:
    """`sep` if it is a non-empty string, else TypeError / ValueError."""
    if not isinstance(sep, str):
        raise TypeError(f"nested_separator must be a str, got {type(sep).__name__}")
    if not sep:
        raise ValueError("nested_separator must not be empty")
    return sep


def split_key(key: Any, sep: str) -> Tuple[str, ...]:
    """The parts of a nested key (TypeError for a non-string key, ValueError for an empty part)."""
    if not isinstance(key, str):
        raise TypeError(f"keys must be strings, got {key!r}")
    parts = tuple(key.split(sep))
    if any(not p for p in parts):
        raise ValueError(f"key {key!r} has an empty part when split at {sep!r}")
    return parts


def children(node: Any) -> Optional[Mapping[str, Any]]:
    """The entries of a DictSpace or a mapping; None for anything else."""
    if isinstance(node, DictSpace):
        return node.spaces
    if isinstance(node, Mapping):
        return node
    return None


def rebuild(like: Any, items: Mapping[str, Any]) -> Any:
    """A container of the kind of `like` (a DictSpace keeps backend, device and metadata) holding `items`."""
    if isinstance(like, DictSpace):
        return DictSpace(like.backend, dict(items), device=like.device, metadata=like.metadata)
    return dict(items)


def _missing(node: Any, path: Sequence[str], depth: int, sep: str) -> Exception:
    key = sep.join(path)
    if isinstance(node, DictSpace):
        return ValueError(f"key {key!r}: the space has no key {path[depth]!r} (it has {list(node.spaces)})")
    return KeyError(f"key {key!r}: missing {path[depth]!r} (the dict has {list(node)})")


def _not_a_dict(node: Any, path: Sequence[str], depth: int, sep: str, is_space: bool) -> Exception:
    where = sep.join(path[:depth])
    if is_space:
        return ValueError(f"key {sep.join(path)!r}: {where!r} is a {type(node).__name__}, not a DictSpace")
    return TypeError(f"key {sep.join(path)!r}: {where!r} holds a {type(node).__name__}, not a dict")


def lookup(root: Any, path: Sequence[str], sep: str, missing_ok: bool = False) -> Tuple[bool, Any]:
    """`(True, value)` at `path` of `root`; `(False, None)` when a key is missing and `missing_ok`, else the error."""
    is_space = isinstance(root, DictSpace)
    node = root
    for depth, part in enumerate(path):
        entries = children(node)
        if entries is None:
            raise _not_a_dict(node, path, depth, sep, is_space)
        if part not in entries:
            if missing_ok:
                return False, None
            raise _missing(node, path, depth, sep)
        node = entries[part]
    return True, node


def replace(root: Any, path: Sequence[str], fn: Callable[[Any], Any], sep: str) -> Any:
    """A copy of `root` whose value at `path` (which must exist) is `fn(value)`."""
    is_space = isinstance(root, DictSpace)

    def go(node: Any, depth: int) -> Any:
        entries = children(node)
        if entries is None:
            raise _not_a_dict(node, path, depth, sep, is_space)
        if path[depth] not in entries:
            raise _missing(node, path, depth, sep)
        items = dict(entries)
        value = entries[path[depth]]
        items[path[depth]] = fn(value) if depth == len(path) - 1 else go(value, depth + 1)
        return rebuild(node, items)

    return go(root, 0)


class KeyTree:
    """A set of nested keys as a tree: `whole` marks a key that names a whole sub-tree; keys below a whole key are
    covered by it."""

    def __init__(self) -> None:
        self.whole = False
        self.below: Dict[str, "KeyTree"] = {}

    @classmethod
    def of(cls, keys: Iterable[Tuple[str, ...]]) -> "KeyTree":
        tree = cls()
        for path in keys:
            node = tree
            for part in path:
                node = node.below.setdefault(part, cls())
            node.whole = True
        return tree

    def _entries(self, root: Any, sep: str, missing_ok: bool, prefix: Tuple[str, ...]) -> Mapping[str, Any]:
        """The entries of `root` (at `prefix`), checked to hold this node's keys unless `missing_ok`."""
        entries = children(root)
        if entries is None:
            raise _not_a_dict(root, prefix + (next(iter(self.below)),), len(prefix), sep, isinstance(root, Space))
        for part in self.below:
            if part not in entries and not missing_ok:
                raise _missing(root, prefix + (part,), len(prefix), sep)
        return entries

    def include(self, root: Any, sep: str, missing_ok: bool, prefix: Tuple[str, ...] = ()) -> Any:
        """The part of `root` the keys name (whole sub-trees for whole keys), in `root`'s key order."""
        entries = self._entries(root, sep, missing_ok, prefix)
        items = {}
        for part, value in entries.items():
            sub = self.below.get(part)
            if sub is None:
                continue
            items[part] = value if sub.whole else sub.include(value, sep, missing_ok, prefix + (part,))
        return rebuild(root, items)

    def exclude(self, root: Any, sep: str, missing_ok: bool, prefix: Tuple[str, ...] = ()) -> Any:
        """`root` without the keys (a whole key removes its sub-tree)."""
        entries = self._entries(root, sep, missing_ok, prefix)
        items = {}
        for part, value in entries.items():
            sub = self.below.get(part)
            if sub is None:
                items[part] = value
            elif not sub.whole:
                items[part] = sub.exclude(value, sep, missing_ok, prefix + (part,))
        return rebuild(root, items)


def check_disjoint(paths: Sequence[Tuple[str, ...]], sep: str, who: str) -> None:
    """ValueError when one key lies inside another (`"a"` and `"a/x"`): their order would decide the result."""
    seen = sorted(paths)
    for a, b in zip(seen, seen[1:]):
        if b[:len(a)] == a:
            raise ValueError(f"{who}: key {sep.join(b)!r} lies inside key {sep.join(a)!r}; name each part once")


def flatten_items(root: Any, sep: str, is_dict: Callable[[Any], bool], who: str) -> List[Tuple[str, Any]]:
    """`(joined key, leaf)` for every leaf of nested `root`, depth first in key order; `is_dict` says which values are
    nested dicts. A key holding `sep` is ValueError (it could not be split back)."""
    out: List[Tuple[str, Any]] = []

    def go(node: Any, prefix: str) -> None:
        for key, value in (children(node) or {}).items():
            if sep in key:
                raise ValueError(f"{who}: key {key!r} already holds the separator {sep!r}, so it could not be "
                                 "unflattened")
            full = key if not prefix else f"{prefix}{sep}{key}"
            if is_dict(value):
                go(value, full)
            else:
                out.append((full, value))

    go(root, "")
    return out


class _Node(dict):
    """An inner node built by `unflatten_items` (a leaf value may itself be a dict, so inner nodes are marked)."""


def _plain(node: Dict[str, Any]) -> Dict[str, Any]:
    return {k: _plain(v) if isinstance(v, _Node) else v for k, v in node.items()}


def unflatten_items(items: Iterable[Tuple[str, Any]], sep: str, who: str) -> Dict[str, Any]:
    """Nested plain dicts from `(joined key, leaf)` pairs; ValueError when a key is both a leaf and a prefix of
    another, or two keys name the same place."""
    root = _Node()
    for key, value in items:
        path = split_key(key, sep)
        node = root
        for depth, part in enumerate(path[:-1]):
            nxt = node.get(part)
            if nxt is None:
                nxt = node[part] = _Node()
            elif not isinstance(nxt, _Node):
                raise ValueError(f"{who}: key {key!r} needs {sep.join(path[:depth + 1])!r} to be a dict, but that key "
                                 "holds a value")
            node = nxt
        if path[-1] in node:
            raise ValueError(f"{who}: key {key!r} collides with another key at {path[-1]!r}")
        node[path[-1]] = value
    return _plain(root)
