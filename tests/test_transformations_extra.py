"""The transformations added after the first five (unienv 0.0.1b16's full set): Batchify / UnBatchify, Crop, the
dict key filters, Flatten / Unflatten, ImageResize, Iterative / Leafwise, and what Rescale and DictTransformation
gained (integer boxes, `nan_to`, integer targets; nested keys). Per transformation: spaces, data, inverse, errors
and JSON; Hypothesis round trips where an inverse exists; the resize filter against PyTorch's and JAX's own
antialiased resize; a differential run against the reference (the same driver on both sides, each side loading the
other's JSON); and a TransformedStorage dataset written by one side and opened by the other.
"""
from __future__ import annotations

import inspect
import json
import os
import pickle
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any, Dict, List

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from _third_party import has_venv, venv_python
from unienv_data.base.errors import BoundsWarning as DataBoundsWarning
from unienv_data.testing.conformance import assert_tree_equal, expect_error
from unienv_interface.errors import BoundsWarning
from unienv_interface.backends import NumpyComputeBackend as NB
from unienv_interface.space import BatchedSpace, BinarySpace, BoxSpace, DictSpace, TextSpace, TupleSpace
from unienv_interface.transformations import (BatchifyTransformation, ChainedTransformation, CropTransformation,
                                              DataTransformation, DictExcludeKeyTransformation,
                                              DictIncludeKeyTransformation, DictTransformation,
                                              FlattenDictTransformation, IdentityTransformation,
                                              ImageResizeTransformation, IterativeTransformation,
                                              LeafwiseTransformation, RescaleTransformation,
                                              TransformationFormatError, UnBatchifyTransformation,
                                              UnflattenDictTransformation, json_to_transformation,
                                              transformation_to_json)
from unienv_interface.transformations.dtype_cast import DtypeTransformation
from unienv_interface.transformations.iter_transform import default_is_leaf_fn, register_leaf_fn

INF = float("inf")
ROOT = Path(__file__).resolve().parent.parent
DRIVER = Path(__file__).parent / "fixtures" / "transformation_driver.py"
REF_STORAGE = Path(__file__).parent / "fixtures" / "reference_transformed_storage.py"
needs_reference = pytest.mark.skipif(not has_venv("unienv", "UNIENV_REFERENCE_PYTHON"),
                                     reason="reference venv (unienv==0.0.1b16) not found")


def box(low: Any, high: Any, dtype: Any = np.float32, shape: Any = None, backend: Any = NB, **kw: Any) -> BoxSpace:
    return BoxSpace(backend, low, high, dtype, shape=shape, **kw)


def bounds_warnings(fn: Any, *args: Any) -> Any:
    """`(fn(*args), [messages of the BoundsWarnings it issued])`, every warning recorded."""
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        out = fn(*args)
    return out, [str(w.message) for w in got if issubclass(w.category, BoundsWarning)]


def round_trip_json(t: DataTransformation) -> DataTransformation:
    """`t` written to JSON text and read back: equal to `t` and of its type."""
    js = transformation_to_json(t)
    back = json_to_transformation(json.loads(json.dumps(js)))
    assert type(back) is type(t) and back == t, js
    assert type(t).deserialize_from(t.serialize()) == t
    return back


# ---------------------------------------------------------------------------------------------------- import paths
MODULES = {"BatchifyTransformation": "batch_and_unbatch", "UnBatchifyTransformation": "batch_and_unbatch",
           "CropTransformation": "crop", "DictIncludeKeyTransformation": "filter_dict",
           "DictExcludeKeyTransformation": "filter_dict", "FlattenDictTransformation": "flatten_dict_transform",
           "UnflattenDictTransformation": "flatten_dict_transform", "ImageResizeTransformation": "image_resize",
           "IterativeTransformation": "iter_transform", "LeafwiseTransformation": "iter_transform",
           "RescaleTransformation": "rescale", "DictTransformation": "dict_transform"}


def test_reference_import_paths_and_json_type_names() -> None:
    import importlib
    import unienv_interface.transformations as pkg
    for name, module in MODULES.items():
        cls = getattr(importlib.import_module(f"unienv_interface.transformations.{module}"), name)
        assert getattr(pkg, name) is cls and name in pkg.__all__
        full = f"unienv_interface.transformations.{module}.{name}"
        assert json_to_transformation({"type": full, **_EXAMPLES[name].to_json()}) == _EXAMPLES[name]
        assert transformation_to_json(_EXAMPLES[name])["type"] == full


def test_importing_the_package_needs_no_optional_library() -> None:
    code = ("import sys, unienv_interface.transformations as t; "
            "bad = sorted(m for m in ('torch', 'jax', 'av', 'h5py', 'pyarrow', 'PIL', 'cv2') if m in sys.modules); "
            "print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, PYTHONPATH=str(ROOT / "src")))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


@needs_reference
def test_constructor_signatures_equal_the_reference() -> None:
    names = sorted(MODULES)
    code = ("import inspect, json, unienv_interface.transformations as t; print(json.dumps({n: [[p.name, str(p.kind), "
            "repr(p.default) if p.default is not p.empty else None] for p in inspect.signature(getattr(t, n))"
            f".parameters.values()] for n in {names!r}}}))")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([str(venv_python("unienv", "UNIENV_REFERENCE_PYTHON")), "-c", code], capture_output=True,
                         text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    ref = json.loads(out.stdout.strip().splitlines()[-1])
    import unienv_interface.transformations as t
    for n in names:
        ours = [[p.name, str(p.kind), None if p.default is p.empty else repr(p.default)]
                for p in inspect.signature(getattr(t, n)).parameters.values()]
        if n == "IterativeTransformation":   # the default predicate is a function: compare its name only
            ours = [[a, k, d.split(" at ")[0] if d else d] for a, k, d in ours]
            ref[n] = [[a, k, d.split(" at ")[0] if d else d] for a, k, d in ref[n]]
        assert ours == ref[n], n


# ---------------------------------------------------------------------------------------------------- batchify
def test_batchify_inserts_and_unbatchify_removes_an_axis() -> None:
    sp = box(np.arange(6.0).reshape(2, 3) - 10, 10.0, shape=(2, 3))
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    for axis, shape in ((0, (1, 2, 3)), (1, (2, 1, 3)), (2, (2, 3, 1)), (-1, (2, 3, 1)), (-3, (1, 2, 3))):
        t = BatchifyTransformation(axis=axis)
        target = t.get_target_space_from_source(sp)
        assert target.shape == shape
        assert np.array_equal(target.low_numpy.reshape(-1), sp.low_numpy.reshape(-1))
        y = t.transform(sp, x)
        assert y.shape == shape and target.contains(y)
        inv = t.direct_inverse(sp)
        assert inv == UnBatchifyTransformation(axis) and t.direction_inverse() == inv
        assert inv.get_target_space_from_source(target) == sp
        assert np.array_equal(inv.transform(target, y), x)
        # extra leading batch axes stay in front
        batch = np.stack([x, x + 1])
        assert t.transform(sp, batch).shape == (2,) + shape
        assert np.array_equal(inv.transform(target, t.transform(sp, batch)), batch)
        round_trip_json(t)
        round_trip_json(inv)
    expect_error((ValueError,), BatchifyTransformation(axis=3).get_target_space_from_source, sp)
    expect_error((ValueError,), BatchifyTransformation(axis=-4).get_target_space_from_source, sp)
    expect_error((ValueError,), UnBatchifyTransformation(axis=0).get_target_space_from_source, sp)   # size 2
    expect_error((ValueError,), BatchifyTransformation().transform, sp, np.zeros((3, 2), np.float32))
    expect_error((TypeError,), BatchifyTransformation, 1.0)
    expect_error((TypeError,), BatchifyTransformation, True)
    expect_error((TypeError,), BatchifyTransformation.from_json, {"axis": "0"})
    expect_error((ValueError,), BatchifyTransformation.from_json, {"axis": 0, "dim": 1})
    assert BatchifyTransformation.from_json({}) == BatchifyTransformation(0)


def test_batchify_through_dicts_tuples_and_batched_text() -> None:
    text = TextSpace(NB, 8)
    sp = DictSpace(NB, {"a": box(-1.0, 1.0, shape=(3,)), "b": TupleSpace(NB, [BinarySpace(NB, (2,)), text])},
                   metadata={"note": "kept"})
    t = BatchifyTransformation()
    target = t.get_target_space_from_source(sp)
    assert target["a"].shape == (1, 3) and target["b"][0].shape == (1, 2)
    assert isinstance(target["b"][1], BatchedSpace) and target["b"][1].batch_shape == (1,)
    assert target.metadata == sp.metadata
    v = {"a": np.array([0.5, 0.0, -1.0], np.float32), "b": (np.array([True, False]), "hi")}
    y = t.transform(sp, v)
    assert y["a"].shape == (1, 3) and y["b"][0].shape == (1, 2) and y["b"][1].tolist() == ["hi"]
    assert target.contains(y)
    back = UnBatchifyTransformation().transform(target, y)
    assert back["b"][1] == "hi"
    assert_tree_equal(back["a"], v["a"])
    assert UnBatchifyTransformation().get_target_space_from_source(target) == sp
    # a text leaf has no axis 1; data that lacks a key is a KeyError
    expect_error((TypeError,), BatchifyTransformation(axis=1).get_target_space_from_source, sp)
    expect_error((KeyError,), t.transform, sp, {"a": v["a"]})
    expect_error((TypeError,), t.transform, sp, {"a": v["a"], "b": [v["b"][0]]})


def test_batchify_on_torch_keeps_the_device_and_dtype() -> None:
    torch = pytest.importorskip("torch")
    from unienv_interface.backends.pytorch import PyTorchComputeBackend as TB
    sp = box(-1.0, 1.0, torch.float16, shape=(4,), backend=TB)
    y = BatchifyTransformation(axis=1).transform(sp, torch.zeros(4, dtype=torch.float16))
    assert y.shape == (4, 1) and y.dtype == torch.float16


@settings(max_examples=60, deadline=None)
@given(shape=hs.lists(hs.integers(1, 4), min_size=0, max_size=4), lead=hs.lists(hs.integers(1, 3), max_size=2),
       data=hs.data())
def test_batchify_then_unbatchify_is_the_identity(shape: List[int], lead: List[int], data: Any) -> None:
    axis = data.draw(hs.integers(-len(shape) - 1, len(shape)))
    sp = box(-5, 5, np.int16, shape=tuple(shape))
    x = np.random.default_rng(len(shape)).integers(-5, 6, size=tuple(lead) + tuple(shape)).astype(np.int16)
    t = BatchifyTransformation(axis)
    target = t.get_target_space_from_source(sp)
    y = t.transform(sp, x)
    assert y.shape == tuple(lead) + tuple(target.shape)
    inv = t.direct_inverse(sp)
    assert inv.get_target_space_from_source(target) == sp
    assert np.array_equal(inv.transform(target, y), x)


# ---------------------------------------------------------------------------------------------------- crop
def test_crop_clips_floats_and_integers() -> None:
    f = box(-10.0, 10.0, np.float32, shape=(4,))
    t = CropTransformation(-0.5, 0.5)
    target = t.get_target_space_from_source(f)
    assert target == box(-0.5, 0.5, np.float32, shape=(4,))
    y = t.transform(f, np.array([-3.0, 0.25, 0.5, 9.0], np.float32))
    assert y.dtype == np.float32 and y.tolist() == [-0.5, 0.25, 0.5, 0.5]
    # values outside the source bounds are clipped too (silently: clipping is the point); NaN stays NaN, as in the
    # reference, with one BoundsWarning per instance
    y, warned = bounds_warnings(t.transform, f, np.array([-30.0, 0, 0, 30.0], np.float32))
    assert y.tolist() == [-0.5, 0, 0, 0.5] and warned == []
    y, warned = bounds_warnings(t.transform, f, np.array([0, np.nan, 0, 0], np.float32))
    assert np.isnan(y[1]) and y[[0, 2, 3]].tolist() == [0, 0, 0]
    assert len(warned) == 1 and "CropTransformation: value nan at position (1,)" in warned[0], warned
    assert bounds_warnings(t.transform, f, np.array([np.nan, 0, 0, 0], np.float32))[1] == []
    # integers: the bounds become the integers inside them, and every result lies in them
    i = box(-100, 100, np.int32, shape=(3,))
    ti = CropTransformation(2.5, 7.5)
    assert ti.get_target_space_from_source(i) == box(3, 7, np.int32, shape=(3,))
    assert ti.transform(i, np.array([-5, 5, 50], np.int32)).tolist() == [3, 5, 7]
    expect_error((ValueError,), CropTransformation(0.2, 0.8).get_target_space_from_source, i)
    # open sides and array bounds
    one_sided = CropTransformation(-INF, [0.0, 1.0, 2.0, 3.0])
    assert one_sided.transform(f, np.full(4, 2.5, np.float32)).tolist() == [0.0, 1.0, 2.0, 2.5]
    assert CropTransformation(-INF, INF).transform(f, np.arange(4, dtype=np.float32)).tolist() == [0, 1, 2, 3]
    assert CropTransformation(-1000, 1000).transform(box(-128, 127, np.int8, shape=()), np.int8(-128)) == -128
    assert t.direct_inverse(f) == IdentityTransformation() and t.has_inverse
    round_trip_json(t)
    round_trip_json(one_sided)
    round_trip_json(CropTransformation(np.array([0.0, -1.0], np.float32), 3))
    assert t.to_json() == {"crop_low": {"scalar": True, "value": -0.5, "backend": None},
                           "crop_high": {"scalar": True, "value": 0.5, "backend": None}}
    expect_error((ValueError,), CropTransformation, 1.0, 0.0)
    expect_error((ValueError,), CropTransformation, np.nan, 1.0)
    expect_error((ValueError,), CropTransformation, [0.0, 0.5], [1.0, 2.0, 3.0])
    expect_error((TypeError,), t.get_target_space_from_source, BinarySpace(NB, (2,)))
    expect_error((ValueError,), t.transform, f, np.zeros(3, np.float32))


# ---------------------------------------------------------------------------------------------------- key filters
def nested_space() -> DictSpace:
    return DictSpace(NB, {
        "obs": DictSpace(NB, {"pos": box(-1.0, 1.0, shape=(2,)), "vel": box(-2.0, 2.0, shape=(2,)),
                              "cam": DictSpace(NB, {"rgb": box(0, 255, np.uint8, shape=(2, 2, 3))})},
                         metadata={"group": "observation"}),
        "act": box(-1.0, 1.0, shape=(3,)), "rew": box(-INF, INF, shape=())}, metadata={"robot": "arm"})


def nested_value() -> Dict[str, Any]:
    return {"obs": {"pos": np.array([0.5, -0.5], np.float32), "vel": np.array([1.0, 0.0], np.float32),
                    "cam": {"rgb": np.zeros((2, 2, 3), np.uint8)}},
            "act": np.zeros(3, np.float32), "rew": np.float32(1.5)}


def test_include_keys() -> None:
    sp, v = nested_space(), nested_value()
    t = DictIncludeKeyTransformation(["obs/pos", "act", "obs/cam"])
    target = t.get_target_space_from_source(sp)
    assert list(target.spaces) == ["act", "obs"] and list(target["obs"].spaces) == ["cam", "pos"]
    assert target.metadata == sp.metadata and target["obs"].metadata == sp["obs"].metadata
    y = t.transform(sp, v)
    assert set(y) == {"obs", "act"} and set(y["obs"]) == {"pos", "cam"} and y["act"] is v["act"]
    assert target.contains(y)
    assert set(v["obs"]) == {"pos", "vel", "cam"}                     # the input is not modified
    # a key names a whole sub-tree, also when a longer key below it is listed too
    whole = DictIncludeKeyTransformation(["obs", "obs/pos"])
    assert whole.get_target_space_from_source(sp) == DictSpace(NB, {"obs": sp["obs"]})
    assert t.enabled_keys == frozenset({"obs/pos", "act", "obs/cam"}) and not t.has_inverse
    expect_error((ValueError,), t.direct_inverse, sp)
    # missing keys
    expect_error((ValueError,), DictIncludeKeyTransformation(["nope"]).get_target_space_from_source, sp)
    expect_error((ValueError,), DictIncludeKeyTransformation(["act/x"]).get_target_space_from_source, sp)
    expect_error((KeyError,), t.transform, sp, {"obs": v["obs"]})
    lenient = DictIncludeKeyTransformation(["act", "nope", "obs/nope"], ignore_missing_keys=True)
    assert set(lenient.get_target_space_from_source(sp).spaces) == {"act", "obs"}
    assert set(lenient.transform(sp, {"act": v["act"]})) == {"act"}
    dotted = DictIncludeKeyTransformation(["obs.vel"], nested_separator=".")
    assert dotted.transform(sp, v) == {"obs": {"vel": v["obs"]["vel"]}}
    js = round_trip_json(t).to_json()
    assert js == {"enabled_keys": ["act", "obs/cam", "obs/pos"], "nested_separator": "/", "ignore_missing_keys": False}
    expect_error((TypeError,), DictIncludeKeyTransformation, "act")
    expect_error((ValueError,), DictIncludeKeyTransformation, ["a//b"])
    expect_error((ValueError,), DictIncludeKeyTransformation, ["a"], nested_separator="")
    expect_error((TypeError,), t.get_target_space_from_source, box(0.0, 1.0, shape=()))
    expect_error((TypeError,), t.transform, sp, [v])


def test_exclude_keys() -> None:
    sp, v = nested_space(), nested_value()
    t = DictExcludeKeyTransformation(["obs/vel", "rew"])
    target = t.get_target_space_from_source(sp)
    assert list(target.spaces) == ["act", "obs"] and list(target["obs"].spaces) == ["cam", "pos"]
    assert target["obs"].metadata == sp["obs"].metadata
    y = t.transform(sp, v)
    assert set(y) == {"act", "obs"} and set(y["obs"]) == {"pos", "cam"} and set(v["obs"]) == {"pos", "vel", "cam"}
    # a key below an excluded key is covered by it
    assert DictExcludeKeyTransformation(["obs", "obs/pos"]).transform(sp, v).keys() == {"act", "rew"}
    expect_error((ValueError,), DictExcludeKeyTransformation(["obs/nope"]).get_target_space_from_source, sp)
    expect_error((KeyError,), t.transform, sp, {"obs": v["obs"], "act": v["act"]})
    assert DictExcludeKeyTransformation(["nope"], ignore_missing_keys=True).transform(sp, v).keys() == v.keys()
    assert t.excluded_keys == frozenset({"obs/vel", "rew"})
    round_trip_json(t)
    round_trip_json(DictExcludeKeyTransformation(["a.b"], ignore_missing_keys=True, nested_separator="."))
    expect_error((TypeError,), DictExcludeKeyTransformation.from_json, {"excluded_keys": "rew"})
    expect_error((TypeError,), DictExcludeKeyTransformation.from_json, {"excluded_keys": [], "ignore_missing_keys": 1})


@settings(max_examples=60, deadline=None)
@given(chosen=hs.sets(hs.sampled_from(["obs/pos", "obs/vel", "obs/cam", "obs/cam/rgb", "act", "rew", "obs"])))
def test_include_and_exclude_split_the_leaves(chosen: set) -> None:
    sp, v = nested_space(), nested_value()
    flat = FlattenDictTransformation()
    leaves = set(flat.get_target_space_from_source(sp).spaces)

    def kept(t: DataTransformation) -> set:
        return set(flat.transform(t.get_target_space_from_source(sp), t.transform(sp, v)))

    def covered(leaf: str) -> bool:
        return any(leaf == k or leaf.startswith(k + "/") for k in chosen)
    inc = {leaf for leaf in leaves if covered(leaf)}
    if chosen:
        assert kept(DictIncludeKeyTransformation(chosen)) == inc
    assert kept(DictExcludeKeyTransformation(chosen)) == leaves - inc


# ---------------------------------------------------------------------------------------------------- flatten
def test_flatten_and_unflatten() -> None:
    sp, v = nested_space(), nested_value()
    t = FlattenDictTransformation(".")
    target = t.get_target_space_from_source(sp)
    assert set(target.spaces) == {"obs.pos", "obs.vel", "obs.cam.rgb", "act", "rew"}
    assert target.metadata == sp.metadata and target["obs.pos"] == sp["obs"]["pos"]
    y = t.transform(sp, v)
    assert y["obs.cam.rgb"] is v["obs"]["cam"]["rgb"] and target.contains(y)
    inv = t.direct_inverse(sp)
    assert inv == UnflattenDictTransformation(".")
    back_space = inv.get_target_space_from_source(target)
    assert back_space == sp and back_space.metadata == sp.metadata and back_space["obs"].metadata == {}
    assert_tree_equal(inv.transform(target, y), v)
    assert inv.direct_inverse() == t
    round_trip_json(t)
    round_trip_json(inv)
    # keys that already hold the separator, collisions, missing and extra data keys
    expect_error((ValueError,), FlattenDictTransformation("_").get_target_space_from_source,
                 DictSpace(NB, {"a_b": box(0.0, 1.0, shape=())}))
    clash = DictSpace(NB, {"a": box(0.0, 1.0, shape=()), "a/b": box(0.0, 1.0, shape=())})
    expect_error((ValueError,), UnflattenDictTransformation().get_target_space_from_source, clash)
    expect_error((KeyError,), t.transform, sp, {k: x for k, x in v.items() if k != "act"})
    expect_error((ValueError,), t.transform, sp, {**v, "extra": 1})
    expect_error((ValueError,), t.transform, sp, {**v, "obs": {**v["obs"], "extra": 1}})
    expect_error((KeyError,), inv.transform, target, {k: x for k, x in y.items() if k != "rew"})
    expect_error((ValueError,), inv.transform, target, {**y, "extra": 1})
    expect_error((TypeError,), t.get_target_space_from_source, box(0.0, 1.0, shape=()))
    expect_error((TypeError,), t.transform, sp, 3)
    expect_error((TypeError,), FlattenDictTransformation, 1)


@settings(max_examples=60, deadline=None)
@given(tree=hs.recursive(hs.just(0), lambda kids: hs.dictionaries(hs.sampled_from("abc"), kids, min_size=1,
                                                                    max_size=3), max_leaves=10))
def test_unflatten_inverts_flatten(tree: Any) -> None:
    if not isinstance(tree, dict):
        tree = {"a": tree}
    counter = iter(range(1000))

    def space_of(node: Any) -> Any:
        if isinstance(node, dict):
            return DictSpace(NB, {k: space_of(x) for k, x in node.items()})
        return box(-1000, 1000, np.int64, shape=())

    def value_of(s: Any) -> Any:
        if isinstance(s, DictSpace):
            return {k: value_of(c) for k, c in s.spaces.items()}
        return np.int64(next(counter))
    sp = space_of(tree)
    v = value_of(sp)
    t = FlattenDictTransformation()
    target = t.get_target_space_from_source(sp)
    assert all("/" not in k or len(k.split("/")) > 1 for k in target.spaces)
    assert UnflattenDictTransformation().get_target_space_from_source(target) == sp
    assert_tree_equal(UnflattenDictTransformation().transform(target, t.transform(sp, v)), v)


# ------------------------------------------------------------------------------------------------ DictTransformation
def test_dict_transformation_nested_keys_and_missing_keys() -> None:
    sp, v = nested_space(), nested_value()
    t = DictTransformation({"obs/pos": RescaleTransformation(0.0, 2.0), "act": CropTransformation(0.0, 1.0)})
    target = t.get_target_space_from_source(sp)
    assert target["obs"]["pos"] == box(0.0, 2.0, shape=(2,)) and target["obs"]["vel"] is sp["obs"]["vel"]
    assert target["obs"].metadata == sp["obs"].metadata
    y = t.transform(sp, v)
    assert y["obs"]["pos"].tolist() == [1.5, 0.5] and y["obs"]["vel"] is v["obs"]["vel"] and y["rew"] is v["rew"]
    assert v["obs"]["pos"].tolist() == [0.5, -0.5]                    # the input is not modified
    inv = t.direct_inverse(sp)
    assert isinstance(inv.mapping["obs/pos"], RescaleTransformation) and inv.mapping["act"] == IdentityTransformation()
    assert inv.transform(target, y)["obs"]["pos"].tolist() == [0.5, -0.5]
    expect_error((ValueError,), DictTransformation({"obs/nope": IdentityTransformation()}).get_target_space_from_source,
                 sp)
    lenient = DictTransformation({"obs/nope": RescaleTransformation(), "act": IdentityTransformation()},
                                 ignore_missing_keys=True)
    assert lenient.get_target_space_from_source(sp) == sp
    assert lenient.transform(sp, {"act": v["act"]}) == {"act": v["act"]}
    assert lenient.direct_inverse(sp).mapping.keys() == {"act"}
    expect_error((ValueError,), DictTransformation, {"obs": IdentityTransformation(),
                                                     "obs/pos": IdentityTransformation()})
    dotted = DictTransformation({"obs.pos": RescaleTransformation(0.0, 2.0)}, nested_separator=".")
    assert dotted.transform(sp, v)["obs"]["pos"].tolist() == [1.5, 0.5]
    js = round_trip_json(t).to_json()
    assert set(js) == {"mapping", "ignore_missing_keys", "nested_separator"}
    # this project's earlier JSON still loads
    legacy = {"type": "DictTransformation", "transformations": {"act": {"type": "IdentityTransformation"}}}
    assert json_to_transformation(legacy) == DictTransformation({"act": IdentityTransformation()})
    assert t.transformations is t.mapping


# ---------------------------------------------------------------------------------------------------- rescale
def test_rescale_of_integer_boxes_and_zero_spans() -> None:
    sp = box([0, 5, -10], [10, 5, 10], np.int64, shape=(3,))
    t = RescaleTransformation(-1.0, 1.0)
    target = t.get_target_space_from_source(sp)
    assert target == box(-1.0, 1.0, np.float64, shape=(3,))        # NumPy's default float
    y = t.transform(sp, np.array([5, 5, -10], np.int64))
    assert y.tolist() == [0.0, -1.0, -1.0]                         # the constant element maps to new_low
    inv = t.direct_inverse(sp)
    assert inv.new_dtype == "int64" and inv.get_target_space_from_source(target) == sp
    assert inv.transform(target, y).tolist() == [5, 5, -10] and inv.transform(target, y).dtype == np.int64
    torch = pytest.importorskip("torch")
    from unienv_interface.backends.pytorch import PyTorchComputeBackend as TB
    assert t.get_target_space_from_source(box(0, 3, torch.int32, shape=(2,), backend=TB)).dtype == torch.float32


def test_rescale_to_an_integer_dtype_and_nan_to() -> None:
    sp = box(0.0, 1.0, np.float32, shape=(4,))
    q = RescaleTransformation(0.0, 8.0, np.uint8)
    assert q.get_target_space_from_source(sp) == box(0, 8, np.uint8, shape=(4,))
    y = q.transform(sp, np.array([1, 3, 5, 16], np.float32) / 16)
    assert y.dtype == np.uint8 and y.tolist() == [0, 2, 2, 8]        # 0.5, 1.5, 2.5, 8: half to even
    back = q.direct_inverse(sp).transform(q.get_target_space_from_source(sp), y)
    assert back.dtype == np.float32 and back.tolist() == [0.0, 0.25, 0.25, 1.0]
    # integer bounds inside fractional new bounds; bounds without an integer are refused
    assert RescaleTransformation(0.5, 3.5, "int8").get_target_space_from_source(sp) == box(1, 3, np.int8, shape=(4,))
    assert RescaleTransformation(0.5, 3.5, "int8").transform(sp, np.zeros(4, np.float32)).tolist() == [1, 1, 1, 1]
    expect_error((ValueError,), RescaleTransformation(0.2, 0.8, "int8").get_target_space_from_source, sp)
    expect_error((ValueError,), RescaleTransformation(0.0, 300.0, "uint8").get_target_space_from_source, sp)
    # nan_to: NaN is replaced (no warning); without it NaN stays NaN (with a BoundsWarning), as in the reference
    n = RescaleTransformation(0.0, 1.0, nan_to=0.5)
    y, warned = bounds_warnings(n.transform, sp, np.array([np.nan, 0.0, 1.0, 0.25], np.float32))
    assert y.tolist() == [0.5, 0.0, 1.0, 0.25] and warned == []
    y, warned = bounds_warnings(RescaleTransformation(0.0, 1.0).transform, sp, np.array([np.nan, 0, 0, 0], np.float32))
    assert np.isnan(y[0]) and y[1:].tolist() == [0, 0, 0] and len(warned) == 1
    y, warned = bounds_warnings(n.transform, sp, np.array([np.nan, 2.0, 0, 0], np.float32))
    assert y.tolist() == [0.5, 2.0, 0, 0] and len(warned) == 1 and "value 2.0 at position (1,)" in warned[0]
    # a nan_to outside the target bounds is used as given (the reference's result), with a warning
    far = RescaleTransformation(0.0, 1.0, nan_to=2.0)
    target, warned = bounds_warnings(far.get_target_space_from_source, sp)
    assert target == box(0.0, 1.0, np.float32, shape=(4,)) and len(warned) == 1 and "nan_to=2.0" in warned[0]
    assert far.transform(sp, np.array([np.nan, 0.5, 0, 0], np.float32)).tolist() == [2.0, 0.5, 0, 0]
    per = RescaleTransformation(0.0, 1.0, nan_to=[0.0, 0.25, 0.5, 1.0])
    assert per.transform(sp, np.full(4, np.nan, np.float32)).tolist() == [0.0, 0.25, 0.5, 1.0]
    assert RescaleTransformation(0.0, 10.0, "int16", nan_to=2.6).transform(sp, np.array([np.nan] * 4, np.float32)
                                                                         ).tolist() == [3, 3, 3, 3]
    expect_error((ValueError,), RescaleTransformation(0.0, 10.0, "uint8", nan_to=-1.0).get_target_space_from_source, sp)
    for t in (q, n, per):
        round_trip_json(t)
        assert pickle.loads(pickle.dumps(t)) == t


def test_rescale_extrapolates_outside_the_source_bounds_and_warns_once() -> None:
    sp = box([0.0, -1.0, 2.0], [4.0, 1.0, 2.0], np.float32, shape=(3,))   # the last element has a zero span
    t = RescaleTransformation(0.0, 1.0)
    y, warned = bounds_warnings(t.transform, sp, np.array([6.0, -3.0, 7.0], np.float32))
    assert y.dtype == np.float32 and y.tolist() == [1.5, -1.0, 0.0]      # the same linear map; zero span: new_low
    assert len(warned) == 1, warned
    assert warned[0].startswith("RescaleTransformation: value 6.0 at position (0,) is outside the source space "
                                "bounds [0.0, 4.0]"), warned[0]
    # once per instance; another instance warns again; values inside still land inside the target bounds
    y, warned = bounds_warnings(t.transform, sp, np.array([[-4.0, 0.0, 2.0], [4.0, 1.0, 2.0]], np.float32))
    assert y.tolist() == [[-1.0, 0.5, 0.0], [1.0, 1.0, 0.0]] and warned == []
    assert len(bounds_warnings(RescaleTransformation(0.0, 1.0).transform, sp, np.array([5.0, 0, 2], np.float32))[1]) == 1
    # NaN stays NaN (a float target); the inverse maps both back without a warning (a storage reading them back)
    target = t.get_target_space_from_source(sp)
    inv = t.direct_inverse(sp)
    assert not inv.reports_bounds and not pickle.loads(pickle.dumps(inv)).reports_bounds
    back, warned = bounds_warnings(inv.transform, target, np.array([1.5, np.nan, 0.0], np.float32))
    assert back[0] == 6.0 and np.isnan(back[1]) and back[2] == 2.0 and warned == []
    # the warning points at the caller's line, and "error" refuses every time (nothing is returned)
    fresh = RescaleTransformation(0.0, 1.0)
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        fresh.transform(sp, np.array([9.0, 0, 2], np.float32))
    assert [os.path.basename(w.filename) for w in got] == [os.path.basename(__file__)]
    fresh = RescaleTransformation(0.0, 1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", BoundsWarning)
        for _ in range(2):
            exc = expect_error((ValueError,), fresh.transform, sp, np.array([0.0, 3.0, 2], np.float32))
            assert isinstance(exc, BoundsWarning) and "(1,)" in str(exc)
    assert fresh.reports_bounds
    assert DataBoundsWarning is BoundsWarning and issubclass(BoundsWarning, UserWarning)


def test_rescale_to_integers_outside_the_source_bounds_follows_the_dtype_rules() -> None:
    sp = box(0.0, 1.0, np.float32, shape=(3,))
    q = RescaleTransformation(0.0, 100.0, "int16")
    y, warned = bounds_warnings(q.transform, sp, np.array([1.5, -0.25, 0.125], np.float32))
    assert y.dtype == np.int16 and y.tolist() == [150, -25, 12] and len(warned) == 1   # 12.5: half to even
    back = q.direct_inverse(sp).transform(q.get_target_space_from_source(sp), y)
    assert np.allclose(back, [1.5, -0.25, 0.12])
    # what the dtype cannot hold is refused (the reference's cast wraps it around), before any warning
    u8 = RescaleTransformation(0.0, 200.0, "uint8")
    for bad in ([1.5, 0, 0], [-0.01, 0, 0], [np.nan, 0, 0]):
        _, warned = bounds_warnings(expect_error, (ValueError,), u8.transform, sp, np.array(bad, np.float32))
        assert warned == []
    y, warned = bounds_warnings(u8.transform, sp, np.array([1.2, 0.5, 0.0], np.float32))
    assert y.tolist() == [240, 100, 0] and len(warned) == 1


def test_dtype_transformation_casts_values_outside_the_bounds() -> None:
    sp = box(-1.0, 1.0, np.float32, shape=(3,))
    t = DtypeTransformation("int8", rounding="nearest")
    y, warned = bounds_warnings(t.transform, sp, np.array([3.4, -1.0, 100.0], np.float32))
    assert y.dtype == np.int8 and y.tolist() == [3, -1, 100] and len(warned) == 1
    assert "DtypeTransformation: value 3.4" in warned[0]
    # the dtype rules stay strict whatever the bounds
    expect_error((ValueError,), DtypeTransformation("int8", "nearest").transform, sp, np.array([300.0, 0, 0], np.float32))
    expect_error((ValueError,), DtypeTransformation("int8", "nearest").transform, sp, np.array([np.nan, 0, 0], np.float32))
    expect_error((ValueError,), DtypeTransformation("int8").transform, sp, np.array([1.5, 0, 0], np.float32))
    y, warned = bounds_warnings(DtypeTransformation("float64").transform, sp, np.array([np.nan, 5, 0], np.float32))
    assert np.isnan(y[0]) and y[1] == 5.0 and len(warned) == 1
    inv = t.direct_inverse(sp)
    assert bounds_warnings(inv.transform, t.get_target_space_from_source(sp), np.array([100, 0, 0], np.int8))[1] == []


def test_rescale_target_dtype_follows_array_bounds_like_the_reference() -> None:
    sp = box(-1.0, 1.0, np.float32, shape=(2,))
    assert RescaleTransformation(np.array([0.0, 1.0]), 2.0).get_target_space_from_source(sp).dtype == np.float64
    assert RescaleTransformation(np.array([0.0, 1.0], np.float32), 2.0).get_target_space_from_source(sp).dtype == \
        np.float32
    assert RescaleTransformation([0.0, 1.0], 2.0).get_target_space_from_source(sp).dtype == np.float32
    assert RescaleTransformation(np.array([0.0, 1.0]), 2.0, "float32").get_target_space_from_source(sp).dtype == \
        np.float32
    t = RescaleTransformation(np.array([0.0, 1.0]), 2.0)
    assert t.to_json()["new_low"] == {"scalar": False, "value": [0.0, 1.0], "backend": "numpy", "dtype": "float64"}
    assert round_trip_json(t).get_target_space_from_source(sp).dtype == np.float64


def test_rescale_reads_the_reference_json_and_its_own_earlier_json() -> None:
    ref = {"type": "unienv_interface.transformations.rescale.RescaleTransformation",
           "new_low": {"scalar": True, "value": 0, "backend": None},
           "new_high": {"scalar": False, "value": [1.0, 2.0], "backend": "pytorch", "dtype": "torch.float32"},
           "nan_to": {"scalar": True, "value": 0.5, "backend": None}, "new_dtype": "float64"}
    t = json_to_transformation(ref)
    assert t.bound_dtypes == (None, "float32") and t.new_dtype == "float64" and float(t.nan_to) == 0.5
    earlier = {"type": "RescaleTransformation", "new_low": [-1.0, 0.0], "new_high": 2, "new_dtype": None}
    assert json_to_transformation(earlier) == RescaleTransformation([-1.0, 0.0], 2.0)
    for bad in ({"scalar": True, "value": "x"}, {"scalar": False, "value": [1], "dtype": "complex64"},
                {"scalar": True, "value": 1, "extra": 0}, {"value": 1, "backend": "tensorflow"}, {"scalar": True}):
        expect_error((ValueError,), json_to_transformation, {"type": "RescaleTransformation", "new_low": bad,
                                                             "new_high": 1.0})


# ---------------------------------------------------------------------------------------------------- image resize
def test_image_resize_spaces_and_values() -> None:
    low = np.zeros((4, 6, 3))
    high = np.broadcast_to(np.array([100.0, 200.0, 255.0]), (4, 6, 3)).copy()
    high[0, 0, 0] = 150.0
    sp = box(low, high, np.float32, shape=(4, 6, 3))
    t = ImageResizeTransformation(2, 3)
    target = t.get_target_space_from_source(sp)
    assert target.shape == (2, 3, 3) and target.dtype == np.float32
    assert target.high_numpy[0, 0].tolist() == [150.0, 200.0, 255.0]  # per channel: the highest high
    # a constant image stays constant; a 2x downscale weighs the four nearest inputs 1/8, 3/8, 3/8, 1/8 (the
    # triangle filter twice as wide), renormalised at the borders: a ramp 0..5 becomes [5/7, 2.5, 30/7]
    x = np.full((4, 6, 3), 7.0, np.float32)
    assert np.allclose(t.transform(sp, x), 7.0)
    ramp = np.ascontiguousarray(np.broadcast_to(np.arange(6, dtype=np.float32)[None, :, None], (4, 6, 3)))
    half = ImageResizeTransformation(4, 3).transform(sp, ramp)
    assert np.allclose(half[:, :, 0], [5 / 7, 2.5, 30 / 7])
    # same size: exact copy; leading batch axes; uint8 rounds and stays in bounds
    same = ImageResizeTransformation(4, 6)
    assert np.array_equal(same.transform(sp, np.stack([ramp, ramp + 1])), np.stack([ramp, ramp + 1]))
    img = box(0, 255, np.uint8, shape=(3, 3, 1))
    up = ImageResizeTransformation(6, 6).transform(img, np.full((3, 3, 1), 255, np.uint8))
    assert up.dtype == np.uint8 and np.all(up == 255)
    inv = t.direct_inverse(sp)
    assert inv == ImageResizeTransformation(4, 6) and inv.get_target_space_from_source(target).shape == sp.shape
    round_trip_json(t)
    expect_error((ValueError,), t.get_target_space_from_source, box(0.0, 1.0, shape=(4, 6)))
    # pixels outside the source bounds are resized like any other, with a BoundsWarning (the reference's result)
    y, warned = bounds_warnings(t.transform, sp, np.full((4, 6, 3), 300.0, np.float32))
    assert np.allclose(y, 300.0) and len(warned) == 1 and "ImageResizeTransformation: value 300.0" in warned[0]
    spot = np.zeros((4, 6, 3), np.float32)
    spot[1, 1, 0] = -40.0
    y, warned = bounds_warnings(t.transform, sp, spot)
    assert y.min() < 0 and warned == []          # once per instance
    dim = box(0, 200, np.uint8, shape=(3, 3, 1))
    y, warned = bounds_warnings(ImageResizeTransformation(6, 6).transform, dim, np.full((3, 3, 1), 250, np.uint8))
    assert np.array_equal(y, np.full((6, 6, 1), 250, np.uint8)) and len(warned) == 1
    expect_error((ValueError,), ImageResizeTransformation, 0, 3)
    expect_error((TypeError,), ImageResizeTransformation, 2.0, 3)
    expect_error((ValueError,), t.direct_inverse)


@pytest.mark.parametrize("h, w, nh, nw", [(16, 16, 8, 8), (17, 23, 5, 9), (8, 8, 20, 13), (30, 10, 7, 40),
                                          (5, 7, 5, 3)])
def test_image_resize_equals_torch_and_jax_antialiased_bilinear(h: int, w: int, nh: int, nw: int) -> None:
    rng = np.random.default_rng(h * w)
    x = rng.random((2, h, w, 3))
    t = ImageResizeTransformation(nh, nw)
    ours = t.transform(box(0.0, 1.0, np.float64, shape=(h, w, 3)), x)
    torch = pytest.importorskip("torch")
    from unienv_interface.backends.pytorch import PyTorchComputeBackend as TB
    want = torch.nn.functional.interpolate(torch.from_numpy(x).permute(0, 3, 1, 2), size=(nh, nw), mode="bilinear",
                                           align_corners=False, antialias=True).permute(0, 2, 3, 1).numpy()
    assert np.allclose(ours, want, atol=1e-9)
    on_torch = t.transform(box(0.0, 1.0, torch.float64, shape=(h, w, 3), backend=TB), torch.from_numpy(x))
    assert isinstance(on_torch, torch.Tensor) and np.allclose(on_torch.numpy(), want, atol=1e-9)
    jax = pytest.importorskip("jax")
    from unienv_interface.backends.jax import JaxComputeBackend as JB
    jx = jax.numpy.asarray(x)
    jwant = np.asarray(jax.image.resize(jx, (2, nh, nw, 3), method="bilinear", antialias=True))
    on_jax = t.transform(box(0.0, 1.0, jx.dtype, shape=(h, w, 3), backend=JB), jx)
    assert np.allclose(np.asarray(on_jax), jwant, atol=1e-5)


# ---------------------------------------------------------------------------------------------------- iterative
def is_box_or_tuple(space: Any) -> bool:
    """A leaf predicate for the tests: Box and Tuple spaces are leaves (a module-level function, so it has a name)."""
    return not isinstance(space, DictSpace)


def test_iterative_applies_to_every_leaf_and_inverts_per_leaf() -> None:
    a, b = box(0.0, 10.0, shape=(2,)), box(-4.0, 4.0, shape=(2,))
    sp = DictSpace(NB, {"a": a, "t": TupleSpace(NB, [b, a])}, metadata={"m": 1})
    t = IterativeTransformation(RescaleTransformation(0.0, 1.0))
    target = t.get_target_space_from_source(sp)
    unit = box(0.0, 1.0, shape=(2,))
    assert target == DictSpace(NB, {"a": unit, "t": TupleSpace(NB, [unit, unit])}) and target.metadata == {"m": 1}
    v = {"a": np.array([5.0, 10.0], np.float32), "t": (np.array([0.0, 4.0], np.float32), np.zeros(2, np.float32))}
    y = t.transform(sp, v)
    assert y["a"].tolist() == [0.5, 1.0] and y["t"][0].tolist() == [0.5, 1.0] and isinstance(y["t"], tuple)
    inv = t.direct_inverse(sp)                  # the leaves differ: one inverse per leaf
    assert isinstance(inv, LeafwiseTransformation)
    assert inv.get_target_space_from_source(target) == sp
    assert_tree_equal(inv.transform(target, y), v)
    round_trip_json(inv)
    same = DictSpace(NB, {"x": a, "y": a})
    inv_same = t.direct_inverse(same)
    assert isinstance(inv_same, IterativeTransformation)
    assert inv_same.transformation == RescaleTransformation(a.low_numpy, a.high_numpy, "float32")
    assert IterativeTransformation(IdentityTransformation()).direct_inverse() == \
        IterativeTransformation(IdentityTransformation())
    expect_error((ValueError,), t.direct_inverse)             # a rescale's inverse needs the leaf space
    expect_error((KeyError,), t.transform, sp, {"a": v["a"]})
    expect_error((TypeError,), t.transform, sp, {"a": v["a"], "t": (v["a"],)})
    expect_error((ValueError,), IterativeTransformation(IdentityTransformation(), lambda s: False)
                 .get_target_space_from_source, a)
    no_inverse = IterativeTransformation(DictIncludeKeyTransformation(["x"]), is_box_or_tuple)
    assert not no_inverse.has_inverse
    expect_error((ValueError,), no_inverse.direct_inverse, sp)
    expect_error((TypeError,), IterativeTransformation, "rescale")
    expect_error((TypeError,), IterativeTransformation, IdentityTransformation(), 3)


def test_iterative_json_names_predicates_and_never_unpickles() -> None:
    t = IterativeTransformation(RescaleTransformation(0.0, 1.0), is_box_or_tuple)
    js = transformation_to_json(t)
    assert js["is_leaf_node_fn"] == {"mode": "name", "value": f"{__name__}.is_box_or_tuple"}
    assert js["inv_is_leaf_node_fn"] == {"mode": "name", "value": "unienv_interface.transformations.iter_transform."
                                                                   "default_is_leaf_fn"}
    back = round_trip_json(t)
    assert back.is_leaf_node_fn is is_box_or_tuple and back.inv_is_leaf_node_fn is default_is_leaf_fn
    sp = DictSpace(NB, {"t": TupleSpace(NB, [box(0.0, 1.0, shape=())])})
    expect_error((TypeError,), back.get_target_space_from_source, sp)   # the tuple is a leaf: rescale refuses it
    # defaults when the predicates are absent (the reference reads them so too)
    assert json_to_transformation({"type": "IterativeTransformation", "transformation": {
        "type": "IdentityTransformation"}}) == IterativeTransformation(IdentityTransformation())
    # a lambda cannot be written; a pickled or unknown predicate is refused, and nothing is imported
    lam = IterativeTransformation(IdentityTransformation(), lambda s: True)
    expect_error((ValueError,), transformation_to_json, lam)
    named = register_leaf_fn(lambda s: True, "tests.always_leaf")
    assert transformation_to_json(IterativeTransformation(IdentityTransformation(), named))["is_leaf_node_fn"] == \
        {"mode": "name", "value": "tests.always_leaf"}
    bomb = dict(js, is_leaf_node_fn={"mode": "pickle", "value": "gASVAAAAAAAAAAA="})
    exc = expect_error((TransformationFormatError,), json_to_transformation, bomb)
    assert "pickle" in str(exc)
    for fn in ({"mode": "name", "value": "os.system"}, {"mode": "name", "value": "unienv_probe_leaf_q7.f"},
               {"mode": "source", "value": "x"}, "os.system"):
        expect_error((TransformationFormatError,), json_to_transformation, dict(js, is_leaf_node_fn=fn))
    assert "unienv_probe_leaf_q7" not in sys.modules


def test_leafwise_structure_must_match_the_space() -> None:
    sp = DictSpace(NB, {"a": box(0.0, 1.0, shape=()), "b": TupleSpace(NB, [box(0.0, 2.0, shape=())])})
    t = LeafwiseTransformation({"a": RescaleTransformation(0.0, 10.0), "b": (IdentityTransformation(),)})
    assert t.get_target_space_from_source(sp)["a"] == box(0.0, 10.0, shape=())
    y = t.transform(sp, {"a": np.float32(0.5), "b": (np.float32(1.0),)})
    assert float(y["a"]) == 5.0 and float(y["b"][0]) == 1.0
    assert t.to_json()["transformations"]["dict"]["b"] == {"tuple": [{"leaf": {"type": "unienv_interface."
                                                                               "transformations.identity."
                                                                               "IdentityTransformation"}}]}
    round_trip_json(t)
    expect_error((ValueError,), LeafwiseTransformation({"a": IdentityTransformation()}).get_target_space_from_source,
                 sp)
    expect_error((ValueError,), LeafwiseTransformation({"a": IdentityTransformation(), "b": (
        IdentityTransformation(), IdentityTransformation())}).get_target_space_from_source, sp)
    expect_error((TypeError,), LeafwiseTransformation, {"a": 3})
    expect_error((ValueError,), LeafwiseTransformation.from_json, {"transformations": {"leaf": {}, "dict": {}}})
    deep: Any = {"leaf": {"type": "IdentityTransformation"}}
    for _ in range(100):
        deep = {"tuple": [deep]}
    expect_error((ValueError,), LeafwiseTransformation.from_json, {"transformations": deep})


@settings(max_examples=40, deadline=None)
@given(bounds=hs.lists(hs.tuples(hs.integers(-1000, 1000), hs.integers(0, 1000)), min_size=1, max_size=4),
       seed=hs.integers(0, 2 ** 16))
def test_iterative_rescale_of_integer_leaves_round_trips_exactly(bounds: List[Any], seed: int) -> None:
    sp = DictSpace(NB, {f"k{i}": box(lo, lo + span, np.int32, shape=(3,)) for i, (lo, span) in enumerate(bounds)})
    rng = np.random.default_rng(seed)
    v = {k: rng.integers(s.low_numpy, s.high_numpy + 1).astype(np.int32) for k, s in sp.spaces.items()}
    t = IterativeTransformation(RescaleTransformation(-1.0, 1.0))
    target = t.get_target_space_from_source(sp)
    y = t.transform(sp, v)
    assert target.contains(y)
    inv = t.direct_inverse(sp)
    assert inv.get_target_space_from_source(target) == sp
    assert_tree_equal(inv.transform(target, y), v)


# ---------------------------------------------------------------------------------------------------- JSON
_EXAMPLES: Dict[str, DataTransformation] = {
    "BatchifyTransformation": BatchifyTransformation(2), "UnBatchifyTransformation": UnBatchifyTransformation(-1),
    "CropTransformation": CropTransformation(-1.0, [1.0, 2.0]),
    "DictIncludeKeyTransformation": DictIncludeKeyTransformation(["a/b", "c"], ignore_missing_keys=True),
    "DictExcludeKeyTransformation": DictExcludeKeyTransformation(["x.y"], nested_separator="."),
    "FlattenDictTransformation": FlattenDictTransformation("."), "UnflattenDictTransformation":
    UnflattenDictTransformation(), "ImageResizeTransformation": ImageResizeTransformation(8, 12),
    "IterativeTransformation": IterativeTransformation(ChainedTransformation([RescaleTransformation(0.0, 1.0),
                                                                              CropTransformation(0.0, 0.5)])),
    "LeafwiseTransformation": LeafwiseTransformation({"a": (RescaleTransformation(-2.0, 2.0, "float64"),)}),
    "RescaleTransformation": RescaleTransformation(np.array([0.0, -1.0], np.float32), 1.0, "float32", nan_to=0.0),
    "DictTransformation": DictTransformation({"a/b": BatchifyTransformation()}, True, "/"),
}


@pytest.mark.parametrize("name", sorted(_EXAMPLES))
def test_json_round_trips_and_pickles(name: str) -> None:
    t = _EXAMPLES[name]
    back = round_trip_json(t)
    json.dumps(transformation_to_json(t), allow_nan=False)   # strict JSON: no NaN / Infinity tokens
    assert pickle.loads(pickle.dumps(t)) == t
    assert back != IdentityTransformation() and repr(t).startswith(type(t).__name__)


# ---------------------------------------------------------------------------------------------------- differential
def _cases() -> List[Dict[str, Any]]:
    rng = np.random.default_rng(7)

    def boxspec(low: Any, high: Any, dtype: str, shape: Any) -> Dict[str, Any]:
        return {"box": {"low": low, "high": high, "dtype": dtype, "shape": list(shape)}}

    def sample(spec: Dict[str, Any]) -> Any:
        if "dict" in spec:
            return {k: sample(s) for k, s in spec["dict"].items()}
        if "tuple" in spec:
            return [sample(s) for s in spec["tuple"]]
        s = spec["box"]
        lo = np.broadcast_to(np.asarray(s["low"], float), s["shape"])
        hi = np.broadcast_to(np.asarray(s["high"], float), s["shape"])
        if s["dtype"].startswith(("int", "uint")):
            return rng.integers(lo, hi + 1).tolist()
        return (lo + rng.random(s["shape"]) * (hi - lo)).astype(s["dtype"]).tolist()

    def make(cls: str, *args: Any, **kwargs: Any) -> Dict[str, Any]:
        return {"cls": cls, "args": list(args), "kwargs": kwargs}

    # (both bounds arrays: the reference's inverse of a rescale fails on a Box with one scalar bound)
    f23 = boxspec(np.arange(6.0).reshape(2, 3).tolist(), np.full((2, 3), 9.0).tolist(), "float32", (2, 3))
    i3 = boxspec([0, 5, -10], [10, 5, 10], "int64", (3,))
    nested = {"dict": {"obs": {"dict": {"pos": boxspec(-1.0, 1.0, "float32", (2,)),
                                        "vel": boxspec(-2.0, 2.0, "float64", (2,))}},
                       "act": boxspec(-1, 1, "int32", (3,))}}
    image = boxspec(0.0, 255.0, "float32", (12, 10, 3))
    cases = [
        (f23, make("RescaleTransformation", 0.0, 1.0)),
        (i3, make("RescaleTransformation", -1.0, 1.0)),
        (f23, make("RescaleTransformation", 0.0, 255.0, "uint8")),
        (f23, make("RescaleTransformation", {"array": [[0.0, 1.0, 2.0]], "dtype": "float64"}, 5.0)),
        (f23, make("RescaleTransformation", -2.0, 2.0, nan_to=0.0)),
        (f23, make("CropTransformation", 2.0, 6.5)),
        (i3, make("CropTransformation", -2.5, 3.5)),
        (f23, make("CropTransformation", {"array": [1.0, 2.0, 3.0], "dtype": "float32"}, 7.0)),
        (f23, make("BatchifyTransformation", axis=0)),
        (f23, make("BatchifyTransformation", axis=1)),
        (nested, make("BatchifyTransformation")),
        (boxspec(-1.0, 1.0, "float32", (2, 1, 3)), make("UnBatchifyTransformation", axis=1)),
        (nested, make("DictIncludeKeyTransformation", ["obs/pos", "act"])),
        (nested, make("DictExcludeKeyTransformation", ["obs/vel"])),
        (nested, make("FlattenDictTransformation", nested_separator=".")),
        (nested, make("DictTransformation", {"obs/pos": {"make": make("RescaleTransformation", 0.0, 4.0)},
                                             "act": {"make": make("CropTransformation", 0, 1)}})),
        (nested, make("IterativeTransformation", {"make": make("RescaleTransformation", -3.0, 3.0)})),
        ({"tuple": [f23, i3]}, make("IterativeTransformation", {"make": make("CropTransformation", 0.0, 4.0)})),
        (f23, make("ChainedTransformation", [{"make": make("RescaleTransformation", 0.0, 2.0)},
                                             {"make": make("CropTransformation", 0.0, 1.0)},
                                             {"make": make("BatchifyTransformation", axis=1)}])),
    ]
    out = [{"backend": "numpy", "space": s, "make": m, "data": sample(s)} for s, m in cases]
    out[4]["data"][0][1] = float("nan")
    # values outside the source bounds and NaN: mapped as the reference maps them (here with a BoundsWarning)
    nan = float("nan")
    wild = [[-3.0, nan, 20.0], [4.0, 100.0, 5.5]]
    outside = [
        (f23, make("RescaleTransformation", 0.0, 1.0), wild),
        (f23, make("RescaleTransformation", -2.0, 2.0, nan_to=0.0), wild),
        (f23, make("RescaleTransformation", 0.0, 1.0, nan_to=5.0), wild),              # nan_to outside the target
        (f23, make("RescaleTransformation", {"array": [[0.0, 1.0, 2.0]], "dtype": "float64"}, 5.0), wild),
        (f23, make("RescaleTransformation", 0.0, 100.0, "int16"), [[-3.0, 1.0, 20.0], [4.0, 10.0, 5.5]]),
        (f23, make("RescaleTransformation", 0.0, 100.0, "int16", nan_to=7.0), [[-3.0, nan, 20.0], [4.0, 10.0, 5.5]]),
        (i3, make("RescaleTransformation", -1.0, 1.0), [20, 7, -15]),                # 7: a zero span maps to -1
        (i3, make("RescaleTransformation", 0.0, 1000.0, "int32"), [20, 7, -15]),
        (f23, make("CropTransformation", 2.0, 6.5), [[nan, -4.0, 50.0], [3.0, 4.0, 5.0]]),
        (nested, make("IterativeTransformation", {"make": make("RescaleTransformation", -3.0, 3.0)}),
         {"obs": {"pos": [2.0, nan], "vel": [-5.0, 1.0]}, "act": [3, -1, 0]}),
        (f23, make("ChainedTransformation", [{"make": make("RescaleTransformation", 0.0, 2.0)},
                                             {"make": make("CropTransformation", 0.0, 1.0)}]), wild),
    ]
    out += [{"backend": "numpy", "space": s, "make": m, "data": d} for s, m, d in outside]
    # images: the reference resizes NumPy arrays with OpenCV (not installed there); torch on both sides
    for nh, nw in ((6, 5), (5, 7), (20, 16)):
        out.append({"backend": "pytorch", "space": image, "make": make("ImageResizeTransformation", nh, nw),
                    "data": sample(image)})
    bright = np.array(sample(image))
    bright[2:5, 3:6, 0] = 400.0          # pixels outside [0, 255]
    bright[7, 1, 2] = -30.0
    for nh, nw in ((6, 5), (20, 16)):
        out.append({"backend": "pytorch", "space": image, "make": make("ImageResizeTransformation", nh, nw),
                    "data": bright.tolist()})
    return out


def _run_driver(python: str, cases: List[Dict[str, Any]], tmp: Path, name: str, ours: bool) -> List[Dict[str, Any]]:
    spec = tmp / f"{name}.json"
    spec.write_text(json.dumps(cases))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if ours:
        env["PYTHONPATH"] = str(ROOT / "src")
    proc = subprocess.run([python, str(DRIVER), str(spec)], capture_output=True, text=True, timeout=600, env=env,
                          cwd=str(tmp))
    assert proc.returncode == 0, f"{name} driver failed:\n{proc.stderr[-3000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def _close(a: Any, b: Any, what: str, problems: List[str]) -> None:
    """Compares two driver descriptions (spaces or data): same structure, shapes and dtypes, values within float32
    rounding."""
    if isinstance(a, dict) and ("error" in a or "error" in b):
        problems.append(f"{what}: {a.get('error')} | {b.get('error') if isinstance(b, dict) else b}")
        return
    if isinstance(a, dict) and "value" in a and "shape" in a:
        if a["shape"] != b.get("shape") or a["dtype"] != b.get("dtype"):
            problems.append(f"{what}: shape/dtype {a['shape']} {a['dtype']} vs {b.get('shape')} {b.get('dtype')}")
            return
        x = np.array([np.nan if v is None else v for v in a["value"]], float)
        y = np.array([np.nan if v is None else v for v in b["value"]], float)
        if not np.allclose(x, y, rtol=1e-5, atol=1e-4, equal_nan=True):
            problems.append(f"{what}: values differ by up to {np.nanmax(np.abs(x - y))}")
        return
    if isinstance(a, dict):
        if set(a) != set(b):
            problems.append(f"{what}: keys {sorted(a)} vs {sorted(b)}")
            return
        for k in a:
            _close(a[k], b[k], f"{what}.{k}", problems)
        return
    if isinstance(a, list) and a and isinstance(a[0], (dict, list)):
        if len(a) != len(b):
            problems.append(f"{what}: {len(a)} vs {len(b)} items")
            return
        for i, (x, y) in enumerate(zip(a, b)):
            _close(x, y, f"{what}[{i}]", problems)
        return
    if isinstance(a, list) or isinstance(a, (int, float)):
        if not np.allclose(np.asarray(a, float), np.asarray(b, float), rtol=1e-6, atol=1e-6):
            problems.append(f"{what}: {a} vs {b}")
        return
    if a != b:
        problems.append(f"{what}: {a!r} vs {b!r}")


def _normal_json(js: Any) -> Any:
    """The JSON with key-set lists sorted (the reference writes a set's order)."""
    if isinstance(js, dict):
        return {k: sorted(v) if k in ("enabled_keys", "excluded_keys") else _normal_json(v) for k, v in js.items()}
    if isinstance(js, list):
        return [_normal_json(v) for v in js]
    return js


@needs_reference
def test_same_results_and_json_as_the_reference(tmp_path: Path) -> None:
    cases = _cases()
    ref_python = str(venv_python("unienv", "UNIENV_REFERENCE_PYTHON"))
    ref = _run_driver(ref_python, cases, tmp_path, "reference", ours=False)
    here = _run_driver(sys.executable, cases, tmp_path, "here", ours=True)
    problems: List[str] = []
    for i, (case, r, h) in enumerate(zip(cases, ref, here)):
        name = f"case {i} {case['make']['cls']}"
        assert "error" not in r, f"{name}: the reference failed: {r}"
        assert "error" not in h, f"{name}: failed here: {h}"
        for key in ("target", "out", "inverse"):
            if r[key] is None or h[key] is None:
                if r[key] is not h[key]:
                    problems.append(f"{name} {key}: {r[key]} vs {h[key]}")
                continue
            _close(r[key], h[key], f"{name} {key}", problems)
        if r["has_inverse"] != h["has_inverse"]:
            problems.append(f"{name}: has_inverse {r['has_inverse']} vs {h['has_inverse']}")
        if _normal_json(r["json"]) != _normal_json(h["json"]):
            problems.append(f"{name}: JSON differs\n  reference {r['json']}\n  here      {h['json']}")
    assert not problems, "\n".join(problems)
    # each side loads the other's JSON and computes what the writer computed
    for side, theirs in (("reference", here), ("here", ref)):
        crossed = [dict(c, foreign=t["json"]) for c, t in zip(cases, theirs)]
        got = _run_driver(ref_python if side == "reference" else sys.executable, crossed, tmp_path, f"{side}_x",
                          ours=side == "here")
        for i, (g, t) in enumerate(zip(got, theirs)):
            _close(t["out"], g["foreign_out"], f"{side} loads case {i} ({cases[i]['make']['cls']})", problems)
    assert not problems, "\n".join(problems)


# ---------------------------------------------------------------------------------------------------- datasets
ROWS = [[[0.5, 1.0, -1.0], [0.0, 0.25, 2.0]], [[-2.0, 1.5, 0.125], [1.0, -0.5, 0.0]]]
STORED = [BatchifyTransformation(axis=1),
          ChainedTransformation([RescaleTransformation(-1.0, 1.0), BatchifyTransformation(axis=0)])]


def _reference_storage(args: List[str], tmp: Path) -> Dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([str(venv_python("unienv", "UNIENV_REFERENCE_PYTHON")), str(REF_STORAGE), *args],
                          capture_output=True, text=True, timeout=300, cwd=str(tmp), env=env)
    assert proc.returncode == 0, f"the reference failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


@needs_reference
@pytest.mark.parametrize("which", range(len(STORED)), ids=["batchify", "rescale_then_batchify"])
def test_transformed_storage_datasets_open_on_the_other_side(tmp_path: Path, which: int) -> None:
    torch = pytest.importorskip("torch")
    from unienv_data.replay_buffer import ReplayBuffer
    from unienv_data.storages.pytorch import PytorchTensorStorage
    from unienv_data.storages.transformation import TransformedStorage
    from unienv_interface.backends.pytorch import PyTorchComputeBackend as TB
    t = STORED[which]
    space = BoxSpace(TB, -2.0, 2.0, torch.float32, shape=(2, 3))

    def report(rb: Any) -> Dict[str, Any]:
        st = rb.storage
        return {"rows": [rb.get_at(i).tolist() for i in range(len(rb))],
                "inner_rows": [st.inner_storage.get(i).tolist() for i in range(len(rb))]}

    # written by the reference, opened here
    theirs = tmp_path / "theirs"
    wrote = _reference_storage(["write", str(theirs), json.dumps({"transformation": transformation_to_json(t),
                                                                 "rows": ROWS})], tmp_path)
    rb = ReplayBuffer.load_from(theirs, backend=TB)
    assert isinstance(rb.storage, TransformedStorage) and rb.storage.data_transformation == t
    got = report(rb)
    rb.close()
    assert np.allclose(got["rows"], ROWS) and np.allclose(got["inner_rows"], wrote["inner_rows"])
    assert json_to_transformation(wrote["transformation"]) == t
    # written here, opened by the reference
    ours = tmp_path / "ours"
    rb = ReplayBuffer.create(TransformedStorage, space, PytorchTensorStorage, data_transformation=t, cache_path=ours,
                             capacity=len(ROWS) + 2, is_memmap=True)
    for row in ROWS:
        rb.append(torch.tensor(row))
    rb.mark_segment_end()
    rb.dumps(ours)
    mine = report(rb)
    rb.close()
    read = _reference_storage(["read", str(ours)], tmp_path)
    assert np.allclose(read["rows"], ROWS) and np.allclose(read["inner_rows"], mine["inner_rows"])
    assert np.allclose(mine["inner_rows"], wrote["inner_rows"])
