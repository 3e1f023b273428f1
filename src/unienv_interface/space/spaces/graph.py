"""`GraphSpace`: graphs with a varying number of nodes (and edges), each carrying a feature array.

An element is a `GraphInstance`. A batch of graphs (`batch_shape` not empty) keeps every field with the batch axes
in front; the node and edge axes are padded to the largest graph of the batch (node and edge features with 0
clipped into the feature bounds, edge endpoints with 0).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Generic, Mapping, Optional, Sequence, Tuple

import numpy as np

from unienv_interface.backends.base import BArrayType, BDeviceType, BDtypeType, BRNGType

from ..metadata import SpaceMetadata
from ..space import Space, array_data_to, check_backend
from .box import BoxSpace, as_member_array, clip_within, sample_within, values_within


@dataclasses.dataclass(eq=False)
class GraphInstance(Generic[BArrayType]):
    """One graph, or a batch of graphs (all fields with the batch axes in front).

    Equality is identity (compare the fields); the arrays are the backend's."""

    n_nodes: Any
    """Number of nodes, shape `batch_shape` (integer)."""

    n_edges: Optional[Any] = None
    """Number of edges, shape `batch_shape` (integer), or None for a graph without edges."""

    nodes_features: Optional[Any] = None
    """Node features, shape `batch_shape + (max n_nodes,) + node_feature_space.shape`."""

    edges_features: Optional[Any] = None
    """Edge features, shape `batch_shape + (max n_edges,) + edge_feature_space.shape`, or None."""

    edges: Optional[Any] = None
    """Edge endpoints (node indices), shape `batch_shape + (max n_edges, 2)` (integer), or None."""


def _count(value: Any, name: str, minimum: int, optional: bool = False) -> Optional[int]:
    if value is None and optional:
        return None
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"GraphSpace {name} must be an int{' or None' if optional else ''}, got {value!r}")
    if value < minimum:
        raise ValueError(f"GraphSpace {name} must be at least {minimum}, got {value}")
    return int(value)


def _max(a: np.ndarray) -> int:
    return int(a.max()) if a.size else 0


class GraphSpace(Space[GraphInstance, BDeviceType, BDtypeType, BRNGType]):
    """Graphs of `min_nodes..max_nodes` nodes (`max_nodes` None: unbounded), each node carrying an element of
    `node_feature_space` (a BoxSpace). With `is_edge`, graphs also have `min_edges..max_edges` directed edges
    (endpoint pairs of node indices), with features from `edge_feature_space` when one is given.

    `batch_shape` makes it a space of batches of graphs (what `batch_space` gives). Equality compares every field;
    device and metadata are ignored. `shape` and `dtype` are None.
    """

    def __init__(self, backend: Any, node_feature_space: BoxSpace, edge_feature_space: Optional[BoxSpace] = None,
                 is_edge: bool = False, min_nodes: int = 1, max_nodes: Optional[int] = None, min_edges: int = 1,
                 max_edges: Optional[int] = None, batch_shape: Sequence[int] = (), device: Any = None,
                 metadata: Optional[Mapping[str, Any]] = None) -> None:
        backend = check_backend(backend)
        if not isinstance(node_feature_space, BoxSpace):
            raise TypeError(f"GraphSpace node_feature_space must be a BoxSpace, got {type(node_feature_space).__name__}")
        if node_feature_space.backend is not backend:
            raise ValueError(f"GraphSpace node_feature_space uses backend {node_feature_space.backend}, expected "
                             f"{backend}")
        if not isinstance(is_edge, (bool, np.bool_)):
            raise TypeError(f"GraphSpace is_edge must be a bool, got {is_edge!r}")
        if edge_feature_space is not None:
            if not is_edge:
                raise ValueError("GraphSpace edge_feature_space needs is_edge=True (a graph without edges has no "
                                 "edge features)")
            if not isinstance(edge_feature_space, BoxSpace):
                raise TypeError(f"GraphSpace edge_feature_space must be a BoxSpace or None, got "
                                f"{type(edge_feature_space).__name__}")
            if edge_feature_space.backend is not backend:
                raise ValueError(f"GraphSpace edge_feature_space uses backend {edge_feature_space.backend}, "
                                 f"expected {backend}")
        try:
            shape = tuple(batch_shape)
        except TypeError:
            raise TypeError(f"GraphSpace batch_shape must be a sequence of ints, got {batch_shape!r}") from None
        if any(isinstance(d, (bool, np.bool_)) or not isinstance(d, (int, np.integer)) or d < 0 for d in shape):
            raise ValueError(f"GraphSpace batch_shape must hold non-negative ints, got {shape!r}")
        lo_n = _count(min_nodes, "min_nodes", 1)
        if lo_n is None:
            raise RuntimeError("internal invariant violated: min_nodes is None")
        hi_n = _count(max_nodes, "max_nodes", lo_n, optional=True)
        lo_e = _count(min_edges, "min_edges", 1)
        if lo_e is None:
            raise RuntimeError("internal invariant violated: min_edges is None")
        hi_e = _count(max_edges, "max_edges", lo_e, optional=True)
        if is_edge and hi_n is not None:
            possible = hi_n * (hi_n - 1)
            for name, value in (("min_edges", lo_e), ("max_edges", hi_e)):
                if value is not None and value > possible:
                    raise ValueError(f"GraphSpace {name}={value} exceeds the {possible} edges that max_nodes={hi_n} "
                                     "nodes allow")
        if device is None:
            device = node_feature_space.device
        else:
            node_feature_space = node_feature_space.to(device=device)
            edge_feature_space = None if edge_feature_space is None else edge_feature_space.to(device=device)
        super().__init__(backend, shape=None, device=device, dtype=None, metadata=metadata)
        self.node_feature_space: BoxSpace = node_feature_space
        self.edge_feature_space: Optional[BoxSpace] = edge_feature_space
        self.is_edge = bool(is_edge)
        self.min_nodes: int = lo_n
        self.max_nodes: Optional[int] = hi_n
        self.min_edges: int = lo_e
        self.max_edges: Optional[int] = hi_e
        self.batch_shape: Tuple[int, ...] = tuple(int(d) for d in shape)

    def replace(self, **changes: Any) -> "GraphSpace":
        """A copy with some constructor arguments changed (e.g. `batch_shape=(4,)`); metadata kept unless given."""
        args = dict(node_feature_space=self.node_feature_space, edge_feature_space=self.edge_feature_space,
                    is_edge=self.is_edge, min_nodes=self.min_nodes, max_nodes=self.max_nodes,
                    min_edges=self.min_edges, max_edges=self.max_edges, batch_shape=self.batch_shape,
                    device=self._device, metadata=self._metadata)
        backend = changes.pop("backend", self._backend)
        unknown = set(changes) - set(args)
        if unknown:
            raise TypeError(f"GraphSpace.replace: unknown argument(s) {sorted(unknown)}")
        args.update(changes)
        return GraphSpace(backend, **args)

    def _copy_with(self, metadata: SpaceMetadata) -> "GraphSpace":
        return self.replace(metadata=metadata)

    def _moved(self, backend: Any, device: Any) -> "GraphSpace":
        edge = None if self.edge_feature_space is None else self.edge_feature_space.to(backend, device)
        return self.replace(backend=backend, node_feature_space=self.node_feature_space.to(backend, device),
                            edge_feature_space=edge, device=device)

    # ------------------------------------------------------------------ layout of (batched) instances
    def _feature_spaces(self) -> Tuple[BoxSpace, Optional[BoxSpace]]:
        return self.node_feature_space, self.edge_feature_space

    def instance_slots(self, x: GraphInstance) -> Tuple[int, int]:
        """`(node slots, edge slots)`: the lengths of the (padded) node and edge axes of instance `x`."""
        axis = len(x.n_nodes.shape)
        nodes = 0 if x.nodes_features is None else int(x.nodes_features.shape[axis])
        edges = max([int(a.shape[axis]) for a in (x.edges, x.edges_features) if a is not None] or [0])
        return nodes, edges

    def _pad_axis(self, a: Optional[Any], axis: int, size: int, feature: Optional[BoxSpace]) -> Optional[Any]:
        if a is None or a.shape[axis] >= size:
            return a
        b = self._backend
        if feature is None:        # edge endpoints
            return b.pad_dim(a, axis, size, 0)
        pad_shape = tuple(a.shape[:axis]) + (size - a.shape[axis],) + tuple(a.shape[axis + 1:])
        zero = np.clip(np.zeros(feature.shape, dtype=feature.low_numpy.dtype), feature.low_numpy, feature.high_numpy)
        block = b.from_numpy(np.ascontiguousarray(np.broadcast_to(zero, pad_shape)), dtype=a.dtype,
                             device=b.device(a))
        return b.concat([a, block], axis=axis)

    def pad_instance(self, x: GraphInstance, node_slots: int, edge_slots: int) -> GraphInstance:
        """`x` with its node and edge axes padded to `node_slots` / `edge_slots` (features with 0 clipped into the
        feature bounds, endpoints with 0); longer axes are kept."""
        axis = len(x.n_nodes.shape)
        node_space, edge_space = self._feature_spaces()
        return GraphInstance(n_nodes=x.n_nodes, n_edges=x.n_edges,
                             nodes_features=self._pad_axis(x.nodes_features, axis, node_slots, node_space),
                             edges_features=self._pad_axis(x.edges_features, axis, edge_slots, edge_space),
                             edges=self._pad_axis(x.edges, axis, edge_slots, None))

    def trim_instance(self, x: GraphInstance) -> GraphInstance:
        """`x` with the node and edge axes cut to the largest node / edge count (padding no graph needs)."""
        b = self._backend
        axis = len(x.n_nodes.shape)
        cut = (slice(None),) * axis

        def trim(a: Optional[Any], n: int) -> Optional[Any]:
            return a if a is None or a.shape[axis] <= n else a[cut + (slice(0, n),)]

        nodes = _max(np.asarray(b.to_numpy(x.n_nodes)))
        edges = _max(np.asarray(b.to_numpy(x.n_edges))) if x.n_edges is not None else None
        return GraphInstance(n_nodes=x.n_nodes, n_edges=x.n_edges, nodes_features=trim(x.nodes_features, nodes),
                             edges_features=x.edges_features if edges is None else trim(x.edges_features, edges),
                             edges=x.edges if edges is None else trim(x.edges, edges))

    # ------------------------------------------------------------------ elements
    def is_bounded(self, manner: str = "both") -> bool:
        return all(s.is_bounded(manner) for s in self._feature_spaces() if s is not None)

    def _counts(self, a: Any, low: int, high: Optional[int]) -> Optional[np.ndarray]:
        """`a` as a NumPy array of counts when it is an integer array of `batch_shape` within `[low, high]`."""
        b = self._backend
        a = as_member_array(b, a)
        if a is None or not b.dtype_is_real_integer(a.dtype) or tuple(a.shape) != self.batch_shape:
            return None
        counts = np.asarray(b.to_numpy(a)).astype(np.int64)
        if counts.size and (counts.min() < low or (high is not None and counts.max() > high)):
            return None
        return counts

    def _features_ok(self, a: Any, space: BoxSpace, slots: int) -> bool:
        a = as_member_array(self._backend, a)
        if a is None or tuple(a.shape) != self.batch_shape + (slots,) + space.shape:
            return False
        return values_within(self._backend, a, space.dtype, space.low_numpy, space.high_numpy)

    def contains(self, x: Any) -> bool:
        """True for a GraphInstance of this space: counts of `batch_shape` within the ranges, node features (and
        edge features when given) of the padded shapes within their bounds, integer edge endpoints of shape
        `batch_shape + (max n_edges, 2)` naming existing nodes; no edge fields for a space without edges."""
        if not isinstance(x, GraphInstance):
            return False
        n_nodes = self._counts(x.n_nodes, self.min_nodes, self.max_nodes)
        if n_nodes is None or x.nodes_features is None:
            return False
        if not self._features_ok(x.nodes_features, self.node_feature_space, _max(n_nodes)):
            return False
        if not self.is_edge:
            return x.n_edges is None and x.edges is None and x.edges_features is None
        n_edges = self._counts(x.n_edges, self.min_edges, self.max_edges)
        edges = as_member_array(self._backend, x.edges)
        slots = _max(n_edges) if n_edges is not None else 0
        if n_edges is None or edges is None or not self._backend.dtype_is_real_integer(edges.dtype):
            return False
        if tuple(edges.shape) != self.batch_shape + (slots, 2):
            return False
        if x.edges_features is not None and (self.edge_feature_space is None or not self._features_ok(
                x.edges_features, self.edge_feature_space, slots)):
            return False
        count = int(math.prod(self.batch_shape))
        ends = np.asarray(self._backend.to_numpy(edges)).astype(np.int64).reshape(count, slots, 2)
        real = np.arange(slots)[None, :] < n_edges.reshape(count, 1)
        ok = (ends >= 0) & (ends < n_nodes.reshape(count, 1, 1))
        both_ends: np.ndarray = np.asarray(ok.all(axis=-1))
        return bool(both_ends[real].all())

    def clip(self, x: Any) -> GraphInstance:
        """`x` with node and edge features clamped into their bounds (counts are kept; ValueError when they are
        outside the ranges, since nodes and edges are neither invented nor dropped here)."""
        if not isinstance(x, GraphInstance):
            raise TypeError(f"GraphSpace.clip expects a GraphInstance, got {type(x).__name__}")
        if self._counts(x.n_nodes, self.min_nodes, self.max_nodes) is None or x.nodes_features is None:
            raise ValueError(f"GraphSpace.clip: n_nodes must be integers of shape {self.batch_shape} in "
                             f"[{self.min_nodes}, {self.max_nodes}] and node features must be given")
        if self.is_edge and (x.n_edges is None or x.edges is None
                             or self._counts(x.n_edges, self.min_edges, self.max_edges) is None):
            raise ValueError(f"GraphSpace.clip: n_edges must be integers of shape {self.batch_shape} in "
                             f"[{self.min_edges}, {self.max_edges}] and edges must be given")

        def clamp(a: Optional[Any], space: Optional[BoxSpace]) -> Optional[Any]:
            if a is None or space is None:
                return None
            return clip_within(self._backend, a, space.low_numpy, space.high_numpy, space.dtype, space.device)

        if not self.is_edge:
            return GraphInstance(n_nodes=x.n_nodes, nodes_features=clamp(x.nodes_features, self.node_feature_space))
        return GraphInstance(n_nodes=x.n_nodes, n_edges=x.n_edges,
                             nodes_features=clamp(x.nodes_features, self.node_feature_space),
                             edges_features=clamp(x.edges_features, self.edge_feature_space), edges=x.edges)

    def sample(self, rng: Any) -> Tuple[Any, GraphInstance]:
        """`(rng, graph)`: node counts uniform in the range (`min_nodes` plus an exponential draw when unbounded),
        edge counts uniform in `[min_edges, max_edges]` (up to `n_nodes**2` when unbounded), endpoints uniform
        over each graph's nodes, features as their BoxSpace samples them (padding included)."""
        b = self._backend
        shape = self.batch_shape
        if self.max_nodes is not None:
            rng, draw = b.random.random_discrete_uniform(shape, self.min_nodes, self.max_nodes + 1, rng=rng)
            n_nodes = np.asarray(b.to_numpy(draw)).astype(np.int64).reshape(shape)
        else:
            rng, draw = b.random.random_exponential(shape, rng=rng)
            n_nodes = np.floor(np.asarray(b.to_numpy(draw), dtype=np.float64)).astype(np.int64).reshape(shape)
            n_nodes += self.min_nodes
        int_dt = b.default_integer_dtype
        out: GraphInstance = GraphInstance(n_nodes=b.from_numpy(n_nodes, dtype=int_dt, device=self._device))
        node = self.node_feature_space
        full = shape + (_max(n_nodes),) + node.shape
        rng, out.nodes_features = sample_within(b, rng, np.broadcast_to(node.low_numpy, full),
                                                np.broadcast_to(node.high_numpy, full), node.dtype, node.device)
        if not self.is_edge:
            return rng, out
        top = np.full(shape, self.max_edges, dtype=np.int64) if self.max_edges is not None else n_nodes ** 2
        top = np.maximum(top, self.min_edges)
        rng, draw = b.random.random_uniform(shape, rng=rng)
        u = np.asarray(b.to_numpy(draw), dtype=np.float64).reshape(shape)
        n_edges = np.minimum(self.min_edges + np.floor(u * (top - self.min_edges + 1)).astype(np.int64), top)
        slots = _max(n_edges)
        rng, draw = b.random.random_uniform(shape + (slots, 2), rng=rng)
        u = np.asarray(b.to_numpy(draw), dtype=np.float64).reshape(shape + (slots, 2))
        ends = np.minimum(np.floor(u * n_nodes[..., None, None]), n_nodes[..., None, None] - 1).astype(np.int64)
        out.n_edges = b.from_numpy(n_edges, dtype=int_dt, device=self._device)
        out.edges = b.from_numpy(ends, dtype=int_dt, device=self._device)
        edge = self.edge_feature_space
        if edge is not None:
            full = shape + (slots,) + edge.shape
            rng, out.edges_features = sample_within(b, rng, np.broadcast_to(edge.low_numpy, full),
                                                    np.broadcast_to(edge.high_numpy, full), edge.dtype, edge.device)
        return rng, out

    def create_empty(self) -> GraphInstance:
        """Not supported (as in the reference): a graph has no single empty shape; build a GraphInstance."""
        raise NotImplementedError("GraphSpace has no create_empty: build a GraphInstance of the sizes you need")

    def data_to(self, data: Any, backend: Any = None, device: Any = None) -> GraphInstance:
        if not isinstance(data, GraphInstance):
            raise TypeError(f"GraphSpace.data_to expects a GraphInstance, got {type(data).__name__}")
        return GraphInstance(**{f.name: None if getattr(data, f.name) is None
                                else array_data_to(self, getattr(data, f.name), backend, device)
                                for f in dataclasses.fields(GraphInstance)})

    # ------------------------------------------------------------------ comparison
    def get_repr(self, abbreviate: bool = False, include_backend: bool = True, include_device: bool = True,
                 include_dtype: bool = True) -> str:
        parts = [f"nodes=[{self.min_nodes}, {self.max_nodes}] "
                 f"{self.node_feature_space.get_repr(abbreviate, False, False, include_dtype)}"]
        if self.is_edge:
            edge = self.edge_feature_space
            parts.append(f"edges=[{self.min_edges}, {self.max_edges}]"
                         + ("" if edge is None else " " + edge.get_repr(abbreviate, False, False, include_dtype)))
        if self.batch_shape:
            parts.append(f"batch_shape={self.batch_shape}")
        if include_backend:
            parts.append(f"backend={self._backend}")
        if include_device and self._device is not None:
            parts.append(f"device={self._device}")
        return f"GraphSpace({', '.join(parts)})"

    def is_subspaceeq(self, other: Space) -> bool:
        """True when `other` is a GraphSpace of the same backend, batch shape and `is_edge` whose count ranges
        enclose this one's (None as unbounded; edge counts only for spaces with edges) and whose feature spaces
        hold this one's (both absent or both present)."""
        if not (isinstance(other, GraphSpace) and other.backend is self._backend
                and other.batch_shape == self.batch_shape and other.is_edge == self.is_edge):
            return False

        def within(lo: int, hi: Optional[int], olo: int, ohi: Optional[int]) -> bool:
            return olo <= lo and (ohi is None or (hi is not None and hi <= ohi))

        if not within(self.min_nodes, self.max_nodes, other.min_nodes, other.max_nodes):
            return False
        if self.is_edge and not within(self.min_edges, self.max_edges, other.min_edges, other.max_edges):
            return False
        if not self.node_feature_space.is_subspaceeq(other.node_feature_space):
            return False
        mine, theirs = self.edge_feature_space, other.edge_feature_space
        if mine is None or theirs is None:
            return mine is None and theirs is None
        return mine.is_subspaceeq(theirs)

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, GraphSpace) and other.backend is self._backend and other.is_edge == self.is_edge
                and other.batch_shape == self.batch_shape and other.min_nodes == self.min_nodes
                and other.max_nodes == self.max_nodes and other.min_edges == self.min_edges
                and other.max_edges == self.max_edges and other.node_feature_space == self.node_feature_space
                and other.edge_feature_space == self.edge_feature_space)

    __hash__ = None  # type: ignore[assignment]
