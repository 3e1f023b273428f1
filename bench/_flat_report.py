"""Measurement and reporting for bench_flattened.py: one timed pass of every op, cProfile of one op, the table."""
from __future__ import annotations

import cProfile
import gc
import os
import pstats
import shutil
import time
from typing import Any, Callable, Dict, Optional, Tuple

import numpy as np

from _flat_workloads import Contender, Plan


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
