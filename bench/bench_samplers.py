"""Window sampling (16 x 256) and prioritized sample(256) on a W1-like buffer vs a plain NumPy gather."""
import os
for v in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ[v] = "1"
import statistics, sys, time
import numpy as np
import torch
torch.set_num_threads(1)
from unienv_data.replay_buffer import ReplayBuffer
from unienv_data.storages.flattened import FlattenedStorage
from unienv_data.storages.pytorch import PytorchTensorStorage
from unienv_data.storages.numpy_memmap import NumpyMemmapStorage
from unienv_data.batches import FrameStackedBatch
from unienv_data.samplers.slice_sampler import SliceSampler
from unienv_data.samplers.prioritized import PrioritizedSampler
from unienv_interface.backends import NumpyComputeBackend
from unienv_interface.backends.pytorch import PyTorchComputeBackend
from unienv_interface.space import BinarySpace, BoxSpace, DictSpace

EPISODES, STEPS, B, T = 50, 400, 256, 16
N = EPISODES * STEPS
rng = np.random.default_rng(0)
raw = {"obs": rng.standard_normal((N, 64), dtype=np.float32), "action": rng.uniform(-1, 1, (N, 8)).astype(np.float32),
       "reward": rng.standard_normal(N, dtype=np.float32), "terminated": np.zeros(N, bool)}
raw["terminated"][STEPS - 1::STEPS] = True

def build(Bk, inner):
    f32 = Bk.dtype_from_name("float32")
    sp = DictSpace(Bk, {"obs": BoxSpace(Bk, -np.inf, np.inf, f32, shape=(64,)),
                        "action": BoxSpace(Bk, -1.0, 1.0, f32, shape=(8,)),
                        "reward": BoxSpace(Bk, -np.inf, np.inf, f32, shape=()),
                        "terminated": BinarySpace(Bk, ())})
    rb = ReplayBuffer.create(FlattenedStorage, sp, inner_storage_cls=inner, capacity=N)
    for e in range(EPISODES):
        w = rb.open_segment_writer()
        for t in range(e * STEPS, (e + 1) * STEPS):
            w.append({k: Bk.from_numpy(v[t]) for k, v in raw.items()})
        rb.commit_segment(w)
    assert len(rb) == N and len(rb.episode_segments()) == EPISODES
    return rb

def timeit(fn, reps=200, warm=20):
    for _ in range(warm):
        fn()
    out = []
    for _ in range(reps):
        t0 = time.perf_counter(); fn(); out.append(time.perf_counter() - t0)
    return statistics.median(out) * 1e6

def gather_np(idx):
    return {k: v[idx] for k, v in raw.items()}

rows = []
for name, Bk, inner in (("torch", PyTorchComputeBackend, PytorchTensorStorage), ("numpy", NumpyComputeBackend, NumpyMemmapStorage)):
    rb = build(Bk, inner)
    sampler = SliceSampler(rb, B, T, seed=0)
    fs = FrameStackedBatch(rb, 0, T - 1)
    anchors = sampler.sample_index()
    idx = (anchors[:, None] + np.arange(T)).reshape(-1)
    d, m = sampler.sample()
    # check against the raw arrays
    st = sampler.sample_with_metadata()
    exp = gather_np((st[1]["start"][:, None] + np.arange(T)).reshape(-1))
    got_obs = st[0]["obs"].numpy() if name == "torch" else st[0]["obs"]
    assert np.array_equal(got_obs.reshape(-1, 64), exp["obs"])
    # fresh windows on every call (cycling through 64 precomputed sets), so no variant reads cache-hot rows
    sets = [sampler.sample_index() for _ in range(64)]
    flat_sets = [(a[:, None] + np.arange(T)).reshape(-1) for a in sets]
    it = {"i": 0}
    def nxt(lst):
        it["i"] = (it["i"] + 1) % 64
        return lst[it["i"]]
    t_base = timeit(lambda: gather_np(nxt(flat_sets)))
    t_base_idx = timeit(lambda: gather_np((sampler.np_rng.integers(0, N - T, B)[:, None] + np.arange(T)).reshape(-1)))
    t_sampler = timeit(sampler.sample)
    t_view = timeit(lambda: fs.get_at_with_metadata(nxt(sets)))
    t_rb = timeit(lambda: rb.get_at(nxt(flat_sets)))
    rows.append((name, "windows 16x256: SliceSampler.sample() [draws its starts]", t_sampler, t_base_idx))
    rows.append((name, "windows 16x256: FrameStackedBatch.get_at_with_metadata(starts)", t_view, t_base))
    rows.append((name, "  (rb.get_at of the same 4096 rows, flat index given)", t_rb, t_base))
    ps = PrioritizedSampler(rb, 256, seed=0)
    keys, logical, w = ps.sample_keys()
    ps.update_priorities(keys, rng.random(256))
    ps.update_priorities(ps.keys_for(np.arange(N)), rng.random(N) + 0.01)
    idx_sets = [rng.integers(0, N, 256) for _ in range(64)]
    t_base256 = timeit(lambda: gather_np(nxt(idx_sets)))
    t_base256_draw = timeit(lambda: gather_np(rng.integers(0, N, 256)))
    t_ps = timeit(ps.sample)
    t_keys = timeit(ps.sample_keys)
    pr = rng.random(256)
    t_upd = timeit(lambda: ps.update_priorities(keys, pr))
    t_rb256 = timeit(lambda: rb.get_at(nxt(idx_sets)))
    rows.append((name, "prioritized sample(256) (draw + weights + read)", t_ps, t_base256_draw))
    rows.append((name, "  prioritized sample_keys() (tree only)", t_keys, t_base256))
    rows.append((name, "  update_priorities(256)", t_upd, t_base256))
    rows.append((name, "  (rb.get_at of 256 random rows)", t_rb256, t_base256))

print(f"{'backend':7} {'operation':66} {'us':>9} {'numpy us':>9} {'ratio':>6}")
print("numpy us: a plain NumPy gather of the same rows, one fancy index per key (with uniform drawing of the")
print("indices for the rows marked [draws]); medians of 200 calls")
for name, op, t, b in rows:
    print(f"{name:7} {op:66} {t:9.1f} {b:9.1f} {t / b:6.2f}")
