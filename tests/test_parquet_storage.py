"""ParquetStorage: the shared SpaceStorage contract (alone and as FlattenedStorage's inner storage), plus pieces,
compression, column views, text columns, bad directories and reader copies."""
from __future__ import annotations

import json
import os
import pickle
from typing import Any, Optional

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

from unienv_data.testing.conformance import StorageConformance, expect_error  # noqa: E402

from unienv_data.base.errors import StorageFormatError, StorageNotFoundError, StorageStateError  # noqa: E402
from unienv_data.storages.flattened import FlattenedStorage  # noqa: E402
from unienv_data.storages.parquet import ParquetStorage  # noqa: E402
from unienv_interface.backends import NumpyComputeBackend as NB  # noqa: E402
from unienv_interface.space import BinarySpace, BoxSpace, DictSpace, TextSpace  # noqa: E402

INF = float("inf")


def flat_space() -> DictSpace:
    return DictSpace(NB, {"obs": BoxSpace(NB, -INF, INF, np.float32, shape=(3,)),
                          "img": BoxSpace(NB, 0, 255, np.uint8, shape=(2, 2)),
                          "action": BoxSpace(NB, -1.0, 1.0, np.float32, shape=(2,)),
                          "reward": BoxSpace(NB, -INF, INF, np.float64, shape=()),
                          "done": BinarySpace(NB, ())})


# ---------------------------------------------------------------------------------------------------- conformance
class _ParquetConformance(StorageConformance):
    supports_growable = True
    options: dict = {}

    def make_space(self) -> Any:
        return flat_space()

    def create(self, tmp_path: Any, capacity: Optional[int]) -> Any:
        return ParquetStorage.create(self.space, capacity=capacity, cache_path=os.path.join(os.fspath(tmp_path), "pq"),
                                     **self.options)

    def load(self, path: Any, read_only: bool) -> Any:
        return ParquetStorage.load_from(path, self.space, read_only=read_only)


class TestParquetDictSmallPieces(_ParquetConformance):
    """Pieces of 4 rows: every test crosses piece boundaries."""
    options = {"piece_size": 4}


class TestParquetBoxZstd(_ParquetConformance):
    options = {"compression": "zstd"}

    def make_space(self) -> Any:
        return BoxSpace(NB, -50, 50, np.int16, shape=(2, 2))


class TestParquetBinaryUncompressed(_ParquetConformance):
    options = {"compression": None, "piece_size": 3}

    def make_space(self) -> Any:
        return BinarySpace(NB, (4,))


@pytest.mark.filterwarnings("ignore::unienv_data.storages.flattened.FlattenPromotionWarning")
class TestFlattenedOverParquet(StorageConformance):
    supports_growable = True

    def make_space(self) -> Any:
        return flat_space()

    def create(self, tmp_path: Any, capacity: Optional[int]) -> Any:
        return FlattenedStorage.create(self.space, ParquetStorage, capacity=capacity,
                                       cache_path=os.path.join(os.fspath(tmp_path), "flat"), piece_size=4)

    def load(self, path: Any, read_only: bool) -> Any:
        return FlattenedStorage.load_from(path, self.space, read_only=read_only)


# ---------------------------------------------------------------------------------------------------- helpers
SPACE = DictSpace(NB, {"obs": BoxSpace(NB, -INF, INF, np.float32, shape=(2,)), "done": BinarySpace(NB, ())})


def _rows(n: int) -> dict:
    return {"obs": np.arange(2 * n, dtype=np.float32).reshape(n, 2), "done": np.arange(n) % 2 == 1}


def _filled(path: Any, capacity: Optional[int] = 10, **kw: Any) -> ParquetStorage:
    st = ParquetStorage.create(SPACE, capacity=capacity, cache_path=str(path), piece_size=4, **kw)
    if capacity is None:
        st.extend_length(10)
    st.set(slice(0, 10), _rows(10))
    return st


# ---------------------------------------------------------------------------------------------------- layout
def test_pieces_and_metadata(tmp_path: Any) -> None:
    st = _filled(tmp_path / "d", compression={"obs": "zstd", "*": None})
    st.flush()
    names = sorted(os.listdir(tmp_path / "d"))
    assert names == ["_metadata.json", "part-000000.parquet", "part-000001.parquet", "part-000002.parquet"]
    meta = json.loads((tmp_path / "d" / "_metadata.json").read_text())
    assert meta["piece_size"] == 4 and meta["num_rows"] == 10 and meta["capacity"] == 10
    assert meta["column_shapes"] == {"done": [], "obs": [2]} and meta["column_dtypes"] == {"done": "bool",
                                                                                            "obs": "float32"}
    md = pq.ParquetFile(tmp_path / "d" / "part-000002.parquet").metadata
    assert md.num_rows == 2
    comp = {md.row_group(0).column(i).path_in_schema: md.row_group(0).column(i).compression
            for i in range(md.num_columns)}
    assert comp == {"done": "UNCOMPRESSED", "obs.list.element": "ZSTD"}
    table = pq.read_table(tmp_path / "d" / "part-000001.parquet")
    assert table.column("obs").to_pylist()[0] == [8.0, 9.0]
    assert json.loads(table.schema.metadata[b"column_shapes"]) == {"done": [], "obs": [2]}


def test_bad_options(tmp_path: Any) -> None:
    expect_error((ValueError,), ParquetStorage.create, SPACE, cache_path=str(tmp_path / "a"), compression="nope")
    expect_error((KeyError,), ParquetStorage.create, SPACE, cache_path=str(tmp_path / "b"), compression={"x": "zstd"})
    expect_error((ValueError,), ParquetStorage.create, SPACE, cache_path=str(tmp_path / "c"), piece_size=0)
    expect_error((ValueError,), ParquetStorage.create, SPACE, cache_path=str(tmp_path / "d"), multiprocessing=True)
    expect_error((ValueError,), ParquetStorage.create, SPACE)
    nested = DictSpace(NB, {"a": SPACE})
    expect_error((TypeError,), ParquetStorage.create, nested, cache_path=str(tmp_path / "e"))
    _filled(tmp_path / "f").close()
    expect_error((FileExistsError,), ParquetStorage.create, SPACE, cache_path=str(tmp_path / "f"))


def test_column_views_decode_and_write_one_column(tmp_path: Any) -> None:
    _filled(tmp_path / "d").close()
    st = ParquetStorage.load_from(tmp_path / "d", SPACE)
    done = st.get_column(["done"])
    assert done.get(slice(0, 4)).tolist() == [False, True, False, True]
    assert st._cols[0] is not None and st._cols[1] is None  # only the "done" column was decoded
    expect_error((KeyError,), st.get_column, ["obs", "x"])
    expect_error((StorageStateError,), done.set, 0, np.array(True))
    rw = ParquetStorage.load_from(tmp_path / "d", SPACE, read_only=False)
    obs = rw.get_column("obs")
    obs.set([9, 0], np.array([[1.0, 1.0], [2.0, 2.0]], np.float32))
    expect_error((StorageStateError,), obs.mark_segment_start, 0)
    rw.close()
    back = ParquetStorage.load_from(tmp_path / "d", SPACE)
    assert back.get(9)["obs"].tolist() == [1.0, 1.0] and back.get(9)["done"]
    assert back.get(0)["obs"].tolist() == [2.0, 2.0]


def test_text_columns(tmp_path: Any) -> None:
    space = DictSpace(NB, {"task": TextSpace(NB, max_length=12), "x": BoxSpace(NB, 0, 9, np.int32, shape=())})
    st = ParquetStorage.create(space, capacity=3, cache_path=str(tmp_path / "t"), piece_size=2)
    st.set(0, {"task": "pick cube", "x": np.array(3, np.int32)})
    st.set(slice(1, 3), {"task": ["ünïcode", ""], "x": np.array([1, 2], np.int32)})
    assert st.get([2, 1])["task"].tolist() == ["", "ünïcode"]
    expect_error((ValueError,), st.set, 0, {"task": "x" * 13, "x": np.array(1, np.int32)})
    st.close()
    assert ParquetStorage.load_from(tmp_path / "t", space).get(0)["task"] == "pick cube"


def test_growable_pieces_follow_length(tmp_path: Any) -> None:
    st = ParquetStorage.create(SPACE, cache_path=str(tmp_path / "g"), piece_size=4)
    st.mark_segment_start(0)
    for i in range(9):
        st.append({"obs": np.array([i, i], np.float32), "done": np.array(i == 8)})
    st.mark_segment_end()
    st.flush()
    assert len([n for n in os.listdir(tmp_path / "g") if n.endswith(".parquet")]) == 3
    st.shrink_length(4)
    st.flush()
    assert sorted(n for n in os.listdir(tmp_path / "g") if n.endswith(".parquet")) == ["part-000000.parquet",
                                                                                        "part-000001.parquet"]
    st.extend_length(2)
    assert st.get(5)["obs"].tolist() == [0.0, 0.0] and st.get(4)["obs"].tolist() == [4.0, 4.0]
    st.close()
    back = ParquetStorage.load_from(tmp_path / "g", SPACE)
    assert len(back) == 7 and back.capacity is None and back.episode_segments() == []
    assert back.get(6)["obs"].tolist() == [0.0, 0.0]


# ---------------------------------------------------------------------------------------------------- bad directories
def test_capacity_and_space_mismatches(tmp_path: Any) -> None:
    _filled(tmp_path / "d").close()
    exc = expect_error((ValueError,), ParquetStorage.load_from, tmp_path / "d", SPACE, capacity=4)
    assert "capacity=10" in str(exc)
    wrong = DictSpace(NB, {"obs": BoxSpace(NB, -INF, INF, np.float64, shape=(3,)), "done": BinarySpace(NB, ()),
                           "more": BinarySpace(NB, ())})
    exc = expect_error((ValueError,), ParquetStorage.load_from, tmp_path / "d", wrong)
    assert "shape [2]" in str(exc) and "float32" in str(exc) and "'more'" in str(exc)
    subset = DictSpace(NB, {"done": BinarySpace(NB, ())})
    assert ParquetStorage.load_from(tmp_path / "d", subset).get(3)["done"]
    expect_error((ValueError,), ParquetStorage.load_from, tmp_path / "d", subset, read_only=False)
    bounded = DictSpace(NB, {"obs": BoxSpace(NB, -1.0, 1.0, np.float32, shape=(2,)), "done": BinarySpace(NB, ())})
    assert "bounds" in str(expect_error((ValueError,), ParquetStorage.load_from, tmp_path / "d", bounded))


def test_missing_truncated_and_damaged_pieces(tmp_path: Any) -> None:
    _filled(tmp_path / "d").close()
    piece = tmp_path / "d" / "part-000001.parquet"
    data = piece.read_bytes()
    piece.write_bytes(data[: len(data) // 2])
    st = ParquetStorage.load_from(tmp_path / "d", SPACE)
    assert st.get(0)["obs"].tolist() == [0.0, 1.0]
    exc = expect_error((StorageFormatError,), st.get, 5)
    assert "part-000001.parquet" in str(exc)
    # a valid parquet file with the wrong number of rows
    pq.write_table(pa.table({"obs": pa.array([[0.0, 0.0]], type=pa.list_(pa.float32(), 2)),
                             "done": pa.array([False])}), piece)
    exc = expect_error((StorageFormatError,), ParquetStorage.load_from(tmp_path / "d", SPACE).get, 5)
    assert "holds 1 rows, expected 4" in str(exc)
    pq.write_table(pa.table({"obs": pa.array([[0.0, 0.0, 0.0]] * 4, type=pa.list_(pa.float64(), 3)),
                             "done": pa.array([False] * 4)}), piece)
    expect_error((StorageFormatError,), ParquetStorage.load_from(tmp_path / "d", SPACE).get, 5)
    piece.unlink()
    exc = expect_error((StorageFormatError,), ParquetStorage.load_from, tmp_path / "d", SPACE)
    assert "part-000001.parquet" in str(exc)
    (tmp_path / "d" / "_metadata.json").write_text("{")
    expect_error((StorageFormatError,), ParquetStorage.load_from, tmp_path / "d", SPACE)
    (tmp_path / "d" / "_metadata.json").write_text(json.dumps({"piece_size": 0, "num_rows": 3, "column_shapes": {}}))
    expect_error((StorageFormatError,), ParquetStorage.load_from, tmp_path / "d", SPACE)
    expect_error((StorageNotFoundError,), ParquetStorage.load_from, tmp_path / "none", SPACE)


def test_reference_style_directory_capacity(tmp_path: Any) -> None:
    """Reference directories record no capacity: growable by default, fixed when capacity equals the row count."""
    _filled(tmp_path / "d").close()
    meta_path = tmp_path / "d" / "_metadata.json"
    meta = json.loads(meta_path.read_text())
    ref_meta = {k: meta[k] for k in ("piece_size", "num_rows", "column_shapes", "compression", "column_dtypes")}
    meta_path.write_text(json.dumps(ref_meta))
    assert ParquetStorage.load_from(tmp_path / "d", SPACE).capacity is None
    assert ParquetStorage.load_from(tmp_path / "d", SPACE, capacity=10).capacity == 10
    exc = expect_error((ValueError,), ParquetStorage.load_from, tmp_path / "d", SPACE, capacity=12)
    assert "pass capacity=10" in str(exc)
    count, cap, space = ParquetStorage.build_space_from_parquet_file(tmp_path / "d")
    assert (count, cap) == (10, 10) and sorted(space.spaces) == ["done", "obs"]
    rb = ParquetStorage.load_replay_buffer_from_raw_parquet(tmp_path / "d")
    assert len(rb) == 10 and rb[3]["done"]


@pytest.mark.parametrize("capacity", [None, 6])
def test_build_space_gives_the_row_count_as_capacity(tmp_path: Any, capacity: Any) -> None:
    """As the reference: `(count, count, space)`, for an empty unbounded directory `(0, 0, space)`."""
    ParquetStorage.create(SPACE, capacity=capacity, cache_path=tmp_path / "d").close()
    count, cap, space = ParquetStorage.build_space_from_parquet_file(tmp_path / "d")
    assert (count, cap) == ((0, 0) if capacity is None else (6, 6))
    assert space == SPACE


def test_pickled_copy_is_a_reader(tmp_path: Any) -> None:
    st = _filled(tmp_path / "d", None)
    clone = pickle.loads(pickle.dumps(st))  # pickling flushes the dirty pieces first
    assert clone.get(7)["obs"].tolist() == [14.0, 15.0] and not clone.is_mutable and clone.is_multiprocessing_safe
    expect_error((StorageStateError,), clone.set, 0, {"obs": np.zeros(2, np.float32), "done": np.array(False)})
    assert clone.get_column("done").get(1)


def test_missing_optional_dependencies_name_the_extra(tmp_path: Any, monkeypatch: Any) -> None:
    from unienv_data.storages.hdf5 import HDF5Storage
    monkeypatch.setitem(__import__("sys").modules, "pyarrow", None)
    with pytest.raises(ModuleNotFoundError, match=r"unienv-storage\[parquet\]"):
        ParquetStorage.create(SPACE, cache_path=str(tmp_path / "p"))
    monkeypatch.setitem(__import__("sys").modules, "h5py", None)
    with pytest.raises(ModuleNotFoundError, match=r"unienv-storage\[hdf5\]"):
        HDF5Storage.create(SPACE, 4, cache_path=str(tmp_path / "h.hdf5"))


@pytest.mark.parametrize("piece_size", [1, 3, 4])
def test_shrink_and_clear_after_extending_past_the_loaded_rows(tmp_path: Any, piece_size: int) -> None:
    # extend_length adds rows the loaded columns do not hold yet: shrinking or clearing over them must work
    from unienv_interface.backends import NumpyComputeBackend as NB
    space = BoxSpace(NB, -10, 10, np.float32, shape=(2,))
    d = os.path.join(tmp_path, "pq")
    st = ParquetStorage.create(space, capacity=None, cache_path=d, piece_size=piece_size)
    st.extend_length(2)
    st.set(slice(0, 2), np.ones((2, 2), np.float32))
    st.extend_length(2)
    st.shrink_length(1)
    assert len(st) == 3
    np.testing.assert_array_equal(st.get(slice(0, 3)), np.r_[np.ones((2, 2)), np.zeros((1, 2))])
    st.extend_length(3)
    st.dumps(d)
    st.close()
    back = ParquetStorage.load_from(d, space, read_only=False)
    np.testing.assert_array_equal(back.get(slice(0, 6)), np.r_[np.ones((2, 2)), np.zeros((4, 2))])
    back.clear()
    assert len(back) == 0
    back.close()


def test_piece_size_beyond_int64_is_a_format_error(tmp_path: Any) -> None:
    from unienv_interface.backends import NumpyComputeBackend as NB
    space = BoxSpace(NB, -1.0, 1.0, np.float32, shape=(3,))
    p = os.path.join(tmp_path, "pq")
    st = ParquetStorage.create(space, capacity=10, cache_path=p, piece_size=4)
    st.set(np.arange(10), np.zeros((10, 3), np.float32))
    st.close()
    meta = os.path.join(p, "_metadata.json")
    d = json.load(open(meta))
    d["piece_size"] = 2 ** 70
    json.dump(d, open(meta, "w"))
    exc = expect_error((StorageFormatError,), ParquetStorage.load_from, p, space)
    assert "piece_size" in str(exc)
