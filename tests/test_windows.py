"""`unienv_data.batches.windows.WindowDataset` on real replay buffers (memory-mapped DictStorage columns and a
FlattenedStorage read by whole rows), checked against a brute-force oracle over recorded episode ids; as a torch
Dataset through DataLoaders with 0 and 2 workers (plain and `shared_memory_dataloader`), and as a sampler source.
"""
from __future__ import annotations

import gc
import warnings
from pathlib import Path
from typing import Any, Dict, Iterator, List, Sequence, Tuple

import numpy as np
import pytest

from unienv_data.base.common import BatchBase
from unienv_data.batches import WindowDataset
from unienv_data.replay_buffer import ReplayBuffer
from unienv_data.samplers import StepSampler
from unienv_data.stats import compute_stats, write_stats
from unienv_data.storages.dict_storage import DictStorage
from unienv_data.storages.flattened import FlattenedStorage
from unienv_data.storages.numpy_memmap import NumpyMemmapStorage
from unienv_interface.backends import NumpyComputeBackend as B
from unienv_interface.space import BoxSpace, DictSpace

LENGTHS = (5, 1, 7, 3, 9)


def step_space() -> DictSpace:
    return DictSpace(B, {
        "observation.image": BoxSpace(B, 0, 250, B.dtype_from_name("uint8"), shape=(4, 4, 3)),
        "action": BoxSpace(B, -np.inf, np.inf, B.dtype_from_name("float32"), shape=(2,)),
        "obs": DictSpace(B, {"pos": BoxSpace(B, -np.inf, np.inf, B.dtype_from_name("float64"), shape=(3,))}),
        "ep": BoxSpace(B, 0, 10 ** 6, B.dtype_from_name("int64"), shape=()),
    })


def make_rows(ep: int, t0: int, n: int, g0: int) -> Dict[str, Any]:
    g = np.arange(g0, g0 + n)
    return {"observation.image": (g[:, None, None, None] + np.zeros((n, 4, 4, 3), np.int64)).astype(np.uint8) % 251,
            "action": np.stack([g, -g], axis=1).astype(np.float32),
            "obs": {"pos": np.stack([g, g * 0.5, np.full(n, ep)], axis=1).astype(np.float64)},
            "ep": np.full(n, ep, np.int64)}


def append_episode(rb: ReplayBuffer, rows: Dict[str, Any]) -> None:
    """One recorded episode (`append` per step, then `mark_segment_end`; `extend` records no episode)."""
    n = rows["ep"].shape[0]
    for i in range(n):
        rb.append({"observation.image": rows["observation.image"][i], "action": rows["action"][i],
                   "obs": {"pos": rows["obs"]["pos"][i]}, "ep": rows["ep"][i]})
    rb.mark_segment_end()


def record(rb: ReplayBuffer, lengths: Sequence[int]) -> None:
    g = 0
    for ep, L in enumerate(lengths):
        append_episode(rb, make_rows(ep, 0, L, g))
        g += L


@pytest.fixture(params=["dict-memmap", "flattened"])
def buffer(request: Any, tmp_path: Path) -> Iterator[ReplayBuffer]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if request.param == "dict-memmap":
            rb = ReplayBuffer.create(DictStorage, step_space(), {"observation.image": NumpyMemmapStorage,
                                                                 "action": NumpyMemmapStorage,
                                                                 "obs/pos": NumpyMemmapStorage, "ep": NumpyMemmapStorage},
                                     cache_path=tmp_path / "rb", capacity=64)
        else:
            rb = ReplayBuffer.create(FlattenedStorage, step_space(), inner_storage_cls=NumpyMemmapStorage,
                                     capacity=64)
    record(rb, LENGTHS)
    yield rb
    rb.close()


def episodes_of(lengths: Sequence[int]) -> List[Tuple[int, int]]:
    ends = np.cumsum(lengths)
    return [(int(e - L), int(e)) for L, e in zip(lengths, ends)]


def oracle(lengths: Sequence[int], anchors: np.ndarray, offsets: Sequence[int]) -> Tuple[np.ndarray, np.ndarray]:
    """`(source row, is_pad)` of every window frame, by brute force over the episode list."""
    eps = episodes_of(lengths)
    rows = np.zeros((len(anchors), len(offsets)), np.int64)
    pad = np.zeros_like(rows, dtype=bool)
    for i, a in enumerate(anchors):
        s, e = next((s, e) for s, e in eps if s <= a < e)
        for j, o in enumerate(offsets):
            f = int(a) + int(o)
            pad[i, j] = not s <= f < e
            rows[i, j] = min(max(f, s), e - 1)
    return rows, pad


WINDOWS = {"observation.image": [-1, 0], "action": range(4), "obs/pos": [-2, 1, 3]}


def test_windows_match_a_brute_force_oracle_and_never_cross_episodes(buffer: ReplayBuffer) -> None:
    ds = WindowDataset(buffer, WINDOWS, pad=True)
    assert len(ds) == sum(LENGTHS)
    everything = buffer.get_at(np.arange(len(buffer)))
    items = np.arange(len(ds))
    got = ds.__getitems__(items.tolist())
    assert np.array_equal(got["index"], ds.anchors) and np.array_equal(ds.anchors, np.arange(sum(LENGTHS)))
    ep_of = everything["ep"]
    for key, offs in WINDOWS.items():
        rows, pad = oracle(LENGTHS, ds.anchors, list(offs))
        leaf = everything["obs"]["pos"] if key == "obs/pos" else everything[key]
        np.testing.assert_array_equal(got[key], leaf[rows])
        np.testing.assert_array_equal(got[key + "_is_pad"], pad)
        assert (ep_of[rows] == ep_of[ds.anchors][:, None]).all()      # never another episode's data
    np.testing.assert_array_equal(got["episode_index"], ep_of[ds.anchors])
    one = ds[7]                                                         # a single item: no batch axis
    assert one["observation.image"].shape == (2, 4, 4, 3) and one["action_is_pad"].shape == (4,)
    for k in one:
        np.testing.assert_array_equal(one[k], got[k][7])
    assert ds.single_space.contains(one)


def test_pad_false_keeps_only_windows_inside_an_episode(buffer: ReplayBuffer) -> None:
    ds = WindowDataset(buffer, {"action": range(-1, 3)}, pad=False)
    want = [a for s, e in episodes_of(LENGTHS) for a in range(s, e) if a - 1 >= s and a + 2 < e]
    np.testing.assert_array_equal(ds.anchors, want)
    got = ds.get_at(slice(None))
    assert not got["action_is_pad"].any()
    np.testing.assert_array_equal(got["action"][:, :, 0], np.asarray(want)[:, None] + np.arange(-1, 3))


def test_keys_flat_dotted_nested_and_errors(buffer: ReplayBuffer) -> None:
    ds = WindowDataset(buffer, {("obs", "pos"): [0], "observation.image": [0]})
    assert set(ds.single_space.spaces) >= {"obs/pos", "observation.image", "obs/pos_is_pad"}
    with pytest.raises(KeyError, match="available leaves.*observation.image"):
        WindowDataset(buffer, {"observation": [0]})
    with pytest.raises(KeyError, match="'obs/vel'"):
        WindowDataset(buffer, {"obs/vel": [0]})
    with pytest.raises(ValueError, match="int step offsets"):
        WindowDataset(buffer, {"action": [0.0, 0.1]})
    with pytest.raises(ValueError, match="normalize needs stats"):
        WindowDataset(buffer, {"action": [0]}, normalize={"action": "mean_std"})


class CountingBatch(BatchBase):
    """A real read-through view of a buffer that records the size of every read (and offers no column views)."""

    def __init__(self, inner: ReplayBuffer) -> None:
        super().__init__(inner.single_space)
        self.inner = inner
        self.reads: List[int] = []

    def __len__(self) -> int:
        return len(self.inner)

    def get_at(self, idx: Any) -> Any:
        self.reads.append(int(np.asarray(idx).size))
        return self.inner.get_at(idx)

    def get_segments(self) -> Any:
        return self.inner.episode_segments()


def test_a_batch_is_one_read_not_one_per_sample(buffer: ReplayBuffer) -> None:
    src = CountingBatch(buffer)
    ds = WindowDataset(src, WINDOWS)
    src.reads.clear()
    ds.__getitems__(list(range(16)))
    assert len(src.reads) == 1                   # keys without a column view share one read of the distinct rows
    assert src.reads[0] <= 16 + 2 + 4 + 3


def test_normalisation_with_stats_written_beside_the_dataset(buffer: ReplayBuffer, tmp_path: Path) -> None:
    doc = compute_stats(buffer)
    write_stats(tmp_path, doc)
    ds = WindowDataset(buffer, {"action": [0, 1], "observation.image": [0], "obs/pos": [0]}, stats=tmp_path,
                       normalize={"action": "mean_std", "observation.image": "min_max", "obs/pos": "quantile"})
    got = ds.get_at(np.arange(len(ds)))
    raw = WindowDataset(buffer, {"action": [0, 1], "observation.image": [0], "obs/pos": [0]}).get_at(
        np.arange(len(ds)))
    a = np.asarray(doc["features"]["action"]["mean"]), np.asarray(doc["features"]["action"]["std"])
    assert got["action"].dtype == np.float32
    np.testing.assert_allclose(got["action"], (raw["action"] - a[0]) / a[1], rtol=1e-5, atol=1e-5)
    img = got["observation.image"]
    assert img.min() >= -1 - 1e-6 and img.max() <= 1 + 1e-6 and img.min() < -0.9 and img.max() > 0.9
    f = doc["features"]["obs/pos"]
    lo, hi = np.asarray(f["q01"]), np.asarray(f["q99"])
    want = (raw["obs/pos"] - (lo + hi) / 2) / np.where(hi > lo, (hi - lo) / 2, 1.0)
    np.testing.assert_allclose(got["obs/pos"], want, rtol=1e-5, atol=1e-5)
    assert ds.single_space.contains(ds[0])


def test_stats_of_another_dataset_are_refused_naming_key_and_shapes(buffer: ReplayBuffer, tmp_path: Path) -> None:
    doc = compute_stats(buffer)
    doc["features"]["action"] = {**doc["features"]["action"], **{s: 0.5 for s in ("mean", "std", "min", "max")}}
    write_stats(tmp_path, doc)                   # scalar action stats (another dataset's) for a 2-d action
    with pytest.raises(ValueError, match=r"'action'.*shape \(\).*leaf shape is \(2,\)"):
        WindowDataset(buffer, {"action": [0]}, stats=tmp_path, normalize={"action": "mean_std"})
    del doc["features"]["obs/pos"]
    write_stats(tmp_path, doc)
    with pytest.raises(KeyError, match="stats.json.*'obs/pos'"):
        WindowDataset(buffer, {"obs/pos": [0]}, stats=tmp_path, normalize={"obs/pos": "mean_std"})


def test_a_sampler_draws_reproducible_random_batches_of_windows(buffer: ReplayBuffer) -> None:
    ds = WindowDataset(buffer, WINDOWS)
    a = StepSampler(ds, batch_size=8, seed=3).sample()
    b = StepSampler(ds, batch_size=8, seed=3).sample()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])
    direct = ds.get_at(np.asarray(a["index"]))
    for k in a:
        np.testing.assert_array_equal(a[k], direct[k])


def test_refresh_sees_new_episodes(buffer: ReplayBuffer) -> None:
    ds = WindowDataset(buffer, {"action": [0, 1]})
    n = len(ds)
    append_episode(buffer, make_rows(9, 0, 4, 100))
    assert len(ds) == n
    ds.refresh()
    assert len(ds) == n + 4 and ds.get_at(len(ds) - 1)["action_is_pad"].tolist() == [False, True]


# ---------------------------------------------------------------------------------------------- torch
torch = pytest.importorskip("torch")


@pytest.fixture
def disk_buffer(tmp_path: Path) -> Iterator[ReplayBuffer]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rb = ReplayBuffer.create(DictStorage, step_space(), {"observation.image": NumpyMemmapStorage,
                                                             "action": NumpyMemmapStorage,
                                                             "obs/pos": NumpyMemmapStorage, "ep": NumpyMemmapStorage},
                                 cache_path=tmp_path / "rb", capacity=64)
        record(rb, LENGTHS)
        rb.dumps(tmp_path / "rb")
        rb.close()
        rb = ReplayBuffer.load_from(tmp_path / "rb", backend=B)
    yield rb
    rb.close()


def collect(loader: Any) -> Dict[str, np.ndarray]:
    parts: Dict[str, List[np.ndarray]] = {}
    for batch in loader:
        for k, v in batch.items():
            assert isinstance(v, torch.Tensor), (k, type(v))
            parts.setdefault(k, []).append(v.numpy().copy())
    return {k: np.concatenate(v) for k, v in parts.items()}


@pytest.mark.parametrize("workers", [0, 2])
def test_dataloader_with_the_tensor_collate(disk_buffer: ReplayBuffer, workers: int) -> None:
    from torch.utils.data import DataLoader
    ds = WindowDataset(disk_buffer, WINDOWS)
    loader = DataLoader(ds, batch_size=8, shuffle=False, num_workers=workers, collate_fn=WindowDataset.collate_fn)
    got = collect(loader)
    want = ds.get_at(np.arange(len(ds)))
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])


@pytest.mark.parametrize("workers,ctx", [(0, None), (2, "fork"), (2, "spawn")])
def test_shared_memory_dataloader_serves_every_window(disk_buffer: ReplayBuffer, workers: int, ctx: Any) -> None:
    from unienv_data.integrations import torch_loader
    ds = WindowDataset(disk_buffer, WINDOWS)
    kw = {} if ctx is None else {"multiprocessing_context": ctx}
    loader = torch_loader.shared_memory_dataloader(ds, 6, shuffle=True, seed=1, num_workers=workers, n_slots=3, **kw)
    got = collect(loader)
    order = np.argsort(got["index"])
    assert np.array_equal(got["index"][order], np.arange(len(ds)))       # every window once
    want = ds.get_at(np.arange(len(ds)))
    for k in want:
        np.testing.assert_array_equal(got[k][order], want[k])
    if workers:
        path = next(p for p, v in torch_loader._MAPPED.items() if v[2] is not None and p in str(loader.dataset.path))
        gc.collect()
        assert len(torch_loader._MAPPED[path][2]) == 3                     # every slot came back
        kept = list(iter(loader))                                          # batches kept alive: fallback, no hang
        assert sum(int(b["index"].shape[0]) for b in kept) == len(ds)
        del kept
        gc.collect()
        assert len(torch_loader._MAPPED[path][2]) == 3
        del loader
        gc.collect()
        assert path not in torch_loader._MAPPED and not Path(path).exists()


def test_shared_memory_dataloader_batches_own_distinct_memory(disk_buffer: ReplayBuffer) -> None:
    from unienv_data.integrations.torch_loader import shared_memory_dataloader
    ds = WindowDataset(disk_buffer, {"action": [0]})
    loader = shared_memory_dataloader(ds, 4, shuffle=False, num_workers=2, n_slots=8)
    batches = list(loader)                     # all alive at once: no slot may be handed out twice
    idx = np.concatenate([b["index"].numpy() for b in batches])
    assert np.array_equal(idx, np.arange(len(ds)))
    for b in batches:
        np.testing.assert_array_equal(b["action"][:, 0, 0].numpy(), b["index"].numpy().astype(np.float32))


def test_windows_on_a_torch_backed_buffer_match_the_numpy_ones() -> None:
    from unienv_data.storages.pytorch import PytorchTensorStorage
    from unienv_interface.backends.pytorch import PyTorchComputeBackend as TB
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tsp = step_space().to(TB)
        trb = ReplayBuffer.create(FlattenedStorage, tsp, inner_storage_cls=PytorchTensorStorage, capacity=64)
        nrb = ReplayBuffer.create(FlattenedStorage, step_space(), inner_storage_cls=NumpyMemmapStorage, capacity=64)
    g = 0
    for ep, L in enumerate(LENGTHS):
        rows = make_rows(ep, 0, L, g)
        append_episode(nrb, rows)
        for i in range(L):
            trb.append({"observation.image": torch.from_numpy(rows["observation.image"][i]),
                        "action": torch.from_numpy(rows["action"][i]),
                        "obs": {"pos": torch.from_numpy(rows["obs"]["pos"][i])},
                        "ep": torch.tensor(rows["ep"][i])})
        trb.mark_segment_end()
        g += L
    doc = compute_stats(nrb)
    kw = dict(stats=doc, normalize={"action": "mean_std"})
    t = WindowDataset(trb, WINDOWS, **kw).get_at(np.arange(sum(LENGTHS)))
    n = WindowDataset(nrb, WINDOWS, **kw).get_at(np.arange(sum(LENGTHS)))
    for k in n:
        assert isinstance(t[k], torch.Tensor), k
        np.testing.assert_allclose(t[k].numpy(), n[k], rtol=1e-6, err_msg=k)
    trb.close()
    nrb.close()


@pytest.mark.parametrize("persistent", [False, True])
def test_an_abandoned_epoch_gives_its_slots_back(disk_buffer: ReplayBuffer, persistent: bool) -> None:
    from unienv_data.integrations import torch_loader
    ds = WindowDataset(disk_buffer, {"action": [0]})
    loader = torch_loader.shared_memory_dataloader(ds, 2, shuffle=False, num_workers=2, n_slots=6,
                                                   persistent_workers=persistent)
    path = loader.dataset.path
    for _ in range(3):                                   # break early, three times: batches are in flight
        for i, batch in enumerate(loader):
            if i == 1:
                break
        del batch
        gc.collect()
    if persistent:
        got = collect(loader)                            # the next epoch receives the old batches first
        assert np.array_equal(np.sort(got["index"]), np.arange(len(ds)))
    gc.collect()
    assert len(torch_loader._MAPPED[path][2]) == 6       # no slot lost
    got = collect(loader)
    assert np.array_equal(got["index"], np.arange(len(ds)))


def test_a_big_batch_through_a_workers_pipe_warns_once(disk_buffer: ReplayBuffer, tmp_path: Path) -> None:
    import subprocess
    import sys
    script = f"""
import numpy as np, warnings
from torch.utils.data import DataLoader
from unienv_data.batches import WindowDataset, _tree
from unienv_data.integrations.torch_loader import shared_memory_dataloader
from unienv_data.replay_buffer import ReplayBuffer
from unienv_interface.backends import NumpyComputeBackend
_tree.WORKER_TRANSFER_WARN_BYTES = 100          # the test batches are small; the workers fork from here
ds = WindowDataset(ReplayBuffer.load_from({str(tmp_path / "rb")!r}, backend=NumpyComputeBackend), {{"action": [0, 1]}})
list(DataLoader(ds, batch_size=8, num_workers=0, collate_fn=WindowDataset.collate_fn))
list(shared_memory_dataloader(ds, 8, num_workers=1, multiprocessing_context="fork"))
import sys
print("---", file=sys.stderr, flush=True)
for _ in range(2):
    list(DataLoader(ds, batch_size=8, num_workers=1, collate_fn=WindowDataset.collate_fn,
                    multiprocessing_context="fork"))
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    before, after = proc.stderr.split("---", 1)
    assert "RuntimeWarning" not in before                      # no workers, or the shared-memory loader: silent
    assert after.count("RuntimeWarning") == 2                  # once per worker process (one per DataLoader here)
    assert "shared_memory_dataloader(dataset, batch_size, num_workers=N)" in after
