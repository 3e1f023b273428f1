"""ReplayBuffer shared by several processes (`multiprocessing=True`; issue 4 item 2, issue 6 item 3, §7 defect 8).

A buffer is created in the test process and handed to 4 writer processes as a `multiprocessing.Process` argument,
under both start methods (fork, spawn), over a memory-mapped FlattenedStorage and over a RAM FlattenedStorage
created with `multiprocessing=True` (shared memory). Writers record whole episodes either step by step
(`append` + `mark_segment_end`) or through segment writers (`open_segment_writer` + `commit_segment`, two
writers open at once and committed in reverse order).

Every row encodes who wrote it: writer `w` (1..4), episode `e`, step `t`, episode length `n` and a checksum `c`
of the four, so afterwards (and while writing, for the reader test) every row and every episode can be checked:
no row lost, no row torn, each episode contiguous, complete and listed by `get_segments()`.
Capacities are larger than what the writers write, so nothing is overwritten and the expected content is exact.
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

torch = pytest.importorskip("torch")

from unienv_data.replay_buffer import ReplayBuffer  # noqa: E402
from unienv_data.storages.flattened import FlattenedStorage  # noqa: E402
from unienv_data.storages.pytorch import PytorchTensorStorage  # noqa: E402
from unienv_interface.backends.pytorch import PyTorchComputeBackend as TB  # noqa: E402
from unienv_interface.space import BoxSpace, DictSpace  # noqa: E402

N_WRITERS = 4
N_EPISODES = 12
CAPACITY = 256
JOIN_TIMEOUT = 60.0
FIELDS = ("w", "e", "t", "n", "c")

SPACE = DictSpace(TB, {k: BoxSpace(TB, 0, 1 << 20, torch.int32, shape=()) for k in FIELDS})


def episode_length(w: int, e: int) -> int:
    return 1 + (w * 7 + e * 3) % 6


def checksum(w: int, e: int, t: int, n: int) -> int:
    return (w * 131 + e * 17 + t * 7 + n * 3 + 12345) % 999_983


def step_value(w: int, e: int, t: int) -> Dict[str, Any]:
    n = episode_length(w, e)
    vals = {"w": w, "e": e, "t": t, "n": n, "c": checksum(w, e, t, n)}
    return {k: torch.tensor(v, dtype=torch.int32) for k, v in vals.items()}


def expected_total() -> int:
    return sum(episode_length(w, e) for w in range(1, N_WRITERS + 1) for e in range(N_EPISODES))


def rows_of(data: Dict[str, Any]) -> np.ndarray:
    """(N, 5) int array with columns w, e, t, n, c."""
    return np.stack([np.atleast_1d(data[k].numpy()) for k in FIELDS], axis=1).astype(np.int64)


def row_problem(r: np.ndarray) -> Optional[str]:
    w, e, t, n, c = (int(x) for x in r)
    if not 1 <= w <= N_WRITERS or not 0 <= e < N_EPISODES:
        return f"row {r.tolist()}: no writer wrote it (unwritten or torn)"
    if n != episode_length(w, e) or not 0 <= t < n or c != checksum(w, e, t, n):
        return f"row {r.tolist()}: inconsistent fields (torn row)"
    return None


def episode_problem(rows: np.ndarray) -> Optional[str]:
    """None when `rows` are exactly one whole episode, in order."""
    if len(rows) == 0:
        return "empty episode"
    for r in rows:
        p = row_problem(r)
        if p:
            return p
    w, e, n = int(rows[0, 0]), int(rows[0, 1]), int(rows[0, 3])
    if len(rows) != n:
        return f"episode ({w}, {e}) has {len(rows)} rows, expected {n}"
    if not (rows[:, 0] == w).all() or not (rows[:, 1] == e).all():
        return f"rows of several episodes in one range: {rows[:, :3].tolist()}"
    if rows[:, 2].tolist() != list(range(n)):
        return f"episode ({w}, {e}) steps out of order: {rows[:, 2].tolist()}"
    return None


# ------------------------------------------------------------------------------------------------ child processes
def write_episodes(rb: ReplayBuffer, w: int, mode: str, delay: float) -> None:
    if mode == "append":
        for e in range(N_EPISODES):
            for t in range(episode_length(w, e)):
                rb.append(step_value(w, e, t))
            rb.mark_segment_end()
            if delay:
                time.sleep(delay)
    else:
        assert mode == "writer", mode
        for e0 in range(0, N_EPISODES, 2):  # two writers open at once, filled interleaved, committed in reverse
            pair = [e for e in (e0, e0 + 1) if e < N_EPISODES]
            writers = [rb.open_segment_writer() for _ in pair]
            for t in range(max(episode_length(w, e) for e in pair)):
                for wr, e in zip(writers, pair):
                    if t < episode_length(w, e):
                        wr.append(step_value(w, e, t))
            for wr in reversed(writers):
                rb.commit_segment(wr)
                if delay:
                    time.sleep(delay)


def writer_main(jobs: List[Tuple[ReplayBuffer, str]], w: int, delay: float, go: Any = None) -> None:
    """Writer `w`: all its episodes into each `(buffer, mode)` of `jobs`, one buffer after the other (one process
    serves several buffers so that a spawn start, which re-imports torch, is paid once per writer). With `go`
    (an Event) it starts writing only once that is set."""
    if go is not None and not go.wait(JOIN_TIMEOUT):
        raise TimeoutError("never told to start")
    for rb, mode in jobs:
        write_episodes(rb, w, mode, delay)


def reader_main(rb: ReplayBuffer, ready: Any, stop: Any, out_path: str) -> None:
    result: Dict[str, Any] = {"row_checks": 0, "episode_checks": 0, "segment_checks": 0, "reads_while_growing": 0,
                              "violations": [], "error": None}
    rng = np.random.default_rng(0)
    last_len = -1

    def violation(msg: str) -> None:
        if len(result["violations"]) < 10:
            result["violations"].append(msg)

    try:
        ready.set()
        while True:
            time.sleep(0.001)   # yield: on 2 busy cores a spinning reader starves the writers it waits for
            stopping = stop.is_set()
            n = len(rb)
            if n and n != last_len:
                result["reads_while_growing"] += 1
            last_len = n
            if n:
                idx = rng.integers(0, n, size=16)
                rows = rows_of(rb.get_at(idx))
                for i, r in zip(idx.tolist(), rows):
                    result["row_checks"] += 1
                    p = row_problem(r)
                    if p:
                        violation(f"sampled logical {i} (len {n}): {p}")
                        continue
                    # the whole episode of a visible row is visible and intact
                    start, stop_ = i - int(r[2]), i - int(r[2]) + int(r[3])
                    now = len(rb)
                    if start < 0 or stop_ > now:
                        violation(f"row {i} of episode {r[:2].tolist()} is visible but its episode "
                                  f"[{start}, {stop_}) is not (len {now})")
                        continue
                    p = episode_problem(rows_of(rb.get_at(slice(start, stop_))))
                    result["episode_checks"] += 1
                    if p:
                        violation(f"episode around logical {i}: {p}")
                segs = rb.episode_segments() or []
                for k in rng.integers(0, len(segs), size=min(4, len(segs))).tolist() if segs else []:
                    s, e = segs[k]
                    p = episode_problem(rows_of(rb.get_at(slice(s, e))))
                    result["segment_checks"] += 1
                    if p:
                        violation(f"segment {(s, e)}: {p}")
            if stopping:
                break
    except BaseException:
        result["error"] = traceback.format_exc()
    with open(out_path, "w") as f:
        json.dump(result, f)


# ------------------------------------------------------------------------------------------------ helpers
def make_buffer(kind: str, tmp_path: Any) -> ReplayBuffer:
    if kind == "memmap":
        return ReplayBuffer.create(FlattenedStorage, SPACE, inner_storage_cls=PytorchTensorStorage,
                                   cache_path=os.fspath(tmp_path / "rb"), capacity=CAPACITY, is_memmap=True,
                                   multiprocessing=True)
    assert kind == "ram", kind
    return ReplayBuffer.create(FlattenedStorage, SPACE, inner_storage_cls=PytorchTensorStorage, capacity=CAPACITY,
                               is_memmap=False, multiprocessing=True)


def run_all(procs: List[Any]) -> None:
    for p in procs:
        p.start()
    deadline = time.monotonic() + JOIN_TIMEOUT
    try:
        for p in procs:
            p.join(timeout=max(0.1, deadline - time.monotonic()))
        hung = [p.name for p in procs if p.is_alive()]
        assert not hung, f"processes still running after {JOIN_TIMEOUT} s: {hung}"
        bad = [(p.name, p.exitcode) for p in procs if p.exitcode != 0]
        assert not bad, f"processes failed: {bad}"
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(timeout=5)


def check_buffer(rb: ReplayBuffer) -> List[Tuple[int, int]]:
    """Every episode exactly once, contiguous and intact; get_segments lists exactly those; returns the ranges."""
    total = expected_total()
    assert len(rb) == total, f"len {len(rb)} != {total} rows committed: rows were lost or duplicated"
    rows = rows_of(rb.get_at(slice(None)))
    problems = [p for p in (row_problem(r) for r in rows) if p]
    assert not problems, problems[:5]
    ranges: List[Tuple[int, int]] = []
    seen = set()
    i = 0
    while i < total:
        n = int(rows[i, 3])
        p = episode_problem(rows[i:i + n])
        assert p is None, f"at logical {i}: {p}"
        key = (int(rows[i, 0]), int(rows[i, 1]))
        assert key not in seen, f"episode {key} stored twice"
        seen.add(key)
        ranges.append((i, i + n))
        i += n
    assert seen == {(w, e) for w in range(1, N_WRITERS + 1) for e in range(N_EPISODES)}
    assert rb.episode_segments() == ranges
    return ranges


# ------------------------------------------------------------------------------------------------ tests
@pytest.mark.parametrize("start_method, kinds", [
    ("fork", ("memmap",)),
    ("fork", ("ram",)),
    ("spawn", ("memmap", "ram")),  # one spawn run serves both storages: each spawn start re-imports torch
], ids=["fork-memmap", "fork-ram", "spawn-memmap+ram"])
def test_four_writers_lose_nothing(tmp_path: Any, start_method: str, kinds: Tuple[str, ...]) -> None:
    """4 processes write into one buffer per (storage, mode): per step (append + mark_segment_end) and through
    segment writers (open_segment_writer + commit_segment)."""
    ctx = mp.get_context(start_method)
    buffers: Dict[Tuple[str, str], ReplayBuffer] = {}
    try:
        for kind in kinds:
            for mode in ("append", "writer"):
                buffers[kind, mode] = make_buffer(kind, tmp_path / f"{kind}-{mode}")
                assert buffers[kind, mode].is_multiprocessing_safe
        jobs = [(rb, mode) for (_kind, mode), rb in buffers.items()]
        procs = [ctx.Process(target=writer_main, args=(jobs, w, 0.0), name=f"writer-{w}")
                 for w in range(1, N_WRITERS + 1)]
        run_all(procs)
        failures = []
        for (kind, mode), rb in buffers.items():
            try:
                ranges = check_buffer(rb)
                # the buffer stays usable by the parent after the children are gone
                rb.extend({k: torch.tensor([1] * 2, dtype=torch.int32) for k in FIELDS})
                assert len(rb) == expected_total() + 2
                assert rb.episode_segments() == ranges
                if kind == "memmap":
                    rb.dumps()
                    for shared in (True, False):  # reopened for more worker processes, and for one process
                        again = ReplayBuffer.load_from(tmp_path / f"{kind}-{mode}" / "rb", backend=TB,
                                                       is_memmap=True, multiprocessing=shared)
                        try:
                            assert len(again) == expected_total() + 2
                            np.testing.assert_array_equal(rows_of(again.get_at(slice(None))),
                                                          rows_of(rb.get_at(slice(None))))
                            assert again.episode_segments() == ranges, \
                                f"segments lost on reload (multiprocessing={shared})"
                        finally:
                            again.close()
            except AssertionError as exc:
                failures.append(f"{kind}/{mode}: {str(exc)[:300]}")
        assert not failures, "\n".join(failures)
    finally:
        for rb in buffers.values():
            rb.close()


@pytest.mark.parametrize("mode", ["append", "writer"])
def test_four_writers_through_a_wrapping_ring(tmp_path: Any, mode: str) -> None:
    """A ring much smaller than what is written: afterwards it holds the newest rows, i.e. possibly the tail of one
    overwritten episode, then whole episodes only, and get_segments lists exactly those episodes (the cut one with
    the rows it keeps, as unienv 0.0.1b16 clips it)."""
    ctx = mp.get_context("fork")
    cap = 40
    rb = ReplayBuffer.create(FlattenedStorage, SPACE, inner_storage_cls=PytorchTensorStorage,
                             cache_path=os.fspath(tmp_path / "rb"), capacity=cap, is_memmap=True, multiprocessing=True)
    try:
        procs = [ctx.Process(target=writer_main, args=([(rb, mode)], w, 0.0), name=f"writer-{w}")
                 for w in range(1, N_WRITERS + 1)]
        run_all(procs)
        assert len(rb) == cap
        rows = rows_of(rb.get_at(slice(None)))
        problems = [p for p in (row_problem(r) for r in rows) if p]
        assert not problems, problems[:5]
        # a possibly cut first episode: its steps run up to its end
        i = 0
        first = rows[0]
        ranges = []
        if int(first[2]) != 0:
            rest = int(first[3]) - int(first[2])
            head = rows[:rest]
            assert (head[:, 0] == first[0]).all() and (head[:, 1] == first[1]).all(), head.tolist()
            assert head[:, 2].tolist() == list(range(int(first[2]), int(first[3])))
            i = rest
            ranges.append((0, rest))
        seen = set()
        while i < cap:
            n = int(rows[i, 3])
            p = episode_problem(rows[i:i + n])
            assert p is None, f"at logical {i}: {p}"
            key = (int(rows[i, 0]), int(rows[i, 1]))
            assert key not in seen
            seen.add(key)
            ranges.append((i, i + n))
            i += n
        assert ranges, "no whole episode survived"
        assert rb.episode_segments() == ranges
    finally:
        rb.close()


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_reader_sees_only_complete_episodes(tmp_path: Any, start_method: str) -> None:
    """A reader samples rows, the episodes around them and listed segments while 4 processes write (2 per step,
    2 through segment writers); everything it sees must be whole, consistent episodes."""
    ctx = mp.get_context(start_method)
    rb = make_buffer("memmap", tmp_path)
    out = os.fspath(tmp_path / "reader.json")
    ready, stop = ctx.Event(), ctx.Event()
    try:
        reader = ctx.Process(target=reader_main, args=(rb, ready, stop, out), name="reader")
        writers = [ctx.Process(target=writer_main, args=([(rb, "append" if w % 2 else "writer")], w, 0.02, ready),
                               name=f"writer-{w}") for w in range(1, N_WRITERS + 1)]
        reader.start()  # the writers wait until the reader runs
        try:
            run_all(writers)
        finally:
            stop.set()
            reader.join(timeout=JOIN_TIMEOUT)
            if reader.is_alive():
                reader.kill()
                reader.join(timeout=5)
                pytest.fail("the reader did not stop")
        assert reader.exitcode == 0
        with open(out) as f:
            result = json.load(f)
        assert result["error"] is None, result["error"]
        assert result["violations"] == [], result["violations"]
        assert result["row_checks"] > 0 and result["episode_checks"] > 0 and result["segment_checks"] > 0, result
        assert result["reads_while_growing"] >= 2, f"the reader never overlapped the writers: {result}"
        check_buffer(rb)
    finally:
        rb.close()


def test_mp_buffer_pickles_only_into_processes(tmp_path: Any) -> None:
    """The shared counters belong to process hand-over; a buffer without multiprocessing is not shared."""
    rb = make_buffer("memmap", tmp_path)
    try:
        assert rb.is_multiprocessing_safe
    finally:
        rb.close()
    plain = ReplayBuffer.create(FlattenedStorage, SPACE, inner_storage_cls=PytorchTensorStorage,
                                capacity=8, is_memmap=False)
    assert not plain.is_multiprocessing_safe
    with pytest.raises(ValueError):
        ReplayBuffer(plain.storage, "storage", multiprocessing=True)
    plain.close()


def hold_lock_main(rb: ReplayBuffer, ready: Any, seconds: float) -> None:
    with rb._state.locked():     # what a commit, extend or dumps holds while it runs
        ready.set()
        time.sleep(seconds)


def test_a_killed_lock_holder_raises_instead_of_hanging(tmp_path: Any) -> None:
    """A process SIGKILLed inside the buffer's lock never releases it: the others raise StorageStateError naming
    it (within about a second, even while it is an unreaped zombie) instead of blocking forever, and the directory
    reopens with every episode committed before."""
    from unienv_data.base import StorageStateError

    ctx = mp.get_context("fork")
    rb = make_buffer("memmap", tmp_path)
    try:
        for t in range(3):
            rb.append(step_value(1, 0, t))
        rb.mark_segment_end()
        # a live holder only makes the others wait
        ready = ctx.Event()
        p = ctx.Process(target=hold_lock_main, args=(rb, ready, 1.5))
        p.start()
        assert ready.wait(JOIN_TIMEOUT)
        t0 = time.monotonic()
        assert rb.episode_segments() == [(0, 3)]
        assert time.monotonic() - t0 > 0.5
        p.join(JOIN_TIMEOUT)
        # a killed holder: an error naming it, not a hang
        ready = ctx.Event()
        p = ctx.Process(target=hold_lock_main, args=(rb, ready, 600.0))
        p.start()
        assert ready.wait(JOIN_TIMEOUT)
        os.kill(p.pid, 9)
        time.sleep(0.2)                       # not joined: the child is a zombie now
        t0 = time.monotonic()
        rb.append(step_value(1, 1, 0))        # an episode in the making is private: no lock yet
        with pytest.raises(StorageStateError, match=f"process {p.pid} was killed while it held the lock"):
            rb.mark_segment_end()
        with pytest.raises(StorageStateError):
            rb.episode_segments()
        assert time.monotonic() - t0 < 10
        p.join(JOIN_TIMEOUT)
        path = rb.cache_path
    finally:
        rb.close()
    back = ReplayBuffer.load_from(path, backend=TB)
    try:
        assert back.episode_segments() == [(0, 3)] and len(back) == 3
        assert rows_of(back.get_at(slice(None)))[:, 2].tolist() == [0, 1, 2]
    finally:
        back.close()
