"""Crash trial of a disk-backed `multiprocessing=True` ReplayBuffer (used by tests/test_crash_trials.py).

A coordinator process (forked by the crash-trial fork server, see tests/_crash_child.py) creates a memory-mapped
buffer with `multiprocessing=True` in a directory, forks `WRITERS` writer processes that record seeded episodes
into it (half through `append` + `mark_segment_end`, half through `open_segment_writer` + `commit_segment`; nobody
calls `dumps()` but the coordinator, now and then), then SIGKILLs its whole process group (itself and every writer)
after a seeded delay: a crash of the machine's recording job at a random instant, with commits in flight.

Each writer prints `COMMITTED <eid> <start> <n> <checksum>` right after its commit returned, still under the
buffer's lock (so the lines are in commit order and `start` is where the episode was placed). Reopened, the
directory must list every printed episode that no later commit overwrote, byte-identical at its place, except
those the commit in flight at the kill (at the tail, at most `MAX_LEN` rows) overlaps; every listed segment must be
one whole episode; an unprinted (in-flight) episode may be listed only whole, at the tail.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time
from typing import Any, Dict, List, Tuple

import numpy as np

WRITERS = 3
MAX_LEN = 8
KIND_CODE = 11


def mp_plan(seed: int) -> Dict[str, Any]:
    """The seeded parameters of one trial: capacity, kill delay (s), and how often the coordinator dumps."""
    rng = np.random.default_rng([int(seed), KIND_CODE, 1])
    return {"capacity": int(rng.integers(24, 49)), "kill_after": float(rng.uniform(0.05, 0.5)),
            "dumps_every": float(rng.choice([0.01, 0.05, 1e9]))}


def _writer(rb: Any, seed: int, w: int, cc: Any) -> None:
    out = cc._Out(1)
    rng = np.random.default_rng([int(seed), KIND_CODE, 10 + w])
    j = 0
    while True:
        eid = (w + 1) * 100000 + j
        n = int(rng.integers(1, MAX_LEN + 1))
        data = cc.episode_arrays("flat", seed, eid, n)
        chk = cc.episode_checksum(data)
        if rng.random() < 0.5:
            for t in range(n):
                rb.append(cc.step_value("flat", data, t))
            with rb._state.locked():
                rb.mark_segment_end()
                s, ln = rb._state.get_segments()[-1]
                out(f"COMMITTED {eid} {s} {ln} {chk}")
        else:
            wr = rb.open_segment_writer()
            for t in range(n):
                wr.append(cc.step_value("flat", data, t))
            with rb._state.locked():
                rb.commit_segment(wr)
                s, ln = rb._state.get_segments()[-1]
                out(f"COMMITTED {eid} {s} {ln} {chk}")
        j += 1


def run(spec: Dict[str, Any], cc: Any) -> None:
    """The coordinator (see the module docstring); never returns: it kills its process group."""
    from unienv_data.replay_buffer import ReplayBuffer
    from unienv_data.storages.flattened import FlattenedStorage
    from unienv_data.storages.pytorch import PytorchTensorStorage
    os.setpgid(0, 0)
    plan = mp_plan(spec["seed"])
    out = cc._Out(1)
    rb = ReplayBuffer.create(FlattenedStorage, cc.torch_space(), inner_storage_cls=PytorchTensorStorage,
                             cache_path=spec["main"], capacity=plan["capacity"], is_memmap=True, multiprocessing=True)
    name = getattr(getattr(rb._state._lock, "_semlock", None), "name", None)
    if name:
        out(f"SEMAPHORE {name}")
    out("READY")
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_writer, args=(rb, spec["seed"], w, cc), daemon=True) for w in range(WRITERS)]
    for p in procs:
        p.start()
    t0 = time.monotonic()
    next_dump = t0 + plan["dumps_every"]
    while time.monotonic() - t0 < plan["kill_after"]:
        time.sleep(0.002)
        if time.monotonic() >= next_dump:
            rb.dumps()
            next_dump += plan["dumps_every"]
    os.killpg(0, signal.SIGKILL)
    time.sleep(10)  # never reached


def _overlap(a: Tuple[int, int], b: Tuple[int, int], cap: int) -> bool:
    ra = {(a[0] + i) % cap for i in range(a[1])}
    return any((b[0] + i) % cap in ra for i in range(b[1]))


def verify(seed: int, main: str, result: Dict[str, Any], cc: Any) -> List[str]:
    """Every broken promise in what the killed trial left behind (empty when all hold)."""
    cap = mp_plan(seed)["capacity"]
    problems: List[str] = []
    for ln in result["lines"]:
        if ln.startswith("ERROR"):
            problems.append("a process raised: " + ln[:1500])
    if "READY" not in result["lines"]:
        return problems + ["the buffer was never created"]
    printed: List[Tuple[int, int, int]] = []
    for ln in result["lines"]:
        if ln.startswith("COMMITTED "):
            _tag, e, s, n, chk = ln.split()
            want = cc.episode_checksum(cc.episode_arrays("flat", seed, int(e), int(n)))
            if int(chk) != want:
                problems.append(f"episode {e}: printed checksum {chk} != recomputed {want}")
            printed.append((int(e), int(s), int(n)))
    live: List[Tuple[int, int, int]] = []
    for e, s, n in printed:
        live = [x for x in live if not _overlap((x[1], x[2]), (s, n), cap)]
        live.append((e, s, n))
    tail = (printed[-1][1] + printed[-1][2]) % cap if printed else 0
    required = {e for e, s, n in live if not _overlap((s, n), (tail, MAX_LEN), cap)}
    placement = {e: (s, n) for e, s, n in printed}
    try:
        obj, runs, read = cc._load("rb", main)
    except BaseException as exc:  # noqa: BLE001
        return problems + [f"the directory does not open: {type(exc).__name__}: {exc!s:.300}"]
    listed: Dict[int, Tuple[int, int]] = {}
    try:
        for s, n in runs:
            rows = read(s, n)
            eid, p = cc._episode_problem("flat", seed, rows, n)
            if p and eid is not None:
                # the rows an episode clipped by later commits keeps (unienv 0.0.1b16's rule), in place
                ceid, t0, full, cp = cc._piece_problem("flat", seed, rows, n)
                if cp is None and n < full:
                    rec = placement.get(ceid)
                    if rec is not None and ((s - t0) % cap != rec[0] or rec[1] != full):
                        problems.append(f"clipped episode {ceid} listed at {(s, n)} from step {t0}, committed at {rec}")
                    continue
            if p:
                problems.append(f"listed segment (start {s}, {n} rows) is torn or garbage: {p}")
                continue
            if eid in listed:
                problems.append(f"episode {eid} is listed twice")
            listed[eid] = (s, n)
            if eid in placement and placement[eid] != (s, n):
                problems.append(f"episode {eid} listed at {(s, n)}, committed at {placement[eid]}")
            elif eid not in placement and s != tail:
                problems.append(f"unprinted episode {eid} listed at {(s, n)}, not at the tail {tail}")
            elif eid in placement and eid not in {x[0] for x in live}:
                problems.append(f"episode {eid} is listed although later commits overwrote its rows")
    finally:
        obj.close()
    lost = sorted(required - set(listed))
    if lost:
        problems.append(f"committed episode(s) {lost} lost ({len(printed)} commits printed; listed {len(listed)})")
    return problems


def cleanup(result: Dict[str, Any]) -> None:
    """Unlinks the named semaphore of the buffer's lock (its owner was killed before it could)."""
    for ln in result["lines"]:
        if ln.startswith("SEMAPHORE "):
            name = ln.split(" ", 1)[1].lstrip("/")
            try:
                os.unlink(os.path.join("/dev/shm", "sem." + name))
            except OSError:
                pass

