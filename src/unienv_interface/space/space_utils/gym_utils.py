"""gymnasium spaces to and from this library's spaces, and their data both ways (needs the `gym` extra).

| gymnasium | here |
| --- | --- |
| `Box` | `BoxSpace` (same bounds, shape and dtype) |
| `Discrete(n, start)` | `BoxSpace` of shape `()` and the Discrete's integer dtype (int64 by default), bounds `[start, start + n - 1]` |
| `MultiDiscrete(nvec, start)` | integer `BoxSpace`, bounds `[start, start + nvec - 1]` |
| `MultiBinary(n)` | `BinarySpace` (bool; gymnasium's data is int8 0/1) |
| `Text` | `TextSpace` |
| `Dict` / `Tuple` | `DictSpace` / `TupleSpace`, nested |
| `OneOf` | `UnionSpace` (values `(index, value)` both sides) |
| `Graph(node_space, edge_space)` | `GraphSpace` (unbatched; edges, with features, exactly when `edge_space` is set) |

A space made from a `Discrete` or `MultiDiscrete` remembers it in its metadata (`{"gym_space": "Discrete"}`), so
`to_gym_space` gives the gymnasium kind back; any other integer Box becomes a gymnasium `Box`. Everything else
(`Sequence`, a `TextSpace` without a character set, a `DynamicBoxSpace`, a batched `GraphSpace` or one whose edges
have no features, which a gymnasium `Graph` cannot hold, ...) raises TypeError naming the space.

Data: `from_gym_data(space, data)` / `to_gym_data(space, data)` convert values; a value whose shape differs from
the space's, or that the space's dtype cannot hold exactly, raises ValueError (nothing is cast silently).
"""
from __future__ import annotations

from typing import Any, Dict, Optional

import numpy as np

try:
    import gymnasium as gym
except ImportError as _exc:  # pragma: no cover - depends on the environment
    raise ImportError("unienv_interface.space.space_utils.gym_utils needs gymnasium: pip install "
                      "'unienv-storage[gym]'") from _exc

from unienv_interface.space.space import Space
from unienv_interface.space.spaces import (BinarySpace, BoxSpace, DictSpace, GraphInstance, GraphSpace, TextSpace,
                                           TupleSpace, UnionSpace)

from ._mapping import check_dict_value
from .batch_utils import batch_space

#: the metadata key recording which gymnasium space an integer BoxSpace came from
GYM_KIND_KEY = "gym_space"
_SUPPORTED_GYM = "Box, Discrete, MultiDiscrete, MultiBinary, Text, Dict, Tuple, OneOf, Graph"
_SUPPORTED_OURS = ("BoxSpace, BinarySpace, TextSpace (with a charset), DictSpace, TupleSpace, UnionSpace, GraphSpace "
                   "(unbatched, edges with features)")


def _integer_dtype(backend: Any, dtype: Any, given: Any, what: str) -> Any:
    dt = backend.as_dtype(dtype) if dtype is not None else backend.dtype_from_name(np.dtype(given).name)
    if not backend.dtype_is_real_integer(dt):
        raise TypeError(f"a gymnasium {what} becomes an integer BoxSpace; dtype {dtype!r} is not an integer dtype")
    return dt


# ---------------------------------------------------------------------------------------------------- spaces
def from_gym_space(gym_space: Any, backend: Any, dtype: Any = None, device: Any = None) -> Space:
    """The space of `backend` (on `device`) equivalent to `gym_space` (see the module docstring for the table).

    `dtype` overrides the leaf dtype of Box / Discrete / MultiDiscrete leaves (it must hold their bounds).
    TypeError for gymnasium spaces without an equivalent here."""
    sp = gym.spaces
    if isinstance(gym_space, sp.Box):
        dt = backend.as_dtype(dtype) if dtype is not None else backend.dtype_from_name(gym_space.dtype.name)
        return BoxSpace(backend, low=np.asarray(gym_space.low), high=np.asarray(gym_space.high), dtype=dt,
                        device=device, shape=gym_space.shape)
    if isinstance(gym_space, sp.Discrete):
        start, n = int(gym_space.start), int(gym_space.n)
        return BoxSpace(backend, low=start, high=start + n - 1,
                        dtype=_integer_dtype(backend, dtype, gym_space.dtype, "Discrete"), device=device, shape=(),
                        metadata={GYM_KIND_KEY: "Discrete"})
    if isinstance(gym_space, sp.MultiDiscrete):
        start_arr = np.asarray(gym_space.start, dtype=np.int64)
        high = start_arr + np.asarray(gym_space.nvec, dtype=np.int64) - 1
        return BoxSpace(backend, low=start_arr, high=high,
                        dtype=_integer_dtype(backend, dtype, gym_space.dtype, "MultiDiscrete"), device=device,
                        shape=gym_space.shape, metadata={GYM_KIND_KEY: "MultiDiscrete"})
    if isinstance(gym_space, sp.MultiBinary):
        if dtype is not None and not backend.dtype_is_boolean(backend.as_dtype(dtype)):
            raise TypeError(f"a gymnasium MultiBinary becomes a BinarySpace; dtype {dtype!r} is not boolean")
        return BinarySpace(backend, shape=tuple(gym_space.shape), dtype=dtype, device=device)
    if isinstance(gym_space, sp.Text):
        return TextSpace(backend, int(gym_space.max_length), min_length=int(gym_space.min_length),
                         charset=frozenset(gym_space.character_set), device=device)
    if isinstance(gym_space, sp.Dict):
        return DictSpace(backend, {k: from_gym_space(s, backend, dtype, device) for k, s in gym_space.spaces.items()},
                         device=device)
    if isinstance(gym_space, sp.Tuple):
        return TupleSpace(backend, [from_gym_space(s, backend, dtype, device) for s in gym_space.spaces],
                          device=device)
    if isinstance(gym_space, sp.OneOf):
        return UnionSpace(backend, [from_gym_space(s, backend, dtype, device) for s in gym_space.spaces],
                          device=device)
    if isinstance(gym_space, sp.Graph):
        node = from_gym_space(gym_space.node_space, backend, dtype, device)
        edge = None if gym_space.edge_space is None else from_gym_space(gym_space.edge_space, backend, dtype, device)
        return GraphSpace(backend, node, edge, is_edge=edge is not None,  # type: ignore[arg-type]
                          device=device)
    raise TypeError(f"from_gym_space: gymnasium {type(gym_space).__name__} ({gym_space}) has no equivalent space "
                    f"here; supported: {_SUPPORTED_GYM}")


def to_gym_space(space: Space) -> Any:
    """The gymnasium space equivalent to `space` (see the module docstring); TypeError for spaces without one."""
    sp = gym.spaces
    if isinstance(space, BoxSpace):
        b = space.backend
        np_dt = b.numpy_dtype(space.dtype)
        if b.dtype_name(space.dtype) == "bfloat16":
            raise TypeError(f"to_gym_space: gymnasium has no bfloat16 Box ({space})")
        low, high = space.low_numpy, space.high_numpy
        kind = space.metadata.get(GYM_KIND_KEY)
        if kind == "Discrete" and space.shape == () and np_dt.kind in "iu":
            return sp.Discrete(int(high) - int(low) + 1, start=int(low), dtype=np_dt.type)
        if kind == "MultiDiscrete" and np_dt.kind in "iu":
            return sp.MultiDiscrete(high.astype(np.int64) - low.astype(np.int64) + 1, dtype=np_dt.type,
                                    start=low.astype(np.int64))
        return sp.Box(low=low.copy(), high=high.copy(), shape=space.shape, dtype=np_dt.type)
    if isinstance(space, BinarySpace):
        # gymnasium has no 0-d MultiBinary: a scalar BinarySpace becomes MultiBinary(1) (values of shape (1,))
        # (a 1-D space as an int n, as gymnasium's own MultiBinary(n) is written, so the two compare equal)
        shape = tuple(space.shape)
        return sp.MultiBinary(shape[0] if len(shape) == 1 else list(shape) if shape else 1)
    if isinstance(space, TextSpace):
        if space.charset is None:
            raise TypeError(f"to_gym_space: {space} has no character set, and gymnasium.spaces.Text needs one; give "
                            "the TextSpace a charset")
        return sp.Text(space.max_length, min_length=space.min_length, charset=space.charset)
    if isinstance(space, DictSpace):
        return sp.Dict({k: to_gym_space(s) for k, s in space.spaces.items()})
    if isinstance(space, TupleSpace):
        return sp.Tuple([to_gym_space(s) for s in space.spaces])
    if isinstance(space, UnionSpace):
        return sp.OneOf([to_gym_space(s) for s in space.spaces])
    if isinstance(space, GraphSpace):
        _check_gym_graph(space, "to_gym_space")
        edge = space.edge_feature_space
        return sp.Graph(node_space=to_gym_space(space.node_feature_space),
                        edge_space=None if edge is None else to_gym_space(edge))
    raise TypeError(f"to_gym_space: {type(space).__name__} ({space}) has no gymnasium equivalent; supported: "
                    f"{_SUPPORTED_OURS}")


def _check_gym_graph(space: GraphSpace, what: str) -> None:
    if space.batch_shape:
        raise TypeError(f"{what}: a gymnasium Graph is one graph; {space} is a batch of shape {space.batch_shape}")
    if space.is_edge and space.edge_feature_space is None:
        raise TypeError(f"{what}: a gymnasium Graph has edges only with an edge space; {space} has edges without "
                        "features (give it an edge_feature_space)")


# ---------------------------------------------------------------------------------------------------- data
def _exact_array(space: Any, data: Any, what: str) -> np.ndarray:
    """`data` as a NumPy array of the space's shape and dtype, refusing values the dtype cannot hold exactly."""
    a = np.asarray(data)
    target = space.backend.numpy_dtype(space.dtype)
    if tuple(a.shape) != tuple(space.shape):
        raise ValueError(f"{what}: expected shape {tuple(space.shape)}, got {tuple(a.shape)}")
    if a.dtype == target:
        return a
    if a.dtype.kind not in "biuf":
        raise TypeError(f"{what}: expected numbers of dtype {target}, got {a.dtype}")
    with np.errstate(all="ignore"):
        out = a.astype(target)
        same = np.array_equal(out.astype(a.dtype), a, equal_nan=a.dtype.kind == "f")
    if not same:
        raise ValueError(f"{what}: values of dtype {a.dtype} do not fit {target} exactly (the space's dtype); "
                         "convert them explicitly first")
    return out


def from_gym_data(space: Space, data: Any) -> Any:
    """A gymnasium value of `to_gym_space(space)` as data of `space` (backend arrays, dicts, tuples, strings)."""
    if isinstance(space, BoxSpace):
        a = _exact_array(space, data, "from_gym_data")
        # a copy: gymnasium envs may reuse their observation buffers between steps
        return space.backend.from_numpy(np.array(a, order="C"), dtype=space.dtype, device=space.device)
    if isinstance(space, BinarySpace):
        a = np.asarray(data)
        if tuple(a.shape) != tuple(space.shape) and not (space.shape == () and a.shape == (1,)):
            raise ValueError(f"from_gym_data: expected a MultiBinary value of shape {tuple(space.shape)}, got "
                             f"{tuple(a.shape)}")
        if a.dtype.kind not in "biu" or not np.all((a == 0) | (a == 1)):
            raise ValueError(f"from_gym_data: a MultiBinary value must hold only 0 and 1, got {a!r}")
        return space.backend.from_numpy(a.astype(bool).reshape(space.shape), dtype=space.dtype, device=space.device)
    if isinstance(space, TextSpace):
        if not isinstance(data, str):
            raise TypeError(f"from_gym_data: a Text value must be a str, got {type(data).__name__}")
        return data
    if isinstance(space, DictSpace):
        check_dict_value(space, data, "from_gym_data")
        return {k: from_gym_data(s, data[k]) for k, s in space.spaces.items()}
    if isinstance(space, TupleSpace):
        if not isinstance(data, (tuple, list)) or len(data) != len(space.spaces):
            raise ValueError(f"from_gym_data: expected a tuple of {len(space.spaces)} values, got {data!r:.80}")
        return tuple(from_gym_data(s, v) for s, v in zip(space.spaces, data))
    if isinstance(space, UnionSpace):
        index, value = _union_value(space, data, "from_gym_data")
        return index, from_gym_data(space.spaces[index], value)
    if isinstance(space, GraphSpace):
        return _graph_from_gym(space, data)
    raise TypeError(f"from_gym_data: {type(space).__name__} has no gymnasium equivalent; supported: {_SUPPORTED_OURS}")


def to_gym_data(space: Space, data: Any) -> Any:
    """Data of `space` as a value of `to_gym_space(space)` (NumPy arrays; a Discrete value is a NumPy integer)."""
    if isinstance(space, (BoxSpace, BinarySpace)):
        b = space.backend
        a = np.asarray(b.to_numpy(data)) if b.is_backendarray(data) else np.asarray(data)
        if isinstance(space, BinarySpace):
            if tuple(a.shape) != tuple(space.shape):
                raise ValueError(f"to_gym_data: expected shape {tuple(space.shape)}, got {tuple(a.shape)}")
            if a.dtype != np.bool_ and not np.all((a == 0) | (a == 1)):
                raise ValueError(f"to_gym_data: a BinarySpace value must hold only 0 and 1, got {a!r}")
            return a.astype(np.int8).reshape(space.shape if space.shape != () else (1,))
        a = _exact_array(space, a, "to_gym_data")
        if space.metadata.get(GYM_KIND_KEY) == "Discrete" and a.shape == ():
            return a[()]
        return a
    if isinstance(space, TextSpace):
        if not isinstance(data, str):
            raise TypeError(f"to_gym_data: a TextSpace value must be a str, got {type(data).__name__}")
        return data
    if isinstance(space, DictSpace):
        check_dict_value(space, data, "to_gym_data", allow_extra=True)
        out: Dict[str, Any] = {k: to_gym_data(s, data[k]) for k, s in space.spaces.items()}
        return out
    if isinstance(space, TupleSpace):
        if not isinstance(data, (tuple, list)) or len(data) != len(space.spaces):
            raise ValueError(f"to_gym_data: expected a tuple of {len(space.spaces)} values, got {data!r:.80}")
        return tuple(to_gym_data(s, v) for s, v in zip(space.spaces, data))
    if isinstance(space, UnionSpace):
        index, value = _union_value(space, data, "to_gym_data")
        return np.int64(index), to_gym_data(space.spaces[index], value)
    if isinstance(space, GraphSpace):
        _check_gym_graph(space, "to_gym_data")
        if not space.contains(data):
            raise ValueError(f"to_gym_data: the value is not a graph of {space}")
        b = space.backend
        edges = None if data.edges is None else np.asarray(b.to_numpy(data.edges)).astype(np.int32)
        feats = None if data.edges_features is None else np.asarray(b.to_numpy(data.edges_features))
        if edges is not None and feats is None:
            raise ValueError("to_gym_data: a gymnasium Graph takes edges only with their features; the value has none")
        return gym.spaces.GraphInstance(nodes=np.asarray(b.to_numpy(data.nodes_features)), edges=feats,
                                        edge_links=edges)
    raise TypeError(f"to_gym_data: {type(space).__name__} has no gymnasium equivalent; supported: {_SUPPORTED_OURS}")


def _union_value(space: UnionSpace, data: Any, what: str) -> Any:
    if not space.is_pair(data):
        raise ValueError(f"{what}: expected an (index, value) tuple with 0 <= index < {len(space.spaces)}, got "
                         f"{data!r:.80}")
    return int(data[0]), data[1]


def _graph_from_gym(space: GraphSpace, data: Any) -> GraphInstance:
    _check_gym_graph(space, "from_gym_data")
    if not isinstance(data, gym.spaces.GraphInstance):
        raise TypeError(f"from_gym_data: a Graph value must be a gymnasium GraphInstance, got {type(data).__name__}")
    b = space.backend
    nodes = np.asarray(data.nodes)
    node_count = int(nodes.shape[0]) if nodes.ndim else 0

    def count(n: int) -> Any:
        return b.from_numpy(np.asarray(n, dtype=np.int64), dtype=b.default_integer_dtype, device=space.device)

    node_features = from_gym_data(batch_space(space.node_feature_space, node_count), nodes)
    out: GraphInstance = GraphInstance(n_nodes=count(node_count), nodes_features=node_features)
    if space.is_edge:
        if data.edge_links is None or data.edges is None:
            raise ValueError(f"from_gym_data: {space} has edges, the gymnasium value has none")
        links = np.asarray(data.edge_links)
        if links.ndim != 2 or links.shape[1] != 2 or links.dtype.kind not in "iu":
            raise ValueError(f"from_gym_data: edge_links must be integer pairs of shape (n, 2), got {links.shape}")
        edge_space = space.edge_feature_space
        if edge_space is None:
            raise RuntimeError("internal invariant violated: _check_gym_graph lets no featureless edges through")
        out.n_edges = count(int(links.shape[0]))
        out.edges = b.from_numpy(links.astype(np.int64), dtype=b.default_integer_dtype, device=space.device)
        out.edges_features = from_gym_data(batch_space(edge_space, int(links.shape[0])), data.edges)
    if not space.contains(out):
        raise ValueError(f"from_gym_data: the gymnasium graph is not a graph of {space} (counts, bounds or edges)")
    return out


def gym_kind(space: Space) -> Optional[str]:
    """The gymnasium space kind `space` was made from (`"Discrete"`, `"MultiDiscrete"`), or None."""
    kind = space.metadata.get(GYM_KIND_KEY)
    return kind if isinstance(kind, str) else None


__all__ = ["to_gym_space", "from_gym_space", "to_gym_data", "from_gym_data", "gym_kind", "GYM_KIND_KEY"]
