"""gymnasium spaces to and from this library's spaces (`space_utils.gym_utils`), with their data, against the real
gymnasium: every supported kind both ways, nested Dict / Tuple, the Discrete -> int64 Box rule, and the refusals."""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from _third_party import require_module

gym = require_module("gymnasium", "gym")

from unienv_interface.backends import NumpyComputeBackend as NB  # noqa: E402
from unienv_interface.space import (BatchedSpace, BinarySpace, BoxSpace, DictSpace, DynamicBoxSpace,  # noqa: E402
                                    GraphSpace, TextSpace, TupleSpace, UnionSpace)
from unienv_interface.space.space_utils import gym_utils  # noqa: E402

S = gym.spaces

KINDS = {
    "box_float": S.Box(-1.0, 2.0, (2, 3), np.float32),
    "box_unbounded": S.Box(-np.inf, np.inf, (4,), np.float64),
    "box_uint8_image": S.Box(0, 255, (5, 6, 3), np.uint8),
    "box_int": S.Box(-3, 7, (2,), np.int32),
    "discrete": S.Discrete(5),
    "discrete_start": S.Discrete(4, start=-2),
    "multi_discrete": S.MultiDiscrete([3, 5, 2]),
    "multi_discrete_start": S.MultiDiscrete([[2, 3], [4, 5]], start=[[1, -1], [0, 10]]),
    "multi_binary": S.MultiBinary(4),
    "multi_binary_2d": S.MultiBinary([2, 3]),
    "text": S.Text(8, min_length=2, charset="abcXYZ 01"),
}
NESTED = S.Dict({
    "pos": S.Box(-1.0, 1.0, (3,), np.float32),
    "mode": S.Discrete(3),
    "inner": S.Tuple((S.MultiBinary(2), S.Dict({"label": S.Text(4, charset="ab"),
                                                 "grid": S.MultiDiscrete([2, 2])}))),
})


def _samples(space: Any, n: int = 25) -> list:
    space.seed(123)
    return [space.sample() for _ in range(n)]


def _gym_equal(a: Any, b: Any) -> bool:
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_gym_equal(a[k], b[k]) for k in a)
    if isinstance(a, tuple):
        return isinstance(b, tuple) and len(a) == len(b) and all(_gym_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, str):
        return a == b
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)


@pytest.mark.parametrize("name", sorted(KINDS) + ["nested"])
def test_gym_space_round_trip_and_data(name: str) -> None:
    g = NESTED if name == "nested" else KINDS[name]
    ours = gym_utils.from_gym_space(g, NB)
    back = gym_utils.to_gym_space(ours)
    assert back == g                          # the same gymnasium space (kind, bounds, dtype, start)
    assert gym_utils.from_gym_space(back, NB) == ours
    for value in _samples(g):
        data = gym_utils.from_gym_data(ours, value)
        assert ours.contains(data), (value, data)
        again = gym_utils.to_gym_data(ours, data)
        assert g.contains(again)
        assert _gym_equal(again, value)       # the same values and dtypes gymnasium produced


def test_discrete_becomes_int64_box_with_inclusive_bounds() -> None:
    sp = gym_utils.from_gym_space(S.Discrete(4, start=2), NB)
    assert isinstance(sp, BoxSpace) and sp.shape == () and sp.dtype == np.int64
    assert (int(sp.low), int(sp.high)) == (2, 5)
    assert gym_utils.gym_kind(sp) == "Discrete"
    value = gym_utils.to_gym_data(sp, np.asarray(5))
    assert isinstance(value, np.integer) and S.Discrete(4, start=2).contains(value)
    md = gym_utils.from_gym_space(S.MultiDiscrete([3, 5]), NB)
    assert md.dtype == np.int64 and md.low_numpy.tolist() == [0, 0] and md.high_numpy.tolist() == [2, 4]


def test_each_kind_maps_to_the_expected_space() -> None:
    kinds = {name: type(gym_utils.from_gym_space(g, NB)) for name, g in KINDS.items()}
    assert kinds["multi_binary"] is BinarySpace and kinds["text"] is TextSpace
    assert all(kinds[k] is BoxSpace for k in kinds if k.startswith(("box", "discrete", "multi_discrete")))
    nested = gym_utils.from_gym_space(NESTED, NB)
    assert isinstance(nested, DictSpace) and isinstance(nested["inner"], TupleSpace)
    assert isinstance(nested["inner"][1], DictSpace)


def test_our_spaces_to_gym_and_back() -> None:
    ours = DictSpace(NB, {
        "img": BoxSpace(NB, 0, 255, np.uint8, shape=(4, 4, 3)),
        "flags": BinarySpace(NB, (3,)),
        "pair": TupleSpace(NB, [BoxSpace(NB, -1.0, 1.0, np.float32, shape=(2,)), TextSpace(NB, 5, charset="xyz")]),
        "count": BoxSpace(NB, 0, 9, np.int64, shape=()),      # a plain integer Box stays a gymnasium Box
    })
    g = gym_utils.to_gym_space(ours)
    assert isinstance(g["count"], S.Box) and isinstance(g["flags"], S.MultiBinary)
    assert gym_utils.from_gym_space(g, NB) == ours
    rng = np.random.default_rng(0)
    for _ in range(10):
        rng, value = ours.sample(rng)
        gv = gym_utils.to_gym_data(ours, value)
        assert g.contains(gv)
        back = gym_utils.from_gym_data(ours, gv)
        assert np.array_equal(back["img"], value["img"]) and back["pair"][1] == value["pair"][1]
        assert np.array_equal(back["flags"], value["flags"]) and back["flags"].dtype == np.bool_


def test_torch_backend_spaces() -> None:
    torch = pytest.importorskip("torch")
    from unienv_interface.backends.pytorch import PyTorchComputeBackend as TB
    sp = gym_utils.from_gym_space(NESTED, TB)
    assert sp["mode"].dtype == torch.int64
    assert gym_utils.to_gym_space(sp) == NESTED
    for value in _samples(NESTED, 5):
        data = gym_utils.from_gym_data(sp, value)
        assert isinstance(data["pos"], torch.Tensor) and sp.contains(data)
        assert _gym_equal(gym_utils.to_gym_data(sp, data), value)


@pytest.mark.parametrize("g", [
    S.Sequence(S.Discrete(3)),
    S.Dict({"ok": S.Discrete(2), "bad": S.Sequence(S.Discrete(2))}),
], ids=["sequence", "nested_sequence"])
def test_unsupported_gym_spaces_raise_type_error(g: Any) -> None:
    with pytest.raises(TypeError, match="no equivalent space here; supported: Box, Discrete"):
        gym_utils.from_gym_space(g, NB)


_NODES = BoxSpace(NB, 0.0, 1.0, np.float32, shape=(2,))


@pytest.mark.parametrize("sp, needle", [
    (TextSpace(NB, 5), "has no character set"),
    (BatchedSpace(TextSpace(NB, 3, charset="ab"), (2,)), "BatchedSpace"),
    (DynamicBoxSpace(NB, 0.0, 1.0, (0,), (3,), np.float32), "DynamicBoxSpace"),
    (GraphSpace(NB, _NODES, batch_shape=(2,)), "is a batch of shape"),
    (GraphSpace(NB, _NODES, is_edge=True), "edges without features"),
])
def test_unsupported_spaces_to_gym_raise_type_error(sp: Any, needle: str) -> None:
    with pytest.raises(TypeError, match=needle):
        gym_utils.to_gym_space(sp)


def test_data_that_does_not_fit_is_refused_not_cast() -> None:
    box = gym_utils.from_gym_space(S.Box(0, 10, (2,), np.int32), NB)
    with pytest.raises(ValueError, match="do not fit int32 exactly"):
        gym_utils.from_gym_data(box, np.array([1.5, 2.0]))
    with pytest.raises(ValueError, match=r"expected shape \(2,\), got \(3,\)"):
        gym_utils.from_gym_data(box, np.array([1, 2, 3], np.int32))
    assert gym_utils.from_gym_data(box, np.array([1.0, 2.0])).dtype == np.int32   # exact values convert
    mb = gym_utils.from_gym_space(S.MultiBinary(2), NB)
    with pytest.raises(ValueError, match="only 0 and 1"):
        gym_utils.from_gym_data(mb, np.array([0, 2], np.int8))
    d = gym_utils.from_gym_space(S.Dict({"a": S.Discrete(2)}), NB)
    with pytest.raises(KeyError, match="missing \\['a'\\], unexpected \\['b'\\]"):
        gym_utils.from_gym_data(d, {"b": 1})


@pytest.mark.parametrize("g", [
    S.Graph(S.Box(-1.0, 1.0, (2,), np.float32), None),
    S.Graph(S.Box(-1.0, 1.0, (3,), np.float32), S.Discrete(3)),
    S.Graph(S.Box(0, 9, (1,), np.int64), S.Box(0.0, 1.0, (2,), np.float32)),
], ids=["nodes", "edge_discrete", "edge_box"])
def test_graph_spaces_and_values_both_ways(g: Any) -> None:
    sp = gym_utils.from_gym_space(g, NB)
    assert isinstance(sp, GraphSpace) and sp.is_edge == (g.edge_space is not None)
    assert gym_utils.to_gym_space(sp) == g
    g.seed(3)
    for _ in range(10):
        value = g.sample()
        if sp.is_edge and (value.edge_links is None or len(value.edge_links) == 0):
            # gymnasium draws graphs without edges too; a GraphSpace with edges has at least min_edges (>= 1)
            with pytest.raises(ValueError, match="the gymnasium value has none|not a graph of"):
                gym_utils.from_gym_data(sp, value)
            continue
        ours = gym_utils.from_gym_data(sp, value)
        assert sp.contains(ours)
        back = gym_utils.to_gym_data(sp, ours)
        assert g.contains(back) and np.array_equal(back.nodes, value.nodes)
        if value.edge_links is not None:
            assert np.array_equal(back.edge_links, value.edge_links) and np.array_equal(back.edges, value.edges)


def test_one_of_is_a_union_space() -> None:
    g = S.OneOf([S.Discrete(2), S.Box(0.0, 1.0, (2,), np.float32), S.Text(3, charset="ab")])
    sp = gym_utils.from_gym_space(g, NB)
    assert isinstance(sp, UnionSpace) and len(sp) == 3 and gym_utils.to_gym_space(sp) == g
    g.seed(1)
    for _ in range(10):
        value = g.sample()
        ours = gym_utils.from_gym_data(sp, value)
        assert sp.contains(ours) and ours[0] == int(value[0])
        back = gym_utils.to_gym_data(sp, ours)
        assert g.contains(back) and int(back[0]) == int(value[0])
    with pytest.raises(ValueError, match=r"\(index, value\) tuple"):
        gym_utils.to_gym_data(sp, (5, None))
