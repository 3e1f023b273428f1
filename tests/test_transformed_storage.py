"""TransformedStorage (reference-api 5.4) and the transformations behind it (`unienv_interface.transformations`):
the shared SpaceStorage contract over FlattenedStorage(PytorchTensorStorage) and NumpyMemmapStorage, exact round
trips, refused transformations, hostile metadata (unknown names, legacy pickles) and dumps / load_from."""
from __future__ import annotations

import gc
import inspect
import json
import os
import pickle
import sys
import warnings
from typing import Any, Dict, Mapping, Optional

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from unienv_data.testing.conformance import StorageConformance, assert_tree_equal, expect_error  # noqa: E402

from unienv_data.base import BoundsWarning, SpaceStorage, StorageFormatError  # noqa: E402
from unienv_data.base.registry import resolve_storage_class  # noqa: E402
from unienv_data.storages.flattened import FlattenedStorage, FlattenPromotionWarning  # noqa: E402
from unienv_data.storages.numpy_memmap import NumpyMemmapStorage  # noqa: E402
from unienv_data.storages.pytorch import PytorchTensorStorage  # noqa: E402
from unienv_data.storages.transformation import TransformedStorage  # noqa: E402
from unienv_interface.backends import NumpyComputeBackend as NB  # noqa: E402
from unienv_interface.backends.pytorch import PyTorchComputeBackend as TB  # noqa: E402
from unienv_interface.space import BinarySpace, BoxSpace, DictSpace, Space  # noqa: E402
from unienv_interface.space.space_utils import batch_utils  # noqa: E402
from unienv_interface.transformations import (ChainedTransformation, DataTransformation,  # noqa: E402
                                              DictTransformation, DtypeTransformation, IdentityTransformation,
                                              RescaleTransformation, TransformationFormatError,
                                              json_to_transformation, register_transformation,
                                              transformation_to_json)

INF = float("inf")
METADATA = "transformed_metadata.json"


# ---------------------------------------------------------------------------------------------------- spaces
def step_space() -> DictSpace:
    return DictSpace(TB, {
        "obs": BoxSpace(TB, -INF, INF, torch.float32, shape=(6,)),
        "action": BoxSpace(TB, -1.0, 1.0, torch.float32, shape=(4,)),
        "reward": BoxSpace(TB, -INF, INF, torch.float32, shape=()),
        "done": BinarySpace(TB, ()),
    })


def step_transformation() -> DictTransformation:
    return DictTransformation({"action": RescaleTransformation(-2.0, 2.0)})


def graded_box(backend: Any = NB) -> BoxSpace:
    low = np.array([[-1.0, -2.0, -4.0], [-0.5, -1.0, -8.0]])
    return BoxSpace(backend, low, -low, np.float32 if backend is NB else torch.float32, shape=(2, 3))


def quantized() -> ChainedTransformation:
    """A float image in [0, 1] stored as uint8 (rounded to nearest)."""
    return ChainedTransformation([RescaleTransformation(0.0, 255.0), DtypeTransformation("uint8", rounding="nearest")])


def _create(space: Space, inner_cls: Any, *args: Any, **kwargs: Any) -> TransformedStorage:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FlattenPromotionWarning)
        return TransformedStorage.create(space, inner_cls, *args, **kwargs)


# ---------------------------------------------------------------------------------------------------- conformance
class _TransformedConformance(StorageConformance):
    # values outside the bounds are stored (the rescale extrapolates, power-of-two scales read them back exactly)
    inner: tuple = (NumpyMemmapStorage,)
    memmap = True
    supports_growable = True

    def make_transformation(self) -> DataTransformation:
        raise NotImplementedError

    def create(self, tmp_path: Any, capacity: Optional[int]) -> TransformedStorage:
        cache = os.path.join(os.fspath(tmp_path), "ts") if self.memmap else None
        return _create(self.space, *self.inner, data_transformation=self.make_transformation(), capacity=capacity,
                       cache_path=cache)

    def load(self, path: Any, read_only: bool) -> TransformedStorage:
        return TransformedStorage.load_from(path, self.space, read_only=read_only)


class TestTransformedRescaleOverFlattenedTorch(_TransformedConformance):
    inner = (FlattenedStorage, PytorchTensorStorage)
    shares_rows_when_pickled = True

    def make_space(self) -> DictSpace:
        return step_space()

    def make_transformation(self) -> DataTransformation:
        return step_transformation()


class TestTransformedRescaleOverFlattenedTorchRAM(_TransformedConformance):
    inner = (FlattenedStorage, PytorchTensorStorage)
    memmap = False

    def make_space(self) -> DictSpace:
        return step_space()

    def make_transformation(self) -> DataTransformation:
        return step_transformation()


class TestTransformedRescaleOverNumpyMemmap(_TransformedConformance):
    shares_rows_when_pickled = True
    spawn_check = True

    def make_space(self) -> BoxSpace:
        return graded_box()

    def make_transformation(self) -> DataTransformation:
        return RescaleTransformation(-1.0, 1.0)


class TestTransformedChainOverNumpyRAM(_TransformedConformance):
    memmap = False

    def make_space(self) -> BoxSpace:
        return graded_box()

    def make_transformation(self) -> DataTransformation:
        return ChainedTransformation([RescaleTransformation(-4.0, 4.0), DtypeTransformation("float64")])


# ---------------------------------------------------------------------------------------------------- signatures
def test_spec_signatures() -> None:
    init = inspect.signature(TransformedStorage.__init__)
    assert list(init.parameters)[1:5] == ["single_instance_space", "data_transformation", "inner_storage",
                                          "inner_storage_path"]
    p = inspect.signature(TransformedStorage.create).parameters
    assert list(p)[:3] == ["single_instance_space", "inner_storage_cls", "args"]
    assert p["args"].kind is inspect.Parameter.VAR_POSITIONAL
    assert p["data_transformation"].kind is inspect.Parameter.KEYWORD_ONLY
    assert p["data_transformation"].default is inspect.Parameter.empty
    for name, default in (("capacity", None), ("cache_path", None), ("multiprocessing", False),
                          ("inner_storage_kwargs", {})):
        assert p[name].kind is inspect.Parameter.KEYWORD_ONLY and p[name].default == default, name
    assert p["kwargs"].kind is inspect.Parameter.VAR_KEYWORD
    p = inspect.signature(TransformedStorage.load_from).parameters
    assert list(p)[:2] == ["path", "single_instance_space"]
    for name, default in (("capacity", None), ("read_only", True), ("multiprocessing", False)):
        assert p[name].kind is inspect.Parameter.KEYWORD_ONLY and p[name].default == default, name
    assert TransformedStorage.single_file_ext is None
    assert issubclass(TransformedStorage, SpaceStorage)
    assert resolve_storage_class("unienv_data.storages.transformation.TransformedStorage") is TransformedStorage


def test_members_and_layout(tmp_path: Any) -> None:
    space = step_space()
    cache = os.path.join(os.fspath(tmp_path), "ts")
    st = _create(space, FlattenedStorage, PytorchTensorStorage, data_transformation=step_transformation(), capacity=5,
                 cache_path=cache)
    try:
        assert isinstance(st.inner_storage, FlattenedStorage)
        assert os.fspath(st.inner_storage_path) == "transformed_inner_storage"
        assert st.transformed_space["action"] == BoxSpace(TB, -2.0, 2.0, torch.float32, shape=(4,))
        assert st.inner_storage.single_instance_space == st.transformed_space
        assert os.fspath(st.cache_filename) == cache
        assert st.capacity == 5 and len(st) == 5 and st.is_mutable and st.is_multiprocessing_safe
        v = {"obs": torch.arange(6, dtype=torch.float32), "action": torch.tensor([1.0, -1.0, 0.5, 0.0]),
             "reward": torch.tensor(2.5), "done": torch.tensor(True)}
        st.set(2, v)
        raw = st.inner_storage.get(2)
        assert torch.equal(raw["action"], torch.tensor([2.0, -2.0, 1.0, 0.0]))  # what is stored is transformed
        assert_tree_equal(st.get(2), v)
        with open(os.path.join(cache, METADATA)) as f:  # create() writes the metadata at once
            meta = json.load(f)
        assert set(meta) == {"storage_type", "inner_storage_type", "inner_storage_path", "data_transformation",
                             "space", "format_version"}
        assert meta["storage_type"] == "TransformedStorage" and meta["format_version"] == 1
        assert meta["inner_storage_type"] == "unienv_data.storages.flattened.FlattenedStorage"
        assert meta["inner_storage_path"] == "transformed_inner_storage"
        assert json_to_transformation(meta["data_transformation"]) == step_transformation()
        other = TransformedStorage.load_from(cache, space)
        assert_tree_equal(other.get(2), v)
        other.close()
    finally:
        st.close()
    single = _create(graded_box(), NumpyMemmapStorage, data_transformation=RescaleTransformation(),
                     capacity=2, cache_path=os.path.join(os.fspath(tmp_path), "single"))
    assert os.fspath(single.inner_storage_path) == "transformed_inner_storage.memmap"
    assert os.path.isfile(os.path.join(os.fspath(tmp_path), "single", "transformed_inner_storage.memmap"))
    single.close()


def test_flattened_accessors_use_the_source_layout() -> None:
    from unienv_interface.space.space_utils.flatten_utils import flatten_data
    space = step_space()
    st = _create(space, FlattenedStorage, PytorchTensorStorage, data_transformation=step_transformation(), capacity=4)
    v = {"obs": torch.arange(6, dtype=torch.float32), "action": torch.tensor([1.0, -1.0, 0.5, 0.0]),
         "reward": torch.tensor(2.5), "done": torch.tensor(True)}
    st.set(1, v)
    flat = st.get_flattened(1)
    assert torch.equal(flat, flatten_data(space, v))  # source values (action in [-1, 1]), sorted key order
    st.set_flattened(0, flat)
    assert_tree_equal(st.get(0), v)
    rows = st.get_flattened(slice(0, 2))
    assert tuple(rows.shape) == (2, flat.shape[0])
    st.set_flattened([2, 3], rows)
    assert_tree_equal(st.get(3), v)
    # sorted key order: action [0, 4), done [4], obs [5, 11), reward [11]
    for col, bad in ((4, 2.0), (4, 0.5)):
        row = flat.clone()
        row[col] = bad
        expect_error((ValueError,), st.set_flattened, 0, row)
    with warnings.catch_warnings():           # an action outside [-1, 1] is refused in the refusal mode only
        warnings.simplefilter("error", BoundsWarning)
        row = flat.clone()
        row[0] = 1.5
        expect_error((ValueError,), st.set_flattened, 0, row)
    expect_error((ValueError,), st.set_flattened, 0, flat[:-1])
    expect_error((ValueError,), st.set_flattened, slice(0, 2), flat)
    expect_error((TypeError,), st.set_flattened, 0, "flat")
    assert_tree_equal(st.get(0), v)
    st.close()


# ---------------------------------------------------------------------------------------------------- refused transformations
class SquareTransformation(DataTransformation):
    """Not invertible on its own (x -> x * x): a storage cannot read its values back."""

    def get_target_space_from_source(self, source_space: Space) -> Space:
        return source_space

    def transform(self, source_space: Space, data: Any) -> Any:
        return data * data

    def to_json(self) -> Dict[str, Any]:
        return {}

    @classmethod
    def from_json(cls, params: Mapping[str, Any]) -> "SquareTransformation":
        return cls()


def test_transformation_without_inverse_is_refused(tmp_path: Any) -> None:
    space = graded_box()
    cache = os.path.join(os.fspath(tmp_path), "ts")
    for t in (SquareTransformation(), ChainedTransformation([RescaleTransformation(), SquareTransformation()])):
        exc = expect_error((ValueError,), TransformedStorage.create, space, NumpyMemmapStorage, data_transformation=t,
                           capacity=3, cache_path=cache)
        assert "inverse" in str(exc), str(exc)
        assert not os.path.exists(cache), "nothing may be created for a refused transformation"
    dspace = step_space()
    exc = expect_error((ValueError,), TransformedStorage.create, dspace, FlattenedStorage, PytorchTensorStorage,
                       data_transformation=DictTransformation({"obs": SquareTransformation()}), capacity=3)
    assert "inverse" in str(exc) and "SquareTransformation" in str(exc), str(exc)
    expect_error((TypeError,), TransformedStorage.create, space, NumpyMemmapStorage, capacity=3)  # required
    expect_error((TypeError,), TransformedStorage.create, space, NumpyMemmapStorage, data_transformation=None,
                 capacity=3)
    inner = NumpyMemmapStorage.create(space, capacity=3)
    expect_error((ValueError,), TransformedStorage, space, SquareTransformation(), inner, "x")
    assert inner.get(0).shape == (2, 3)
    inner.close()


def test_transformation_that_does_not_apply_is_refused() -> None:
    unbounded = BoxSpace(NB, -INF, INF, np.float32, shape=(3,))
    exc = expect_error((ValueError,), TransformedStorage.create, unbounded, NumpyMemmapStorage,
                       data_transformation=RescaleTransformation(), capacity=2)
    assert "finite" in str(exc)
    expect_error((TypeError,), TransformedStorage.create, BinarySpace(NB, (3,)), NumpyMemmapStorage,
                 data_transformation=RescaleTransformation(), capacity=2)
    # rounding into integers would read back values outside [0.3, 254.6]: the inverse does not map onto the space
    odd = BoxSpace(NB, 0.3, 254.6, np.float32, shape=(2,))
    exc = expect_error((ValueError,), TransformedStorage.create, odd, NumpyMemmapStorage,
                       data_transformation=DtypeTransformation("uint8", rounding="nearest"), capacity=2)
    assert "outside" in str(exc), str(exc)


def test_inner_storage_of_another_space_is_refused() -> None:
    space = graded_box()
    wrong = NumpyMemmapStorage.create(BoxSpace(NB, -2.0, 2.0, np.float32, shape=(2, 3)), capacity=2)
    exc = expect_error((ValueError,), TransformedStorage, space, RescaleTransformation(), wrong, "x")
    assert "inner storage" in str(exc)
    wrong.close()


# ---------------------------------------------------------------------------------------------------- round trips
def test_power_of_two_rescale_round_trips_bit_exactly(tmp_path: Any) -> None:
    space = graded_box()
    st = _create(space, NumpyMemmapStorage, data_transformation=RescaleTransformation(-1.0, 1.0), capacity=64)
    rng = np.random.default_rng(0)
    low, high = space.low_numpy, space.high_numpy
    vals = (low + rng.random((64, 2, 3)) * (high - low)).astype(np.float32)
    vals[0], vals[1] = low, high  # the bounds themselves
    vals[2] = np.float32(1e-30)   # tiny values keep every bit
    st.set(Ellipsis, vals)
    back = st.get(Ellipsis)
    assert back.dtype == np.float32 and np.array_equal(back.view(np.uint32), vals.view(np.uint32))
    assert np.abs(st.inner_storage.get(Ellipsis)).max() <= 1.0
    st.close()


def test_uint8_quantization_round_trip(tmp_path: Any) -> None:
    """A float image in [0, 1] kept as uint8: grid values k/255 come back exactly, others within half a step, and
    re-storing what was read changes nothing. The file holds one byte per pixel."""
    space = BoxSpace(TB, 0.0, 1.0, torch.float32, shape=(16, 16))
    st = _create(space, PytorchTensorStorage, data_transformation=quantized(), capacity=3,
                 cache_path=os.path.join(os.fspath(tmp_path), "q"))
    assert st.transformed_space.dtype == torch.uint8
    assert os.path.getsize(os.path.join(os.fspath(tmp_path), "q", "transformed_inner_storage.memmap")) == 3 * 256
    grid = (torch.arange(256, dtype=torch.float64) / 255).to(torch.float32).reshape(16, 16)
    st.set(0, grid)
    assert torch.equal(st.inner_storage.get(0).reshape(-1), torch.arange(256, dtype=torch.uint8))
    assert torch.equal(st.get(0), grid)
    noisy = torch.rand(16, 16, generator=torch.Generator().manual_seed(3))
    st.set(1, noisy)
    back = st.get(1)
    assert float((back - noisy).abs().max()) <= 0.5 / 255 + 1e-7
    st.set(2, back)
    assert torch.equal(st.inner_storage.get(2), st.inner_storage.get(1))
    assert torch.equal(st.get(2), back)
    bad = grid.clone()
    bad[3, 3] = 1.0000001
    with warnings.catch_warnings():
        warnings.simplefilter("error", BoundsWarning)
        exc = expect_error((ValueError,), st.set, 0, bad)
    assert "(3, 3)" in str(exc) and "bounds" in str(exc), str(exc)
    # NaN has no uint8 value: refused in any mode
    bad[3, 3] = float("nan")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", BoundsWarning)
        expect_error((ValueError,), st.set, 0, bad)
    assert torch.equal(st.get(0), grid)
    # the default mode: a value just past the bound is rounded onto it and stored (with a warning)
    bad[3, 3] = 1.0000001
    with pytest.warns(BoundsWarning):
        st.set(0, bad)
    assert st.get(0)[3, 3] == 1.0
    st.close()


def test_general_affine_rescale_stays_in_bounds_and_close() -> None:
    space = BoxSpace(NB, 0.0, 1.0, np.float32, shape=(1000,))
    t = RescaleTransformation(-1.0, 1.0)
    target = t.get_target_space_from_source(space)
    inv = t.direct_inverse(space)
    assert inv.get_target_space_from_source(target) == space
    x = np.random.default_rng(1).random(1000).astype(np.float32)
    x[:2] = [0.0, 1.0]
    y = t.transform(space, x)
    assert y.dtype == np.float32 and y.min() >= -1.0 and y.max() <= 1.0 and y[0] == -1.0 and y[1] == 1.0
    back = inv.transform(target, y)
    assert back.min() >= 0.0 and back.max() <= 1.0
    assert np.all(np.abs(back - x) <= np.spacing(np.float32(1.0)))


def test_values_outside_the_bounds_are_stored_through_a_rescale(tmp_path: Any) -> None:
    """A value outside the source bounds (and NaN) goes through the rescale as the reference maps it and is stored:
    it reads back the same up to float32 rounding. One BoundsWarning from the transformation and one from the inner
    storage, on the first such write only; reading never warns, even in the refusal mode, and a loaded copy too."""
    space = BoxSpace(NB, 0.0, 3.0, np.float32, shape=(2,))
    path = os.path.join(os.fspath(tmp_path), "oob")
    st = _create(space, NumpyMemmapStorage, data_transformation=RescaleTransformation(-1.0, 1.0), capacity=4,
                 cache_path=path)
    with warnings.catch_warnings(record=True) as first:
        warnings.simplefilter("always")
        st.set(0, np.array([4.5, 1.0], np.float32))
    bw = [w for w in first if issubclass(w.category, BoundsWarning)]
    got = [str(w.message) for w in bw]
    assert len(got) == 2 and got[0].startswith("RescaleTransformation: value 4.5 at position (0,)"), got
    assert all(os.path.basename(w.filename) == os.path.basename(__file__) for w in bw)   # the line of st.set
    assert np.allclose(st.inner_storage.get(0), [2.0, -1.0 / 3.0])            # extrapolated past new_high
    with warnings.catch_warnings(record=True) as again:
        warnings.simplefilter("always")
        st.set(1, np.array([-6.0, np.nan], np.float32))
        st.set(2, np.array([1.5, 3.0], np.float32))
    assert [w for w in again if issubclass(w.category, BoundsWarning)] == []
    with warnings.catch_warnings():
        warnings.simplefilter("error", BoundsWarning)
        back = st.get(Ellipsis)
    assert np.allclose(back[0], [4.5, 1.0], rtol=1e-6) and back[1][0] == pytest.approx(-6.0, rel=1e-6)
    assert np.isnan(back[1][1]) and np.array_equal(back[2], [1.5, 3.0])
    st.dumps(path)
    st.close()
    loaded = TransformedStorage.load_from(path, space)
    with warnings.catch_warnings():
        warnings.simplefilter("error", BoundsWarning)
        assert np.allclose(loaded.get(0), [4.5, 1.0], rtol=1e-6)
    loaded.close()
    # the refusal mode: nothing is written, and the transformation reports the value every time
    st = _create(space, NumpyMemmapStorage, data_transformation=RescaleTransformation(-1.0, 1.0), capacity=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error", BoundsWarning)
        for _ in range(2):
            exc = expect_error((ValueError,), st.set, 0, np.array([3.5, 0.0], np.float32))
            assert isinstance(exc, BoundsWarning) and "RescaleTransformation" in str(exc)
    assert np.array_equal(st.get(0), np.full(2, 1.5, np.float32))           # never written: the inverse of zero
    st.close()


def test_never_written_rows_read_as_the_inverse_of_zero() -> None:
    space = BoxSpace(NB, 0.0, 1.0, np.float32, shape=(2,))
    st = _create(space, NumpyMemmapStorage, data_transformation=RescaleTransformation(-1.0, 1.0), capacity=2)
    assert np.array_equal(st.get(0), np.full(2, 0.5, np.float32))  # stored zero = the middle of [0, 1]
    st.close()


# ---------------------------------------------------------------------------------------------------- persistence
def _dumped(tmp_path: Any, name: str = "dump") -> str:
    st = _create(graded_box(), NumpyMemmapStorage, data_transformation=RescaleTransformation(-1.0, 1.0), capacity=4)
    st.set(1, graded_box().high_numpy)
    path = os.path.join(os.fspath(tmp_path), name)
    st.dumps(path)
    st.close()
    return path


def _edit(path: str, **changes: Any) -> None:
    meta_file = os.path.join(path, METADATA)
    with open(meta_file) as f:
        meta = json.load(f)
    for k, v in changes.items():
        if v is _DROP:
            meta.pop(k, None)
        else:
            meta[k] = v
    with open(meta_file, "w") as f:
        json.dump(meta, f)


_DROP = object()


def test_dumps_and_load_from(tmp_path: Any) -> None:
    path = _dumped(tmp_path)
    assert sorted(os.listdir(path)) == sorted([METADATA, "transformed_inner_storage.memmap",
                                               "transformed_inner_storage.memmap.meta.json"])
    back = TransformedStorage.load_from(path, graded_box())
    assert not back.is_mutable and back.capacity == 4
    assert np.array_equal(back.get(1), graded_box().high_numpy)
    assert back.data_transformation == RescaleTransformation(-1.0, 1.0)
    back.close()
    expect_error((ValueError,), TransformedStorage.load_from, path, graded_box(), capacity=7)


def test_load_with_another_space_is_refused(tmp_path: Any) -> None:
    path = _dumped(tmp_path)
    # different source bounds with the same transformed space: only the stored space can tell
    other = BoxSpace(NB, -1.0, 1.0, np.float32, shape=(2, 3))
    assert RescaleTransformation(-1.0, 1.0).get_target_space_from_source(other) == \
        RescaleTransformation(-1.0, 1.0).get_target_space_from_source(graded_box())
    exc = expect_error((ValueError,), TransformedStorage.load_from, path, other)
    assert "space" in str(exc)


def test_missing_or_damaged_metadata(tmp_path: Any) -> None:
    path = _dumped(tmp_path)
    expect_error((FileNotFoundError,), TransformedStorage.load_from, os.path.join(path, "nope"), graded_box())
    with open(os.path.join(path, METADATA), "w") as f:
        f.write('{"storage_type": "Transfo')
    exc = expect_error((ValueError,), TransformedStorage.load_from, path, graded_box())
    assert isinstance(exc, StorageFormatError)
    os.unlink(os.path.join(path, METADATA))
    expect_error((FileNotFoundError,), TransformedStorage.load_from, path, graded_box())


@pytest.mark.parametrize("field, value", [
    ("storage_type", "FlattenedStorage"), ("format_version", 99), ("data_transformation", _DROP),
    ("inner_storage_type", "os.system"), ("inner_storage_path", "../../etc/passwd"),
    ("inner_storage_path", "/etc/passwd"), ("inner_storage_path", "."),
    ("inner_storage_type", "unienv_data.storages.transformation.TransformedStorage"),
])
def test_hostile_or_wrong_metadata_fields(tmp_path: Any, field: str, value: Any) -> None:
    path = _dumped(tmp_path)
    _edit(path, **{field: value})
    exc = expect_error((ValueError,), TransformedStorage.load_from, path, graded_box())
    assert isinstance(exc, StorageFormatError), type(exc)


@pytest.mark.parametrize("transformation", [
    {"type": "os.system", "command": "true"},
    {"type": "subprocess.Popen"},
    {"type": "unienv_transform_probe_q9.Evil"},
    {"new_low": -1.0},                                                  # no type
    ["not", "an", "object"],
    {"type": "RescaleTransformation", "new_low": "abc", "new_high": 1.0},
    {"type": "RescaleTransformation", "new_low": 1.0, "new_high": -1.0},
    {"type": "RescaleTransformation", "new_low": -1.0, "new_high": 1.0, "surprise": 1},
    {"type": "RescaleTransformation", "new_low": -1.0, "new_high": 1.0, "new_dtype": "complex64"},
    {"type": "RescaleTransformation", "new_low": {"scalar": False, "value": [1], "backend": "os.system"},
     "new_high": 1.0},
    {"type": "RescaleTransformation", "new_low": -1.0, "new_high": 1.0, "nan_to": float("nan")},
    {"type": "DtypeTransformation", "dtype": "uint8", "rounding": "stochastic"},
    {"type": "ChainedTransformation", "transformations": {"not": "a list"}},
])
def test_hostile_transformation_json_is_refused_and_never_imported(tmp_path: Any, monkeypatch: pytest.MonkeyPatch,
                                                                  transformation: Any) -> None:
    path = _dumped(tmp_path)
    probe_dir = tmp_path / "plugins"
    probe_dir.mkdir()
    (probe_dir / "unienv_transform_probe_q9.py").write_text("IMPORTED = True\nclass Evil:\n    pass\n")
    monkeypatch.syspath_prepend(str(probe_dir))
    _edit(path, data_transformation=transformation)
    exc = expect_error((ValueError,), TransformedStorage.load_from, path, graded_box())
    assert isinstance(exc, StorageFormatError), type(exc)
    assert "data_transformation" in str(exc)
    assert "unienv_transform_probe_q9" not in sys.modules


def test_deeply_nested_transformation_json_is_refused(tmp_path: Any) -> None:
    path = _dumped(tmp_path)
    js: Any = transformation_to_json(RescaleTransformation(-1.0, 1.0))
    for _ in range(200):
        js = {"type": "ChainedTransformation", "transformations": [js]}
    _edit(path, data_transformation=js)
    exc = expect_error((ValueError,), TransformedStorage.load_from, path, graded_box())
    assert "nested" in str(exc)


class _PickleBomb:
    """Unpickling it creates a flag file: proof that a pickle was loaded."""

    def __init__(self, flag: str) -> None:
        self.flag = flag

    def __reduce__(self) -> Any:
        return (open, (self.flag, "w"))


@pytest.mark.parametrize("with_metadata", [False, True])
def test_legacy_pickle_is_refused_and_never_loaded(tmp_path: Any, with_metadata: bool) -> None:
    path = _dumped(tmp_path)
    flag = os.path.join(os.fspath(tmp_path), "unpickled.flag")
    with open(os.path.join(path, "data_transformation.pkl"), "wb") as f:
        pickle.dump(_PickleBomb(flag), f)
    if with_metadata:  # the reference's layout: the class name in the JSON, the object in the pickle
        _edit(path, data_transformation=_DROP, transformation="unienv_interface.transformations.rescale.X",
              format_version=_DROP, space=_DROP)
    else:
        os.unlink(os.path.join(path, METADATA))
    exc = expect_error((ValueError,), TransformedStorage.load_from, path, graded_box())
    assert isinstance(exc, StorageFormatError)
    assert "pickle" in str(exc) and "data_transformation.pkl" in str(exc), str(exc)
    assert not os.path.exists(flag)


def test_reference_style_metadata_without_version_or_space_loads(tmp_path: Any) -> None:
    path = _dumped(tmp_path)
    _edit(path, format_version=_DROP, space=_DROP)
    back = TransformedStorage.load_from(path, graded_box())
    assert np.array_equal(back.get(1), graded_box().high_numpy)
    back.close()


def test_unregistered_transformation_cannot_be_dumped_but_works_in_memory(tmp_path: Any) -> None:
    class LocalRescale(RescaleTransformation):
        pass

    space = graded_box()
    st = _create(space, NumpyMemmapStorage, data_transformation=LocalRescale(), capacity=2)
    st.set(0, space.high_numpy)
    assert np.array_equal(st.get(0), space.high_numpy)
    exc = expect_error((ValueError,), st.dumps, os.path.join(os.fspath(tmp_path), "d"))
    assert "register" in str(exc)
    st.close()
    cache = os.path.join(os.fspath(tmp_path), "c")
    expect_error((ValueError,), TransformedStorage.create, space, NumpyMemmapStorage, data_transformation=LocalRescale(),
                 capacity=2, cache_path=cache)
    assert not os.path.exists(cache)
    register_transformation(LocalRescale)
    st = _create(space, NumpyMemmapStorage, data_transformation=LocalRescale(), capacity=2, cache_path=cache)
    st.close()
    back = TransformedStorage.load_from(cache, space)
    assert type(back.data_transformation) is LocalRescale
    back.close()


# ---------------------------------------------------------------------------------------------------- ownership
def test_close_and_gc_never_close_an_inner_storage_passed_in() -> None:
    space = graded_box()
    t = RescaleTransformation(-1.0, 1.0)
    inner = NumpyMemmapStorage.create(t.get_target_space_from_source(space), capacity=3)
    st = TransformedStorage(space, t, inner, "inner.memmap")
    st.set(1, space.high_numpy)
    w = st.open_segment_writer()
    w.append(space.low_numpy)
    st.close()
    expect_error((RuntimeError, ValueError), st.get, 1)
    exc = expect_error((RuntimeError, ValueError), w.commit, 0)
    assert "close" in str(exc)
    assert inner.episode_segments() == []
    assert np.array_equal(inner.get(1), np.ones((2, 3), np.float32))
    again = TransformedStorage(space, t, inner, "inner.memmap")
    del again
    gc.collect()
    assert np.array_equal(inner.get(1), np.ones((2, 3), np.float32))
    inner.close()


def test_close_of_a_created_storage_closes_its_inner() -> None:
    st = _create(graded_box(), NumpyMemmapStorage, data_transformation=RescaleTransformation(), capacity=2)
    inner = st.inner_storage
    st.close()
    expect_error((RuntimeError, ValueError), inner.get, 0)


# ---------------------------------------------------------------------------------------------------- transformations
def test_transformation_json_round_trips() -> None:
    cases = [IdentityTransformation(), RescaleTransformation([-1.0, 0.0, 2.0], 3.0, "float64"),
             DtypeTransformation("int16", rounding="floor"), quantized(), ChainedTransformation([]),
             DictTransformation({"a": quantized(), "b": IdentityTransformation()})]
    for t in cases:
        js = transformation_to_json(t)
        text = json.dumps(js, allow_nan=False)
        back = json_to_transformation(json.loads(text))
        assert back == t and type(back) is type(t), js
        assert pickle.loads(pickle.dumps(t)) == t
        assert type(t).deserialize_from(js) == t
    assert json_to_transformation({"type": "RescaleTransformation", "new_low": 0, "new_high": 1}) == \
        RescaleTransformation(0.0, 1.0)
    expect_error((TransformationFormatError,), RescaleTransformation.deserialize_from, transformation_to_json(quantized()))


def test_rescale_checks_its_input_and_parameters() -> None:
    space = BoxSpace(NB, -1.0, 1.0, np.float32, shape=(3,))
    t = RescaleTransformation(0.0, 10.0)
    assert np.array_equal(t.transform(space, np.array([-1.0, 0.0, 1.0], np.float32)), np.array([0, 5, 10], np.float32))
    assert np.array_equal(t.transform(space, [0.5, 0.5, 0.5]), np.full(3, 7.5, np.float32))  # exact Python floats
    with pytest.warns(BoundsWarning, match=r"value 2\.0 at position \(1,\) is outside the source space bounds"):
        assert t.transform(space, np.array([0.5, 2.0, 0.0], np.float32)).tolist() == [7.5, 15.0, 5.0]
    expect_error((ValueError,), t.transform, space, np.zeros(4, np.float32))
    expect_error((TypeError,), t.transform, space, "text")
    expect_error((ValueError,), t.transform, space, np.array([0, 0, 2 ** 25 + 1], np.int64))
    expect_error((ValueError,), RescaleTransformation, 1.0, 0.5)
    expect_error((ValueError,), RescaleTransformation, -INF, 1.0)
    expect_error((ValueError,), RescaleTransformation, 0.0, 1.0, np.complex64)
    expect_error((ValueError,), RescaleTransformation, 0.0, 1.0, nan_to=float("nan"))
    expect_error((ValueError,), RescaleTransformation, [0.0, 0.5], [1.0, 2.0, 3.0])
    expect_error((ValueError,), RescaleTransformation(np.arange(4) * 0.1, 1.0).get_target_space_from_source, space)
    expect_error((ValueError,), t.direct_inverse)
    expect_error((TypeError,), t.get_target_space_from_source, BinarySpace(NB, (3,)))
    # an element whose source bounds are equal maps to new_low (the reference's rule), and back onto its one value
    flat = BoxSpace(NB, [-1.0, 0.0, 0.0], [1.0, 0.0, 1.0], np.float32)
    assert t.transform(flat, np.array([1.0, 0.0, 0.5], np.float32)).tolist() == [10.0, 0.0, 5.0]
    back = t.direct_inverse(flat).transform(t.get_target_space_from_source(flat), np.array([10.0, 0.0, 5.0], np.float32))
    assert back.tolist() == [1.0, 0.0, 0.5]
    # torch data on a torch space, batched with extra leading axes or through a batch-of-one space
    tspace = BoxSpace(TB, -1.0, 1.0, torch.float32, shape=(3,))
    batch = torch.tensor([[1.0, 0.5, -1.0], [0.0, 0.25, 1.0]])
    out = t.transform(tspace, batch)
    assert out.dtype == torch.float32 and torch.equal(out, (batch + 1) * 5)
    assert torch.equal(t.transform(batch_utils.batch_space(tspace, 1), batch), out)


def test_dtype_transformation_rules() -> None:
    f = BoxSpace(NB, -INF, INF, np.float32, shape=(4,))
    x = np.array([-1.5, -0.5, 0.5, 2.5], np.float32)
    expect = {"nearest": [-2, 0, 0, 2], "floor": [-2, -1, 0, 2], "ceil": [-1, 0, 1, 3], "trunc": [-1, 0, 0, 2]}
    for mode, want in expect.items():
        t = DtypeTransformation("int8", rounding=mode)
        assert t.get_target_space_from_source(f) == BoxSpace(NB, -128, 127, np.int8, shape=(4,))
        y = t.transform(f, x)
        assert y.dtype == np.int8 and y.tolist() == want, mode
    exact = DtypeTransformation("int8")
    assert exact.transform(f, np.array([1.0, -3.0, 0.0, 127.0], np.float32)).tolist() == [1, -3, 0, 127]
    for bad in ([0.5, 0, 0, 0], [128.0, 0, 0, 0], [float("nan"), 0, 0, 0], [INF, 0, 0, 0]):
        expect_error((ValueError,), exact.transform, f, np.array(bad, np.float32))
        expect_error((ValueError,), DtypeTransformation("int8", rounding="nearest").transform, f,
                     np.array(bad, np.float32) * 300 if bad[0] != 0.5 else np.array([300.0, 0, 0, 0], np.float32))
    # int -> narrower int: range checked, never wrapped
    i = BoxSpace(NB, -1000, 1000, np.int32, shape=(2,))
    t = DtypeTransformation("uint8")
    assert t.get_target_space_from_source(i) == BoxSpace(NB, 0, 255, np.uint8, shape=(2,))
    assert t.transform(i, np.array([0, 255], np.int32)).tolist() == [0, 255]
    expect_error((ValueError,), t.transform, i, np.array([-1, 3], np.int32))
    expect_error((ValueError,), t.transform, i, np.array([256, 3], np.int32))
    expect_error((ValueError,), DtypeTransformation("uint8").get_target_space_from_source,
                 BoxSpace(NB, 300, 400, np.int32, shape=(2,)))
    # int -> float: exact only
    big = BoxSpace(NB, -INF, INF, np.int64, shape=(1,))
    to32 = DtypeTransformation("float32")
    assert to32.transform(big, np.array([2 ** 24], np.int64)).tolist() == [2.0 ** 24]
    expect_error((ValueError,), to32.transform, big, np.array([2 ** 24 + 1], np.int64))
    expect_error((ValueError,), to32.transform, big, np.array([2 ** 63 - 1], np.int64))
    # float64 -> float32: exact unless rounding="nearest"; overflow always refused
    d = BoxSpace(NB, -INF, INF, np.float64, shape=(1,))
    expect_error((ValueError,), to32.transform, d, np.array([0.1]))
    assert DtypeTransformation("float32", "nearest").transform(d, np.array([0.1])).tolist() == [np.float32(0.1)]
    expect_error((ValueError,), DtypeTransformation("float32", "nearest").transform, d, np.array([1e300]))
    assert np.isnan(to32.transform(d, np.array([np.nan]))[0])
    # rounding modes that do not apply
    expect_error((ValueError,), DtypeTransformation("int16", "floor").get_target_space_from_source, i)
    expect_error((ValueError,), DtypeTransformation("float32", "floor").get_target_space_from_source, d)
    expect_error((ValueError,), DtypeTransformation, "bool")
    expect_error((ValueError,), DtypeTransformation, "uint8", "stochastic")
    # the inverse casts back exactly onto the source dtype
    inv = DtypeTransformation("uint8", "nearest").direct_inverse(BoxSpace(NB, 0.0, 255.0, np.float32, shape=(2,)))
    assert inv == DtypeTransformation("float32")


def test_dtype_transformation_on_torch_keeps_bfloat16() -> None:
    space = BoxSpace(TB, -INF, INF, torch.float32, shape=(3,))
    t = DtypeTransformation("bfloat16", rounding="nearest")
    y = t.transform(space, torch.tensor([1.0, 0.1, -3.0]))
    assert y.dtype == torch.bfloat16
    expect_error((ValueError,), DtypeTransformation("bfloat16").transform, space, torch.tensor([1.0, 0.1, -3.0]))
    target = t.get_target_space_from_source(space)
    back = t.direct_inverse(space).transform(target, y)
    assert back.dtype == torch.float32 and torch.equal(back, y.float())


def test_chained_and_dict_transformations() -> None:
    space = DictSpace(NB, {"img": BoxSpace(NB, 0.0, 1.0, np.float32, shape=(2,)),
                           "x": BoxSpace(NB, -INF, INF, np.float64, shape=())})
    t = DictTransformation({"img": quantized()})
    target = t.get_target_space_from_source(space)
    assert target["img"] == BoxSpace(NB, 0, 255, np.uint8, shape=(2,)) and target["x"] == space["x"]
    v = {"img": np.array([0.0, 1.0], np.float32), "x": np.array(3.5)}
    y = t.transform(space, v)
    assert y["img"].tolist() == [0, 255] and y["x"] is v["x"]
    assert_tree_equal(t.direct_inverse(space).transform(target, y), v)
    expect_error((KeyError,), t.transform, space, {"x": np.array(1.0)})
    with pytest.warns(BoundsWarning, match="RescaleTransformation"):   # 2.0 maps to 510, which uint8 cannot hold
        exc = expect_error((ValueError,), t.transform, space, {"img": np.array([2.0, 0.0], np.float32), "x": v["x"]})
    assert "'img'" in str(exc)
    expect_error((TypeError,), t.transform, space, [v])
    expect_error((ValueError,), DictTransformation({"nope": IdentityTransformation()}).get_target_space_from_source, space)
    chain = ChainedTransformation([])
    assert chain.get_target_space_from_source(space) is space and chain.transform(space, v) is v
    assert chain.direct_inverse() == ChainedTransformation([])
    expect_error((ValueError,), quantized().direct_inverse)
    expect_error((ValueError,), SquareTransformation().direct_inverse, space)


# ---------------------------------------------------------------------------------------------------- owners
def test_replay_buffer_over_a_transformed_storage(tmp_path: Any) -> None:
    from unienv_data.replay_buffer import ReplayBuffer
    space = graded_box()
    path = os.path.join(os.fspath(tmp_path), "rb")
    rb = ReplayBuffer.create(TransformedStorage, space, NumpyMemmapStorage, cache_path=path, capacity=5,
                             data_transformation=RescaleTransformation(-1.0, 1.0))
    rng = np.random.default_rng(5)
    steps = [(space.low_numpy + rng.random((2, 3)) * (space.high_numpy - space.low_numpy)).astype(np.float32)
             for _ in range(7)]
    for v in steps[:3]:
        rb.append(v)
    rb.mark_segment_end()
    w = rb.open_segment_writer()
    for v in steps[3:]:
        w.append(v)
    rb.commit_segment(w)
    assert len(rb) == 5
    segs = rb.episode_segments()
    rb.dumps()
    rb.close()
    back = ReplayBuffer.load_from(path, backend=NB, read_only=False)
    assert isinstance(back.storage, TransformedStorage)
    assert back.episode_segments() == segs
    assert np.array_equal(back.get_at(slice(0, 5)), np.stack(steps[2:]))
    back.close()


def test_dict_storage_with_a_quantized_image_child(tmp_path: Any) -> None:
    dict_storage = pytest.importorskip("unienv_data.storages.dict_storage")
    space = DictSpace(TB, {"image": BoxSpace(TB, 0.0, 1.0, torch.float32, shape=(4, 4, 3)),
                           "state": BoxSpace(TB, -INF, INF, torch.float32, shape=(2,))})
    st = dict_storage.DictStorage.create(
        space, {"image": TransformedStorage, "state": PytorchTensorStorage}, capacity=3,
        cache_path=os.path.join(os.fspath(tmp_path), "ds"),
        key_kwargs={"image": {"inner_storage_cls": PytorchTensorStorage, "data_transformation": quantized()}})
    grid = (torch.arange(48, dtype=torch.float64) / 255).to(torch.float32).reshape(4, 4, 3)
    v = {"image": grid, "state": torch.tensor([1.5, -2.0])}
    st.set(0, v)
    assert_tree_equal(st.get(0), v)
    bad = {"image": grid + 2.0, "state": torch.tensor([0.0, 0.0])}
    with pytest.warns(BoundsWarning):         # the rescale extrapolates, the uint8 cast refuses what it cannot hold
        expect_error((ValueError,), st.set, 1, bad)
    st.mark_segment_start(1)
    expect_error((ValueError,), st.append, bad)
    st.append(v)
    st.mark_segment_end()
    w = st.open_segment_writer()
    expect_error((ValueError,), w.append, bad)
    w.append(v)
    w.commit(2)
    assert st.episode_segments() == [(1, 1), (2, 2)]
    assert_tree_equal(st.get(Ellipsis), {k: torch.stack([x, x, x]) for k, x in v.items()})
    st.close()


# ---------------------------------------------------------------------------------------------------- properties
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as hs  # noqa: E402

_finite32 = hs.floats(-1e6, 1e6, allow_nan=False, width=32)


@settings(max_examples=60, deadline=None)
@given(lo=_finite32, span=hs.floats(0.0625, 1e6, width=32), nl=_finite32, nspan=hs.floats(0.0625, 1e6, width=32),
       u=hs.lists(hs.floats(0.0, 1.0), min_size=1, max_size=8))
def test_rescale_stays_inside_both_spaces_and_inverts_closely(lo: float, span: float, nl: float, nspan: float,
                                                             u: list) -> None:
    hi = float(np.float32(lo + span))
    if not hi > lo:
        return
    space = BoxSpace(NB, lo, hi, np.float32, shape=(len(u),))
    t = RescaleTransformation(nl, nl + nspan)
    target = t.get_target_space_from_source(space)
    if not np.all(target.low_numpy < target.high_numpy):
        return
    x = np.clip((np.float64(lo) + np.array(u) * (hi - lo)).astype(np.float32), space.low_numpy, space.high_numpy)
    y = t.transform(space, x)
    assert target.contains(y)
    back = t.direct_inverse(space).transform(target, y)
    assert space.contains(back)
    # two float32 roundings (the stored value and the result) bound the error
    tol = 4 * np.spacing(np.float32(max(abs(lo), abs(hi)))) + 4 * np.spacing(np.float32(max(abs(nl), abs(nl + nspan)))) * span / nspan
    assert np.all(np.abs(back.astype(np.float64) - x) <= tol)


@settings(max_examples=60, deadline=None)
@given(vals=hs.lists(hs.floats(0.0, 1.0, width=32), min_size=1, max_size=16))
def test_quantization_restore_is_idempotent(vals: list) -> None:
    space = BoxSpace(NB, 0.0, 1.0, np.float32, shape=(len(vals),))
    t = quantized()
    target = t.get_target_space_from_source(space)
    inv = t.direct_inverse(space)
    q = t.transform(space, np.array(vals, np.float32))
    back = inv.transform(target, q)
    assert np.all(np.abs(back - np.array(vals, np.float32)) <= 0.5 / 255 + 1e-7)
    assert np.array_equal(t.transform(space, back), q)


@pytest.mark.parametrize("low, high, new_low, new_high", [
    (-1e308, 1e308, -1.0, 1.0),        # the source span overflows float64
    (0.0, 1e300, 0.0, 1e-30),          # the scale underflows to 0
], ids=["span-overflow", "scale-underflow"])
def test_rescale_beyond_float64_is_refused_at_create(low: float, high: float, new_low: float, new_high: float) -> None:
    # found by fuzzing: every value used to be stored as new_low and read back as NaN, silently
    from unienv_interface.transformations import RescaleTransformation
    space = BoxSpace(NB, low, high, np.float64, shape=(3,))
    exc = expect_error((ValueError,), TransformedStorage.create, space, NumpyMemmapStorage,
                       data_transformation=RescaleTransformation(new_low, new_high), capacity=2)
    assert "float64" in str(exc)


def test_integer_cast_of_a_scalar_leaf() -> None:
    from unienv_interface.transformations import DtypeTransformation
    scalar = BoxSpace(NB, 0, 100, np.int64, shape=())
    st = TransformedStorage.create(scalar, NumpyMemmapStorage, data_transformation=DtypeTransformation("uint8"),
                                   capacity=4)
    st.set(1, np.int64(42))
    assert int(st.get(1)) == 42 and st.inner_storage.get(1).dtype == np.uint8
    st.close()


@pytest.mark.parametrize("key, bad", [("new_low", []), ("rounding", "nearest")])
def test_damaged_stored_transformation_is_a_format_error(tmp_path: Any, key: str, bad: Any) -> None:
    from unienv_interface.transformations import DtypeTransformation, RescaleTransformation
    if key == "new_low":
        space, tr = BoxSpace(NB, -2.0, 2.0, np.float64, shape=(2,)), RescaleTransformation(-1.0, 1.0)
    else:
        space, tr = BoxSpace(NB, 0, 100, np.int64, shape=(1,)), DtypeTransformation("uint8")
    d = os.path.join(tmp_path, "t")
    st = TransformedStorage.create(space, NumpyMemmapStorage, data_transformation=tr, capacity=2, cache_path=d)
    st.dumps(d)
    st.close()
    meta_file = os.path.join(d, "transformed_metadata.json")
    meta = json.load(open(meta_file))
    meta["data_transformation"][key] = bad
    json.dump(meta, open(meta_file, "w"))
    exc = expect_error((StorageFormatError,), TransformedStorage.load_from, d, space)
    assert "transformed_metadata.json" in str(exc)
