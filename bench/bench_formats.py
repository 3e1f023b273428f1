#!/usr/bin/env python
"""HDF5Storage, ParquetStorage and NPZStorage on workload W1, against the plain library on the same file layout and
against this project's memmap storage, in one process.

Data: W1 (obs f32[64], action f32[8], reward f32, terminated bool; 50 episodes x 400 steps = 20,000 steps), from the
shared harness generator (`../shared/bench/workloads.py`) when importable, else the same shapes from a fixed seed.

Configs (ours vs "plain", each pair on the same file layout):

  hdf5         HDF5Storage, capacity 20,000: contiguous datasets, memory-mapped   plain h5py on those datasets
  hdf5-nommap  HDF5Storage(use_mmap=False): same layout, all I/O through HDF5     plain h5py
  hdf5-gzip    HDF5Storage(compression="gzip", level 4): whole-row 64 KiB chunks plain h5py, same chunks / filter
  parquet      ParquetStorage, pieces of 1,024 rows, snappy                      plain pyarrow, same pieces
  npz          FlattenedStorage(NPZStorage, compressed=False): one file per step  plain np.savez / np.load per step
               (the W1 steps flattened to one float64 row; NPZ_STEPS steps only: one file per step is slow)
  memmap       one NumpyMemmapStorage per key (native dtypes): the "memmap" column of every row

Plain h5py: `ds[s:e] = chunk[key]` per key to write; `ds[unique][inverse]` per key to read (h5py needs increasing
indices). Plain pyarrow: one `pq.write_table` per piece of the same schema and options (snappy, no dictionary
encoding, as ParquetStorage writes numeric columns); reads take rows from the table of all pieces (read once, in
`open`) and convert the columns to NumPy. Plain NPZ: `np.savez` / `np.load` of the
flat row per step.

Operations (median over repeats, per unit):

  bulk   create + set(slice(s, e), chunk) in chunks of 1,000 steps + close (data on disk)   us per step
  batch  get(idx), 200 batches of 256 random indices (NPZ: 20), storage already open        us per batch
  open   load_from(path, space) + the first batch get                                        us per open

An untimed warm-up pass checks every config's contents against the workload.

Usage:  .venv/bin/python bench/bench_formats.py [--quick] [--repeats N] [--json PATH]
"""
from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from typing import Any, Callable, Dict, List, Tuple  # noqa: E402

import h5py  # noqa: E402
import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from unienv_data.storages.flattened import FlattenedStorage  # noqa: E402
from unienv_data.storages.hdf5 import HDF5Storage  # noqa: E402
from unienv_data.storages.npz_storage import NPZStorage  # noqa: E402
from unienv_data.storages.numpy_memmap import NumpyMemmapStorage  # noqa: E402
from unienv_data.storages.parquet import ParquetStorage  # noqa: E402
from unienv_interface.backends import NumpyComputeBackend as NB  # noqa: E402
from unienv_interface.space import BinarySpace, BoxSpace, DictSpace  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HARNESS_DIR = os.environ.get("UNIENV_BENCH_HARNESS", os.path.join(os.path.dirname(REPO), "shared", "bench"))
KEYS = (("obs", (64,), "float32"), ("action", (8,), "float32"), ("reward", (), "float32"), ("terminated", (), "bool"))
CHUNK, N_BATCHES, BATCH, NPZ_STEPS, NPZ_BATCHES, PIECE = 1_000, 200, 256, 2_000, 20, 1_024


# ---------------------------------------------------------------------------------------------- workload
def workload(quick: bool) -> Tuple[Dict[str, np.ndarray], np.ndarray, str]:
    try:
        sys.path.insert(0, HARNESS_DIR)
        import workloads  # type: ignore[import-not-found]
        wl = workloads.generate("W1")
        data, rand, source = wl.data, wl.rand_indices, "shared harness generate('W1')"
    except Exception:  # noqa: BLE001 - the harness is optional
        rng = np.random.default_rng(20260501)
        n = 20_000
        data = {"obs": rng.standard_normal((n, 64), dtype=np.float32),
                "action": rng.uniform(-1, 1, (n, 8)).astype(np.float32),
                "reward": rng.standard_normal(n, dtype=np.float32), "terminated": np.arange(n) % 400 == 399}
        rand, source = rng.integers(0, n, size=(N_BATCHES, BATCH)), "fallback generator (fixed seed)"
    if quick:
        n = 4_000
        data = {k: v[:n] for k, v in data.items()}
        rand = rand % n
    return data, rand, source


def space() -> DictSpace:
    inf = float("inf")
    return DictSpace(NB, {"obs": BoxSpace(NB, -inf, inf, np.float32, shape=(64,)),
                          "action": BoxSpace(NB, -1.0, 1.0, np.float32, shape=(8,)),
                          "reward": BoxSpace(NB, -inf, inf, np.float32, shape=()),
                          "terminated": BinarySpace(NB, ())})


def leaf_space(key: str) -> Any:
    return space().spaces[key]


def check(got: Dict[str, np.ndarray], data: Dict[str, np.ndarray], idx: np.ndarray, what: str) -> None:
    for k in data:
        if not np.array_equal(np.asarray(got[k]), data[k][idx]):
            raise AssertionError(f"{what}: key {k!r} differs from the workload")


# ---------------------------------------------------------------------------------------------- configs
class Config:
    """One pair (ours, plain) of bulk / batch / open implementations."""

    name = ""

    def __init__(self, root: str, data: Dict[str, np.ndarray]) -> None:
        self.root, self.data = root, data
        self.n = len(data["obs"])
        self.ours_obj: Any = None
        self.plain_obj: Any = None

    def path(self, tag: str) -> str:
        return os.path.join(self.root, f"{self.name}-{tag}")

    def chunks(self) -> List[Tuple[int, int]]:
        return [(s, min(s + CHUNK, self.n)) for s in range(0, self.n, CHUNK)]

    def chunk(self, s: int, e: int) -> Dict[str, np.ndarray]:
        return {k: v[s:e] for k, v in self.data.items()}

    def remove(self, tag: str) -> None:
        p = self.path(tag)
        if os.path.isdir(p):
            shutil.rmtree(p)
        elif os.path.exists(p):
            os.unlink(p)

    # hooks
    def bulk_ours(self) -> None: ...
    def bulk_plain(self) -> None: ...
    def open_ours(self) -> Any: ...
    def open_plain(self) -> Any: ...
    def read_ours(self, obj: Any, idx: np.ndarray) -> Dict[str, np.ndarray]: return obj.get(idx)
    def read_plain(self, obj: Any, idx: np.ndarray) -> Dict[str, np.ndarray]: ...
    def close(self, obj: Any) -> None:
        obj.close()


class HDF5Config(Config):
    name = "hdf5"
    options: Dict[str, Any] = {}
    read_opts: Dict[str, Any] = {}

    def bulk_ours(self) -> None:
        st = HDF5Storage.create(space(), self.n, cache_path=self.path("ours.hdf5"), **self.options)
        for s, e in self.chunks():
            st.set(slice(s, e), self.chunk(s, e))
        st.close()

    def bulk_plain(self) -> None:
        with h5py.File(self.path("ours.hdf5"), "r") as src, h5py.File(self.path("plain.hdf5"), "w") as f:
            dsets = {}
            for k, shape, dtype in KEYS:  # the same layout as the file HDF5Storage wrote
                s = src[k]
                dsets[k] = f.create_dataset(k, shape=(self.n,) + shape, dtype=dtype, chunks=s.chunks,
                                            compression=s.compression, compression_opts=s.compression_opts)
            for s, e in self.chunks():
                for k in dsets:
                    dsets[k][s:e] = self.data[k][s:e]

    def open_ours(self) -> Any:
        return HDF5Storage.load_from(self.path("ours.hdf5"), space(), **self.read_opts)

    def open_plain(self) -> Any:
        f = h5py.File(self.path("ours.hdf5"), "r")
        return f, {k: f[k] for k, _, _ in KEYS}

    def read_plain(self, obj: Any, idx: np.ndarray) -> Dict[str, np.ndarray]:
        uniq, inv = np.unique(idx, return_inverse=True)
        return {k: ds[uniq][inv] for k, ds in obj[1].items()}

    def close(self, obj: Any) -> None:
        (obj[0] if isinstance(obj, tuple) else obj).close()


class HDF5NoMmap(HDF5Config):
    name = "hdf5-nommap"
    options = {"use_mmap": False}
    read_opts = {"use_mmap": False}


class HDF5Gzip(HDF5Config):
    name = "hdf5-gzip"
    options = {"compression": "gzip", "compression_level": 4}


class ParquetConfig(Config):
    name = "parquet"

    def bulk_ours(self) -> None:
        st = ParquetStorage.create(space(), capacity=self.n, cache_path=self.path("ours"), piece_size=PIECE)
        for s, e in self.chunks():
            st.set(slice(s, e), self.chunk(s, e))
        st.close()

    def bulk_plain(self) -> None:
        out = self.path("plain")
        os.makedirs(out, exist_ok=True)
        buf = {k: np.zeros((self.n,) + shape, dtype) for k, shape, dtype in KEYS}
        written = 0
        for s, e in self.chunks():
            for k in buf:
                buf[k][s:e] = self.data[k][s:e]
            while written + PIECE <= e or (e == self.n and written < self.n):
                end = min(written + PIECE, self.n)
                cols = []
                for k, shape, _ in KEYS:
                    a = buf[k][written:end]
                    cols.append(pa.FixedSizeListArray.from_arrays(pa.array(a.reshape(-1)), shape[0]) if shape
                                else pa.array(a))
                pq.write_table(pa.table(cols, names=[k for k, _, _ in KEYS]),
                               os.path.join(out, f"part-{written // PIECE:06d}.parquet"), compression="snappy",
                               use_dictionary=False)  # as ParquetStorage writes numeric columns
                written = end

    def open_ours(self) -> Any:
        return ParquetStorage.load_from(self.path("ours"), space())

    def open_plain(self) -> Any:
        d = self.path("ours")
        files = sorted(f for f in os.listdir(d) if f.endswith(".parquet"))
        return pa.concat_tables([pq.read_table(os.path.join(d, f)) for f in files])

    def read_plain(self, obj: Any, idx: np.ndarray) -> Dict[str, np.ndarray]:
        t = obj.take(pa.array(idx))
        out = {}
        for k, shape, _ in KEYS:
            col = t.column(k).combine_chunks()
            out[k] = (col.flatten().to_numpy(zero_copy_only=False).reshape((-1,) + shape) if shape
                      else col.to_numpy(zero_copy_only=False))
        return out

    def close(self, obj: Any) -> None:
        if hasattr(obj, "close"):
            obj.close()


class NPZConfig(Config):
    name = "npz"

    def __init__(self, root: str, data: Dict[str, np.ndarray]) -> None:
        super().__init__(root, {k: v[:NPZ_STEPS] for k, v in data.items()})
        st = FlattenedStorage.create(space(), NPZStorage, capacity=1, cache_path=self.path("probe"))
        self.plan = st._plan
        st.close()
        self.remove("probe")

    def bulk_ours(self) -> None:
        st = FlattenedStorage.create(space(), NPZStorage, capacity=self.n, cache_path=self.path("ours"),
                                     compressed=False)
        for s, e in self.chunks():
            st.set(slice(s, e), self.chunk(s, e))
        st.close()

    def bulk_plain(self) -> None:
        out = self.path("plain")
        os.makedirs(out, exist_ok=True)
        for s, e in self.chunks():
            rows = self.plan.pack(self.chunk(s, e), (e - s,))
            for i in range(s, e):
                np.savez(os.path.join(out, f"{i}.npz"), data=rows[i - s])

    def open_ours(self) -> Any:
        return FlattenedStorage.load_from(self.path("ours"), space())

    def open_plain(self) -> Any:
        return os.path.join(self.path("ours"), "inner_storage")

    def read_plain(self, obj: Any, idx: np.ndarray) -> Dict[str, np.ndarray]:
        rows = []
        for i in idx.tolist():
            with np.load(os.path.join(obj, f"{i}.npz")) as z:
                rows.append(z["data"])
        return self.plan.unpack(np.stack(rows), to_backend=True)

    def close(self, obj: Any) -> None:
        if hasattr(obj, "close"):
            obj.close()


class MemmapRef(Config):
    """One NumpyMemmapStorage per key: the project's memmap storage on the same per-key layout."""

    name = "memmap"

    def bulk_ours(self) -> None:
        for k, _, _ in KEYS:
            st = NumpyMemmapStorage.create(leaf_space(k), capacity=self.n, cache_path=self.path(f"{k}.memmap"))
            for s, e in self.chunks():
                st.set(slice(s, e), self.data[k][s:e])
            st.close()

    def open_ours(self) -> Any:
        return {k: NumpyMemmapStorage.load_from(self.path(f"{k}.memmap"), leaf_space(k)) for k, _, _ in KEYS}

    def read_ours(self, obj: Any, idx: np.ndarray) -> Dict[str, np.ndarray]:
        return {k: st.get(idx) for k, st in obj.items()}

    def close(self, obj: Any) -> None:
        for st in obj.values():
            st.close()


CONFIGS = {c.name: c for c in (HDF5Config, HDF5NoMmap, HDF5Gzip, ParquetConfig, NPZConfig, MemmapRef)}


# ---------------------------------------------------------------------------------------------- timing
def timed(fn: Callable[[], Any]) -> float:
    gc.collect()
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def run_side(cfg: Config, side: str, rand: np.ndarray, n_batches: int) -> Dict[str, float]:
    """Times bulk / batch / open for one side ('ours' or 'plain') of a config; returns us per unit."""
    bulk = getattr(cfg, f"bulk_{side}")
    opener = getattr(cfg, f"open_{side}")
    reader = getattr(cfg, f"read_{side}")
    if side == "plain":
        cfg.remove("plain.hdf5")
        cfg.remove("plain")
    else:
        for tag in ("ours.hdf5", "ours") + tuple(f"{k}.memmap" for k, _, _ in KEYS):
            cfg.remove(tag)
    out = {"bulk": timed(bulk) / cfg.n * 1e6}
    if side == "plain" and not isinstance(cfg, MemmapRef):
        # plain writers wrote their own copy; reads use the file ours wrote (the same layout)
        pass
    batches = rand[:n_batches] % cfg.n
    obj = opener()
    reader(obj, batches[0])
    out["batch"] = timed(lambda: [reader(obj, b) for b in batches]) / len(batches) * 1e6
    cfg.close(obj)

    def open_and_read() -> None:
        o = opener()
        reader(o, batches[1])
        cfg.close(o)
    out["open"] = timed(open_and_read) * 1e6
    return out


def verify(cfg: Config, rand: np.ndarray) -> None:
    cfg.bulk_ours()
    if not isinstance(cfg, MemmapRef):
        cfg.bulk_plain()
    idx = np.concatenate([rand[0] % cfg.n, [0, cfg.n - 1, 5, 5]])
    for side in ("ours",) if isinstance(cfg, MemmapRef) else ("ours", "plain"):
        obj = getattr(cfg, f"open_{side}")()
        check(getattr(cfg, f"read_{side}")(obj, idx), cfg.data, idx, f"{cfg.name} {side}")
        cfg.close(obj)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="4,000 steps, 1 repeat")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    data, rand, source = workload(args.quick)
    repeats = 1 if args.quick else args.repeats
    names = [n for n in args.configs.split(",") if n]
    root = tempfile.mkdtemp(prefix="bench-formats-")
    print(f"W1: {len(data['obs'])} steps ({source}); NPZ: {min(NPZ_STEPS, len(data['obs']))} steps; "
          f"h5py {h5py.__version__} (HDF5 {h5py.version.hdf5_version}), pyarrow {pa.__version__}, numpy {np.__version__}; "
          f"{repeats} repeat(s), median")
    try:
        cfgs = {n: CONFIGS[n](root, data) for n in names}
        for cfg in cfgs.values():
            verify(cfg, rand)
        samples: Dict[Tuple[str, str, str], List[float]] = {}
        for r in range(repeats):
            order = list(cfgs.values()) if r % 2 == 0 else list(reversed(cfgs.values()))
            for cfg in order:
                nb = NPZ_BATCHES if isinstance(cfg, NPZConfig) else N_BATCHES
                for side in ("ours",) if isinstance(cfg, MemmapRef) else ("ours", "plain"):
                    for op, v in run_side(cfg, side, rand, nb).items():
                        samples.setdefault((cfg.name, side, op), []).append(v)
        med = {k: statistics.median(v) for k, v in samples.items()}
        units = {"bulk": "us/step", "batch": "us/batch", "open": "us/open"}
        print()
        print(f"| config | op | unit | ours | plain | ours/plain | memmap | ours/memmap |")
        print("|---|---|---|---:|---:|---:|---:|---:|")
        for name in names:
            if name == "memmap":
                continue
            for op in ("bulk", "batch", "open"):
                ours, plain = med[(name, "ours", op)], med[(name, "plain", op)]
                mm = med.get(("memmap", "ours", op))
                mm_s = f"{mm:.1f}" if mm is not None else "-"
                ratio_mm = f"{ours / mm:.2f}x" if mm else "-"
                print(f"| {name} | {op} | {units[op]} | {ours:.1f} | {plain:.1f} | {ours / plain:.2f}x | {mm_s} | "
                      f"{ratio_mm} |")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"source": source, "samples": {"/".join(k): v for k, v in samples.items()},
                           "median": {"/".join(k): v for k, v in med.items()}}, f, indent=1)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
