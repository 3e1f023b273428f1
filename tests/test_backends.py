"""Compute backends: namespace classes over NumPy / PyTorch / JAX, dtype names, conversion, functional RNG,
serialization, and that the packages import without the optional array libraries."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from typing import Any

import numpy as np
import pytest

from unienv_interface.backends import (ComputeBackend, NumpyComputeBackend, deserialize_backend, deserialize_dtype,
                                       get_backend_from_tensor, serialize_backend, serialize_dtype)
from unienv_interface.backends.numpy import NumpyComputeBackend as NumpyFromModule

NB = NumpyComputeBackend
torch = pytest.importorskip("torch")
from unienv_interface.backends.pytorch import PyTorchComputeBackend as TB  # noqa: E402

BACKENDS = [pytest.param(NB, id="numpy"), pytest.param(TB, id="pytorch")]
try:  # JAX joins every backend-parametrized test when the `jax` extra is installed (CI installs it)
    from unienv_interface.backends.jax import JaxComputeBackend as _JB
    BACKENDS.append(pytest.param(_JB, id="jax"))
    import jax as _jax
    _JAX_X64 = bool(_jax.config.read("jax_enable_x64"))
except ModuleNotFoundError:
    _JB = None  # type: ignore[assignment,misc]
    _JAX_X64 = True
#: dtype a backend keeps for a NumPy array of each name (JAX without x64 narrows 64-bit data it can hold exactly)
_JAX_NARROW = {"int64": "int32", "uint64": "uint32", "float64": "float32", "complex128": "complex64"}


def kept_dtype(B: Any, name: str) -> str:
    if B is _JB and not _JAX_X64:
        return _JAX_NARROW.get(name, name)
    return name
ALL_NAMES = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16", "bfloat16",
             "float32", "float64", "complex64", "complex128"]
#: dtypes NumPy and PyTorch both have
COMMON = [n for n in ALL_NAMES if n != "bfloat16"]
REPO_SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")


# ================================================================================================ namespace classes
class TestNamespaceClasses:
    @pytest.mark.parametrize("B", BACKENDS)
    def test_not_instantiable(self, B: Any) -> None:
        with pytest.raises(RuntimeError):
            B()
        with pytest.raises(RuntimeError):
            ComputeBackend()

    def test_repr_is_the_simplified_name(self) -> None:
        assert repr(NB) == "numpy" and str(NB) == "numpy" and NB.simplified_name == "numpy"
        assert repr(TB) == "pytorch" and str(TB) == "pytorch" and TB.simplified_name == "pytorch"
        assert f"{NB}" == "numpy"

    def test_import_paths_give_the_same_class(self) -> None:
        assert NumpyFromModule is NB
        from unienv_interface.backends import pytorch as pt_mod
        assert pt_mod.PyTorchComputeBackend is TB
        assert pt_mod.PyTorchArrayType is torch.Tensor and pt_mod.PyTorchRNGType is torch.Generator
        from unienv_interface.backends import numpy as np_mod
        assert np_mod.NumpyArrayType is np.ndarray and np_mod.NumpyRNGType is np.random.Generator

    def test_equality_is_identity(self) -> None:
        assert NB == NumpyComputeBackend and TB == deserialize_backend("pytorch")
        assert NB != TB
        assert issubclass(NB, ComputeBackend) and issubclass(TB, ComputeBackend)

    def test_default_dtypes(self) -> None:
        assert TB.default_integer_dtype == torch.int32
        assert TB.default_index_dtype == torch.int64
        assert TB.default_floating_dtype == torch.float32
        assert TB.default_boolean_dtype == torch.bool
        assert np.dtype(NB.default_integer_dtype) == np.int64
        assert np.dtype(NB.default_index_dtype) == np.int64
        assert np.dtype(NB.default_floating_dtype) == np.float64
        assert np.dtype(NB.default_boolean_dtype) == np.bool_

    @pytest.mark.parametrize("B", BACKENDS)
    def test_array_api_names_are_reachable(self, B: Any) -> None:
        for name in ["zeros", "ones", "empty", "full", "zeros_like", "asarray", "arange", "reshape", "astype", "concat",
                     "stack", "result_type", "broadcast_to", "broadcast_shapes", "all", "any", "min", "max", "sum",
                     "isclose", "isnan", "iinfo", "finfo", "nonzero", "argsort", "unique_values", "logical_and",
                     "logical_or", "logical_not", "where", "clip", "floor", "minimum", "maximum", "permute_dims",
                     "device", "to_device", "float32", "uint8", "int64", "bool", "inf"]:
            assert getattr(B, name) is not None, name
        z = B.zeros((2, 3), dtype=B.float32)
        assert B.is_backendarray(z) and tuple(z.shape) == (2, 3)
        c = B.concat([B.zeros((2,), dtype=B.float32), B.ones((1,), dtype=B.float32)], axis=0)
        np.testing.assert_array_equal(B.to_numpy(c), [0.0, 0.0, 1.0])
        s = B.stack([B.arange(3), B.arange(3)], axis=0)
        assert tuple(s.shape) == (2, 3)
        assert B.inf == float("inf")
        assert int(B.iinfo(B.int8).max) == 127
        with pytest.raises(AttributeError):
            B.no_such_function_anywhere

    @pytest.mark.parametrize("B", BACKENDS)
    def test_array_namespace_info_lists_dtypes(self, B: Any) -> None:
        """The reference serializes dtypes through `B.__array_namespace_info__().dtypes()`."""
        dtypes = B.__array_namespace_info__().dtypes()
        assert "float32" in dtypes and "int64" in dtypes and "bool" in dtypes

    @pytest.mark.parametrize("B", BACKENDS)
    def test_at_set_is_in_place_for_mutable_arrays(self, B: Any) -> None:
        x = B.zeros((3,), dtype=B.float32)
        out = B.at(x)[1].set(5.0)
        np.testing.assert_array_equal(B.to_numpy(out), [0.0, 5.0, 0.0])
        # NumPy and torch write in place; JAX arrays are immutable, so the original stays as it was
        np.testing.assert_array_equal(B.to_numpy(x), [0.0, 0.0, 0.0] if B is _JB else [0.0, 5.0, 0.0])

    def test_get_backend_from_tensor(self) -> None:
        assert get_backend_from_tensor(np.zeros(2)) is NB
        assert get_backend_from_tensor(torch.zeros(2)) is TB
        with pytest.raises(TypeError):
            get_backend_from_tensor([1, 2])

    @pytest.mark.parametrize("B", BACKENDS)
    def test_helpers(self, B: Any) -> None:
        assert B.is_backendarray(B.zeros((1,))) and not B.is_backendarray([0])
        assert B.abbreviate_array(B.from_numpy(np.full((2, 3), 4.0))) == 4.0
        ab = B.abbreviate_array(B.from_numpy(np.array([[1, 2, 3], [1, 2, 3]])))
        np.testing.assert_array_equal(B.to_numpy(ab), [[1, 2, 3]])
        padded = B.pad_dim(B.zeros((2, 2), dtype=B.float32), 1, 4, 7.0)
        np.testing.assert_array_equal(B.to_numpy(padded), [[0, 0, 7, 7], [0, 0, 7, 7]])
        mapped = B.map_fn_over_arrays({"a": B.zeros((1,)), "b": (B.ones((1,)), 3)}, lambda x: x + 1)
        np.testing.assert_array_equal(B.to_numpy(mapped["a"]), [1.0])
        np.testing.assert_array_equal(B.to_numpy(mapped["b"][0]), [2.0])
        assert mapped["b"][1] == 3


# ================================================================================================ conversion
class TestConversion:
    @pytest.mark.parametrize("B", BACKENDS)
    @pytest.mark.parametrize("name", [n for n in COMMON if not n.startswith("complex")])
    def test_from_numpy_to_numpy_round_trip(self, B: Any, name: str) -> None:
        a = np.arange(6).reshape(2, 3).astype(name)
        x = B.from_numpy(a)
        kept = kept_dtype(B, name)
        assert B.is_backendarray(x) and B.dtype_name(x.dtype) == kept and tuple(x.shape) == (2, 3)
        back = B.to_numpy(x)
        assert isinstance(back, np.ndarray) and back.dtype == np.dtype(kept)
        np.testing.assert_array_equal(back, a)

    @pytest.mark.skipif(_JB is None or _JAX_X64, reason="needs JAX running without JAX_ENABLE_X64")
    @pytest.mark.parametrize("name,big", [("int64", 2**40), ("uint64", 2**33), ("float64", 1e300)])
    def test_jax_without_x64_refuses_64_bit_values_it_cannot_hold(self, name: str, big: Any) -> None:
        a = np.array([1, big], dtype=name)
        with pytest.raises(ValueError, match=f"{name}.*JAX_ENABLE_X64"):
            _JB.from_numpy(a)
        with pytest.raises(ValueError, match="JAX_ENABLE_X64"):
            _JB.from_other_backend(TB, torch.from_numpy(a.copy()) if name != "uint64" else torch.tensor([1, 2**33]))
        ok = _JB.from_other_backend(TB, torch.tensor([1, -2], dtype=torch.int64))
        assert ok.dtype.name == "int32" and ok.tolist() == [1, -2]

    @pytest.mark.parametrize("B", BACKENDS)
    def test_from_numpy_with_dtype(self, B: Any) -> None:
        x = B.from_numpy(np.array([1, 2, 3], np.int64), dtype=B.float32)
        assert x.dtype == B.dtype_from_name("float32")
        y = B.from_numpy(np.array([1, 0]), dtype="bool")
        assert B.dtype_is_boolean(y.dtype)

    def test_torch_from_read_only_numpy(self) -> None:
        a = np.arange(3.0)
        a.flags.writeable = False
        t = TB.from_numpy(a)
        t[0] = 9.0  # must not write into (or warn about) the read-only source
        assert a[0] == 0.0

    @pytest.mark.parametrize("name", [n for n in COMMON if not n.startswith("complex")])
    def test_numpy_to_torch_and_back(self, name: str) -> None:
        a = np.array([0, 1, 1, 0, 1]).astype(name)
        t = TB.from_other_backend(NB, a)
        assert isinstance(t, torch.Tensor) and TB.dtype_name(t.dtype) == name
        np.testing.assert_array_equal(t.numpy(), a)
        n = NB.from_other_backend(TB, t)
        assert isinstance(n, np.ndarray) and n.dtype == np.dtype(name)
        np.testing.assert_array_equal(n, a)

    def test_same_backend_is_identity(self) -> None:
        a = np.zeros(3)
        assert NB.from_other_backend(NB, a) is a
        t = torch.zeros(3)
        assert TB.from_other_backend(TB, t) is t

    def test_torch_bfloat16_to_numpy_is_refused(self) -> None:
        with pytest.raises(TypeError):
            NB.from_other_backend(TB, torch.zeros(2, dtype=torch.bfloat16))

    def test_devices(self) -> None:
        t = torch.zeros(2)
        assert str(TB.device(t)).startswith("cpu")
        assert TB.to_device(t, "cpu").device.type == "cpu"
        assert TB.deserialize_device(TB.serialize_device(torch.device("cpu"))) == torch.device("cpu")
        assert TB.deserialize_device("cpu:0").type == "cpu"
        assert TB.serialize_device(None) is None and TB.deserialize_device(None) is None
        assert NB.to_device(np.zeros(1), None) is not None
        with pytest.raises(ValueError):
            NB.to_device(np.zeros(1), "cuda:0")


# ================================================================================================ dtypes
class TestDtypes:
    @pytest.mark.parametrize("B", BACKENDS)
    @pytest.mark.parametrize("name", ALL_NAMES)
    def test_dtype_name_round_trip(self, B: Any, name: str) -> None:
        if B is NB and name == "bfloat16":
            with pytest.raises(ValueError):
                B.dtype_from_name(name)
            return
        d = B.dtype_from_name(name)
        assert B.dtype_name(d) == name
        assert B.dtype_from_name(B.dtype_name(d)) == d
        assert name in B.dtype_names()

    @pytest.mark.parametrize("name", COMMON)
    def test_common_dtypes_match_across_backends(self, name: str) -> None:
        t, n = TB.dtype_from_name(name), NB.dtype_from_name(name)
        assert t == getattr(torch, name)
        assert np.dtype(n) == np.dtype(name)
        assert TB.numpy_dtype(t) == np.dtype(name)
        assert TB.as_dtype(n) == t and np.dtype(NB.as_dtype(t)) == np.dtype(name)
        assert TB.itemsize(t) == np.dtype(name).itemsize

    @pytest.mark.parametrize("B", BACKENDS)
    def test_unknown_names(self, B: Any) -> None:
        with pytest.raises(ValueError):
            B.dtype_from_name("float128x")
        with pytest.raises(ValueError):
            B.dtype_name("not a dtype") if B is TB else B.dtype_name(np.dtype("U3"))

    @pytest.mark.parametrize("B", BACKENDS)
    def test_classification(self, B: Any) -> None:
        for name in ALL_NAMES:
            try:
                d = B.dtype_from_name(name)
            except ValueError:
                continue
            assert B.dtype_is_boolean(d) == (name == "bool")
            assert B.dtype_is_real_integer(d) == (name.startswith("int") or name.startswith("uint")), name
            assert B.dtype_is_real_floating(d) == (name.startswith("float") or name == "bfloat16"), name

    def test_python_types_as_dtypes(self) -> None:
        assert np.dtype(NB.as_dtype(int)) == np.int64 and np.dtype(NB.as_dtype(float)) == np.float64
        assert TB.as_dtype(bool) == torch.bool and TB.as_dtype("float16") == torch.float16
        assert TB.as_dtype("torch.int16") == torch.int16
        assert TB.numpy_dtype(torch.bfloat16).itemsize == 2

    def test_promotion(self) -> None:
        assert TB.promote_types(torch.bool, torch.float32) == torch.float32
        assert TB.promote_types(torch.uint8, torch.int8) == torch.int16
        assert TB.promote_types(torch.float16, torch.int32) == torch.float16
        assert np.dtype(NB.promote_types(np.bool_, np.float32)) == np.float32
        assert np.dtype(NB.promote_types(np.int32, np.float32)) == np.float64
        with pytest.raises(ValueError):
            NB.promote_types()


# ================================================================================================ serialization
class TestSerialization:
    @pytest.mark.parametrize("B", BACKENDS)
    @pytest.mark.parametrize("name", ALL_NAMES)
    def test_serialize_dtype_round_trip(self, B: Any, name: str) -> None:
        try:
            d = B.dtype_from_name(name)
        except ValueError:
            assert B is NB and name == "bfloat16"
            return
        s = serialize_dtype(d)
        assert s == name and isinstance(s, str)
        assert deserialize_dtype(B, s) == d
        assert serialize_dtype(d, B) == name

    @pytest.mark.parametrize("name", ["float16", "bfloat16", "uint16", "uint32", "uint64"])
    def test_dtypes_the_reference_could_not_serialize(self, name: str) -> None:
        d = getattr(torch, name)
        assert deserialize_dtype(TB, serialize_dtype(d)) == d

    def test_numpy_scalar_types_serialize(self) -> None:
        assert serialize_dtype(np.float32) == "float32"
        assert serialize_dtype(np.dtype("uint16")) == "uint16"
        assert deserialize_dtype(TB, "torch.float32") == torch.float32  # reference-style names are accepted

    def test_deserialize_errors(self) -> None:
        with pytest.raises(ValueError):
            deserialize_dtype(NB, "bfloat16")
        with pytest.raises(ValueError):
            deserialize_dtype(TB, "nope")
        with pytest.raises(TypeError):
            deserialize_dtype(NB, 3)  # type: ignore[arg-type]

    def test_backend_round_trip(self) -> None:
        assert serialize_backend(NB) == "numpy" and serialize_backend(TB) == "pytorch"
        assert deserialize_backend("numpy") is NB and deserialize_backend("pytorch") is TB
        for B in (NB, TB):
            assert deserialize_backend(serialize_backend(B)) is B
        with pytest.raises(ValueError):
            deserialize_backend("tensorflow")
        with pytest.raises(ValueError):
            serialize_backend(np)


# ================================================================================================ random numbers
class TestRandom:
    @pytest.mark.parametrize("B", BACKENDS)
    def test_draws_return_rng_and_value(self, B: Any) -> None:
        rng = B.random.random_number_generator(0)
        rng, u = B.random.random_uniform((4,), rng=rng, low=2.0, high=3.0)
        assert B.is_backendarray(u) and tuple(u.shape) == (4,)
        un = B.to_numpy(u)
        assert ((un >= 2.0) & (un <= 3.0)).all()
        rng, k = B.random.random_discrete_uniform((50,), 3, 7, rng=rng)
        kn = B.to_numpy(k)
        assert B.dtype_is_real_integer(k.dtype) and kn.min() >= 3 and kn.max() < 7
        rng, k8 = B.random.random_discrete_uniform((5,), 0, 4, rng=rng, dtype=B.dtype_from_name("uint8"))
        assert B.dtype_name(k8.dtype) == "uint8"
        rng, nrm = B.random.random_normal((1000,), rng=rng)
        assert abs(float(B.to_numpy(nrm).mean())) < 0.2
        rng, e = B.random.random_exponential((20,), rng=rng)
        assert (B.to_numpy(e) >= 0).all()
        rng, g = B.random.random_geometric((20,), rng=rng, p=0.5)
        assert (B.to_numpy(g) >= 1).all()
        rng, p = B.random.random_permutation(10, rng=rng)
        assert sorted(B.to_numpy(p).tolist()) == list(range(10))
        assert rng is not None

    @pytest.mark.parametrize("B", BACKENDS)
    def test_seed_makes_draws_reproducible(self, B: Any) -> None:
        def draw(seed: int) -> list:
            rng = B.random.random_number_generator(seed)
            out = []
            rng, a = B.random.random_uniform((5,), rng=rng)
            out.append(B.to_numpy(a).tolist())
            rng, b = B.random.random_discrete_uniform((5,), 0, 100, rng=rng)
            out.append(B.to_numpy(b).tolist())
            rng, c = B.random.random_permutation(6, rng=rng)
            out.append(B.to_numpy(c).tolist())
            rng, d = B.random.random_normal((3,), rng=rng)
            out.append(B.to_numpy(d).tolist())
            return out

        assert draw(42) == draw(42)
        assert draw(42) != draw(43)

    @pytest.mark.parametrize("B", BACKENDS)
    def test_unseeded_generators_differ(self, B: Any) -> None:
        _, a = B.random.random_uniform((8,), rng=B.random.random_number_generator())
        _, b = B.random.random_uniform((8,), rng=B.random.random_number_generator())
        assert B.to_numpy(a).tolist() != B.to_numpy(b).tolist()

    def test_torch_dtype_and_device_arguments(self) -> None:
        rng = TB.random.random_number_generator(1, device="cpu")
        rng, u = TB.random.random_uniform((2,), rng=rng, dtype=torch.float64, device="cpu")
        assert u.dtype == torch.float64 and u.device.type == "cpu"
        rng, p = TB.random.random_permutation(4, rng=rng, dtype=torch.int32)
        assert p.dtype == torch.int32


# ================================================================================================ JAX
class TestJax:
    def test_jax_backend(self) -> None:
        pytest.importorskip("jax")
        import jax.numpy as jnp

        from unienv_interface.backends.jax import JaxComputeBackend as JB
        with pytest.raises(RuntimeError):
            JB()
        assert repr(JB) == "jax" and deserialize_backend("jax") is JB and serialize_backend(JB) == "jax"
        x = JB.from_numpy(np.arange(3, dtype=np.float32))
        assert JB.is_backendarray(x)
        np.testing.assert_array_equal(JB.to_numpy(x), [0.0, 1.0, 2.0])
        assert JB.dtype_name(JB.dtype_from_name("bfloat16")) == "bfloat16"
        assert JB.dtype_from_name(serialize_dtype(jnp.float16)) == jnp.float16
        y = JB.at(x)[0].set(5.0)
        assert float(y[0]) == 5.0 and float(x[0]) == 0.0  # functional on JAX
        t = TB.from_other_backend(JB, x)
        assert isinstance(t, torch.Tensor) and t.tolist() == [0.0, 1.0, 2.0]
        back = JB.from_other_backend(NB, np.arange(2))
        assert JB.is_backendarray(back)
        k1 = JB.random.random_number_generator(3)
        k2 = JB.random.random_number_generator(3)
        _, a = JB.random.random_uniform((4,), rng=k1)
        _, b = JB.random.random_uniform((4,), rng=k2)
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))

    def test_jax_import_error_names_the_extra(self) -> None:
        try:
            import jax  # noqa: F401
        except ImportError:
            with pytest.raises(ModuleNotFoundError, match="jax"):
                import unienv_interface.backends.jax  # noqa: F401
        else:
            pytest.skip("jax is installed")


# ================================================================================================ optional deps
def _run_without(blocked: list, body: str) -> subprocess.CompletedProcess:
    """Runs `body` in a fresh interpreter where importing any of `blocked` fails."""
    prelude = "import sys\n" + "".join(f"sys.modules[{m!r}] = None\n" for m in blocked)
    code = prelude + textwrap.dedent(body)
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO_SRC + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)


class TestOptionalDependencies:
    def test_packages_import_without_torch(self) -> None:
        r = _run_without(["torch", "jax"], """
            import unienv_interface
            import unienv_data
            import unienv_interface.backends
            import unienv_interface.space
            from unienv_interface.space.space_utils import batch_utils, flatten_utils, serialization_utils
            from unienv_interface.backends import NumpyComputeBackend, serialize_dtype
            from unienv_interface.backends.serialization import deserialize_backend
            from unienv_data.base import SpaceStorage, BufferedSegmentWriter
            import unienv_data.storages.flattened
            import unienv_data.storages.numpy_memmap
            assert sys.modules["torch"] is None
            print("imported-ok")
        """)
        assert r.returncode == 0, r.stderr
        assert "imported-ok" in r.stdout

    def test_numpy_spaces_work_without_torch(self) -> None:
        r = _run_without(["torch", "jax"], """
            import numpy as np
            from unienv_interface.backends import NumpyComputeBackend as NB
            from unienv_interface.space import BoxSpace, BinarySpace, DictSpace
            from unienv_interface.space.space_utils import flatten_utils, serialization_utils
            sp = DictSpace(NB, {"a": BoxSpace(NB, -1, 1, np.float32, shape=(2,)), "b": BinarySpace(NB, ())})
            rng, x = sp.sample(NB.random.random_number_generator(0))
            flat = flatten_utils.flatten_data(sp, x)
            back = flatten_utils.unflatten_data(sp, flat)
            assert sp.contains(back)
            assert serialization_utils.json_to_space(serialization_utils.space_to_json(sp), NB) == sp
            print("numpy-ok")
        """)
        assert r.returncode == 0, r.stderr
        assert "numpy-ok" in r.stdout

    def test_torch_backend_import_error_names_the_extra(self) -> None:
        r = _run_without(["torch"], """
            try:
                import unienv_interface.backends.pytorch
            except ModuleNotFoundError as exc:
                print("MNFE:", exc)
            try:
                from unienv_interface.backends import deserialize_backend
                deserialize_backend("pytorch")
            except ModuleNotFoundError as exc:
                print("MNFE2:", exc)
        """)
        assert r.returncode == 0, r.stderr
        assert "MNFE:" in r.stdout and "torch" in r.stdout.lower()
        assert "MNFE2:" in r.stdout
