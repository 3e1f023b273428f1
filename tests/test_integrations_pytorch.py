"""unienv_data.integrations.pytorch: Dataset adapters (with real DataLoader workers) and the pinned prefetcher."""
from __future__ import annotations

import itertools
import multiprocessing
import threading
import time
import warnings
from typing import Any, Dict, Iterator, List

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader, Dataset, TensorDataset  # noqa: E402

from unienv_data.integrations.pytorch import (PinnedPrefetcher, PyTorchAsUniEnvDataset,  # noqa: E402
                                              UniEnvAsPyTorchDataset)
from unienv_data.replay_buffer import ReplayBuffer  # noqa: E402
from unienv_data.samplers import StepSampler  # noqa: E402
from unienv_data.samplers.multiprocessing_sampler import MultiprocessingSampler  # noqa: E402
from unienv_data.storages.flattened import FlattenedStorage  # noqa: E402
from unienv_data.storages.pytorch import PytorchTensorStorage  # noqa: E402
from unienv_interface.backends.pytorch import PyTorchComputeBackend as B  # noqa: E402
from unienv_interface.space import BinarySpace, BoxSpace, DictSpace, TupleSpace  # noqa: E402

ROWS = 300


def space() -> DictSpace:
    f32 = B.dtype_from_name("float32")
    return DictSpace(B, {"obs": BoxSpace(B, -np.inf, np.inf, f32, shape=(16,)),
                         "action": BoxSpace(B, -1.0, 1.0, f32, shape=(4,)),
                         "reward": BoxSpace(B, -np.inf, np.inf, f32, shape=()),
                         "terminated": BinarySpace(B, ())})


def rows(start: int, n: int, scale: float = 1.0) -> Dict[str, Any]:
    ids = torch.arange(start, start + n, dtype=torch.float32)
    return {"obs": (ids * scale)[:, None].repeat(1, 16), "action": ((ids % 5) / 5.0)[:, None].repeat(1, 4),
            "reward": ids, "terminated": (ids.to(torch.int64) % 4) == 0}


@pytest.fixture
def buffer(tmp_path: Any) -> Iterator[ReplayBuffer]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rb = ReplayBuffer.create(FlattenedStorage, space(), inner_storage_cls=PytorchTensorStorage,
                                 cache_path=str(tmp_path / "rb"), capacity=ROWS)
    rb.extend(rows(1, ROWS))
    yield rb
    rb.close()


def check_rows(batch: Dict[str, Any], scale: float = 1.0) -> None:
    ids = batch["reward"]
    assert torch.equal(batch["obs"], (ids * scale)[:, None].expand(-1, 16))
    assert torch.equal(batch["terminated"], (ids.to(torch.int64) % 4) == 0)


# ---------------------------------------------------------------------------------------------------- UniEnv -> torch
def test_dataset_items_and_batched_getitems(buffer: ReplayBuffer) -> None:
    ds = UniEnvAsPyTorchDataset(buffer)
    assert len(ds) == ROWS
    one = ds[5]
    assert one["obs"].shape == (16,) and float(one["reward"]) == 6.0
    assert float(ds[np.int64(-1)]["reward"]) == ROWS
    batch = ds.__getitems__([3, 0, 7])
    assert batch["reward"].tolist() == [4.0, 1.0, 8.0]
    assert UniEnvAsPyTorchDataset.collate_fn(batch) is batch
    assert ds[[1, 2]]["reward"].tolist() == [2.0, 3.0]
    assert ds[torch.tensor([2, 3])]["obs"].shape == (2, 16)
    stacked = UniEnvAsPyTorchDataset.collate_fn([ds[0], ds[1]])  # per-sample items: stacked
    assert stacked["reward"].tolist() == [1.0, 2.0]
    with_meta = UniEnvAsPyTorchDataset(buffer, include_metadata=True)
    data, meta = with_meta.__getitems__([0, 1])
    assert meta is None and data["reward"].tolist() == [1.0, 2.0]
    with pytest.raises(TypeError):
        UniEnvAsPyTorchDataset([1, 2, 3])  # type: ignore[arg-type]
    with pytest.raises(IndexError):
        ds.__getitems__([ROWS])


def test_dataloader_calls_getitems_once_per_batch(buffer: ReplayBuffer) -> None:
    calls: List[int] = []
    original = buffer.get_at

    def counting_get_at(idx: Any) -> Any:
        calls.append(len(idx) if hasattr(idx, "__len__") else 1)
        return original(idx)

    buffer.get_at = counting_get_at  # type: ignore[method-assign]
    dl = DataLoader(UniEnvAsPyTorchDataset(buffer), batch_size=64, shuffle=True,
                    collate_fn=UniEnvAsPyTorchDataset.collate_fn)
    got = list(dl)
    assert calls == [64, 64, 64, 64, 44]
    assert sorted(torch.cat([b["reward"] for b in got]).tolist()) == [float(i) for i in range(1, ROWS + 1)]


@pytest.mark.parametrize("ctx", ["fork", "spawn"])
def test_dataloader_workers_map_the_same_file(buffer: ReplayBuffer, ctx: str) -> None:
    ds = UniEnvAsPyTorchDataset(buffer)
    dl = DataLoader(ds, batch_size=50, shuffle=True, collate_fn=UniEnvAsPyTorchDataset.collate_fn, num_workers=2,
                    persistent_workers=True, multiprocessing_context=ctx)
    first = list(dl)
    assert len(first) == ROWS // 50
    for b in first:
        check_rows(b)
    assert sorted(torch.cat([b["reward"] for b in first]).tolist()) == [float(i) for i in range(1, ROWS + 1)]
    # rewrite every row in place: the persistent workers (fork: inherited mapping, spawn: reopened by file name)
    # see the new values, which a pickled copy of the rows could not
    buffer.set_at(slice(0, ROWS), rows(1, ROWS, scale=2.0))
    second = list(dl)
    for b in second:
        check_rows(b, scale=2.0)
    del dl
    deadline = time.monotonic() + 5
    while multiprocessing.active_children() and time.monotonic() < deadline:
        time.sleep(0.02)


# ---------------------------------------------------------------------------------------------------- torch -> UniEnv
class DictDataset(Dataset):  # type: ignore[type-arg]
    def __init__(self, n: int, bad_at: int = -1) -> None:
        self.n, self.bad_at = n, bad_at

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Dict[str, Any]:
        if i == self.bad_at:
            return {"x": torch.zeros(4, dtype=torch.float64), "flag": True, "k": np.int16(i)}
        return {"x": torch.full((3,), float(i)), "flag": bool(i % 2), "k": np.int16(i)}


def test_torch_dataset_as_batch() -> None:
    x = torch.randn(10, 3)
    y = torch.arange(10)
    batch = PyTorchAsUniEnvDataset(TensorDataset(x, y))
    assert len(batch) == 10 and not batch.is_mutable
    sp = batch.single_space
    assert isinstance(sp, TupleSpace)
    assert sp.spaces[0].shape == (3,) and sp.spaces[1].dtype == torch.int64
    a, b = batch.get_at(4)
    assert torch.equal(a, x[4]) and int(b) == 4
    a, b = batch.get_at(np.array([1, 3]))
    assert torch.equal(a, x[[1, 3]]) and b.tolist() == [1, 3]
    a, _ = batch.get_at(slice(0, 10, 5))
    assert torch.equal(a, x[[0, 5]])
    with pytest.raises(NotImplementedError):
        batch.set_at(0, (x[0], y[0]))
    with pytest.raises(IndexError):
        batch.get_at(10)
    sampled = StepSampler(batch, 4, seed=0).sample()
    assert sampled[0].shape == (4, 3)

    d = PyTorchAsUniEnvDataset(DictDataset(6))
    assert isinstance(d.single_space, DictSpace)
    assert isinstance(d.single_space.spaces["flag"], BinarySpace)
    assert d.single_space.spaces["k"].dtype == torch.int16
    got = d.get_at(np.arange(6))
    assert got["x"].shape == (6, 3) and got["flag"].tolist() == [False, True] * 3 and got["k"].dtype == torch.int16
    with pytest.raises(ValueError, match=r"dataset\[2\]\['x'\]"):
        PyTorchAsUniEnvDataset(DictDataset(4, bad_at=2)).get_at(np.arange(4))
    with pytest.raises(ValueError, match="empty"):
        PyTorchAsUniEnvDataset(TensorDataset(torch.zeros(0, 2)))
    with pytest.raises(TypeError, match="cannot infer"):
        PyTorchAsUniEnvDataset(["text"])


def test_round_trip_reads_one_gather(buffer: ReplayBuffer) -> None:
    back = PyTorchAsUniEnvDataset(UniEnvAsPyTorchDataset(buffer))
    assert isinstance(back.single_space, DictSpace) and isinstance(buffer.single_space, DictSpace)
    assert back.single_space.spaces.keys() == buffer.single_space.spaces.keys()
    b = back.get_at(np.array([0, 10, 20]))
    assert b["reward"].tolist() == [1.0, 11.0, 21.0]
    check_rows(b)


# ---------------------------------------------------------------------------------------------------- prefetcher
def test_prefetcher_yields_in_order_and_documents_cpu_pinning() -> None:
    items = [{"a": torch.full((2,), float(i)), "b": (torch.tensor(i), np.int8(i))} for i in range(20)]
    with PinnedPrefetcher(items, depth=3) as pf:
        assert pf.pin_memory == torch.cuda.is_available()
        out = list(pf)
    assert [float(o["a"][0]) for o in out] == list(range(20))
    assert all(o["a"].is_pinned() == torch.cuda.is_available() for o in out)
    assert not pf.is_alive
    assert list(PinnedPrefetcher([], depth=1)) == []
    moved = next(PinnedPrefetcher(items[:1], device="cpu"))
    assert moved["a"].device.type == "cpu"
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="needs CUDA"):
            PinnedPrefetcher(items, pin_memory=True)
    with pytest.raises(ValueError):
        PinnedPrefetcher(items, depth=0)


def test_prefetcher_reraises_source_errors_and_stops_cleanly(buffer: ReplayBuffer) -> None:
    def broken() -> Iterator[int]:
        yield 1
        raise KeyError("bad batch")

    pf = PinnedPrefetcher(broken())
    assert next(pf) == 1
    with pytest.raises(KeyError, match="bad batch"):
        next(pf)
    with pytest.raises(StopIteration):
        next(pf)
    # an endless sampler: close() stops the thread although the queue is full and the source never ends
    before = threading.active_count()
    pf = PinnedPrefetcher(StepSampler(buffer, 32, seed=0), depth=2)
    batches = list(itertools.islice(pf, 5))
    for b in batches:
        check_rows(b)
    time.sleep(0.05)
    pf.close()
    assert not pf.is_alive and threading.active_count() <= before
    pf.close()


def test_prefetcher_over_a_multiprocessing_sampler(buffer: ReplayBuffer) -> None:
    with MultiprocessingSampler(StepSampler(buffer, 16), n_workers=2, n_buffers=4, ctx="fork",
                                shared_memory=True) as ms:
        with PinnedPrefetcher(ms, depth=2) as pf:
            for b in itertools.islice(pf, 10):
                check_rows(b)
    assert not multiprocessing.active_children()


# ---------------------------------------------------------------------------------------------------- samplers as datasets
def test_samplers_serve_every_item_they_can_draw(tmp_path: Any) -> None:
    from unienv_data.samplers import PrioritizedSampler, SegmentSampler, SliceSampler
    from unienv_data.batches import FrameStackedBatch
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rb = ReplayBuffer.create(FlattenedStorage, space(), inner_storage_cls=PytorchTensorStorage, capacity=64)
    for L in (5, 2, 9):                                     # three recorded episodes
        base = len(rb)
        for i in range(L):
            one = rows(base + i + 1, 1)
            rb.append({k: v[0] for k, v in one.items()})
        rb.mark_segment_end()
    slices = SliceSampler(rb, batch_size=4, window=3, seed=0)
    ds = UniEnvAsPyTorchDataset(slices)                      # raised NotImplementedError before
    starts = slices.all_starts()
    assert ds.sampler is slices and len(ds) == len(starts) == (5 - 2) + 0 + (9 - 2)
    want = FrameStackedBatch(rb, 0, 2).get_at(starts)
    got = ds.__getitems__(list(range(len(ds))))
    assert torch.equal(got["obs"], want["obs"]) and torch.equal(ds[1]["reward"], want["reward"][1])
    loader = DataLoader(ds, batch_size=4, shuffle=True, collate_fn=UniEnvAsPyTorchDataset.collate_fn)
    seen = torch.cat([b["reward"][:, 0] for b in loader])
    assert sorted(seen.tolist()) == sorted(want["reward"][:, 0].tolist())
    steps = UniEnvAsPyTorchDataset(StepSampler(rb, batch_size=4))
    assert len(steps) == len(rb) and torch.equal(steps[3]["obs"], rb.get_at(3)["obs"])
    assert len(UniEnvAsPyTorchDataset(PrioritizedSampler(rb, batch_size=4))) == len(rb)
    with pytest.raises(TypeError, match="SliceSampler.*WindowDataset"):
        UniEnvAsPyTorchDataset(SegmentSampler(rb, batch_size=2))
    rb.close()


def test_tensor_collate_turns_numpy_batches_into_tensors_without_a_copy() -> None:
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    out = UniEnvAsPyTorchDataset.tensor_collate_fn({"x": a, "t": (a[:, 0].copy(),)})
    assert isinstance(out["x"], torch.Tensor) and out["x"].data_ptr() == a.ctypes.data
    assert isinstance(out["t"][0], torch.Tensor)
