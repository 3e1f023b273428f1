#!/usr/bin/env python
"""FlattenedStorage against the raw-numpy limit, on workload W1, in one process.

Configs (each a FlattenedStorage over one inner storage, capacity = number of steps):

  torch-memmap  PytorchTensorStorage, memory-mapped (cache_path)     limit: raw-disk
  torch-ram     PytorchTensorStorage, in RAM                         limit: raw-ram
  numpy-memmap  NumpyMemmapStorage, memory-mapped (numpy backend)    limit: raw-disk

Limits (one plain ndarray per key, native dtype, fed with numpy per-step rows):

  raw-disk  np.memmap(..., mode="w+") per key, used through .view(np.ndarray); reopen = small json + np.memmap("r")
  raw-ram   np.empty + fill(0) per key (pages faulted in up front); reopen = np.save per key + np.load

Operations (each timed over the whole plan, reported per unit):

  append  mark_segment_start / append per step / mark_segment_end per episode     us per step
  bulk    set(slice(s, e), chunk) in chunks of 1,000 steps, on a fresh storage     us per step
  batch   get(idx), 200 batches of 256 random indices (torch int64 / numpy index)  us per batch
  slice   get(slice(o, o + 64)), 200 slices, every leaf copied out (clone)        us per slice
  reopen  dumps + close + load_from(path, space) + one get (the first batch)      us per reopen

An untimed warm-up pass first runs every op once per config (lazy imports, first-use caches) and checks the
contents against the workload after append, bulk and reopen. Then every repeat runs every config and both limits
(order reversed on odd repeats); the table shows the median per op and ratio = median(ours) / median(limit).

Usage:  .venv/bin/python bench/bench_flattened.py [--quick] [--repeats N] [--json PATH] [--profile]
"""
from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import cProfile  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import pstats  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from typing import Any, Callable, Dict, List, Optional, Tuple  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)
try:
    torch.set_num_interop_threads(1)
except RuntimeError:
    pass

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


# ---------------------------------------------------------------------------------------------- contenders
class Contender:
    """One storage configuration; the benchmark only calls these methods."""

    name = ""
    label = ""
    medium = ""
    limit = ""          # name of the limit this contender is divided by ("" for the limits themselves)

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


class _RawHandle:
    def __init__(self, arrays: Dict[str, np.ndarray]) -> None:
        self.arrays: Any = arrays   # dict key -> ndarray; None once closed
        self.episode_starts: List[int] = []


class RawBase(Contender):
    """One plain ndarray per key; per-step rows are numpy views of the workload."""

    def prepare(self, plan: Plan) -> None:
        self.plan = plan
        self.steps = [{k: plan.data[k][i] for k in plan.keys} for i in range(plan.n)]
        self.chunk_data = [(s, e, {k: plan.data[k][s:e] for k in plan.keys}) for s, e in plan.chunks]
        self.shapes = {k: (tuple(plan.data[k].shape[1:]), plan.data[k].dtype.name) for k in plan.keys}

    def append_all(self, h: _RawHandle) -> int:
        items = list(h.arrays.items())
        steps = self.steps
        for s, e in self.plan.episodes:
            h.episode_starts.append(s)
            for i in range(s, e):
                row = steps[i]
                for k, a in items:
                    a[i] = row[k]
        return self.plan.n

    def bulk_all(self, h: _RawHandle) -> int:
        items = list(h.arrays.items())
        for s, e, chunk in self.chunk_data:
            for k, a in items:
                a[s:e] = chunk[k]
        h.episode_starts = [s for s, _ in self.plan.episodes]
        return self.plan.n

    def batch_all(self, h: _RawHandle) -> int:
        items = list(h.arrays.items())
        for idx in self.plan.rand:
            {k: a[idx] for k, a in items}
        return len(self.plan.rand)

    def slice_all(self, h: _RawHandle) -> int:
        items = list(h.arrays.items())
        for o in self.plan.offsets.tolist():
            {k: np.array(a[o:o + SLICE_LEN], copy=True) for k, a in items}
        return len(self.plan.offsets)

    def read(self, h: _RawHandle, idx: np.ndarray) -> Dict[str, np.ndarray]:
        return {k: a[idx] for k, a in h.arrays.items()}

    def close(self, h: _RawHandle) -> None:
        h.arrays = None

    def _write_meta(self, h: _RawHandle, path: str) -> None:
        meta = {"n": self.plan.n, "episode_starts": list(map(int, h.episode_starts)),
                "keys": {k: [list(shape), dt] for k, (shape, dt) in self.shapes.items()}}
        with open(os.path.join(path, "meta.json"), "w") as f:
            json.dump(meta, f)

    @staticmethod
    def _read_meta(path: str) -> Dict[str, Any]:
        with open(os.path.join(path, "meta.json")) as f:
            return json.load(f)


class RawDisk(RawBase):
    name, label, medium = "raw-disk", "np.memmap per key (.view(np.ndarray))", "disk"

    def create(self, path: str) -> _RawHandle:
        os.makedirs(path, exist_ok=True)
        arrays = {}
        for k, (shape, dt) in self.shapes.items():
            mm = np.memmap(os.path.join(path, f"{k}.bin"), mode="w+", dtype=np.dtype(dt), shape=(self.plan.n, *shape))
            arrays[k] = mm.view(np.ndarray)   # plain ndarray view; keeps the mapping alive
        return _RawHandle(arrays)

    def reopen(self, h: _RawHandle, path: str) -> _RawHandle:
        self._write_meta(h, path)
        self.close(h)
        meta = self._read_meta(path)
        arrays = {k: np.memmap(os.path.join(path, f"{k}.bin"), mode="r", dtype=np.dtype(dt),
                               shape=(meta["n"], *shape)).view(np.ndarray)
                  for k, (shape, dt) in meta["keys"].items()}
        h2 = _RawHandle(arrays)
        h2.episode_starts = meta["episode_starts"]
        self.read(h2, self.plan.rand[0])
        return h2


class RawRam(RawBase):
    name, label, medium = "raw-ram", "np.empty + fill(0) per key", "ram"

    def create(self, path: str) -> _RawHandle:
        arrays = {}
        for k, (shape, dt) in self.shapes.items():
            a = np.empty((self.plan.n, *shape), dtype=np.dtype(dt))
            a.fill(0)  # fault every page in now: writes then measure steady state, not first touch
            arrays[k] = a
        return _RawHandle(arrays)

    def reopen(self, h: _RawHandle, path: str) -> _RawHandle:
        os.makedirs(path, exist_ok=True)
        for k, a in h.arrays.items():
            np.save(os.path.join(path, f"{k}.npy"), a)
        self._write_meta(h, path)
        self.close(h)
        meta = self._read_meta(path)
        h2 = _RawHandle({k: np.load(os.path.join(path, f"{k}.npy")) for k in meta["keys"]})
        h2.episode_starts = meta["episode_starts"]
        self.read(h2, self.plan.rand[0])
        return h2


class Flat(Contender):
    """FlattenedStorage over an inner array storage."""

    backend = "pytorch"
    is_memmap = True

    def __init__(self) -> None:
        from unienv_data.storages.flattened import FlattenedStorage
        self.FlattenedStorage = FlattenedStorage
        self.caught: List[str] = []

    def inner_cls(self) -> type:
        raise NotImplementedError

    def make_space(self) -> Any:
        from unienv_interface.space import BinarySpace, BoxSpace, DictSpace
        if self.backend == "pytorch":
            from unienv_interface.backends.pytorch import PyTorchComputeBackend as B
            dt: Dict[str, Any] = {"float32": torch.float32, "bool": torch.bool}
            dev: Any = "cpu"
        else:
            from unienv_interface.backends.numpy import NumpyComputeBackend as B
            dt = {"float32": np.float32, "bool": np.bool_}
            dev = None
        bounds = {"action": (-1.0, 1.0)}
        spaces = {}
        for name, shape, dtype in KEYS:
            if dtype == "bool":
                spaces[name] = BinarySpace(B, shape=shape, dtype=dt[dtype], device=dev)
            else:
                lo, hi = bounds.get(name, (-np.inf, np.inf))
                spaces[name] = BoxSpace(B, lo, hi, dt[dtype], shape=shape, device=dev)
        return DictSpace(B, spaces, device=dev)

    def prepare(self, plan: Plan) -> None:
        self.plan = plan
        self.space = self.make_space()
        src: Dict[str, Any]
        self.rand: List[Any]
        if self.backend == "pytorch":
            src = {k: torch.from_numpy(plan.data[k]) for k in plan.keys}      # zero-copy views
            self.rand = [torch.from_numpy(np.ascontiguousarray(r)) for r in plan.rand]
            self.own = lambda v: v.clone()
            self.to_np = lambda v: v.numpy()
        else:
            src = {k: plan.data[k] for k in plan.keys}
            self.rand = [np.ascontiguousarray(r) for r in plan.rand]
            self.own = lambda v: np.array(v, copy=True)
            self.to_np = np.asarray
        self.steps = [{k: t[i] for k, t in src.items()} for i in range(plan.n)]
        self.chunk_data = [(s, e, {k: t[s:e] for k, t in src.items()}) for s, e in plan.chunks]

    def create(self, path: str) -> Any:
        with warnings.catch_warnings(record=True) as got:
            warnings.simplefilter("always")
            st = self.FlattenedStorage.create(self.space, self.inner_cls(), capacity=self.plan.n,
                                              cache_path=path if self.is_memmap else None, is_memmap=self.is_memmap)
        for w in got:
            msg = f"{w.category.__name__}: {w.message}"
            if msg not in self.caught:
                self.caught.append(msg)
        return st

    def append_all(self, st: Any) -> int:
        steps = self.steps
        for s, e in self.plan.episodes:
            st.mark_segment_start(s)
            for i in range(s, e):
                st.append(steps[i])
            st.mark_segment_end()
        return self.plan.n

    def bulk_all(self, st: Any) -> int:
        for s, e, chunk in self.chunk_data:
            st.set(slice(s, e), chunk)
        return self.plan.n

    def batch_all(self, st: Any) -> int:
        for idx in self.rand:
            st.get(idx)
        return len(self.rand)

    def slice_all(self, st: Any) -> int:
        own = self.own
        for o in self.plan.offsets.tolist():
            {k: own(v) for k, v in st.get(slice(o, o + SLICE_LEN)).items()}
        return len(self.plan.offsets)

    def reopen(self, st: Any, path: str) -> Any:
        st.dumps(path)
        st.close()
        kwargs = {} if self.is_memmap else {"is_memmap": False}
        st2 = self.FlattenedStorage.load_from(path, self.space, **kwargs)
        st2.get(self.rand[0])
        return st2

    def read(self, st: Any, idx: np.ndarray) -> Dict[str, np.ndarray]:
        native = torch.from_numpy(idx) if self.backend == "pytorch" else idx
        return {k: self.to_np(v) for k, v in st.get(native).items()}

    def close(self, st: Any) -> None:
        st.close()


class FlatTorchMemmap(Flat):
    name, label, medium, limit = "torch-memmap", "FlattenedStorage(PytorchTensorStorage, memmap)", "disk", "raw-disk"

    def inner_cls(self) -> type:
        from unienv_data.storages.pytorch import PytorchTensorStorage
        return PytorchTensorStorage


class FlatTorchRam(FlatTorchMemmap):
    name, label, medium, limit = "torch-ram", "FlattenedStorage(PytorchTensorStorage, RAM)", "ram", "raw-ram"
    is_memmap = False


class FlatNumpyMemmap(Flat):
    name, label, medium, limit = "numpy-memmap", "FlattenedStorage(NumpyMemmapStorage, memmap)", "disk", "raw-disk"
    backend = "numpy"

    def inner_cls(self) -> type:
        from unienv_data.storages.numpy_memmap import NumpyMemmapStorage
        return NumpyMemmapStorage


# ---------------------------------------------------------------------------------------------- measurement
def check(c: Contender, h: Any, plan: Plan, where: str) -> None:
    got = c.read(h, plan.check)
    for k in plan.keys:
        want = plan.data[k][plan.check]
        if got[k].dtype != want.dtype or not np.array_equal(got[k], want):
            raise AssertionError(f"{c.name}: {k!r} differs from the workload {where}")


def timed(fn: Callable[[], int]) -> Tuple[float, int]:
    gc.collect()
    t0 = time.perf_counter()
    units = fn()
    return time.perf_counter() - t0, units


def one_repeat(c: Contender, plan: Plan, root: str, r: int, verify: bool) -> Dict[str, float]:
    """One pass of the five ops on fresh storages; returns microseconds per unit for each op."""
    base = os.path.join(root, c.name, f"r{r}")
    os.makedirs(base, exist_ok=True)
    out: Dict[str, float] = {}

    h = c.create(os.path.join(base, "append"))
    try:
        t, units = timed(lambda: c.append_all(h))
        out["append"] = t / units * 1e6
        if verify:
            check(c, h, plan, "after append")
    finally:
        c.close(h)
    shutil.rmtree(os.path.join(base, "append"), ignore_errors=True)

    path = os.path.join(base, "bulk")
    h = c.create(path)
    h2 = None
    try:
        t, units = timed(lambda: c.bulk_all(h))
        out["bulk"] = t / units * 1e6
        if verify:
            check(c, h, plan, "after bulk")
        t, units = timed(lambda: c.batch_all(h))
        out["batch"] = t / units * 1e6
        t, units = timed(lambda: c.slice_all(h))
        out["slice"] = t / units * 1e6
        gc.collect()
        t0 = time.perf_counter()
        h2 = c.reopen(h, path)
        out["reopen"] = (time.perf_counter() - t0) * 1e6
        if verify:
            check(c, h2, plan, "after reopen")
    finally:
        c.close(h)   # idempotent for ours; the raw handle just drops its arrays
        if h2 is not None:
            c.close(h2)
    shutil.rmtree(base, ignore_errors=True)
    return out


def profile_op(c: Contender, op: str, root: str, top: int = 15) -> str:
    """cProfile of one run of `op` on `c`; the `top` library functions by cumulative time."""
    path = os.path.join(root, "profile", c.name, op)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    h = c.create(path)
    h2 = None
    prof = cProfile.Profile()
    try:
        if op not in ("append", "bulk"):
            c.bulk_all(h)
        fn: Optional[Callable[[], int]] = {"append": lambda: c.append_all(h), "bulk": lambda: c.bulk_all(h), "batch": lambda: c.batch_all(h),
              "slice": lambda: c.slice_all(h)}.get(op)
        if fn is not None and op in ("batch", "slice"):
            fn()   # reads change nothing: one unprofiled pass first, so the profile shows the steady state
        gc.collect()
        if fn is not None:
            prof.runcall(fn)
        else:
            h2 = prof.runcall(c.reopen, h, path)
    finally:
        c.close(h)
        if h2 is not None:
            c.close(h2)
        shutil.rmtree(os.path.dirname(path), ignore_errors=True)
    stats = pstats.Stats(prof)
    total = stats.total_tt  # type: ignore[attr-defined]
    import unienv_data
    import unienv_interface
    roots = tuple(os.path.dirname(os.path.abspath(m.__file__)) for m in (unienv_data, unienv_interface))
    rows = []
    for (fname, line, func), (_cc, nc, tt, ct, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        if os.path.abspath(fname).startswith(roots):
            rel = os.path.relpath(fname, os.path.dirname(os.path.dirname(roots[0])))
            rows.append((ct, tt, nc, f"{rel}:{line}({func})"))
    rows.sort(key=lambda x: -x[0])
    lines = [f"  cProfile {c.name} / {op}: {total * 1e3:.1f} ms total under the profiler (profiler overhead inflates "
             "per-call costs); library functions by cumulative time:",
             f"  {'ncalls':>8} {'tottime ms':>11} {'cumtime ms':>11} {'cum %':>6}  function"]
    for ct, tt, nc, where in rows[:top]:
        lines.append(f"  {nc:>8} {tt * 1e3:>11.1f} {ct * 1e3:>11.1f} {100 * ct / total if total else 0:>5.1f}%  {where}")
    return "\n".join(lines)


def fmt_us(x: float) -> str:
    return f"{x:,.0f}" if x >= 1000 else (f"{x:.1f}" if x >= 10 else f"{x:.2f}")


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help=f"smoke run: {QUICK_EPISODES} episodes instead of {EPISODES}")
    ap.add_argument("--repeats", type=int, default=3, help="repeats per config (median is reported); default 3")
    ap.add_argument("--json", metavar="PATH", help="write all measurements and ratios to PATH")
    ap.add_argument("--configs", default="torch-memmap,torch-ram,numpy-memmap",
                    help="comma-separated subset of torch-memmap,torch-ram,numpy-memmap")
    ap.add_argument("--no-warmup", action="store_true",
                    help="skip the untimed warm-up pass (it loads lazy imports and checks every config's contents)")
    ap.add_argument("--profile", action="store_true",
                    help="after the table, cProfile every op whose ratio is over its target")
    args = ap.parse_args(argv)
    if args.repeats < 1:
        ap.error("--repeats must be >= 1")

    t_start = time.perf_counter()
    plan = load_plan(args.quick)
    available = {c.name: c for c in (FlatTorchMemmap, FlatTorchRam, FlatNumpyMemmap)}
    wanted = [s.strip() for s in args.configs.split(",") if s.strip()]
    for w in wanted:
        if w not in available:
            ap.error(f"unknown config {w!r}; choose from {sorted(available)}")
    ours: List[Contender] = [available[w]() for w in wanted]
    limits: Dict[str, Contender] = {}
    for c in ours:
        if c.limit not in limits:
            limits[c.limit] = RawDisk() if c.limit == "raw-disk" else RawRam()
    everyone: List[Contender] = ours + list(limits.values())
    for c in everyone:
        c.prepare(plan)
    gc.collect()
    gc.freeze()   # the prepared per-step inputs are never walked by the collector

    samples: Dict[str, Dict[str, List[float]]] = {c.name: {op: [] for op in OPS} for c in everyone}
    root = tempfile.mkdtemp(prefix="bench-flattened-")
    try:
        if not args.no_warmup:
            for c in everyone:
                one_repeat(c, plan, root, -1, verify=True)
        for r in range(args.repeats):
            order = everyone if r % 2 == 0 else everyone[::-1]
            for c in order:
                for op, us in one_repeat(c, plan, root, r, verify=(r == 0 and args.no_warmup)).items():
                    samples[c.name][op].append(us)

        med = {name: {op: statistics.median(v) for op, v in ops.items()} for name, ops in samples.items()}
        results: Dict[str, Any] = {}
        for c in ours:
            rows = {}
            for op in OPS:
                ratio = med[c.name][op] / med[c.limit][op]
                rows[op] = {"unit": UNITS[op], "ours_us": med[c.name][op], "limit_us": med[c.limit][op],
                            "ratio": ratio, "target": TARGETS[op], "pass": ratio <= TARGETS[op],
                            "ours_samples_us": samples[c.name][op], "limit_samples_us": samples[c.limit][op]}
            results[c.name] = {"label": c.label, "medium": c.medium, "limit": c.limit, "ops": rows,
                               "warnings": list(getattr(c, "caught", []))}

        print(f"FlattenedStorage vs raw-numpy limit, W1: {plan.n} steps ({len(plan.episodes)} episodes), "
              f"{args.repeats} repeat(s), medians; single-threaded")
        print(f"data: {plan.source}")
        print(f"numpy {np.__version__}, torch {torch.__version__}, python {platform.python_version()}, "
              f"{os.cpu_count()} cpu(s), temp dir {root}")
        for c in ours:
            lim = limits[c.limit]
            print(f"\n{c.label}   vs   {lim.name}: {lim.label}")
            print(f"  {'op':<7} {'unit':<10} {'ours':>9} {'limit':>9} {'ratio':>8} {'target':>7}  verdict")
            for op, row in results[c.name]["ops"].items():
                print(f"  {op:<7} {row['unit']:<10} {fmt_us(row['ours_us']):>9} {fmt_us(row['limit_us']):>9} "
                      f"{row['ratio']:>7.2f}x {'<=' + format(row['target'], '.1f') + 'x':>7}  "
                      f"{'PASS' if row['pass'] else 'over'}")
            for w in results[c.name]["warnings"]:
                print(f"  note: {w[:300]}")
        over = [(c, op) for c in ours for op in OPS if not results[c.name]["ops"][op]["pass"]]
        print(f"\n{len(over)} of {len(ours) * len(OPS)} ratios over target"
              + (": " + ", ".join(f"{c.name}/{op}" for c, op in over) if over else ""))
        print("ratio = median(ours) / median(limit); under ~1.5x apart in one run can be noise on a shared machine.")

        profiles: Dict[str, str] = {}
        if args.profile and over:
            for c, op in over:
                text = profile_op(c, op, root)
                profiles[f"{c.name}/{op}"] = text
                print("\n" + text)

        elapsed = time.perf_counter() - t_start
        print(f"\ntotal {elapsed:.1f} s")
        if args.json:
            doc = {"workload": "W1", "n_steps": plan.n, "episodes": len(plan.episodes), "quick": args.quick,
                   "repeats": args.repeats, "data_source": plan.source, "targets": TARGETS, "units": UNITS,
                   "versions": {"numpy": np.__version__, "torch": torch.__version__,
                                "python": platform.python_version()},
                   "results": results, "limits": {name: med[name] for name in limits}, "profiles": profiles,
                   "elapsed_s": elapsed}
            os.makedirs(os.path.dirname(os.path.abspath(args.json)) or ".", exist_ok=True)
            with open(args.json, "w") as f:
                json.dump(doc, f, indent=2)
            print(f"wrote {args.json}")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
