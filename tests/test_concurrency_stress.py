"""Concurrency stress (issue 6 item 3): 4 writer processes and a reader process share one `multiprocessing=True`
ReplayBuffer.

Writers record seeded episodes (1-12 steps) without pauses, per step (`append` + `mark_segment_end`) or through up
to three segment writers open at once and committed in a random order; some episodes are abandoned half-way
(`abort_segment` / `writer.abort()`) and must never become visible. Under fork and spawn, over a memory-mapped
FlattenedStorage and over one in shared memory, in append, segment-writer and mixed modes.

A reader process samples all the while: random rows (each must be a whole, consistent row whose whole episode is
visible and intact), `get_segments()` (must tile `[0, len)` with whole episodes), `StepSampler` batches and
`SegmentSampler` episodes. The capacity exceeds what is written, so the ring never wraps and what must be there is
exact: afterwards every committed episode is there exactly once, contiguous and intact, no abandoned one is, and
the segments list exactly the committed episodes (also after reopening the memory-mapped buffer from disk).

A second test dumps the buffer to fresh directories while the writers commit: each snapshot must open and list
only whole, intact episodes.

Every row encodes writer w, episode e, step t, length n, a checksum c of those, and a payload p derived from them.
Each configuration takes a few seconds; `--soak` multiplies the episodes per writer.
"""
from __future__ import annotations

import json
import multiprocessing as mp
import os
import time
import traceback
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import pytest

from unienv_data.replay_buffer import ReplayBuffer
from unienv_data.samplers.segment_sampler import SegmentSampler
from unienv_data.samplers.step_sampler import StepSampler
from unienv_data.storages.flattened import FlattenedStorage
from unienv_data.storages.numpy_memmap import NumpyMemmapStorage
from unienv_interface.backends import NumpyComputeBackend as NB
from unienv_interface.space import BoxSpace, DictSpace

N_WRITERS = 4
EPISODES_PER_WRITER = 60
MAX_LEN = 12
JOIN_TIMEOUT = 60.0
KEYS = ("w", "e", "t", "n", "c")
SPACE = DictSpace(NB, {**{k: BoxSpace(NB, 0, 1 << 30, np.int32, shape=()) for k in KEYS},
                       "p": BoxSpace(NB, 0, 1 << 30, np.int32, shape=(3,))})


# ------------------------------------------------------------------------------------------------ the episodes
def plan(w: int, n_episodes: int, mode: str) -> List[Dict[str, Any]]:
    """Writer w's episodes in the order it records them: e, n, how ('append' | 'writer'), abort (abandoned)."""
    rng = np.random.default_rng([w, n_episodes, {"append": 1, "writer": 2, "mixed": 3}[mode]])
    out = []
    for e in range(n_episodes):
        how = mode if mode != "mixed" else ("append" if rng.random() < 0.5 else "writer")
        out.append({"e": e, "n": int(rng.integers(1, MAX_LEN + 1)), "how": how, "abort": bool(rng.random() < 0.1)})
    return out


def checksum(w: int, e: int, t: int, n: int) -> int:
    return (w * 1_000_003 + e * 7919 + t * 131 + n * 17 + 99991) % (1 << 29)


def payload(w: int, e: int, t: int) -> List[int]:
    return [(w * 31 + e * 7 + t * 3 + i * 1_234_567) % (1 << 29) for i in range(3)]


def step(w: int, e: int, t: int, n: int) -> Dict[str, Any]:
    v = {"w": w, "e": e, "t": t, "n": n, "c": checksum(w, e, t, n)}
    out: Dict[str, Any] = {k: np.array(x, dtype=np.int32) for k, x in v.items()}
    out["p"] = np.array(payload(w, e, t), dtype=np.int32)
    return out


def rows_of(batch: Dict[str, Any]) -> np.ndarray:
    """(N, 8) int64: w, e, t, n, c, p0, p1, p2."""
    cols = [np.atleast_1d(np.asarray(batch[k])).astype(np.int64) for k in KEYS]
    p = np.asarray(batch["p"]).astype(np.int64).reshape(len(cols[0]), 3)
    return np.concatenate([np.stack(cols, axis=1), p], axis=1)


def row_problem(r: np.ndarray) -> Optional[str]:
    w, e, t, n, c = (int(x) for x in r[:5])
    if not 1 <= w <= N_WRITERS or e < 0:
        return f"row {r.tolist()}: written by no writer (unwritten or torn)"
    if not 0 <= t < n or c != checksum(w, e, t, n) or r[5:].tolist() != payload(w, e, t):
        return f"row {r.tolist()}: inconsistent fields (torn)"
    return None


def episode_problem(rows: np.ndarray) -> Optional[str]:
    """None when `rows` are exactly one whole episode in order."""
    if len(rows) == 0:
        return "empty range"
    for r in rows:
        p = row_problem(r)
        if p:
            return p
    w, e, n = (int(x) for x in (rows[0, 0], rows[0, 1], rows[0, 3]))
    if len(rows) != n or not (rows[:, 0] == w).all() or not (rows[:, 1] == e).all():
        return f"range of {len(rows)} rows is not episode ({w}, {e}) of {n} rows: {rows[:, :4].tolist()}"
    if rows[:, 2].tolist() != list(range(n)):
        return f"episode ({w}, {e}) steps out of order: {rows[:, 2].tolist()}"
    return None


def committed(n_episodes: int, mode: str) -> Dict[Tuple[int, int], int]:
    """(w, e) -> length of every episode that is committed (not abandoned)."""
    return {(w, ep["e"]): ep["n"] for w in range(1, N_WRITERS + 1) for ep in plan(w, n_episodes, mode)
            if not ep["abort"]}


# ------------------------------------------------------------------------------------------------ child processes
def writer_main(rb: ReplayBuffer, w: int, n_episodes: int, mode: str, go: Any, reader_iters: Any = None) -> None:
    """Records writer w's plan. With `reader_iters` (a shared counter of reader passes) it waits, at a third and at
    two thirds of its episodes, for the reader to complete a pass, so the reader surely sees the buffer growing."""
    if not go.wait(JOIN_TIMEOUT):
        raise TimeoutError("never told to start")
    rng = np.random.default_rng([w, 5])
    eps = plan(w, n_episodes, mode)
    marks = {len(eps) // 3, 2 * len(eps) // 3}
    i = 0
    while i < len(eps):
        if reader_iters is not None and i in marks:
            marks.discard(i)
            seen = reader_iters.value
            deadline = time.monotonic() + 10.0
            while reader_iters.value < seen + 2 and time.monotonic() < deadline:
                time.sleep(0.001)
        ep = eps[i]
        if ep["how"] == "append":
            cut = int(rng.integers(0, ep["n"])) if ep["abort"] else ep["n"]
            for t in range(cut):
                rb.append(step(w, ep["e"], t, ep["n"]))
            if ep["abort"]:
                rb.abort_segment()
            else:
                rb.mark_segment_end()
            i += 1
            continue
        group = []  # up to three consecutive writer-mode episodes, open at once
        while i < len(eps) and eps[i]["how"] == "writer" and len(group) < 3:
            group.append(eps[i])
            i += 1
        writers = [rb.open_segment_writer() for _ in group]
        for t in range(max(g["n"] for g in group)):
            for wr, g in zip(writers, group):
                if t < g["n"]:
                    wr.append(step(w, g["e"], t, g["n"]))
        for k in rng.permutation(len(group)).tolist():
            if group[k]["abort"]:
                writers[k].abort()
            else:
                rb.commit_segment(writers[k])


def reader_main(rb: ReplayBuffer, ready: Any, stop: Any, out_path: str, iters: Any) -> None:
    res: Dict[str, Any] = {"rows": 0, "episodes": 0, "segment_lists": 0, "step_batches": 0, "segment_batches": 0,
                           "reads_while_growing": 0, "violations": [], "error": None}
    rng = np.random.default_rng(7)
    steps = StepSampler(rb, batch_size=16, seed=3)
    segs_sampler = SegmentSampler(rb, batch_size=4, seed=4)

    def bad(msg: str) -> None:
        if len(res["violations"]) < 10:
            res["violations"].append(msg)

    def check_episode_around(i: int, r: np.ndarray) -> None:
        start, end = i - int(r[2]), i - int(r[2]) + int(r[3])
        now = len(rb)
        if start < 0 or end > now:
            bad(f"row {i} of episode {r[:2].tolist()} is visible, its episode [{start}, {end}) is not (len {now})")
            return
        p = episode_problem(rows_of(rb.get_at(slice(start, end))))
        res["episodes"] += 1
        if p:
            bad(f"episode around logical row {i}: {p}")

    last = -1
    try:
        ready.set()
        while True:
            time.sleep(0.001)   # yield: on 2 busy cores a spinning reader starves the writers it waits for
            stopping = stop.is_set()
            n = len(rb)
            res["reads_while_growing"] += n != last and last > 0
            last = n
            if n:
                idx = rng.integers(0, n, size=8)
                for i, r in zip(idx.tolist(), rows_of(rb.get_at(idx))):
                    res["rows"] += 1
                    p = row_problem(r)
                    if p:
                        bad(f"sampled logical row {i} (len {n}): {p}")
                    else:
                        check_episode_around(i, r)
                # the segment list tiles [0, len) with whole episodes (nothing is abandoned into the buffer)
                segs = rb.episode_segments() or []
                res["segment_lists"] += 1
                pos = 0
                for s, e in segs:
                    if s != pos:
                        bad(f"segments {segs[:6]}...: gap or overlap at {pos} -> {s}")
                        break
                    pos = e
                if pos > len(rb):
                    bad(f"segments reach row {pos}, beyond len {len(rb)}")
                for k in rng.integers(0, len(segs), size=min(3, len(segs))).tolist() if segs else []:
                    s, e = segs[k]
                    p = episode_problem(rows_of(rb.get_at(slice(s, e))))
                    if p:
                        bad(f"listed segment {(s, e)}: {p}")
                for r in rows_of(steps.sample()):
                    p = row_problem(r)
                    if p:
                        bad(f"StepSampler: {p}")
                res["step_batches"] += 1
                if segs:
                    for ep in segs_sampler.sample_list():
                        p = episode_problem(rows_of(ep))
                        if p:
                            bad(f"SegmentSampler episode: {p}")
                    res["segment_batches"] += 1
            with iters.get_lock():
                iters.value += 1
            if stopping:
                break
    except BaseException:
        res["error"] = traceback.format_exc()
    with open(out_path, "w") as f:
        json.dump(res, f)


# ------------------------------------------------------------------------------------------------ helpers
def make_buffer(medium: str, path: str, capacity: int) -> ReplayBuffer:
    if medium == "memmap":
        return ReplayBuffer.create(FlattenedStorage, SPACE, inner_storage_cls=NumpyMemmapStorage, cache_path=path,
                                   capacity=capacity, is_memmap=True, multiprocessing=True)
    return ReplayBuffer.create(FlattenedStorage, SPACE, inner_storage_cls=NumpyMemmapStorage, capacity=capacity,
                               is_memmap=False, multiprocessing=True)


def join_all(procs: List[Any], deadline: float) -> None:
    try:
        for p in procs:
            p.join(timeout=max(0.1, deadline - time.monotonic()))
        hung = [p.name for p in procs if p.is_alive()]
        assert not hung, f"processes still running after {JOIN_TIMEOUT} s (deadlock or hang): {hung}"
        failed = [(p.name, p.exitcode) for p in procs if p.exitcode != 0]
        assert not failed, f"processes failed: {failed}"
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(timeout=5)


def check_final(rb: ReplayBuffer, n_episodes: int, mode: str) -> None:
    want = committed(n_episodes, mode)
    total = sum(want.values())
    assert len(rb) == total, f"len {len(rb)} != {total} committed rows: rows lost, duplicated or abandoned ones kept"
    rows = rows_of(rb.get_at(slice(None)))
    bad = [p for p in (row_problem(r) for r in rows) if p]
    assert not bad, bad[:5]
    seen: Dict[Tuple[int, int], Tuple[int, int]] = {}
    i = 0
    while i < total:
        n = int(rows[i, 3])
        p = episode_problem(rows[i:i + n])
        assert p is None, f"at logical row {i}: {p}"
        key = (int(rows[i, 0]), int(rows[i, 1]))
        assert key not in seen, f"episode {key} stored twice"
        assert key in want, f"abandoned episode {key} is in the buffer"
        seen[key] = (i, i + n)
        i += n
    assert set(seen) == set(want), f"lost episodes: {sorted(set(want) - set(seen))[:10]}"
    assert rb.episode_segments() == sorted(seen.values()), "get_segments() does not list exactly the committed episodes"


CONFIGS = [
    ("fork", "append", "memmap"),
    ("fork", "writer", "shm"),
    ("fork", "mixed", "memmap"),
    ("spawn", "append", "shm"),
    ("spawn", "writer", "memmap"),
    ("spawn", "mixed", "shm"),
]


@pytest.mark.parametrize("start_method, mode, medium", CONFIGS, ids=["-".join(c) for c in CONFIGS])
def test_four_writers_and_a_reader(tmp_path: Any, soak: int, start_method: str, mode: str, medium: str) -> None:
    ctx = mp.get_context(start_method)
    n_eps = EPISODES_PER_WRITER * soak
    cap = N_WRITERS * n_eps * MAX_LEN + 8          # never wraps
    path = os.fspath(tmp_path / "rb")
    rb = make_buffer(medium, path, cap)
    out = os.fspath(tmp_path / "reader.json")
    ready, stop = ctx.Event(), ctx.Event()
    iters = ctx.Value("q", 0)
    try:
        reader = ctx.Process(target=reader_main, args=(rb, ready, stop, out, iters), name="reader")
        writers = [ctx.Process(target=writer_main, args=(rb, w, n_eps, mode, ready, iters), name=f"writer-{w}")
                   for w in range(1, N_WRITERS + 1)]
        reader.start()
        for p in writers:
            p.start()
        try:
            join_all(writers, time.monotonic() + JOIN_TIMEOUT)
        finally:
            stop.set()
            join_all([reader], time.monotonic() + JOIN_TIMEOUT)
        with open(out) as f:
            res = json.load(f)
        assert res["error"] is None, res["error"]
        assert res["violations"] == [], res["violations"]
        assert res["rows"] > 0 and res["episodes"] > 0 and res["step_batches"] > 0, res
        assert res["reads_while_growing"] >= 2, f"the reader never overlapped the writers: {res}"
        check_final(rb, n_eps, mode)
        if medium == "memmap":
            rb.dumps()
            again = ReplayBuffer.load_from(path, backend=NB, is_memmap=True)
            try:
                check_final(again, n_eps, mode)
            finally:
                again.close()
    finally:
        rb.close()


@pytest.mark.parametrize("medium", ["memmap", "shm"])
def test_dumps_snapshots_while_writers_commit(tmp_path: Any, soak: int, medium: str) -> None:
    """`dumps(<new directory>)` taken while 4 processes commit (a checkpoint during collection): every snapshot
    opens, and lists only whole, intact, committed episodes that tile its rows."""
    ctx = mp.get_context("fork")
    n_eps = EPISODES_PER_WRITER * soak
    cap = N_WRITERS * n_eps * MAX_LEN + 8
    rb = make_buffer(medium, os.fspath(tmp_path / "rb"), cap)
    go = ctx.Event()
    snaps: List[str] = []
    try:
        writers = [ctx.Process(target=writer_main, args=(rb, w, n_eps, "mixed", go), name=f"writer-{w}")
                   for w in range(1, N_WRITERS + 1)]
        for p in writers:
            p.start()
        go.set()
        try:
            while any(p.is_alive() for p in writers) and len(snaps) < 12 * soak:
                d = os.fspath(tmp_path / f"snap{len(snaps)}")
                rb.dumps(d)
                snaps.append(d)
        finally:
            join_all(writers, time.monotonic() + JOIN_TIMEOUT)
        check_final(rb, n_eps, "mixed")
    finally:
        rb.close()
    assert len(snaps) >= 2, "the writers finished before two snapshots were taken"
    want = committed(n_eps, "mixed")
    problems = []
    for d in snaps:
        try:
            snap = ReplayBuffer.load_from(d, backend=NB, is_memmap=True)
        except Exception as exc:  # noqa: BLE001
            problems.append(f"{os.path.basename(d)} does not open: {type(exc).__name__}: {exc}")
            continue
        try:
            segs = snap.episode_segments() or []
            for s, e in segs:
                rows = rows_of(snap.get_at(slice(s, e)))
                p = episode_problem(rows)
                if p is None and (int(rows[0, 0]), int(rows[0, 1])) not in want:
                    p = "an abandoned episode"
                if p:
                    problems.append(f"{os.path.basename(d)} (len {len(snap)}, {len(segs)} segments): segment "
                                    f"{(s, e)}: {p}")
                    break
        finally:
            snap.close()
    assert not problems, f"{len(problems)} of {len(snaps)} snapshots are damaged:\n" + "\n".join(problems[:8])
