"""The compiled single-sample paths of FlattenedStorage (storages/_flat_codec.py) against the generic rules.

Differential: every input below is appended through the compiled appender and packed by the generic per-leaf path
(`FlatRowPlan._put`, i.e. `LeafConverter.convert` + the row-cast check); both must store the same row bytes, or both
must refuse with the same error type and message, and a refused append must leave rows and segment state unchanged.
Plus the plumbing: close / pickle / subclasses / non-dict mappings / slice reads as views of one copy.
"""
from __future__ import annotations

import pickle
import warnings
from collections import OrderedDict
from typing import Any, Callable, Dict, List, Tuple

import numpy as np
import pytest

torch = pytest.importorskip("torch")

# values outside declared bounds are stored with a BoundsWarning by default; this file's refusal checks run in
# the refusal mode (the warning as an error), where they are refused like every other bad value
pytestmark = pytest.mark.filterwarnings("error::unienv_data.base.errors.BoundsWarning")

from unienv_data.base.errors import StorageClosedError  # noqa: E402
from unienv_data.storages.flattened import FlattenedStorage, FlattenPromotionWarning  # noqa: E402
from unienv_data.storages.numpy_memmap import NumpyMemmapStorage  # noqa: E402
from unienv_data.storages.pytorch import PytorchTensorStorage  # noqa: E402
from unienv_interface.backends import NumpyComputeBackend as NB  # noqa: E402
from unienv_interface.backends.pytorch import PyTorchComputeBackend as TB  # noqa: E402
from unienv_interface.space import BinarySpace, BoxSpace, DictSpace  # noqa: E402

INF = float("inf")
NAN = float("nan")
I64 = np.iinfo(np.int64)


def torch_space() -> DictSpace:
    return DictSpace(TB, {
        "obs": BoxSpace(TB, -INF, INF, torch.float32, shape=(4,)),
        "action": BoxSpace(TB, -1.0, 1.0, torch.float32, shape=(3,)),
        "reward": BoxSpace(TB, -INF, INF, torch.float32, shape=()),
        "level": BoxSpace(TB, -10, 10, torch.int16, shape=()),
        "grid": BoxSpace(TB, 0.0, 2.0, torch.float32, shape=(2, 3)),
        "wide": BoxSpace(TB, np.arange(70.0) - 80, np.arange(70.0), torch.float32, shape=(70,)),
        "pix": BoxSpace(TB, 0, 255, torch.uint8, shape=(2,)),
        "done": BinarySpace(TB, ()),
    })


def numpy_space() -> DictSpace:
    return DictSpace(NB, {
        "obs": BoxSpace(NB, -INF, INF, np.float32, shape=(4,)),
        "action": BoxSpace(NB, -1.0, 1.0, np.float32, shape=(3,)),
        "reward": BoxSpace(NB, -INF, INF, np.float32, shape=()),
        "level": BoxSpace(NB, -10, 10, np.int16, shape=()),
        "count": BoxSpace(NB, I64.min, I64.max, np.int64, shape=(2,)),      # needs the float64 row-cast check
        "done": BinarySpace(NB, ()),
    })


def torch_good() -> Dict[str, Any]:
    return {"obs": torch.tensor([0.5, -2.0, 1e30, NAN]), "action": torch.tensor([-1.0, 0.25, 1.0]),
            "reward": torch.tensor(-3.5), "level": torch.tensor(7, dtype=torch.int16),
            "grid": torch.tensor([[0.0, 1.0, 2.0], [0.5, 1.5, 2.0]]), "wide": torch.arange(70.0) - 1,
            "pix": torch.tensor([0, 255], dtype=torch.uint8), "done": torch.tensor(True)}


def numpy_good() -> Dict[str, Any]:
    return {"obs": np.array([0.5, -2.0, 1e30, NAN], np.float32), "action": np.array([-1.0, 0.25, 1.0], np.float32),
            "reward": np.float32(-3.5), "level": np.int16(-10), "count": np.array([2 ** 40, -5], np.int64),
            "done": np.bool_(False)}


def _with(base: Callable[[], Dict[str, Any]], **changes: Any) -> Dict[str, Any]:
    v = base()
    v.update(changes)
    return v


def torch_cases() -> List[Tuple[str, Dict[str, Any]]]:
    g = torch_good
    col = torch.tensor([[0.1, 9.0], [0.2, 9.0], [-0.3, 9.0]])[:, 0]            # non-contiguous
    grad = torch.tensor([0.1, 0.2, 0.3], requires_grad=True)
    return [
        ("exact", g()),
        ("non-contiguous action", _with(g, action=col)),
        ("non-contiguous obs", _with(g, obs=torch.arange(8.0)[::2])),
        ("transposed grid", _with(g, grid=torch.tensor([[0.0, 0.5], [1.0, 1.5], [2.0, 2.0]]).T)),
        ("grad action", _with(g, action=grad)),
        ("grad obs", _with(g, obs=torch.ones(4, requires_grad=True))),
        ("grad reward", _with(g, reward=torch.tensor(1.5, requires_grad=True))),
        ("float64 action", _with(g, action=torch.tensor([0.5, 0.25, 0.0], dtype=torch.float64))),
        ("float64 obs", _with(g, obs=torch.tensor([1e300, 0.0, 0.0, 0.0], dtype=torch.float64))),
        ("int action", _with(g, action=torch.tensor([1, 0, -1]))),
        ("numpy action", _with(g, action=np.array([0.5, 0.5, 0.5], np.float32))),
        ("list action", _with(g, action=[0.5, 0.5, 0.5])),
        ("python reward", _with(g, reward=2.5)),
        ("numpy reward", _with(g, reward=np.float32(2.5))),
        ("nan action", _with(g, action=torch.tensor([0.0, NAN, 0.0]))),
        ("nan first action", _with(g, action=torch.tensor([NAN, 0.0, 0.0]))),
        ("inf action", _with(g, action=torch.tensor([0.0, INF, 0.0]))),
        ("out of bounds action", _with(g, action=torch.tensor([0.0, 1.0001, 0.0]))),
        ("below bounds action", _with(g, action=torch.tensor([-1.5, 0.0, 0.0]))),
        ("wrong shape action", _with(g, action=torch.zeros(1, 3))),
        ("same count obs", _with(g, obs=torch.zeros(2, 2))),
        ("scalar for vector", _with(g, action=torch.tensor(0.5))),
        ("vector for scalar", _with(g, reward=torch.tensor([0.5]))),
        ("level out of bounds", _with(g, level=torch.tensor(11, dtype=torch.int16))),
        ("level int64", _with(g, level=torch.tensor(3))),
        ("level fractional", _with(g, level=torch.tensor(3.5))),
        ("grid out of bounds", _with(g, grid=torch.full((2, 3), 2.5))),
        ("grid nan", _with(g, grid=torch.tensor([[0.0, NAN, 0.0], [0.0, 0.0, 0.0]]))),
        ("wide out of per-element bounds", _with(g, wide=torch.arange(70.0) + 1)),
        ("wide nan", _with(g, wide=torch.full((70,), NAN))),
        ("pix int", _with(g, pix=torch.tensor([0, 256]))),
        ("done float 0/1", _with(g, done=torch.tensor(1.0))),
        ("done float 2", _with(g, done=torch.tensor(2.0))),
        ("done python bool", _with(g, done=False)),
        ("done int tensor", _with(g, done=torch.tensor(1))),
        ("string obs", _with(g, obs="abc")),
        ("none reward", _with(g, reward=None)),
        ("bfloat16 action", _with(g, action=torch.tensor([0.5, 0.25, 1.0], dtype=torch.bfloat16))),
    ]


def numpy_cases() -> List[Tuple[str, Dict[str, Any]]]:
    g = numpy_good
    return [
        ("exact", g()),
        ("non-contiguous action", _with(g, action=np.arange(6, dtype=np.float32)[::2] / 10)),
        ("strided float32 action", _with(g, action=np.array([0.1, 9, 0.2, 9, -0.3, 9], np.float32)[::2])),
        ("nan first action", _with(g, action=np.array([NAN, 0.0, 0.0], np.float32))),
        ("nan last action", _with(g, action=np.array([0.0, 0.0, NAN], np.float32))),
        ("inf pair action", _with(g, action=np.array([-INF, 0.0, INF], np.float32))),
        ("bound ends action", _with(g, action=np.array([1.0, -1.0, 1.0], np.float32))),
        ("0-d reward", _with(g, reward=np.array(1.5, np.float32))),
        ("float64 reward", _with(g, reward=np.float64(1.5))),
        ("float64 reward beyond float32", _with(g, reward=np.float64(1e300))),
        ("python reward", _with(g, reward=1.25)),
        ("float64 action", _with(g, action=np.array([0.5, 0.1, 0.0]))),
        ("nan action", _with(g, action=np.array([0.0, NAN, 0.0], np.float32))),
        ("out of bounds action", _with(g, action=np.array([0.0, 2.0, 0.0], np.float32))),
        ("level out of bounds", _with(g, level=np.int16(-11))),
        ("level python int", _with(g, level=3)),
        ("level int64", _with(g, level=np.int64(3))),
        ("count beyond float64 precision", _with(g, count=np.array([2 ** 53 + 1, 0], np.int64))),
        ("count list", _with(g, count=[3, -4])),
        ("done python bool", _with(g, done=True)),
        ("done 0-d array", _with(g, done=np.array(True))),
        ("done float", _with(g, done=np.float32(1.0))),
        ("done 2", _with(g, done=np.int64(2))),
        ("tensor obs", _with(g, obs=torch.zeros(4))),
        ("wrong shape obs", _with(g, obs=np.zeros((2, 2), np.float32))),
        ("big-endian obs", _with(g, obs=np.array([1.0, 2.0, 3.0, 4.0], dtype=">f4"))),
    ]


def reference_row(st: FlattenedStorage, value: Dict[str, Any]) -> np.ndarray:
    """The row the generic per-leaf path packs (or its exception)."""
    plan = st._plan
    row = np.zeros(plan.width, plan.row_dtype)
    for lf in plan.leaves:
        plan._put(row, lf, value[lf.key], ())
    return row


def outcome(fn: Callable[[], Any]) -> Any:
    try:
        return ("ok", fn())
    except Exception as exc:  # the differential compares error types and messages
        return ("error", type(exc), str(exc))


def make(space: DictSpace, cap: int = 8) -> FlattenedStorage:
    inner = PytorchTensorStorage if space.backend is TB else NumpyMemmapStorage
    return FlattenedStorage.create(space, inner, capacity=cap)


@pytest.mark.parametrize("space_fn, cases_fn", [(torch_space, torch_cases), (numpy_space, numpy_cases)],
                         ids=["torch", "numpy"])
def test_compiled_append_matches_the_generic_rules(space_fn: Any, cases_fn: Any) -> None:
    st = make(space_fn(), cap=64)
    assert "append" in st.__dict__, "the compiled appender is installed"
    st.mark_segment_start(0)
    for name, value in cases_fn():
        want = outcome(lambda: reference_row(st, value))
        before = st.get_flattened(Ellipsis).numpy() if space_fn is torch_space else st.get_flattened(Ellipsis)
        n = st.pending_segment_length
        got = outcome(lambda: st.append(value))
        if want[0] == "error":
            assert got[0] == "error", f"{name}: generic path refuses ({want[2]}), compiled path accepted"
            assert got[1:] == want[1:], f"{name}: {got[1:]} != {want[1:]}"
            after = st.get_flattened(Ellipsis)
            after = after.numpy() if space_fn is torch_space else after
            assert np.array_equal(after, before, equal_nan=True), f"{name}: a refused append wrote something"
            assert st.pending_segment_length == n
        else:
            assert got[0] == "ok", f"{name}: compiled path refused: {got[1:]}"
            stored = st.get_flattened(n)
            stored = stored.numpy() if space_fn is torch_space else stored
            assert stored.tobytes() == want[1].tobytes(), f"{name}: stored row differs from the generic packing"
            assert st.pending_segment_length == n + 1
    # pack (set of one sample, writers) uses the same compiled checks
    for name, value in cases_fn():
        want = outcome(lambda: reference_row(st, value))
        got = outcome(lambda: st._plan.pack(value))
        if want[0] == "error":
            assert got[1:] == want[1:], name
        else:
            assert got[0] == "ok" and got[1].tobytes() == want[1].tobytes(), name


def test_keys_and_non_dict_values() -> None:
    st = make(torch_space())
    st.mark_segment_start(0)
    v = torch_good()
    with pytest.raises(KeyError, match="missing key"):
        st.append({k: x for k, x in v.items() if k != "obs"})
    with pytest.raises(KeyError, match="unexpected key"):
        st.append({**v, "extra": torch.zeros(1)})
    with pytest.raises(KeyError, match="missing key"):        # as many keys as the space, one of them wrong
        st.append({**{k: x for k, x in v.items() if k != "obs"}, "obz": torch.zeros(4)})
    with pytest.raises(KeyError, match="missing key"):
        st._plan.pack({**{k: x for k, x in v.items() if k != "obs"}, "obz": torch.zeros(4)})
    with pytest.raises(TypeError, match="expected a dict"):
        st.append([1, 2, 3])
    assert st.pending_segment_length == 0
    st.append(OrderedDict(sorted(v.items())))        # a Mapping that is not a plain dict takes the generic path
    assert st.get_flattened(0).numpy().tobytes() == reference_row(st, v).tobytes()
    assert st.pending_segment_length == 1


def test_close_removes_the_compiled_appender() -> None:
    inner = PytorchTensorStorage.create(make(torch_space()).flat_space, capacity=4)
    st = FlattenedStorage(torch_space(), inner, "inner_storage.memmap")
    inner.mark_segment_start(0)
    st.append(torch_good())
    st.close()              # does not own the inner storage: it stays open
    with pytest.raises(StorageClosedError):
        st.append(torch_good())
    assert inner.pending_segment_length == 1


def test_state_errors_come_from_the_inner_storage() -> None:
    st = make(torch_space(), cap=2)
    with pytest.raises(ValueError, match="mark_segment_start"):
        st.append(torch_good())
    st.mark_segment_start(1)
    st.append(torch_good())
    st.append(torch_good())  # wraps the ring to row 0
    with pytest.raises(ValueError, match="capacity"):
        st.append(torch_good())
    st.mark_segment_end()
    assert st.episode_segments() == [(1, 0)]


def test_pickled_storage_appends_through_its_own_inner(tmp_path: Any) -> None:
    st = FlattenedStorage.create(torch_space(), PytorchTensorStorage, capacity=4, cache_path=str(tmp_path / "s"))
    clone = pickle.loads(pickle.dumps(st))
    assert clone.inner_storage is not st.inner_storage and "append" in clone.__dict__
    clone.mark_segment_start(2)
    clone.append(torch_good())
    assert clone.get_flattened(2).numpy().tobytes() == reference_row(clone, torch_good()).tobytes()
    assert st.get_flattened(2).numpy().tobytes() == reference_row(st, torch_good()).tobytes()   # same file
    clone.close()
    st.close()


def test_subclass_append_override_is_kept() -> None:
    calls: List[Any] = []

    class Counting(FlattenedStorage):
        def append(self, value: Any) -> None:
            calls.append(value)
            super().append(value)

    st = Counting.create(torch_space(), PytorchTensorStorage, capacity=4)
    assert "append" not in st.__dict__
    st.mark_segment_start(0)
    st.append(torch_good())
    assert len(calls) == 1 and st.pending_segment_length == 1


@pytest.mark.parametrize("space_fn, good", [(torch_space, torch_good), (numpy_space, numpy_good)], ids=["torch", "numpy"])
def test_slice_reads_are_fresh_copies(space_fn: Any, good: Any) -> None:
    st = make(space_fn(), cap=6)
    st.mark_segment_start(0)
    for _ in range(6):
        st.append(good())
    out = st.get(slice(1, 4))
    for k, v in out.items():
        arr = v.numpy() if space_fn is torch_space else v
        assert arr.shape[0] == 3
        assert not np.shares_memory(arr, st.inner_storage._block.data), k
    one = st.get(2)
    for k in out:
        a = out[k][1].numpy() if space_fn is torch_space else out[k][1]
        b = one[k].numpy() if space_fn is torch_space else one[k]
        assert a.dtype == b.dtype and np.array_equal(a, b, equal_nan=True), k
    assert st.get(slice(4, 2))["obs"].shape[0] == 0
    assert st.get(slice(0, 6, 2))["obs"].shape[0] == 3


def test_generated_source_is_kept_and_errors_name_the_key() -> None:
    st = make(torch_space())
    src = st._plan.codec.source
    assert "def make_append" in src and "def unpack_batch" in src
    st.mark_segment_start(0)
    with pytest.raises(ValueError) as info:
        st.append(_with(torch_good, action=torch.tensor([0.0, 3.0, 0.0])))
    assert "'action'" in str(info.value) and "outside the space bounds" in str(info.value)


def test_reads_after_the_inner_storage_closed_raise() -> None:
    inner = NumpyMemmapStorage.create(make(numpy_space()).flat_space, capacity=4)
    st = FlattenedStorage(numpy_space(), inner, "inner_storage.memmap")
    inner.close()
    for index in (slice(0, 2), 1, np.array([0, 1])):
        with pytest.raises(StorageClosedError):
            st.get(index)


def float_space() -> DictSpace:
    """Float32 leaves and a bool on the NumPy backend: a float64 row whose batch reads cast once, then slice."""
    return DictSpace(NB, {
        "obs": BoxSpace(NB, -INF, INF, np.float32, shape=(5,)),
        "grid": BoxSpace(NB, 0.0, 2.0, np.float32, shape=(2, 3)),
        "reward": BoxSpace(NB, -INF, INF, np.float32, shape=()),
        "done": BinarySpace(NB, ()),
    })


def test_batch_reads_cast_once_and_match_the_per_leaf_rule() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FlattenPromotionWarning)   # the float64 row is the point here
        st = make(float_space(), cap=12)
    assert "cast = rows.astype" in st._plan.codec.source
    rng = np.random.default_rng(3)
    st.mark_segment_start(0)
    for i in range(12):
        st.append({"obs": rng.standard_normal(5).astype(np.float32), "grid": rng.uniform(0, 2, (2, 3)).astype(np.float32),
                   "reward": np.float32(i) / 3, "done": np.bool_(i % 3 == 0)})
    rows = st.get_flattened(Ellipsis)
    plan = st._plan
    for index in (slice(2, 9), slice(None), slice(1, 10, 3), np.array([11, 0, 4, 4]), 5):
        got = st.get(index)
        want_rows = rows[index]
        lead = want_rows.shape[:-1]
        for lf in plan.leaves:
            part = want_rows[..., lf.start:lf.stop]
            want = (part != 0) if lf.is_binary else part.astype(lf.leaf_np)
            want = want.reshape(lead + lf.shape)
            arr = got[lf.key]
            assert arr.dtype == want.dtype and arr.shape == want.shape, (index, lf.key)
            assert np.array_equal(arr, want), (index, lf.key)
            assert not np.shares_memory(arr, st.inner_storage._block.data), (index, lf.key)


def test_closing_the_inner_storage_stops_the_compiled_append() -> None:
    inner = NumpyMemmapStorage.create(make(numpy_space()).flat_space, capacity=4)
    st = FlattenedStorage(numpy_space(), inner, "inner_storage.memmap")
    inner.mark_segment_start(0)
    st.append(numpy_good())
    inner.close()           # the appender's fast path must not write into a released block
    with pytest.raises(StorageClosedError):
        st.append(numpy_good())


@pytest.mark.parametrize("space_fn, good", [(torch_space, torch_good), (numpy_space, numpy_good)], ids=["torch", "numpy"])
def test_growable_inner_storage_grows_under_the_compiled_append(space_fn: Any, good: Any) -> None:
    inner_cls = PytorchTensorStorage if space_fn is torch_space else NumpyMemmapStorage
    st = FlattenedStorage.create(space_fn(), inner_cls, capacity=None)
    st.mark_segment_start(0)
    for _ in range(40):
        st.append(good())
    st.mark_segment_end()
    assert len(st) == 40 and st.episode_segments() == [(0, 39)]   # (first, last) rows
    want = reference_row(st, good()).tobytes()
    for i in (0, 17, 39):
        row = st.get_flattened(i)
        assert (row.numpy() if space_fn is torch_space else row).tobytes() == want, i
