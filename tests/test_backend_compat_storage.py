"""ToBackendOrDeviceStorage (reference-api 5.5): the shared SpaceStorage contract with torch outside / NumPy inside
and the reverse, value- and dtype-preserving zero-copy conversions, the always-a-wrapper `create`, and its metadata."""
from __future__ import annotations

import gc
import inspect
import json
import os
import sys
import warnings
from typing import Any, Optional

import numpy as np
import pytest

torch = pytest.importorskip("torch")

# values outside declared bounds are stored with a BoundsWarning by default; this file's refusal checks run in
# the refusal mode (the warning as an error), where they are refused like every other bad value
pytestmark = pytest.mark.filterwarnings("error::unienv_data.base.errors.BoundsWarning")

from unienv_data.testing.conformance import StorageConformance, assert_tree_equal, expect_error  # noqa: E402

from unienv_data.base import SpaceStorage, StorageFormatError  # noqa: E402
from unienv_data.base.registry import resolve_storage_class  # noqa: E402
from unienv_data.storages.backend_compat import ToBackendOrDeviceStorage  # noqa: E402
from unienv_data.storages.flattened import FlattenedStorage, FlattenPromotionWarning  # noqa: E402
from unienv_data.storages.numpy_memmap import NumpyMemmapStorage  # noqa: E402
from unienv_data.storages.pytorch import PytorchTensorStorage  # noqa: E402
from unienv_interface.backends import NumpyComputeBackend as NB  # noqa: E402
from unienv_interface.backends.pytorch import PyTorchComputeBackend as TB  # noqa: E402
from unienv_interface.space import BinarySpace, BoxSpace, DictSpace, Space  # noqa: E402

INF = float("inf")
METADATA = "backend_metadata.json"


def dtype_of(backend: Any, name: str) -> Any:
    return backend.dtype_from_name(name)


def step_space(backend: Any) -> DictSpace:
    f32 = dtype_of(backend, "float32")
    return DictSpace(backend, {
        "obs": BoxSpace(backend, -INF, INF, f32, shape=(5,)),
        "action": BoxSpace(backend, -1.0, 1.0, f32, shape=(3,)),
        "count": BoxSpace(backend, 0, 1000, dtype_of(backend, "int32"), shape=(2,)),
        "done": BinarySpace(backend, ()),
    })


def mixed_box(backend: Any) -> BoxSpace:
    return BoxSpace(backend, -50, 50, dtype_of(backend, "int16"), shape=(2, 2))


def _create(space: Space, inner_cls: Any, *args: Any, **kwargs: Any) -> ToBackendOrDeviceStorage:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FlattenPromotionWarning)
        return ToBackendOrDeviceStorage.create(space, inner_cls, *args, **kwargs)


# ---------------------------------------------------------------------------------------------------- conformance
class _BackendConformance(StorageConformance):
    inner: tuple = (NumpyMemmapStorage,)
    inner_backend: Any = NB
    memmap = True
    supports_growable = True

    def create(self, tmp_path: Any, capacity: Optional[int]) -> ToBackendOrDeviceStorage:
        cache = os.path.join(os.fspath(tmp_path), "bs") if self.memmap else None
        return _create(self.space, *self.inner, backend=self.inner_backend, capacity=capacity, cache_path=cache)

    def load(self, path: Any, read_only: bool) -> ToBackendOrDeviceStorage:
        return ToBackendOrDeviceStorage.load_from(path, self.space, read_only=read_only)


class TestTorchOverNumpyMemmap(_BackendConformance):
    shares_rows_when_pickled = True
    spawn_check = True

    def make_space(self) -> BoxSpace:
        return BoxSpace(TB, -1.0, 1.0, torch.float32, shape=(3,))


class TestTorchDictOverFlattenedNumpy(_BackendConformance):
    inner = (FlattenedStorage, NumpyMemmapStorage)
    shares_rows_when_pickled = True

    def make_space(self) -> DictSpace:
        return step_space(TB)


class TestNumpyOverTorchRAM(_BackendConformance):
    inner = (PytorchTensorStorage,)
    inner_backend = TB
    memmap = False

    def make_space(self) -> BoxSpace:
        return mixed_box(NB)


class TestNumpyDictOverFlattenedTorch(_BackendConformance):
    inner = (FlattenedStorage, PytorchTensorStorage)
    inner_backend = TB
    shares_rows_when_pickled = True

    def make_space(self) -> DictSpace:
        return step_space(NB)


class TestSameBackendPassThrough(_BackendConformance):
    inner = (PytorchTensorStorage,)
    inner_backend = None
    shares_rows_when_pickled = True

    def make_space(self) -> BoxSpace:
        return mixed_box(TB)


# ---------------------------------------------------------------------------------------------------- signatures
def test_spec_signatures() -> None:
    init = inspect.signature(ToBackendOrDeviceStorage.__init__)
    assert list(init.parameters)[1:] == ["single_instance_space", "inner_storage", "inner_storage_path", "cache_filename"]
    p = inspect.signature(ToBackendOrDeviceStorage.create).parameters
    assert list(p)[:3] == ["single_instance_space", "inner_storage_cls", "args"]
    for name, default in (("capacity", None), ("cache_path", None), ("multiprocessing", False), ("backend", None),
                          ("device", None), ("inner_storage_kwargs", {})):
        assert p[name].kind is inspect.Parameter.KEYWORD_ONLY and p[name].default == default, name
    assert p["kwargs"].kind is inspect.Parameter.VAR_KEYWORD
    p = inspect.signature(ToBackendOrDeviceStorage.load_from).parameters
    assert list(p)[:2] == ["path", "single_instance_space"]
    for name, default in (("capacity", None), ("read_only", True), ("multiprocessing", False)):
        assert p[name].kind is inspect.Parameter.KEYWORD_ONLY and p[name].default == default, name
    assert ToBackendOrDeviceStorage.single_file_ext is None
    assert issubclass(ToBackendOrDeviceStorage, SpaceStorage)
    name = "unienv_data.storages.backend_compat.ToBackendOrDeviceStorage"
    assert resolve_storage_class(name) is ToBackendOrDeviceStorage


# ---------------------------------------------------------------------------------------------------- behaviour
def test_create_always_returns_the_wrapper() -> None:
    space = mixed_box(TB)
    for kwargs in ({}, {"backend": TB}, {"backend": "pytorch"}, {"backend": None, "device": None}):
        st = ToBackendOrDeviceStorage.create(space, PytorchTensorStorage, capacity=2, **kwargs)
        assert type(st) is ToBackendOrDeviceStorage, kwargs
        assert isinstance(st.inner_storage, PytorchTensorStorage)
        v = torch.tensor([[1, -2], [3, 50]], dtype=torch.int16)
        st.set(0, v)
        assert_tree_equal(st.get(0), v)
        st.close()
    expect_error((TypeError,), ToBackendOrDeviceStorage.create, space, PytorchTensorStorage, capacity=2, backend=42)
    expect_error((ValueError,), ToBackendOrDeviceStorage.create, space, PytorchTensorStorage, capacity=2,
                 backend="tensorflow")


def test_torch_outside_numpy_inside(tmp_path: Any) -> None:
    space = step_space(TB)
    st = _create(space, FlattenedStorage, NumpyMemmapStorage, backend=NB, capacity=4,
                 cache_path=os.path.join(os.fspath(tmp_path), "s"))
    assert st.inner_backend is NB and st.inner_storage.backend is NB
    assert st.inner_storage.single_instance_space == space.to(backend=NB)
    v = {"obs": torch.tensor([1.5, -2.0, 0.0, 1e30, -1e-30]), "action": torch.tensor([1.0, -0.25, 0.5]),
         "count": torch.tensor([0, 1000], dtype=torch.int32), "done": torch.tensor(True)}
    st.set(1, v)
    got = st.get(1)
    assert_tree_equal(got, v)  # torch tensors, each in its own dtype, with the same values
    raw = st.inner_storage.get(1)
    assert isinstance(raw["obs"], np.ndarray) and raw["count"].dtype == np.int32
    batch = st.get(torch.tensor([1, 0]))
    assert batch["done"].dtype == torch.bool and batch["done"].tolist() == [True, False]
    st.set(torch.tensor([True, False, False, True]), {k: torch.stack([x, x]) for k, x in v.items()})
    assert_tree_equal(st.get(3), v)
    st.close()


def test_numpy_outside_torch_inside_index_forms() -> None:
    space = BoxSpace(NB, 0, 60000, np.uint16, shape=(3,))  # uint16 exists in both libraries
    st = ToBackendOrDeviceStorage.create(space, PytorchTensorStorage, backend=TB, capacity=5)
    assert st.inner_storage.single_instance_space.dtype == torch.uint16
    rows = np.array([[0, 1, 60000], [7, 8, 9]], dtype=np.uint16)
    st.set(np.array([4, 0]), rows)
    for index in (np.array([4, 0]), np.array([4, 0], dtype=np.uint8), [4, 0], torch.tensor([4, 0])):
        got = st.get(index)
        assert isinstance(got, np.ndarray) and got.dtype == np.uint16 and np.array_equal(got, rows), index
    mask = np.zeros(5, dtype=bool)
    mask[[0, 4]] = True
    assert np.array_equal(st.get(mask), rows[::-1])
    assert np.array_equal(st.get(np.array(4)), rows[0])
    expect_error((ValueError,), st.set, 1, np.array([0, 1, 60001], np.uint16))
    expect_error((TypeError, IndexError), st.get, np.array([0.0, 1.0]))
    st.close()


def test_conversions_share_memory_and_keep_dtypes() -> None:
    space = BoxSpace(TB, -INF, INF, torch.float64, shape=(4,))
    st = ToBackendOrDeviceStorage.create(space, NumpyMemmapStorage, backend=NB, capacity=2)
    a = np.arange(4, dtype=np.float64)
    t = st._to_outer_leaf(a)
    assert isinstance(t, torch.Tensor) and t.dtype == torch.float64 and t.data_ptr() == a.ctypes.data
    back = st._to_inner_leaf(t)
    assert isinstance(back, np.ndarray) and back.dtype == np.float64 and back.ctypes.data == a.ctypes.data
    assert st._to_inner_leaf(a) is a  # not an outer-backend array: handed to the inner storage unchanged
    st.close()


def test_dtype_missing_on_the_inner_backend_is_a_clear_error(tmp_path: Any) -> None:
    space = BoxSpace(TB, -INF, INF, torch.bfloat16, shape=(2,))
    cache = os.path.join(os.fspath(tmp_path), "bf")
    exc = expect_error((ValueError,), ToBackendOrDeviceStorage.create, space, NumpyMemmapStorage, backend=NB,
                       capacity=2, cache_path=cache)
    assert "bfloat16" in str(exc) and "numpy" in str(exc), str(exc)
    assert not os.path.exists(os.path.join(cache, "inner_storage.memmap"))


def test_values_of_other_libraries_pass_to_the_inner_storage() -> None:
    st = ToBackendOrDeviceStorage.create(mixed_box(TB), NumpyMemmapStorage, backend=NB, capacity=2)
    st.set(0, np.array([[1, 2], [3, 4]], np.int16))      # NumPy into a torch-facing storage
    st.set(1, [[5, 6], [7, 8]])                           # Python lists
    assert st.get(Ellipsis).tolist() == [[[1, 2], [3, 4]], [[5, 6], [7, 8]]]
    expect_error((ValueError,), st.set, 0, [[1, 2], [3, 51]])
    expect_error((TypeError,), st.set, 0, "no")
    st.close()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_served_on_a_gpu_from_cpu_rows() -> None:  # pragma: no cover - only where a GPU exists
    space = BoxSpace(TB, -1.0, 1.0, torch.float32, shape=(3,), device="cuda")
    st = ToBackendOrDeviceStorage.create(space, PytorchTensorStorage, device="cpu", capacity=4)
    v = torch.tensor([0.5, -1.0, 1.0], device="cuda")
    st.set(torch.tensor([2], device="cuda"), v[None])
    got = st.get(2)
    assert got.device.type == "cuda" and torch.equal(got, v)
    assert st.inner_storage.get(2).device.type == "cpu"
    st.close()


# ---------------------------------------------------------------------------------------------------- persistence
def _dumped(tmp_path: Any) -> str:
    st = ToBackendOrDeviceStorage.create(mixed_box(TB), NumpyMemmapStorage, backend=NB, capacity=3)
    st.set(2, torch.tensor([[1, 2], [3, 4]], dtype=torch.int16))
    path = os.path.join(os.fspath(tmp_path), "dump")
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


def test_dumps_metadata_and_load_from(tmp_path: Any) -> None:
    path = _dumped(tmp_path)
    with open(os.path.join(path, METADATA)) as f:
        meta = json.load(f)
    assert meta == {"storage_type": "ToBackendOrDeviceStorage",
                    "inner_storage_type": "unienv_data.storages.numpy_memmap.NumpyMemmapStorage",
                    "inner_storage_path": "inner_storage.memmap", "inner_backend": "numpy", "inner_device": None,
                    "format_version": 1}
    back = ToBackendOrDeviceStorage.load_from(path, mixed_box(TB))
    assert type(back) is ToBackendOrDeviceStorage and not back.is_mutable and back.capacity == 3
    assert_tree_equal(back.get(2), torch.tensor([[1, 2], [3, 4]], dtype=torch.int16))
    back.close()
    # the same directory read as NumPy outside (inner and outer then agree): still the wrapper
    same = ToBackendOrDeviceStorage.load_from(path, mixed_box(NB))
    assert type(same) is ToBackendOrDeviceStorage and isinstance(same.get(2), np.ndarray)
    same.close()
    expect_error((ValueError,), ToBackendOrDeviceStorage.load_from, path, BoxSpace(TB, -50, 50, torch.int32, shape=(2, 2)))


def test_reference_metadata_without_version_loads(tmp_path: Any) -> None:
    path = _dumped(tmp_path)
    _edit(path, format_version=_DROP)
    back = ToBackendOrDeviceStorage.load_from(path, mixed_box(TB))
    assert back.get(2).tolist() == [[1, 2], [3, 4]]
    back.close()


@pytest.mark.parametrize("field, value", [
    ("storage_type", "TransformedStorage"), ("format_version", 7), ("inner_backend", "os"), ("inner_backend", None),
    ("inner_backend", _DROP), ("inner_device", 3), ("inner_device", "banana:0"), ("inner_storage_type", "os.system"),
    ("inner_storage_type", "unienv_backend_probe_z3.Storage"), ("inner_storage_path", "../../etc/passwd"),
    ("inner_storage_path", "/etc/passwd"), ("inner_storage_path", "."),
])
def test_hostile_or_wrong_metadata_is_refused(tmp_path: Any, monkeypatch: pytest.MonkeyPatch, field: str,
                                              value: Any) -> None:
    path = _dumped(tmp_path)
    probe_dir = tmp_path / "plugins"
    probe_dir.mkdir()
    (probe_dir / "unienv_backend_probe_z3.py").write_text("IMPORTED = True\nclass Storage:\n    pass\n")
    monkeypatch.syspath_prepend(str(probe_dir))
    _edit(path, **{field: value})
    exc = expect_error((ValueError,), ToBackendOrDeviceStorage.load_from, path, mixed_box(TB))
    assert isinstance(exc, StorageFormatError), (type(exc), exc)
    assert "unienv_backend_probe_z3" not in sys.modules


def test_missing_or_damaged_metadata(tmp_path: Any) -> None:
    path = _dumped(tmp_path)
    expect_error((FileNotFoundError,), ToBackendOrDeviceStorage.load_from, os.path.join(path, "nope"), mixed_box(TB))
    with open(os.path.join(path, METADATA), "w") as f:
        f.write("[1, 2")
    exc = expect_error((ValueError,), ToBackendOrDeviceStorage.load_from, path, mixed_box(TB))
    assert isinstance(exc, StorageFormatError)
    os.unlink(os.path.join(path, METADATA))
    expect_error((FileNotFoundError,), ToBackendOrDeviceStorage.load_from, path, mixed_box(TB))


# ---------------------------------------------------------------------------------------------------- ownership
def test_inner_storage_of_another_space_is_refused() -> None:
    inner = NumpyMemmapStorage.create(BoxSpace(NB, -50, 50, np.int32, shape=(2, 2)), capacity=2)
    expect_error((ValueError,), ToBackendOrDeviceStorage, mixed_box(TB), inner, "inner_storage.memmap")
    assert inner.get(0).shape == (2, 2)
    inner.close()


def test_close_and_gc_never_close_an_inner_storage_passed_in() -> None:
    inner = NumpyMemmapStorage.create(mixed_box(NB), capacity=2)
    st = ToBackendOrDeviceStorage(mixed_box(TB), inner, "inner_storage.memmap")
    st.set(1, torch.ones(2, 2, dtype=torch.int16))
    w = st.open_segment_writer()
    w.append(torch.zeros(2, 2, dtype=torch.int16))
    st.close()
    expect_error((RuntimeError, ValueError), st.get, 1)
    exc = expect_error((RuntimeError, ValueError), w.commit, 0)
    assert "close" in str(exc)
    assert inner.episode_segments() == [] and inner.get(1).tolist() == [[1, 1], [1, 1]]
    again = ToBackendOrDeviceStorage(mixed_box(TB), inner, "inner_storage.memmap")
    del again
    gc.collect()
    assert inner.get(1).tolist() == [[1, 1], [1, 1]]
    inner.close()
    created = ToBackendOrDeviceStorage.create(mixed_box(TB), NumpyMemmapStorage, backend=NB, capacity=2)
    own = created.inner_storage
    created.close()
    expect_error((RuntimeError, ValueError), own.get, 0)


def test_replay_buffer_over_a_backend_adapter(tmp_path: Any) -> None:
    from unienv_data.replay_buffer import ReplayBuffer
    space = step_space(TB)
    path = os.path.join(os.fspath(tmp_path), "rb")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FlattenPromotionWarning)
        rb = ReplayBuffer.create(ToBackendOrDeviceStorage, space, FlattenedStorage, NumpyMemmapStorage,
                                 cache_path=path, capacity=4, backend=NB)
    rng = torch.Generator().manual_seed(0)
    steps = [{"obs": torch.randn(5, generator=rng), "action": torch.rand(3, generator=rng) * 2 - 1,
              "count": torch.tensor([i, 2 * i], dtype=torch.int32), "done": torch.tensor(i % 2 == 1)}
             for i in range(6)]
    for v in steps[:3]:
        rb.append(v)
    rb.mark_segment_end()
    rb.extend({k: torch.stack([s[k] for s in steps[3:]]) for k in steps[0]})
    segs = rb.episode_segments()
    rb.dumps()
    rb.close()
    back = ReplayBuffer.load_from(path, backend=TB)
    assert isinstance(back.storage, ToBackendOrDeviceStorage) and back.storage.inner_backend is NB
    assert back.episode_segments() == segs
    got = back.get_at(slice(0, 4))
    assert_tree_equal(got, {k: torch.stack([s[k] for s in steps[2:]]) for k in steps[0]})
    back.close()


def test_a_recorded_inner_backend_the_inner_storage_cannot_take_is_a_format_error(tmp_path: Any) -> None:
    from unienv_data.base.errors import StorageFormatError
    from unienv_data.storages.backend_compat import ToBackendOrDeviceStorage
    from unienv_data.storages.numpy_memmap import NumpyMemmapStorage
    from unienv_interface.backends.pytorch import PyTorchComputeBackend as TB
    from unienv_interface.space import BoxSpace
    space = BoxSpace(TB, -1.0, 1.0, torch.float32, shape=(3,))
    d = os.path.join(tmp_path, "b2d")
    st = ToBackendOrDeviceStorage.create(space, NumpyMemmapStorage, backend="numpy", capacity=2, cache_path=d)
    st.dumps(d)
    st.close()
    meta_file = os.path.join(d, "backend_metadata.json")
    meta = json.load(open(meta_file))
    meta["inner_backend"] = "pytorch"
    json.dump(meta, open(meta_file, "w"))
    with pytest.raises(StorageFormatError, match="backend_metadata.json"):
        ToBackendOrDeviceStorage.load_from(d, space)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a device this machine lacks")
def test_a_device_this_machine_lacks_is_refused_where_the_dataset_is_opened(tmp_path: Any) -> None:
    """`ReplayBuffer.load_from(..., device="cuda")` without CUDA (and a device NumPy cannot hold, and a device
    `space.to` / a `ToBackendOrDeviceStorage` is asked for) raises ValueError naming the device at once, not a raw
    AssertionError from torch at the first read."""
    from unienv_data.replay_buffer import ReplayBuffer
    space = DictSpace(NB, {"a": BoxSpace(NB, -1.0, 1.0, np.float32, shape=(2,))})
    path = str(tmp_path / "rb")
    rb = ReplayBuffer.create(FlattenedStorage, space, NumpyMemmapStorage, capacity=4, cache_path=path)
    rb.append({"a": np.zeros(2, np.float32)})
    rb.mark_segment_end()
    rb.close()
    with pytest.raises(ValueError, match="'cuda'.*pass device=None or 'cpu'"):
        ReplayBuffer.load_from(path, backend="torch", device="cuda")
    with pytest.raises(ValueError, match="NumPy arrays live on the host.*'cuda'"):
        ReplayBuffer.load_from(path, backend="numpy", device="cuda")
    with pytest.raises(ValueError, match="'cuda'"):
        space.to(backend=TB, device="cuda")
    with pytest.raises(ValueError, match="'cuda'"):
        ToBackendOrDeviceStorage.create(BoxSpace(TB, -1.0, 1.0, torch.float32, shape=(3,)), PytorchTensorStorage,
                                        device="cuda", capacity=2)
    back = ReplayBuffer.load_from(path, backend="torch", device="cpu")     # a device it has: served
    assert back[0]["a"].device.type == "cpu"
    back.close()
