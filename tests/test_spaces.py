"""Spaces and their utilities: construction, equality, sampling, backend conversion, batching, flattening
(including the reference promotion table) and JSON serialization."""
from __future__ import annotations

import json
from typing import Any, List

import numpy as np
import pytest

from unienv_interface.backends import NumpyComputeBackend as NB
from unienv_interface.space import (BatchedSpace, BinarySpace, BoxSpace, DictSpace, Space, SpaceMetadata, TextSpace,
                                    TupleSpace)
from unienv_interface.space.space_utils import batch_utils as bu
from unienv_interface.space.space_utils import flatten_utils as fu
from unienv_interface.space.space_utils import serialization_utils as su

from _backend_params import BACKENDS, JB, TB, needs_torch, torch  # noqa: F401


def dt(B: Any, name: str) -> Any:
    return B.dtype_from_name(name)


def as_np(B: Any, x: Any) -> np.ndarray:
    return np.asarray(B.to_numpy(x))


def assert_data_equal(B: Any, x: Any, y: Any) -> None:
    """Structural equality of two space elements (dict / tuple / str / arrays), dtype included."""
    if isinstance(x, dict):
        assert isinstance(y, dict) and list(x.keys()) == list(y.keys())
        for k in x:
            assert_data_equal(B, x[k], y[k])
    elif isinstance(x, tuple):
        assert isinstance(y, tuple) and len(x) == len(y)
        for a, b in zip(x, y):
            assert_data_equal(B, a, b)
    elif isinstance(x, str):
        assert x == y
    elif isinstance(x, np.ndarray) and x.dtype == object:
        assert isinstance(y, np.ndarray) and x.shape == y.shape and x.tolist() == y.tolist()
    else:
        assert B.is_backendarray(x) and B.is_backendarray(y)
        assert x.dtype == y.dtype and tuple(x.shape) == tuple(y.shape)
        np.testing.assert_array_equal(as_np(B, x), as_np(B, y))


class _OpaqueSpace(Space):
    """A space the utilities know nothing about."""

    def to(self, backend=None, device=None):  # type: ignore[no-untyped-def]
        return self

    def sample(self, rng):  # type: ignore[no-untyped-def]
        return rng, None

    def create_empty(self):  # type: ignore[no-untyped-def]
        return None

    def is_bounded(self, manner="both"):  # type: ignore[no-untyped-def]
        return True

    def contains(self, x):  # type: ignore[no-untyped-def]
        return x is None

    def get_repr(self, abbreviate=False, include_backend=True, include_device=True, include_dtype=True):  # type: ignore[no-untyped-def]
        return "_OpaqueSpace()"

    def data_to(self, data, backend=None, device=None):  # type: ignore[no-untyped-def]
        return data

    def _copy_with(self, metadata):  # type: ignore[no-untyped-def]
        return self


# ================================================================================================ construction
class TestBoxConstruction:
    @pytest.mark.parametrize("B", BACKENDS)
    def test_shape_from_argument_bounds_or_scalars(self, B: Any) -> None:
        s = BoxSpace(B, -1.0, 1.0, dt(B, "float32"), shape=(2, 3))
        assert s.shape == (2, 3) and s.dtype == dt(B, "float32") and s.backend is B
        assert tuple(s.low.shape) == (2, 3) and tuple(s.high.shape) == (2, 3)
        assert B.is_backendarray(s.low) and s.low.dtype == dt(B, "float32")
        np.testing.assert_array_equal(as_np(B, s.low), -np.ones((2, 3), np.float32))
        s2 = BoxSpace(B, np.zeros((1, 3)), np.ones((2, 1)), dt(B, "float64"))
        assert s2.shape == (2, 3)
        s3 = BoxSpace(B, 0, 5, dt(B, "int32"))
        assert s3.shape == ()

    @pytest.mark.parametrize("B", BACKENDS)
    def test_bounds_from_backend_arrays(self, B: Any) -> None:
        lo = B.from_numpy(np.array([0.0, -1.0], np.float32))
        hi = B.from_numpy(np.array([1.0, 2.0], np.float32))
        s = BoxSpace(B, lo, hi, dt(B, "float32"))
        assert s.shape == (2,)
        np.testing.assert_array_equal(as_np(B, s.high), [1.0, 2.0])

    @pytest.mark.parametrize("B", BACKENDS)
    def test_python_dtypes_become_concrete(self, B: Any) -> None:
        si = BoxSpace(B, 0, 3, int)
        sf = BoxSpace(B, 0, 3, float)
        assert B.dtype_is_real_integer(si.dtype) and si.dtype is not int
        assert B.dtype_is_real_floating(sf.dtype) and sf.dtype is not float
        B.dtype_name(si.dtype), B.dtype_name(sf.dtype)  # both are named backend dtypes

    @pytest.mark.parametrize("B", BACKENDS)
    @pytest.mark.parametrize("bad", ["bool", "complex64", None])
    def test_non_real_dtypes_are_rejected_with_type_error(self, B: Any, bad: Any) -> None:
        dtype = None if bad is None else dt(B, bad)
        with pytest.raises(TypeError):
            BoxSpace(B, 0, 1, dtype, shape=(2,))

    @pytest.mark.parametrize("B", BACKENDS)
    def test_bool_dtype_message_points_to_binary(self, B: Any) -> None:
        with pytest.raises(TypeError, match="(?i)real floating or integer"):
            BoxSpace(B, 0, 1, dt(B, "bool"))

    @pytest.mark.parametrize("B", BACKENDS)
    @pytest.mark.parametrize("name", ["int8", "int16", "int32", "int64", "uint8"])
    def test_integer_infinite_bounds_become_iinfo(self, B: Any, name: str) -> None:
        s = BoxSpace(B, -np.inf, np.inf, dt(B, name), shape=(3,))
        info = np.iinfo(np.dtype(name))
        lo, hi = as_np(B, s.low), as_np(B, s.high)
        assert lo.dtype == np.dtype(name) and hi.dtype == np.dtype(name)
        assert (lo == info.min).all() and (hi == info.max).all()  # exact, int64 extremes included
        assert s.is_bounded("both")

    @pytest.mark.parametrize("B", BACKENDS)
    @pytest.mark.parametrize("name", ["float32", "int16", "int64"])
    def test_scalar_box_keeps_scalar_bounds(self, B: Any, name: str) -> None:
        s = BoxSpace(B, 0, 5, dt(B, name))
        assert s.shape == () and s.low_numpy.shape == () and s.high_numpy.shape == ()
        assert tuple(s.low.shape) == () and tuple(s.high.shape) == ()
        _, x = s.sample(B.random.random_number_generator(0))
        assert tuple(x.shape) == () and s.contains(x)
        assert s.with_metadata(a=1) == s

    @pytest.mark.parametrize("B", BACKENDS)
    def test_64_bit_integer_bounds_are_exact(self, B: Any) -> None:
        big = 2 ** 62 + 1  # not representable in float64
        s = BoxSpace(B, -big, big, dt(B, "int64"), shape=(1,))
        assert int(s.high_numpy[0]) == big and int(s.low_numpy[0]) == -big
        full = BoxSpace(B, 0, np.inf, dt(B, "int64"), shape=(2,))
        assert full.with_metadata(a=1) == full  # rebuilding from its own bounds keeps iinfo.max
        assert int(full.with_metadata(a=1).high_numpy[0]) == np.iinfo(np.int64).max
        for name in ("uint64", "uint32"):
            try:
                d = dt(B, name)
            except ValueError:
                continue
            u = BoxSpace(B, 0, np.inf, d, shape=(2,))
            assert int(u.with_metadata(a=1).high_numpy[0]) == np.iinfo(np.dtype(name)).max

    @pytest.mark.parametrize("B", BACKENDS)
    def test_uint64_bounds_from_python_lists_are_exact(self, B: Any) -> None:
        try:
            d = dt(B, "uint64")
        except ValueError:
            pytest.skip("no uint64")
        s = BoxSpace(B, 0, [0, 2 ** 63 + 1], d)
        assert int(s.high_numpy[1]) == 2 ** 63 + 1
        back = json_round_trip(s, B)
        assert int(back.high_numpy[1]) == 2 ** 63 + 1

    @pytest.mark.parametrize("B", BACKENDS)
    def test_int64_samples_stay_inside_bounds_beyond_2_53(self, B: Any) -> None:
        v = 2 ** 53 + 1
        s = BoxSpace(B, v, v, dt(B, "int64"), shape=(3,))
        rng = B.random.random_number_generator(0)
        rng, x = s.sample(rng)
        assert (as_np(B, x) == v).all() and s.contains(x)
        wide = BoxSpace(B, -np.inf, np.inf, dt(B, "int64"), shape=(50,))
        for _ in range(5):
            rng, x = wide.sample(rng)
            assert wide.contains(x)

    @pytest.mark.parametrize("B", BACKENDS)
    def test_integer_mixed_infinite_bounds(self, B: Any) -> None:
        s = BoxSpace(B, np.array([-np.inf, 0.0]), np.array([5.0, np.inf]), dt(B, "int16"))
        np.testing.assert_array_equal(as_np(B, s.low), [-32768, 0])
        np.testing.assert_array_equal(as_np(B, s.high), [5, 32767])

    @pytest.mark.parametrize("B", BACKENDS)
    def test_integer_bounds_pointing_the_wrong_way_are_rejected(self, B: Any) -> None:
        with pytest.raises(ValueError):
            BoxSpace(B, np.inf, np.inf, dt(B, "int32"))
        with pytest.raises(ValueError):
            BoxSpace(B, -np.inf, -np.inf, dt(B, "int32"))

    @pytest.mark.parametrize("B", BACKENDS)
    def test_integer_bounds_outside_the_dtype_or_fractional_are_rejected(self, B: Any) -> None:
        with pytest.raises(ValueError):
            BoxSpace(B, 0, 300, dt(B, "uint8"))
        with pytest.raises(ValueError):
            BoxSpace(B, -1, 3, dt(B, "uint8"))
        with pytest.raises(ValueError):
            BoxSpace(B, 0.5, 3, dt(B, "int32"))

    @pytest.mark.parametrize("B", BACKENDS)
    @pytest.mark.parametrize("name", ["float32", "int32"])
    def test_nan_bounds_are_rejected(self, B: Any, name: str) -> None:
        with pytest.raises(ValueError):
            BoxSpace(B, np.nan, 1, dt(B, name))
        with pytest.raises(ValueError):
            BoxSpace(B, 0, np.array([1.0, np.nan]), dt(B, name))

    @pytest.mark.parametrize("B", BACKENDS)
    @pytest.mark.parametrize("name", ["float32", "int64"])
    def test_low_above_high_is_rejected(self, B: Any, name: str) -> None:
        with pytest.raises(ValueError):
            BoxSpace(B, 2, 1, dt(B, name))
        with pytest.raises(ValueError):
            BoxSpace(B, np.array([0, 3]), np.array([1, 2]), dt(B, name))
        BoxSpace(B, 1, 1, dt(B, name))  # low == high is fine

    @pytest.mark.parametrize("B", BACKENDS)
    def test_shape_errors(self, B: Any) -> None:
        with pytest.raises(ValueError):
            BoxSpace(B, np.zeros(3), np.ones(4), dt(B, "float32"))
        with pytest.raises(ValueError):
            BoxSpace(B, np.zeros(3), 1, dt(B, "float32"), shape=(4,))
        with pytest.raises(ValueError):
            BoxSpace(B, 0, 1, dt(B, "float32"), shape=(-1,))

    def test_backend_must_be_a_backend_class_a_name_or_an_array_module(self) -> None:
        with pytest.raises(TypeError):
            BoxSpace(3, 0, 1, np.float32)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="unknown backend name"):
            BoxSpace("numpyy", 0, 1, np.float32)
        assert BoxSpace(np, 0, 1, np.float32).backend is NB
        assert BoxSpace("numpy", 0, 1, np.float32).backend is NB

    @pytest.mark.parametrize("B", BACKENDS)
    def test_bounds_are_immutable(self, B: Any) -> None:
        s = BoxSpace(B, 0.0, 1.0, dt(B, "float32"), shape=(2,))
        with pytest.raises((ValueError, TypeError, RuntimeError)):
            s.low_numpy[0] = 5.0
        low = s.low
        if B is JB:  # JAX arrays cannot be mutated at all
            with pytest.raises(TypeError):
                low[0] = 0.5
        else:
            low[0] = 0.5  # mutating a returned bound must not change the space
        assert s == BoxSpace(B, 0.0, 1.0, dt(B, "float32"), shape=(2,))
        np.testing.assert_array_equal(s.low_numpy, [0.0, 0.0])
        np.testing.assert_array_equal(as_np(B, s.low), [0.0, 0.0])

    @pytest.mark.parametrize("B", BACKENDS)
    def test_is_bounded(self, B: Any) -> None:
        f = dt(B, "float32")
        assert BoxSpace(B, 0, 1, f).is_bounded()
        assert not BoxSpace(B, -np.inf, 1, f).is_bounded("both")
        assert not BoxSpace(B, -np.inf, 1, f).is_bounded("below")
        assert BoxSpace(B, -np.inf, 1, f).is_bounded("above")
        assert BoxSpace(B, 0, np.inf, f).is_bounded("below")


class TestBinaryConstruction:
    @pytest.mark.parametrize("B", BACKENDS)
    def test_default_dtype_and_shape(self, B: Any) -> None:
        s = BinarySpace(B, (2, 3))
        assert s.shape == (2, 3) and s.dtype == B.default_boolean_dtype and B.dtype_is_boolean(s.dtype)
        assert BinarySpace(B, 4).shape == (4,)
        assert BinarySpace(B, ()).shape == ()

    @pytest.mark.parametrize("B", BACKENDS)
    def test_non_boolean_dtype_is_rejected(self, B: Any) -> None:
        with pytest.raises(TypeError):
            BinarySpace(B, (2,), dtype=dt(B, "uint8"))
        with pytest.raises(ValueError):
            BinarySpace(B, (-2,))


class TestDictAndTupleConstruction:
    @pytest.mark.parametrize("B", BACKENDS)
    def test_keys_are_sorted(self, B: Any) -> None:
        f = dt(B, "float32")
        d = DictSpace(B, {"zeta": BoxSpace(B, 0, 1, f), "alpha": BinarySpace(B, ()), "mid": BoxSpace(B, 0, 1, f)})
        assert list(d.keys()) == ["alpha", "mid", "zeta"]
        assert list(d) == ["alpha", "mid", "zeta"] and len(d) == 3
        assert isinstance(d["alpha"], BinarySpace)
        assert d.shape is None and d.dtype is None
        from_pairs = DictSpace(B, [("b", BinarySpace(B, ())), ("a", BinarySpace(B, ()))])
        assert list(from_pairs.keys()) == ["a", "b"]
        assert list(DictSpace(B).keys()) == [] and len(DictSpace(B, None)) == 0

    @pytest.mark.parametrize("B", BACKENDS)
    def test_unsortable_keys_keep_insertion_order(self, B: Any) -> None:
        d = DictSpace(B, {"b": BinarySpace(B, ()), 1: BinarySpace(B, ()), "a": BinarySpace(B, ())})
        assert list(d.keys()) == ["b", 1, "a"]

    @pytest.mark.parametrize("B", BACKENDS)
    def test_nested_mappings_become_dict_spaces(self, B: Any) -> None:
        d = DictSpace(B, {"obs": {"z": BinarySpace(B, (2,)), "y": BoxSpace(B, 0, 1, dt(B, "float32"))},
                          "act": BoxSpace(B, -1, 1, dt(B, "float32"), shape=(2,))})
        assert isinstance(d["obs"], DictSpace)
        assert list(d["obs"].keys()) == ["y", "z"]
        assert list(d.keys()) == ["act", "obs"]

    @pytest.mark.parametrize("B", BACKENDS)
    def test_setitem_keeps_keys_sorted(self, B: Any) -> None:
        d = DictSpace(B, {"b": BinarySpace(B, ())})
        d["a"] = BinarySpace(B, (2,))
        assert list(d.keys()) == ["a", "b"]
        with pytest.raises(TypeError):
            d["c"] = "not a space"  # type: ignore[assignment]

    @needs_torch
    def test_children_must_share_the_backend(self) -> None:
        with pytest.raises((ValueError, TypeError)):
            DictSpace(NB, {"a": BinarySpace(TB, ())})
        with pytest.raises((ValueError, TypeError)):
            TupleSpace(NB, [BinarySpace(TB, ())])

    @pytest.mark.parametrize("B", BACKENDS)
    def test_children_must_be_spaces(self, B: Any) -> None:
        with pytest.raises(TypeError):
            DictSpace(B, {"a": 3})
        with pytest.raises(TypeError):
            TupleSpace(B, [BinarySpace(B, ()), 3])

    @needs_torch
    def test_device_is_given_to_children_or_taken_from_them(self) -> None:
        d = DictSpace(TB, {"a": BoxSpace(TB, 0, 1, torch.float32)}, device="cpu")
        assert str(d["a"].device).startswith("cpu")
        d2 = DictSpace(TB, {"a": BoxSpace(TB, 0, 1, torch.float32, device="cpu"), "b": BinarySpace(TB, ())})
        assert str(d2.device).startswith("cpu")
        assert DictSpace(TB, {"a": BinarySpace(TB, ())}).device is None

    @pytest.mark.parametrize("B", BACKENDS)
    def test_tuple_space(self, B: Any) -> None:
        t = TupleSpace(B, [BinarySpace(B, ()), BoxSpace(B, 0, 1, dt(B, "float32"))])
        assert len(t) == 2 and isinstance(t[0], BinarySpace) and isinstance(list(t)[1], BoxSpace)


class TestTextConstruction:
    @pytest.mark.parametrize("B", BACKENDS)
    def test_charset(self, B: Any) -> None:
        t = TextSpace(B, 5, min_length=1, charset="cab")
        assert t.charset == frozenset("abc") and t.charset_list == ["a", "b", "c"]
        assert t.max_length == 5 and t.min_length == 1
        assert TextSpace(B, 3).charset is None
        assert TextSpace(B, 3, charset=frozenset("xy")).charset_list == ["x", "y"]

    @pytest.mark.parametrize("B", BACKENDS)
    def test_contains(self, B: Any) -> None:
        t = TextSpace(B, 4, min_length=1, charset="ab")
        assert t.contains("ab") and "abba" in t
        assert not t.contains("") and not t.contains("abbaa") and not t.contains("abc") and not t.contains(3)
        assert TextSpace(B, 2).contains("?!")

    @pytest.mark.parametrize("B", BACKENDS)
    def test_bad_lengths(self, B: Any) -> None:
        with pytest.raises(ValueError):
            TextSpace(B, -1)
        with pytest.raises(ValueError):
            TextSpace(B, 3, min_length=4)


# ================================================================================================ equality
class TestEquality:
    @pytest.mark.parametrize("B", BACKENDS)
    def test_box_equality_uses_exact_bounds(self, B: Any) -> None:
        f64 = dt(B, "float64")
        a = BoxSpace(B, 0.0, 1.0, f64, shape=(2,))
        assert a == BoxSpace(B, np.zeros(2), np.ones(2), f64)
        assert a != BoxSpace(B, 0.0, 1.0 + 1e-9, f64, shape=(2,))      # within isclose, still different
        assert a != BoxSpace(B, 1e-12, 1.0, f64, shape=(2,))
        assert a != BoxSpace(B, 0.0, 1.0, dt(B, "float32"), shape=(2,))
        assert a != BoxSpace(B, 0.0, 1.0, f64, shape=(3,))
        assert a != BoxSpace(B, 0.0, 1.0, f64, shape=(1, 2))
        assert a != BinarySpace(B, (2,))
        assert (a == "box") is False and a != 3

    @pytest.mark.parametrize("B", BACKENDS)
    def test_metadata_is_ignored(self, B: Any) -> None:
        f = dt(B, "float32")
        plain = BoxSpace(B, 0, 1, f)
        tagged = BoxSpace(B, 0, 1, f, metadata={"unit": "m"})
        assert plain == tagged
        assert tagged.metadata["unit"] == "m" and len(plain.metadata) == 0
        assert plain.with_metadata(kind="x") == plain
        assert plain.with_metadata(kind="x").metadata["kind"] == "x"
        assert BinarySpace(B, (2,), metadata={"a": 1}) == BinarySpace(B, (2,))
        assert DictSpace(B, {"x": plain}, metadata={"q": 1}) == DictSpace(B, {"x": tagged})
        assert TextSpace(B, 3, metadata={"a": 1}) == TextSpace(B, 3)

    def test_metadata_is_read_only_and_json_checked(self) -> None:
        s = BoxSpace(NB, 0, 1, np.float32, metadata={"k": [1, 2]})
        assert isinstance(s.metadata, SpaceMetadata)
        with pytest.raises(TypeError):
            s.metadata["k"] = 3  # type: ignore[index]
        with pytest.raises(TypeError):
            BoxSpace(NB, 0, 1, np.float32, metadata={"k": object()})

    @needs_torch
    def test_device_is_ignored(self) -> None:
        assert BoxSpace(TB, 0, 1, torch.float32, device="cpu") == BoxSpace(TB, 0, 1, torch.float32)
        assert BoxSpace(TB, 0, 1, torch.float32, device=torch.device("cpu")) == BoxSpace(TB, 0, 1, torch.float32)
        assert BinarySpace(TB, (2,), device="cpu") == BinarySpace(TB, (2,))

    @needs_torch
    def test_backend_takes_part(self) -> None:
        assert BoxSpace(NB, 0, 1, np.float32) != BoxSpace(TB, 0, 1, torch.float32)
        assert BinarySpace(NB, ()) != BinarySpace(TB, ())
        assert TextSpace(NB, 3) != TextSpace(TB, 3)

    @pytest.mark.parametrize("B", BACKENDS)
    def test_dict_tuple_text_equality(self, B: Any) -> None:
        f = dt(B, "float32")
        x, y = BoxSpace(B, 0, 1, f), BinarySpace(B, ())
        assert DictSpace(B, {"a": x, "b": y}) == DictSpace(B, {"b": y, "a": x})
        assert DictSpace(B, {"a": x}) != DictSpace(B, {"a": x, "b": y})
        assert DictSpace(B, {"a": x}) != DictSpace(B, {"c": x})
        assert TupleSpace(B, [x, y]) == TupleSpace(B, [x, y])
        assert TupleSpace(B, [x, y]) != TupleSpace(B, [y, x])
        assert TextSpace(B, 4, charset="ab") == TextSpace(B, 4, charset=frozenset("ba"))
        assert TextSpace(B, 4, charset="ab") != TextSpace(B, 4, charset="abc")
        assert TextSpace(B, 4, min_length=1) != TextSpace(B, 4)
        assert TextSpace(B, 4) != TextSpace(B, 5)


# ================================================================================================ sampling
def all_spaces(B: Any) -> List[Space]:
    """One of every space kind (and every Box dtype flavour) on backend B."""
    out: List[Space] = []
    for name in ["float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
                 "uint64", "bfloat16"]:
        try:
            d = B.dtype_from_name(name)
        except ValueError:
            continue
        out.append(BoxSpace(B, 0, 10, d, shape=(2, 3)))
        out.append(BoxSpace(B, -np.inf, np.inf, d, shape=(4,)))
    f = dt(B, "float32")
    out += [
        BoxSpace(B, -np.inf, 2.0, f, shape=(5,)),
        BoxSpace(B, -2.0, np.inf, f, shape=(5,)),
        BoxSpace(B, np.array([-1.0, 0.0, 5.0]), np.array([1.0, 0.0, 6.0]), f),
        BoxSpace(B, 3, 3, dt(B, "int32"), shape=(2,)),
        BinarySpace(B, (2, 2)),
        BinarySpace(B, ()),
        TextSpace(B, 6, min_length=2, charset="xyz"),
        TextSpace(B, 3),
        DictSpace(B, {"obs": {"pos": BoxSpace(B, -1, 1, f, shape=(3,)), "flag": BinarySpace(B, ())},
                      "n": BoxSpace(B, 0, 9, dt(B, "int64"))}),
        TupleSpace(B, [BinarySpace(B, (1,)), BoxSpace(B, 0, 1, f), TextSpace(B, 2, charset="ab")]),
        bu.batch_space(TextSpace(B, 3, charset="ab"), 2),
    ]
    return out


class TestSampling:
    @pytest.mark.parametrize("B", BACKENDS)
    def test_sample_is_contained(self, B: Any) -> None:
        rng = B.random.random_number_generator(1234)
        for sp in all_spaces(B):
            for _ in range(5):
                rng, x = sp.sample(rng)
                assert sp.contains(x), (sp, x)
                assert x in sp

    @pytest.mark.parametrize("B", BACKENDS)
    def test_sample_is_reproducible_with_a_seed(self, B: Any) -> None:
        for sp in all_spaces(B):
            _, x1 = sp.sample(B.random.random_number_generator(7))
            _, x2 = sp.sample(B.random.random_number_generator(7))
            assert_data_equal(B, x1, x2)

    @pytest.mark.parametrize("B", BACKENDS)
    def test_create_empty_has_the_right_form(self, B: Any) -> None:
        f = dt(B, "float32")
        e = BoxSpace(B, -1, 1, f, shape=(2,)).create_empty()
        assert B.is_backendarray(e) and e.dtype == f and tuple(e.shape) == (2,)
        assert BinarySpace(B, (3,)).contains(BinarySpace(B, (3,)).create_empty())
        d = DictSpace(B, {"a": BinarySpace(B, ()), "t": TextSpace(B, 2)})
        assert d.contains(d.create_empty())

    @pytest.mark.parametrize("B", BACKENDS)
    def test_contains_rejects_wrong_values(self, B: Any) -> None:
        f = dt(B, "float32")
        box = BoxSpace(B, -1, 1, f, shape=(2,))
        assert not box.contains(B.from_numpy(np.array([0.0, 2.0], np.float32)))
        assert not box.contains(B.from_numpy(np.array([0.0, np.nan], np.float32)))
        assert not box.contains(B.from_numpy(np.zeros(3, np.float32)))
        assert not box.contains(B.from_numpy(np.zeros(2, np.float64)))
        assert not box.contains([0.0, 0.0])
        assert not BinarySpace(B, (2,)).contains(B.from_numpy(np.zeros(2, np.int64)))
        d = DictSpace(B, {"a": BinarySpace(B, ())})
        ok = {"a": B.from_numpy(np.array(True))}
        assert d.contains(ok)
        assert not d.contains({**ok, "extra": ok["a"]})
        assert not d.contains({})
        assert not TupleSpace(B, [BinarySpace(B, ())]).contains(())

    @needs_torch
    def test_contains_is_backend_specific(self) -> None:
        box = BoxSpace(TB, 0, 1, torch.float32, shape=(2,))
        assert not box.contains(np.zeros(2, np.float32))
        assert box.contains(torch.zeros(2))

    @pytest.mark.parametrize("B", BACKENDS)
    def test_clip(self, B: Any) -> None:
        box = BoxSpace(B, -1, 1, dt(B, "float32"), shape=(3,))
        c = box.clip(B.from_numpy(np.array([-5.0, 0.5, 5.0], np.float32)))
        np.testing.assert_array_equal(as_np(B, c), [-1.0, 0.5, 1.0])


# ================================================================================================ to(backend)
@needs_torch
class TestToBackend:
    def test_box_round_trip(self) -> None:
        for name in ["float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8"]:
            ns = BoxSpace(NB, np.array([1, 0]), np.array([3, 4]), np.dtype(name), metadata={"m": 1})
            ts = ns.to(TB)
            assert ts.backend is TB and ts.dtype == getattr(torch, name) and ts.shape == (2,)
            np.testing.assert_array_equal(ts.low.numpy(), [1, 0])
            assert ts.metadata["m"] == 1
            assert ts.to(NB) == ns

    def test_every_space_kind(self) -> None:
        wrong = []
        for sp in all_spaces(NB):
            ts = sp.to(TB)
            assert ts.backend is TB and type(ts) is type(sp)
            if ts.to(NB) != sp:
                wrong.append((sp, ts.to(NB)))
        assert not wrong, wrong
        d = DictSpace(NB, {"a": BinarySpace(NB, (2,)), "b": TextSpace(NB, 3, charset="ab")}).to(TB)
        assert d["a"].dtype == torch.bool and d["a"].backend is TB and d["b"].backend is TB

    def test_device_and_identity(self) -> None:
        ts = BoxSpace(TB, 0, 1, torch.float32)
        assert ts.to() == ts
        moved = ts.to(device="cpu")
        assert str(moved.device).startswith("cpu") and moved == ts

    def test_bfloat16_has_no_numpy_equivalent(self) -> None:
        with pytest.raises((ValueError, TypeError)):
            BoxSpace(TB, 0, 1, torch.bfloat16).to(NB)

    def test_data_to(self) -> None:
        sp = DictSpace(NB, {"a": BoxSpace(NB, 0, 1, np.float32, shape=(2,)), "b": BinarySpace(NB, ())})
        _, x = sp.sample(np.random.default_rng(0))
        y = sp.data_to(x, backend=TB)
        assert isinstance(y["a"], torch.Tensor) and y["a"].dtype == torch.float32
        assert sp.to(TB).contains(y)
        np.testing.assert_array_equal(y["a"].numpy(), x["a"])


# ================================================================================================ batch_utils
class TestBatchUtils:
    @pytest.mark.parametrize("B", BACKENDS)
    def test_batch_space(self, B: Any) -> None:
        f = dt(B, "float32")
        box = BoxSpace(B, np.array([0.0, -1.0]), np.array([1.0, 1.0]), f)
        bb = bu.batch_space(box, 4)
        assert isinstance(bb, BoxSpace) and bb.shape == (4, 2) and bb.dtype == f
        np.testing.assert_array_equal(as_np(B, bb.low), np.tile([0.0, -1.0], (4, 1)))
        assert bu.batch_space(BinarySpace(B, (3,)), 2).shape == (2, 3)
        assert bu.batch_space(box).shape == (1, 2)
        d = bu.batch_space(DictSpace(B, {"b": box, "a": BinarySpace(B, ())}), 5)
        assert isinstance(d, DictSpace) and list(d.keys()) == ["a", "b"]
        assert d["a"].shape == (5,) and d["b"].shape == (5, 2)
        t = bu.batch_space(TupleSpace(B, [box, BinarySpace(B, ())]), 3)
        assert isinstance(t, TupleSpace) and t[0].shape == (3, 2) and t[1].shape == (3,)
        txt = TextSpace(B, 4, charset="ab")
        bt = bu.batch_space(txt, 3)
        assert isinstance(bt, BatchedSpace) and bt.batch_shape == (3,) and bt.single_space == txt
        assert bu.batch_space(bt, 2).batch_shape == (2, 3)

    @pytest.mark.parametrize("B", BACKENDS)
    def test_single_space_and_batch_size(self, B: Any) -> None:
        f = dt(B, "float32")
        sp = DictSpace(B, {"x": BoxSpace(B, np.array([0.0, -1.0]), 1.0, f), "y": BinarySpace(B, ()),
                           "t": TupleSpace(B, [BoxSpace(B, 0, 3, dt(B, "int16"))])})
        batched = bu.batch_space(sp, 6)
        assert bu.batch_size(batched) == 6
        assert bu.get_single_space(batched) == sp
        assert list(bu.unbatch_spaces(bu.batch_space(sp, 2))) == [sp, sp]
        bt = bu.batch_space(TextSpace(B, 2), 3)
        assert bu.batch_size(bt) == 3 and bu.get_single_space(bt) == TextSpace(B, 2)
        with pytest.raises(ValueError):
            bu.batch_size(BoxSpace(B, 0, 1, f))
        with pytest.raises(ValueError):
            bu.batch_size_data({})

    @pytest.mark.parametrize("B", BACKENDS)
    def test_batch_space_errors(self, B: Any) -> None:
        with pytest.raises(TypeError):
            bu.batch_space(_OpaqueSpace(B), 2)
        for bad in (-1, 1.5, True):
            with pytest.raises(ValueError):
                bu.batch_space(BinarySpace(B, ()), bad)  # type: ignore[arg-type]

    @pytest.mark.parametrize("B", BACKENDS)
    def test_concatenate_stacks_samples(self, B: Any) -> None:
        f = dt(B, "float32")
        sp = DictSpace(B, {"x": BoxSpace(B, -1, 1, f, shape=(2,)), "y": BinarySpace(B, ()),
                           "t": TupleSpace(B, [BoxSpace(B, 0, 5, dt(B, "int32"))])})
        rng = B.random.random_number_generator(3)
        items = []
        for _ in range(4):
            rng, x = sp.sample(rng)
            items.append(x)
        batched = bu.batch_space(sp, 4)
        stacked = bu.concatenate(batched, items)
        assert batched.contains(stacked)
        assert tuple(stacked["x"].shape) == (4, 2) and tuple(stacked["t"][0].shape) == (4,)
        assert bu.batch_size_data(stacked) == 4
        for i, x in enumerate(items):
            one = bu.get_at(batched, stacked, i)
            assert sp.contains(one), one  # an entry of a batch is an element of the single space
            assert_data_equal(B, one, x)
        for got, want in zip(bu.iterate(batched, stacked), items):
            assert sp.contains(got), got
            assert_data_equal(B, got, want)
        assert len(list(bu.iterate(batched, stacked))) == 4

    @pytest.mark.parametrize("B", BACKENDS)
    def test_concatenate_missing_key_is_a_key_error(self, B: Any) -> None:
        sp = DictSpace(B, {"a": BinarySpace(B, ()), "b": BinarySpace(B, ())})
        _, x = sp.sample(B.random.random_number_generator(0))
        with pytest.raises(KeyError):
            bu.concatenate(bu.batch_space(sp, 2), [x, {"a": x["a"]}])

    @pytest.mark.parametrize("B", BACKENDS)
    def test_concatenate_text_gives_object_array(self, B: Any) -> None:
        bt = bu.batch_space(TextSpace(B, 3, charset="ab"), 2)
        out = bu.concatenate(bt, ["ab", "b"])
        assert isinstance(out, np.ndarray) and out.dtype == object and out.tolist() == ["ab", "b"]
        assert bt.contains(out)
        assert list(bu.iterate(bt, out)) == ["ab", "b"]

    @pytest.mark.parametrize("B", BACKENDS)
    def test_concatenate_empty_box_batch(self, B: Any) -> None:
        out = bu.concatenate(bu.batch_space(BoxSpace(B, 0, 1, dt(B, "float32"), shape=(3,)), 0), [])
        assert tuple(out.shape) == (0, 3) and out.dtype == dt(B, "float32")

    @pytest.mark.parametrize("B", BACKENDS)
    def test_get_at_and_set_at(self, B: Any) -> None:
        f = dt(B, "float32")
        sp = DictSpace(B, {"x": BoxSpace(B, -10, 10, f, shape=(2,)), "y": BinarySpace(B, ())})
        batched = bu.batch_space(sp, 3)
        data = {"x": B.from_numpy(np.arange(6, dtype=np.float32).reshape(3, 2)),
                "y": B.from_numpy(np.array([True, False, True]))}
        one = bu.get_at(batched, data, 1)
        np.testing.assert_array_equal(as_np(B, one["x"]), [2.0, 3.0])
        assert bool(as_np(B, one["y"])) is False
        sub = bu.get_at(batched, data, slice(0, 2))
        assert tuple(sub["x"].shape) == (2, 2)
        new = {"x": B.from_numpy(np.array([-1.0, -2.0], np.float32)), "y": B.from_numpy(np.array(True))}
        out = bu.set_at(batched, data, 1, new)
        np.testing.assert_array_equal(as_np(B, out["x"]), [[0, 1], [-1, -2], [4, 5]])
        np.testing.assert_array_equal(as_np(B, out["y"]), [True, True, True])
        t = TupleSpace(B, [BinarySpace(B, ())])
        tb = bu.batch_space(t, 2)
        tdata = (B.from_numpy(np.array([False, False])),)
        tout = bu.set_at(tb, tdata, 0, (B.from_numpy(np.array(True)),))
        np.testing.assert_array_equal(as_np(B, tout[0]), [True, False])


# ================================================================================================ flatten_utils
class TestFlatDim:
    @pytest.mark.parametrize("B", BACKENDS)
    def test_flat_dim(self, B: Any) -> None:
        f = dt(B, "float32")
        box = BoxSpace(B, 0, 1, f, shape=(2, 3))
        assert fu.flat_dim(box) == 6 and fu.flat_dim(box, start_dim=1) == 3
        assert fu.flat_dim(BinarySpace(B, (4,))) == 4 and fu.flat_dim(BinarySpace(B, ())) == 1
        d = DictSpace(B, {"a": box, "b": BinarySpace(B, (2,))})
        assert fu.flat_dim(d) == 8
        assert fu.flat_dim(TupleSpace(B, [box, box])) == 12
        assert fu.flat_dim(TextSpace(B, 5, charset="ab")) == 5
        assert fu.flat_dim(TextSpace(B, 5)) is None
        assert fu.flat_dim(TextSpace(B, 5, charset="ab"), start_dim=1) is None
        assert fu.flat_dim(DictSpace(B, {"a": box, "t": TextSpace(B, 2)})) is None
        assert fu.flat_dim(bu.batch_space(TextSpace(B, 2, charset="a"), 3)) is None
        assert fu.flat_dim(DictSpace(B, {})) == 0
        assert fu.is_flattenable(d) and not fu.is_flattenable(TextSpace(B, 5))


class TestFlattenSpace:
    @pytest.mark.parametrize("B", BACKENDS)
    def test_box(self, B: Any) -> None:
        box = BoxSpace(B, np.arange(6).reshape(2, 3), 10, dt(B, "int16"), metadata={"m": 1})
        flat = fu.flatten_space(box)
        assert isinstance(flat, BoxSpace) and flat.shape == (6,) and flat.dtype == dt(B, "int16")
        np.testing.assert_array_equal(as_np(B, flat.low), np.arange(6))
        assert len(flat.metadata) == 0
        batched = bu.batch_space(BoxSpace(B, 0, 1, dt(B, "float32"), shape=(2, 3)), 4)
        assert fu.flatten_space(batched, start_dim=1).shape == (4, 6)

    @pytest.mark.parametrize("B", BACKENDS)
    def test_binary_uses_the_default_integer_dtype(self, B: Any) -> None:
        flat = fu.flatten_space(BinarySpace(B, (2, 2)))
        assert flat.shape == (4,) and flat.dtype == B.default_integer_dtype
        np.testing.assert_array_equal(as_np(B, flat.low), [0] * 4)
        np.testing.assert_array_equal(as_np(B, flat.high), [1] * 4)

    @pytest.mark.parametrize("B", BACKENDS)
    def test_dict_concatenates_in_sorted_key_order(self, B: Any) -> None:
        f = dt(B, "float32")
        d = DictSpace(B, {"c": BoxSpace(B, 30, 31, f, shape=(1,)), "a": BoxSpace(B, 10, 11, f, shape=(2,)),
                          "b": BoxSpace(B, 20, 21, f, shape=())}, metadata={"x": 1})
        flat = fu.flatten_space(d)
        assert flat.shape == (4,) and flat.dtype == f and len(flat.metadata) == 0
        np.testing.assert_array_equal(as_np(B, flat.low), [10, 10, 20, 30])
        np.testing.assert_array_equal(as_np(B, flat.high), [11, 11, 21, 31])
        t = fu.flatten_space(TupleSpace(B, [BoxSpace(B, 5, 6, f), BoxSpace(B, 1, 2, f)]))
        np.testing.assert_array_equal(as_np(B, t.low), [5, 1])  # tuples keep position order

    @pytest.mark.parametrize("B", BACKENDS)
    def test_text_with_charset(self, B: Any) -> None:
        t = TextSpace(B, 4, charset="cab")
        flat = fu.flatten_space(t)
        assert flat.shape == (4,) and flat.dtype == B.default_integer_dtype
        np.testing.assert_array_equal(as_np(B, flat.low), [0] * 4)
        np.testing.assert_array_equal(as_np(B, flat.high), [3] * 4)
        data = fu.flatten_data(t, "ba")
        np.testing.assert_array_equal(as_np(B, data), [1, 0, 3, 3])  # sorted charset a,b,c; padded with 3
        assert fu.unflatten_data(t, data) == "ba"

    @pytest.mark.parametrize("B", BACKENDS)
    def test_text_without_charset_is_a_value_error(self, B: Any) -> None:
        with pytest.raises(ValueError, match="character set"):
            fu.flatten_space(TextSpace(B, 4))
        with pytest.raises(ValueError, match="character set"):
            fu.flatten_space(DictSpace(B, {"t": TextSpace(B, 4), "b": BinarySpace(B, ())}))

    @pytest.mark.parametrize("B", BACKENDS)
    def test_empty_dict_is_a_clear_value_error(self, B: Any) -> None:
        with pytest.raises(ValueError) as info:
            fu.flatten_space(DictSpace(B, {}))
        msg = str(info.value)
        assert "empty" in msg.lower() and "DictSpace" in msg
        assert "torch.cat" not in msg
        with pytest.raises(ValueError):
            fu.flatten_space(DictSpace(B, {"inner": DictSpace(B, {})}))

    @pytest.mark.parametrize("B", BACKENDS)
    def test_unknown_spaces_are_not_implemented(self, B: Any) -> None:
        with pytest.raises(NotImplementedError):
            fu.flatten_space(bu.batch_space(TextSpace(B, 2, charset="a"), 2))
        with pytest.raises(NotImplementedError):
            fu.flatten_space(DictSpace(B, {"o": _OpaqueSpace(B)}))


# the reference promotion table (reference-api.md section 3): leaves -> (torch row dtype, numpy row dtype)
PROMOTION_TABLE = [
    (["float32"], "float32", "float32"),
    (["uint8"], "uint8", "uint8"),
    (["bool"], "int32", "int64"),
    (["uint8", "float32"], "float32", "float32"),
    (["bool", "float32"], "float32", "float64"),
    (["int64", "float32"], "float32", "float64"),
    (["int32", "float32"], "float32", "float64"),
    (["uint8", "int8"], "int16", "int16"),
    (["uint8", "bool"], "int32", "int64"),
    (["float16", "uint8"], "float16", "float16"),
    (["float16", "int32"], "float16", "float64"),
    (["float64", "float32"], "float64", "float64"),
    (["bool", "uint8", "float32"], "float32", "float64"),
]


def _leaf(B: Any, name: str) -> Space:
    if name == "bool":
        return BinarySpace(B, (2,))
    return BoxSpace(B, 0, 1, B.dtype_from_name(name), shape=(2,))


class TestPromotionTable:
    @pytest.mark.parametrize("leaves,torch_row,numpy_row", PROMOTION_TABLE,
                             ids=["+".join(r[0]) for r in PROMOTION_TABLE])
    @pytest.mark.parametrize("B", BACKENDS)
    def test_row_dtype(self, B: Any, leaves: List[str], torch_row: str, numpy_row: str) -> None:
        # JAX promotes like torch (an integer or bool next to a float takes the float), NumPy widens to float64
        want = numpy_row if B.simplified_name == "numpy" else torch_row
        if B.simplified_name == "jax" and "bool" in leaves and want == "int32":
            want = B.dtype_name(B.default_integer_dtype)  # bools widen to JAX's default integer (int64 with x64)
        sp = DictSpace(B, {f"k{i}": _leaf(B, n) for i, n in enumerate(leaves)})
        flat = fu.flatten_space(sp)
        assert B.dtype_name(flat.dtype) == want
        assert flat.shape == (2 * len(leaves),)

    @pytest.mark.parametrize("B", BACKENDS)
    def test_row_layout_follows_sorted_keys_whatever_the_dtypes(self, B: Any) -> None:
        sp = DictSpace(B, {"z_img": BoxSpace(B, 0, 255, dt(B, "uint8"), shape=(2,)),
                           "a_flag": BinarySpace(B, ()),
                           "m_pos": BoxSpace(B, -5, 5, dt(B, "float32"), shape=(1,))})
        leaves = fu.flat_leaves(sp)
        assert [lf.path for lf in leaves] == [("a_flag",), ("m_pos",), ("z_img",)]
        assert [lf.offset for lf in leaves] == [0, 1, 2]
        flat = fu.flatten_space(sp)
        np.testing.assert_array_equal(as_np(B, flat.low), [0, -5, 0, 0])
        np.testing.assert_array_equal(as_np(B, flat.high), [1, 5, 255, 255])
        data = {"a_flag": B.from_numpy(np.array(True)), "m_pos": B.from_numpy(np.array([-2.5], np.float32)),
                "z_img": B.from_numpy(np.array([7, 200], np.uint8))}
        row = fu.flatten_data(sp, data)
        assert row.dtype == flat.dtype
        np.testing.assert_array_equal(as_np(B, row), [1, -2.5, 7, 200])
        back = fu.unflatten_data(sp, row)
        assert_data_equal(B, back, data)


class TestFlattenData:
    @pytest.mark.parametrize("B", BACKENDS)
    def test_round_trip(self, B: Any) -> None:
        f = dt(B, "float32")
        spaces = [
            BoxSpace(B, -1, 1, f, shape=(2, 3)),
            BoxSpace(B, 0, 200, dt(B, "uint8"), shape=(4,)),
            BinarySpace(B, (3,)),
            DictSpace(B, {"obs": {"p": BoxSpace(B, -1, 1, f, shape=(2,)), "ok": BinarySpace(B, ())},
                          "k": BoxSpace(B, -3, 3, dt(B, "int16"), shape=(2,))}),
            TupleSpace(B, [BinarySpace(B, (2,)), BoxSpace(B, 0, 9, dt(B, "int32"))]),
        ]
        rng = B.random.random_number_generator(5)
        for sp in spaces:
            rng, x = sp.sample(rng)
            flat = fu.flatten_data(sp, x)
            assert tuple(flat.shape) == (fu.flat_dim(sp),)
            assert flat.dtype == fu.flatten_space(sp).dtype
            assert fu.flatten_space(sp).contains(flat)
            back = fu.unflatten_data(sp, flat)
            assert sp.contains(back)
            assert_data_equal(B, back, x)

    @pytest.mark.parametrize("B", BACKENDS)
    def test_round_trip_start_dim_1(self, B: Any) -> None:
        f = dt(B, "float32")
        sp = DictSpace(B, {"x": BoxSpace(B, -1, 1, f, shape=(2, 2)), "b": BinarySpace(B, (3,)),
                           "t": TupleSpace(B, [BoxSpace(B, 0, 4, dt(B, "int32"))])})
        n = 5
        rng = B.random.random_number_generator(9)
        items = []
        for _ in range(n):
            rng, x = sp.sample(rng)
            items.append(x)
        batched = bu.batch_space(sp, n)
        data = bu.concatenate(batched, items)
        flat = fu.flatten_data(batched, data, start_dim=1)
        assert tuple(flat.shape) == (n, fu.flat_dim(sp))
        assert fu.flat_dim(batched, start_dim=1) == fu.flat_dim(sp)
        assert fu.flatten_space(batched, start_dim=1).shape == (n, fu.flat_dim(sp))
        for i in range(n):  # row i is the flattened sample i
            np.testing.assert_array_equal(as_np(B, flat[i]), as_np(B, fu.flatten_data(sp, items[i])))
        back = fu.unflatten_data(batched, flat, start_dim=1)
        assert batched.contains(back)
        assert_data_equal(B, back, data)

    @pytest.mark.parametrize("B", BACKENDS)
    def test_unflatten_returns_copies(self, B: Any) -> None:
        f = dt(B, "float32")
        sp = DictSpace(B, {"a": BoxSpace(B, -9, 9, f, shape=(2,)), "b": BoxSpace(B, -9, 9, f, shape=(1,))})
        flat = B.from_numpy(np.array([1.0, 2.0, 3.0], np.float32))
        out = fu.unflatten_data(sp, flat)
        if B is JB:
            pytest.skip("JAX arrays are immutable: a view could never change")
        flat[0] = 7.0
        np.testing.assert_array_equal(as_np(B, out["a"]), [1.0, 2.0])

    @pytest.mark.parametrize("B", BACKENDS)
    def test_bad_data(self, B: Any) -> None:
        f = dt(B, "float32")
        sp = DictSpace(B, {"a": BoxSpace(B, 0, 1, f, shape=(2,)), "b": BinarySpace(B, ())})
        good = {"a": B.from_numpy(np.zeros(2, np.float32)), "b": B.from_numpy(np.array(False))}
        fu.flatten_data(sp, good)
        with pytest.raises(KeyError):
            fu.flatten_data(sp, {"a": good["a"]})
        with pytest.raises(KeyError):  # extra keys are never dropped silently
            fu.flatten_data(sp, {**good, "c": good["a"]})
        with pytest.raises(ValueError):
            fu.flatten_data(sp, {**good, "a": B.from_numpy(np.zeros(3, np.float32))})
        with pytest.raises(TypeError):
            fu.flatten_data(sp, [good["a"], good["b"]])
        with pytest.raises(ValueError):
            fu.flatten_data(TupleSpace(B, [BinarySpace(B, ())]), ())

    @needs_torch
    def test_numpy_data_for_a_torch_space_is_a_type_error(self) -> None:
        with pytest.raises(TypeError):
            fu.flatten_data(BoxSpace(TB, 0, 1, torch.float32, shape=(2,)), np.zeros(2, np.float32))

    @pytest.mark.parametrize("B", BACKENDS)
    def test_text_in_dict(self, B: Any) -> None:
        sp = DictSpace(B, {"t": TextSpace(B, 3, charset="ab"), "x": BinarySpace(B, ())})
        data = {"t": "ba", "x": B.from_numpy(np.array(True))}
        flat = fu.flatten_data(sp, data)
        np.testing.assert_array_equal(as_np(B, flat), [1, 0, 2, 1])
        back = fu.unflatten_data(sp, flat)
        assert back["t"] == "ba" and bool(as_np(B, back["x"]))
        with pytest.raises(ValueError):
            fu.flatten_data(TextSpace(B, 2, charset="ab"), "abc")
        with pytest.raises(ValueError):
            fu.flatten_data(TextSpace(B, 2, charset="ab"), "z")


# ================================================================================================ serialization
def json_round_trip(sp: Space, backend: Any) -> Space:
    text = json.dumps(su.space_to_json(sp))
    return su.json_to_space(json.loads(text), backend)


class TestSerialization:
    @pytest.mark.parametrize("B", BACKENDS)
    def test_every_space_kind(self, B: Any) -> None:
        wrong = []
        for sp in all_spaces(B):
            js = su.space_to_json(sp)
            assert isinstance(js, dict) and isinstance(js["type"], str)
            back = json_round_trip(sp, B)
            assert type(back) is type(sp)
            if back != sp:
                wrong.append((sp, back))
        assert not wrong, wrong

    @pytest.mark.parametrize("B", BACKENDS)
    def test_every_box_dtype(self, B: Any) -> None:
        names = ["float16", "bfloat16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "uint16",
                 "uint32", "uint64"]
        seen = []
        for name in names:
            try:
                d = B.dtype_from_name(name)
            except ValueError:
                assert (B.simplified_name, name) == ("numpy", "bfloat16")  # the only gap
                continue
            for lo, hi in [(0, 7), (-np.inf, np.inf)]:
                if name.startswith("u") and lo == -np.inf:
                    lo = 0
                sp = BoxSpace(B, lo, hi, d, shape=(2,))
                js = su.space_to_json(sp)
                assert js["dtype"] == name
                back = json_round_trip(sp, B)
                assert back == sp and back.dtype == d
            seen.append(name)
        assert "float16" in seen and "uint64" in seen

    @pytest.mark.parametrize("B", BACKENDS)
    def test_binary_dtype(self, B: Any) -> None:
        js = su.space_to_json(BinarySpace(B, (2, 3)))
        assert js["dtype"] == "bool" and js["shape"] == [2, 3]
        assert json_round_trip(BinarySpace(B, (2, 3)), B) == BinarySpace(B, (2, 3))

    @pytest.mark.parametrize("B", BACKENDS)
    def test_format(self, B: Any) -> None:
        sp = DictSpace(B, {"b": BoxSpace(B, np.array([0.0, 0.0]), np.array([1.0, np.inf]), dt(B, "float32")),
                           "a": TextSpace(B, 3, min_length=1, charset="yx"),
                           "t": TupleSpace(B, [BinarySpace(B, ())])}, metadata={"source": "sim"})
        js = su.space_to_json(sp)
        assert js["type"] == "DictSpace" and list(js["spaces"]) == ["a", "b", "t"]
        assert js["metadata"] == {"source": "sim"}
        box = js["spaces"]["b"]
        assert box["type"] == "BoxSpace" and box["shape"] == [2] and box["dtype"] == "float32"
        # the reference's form: the Box's ndim, axes along which a bound does not vary cut to length 1
        assert box["low"] == [0.0] and box["high"] == [1.0, float("inf")]
        for other_form in (dict(box, low=0.0), dict(box, low=[0.0, 0.0])):   # forms earlier versions wrote still read
            assert su.json_to_space(other_form, sp.backend) == sp.spaces["b"]
        image = su.space_to_json(BoxSpace(B, 0, 255, dt(B, "uint8"), shape=(64, 48, 3)))
        assert image["low"] == [[[0]]] and image["high"] == [[[255]]]
        per_channel = np.broadcast_to(np.array([0.0, -1.0, 2.0]), (4, 5, 3))
        js_pc = su.space_to_json(BoxSpace(B, per_channel, 10.0, dt(B, "float32"), shape=(4, 5, 3)))
        assert js_pc["low"] == [[[0.0, -1.0, 2.0]]] and js_pc["high"] == [[[10.0]]]
        assert su.json_to_space(js_pc, sp.backend).low_numpy.tolist() == per_channel.tolist()
        assert js["spaces"]["a"] == {"type": "TextSpace", "min_length": 1, "max_length": 3, "charset": "xy"}
        assert js["spaces"]["t"]["type"] == "TupleSpace" and isinstance(js["spaces"]["t"]["spaces"], list)
        text = json.dumps(js)
        assert "Infinity" in text
        back = su.json_to_space(json.loads(text), B)
        assert back == sp and back.metadata["source"] == "sim"

    @pytest.mark.parametrize("B", BACKENDS)
    def test_metadata_survives_on_children(self, B: Any) -> None:
        sp = DictSpace(B, {"img": BoxSpace(B, 0, 255, dt(B, "uint8"), shape=(2,), metadata={"kind": "image"})})
        back = json_round_trip(sp, B)
        assert back["img"].metadata["kind"] == "image"

    @needs_torch
    def test_json_is_backend_neutral(self) -> None:
        wrong = []
        for sp in all_spaces(NB):
            on_torch = su.json_to_space(json.loads(json.dumps(su.space_to_json(sp))), TB)
            if on_torch != sp.to(TB):
                wrong.append((sp, on_torch))
        assert not wrong, wrong
        tb = BoxSpace(TB, 0, 1, torch.bfloat16, shape=(2,))
        assert json_round_trip(tb, TB) == tb
        with pytest.raises(ValueError):
            su.json_to_space(su.space_to_json(tb), NB)

    @pytest.mark.parametrize("bad", [{}, {"type": "NoSuchSpace"}, {"type": "BoxSpace", "shape": [2]},
                                     {"type": "DictSpace", "spaces": [1, 2]}, [1, 2], "BoxSpace"])
    def test_malformed_json_is_a_value_error(self, bad: Any) -> None:
        with pytest.raises(ValueError):
            su.json_to_space(bad, NB)

    def test_unknown_space_is_a_type_error(self) -> None:
        with pytest.raises(TypeError):
            su.space_to_json(_OpaqueSpace(NB))


# ================================================================================================ properties
from hypothesis import example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.extra import numpy as hnp  # noqa: E402

_BOX_DTYPES = ["float16", "float32", "float64", "int8", "uint8", "int32", "int64", "uint64"]


@st.composite
def box_bounds(draw: Any) -> Any:
    name = draw(st.sampled_from(_BOX_DTYPES))
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=2, max_side=3))
    elems = (hnp.from_dtype(np.dtype(name), allow_nan=False, allow_infinity=False)
             if np.dtype(name).kind == "f" else hnp.from_dtype(np.dtype(name)))
    a = draw(hnp.arrays(np.dtype(name), shape, elements=elems))
    b = draw(hnp.arrays(np.dtype(name), shape, elements=elems))
    return name, np.minimum(a, b), np.maximum(a, b)


@settings(max_examples=60, deadline=None)
@given(bounds=box_bounds(), use_torch=st.booleans())
# bounds that float64 cannot hold exactly
@example(bounds=("uint64", np.array([0, 0], np.uint64), np.array([0, 2 ** 63 + 1], np.uint64)), use_torch=False)
@example(bounds=("int64", np.array(2 ** 53 + 1, np.int64), np.array(2 ** 53 + 1, np.int64)), use_torch=False)
@example(bounds=("int64", np.array([-(2 ** 62) - 1], np.int64), np.array([2 ** 62 + 1], np.int64)), use_torch=True)
def test_box_bounds_survive_json_to_and_batching_exactly(bounds: Any, use_torch: bool) -> None:
    name, lo, hi = bounds
    B = TB if (use_torch and TB is not None) else NB
    sp = BoxSpace(B, lo, hi, B.dtype_from_name(name))
    assert sp.shape == lo.shape
    np.testing.assert_array_equal(sp.low_numpy, lo)
    np.testing.assert_array_equal(sp.high_numpy, hi)
    assert json_round_trip(sp, B) == sp
    assert sp.with_metadata(k=1) == sp
    other = TB if B is NB else NB
    if other is not None:
        assert sp.to(other).to(B) == sp
    single = bu.get_single_space(bu.batch_space(sp, 2))
    assert single == sp
    rng, x = sp.sample(B.random.random_number_generator(0))
    assert sp.contains(x)


_LEAF_DTYPES = ["float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "bool"]


def _leaf_spec() -> Any:
    shapes = hnp.array_shapes(min_dims=0, max_dims=2, min_side=1, max_side=3)
    return st.tuples(st.just("leaf"), st.sampled_from(_LEAF_DTYPES), shapes)


_space_specs = st.recursive(
    _leaf_spec(),
    lambda children: st.one_of(
        st.tuples(st.just("dict"), st.dictionaries(st.text("abcxyz", min_size=1, max_size=3), children, min_size=1,
                                                   max_size=3)),
        st.tuples(st.just("tuple"), st.lists(children, min_size=1, max_size=3)),
    ),
    max_leaves=5,
)


def _build(B: Any, spec: Any) -> Space:
    kind = spec[0]
    if kind == "leaf":
        _, name, shape = spec
        if name == "bool":
            return BinarySpace(B, shape)
        lo, hi = (0, 100) if name.startswith("u") else (-100, 100)
        return BoxSpace(B, lo, hi, B.dtype_from_name(name), shape=shape)
    if kind == "dict":
        return DictSpace(B, {k: _build(B, v) for k, v in spec[1].items()})
    return TupleSpace(B, [_build(B, v) for v in spec[1]])


@settings(max_examples=40, deadline=None)
@given(spec=_space_specs, use_torch=st.booleans(), n=st.integers(1, 3), seed=st.integers(0, 2 ** 16))
def test_flatten_round_trip_on_random_nested_spaces(spec: Any, use_torch: bool, n: int, seed: int) -> None:
    """Leaves whose values every promoted row dtype holds exactly come back unchanged, single and batched."""
    B = TB if (use_torch and TB is not None) else NB
    sp = _build(B, spec)
    flat_space = fu.flatten_space(sp)
    assert flat_space.shape == (fu.flat_dim(sp),)
    assert [lf.offset for lf in fu.flat_leaves(sp)] == sorted(lf.offset for lf in fu.flat_leaves(sp))
    rng = B.random.random_number_generator(seed)
    items = []
    for _ in range(n):
        rng, x = sp.sample(rng)
        items.append(x)
        flat = fu.flatten_data(sp, x)
        assert flat.dtype == flat_space.dtype and tuple(flat.shape) == flat_space.shape
        assert flat_space.contains(flat)
        back = fu.unflatten_data(sp, flat)
        assert sp.contains(back)
        assert_data_equal(B, back, x)
    batched = bu.batch_space(sp, n)
    data = bu.concatenate(batched, items)
    rows = fu.flatten_data(batched, data, start_dim=1)
    assert tuple(rows.shape) == (n, fu.flat_dim(sp))
    assert_data_equal(B, fu.unflatten_data(batched, rows, start_dim=1), data)
    assert json_round_trip(sp, B) == sp


def test_a_huge_stored_shape_is_refused_before_any_allocation() -> None:
    # a Box keeps full-shape float64 bounds: 2**31 elements per sample would allocate tens of GiB (found by fuzzing)
    js = su.space_to_json(BoxSpace(NB, -1.0, 1.0, np.float32, shape=(3,)))
    js["shape"] = [2 ** 31]
    with pytest.raises(ValueError, match="elements per sample"):
        su.json_to_space(js, NB)
    js["shape"] = [2160, 3840, 3]                     # a 4K RGB frame still loads
    assert su.json_to_space(js, NB).shape == (2160, 3840, 3)


def test_box_contains_accepts_dtypes_that_cast_without_loss() -> None:
    box = BoxSpace(NB, 0.0, 1.0, np.float32, shape=(2,))
    assert box.contains(np.array([True, False]))              # a bool array in a float32 box, as the reference
    assert box.contains(np.array([1, 0], np.uint8)) and box.contains(np.array([0.5, 1.0], np.float16))
    for lossy in (np.float64, np.int32, np.int64):              # values these hold may not survive float32
        assert not box.contains(np.zeros(2, lossy))
    assert not box.contains(np.array([2, 0], np.uint8))         # the bounds still apply
    assert not box.contains(np.zeros(2, np.complex64)) and not box.contains(np.array(["a", "b"]))
    ints = BoxSpace(NB, -5, 5, np.int64, shape=())
    assert ints.contains(np.int32(3)) and ints.contains(np.array(True)) and not ints.contains(np.float32(1.0))
    assert not ints.contains(np.uint64(1))                      # uint64 does not fit int64
    torch = pytest.importorskip("torch")
    from unienv_interface.backends.pytorch import PyTorchComputeBackend as TB
    tbox = BoxSpace(TB, -2.0, 2.0, torch.float32, shape=(2,))
    assert tbox.contains(torch.tensor([1.5, -2.0], dtype=torch.bfloat16)) and tbox.contains(torch.ones(2, dtype=torch.bool))
    assert not tbox.contains(torch.tensor([3.0, 0.0], dtype=torch.bfloat16))
    assert not tbox.contains(torch.zeros(2, dtype=torch.float64)) and not tbox.contains(torch.zeros(2, dtype=torch.int64))
