"""W1 for bench_flattened.py: its shape, the read plan, and the interface every contender implements."""
from __future__ import annotations

import os
import sys
from typing import Any, Dict, Tuple

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HARNESS_DIR = os.environ.get("UNIENV_BENCH_HARNESS", os.path.join(os.path.dirname(REPO), "shared", "bench"))

# W1 shape and read plan (used as given by the shared generator when it is importable)
KEYS: Tuple[Tuple[str, Tuple[int, ...], str], ...] = (
    ("obs", (64,), "float32"), ("action", (8,), "float32"), ("reward", (), "float32"), ("terminated", (), "bool"))
EPISODES, STEPS_PER_EPISODE, QUICK_EPISODES = 50, 400, 10
CHUNK, N_BATCHES, BATCH, N_SLICES, SLICE_LEN = 1_000, 200, 256, 200, 64
FALLBACK_SEED = 20260501

OPS = ("append", "bulk", "batch", "slice", "reopen")
UNITS = {"append": "us/step", "bulk": "us/step", "batch": "us/batch", "slice": "us/slice", "reopen": "us/reopen"}
TARGETS = {"append": 2.0, "bulk": 1.2, "batch": 1.5, "slice": 2.0, "reopen": 3.0}



# ---------------------------------------------------------------------------------------------- workload
class Plan:
    """The data and the read plan, as numpy arrays."""

    def __init__(self, data: Dict[str, np.ndarray], rand: np.ndarray, offsets: np.ndarray, source: str) -> None:
        self.data = data
        self.n = int(next(iter(data.values())).shape[0])
        self.keys = list(data)
        self.rand = rand
        self.offsets = offsets
        self.source = source
        self.episodes = [(s, min(s + STEPS_PER_EPISODE, self.n)) for s in range(0, self.n, STEPS_PER_EPISODE)]
        self.chunks = [(s, min(s + CHUNK, self.n)) for s in range(0, self.n, CHUNK)]
        picks = [0, 1, self.n - 1, STEPS_PER_EPISODE - 1, STEPS_PER_EPISODE]
        self.check = np.unique(np.concatenate([np.array(picks), rand[0, :16]])).astype(np.int64)


def _fallback_w1(n: int) -> Tuple[Dict[str, np.ndarray], np.ndarray, np.ndarray]:
    rng = np.random.default_rng(FALLBACK_SEED)
    data = {
        "obs": rng.standard_normal((n, 64), dtype=np.float32),
        "action": rng.uniform(-1.0, 1.0, (n, 8)).astype(np.float32),
        "reward": rng.standard_normal(n, dtype=np.float32),
        "terminated": np.zeros(n, dtype=np.bool_),
    }
    data["terminated"][STEPS_PER_EPISODE - 1::STEPS_PER_EPISODE] = True
    rand = rng.integers(0, n, size=(N_BATCHES, BATCH), dtype=np.int64)
    offsets = rng.integers(0, n - SLICE_LEN + 1, size=N_SLICES, dtype=np.int64)
    return data, rand, offsets


def load_plan(quick: bool) -> Plan:
    full_n = EPISODES * STEPS_PER_EPISODE
    source = ""
    try:
        if HARNESS_DIR not in sys.path:
            sys.path.insert(0, HARNESS_DIR)
        import workloads  # the shared generator (bit-identical data for every contender)
        wl = workloads.generate("W1")
        data, rand, offsets = dict(wl.data), np.asarray(wl.rand_indices), np.asarray(wl.slice_offsets)
        source = f"workloads.generate('W1') from {HARNESS_DIR}, fingerprint {workloads.fingerprint(wl)}"
    except (ImportError, AttributeError, KeyError) as exc:
        data, rand, offsets = _fallback_w1(full_n)
        source = f"built-in generator, seed {FALLBACK_SEED} (shared workloads unavailable: {exc!r})"
    for name, shape, dtype in KEYS:
        arr = data[name]
        if arr.shape != (full_n, *shape) or arr.dtype != np.dtype(dtype):
            raise SystemExit(f"unexpected W1 layout for {name}: {arr.shape} {arr.dtype}")
    if quick:
        n = QUICK_EPISODES * STEPS_PER_EPISODE
        data = {k: np.ascontiguousarray(v[:n]) for k, v in data.items()}
        rand = rand % n
        offsets = offsets % (n - SLICE_LEN + 1)
        source += f"; --quick: first {QUICK_EPISODES} episodes, read plan folded into range"
    data = {name: np.ascontiguousarray(data[name]) for name, _, _ in KEYS}
    return Plan(data, np.ascontiguousarray(rand, dtype=np.int64), np.asarray(offsets, dtype=np.int64), source)



class Contender:
    """One storage configuration; the benchmark only calls these methods."""

    name = ""
    label = ""
    medium = ""
    limit = ""          # name of the limit this contender is divided by ("" for the limits themselves)
    same_limit = ""     # name of the limit fed the same inputs as this contender ("" when `limit` already is)

    def prepare(self, plan: Plan) -> None:
        raise NotImplementedError

    def create(self, path: str) -> Any:
        raise NotImplementedError

    def append_all(self, h: Any) -> int:
        raise NotImplementedError

    def bulk_all(self, h: Any) -> int:
        raise NotImplementedError

    def batch_all(self, h: Any) -> int:
        raise NotImplementedError

    def slice_all(self, h: Any) -> int:
        raise NotImplementedError

    def reopen(self, h: Any, path: str) -> Any:
        raise NotImplementedError

    def read(self, h: Any, idx: np.ndarray) -> Dict[str, np.ndarray]:
        raise NotImplementedError

    def close(self, h: Any) -> None:
        raise NotImplementedError

