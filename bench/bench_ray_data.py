#!/usr/bin/env python
"""The Ray Data datasource (`read_unienv`) against a plain one-process loop over the same files, same run.

Small cases (Ray's fixed cost per execution dominates):
  vectors   ReplayBuffer(FlattenedStorage(PytorchTensorStorage, memmap)), W1 leaves (obs f32[64], action f32[8],
            reward f32, terminated bool); 1,000 episodes x 50 steps (15 MB)
  images    ReplayBuffer(native-layout DictStorage), image uint8[64,64,3] (its own memmap) + state f32[8] + done;
            1,000 episodes x 10 steps (123 MB)
  png       as images, but the image leaf is an ImageStorage (one PNG per row); 300 episodes x 10 steps
Realistic sizes (the shared workloads: W1 episodes are 400 steps, camera episodes 300 frames of 128x128x3):
  w1        as vectors, 1,000 episodes x 400 steps (118 MB)
  camera    as images at 128x128x3, 20 episodes x 300 frames (295 MB; W2's 10 episodes doubled)
  campng    as png at 128x128x3, 10 episodes x 300 frames
  camvideo  as camera, the image leaf in a VideoStorage (default codec settings), 10 episodes x 300 frames

  plain     open_dataset(path) once, then per episode `read_numpy(its rows)` plus the same bookkeeping columns
            (episode_id, step, episode_start, episode_end, index): every row of every episode as NumPy arrays
  ray       read_unienv(path, override_num_blocks=B) (the plan opens the dataset once, as the plain loop does), then
            every row consumed in the driver through iter_batches(batch_format="numpy"); B = read_unienv's default
            (one task per CPU, fewer for small datasets), B = 2, and Ray's own choice ("Ray auto":
            read_datasource without override_num_blocks, which makes up to 200 tasks)
  floor     what any Ray Data source costs here for the same output: B no-op read tasks (B = the default's) that
            each yield a block of the same rows and bytes already in the object store (a free read), consumed the
            same way. plain / floor is the best ratio any datasource could reach on this machine: where it is
            under the target, the target is out of reach for Ray Data itself, not for this datasource.

Ratio = plain seconds / ray seconds (a throughput ratio: >= 0.5x is the issue's target, > 1x means Ray is faster).
Both sides include opening the dataset. Medians over --repeats, the sides interleaved and their order swapped every
repeat. One warm-up pass (untimed) starts the Ray workers and checks that both sides return the same rows.

Usage:  .venv/bin/python bench/bench_ray_data.py [--quick] [--repeats N] [--cases vectors,images,...]
"""
from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import functools  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from typing import Any, Callable, Dict, List, Optional, Tuple  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)

from unienv_data.integrations.ray import init_local_cluster  # noqa: E402  (before anything imports ray)

from unienv_data.inspect import open_dataset  # noqa: E402
from unienv_data.integrations.ray._datasource_plan import split_runs  # noqa: E402
from unienv_data.integrations.ray.datasource import _datasource_class, default_num_blocks, read_unienv  # noqa: E402
from unienv_data.replay_buffer import ReplayBuffer  # noqa: E402
from unienv_data.storages.dict_storage import DictStorage  # noqa: E402
from unienv_data.storages.flattened import FlattenedStorage  # noqa: E402
from unienv_data.storages.image_storage import ImageStorage  # noqa: E402
from unienv_data.storages.native_layout import native_layout_kwargs  # noqa: E402
from unienv_data.storages.pytorch import PytorchTensorStorage  # noqa: E402
from unienv_interface.backends.pytorch import PyTorchComputeBackend as TB  # noqa: E402
from unienv_interface.space import BinarySpace, BoxSpace, DictSpace  # noqa: E402

TARGET = 0.5


# ---------------------------------------------------------------------------------------------------- datasets
def _fill(rb: ReplayBuffer, data: Dict[str, np.ndarray], steps: int) -> None:
    n = len(next(iter(data.values())))
    for s in range(0, n, steps):
        w = rb.open_segment_writer()
        chunk = {k: torch.from_numpy(v[s:s + steps]) for k, v in data.items()}
        for i in range(steps):
            w.append({k: t[i] for k, t in chunk.items()})
        rb.commit_segment(w)
    rb.dumps()
    rb.close()


def make_vectors(path: str, episodes: int, steps: int) -> None:
    rng = np.random.default_rng(0)
    n = episodes * steps
    space = DictSpace(TB, {"obs": BoxSpace(TB, -np.inf, np.inf, torch.float32, shape=(64,)),
                           "action": BoxSpace(TB, -1.0, 1.0, torch.float32, shape=(8,)),
                           "reward": BoxSpace(TB, -np.inf, np.inf, torch.float32, shape=()),
                           "terminated": BinarySpace(TB, ())})
    data = {"obs": rng.standard_normal((n, 64), dtype=np.float32),
            "action": rng.uniform(-1, 1, (n, 8)).astype(np.float32),
            "reward": rng.standard_normal(n, dtype=np.float32),
            "terminated": (np.arange(n) % steps) == steps - 1}
    rb = ReplayBuffer.create(FlattenedStorage, space, inner_storage_cls=PytorchTensorStorage, cache_path=path,
                             capacity=n, is_memmap=True)
    _fill(rb, data, steps)


def _image_data(episodes: int, steps: int, side: int = 64) -> Tuple[DictSpace, Dict[str, np.ndarray]]:
    rng = np.random.default_rng(1)
    n = episodes * steps
    space = DictSpace(TB, {"image": BoxSpace(TB, 0, 255, torch.uint8, shape=(side, side, 3)),
                           "state": BoxSpace(TB, -np.inf, np.inf, torch.float32, shape=(8,)),
                           "done": BinarySpace(TB, ())})
    # smooth images (a PNG of noise is all entropy and no compression: unrealistic)
    yy, xx = np.mgrid[0:side, 0:side]
    base = ((xx[None, :, :, None] + yy[None, :, :, None] * 2 + np.arange(3)[None, None, None, :] * 40)
            % 256).astype(np.int64)
    shift = rng.integers(0, 256, (n, 1, 1, 1))
    images = ((base + shift) % 256).astype(np.uint8)
    data = {"image": images, "state": rng.standard_normal((n, 8), dtype=np.float32),
            "done": (np.arange(n) % steps) == steps - 1}
    return space, data


def make_images(path: str, episodes: int, steps: int, side: int = 64) -> None:
    space, data = _image_data(episodes, steps, side)
    rb = ReplayBuffer.create(DictStorage, space, cache_path=path, capacity=episodes * steps,
                             **native_layout_kwargs(space))
    _fill(rb, data, steps)


def make_png(path: str, episodes: int, steps: int, side: int = 64) -> None:
    space, data = _image_data(episodes, steps, side)
    kwargs = native_layout_kwargs(space)
    kwargs["storage_cls_map"]["image"] = ImageStorage
    rb = ReplayBuffer.create(DictStorage, space, cache_path=path, capacity=episodes * steps, **kwargs)
    _fill(rb, data, steps)


def make_video(path: str, episodes: int, steps: int, side: int = 64) -> None:
    space, data = _image_data(episodes, steps, side)
    rb = ReplayBuffer.create(DictStorage, space, cache_path=path, capacity=episodes * steps,
                             **native_layout_kwargs(space, image_storage="video"))
    _fill(rb, data, steps)


# ---------------------------------------------------------------------------------------------------- the two sides
def plain_read(path: str) -> Tuple[int, float, float]:
    """(rows, open seconds, loop seconds)."""
    t0 = time.perf_counter()
    ds = open_dataset(path)
    t1 = time.perf_counter()
    rows = 0
    for eid, (s, e) in enumerate(ds.episodes()):
        batch = ds.read_numpy(np.arange(s, e))
        n = e - s
        step = np.arange(n, dtype=np.int64)
        batch.update(episode_id=np.full(n, eid, dtype=np.int64), step=step, episode_start=step == 0,
                     episode_end=step == n - 1, index=step + s)
        rows += n
    ds.close()
    return rows, t1 - t0, time.perf_counter() - t1


def ray_read(path: str, blocks: Any) -> Tuple[int, float, float]:
    """(rows, seconds to make the dataset (the plan), seconds to execute and consume it). `blocks`: an int,
    "default" (read_unienv's choice) or "ray" (Ray's own choice: read_datasource without override_num_blocks)."""
    import ray.data
    t0 = time.perf_counter()
    if blocks == "ray":
        ds = ray.data.read_datasource(_datasource_class()(path))
    else:
        ds = read_unienv(path, override_num_blocks=None if blocks == "default" else blocks)
    t1 = time.perf_counter()
    rows = 0
    for batch in ds.iter_batches(batch_size=None, batch_format="numpy"):
        rows += len(batch["episode_id"])
    return rows, t1 - t0, time.perf_counter() - t1


class Floor:
    """Ray's own cost for a read's output: the blocks a read of `path` with `blocks` tasks makes (same rows and
    bytes), put in the object store once; `run()` executes `blocks` read tasks that only fetch and yield them."""

    def __init__(self, path: str) -> None:
        import pyarrow as pa
        import ray
        from ray.data.extensions import ArrowTensorArray
        plan = _datasource_class()(path).plan
        cpus = int(ray.cluster_resources().get("CPU", 1))
        n = default_num_blocks(plan.num_rows * plan.row_nbytes, cpus, len(plan.runs), copy_only=plan.copy_only)
        self.blocks = []
        for runs in split_runs(plan.runs, n):
            rows = sum(r.length for r in runs)
            payload = np.full((rows, plan.row_nbytes), 7, dtype=np.uint8)
            self.blocks.append(ray.put(pa.table({"payload": ArrowTensorArray.from_numpy(payload)})))
        self.n = n

    def run(self) -> Tuple[int, float, float]:
        """(rows, 0, seconds to execute and consume)."""
        import ray
        import ray.data
        from ray.data.block import BlockMetadata
        refs = self.blocks

        class _Source(ray.data.Datasource):
            def estimate_inmemory_data_size(self) -> Optional[int]:
                return None

            def get_read_tasks(self, parallelism: int, per_task_row_limit: Optional[int] = None,
                               data_context: Optional[Any] = None) -> List[Any]:
                def task(ref: Any) -> Any:
                    yield ray.get(ref)
                meta = BlockMetadata(num_rows=None, size_bytes=None, input_files=None, exec_stats=None)
                return [ray.data.ReadTask(functools.partial(task, r), meta) for r in refs]

        t0 = time.perf_counter()
        rows = 0
        for batch in ray.data.read_datasource(_Source(), override_num_blocks=self.n).iter_batches(
                batch_size=None, batch_format="numpy"):
            rows += len(batch["payload"])
        return rows, 0.0, time.perf_counter() - t0


def check_same(path: str) -> None:
    """The warm-up check: Ray returns the rows the plain loop reads (sums per column)."""
    ds = open_dataset(path)
    want: Dict[str, float] = {}
    for s, e in ds.episodes():
        for k, v in ds.read_numpy(np.arange(s, e)).items():
            want[k] = want.get(k, 0.0) + float(v.astype(np.float64).sum())
    ds.close()
    got: Dict[str, float] = {}
    for batch in read_unienv(path, override_num_blocks=2).iter_batches(batch_size=None, batch_format="numpy"):
        for k in want:
            got[k] = got.get(k, 0.0) + float(batch[k].astype(np.float64).sum())
    for k in want:
        if not np.isclose(got[k], want[k], rtol=1e-9, atol=1e-6):
            raise SystemExit(f"{path}: column {k} differs: ray {got[k]} vs plain {want[k]}")


def measure(path: str, repeats: int, floor: Floor) -> Dict[str, List[float]]:
    sides: List[Tuple[str, Callable[[], Tuple[int, float, float]]]] = [
        ("plain", lambda: plain_read(path)),
        ("raydef", lambda: ray_read(path, "default")),
        ("ray2", lambda: ray_read(path, 2)),
        ("rayauto", lambda: ray_read(path, "ray")),
        ("floor", floor.run),
    ]
    out: Dict[str, List[float]] = {}
    rows = set()
    for r in range(repeats):
        for name, fn in (sides if r % 2 == 0 else sides[::-1]):
            n, a, b = fn()
            rows.add(n)
            out.setdefault(name + ":open", []).append(a)
            out.setdefault(name + ":rest", []).append(b)
            out.setdefault(name, []).append(a + b)
    if len(rows) != 1:
        raise SystemExit(f"{path}: the sides read different row counts: {sorted(rows)}")
    out["rows"] = [float(rows.pop())]
    plan = _datasource_class()(path).plan
    out["bytes"] = [float(plan.num_rows * plan.row_nbytes)]
    return out


CASES: Dict[str, Tuple[Callable[..., None], int, int, int]] = {   # make, episodes, steps, image side
    "vectors": (make_vectors, 1000, 50, 0),
    "images": (make_images, 1000, 10, 64),
    "png": (make_png, 300, 10, 64),
    "w1": (make_vectors, 1000, 400, 0),
    "camera": (make_images, 20, 300, 128),
    "campng": (make_png, 10, 300, 128),
    "camvideo": (make_video, 10, 300, 128),
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a tenth of the episodes (at least 2), 3 repeats")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--cases", default=",".join(CASES))
    args = ap.parse_args()
    repeats = 3 if args.quick else args.repeats
    wanted = [c for c in args.cases.split(",") if c]
    unknown = [c for c in wanted if c not in CASES]
    if unknown:
        raise SystemExit(f"unknown cases {unknown}; known: {sorted(CASES)}")

    init_local_cluster(num_cpus=2, object_store_bytes=1 << 30)
    import ray.data
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    ctx.print_on_execution_start = False
    root = tempfile.mkdtemp(prefix="unienv-bench-raydata-")
    results = []
    try:
        for name in wanted:
            make, episodes, steps, side = CASES[name]
            if args.quick:
                episodes = max(2, episodes // 10)
            path = os.path.join(root, name)
            t = time.perf_counter()
            if side:
                make(path, episodes, steps, side)
            else:
                make(path, episodes, steps)
            print(f"[{name}] wrote {episodes} episodes x {steps} steps in {time.perf_counter() - t:.1f} s",
                  flush=True)
            check_same(path)                      # also the warm-up: workers started, torch imported in them
            floor = Floor(path)
            plain_read(path)
            for blocks in ("default", 2, "ray"):
                ray_read(path, blocks)
            floor.run()
            m = measure(path, repeats, floor)
            results.append((name, episodes, steps, floor.n, m))
            del floor
            shutil.rmtree(path, ignore_errors=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
        import ray
        ray.shutdown()

    med = statistics.median
    print()
    print(f"Ray Data datasource vs a plain loop over the same files (2 CPUs, medians of {repeats}; "
          f"ratio = plain s / ray s, target >= {TARGET}x; best = plain s / floor s, the most any Ray Data source "
          "reaches)")
    print(f"  {'case':8} {'episodes':>8} {'rows':>7} {'MB':>5} {'plain s':>8} {'default':>8} {'B':>2} {'ratio':>6} "
          f"{'B=2':>7} {'ratio':>6} {'Ray auto':>8} {'ratio':>6} {'floor':>7} {'best':>6}  verdict (default)")
    for name, episodes, _steps, nb, m in results:
        plain, rd, r2, ra, fl = (med(m[k]) for k in ("plain", "raydef", "ray2", "rayauto", "floor"))
        if plain / rd >= TARGET:
            verdict = "PASS"
        elif plain / fl < TARGET:
            verdict = "out of reach (floor)"
        else:
            verdict = "under"
        mb = m["bytes"][0] / 1e6
        print(f"  {name:8} {episodes:>8} {int(m['rows'][0]):>7} {mb:5.0f} {plain:8.3f} {rd:8.3f} {nb:>2} "
              f"{plain / rd:5.2f}x {r2:7.3f} {plain / r2:5.2f}x {ra:8.3f} {plain / ra:5.2f}x {fl:7.3f} "
              f"{plain / fl:5.2f}x  {verdict}")
    print()
    print("Split: opening / planning vs the rest (seconds, medians; ray = read_unienv default)")
    print(f"  {'case':8} {'plain open':>10} {'plain loop':>10} {'ray plan':>9} {'ray exec':>9} "
          f"{'loop/exec':>9}")
    for name, _e, _s, _nb, m in results:
        po, pl = med(m["plain:open"]), med(m["plain:rest"])
        ro, rx = med(m["raydef:open"]), med(m["raydef:rest"])
        print(f"  {name:8} {po:10.3f} {pl:10.3f} {ro:9.3f} {rx:9.3f} {pl / rx:8.2f}x")
    print()
    print("Notes: `floor` executes the same number of read tasks as the default, each yielding an equally large block")
    print("that is already in the object store: Ray's cost per execution (~35-60 ms here) plus one copy of every")
    print("block into the object store and its hand-off to the driver. Data that a plain loop copies out of the page")
    print("cache at memory speed (memmap arrays) cannot reach 0.5x through Ray Data on one node; reads that decode")
    print("(PNG, video) or that a cluster spreads over many nodes are where the datasource pays off.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
