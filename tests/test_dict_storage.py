"""DictStorage: the shared SpaceStorage contract (torch and NumPy, memory-mapped, in RAM and in shared memory, flat
and nested spaces with an image-like uint8 leaf) and the behaviour specific to it (reference-api 5.3)."""
from __future__ import annotations

import gc
import json
import os
import pickle
from typing import Any, Dict, List, Optional

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from unienv_data.testing.conformance import (StorageConformance, assert_tree_equal, expect_error,  # noqa: E402
                         sample_from_space, stack_tree)

from unienv_data.base import SpaceStorage, StorageFormatError, StorageStateError, register_storage  # noqa: E402
from unienv_data.base.registry import resolve_storage_class  # noqa: E402
from unienv_data.storages.dict_storage import METADATA_FILE, DictStorage  # noqa: E402
from unienv_data.storages.flattened import FlattenedStorage  # noqa: E402
from unienv_data.storages.numpy_memmap import NumpyMemmapStorage  # noqa: E402
from unienv_data.storages.pytorch import PytorchTensorStorage  # noqa: E402
from unienv_interface.backends import NumpyComputeBackend as NB  # noqa: E402
from unienv_interface.backends.pytorch import PyTorchComputeBackend as TB  # noqa: E402
from unienv_interface.space import BinarySpace, BoxSpace, DictSpace  # noqa: E402

INF = float("inf")
# mixed-dtype residuals in flattened children are intended here (the native layout avoids them)
# values outside declared bounds are stored with a BoundsWarning by default; this file's refusal checks run in
# the refusal mode (the warning as an error), where they are refused like every other bad value
pytestmark = [pytest.mark.filterwarnings("ignore::unienv_data.storages.flattened.FlattenPromotionWarning"),
              pytest.mark.filterwarnings("error::unienv_data.base.errors.BoundsWarning")]


# ---------------------------------------------------------------------------------------------------- spaces
def nested_space(backend: Any = TB) -> DictSpace:
    """obs/{image u8[4,4,3], pos f32[3] in [-5, 5], count i32[2]}, action f32[2] in [-1, 1], done bool."""
    t = backend is TB
    return DictSpace(backend, {
        "obs": {"image": BoxSpace(backend, 0, 255, torch.uint8 if t else np.uint8, shape=(4, 4, 3)),
                "pos": BoxSpace(backend, -5.0, 5.0, torch.float32 if t else np.float32, shape=(3,)),
                "count": BoxSpace(backend, 0, 100, torch.int32 if t else np.int32, shape=(2,))},
        "action": BoxSpace(backend, -1.0, 1.0, torch.float32 if t else np.float32, shape=(2,)),
        "done": BinarySpace(backend, ()),
    })


def flat_space(backend: Any = TB) -> DictSpace:
    """The W1 step dict: obs f32[6] unbounded, action f32[2] in [-1, 1], reward f32, terminated bool."""
    f32 = torch.float32 if backend is TB else np.float32
    return DictSpace(backend, {
        "obs": BoxSpace(backend, -INF, INF, f32, shape=(6,)),
        "action": BoxSpace(backend, -1.0, 1.0, f32, shape=(2,)),
        "reward": BoxSpace(backend, -INF, INF, f32, shape=()),
        "terminated": BinarySpace(backend, ()),
    })


def array_cls(backend: Any) -> Any:
    return PytorchTensorStorage if backend is TB else NumpyMemmapStorage


def nested_routing(backend: Any = TB) -> Dict[str, Any]:
    """The image on its own, the rest of obs flattened, everything else flattened."""
    arr = array_cls(backend)
    return {"storage_cls_map": {"obs/image": arr, "obs/*": FlattenedStorage, "*": FlattenedStorage},
            "type_kwargs": {FlattenedStorage: {"inner_storage_cls": arr}}}


def per_key_routing(backend: Any = TB) -> Dict[str, Any]:
    """One array storage per leaf (the reference's typical per-key layout)."""
    arr = array_cls(backend)
    return {"storage_cls_map": {"obs": arr, "action": arr, "reward": arr, "terminated": arr}}


# ---------------------------------------------------------------------------------------------------- conformance
class _DictConformance(StorageConformance):
    backend: Any = TB
    memmap = True
    shared = False
    supports_growable = True
    routing = staticmethod(nested_routing)

    def make_space(self) -> DictSpace:
        return nested_space(self.backend)

    def create(self, tmp_path: Any, capacity: Optional[int]) -> DictStorage:
        cache = os.path.join(os.fspath(tmp_path), "ds") if self.memmap else None
        return DictStorage.create(self.space, capacity=capacity, cache_path=cache, multiprocessing=self.shared,
                                  **self.routing(self.backend))

    def load(self, path: Any, read_only: bool) -> DictStorage:
        return DictStorage.load_from(path, self.space, read_only=read_only)


class TestDictTorchNestedMemmap(_DictConformance):
    shares_rows_when_pickled = True
    spawn_check = True


class TestDictTorchNestedRAM(_DictConformance):
    memmap = False


class TestDictTorchNestedShared(_DictConformance):
    memmap = False
    shared = True
    shares_rows_when_pickled = True


class TestDictTorchPerKeyMemmap(_DictConformance):
    shares_rows_when_pickled = True
    routing = staticmethod(per_key_routing)

    def make_space(self) -> DictSpace:
        return flat_space(self.backend)


class TestDictNumpyNestedMemmap(_DictConformance):
    backend = NB
    shares_rows_when_pickled = True


class TestDictNumpyNestedRAM(_DictConformance):
    backend = NB
    memmap = False


class TestDictNumpyPerKeyRAM(_DictConformance):
    backend = NB
    memmap = False
    routing = staticmethod(per_key_routing)

    def make_space(self) -> DictSpace:
        return flat_space(self.backend)


class TestDictOfDictMemmap(_DictConformance):
    """A DictStorage child inside a DictStorage (the obs sub-dict is itself split per key)."""

    shares_rows_when_pickled = True

    @staticmethod
    def routing(backend: Any) -> Dict[str, Any]:  # type: ignore[override]
        arr = array_cls(backend)
        return {"storage_cls_map": {"obs": DictStorage, "*": FlattenedStorage},
                "key_kwargs": {"obs": {"storage_cls_map": {"image": arr, "*": FlattenedStorage}},
                               "*": {"inner_storage_cls": arr}},
                "type_kwargs": {DictStorage: {"type_kwargs": {FlattenedStorage: {"inner_storage_cls": arr}}}}}


# ---------------------------------------------------------------------------------------------------- a child of unknown type
@register_storage
class ListStorage(SpaceStorage[Any, Any, Any, Any, Any]):
    """A minimal storage of any space in a Python list (a child type DictStorage has no fast path for). Values are
    checked through `prepare_element`; `set` checks the whole batch before writing."""

    def __init__(self, space: Any, rows: List[Any], read_only: bool = False) -> None:
        super().__init__(space)
        self.rows = rows
        self._read_only = read_only
        from unienv_data.base.segments import SegmentLog
        self._log = SegmentLog(len(rows))

    @classmethod
    def create(cls, single_instance_space: Any, *args: Any, capacity: Optional[int] = None, cache_path: Any = None,
               multiprocessing: bool = False, **kwargs: Any) -> "ListStorage":
        zero = {k: torch.zeros_like(v) for k, v in sample_from_space(single_instance_space, np.random.default_rng(0)).items()}
        st = cls(single_instance_space, [zero] * int(capacity or 0))
        st._path = cache_path
        return st

    @classmethod
    def load_from(cls, path: Any, single_instance_space: Any, *, capacity: Optional[int] = None,
                  read_only: bool = True, multiprocessing: bool = False, **kwargs: Any) -> "ListStorage":
        with open(path, "rb") as f:
            rows, segs = pickle.load(f)
        st = cls(single_instance_space, rows, read_only)
        for s, n in segs:
            st._log.add(s, n)
        return st

    @property
    def capacity(self) -> Optional[int]:
        return len(self.rows)

    @property
    def is_mutable(self) -> bool:
        return not self._read_only

    def segment_log(self) -> Any:
        return self._log

    def clear(self) -> None:
        super().clear()
        self.rows = [{k: torch.zeros_like(v) for k, v in self.rows[0].items()}] * len(self.rows)

    def prepare_element(self, value: Any) -> Any:
        if not self.single_instance_space.contains(value):
            raise ValueError(f"ListStorage: {value!r} is not in the space")
        return {k: v.clone() for k, v in value.items()}

    def get(self, index: Any) -> Any:
        self._check_open()
        from unienv_data.base.indexing import normalize_index
        norm = normalize_index(index, len(self.rows))
        if norm.single is not None:
            return {k: v.clone() for k, v in self.rows[norm.single].items()}
        items = [self.rows[int(i)] for i in norm.positions()]
        if not items:
            return {k: v.unsqueeze(0)[:0].clone() for k, v in self.rows[0].items()}
        return {k: torch.stack([it[k] for it in items]) for k in self.rows[0]}

    def set(self, index: Any, value: Any) -> None:
        self.check_writable()
        from unienv_data.base.indexing import normalize_index
        norm = normalize_index(index, len(self.rows))
        if norm.single is not None:
            self.rows[norm.single] = self.prepare_element(value)
            return
        pos = norm.positions()
        items = [self.prepare_element({k: v[j] for k, v in value.items()}) for j in range(len(pos))]
        if any(v.shape[0] != len(pos) for v in value.values()):
            raise ValueError("batch of the wrong length")
        for p, it in zip(pos, items):
            self.rows[int(p)] = it

    def stack_prepared(self, items: List[Any]) -> Any:
        return items

    def set_prepared(self, index: Any, batch: Any) -> None:
        positions = np.arange(len(self.rows))[index] if isinstance(index, slice) else np.asarray(index)
        for p, it in zip(positions, batch):
            self.rows[int(p)] = it

    def dumps(self, path: Any) -> None:
        self._check_open()
        with open(path, "wb") as f:
            pickle.dump((self.rows, self._log.runs()), f)


@register_storage
class MappedListStorage(ListStorage):
    """Like ListStorage, but its segment writer is not a BufferedSegmentWriter (DictStorage then appends raw values)."""

    def open_segment_writer(self) -> Any:
        from unienv_data.base.segment_writer import BufferedSegmentWriter, MappedSegmentWriter
        self.check_writable()
        return MappedSegmentWriter(self, BufferedSegmentWriter(self), lambda v: v)


def _mapped_routing(backend: Any) -> Dict[str, Any]:
    return {"storage_cls_map": {"obs/image": PytorchTensorStorage, "obs/*": MappedListStorage, "*": FlattenedStorage},
            "key_kwargs": {"*": {"inner_storage_cls": PytorchTensorStorage}}}


class TestDictWithMappedWriterChild(_DictConformance):
    """A child whose writer takes raw values: DictStorage checks them through `prepare_element` first."""

    memmap = False
    supports_growable = False
    routing = staticmethod(_mapped_routing)

    def test_pickle_round_trip(self, tmp_path: Any) -> None:
        pytest.skip("the test child keeps rows in a Python list")

    @pytest.mark.parametrize("category", ["out of bounds", "NaN into bounded float leaf"])
    def test_stores_out_of_bounds_with_one_bounds_warning(self, tmp_path: Any, category: str) -> None:
        pytest.skip("the test child checks values with Space.contains, which refuses out-of-bounds values")


def _mixed_routing(backend: Any) -> Dict[str, Any]:
    return {"storage_cls_map": {"obs/image": PytorchTensorStorage, "obs/*": ListStorage, "*": FlattenedStorage},
            "key_kwargs": {"*": {"inner_storage_cls": PytorchTensorStorage}}}


class TestDictWithUnknownChildType(_DictConformance):
    """A child without a DictStorage fast path is checked through its `prepare_element` hook."""

    memmap = False
    supports_growable = False
    routing = staticmethod(_mixed_routing)

    def test_pickle_round_trip(self, tmp_path: Any) -> None:
        pytest.skip("the test child keeps rows in a Python list")

    @pytest.mark.parametrize("category", ["out of bounds", "NaN into bounded float leaf"])
    def test_stores_out_of_bounds_with_one_bounds_warning(self, tmp_path: Any, category: str) -> None:
        pytest.skip("the test child checks values with Space.contains, which refuses out-of-bounds values")


# ---------------------------------------------------------------------------------------------------- helpers
def make(space: Any = None, cache: Optional[str] = None, capacity: Optional[int] = 4, **routing: Any) -> DictStorage:
    space = space if space is not None else nested_space()
    return DictStorage.create(space, capacity=capacity, cache_path=cache, **(routing or nested_routing()))


def value(space: Any = None, seed: int = 0) -> Any:
    return sample_from_space(space if space is not None else nested_space(), np.random.default_rng(seed))


# ---------------------------------------------------------------------------------------------------- routing
class TestRouting:
    def test_children_get_the_routed_spaces(self) -> None:
        st = make()
        sp = nested_space()
        assert set(st.storages) == {"obs/image", "obs/*", "*"}
        assert st.get_column("obs/image").single_instance_space == sp["obs"]["image"]
        assert st.get_column(["obs", "image"]) is st.get_column("obs/image")
        residual_obs = st.get_column("obs/*").single_instance_space
        assert isinstance(residual_obs, DictSpace) and list(residual_obs.keys()) == ["count", "pos"]
        top = st.get_column("*").single_instance_space
        assert list(top.keys()) == ["action", "done"]
        assert st.storage_paths == {"obs/image": "obs.image.memmap", "obs/*": "obs._default", "*": "_default"}

    def test_star_alone_takes_everything_left(self) -> None:
        st = make(storage_cls_map={"obs/pos": PytorchTensorStorage, "*": FlattenedStorage},
                  key_kwargs={"*": {"inner_storage_cls": PytorchTensorStorage}})
        rest = st.get_column("*").single_instance_space
        assert list(rest.keys()) == ["action", "done", "obs"]
        assert list(rest["obs"].keys()) == ["count", "image"]

    def test_whole_sub_dict_key(self) -> None:
        st = make(storage_cls_map={"obs": FlattenedStorage, "action": PytorchTensorStorage, "done": PytorchTensorStorage},
                  key_kwargs={"obs": {"inner_storage_cls": PytorchTensorStorage}}, capacity=3)
        v = value()
        st.set(1, v)
        assert_tree_equal(st.get(1), v)

    def test_groups_take_leaves_from_anywhere(self, tmp_path: Any) -> None:
        sp = nested_space()
        st = DictStorage.create(sp, {"@f32": FlattenedStorage, "*": FlattenedStorage}, capacity=3,
                                cache_path=os.path.join(tmp_path, "g"), groups={"@f32": ["obs/pos", "action"]},
                                type_kwargs={FlattenedStorage: {"inner_storage_cls": PytorchTensorStorage}})
        gsp = st.get_column("@f32").single_instance_space
        assert list(gsp.keys()) == ["action", "obs"] and list(gsp["obs"].keys()) == ["pos"]
        v = value(sp, 3)
        st.set(2, v)
        assert_tree_equal(st.get(2), v)
        meta = json.load(open(os.path.join(tmp_path, "g", METADATA_FILE)))
        assert meta["groups"] == {"@f32": ["obs/pos", "action"]}
        st.close()
        back = DictStorage.load_from(os.path.join(tmp_path, "g"), sp)
        assert_tree_equal(back.get(2), v)
        back.close()

    def test_empty_sub_dict_round_trips(self) -> None:
        sp = DictSpace(TB, {"a": BoxSpace(TB, 0.0, 1.0, torch.float32, shape=(2,)), "b": {}})
        st = DictStorage.create(sp, {"*": FlattenedStorage}, capacity=2, inner_storage_cls=PytorchTensorStorage)
        v = {"a": torch.tensor([0.5, 1.0]), "b": {}}
        st.set(0, v)
        assert_tree_equal(st.get(0), v)
        expect_error((KeyError,), st.set, 1, {"a": v["a"]})

    def test_get_returns_space_key_order(self) -> None:
        st = make(storage_cls_map={"obs/*": FlattenedStorage, "done": PytorchTensorStorage,
                                   "action": PytorchTensorStorage},
                  key_kwargs={"obs/*": {"inner_storage_cls": PytorchTensorStorage}})
        got = st.get(0)
        assert list(got) == ["action", "done", "obs"]
        assert list(got["obs"]) == ["count", "image", "pos"]
        batch = st.get(slice(0, 2))
        assert list(batch) == ["action", "done", "obs"]

    def test_key_matching_nothing_raises(self) -> None:
        for bad in ("obs/camera", "nothing", "obs/pos/x", "nothing/*"):
            exc = expect_error((KeyError,), make, storage_cls_map={bad: PytorchTensorStorage, "*": FlattenedStorage},
                               key_kwargs={"*": {"inner_storage_cls": PytorchTensorStorage}})
            assert bad in str(exc)

    def test_wildcard_with_nothing_left_raises(self) -> None:
        exc = expect_error((KeyError,), make, storage_cls_map={"obs": FlattenedStorage, "obs/*": FlattenedStorage,
                                                               "*": FlattenedStorage},
                           type_kwargs={FlattenedStorage: {"inner_storage_cls": PytorchTensorStorage}})
        assert "obs/*" in str(exc)

    def test_unclaimed_leaf_raises(self) -> None:
        exc = expect_error((ValueError,), make, storage_cls_map={"obs/image": PytorchTensorStorage,
                                                                 "action": PytorchTensorStorage})
        for k in ("obs/pos", "obs/count", "done"):
            assert k in str(exc)

    def test_leaf_claimed_twice_raises(self) -> None:
        exc = expect_error((ValueError,), make, storage_cls_map={"obs": FlattenedStorage,
                                                                 "obs/image": PytorchTensorStorage,
                                                                 "*": FlattenedStorage},
                           type_kwargs={FlattenedStorage: {"inner_storage_cls": PytorchTensorStorage}})
        assert "obs/image" in str(exc)

    def test_bad_map_entries(self) -> None:
        expect_error((TypeError,), make, storage_cls_map={"*": dict})
        expect_error((ValueError,), make, storage_cls_map={})
        expect_error((ValueError,), make, storage_cls_map={"obs/*/x": FlattenedStorage, "*": FlattenedStorage})
        expect_error((KeyError,), make, storage_cls_map={"*": FlattenedStorage},
                     key_kwargs={"*": {"inner_storage_cls": PytorchTensorStorage}, "obs": {}})
        expect_error((TypeError,), DictStorage.create, BoxSpace(TB, 0.0, 1.0, torch.float32, shape=(2,)),
                     {"*": PytorchTensorStorage}, capacity=2)

    def test_key_containing_the_separator_is_refused(self) -> None:
        sp = DictSpace(TB, {"a/b": BoxSpace(TB, 0.0, 1.0, torch.float32, shape=(1,))})
        expect_error((ValueError,), DictStorage.create, sp, {"*": FlattenedStorage}, capacity=2,
                     inner_storage_cls=PytorchTensorStorage)
        st = DictStorage.create(sp, {"a/b": PytorchTensorStorage}, capacity=2, nested_separator=".")
        assert st.storage_paths == {"a/b": "a%2Fb.memmap"}

    def test_group_errors(self) -> None:
        kw = dict(type_kwargs={FlattenedStorage: {"inner_storage_cls": PytorchTensorStorage}})
        expect_error((ValueError,), make, storage_cls_map={"*": FlattenedStorage}, groups={"@g": ["action"]}, **kw)
        expect_error((KeyError,), make, storage_cls_map={"@g": FlattenedStorage, "*": FlattenedStorage},
                     groups={"@g": ["nope"]}, **kw)
        expect_error((ValueError,), make, storage_cls_map={"obs": FlattenedStorage, "*": FlattenedStorage},
                     groups={"obs": ["action"]}, **kw)

    def test_kwargs_merge_order(self) -> None:
        seen: Dict[str, Dict[str, Any]] = {}

        class Probe(PytorchTensorStorage):
            @classmethod
            def create(cls, space: Any, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
                seen[str(space.shape)] = dict(kwargs)
                kwargs.pop("tag", None)
                kwargs.pop("extra", None)
                return super().create(space, *args, **kwargs)

        sp = DictSpace(TB, {"a": BoxSpace(TB, 0.0, 1.0, torch.float32, shape=(1,)),
                            "b": BoxSpace(TB, 0.0, 1.0, torch.float32, shape=(2,))})
        DictStorage.create(sp, {"a": Probe, "b": Probe}, capacity=2, tag="kw",
                           type_kwargs={Probe: {"tag": "type", "extra": 1}}, key_kwargs={"b": {"tag": "key"}})
        assert seen["(1,)"]["tag"] == "type" and seen["(2,)"]["tag"] == "key"
        assert seen["(1,)"]["extra"] == 1 and seen["(1,)"]["capacity"] == 2


# ---------------------------------------------------------------------------------------------------- values
class TestValues:
    def test_missing_extra_and_misplaced_keys_name_the_key(self) -> None:
        st = make()
        v = value()
        before = st.get(Ellipsis)
        bad_missing = {**v, "obs": {k: x for k, x in v["obs"].items() if k != "pos"}}
        exc = expect_error((KeyError,), st.set, 0, bad_missing)
        assert "pos" in str(exc) and "obs" in str(exc)
        bad_extra = {**v, "obs": {**v["obs"], "depth": v["obs"]["pos"]}}
        exc = expect_error((KeyError,), st.set, 0, bad_extra)
        assert "depth" in str(exc)
        exc = expect_error((TypeError,), st.set, 0, {**v, "obs": v["obs"]["pos"]})
        assert "obs" in str(exc)
        assert_tree_equal(st.get(Ellipsis), before)

    def test_bad_leaf_in_one_child_writes_no_child(self) -> None:
        st = make()
        st.set(0, value(seed=1))
        before = st.get(Ellipsis)
        v = value(seed=2)
        bad = {**v, "done": torch.tensor(2)}  # the last child in the write order is the bad one
        expect_error((ValueError,), st.set, 0, bad)
        assert_tree_equal(st.get(Ellipsis), before)
        bad_img = {**v, "obs": {**v["obs"], "image": v["obs"]["image"].float() + 0.5}}
        expect_error((ValueError, TypeError), st.set, slice(0, 2), stack_tree([v, bad_img]))
        assert_tree_equal(st.get(Ellipsis), before)
        st.mark_segment_start(0)
        expect_error((ValueError,), st.append, bad)
        assert st.pending_segment_length == 0
        st.abort_segment()
        w = st.open_segment_writer()
        expect_error((ValueError,), w.append, bad)
        assert len(w) == 0 and all(len(cw) == 0 for cw in w.writers)  # type: ignore[attr-defined]
        w.abort()
        assert_tree_equal(st.get(Ellipsis), before)

    def test_unknown_child_refusing_writes_nothing(self) -> None:
        st = DictStorage.create(nested_space(), capacity=3, **_mixed_routing(TB))
        good = value(seed=1)
        st.set(0, good)
        before = st.get(Ellipsis)
        bad = {**value(seed=2), "obs": {**value(seed=2)["obs"], "pos": torch.full((3,), 9.0)}}
        expect_error((ValueError,), st.set, 1, bad)
        assert_tree_equal(st.get(Ellipsis), before)

    def test_flattened_accessors(self) -> None:
        st = make()
        v = [value(seed=s) for s in range(2)]
        st.set(slice(0, 2), stack_tree(v))
        flat = st.get_flattened(slice(0, 2))
        assert flat.shape[0] == 2 and flat.ndim == 2
        one = st.get_flattened(1)
        assert torch.equal(one, flat[1])
        st.set_flattened(3, one)
        assert_tree_equal(st.get(3), v[1])
        st.set_flattened([2, 3], flat)
        assert_tree_equal(st.get(slice(2, 4)), stack_tree(v))
        before = st.get(Ellipsis)
        bad_done = one.clone()
        bad_done[2] = 2.0  # the 'done' column (after action's two): not 0/1
        expect_error((ValueError,), st.set_flattened, 0, bad_done)
        bad_action = one.clone()
        bad_action[0] = 1.5  # 'action' is in [-1, 1]
        expect_error((ValueError,), st.set_flattened, 0, bad_action)
        expect_error((ValueError,), st.set_flattened, 0, flat)  # a batch for a single index
        assert_tree_equal(st.get(Ellipsis), before)


# ---------------------------------------------------------------------------------------------------- children
class TestChildren:
    def test_children_must_agree_on_capacity(self) -> None:
        sp = flat_space()
        kids = {k: PytorchTensorStorage.create(sp[k], capacity=4 if k != "reward" else 5) for k in sp.keys()}
        exc = expect_error((ValueError,), DictStorage, sp, kids)
        assert "capacity" in str(exc) and "reward" in str(exc)
        grow = {k: PytorchTensorStorage.create(sp[k], capacity=None) for k in sp.keys()}
        grow["obs"].extend_length(2)
        exc = expect_error((ValueError,), DictStorage, sp, grow)
        assert "length" in str(exc)

    def test_children_must_store_the_routed_space(self) -> None:
        sp = flat_space()
        kids = {k: PytorchTensorStorage.create(sp[k], capacity=4) for k in sp.keys()}
        kids["action"] = PytorchTensorStorage.create(BoxSpace(TB, -2.0, 2.0, torch.float32, shape=(2,)), capacity=4)
        exc = expect_error((ValueError,), DictStorage, sp, kids)
        assert "action" in str(exc)

    def test_close_and_gc_ownership(self) -> None:
        sp = flat_space()
        kids = {k: PytorchTensorStorage.create(sp[k], capacity=4) for k in sp.keys()}
        st = DictStorage(sp, kids)
        st.close()
        assert not any(k.is_closed for k in kids.values()), "a DictStorage around given children must not close them"
        st2 = DictStorage(sp, kids)
        del st2
        gc.collect()
        assert not any(k.is_closed for k in kids.values())
        own = make()
        col = own.get_column("obs/image")
        del own
        gc.collect()
        assert not col.is_closed, "garbage collection must not close a child still in use"
        col.get(0)
        made = make()
        made_kids = list(made.storages.values())
        made.close()
        assert all(k.is_closed for k in made_kids)

    def test_segments_stay_consistent_and_disagreement_is_reported(self) -> None:
        st = make(capacity=6)
        st.mark_segment_start(2)
        st.append(value())
        st.mark_segment_end()
        for child in st.storages.values():
            assert child.episode_segments() == [(2, 2)]
        st.get_column("obs/image").mark_segment_start(0)
        expect_error((StorageStateError,), lambda: st.has_open_segment)
        st.get_column("obs/image").abort_segment()
        st.get_column("*").forget_segments(2, 1)
        expect_error((StorageStateError,), st.episode_segments)

    def test_writer_commits_every_child_at_the_same_start(self) -> None:
        st = make(capacity=5)
        w = st.open_segment_writer()
        vals = [value(seed=s) for s in range(3)]
        for v in vals:
            w.append(v)
        w.commit(4)
        assert st.episode_segments() == [(4, 1)]
        for child in st.storages.values():
            assert child.episode_segments() == [(4, 1)]
        assert_tree_equal(st.get(np.array([4, 0, 1])), stack_tree(vals))

    def test_record_segment_reaches_every_child(self) -> None:
        st = make(capacity=5)
        st.record_segment(1, 2)
        assert st.episode_segments() == [(1, 2)]


# ---------------------------------------------------------------------------------------------------- persistence
class TestPersistence:
    def _dumped(self, tmp_path: Any) -> Any:
        st = make(capacity=4)
        vals = [value(seed=s) for s in range(4)]
        st.set(Ellipsis, stack_tree(vals))
        st.mark_segment_start(1)
        st.append(vals[1])
        st.mark_segment_end()
        path = os.path.join(tmp_path, "dump")
        st.dumps(path)
        return path, vals

    def test_metadata_layout(self, tmp_path: Any) -> None:
        path, _ = self._dumped(tmp_path)
        meta = json.load(open(os.path.join(path, METADATA_FILE)))
        assert meta["storage_type"] == "DictStorage" and meta["format_version"] == 1
        assert meta["nested_separator"] == "/" and meta["capacity"] == 4
        assert meta["storage_map"]["obs/image"] == {"type": "unienv_data.storages.pytorch.PytorchTensorStorage",
                                                    "path": "obs.image.memmap"}
        assert meta["storage_map"]["*"]["path"] == "_default"
        assert sorted(os.listdir(path)) == sorted(["_default", "obs._default", "obs.image.memmap",
                                                   "obs.image.memmap.meta.json", METADATA_FILE])

    def test_reference_style_metadata_loads(self, tmp_path: Any) -> None:
        path, vals = self._dumped(tmp_path)
        meta_file = os.path.join(path, METADATA_FILE)
        meta = json.load(open(meta_file))
        ref = {k: meta[k] for k in ("storage_type", "storage_map", "nested_separator")}
        json.dump(ref, open(meta_file, "w"))
        back = DictStorage.load_from(path, nested_space())
        assert_tree_equal(back.get(2), vals[2])
        back.close()

    def test_renamed_keys_are_refused(self, tmp_path: Any) -> None:
        path, _ = self._dumped(tmp_path)
        sp = nested_space()
        renamed = DictSpace(TB, {"obs": {"image": sp["obs"]["image"], "position": sp["obs"]["pos"],
                                         "count": sp["obs"]["count"]},
                                 "action": sp["action"], "done": sp["done"]})
        exc = expect_error((ValueError, KeyError), DictStorage.load_from, path, renamed)
        assert "pos" in str(exc)
        meta_file = os.path.join(path, METADATA_FILE)
        meta = json.load(open(meta_file))
        del meta["space"]
        json.dump(meta, open(meta_file, "w"))
        exc = expect_error((ValueError, KeyError), DictStorage.load_from, path, renamed)
        assert "pos" in str(exc)
        image_renamed = DictSpace(TB, {"obs": {"rgb": sp["obs"]["image"], "pos": sp["obs"]["pos"],
                                               "count": sp["obs"]["count"]},
                                       "action": sp["action"], "done": sp["done"]})
        exc = expect_error((KeyError,), DictStorage.load_from, path, image_renamed)
        assert "obs/image" in str(exc)

    def test_changed_bounds_are_refused_by_the_stored_space(self, tmp_path: Any) -> None:
        # same keys, dtypes and shapes (every child would open it): only the stored space tells them apart
        path, vals = self._dumped(tmp_path)
        sp = nested_space()
        wider = DictSpace(TB, {"obs": {"image": sp["obs"]["image"],
                                       "pos": BoxSpace(TB, -9.0, 9.0, torch.float32, shape=(3,)),
                                       "count": sp["obs"]["count"]},
                               "action": sp["action"], "done": sp["done"]})
        exc = expect_error((ValueError,), DictStorage.load_from, path, wider)
        assert "obs/pos" in str(exc) and "stored" in str(exc) and "given" in str(exc)
        back = DictStorage.load_from(path, nested_space())        # the space it was written with opens
        assert_tree_equal(back.get(2), vals[2])
        back.close()

    def test_damaged_groups_are_a_format_error(self, tmp_path: Any) -> None:
        # the space matches the stored one, so a storage map the space cannot route means damaged metadata
        from unienv_data.storages.native_layout import create_native_storage, load_native_storage
        sp = nested_space()
        path = os.path.join(tmp_path, "native")
        st = create_native_storage(sp, capacity=4, cache_path=path)
        st.dumps(path)
        st.close()
        meta_file = os.path.join(path, METADATA_FILE)
        meta = json.load(open(meta_file))
        assert meta["groups"]
        del meta["groups"]
        json.dump(meta, open(meta_file, "w"))
        exc = expect_error((StorageFormatError,), load_native_storage, path, sp)
        assert METADATA_FILE in str(exc) and "groups" in str(exc)

    def test_capacity_must_agree(self, tmp_path: Any) -> None:
        path, _ = self._dumped(tmp_path)
        exc = expect_error((ValueError,), DictStorage.load_from, path, nested_space(), capacity=3)
        assert "capacity=4" in str(exc)
        back = DictStorage.load_from(path, nested_space(), capacity=4)
        assert back.capacity == 4
        back.close()

    def test_hostile_metadata(self, tmp_path: Any) -> None:
        path, _ = self._dumped(tmp_path)
        meta_file = os.path.join(path, METADATA_FILE)
        good = json.load(open(meta_file))

        def load_with(meta: Any) -> None:
            with open(meta_file, "w") as f:
                f.write(meta if isinstance(meta, str) else json.dumps(meta))
            DictStorage.load_from(path, nested_space())

        for label, meta in [
            ("unknown class", {**good, "storage_map": {**good["storage_map"], "*": {"type": "os.system", "path": "_default"}}}),
            ("builtin name", {**good, "storage_map": {**good["storage_map"], "*": {"type": "builtins.dict", "path": "_default"}}}),
            ("path outside", {**good, "storage_map": {**good["storage_map"], "*": {"type": good["storage_map"]["*"]["type"], "path": "../../etc"}}}),
            ("absolute path", {**good, "storage_map": {**good["storage_map"], "*": {"type": good["storage_map"]["*"]["type"], "path": "/etc"}}}),
            ("entry not an object", {**good, "storage_map": {**good["storage_map"], "*": "FlattenedStorage"}}),
            ("wrong storage type", {**good, "storage_type": "FlattenedStorage"}),
            ("missing storage map", {k: v for k, v in good.items() if k != "storage_map"}),
            ("bad groups", {**good, "groups": {"@g": "action"}}),
            ("newer format", {**good, "format_version": 99}),
            ("truncated JSON", json.dumps(good)[:50]),
            ("not an object", "[1, 2]"),
        ]:
            try:
                exc = expect_error((StorageFormatError,), load_with, meta)
            except BaseException as e:  # noqa: BLE001
                raise AssertionError(f"{label}: {e}") from None
            assert str(exc)
        os.remove(meta_file)
        expect_error((FileNotFoundError,), DictStorage.load_from, path, nested_space())
        expect_error((FileNotFoundError,), DictStorage.load_from, os.path.join(tmp_path, "nope"), nested_space())

    def test_load_reconciles_children_that_disagree(self, tmp_path: Any) -> None:
        path, _ = self._dumped(tmp_path)
        back = DictStorage.load_from(path, nested_space(), read_only=False)
        back.durable = False    # a durable segment end would persist it in every child at once
        back.mark_segment_start(2)
        back.append(value(seed=9))
        back.mark_segment_end()
        back.get_column("obs/image").flush()  # only one child saw the new segment when "the process died"
        image = back.get_column("obs/image")
        assert image.episode_segments() == [(1, 1), (2, 2)]
        again = DictStorage.load_from(path, nested_space())
        assert again.episode_segments() == [(1, 1)]
        again.close()

    def test_create_with_cache_path_reopens(self, tmp_path: Any) -> None:
        d = os.path.join(tmp_path, "own")
        st = make(cache=d, capacity=3)
        assert st.cache_filename == d
        v = value(seed=4)
        st.set(1, v)
        st.mark_segment_start(0)
        st.append(v)
        st.mark_segment_end()
        st.flush()
        back = DictStorage.load_from(d, nested_space())
        assert_tree_equal(back.get(1), v)
        assert back.episode_segments() == [(0, 0)]
        back.close()
        st.close()

    def test_in_memory_cache_filename_is_none(self) -> None:
        assert make().cache_filename is None

    def test_get_column_unknown_key(self) -> None:
        st = make()
        exc = expect_error((KeyError,), st.get_column, "obs/pos")
        assert "obs/image" in str(exc)

    def test_registry_resolves_dict_storage(self) -> None:
        assert resolve_storage_class("unienv_data.storages.dict_storage.DictStorage") is DictStorage

    def test_read_only_flags(self, tmp_path: Any) -> None:
        path, _ = self._dumped(tmp_path)
        ro = DictStorage.load_from(path, nested_space())
        assert not ro.is_mutable and ro.is_multiprocessing_safe
        ro.close()


# ---------------------------------------------------------------------------------------------------- metadata routing
from unienv_data.storages.metadata_routing import (backend_array_storage, create_dict_storage_from_space,  # noqa: E402
                                                   default_image_storage, dict_storage_kwargs_from_space)


def camera_space(backend: Any = TB) -> DictSpace:
    t = backend is TB
    u8 = torch.uint8 if t else np.uint8
    f32 = torch.float32 if t else np.float32
    return DictSpace(backend, {
        "obs": {"cam": BoxSpace(backend, 0, 255, u8, shape=(4, 5, 3), metadata={"kind": "image"}),
                "mask": BoxSpace(backend, 0, 255, u8, shape=(4, 5), metadata={"kind": "image"}),
                "state": BoxSpace(backend, -1.0, 1.0, f32, shape=(3,))},
        "wrist": BoxSpace(backend, 0, 255, u8, shape=(4, 5, 3), metadata={"kind": "image"}),
        "action": BoxSpace(backend, -1.0, 1.0, f32, shape=(2,)),
    })


class TestMetadataRouting:
    def test_images_by_kind_rest_to_star(self) -> None:
        sp = camera_space()
        kw = dict_storage_kwargs_from_space(sp, kind_storage_cls={"image": PytorchTensorStorage})
        assert kw["nested_separator"] == "/"
        assert kw["storage_cls_map"] == {"obs/cam": PytorchTensorStorage, "wrist": PytorchTensorStorage,
                                         "*": FlattenedStorage}
        assert kw["key_kwargs"] == {"*": {"inner_storage_cls": PytorchTensorStorage}}  # (H, W) mask: not (H, W, 3)

    def test_default_image_class(self) -> None:
        cls = default_image_storage(camera_space())
        try:
            from unienv_data.storages.image_storage import ImageStorage
        except ImportError:
            assert cls is PytorchTensorStorage
        else:
            assert cls is ImageStorage
        assert backend_array_storage(camera_space(NB)) is NumpyMemmapStorage

    def test_key_routing_kwargs_and_default_override(self) -> None:
        sp = camera_space()
        kw = dict_storage_kwargs_from_space(
            sp, kind_storage_cls={"image": PytorchTensorStorage}, key_storage_cls={"obs": FlattenedStorage},
            default_storage_cls=PytorchTensorStorage, kind_kwargs={"image": {"is_memmap": False}},
            key_kwargs={"obs": {"inner_storage_cls": PytorchTensorStorage}}, nested_separator=".")
        assert kw["storage_cls_map"] == {"wrist": PytorchTensorStorage, "obs": FlattenedStorage,
                                         "*": PytorchTensorStorage}
        assert kw["key_kwargs"] == {"wrist": {"is_memmap": False}, "obs": {"inner_storage_cls": PytorchTensorStorage}}
        assert kw["nested_separator"] == "."
        expect_error((KeyError,), dict_storage_kwargs_from_space, sp, key_kwargs={"nope": {}})
        expect_error((TypeError,), dict_storage_kwargs_from_space, BoxSpace(TB, 0.0, 1.0, torch.float32, shape=(1,)))

    def test_no_star_when_nothing_is_left(self) -> None:
        sp = DictSpace(TB, {"cam": BoxSpace(TB, 0, 255, torch.uint8, shape=(4, 5, 3), metadata={"kind": "image"})})
        kw = dict_storage_kwargs_from_space(sp, kind_storage_cls={"image": PytorchTensorStorage})
        assert kw["storage_cls_map"] == {"cam": PytorchTensorStorage}

    @pytest.mark.parametrize("backend", [TB, NB])
    def test_create_in_memory_round_trip(self, backend: Any) -> None:
        sp = camera_space(backend)
        st = create_dict_storage_from_space(sp, capacity=3)
        assert isinstance(st.get_column("obs/cam"), array_cls(backend))
        v = value(sp, 5)
        st.set(1, v)
        assert_tree_equal(st.get(1), v)

    def test_create_on_disk_round_trip(self, tmp_path: Any) -> None:
        sp = camera_space()
        path = os.path.join(tmp_path, "r")
        st = create_dict_storage_from_space(sp, capacity=3, cache_path=path,
                                           kind_storage_cls={"image": PytorchTensorStorage})
        v = value(sp, 6)
        st.set(2, v)
        st.close()
        back = DictStorage.load_from(path, sp)
        assert_tree_equal(back.get(2), v)
        back.close()


def test_prepare_single_checks_without_segment_state() -> None:
    """Composite owners may check a sample through `prepare_element` at any time (no open segment needed)."""
    st = DictStorage.create(nested_space(), capacity=3, **TestDictOfDictMemmap.routing(TB))
    v = value(seed=1)
    prepared = st.prepare_element(v)
    assert_tree_equal(prepared, v)
    v["obs"]["pos"].add_(1.0)
    assert not torch.equal(prepared["obs"]["pos"], v["obs"]["pos"]), "the prepared sample must be a snapshot"
    expect_error((ValueError,), st.prepare_element, {**v, "obs": {**v["obs"], "pos": torch.full((3,), 9.0)}})
    expect_error((KeyError,), st.prepare_element, {**v, "extra": v["done"]})


# ---------------------------------------------------------------------------------------------------- staging protocol
class PlainRows(SpaceStorage[Any, Any, Any, Any, Any]):
    """Rows of a Box / Binary space kept by an array storage, but a storage of its own type that implements none of
    the staging methods (the `SpaceStorage` defaults: a dry check through the shared conversion rules)."""

    def __init__(self, space: Any, capacity: int) -> None:
        super().__init__(space)
        self.rows = array_cls(space.backend).create(space, capacity=capacity)

    @property
    def capacity(self) -> Optional[int]:
        return self.rows.capacity

    def segment_log(self) -> Any:
        return self.rows.segment_log()

    def get(self, index: Any) -> Any:
        return self.rows.get(index)

    def set(self, index: Any, value: Any) -> None:
        self.check_writable()
        self.rows.set(index, value)

    def dumps(self, path: Any) -> None:
        self.rows.dumps(path)


def _box(backend: Any = TB, shape: Any = (3,)) -> BoxSpace:
    return BoxSpace(backend, -1.0, 1.0, torch.float32 if backend is TB else np.float32, shape=shape)


class TestStagingProtocol:
    """`stage_set` / `stage_append` / `open_staged_writer`: check now (nothing written on error), write when called."""

    @pytest.mark.parametrize("make_child", ["array", "flattened", "flattened-over-plain", "plain", "dict"])
    def test_stage_checks_now_and_writes_later(self, make_child: str) -> None:
        sp = _box()
        if make_child == "array":
            st: SpaceStorage = PytorchTensorStorage.create(sp, capacity=4)
            good, bad = torch.full((3,), 0.5), torch.full((3,), 2.0)
        elif make_child == "plain":
            st = PlainRows(sp, 4)
            good, bad = torch.full((3,), 0.5), torch.full((3,), 2.0)
        else:
            dsp = DictSpace(TB, {"a": sp, "b": BinarySpace(TB, ())})
            if make_child == "flattened":
                st = FlattenedStorage.create(dsp, PytorchTensorStorage, capacity=4)
            elif make_child == "flattened-over-plain":
                st = FlattenedStorage(dsp, PlainRows(FlattenedStorage.create(dsp, PytorchTensorStorage, capacity=1)
                                                     .flat_space, 4), "inner")
            else:
                st = DictStorage.create(dsp, {"a": PytorchTensorStorage, "b": PytorchTensorStorage}, capacity=4)
            good = {"a": torch.full((3,), 0.5), "b": torch.tensor(True)}
            bad = {"a": torch.full((3,), 2.0), "b": torch.tensor(True)}
        before = st.get(Ellipsis)
        expect_error((ValueError,), st.stage_set, 1, bad)
        expect_error((IndexError,), st.stage_set, 9, good)
        write = st.stage_set(1, good)
        assert_tree_equal(st.get(Ellipsis), before)  # staged, not yet written
        write()
        assert_tree_equal(st.get(1), good)
        batch = stack_tree([good, good])
        expect_error((ValueError,), st.stage_set, slice(2, 4), stack_tree([good, bad]))
        st.stage_set(np.array([3, 2]), batch)()
        assert_tree_equal(st.get(np.array([2, 3])), batch)
        # appends check the segment state as well
        expect_error((StorageStateError,), st.stage_append, good)
        st.mark_segment_start(0)
        expect_error((ValueError,), st.stage_append, bad)
        append = st.stage_append(good)
        assert st.pending_segment_length == 0
        append()
        assert st.pending_segment_length == 1
        st.mark_segment_end()
        assert st.episode_segments() == [(0, 0)]
        # a staged writer append: nothing buffered on error
        writer, stage = st.open_staged_writer()
        expect_error((ValueError,), stage, bad)
        assert len(writer) == 0
        stage(good)()
        assert len(writer) == 1
        writer.commit(3)
        assert (3, 3) in (st.episode_segments() or [])

    def test_what_checks_everything(self) -> None:
        sp = DictSpace(TB, {"a": _box(), "b": BinarySpace(TB, ())})
        assert PytorchTensorStorage.create(_box(), capacity=2).staging_checks_all
        assert FlattenedStorage.create(sp, PytorchTensorStorage, capacity=2).staging_checks_all
        assert not PlainRows(_box(), 2).staging_checks_all
        mixed = DictStorage(sp, {"a": PlainRows(_box(), 2), "b": PytorchTensorStorage.create(BinarySpace(TB, ()), capacity=2)})
        assert not mixed.staging_checks_all
        # children that may still refuse when written are staged and written first
        assert isinstance(mixed._stager.parts[0][0], PlainRows)

    def test_two_children_on_the_defaults_refuse_before_either_writes(self) -> None:
        """The defaults check Box / Binary values with the shared conversion rules, so a second such child refusing
        its part stops the write before the first one wrote (as two video cameras do)."""
        sp = DictSpace(TB, {"a": _box(), "b": _box(shape=(2,))})
        st = DictStorage(sp, {"a": PlainRows(_box(), 3), "b": PlainRows(_box(shape=(2,)), 3)})
        good = {"a": torch.zeros(3), "b": torch.zeros(2)}
        bad = {"a": torch.full((3,), 0.5), "b": torch.full((2,), 2.0)}
        before = st.get(Ellipsis)
        expect_error((ValueError,), st.set, 0, bad)
        expect_error((ValueError,), st.set, slice(0, 2), stack_tree([good, bad]))
        assert_tree_equal(st.get(Ellipsis), before)
        st.mark_segment_start(0)
        st.append(good)
        expect_error((ValueError,), st.append, bad)
        assert all(c.pending_segment_length == 1 for c in st.storages.values())
        st.mark_segment_end()
        w = st.open_segment_writer()
        expect_error((ValueError,), w.append, bad)
        w.append(good)
        w.commit(1)
        assert st.episode_segments() == [(0, 0), (1, 1)]

    def test_one_index_normalisation_serves_every_child(self) -> None:
        from unienv_data.base.indexing import normalize_index
        st = make(capacity=4)
        v = stack_tree([value(seed=1), value(seed=2)])
        norm = normalize_index(np.array([-1, 0]), len(st))
        st.stage_set(norm, v)()
        assert_tree_equal(st.get(np.array([3, 0])), v)

    def test_dict_storage_uses_only_the_staging_protocol(self) -> None:
        """DictStorage writes its children through `stage_set` / `stage_append` / `open_staged_writer` only: no private
        internals of particular child types."""
        import inspect

        from unienv_data.storages import _dict_routing, _dict_staging, dict_storage
        for mod in (dict_storage, _dict_staging, _dict_routing):
            src = inspect.getsource(mod)
            for name in ("_conv", "_plan", "_fast", "write_rows_with", "_append_via", "write_checked_rows",
                         "append_checked_row", "ArrayStorageBase", "FlattenedStorage"):
                assert name not in src, f"{mod.__name__} uses {name}"

    def test_state_errors_name_the_dict_storage(self) -> None:
        st = make(capacity=3)
        exc = expect_error((StorageStateError,), st.append, value())
        assert "DictStorage" in str(exc) and "mark_segment_start" in str(exc)
        st.get_column("obs/image").mark_segment_start(0)
        exc = expect_error((StorageStateError,), st.append, value())
        assert "disagree" in str(exc)
