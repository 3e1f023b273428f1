#!/usr/bin/env python
"""The native layout (`create_native_storage`) against the raw-numpy limit, on workload W2, in one process.

W2 "camera": obs f32[64], action f32[8], reward f32, terminated bool, image uint8[128,128,3]; 10 episodes x 300
steps (147 MB of frames), from the shared harness generator (`../shared/bench/workloads.py`, `generate("W2")`), and
its read plan (200 batches of 256 random indices, 200 slices of 64 steps).

  native     create_native_storage(space, capacity=N, cache_path=dir): a DictStorage that keeps every leaf in its own
             dtype (the float32 leaves in one memory-mapped row, the bool leaf in another, the image in its own
             memory-mapped uint8 array), NumPy backend, fed NumPy rows
  raw-disk   the limit: one np.memmap per key (native dtype, no checks), used through .view(np.ndarray), fed the
             same NumPy rows (bench/_flat_limits.py)

Operations, each timed over the whole plan and reported per unit (bench/_flat_report.py `one_repeat`, the same code
as bench_flattened.py): append (mark_segment_start / append per step / mark_segment_end per episode), bulk
(set(slice) in chunks of 1,000 steps on a fresh storage), batch (get of 256 random indices), slice (get of 64 steps,
copied out), reopen (dumps + close + load_from + the first batch). Bytes on disk after a bulk write and dumps(),
against the native-dtype bytes of the data. Targets (issue #3): append <= 2x, bulk <= 1.3x, batch <= 1.5x,
slice <= 1.5x, bytes <= 1.05x (reopen: <= 3x, as for FlattenedStorage).

Usage:  .venv/bin/python bench/bench_native.py [--quick] [--repeats N]
"""
from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import gc  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from typing import Any, Dict, List, Optional  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _flat_limits import RawDisk  # noqa: E402
from _flat_report import fmt_us, one_repeat  # noqa: E402
from _flat_contenders import StorageApiOps  # noqa: E402
from _flat_workloads import HARNESS_DIR, OPS, SLICE_LEN, UNITS, Plan  # noqa: E402

STEPS_PER_EPISODE = 300
TARGETS = {"append": 2.0, "bulk": 1.3, "batch": 1.5, "slice": 1.5, "reopen": 3.0}
BYTES_TARGET = 1.05


def load_w2(quick: bool) -> Plan:
    if HARNESS_DIR not in sys.path:
        sys.path.insert(0, HARNESS_DIR)
    import workloads  # the shared generator: the same bytes every contender of the shared harness sees
    wl = workloads.generate("W2")
    data = {k: np.ascontiguousarray(v) for k, v in wl.data.items()}
    rand, offsets = np.asarray(wl.rand_indices, dtype=np.int64), np.asarray(wl.slice_offsets, dtype=np.int64)
    source = f"workloads.generate('W2') from {HARNESS_DIR}, fingerprint {workloads.fingerprint(wl)}"
    if quick:
        n = 3 * STEPS_PER_EPISODE
        data = {k: np.ascontiguousarray(v[:n]) for k, v in data.items()}
        rand, offsets = rand[:20] % n, offsets[:20] % (n - SLICE_LEN + 1)
        source += "; --quick: first 3 episodes, 20 batches and slices"
    plan = Plan(data, np.ascontiguousarray(rand), offsets, source)
    plan.episodes = [(s, min(s + STEPS_PER_EPISODE, plan.n)) for s in range(0, plan.n, STEPS_PER_EPISODE)]
    return plan


class Native(StorageApiOps):
    """`create_native_storage` of the W2 space, memory-mapped, NumPy backend."""

    name, label, medium, limit = "native", "create_native_storage (NumPy, memory-mapped)", "disk", "raw-disk"

    def prepare(self, plan: Plan) -> None:
        from unienv_interface.backends import NumpyComputeBackend as B
        from unienv_interface.space import BinarySpace, BoxSpace, DictSpace
        self.plan = plan
        spaces: Dict[str, Any] = {}
        for k, a in plan.data.items():
            shape = tuple(a.shape[1:])
            if a.dtype == np.bool_:
                spaces[k] = BinarySpace(B, shape=shape)
            elif a.dtype == np.uint8:
                spaces[k] = BoxSpace(B, 0, 255, np.uint8, shape=shape)
            else:
                lo, hi = (-1.0, 1.0) if k == "action" else (-np.inf, np.inf)
                spaces[k] = BoxSpace(B, lo, hi, a.dtype, shape=shape)
        self.space = DictSpace(B, spaces)
        self.steps = [{k: plan.data[k][i] for k in plan.keys} for i in range(plan.n)]
        self.chunk_data = [(s, e, {k: plan.data[k][s:e] for k in plan.keys}) for s, e in plan.chunks]
        self.rand = list(plan.rand)
        self.own = lambda v: v              # get returns copies already

    def create(self, path: str) -> Any:
        from unienv_data.storages.native_layout import create_native_storage
        return create_native_storage(self.space, capacity=self.plan.n, cache_path=path)

    def reopen(self, st: Any, path: str) -> Any:
        from unienv_data.storages.dict_storage import DictStorage
        st.dumps(path)
        st.close()
        back = DictStorage.load_from(path, self.space, capacity=self.plan.n)
        back.get(self.plan.rand[0])
        return back

    def read(self, st: Any, idx: np.ndarray) -> Dict[str, np.ndarray]:
        return {k: np.asarray(v) for k, v in st.get(idx).items()}


def bytes_on_disk(path: str) -> int:
    total = 0
    for d, _, files in os.walk(path):
        for f in files:
            total += os.stat(os.path.join(d, f)).st_blocks * 512
    return total


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="3 episodes, 20 batches and slices")
    ap.add_argument("--repeats", type=int, default=5, help="repeats (median reported); default 5")
    args = ap.parse_args(argv)
    plan = load_w2(args.quick)
    ours, limit = Native(), RawDisk()
    for c in (ours, limit):
        c.prepare(plan)
    gc.collect()
    gc.freeze()
    samples: Dict[str, Dict[str, List[float]]] = {c.name: {op: [] for op in OPS} for c in (ours, limit)}
    root = tempfile.mkdtemp(prefix="bench-native-")
    t0 = time.perf_counter()
    try:
        for c in (ours, limit):
            one_repeat(c, plan, root, -1, verify=True)       # untimed warm-up, checks the contents
        for r in range(args.repeats):
            for c in ((ours, limit) if r % 2 == 0 else (limit, ours)):
                for op, us in one_repeat(c, plan, root, r, verify=False).items():
                    samples[c.name][op].append(us)
        path = os.path.join(root, "bytes")
        st = ours.create(path)
        ours.bulk_all(st)
        st.dumps(path)
        st.close()
        on_disk = bytes_on_disk(path)
        raw = sum(a.nbytes for a in plan.data.values())
    finally:
        shutil.rmtree(root, ignore_errors=True)
    med = {name: {op: statistics.median(v) for op, v in ops.items()} for name, ops in samples.items()}
    print(f"native layout vs raw-numpy limit, W2: {plan.n} steps ({len(plan.episodes)} episodes), "
          f"{args.repeats} repeats, medians; single-threaded\ndata: {plan.source}\n")
    print(f"{ours.label}   vs   {limit.name}: {limit.label}")
    print(f"  {'op':<7} {'unit':<10} {'ours':>9} {'limit':>9} {'ratio':>8} {'target':>7}  verdict")
    over = []
    for op in OPS:
        ratio = med[ours.name][op] / med[limit.name][op]
        ok = ratio <= TARGETS[op]
        over += [] if ok else [op]
        print(f"  {op:<7} {UNITS[op]:<10} {fmt_us(med[ours.name][op]):>9} {fmt_us(med[limit.name][op]):>9} "
              f"{ratio:>7.2f}x {'<=' + format(TARGETS[op], '.1f') + 'x':>7}  {'PASS' if ok else 'over'}")
    ratio = on_disk / raw
    print(f"  bytes   on disk    {on_disk / 1e6:>8.1f}M {raw / 1e6:>8.1f}M {ratio:>7.3f}x {'<=' + str(BYTES_TARGET) + 'x':>7}"
          f"  {'PASS' if ratio <= BYTES_TARGET else 'over'}")
    print(f"\n{len(over)} of {len(OPS)} time ratios over target{': ' + ', '.join(over) if over else ''}; "
          f"ratio = median(ours) / median(limit), sides interleaved per repeat. Load average at the end: "
          f"{os.getloadavg()}; total {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
