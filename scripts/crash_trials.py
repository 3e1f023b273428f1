"""Crash trials of the most common persistence loop (issue 13 point 8), with real SIGKILLs at random moments.

The loop, in a forked writer process: `append()` every step, `mark_segment_end()`, then `dumps(<the buffer's own
directory>)` after each episode, on a `ReplayBuffer` with `maintain_segment_metadata=True`. After each commit point
the writer prints `COMMITTED <episode>`; the parent SIGKILLs it (its whole process group) at a random instant once
the ring has wrapped (random delay after a random number of episodes), so kills land in `append`, in
`mark_segment_end` and inside `dumps`. Then `ReplayBuffer.load_from` (read-only) must:

* open without an error;
* show only rows that equal a recorded row (every field, the camera frame included, regenerated from the seed;
  a row mixing two episodes' values is caught);
* list only intact segments: one episode's consecutive steps, whole (the oldest one may be clipped to its newest
  rows once the ring has wrapped), of an episode that reached `mark_segment_end`;
* lose no committed episode: every committed episode among the newest `capacity - <longest episode>` rows (all of
  them for a growable buffer) is listed whole.

Kill modes (`--mode`):

  timer   (the default) the parent SIGKILLs the writer a random delay after a random number of episodes past the wrap
  write   once the ring has wrapped, the writer SIGKILLs itself at a seeded call of storage code (every call into a
          `unienv_data.storages` module is a candidate, each with probability 1/WRITE_KILL_ODDS): between the
          field-by-field writes of one row, inside a segment commit or inside a `dumps`. It aims where a timer
          rarely lands (a storage writing a row's fields one by one leaves a torn row if the kill falls between
          two of them) and reproduces exactly per seed.

Configurations (`--configs`, default all):

  flat-2000 / flat-64     FlattenedStorage over a memory-mapped PytorchTensorStorage, capacity 2000 with episodes
                          of 10-150 steps / capacity 64 with episodes of 1-4 steps
  h5-2000 / h5-64         HDF5Storage
  h5flat-2000 / h5flat-64 FlattenedStorage over HDF5Storage
  grow-native             growable (capacity=None) native-layout DictStorage with a camera (memory-mapped arrays)
  grow-video / grow-h5    the same with the camera in a lossless VideoStorage / every child in HDF5
  shared                  multiprocessing=True buffer, capacity 1000, native layout with a camera; the collector
                          is killed while committing (no dumps: every commit persists itself)

    python scripts/crash_trials.py --trials 100 [--configs flat-64,shared] [--seed 0] [--keep DIR] [--mode write]

It reuses the crash-test machinery of tests/ (row checksums, spaces, line output, semaphore cleanup). Prints one
line per configuration, `<config>: <clean> of <trials> clean`, and the problems of failing trials (their
directories are kept under --keep for inspection). Exit status 1 when any trial failed.
"""
from __future__ import annotations

import argparse
import os
import select
import shutil
import signal
import sys
import tempfile
import time
import warnings
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
import _crash_child as cc  # noqa: E402
import _crash_kinds as ck  # noqa: E402
import _crash_mp as cm  # noqa: E402

#: name -> (storage, capacity, (shortest, longest) episode, shared)
CONFIGS: Dict[str, Tuple[str, Optional[int], Tuple[int, int], bool]] = {
    "flat-2000": ("flat", 2000, (10, 150), False), "flat-64": ("flat", 64, (1, 4), False),
    "h5-2000": ("h5", 2000, (10, 150), False), "h5-64": ("h5", 64, (1, 4), False),
    "h5flat-2000": ("h5flat", 2000, (10, 150), False), "h5flat-64": ("h5flat", 64, (1, 4), False),
    "grow-native": ("native", None, (10, 60), False), "grow-video": ("video", None, (10, 60), False),
    "grow-h5": ("nativeh5", None, (10, 60), False),
    "shared": ("native", 1000, (10, 150), True),
}
CAMERA = ("native", "video", "nativeh5")
HANG_S = 120.0
#: `--mode write`: each call into storage code after the wrap is the kill point with probability 1 / this
WRITE_KILL_ODDS = 400


class _KillInStorage:
    """A profile hook: at each call into a `unienv_data.storages` module, SIGKILLs this process with probability
    1 / WRITE_KILL_ODDS (a seeded generator, so a seed reproduces the same instant)."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng([seed, 77])

    def __call__(self, frame: Any, event: str, arg: Any) -> None:
        if event != "call" or not frame.f_globals.get("__name__", "").startswith("unienv_data.storages"):
            return
        if self.rng.integers(WRITE_KILL_ODDS) == 0:
            sys.setprofile(None)
            os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(10)  # never reached


# ------------------------------------------------------------------------------------------------ episodes
def episode_length(seed: int, eid: int, lens: Tuple[int, int]) -> int:
    return int(np.random.default_rng([seed, eid, 5]).integers(lens[0], lens[1] + 1))


def episode(storage: str, seed: int, eid: int, n: int) -> Dict[str, np.ndarray]:
    """The recorded rows of one episode (fields eid, t, n, x, chk; plus the camera frame `img`)."""
    if storage == "flat":
        return cc.episode_arrays("flat", seed, eid, n)
    return ck.episode_arrays("rbvideo" if storage in CAMERA else "h5rb", seed, eid, n, cc.row_checksum)


def space(storage: str) -> Any:
    return cc.torch_space() if storage == "flat" else ck._np_space(storage in CAMERA)


def create(storage: str, path: str, cap: Optional[int], shared: bool) -> Any:
    from unienv_data.replay_buffer import ReplayBuffer
    from unienv_data.storages.dict_storage import DictStorage
    from unienv_data.storages.flattened import FlattenedStorage
    from unienv_data.storages.native_layout import native_layout_kwargs
    sp = space(storage)
    common: Dict[str, Any] = {"cache_path": path, "capacity": cap, "maintain_segment_metadata": not shared,
                              "multiprocessing": shared}
    if storage == "flat":
        from unienv_data.storages.pytorch import PytorchTensorStorage
        return ReplayBuffer.create(FlattenedStorage, sp, inner_storage_cls=PytorchTensorStorage, is_memmap=True,
                                   **common)
    if storage in ("h5", "h5flat"):
        from unienv_data.storages.hdf5 import HDF5Storage
        if storage == "h5":
            return ReplayBuffer.create(HDF5Storage, sp, **common)
        return ReplayBuffer.create(FlattenedStorage, sp, inner_storage_cls=HDF5Storage, **common)
    if storage == "video":
        kw = native_layout_kwargs(sp, image_storage="video", video_kwargs=ck.VIDEO_KWARGS)
    else:
        kw = native_layout_kwargs(sp)
    if storage == "nativeh5":
        from unienv_data.storages.hdf5 import HDF5Storage
        kw["storage_cls_map"] = {k: (v if v is FlattenedStorage else HDF5Storage)
                                 for k, v in kw["storage_cls_map"].items()}
        kw["key_kwargs"] = {k: {**v, "inner_storage_cls": HDF5Storage} for k, v in kw.get("key_kwargs", {}).items()}
        for k, v in kw["storage_cls_map"].items():
            if v is FlattenedStorage:
                kw["key_kwargs"].setdefault(k, {"inner_storage_cls": HDF5Storage})
    return ReplayBuffer.create(DictStorage, sp, **common, **kw)


# ------------------------------------------------------------------------------------------------ the writer
def writer(config: str, seed: int, path: str, fd: int, mode: str = "timer") -> None:
    """The recording loop (never returns; SIGKILLed by the parent, or by itself in mode "write")."""
    storage, cap, lens, shared = CONFIGS[config]
    wrap = cap if cap is not None else 0
    rows = 0
    out = cc._Out(fd)
    rb = create(storage, path, cap, shared)
    name = getattr(getattr(getattr(rb._state, "_lock", None), "_semlock", None), "name", None)
    if name:
        out(f"SEMAPHORE {name}")
    out("READY")
    eid = 0
    while True:
        n = episode_length(seed, eid, lens)
        data = episode(storage, seed, eid, n)
        if mode == "write" and rows >= wrap and sys.getprofile() is None:
            sys.setprofile(_KillInStorage(seed))
        out(f"BEGIN {eid} {n}")
        for t in range(n):
            if storage == "flat":
                rb.append(cc.step_value("flat", data, t))
            else:
                rb.append({k: np.array(v[t]) for k, v in data.items()})
        rb.mark_segment_end()
        if not shared:
            rb.dumps(path)
        out(f"COMMITTED {eid} {n}")
        rows += n
        eid += 1


def run_trial(config: str, seed: int, path: str, mode: str = "timer") -> Dict[str, Any]:
    """Forks the writer, which is SIGKILLed at a random instant after the ring wrapped (by this process, or by
    itself in mode "write"); its lines."""
    storage, cap, lens, shared = CONFIGS[config]
    rng = np.random.default_rng([seed, 99])
    wrap = cap if cap is not None else 0
    extra = int(rng.integers(0, 6))        # episodes after the wrap before the kill timer starts
    delay = float(rng.uniform(0.0, 0.8))
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:                           # the writer
        os.close(r)
        os.setpgid(0, 0)
        try:
            writer(config, seed, path, w, mode)
        except BaseException:  # noqa: BLE001 - report and die; the parent sees no further commits
            import traceback
            os.write(w, ("ERROR " + traceback.format_exc().replace("\n", " | ") + "\n").encode())
        os._exit(3)
    os.close(w)
    lines: List[str] = []
    buf = b""
    rows = 0
    after_wrap = -1
    deadline: Optional[float] = None
    t0 = time.monotonic()
    while True:
        now = time.monotonic()
        if deadline is not None and now >= deadline:
            break
        if now - t0 > HANG_S:
            lines.append("HUNG")
            break
        ready, _, _ = select.select([r], [], [], 0.005 if deadline is None else max(0.0, deadline - now))
        if not ready:
            continue
        chunk = os.read(r, 65536)
        if not chunk:
            break
        buf += chunk
        while b"\n" in buf:
            ln, buf = buf.split(b"\n", 1)
            lines.append(ln.decode())
            if ln.startswith(b"COMMITTED"):
                rows += int(ln.split()[2])
                if rows >= wrap and mode == "timer":
                    after_wrap += 1
                    if after_wrap >= extra and deadline is None:
                        deadline = time.monotonic() + delay
            elif ln.startswith(b"READY") and wrap == 0 and deadline is None and mode == "timer":
                deadline = time.monotonic() + 0.05 + delay
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    os.waitpid(pid, 0)
    while True:                            # what it wrote before dying
        ready, _, _ = select.select([r], [], [], 0)
        chunk = os.read(r, 65536) if ready else b""
        if not chunk:
            break
        buf += chunk
    os.close(r)
    lines += [ln.decode() for ln in buf.split(b"\n") if ln]
    res = {"lines": lines}
    cm.cleanup(res)
    return res


# ------------------------------------------------------------------------------------------------ the checks
def verify(config: str, seed: int, path: str, res: Dict[str, Any]) -> List[str]:
    from unienv_data.replay_buffer import ReplayBuffer
    storage, cap, lens, shared = CONFIGS[config]
    lines = res["lines"]
    problems = [ln for ln in lines if ln.startswith(("ERROR", "HUNG"))]
    committed = [(int(ln.split()[1]), int(ln.split()[2])) for ln in lines if ln.startswith("COMMITTED")]
    begun = max([int(ln.split()[1]) for ln in lines if ln.startswith("BEGIN")], default=-1)
    if not any(ln == "READY" for ln in lines):
        return problems + ["killed before create() returned"]
    try:
        rb = ReplayBuffer.load_from(path, backend="numpy")
    except Exception as exc:  # noqa: BLE001 - any error here is the finding
        return problems + [f"load_from raised {type(exc).__name__}: {exc}"[:600]]
    try:
        n_rows = len(rb)
        segs = rb.episode_segments() or []
        rows = {k: np.asarray(v) for k, v in rb[0:n_rows].items()} if n_rows else {}
    finally:
        rb.close()
    cache: Dict[int, Dict[str, np.ndarray]] = {}

    def recorded(eid: int) -> Dict[str, np.ndarray]:
        if eid not in cache:
            cache[eid] = episode(storage, seed, eid, episode_length(seed, eid, lens))
        return cache[eid]

    eids = rows["eid"].astype(np.int64) if n_rows else np.zeros(0, np.int64)
    ts = rows["t"].astype(np.int64) if n_rows else np.zeros(0, np.int64)
    for i in range(n_rows):
        e, t = int(eids[i]), int(ts[i])
        ok = 0 <= e <= begun and 0 <= t < episode_length(seed, e, lens)
        if ok:
            want = recorded(e)
            ok = all(np.array_equal(rows[k][i], want[k][t]) for k in want)
        if not ok:
            where = next((f"in segment {(a, b)}" for a, b in segs if a <= i < b), "outside every segment")
            problems.append(f"row {i} (eid {e}, t {t}) equals no recorded row ({where}; {n_rows} rows visible)")
            if len(problems) > 5:
                return problems
    listed: Dict[int, Tuple[int, int]] = {}
    # rows written: the committed episodes', plus those of the episode begun after them, whose commit point may
    # have completed before the kill stopped its COMMITTED line
    pending = episode_length(seed, begun, lens) if begun > (committed[-1][0] if committed else -1) else 0
    wrapped = cap is not None and sum(n for _e, n in committed) + pending > cap
    for s, e in segs:
        seg_e = eids[s:e]
        seg_t = ts[s:e]
        if e <= s or len(set(seg_e.tolist())) != 1:
            problems.append(f"segment {(s, e)} holds {sorted(set(seg_e.tolist()))[:5]} episodes")
            continue
        eid = int(seg_e[0])
        n = episode_length(seed, eid, lens)
        whole = e - s == n and np.array_equal(seg_t, np.arange(n))
        clipped = wrapped and s == 0 and np.array_equal(seg_t, np.arange(n - (e - s), n))
        if not (whole or clipped):
            problems.append(f"segment {(s, e)} of episode {eid} is torn (steps {seg_t[:3]}..{seg_t[-3:]}, n {n})")
        if eid > begun:
            problems.append(f"segment {(s, e)} lists episode {eid}, never recorded")
        if whole:
            listed[eid] = (s, e)
    budget = float("inf") if cap is None else cap - lens[1]
    acc = 0
    for eid, n in reversed(committed):
        acc += n
        if acc > budget:
            break
        if eid not in listed:
            problems.append(f"committed episode {eid} ({n} steps) is lost (not listed whole)")
    return problems


# ------------------------------------------------------------------------------------------------ main
def _preload() -> None:
    import torch  # noqa: F401
    ck.preload()
    cc.torch_space()
    import unienv_data.storages.pytorch  # noqa: F401
    import unienv_data.replay_buffer  # noqa: F401
    warnings.simplefilter("ignore")


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=30, help="trials per configuration")
    ap.add_argument("--configs", default=",".join(CONFIGS), help=f"comma-separated, of {list(CONFIGS)}")
    ap.add_argument("--seed", type=int, default=0, help="first seed")
    ap.add_argument("--keep", default=None, help="directory to keep failing trials in (default: a temp dir)")
    ap.add_argument("--mode", choices=("timer", "write"), default="timer",
                    help="who kills the writer: a timer in this process, or the writer itself inside storage code")
    args = ap.parse_args(argv)
    configs = [c for c in args.configs.split(",") if c]
    unknown = [c for c in configs if c not in CONFIGS]
    if unknown:
        ap.error(f"unknown configuration(s) {unknown}; choose from {list(CONFIGS)}")
    _preload()
    keep = args.keep or tempfile.mkdtemp(prefix="crash-trials-")
    failed = False
    for config in configs:
        clean = 0
        t0 = time.monotonic()
        reports: List[str] = []
        for seed in range(args.seed, args.seed + args.trials):
            path = os.path.join(keep, f"{config}-{seed}")
            shutil.rmtree(path, ignore_errors=True)
            res = run_trial(config, seed, path, args.mode)
            probs = verify(config, seed, path, res)
            n_commit = sum(ln.startswith("COMMITTED") for ln in res["lines"])
            if probs:
                reports.append(f"  [{config} seed {seed}] ({n_commit} committed; dir {path})\n    "
                               + "\n    ".join(probs[:6]))
            else:
                clean += 1
                shutil.rmtree(path, ignore_errors=True)
        failed = failed or clean < args.trials
        print(f"{config}: {clean} of {args.trials} clean ({time.monotonic() - t0:.0f} s)", flush=True)
        for rep in reports[:10]:
            print(rep, flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
