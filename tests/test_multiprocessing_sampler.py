"""MultiprocessingSampler with real worker processes (fork and spawn)."""
from __future__ import annotations

import gc
import multiprocessing
import os
import pickle
import subprocess
import sys
import tempfile
import time
import warnings
from typing import Any, Dict, Iterator

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from unienv_data.replay_buffer import ReplayBuffer  # noqa: E402
from unienv_data.samplers import StepSampler  # noqa: E402
from unienv_data.samplers.multiprocessing_sampler import MultiprocessingSampler, SamplerWorkerError  # noqa: E402
from unienv_data.storages.flattened import FlattenedStorage  # noqa: E402
from unienv_data.storages.pytorch import PytorchTensorStorage  # noqa: E402
from unienv_interface.backends.pytorch import PyTorchComputeBackend as B  # noqa: E402
from unienv_interface.space import BinarySpace, BoxSpace, DictSpace  # noqa: E402
from unienv_interface.space.space_utils import batch_utils, flatten_utils  # noqa: E402

ROWS = 600


def w1_space() -> DictSpace:
    f32 = B.dtype_from_name("float32")
    return DictSpace(B, {"obs": BoxSpace(B, -np.inf, np.inf, f32, shape=(64,)),
                         "action": BoxSpace(B, -1.0, 1.0, f32, shape=(8,)),
                         "reward": BoxSpace(B, -np.inf, np.inf, f32, shape=()),
                         "terminated": BinarySpace(B, ())})


def coded_rows(start: int, n: int) -> Dict[str, Any]:
    """Rows whose every field is a function of the row id (ids start at 1, so a zero row was never written)."""
    ids = torch.arange(start, start + n, dtype=torch.float32)
    return {"obs": ids[:, None].repeat(1, 64), "action": ((ids % 7) / 7.0)[:, None].repeat(1, 8),
            "reward": ids, "terminated": (ids.to(torch.int64) % 10) == 0}


def assert_coded(batch: Dict[str, Any], batch_size: int) -> None:
    ids = batch["reward"]
    assert batch["obs"].shape == (batch_size, 64) and batch["obs"].dtype == torch.float32
    assert batch["action"].shape == (batch_size, 8) and batch["terminated"].dtype == torch.bool
    assert bool((ids >= 1).all()), "a row that was never written was sampled"
    assert torch.equal(batch["obs"], ids[:, None].expand(-1, 64))
    assert torch.equal(batch["action"], ((ids % 7) / 7.0)[:, None].expand(-1, 8))
    assert torch.equal(batch["terminated"], (ids.to(torch.int64) % 10) == 0)


def make_buffer(path: Any, capacity: int = ROWS, rows: int = ROWS, multiprocessing: bool = False) -> ReplayBuffer:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # bool promoted into the float row
        rb = ReplayBuffer.create(FlattenedStorage, w1_space(), inner_storage_cls=PytorchTensorStorage,
                                 cache_path=str(path), capacity=capacity, multiprocessing=multiprocessing)
    if rows:
        rb.extend(coded_rows(1, rows))
    return rb


def no_children_left() -> bool:
    deadline = time.monotonic() + 5
    while multiprocessing.active_children() and time.monotonic() < deadline:
        time.sleep(0.02)
    return not multiprocessing.active_children()


@pytest.fixture
def buffer(tmp_path: Any) -> Iterator[ReplayBuffer]:
    rb = make_buffer(tmp_path / "rb")
    yield rb
    rb.close()


# ---------------------------------------------------------------------------------------------------- samplers used by
# the tests (module level so that spawned workers can import them)
class FailingSampler(StepSampler):
    """Raises in `sample()` (inside the worker)."""

    def sample(self) -> Any:
        raise ValueError(f"boom from pid {os.getpid()}")


class CrashingSampler(StepSampler):
    """Kills its worker process in `sample()`."""

    def sample(self) -> Any:
        os._exit(3)


class UnseedableSampler(StepSampler):
    """Fails while its worker starts (workers reseed their sampler before serving)."""

    def manual_seed(self, seed: int) -> None:
        raise RuntimeError("cannot seed this sampler here")


# ---------------------------------------------------------------------------------------------------- tests
def test_import_does_not_need_torch() -> None:
    code = ("import sys, unienv_data, unienv_data.samplers.multiprocessing_sampler, unienv_data.integrations; "
            "assert 'torch' not in sys.modules, 'torch was imported'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


@pytest.mark.parametrize("shared_memory", [False, True])
def test_fork_batches_are_valid_rows(buffer: ReplayBuffer, shared_memory: bool) -> None:
    inner = StepSampler(buffer, 32, seed=0)
    reference = inner.sample()
    with MultiprocessingSampler(inner, n_workers=2, n_buffers=4, ctx="fork", shared_memory=shared_memory,
                                seed=1) as ms:
        assert len(ms) == ROWS and ms.batch_size == 32 and len(ms.worker_pids) == 2
        seen = []
        for _ in range(12):
            b = ms.sample()
            assert set(b) == set(reference)
            assert all(b[k].dtype == reference[k].dtype and b[k].shape == reference[k].shape for k in b)
            assert_coded(b, 32)
            seen.append(tuple(b["reward"].tolist()))
        # reseeded workers: no two batches repeat (forked copies of one generator would produce pairs)
        assert len(set(seen)) == len(seen)
        flat = ms.sample_flat()
        assert flat.shape == (32, 74) and flat.dtype == torch.float32
        structured = flatten_utils.unflatten_data(batch_utils.batch_space(w1_space(), 32), flat, start_dim=1)
        assert_coded(structured, 32)
        ids = structured["reward"].to(torch.int64).numpy() - 1  # no wrap: logical index = id - 1
        assert torch.equal(flat, buffer.get_flattened_at(ids))
        data, meta = ms.sample_with_metadata()
        assert meta is None
        assert_coded(data, 32)
    assert ms.closed
    assert no_children_left()
    with pytest.raises(RuntimeError, match="closed"):
        ms.sample()


def test_shared_memory_gives_the_same_batches_as_the_pipe(buffer: ReplayBuffer) -> None:
    # one worker with a fixed seed draws a fixed stream; each kind gets its own sampler, because how many batches of
    # one kind are prefetched before another kind is asked for depends on timing
    runs = []
    for shm in (False, True):
        got: list = []
        for method in ("sample", "sample_flat"):
            with MultiprocessingSampler(StepSampler(buffer, 16), n_workers=1, n_buffers=3, ctx="fork",
                                        shared_memory=shm, seed=7) as ms:
                got.extend(getattr(ms, method)() for _ in range(4))
        runs.append(got)
    for a, b in zip(*runs):
        if isinstance(a, dict):
            assert all(torch.equal(a[k], b[k]) and a[k].dtype == b[k].dtype for k in a)
        else:
            assert torch.equal(a, b)
    assert no_children_left()


def test_a_batch_larger_than_a_slot_goes_through_the_pipe(buffer: ReplayBuffer) -> None:
    with MultiprocessingSampler(StepSampler(buffer, 16), n_workers=1, ctx="fork", shared_memory=True,
                                slot_bytes=256) as ms:
        with pytest.warns(RuntimeWarning, match="slot_bytes"):
            b = ms.sample()
        assert_coded(b, 16)


def test_errors_are_not_replayed_once_their_cause_is_gone(tmp_path: Any) -> None:
    rb = make_buffer(tmp_path / "empty", capacity=100, rows=0, multiprocessing=True)
    with MultiprocessingSampler(StepSampler(rb, 8), n_workers=2, n_buffers=4, ctx="fork") as ms:
        with pytest.raises(IndexError, match="empty"):
            ms.sample()
        rb.extend(coded_rows(1, 50))
        assert_coded(ms.sample(), 8)  # not one of the failures prefetched while the buffer was empty
        child = multiprocessing.get_context("fork").Process(target=_use_in_forked_child, args=(ms,))
        child.start()
        child.join(10)
        assert child.exitcode == 0, "a forked copy of the sampler must refuse to run"
    rb.close()


def _use_in_forked_child(ms: MultiprocessingSampler) -> None:
    try:
        ms.sample()
    except RuntimeError as exc:
        os._exit(0 if "forked copy" in str(exc) else 1)
    os._exit(2)


def test_manual_seed_restarts_the_worker_streams(buffer: ReplayBuffer) -> None:
    with MultiprocessingSampler(StepSampler(buffer, 8), n_workers=1, n_buffers=2, ctx="fork", seed=3) as ms:
        first = [ms.sample()["reward"] for _ in range(3)]
        ms.manual_seed(3)
        again = [ms.sample()["reward"] for _ in range(3)]
        ms.manual_seed(4)
        other = ms.sample()["reward"]
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    assert not torch.equal(first[0], other)


def test_epoch_iterators_cover_every_row_once(buffer: ReplayBuffer) -> None:
    with MultiprocessingSampler(StepSampler(buffer, 64), n_workers=2, n_buffers=3, ctx="fork",
                                shared_memory=True) as ms:
        batches = list(ms.epoch_iter())
        assert [len(b["reward"]) for b in batches] == [64] * 9 + [ROWS - 9 * 64]
        ids = torch.cat([b["reward"] for b in batches])
        assert sorted(ids.tolist()) == list(range(1, ROWS + 1))
        for b in batches:
            assert_coded(b, len(b["reward"]))
        flat = torch.cat(list(ms.epoch_flat_iter()))
        assert flat.shape == (ROWS, 74)
        # abandoning an epoch early leaves the sampler usable
        it = ms.epoch_iter()
        next(it)
        it.close()  # type: ignore[attr-defined]  # a generator
        assert_coded(ms.sample(), 64)


def test_worker_exception_is_reraised_with_its_traceback(buffer: ReplayBuffer) -> None:
    with MultiprocessingSampler(FailingSampler(buffer, 4), n_workers=2, n_buffers=2, ctx="fork") as ms:
        with pytest.raises(ValueError, match="boom from pid") as info:
            ms.sample()
        text = info.value.remote_traceback  # type: ignore[attr-defined]
        assert "in sample" in text and "Traceback" in text and "FailingSampler" not in str(info.value)
        assert "boom from pid" in str(info.value.__cause__)
        assert int(str(info.value).rsplit(" ", 1)[1]) in ms.worker_pids
        # the worker survives its exception: the next call fails the same way, not with a dead worker
        with pytest.raises(ValueError):
            ms.sample()
        # other kinds of requests still work
        assert ms.sample_flat().shape == (4, 74)
    assert no_children_left()


def test_worker_crash_surfaces_in_the_parent(buffer: ReplayBuffer) -> None:
    ms = MultiprocessingSampler(CrashingSampler(buffer, 4), n_workers=2, n_buffers=2, ctx="fork")
    with pytest.raises(SamplerWorkerError, match="exited with code 3"):
        ms.sample()
    assert ms.closed
    assert no_children_left()


def test_close_is_clean_idempotent_and_runs_on_garbage_collection(buffer: ReplayBuffer) -> None:
    ms = MultiprocessingSampler(StepSampler(buffer, 8), n_workers=3, n_buffers=6, ctx="fork", shared_memory=True)
    def shm_files() -> list:
        return [f for f in os.listdir(shm_dir) if f.startswith(f"unienv-sampler-{os.getpid()}-")]

    shm_dir = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
    deadline = time.monotonic() + 10
    while shm_files() and time.monotonic() < deadline:  # unlinked once every worker has mapped it
        ms.sample()
    assert shm_files() == []
    ms.close()
    ms.close()
    assert no_children_left()
    ms2 = MultiprocessingSampler(StepSampler(buffer, 8), n_workers=2, ctx="fork")
    pids = list(ms2.worker_pids)
    assert len(multiprocessing.active_children()) == 2
    del ms2
    gc.collect()
    assert no_children_left()
    for pid in pids:
        assert pid is not None
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_a_blocked_worker_is_stopped_by_close(buffer: ReplayBuffer) -> None:
    # many large batches requested and never read: the workers block on full pipes, close() must still finish
    ms = MultiprocessingSampler(StepSampler(buffer, 512), n_workers=2, n_buffers=8, ctx="fork")
    ms._top_up("sample")
    time.sleep(0.3)
    t0 = time.monotonic()
    ms.close(timeout=2.0)
    assert time.monotonic() - t0 < 8.0
    assert no_children_left()


def test_sampling_while_another_process_writes(tmp_path: Any) -> None:
    rb = make_buffer(tmp_path / "live", capacity=8000, rows=200, multiprocessing=True)
    writer = multiprocessing.get_context("fork").Process(target=_write_more, args=(rb, 201, 3000, 100))
    with MultiprocessingSampler(StepSampler(rb, 64), n_workers=2, n_buffers=4, ctx="fork",
                                shared_memory=True) as ms:
        writer.start()
        newest = 0.0
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            b = ms.sample()
            assert_coded(b, 64)  # only committed rows, never a reserved-but-unwritten (zero) row
            newest = max(newest, float(b["reward"].max()))
            if newest > 1000 and not writer.is_alive():
                break
        writer.join(10)
    assert writer.exitcode == 0
    assert newest > 1000, "rows appended by another process never reached the workers"
    assert len(rb) == 3200
    rb.close()


def _write_more(rb: ReplayBuffer, start: int, n: int, chunk: int) -> None:
    for s in range(start, start + n, chunk):
        rb.extend(coded_rows(s, chunk))
        time.sleep(0.002)


def test_spawn_workers_reopen_the_buffer_by_file_name(tmp_path: Any) -> None:
    # a multiprocessing buffer: its lock and shared counters travel to the spawned worker with the sampler
    rb = make_buffer(tmp_path / "spawned", capacity=1000, rows=200, multiprocessing=True)
    with MultiprocessingSampler(StepSampler(rb, 32), n_workers=1, n_buffers=4, ctx="spawn",
                                shared_memory=True, seed=0) as ms:
        assert_coded(ms.sample(), 32)
        # the worker mapped the same file: an in-place write by the parent reaches it ...
        rb.set_at(slice(0, 200), coded_rows(1, 200) | {"action": torch.zeros(200, 8)})
        ms.manual_seed(1)  # drops batches prefetched before the write
        assert torch.equal(ms.sample()["action"], torch.zeros(32, 8))
        # ... and so do rows appended later (shared counters)
        rb.extend(coded_rows(201, 800))
        newest = max(float(ms.sample()["reward"].max()) for _ in range(20))
        assert newest > 200
    assert no_children_left()
    rb.close()


@pytest.mark.parametrize("wait", [0.0, 0.5])
def test_start_failure_reports_the_worker_traceback(buffer: ReplayBuffer, wait: float) -> None:
    ms = MultiprocessingSampler(UnseedableSampler(buffer, 4), n_workers=2, ctx="fork")
    time.sleep(wait)  # 0.5: the workers are gone before the first request is sent
    with pytest.raises(SamplerWorkerError, match="failed to start") as info:
        ms.sample()
    assert "cannot seed this sampler here" in str(info.value)
    assert "in manual_seed" in (info.value.remote_traceback or "")
    assert ms.closed and no_children_left()


def test_arguments_are_checked(buffer: ReplayBuffer) -> None:
    inner = StepSampler(buffer, 4)
    with pytest.raises(TypeError):
        MultiprocessingSampler(buffer, n_workers=1)  # type: ignore[arg-type]
    for kwargs in ({"n_workers": 0}, {"n_buffers": -1}, {"doze_time": 0}, {"seed": -1}, {"timeout": 0}):
        with pytest.raises(ValueError):
            MultiprocessingSampler(inner, ctx="fork", **kwargs)  # type: ignore[arg-type]
    assert not multiprocessing.active_children()
    with MultiprocessingSampler(inner, n_workers=1, ctx="fork") as ms:
        with pytest.raises(TypeError, match="cannot be pickled"):
            pickle.dumps(ms)
        with pytest.raises(TypeError):
            MultiprocessingSampler(ms, n_workers=1)
    assert no_children_left()


# ---------------------------------------------------------------------------------------------------- the parts
# (_mp_packing, _mp_slots, _mp_worker: private modules, tested here because this sampler is their only user)
def test_packing_round_trips_every_kind_of_leaf() -> None:
    from unienv_data.samplers._mp_packing import ALIGN, pack, unpack

    batch = {"np": np.arange(12, dtype=np.int16).reshape(3, 4), "t": torch.linspace(0, 1, 5),
             "bf16": torch.tensor([1.5, -2.0, 3.25], dtype=torch.bfloat16),
             "nested": (np.zeros((0, 3), dtype=np.float64), [torch.ones(2, 2, dtype=torch.bool), "text", 7]),
             "objects": np.array([{"a": 1}], dtype=object)}
    slot = np.zeros(1024, dtype=np.uint8)
    spec, payload = pack(batch, slot)
    assert payload is None, "a batch that fits goes into the slot"
    with pytest.raises(TypeError):  # an unhashable leaf: the worker sends this layout with every batch
        hash(spec)
    hash(pack({k: v for k, v in batch.items() if k != "objects"}, slot)[0])  # else sent once, then by id
    out = unpack(spec, slot, copy=True)
    slot[:] = 0xFF  # the slot is reused by the next batch: nothing returned may alias it
    assert set(out) == set(batch)
    assert type(out["np"]) is np.ndarray and np.array_equal(out["np"], batch["np"])
    assert type(out["t"]) is torch.Tensor and torch.equal(out["t"], batch["t"])
    assert out["bf16"].dtype == torch.bfloat16 and torch.equal(out["bf16"], batch["bf16"])
    empty, rest = out["nested"]
    assert type(out["nested"]) is tuple and type(rest) is list
    assert empty.shape == (0, 3) and empty.dtype == np.float64
    assert torch.equal(rest[0], batch["nested"][1][0]) and rest[1:] == ["text", 7]
    assert out["objects"][0] == {"a": 1}  # an object array travels by pickle, inside the description
    offsets = [leaf[3] for leaf in (spec[1][0][1], spec[1][1][1], spec[1][2][1])]
    assert all(off % ALIGN == 0 for off in offsets)


def test_packing_falls_back_to_a_payload_when_the_slot_is_too_small() -> None:
    from unienv_data.samplers._mp_packing import pack, unpack

    batch = [np.arange(100, dtype=np.float32), torch.arange(10)]
    spec, payload = pack(batch, np.zeros(64, dtype=np.uint8))
    assert payload is not None
    out = unpack(spec, np.frombuffer(payload, dtype=np.uint8), copy=False)
    assert np.array_equal(out[0], batch[0]) and torch.equal(out[1], batch[1])
    spec, payload = pack(batch, None)  # no slot at all (shared_memory=False)
    assert payload is not None and np.array_equal(unpack(spec, np.frombuffer(payload, np.uint8), True)[0], batch[0])


def test_slot_size_fits_a_batch_and_checks_slot_bytes(buffer: ReplayBuffer) -> None:
    from unienv_data.samplers._mp_packing import ALIGN, pack
    from unienv_data.samplers._mp_slots import slot_size

    inner = StepSampler(buffer, 32, seed=0)
    size = slot_size(inner, None)
    assert size % ALIGN == 0
    for batch in (inner.sample(), inner.sample_flat()):
        assert pack(batch, np.zeros(size, dtype=np.uint8))[1] is None, "the default slot must hold a batch"
    assert slot_size(inner, 100) == 128
    for bad in (0, -5, True, 1.5):
        with pytest.raises(ValueError, match="slot_bytes"):
            slot_size(inner, bad)  # type: ignore[arg-type]


def test_worker_entry_point_and_sampler_carrier_survive_pickling(buffer: ReplayBuffer) -> None:
    # spawn and forkserver pickle the process target by reference and the carrier by value
    from unienv_data.samplers._mp_worker import Carrier, worker_main

    assert pickle.loads(pickle.dumps(worker_main)) is worker_main
    carried = pickle.loads(pickle.dumps(Carrier({"seed": torch.Generator().manual_seed(5).get_state()})))
    assert torch.equal(carried.get()["seed"], torch.Generator().manual_seed(5).get_state())
    assert Carrier(buffer).get() is buffer  # under fork the sampler is inherited, not copied


def test_spawn_start_failure_reports_the_worker_traceback(tmp_path: Any) -> None:
    rb = make_buffer(tmp_path / "spawn-fail", capacity=100, rows=50, multiprocessing=True)
    ms = MultiprocessingSampler(UnseedableSampler(rb, 4), n_workers=1, ctx="spawn", shared_memory=True)
    with pytest.raises(SamplerWorkerError, match="failed to start") as info:
        ms.sample()
    assert "cannot seed this sampler here" in (info.value.remote_traceback or "")
    assert ms.closed and no_children_left()
    rb.close()
