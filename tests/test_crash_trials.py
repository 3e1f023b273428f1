"""Crash trials (issue 6 items 1 and 6): recording processes SIGKILLed at random moments.

Each trial forks a recording process (tests/_crash_child.py, through its fork server so torch is imported once)
that records seeded episodes into one directory, and after every commit point (`mark_segment_end` or a segment
writer's `commit`, followed by `flush()` or `dumps()`) prints `COMMITTED <episode> <checksum>`. Every few episodes
it also dumps into a second directory. The ring is small, so it wraps several times per trial and newer episodes
overwrite older ones. Then the process is SIGKILLed:

* timer trials: by this process, a seeded random delay after a seeded random number of COMMITTED lines;
* point trials: by itself, at the K-th call/return event of `unienv_data` code (K seeded over the event count of
  a dry run), which reaches every instant between two library calls, inside `dumps` / `flush` included, and
  reproduces exactly: `python tests/_crash_child.py trial --kind KIND --seed SEED --mode point`.

After the kill the directories are reopened read-only and checked (`_crash_child.verify`):

* the recording directory opens without error once `create` returned;
* every episode whose COMMITTED line was printed is listed as a segment, byte-identical, at the rows it was recorded
  at, unless the episode being recorded when the kill came overlaps its rows (then it may be gone, never torn);
* every listed segment is one whole recorded episode: an unfinished episode is absent, never half-visible, and a
  ring that wrapped never lists a segment whose rows were overwritten;
* the dumps destination (`dumps(<another directory>)`): after a completed dumps it opens with exactly that
  state; a dumps killed halfway leaves a destination that either refuses to load with a clean error
  (ValueError / TypeError / KeyError / IndexError / FileNotFoundError, with a message) or opens with the state of
  the last completed dumps or of the interrupted one (everything in both present, nothing outside either,
  nothing torn). Never a destination that opens with garbage.

Storage kinds: `flat` (FlattenedStorage over a memory-mapped PytorchTensorStorage), `numpy` (NumpyMemmapStorage),
`rb` (ReplayBuffer over a memory-mapped FlattenedStorage), and over HDF5 and video (tests/_crash_kinds.py): `h5`
(HDF5Storage, fixed capacity), `h5grow` (growable), `h5flat` (FlattenedStorage over HDF5), `h5rb` (ReplayBuffer
over HDF5), `video` (VideoStorage ring, lossless 16x16 frames, compared bit for bit), `videogrow` (growable),
`rbvideo` (ReplayBuffer over a native-layout DictStorage whose image leaf is a lossless VideoStorage). `TRIALS`
per kind in CI (half timer, half point, one in five with `set_durable(True)`), times `--soak-factor` with
`--soak`.

A separate trial (tests/_crash_mp.py) records into a disk-backed `multiprocessing=True` ReplayBuffer from three
writer processes and SIGKILLs all of them (and the coordinator) at once at a random instant: every episode whose
`commit_segment` / `mark_segment_end` returned survives, without any `dumps()`.
"""
from __future__ import annotations

import json
import os
import shutil
import time
from typing import Any, Dict, List

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import _crash_child as cc  # noqa: E402
import _crash_kinds as ck  # noqa: E402
import _crash_mp as cm  # noqa: E402

TRIALS_PER_KIND = 25
#: trials per kind in CI (the HDF5 and video kinds cost more per trial; the module stays under a minute)
TRIALS = {"flat": 25, "numpy": 25, "rb": 25, "h5": 16, "h5grow": 16, "h5flat": 12, "h5rb": 12, "video": 12,
          "videogrow": 12, "rbvideo": 12}
SNAPSHOT_TRIALS = {k: (8 if k in ("flat", "numpy", "rb") else 4) for k in cc.KINDS}
MP_TRIALS = 10
MAX_REPORTED = 12


@pytest.fixture(scope="module")
def server() -> Any:
    srv = cc.Server()
    try:
        yield srv
    finally:
        srv.close()


def _trial(server: Any, root: str, kind: str, seed: int, mode: str, durable: bool,
           window: str = "all") -> List[str]:
    """Runs one trial in a fresh directory; its problems, each prefixed with how to reproduce it."""
    os.makedirs(root, exist_ok=True)
    spec = cc.trial_spec(kind, seed, root, mode, durable, window)
    kill = cc.timer_kill(kind, seed) if mode == "timer" else None
    try:
        res = server.run(spec, kill_after=kill)
    except TimeoutError as exc:
        server.restart()
        return [f"[{kind} seed {seed} {mode}] hung: {exc}",
                f"    repro: {cc.repro_command(kind, seed, mode, durable, window)}"]
    problems = cc.verify(cc.make_plan(kind, seed), spec["main"], spec["snap"], res)
    if not problems:
        shutil.rmtree(root, ignore_errors=True)  # keep failing directories for inspection
        return []
    where = next((ln for ln in res["lines"] if ln.startswith("KILL-AT")), f"timer kill {kill}")
    head = (f"[{kind} seed {seed} {mode}{' durable' if durable else ''}] ({where}; "
            f"{sum(ln.startswith('COMMITTED') for ln in res['lines'])} committed; exit {res['exit']}; dir {root})\n"
            f"    repro: {cc.repro_command(kind, seed, mode, durable, window)}"
            + ("  (timer kills land at a slightly different instant each run; point kills reproduce exactly)"
               if mode == "timer" else ""))
    return [head] + ["    " + p for p in problems]


def _report(kind: str, failures: List[List[str]], trials: int, seconds: float) -> str:
    lines = [f"{len(failures)} of {trials} crash trials of {kind!r} broke a durability promise ({seconds:.1f} s):"]
    for f in failures[:MAX_REPORTED]:
        lines += f
    if len(failures) > MAX_REPORTED:
        lines.append(f"... and {len(failures) - MAX_REPORTED} more")
    return "\n".join(lines)


@pytest.mark.parametrize("kind", cc.KINDS)
def test_committed_episodes_survive_sigkill(server: Any, tmp_path: Any, soak: int, kind: str) -> None:
    """TRIALS_PER_KIND seeded trials (x soak factor): odd seeds are killed at a library event, even seeds by a
    timer; one in five runs with durable commit points (fsync)."""
    t0 = time.monotonic()
    n = TRIALS[kind] * soak
    failures = []
    for seed in range(n):
        mode = "point" if seed % 2 else "timer"
        probs = _trial(server, os.fspath(tmp_path / f"t{seed}"), kind, seed, mode, durable=seed % 5 == 4)
        if probs:
            failures.append(probs)
    assert not failures, _report(kind, failures, n, time.monotonic() - t0)


@pytest.mark.parametrize("kind", cc.KINDS)
def test_kill_inside_dumps_to_another_directory(server: Any, tmp_path: Any, soak: int, kind: str) -> None:
    """Point trials whose kill lands inside `dumps(<another directory>)`: the destination refuses to load with a
    clean error, or opens with the last completed dumps' state or the interrupted one's; never garbage."""
    t0 = time.monotonic()
    n = SNAPSHOT_TRIALS[kind] * soak
    failures = []
    seed = 1000
    done = 0
    while done < n:
        seed += 1
        if cc.make_plan(kind, seed)["snapshots"] == 0:
            continue
        done += 1
        probs = _trial(server, os.fspath(tmp_path / f"s{seed}"), kind, seed, "point", durable=seed % 4 == 0,
                       window="snapshot")
        if probs:
            failures.append(probs)
    assert not failures, _report(kind, failures, n, time.monotonic() - t0)


@pytest.mark.parametrize("kind", cc.KINDS)
def test_unkilled_run_keeps_everything(server: Any, tmp_path: Any, kind: str) -> None:
    """Without a kill every promise holds trivially: all live episodes listed, the last dumps complete."""
    assert _trial(server, os.fspath(tmp_path / "none"), kind, 5, "none", durable=False) == []


# ------------------------------------------------------------------------------------- the checker is not vacuous
def _finished_trial(server: Any, root: str, kind: str, seed: int) -> Dict[str, Any]:
    spec = cc.trial_spec(kind, seed, root, "none", False)
    res = server.run(spec)
    assert "DONE" in res["lines"], res
    assert cc.verify(cc.make_plan(kind, seed), spec["main"], spec["snap"], res) == []
    return {"spec": spec, "res": res, "plan": cc.make_plan(kind, seed)}


def _data_file(kind: str, main: str) -> str:
    if kind == "numpy":
        return os.path.join(main, cc.NUMPY_FILE)
    if kind == "flat":
        return os.path.join(main, "inner_storage.memmap")
    return os.path.join(main, "storage", "inner_storage.memmap")


@pytest.mark.parametrize("kind", cc.KINDS)
def test_checker_detects_a_torn_segment(server: Any, tmp_path: Any, kind: str) -> None:
    """Overwriting one byte inside a listed segment's rows makes `verify` report it."""
    t = _finished_trial(server, os.fspath(tmp_path / "x"), kind, 3)
    plan = t["plan"]
    live = cc.live_after(plan, len(plan["commits"]))
    _eid, start, _n = live[-1]
    if kind in ck.KINDS:
        ck.tamper_row(kind, t["spec"]["main"], start)
        problems = cc.verify(plan, t["spec"]["main"], t["spec"]["snap"], t["res"])
        assert any("torn or garbage" in p for p in problems), problems
        return
    path = _data_file(kind, t["spec"]["main"])
    row_bytes = os.path.getsize(path) // plan["capacity"]
    with open(path, "r+b") as f:
        f.seek(start * row_bytes + 1)
        b = f.read(1)
        f.seek(start * row_bytes + 1)
        f.write(bytes([b[0] ^ 0x5A]))
    problems = cc.verify(plan, t["spec"]["main"], t["spec"]["snap"], t["res"])
    assert any("torn or garbage" in p for p in problems), problems


@pytest.mark.parametrize("kind", cc.KINDS)
def test_checker_detects_a_lost_episode(server: Any, tmp_path: Any, kind: str) -> None:
    """Dropping the newest segment from the metadata makes `verify` report a lost committed episode."""
    t = _finished_trial(server, os.fspath(tmp_path / "x"), kind, 3)
    main = t["spec"]["main"]
    log = os.path.join(main if kind == "flat" else os.path.join(main, "storage"), "flattened_commit.log")
    if kind in ("flat", "rb"):
        # a FlattenedStorage on disk commits into its commit log, which a reopen takes over the sidecar's list:
        # the log is what must lose the newest segment
        from unienv_data.storages._commit_log import LogFile, read_log
        logged = read_log(log, t["plan"]["capacity"])
        assert logged is not None and logged[1], logged
        LogFile(log).compact(logged[0], logged[1][:-1])
        problems = cc.verify(t["plan"], main, t["spec"]["snap"], t["res"])
        assert any("lost" in p for p in problems), problems
        # without a log the sidecar's list counts (the trials flush after every commit, so it is current too)
        os.unlink(log)
    if kind in ck.KINDS:
        meta_path, key = ck.segment_list_file(kind, main)
    elif kind == "rb":
        # a buffer over a storage that persists its own segment list: that list (not metadata.json) is authoritative
        meta_path = os.path.join(main, "storage", "inner_storage.memmap.meta.json")
        key = "segments"
    else:
        meta_path = _data_file(kind, main) + ".meta.json"
        key = "segments"
    with open(meta_path) as f:
        meta = json.load(f)
    assert meta[key], meta
    meta[key] = meta[key][:-1]
    with open(meta_path, "w") as f:
        json.dump(meta, f)
    problems = cc.verify(t["plan"], main, t["spec"]["snap"], t["res"])
    assert any("lost" in p for p in problems), problems


def test_plans_wrap_the_ring_and_dump_elsewhere() -> None:
    """The seeded plans exercise what the trials claim: wrapping rings, several writers, dumps elsewhere."""
    for kind in cc.KINDS:
        plans = [cc.make_plan(kind, s) for s in range(TRIALS_PER_KIND)]
        wraps = sum(sum(n for _e, _s, n in p["commits"]) > p["capacity"] for p in plans)
        if kind in ck.GROWABLE_KINDS:   # no ring: an episode overwrites older ones where it starts among them
            def rewrites(p: Dict[str, Any]) -> bool:
                tail = 0
                hit = False
                for _e, s, n in p["commits"]:
                    hit = hit or s < tail
                    tail = max(tail, s + n)
                return hit
            assert wraps == 0 and sum(rewrites(p) for p in plans) >= 5, kind
        else:
            assert wraps >= TRIALS_PER_KIND * 0.8, (kind, wraps)
        assert sum(p["snapshots"] > 0 for p in plans) >= TRIALS_PER_KIND // 2
        ops = {a["op"] for p in plans for a in p["actions"]}
        assert ops == {"append", "writer", "writers", "snapshot"}, ops
        # the checksum printed by the child is a function of the episode content only
        e, _s, n = plans[0]["commits"][0]
        a = cc.episode_arrays(kind, 0, e, n)
        assert cc.episode_checksum(a) == cc.episode_checksum(cc.episode_arrays(kind, 0, e, n))
        assert np.all([cc.episode_arrays(kind, 0, e, n)[k].shape[0] == n for k in a])


# ------------------------------------------------------------------------- a shared buffer, every process killed
def test_shared_buffer_commits_survive_killing_every_process(server: Any, tmp_path: Any, soak: int) -> None:
    """MP_TRIALS (x soak) trials of a disk-backed multiprocessing=True buffer written by three processes, all of
    them SIGKILLed at once: every episode whose commit returned is listed, byte-identical, at its place."""
    t0 = time.monotonic()
    n = MP_TRIALS * soak
    failures = []
    commits = 0
    for seed in range(n):
        root = os.fspath(tmp_path / f"m{seed}")
        spec = cc.trial_spec("mp", seed, root, "timer", durable=seed % 5 == 4)
        res = server.run(spec)
        cm.cleanup(res)
        commits += sum(ln.startswith("COMMITTED") for ln in res["lines"])
        probs = cm.verify(seed, spec["main"], res, cc)
        if probs:
            failures.append([f"[mp seed {seed}] (exit {res['exit']}; dir {root})"] + ["    " + p for p in probs])
        else:
            shutil.rmtree(root, ignore_errors=True)
    assert commits >= n * 5, commits    # the writers got going before the kill
    assert not failures, _report("mp", failures, n, time.monotonic() - t0)


# ------------------------------------------------------------------------- scripts/crash_trials.py, kills mid-write
#: the persistence loop of issue 13 over HDF5, killed inside storage code once the ring has wrapped (about 0.3 s a
#: trial for the 64-row rings, 0.5 s for 2000 rows); seeds 8, 10, 12 and 17 tore a row before the fix
SCRIPT_CONFIGS = "h5-64,h5flat-64,h5-2000"
SCRIPT_TRIALS = 18


def test_persistence_loop_killed_inside_storage_writes(tmp_path: Any) -> None:
    """scripts/crash_trials.py --mode write: the writer (append per step, mark_segment_end, dumps into its own
    directory, maintained segments) SIGKILLs itself at a seeded call into storage code after the ring wrapped, so
    kills land between the field-by-field writes of a row (HDF5Storage writes one dataset per field). Every trial
    must reopen with only recorded rows visible, intact segments and no committed episode lost (the script's
    checks); a row torn by the kill must never be visible."""
    import subprocess
    import sys
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts", "crash_trials.py")
    proc = subprocess.run([sys.executable, script, "--trials", str(SCRIPT_TRIALS), "--configs", SCRIPT_CONFIGS,
                           "--mode", "write", "--keep", os.fspath(tmp_path)], capture_output=True, text=True,
                          timeout=600)
    report = (proc.stdout + proc.stderr)[-4000:]
    assert proc.returncode == 0, report
    for config in SCRIPT_CONFIGS.split(","):
        assert f"{config}: {SCRIPT_TRIALS} of {SCRIPT_TRIALS} clean" in proc.stdout, report
