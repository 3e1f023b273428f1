"""NPZStorage: the shared SpaceStorage contract (alone and as FlattenedStorage's inner storage), plus missing and
damaged row files, dumps elsewhere and pickled copies."""
from __future__ import annotations

import json
import os
import pickle
from typing import Any, Optional

import numpy as np
import pytest

from unienv_data.testing.conformance import StorageConformance, expect_error

from unienv_data.base.errors import StorageFormatError, StorageNotFoundError, StorageStateError
from unienv_data.storages.flattened import FlattenedStorage
from unienv_data.storages.npz_storage import NPZStorage
from unienv_interface.backends import NumpyComputeBackend as NB
from unienv_interface.space import BinarySpace, BoxSpace, DictSpace

INF = float("inf")


# ---------------------------------------------------------------------------------------------------- conformance
class _NPZConformance(StorageConformance):
    supports_growable = True
    compressed = True

    def create(self, tmp_path: Any, capacity: Optional[int]) -> Any:
        return NPZStorage.create(self.space, capacity=capacity, compressed=self.compressed,
                                 cache_path=os.path.join(os.fspath(tmp_path), "rows"))

    def load(self, path: Any, read_only: bool) -> Any:
        return NPZStorage.load_from(path, self.space, read_only=read_only)


class TestNPZBox(_NPZConformance):
    def make_space(self) -> BoxSpace:
        return BoxSpace(NB, -1.0, 1.0, np.float32, shape=(3,))


class TestNPZIntUncompressed(_NPZConformance):
    compressed = False

    def make_space(self) -> BoxSpace:
        return BoxSpace(NB, -50, 50, np.int16, shape=(2, 2))


class TestNPZBinary(_NPZConformance):
    def make_space(self) -> BinarySpace:
        return BinarySpace(NB, (4,))


class TestNPZTorchScalar(_NPZConformance):
    """Any backend: rows come back as tensors of the space's dtype."""

    def make_space(self) -> BoxSpace:
        torch = pytest.importorskip("torch")
        from unienv_interface.backends.pytorch import PyTorchComputeBackend as TB
        return BoxSpace(TB, -INF, INF, torch.float64, shape=())


@pytest.mark.filterwarnings("ignore::unienv_data.storages.flattened.FlattenPromotionWarning")
class TestFlattenedOverNPZ(StorageConformance):
    supports_growable = True

    def make_space(self) -> DictSpace:
        return DictSpace(NB, {"obs": BoxSpace(NB, -INF, INF, np.float32, shape=(3,)),
                              "action": BoxSpace(NB, -1.0, 1.0, np.float32, shape=(2,)),
                              "done": BinarySpace(NB, ())})

    def create(self, tmp_path: Any, capacity: Optional[int]) -> Any:
        return FlattenedStorage.create(self.space, NPZStorage, capacity=capacity,
                                       cache_path=os.path.join(os.fspath(tmp_path), "flat"))

    def load(self, path: Any, read_only: bool) -> Any:
        return FlattenedStorage.load_from(path, self.space, read_only=read_only)


# ---------------------------------------------------------------------------------------------------- specifics
SPACE = BoxSpace(NB, -INF, INF, np.float32, shape=(2,))


def _filled(tmp_path: Any, capacity: Optional[int] = 4) -> NPZStorage:
    st = NPZStorage.create(SPACE, capacity=capacity, cache_path=str(tmp_path / "rows"))
    if capacity is None:
        st.extend_length(4)
    st.set(slice(0, 4), np.arange(8, dtype=np.float32).reshape(4, 2))
    return st


def test_missing_written_file_is_an_error_not_zeros(tmp_path: Any) -> None:
    st = _filled(tmp_path)
    os.unlink(st.row_path(2))
    exc = expect_error((StorageNotFoundError,), st.get, 2)
    assert "2.npz" in str(exc) and "missing" in str(exc)
    expect_error((StorageNotFoundError,), st.get, slice(0, 4))
    st.close()
    back = NPZStorage.load_from(tmp_path / "rows", SPACE)  # the metadata remembers the row was written
    expect_error((StorageNotFoundError,), back.get, 2)
    np.testing.assert_array_equal(back.get(3), [6.0, 7.0])


def test_damaged_and_foreign_files_are_refused(tmp_path: Any) -> None:
    st = _filled(tmp_path)
    with open(st.row_path(1), "r+b") as f:
        f.truncate(20)
    exc = expect_error((StorageFormatError,), st.get, 1)
    assert "1.npz" in str(exc) and "damaged" in str(exc)
    np.savez(st.row_path(2), data=np.zeros(3, dtype=np.float64))
    exc = expect_error((StorageFormatError,), st.get, 2)
    assert "float64" in str(exc) and "float32" in str(exc)
    np.savez(st.row_path(3), other=np.zeros(2, dtype=np.float32))
    expect_error((StorageFormatError,), st.get, 3)


def test_bad_metadata(tmp_path: Any) -> None:
    st = _filled(tmp_path)
    st.close()
    meta_path = tmp_path / "rows" / "npz_metadata.json"
    meta = json.loads(meta_path.read_text())
    exc = expect_error((ValueError,), NPZStorage.load_from, tmp_path / "rows", SPACE, capacity=5)
    assert "capacity=4" in str(exc)
    wrong = BoxSpace(NB, -INF, INF, np.float64, shape=(2,))
    exc = expect_error((ValueError,), NPZStorage.load_from, tmp_path / "rows", wrong)
    assert "float32" in str(exc)
    meta_path.write_text(json.dumps({**meta, "written": [[3, 9]]}))
    expect_error((StorageFormatError,), NPZStorage.load_from, tmp_path / "rows", SPACE)
    meta_path.write_text("{not json")
    expect_error((StorageFormatError,), NPZStorage.load_from, tmp_path / "rows", SPACE)
    expect_error((StorageNotFoundError,), NPZStorage.load_from, tmp_path / "nothing", SPACE)


def test_create_refuses_a_used_directory_and_needs_a_path(tmp_path: Any) -> None:
    _filled(tmp_path).close()
    expect_error((FileExistsError,), NPZStorage.create, SPACE, capacity=4, cache_path=str(tmp_path / "rows"))
    expect_error((ValueError,), NPZStorage.create, SPACE, capacity=4)
    expect_error((TypeError,), NPZStorage.create, SPACE, capacity=4, cache_path=str(tmp_path / "x"), quality=3)


def test_reference_style_directory_without_a_file(tmp_path: Any) -> None:
    """A reference directory records nothing about which rows were set: a row without a file is an error unless
    missing_ok=True asks for the reference's zeros."""
    d = tmp_path / "ref"
    d.mkdir()
    np.savez_compressed(d / "0.npz", data=np.array([1.0, 2.0], dtype=np.float32))
    (d / "npz_metadata.json").write_text(json.dumps({"storage_type": "NPZStorage", "compressed": True,
                                                     "capacity": 3, "length": 3}))
    st = NPZStorage.load_from(d, SPACE)
    np.testing.assert_array_equal(st.get(0), [1.0, 2.0])
    exc = expect_error((StorageNotFoundError,), st.get, 1)
    assert "missing_ok=True" in str(exc)
    lenient = NPZStorage.load_from(d, SPACE, missing_ok=True)
    np.testing.assert_array_equal(lenient.get(slice(0, 3)), [[1.0, 2.0], [0.0, 0.0], [0.0, 0.0]])
    assert st.episode_segments() == []


def test_dumps_elsewhere_replaces_stale_rows(tmp_path: Any) -> None:
    st = _filled(tmp_path, capacity=None)
    st.dumps(tmp_path / "out")
    st.shrink_length(2)
    st.dumps(tmp_path / "out")
    assert sorted(os.listdir(tmp_path / "out")) == ["0.npz", "1.npz", "npz_metadata.json"]
    back = NPZStorage.load_from(tmp_path / "out", SPACE, read_only=False)
    assert len(back) == 2
    back.set(0, np.array([9.0, 9.0], dtype=np.float32))  # a copy: the source keeps its row
    np.testing.assert_array_equal(st.get(0), [0.0, 1.0])


def test_pickled_copy_writes_rows_but_not_structure(tmp_path: Any) -> None:
    st = _filled(tmp_path, capacity=None)
    st.mark_segment_start(0)
    st.append(np.array([5.0, 5.0], dtype=np.float32))
    st.mark_segment_end()
    clone = pickle.loads(pickle.dumps(st))
    assert clone.episode_segments() == [(0, 0)] and len(clone) == 4
    clone.set(1, np.array([7.0, 7.0], dtype=np.float32))
    np.testing.assert_array_equal(st.get(1), [7.0, 7.0])
    expect_error((StorageStateError,), clone.extend_length, 1)
    clone.close()
    assert len(st) == 4


def test_rejects_structured_and_bfloat16_spaces(tmp_path: Any) -> None:
    expect_error((TypeError,), NPZStorage.create, DictSpace(NB, {"a": SPACE}), cache_path=str(tmp_path / "a"))


def test_map_io_order_errors_and_nesting() -> None:
    from unienv_data.storages import _io_pool
    assert _io_pool.map_io(lambda x: x * 2, range(50)) == [x * 2 for x in range(50)]
    seen = []

    def flaky(x: int) -> int:
        seen.append(x)
        if x == 3:
            raise OSError("disk full")
        return x
    with pytest.raises(OSError, match="disk full"):
        _io_pool.map_io(flaky, range(40))
    assert 3 in seen and len(seen) > 10  # the other runs finished before the error surfaced
    nested = _io_pool.map_io(lambda x: _io_pool.map_io(lambda y: (x, y, _io_pool.in_io_pool_thread()), range(8)),
                             range(8))
    assert all(inner_in_pool for row in nested for (_x, _y, inner_in_pool) in row) or _io_pool.IO_POOL_WORKERS <= 1
    assert _io_pool.map_io(str, []) == []


@pytest.mark.parametrize("field, value", [("capacity", 2 ** 40), ("capacity", 2 ** 70), ("length", 2 ** 40)])
def test_absurd_row_counts_are_format_errors(tmp_path: Any, field: str, value: int) -> None:
    from unienv_data.storages.npz_storage import NPZStorage
    from unienv_interface.backends import NumpyComputeBackend as NB
    from unienv_interface.space import BoxSpace
    box = BoxSpace(NB, 0, 255, np.uint8, shape=(2,))
    p = os.path.join(tmp_path, "npz")
    st = NPZStorage.create(box, capacity=None if field == "length" else 10, cache_path=p)
    if field == "length":
        st.extend_length(10)
    st.set(np.arange(10), np.full((10, 2), 7, np.uint8))
    st.close()
    meta = os.path.join(p, "npz_metadata.json")
    d = json.load(open(meta))
    d[field] = value
    json.dump(d, open(meta, "w"))
    expect_error((StorageFormatError,), NPZStorage.load_from, p, box)
