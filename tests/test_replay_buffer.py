"""ReplayBuffer (reference-api §6; defects 4, 8, 9, 25 of §7): construction and reopening, logical indexing, ring
overwrite, append-built and writer-built episodes, segments that stay right after the ring wraps, clear, dumps,
StepSampler, the static path helpers, and validation of damaged or hostile `metadata.json`.

Every sample holds an integer `id` and a vector `v` derived from it (see `row_v`), so a read can be checked
against a plain list of ids. Logical index 0 is the oldest sample.
"""
from __future__ import annotations

import json
import os
import shutil
import warnings
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np
import pytest

torch = pytest.importorskip("torch")

# values outside declared bounds are stored with a BoundsWarning by default; this file's refusal checks run in
# the refusal mode (the warning as an error), where they are refused like every other bad value
pytestmark = pytest.mark.filterwarnings("error::unienv_data.base.errors.BoundsWarning")

from unienv_data.base.errors import StorageFormatError, StorageStateError  # noqa: E402
from unienv_data.replay_buffer import ReplayBuffer  # noqa: E402
from unienv_data.samplers import StepSampler  # noqa: E402
from unienv_data.storages.flattened import FlattenedStorage, FlattenPromotionWarning  # noqa: E402
from unienv_data.storages.numpy_memmap import NumpyMemmapStorage  # noqa: E402
from unienv_data.storages.pytorch import PytorchTensorStorage  # noqa: E402
from unienv_interface.backends import NumpyComputeBackend  # noqa: E402
from unienv_interface.backends.pytorch import PyTorchComputeBackend  # noqa: E402
from unienv_interface.space import BoxSpace, DictSpace  # noqa: E402

TB = PyTorchComputeBackend
NB = NumpyComputeBackend
META = "metadata.json"


# ------------------------------------------------------------------------------------------------ samples
def make_space(backend: Any = TB, id_high: int = 1 << 20) -> DictSpace:
    i32 = torch.int32 if backend is TB else np.int32
    f32 = torch.float32 if backend is TB else np.float32
    return DictSpace(backend, {
        "id": BoxSpace(backend, -id_high, id_high, i32, shape=()),
        "v": BoxSpace(backend, -100.0, 100.0, f32, shape=(2,)),
    })


def row_v(i: int) -> np.ndarray:
    return np.array([(i % 97) * 0.5, -float(i % 89)], dtype=np.float32)


def to_np(x: Any) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().numpy()
    return np.asarray(x)


def single(i: int, backend: Any = TB) -> Dict[str, Any]:
    if backend is TB:
        return {"id": torch.tensor(i, dtype=torch.int32), "v": torch.from_numpy(row_v(i))}
    return {"id": np.array(i, dtype=np.int32), "v": row_v(i)}


def batch(ids: Sequence[int], backend: Any = TB) -> Dict[str, Any]:
    idv = np.array(list(ids), dtype=np.int32)
    v = np.stack([row_v(i) for i in ids]) if len(ids) else np.zeros((0, 2), np.float32)
    if backend is TB:
        return {"id": torch.from_numpy(idv), "v": torch.from_numpy(v)}
    return {"id": idv, "v": v}


def ids_of(data: Any) -> List[int]:
    """ids of a batch (list) or of one sample (a one-element list), after checking `v` matches every id."""
    ids = to_np(data["id"])
    v = to_np(data["v"])
    if ids.ndim == 0:
        ids, v = ids[None], v[None]
    expected_v = np.stack([row_v(int(i)) for i in ids]) if ids.size else np.zeros((0, 2), np.float32)
    np.testing.assert_array_equal(v, expected_v)
    return [int(i) for i in ids]


def all_ids(rb: ReplayBuffer) -> List[int]:
    return ids_of(rb.get_at(slice(None))) if len(rb) else []


def assert_buffer(rb: ReplayBuffer, ids: Sequence[int], segments: Optional[List[tuple]] = None) -> None:
    assert len(rb) == len(ids)
    assert rb.count == len(ids)
    assert all_ids(rb) == list(ids)
    for i, want in enumerate(ids):
        assert ids_of(rb.get_at(i)) == [want]
    if segments is not None:
        assert rb.episode_segments() == segments


def write_episode(rb: ReplayBuffer, ids: Sequence[int], backend: Any = TB) -> None:
    for i in ids:
        rb.append(single(i, backend))
    rb.mark_segment_end()


def commit_episode(rb: ReplayBuffer, ids: Sequence[int], backend: Any = TB) -> None:
    w = rb.open_segment_writer()
    for i in ids:
        w.append(single(i, backend))
    rb.commit_segment(w)


# ------------------------------------------------------------------------------------------------ configurations
class Config:
    """How a buffer is created and reopened (each the way a reference user writes it)."""

    def __init__(self, name: str, backend: Any, create: Callable[..., ReplayBuffer],
                 reopen: Callable[..., ReplayBuffer], growable: bool = False) -> None:
        self.name, self.backend, self._create, self._reopen, self.growable = name, backend, create, reopen, growable

    def create(self, tmp_path: Any, capacity: Optional[int]) -> ReplayBuffer:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FlattenPromotionWarning)
            return self._create(os.path.join(os.fspath(tmp_path), "rb"), capacity)

    def reopen(self, rb: ReplayBuffer, tmp_path: Any, read_only: bool = False) -> ReplayBuffer:
        """dumps + close + load_from."""
        return self._reopen(rb, os.path.join(os.fspath(tmp_path), "rb"), read_only)


def _torch_memmap_create(d: str, cap: Optional[int], maintain: bool = False,
                         overwrite: bool = False) -> ReplayBuffer:
    return ReplayBuffer.create(FlattenedStorage, make_space(TB), inner_storage_cls=PytorchTensorStorage,
                               cache_path=d, capacity=cap, is_memmap=True, maintain_segment_metadata=maintain,
                               overwrite=overwrite)


def _torch_memmap_reopen(rb: ReplayBuffer, d: str, read_only: bool) -> ReplayBuffer:
    rb.dumps(d)
    rb.close()
    return ReplayBuffer.load_from(d, backend=PyTorchComputeBackend, is_memmap=True, read_only=read_only)


def _torch_ram_create(d: str, cap: Optional[int]) -> ReplayBuffer:
    return ReplayBuffer.create(FlattenedStorage, make_space(TB), inner_storage_cls=PytorchTensorStorage,
                               capacity=cap, is_memmap=False)


def _torch_ram_reopen(rb: ReplayBuffer, d: str, read_only: bool) -> ReplayBuffer:
    rb.dumps(d)
    rb.close()
    return ReplayBuffer.load_from(d, backend=PyTorchComputeBackend, is_memmap=False, read_only=read_only)


def _numpy_memmap_create(d: str, cap: Optional[int]) -> ReplayBuffer:
    return ReplayBuffer.create(FlattenedStorage, make_space(NB), inner_storage_cls=NumpyMemmapStorage,
                               cache_path=d, capacity=cap, is_memmap=True)


def _numpy_memmap_reopen(rb: ReplayBuffer, d: str, read_only: bool) -> ReplayBuffer:
    rb.dumps(d)
    rb.close()
    return ReplayBuffer.load_from(d, backend=NumpyComputeBackend, is_memmap=True, read_only=read_only)


CONFIGS = {
    "torch_memmap": Config("torch_memmap", TB, _torch_memmap_create, _torch_memmap_reopen),
    "torch_ram_dumps": Config("torch_ram_dumps", TB, _torch_ram_create, _torch_ram_reopen),
    "numpy_memmap": Config("numpy_memmap", NB, _numpy_memmap_create, _numpy_memmap_reopen),
    "torch_memmap_growable": Config("torch_memmap_growable", TB, _torch_memmap_create, _torch_memmap_reopen,
                                    growable=True),
}


@pytest.fixture(params=sorted(CONFIGS))
def cfg(request: Any) -> Config:
    return CONFIGS[request.param]


@pytest.fixture
def rb6(tmp_path: Any) -> Any:
    """A torch memmap buffer of capacity 6."""
    rb = _torch_memmap_create(os.path.join(os.fspath(tmp_path), "rb"), 6)
    yield rb
    rb.close()


# ================================================================================================ create / load_from
def test_round_trip_every_config(cfg: Config, tmp_path: Any) -> None:
    cap = None if cfg.growable else 8
    b = cfg.backend
    rb = cfg.create(tmp_path, cap)
    assert rb.capacity == cap and len(rb) == 0 and rb.offset == 0
    assert rb.episode_segments() == []
    rb.extend(batch([1, 2, 3], b))
    write_episode(rb, [10, 11, 12, 13], b)
    commit_episode(rb, [20, 21], b)
    # the expectation from the plain list: a ring of 8 drops the oldest row(s)
    ids = [1, 2, 3, 10, 11, 12, 13, 20, 21]
    drop = 0 if cap is None else max(0, len(ids) - cap)
    ids = ids[drop:]
    segs = [(3 - drop, 7 - drop), (7 - drop, 9 - drop)]
    assert_buffer(rb, ids, segs)
    assert rb.offset == (0 if cap is None else drop)

    rb = cfg.reopen(rb, tmp_path)
    assert rb.capacity == cap
    assert rb.offset == (0 if cap is None else drop)
    assert_buffer(rb, ids, segs)

    # the reopened buffer is writable and keeps going from where it was
    rb.extend(batch([30, 31], b))
    write_episode(rb, [40, 41, 42], b)
    ids = ids + [30, 31, 40, 41, 42]
    segs = segs + [(len(ids) - 3, len(ids))]
    if cap is not None and len(ids) > cap:
        k = len(ids) - cap
        ids = ids[k:]
        segs = [(max(s - k, 0), e - k) for s, e in segs if e - k > 0]   # the oldest episode is clipped
    assert_buffer(rb, ids, segs)

    rb = cfg.reopen(rb, tmp_path, read_only=True)
    assert_buffer(rb, ids, segs)
    assert not rb.is_mutable
    with pytest.raises((ValueError, RuntimeError)):
        rb.extend(batch([99], b))
    with pytest.raises((ValueError, RuntimeError)):
        rb.set_at(0, single(99, b))
    assert_buffer(rb, ids, segs)
    rb.close()


def test_reference_style_create_and_load(tmp_path: Any) -> None:
    d = os.fspath(tmp_path / "buf")
    space = make_space(TB)
    rb = ReplayBuffer.create(FlattenedStorage, space, inner_storage_cls=PytorchTensorStorage, cache_path=d,
                             capacity=5, is_memmap=True)
    assert ReplayBuffer.is_loadable_from(d)  # create writes the metadata at once
    rb.extend(batch([1, 2, 3, 4, 5, 6, 7]))
    rb.dumps(d)
    rb.close()
    rb2 = ReplayBuffer.load_from(d, backend=PyTorchComputeBackend, is_memmap=True)
    assert rb2.capacity == 5 and len(rb2) == 5
    assert all_ids(rb2) == [3, 4, 5, 6, 7]
    assert rb2.single_space == space
    rb2.close()
    # a given space equal to the stored one is accepted
    rb3 = ReplayBuffer.load_from(d, backend=PyTorchComputeBackend, is_memmap=True, single_instance_space=space)
    assert all_ids(rb3) == [3, 4, 5, 6, 7]
    rb3.close()


def test_a_directory_left_by_an_unfinished_create_says_how_to_start_again(tmp_path: Any) -> None:
    """A create killed before it wrote `metadata.json` leaves a directory that create() refuses to replace: opening
    it names the unfinished create and the `overwrite=True` that replaces it, and that create then works."""
    space = DictSpace(NumpyComputeBackend, {"a": BoxSpace(NumpyComputeBackend, -1.0, 1.0, np.float32, shape=(2,))})
    path = str(tmp_path / "rb")
    rb = ReplayBuffer.create(FlattenedStorage, space, NumpyMemmapStorage, capacity=4, cache_path=path)
    rb.close()
    os.unlink(os.path.join(path, "metadata.json"))          # what a create killed before its metadata leaves
    with pytest.raises(FileExistsError, match="overwrite=True"):
        ReplayBuffer.create(FlattenedStorage, space, NumpyMemmapStorage, capacity=4, cache_path=path)
    with pytest.raises(FileNotFoundError, match="did not finish.*overwrite=True"):
        ReplayBuffer.load_from(path, backend=NumpyComputeBackend)
    again = ReplayBuffer.create(FlattenedStorage, space, NumpyMemmapStorage, capacity=4, cache_path=path,
                                overwrite=True)
    again.append({"a": np.ones(2, np.float32)})
    again.mark_segment_end()
    again.close()
    assert len(ReplayBuffer.load_from(path, backend=NumpyComputeBackend)) == 1


def test_a_backend_typo_is_the_callers_error_and_a_read_only_load_says_how_to_append(tmp_path: Any) -> None:
    d = os.fspath(tmp_path / "buf")
    rb = _torch_memmap_create(d, 8)
    write_episode(rb, [1, 2])
    rb.close()
    # the misspelt backend is named with the valid names, not blamed on metadata.json
    with pytest.raises(ValueError, match="unknown backend name 'pytroch'.*'torch'") as info:
        ReplayBuffer.load_from(d, backend="pytroch", is_memmap=True)
    assert "metadata.json" not in str(info.value)
    with pytest.raises(ValueError, match="unknown backend name"):
        ReplayBuffer.get_space_from_path(d, backend="pytroch")
    ro = ReplayBuffer.load_from(d, backend="torch", is_memmap=True)
    with pytest.raises(StorageStateError, match=r"read_only=False"):
        ro.append(single(3))
    ro.close()
    # what the message advises: reopen writable, append, mark the episode's end
    rw = ReplayBuffer.load_from(d, backend="torch", is_memmap=True, read_only=False)
    write_episode(rw, [3, 4])
    assert_buffer(rw, [1, 2, 3, 4], [(0, 2), (2, 4)])
    rw.close()


def test_load_from_names_a_space_keyword_and_suggests_single_instance_space(tmp_path: Any) -> None:
    """`space=` is not a `load_from` keyword (the reference's is `single_instance_space=`): the TypeError names it
    and the right keyword, never an internal function's parameter."""
    d = os.fspath(tmp_path / "buf")
    rb = _numpy_memmap_create(d, 8)
    write_episode(rb, [1, 2], NB)
    rb.close()
    wrong = BoxSpace(NB, 0.0, 1.0, np.float32, shape=(3,))
    for given in (wrong, make_space(NB)):
        with pytest.raises(TypeError, match=r"unexpected keyword argument 'space'.*single_instance_space=") as info:
            ReplayBuffer.load_from(d, backend="numpy", space=given)
        assert "load_storage_as" not in str(info.value) and "multiple values" not in str(info.value)
    ok = ReplayBuffer.load_from(d, backend="numpy", single_instance_space=make_space(NB))
    assert all_ids(ok) == [1, 2]
    ok.close()


def test_close_of_a_memmap_buffer_persists_without_dumps(tmp_path: Any) -> None:
    d = os.fspath(tmp_path / "buf")
    rb = _torch_memmap_create(d, 4)
    rb.extend(batch([1, 2, 3]))
    write_episode(rb, [7, 8])
    rb.close()
    rb2 = ReplayBuffer.load_from(d, backend=TB, is_memmap=True)
    assert_buffer(rb2, [2, 3, 7, 8], [(2, 4)])
    rb2.close()


def test_numpy_memmap_storage_directly(tmp_path: Any) -> None:
    d = os.fspath(tmp_path / "np")
    space = BoxSpace(NB, -10.0, 10.0, np.float32, shape=(3,))
    rb = ReplayBuffer.create(NumpyMemmapStorage, space, cache_path=d, capacity=4)
    assert rb.storage_path_relative == "storage.memmap"
    rows = np.arange(18, dtype=np.float32).reshape(6, 3) / 4
    rb.extend(rows[:5])
    w = rb.open_segment_writer()
    w.append(rows[5])
    rb.commit_segment(w)
    np.testing.assert_array_equal(rb.get_at(slice(None)), rows[2:])
    assert rb.episode_segments() == [(3, 4)]
    rb.dumps(d)
    rb.close()
    rb2 = ReplayBuffer.load_from(d, backend=NumpyComputeBackend)
    assert isinstance(rb2.get_at(0), np.ndarray)
    np.testing.assert_array_equal(rb2.get_at(slice(None)), rows[2:])
    np.testing.assert_array_equal(rb2.get_at(-1), rows[5])
    assert rb2.episode_segments() == [(3, 4)]
    assert ReplayBuffer.get_capacity_from_path(d) == 4
    rb2.close()


def test_growable_buffer(tmp_path: Any) -> None:
    d = os.fspath(tmp_path / "g")
    rb = _torch_memmap_create(d, None)
    assert rb.capacity is None
    ids: List[int] = []
    for k in range(5):
        new = list(range(100 * k, 100 * k + 7))
        rb.extend(batch(new))
        ids += new
    commit_episode(rb, list(range(1000, 1040)))  # longer than anything: growable has no capacity limit
    write_episode(rb, [2000, 2001])
    ids += list(range(1000, 1040)) + [2000, 2001]
    segs = [(35, 75), (75, 77)]
    assert_buffer(rb, ids, segs)
    assert rb.offset == 0
    rb.dumps()
    rb.close()
    assert ReplayBuffer.get_capacity_from_path(d) is None
    assert ReplayBuffer.get_length_from_path(d) == len(ids)
    rb2 = ReplayBuffer.load_from(d, backend=TB, is_memmap=True, read_only=False)
    assert_buffer(rb2, ids, segs)
    rb2.clear()
    assert_buffer(rb2, [], [])
    rb2.extend(batch([5, 6]))
    assert_buffer(rb2, [5, 6], [])
    rb2.close()


# ================================================================================================ len / indexing
def test_len_count_offset_through_wrap(rb6: ReplayBuffer) -> None:
    assert (len(rb6), rb6.count, rb6.offset) == (0, 0, 0)
    rb6.extend(batch([1, 2, 3, 4]))
    assert (len(rb6), rb6.offset) == (4, 0)
    rb6.extend(batch([5, 6, 7]))
    assert (len(rb6), rb6.offset) == (6, 1)
    rb6.extend(batch([8, 9, 10, 11, 12]))
    assert (len(rb6), rb6.offset) == (6, 0)
    rb6.extend(batch([13]))
    assert (len(rb6), rb6.offset) == (6, 1)
    assert all_ids(rb6) == [8, 9, 10, 11, 12, 13]


@pytest.mark.parametrize("offset_rows", [0, 3], ids=["no_wrap", "wrapped"])
def test_get_at_index_forms(rb6: ReplayBuffer, offset_rows: int) -> None:
    ids = list(range(1, 7 + offset_rows))
    rb6.extend(batch(ids[:4]))
    rb6.extend(batch(ids[4:]))
    ids = ids[-6:] if len(ids) > 6 else ids
    assert rb6.offset == offset_rows
    n = len(ids)
    assert all_ids(rb6) == ids
    # ints, negative ints, NumPy ints
    for i in range(-n, n):
        got = rb6.get_at(i)
        assert to_np(got["id"]).shape == ()
        assert ids_of(got) == [ids[i]]
        assert ids_of(rb6[i]) == [ids[i]]
    assert ids_of(rb6.get_at(np.int64(2))) == [ids[2]]
    # slices
    assert ids_of(rb6.get_at(slice(1, 4))) == ids[1:4]
    assert ids_of(rb6.get_at(slice(None, None, 2))) == ids[::2]
    assert ids_of(rb6.get_at(slice(-3, None))) == ids[-3:]
    assert ids_of(rb6.get_at(slice(4, 2))) == []
    assert ids_of(rb6.get_at(...)) == ids
    # integer arrays (NumPy, torch, list), negatives and repeats allowed
    picks = [5, 0, -1, 2, 2, -6]
    want = [ids[p] for p in picks]
    assert ids_of(rb6.get_at(np.array(picks))) == want
    assert ids_of(rb6.get_at(torch.tensor(picks))) == want
    assert ids_of(rb6.get_at(picks)) == want
    assert ids_of(rb6.get_at(np.zeros(0, dtype=np.int64))) == []
    # boolean masks of the logical length
    mask = [True, False, True, True, False, True]
    want = [x for x, m in zip(ids, mask) if m]
    assert ids_of(rb6.get_at(np.array(mask))) == want
    assert ids_of(rb6.get_at(torch.tensor(mask))) == want
    # flattened access is logical too
    flat = to_np(rb6.get_flattened_at(slice(None)))
    assert flat.shape[0] == n
    np.testing.assert_array_equal(flat[:, 0], np.array(ids, dtype=flat.dtype))


def test_get_at_out_of_range(rb6: ReplayBuffer) -> None:
    with pytest.raises(IndexError):
        rb6.get_at(0)  # empty
    rb6.extend(batch([1, 2, 3, 4, 5, 6, 7, 8]))  # wrapped: offset 2
    for bad in (6, -7, 100):
        with pytest.raises(IndexError):
            rb6.get_at(bad)
    with pytest.raises(IndexError):
        rb6.get_at(np.array([0, 6]))
    with pytest.raises(IndexError):
        rb6.get_at(torch.tensor([-7]))
    with pytest.raises(IndexError):
        rb6.get_at(np.ones(5, dtype=bool))  # mask shorter than len
    with pytest.raises(IndexError):
        rb6.get_at(np.ones(7, dtype=bool))
    with pytest.raises(TypeError):
        rb6.get_at(1.5)
    with pytest.raises(TypeError):
        rb6.get_at(True)
    rb6.clear()
    rb6.extend(batch([1, 2]))  # len 2 < capacity 6: rows 2.. do not exist logically
    with pytest.raises(IndexError):
        rb6.get_at(2)
    with pytest.raises(IndexError):
        rb6.get_at(np.array([0, 3]))
    with pytest.raises(IndexError):
        rb6.get_at(np.ones(6, dtype=bool))
    assert ids_of(rb6.get_at(slice(0, 6))) == [1, 2]  # slices clip like Python's


def test_set_at_is_logical(rb6: ReplayBuffer) -> None:
    rb6.extend(batch([1, 2, 3, 4, 5, 6, 7, 8]))  # [3..8], offset 2
    rb6.set_at(0, single(30))
    rb6.set_at(-1, single(80))
    rb6.set_at(np.array([1, 2]), batch([40, 50]))
    assert all_ids(rb6) == [30, 40, 50, 6, 7, 80]
    with pytest.raises(IndexError):
        rb6.set_at(6, single(1))
    assert all_ids(rb6) == [30, 40, 50, 6, 7, 80]


# ================================================================================================ extend / ring
def test_extend_wraps_and_overwrites_oldest(rb6: ReplayBuffer) -> None:
    rb6.extend(batch([1, 2, 3, 4]))
    rb6.extend(batch([5, 6, 7, 8]))  # wraps: physical rows 4, 5, 0, 1
    assert_buffer(rb6, [3, 4, 5, 6, 7, 8])
    assert rb6.offset == 2
    rb6.extend(batch([9]))
    assert_buffer(rb6, [4, 5, 6, 7, 8, 9])
    rb6.extend(batch([]))  # empty batch: no change
    assert_buffer(rb6, [4, 5, 6, 7, 8, 9])


@pytest.mark.parametrize("n", [6, 7, 15])
def test_extend_batch_at_least_capacity_keeps_last_items(rb6: ReplayBuffer, n: int) -> None:
    rb6.extend(batch([100, 101, 102]))
    write_episode(rb6, [200, 201])
    ids = list(range(1, n + 1))
    rb6.extend(batch(ids))
    assert_buffer(rb6, ids[-6:], [])
    assert rb6.offset == 0
    rb6.extend(batch([50]))
    assert_buffer(rb6, ids[-5:] + [50], [])


# ================================================================================================ episodes
def test_append_and_mark_segment_end(rb6: ReplayBuffer) -> None:
    rb6.append(single(1))
    rb6.append(single(2))
    assert len(rb6) == 2  # single process: appended rows count at once
    assert rb6.episode_segments() == []  # not recorded before the episode ends
    rb6.mark_segment_end()
    assert_buffer(rb6, [1, 2], [(0, 2)])
    write_episode(rb6, [3, 4, 5])
    assert_buffer(rb6, [1, 2, 3, 4, 5], [(0, 2), (2, 5)])
    rb6.mark_segment_end()  # nothing open: a no-op
    assert rb6.episode_segments() == [(0, 2), (2, 5)]


def test_commit_segment_in_any_order(rb6: ReplayBuffer) -> None:
    rb6.extend(batch([1]))
    w1, w2, w3 = rb6.open_segment_writer(), rb6.open_segment_writer(), rb6.open_segment_writer()
    for k in range(3):  # interleaved appends
        w1.append(single(10 + k))
        if k < 2:
            w2.append(single(20 + k))
        if k < 1:
            w3.append(single(30 + k))
    assert len(rb6) == 1  # nothing visible before commit
    rb6.commit_segment(w3)
    rb6.commit_segment(w1)
    assert_buffer(rb6, [1, 30, 10, 11, 12], [(1, 2), (2, 5)])
    rb6.commit_segment(w2)  # placed at the tail at commit time; the ring drops 1 and 30
    assert_buffer(rb6, [30, 10, 11, 12, 20, 21], [(0, 1), (1, 4), (4, 6)])


def test_commit_segment_twice_or_after_abort_is_rejected(rb6: ReplayBuffer) -> None:
    w = rb6.open_segment_writer()
    w.append(single(1))
    rb6.commit_segment(w)
    with pytest.raises((ValueError, RuntimeError)):
        rb6.commit_segment(w)
    w2 = rb6.open_segment_writer()
    w2.append(single(2))
    w2.abort()
    with pytest.raises((ValueError, RuntimeError)):
        rb6.commit_segment(w2)
    assert_buffer(rb6, [1], [(0, 1)])


def test_commit_empty_writer_changes_nothing(rb6: ReplayBuffer) -> None:
    rb6.extend(batch([1, 2]))
    rb6.commit_segment(rb6.open_segment_writer())
    assert_buffer(rb6, [1, 2], [])


def test_writer_from_another_buffer_is_rejected(tmp_path: Any) -> None:
    a = _torch_memmap_create(os.fspath(tmp_path / "a"), 6)
    b = _torch_memmap_create(os.fspath(tmp_path / "b"), 6)
    a.extend(batch([1, 2]))
    w = b.open_segment_writer()
    w.append(single(9))
    with pytest.raises(ValueError):
        a.commit_segment(w)
    assert_buffer(a, [1, 2], [])
    assert len(b) == 0
    # a writer of the bare storage of another buffer is just as foreign
    w2 = b.storage.open_segment_writer()
    w2.append(single(9))
    with pytest.raises(ValueError):
        a.commit_segment(w2)
    assert_buffer(a, [1, 2], [])
    # the writer still works on its own buffer
    b.commit_segment(w)
    assert_buffer(b, [9], [(0, 1)])
    a.close()
    b.close()


def test_episode_longer_than_capacity_is_rejected(rb6: ReplayBuffer) -> None:
    rb6.extend(batch([1, 2, 3]))
    write_episode(rb6, [4, 5])
    before = (len(rb6), rb6.offset, all_ids(rb6), rb6.episode_segments())
    w = rb6.open_segment_writer()
    for i in range(7):
        w.append(single(100 + i))
    with pytest.raises(ValueError, match="capacity of at least 7"):     # raise the capacity, not split it
        rb6.commit_segment(w)
    assert (len(rb6), rb6.offset, all_ids(rb6), rb6.episode_segments()) == before
    # exactly the capacity fits
    commit_episode(rb6, list(range(200, 206)))
    assert_buffer(rb6, list(range(200, 206)), [(0, 6)])


def test_segments_stay_right_after_the_ring_wraps(tmp_path: Any) -> None:
    rb = _torch_memmap_create(os.fspath(tmp_path / "r"), 7)
    commit_episode(rb, [1, 2, 3])          # A
    write_episode(rb, [4, 5, 6])           # B
    assert_buffer(rb, [1, 2, 3, 4, 5, 6], [(0, 3), (3, 6)])
    commit_episode(rb, [7, 8, 9])          # C: overwrites A's first two rows, so A is clipped to its last
    assert_buffer(rb, [3, 4, 5, 6, 7, 8, 9], [(0, 1), (1, 4), (4, 7)])
    rb.extend(batch([10, 11]))             # overwrites 3 (the rest of A) and 4 (B's first row)
    assert_buffer(rb, [5, 6, 7, 8, 9, 10, 11], [(0, 2), (2, 5)])
    write_episode(rb, [12, 13, 14, 15])    # D, append-built across the physical end: B goes, C keeps its last
    assert_buffer(rb, [9, 10, 11, 12, 13, 14, 15], [(0, 1), (3, 7)])
    commit_episode(rb, [16, 17, 18, 19, 20, 21, 22])  # E fills the whole ring
    assert_buffer(rb, [16, 17, 18, 19, 20, 21, 22], [(0, 7)])
    commit_episode(rb, [23])
    assert_buffer(rb, [17, 18, 19, 20, 21, 22, 23], [(0, 6), (6, 7)])
    # the same after a reopen
    rb.dumps()
    rb.close()
    rb2 = ReplayBuffer.load_from(tmp_path / "r", backend=TB, is_memmap=True)
    assert_buffer(rb2, [17, 18, 19, 20, 21, 22, 23], [(0, 6), (6, 7)])
    rb2.close()


def test_segments_of_maintain_segment_metadata_buffer(tmp_path: Any) -> None:
    rb = ReplayBuffer.create(FlattenedStorage, make_space(), inner_storage_cls=PytorchTensorStorage,
                             cache_path=tmp_path / "m", capacity=5, is_memmap=True, maintain_segment_metadata=True)
    write_episode(rb, [1, 2])
    commit_episode(rb, [3, 4, 5])
    write_episode(rb, [6, 7])
    assert_buffer(rb, [3, 4, 5, 6, 7], [(0, 3), (3, 5)])
    rb.dumps()
    rb.close()
    rb2 = ReplayBuffer.load_from(tmp_path / "m", backend=TB, is_memmap=True)
    assert_buffer(rb2, [3, 4, 5, 6, 7], [(0, 3), (3, 5)])
    rb2.close()


def test_extend_or_commit_while_append_episode_is_open(rb6: ReplayBuffer) -> None:
    rb6.extend(batch([1]))
    rb6.append(single(2))
    w = rb6.open_segment_writer()
    w.append(single(3))
    with pytest.raises(RuntimeError, match="mark_segment_end") as info:
        rb6.extend(batch([4]))
    assert isinstance(info.value, StorageStateError)
    with pytest.raises(RuntimeError, match="mark_segment_end"):
        rb6.commit_segment(w)
    assert len(rb6) == 2 and all_ids(rb6) == [1, 2]
    rb6.append(single(5))
    rb6.mark_segment_end()
    rb6.commit_segment(w)
    rb6.extend(batch([4]))
    assert_buffer(rb6, [1, 2, 5, 3, 4], [(1, 3), (3, 4)])


def test_abort_segment_keeps_rows_without_a_segment(rb6: ReplayBuffer) -> None:
    rb6.append(single(1))
    rb6.append(single(2))
    rb6.abort_segment()
    rb6.extend(batch([3]))
    assert_buffer(rb6, [1, 2, 3], [])


def _out_of_bounds(b: Dict[str, Any], pos: int) -> Dict[str, Any]:
    b["id"] = b["id"].clone()
    b["id"][pos] = 1 << 22  # outside the id bounds
    return b


@pytest.mark.parametrize("n", [2, 6, 8], ids=["partial", "exactly_capacity", "more_than_capacity"])
def test_rejected_extend_changes_nothing(rb6: ReplayBuffer, n: int) -> None:
    """Bad data is refused before anything changes: rows, counters and the segments those rows belong to."""
    write_episode(rb6, [1, 2, 3])
    commit_episode(rb6, [4, 5, 6])  # full ring, offset 0: the next extend would overwrite episode [1, 2, 3]
    before = (len(rb6), rb6.offset, all_ids(rb6), rb6.episode_segments())
    assert before[3] == [(0, 3), (3, 6)]
    with pytest.raises(ValueError):
        rb6.extend(_out_of_bounds(batch(list(range(10, 10 + n))), n - 1))
    assert (len(rb6), rb6.offset, all_ids(rb6), rb6.episode_segments()) == before
    wrong_shape = batch(list(range(10, 10 + n)))
    wrong_shape["v"] = torch.zeros(n + 1, 2)
    with pytest.raises((ValueError, TypeError)):
        rb6.extend(wrong_shape)
    assert (len(rb6), rb6.offset, all_ids(rb6), rb6.episode_segments()) == before


def test_rejected_append_changes_nothing(rb6: ReplayBuffer) -> None:
    write_episode(rb6, [1, 2, 3])
    bad = {"id": torch.tensor(1 << 22, dtype=torch.int32), "v": torch.zeros(2)}
    # as the first step of an episode: no episode may be left open
    with pytest.raises(ValueError):
        rb6.append(bad)
    assert_buffer(rb6, [1, 2, 3], [(0, 3)])
    rb6.extend(batch([4]))  # must not complain about an open episode: nothing was appended
    assert_buffer(rb6, [1, 2, 3, 4], [(0, 3)])
    # in the middle of an episode: the episode keeps its earlier steps
    rb6.append(single(5))
    with pytest.raises(ValueError):
        rb6.append(bad)
    rb6.append(single(6))
    rb6.mark_segment_end()
    assert_buffer(rb6, [1, 2, 3, 4, 5, 6], [(0, 3), (4, 6)])


def test_rejected_writer_append_changes_nothing(rb6: ReplayBuffer) -> None:
    rb6.extend(batch([1]))
    w = rb6.open_segment_writer()
    w.append(single(2))
    with pytest.raises(ValueError):
        w.append({"id": torch.tensor(1 << 22, dtype=torch.int32), "v": torch.zeros(2)})
    assert len(w) == 1
    rb6.commit_segment(w)
    assert_buffer(rb6, [1, 2], [(1, 2)])


def test_create_over_an_existing_buffer_starts_empty(tmp_path: Any) -> None:
    """§7 defect 5: re-creating over old files must not bring the old rows back (and needs overwrite=True)."""
    d = os.fspath(tmp_path / "again")
    rb = _torch_memmap_create(d, 4)
    rb.extend(batch([1, 2, 3, 4]))
    write_episode(rb, [5])
    rb.close()
    with pytest.raises(FileExistsError, match="overwrite=True"):
        _torch_memmap_create(d, 4)
    rb = _torch_memmap_create(d, 4, overwrite=True)
    assert (len(rb), rb.offset, rb.episode_segments()) == (0, 0, [])
    assert not to_np(rb.storage.get_flattened(slice(None))).any()
    rb.extend(batch([9]))
    rb.close()
    again = ReplayBuffer.load_from(d, backend=TB, is_memmap=True)
    assert_buffer(again, [9], [])
    again.close()


# ================================================================================================ clear / dumps
def test_clear(cfg: Config, tmp_path: Any) -> None:
    cap = None if cfg.growable else 5
    b = cfg.backend
    rb = cfg.create(tmp_path, cap)
    rb.extend(batch([1, 2, 3, 4], b))
    write_episode(rb, [5, 6, 7], b)
    rb.append(single(8, b))  # an open episode is dropped by clear
    rb.clear()
    assert (len(rb), rb.offset) == (0, 0)
    assert rb.episode_segments() == []
    with pytest.raises(IndexError):
        rb.get_at(0)
    rb.extend(batch([10, 11], b))  # no error: nothing open any more
    write_episode(rb, [12], b)
    assert_buffer(rb, [10, 11, 12], [(2, 3)])
    rb = cfg.reopen(rb, tmp_path)
    assert_buffer(rb, [10, 11, 12], [(2, 3)])
    rb.clear()
    rb = cfg.reopen(rb, tmp_path)
    assert_buffer(rb, [], [])
    rb.close()


def test_dumps_to_another_directory_is_a_snapshot(tmp_path: Any) -> None:
    d1, d2 = os.fspath(tmp_path / "one"), os.fspath(tmp_path / "two")
    rb = _torch_memmap_create(d1, 5)
    rb.extend(batch([1, 2, 3, 4, 5, 6]))
    write_episode(rb, [7, 8])
    rb.dumps(d2)
    assert ReplayBuffer.is_loadable_from(d2)
    rb.extend(batch([9]))  # after the snapshot
    snap = ReplayBuffer.load_from(d2, backend=TB, is_memmap=True)
    assert_buffer(snap, [4, 5, 6, 7, 8], [(3, 5)])
    assert_buffer(rb, [5, 6, 7, 8, 9], [(2, 4)])
    snap.close()
    rb.close()
    again = ReplayBuffer.load_from(d1, backend=TB, is_memmap=True)
    assert_buffer(again, [5, 6, 7, 8, 9], [(2, 4)])
    again.close()


def test_closing_a_ram_copy_keeps_the_directory_consistent(tmp_path: Any) -> None:
    """A buffer loaded into RAM (`is_memmap=False`) and changed, then closed without `dumps`: the directory must
    still describe one real state (the last dump, or everything), never new counters over old rows."""
    d = os.fspath(tmp_path / "ram")
    rb = _torch_ram_create("", 4)
    rb.extend(batch([1, 2]))
    write_episode(rb, [3])
    rb.dumps(d)
    rb.close()
    rb = ReplayBuffer.load_from(d, backend=TB, is_memmap=False, read_only=False)
    rb.extend(batch([4, 5]))
    write_episode(rb, [6])
    rb.close()
    again = ReplayBuffer.load_from(d, backend=TB, is_memmap=False)
    state = (len(again), all_ids(again), again.episode_segments())
    again.close()
    assert state in ((3, [1, 2, 3], [(2, 3)]), (4, [3, 4, 5, 6], [(0, 1), (3, 4)])), state


def test_dumps_without_any_path_is_an_error() -> None:
    rb = _torch_ram_create("", 3)
    rb.extend(batch([1]))
    with pytest.raises(ValueError):
        rb.dumps()


def test_closed_buffer_raises(rb6: ReplayBuffer) -> None:
    rb6.extend(batch([1]))
    rb6.close()
    rb6.close()  # idempotent
    with pytest.raises((ValueError, RuntimeError)):
        rb6.get_at(0)
    with pytest.raises((ValueError, RuntimeError)):
        rb6.extend(batch([2]))


# ================================================================================================ StepSampler
def test_step_sampler_is_reproducible(rb6: ReplayBuffer) -> None:
    rb6.extend(batch(list(range(1, 10))))  # [4..9]
    present = set(all_ids(rb6))
    s1, s2 = StepSampler(rb6, 32, seed=123), StepSampler(rb6, 32, seed=123)
    draws1 = [ids_of(s1.sample()) for _ in range(4)]
    draws2 = [ids_of(s2.sample()) for _ in range(4)]
    assert draws1 == draws2
    for d in draws1:
        assert len(d) == 32 and set(d) <= present
    assert len(set(sum(draws1, []))) > 1
    s1.manual_seed(123)
    assert ids_of(s1.sample()) == draws1[0]
    other = [ids_of(StepSampler(rb6, 32, seed=7).sample()) for _ in range(1)]
    assert other[0] != draws1[0]
    flat = to_np(StepSampler(rb6, 5, seed=1).sample_flat())
    assert flat.shape[0] == 5 and set(int(x) for x in flat[:, 0]) <= present


# ================================================================================================ static helpers
def test_static_helpers(tmp_path: Any) -> None:
    d = os.fspath(tmp_path / "h")
    assert not ReplayBuffer.is_loadable_from(d)
    assert not ReplayBuffer.is_loadable_from(os.fspath(tmp_path))  # a directory without metadata
    rb = _torch_memmap_create(d, 4)
    rb.extend(batch([1, 2, 3]))
    rb.dumps()
    assert ReplayBuffer.is_loadable_from(d)
    assert ReplayBuffer.get_length_from_path(d) == 3
    assert ReplayBuffer.get_capacity_from_path(d) == 4
    assert ReplayBuffer.get_space_from_path(d, backend=TB) == make_space(TB)
    assert ReplayBuffer.get_space_from_path(d, backend=NB) == make_space(NB)
    rb.extend(batch([4, 5]))
    rb.close()
    assert ReplayBuffer.get_length_from_path(d) == 4
    with pytest.raises(FileNotFoundError):
        ReplayBuffer.get_length_from_path(os.fspath(tmp_path / "nope"))
    with open(os.path.join(d, META), "w") as f:
        f.write("{not json")
    assert not ReplayBuffer.is_loadable_from(d)
    with pytest.raises(ValueError):
        ReplayBuffer.get_capacity_from_path(d)


# ================================================================================================ metadata validation
def _saved(tmp_path: Any, capacity: Optional[int] = 4) -> str:
    """A dumped buffer: three committed episodes, wrapped when capacity is 4."""
    d = os.fspath(tmp_path / "saved")
    rb = _torch_memmap_create(d, capacity, maintain=True)
    commit_episode(rb, [1, 2])
    commit_episode(rb, [3])
    write_episode(rb, [4, 5])
    rb.dumps()
    rb.close()
    return d


def _read_meta(d: str) -> Dict[str, Any]:
    with open(os.path.join(d, META)) as f:
        return json.load(f)


def _write_meta(d: str, meta: Any) -> None:
    with open(os.path.join(d, META), "w") as f:
        json.dump(meta, f)


def _edit(**changes: Any) -> Callable[[Dict[str, Any]], Dict[str, Any]]:
    def f(meta: Dict[str, Any]) -> Dict[str, Any]:
        meta = dict(meta)
        for k, v in changes.items():
            meta[k] = v
        return meta
    return f


def _drop(field: str) -> Callable[[Dict[str, Any]], Dict[str, Any]]:
    def f(meta: Dict[str, Any]) -> Dict[str, Any]:
        meta = dict(meta)
        del meta[field]
        return meta
    return f


BAD_META: Dict[str, Callable[[Dict[str, Any]], Any]] = {
    "not_an_object": lambda m: [m],
    "wrong_type": _edit(type="FlattenedStorage"),
    "count_gt_capacity": _edit(count=53),
    "count_negative": _edit(count=-1),
    "count_string": _edit(count="3"),
    "count_float": _edit(count=3.0),
    "count_bool": _edit(count=True),
    "offset_negative": _edit(offset=-1),
    "offset_eq_capacity": _edit(offset=4),
    "offset_gt_capacity": _edit(offset=9),
    "capacity_smaller_than_storage": _edit(capacity=2, count=2, offset=0),
    "capacity_larger_than_storage": _edit(capacity=8),
    "capacity_zero": _edit(capacity=0, count=0, offset=0),
    "capacity_string": _edit(capacity="4"),
    "capacity_none_for_fixed_storage": _edit(capacity=None, offset=0),
    "segments_not_a_list": _edit(physical_segments="0-1"),
    "segments_dict": _edit(physical_segments={"0": 1}),
    "segments_pair_too_short": _edit(physical_segments=[[0]]),
    "segments_pair_too_long": _edit(physical_segments=[[0, 1, 2]]),
    "segments_flat_ints": _edit(physical_segments=[0, 1]),
    "segments_strings": _edit(physical_segments=[["0", "1"]]),
    "segments_floats": _edit(physical_segments=[[0.0, 1.0]]),
    "segments_bool": _edit(physical_segments=[[True, False]]),
    "segments_none_entry": _edit(physical_segments=[None]),
    "segments_negative": _edit(physical_segments=[[-1, 0]]),
    "segments_past_capacity": _edit(physical_segments=[[2, 9]]),
    "segments_start_past_capacity": _edit(physical_segments=[[4, 0]]),
    "segments_overlapping": _edit(physical_segments=[[2, 3], [3, 0]]),
    "segments_same_twice": _edit(physical_segments=[[2, 2], [2, 2]]),
    "storage_cls_os_system": _edit(storage_cls="os.system"),
    "storage_cls_unknown": _edit(storage_cls="evil_plugin.Storage"),
    "storage_cls_not_str": _edit(storage_cls=["unienv_data.storages.flattened.FlattenedStorage"]),
    "storage_path_parent": _edit(storage_path_relative="../x"),
    "storage_path_parent_nested": _edit(storage_path_relative="storage/../../x"),
    "storage_path_absolute": _edit(storage_path_relative="/etc"),
    "storage_path_empty": _edit(storage_path_relative=""),
    "storage_path_missing_dir": _edit(storage_path_relative="elsewhere"),
    "space_not_a_space": _edit(single_instance_space={"type": "NoSuchSpace"}),
    "space_box_missing_fields": _edit(single_instance_space={"type": "BoxSpace"}),
    "space_is_a_string": _edit(single_instance_space="DictSpace"),
    "space_differs_from_data": _edit(single_instance_space={
        "type": "DictSpace", "spaces": {
            "id": {"type": "BoxSpace", "shape": [], "low": -1048576, "high": 1048576, "dtype": "int32"},
            "w": {"type": "BoxSpace", "shape": [2], "low": -100.0, "high": 100.0, "dtype": "float32"}}}),
    "format_version_from_the_future": _edit(format_version=999),
    "format_version_string": _edit(format_version="1"),
}
for _field in ("type", "count", "offset", "capacity", "storage_cls", "storage_path_relative",
               "single_instance_space"):
    BAD_META[f"missing_{_field}"] = _drop(_field)


def _assert_rejected(d: str, **kwargs: Any) -> BaseException:
    try:
        rb = ReplayBuffer.load_from(d, backend=TB, is_memmap=True, **kwargs)
    except (ValueError, FileNotFoundError) as exc:
        assert not isinstance(exc, (json.JSONDecodeError, KeyError, IndexError)), repr(exc)
        assert str(exc).strip(), "the error has no message"
        return exc
    # it loaded: then every later use must work (and the test still fails: the damage went unnoticed)
    try:
        n = len(rb)
        if n:
            rb.get_at(slice(None))
            rb.get_at(n - 1)
        rb.episode_segments()
    finally:
        rb.close()
    pytest.fail(f"damaged metadata loaded without an error (len {n}, segments {rb._state.get_segments()})")


@pytest.mark.parametrize("kind", sorted(BAD_META))
def test_damaged_metadata_is_rejected(tmp_path: Any, kind: str) -> None:
    d = _saved(tmp_path)
    meta = _read_meta(d)
    if kind.startswith("segments_"):  # make sure the buffer itself keeps segments in the metadata
        assert meta["physical_segments"] is not None
    _write_meta(d, BAD_META[kind](meta))
    _assert_rejected(d)
    assert not ReplayBuffer.is_loadable_from(d) or kind in (
        "capacity_smaller_than_storage", "capacity_larger_than_storage", "capacity_none_for_fixed_storage",
        "storage_cls_os_system", "storage_cls_unknown", "storage_cls_not_str", "storage_path_parent",
        "storage_path_parent_nested", "storage_path_absolute", "storage_path_empty", "storage_path_missing_dir",
        "space_not_a_space", "space_box_missing_fields", "space_is_a_string", "space_differs_from_data")


@pytest.mark.parametrize("cut", [0, 1, 10, -1])
def test_truncated_metadata_json(tmp_path: Any, cut: int) -> None:
    d = _saved(tmp_path)
    path = os.path.join(d, META)
    with open(path) as f:
        text = f.read()
    with open(path, "w") as f:
        f.write(text[:cut] if cut >= 0 else text[:len(text) // 2])
    exc = _assert_rejected(d)
    assert isinstance(exc, StorageFormatError)
    assert not ReplayBuffer.is_loadable_from(d)


def test_missing_metadata_file_or_directory(tmp_path: Any) -> None:
    d = _saved(tmp_path)
    os.remove(os.path.join(d, META))
    exc = _assert_rejected(d)
    assert isinstance(exc, FileNotFoundError)
    exc = _assert_rejected(os.fspath(tmp_path / "does_not_exist"))
    assert isinstance(exc, FileNotFoundError)


def test_missing_storage_files(tmp_path: Any) -> None:
    d = _saved(tmp_path)
    shutil.rmtree(os.path.join(d, "storage"))
    _assert_rejected(d)


def test_storage_cls_is_never_imported(tmp_path: Any, monkeypatch: Any) -> None:
    d = _saved(tmp_path)
    meta = _read_meta(d)
    meta["storage_cls"] = "some_module_that_must_not_be_imported.Storage"
    _write_meta(d, meta)
    import builtins
    real_import = builtins.__import__

    def guard(name: str, *args: Any, **kwargs: Any) -> Any:
        assert not name.startswith("some_module_that_must_not_be_imported"), "imported a name from metadata"
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", guard)
    exc = _assert_rejected(d)
    assert "some_module_that_must_not_be_imported" in str(exc)


def test_given_space_that_differs_is_rejected(tmp_path: Any) -> None:
    d = _saved(tmp_path)
    for other in (make_space(TB, id_high=1000),
                  DictSpace(TB, {"id": BoxSpace(TB, -(1 << 20), 1 << 20, torch.int32, shape=()),
                                 "w": BoxSpace(TB, -100.0, 100.0, torch.float32, shape=(2,))}),
                  BoxSpace(TB, -1.0, 1.0, torch.float32, shape=(3,))):
        with pytest.raises(ValueError) as info:
            ReplayBuffer.load_from(d, backend=TB, is_memmap=True, single_instance_space=other)
        assert "space" in str(info.value)
    rb = ReplayBuffer.load_from(d, backend=TB, is_memmap=True)
    assert_buffer(rb, [2, 3, 4, 5], [(0, 1), (1, 2), (2, 4)])  # the damage attempts changed nothing
    rb.close()


def test_valid_metadata_edits_still_load(tmp_path: Any) -> None:
    """Control for the damage table: the metadata as written, and reference-style metadata (no format_version,
    physical_segments null) load."""
    d = _saved(tmp_path)
    meta = _read_meta(d)
    rb = ReplayBuffer.load_from(d, backend=TB, is_memmap=True)
    assert_buffer(rb, [2, 3, 4, 5], [(0, 1), (1, 2), (2, 4)])
    rb.close()
    ref = dict(meta)
    ref.pop("format_version", None)
    ref.pop("maintain_segment_metadata", None)
    ref["physical_segments"] = None
    _write_meta(d, ref)
    rb = ReplayBuffer.load_from(d, backend=TB, is_memmap=True)
    assert all_ids(rb) == [2, 3, 4, 5]
    rb.close()


def test_segments_kept_only_in_metadata_json_are_loaded(tmp_path: Any) -> None:
    """A reference-written buffer keeps its segments only in metadata.json (`physical_segments`, inclusive
    physical pairs); the storage below has no segment record. Loading must not drop them."""
    d = _saved(tmp_path)  # capacity 4, offset 1: logical [2, 3, 4, 5], episodes [3] and [4, 5]
    meta = _read_meta(d)
    assert meta["offset"] == 1 and meta["physical_segments"] == [[1, 1], [2, 2], [3, 0]]
    # the reference layout: no format_version, a bare flattened_metadata.json, no sidecar next to the raw rows
    ref = {k: v for k, v in meta.items() if k not in ("format_version", "maintain_segment_metadata")}
    _write_meta(d, ref)
    with open(os.path.join(d, "storage", "flattened_metadata.json"), "w") as f:
        json.dump({"storage_type": "FlattenedStorage",
                   "inner_storage_type": "unienv_data.storages.pytorch.PytorchTensorStorage",
                   "inner_storage_path": "inner_storage.memmap"}, f)
    os.remove(os.path.join(d, "storage", "inner_storage.memmap.meta.json"))
    rb = ReplayBuffer.load_from(d, backend=TB, is_memmap=True)
    try:
        assert all_ids(rb) == [2, 3, 4, 5]
        assert rb.episode_segments() == [(0, 1), (1, 2), (2, 4)]
    finally:
        rb.close()


def test_segments_over_rows_never_written_are_rejected(tmp_path: Any) -> None:
    """A ring of 6 holding 2 rows (physical 0, 1): a segment on physical rows 3..4 describes nothing stored."""
    d = os.fspath(tmp_path / "short")
    rb = _torch_memmap_create(d, 6, maintain=True)
    write_episode(rb, [1, 2])
    rb.dumps()
    rb.close()
    meta = _read_meta(d)
    assert meta["physical_segments"] == [[0, 1]]
    _write_meta(d, dict(meta, physical_segments=[[0, 1], [3, 4]]))
    _assert_rejected(d)


def test_growable_metadata_validation(tmp_path: Any) -> None:
    d = _saved(tmp_path, capacity=None)
    meta = _read_meta(d)
    assert meta["capacity"] is None
    for bad in (dict(meta, count=6), dict(meta, offset=1), dict(meta, capacity=5), dict(meta, count=-2),
                dict(meta, physical_segments=[[3, 1]]), dict(meta, physical_segments=[[0, 7]])):
        _write_meta(d, bad)
        _assert_rejected(d)
    _write_meta(d, meta)
    rb = ReplayBuffer.load_from(d, backend=TB, is_memmap=True)
    assert_buffer(rb, [1, 2, 3, 4, 5], [(0, 2), (2, 3), (3, 5)])
    rb.close()


def test_metadata_disagreeing_with_the_storage_files_is_a_format_error(tmp_path: Any) -> None:
    # the caller gives no space: metadata.json's space differs from what the storage's own files record, so the
    # directory is damaged (or mixed from two buffers), not a caller mistake
    B = NumpyComputeBackend
    space = DictSpace(B, {"x": BoxSpace(B, -1.0, 1.0, np.float32, shape=(2,))})
    d = os.path.join(tmp_path, "rb")
    rb = ReplayBuffer.create(FlattenedStorage, space, inner_storage_cls=NumpyMemmapStorage, capacity=4, cache_path=d)
    rb.append({"x": np.zeros(2, np.float32)})
    rb.mark_segment_end()
    rb.dumps()
    rb.close()
    meta_file = os.path.join(d, "metadata.json")
    meta = json.load(open(meta_file))
    meta["single_instance_space"]["spaces"]["x"]["high"] = 2.0
    json.dump(meta, open(meta_file, "w"))
    with pytest.raises(StorageFormatError, match="metadata.json does not agree"):
        ReplayBuffer.load_from(d, backend=B)


def test_load_from_refuses_capacity_naming_the_metadata(tmp_path: Any) -> None:
    """The capacity is stored; `capacity=` at load is a TypeError that says so (the reference's is a clash of keyword
    arguments inside the storage call), and the buffer opens unchanged without it."""
    d = _saved(tmp_path, capacity=None)
    with pytest.raises(TypeError, match=r"does not take capacity= \(got 20\).*metadata\.json"):
        ReplayBuffer.load_from(d, backend=TB, capacity=20, is_memmap=True)
    rb = ReplayBuffer.load_from(d, backend=TB, is_memmap=True)
    assert rb.capacity is None and len(rb) == 5
    rb.close()
