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


# ---------------------------------------------------------------- reading straight into caller-given arrays
def empty_like_batch(ds: WindowDataset, n: int) -> Dict[str, Any]:
    """NumPy arrays laid out like a batch of `n` items of `ds` (what a shared-memory slot holds)."""
    from unienv_data.batches._tree import map_leaves, to_host_numpy
    one = ds.get_at(np.zeros(1, dtype=np.int64))
    return map_leaves(one, lambda leaf: np.full((n,) + tuple(leaf.shape[1:]), 77,
                                                dtype=to_host_numpy(leaf).dtype))


@pytest.mark.parametrize("normalized", [False, True])
def test_get_at_into_equals_read_items_with_pad_masks_at_episode_edges(buffer: ReplayBuffer, tmp_path: Path,
                                                                       normalized: bool) -> None:
    kw: Dict[str, Any] = {}
    if normalized:
        write_stats(tmp_path, compute_stats(buffer))
        kw = {"stats": tmp_path, "normalize": {"action": "mean_std"}}
    ds = WindowDataset(buffer, WINDOWS, **kw)
    items = np.array([5, 4, 0, 12, 24, 6, 5], dtype=np.int64)       # episode starts / ends, a repeat
    want = ds.__getitems__(items)
    out = empty_like_batch(ds, items.shape[0])
    ds.get_at_into(items, out)
    assert set(out) == set(want)
    for k in want:
        assert out[k].dtype == np.asarray(want[k]).dtype, k
        np.testing.assert_array_equal(out[k], want[k], err_msg=k)
    # item 5 is the first step of episode 1 (length 1): frame -1 is padded, and so is every frame after 0
    np.testing.assert_array_equal(out["observation.image_is_pad"][0], [True, False])
    np.testing.assert_array_equal(out["action_is_pad"][0], [False, True, True, True])
    np.testing.assert_array_equal(out["observation.image"][0, 0], out["observation.image"][0, 1])  # repeats step 0
    # item 4 is the last step of episode 0 (length 5)
    np.testing.assert_array_equal(out["action_is_pad"][1], [False, True, True, True])
    np.testing.assert_array_equal(out["obs/pos_is_pad"][2], [True, False, False])   # [-2, 1, 3] at step 0


def test_get_at_into_rejects_a_wrong_destination(disk_buffer: ReplayBuffer) -> None:
    ds = WindowDataset(disk_buffer, WINDOWS)
    out = empty_like_batch(ds, 3)
    with pytest.raises(IndexError):
        ds.get_at_into(np.array([0, 1, len(ds)]), out)
    bad = dict(out, **{"observation.image": out["observation.image"][:, ::-1]})     # not C-contiguous
    with pytest.raises(ValueError, match="C-contiguous"):
        ds.get_at_into(np.arange(3), bad)
    col = disk_buffer.get_column("action")
    with pytest.raises(ValueError, match="float32"):
        col.get_at_into(np.arange(3), np.zeros((3, 2), np.float64))
    dst = np.zeros((3, 2), np.float32)
    col.get_at_into(np.array([-1, 0, 2]), dst)                        # negatives count from the end, like get_at
    np.testing.assert_array_equal(dst, col.get_at(np.array([-1, 0, 2])))


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_shared_memory_dataloader_0_and_2_workers_give_identical_batches(disk_buffer: ReplayBuffer, tmp_path: Path,
                                                                         backend: str) -> None:
    """Same seed: the same index batches (the batch sampler runs in the training process) and the same values;
    with workers the windows are gathered straight into the shared-memory slots."""
    from unienv_data.integrations.torch_loader import shared_memory_dataloader
    rb = disk_buffer if backend == "numpy" else ReplayBuffer.load_from(tmp_path / "rb", backend=backend)
    try:
        ds = WindowDataset(rb, WINDOWS)
        runs = []
        for workers in (0, 2):
            loader = shared_memory_dataloader(ds, 5, shuffle=True, seed=3, num_workers=workers)
            if workers:
                assert loader.dataset.item_spec is not None          # the gather-into-slot path is on
            runs.append([{k: v.numpy().copy() for k, v in b.items()} for b in loader])
            del loader
        assert len(runs[0]) == len(runs[1]) == -(-len(ds) // 5)
        for b0, b2 in zip(*runs):
            assert set(b0) == set(b2)
            for k in b0:
                assert b0[k].dtype == b2[k].dtype, k
                np.testing.assert_array_equal(b0[k], b2[k], err_msg=k)
        seen = np.concatenate([b["index"] for b in runs[1]])
        assert np.array_equal(np.sort(seen), np.arange(len(ds)))
    finally:
        if rb is not disk_buffer:
            rb.close()


def test_torch_backend_buffer_reads_columns_not_whole_rows(disk_buffer: ReplayBuffer, tmp_path: Path) -> None:
    """A buffer written with NumPy storages and opened on torch serves `get_column` through the backend wrapper,
    so a WindowDataset reads each key's own column (it used to read whole rows at every frame of any key)."""
    from unienv_data.replay_buffer._column_view import ColumnView
    disk_buffer.dumps(tmp_path / "again")
    rb = ReplayBuffer.load_from(tmp_path / "again", backend="torch")
    try:
        col = rb.get_column("action")
        assert isinstance(col, ColumnView)
        got = col.get_at(np.array([3, 0]))
        assert isinstance(got, torch.Tensor) and got.dtype == torch.float32
        np.testing.assert_array_equal(got.numpy(), disk_buffer.get_at(np.array([3, 0]))["action"])
        ds_t = WindowDataset(rb, WINDOWS)
        assert all(c is not None for c in ds_t._reader.columns.values())
        ds_n = WindowDataset(disk_buffer, WINDOWS)
        items = np.arange(len(ds_n))
        a, b = ds_t.__getitems__(items), ds_n.__getitems__(items)
        for k in b:
            assert isinstance(a[k], torch.Tensor), k
            np.testing.assert_array_equal(a[k].numpy(), b[k], err_msg=k)
    finally:
        rb.close()


def test_torch_rows_path_gathers_like_numpy(buffer: ReplayBuffer) -> None:
    """A source without columns on the torch backend (a backend view) is read by whole rows and gathered per key;
    CPU tensors gather through NumPy (torch's row indexing of camera frames was 10-100x slower) with equal values."""
    from unienv_data.batches import ToBackendOrDeviceBatch
    from unienv_interface.backends.pytorch import PyTorchComputeBackend
    view = ToBackendOrDeviceBatch(buffer, PyTorchComputeBackend)
    ds_t = WindowDataset(view, WINDOWS)
    assert all(c is None for c in ds_t._reader.columns.values())       # the whole-rows path
    items = np.array([5, 0, 24, 12, 4])
    a, b = ds_t.__getitems__(items), WindowDataset(buffer, WINDOWS).__getitems__(items)
    for k in b:
        assert isinstance(a[k], torch.Tensor), k
        np.testing.assert_array_equal(a[k].numpy(), b[k], err_msg=k)
