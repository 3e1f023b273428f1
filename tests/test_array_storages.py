"""PytorchTensorStorage and NumpyMemmapStorage: the shared SpaceStorage contract (Box and Binary spaces, memory-mapped
files, RAM and shared memory, fixed and growable), plus file handling and the dtypes only torch has."""
from __future__ import annotations

import json
import os
from typing import Any, Optional

import numpy as np
import pytest

torch = pytest.importorskip("torch")

# values outside declared bounds are stored with a BoundsWarning by default; this file's refusal checks run in
# the refusal mode (the warning as an error), where they are refused like every other bad value
pytestmark = pytest.mark.filterwarnings("error::unienv_data.base.errors.BoundsWarning")

from unienv_data.testing.conformance import StorageConformance, assert_tree_equal, expect_error  # noqa: E402

from unienv_data.storages.numpy_memmap import NumpyMemmapStorage  # noqa: E402
from unienv_data.storages.pytorch import PytorchTensorStorage  # noqa: E402
from unienv_interface.backends import NumpyComputeBackend as NB  # noqa: E402
from unienv_interface.backends.pytorch import PyTorchComputeBackend as TB  # noqa: E402
from unienv_interface.space import BinarySpace, BoxSpace  # noqa: E402

INF = float("inf")


# ---------------------------------------------------------------------------------------------------- conformance
class _ArrayConformance(StorageConformance):
    storage_cls: Any = PytorchTensorStorage
    memmap = True
    shared = False
    supports_growable = True

    def create(self, tmp_path: Any, capacity: Optional[int]) -> Any:
        cache = os.path.join(os.fspath(tmp_path), "data.memmap") if self.memmap else None
        return self.storage_cls.create(self.space, capacity=capacity, cache_path=cache, multiprocessing=self.shared)

    def dump_path(self, tmp_path: Any) -> str:
        return os.path.join(os.fspath(tmp_path), "dump.memmap")

    def load(self, path: Any, read_only: bool) -> Any:
        return self.storage_cls.load_from(path, self.space, read_only=read_only)


class TestTorchBoxMemmap(_ArrayConformance):
    shares_rows_when_pickled = True

    def make_space(self) -> BoxSpace:
        return BoxSpace(TB, -1.0, 1.0, torch.float32, shape=(3,))


class TestTorchIntBoxRAM(_ArrayConformance):
    memmap = False

    def make_space(self) -> BoxSpace:
        return BoxSpace(TB, -50, 50, torch.int32, shape=(2, 2))


class TestTorchBinaryShared(_ArrayConformance):
    memmap = False
    shared = True
    shares_rows_when_pickled = True
    spawn_check = True

    def make_space(self) -> BinarySpace:
        return BinarySpace(TB, (4,))


class TestTorchUint8RAM(_ArrayConformance):
    memmap = False
    capacity = 8

    def make_space(self) -> BoxSpace:
        return BoxSpace(TB, 0, 255, torch.uint8, shape=(2, 3))


class TestTorchScalarFloatMemmap(_ArrayConformance):
    shares_rows_when_pickled = True

    def make_space(self) -> BoxSpace:
        return BoxSpace(TB, -INF, INF, torch.float64, shape=())


class TestTorchScalarBoundedRAM(_ArrayConformance):
    memmap = False

    def make_space(self) -> BoxSpace:
        return BoxSpace(TB, -2.0, 2.0, torch.float32, shape=())


class TestNumpyBoxMemmap(_ArrayConformance):
    storage_cls = NumpyMemmapStorage
    shares_rows_when_pickled = True

    def make_space(self) -> BoxSpace:
        return BoxSpace(NB, -1.0, 1.0, np.float32, shape=(3,))


class TestNumpyBinaryRAM(_ArrayConformance):
    storage_cls = NumpyMemmapStorage
    memmap = False

    def make_space(self) -> BinarySpace:
        return BinarySpace(NB, (2,))


class TestNumpyInt16Shared(_ArrayConformance):
    storage_cls = NumpyMemmapStorage
    memmap = False
    shared = True
    shares_rows_when_pickled = True

    def make_space(self) -> BoxSpace:
        return BoxSpace(NB, -10, 10, np.int16, shape=(3,))


class TestNumpyScalarUnboundedMemmap(_ArrayConformance):
    storage_cls = NumpyMemmapStorage
    shares_rows_when_pickled = True

    def make_space(self) -> BoxSpace:
        return BoxSpace(NB, -INF, INF, np.float32, shape=())


# ---------------------------------------------------------------------------------------------------- files
STORAGES = [pytest.param(PytorchTensorStorage, TB, id="torch"), pytest.param(NumpyMemmapStorage, NB, id="numpy")]


def f32_space(backend: Any, shape: Any = (3,)) -> BoxSpace:
    return BoxSpace(backend, -INF, INF, torch.float32 if backend is TB else np.float32, shape=shape)


def as_numpy(x: Any) -> np.ndarray:
    return x.numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


def value(backend: Any, arr: Any) -> Any:
    arr = np.array(arr, dtype=np.float32)
    return torch.from_numpy(arr) if backend is TB else arr


@pytest.mark.parametrize("cls, backend", STORAGES)
def test_create_over_an_existing_file_replaces_it(tmp_path: Any, cls: Any, backend: Any) -> None:
    path = os.path.join(os.fspath(tmp_path), "data.memmap")
    space = f32_space(backend)
    old = cls.create(space, capacity=4, cache_path=path)
    for i in range(4):
        old.set(i, value(backend, [i + 1.0, i + 2.0, i + 3.0]))
    old.close()
    with pytest.raises(FileExistsError, match="overwrite=True"):
        cls.create(space, capacity=4, cache_path=path)
    fresh = cls.create(space, capacity=4, cache_path=path, overwrite=True)
    assert np.array_equal(as_numpy(fresh.get(Ellipsis)), np.zeros((4, 3), np.float32))
    assert fresh.episode_segments() == []
    fresh.close()
    bigger = cls.create(space, capacity=6, cache_path=path, overwrite=True)
    assert bigger.capacity == 6
    assert np.array_equal(as_numpy(bigger.get(Ellipsis)), np.zeros((6, 3), np.float32))
    bigger.close()
    with open(path, "wb") as f:  # a foreign raw file without metadata
        f.write(np.full((10, 3), 7.0, np.float32).tobytes())
    again = cls.create(space, capacity=2, cache_path=path, overwrite=True)
    assert np.array_equal(as_numpy(again.get(Ellipsis)), np.zeros((2, 3), np.float32))
    again.close()
    reloaded = cls.load_from(path, space)
    assert reloaded.capacity == 2
    reloaded.close()


@pytest.mark.parametrize("cls, backend", STORAGES)
def test_memmap_existok_false_refuses_an_existing_file(tmp_path: Any, cls: Any, backend: Any) -> None:
    path = os.path.join(os.fspath(tmp_path), "data.memmap")
    space = f32_space(backend)
    old = cls.create(space, capacity=3, cache_path=path, memmap_existok=False)
    old.set(1, value(backend, [1.0, 2.0, 3.0]))
    old.close()
    before = open(path, "rb").read()
    expect_error((FileExistsError,), cls.create, space, capacity=3, cache_path=path, memmap_existok=False)
    assert open(path, "rb").read() == before
    kept = cls.load_from(path, space)
    assert np.array_equal(as_numpy(kept.get(1)), np.array([1.0, 2.0, 3.0], np.float32))
    kept.close()


@pytest.mark.parametrize("cls, backend", STORAGES)
def test_is_memmap_without_cache_path_is_a_value_error(tmp_path: Any, cls: Any, backend: Any) -> None:
    expect_error((ValueError,), cls.create, f32_space(backend), capacity=3, is_memmap=True)


@pytest.mark.parametrize("cls, backend", STORAGES)
def test_ram_storage_is_not_a_memmap_and_not_shared(tmp_path: Any, cls: Any, backend: Any) -> None:
    st = cls.create(f32_space(backend), capacity=3)
    assert st.cache_filename is None
    assert not st.is_multiprocessing_safe
    shared = cls.create(f32_space(backend), capacity=3, multiprocessing=True)
    assert shared.cache_filename is None and shared.is_multiprocessing_safe
    mm = cls.create(f32_space(backend), capacity=3, cache_path=os.path.join(os.fspath(tmp_path), "x.memmap"))
    assert os.fspath(mm.cache_filename) == os.path.join(os.fspath(tmp_path), "x.memmap")
    assert mm.is_multiprocessing_safe
    for s in (st, shared, mm):
        s.close()


@pytest.mark.parametrize("cls, backend", STORAGES)
def test_load_raw_file_without_sidecar_infers_capacity(tmp_path: Any, cls: Any, backend: Any) -> None:
    path = os.path.join(os.fspath(tmp_path), "raw.memmap")
    rows = np.arange(5 * 3, dtype=np.float32).reshape(5, 3)
    with open(path, "wb") as f:
        f.write(rows.tobytes())
    st = cls.load_from(path, f32_space(backend))
    assert st.capacity == 5 and len(st) == 5
    assert np.array_equal(as_numpy(st.get(Ellipsis)), rows)
    assert np.array_equal(as_numpy(st.get(-1)), rows[4])
    st.close()
    same = cls.load_from(path, f32_space(backend), capacity=5)
    assert same.capacity == 5
    same.close()
    exc = expect_error((ValueError,), cls.load_from, path, f32_space(backend), capacity=4)
    assert "5" in str(exc)


@pytest.mark.parametrize("cls, backend", STORAGES)
def test_load_file_of_partial_rows_is_a_value_error(tmp_path: Any, cls: Any, backend: Any) -> None:
    path = os.path.join(os.fspath(tmp_path), "raw.memmap")
    with open(path, "wb") as f:
        f.write(np.zeros(5 * 3, np.float32).tobytes() + b"\x00\x01")
    expect_error((ValueError,), cls.load_from, path, f32_space(backend))
    # the same bytes read as float64 rows of width 3 do not divide either
    with open(path, "wb") as f:
        f.write(np.zeros(5 * 3, np.float32).tobytes())  # 60 bytes: 2.5 rows of float64[3]
    f64 = BoxSpace(backend, -INF, INF, torch.float64 if backend is TB else np.float64, shape=(3,))
    expect_error((ValueError,), cls.load_from, path, f64)


@pytest.mark.parametrize("cls, backend", STORAGES)
def test_load_missing_file_is_file_not_found(tmp_path: Any, cls: Any, backend: Any) -> None:
    expect_error((FileNotFoundError,), cls.load_from, os.path.join(os.fspath(tmp_path), "nope.memmap"), f32_space(backend))


@pytest.mark.parametrize("cls, backend", STORAGES)
def test_load_with_a_different_space_than_the_sidecar_is_a_value_error(tmp_path: Any, cls: Any, backend: Any) -> None:
    path = os.path.join(os.fspath(tmp_path), "data.memmap")
    st = cls.create(f32_space(backend, (4,)), capacity=3, cache_path=path)
    st.close()
    # (2, 2) float32 rows have the same size as (4,): only the sidecar can tell them apart
    expect_error((ValueError,), cls.load_from, path, f32_space(backend, (2, 2)))
    i32 = BoxSpace(backend, -5, 5, torch.int32 if backend is TB else np.int32, shape=(4,))
    expect_error((ValueError,), cls.load_from, path, i32)


@pytest.mark.parametrize("cls, backend", STORAGES)
def test_sidecar_records_capacity_and_segments(tmp_path: Any, cls: Any, backend: Any) -> None:
    path = os.path.join(os.fspath(tmp_path), "data.memmap")
    st = cls.create(f32_space(backend), capacity=4, cache_path=path)
    st.mark_segment_start(3)
    st.append(value(backend, [1, 2, 3]))
    st.append(value(backend, [4, 5, 6]))
    st.mark_segment_end()
    st.close()
    with open(path + ".meta.json") as f:
        meta = json.load(f)
    assert meta["capacity"] == 4
    assert os.path.getsize(path) == 4 * 3 * 4  # raw rows, no header (the reference layout)
    back = cls.load_from(path, f32_space(backend))
    assert back.episode_segments() == [(3, 0)]
    assert np.array_equal(as_numpy(back.get(0)), np.array([4, 5, 6], np.float32))
    back.close()


# ---------------------------------------------------------------------------------------------------- torch-only dtypes
TORCH_DTYPE_SPACES = [
    pytest.param(lambda: BoxSpace(TB, -4.0, 4.0, torch.bfloat16, shape=(3,)),
                 torch.tensor([[-4.0, 0.5, 3.96875], [1.0, -0.0078125, 2.5]], dtype=torch.bfloat16), id="bfloat16"),
    pytest.param(lambda: BoxSpace(TB, -INF, INF, torch.float16, shape=(3,)),
                 torch.tensor([[65504.0, -0.000061035, 1.0009765625], [float("inf"), -2.5, 0.0]], dtype=torch.float16),
                 id="float16"),
    pytest.param(lambda: BoxSpace(TB, 0, 65535, torch.uint16, shape=(3,)),
                 torch.tensor([[0, 40000, 65535], [1, 32768, 12345]], dtype=torch.uint16), id="uint16"),
]


@pytest.mark.parametrize("memmap", [True, False], ids=["memmap", "ram"])
@pytest.mark.parametrize("make_space, rows", TORCH_DTYPE_SPACES)
def test_torch_only_dtypes_round_trip(tmp_path: Any, make_space: Any, rows: Any, memmap: bool) -> None:
    space = make_space()
    cache = os.path.join(os.fspath(tmp_path), "data.memmap") if memmap else None
    st = PytorchTensorStorage.create(space, capacity=3, cache_path=cache)
    st.set(0, rows[0])
    st.set(slice(1, 3), rows)
    got = st.get(0)
    assert got.dtype == space.dtype
    assert_tree_equal(got, rows[0])
    assert_tree_equal(st.get(slice(1, 3)), rows)
    st.mark_segment_start(2)
    st.append(rows[1])
    st.mark_segment_end()
    dump = os.path.join(os.fspath(tmp_path), "dump.memmap")
    st.dumps(dump)
    back = PytorchTensorStorage.load_from(dump, make_space())
    assert back.capacity == 3
    assert_tree_equal(back.get(Ellipsis), torch.stack([rows[0], rows[0], rows[1]]))
    assert back.episode_segments() == [(2, 2)]
    back.close()
    st.close()


def test_bfloat16_refuses_values_it_cannot_hold_exactly(tmp_path: Any) -> None:
    space = BoxSpace(TB, -4.0, 4.0, torch.bfloat16, shape=(2,))
    st = PytorchTensorStorage.create(space, capacity=2)
    st.set(0, torch.tensor([1.5, -2.0], dtype=torch.bfloat16))
    expect_error((ValueError,), st.set, 1, torch.tensor([1.0 + 2 ** -10, 0.0], dtype=torch.float32))
    expect_error((ValueError,), st.set, 1, torch.tensor([5.0, 0.0], dtype=torch.bfloat16))
    st.set(1, torch.tensor([0.25, 3.0], dtype=torch.float32))  # exactly representable: accepted
    assert_tree_equal(st.get(1), torch.tensor([0.25, 3.0], dtype=torch.bfloat16))
    assert_tree_equal(st.get(0), torch.tensor([1.5, -2.0], dtype=torch.bfloat16))
    st.close()


def test_uint16_refuses_negative_and_too_large(tmp_path: Any) -> None:
    space = BoxSpace(TB, 0, 65535, torch.uint16, shape=(2,))
    st = PytorchTensorStorage.create(space, capacity=2)
    expect_error((ValueError,), st.set, 0, torch.tensor([-1, 0], dtype=torch.int32))
    expect_error((ValueError,), st.set, 0, torch.tensor([65536, 0], dtype=torch.int64))
    st.set(0, torch.tensor([65535, 7], dtype=torch.int64))
    assert_tree_equal(st.get(0), torch.tensor([65535, 7], dtype=torch.uint16))
    st.close()


# ---------------------------------------------------------------- raw row copies (dumps / load into RAM)
def test_write_rows_and_read_rows_into_round_trip_strided_and_contiguous(tmp_path: Any) -> None:
    from unienv_data.base.errors import StorageFormatError
    from unienv_data.storages._array_file import read_rows_into, write_rows

    rows = np.arange(7 * 5, dtype=np.float32).reshape(7, 5)
    for name, src in (("contiguous", rows), ("strided", rows[::2]), ("columns", rows[:, 1:4])):
        path = str(tmp_path / name)
        with open(path, "wb") as f:
            write_rows(f, src)
        assert os.path.getsize(path) == src.nbytes
        back = np.empty(src.shape, dtype=src.dtype)
        read_rows_into(path, back)
        assert np.array_equal(back, src), name
    too_many = np.empty((8, 5), dtype=np.float32)
    with pytest.raises(StorageFormatError, match="truncated"):
        read_rows_into(str(tmp_path / "contiguous"), too_many)


def test_large_reads_split_over_threads_keep_every_byte_and_report_truncation(tmp_path: Any, monkeypatch: Any) -> None:
    """Reads from the parallel-read size on are split into page-aligned parts, one per IO thread: the bytes land
    where a single read puts them (sizes that are no multiple of the page or of the thread count included), and a
    file shorter than the array is a StorageFormatError whichever part runs past its end."""
    from unienv_data.base.errors import StorageFormatError
    from unienv_data.storages import _array_file
    from unienv_data.storages._io_pool import IO_POOL_WORKERS
    if IO_POOL_WORKERS < 2 or not hasattr(os, "preadv"):
        pytest.skip("one IO thread, or no preadv: reads are never split here")
    monkeypatch.setattr(_array_file, "_PARALLEL_READ_BYTES", 1)
    rng = np.random.default_rng(3)
    for nbytes in (1, 4095, 4096 * 3 + 17, 1 << 20):
        src = rng.integers(0, 256, nbytes, dtype=np.uint8)
        path = str(tmp_path / f"rows{nbytes}")
        src.tofile(path)
        back = np.zeros(nbytes, np.uint8)
        _array_file.read_rows_into(path, back)
        assert np.array_equal(back, src), nbytes
        with pytest.raises(StorageFormatError, match="truncated"):
            _array_file.read_rows_into(path, np.zeros(nbytes + 4096 * 2 + 1, np.uint8))


@pytest.mark.parametrize("cls, space", [(PytorchTensorStorage, BoxSpace(TB, -10.0, 10.0, torch.float32, shape=(3,))),
                                        (NumpyMemmapStorage, BoxSpace(NB, -10.0, 10.0, np.float32, shape=(3,)))])
def test_ram_dump_and_load_into_ram_copy_the_rows_exactly(tmp_path: Any, cls: Any, space: Any) -> None:
    st = cls.create(space, capacity=5)
    vals = np.linspace(-9, 9, 15, dtype=np.float32).reshape(5, 3)
    st.set(slice(0, 5), torch.from_numpy(vals) if cls is PytorchTensorStorage else vals)
    path = str(tmp_path / "rows.memmap")
    st.dumps(path)
    assert os.path.getsize(path) == vals.nbytes
    back = cls.load_from(path, space, is_memmap=False)
    assert not back.is_memmap and back.capacity == 5
    got = back.get(slice(None))
    assert np.array_equal(got.numpy() if cls is PytorchTensorStorage else got, vals)
    st.set(0, torch.zeros(3) if cls is PytorchTensorStorage else np.zeros(3, np.float32))   # the copy is independent
    again = back.get(0)
    assert np.array_equal(again.numpy() if cls is PytorchTensorStorage else again, vals[0])


def test_large_ram_blocks_start_zeroed_and_stay_private_to_a_forked_child(tmp_path: Any) -> None:
    """In-RAM blocks of 64 MiB and more live in private anonymous mappings: zeros at creation, values round-trip
    through dumps / load into RAM, and a forked child's writes never reach the parent (copy-on-write, as with
    ordinary heap memory)."""
    from unienv_data.storages._array_file import _ANON_MAP_BYTES
    space = BoxSpace(NB, 0, 255, np.uint8, shape=(256, 256, 3))
    rows = _ANON_MAP_BYTES // (256 * 256 * 3) + 1
    st = NumpyMemmapStorage.create(space, capacity=rows)
    assert not st.get(slice(None)).any()
    frames = np.random.default_rng(0).integers(0, 256, (rows, 256, 256, 3), dtype=np.uint8)
    st.set(slice(0, rows), frames)
    path = str(tmp_path / "frames.memmap")
    st.dumps(path)
    back = NumpyMemmapStorage.load_from(path, space, is_memmap=False, read_only=False)
    assert np.array_equal(back.get(slice(None)), frames)
    pid = os.fork()
    if pid == 0:                                # the child overwrites its copy and exits at once
        back.set(0, np.zeros((256, 256, 3), np.uint8))
        os._exit(0 if not back.get(0).any() else 1)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0
    assert np.array_equal(back.get(0), frames[0])
