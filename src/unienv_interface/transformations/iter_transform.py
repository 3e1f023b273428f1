"""`IterativeTransformation` (one transformation applied to every leaf of nested Dict / Tuple spaces) and
`LeafwiseTransformation` (one transformation per leaf, in the space's structure).

Which spaces are leaves is decided by a predicate, `is_leaf_node_fn(space) -> bool` (by default: anything but a
DictSpace or TupleSpace). JSON names a predicate as `{"mode": "name", "value": "module.qualname"}`, the reference's
form. A name read from a file is looked up, never imported: it resolves to `default_is_leaf_fn`, to a predicate
registered with `register_leaf_fn`, or to a module-level function that an IterativeTransformation of this process
was built with. The reference's other form, a cloudpickled function (`"mode": "pickle"`), is refused: unpickling a
file can run arbitrary code. A lambda or local function therefore cannot be written to JSON (register it under a
name instead).
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple, Union

from unienv_interface.registry import ClassRegistry, class_type_name
from unienv_interface.space import DictSpace, Space, TupleSpace

from ._arrays import prefixed
from .serialization_utils import MAX_DEPTH, check_param_names, json_to_transformation, transformation_to_json
from .transformation import DataTransformation, TransformationFormatError

LeafFn = Callable[[Space], bool]


def default_is_leaf_fn(space: Space) -> bool:
    """True for every space except a DictSpace or a TupleSpace (whose children are visited instead)."""
    return not isinstance(space, (DictSpace, TupleSpace))


_LEAF_FNS: ClassRegistry[Any] = ClassRegistry(
    "leaf predicate", {}, TransformationFormatError,
    "register it with unienv_interface.transformations.iter_transform.register_leaf_fn")
_NAME_OF: Dict[Any, str] = {}


def register_leaf_fn(fn: LeafFn, *aliases: str) -> LeafFn:
    """Makes the predicate `fn` loadable from JSON under `module.qualname` (for a module-level function) and
    `aliases`; JSON then names it by its first name. Usable as a decorator. A lambda or local function needs an
    alias."""
    if not callable(fn):
        raise TypeError(f"a leaf predicate must be callable, got {fn!r}")
    own = _own_name(fn)
    names = ([own] if own else []) + list(aliases)
    if not names:
        raise ValueError(f"{fn!r} has no module-level name: register it with an alias, e.g. "
                         "register_leaf_fn(fn, 'my_package.is_leaf')")
    for name in names:
        if not isinstance(name, str) or not name:
            raise TypeError(f"a leaf predicate's name must be a non-empty str, got {name!r}")
    _LEAF_FNS.register(fn, *aliases)  # type: ignore[arg-type]
    _NAME_OF[fn] = names[0]
    return fn


def _own_name(fn: Any) -> Optional[str]:
    """`module.qualname` of a module-level function or class member; None for a lambda or a local function."""
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qualname, str) or "<" in qualname:
        return None
    return class_type_name(fn)  # type: ignore[arg-type]


register_leaf_fn(default_is_leaf_fn)


def leaf_fn_to_json(fn: LeafFn, what: str) -> Dict[str, str]:
    """`{"mode": "name", "value": name}`; ValueError for a predicate without a name (a lambda, a local function)."""
    name = _NAME_OF.get(fn)
    if name is None:
        raise ValueError(f"{what} {fn!r} cannot be written to JSON: use a module-level function, or register it "
                         "with unienv_interface.transformations.iter_transform.register_leaf_fn(fn, name)")
    return {"mode": "name", "value": name}


def leaf_fn_from_json(data: Any, what: str) -> LeafFn:
    """The predicate a `leaf_fn_to_json` object names (TransformationFormatError for anything else)."""
    if not isinstance(data, Mapping) or set(data) != {"mode", "value"}:
        raise TransformationFormatError(f"{what} must be an object with keys 'mode' and 'value', got {data!r}"[:200])
    if data["mode"] == "pickle":
        raise TransformationFormatError(f"{what} is a pickled function; pickles are never loaded (unpickling can "
                                        "run arbitrary code): register a named predicate with register_leaf_fn")
    if data["mode"] != "name":
        raise TransformationFormatError(f"{what}: unknown mode {data['mode']!r}; expected 'name'")
    return _LEAF_FNS.resolve(data["value"], what)  # type: ignore[no-any-return]


def _check_leaf_fn(fn: Any, what: str) -> LeafFn:
    if not callable(fn):
        raise TypeError(f"{what} must be callable, got {fn!r}")
    own = _own_name(fn)
    if own is not None and fn not in _NAME_OF:   # a module-level function this process holds: known by its name
        register_leaf_fn(fn)
    return fn  # type: ignore[no-any-return]


def _rebuild(like: Space, children: Union[Dict[str, Space], List[Space]]) -> Space:
    """A DictSpace / TupleSpace like `like` over new children, on the backend and device of the first one (a member
    may move data), keeping `like`'s metadata."""
    values = list(children.values()) if isinstance(children, dict) else children
    first = values[0] if values else like
    if isinstance(children, dict):
        return DictSpace(first.backend, children, device=first.device, metadata=like.metadata)
    return TupleSpace(first.backend, children, device=first.device, metadata=like.metadata)


def _dict_data(space: DictSpace, data: Any, who: str) -> Mapping[str, Any]:
    if not isinstance(data, Mapping):
        raise TypeError(f"{who}: expected a dict with keys {list(space.spaces)}, got {type(data).__name__}")
    missing = [k for k in space.spaces if k not in data]
    if missing:
        raise KeyError(f"{who}: missing key(s) {missing} (expected keys {list(space.spaces)})")
    return data


def _tuple_data(space: TupleSpace, data: Any, who: str) -> Any:
    if not isinstance(data, (tuple, list)) or len(data) != len(space.spaces):
        raise TypeError(f"{who}: expected a tuple of {len(space.spaces)} elements, got {type(data).__name__}"
                        f"{f' of {len(data)}' if isinstance(data, (tuple, list)) else ''}")
    return data


# ---------------------------------------------------------------------------------------------------- leafwise
Structure = Any   # DataTransformation | Mapping[str, Structure] | Tuple[Structure, ...]


def _check_structure(node: Any, where: str = "transformations", depth: int = 0) -> Structure:
    if depth > MAX_DEPTH:
        raise ValueError(f"LeafwiseTransformation structure is nested deeper than {MAX_DEPTH} levels")
    if isinstance(node, DataTransformation):
        return node
    if isinstance(node, Mapping):
        out = {}
        for k, v in node.items():
            if not isinstance(k, str):
                raise TypeError(f"{where}: keys must be strings, got {k!r}")
            out[k] = _check_structure(v, f"{where}[{k!r}]", depth + 1)
        return out
    if isinstance(node, (tuple, list)):
        return tuple(_check_structure(v, f"{where}[{i}]", depth + 1) for i, v in enumerate(node))
    raise TypeError(f"{where} must be a DataTransformation, a mapping or a tuple of them, got {type(node).__name__}")


def _leaves(node: Structure) -> List[DataTransformation]:
    if isinstance(node, DataTransformation):
        return [node]
    values = node.values() if isinstance(node, Mapping) else node
    return [t for v in values for t in _leaves(v)]


class LeafwiseTransformation(DataTransformation):
    """One transformation per leaf: `transformations` mirrors the space, a mapping for a DictSpace (naming every
    key), a tuple for a TupleSpace (one per element) and a DataTransformation for a leaf; a structure that does not
    match the space is ValueError. `IterativeTransformation.direct_inverse` returns one when its leaves need
    different inverses. Invertible when every member is.

    JSON: `{"transformations": node}` with node `{"leaf": <transformation JSON>}`, `{"dict": {key: node}}` or
    `{"tuple": [node, ...]}` (the reference's form).
    """

    def __init__(self, transformations: Structure) -> None:
        self.transformations = _check_structure(transformations)
        self.has_inverse = all(t.has_inverse for t in _leaves(self.transformations))

    def _map(self, node: Structure, space: Optional[Space], fn: Callable[..., Any], data: Any = None,
             with_data: bool = False, where: str = "") -> Any:
        """`fn(transformation, space[, data])` at every leaf, in the structure's shape."""
        if isinstance(node, DataTransformation):
            try:
                return fn(node, space, data) if with_data else fn(node, space)
            except (TypeError, ValueError) as exc:
                raise prefixed(exc, f"LeafwiseTransformation at {where or 'the root'}") from None
        if isinstance(node, Mapping):
            if space is not None:
                if not isinstance(space, DictSpace):
                    raise ValueError(f"LeafwiseTransformation at {where or 'the root'}: the structure is a mapping, "
                                     f"the space a {type(space).__name__}")
                if set(node) != set(space.spaces):
                    raise ValueError(f"LeafwiseTransformation at {where or 'the root'}: the structure names keys "
                                     f"{sorted(node)}, the space has {sorted(space.spaces)}")
                if with_data:
                    data = _dict_data(space, data, "LeafwiseTransformation")
            return {k: self._map(sub, None if space is None else space.spaces[k], fn,
                                 data[k] if with_data else None, with_data, f"{where}[{k!r}]")
                    for k, sub in node.items()}
        if space is not None:
            if not isinstance(space, TupleSpace) or len(space.spaces) != len(node):
                raise ValueError(f"LeafwiseTransformation at {where or 'the root'}: the structure is a tuple of "
                                 f"{len(node)}, the space a {type(space).__name__}"
                                 f"{f' of {len(space.spaces)}' if isinstance(space, TupleSpace) else ''}")
            if with_data:
                data = _tuple_data(space, data, "LeafwiseTransformation")
        return tuple(self._map(sub, None if space is None else space.spaces[i], fn,
                               data[i] if with_data else None, with_data, f"{where}[{i}]")
                     for i, sub in enumerate(node))

    def get_target_space_from_source(self, source_space: Space) -> Space:
        def build(node: Structure, space: Space) -> Space:
            if isinstance(node, DataTransformation):
                try:
                    return node.get_target_space_from_source(space)
                except (TypeError, ValueError) as exc:
                    raise prefixed(exc, "LeafwiseTransformation") from None
            self._map(node, space, lambda t, s: None)     # checks the structure against the space
            kids: Any = space.spaces  # type: ignore[attr-defined]
            if isinstance(node, Mapping):
                return _rebuild(space, {k: build(sub, kids[k]) for k, sub in node.items()})
            return _rebuild(space, [build(sub, kids[i]) for i, sub in enumerate(node)])
        return build(self.transformations, source_space)

    def transform(self, source_space: Space, data: Any) -> Any:
        return self._map(self.transformations, source_space, lambda t, s, d: t.transform(s, d), data, with_data=True)

    def direct_inverse(self, source_space: Optional[Space] = None) -> "LeafwiseTransformation":
        if not self.has_inverse:
            bad = sorted({type(t).__name__ for t in _leaves(self.transformations) if not t.has_inverse})
            raise ValueError(f"LeafwiseTransformation has no inverse: {bad} cannot be inverted")
        return LeafwiseTransformation(self._map(self.transformations, source_space, lambda t, s: t.direct_inverse(s)))

    def close(self) -> None:
        for t in _leaves(self.transformations):
            t.close()

    def to_json(self) -> Dict[str, Any]:
        def encode(node: Structure) -> Dict[str, Any]:
            if isinstance(node, DataTransformation):
                return {"leaf": transformation_to_json(node)}
            if isinstance(node, Mapping):
                return {"dict": {k: encode(v) for k, v in node.items()}}
            return {"tuple": [encode(v) for v in node]}
        return {"transformations": encode(self.transformations)}

    @classmethod
    def from_json(cls, params: Mapping[str, Any]) -> "LeafwiseTransformation":
        check_param_names(params, ("transformations",), ("transformations",), cls.__name__)

        def decode(node: Any, depth: int) -> Structure:
            if depth > MAX_DEPTH:
                raise TransformationFormatError(f"LeafwiseTransformation JSON is nested deeper than {MAX_DEPTH} levels")
            if not isinstance(node, Mapping) or len(node) != 1 or next(iter(node)) not in ("leaf", "dict", "tuple"):
                raise ValueError(f"a LeafwiseTransformation node must be an object with one key, 'leaf', 'dict' or "
                                 f"'tuple', got {str(node)[:120]}")
            kind, value = next(iter(node.items()))
            if kind == "leaf":
                return json_to_transformation(value)
            if kind == "dict":
                if not isinstance(value, Mapping):
                    raise TypeError(f"a 'dict' node holds an object, got {type(value).__name__}")
                return {k: decode(v, depth + 1) for k, v in value.items()}
            if not isinstance(value, list):
                raise TypeError(f"a 'tuple' node holds a list, got {type(value).__name__}")
            return tuple(decode(v, depth + 1) for v in value)

        return cls(decode(params["transformations"], 0))


# ---------------------------------------------------------------------------------------------------- iterative
class IterativeTransformation(DataTransformation):
    """Applies `transformation` to every leaf of nested DictSpace / TupleSpace (a space is a leaf when
    `is_leaf_node_fn(space)`); a space that is neither a leaf nor a Dict / Tuple space is ValueError. Data follows
    the space: a DictSpace's data must hold its keys (KeyError) and the result holds only them; a TupleSpace's data
    is a tuple of its length.

    Invertible when `transformation` is. `direct_inverse(source_space)` inverts per leaf: one
    IterativeTransformation (with the two predicates swapped) when all leaves are equal spaces, else a
    LeafwiseTransformation holding one inverse per leaf (e.g. rescaled leaves with different bounds).
    """

    def __init__(self, transformation: DataTransformation, is_leaf_node_fn: LeafFn = default_is_leaf_fn,
                 inv_is_leaf_node_fn: LeafFn = default_is_leaf_fn) -> None:
        if not isinstance(transformation, DataTransformation):
            raise TypeError(f"IterativeTransformation takes a DataTransformation, got {type(transformation).__name__}")
        self.transformation = transformation
        self.is_leaf_node_fn = _check_leaf_fn(is_leaf_node_fn, "is_leaf_node_fn")
        self.inv_is_leaf_node_fn = _check_leaf_fn(inv_is_leaf_node_fn, "inv_is_leaf_node_fn")
        self.has_inverse = transformation.has_inverse

    def _walk(self, space: Space, leaf: Callable[[Space], Any], node: Callable[[Space, Any], Any]) -> Any:
        """`leaf(space)` at the leaves and `node(space, children results)` at the Dict / Tuple spaces above them."""
        if self.is_leaf_node_fn(space):
            return leaf(space)
        if isinstance(space, DictSpace):
            return node(space, {k: self._walk(s, leaf, node) for k, s in space.spaces.items()})
        if isinstance(space, TupleSpace):
            return node(space, [self._walk(s, leaf, node) for s in space.spaces])
        raise ValueError(f"IterativeTransformation: a {type(space).__name__} is not a leaf (is_leaf_node_fn says so) "
                         "and not a DictSpace or TupleSpace")

    def get_target_space_from_source(self, source_space: Space) -> Space:
        return self._walk(source_space, self.transformation.get_target_space_from_source,  # type: ignore[no-any-return]
                          _rebuild)

    def transform(self, source_space: Space, data: Any) -> Any:
        if self.is_leaf_node_fn(source_space):
            return self.transformation.transform(source_space, data)
        if isinstance(source_space, DictSpace):
            d = _dict_data(source_space, data, "IterativeTransformation")
            return {k: self.transform(s, d[k]) for k, s in source_space.spaces.items()}
        if isinstance(source_space, TupleSpace):
            t = _tuple_data(source_space, data, "IterativeTransformation")
            return tuple(self.transform(s, t[i]) for i, s in enumerate(source_space.spaces))
        return self._walk(source_space, lambda s: None, lambda s, c: None)  # raises the ValueError

    def direct_inverse(self, source_space: Optional[Space] = None) -> Union["IterativeTransformation",
                                                                             LeafwiseTransformation]:
        if not self.has_inverse:
            raise ValueError(f"IterativeTransformation has no inverse: {type(self.transformation).__name__} cannot "
                             "be inverted")
        leaf_space = None
        if source_space is not None:
            leaves: List[Space] = []
            self._walk(source_space, leaves.append, lambda s, c: None)
            if any(leaf != leaves[0] for leaf in leaves[1:]):
                structure = self._walk(source_space, self.transformation.direct_inverse,
                                       lambda s, c: c if isinstance(c, dict) else tuple(c))
                return LeafwiseTransformation(structure)
            leaf_space = leaves[0] if leaves else None
        return IterativeTransformation(self.transformation.direct_inverse(leaf_space),
                                       is_leaf_node_fn=self.inv_is_leaf_node_fn,
                                       inv_is_leaf_node_fn=self.is_leaf_node_fn)

    def close(self) -> None:
        self.transformation.close()

    def to_json(self) -> Dict[str, Any]:
        return {"transformation": transformation_to_json(self.transformation),
                "is_leaf_node_fn": leaf_fn_to_json(self.is_leaf_node_fn, "is_leaf_node_fn"),
                "inv_is_leaf_node_fn": leaf_fn_to_json(self.inv_is_leaf_node_fn, "inv_is_leaf_node_fn")}

    @classmethod
    def from_json(cls, params: Mapping[str, Any]) -> "IterativeTransformation":
        check_param_names(params, ("transformation", "is_leaf_node_fn", "inv_is_leaf_node_fn"), ("transformation",),
                          cls.__name__)
        fns: Tuple[LeafFn, ...] = tuple(
            leaf_fn_from_json(params[k], k) if k in params else default_is_leaf_fn
            for k in ("is_leaf_node_fn", "inv_is_leaf_node_fn"))
        return cls(json_to_transformation(params["transformation"]), fns[0], fns[1])


__all__ = ["IterativeTransformation", "LeafwiseTransformation", "default_is_leaf_fn", "register_leaf_fn"]
