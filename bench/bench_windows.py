"""WindowDataset through a torch DataLoader on memory-mapped camera data: samples/s with 0 and 2 workers.

Data: a ReplayBuffer over a DictStorage with one NumpyMemmapStorage per key (the native layout), reopened with
`load_from` once per backend (`numpy`, `torch`; workers map the same files): `observation.image` uint8
(128, 128, 3), `observation.state` float32 (8,), `action` float32 (7,), episodes of 100 steps. Items:
`{"observation.image": [-1, 0], "observation.state": [-1, 0], "action": range(16)}` with pad masks; batch 64
(about 6 MB per batch, almost all camera bytes).

Rows: the documented default loader, `shared_memory_dataloader(ds, 64, num_workers=w, persistent_workers=w > 0)`
(docs/batches.md), for each backend with 0 and 2 workers. Each measurement is a fresh loader, shuffled, first
batches discarded as warm-up. The rows run interleaved, `--repeats` rounds, so slow phases of a shared machine hit
every row alike; the summary gives min and median samples/s per row and the ratio 2 workers / 0 workers per round
(>= 1 is the goal). `--compare` adds plain DataLoaders with 2 workers (tensor collate: one shared-memory segment
per tensor; identity collate: NumPy pickled through the pipe) for comparison.

Each row also prints the CPU time per batch of the training process itself (`getrusage`, its own threads only:
what the workers take off the training loop) and of the worker processes (`/proc/<pid>/stat`: what making a
batch costs there); unlike samples/s, these hardly depend on how busy the cores are. Samples/s depend on how many cores are free; on a machine
whose cores are busy with other work, 2 workers plus the training process compete for them.

`--step-ms X` makes the loop sleep X ms per batch, like a training step waiting for an accelerator: workers then
read while the loop waits (without them the two add up).

Run: `.venv/bin/python bench/bench_windows.py [--steps 3000] [--seconds 2] [--repeats 3] [--batch 64] [--step-ms 0]`.
"""
from __future__ import annotations

import argparse
import functools
import os
import sys
import tempfile
import time
import warnings
from typing import Any, Callable, Dict, List, Tuple

import numpy as np


WINDOWS = {"observation.image": [-1, 0], "observation.state": [-1, 0], "action": range(16)}


def build(path: str, steps: int, episode: int) -> None:
    from unienv_data.replay_buffer import ReplayBuffer
    from unienv_data.storages.dict_storage import DictStorage
    from unienv_data.storages.numpy_memmap import NumpyMemmapStorage
    from unienv_interface.backends import NumpyComputeBackend as B
    from unienv_interface.space import BoxSpace, DictSpace
    space = DictSpace(B, {"observation.image": BoxSpace(B, 0, 255, B.dtype_from_name("uint8"), shape=(128, 128, 3)),
                          "observation.state": BoxSpace(B, -10.0, 10.0, B.dtype_from_name("float32"), shape=(8,)),
                          "action": BoxSpace(B, -1.0, 1.0, B.dtype_from_name("float32"), shape=(7,))})
    rb = ReplayBuffer.create(DictStorage, space, {key: NumpyMemmapStorage for key in space.spaces},
                             cache_path=path, capacity=steps)
    rng = np.random.default_rng(0)
    for s in range(0, steps, episode):
        n = min(episode, steps - s)
        img = rng.integers(0, 256, (n, 128, 128, 3), dtype=np.uint8)
        state = rng.uniform(-10, 10, (n, 8)).astype(np.float32)
        act = rng.uniform(-1, 1, (n, 7)).astype(np.float32)
        for i in range(n):                   # append + mark_segment_end records the episode
            rb.append({"observation.image": img[i], "observation.state": state[i], "action": act[i]})
        rb.mark_segment_end()
    rb.dumps(path)
    rb.close()


def identity(batch: Any) -> Any:
    return batch


def plain(ds: Any, workers: int, collate: Callable[[Any], Any], batch: int) -> Any:
    import torch
    from torch.utils.data import DataLoader
    return DataLoader(ds, batch_size=batch, shuffle=True, num_workers=workers, collate_fn=collate,
                      persistent_workers=workers > 0, generator=torch.Generator().manual_seed(0))


def _worker_cpu(it: Any) -> float:
    """CPU seconds the loader iterator's worker processes have used so far (Linux `/proc`; 0 without workers)."""
    total = 0.0
    for w in getattr(it, "_workers", []):
        try:
            with open(f"/proc/{w.pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, ValueError, IndexError):
            return float("nan")
    return total


def measure(loader: Any, seconds: float, step_ms: float = 0.0) -> Tuple[float, float, float]:
    """`(samples/s, CPU ms the training process spends per batch, CPU ms the workers spend per batch)`: the CPU
    figures do not depend on how busy the machine's cores are; the workers' is what a batch costs to make."""
    import resource
    n = batches = 0
    it = iter(loader)
    for _ in range(3):                     # warm-up: worker start, page cache
        next(it)
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    w0 = _worker_cpu(it)
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        try:
            b = next(it)
        except StopIteration:
            w0 -= _worker_cpu(it)
            it = iter(loader)
            w0 += _worker_cpu(it)
            continue
        n += int(b["index"].shape[0])
        batches += 1
        if step_ms:
            time.sleep(step_ms / 1e3)      # a training step that waits for an accelerator (frees the CPU)
    dt = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    wcpu = _worker_cpu(it) - w0
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    del it, loader
    return n / dt, 1e3 * cpu / max(batches, 1), 1e3 * wcpu / max(batches, 1)


def main(argv: Any = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--episode", type=int, default=100)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--seconds", type=float, default=2.0, help="measured seconds per row and repeat")
    p.add_argument("--repeats", type=int, default=3, help="rounds; every round runs every row once (interleaved)")
    p.add_argument("--backends", default="numpy,torch", help="backends the buffer is opened with")
    p.add_argument("--prefetch", default="2", help="prefetch_factor values of the 2-worker rows (comma separated)")
    p.add_argument("--step-ms", type=float, default=0.0,
                   help="a simulated training step per batch: the loop sleeps this long (as when it waits for a GPU)")
    p.add_argument("--compare", action="store_true",
                   help="also run the plain-DataLoader rows (tensor collate, pickled NumPy) for comparison")
    p.add_argument("--dir", default=None, help="where to write the dataset (default: a temporary directory)")
    args = p.parse_args(argv)
    warnings.simplefilter("ignore")
    from unienv_data.batches import WindowDataset
    from unienv_data.integrations.torch_loader import shared_memory_dataloader
    from unienv_data.replay_buffer import ReplayBuffer
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        path = os.path.join(tmp, "cam")
        build(path, args.steps, args.episode)
        buffers = {b: ReplayBuffer.load_from(path, backend=b) for b in args.backends.split(",")}
        sets = {b: WindowDataset(rb, WINDOWS, pad=True) for b, rb in buffers.items()}
        first = next(iter(sets.values()))
        mb = sum(int(np.prod(tuple(v.shape))) * v.element_size() if hasattr(v, "element_size") else v.nbytes
                 for v in first.__getitems__(np.arange(args.batch)).values()) / 2 ** 20
        print(f"{len(first)} windows, batch {args.batch} = {mb:.1f} MiB; CPUs: {os.cpu_count()}; "
              f"{args.repeats} rounds of {args.seconds:g} s per row")
        rows: List[Tuple[str, int, Callable[[], Any]]] = []
        prefetch = [int(x) for x in args.prefetch.split(",")]
        for b, ds in sets.items():
            rows.append((f"{b} default", 0, functools.partial(shared_memory_dataloader, ds, args.batch,
                                                              num_workers=0, seed=0)))
            for pf in prefetch:
                label = f"{b} default" if pf == prefetch[0] else f"{b} prefetch {pf}"
                rows.append((label, 2, functools.partial(shared_memory_dataloader, ds, args.batch, num_workers=2,
                                                         seed=0, persistent_workers=True, prefetch_factor=pf)))
        if args.compare:
            ds = next(iter(sets.values()))
            rows += [("tensor collate", 2, lambda: plain(ds, 2, WindowDataset.collate_fn, args.batch)),
                     ("numpy (pickled)", 2, lambda: plain(ds, 2, identity, args.batch))]
        rates: Dict[Tuple[str, int], List[float]] = {}
        cpus: Dict[Tuple[str, int], List[float]] = {}
        wcpus: Dict[Tuple[str, int], List[float]] = {}
        for r in range(args.repeats):
            for label, w, make in rows:
                rate, cpu, wcpu = measure(make(), args.seconds, args.step_ms)
                rates.setdefault((label, w), []).append(rate)
                cpus.setdefault((label, w), []).append(cpu)
                wcpus.setdefault((label, w), []).append(wcpu)
                print(f"  round {r + 1}: {label:16s} workers={w}: {rate:9.0f} samples/s, CPU ms per batch: "
                      f"training process {cpu:5.2f}, workers {wcpu:5.2f}", flush=True)
        print(f"{'loader':16s} {'workers':>7s} {'min':>9s} {'median':>9s}  (samples/s)  CPU ms per batch (median): "
              "training process, workers")
        for (label, w), v in rates.items():
            print(f"{label:16s} {w:7d} {min(v):9.0f} {float(np.median(v)):9.0f}  {'':11s}  "
                  f"{float(np.median(cpus[(label, w)])):5.2f}, {float(np.median(wcpus[(label, w)])):5.2f}")
        for b in sets:
            r0, r2 = rates[(f"{b} default", 0)], rates[(f"{b} default", 2)]
            per_round = [x2 / x0 for x0, x2 in zip(r0, r2)]
            print(f"{b:6s} ratio 2 workers / 0 workers: median {float(np.median(per_round)):.2f}x, "
                  f"min {min(per_round):.2f}x, max {max(per_round):.2f}x (per round)")
        if len(sets) == 2:
            b0, b1 = list(sets)
            for w in (0, 2):
                q = float(np.median(rates[(f"{b1} default", w)])) / float(np.median(rates[(f"{b0} default", w)]))
                print(f"{b1} / {b0} backend, workers={w}: {q:.2f}x (medians)")
        for rb in buffers.values():
            rb.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
