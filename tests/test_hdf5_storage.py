"""HDF5Storage: the shared SpaceStorage contract (memory-mapped, chunked / compressed, growable, in memory; alone
and as FlattenedStorage's inner storage), plus file checks, column views, text leaves and reader processes."""
from __future__ import annotations

import json
import multiprocessing
import os
import pickle
from typing import Any, Optional

import numpy as np
import pytest

h5py = pytest.importorskip("h5py")

from unienv_data.testing.conformance import StorageConformance, expect_error  # noqa: E402

from unienv_data.base.errors import StorageFormatError, StorageNotFoundError, StorageStateError  # noqa: E402
from unienv_data.storages.flattened import FlattenedStorage  # noqa: E402
from unienv_data.storages.hdf5 import META_ATTR, HDF5Storage  # noqa: E402
from unienv_interface.backends import NumpyComputeBackend as NB  # noqa: E402
from unienv_interface.space import BinarySpace, BoxSpace, DictSpace, TextSpace  # noqa: E402

INF = float("inf")


def w1_like_space() -> DictSpace:
    return DictSpace(NB, {
        "obs": DictSpace(NB, {"pos": BoxSpace(NB, -INF, INF, np.float32, shape=(3,)),
                              "img": BoxSpace(NB, 0, 255, np.uint8, shape=(2, 2))}),
        "action": BoxSpace(NB, -1.0, 1.0, np.float32, shape=(2,)),
        "reward": BoxSpace(NB, -INF, INF, np.float64, shape=()),
        "done": BinarySpace(NB, ()),
    })


# ---------------------------------------------------------------------------------------------------- conformance
class _HDF5Conformance(StorageConformance):
    supports_growable = True
    options: dict = {}
    in_memory = False

    def make_space(self) -> Any:
        return w1_like_space()

    def create(self, tmp_path: Any, capacity: Optional[int]) -> Any:
        path = None if self.in_memory else os.path.join(os.fspath(tmp_path), "data.hdf5")
        return HDF5Storage.create(self.space, capacity, cache_path=path, **self.options)

    def dump_path(self, tmp_path: Any) -> str:
        return os.path.join(os.fspath(tmp_path), "dump.hdf5")

    def load(self, path: Any, read_only: bool) -> Any:
        return HDF5Storage.load_from(path, self.space, read_only=read_only)


class TestHDF5Dict(_HDF5Conformance):
    """Fixed capacity: contiguous, memory-mapped datasets; growable: chunked datasets."""


class TestHDF5Compressed(_HDF5Conformance):
    options = {"compression": "gzip", "compression_level": 4}


class TestHDF5ChunkedNoMmap(_HDF5Conformance):
    options = {"chunks": (2,), "use_mmap": False}

    def make_space(self) -> Any:
        return BoxSpace(NB, -50, 50, np.int16, shape=(2, 2))


class TestHDF5InMemory(_HDF5Conformance):
    in_memory = True

    def make_space(self) -> Any:
        return BinarySpace(NB, (4,))


@pytest.mark.filterwarnings("ignore::unienv_data.storages.flattened.FlattenPromotionWarning")
class TestFlattenedOverHDF5(StorageConformance):
    supports_growable = True

    def make_space(self) -> Any:
        return w1_like_space()

    def create(self, tmp_path: Any, capacity: Optional[int]) -> Any:
        return FlattenedStorage.create(self.space, HDF5Storage, capacity=capacity,
                                       cache_path=os.path.join(os.fspath(tmp_path), "flat"))

    def load(self, path: Any, read_only: bool) -> Any:
        return FlattenedStorage.load_from(path, self.space, read_only=read_only)


# ---------------------------------------------------------------------------------------------------- helpers
SPACE = DictSpace(NB, {"obs": BoxSpace(NB, -INF, INF, np.float32, shape=(2,)), "done": BinarySpace(NB, ())})


def _rows(n: int, start: int = 0) -> dict:
    obs = (np.arange(2 * n, dtype=np.float32).reshape(n, 2) + 2 * start)
    return {"obs": obs, "done": (np.arange(n) + start) % 2 == 1}


def _filled(path: Any, capacity: Optional[int] = 4, **kw: Any) -> HDF5Storage:
    st = HDF5Storage.create(SPACE, capacity, cache_path=str(path), **kw)
    if capacity is None:
        st.extend_length(4)
    st.set(slice(0, 4), _rows(4))
    return st


# ---------------------------------------------------------------------------------------------------- layout
def test_layout_is_one_dataset_per_leaf(tmp_path: Any) -> None:
    st = HDF5Storage.create(w1_like_space(), 5, cache_path=str(tmp_path / "a.hdf5"))
    assert sorted(st.memory_mapped_keys) == ["action", "done", "obs/img", "obs/pos", "reward"]
    st.close()
    with h5py.File(tmp_path / "a.hdf5", "r") as f:
        assert f["obs/pos"].shape == (5, 3) and f["obs/pos"].maxshape == (5, 3) and f["obs/pos"].chunks is None
        assert f["done"].dtype == np.bool_ and f["obs/img"].dtype == np.uint8
        meta = json.loads(f.attrs[META_ATTR])
        assert meta["capacity"] == 5 and meta["length"] == 5 and meta["format_version"] == 1
    box = HDF5Storage.create(BoxSpace(NB, 0, 1, np.float32, shape=(2,)), None, cache_path=str(tmp_path / "b.hdf5"),
                             compression="lzf")
    box.close()
    with h5py.File(tmp_path / "b.hdf5", "r") as f:
        assert list(f.keys()) == ["data"] and f["data"].maxshape == (None, 2) and f["data"].compression == "lzf"


def test_per_key_options_and_bad_options(tmp_path: Any) -> None:
    st = HDF5Storage.create(w1_like_space(), 6, cache_path=str(tmp_path / "a.hdf5"),
                            compression={"obs/img": "gzip", "*": None}, chunks={"obs": (3,)})
    assert "action" in st.memory_mapped_keys and "obs/img" not in st.memory_mapped_keys
    st.close()
    with h5py.File(tmp_path / "a.hdf5", "r") as f:
        assert f["obs/img"].compression == "gzip" and f["obs/img"].chunks == (3, 2, 2)
        assert f["obs/pos"].chunks == (3, 3) and f["action"].chunks is None
    expect_error((ValueError,), HDF5Storage.create, SPACE, 4, cache_path=str(tmp_path / "b.hdf5"), chunks=(5,))
    expect_error((ValueError,), HDF5Storage.create, SPACE, 4, cache_path=str(tmp_path / "c.hdf5"), compression="nope")
    expect_error((ValueError,), HDF5Storage.create, SPACE, 4, cache_path=str(tmp_path / "d.hdf5"), multiprocessing=True)
    expect_error((ValueError,), HDF5Storage.create, SPACE, 4, cache_path=str(tmp_path / "e.hdf5"), initial_capacity=2)
    torch = pytest.importorskip("torch")
    from unienv_interface.backends.pytorch import PyTorchComputeBackend as TB
    expect_error((TypeError,), HDF5Storage.create, BoxSpace(TB, 0, 1, torch.float32, shape=(2,)), 4,
                 cache_path=str(tmp_path / "f.hdf5"))


def test_batch_reads_restore_order_and_duplicates(tmp_path: Any) -> None:
    """Sorted / deduplicated reads for h5py, through every read path (memory map, span read, sparse selection)."""
    n = 5000
    data = {"obs": np.random.default_rng(0).standard_normal((n, 2)).astype(np.float32),
            "done": np.arange(n) % 3 == 0}
    for i, kw in enumerate(({}, {"use_mmap": False}, {"chunks": (64,)}, {"chunks": (64,), "reduce_io": False})):
        st = HDF5Storage.create(SPACE, n, cache_path=str(tmp_path / f"r{i}.hdf5"), **kw)
        st.set(slice(0, n), data)
        for idx in (np.array([4999, 3, 3, 17, 0, 4999]), np.array([10, 12, 11, 10]),
                    np.random.default_rng(1).integers(0, n, 300), np.arange(0, n, 7)[::-1], [-1, -n]):
            got = st.get(idx)
            np.testing.assert_array_equal(got["obs"], data["obs"][idx])
            np.testing.assert_array_equal(got["done"], data["done"][idx])
        got = st.get(slice(3, 4000, 9))
        np.testing.assert_array_equal(got["obs"], data["obs"][3:4000:9])
        st.set(np.array([7, 2, 7, 4000]), {"obs": np.full((4, 2), 9.0, np.float32) * np.arange(4)[:, None],
                                           "done": np.array([True, True, False, True])})
        assert st.get(7)["obs"].tolist() == [18.0, 18.0] and not st.get(7)["done"]
        st.close()


# ---------------------------------------------------------------------------------------------------- bad files
def test_capacity_mismatch_says_what_to_pass(tmp_path: Any) -> None:
    _filled(tmp_path / "f.hdf5").close()
    exc = expect_error((ValueError,), HDF5Storage.load_from, tmp_path / "f.hdf5", SPACE, capacity=5)
    assert "pass capacity=4" in str(exc)
    _filled(tmp_path / "g.hdf5", None).close()
    exc = expect_error((ValueError,), HDF5Storage.load_from, tmp_path / "g.hdf5", SPACE, capacity=4)
    assert "omit capacity" in str(exc)
    assert HDF5Storage.load_from(tmp_path / "g.hdf5", SPACE).capacity is None


def test_datasets_that_do_not_match_the_space(tmp_path: Any) -> None:
    _filled(tmp_path / "f.hdf5").close()
    wrong = DictSpace(NB, {"obs": BoxSpace(NB, -INF, INF, np.float64, shape=(2,)), "done": BinarySpace(NB, ()),
                           "extra": BoxSpace(NB, 0, 1, np.float32, shape=())})
    exc = expect_error((ValueError,), HDF5Storage.load_from, tmp_path / "f.hdf5", wrong)
    assert "'obs' holds float32[2]" in str(exc) and "float64[2]" in str(exc) and "no dataset 'extra'" in str(exc)
    subset = DictSpace(NB, {"obs": SPACE.spaces["obs"]})
    assert HDF5Storage.load_from(tmp_path / "f.hdf5", subset).get(1)["obs"].tolist() == [2.0, 3.0]
    exc = expect_error((ValueError,), HDF5Storage.load_from, tmp_path / "f.hdf5", subset, read_only=False)
    assert "read_only=True" in str(exc)
    bounded = DictSpace(NB, {"obs": BoxSpace(NB, -1.0, 1.0, np.float32, shape=(2,)), "done": BinarySpace(NB, ())})
    exc = expect_error((ValueError,), HDF5Storage.load_from, tmp_path / "f.hdf5", bounded)
    assert "bounds" in str(exc)
    with h5py.File(tmp_path / "f.hdf5", "r+") as f:
        del f["done"]
        f.create_dataset("done", shape=(3,), dtype=bool)
    exc = expect_error((StorageFormatError,), HDF5Storage.load_from, tmp_path / "f.hdf5", SPACE)
    assert "damaged" in str(exc)


def test_truncated_and_corrupted_files(tmp_path: Any) -> None:
    _filled(tmp_path / "f.hdf5").close()
    size = os.path.getsize(tmp_path / "f.hdf5")
    with open(tmp_path / "f.hdf5", "r+b") as f:
        f.truncate(size // 2)
    exc = expect_error((StorageFormatError,), HDF5Storage.load_from, tmp_path / "f.hdf5", SPACE)
    assert "truncated or corrupted" in str(exc)
    (tmp_path / "junk.hdf5").write_bytes(b"not an hdf5 file at all" * 10)
    expect_error((StorageFormatError,), HDF5Storage.load_from, tmp_path / "junk.hdf5", SPACE)
    expect_error((StorageNotFoundError,), HDF5Storage.load_from, tmp_path / "none.hdf5", SPACE)
    _filled(tmp_path / "m.hdf5").close()
    with h5py.File(tmp_path / "m.hdf5", "r+") as f:
        f.attrs[META_ATTR] = "{broken"
    expect_error((StorageFormatError,), HDF5Storage.load_from, tmp_path / "m.hdf5", SPACE)
    with h5py.File(tmp_path / "m.hdf5", "r+") as f:
        f.attrs[META_ATTR] = json.dumps({"format_version": 1, "capacity": 4, "length": 4, "segments": [[3, 9]]})
    expect_error((StorageFormatError,), HDF5Storage.load_from, tmp_path / "m.hdf5", SPACE)


def test_corrupted_compressed_chunk_is_a_clear_error(tmp_path: Any) -> None:
    st = HDF5Storage.create(SPACE, 64, cache_path=str(tmp_path / "c.hdf5"), compression="gzip", chunks=(64,))
    st.set(slice(0, 64), _rows(64))
    st.close()
    with h5py.File(tmp_path / "c.hdf5", "r") as f:
        off = f["obs"].id.get_chunk_info(0).byte_offset
    with open(tmp_path / "c.hdf5", "r+b") as f:
        f.seek(off)
        f.write(b"\xff" * 32)
    back = HDF5Storage.load_from(tmp_path / "c.hdf5", SPACE)
    expect_error((StorageFormatError,), back.get, slice(0, 8))


# ---------------------------------------------------------------------------------------------------- growth, text, views
def test_growable_file_is_trimmed_at_rest(tmp_path: Any) -> None:
    st = HDF5Storage.create(SPACE, None, cache_path=str(tmp_path / "g.hdf5"))
    st.mark_segment_start(0)
    for i in range(10):
        st.append({"obs": np.array([i, i], np.float32), "done": np.array(i == 9)})
    st.mark_segment_end()
    st.flush()      # a commit point: the state sidecar says 10 rows; the file keeps its spare rows until close
    assert HDF5Storage.load_from(tmp_path / "g.hdf5", SPACE).episode_segments() == [(0, 9)]
    st.close()
    with h5py.File(tmp_path / "g.hdf5", "r") as f:
        assert f["obs"].shape == (10, 2)
    back = HDF5Storage.load_from(tmp_path / "g.hdf5", SPACE)
    assert len(back) == 10 and back.episode_segments() == [(0, 9)]
    assert back.get(9)["done"]


def test_text_leaves(tmp_path: Any) -> None:
    space = DictSpace(NB, {"task": TextSpace(NB, max_length=12), "x": BoxSpace(NB, 0, 9, np.int32, shape=())})
    st = HDF5Storage.create(space, 3, cache_path=str(tmp_path / "t.hdf5"))
    st.set(0, {"task": "pick cube", "x": np.array(3, np.int32)})
    st.set(slice(1, 3), {"task": ["ünïcode", ""], "x": np.array([1, 2], np.int32)})
    assert st.get(0)["task"] == "pick cube"
    got = st.get([2, 1, 1])
    assert got["task"].tolist() == ["", "ünïcode", "ünïcode"] and got["x"].tolist() == [2, 1, 1]
    expect_error((ValueError,), st.set, 0, {"task": "x" * 13, "x": np.array(1, np.int32)})
    expect_error((TypeError,), st.set, 0, {"task": 5, "x": np.array(1, np.int32)})
    st.dumps(tmp_path / "u.hdf5")
    assert HDF5Storage.load_from(tmp_path / "u.hdf5", space).get(1)["task"] == "ünïcode"
    count, cap, inferred = HDF5Storage.build_space_from_hdf5_file(tmp_path / "u.hdf5")
    assert (count, cap) == (3, 3) and inferred == space


def test_column_views(tmp_path: Any) -> None:
    st = HDF5Storage.create(w1_like_space(), 4, cache_path=str(tmp_path / "a.hdf5"))
    pos = st.get_column(["obs", "pos"])
    obs = st.get_column("obs")
    assert len(pos) == 4 and pos.capacity == 4
    pos.set(slice(0, 2), np.ones((2, 3), np.float32))
    assert st.get(1)["obs"]["pos"].tolist() == [1.0, 1.0, 1.0]
    assert sorted(obs.get(0)) == ["img", "pos"]
    expect_error((StorageStateError,), pos.mark_segment_start, 0)
    expect_error((KeyError,), st.get_column, ["obs", "nope"])
    pos.dumps(tmp_path / "pos.hdf5")
    alone = HDF5Storage.load_from(tmp_path / "pos.hdf5", st.single_instance_space.spaces["obs"].spaces["pos"])
    assert alone.get(0).tolist() == [1.0, 1.0, 1.0]
    clone = pickle.loads(pickle.dumps(pos))
    assert clone.get(1).tolist() == [1.0, 1.0, 1.0] and not clone.is_mutable
    st.close()
    expect_error((StorageStateError,), pos.get, 0)


def test_build_space_from_reference_style_file(tmp_path: Any) -> None:
    with h5py.File(tmp_path / "raw.hdf5", "w") as f:
        f.create_dataset("obs", data=np.zeros((7, 3), np.float32), maxshape=(None, 3))
        f.create_dataset("done", data=np.zeros(7, bool), maxshape=(None,))
        g = f.create_group("info")
        g.create_dataset("step", data=np.arange(7, dtype=np.int64), maxshape=(None,))
        f.create_dataset("_private", data=np.zeros(2))
    count, cap, space = HDF5Storage.build_space_from_hdf5_file(str(tmp_path / "raw.hdf5"))
    assert count == 7 and cap is None
    assert isinstance(space, DictSpace) and sorted(space.spaces) == ["done", "info", "obs"]
    rb = HDF5Storage.load_replay_buffer_from_raw_hdf5(tmp_path / "raw.hdf5")
    assert len(rb) == 7 and rb[6]["info"]["step"] == 6


# ---------------------------------------------------------------------------------------------------- processes
def _child_reads(storage: Any, q: Any) -> None:
    try:
        q.put((storage.get(2)["obs"].tolist(), storage.is_mutable))
    except Exception as exc:  # noqa: BLE001 - reported to the parent
        q.put(repr(exc))


def test_pickled_copy_is_a_lazy_reader(tmp_path: Any) -> None:
    st = _filled(tmp_path / "f.hdf5", None)
    blob = pickle.dumps(st)
    clone = pickle.loads(blob)
    assert clone._file is None and not clone.is_mutable and clone.is_multiprocessing_safe
    assert clone.get(2)["obs"].tolist() == [4.0, 5.0]
    expect_error((StorageStateError,), clone.set, 0, {"obs": np.zeros(2, np.float32), "done": np.array(False)})
    clone.close()
    assert st.get(3)["obs"].tolist() == [6.0, 7.0]


@pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(), reason="needs fork")
def test_forked_child_reopens_read_only(tmp_path: Any) -> None:
    st = _filled(tmp_path / "f.hdf5")
    st.set(2, {"obs": np.array([40.0, 50.0], np.float32), "done": np.array(True)})
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_child_reads, args=(st, q))
    p.start()
    got = q.get(timeout=60)
    p.join(60)
    assert got == ([40.0, 50.0], False)
    st.set(3, {"obs": np.array([1.0, 1.0], np.float32), "done": np.array(False)})  # the parent still writes
    st.close()
    assert HDF5Storage.load_from(tmp_path / "f.hdf5", SPACE).get(3)["obs"].tolist() == [1.0, 1.0]


def test_multiprocessing_load_must_be_read_only(tmp_path: Any) -> None:
    _filled(tmp_path / "f.hdf5").close()
    expect_error((ValueError,), HDF5Storage.load_from, tmp_path / "f.hdf5", SPACE, read_only=False,
                 multiprocessing=True)
    st = HDF5Storage.load_from(tmp_path / "f.hdf5", SPACE, multiprocessing=True)
    assert st.is_multiprocessing_safe and st.get(1)["obs"].tolist() == [2.0, 3.0]


# ---------------------------------------------------------------------------------------------------- DictStorage
try:
    from unienv_data.storages.dict_storage import DictStorage
except ImportError:  # pragma: no cover - DictStorage is another module's work
    DictStorage = None  # type: ignore[assignment,misc]


@pytest.mark.skipif(DictStorage is None, reason="unienv_data.storages.dict_storage is not available")
class TestDictStorageOfFileFormats(StorageConformance):
    """The three file formats as children of one DictStorage (HDF5 for a sub-dict, NPZ for a leaf, Parquet for the
    rest)."""

    supports_growable = True

    def make_space(self) -> Any:
        pytest.importorskip("pyarrow")
        return DictSpace(NB, {"obs": DictSpace(NB, {"pos": BoxSpace(NB, -INF, INF, np.float32, shape=(3,))}),
                              "action": BoxSpace(NB, -1.0, 1.0, np.float32, shape=(2,)),
                              "reward": BoxSpace(NB, -INF, INF, np.float64, shape=()), "done": BinarySpace(NB, ())})

    def create(self, tmp_path: Any, capacity: Optional[int]) -> Any:
        from unienv_data.storages.npz_storage import NPZStorage
        from unienv_data.storages.parquet import ParquetStorage
        return DictStorage.create(self.space, {"obs": HDF5Storage, "action": NPZStorage, "*": ParquetStorage},
                                  capacity=capacity, cache_path=os.path.join(os.fspath(tmp_path), "dict"))

    def load(self, path: Any, read_only: bool) -> Any:
        return DictStorage.load_from(path, self.space, read_only=read_only)


_FLIP_SWEEP = r"""
import os, sys
import numpy as np
from unienv_interface.backends import NumpyComputeBackend as B
from unienv_interface.space import BinarySpace, BoxSpace, DictSpace
from unienv_data.storages.hdf5 import HDF5Storage
from unienv_data.base.errors import StorageFormatError
space = DictSpace(B, {"x": BoxSpace(B, -1.0, 1.0, np.float32, shape=(3,)), "done": BinarySpace(B, ()),
                      "n": DictSpace(B, {"i": BoxSpace(B, 0, 100, np.int64, shape=())})})
p = os.path.join(sys.argv[1], "a.hdf5")
st = HDF5Storage.create(space, capacity=10, cache_path=p)
st.extend_length(10)
st.close()
good = open(p, "rb").read()
outcomes = {}
for pos in range(0, min(len(good), 2048)):
    b = bytearray(good)
    b[pos] = 0xFF
    open(p, "wb").write(b)
    try:
        HDF5Storage.load_from(p, space).close()
        kind = "loaded"
    except StorageFormatError:
        kind = "format"
    except ValueError:
        kind = "mismatch"   # a damaged link can look like a missing dataset: named as a space mismatch
    except Exception as exc:
        kind = "BARE " + type(exc).__name__
    outcomes[kind] = outcomes.get(kind, 0) + 1
print(outcomes)
"""


def test_a_flipped_byte_in_the_file_structure_is_a_format_error(tmp_path: Any) -> None:
    """Every byte of the first 2 KiB (superblock, B-trees, heaps, object headers) set to 0xFF in turn: h5py's own
    RuntimeError / OSError / KeyError / TypeError / UnicodeDecodeError come out as StorageFormatError. Run in a
    child process: libhdf5 itself may crash or hang on some damage (docs/guarantees.md, HDF5 limits)."""
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-c", _FLIP_SWEEP, os.fspath(tmp_path)], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    outcomes = eval(out.stdout.strip().splitlines()[-1])  # noqa: S307 - our own child's printed dict
    assert not [k for k in outcomes if k.startswith("BARE")], outcomes
    assert outcomes.get("format", 0) > 0
