"""W1-like buffer: obs f32[64], action f32[8], reward f32, terminated bool; 20,000 rows; sample(256)."""
import os, sys, tempfile, time, warnings, statistics
import numpy as np, torch
from torch.utils.data import DataLoader
from unienv_interface.backends.pytorch import PyTorchComputeBackend as B
from unienv_interface.space import BoxSpace, BinarySpace, DictSpace
from unienv_data.replay_buffer import ReplayBuffer
from unienv_data.storages.flattened import FlattenedStorage
from unienv_data.storages.pytorch import PytorchTensorStorage
from unienv_data.samplers import StepSampler
from unienv_data.samplers.multiprocessing_sampler import MultiprocessingSampler
from unienv_data.integrations.pytorch import UniEnvAsPyTorchDataset, PinnedPrefetcher

class ZeroCost(torch.utils.data.Dataset):
    """DataLoader's own IPC floor: batches of the same shapes that cost nothing to make."""
    def __len__(self): return 20000
    def __getitems__(self, idx):
        n = len(idx)
        return {"obs": torch.zeros(n, 64), "action": torch.zeros(n, 8), "reward": torch.zeros(n),
                "terminated": torch.zeros(n, dtype=torch.bool)}

class HeavySampler(StepSampler):
    """StepSampler plus ~1 ms of per-batch CPU work (stands in for decoding / augmentation)."""
    def sample(self):
        b = super().sample()
        x = np.ones((256, 256), np.float32)
        for _ in range(int(os.environ.get("HEAVY", "30"))):
            x = np.tanh(x * 0.5)
        return b

def rate(fn, seconds):
    fn()
    n = 0; t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        fn(); n += 1
    return n / (time.perf_counter() - t0)

if __name__ == "__main__":
    warnings.simplefilter("ignore")
    f32 = B.dtype_from_name("float32")
    sp = DictSpace(B, {"obs": BoxSpace(B, -np.inf, np.inf, f32, shape=(64,)), "action": BoxSpace(B, -1, 1, f32, shape=(8,)),
        "reward": BoxSpace(B, -np.inf, np.inf, f32, shape=()), "terminated": BinarySpace(B, ())})
    d = tempfile.mkdtemp()
    n = 20000
    rb = ReplayBuffer.create(FlattenedStorage, sp, inner_storage_cls=PytorchTensorStorage, cache_path=d, capacity=n)
    rb.extend({"obs": torch.randn(n, 64), "action": torch.rand(n, 8) * 2 - 1, "reward": torch.randn(n), "terminated": torch.rand(n) < 0.01})
    s = StepSampler(rb, 256, seed=0)
    secs = float(os.environ.get("SECS", "1.5"))
    rounds = int(os.environ.get("ROUNDS", "3"))
    res = {}
    def add(k, v): res.setdefault(k, []).append(v)
    samplers = {}
    for nw in (1, 2):
        for shm in (False, True):
            samplers[(nw, shm)] = MultiprocessingSampler(s, n_workers=nw, n_buffers=8, ctx="fork", shared_memory=shm, seed=0)
    hs = HeavySampler(rb, 256, seed=0)
    heavy = {nw: MultiprocessingSampler(hs, n_workers=nw, n_buffers=8, ctx="fork", shared_memory=True, seed=0) for nw in (1, 2)}
    ds = UniEnvAsPyTorchDataset(rb)
    dl = DataLoader(ds, batch_size=256, shuffle=True, collate_fn=UniEnvAsPyTorchDataset.collate_fn, num_workers=2,
                    persistent_workers=True, prefetch_factor=4)
    dl0 = DataLoader(ds, batch_size=256, shuffle=True, collate_fn=UniEnvAsPyTorchDataset.collate_fn, num_workers=0)
    for _ in dl: pass
    dlz = DataLoader(ZeroCost(), batch_size=256, shuffle=True, collate_fn=UniEnvAsPyTorchDataset.collate_fn,
                     num_workers=2, persistent_workers=True, prefetch_factor=4)
    for _ in dlz: pass
    def epoch_rate(loader):
        t0 = time.perf_counter(); k = 0
        while time.perf_counter() - t0 < secs:
            for _ in loader: k += 1
        return k / (time.perf_counter() - t0)
    for r in range(rounds):
        add("in-process StepSampler.sample()", rate(s.sample, secs))
        for (nw, shm), ms in samplers.items():
            add(f"MultiprocessingSampler {nw} worker(s), {'shared memory' if shm else 'pipe'}", rate(ms.sample, secs))
        add("heavy (+~0.45 ms CPU/batch) in-process", rate(hs.sample, secs))
        for nw, ms in heavy.items():
            add(f"heavy (+~0.45 ms CPU/batch) MultiprocessingSampler {nw} worker(s), shared memory", rate(ms.sample, secs))
        add("DataLoader num_workers=0 (UniEnvAsPyTorchDataset, __getitems__)", epoch_rate(dl0))
        add("DataLoader num_workers=2 persistent (UniEnvAsPyTorchDataset, __getitems__)", epoch_rate(dl))
        add("DataLoader num_workers=2 persistent, zero-cost dataset (torch IPC floor)", epoch_rate(dlz))
    for ms in list(samplers.values()) + list(heavy.values()): ms.close()
    print(f"load average at end: {os.getloadavg()}")
    for k, v in res.items():
        print(f"{k:80s} median {statistics.median(v):8.0f} batches/s   (runs: {', '.join(f'{x:.0f}' for x in v)})")
