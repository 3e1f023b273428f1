"""WindowDataset through a torch DataLoader on memory-mapped camera data: samples/s with 0 and 2 workers.

Data: a ReplayBuffer over a DictStorage with one NumpyMemmapStorage per key (the native layout), reopened with
`load_from` (so workers map the same files): `observation.image` uint8 (128, 128, 3), `action` float32 (7,),
episodes of 100 steps. Items: `{"observation.image": [-1, 0], "action": range(16)}` with pad masks; batch 64
(about 6.3 MB per batch, almost all camera bytes).

Rows (each a fresh DataLoader, shuffled, persistent workers, first batches discarded as warm-up):

* `shared_memory_dataloader(ds, 64, num_workers=w)`: workers copy each batch into a preallocated shared-memory
  slot and the parent's tensors are that memory (no copy in the parent); the ratio 2 / 0 workers of this row is
  the verdict (>= 1 passes);
* `collate_fn=WindowDataset.collate_fn` (batches become torch tensors in the worker, handed over in shared
  memory, one segment and one file descriptor per tensor) with 0 and 2 workers;
* the same with an identity collate (NumPy batches pickled through the worker's pipe): the pre-fix behaviour,
  for comparison.

Each row also prints the CPU time the training process itself spends per batch (`getrusage`, its own threads
only): what the workers take off the training loop. Samples/s depend on how many cores are free; on a machine
whose cores are busy with other work, 2 workers plus the training process compete for them.

Run: `.venv/bin/python bench/bench_windows.py [--steps 3000] [--seconds 4] [--batch 64]`.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import warnings
from typing import Any, Callable, Dict, Tuple

import numpy as np


def build(path: str, steps: int, episode: int) -> None:
    from unienv_data.replay_buffer import ReplayBuffer
    from unienv_data.storages.dict_storage import DictStorage
    from unienv_data.storages.numpy_memmap import NumpyMemmapStorage
    from unienv_interface.backends import NumpyComputeBackend as B
    from unienv_interface.space import BoxSpace, DictSpace
    space = DictSpace(B, {"observation.image": BoxSpace(B, 0, 255, B.dtype_from_name("uint8"), shape=(128, 128, 3)),
                          "action": BoxSpace(B, -1.0, 1.0, B.dtype_from_name("float32"), shape=(7,))})
    rb = ReplayBuffer.create(DictStorage, space, {"observation.image": NumpyMemmapStorage,
                                                  "action": NumpyMemmapStorage},
                             cache_path=path, capacity=steps)
    rng = np.random.default_rng(0)
    for s in range(0, steps, episode):
        n = min(episode, steps - s)
        img = rng.integers(0, 256, (n, 128, 128, 3), dtype=np.uint8)
        act = rng.uniform(-1, 1, (n, 7)).astype(np.float32)
        for i in range(n):                   # append + mark_segment_end records the episode
            rb.append({"observation.image": img[i], "action": act[i]})
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


def measure(loader: Any, seconds: float) -> Tuple[float, float]:
    """`(samples/s, CPU ms the training process spends per batch)`: the second is what workers take off the
    training loop, and does not depend on how busy the other cores are."""
    import resource
    n = batches = 0
    it = iter(loader)
    for _ in range(3):                     # warm-up: worker start, page cache
        next(it)
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        try:
            b = next(it)
        except StopIteration:
            it = iter(loader)
            continue
        n += int(b["index"].shape[0])
        batches += 1
    dt = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    del it, loader
    return n / dt, 1e3 * cpu / max(batches, 1)


def main(argv: Any = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--episode", type=int, default=100)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--seconds", type=float, default=4.0)
    p.add_argument("--slots-only", action="store_true", help="skip the plain-DataLoader comparison rows")
    p.add_argument("--dir", default=None, help="where to write the dataset (default: a temporary directory)")
    args = p.parse_args(argv)
    warnings.simplefilter("ignore")
    from unienv_data.batches import WindowDataset
    from unienv_data.integrations.torch_loader import shared_memory_dataloader
    from unienv_data.replay_buffer import ReplayBuffer
    from unienv_interface.backends import NumpyComputeBackend
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        path = os.path.join(tmp, "cam")
        build(path, args.steps, args.episode)
        rb = ReplayBuffer.load_from(path, backend=NumpyComputeBackend)
        ds = WindowDataset(rb, {"observation.image": [-1, 0], "action": range(16)}, pad=True)
        mb = sum(v.nbytes for v in ds.__getitems__(np.arange(args.batch)).values()) / 2 ** 20
        print(f"{len(ds)} windows, batch {args.batch} = {mb:.1f} MiB; CPUs: {os.cpu_count()}")
        res: Dict[str, float] = {}
        rows = [("shared-memory slots", lambda w: shared_memory_dataloader(ds, args.batch, num_workers=w, seed=0,
                                                                          persistent_workers=w > 0))]
        if not args.slots_only:
            rows += [("tensor collate", lambda w: plain(ds, w, WindowDataset.collate_fn, args.batch)),
                     ("numpy (pickled)", lambda w: plain(ds, w, identity, args.batch))]
        for label, make in rows:
            for w in (0, 2):
                r, cpu = measure(make(w), args.seconds)
                res[f"{label}/{w}"] = r
                print(f"{label:20s} workers={w}: {r:9.0f} samples/s, training process {cpu:5.2f} ms CPU per batch")
        for label, _ in rows:
            ratio = res[f"{label}/2"] / res[f"{label}/0"]
            print(f"{label:20s} ratio 2 workers / 0 workers: {ratio:.2f}x")
        rb.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
