"""The native layout (issue 3 item 4): a DictStorage keeping every leaf in its own dtype. The shared SpaceStorage
contract over W1- and W2-like spaces, exact dtypes, no promotion warning, segments and writers across children,
persistence and bytes on disk."""
from __future__ import annotations

import json
import os
import warnings
from typing import Any, Optional

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from unienv_data.testing.conformance import StorageConformance, assert_tree_equal, expect_error, stack_tree  # noqa: E402

from unienv_data.storages.dict_storage import METADATA_FILE, DictStorage  # noqa: E402
from unienv_data.storages.flattened import FlattenedStorage, FlattenPromotionWarning  # noqa: E402
from unienv_data.storages.native_layout import (create_native_storage, is_image_leaf,  # noqa: E402
                                                load_native_storage, native_bytes_per_sample,
                                                native_layout_kwargs)
from unienv_data.storages.numpy_memmap import NumpyMemmapStorage  # noqa: E402
from unienv_data.storages.pytorch import PytorchTensorStorage  # noqa: E402
from unienv_interface.backends import NumpyComputeBackend as NB  # noqa: E402
from unienv_interface.backends.pytorch import PyTorchComputeBackend as TB  # noqa: E402
from unienv_interface.space import BinarySpace, BoxSpace, DictSpace, TextSpace  # noqa: E402

INF = float("inf")
# every test here fails on a promotion warning: the native layout must never promote
pytestmark = pytest.mark.filterwarnings("error::unienv_data.storages.flattened.FlattenPromotionWarning")


def _dt(backend: Any, name: str) -> Any:
    return getattr(torch, name) if backend is TB else np.dtype(name)


def w1_space(backend: Any = TB) -> DictSpace:
    f32 = _dt(backend, "float32")
    return DictSpace(backend, {
        "obs": BoxSpace(backend, -INF, INF, f32, shape=(64,)),
        "action": BoxSpace(backend, -1.0, 1.0, f32, shape=(8,)),
        "reward": BoxSpace(backend, -INF, INF, f32, shape=()),
        "terminated": BinarySpace(backend, ()),
    })


def w2_space(backend: Any = TB, hw: int = 8) -> DictSpace:
    """W1 plus an image uint8[hw, hw, 3] (W2 is 128x128; tests use small frames)."""
    sp = w1_space(backend)
    return DictSpace(backend, {**sp.spaces, "image": BoxSpace(backend, 0, 255, _dt(backend, "uint8"), shape=(hw, hw, 3))})


def mixed_space(backend: Any = TB) -> DictSpace:
    """Nested, every dtype family: two float32 leaves in different sub-dicts, int64 beyond 2**53, uint8 non-image,
    float64, two bools, a grayscale image and an image marked by metadata. (Int bounds are full-range or end at
    the dtype's limit: the conformance helpers build out-of-bounds values in float64.)"""
    return DictSpace(backend, {
        "obs": {"pos": BoxSpace(backend, -5.0, 5.0, _dt(backend, "float32"), shape=(3,)),
                "rgb": BoxSpace(backend, 0, 255, _dt(backend, "uint8"), shape=(4, 5, 3)),
                "gray": BoxSpace(backend, 0, 255, _dt(backend, "uint8"), shape=(4, 5, 1)),
                "depth": BoxSpace(backend, 0.0, 10.0, _dt(backend, "float32"), shape=(4, 5),
                                  metadata={"kind": "image"}),
                "ids": BoxSpace(backend, -INF, INF, _dt(backend, "int64"), shape=(2,)),
                "flags": BoxSpace(backend, 0, 7, _dt(backend, "uint8"), shape=(4,))},
        "action": BoxSpace(backend, -1.0, 1.0, _dt(backend, "float32"), shape=(2,)),
        "time": BoxSpace(backend, 0.0, 1e9, _dt(backend, "float64"), shape=()),
        "step": BoxSpace(backend, 0, 2 ** 63 - 1, _dt(backend, "int64"), shape=()),
        "terminated": BinarySpace(backend, ()),
        "truncated": BinarySpace(backend, (1,)),
    })


# ---------------------------------------------------------------------------------------------------- conformance
class _NativeConformance(StorageConformance):
    backend: Any = TB
    memmap = True
    shared = False
    supports_growable = True

    def create(self, tmp_path: Any, capacity: Optional[int]) -> DictStorage:
        cache = os.path.join(os.fspath(tmp_path), "native") if self.memmap else None
        return create_native_storage(self.space, capacity=capacity, cache_path=cache, multiprocessing=self.shared)

    def load(self, path: Any, read_only: bool) -> DictStorage:
        return load_native_storage(path, self.space, read_only=read_only)


class TestNativeW2TorchMemmap(_NativeConformance):
    shares_rows_when_pickled = True
    spawn_check = True

    def make_space(self) -> DictSpace:
        return w2_space()


class TestNativeW2TorchRAM(_NativeConformance):
    memmap = False

    def make_space(self) -> DictSpace:
        return w2_space()


class TestNativeW2TorchShared(_NativeConformance):
    memmap = False
    shared = True
    shares_rows_when_pickled = True

    def make_space(self) -> DictSpace:
        return w2_space()


class TestNativeW1NumpyMemmap(_NativeConformance):
    backend = NB
    shares_rows_when_pickled = True

    def make_space(self) -> DictSpace:
        return w1_space(NB)


class TestNativeW2NumpyRAM(_NativeConformance):
    backend = NB
    memmap = False

    def make_space(self) -> DictSpace:
        return w2_space(NB)


class TestNativeMixedTorchMemmap(_NativeConformance):
    shares_rows_when_pickled = True

    def make_space(self) -> DictSpace:
        return mixed_space()


class TestNativeMixedNumpyRAM(_NativeConformance):
    backend = NB
    memmap = False

    def make_space(self) -> DictSpace:
        return mixed_space(NB)


# ---------------------------------------------------------------------------------------------------- helpers
def rand_value(space: Any, seed: int = 0) -> Any:
    from unienv_data.testing.conformance import sample_from_space
    return sample_from_space(space, np.random.default_rng(seed))


def data_bytes(path: str) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            if not f.endswith((".json", ".log")):      # metadata (and DictStorage's commit log) are not rows
                total += os.path.getsize(os.path.join(root, f))
    return total


# ---------------------------------------------------------------------------------------------------- layout
class TestLayout:
    def test_w2_children(self) -> None:
        st = create_native_storage(w2_space(), capacity=4)
        assert set(st.storages) == {"@float32", "image", "terminated"}
        assert st.groups == {"@float32": ["action", "obs", "reward"]}
        group = st.get_column("@float32")
        assert isinstance(group, FlattenedStorage) and isinstance(group.inner_storage, PytorchTensorStorage)
        assert group.flat_space.shape == (73,) and group.flat_space.dtype == torch.float32
        assert isinstance(st.get_column("image"), PytorchTensorStorage)
        assert st.get_column("terminated").single_instance_space.dtype == torch.bool

    def test_w1_numpy_children(self) -> None:
        st = create_native_storage(w1_space(NB), capacity=4)
        assert set(st.storages) == {"@float32", "terminated"}
        assert isinstance(st.get_column("terminated"), NumpyMemmapStorage)
        assert isinstance(st.get_column("@float32").inner_storage, NumpyMemmapStorage)

    def test_mixed_children(self) -> None:
        kw = native_layout_kwargs(mixed_space())
        cls_map = kw["storage_cls_map"]
        assert kw["groups"] == {"@float32": ["action", "obs/pos"], "@int64": ["obs/ids", "step"]}
        for image in ("obs/rgb", "obs/gray", "obs/depth"):
            assert cls_map[image] is PytorchTensorStorage
        assert cls_map["obs/flags"] is PytorchTensorStorage  # the only non-image uint8 leaf: no flat row needed
        assert cls_map["time"] is PytorchTensorStorage
        assert cls_map["terminated"] is PytorchTensorStorage and cls_map["truncated"] is PytorchTensorStorage
        assert cls_map["@float32"] is FlattenedStorage

    def test_image_detection(self) -> None:
        assert is_image_leaf(BoxSpace(TB, 0, 255, torch.uint8, shape=(8, 8, 3)))
        assert is_image_leaf(BoxSpace(TB, 0, 255, torch.uint8, shape=(8, 8, 4)))
        assert not is_image_leaf(BoxSpace(TB, 0, 255, torch.uint8, shape=(8, 8, 2)))
        assert not is_image_leaf(BoxSpace(TB, 0, 255, torch.uint8, shape=(8,)))
        assert not is_image_leaf(BoxSpace(TB, 0.0, 1.0, torch.float32, shape=(8, 8, 3)))
        assert is_image_leaf(BoxSpace(TB, 0.0, 1.0, torch.float32, shape=(8, 8), metadata={"kind": "image"}))

    def test_group_name_avoids_space_keys(self) -> None:
        f32 = torch.float32
        sp = DictSpace(TB, {"@float32": BoxSpace(TB, 0.0, 1.0, f32, shape=(1,)),
                            "b": BoxSpace(TB, 0.0, 1.0, f32, shape=(2,))})
        st = create_native_storage(sp, capacity=3)
        assert set(st.storages) == {"@@float32"}
        v = rand_value(sp)
        st.set(0, v)
        assert_tree_equal(st.get(0), v)

    def test_text_and_bfloat16_leaves(self) -> None:
        sp = DictSpace(TB, {"note": TextSpace(TB, 5, charset="abc"),
                            "half": BoxSpace(TB, -1.0, 1.0, torch.bfloat16, shape=(2,)),
                            "x": BoxSpace(TB, 0.0, 1.0, torch.float32, shape=(2,))})
        kw = native_layout_kwargs(sp)
        assert kw["storage_cls_map"]["note"] is FlattenedStorage
        assert kw["storage_cls_map"]["half"] is PytorchTensorStorage
        st = create_native_storage(sp, capacity=2)
        v = {"note": "abca", "half": torch.tensor([0.5, -1.0], dtype=torch.bfloat16), "x": torch.tensor([0.25, 1.0])}
        st.set(1, v)
        got = st.get(1)
        assert got["note"] == "abca" and got["half"].dtype == torch.bfloat16
        assert torch.equal(got["half"], v["half"]) and torch.equal(got["x"], v["x"])

    def test_bad_arguments(self, tmp_path: Any) -> None:
        expect_error((TypeError,), create_native_storage, BoxSpace(TB, 0.0, 1.0, torch.float32, shape=(2,)), capacity=2)
        expect_error((ValueError,), create_native_storage, w2_space(), capacity=2, image_storage="png")
        try:
            create_native_storage(w2_space(), capacity=2, image_storage="video")
        except (ModuleNotFoundError, ValueError) as exc:
            assert "video" in str(exc)
        else:
            pytest.fail("image_storage='video' without cache_path must raise")


# ---------------------------------------------------------------------------------------------------- dtypes
class TestDtypes:
    def test_every_dtype_is_kept_and_nothing_promotes(self, tmp_path: Any) -> None:
        sp = mixed_space()
        with warnings.catch_warnings():
            warnings.simplefilter("error", FlattenPromotionWarning)
            st = create_native_storage(sp, capacity=4, cache_path=os.path.join(tmp_path, "n"))
        v = rand_value(sp, 1)
        big = torch.tensor([2 ** 53 + 1, -(2 ** 62) + 3], dtype=torch.int64)
        v["obs"]["ids"] = big
        v["step"] = torch.tensor(2 ** 62 - 1, dtype=torch.int64)
        v["time"] = torch.tensor(123456789.123456789, dtype=torch.float64)
        st.set(2, v)
        got = st.get(2)
        assert_tree_equal(got, v)
        assert got["obs"]["rgb"].dtype == torch.uint8 and got["terminated"].dtype == torch.bool
        assert got["truncated"].dtype == torch.bool and got["obs"]["ids"].dtype == torch.int64
        assert int(got["obs"]["ids"][0]) == 2 ** 53 + 1 and int(got["step"]) == 2 ** 62 - 1
        assert list(got) == ["action", "obs", "step", "terminated", "time", "truncated"]
        assert list(got["obs"]) == list(sp["obs"].keys())
        st.close()
        back = load_native_storage(os.path.join(tmp_path, "n"), sp)
        assert_tree_equal(back.get(2), v)
        back.close()

    def test_numpy_int64_survives(self) -> None:
        sp = mixed_space(NB)
        st = create_native_storage(sp, capacity=3)
        v = rand_value(sp, 2)
        v["step"] = np.array(2 ** 53 + 1, dtype=np.int64)
        st.set(0, v)
        assert int(st.get(0)["step"]) == 2 ** 53 + 1
        batch = st.get(np.array([0, 0]))
        assert batch["step"].dtype == np.int64 and batch["terminated"].dtype == np.bool_

    def test_uint8_image_is_not_cast(self) -> None:
        st = create_native_storage(w2_space(), capacity=3)
        v = rand_value(w2_space(), 3)
        v["image"] = torch.full((8, 8, 3), 255, dtype=torch.uint8)
        st.set(0, v)
        assert st.get(0)["image"].dtype == torch.uint8 and int(st.get(0)["image"].max()) == 255
        bad = dict(v, image=v["image"].float() + 0.7)
        expect_error((ValueError, TypeError), st.set, 1, bad)

    @pytest.mark.parametrize("backend", [NB, TB], ids=["numpy", "torch"])
    def test_refusals_from_one_leaf_children_name_the_key(self, backend: Any) -> None:
        # leaves kept in an array of their own (images, the only bool, the only int64) are named by their key path,
        # like the leaves of a flattened group, on every write path; nothing is written
        sp = mixed_space(backend)
        st = create_native_storage(sp, capacity=4)
        good = rand_value(sp, 0)
        st.set(0, good)
        asarray = (lambda a, dt: torch.as_tensor(a, dtype=dt)) if backend is TB else np.asarray
        wrong_shape = dict(good, obs=dict(good["obs"], rgb=asarray(np.zeros((3, 4, 5)), _dt(backend, "uint8"))))
        too_big = dict(good, obs=dict(good["obs"], rgb=asarray(np.full((4, 5, 3), 300), _dt(backend, "int32"))))
        for bad, words in ((wrong_shape, ["key 'obs/rgb'", "4, 5, 3)", "3, 4, 5)"]),
                           (too_big, ["key 'obs/rgb'", "300", "uint8"])):
            for write in (lambda v: st.set(1, v), lambda v: st.set(slice(1, 3), stack_tree([v, v]))):
                exc = expect_error((ValueError, TypeError), write, bad)
                assert all(w in str(exc) for w in words), str(exc)
            st.mark_segment_start(1)
            exc = expect_error((ValueError, TypeError), st.append, bad)
            assert "key 'obs/rgb'" in str(exc)
            st.abort_segment()
            writer = st.open_segment_writer()
            exc = expect_error((ValueError, TypeError), writer.append, bad)
            assert "key 'obs/rgb'" in str(exc)
            writer.abort()
        assert_tree_equal(st.get(0), good)
        st.close()


# ---------------------------------------------------------------------------------------------------- segments
class TestSegmentsAcrossChildren:
    def test_append_and_writers_record_the_same_segments_in_every_child(self) -> None:
        sp = w2_space()
        st = create_native_storage(sp, capacity=6)
        vals = [rand_value(sp, s) for s in range(5)]
        st.mark_segment_start(4)
        for v in vals[:3]:
            st.append(v)
        st.mark_segment_end()
        w1, w2 = st.open_segment_writer(), st.open_segment_writer()
        w1.append(vals[3])
        w2.append(vals[4])
        w2.commit(2)
        w1.commit(1)
        assert st.episode_segments() == [(1, 1), (2, 2), (4, 0)]   # position order
        for key, child in st.storages.items():
            assert child.episode_segments() == [(1, 1), (2, 2), (4, 0)], key
        assert_tree_equal(st.get(np.array([4, 5, 0, 1, 2])), stack_tree(vals[:3] + [vals[3], vals[4]]))

    def test_growable_appends_grow_every_child(self, tmp_path: Any) -> None:
        sp = w2_space()
        st = create_native_storage(sp, capacity=None, cache_path=os.path.join(tmp_path, "g"))
        vals = [rand_value(sp, s) for s in range(7)]
        st.mark_segment_start(0)
        for v in vals:
            st.append(v)
        st.mark_segment_end()
        assert len(st) == 7 and all(len(c) == 7 for c in st.storages.values())
        st.close()
        back = load_native_storage(os.path.join(tmp_path, "g"), sp)
        assert back.capacity is None and len(back) == 7 and back.episode_segments() == [(0, 6)]
        assert_tree_equal(back.get(slice(0, 7)), stack_tree(vals))
        back.close()


# ---------------------------------------------------------------------------------------------------- persistence
class TestPersistenceAndSize:
    def test_dumps_load_round_trip_with_plain_dict_storage_loader(self, tmp_path: Any) -> None:
        sp = w2_space()
        st = create_native_storage(sp, capacity=5)
        vals = [rand_value(sp, s) for s in range(5)]
        st.set(Ellipsis, stack_tree(vals))
        st.mark_segment_start(3)
        st.append(vals[0])
        st.append(vals[1])
        st.mark_segment_end()
        path = os.path.join(tmp_path, "dump")
        st.dumps(path)
        meta = json.load(open(os.path.join(path, METADATA_FILE)))
        assert meta["groups"] == {"@float32": ["action", "obs", "reward"]}
        assert sorted(meta["storage_map"]) == ["@float32", "image", "terminated"]
        back = DictStorage.load_from(path, sp)
        assert back.episode_segments() == [(3, 4)]
        assert_tree_equal(back.get(Ellipsis), st.get(Ellipsis))
        back.close()

    @pytest.mark.parametrize("backend", [TB, NB])
    def test_bytes_on_disk_are_the_native_bytes(self, tmp_path: Any, backend: Any) -> None:
        sp = w2_space(backend, hw=32)
        cap = 64
        path = os.path.join(tmp_path, "n")
        st = create_native_storage(sp, capacity=cap, cache_path=path)
        st.flush()
        native = native_bytes_per_sample(sp)
        assert native == 64 * 4 + 8 * 4 + 4 + 1 + 32 * 32 * 3
        on_disk = data_bytes(path)
        assert on_disk == cap * native, (on_disk, cap * native)
        meta_bytes = sum(os.path.getsize(os.path.join(r, f)) for r, _d, fs in os.walk(path) for f in fs
                         if f.endswith(".json"))
        # the metadata does not grow with the rows: a few copies of the space (whose Box bounds are written in
        # full shape, as unienv 0.0.1b16 reads them) plus the layout
        from unienv_interface.space.space_utils.serialization_utils import space_to_json
        space_json = len(json.dumps(space_to_json(sp)))
        assert meta_bytes <= 2 * space_json + 8192, (meta_bytes, space_json)
        st.close()

    def test_replay_buffer_over_the_native_layout(self, tmp_path: Any) -> None:
        from unienv_data.replay_buffer import ReplayBuffer
        sp = w2_space()
        rb = ReplayBuffer.create(DictStorage, sp, cache_path=os.path.join(tmp_path, "rb"), capacity=4,
                                 **native_layout_kwargs(sp))
        vals = [rand_value(sp, s) for s in range(6)]
        for episode in (vals[:3], vals[3:]):
            for v in episode:
                rb.append(v)
            rb.mark_segment_end()
        assert len(rb) == 4
        assert_tree_equal(rb.get_at(0), vals[2])
        rb.dumps(os.path.join(tmp_path, "rb"))
        back = ReplayBuffer.load_from(os.path.join(tmp_path, "rb"), backend=TB)
        assert_tree_equal(back.get_at(3), vals[5])
        back.close()
        rb.close()


# ---------------------------------------------------------------------------------------------------- video
class TestVideoOption:
    def test_video_images_or_a_clear_error(self, tmp_path: Any) -> None:
        sp = w2_space(hw=16)
        try:
            from unienv_data.storages.video_storage import VideoStorage  # noqa: F401
        except ImportError:
            exc = expect_error((ModuleNotFoundError,), create_native_storage, sp, capacity=4,
                               cache_path=os.path.join(tmp_path, "v"), image_storage="video")
            assert "video_storage" in str(exc) or "PyAV" in str(exc)
            return
        kw = native_layout_kwargs(sp, image_storage="video", video_kwargs={"fps": 10})
        assert kw["storage_cls_map"]["image"] is VideoStorage
        assert kw["key_kwargs"]["image"] == {"fps": 10}
        assert kw["storage_cls_map"]["@float32"] is FlattenedStorage
        # two cameras, lossless: exact frames, segments in every child, a bad frame in either camera writes nothing
        sp2 = DictSpace(TB, {**sp.spaces, "wrist": BoxSpace(TB, 0, 255, torch.uint8, shape=(16, 16, 3))})
        path = os.path.join(tmp_path, "v")
        st = create_native_storage(sp2, capacity=6, cache_path=path, image_storage="video",
                                   video_kwargs={"lossless": True})
        assert isinstance(st.get_column("image"), VideoStorage) and isinstance(st.get_column("wrist"), VideoStorage)
        vals = [rand_value(sp2, s) for s in range(4)]
        st.mark_segment_start(0)
        for v in vals[:3]:
            st.append(v)
        bad = dict(vals[3], wrist=vals[3]["wrist"][:8])
        expect_error((ValueError,), st.append, bad)
        assert all(c.pending_segment_length == 3 for c in st.storages.values())
        st.mark_segment_end()
        w = st.open_segment_writer()
        w.append(vals[3])
        expect_error((ValueError,), w.append, bad)
        w.commit(4)
        assert st.episode_segments() == [(0, 2), (4, 4)]
        assert_tree_equal(st.get(np.array([0, 1, 2, 4])), stack_tree(vals))
        before = st.get(Ellipsis)
        expect_error((ValueError,), st.set, 5, bad)
        assert_tree_equal(st.get(Ellipsis), before)
        st.close()
        back = load_native_storage(path, sp2)
        assert back.episode_segments() == [(0, 2), (4, 4)]
        assert_tree_equal(back.get(np.array([0, 1, 2, 4])), stack_tree(vals))
        back.close()


def test_a_grouped_leaf_is_a_column_and_a_misspelt_key_is_named(tmp_path: Any) -> None:
    from unienv_data.replay_buffer import ReplayBuffer
    sp = w2_space(NB)
    rb = ReplayBuffer.create(DictStorage, sp, cache_path=str(tmp_path / "rb"), capacity=8, **native_layout_kwargs(sp))
    assert "action" not in rb.storage.storages                 # it lives in the per-dtype group
    rows = []
    for t in range(3):
        row = {"obs": np.full(64, t, np.float32), "action": np.full(8, t / 10, np.float32),
               "reward": np.float32(t), "terminated": False, "image": np.full((8, 8, 3), t, np.uint8)}
        rows.append(row)
        rb.append(row)
    rb.mark_segment_end()
    action = rb.get_column("action")
    np.testing.assert_array_equal(action.get_at(slice(None)), np.stack([r["action"] for r in rows]))
    action.set_at(1, np.full(8, 0.5, np.float32))              # writes the field, keeps the group's other fields
    np.testing.assert_array_equal(rb.get_at(1)["action"], np.full(8, 0.5, np.float32))
    np.testing.assert_array_equal(rb.get_at(1)["obs"], rows[1]["obs"])
    with pytest.raises(KeyError, match="no column 'actions'"):
        rb.get_column("actions")
    # a misspelt key: both the missing and the unexpected key in one message
    bad = dict(rows[0])
    bad["actions"] = bad.pop("action")
    with pytest.raises(KeyError, match=r"missing key\(s\) \['action'\], unexpected key\(s\) \['actions'\]"):
        rb.append(bad)
    rb.close()
