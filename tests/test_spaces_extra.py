"""DynamicBoxSpace, UnionSpace and GraphSpace (with GraphInstance), and the subspace relation of every space:
construction and its errors, membership, sampling, backends, batching, flattening and JSON, property-based round
trips, and a differential run against the reference (unienv 0.0.1b16) in its own venv."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Tuple

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import unienv_interface.space as space_pkg
import unienv_interface.space.spaces as spaces_pkg
from _third_party import has_venv, venv_python
from unienv_interface.backends import NumpyComputeBackend as NB
from unienv_interface.space import (BatchedSpace, BinarySpace, BoxSpace, DictSpace, DynamicBoxSpace, GraphInstance,
                                    GraphSpace, Space, TextSpace, TupleSpace, UnionSpace)
from unienv_interface.space.space_utils import batch_utils as bu
from unienv_interface.space.space_utils import flatten_utils as fu
from unienv_interface.space.space_utils import serialization_utils as su

from _backend_params import BACKENDS, JB, TB, needs_torch, torch  # noqa: F401

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = Path(__file__).parent / "fixtures" / "extra_spaces_scenarios.py"


def dt(B: Any, name: str) -> Any:
    return B.dtype_from_name(name)


def a(B: Any, values: Any, name: str) -> Any:
    return B.from_numpy(np.asarray(values, dtype=np.dtype(name)), dtype=dt(B, name))


def npv(B: Any, x: Any) -> np.ndarray:
    return np.asarray(B.to_numpy(x))


def rng(B: Any, seed: int = 0) -> Any:
    return B.random.random_number_generator(seed)


def rows(B: Any, **kw: Any) -> DynamicBoxSpace:
    """Between 0 and 5 rows of 3 float32 values in [-1, 1]."""
    return DynamicBoxSpace(B, -1.0, 1.0, (0, 3), (5, 3), dt(B, "float32"), **kw)


def mixed_union(B: Any) -> UnionSpace:
    return UnionSpace(B, [BoxSpace(B, 0, 10, dt(B, "int32"), shape=(2,)), BinarySpace(B, (3,)),
                          BoxSpace(B, -2.5, 1.0, dt(B, "float32"), shape=(1,))])


def feature(B: Any, low: float = -1.0, high: float = 1.0, shape: Tuple[int, ...] = (2,)) -> BoxSpace:
    return BoxSpace(B, low, high, dt(B, "float32"), shape=shape)


def edge_graphs(B: Any, **kw: Any) -> GraphSpace:
    return GraphSpace(B, feature(B), BoxSpace(B, 0, 5, dt(B, "int32"), shape=()), is_edge=True, min_nodes=2,
                      max_nodes=5, min_edges=1, max_edges=6, **kw)


def graph(B: Any, n: int, feats: Any, edges: Any = None, efeat: Any = None) -> GraphInstance:
    i = npv(B, B.from_numpy(np.zeros(0), dtype=B.default_integer_dtype)).dtype.name
    return GraphInstance(n_nodes=a(B, n, i), n_edges=None if edges is None else a(B, len(edges), i),
                         nodes_features=a(B, feats, "float32"),
                         edges_features=None if efeat is None else a(B, efeat, "int32"),
                         edges=None if edges is None else a(B, edges, i))


def json_round_trip(sp: Space, B: Any) -> Space:
    return su.json_to_space(json.loads(json.dumps(su.space_to_json(sp))), B)


# ================================================================================================ imports
def test_the_names_import_from_both_packages() -> None:
    for name in ("DynamicBoxSpace", "UnionSpace", "GraphSpace", "GraphInstance"):
        assert getattr(space_pkg, name) is getattr(spaces_pkg, name)
        assert name in space_pkg.__all__ and name in spaces_pkg.__all__
    assert set(space_pkg.__all__) == set(spaces_pkg.__all__)


# ================================================================================================ DynamicBoxSpace
class TestDynamicBox:
    @pytest.mark.parametrize("B", BACKENDS)
    def test_properties(self, B: Any) -> None:
        sp = rows(B, fill_value=2)
        assert sp.shape is None and sp.dtype == dt(B, "float32") and sp.device is None
        assert sp.shape_low == (0, 3) and sp.shape_high == (5, 3) and sp.variable_axes == (0,)
        assert sp.fill_value == 2
        assert tuple(sp.low.shape) == (1, 3) and npv(B, sp.high).tolist() == [[1.0, 1.0, 1.0]]
        assert tuple(sp.get_low((4, 3)).shape) == (4, 3)
        assert sp.is_bounded() and not DynamicBoxSpace(B, -np.inf, 0.0, (1,), (2,), dt(B, "float32")).is_bounded()

    def test_python_dtypes_and_infinite_integer_bounds(self) -> None:
        sp = DynamicBoxSpace(NB, 0.0, 1.0, (1,), (3,), float)
        assert sp.dtype == np.float64
        ints = DynamicBoxSpace(NB, -np.inf, np.inf, (1,), (4,), np.int32)
        assert ints.low_numpy.tolist() == [-(2 ** 31)] and ints.high_numpy.tolist() == [2 ** 31 - 1]

    @pytest.mark.parametrize("kwargs, error, match", [
        (dict(shape_low=(2, 3), shape_high=(2, 3)), ValueError, r"use BoxSpace"),
        (dict(shape_low=(3,), shape_high=(2,)), ValueError, r"shape_low <= shape_high.*\(3,\) and \(2,\)"),
        (dict(shape_low=(1, 3), shape_high=(2,)), ValueError, r"same length.*\(1, 3\) and \(2,\)"),
        (dict(shape_low=(-1,), shape_high=(2,)), ValueError, r"non-negative"),
        (dict(shape_low=(1.5,), shape_high=(2,)), TypeError, r"sequence of ints"),
        (dict(dtype=np.bool_), TypeError, r"real floating or integer.*bool"),
        (dict(dtype=None), TypeError, r"needs a dtype"),
        (dict(low=2.0, high=1.0), ValueError, r"low <= high"),
        (dict(low=np.nan), ValueError, r"NaN"),
        (dict(low=np.array([0.0, 0.5])), ValueError, r"variable axes \[0\]"),
        (dict(fill_value=np.nan), ValueError, r"fill_value must not be NaN"),
        (dict(fill_value="x"), TypeError, r"fill_value must be an int or a float, got 'x'"),
        (dict(dtype=np.uint8, fill_value=300), ValueError, r"fill_value must be a whole number in \[0, 255\].*300"),
    ])
    def test_invalid_construction_raises(self, kwargs: Dict[str, Any], error: type, match: str) -> None:
        args: Dict[str, Any] = dict(low=0.0, high=1.0, shape_low=(1,), shape_high=(2,), dtype=np.float32)
        args.update(kwargs)
        with pytest.raises(error, match=match):
            DynamicBoxSpace(NB, **args)

    @pytest.mark.parametrize("B", BACKENDS)
    def test_contains(self, B: Any) -> None:
        sp = rows(B)
        assert sp.contains(a(B, [[0.5, -0.5, 0.0]], "float32"))
        assert sp.contains(a(B, np.zeros((0, 3)), "float32")) and sp.contains(a(B, np.zeros((5, 3)), "float32"))
        assert not sp.contains(a(B, np.zeros((6, 3)), "float32"))       # longer than shape_high
        assert not sp.contains(a(B, np.zeros((2, 4)), "float32"))       # a fixed axis of another size
        assert not sp.contains(a(B, np.zeros(3), "float32"))            # another number of axes
        assert not sp.contains(a(B, np.full((1, 3), 1.5), "float32"))   # out of bounds
        assert sp.contains(a(B, np.zeros((2, 3)), "int8"))              # casts without loss, as BoxSpace
        assert not sp.contains(a(B, np.zeros((2, 3)), "float64"))       # would lose precision
        assert not sp.contains([[0.0, 0.0, 0.0]])

    @pytest.mark.parametrize("B", BACKENDS)
    def test_sample_empty_clip(self, B: Any) -> None:
        sp = DynamicBoxSpace(B, a(B, [[0, 10]], "int16"), 20, (1, 2), (4, 2), dt(B, "int16"))
        r = rng(B)
        shapes = set()
        for _ in range(40):
            r, x = sp.sample(r)
            assert sp.contains(x) and x.dtype == dt(B, "int16")
            shapes.add(tuple(x.shape))
        assert shapes == {(1, 2), (2, 2), (3, 2), (4, 2)}
        empty = sp.create_empty()
        assert tuple(empty.shape) == (4, 2) and not npv(B, empty).any()
        clipped = sp.clip(a(B, np.full((6, 2), 50), "int16"))
        assert npv(B, clipped).tolist() == [[20, 20]] * 4
        with pytest.raises(ValueError, match="shorter than shape_low"):
            sp.clip(a(B, np.zeros((0, 2)), "int16"))

    @pytest.mark.parametrize("B", BACKENDS)
    def test_equality_to_and_data_to(self, B: Any) -> None:
        sp = rows(B, metadata={"kind": "points"})
        assert sp == rows(B) and sp != rows(B, fill_value=1)   # fill_value changes the flat form: it counts
        assert sp != DynamicBoxSpace(B, -1.0, 2.0, (0, 3), (5, 3), dt(B, "float32"))
        assert sp != BoxSpace(B, -1.0, 1.0, dt(B, "float32"), shape=(5, 3))
        assert sp.to(NB).to(B) == sp and sp.to(NB).metadata == {"kind": "points"}
        x = a(B, [[0.5, 0.5, 0.5]], "float32")
        assert np.array_equal(sp.data_to(x, NB), [[0.5, 0.5, 0.5]])
        text = sp.get_repr()
        assert "shape_low=(0, 3)" in text and "shape_high=(5, 3)" in text and "float32" in text

    def test_unpad_never_goes_below_shape_low(self) -> None:
        sp = DynamicBoxSpace(NB, -1.0, 1.0, (2, 1), (4, 1), np.float32)
        x = np.zeros((3, 1), np.float32)                      # every value equals fill_value 0
        assert fu.unflatten_data(sp, fu.flatten_data(sp, x)).shape == (2, 1)   # reference: (0, 1)
        y = np.array([[0.5], [0.0], [0.5]], np.float32)
        np.testing.assert_array_equal(fu.unflatten_data(sp, fu.flatten_data(sp, y)), y)

    @pytest.mark.parametrize("B", BACKENDS)
    def test_flatten(self, B: Any) -> None:
        sp = DynamicBoxSpace(B, a(B, [[-1.0, -2.0, -3.0]], "float32"), 2.0, (1, 3), (4, 3), dt(B, "float32"),
                             fill_value=5)
        assert fu.flat_dim(sp) == 12 and fu.is_flattenable(sp)
        box = fu.flatten_space(sp)
        assert box.shape == (12,) and box.dtype == dt(B, "float32") and len(box.metadata) == 0
        assert box.low_numpy.tolist() == [-1.0, -2.0, -3.0] * 4
        assert box.high_numpy.tolist() == [2.0] * 3 + [5.0] * 9        # padding slots admit the fill value
        x = a(B, [[0.0, -1.5, 2.0], [1.0, 1.0, 1.0]], "float32")
        flat = fu.flatten_data(sp, x)
        assert npv(B, flat).tolist() == [0.0, -1.5, 2.0, 1.0, 1.0, 1.0] + [5.0] * 6 and box.contains(flat)
        back = fu.unflatten_data(sp, flat)
        assert npv(B, back).tolist() == npv(B, x).tolist() and back.dtype == dt(B, "float32")
        with pytest.raises(ValueError, match=r"between \(1, 3\) and \(4, 3\).*\(5, 3\)"):
            fu.flatten_data(sp, a(B, np.zeros((5, 3)), "float32"))
        with pytest.raises(TypeError, match="got list"):
            fu.flatten_data(sp, [[0.0, 0.0, 0.0]])

    @pytest.mark.parametrize("B", BACKENDS)
    def test_flatten_in_a_dict_promotes(self, B: Any) -> None:
        d = DictSpace(B, {"d": rows(B), "i": BoxSpace(B, 0, 3, dt(B, "uint8"), shape=(2,))})
        assert fu.flat_dim(d) == 17
        box = fu.flatten_space(d)
        assert box.dtype == dt(B, "float32") and box.shape == (17,)
        value = {"d": a(B, [[0.5, 0.5, 0.5]], "float32"), "i": a(B, [1, 2], "uint8")}
        flat = fu.flatten_data(d, value)
        assert npv(B, flat).tolist() == [0.5] * 3 + [0.0] * 12 + [1.0, 2.0]
        back = fu.unflatten_data(d, flat)
        assert npv(B, back["d"]).tolist() == [[0.5] * 3] and back["i"].dtype == dt(B, "uint8")

    @pytest.mark.parametrize("B", BACKENDS)
    def test_batching(self, B: Any) -> None:
        sp = rows(B, fill_value=9)
        batched = bu.batch_space(sp, 2)
        assert batched.shape_low == (2, 0, 3) and batched.shape_high == (2, 5, 3) and batched.fill_value == 9
        assert bu.batch_size(batched) == 2 and bu.get_single_space(batched) == sp
        assert list(bu.unbatch_spaces(batched)) == [sp, sp]
        x1, x2 = a(B, [[0.5] * 3, [0.25] * 3], "float32"), a(B, [[1.0] * 3], "float32")
        data = bu.concatenate(batched, [x1, x2])
        assert npv(B, data).tolist() == [[[0.5] * 3, [0.25] * 3], [[1.0] * 3, [9.0] * 3]]
        assert npv(B, bu.get_at(batched, data, 1)).tolist() == [[1.0] * 3, [9.0] * 3]
        assert bu.batch_size_data(data) == 2 and len(list(bu.iterate(batched, data))) == 2
        grown = bu.set_at(batched, data, 0, a(B, [[-1.0] * 3] * 4, "float32"))   # longer than the batch: it grows
        assert tuple(grown.shape) == (2, 4, 3)
        assert npv(B, grown)[1].tolist() == [[1.0] * 3] + [[9.0] * 3] * 3
        short = bu.set_at(batched, data, 1, a(B, [[-1.0] * 3], "float32"))      # shorter: padded, not broadcast
        assert npv(B, short)[1].tolist() == [[-1.0] * 3, [9.0] * 3]
        rows_ = fu.flatten_data(batched, data, start_dim=1)
        assert tuple(rows_.shape) == (2, 15) and fu.flat_dim(batched, 1) == 15
        assert fu.flatten_space(batched, 1).shape == (2, 15)
        assert npv(B, fu.unflatten_data(batched, rows_, start_dim=1)).tolist() == npv(B, data).tolist()
        with pytest.raises(ValueError, match="no fixed leading"):
            bu.batch_size(sp)

    @pytest.mark.parametrize("B", BACKENDS)
    def test_json(self, B: Any) -> None:
        sp = DynamicBoxSpace(B, a(B, [[-1.0, -2.0, -3.0]], "float32"), 1.0, (0, 3), (5, 3), dt(B, "float32"),
                             fill_value=5, metadata={"kind": "points"})
        js = su.space_to_json(sp)
        assert js == {"type": "DynamicBoxSpace", "low": [[-1.0, -2.0, -3.0]], "high": [[1.0]], "shape_low": [0, 3],
                      "shape_high": [5, 3], "dtype": "float32", "fill_value": 5, "metadata": {"kind": "points"}}
        back = json_round_trip(sp, B)
        assert back == sp and back.metadata == sp.metadata
        assert json_round_trip(bu.batch_space(sp, 3), NB) == bu.batch_space(sp.to(NB), 3)
        bad = dict(js, shape_high=[5])
        with pytest.raises(ValueError, match="same length"):
            su.json_to_space(bad, B)


# ================================================================================================ UnionSpace
class TestUnion:
    @pytest.mark.parametrize("B", BACKENDS)
    def test_properties_contains_sample(self, B: Any) -> None:
        u = mixed_union(B)
        assert len(u) == 3 and u[1] == BinarySpace(B, (3,)) and list(u) == list(u.spaces)
        assert u.shape is None and u.dtype is None
        good = (1, a(B, [True, False, True], "bool"))
        assert u.contains(good) and u.contains((np.int64(2), a(B, [0.5], "float32")))
        for bad in ([1, good[1]], (3, good[1]), (-1, good[1]), (0, good[1]), (0,), good[1], (1.0, good[1])):
            assert not u.contains(bad)
        r = rng(B)
        seen = set()
        for _ in range(30):
            r, x = u.sample(r)
            assert type(x[0]) is int and u.contains(x)
            seen.add(x[0])
        assert seen == {0, 1, 2}
        index, empty = u.create_empty()
        assert index == 0 and tuple(empty.shape) == (2,)
        assert u.clip((2, a(B, [5.0], "float32")))[0] == 2 and npv(B, u.clip((2, a(B, [5.0], "float32")))[1]) == 1.0
        with pytest.raises(ValueError, match=r"\(index, value\) tuple with 0 <= index < 3"):
            u.clip((7, None))

    @pytest.mark.parametrize("B", BACKENDS)
    def test_equality_backends_repr(self, B: Any) -> None:
        u = mixed_union(B)
        assert u == mixed_union(B) and u != UnionSpace(B, list(u.spaces)[:2])
        assert u != UnionSpace(B, list(reversed(u.spaces))) and u != TupleSpace(B, list(u.spaces))
        moved = u.to(NB)
        assert moved.backend is NB and moved.to(B) == u
        index, value = u.data_to((0, a(B, [1, 2], "int32")), NB)
        assert index == 0 and isinstance(value, np.ndarray) and value.tolist() == [1, 2]
        assert u.get_repr().startswith("UnionSpace(BoxSpace(") and u.is_bounded()

    def test_invalid_construction_raises(self) -> None:
        with pytest.raises(ValueError, match="at least one alternative"):
            UnionSpace(NB, [])
        with pytest.raises(TypeError, match="alternative 1 must be a Space, got str"):
            UnionSpace(NB, [BinarySpace(NB, ()), "x"])
        with pytest.raises(TypeError, match="iterable of spaces"):
            UnionSpace(NB, BinarySpace(NB, ()))
        if TB is not None:
            with pytest.raises(ValueError, match="backend pytorch, expected numpy"):
                UnionSpace(NB, [BinarySpace(TB, ())])

    @pytest.mark.parametrize("B", BACKENDS)
    def test_flatten(self, B: Any) -> None:
        u = mixed_union(B)
        assert fu.flat_dim(u) == 4 and fu.flat_dim(u, 1) is None
        box = fu.flatten_space(u)
        assert box.dtype == B.default_floating_dtype and box.shape == (4,)
        assert box.low_numpy.tolist() == [0.0, -2.5, -2.5, -2.5] and box.high_numpy.tolist() == [2.0, 10.0, 10.0, 10.0]
        for value, flat in [((0, a(B, [3, 10], "int32")), [0.0, 3.0, 10.0, 0.0]),
                            ((1, a(B, [True, False, True], "bool")), [1.0, 1.0, 0.0, 1.0]),
                            ((2, a(B, [0.5], "float32")), [2.0, 0.5, 0.0, 0.0])]:
            got = fu.flatten_data(u, value)
            assert npv(B, got).tolist() == flat and got.dtype == B.default_floating_dtype and box.contains(got)
            index, back = fu.unflatten_data(u, got)
            assert index == value[0] and back.dtype == value[1].dtype
            assert npv(B, back).tolist() == npv(B, value[1]).tolist()
        with pytest.raises(ValueError, match="start_dim 0"):
            fu.flatten_space(u, 1)
        with pytest.raises(ValueError, match=r"\(index, value\) tuple"):
            fu.flatten_data(u, [0, a(B, [3, 10], "int32")])
        with pytest.raises(ValueError, match="not the index of one of its 3"):
            fu.unflatten_data(u, a(B, [7.0, 0.0, 0.0, 0.0], npv(B, box.low).dtype.name))

    def test_flatten_errors_name_the_alternative(self) -> None:
        assert fu.flat_dim(UnionSpace(NB, [TextSpace(NB, 3)])) is None
        with pytest.raises(ValueError, match="defined character set"):
            fu.flatten_space(UnionSpace(NB, [TextSpace(NB, 3)]))
        with pytest.raises(NotImplementedError, match="Unknown space"):
            fu.flatten_space(UnionSpace(NB, [GraphSpace(NB, feature(NB))]))
        text = UnionSpace(NB, [TextSpace(NB, 4, charset="abc"), BoxSpace(NB, 0, 1, np.int64, shape=(1,))])
        assert fu.unflatten_data(text, fu.flatten_data(text, (0, "cab"))) == (0, "cab")

    @pytest.mark.parametrize("B", BACKENDS)
    def test_in_a_dict(self, B: Any) -> None:
        d = DictSpace(B, {"u": mixed_union(B), "x": BoxSpace(B, 0, 3, dt(B, "int32"), shape=(2,))})
        box = fu.flatten_space(d)
        assert box.shape == (6,) and box.dtype == B.promote_types(B.default_floating_dtype, dt(B, "int32"))
        value = {"u": (1, a(B, [True, True, False], "bool")), "x": a(B, [1, 2], "int32")}
        back = fu.unflatten_data(d, fu.flatten_data(d, value))
        assert back["u"][0] == 1 and npv(B, back["u"][1]).tolist() == [True, True, False]

    @pytest.mark.parametrize("B", BACKENDS)
    def test_batching(self, B: Any) -> None:
        u = mixed_union(B).with_metadata(kind="choice")
        batched = bu.batch_space(u, 3)
        assert isinstance(batched, BatchedSpace) and batched.single_space == u and batched.metadata == {"kind": "choice"}
        values = [(0, a(B, [3, 10], "int32")), (1, a(B, [True, False, True], "bool")), (2, a(B, [0.5], "float32"))]
        data = bu.concatenate(batched, values)
        assert data.shape == (3,) and data.dtype == object and batched.contains(data)
        assert bu.get_at(batched, data, 1)[0] == 1
        changed = bu.set_at(batched, data, 0, (2, a(B, [-1.0], "float32")))
        assert changed[0][0] == 2 and data[0][0] == 0          # functional: the input is unchanged
        assert [v[0] for v in bu.iterate(batched, data)] == [0, 1, 2]
        assert bu.concatenate(u, values).shape == (3,)         # the single space, as the reference accepts

    @pytest.mark.parametrize("B", BACKENDS)
    def test_json(self, B: Any) -> None:
        u = mixed_union(B).with_metadata(kind="choice")
        js = su.space_to_json(u)
        assert js["type"] == "UnionSpace" and [c["type"] for c in js["spaces"]] == ["BoxSpace", "BinarySpace", "BoxSpace"]
        assert js["metadata"] == {"kind": "choice"}
        assert json_round_trip(u, B) == u and json_round_trip(u, NB) == u.to(NB)
        assert json_round_trip(bu.batch_space(u, 2), B) == bu.batch_space(u, 2)


# ================================================================================================ GraphSpace
class TestGraph:
    @pytest.mark.parametrize("B", BACKENDS)
    def test_properties_and_sample(self, B: Any) -> None:
        g = edge_graphs(B)
        assert g.shape is None and g.dtype is None and g.batch_shape == () and g.is_edge
        assert (g.min_nodes, g.max_nodes, g.min_edges, g.max_edges) == (2, 5, 1, 6)
        for space in (g, bu.batch_space(g, 3), GraphSpace(B, feature(B)), GraphSpace(B, feature(B), is_edge=True)):
            r = rng(B, 3)
            for _ in range(8):
                r, x = space.sample(r)
                assert isinstance(x, GraphInstance) and space.contains(x)
        r, x = bu.batch_space(GraphSpace(B, feature(B), max_nodes=3), 4).sample(rng(B))
        assert tuple(x.n_nodes.shape) == (4,) and x.edges is None and x.n_edges is None
        with pytest.raises(NotImplementedError, match="create_empty"):
            g.create_empty()
        assert "nodes=[2, 5]" in g.get_repr() and "edges=[1, 6]" in g.get_repr() and g.is_bounded()

    @pytest.mark.parametrize("kwargs, error, match", [
        (dict(min_nodes=0), ValueError, r"min_nodes must be at least 1, got 0"),
        (dict(min_nodes=3, max_nodes=2), ValueError, r"max_nodes must be at least 3, got 2"),
        (dict(min_edges=0), ValueError, r"min_edges must be at least 1"),
        (dict(max_nodes=1.5), TypeError, r"max_nodes must be an int or None, got 1.5"),
        (dict(is_edge=True, max_nodes=2, min_edges=3), ValueError, r"min_edges=3 exceeds the 2 edges"),
        (dict(is_edge=True, max_nodes=3, max_edges=7), ValueError, r"max_edges=7 exceeds the 6 edges"),
        (dict(edge_feature_space="own"), ValueError, r"needs is_edge=True"),
        (dict(batch_shape=(-1,)), ValueError, r"batch_shape"),
        (dict(is_edge="yes"), TypeError, r"is_edge must be a bool"),
    ])
    def test_invalid_construction_raises(self, kwargs: Dict[str, Any], error: type, match: str) -> None:
        if kwargs.get("edge_feature_space") == "own":
            kwargs["edge_feature_space"] = feature(NB)
        with pytest.raises(error, match=match):
            GraphSpace(NB, feature(NB), **kwargs)

    def test_feature_spaces_must_be_boxes(self) -> None:
        with pytest.raises(TypeError, match="node_feature_space must be a BoxSpace, got BinarySpace"):
            GraphSpace(NB, BinarySpace(NB, (2,)))  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="edge_feature_space must be a BoxSpace or None"):
            GraphSpace(NB, feature(NB), BinarySpace(NB, ()), is_edge=True)  # type: ignore[arg-type]

    @pytest.mark.parametrize("B", BACKENDS)
    def test_contains(self, B: Any) -> None:
        g = edge_graphs(B)
        assert g.contains(graph(B, 2, [[0.0, 0.5], [1.0, -1.0]], [[0, 1], [1, 0], [1, 1]], [1, 2, 5]))
        assert g.contains(graph(B, 3, [[0.0, 0.0]] * 3, [[2, 1]]))          # edge features are optional
        for bad in (graph(B, 3, [[0.0, 0.0]] * 3),                            # no edges in a space with edges
                    graph(B, 1, [[0.0, 0.0]], [[0, 0]], [0]),                 # fewer nodes than min_nodes
                    graph(B, 2, [[0.0, 0.0]] * 2, [[0, 1]] * 7, [0] * 7),     # more edges than max_edges
                    graph(B, 2, [[0.0, 2.0]] * 2, [[0, 1]], [0]),             # node feature out of bounds
                    graph(B, 2, [[0.0, 0.0]] * 3, [[0, 1]], [0]),             # node axis not max(n_nodes) long
                    graph(B, 2, [[0.0, 0.0]] * 2, [[0, 1]], [9]),             # edge feature out of bounds
                    graph(B, 2, [[0.0, 0.0]] * 2, [[0, 2]], [0]),             # endpoint names no node
                    graph(B, 2, [[0.0, 0.0]] * 2, [[-1, 0]], [0]),
                    "graph"):
            assert not g.contains(bad)
        nodes_only = GraphSpace(B, feature(B))
        assert nodes_only.contains(graph(B, 3, [[0.1, 0.2]] * 3))
        assert not nodes_only.contains(graph(B, 2, [[0.0, 0.0]] * 2, [[0, 1]]))

    @pytest.mark.parametrize("B", BACKENDS)
    def test_batching(self, B: Any) -> None:
        g = edge_graphs(B)
        batched = bu.batch_space(g, 2)
        assert batched.batch_shape == (2,) and bu.batch_size(batched) == 2 and bu.get_single_space(batched) == g
        g1 = graph(B, 2, [[0.0, 0.5], [1.0, -1.0]], [[0, 1], [1, 0], [1, 1]], [1, 2, 5])
        g2 = graph(B, 4, [[0.5, 0.5]] * 4, [[3, 2]], [4])
        data = bu.concatenate(batched, [g1, g2])
        assert batched.contains(data) and bu.batch_size_data(data) == 2
        assert npv(B, data.nodes_features)[0].tolist() == [[0.0, 0.5], [1.0, -1.0], [0.0, 0.0], [0.0, 0.0]]
        assert npv(B, data.edges)[1].tolist() == [[3, 2], [0, 0], [0, 0]]
        assert npv(B, data.edges_features)[1].tolist() == [4, 0, 0]
        first = bu.get_at(batched, data, 0)                        # the padding the single graph needs no more
        assert g.contains(first) and tuple(first.nodes_features.shape) == (2, 2)
        assert [int(npv(B, x.n_nodes)) for x in bu.iterate(batched, data)] == [2, 4]
        g3 = graph(B, 5, [[0.25, 0.25]] * 5, [[4, 1], [0, 4]], [3, 3])
        written = bu.set_at(batched, data, 0, g3)                  # more nodes than the batch holds: it grows
        assert batched.contains(written) and tuple(written.nodes_features.shape) == (2, 5, 2)
        assert npv(B, written.n_nodes).tolist() == [5, 4] and tuple(written.edges.shape) == (2, 2, 2)
        moved = g.data_to(g1, NB)
        assert isinstance(moved.nodes_features, np.ndarray) and moved.n_edges.tolist() == 3

    @pytest.mark.parametrize("B", BACKENDS)
    def test_bounded_node_padding_and_batch_of_nodes_only(self, B: Any) -> None:
        g = GraphSpace(B, feature(B, 1.0, 2.0))
        batched = bu.batch_space(g, 2)
        data = bu.concatenate(batched, [graph(B, 1, [[1.5, 1.5]]), graph(B, 2, [[1.0, 2.0]] * 2)])
        assert npv(B, data.nodes_features)[0].tolist() == [[1.5, 1.5], [1.0, 1.0]]   # 0 clipped into [1, 2]
        assert batched.contains(data) and data.edges is None

    def test_clip(self) -> None:
        g = edge_graphs(NB)
        x = graph(NB, 2, [[3.0, -3.0], [0.0, 0.0]], [[0, 1]], [9])
        clipped = g.clip(x)
        assert clipped.nodes_features.tolist() == [[1.0, -1.0], [0.0, 0.0]] and clipped.edges_features.tolist() == [5]
        assert g.contains(clipped)
        with pytest.raises(ValueError, match=r"n_nodes must be integers of shape \(\) in \[2, 5\]"):
            g.clip(graph(NB, 7, [[0.0, 0.0]] * 7, [[0, 1]], [0]))

    @pytest.mark.parametrize("B", BACKENDS)
    def test_no_flat_form(self, B: Any) -> None:
        g = edge_graphs(B)
        assert fu.flat_dim(g) is None and not fu.is_flattenable(g)
        for call in (lambda: fu.flatten_space(g), lambda: fu.flatten_space(DictSpace(B, {"g": g}))):
            with pytest.raises(NotImplementedError, match="Unknown space: `GraphSpace"):
                call()

    @pytest.mark.parametrize("B", BACKENDS)
    def test_equality_and_json(self, B: Any) -> None:
        g = edge_graphs(B, metadata={"kind": "scene"})
        assert g == edge_graphs(B) and g != GraphSpace(B, feature(B)) and g != edge_graphs(B, batch_shape=(2,))
        js = su.space_to_json(g)
        assert js == {"type": "GraphSpace", "max_nodes": 5, "min_nodes": 2, "max_edges": 6, "min_edges": 1,
                      "is_edge": True, "node_feature_space": su.space_to_json(feature(B)),
                      "edge_feature_space": su.space_to_json(BoxSpace(B, 0, 5, dt(B, "int32"), shape=())),
                      "batch_shape": [], "metadata": {"kind": "scene"}}
        assert json_round_trip(g, B) == g and json_round_trip(g, NB) == g.to(NB) and g.to(NB).to(B) == g
        batched = bu.batch_space(GraphSpace(B, feature(B)), 3)
        assert json_round_trip(batched, B) == batched


# ================================================================================================ subspaces
class TestSubspace:
    def test_every_space_answers(self) -> None:
        box, tight = feature(NB, 0.0, 1.0), feature(NB, 0.1, 0.9)
        pairs: List[Tuple[Space, Space]] = [
            (tight, box),
            (DictSpace(NB, {"a": tight}), DictSpace(NB, {"a": box, "b": box})),
            (TupleSpace(NB, [tight]), TupleSpace(NB, [box])),
            (BatchedSpace(tight, (3,)), BatchedSpace(box, (3,))),
            (TextSpace(NB, 5, min_length=1, charset="abc"), TextSpace(NB, 10, charset="abcdef")),
            (UnionSpace(NB, [tight]), UnionSpace(NB, [box])),
            (DynamicBoxSpace(NB, 0.1, 0.9, (2, 3), (2, 5), np.float32), DynamicBoxSpace(NB, 0.0, 1.0, (1, 3), (3, 6), np.float32)),
            (GraphSpace(NB, tight, min_nodes=2, max_nodes=4), GraphSpace(NB, box, max_nodes=5)),
        ]
        for small, big in pairs:
            assert small.is_subspaceeq(big) and not big.is_subspaceeq(small), (small, big)
            assert small.is_subspace(big) and not big.is_subspace(small)
            assert big.is_subspaceeq(big) and not big.is_subspace(big)
        assert BinarySpace(NB, (2,)).is_subspaceeq(BinarySpace(NB, (2,)))
        assert not BinarySpace(NB, (2,)).is_subspaceeq(BinarySpace(NB, (3,)))
        assert not box.is_subspaceeq(BoxSpace(NB, 0.0, 1.0, np.float64, shape=(2,)))   # dtypes must be equal
        assert not TextSpace(NB, 5).is_subspaceeq(TextSpace(NB, 5, charset="abc"))
        assert TextSpace(NB, 5, charset="ab").is_subspaceeq(TextSpace(NB, 5))
        spaces = [box, DictSpace(NB, {"a": box}), TupleSpace(NB, [box]), BinarySpace(NB, (2,)), TextSpace(NB, 5),
                  UnionSpace(NB, [box]), GraphSpace(NB, box)]
        for i, s1 in enumerate(spaces):
            for j, s2 in enumerate(spaces):
                assert s1.is_subspaceeq(s2) == (i == j)

    def test_the_base_class_does_not_guess(self) -> None:
        class Opaque(Space):
            def sample(self, rng: Any) -> Any:
                return rng, None

            def create_empty(self) -> Any:
                return None

            def is_bounded(self, manner: str = "both") -> bool:
                return True

            def contains(self, x: Any) -> bool:
                return False

            def get_repr(self, abbreviate: bool = False, include_backend: bool = True, include_device: bool = True,
                         include_dtype: bool = True) -> str:
                return "Opaque"

            def data_to(self, data: Any, backend: Any = None, device: Any = None) -> Any:
                return data

        sp = Opaque(NB)
        with pytest.raises(NotImplementedError, match="Opaque does not implement is_subspaceeq"):
            sp.is_subspace(sp)


# ================================================================================================ properties
_INT_DTYPES = ["int16", "uint8", "int32"]


@st.composite
def dynamic_cases(draw: Any, min_side: int = 0) -> Any:
    """A DynamicBoxSpace recipe (axes at least `min_side` long) and one element of values in [0, 50]."""
    ndim = draw(st.integers(1, 3))
    lows = [draw(st.integers(min_side, 3)) for _ in range(ndim)]
    highs = [lo + draw(st.integers(0, 3)) for lo in lows]
    if lows == highs:
        axis = draw(st.integers(0, ndim - 1))
        highs[axis] += 1
    name = draw(st.sampled_from(["float32", "float64"] + _INT_DTYPES))
    shape = tuple(draw(st.integers(lo, hi)) for lo, hi in zip(lows, highs))
    values = draw(st.lists(st.integers(0, 50), min_size=int(np.prod(shape)), max_size=int(np.prod(shape))))
    return tuple(lows), tuple(highs), name, np.array(values, dtype=np.dtype(name)).reshape(shape)


def _backend(use_torch: bool) -> Any:
    return TB if (use_torch and TB is not None) else NB


@settings(max_examples=60, deadline=None)
@given(case=dynamic_cases(min_side=1), use_torch=st.booleans(), n=st.integers(1, 3))
def test_dynamic_box_flatten_round_trip(case: Any, use_torch: bool, n: int) -> None:
    """With a fill value the data never holds, every element comes back exactly (single and batched); JSON too.
    (An element with no values, some axis 0 long, has no length to recover on its other axes.)"""
    lows, highs, name, x_np = case
    B = _backend(use_torch)
    sp = DynamicBoxSpace(B, 0, 50, lows, highs, dt(B, name), fill_value=99)
    x = B.from_numpy(x_np, dtype=dt(B, name))
    assert sp.contains(x)
    flat = fu.flatten_data(sp, x)
    assert tuple(flat.shape) == (fu.flat_dim(sp),) and fu.flatten_space(sp).contains(flat)
    back = fu.unflatten_data(sp, flat)
    assert back.dtype == x.dtype and npv(B, back).tolist() == x_np.tolist()
    batched = bu.batch_space(sp, n)
    items = [x] + [sp.sample(rng(B, i))[1] for i in range(n - 1)]
    data = bu.concatenate(batched, items)
    rows_ = fu.flatten_data(batched, data, start_dim=1)
    assert tuple(rows_.shape) == (n, fu.flat_dim(sp))
    again = fu.unflatten_data(batched, rows_, start_dim=1)
    trimmed = fu.unflatten_data(batched, fu.flatten_data(batched, again, 1), 1)   # a fixed point
    assert npv(B, trimmed).tolist() == npv(B, again).tolist()
    for i, item in enumerate(items):
        got = npv(B, bu.get_at(batched, again, i))
        want = npv(B, item)
        assert got[tuple(slice(0, d) for d in want.shape)].tolist() == want.tolist()
    assert json_round_trip(sp, B) == sp and json_round_trip(batched, B) == batched


@settings(max_examples=60, deadline=None)
@given(case=dynamic_cases(), fill=st.integers(0, 50))
def test_dynamic_box_unflatten_cuts_only_padding(case: Any, fill: int) -> None:
    """Whatever the data holds, unflatten gives a prefix of it, at least shape_low long, and what it cut is fill."""
    lows, highs, name, x = case
    sp = DynamicBoxSpace(NB, 0, 50, lows, highs, np.dtype(name), fill_value=fill)
    back = fu.unflatten_data(sp, fu.flatten_data(sp, x))
    assert sp.contains(back)
    assert np.array_equal(back, x[tuple(slice(0, d) for d in back.shape)])
    cut = np.ones(x.shape, dtype=bool)
    cut[tuple(slice(0, d) for d in back.shape)] = False
    assert (x[cut] == fill).all()


@st.composite
def union_cases(draw: Any) -> Any:
    kinds = draw(st.lists(st.sampled_from(["f32", "i16", "bin", "u8"]), min_size=1, max_size=4))
    shapes = [draw(st.tuples(st.integers(1, 3)) | st.just(())) for _ in kinds]
    index = draw(st.integers(0, len(kinds) - 1))
    size = int(np.prod(shapes[index]))
    values = draw(st.lists(st.integers(-100, 100), min_size=size, max_size=size))
    return kinds, shapes, index, values


def _union(B: Any, kinds: List[str], shapes: List[Tuple[int, ...]]) -> UnionSpace:
    make = {"f32": lambda s: BoxSpace(B, -100.0, 100.0, dt(B, "float32"), shape=s),
            "i16": lambda s: BoxSpace(B, -100, 100, dt(B, "int16"), shape=s),
            "u8": lambda s: BoxSpace(B, 0, 100, dt(B, "uint8"), shape=s),
            "bin": lambda s: BinarySpace(B, s)}
    return UnionSpace(B, [make[k](s) for k, s in zip(kinds, shapes)])


@settings(max_examples=60, deadline=None)
@given(case=union_cases(), use_torch=st.booleans())
def test_union_flatten_and_json_round_trip(case: Any, use_torch: bool) -> None:
    kinds, shapes, index, values = case
    B = _backend(use_torch)
    u = _union(B, kinds, shapes)
    alt = u[index]
    raw = np.array(values).reshape(shapes[index])
    value_np = raw != 0 if kinds[index] == "bin" else np.abs(raw) if kinds[index] == "u8" else raw
    value = B.from_numpy(value_np.astype(B.numpy_dtype(alt.dtype)), dtype=alt.dtype)
    assert u.contains((index, value))
    flat = fu.flatten_data(u, (index, value))
    assert tuple(flat.shape) == (fu.flat_dim(u),) and fu.flatten_space(u).contains(flat)
    got_index, back = fu.unflatten_data(u, flat)
    assert got_index == index and back.dtype == value.dtype and npv(B, back).tolist() == npv(B, value).tolist()
    assert json_round_trip(u, B) == u and json_round_trip(u, NB) == u.to(NB)


@settings(max_examples=40, deadline=None)
@given(is_edge=st.booleans(), min_nodes=st.integers(1, 3), extra_nodes=st.none() | st.integers(0, 3),
       max_edges=st.none() | st.integers(1, 2), batch=st.lists(st.integers(0, 3), max_size=2),
       edge_features=st.booleans(), use_torch=st.booleans(), seed=st.integers(0, 2 ** 16))
def test_graph_json_batching_and_samples(is_edge: bool, min_nodes: int, extra_nodes: Any, max_edges: Any,
                                         batch: List[int], edge_features: bool, use_torch: bool, seed: int) -> None:
    B = _backend(use_torch)
    max_nodes = None if extra_nodes is None else min_nodes + extra_nodes
    if is_edge and max_nodes is not None and max_nodes * (max_nodes - 1) < max(1, max_edges or 1):
        max_nodes = min_nodes + 2
    g = GraphSpace(B, feature(B), BoxSpace(B, 0, 5, dt(B, "int32"), shape=(2,)) if is_edge and edge_features else None,
                   is_edge=is_edge, min_nodes=min_nodes, max_nodes=max_nodes,
                   max_edges=max_edges if is_edge else None, batch_shape=tuple(batch))
    assert json_round_trip(g, B) == g and json_round_trip(g, NB) == g.to(NB)
    batched = bu.batch_space(g, 2)
    assert bu.get_single_space(batched) == g
    r = rng(B, seed)
    items = []
    for _ in range(2):
        r, x = g.sample(r)
        assert g.contains(x)
        items.append(x)
    data = bu.concatenate(batched, items)
    assert batched.contains(data)
    for i, item in enumerate(items):
        again = bu.get_at(batched, data, i)
        assert g.contains(again)
        assert npv(B, again.n_nodes).tolist() == npv(B, item.n_nodes).tolist()


# ================================================================================================ the reference
def _run(python: str, out: Path, foreign: Path = None, src: str = "") -> Dict[str, Any]:  # type: ignore[assignment]
    env = dict(os.environ, PYTHONPATH=src)
    cmd = [python, str(SCENARIOS), str(out)] + ([str(foreign)] if foreign is not None else [])
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=str(SCENARIOS.parent))
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(out.read_text())  # type: ignore[no-any-return]


def _leaves(x: Any, path: str = "") -> Dict[str, Any]:
    if isinstance(x, dict):
        out: Dict[str, Any] = {}
        for k, v in x.items():
            out.update(_leaves(v, f"{path}/{k}"))
        return out
    if isinstance(x, list):
        out = {}
        for i, v in enumerate(x):
            out.update(_leaves(v, f"{path}[{i}]"))
        return out or {path: []}
    return {path: x}


#: results that differ from the reference on purpose (docs/differences.md), by path prefix: why
LISTED_DIFFERENCES = {
    "/numpy/dynamic_box/rows_set_at/values[0][1]":
        "set_at pads a shorter DynamicBox value with the fill value; the reference broadcasts its one row over the padding",
    "/pytorch/dynamic_box/rows_set_at/values[0][1]": "as for numpy",
    "/pytorch/dynamic_box/rows_contains[4]":
        "float64 data is no member of a float32 space (as for BoxSpace here); torch's can_cast lets the reference accept it",
    "/pytorch/union/contains[8]": "as above, for a float32 Box alternative",
}


@pytest.fixture(scope="module")
def ours(tmp_path_factory: Any) -> Dict[str, Any]:
    pytest.importorskip("torch")   # the scenarios run on the numpy and pytorch backends, as the reference venv has
    return _run(sys.executable, tmp_path_factory.mktemp("ours") / "out.json", src=str(ROOT / "src"))


def test_known_answers(ours: Dict[str, Any]) -> None:
    res = ours["results"]
    for name, value in res.items():
        assert "error" not in value, f"{name}: {value}"
    dyn = res["numpy/dynamic_box"]
    assert dyn["rows_set_at"]["values"][0] == [[-1.0, -1.0, -1.0], [0.0, 0.0, 0.0]]
    assert dyn["rows_contains"] == [True, True, False, False, False, True, False, False, False]
    assert dyn["dyn_cols"]["flat_space"]["high"]["values"] == [2.0] * 3 + [5.0] * 9
    assert set(dyn["constructor_errors"][:8]) == {"raised"} and dyn["constructor_errors"][8] == "ok"
    assert res["numpy/union"]["flatten"][1]["values"] == [1.0, 1.0, 0.0, 1.0]
    assert res["pytorch/union"]["flatten"][1]["dtype"] == "float32"
    assert res["numpy/graphs"]["graph_edges"]["flatten_space_error"] == "NotImplementedError"


@pytest.mark.skipif(not has_venv("unienv", "UNIENV_REFERENCE_PYTHON"), reason="reference venv not found")
def test_same_results_as_the_reference_and_json_both_ways(ours: Dict[str, Any], tmp_path: Path) -> None:
    python = str(venv_python("unienv", "UNIENV_REFERENCE_PYTHON"))
    ours_file = tmp_path / "ours.json"
    ours_file.write_text(json.dumps(ours))
    ref = _run(python, tmp_path / "ref.json", foreign=ours_file)       # the reference reads our JSON
    ref_file = tmp_path / "ref.json"
    mine = _run(sys.executable, tmp_path / "mine.json", foreign=ref_file, src=str(ROOT / "src"))  # we read theirs
    # the JSON we write is the JSON the reference writes, and each side reads the other's back to an equal space
    assert mine["json"] == ref["json"]
    for who, read in (("reference", ref["read"]), ("here", mine["read"])):
        bad = {k: v for k, v in read.items() if v != {"equal": True, "same_json": True}}
        assert not bad and read, f"{who} reading the other's JSON: {bad}"
    a_, b_ = _leaves(mine["results"]), _leaves(ref["results"])
    assert set(a_) == set(b_), sorted(set(a_) ^ set(b_))
    differing = {k for k in a_ if a_[k] != b_[k]}
    listed = {k for k in differing if any(k.startswith(p) for p in LISTED_DIFFERENCES)}
    assert not differing - listed, {k: {"here": a_[k], "reference": b_[k]} for k in sorted(differing - listed)}
    for prefix, why in LISTED_DIFFERENCES.items():
        assert any(k.startswith(prefix) for k in listed), f"{prefix} no longer differs ({why}): update the list"
