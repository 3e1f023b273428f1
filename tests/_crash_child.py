"""Crash-trial helper: the recording process that gets SIGKILLed, and the checks run on what it leaves behind.

Used by tests/test_crash_trials.py; also runnable on its own to reproduce one trial:

    python tests/_crash_child.py trial --kind flat --seed 7 [--mode point|timer|none] [--durable] [--dir DIR]

A trial records deterministic episodes (from `make_plan(kind, seed)`) into one storage directory, making every
episode durable at a commit point (`mark_segment_end` or a segment writer's `commit`, then `flush()` / `dumps()`),
and only afterwards prints `COMMITTED <episode id> <checksum>` on stdout (one unbuffered `os.write`). Every few
episodes it also dumps a snapshot into a second directory (`SNAP-BEGIN <j>` before, `SNAPSHOT <j>` after).

Storage kinds:
  flat   FlattenedStorage over a memory-mapped PytorchTensorStorage (torch Dict space)
  numpy  NumpyMemmapStorage directly (int64 rows)
  rb     ReplayBuffer over a memory-mapped FlattenedStorage (torch Dict space)

Kill modes:
  timer  the parent SIGKILLs the process at a random moment (after a random number of COMMITTED lines plus a
         random delay)
  point  the process SIGKILLs itself at the K-th call/return event of library code (`unienv_data.*` frames and
         the C functions they call, e.g. os.replace), K drawn from the seed over the event count of a dry run:
         deterministic, so a failing seed reproduces exactly
  none   no kill (the whole plan runs)

Every row carries its episode id, step, episode length and a per-row checksum, so a reader can tell a whole episode
from a torn one, and compare it byte for byte with the episode the plan says was recorded.
"""
from __future__ import annotations

import argparse
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import zlib
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

import _crash_kinds as ck

KINDS = ("flat", "numpy", "rb") + ck.KINDS
_KIND_CODE = {"flat": 1, "numpy": 2, "rb": 3, **ck.KIND_CODE}
BUFFER_KINDS = ("rb",) + ck.BUFFER_KINDS
FIELDS = ("eid", "t", "n", "x", "chk")  # torch kinds; numpy rows are [eid, t, n, a, b, chk]
NUMPY_FILE = "data.memmap"
CLEAN_ERRORS = (ValueError, TypeError, KeyError, IndexError, FileNotFoundError)


# =============================================================================================== the plan
def make_plan(kind: str, seed: int) -> Dict[str, Any]:
    """What a trial records, in order. `actions` are executed one after the other; `commits` lists every episode
    in the order its commit point is reached: `(eid, start, n)` with `start` the physical row it is placed at."""
    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r}; one of {KINDS}")
    rng = np.random.default_rng([int(seed), _KIND_CODE[kind], 1])
    cap = int(rng.integers(16, 41))
    n_groups = int(rng.integers(8, 19))
    buffer = kind in BUFFER_KINDS
    growable = kind in ck.GROWABLE_KINDS
    if growable:
        cap = ck.GROW_BOUND     # no ring: only the bound of the overlap arithmetic
    tail = 0
    eid = 0
    actions: List[Dict[str, Any]] = []
    commits: List[Tuple[int, int, int]] = []
    snaps = 0
    for _g in range(n_groups):
        r = rng.random()
        persist = "flush" if (not buffer and rng.random() < 0.5) else "dumps"
        if r < 0.45:
            group = [eid]
            op = "append"
        elif r < 0.75:
            group = [eid]
            op = "writer"
        else:
            group = [eid, eid + 1]
            op = "writers"
        eid += len(group)
        lengths = {e: int(rng.integers(1, 9)) for e in group}
        order = list(reversed(group)) if op == "writers" else group  # several writers: committed in reverse
        starts = {}
        for e in order:
            if not buffer and rng.random() < 0.15:
                # anywhere on the ring, or in the rows of a growable storage (overlaps older episodes at random)
                starts[e] = int(rng.integers(0, tail + 1)) if growable else int(rng.integers(0, cap))
            else:
                starts[e] = tail
            tail = max(tail, starts[e] + lengths[e]) if growable else (starts[e] + lengths[e]) % cap
            commits.append((e, starts[e], lengths[e]))
        actions.append({"op": op, "eids": group, "order": order, "lengths": lengths, "starts": starts,
                        "persist": persist})
        if rng.random() < 0.25:
            actions.append({"op": "snapshot", "j": snaps, "after": len(commits)})
            snaps += 1
    return {"kind": kind, "seed": int(seed), "capacity": cap, "actions": actions, "commits": commits,
            "snapshots": snaps, "growable": growable}


def runs_overlap(a: Tuple[int, int], b: Tuple[int, int], cap: int) -> bool:
    """Whether runs `(start, n)` share a physical row of a ring of `cap` rows."""
    ra = {(a[0] + i) % cap for i in range(a[1])}
    return any((b[0] + i) % cap in ra for i in range(b[1]))


def live_after(plan: Dict[str, Any], n_commits: int) -> List[Tuple[int, int, int]]:
    """The episodes a correct storage lists after the first `n_commits` commits: each commit drops the older
    episodes it overlaps. `(eid, start, n)`, oldest first."""
    cap = plan["capacity"]
    live: List[Tuple[int, int, int]] = []
    for e, s, n in plan["commits"][:n_commits]:
        live = [x for x in live if not runs_overlap((x[1], x[2]), (s, n), cap)]
        live.append((e, s, n))
    return live


# =============================================================================================== episode content
def episode_arrays(kind: str, seed: int, eid: int, n: int) -> Dict[str, np.ndarray]:
    """The rows of episode `eid` as NumPy arrays: for the torch kinds a dict of FIELDS with a leading axis of n;
    for "numpy" {"rows": int64 (n, 6)}."""
    if kind in ck.KINDS:
        return ck.episode_arrays(kind, seed, eid, n, row_checksum)
    rng = np.random.default_rng([int(seed), int(eid), 77])
    if kind == "numpy":
        rows = np.zeros((n, 6), dtype=np.int64)
        rows[:, 0] = eid
        rows[:, 1] = np.arange(n)
        rows[:, 2] = n
        rows[:, 3:5] = rng.integers(0, 1 << 40, size=(n, 2))
        for t in range(n):
            rows[t, 5] = zlib.crc32(rows[t, :5].tobytes()) & 0xFFFFFFF
        return {"rows": rows}
    x = rng.standard_normal((n, 3)).astype(np.float32)
    out = {"eid": np.full(n, eid, np.int32), "t": np.arange(n, dtype=np.int32), "n": np.full(n, n, np.int32),
           "x": x, "chk": np.zeros(n, np.int32)}
    for t in range(n):
        out["chk"][t] = row_checksum(eid, t, n, x[t])
    return out


def row_checksum(eid: int, t: int, n: int, x: np.ndarray) -> int:
    """Per-row checksum of the torch kinds (below 2**20, exact in a float32 flat row)."""
    head = np.array([eid, t, n], dtype=np.int32).tobytes()
    return zlib.crc32(head + np.asarray(x, dtype=np.float32).tobytes()) & 0xFFFFF


def episode_checksum(arrays: Dict[str, np.ndarray]) -> int:
    """crc32 of every field's bytes (keys sorted): the checksum printed with COMMITTED."""
    c = 0
    for k in sorted(arrays):
        c = zlib.crc32(np.ascontiguousarray(arrays[k]).tobytes(), c)
    return c


# =============================================================================================== spaces (lazy)
_SPACES: Dict[str, Any] = {}


def torch_space() -> Any:
    if "torch" not in _SPACES:
        import torch
        from unienv_interface.backends.pytorch import PyTorchComputeBackend as TB
        from unienv_interface.space import BoxSpace, DictSpace
        ints = {k: BoxSpace(TB, 0, 1 << 20, torch.int32, shape=()) for k in ("eid", "t", "n", "chk")}
        _SPACES["torch"] = DictSpace(TB, {**ints, "x": BoxSpace(TB, -np.inf, np.inf, torch.float32, shape=(3,))})
    return _SPACES["torch"]


def numpy_space() -> Any:
    if "numpy" not in _SPACES:
        from unienv_interface.backends import NumpyComputeBackend as NB
        from unienv_interface.space import BoxSpace
        _SPACES["numpy"] = BoxSpace(NB, 0, 1 << 62, np.int64, shape=(6,))
    return _SPACES["numpy"]


def step_value(kind: str, arrays: Dict[str, np.ndarray], t: int) -> Any:
    if kind in ck.KINDS:
        return ck.step_value(kind, arrays, t)
    if kind == "numpy":
        return arrays["rows"][t].copy()
    import torch
    return {k: torch.from_numpy(np.array(v[t])) for k, v in arrays.items()}


# =============================================================================================== the recording child
class _Out:
    """Line output on a file descriptor, one unbuffered write per line (survives a SIGKILL once written)."""

    def __init__(self, fd: Optional[int]) -> None:
        self.fd = fd

    def __call__(self, line: str) -> None:
        if self.fd is not None:
            os.write(self.fd, (line + "\n").encode())


_IN_SNAPSHOT = [False]  # set while `record` is inside a dumps to the snapshot directory


class _KillAtEvent:
    """A profile hook counting call/return events of library code; SIGKILLs this process at event `kill_at`.
    With `window="snapshot"` only events inside a dumps to the snapshot directory count."""

    def __init__(self, kill_at: Optional[int], window: str = "all") -> None:
        self.kill_at = kill_at
        self.window = window
        self.count = 0

    def __call__(self, frame: Any, event: str, arg: Any) -> None:
        if self.window == "snapshot" and not _IN_SNAPSHOT[0]:
            return
        if not frame.f_globals.get("__name__", "").startswith("unienv_data"):
            return
        self.count += 1
        if self.kill_at is not None and self.count >= self.kill_at:
            sys.setprofile(None)
            os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(10)  # never reached


def _open_storage(kind: str, main: str, cap: int) -> Any:
    if kind in ck.KINDS:
        return ck.open_storage(kind, main, cap)
    if kind == "flat":
        from unienv_data.storages.flattened import FlattenedStorage
        from unienv_data.storages.pytorch import PytorchTensorStorage
        return FlattenedStorage.create(torch_space(), PytorchTensorStorage, capacity=cap, cache_path=main)
    if kind == "numpy":
        from unienv_data.storages.numpy_memmap import NumpyMemmapStorage
        os.makedirs(main, exist_ok=True)
        return NumpyMemmapStorage.create(numpy_space(), capacity=cap, cache_path=os.path.join(main, NUMPY_FILE))
    from unienv_data.replay_buffer import ReplayBuffer
    from unienv_data.storages.flattened import FlattenedStorage
    from unienv_data.storages.pytorch import PytorchTensorStorage
    return ReplayBuffer.create(FlattenedStorage, torch_space(), inner_storage_cls=PytorchTensorStorage,
                               cache_path=main, capacity=cap, is_memmap=True)


def record(plan: Dict[str, Any], main: str, snap: str, out: Callable[[str], None]) -> None:
    """Executes the plan (see the module docstring); prints READY, COMMITTED, SNAP-BEGIN / SNAPSHOT, DONE."""
    kind, seed = plan["kind"], plan["seed"]
    st = _open_storage(kind, main, plan["capacity"])
    own, snap_to = main, snap
    if kind == "numpy":
        own, snap_to = os.path.join(main, NUMPY_FILE), os.path.join(snap, NUMPY_FILE)
    elif kind in ck.KINDS:
        own, snap_to = ck.own_path(kind, main), ck.snap_path(kind, snap)
    out("READY")

    def persist(how: str) -> None:
        if kind in BUFFER_KINDS:
            st.dumps() if how == "flush" else st.dumps(main)
        elif how == "flush":
            st.flush()
        else:
            st.dumps(own)

    for act in plan["actions"]:
        if act["op"] == "snapshot":
            out(f"SNAP-BEGIN {act['j']}")
            _IN_SNAPSHOT[0] = True
            try:
                st.dumps(snap_to)
            finally:
                _IN_SNAPSHOT[0] = False
            out(f"SNAPSHOT {act['j']}")
            continue
        data = {e: episode_arrays(kind, seed, e, act["lengths"][e]) for e in act["eids"]}
        if act["op"] == "append":
            (e,) = act["eids"]
            if kind not in BUFFER_KINDS:
                st.mark_segment_start(act["starts"][e])
            for t in range(act["lengths"][e]):
                st.append(step_value(kind, data[e], t))
            st.mark_segment_end()
            persist(act["persist"])
            out(f"COMMITTED {e} {episode_checksum(data[e])}")
            continue
        writers = {e: st.open_segment_writer() for e in act["eids"]}
        for t in range(max(act["lengths"].values())):          # filled interleaved
            for e in act["eids"]:
                if t < act["lengths"][e]:
                    writers[e].append(step_value(kind, data[e], t))
        for e in act["order"]:
            if kind in BUFFER_KINDS:
                st.commit_segment(writers[e])
            else:
                writers[e].commit(act["starts"][e])
            persist(act["persist"])
            out(f"COMMITTED {e} {episode_checksum(data[e])}")
    out("DONE")


def run_trial(spec: Dict[str, Any], out_fd: Optional[int] = 1) -> None:
    """Runs one trial in this process. spec: kind, seed, main, snap, mode ('timer' | 'point' | 'none'), durable,
    window ('all' | 'snapshot': where a point-mode kill may land)."""
    from unienv_data.base.files import set_durable
    set_durable(bool(spec.get("durable")))
    if spec["kind"] == "mp":
        import _crash_mp
        _crash_mp.run(spec, sys.modules[__name__])
    plan = make_plan(spec["kind"], spec["seed"])
    out = _Out(out_fd)
    if spec.get("mode") != "point":
        record(plan, spec["main"], spec["snap"], out)
        return
    # dry run in a scratch directory to count the events, then the real run killed at event K
    scratch = tempfile.mkdtemp(prefix="crash-dry-")
    try:
        window = spec.get("window", "all")
        counter = _KillAtEvent(None, window)
        sys.setprofile(counter)
        try:
            record(plan, os.path.join(scratch, "main"), os.path.join(scratch, "snap"), _Out(None))
        finally:
            sys.setprofile(None)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if counter.count == 0:
        raise ValueError(f"no library event in window {window!r} for this plan")
    kill_at = int(np.random.default_rng([int(spec["seed"]), _KIND_CODE[spec["kind"]], 2]).integers(1, counter.count + 1))
    out(f"KILL-AT {kill_at} OF {counter.count} IN {window}")
    sys.setprofile(_KillAtEvent(kill_at, window))
    try:
        record(plan, spec["main"], spec["snap"], out)
    finally:
        sys.setprofile(None)


def _preload() -> None:
    import torch
    torch.set_num_threads(1)
    torch_space()
    numpy_space()
    import unienv_data.replay_buffer  # noqa: F401
    import unienv_data.storages.flattened  # noqa: F401
    import unienv_data.storages.numpy_memmap  # noqa: F401
    import unienv_data.storages.pytorch  # noqa: F401
    ck.preload()


def serve() -> None:
    """Fork server: imports everything once, then for each JSON spec line on stdin forks a child that runs the
    trial. Prints `CHILD <pid>` after each fork and `EXIT <pid> <how>` once the child is gone; the children print
    their own lines on the same stdout."""
    _preload()
    out = _Out(1)
    out("SERVER-READY")
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        spec = json.loads(line)
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                run_trial(spec)
            except BaseException:
                msg = traceback.format_exc()
                out("ERROR " + json.dumps(msg))
                code = 3
            os._exit(code)
        out(f"CHILD {pid}")
        _, status = os.waitpid(pid, 0)
        if os.WIFSIGNALED(status):
            how = f"signal {os.WTERMSIG(status)}"
        else:
            how = f"code {os.WEXITSTATUS(status)}"
        out(f"EXIT {pid} {how}")


# =============================================================================================== the parent side
class Server:
    """A running fork server (`serve`), driven line by line from the test process."""

    def __init__(self, env: Optional[Dict[str, str]] = None) -> None:
        self._env = env
        self._start()

    def restart(self) -> None:
        """A fresh server (after a hung trial, whose late output must not be taken for the next trial's)."""
        self.close()
        self._start()

    def _start(self) -> None:
        env = self._env
        self.errfile = tempfile.TemporaryFile()
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "serve"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.errfile, env=env)
        self._buf = b""
        line = self.readline(120.0)
        if line != "SERVER-READY":
            raise RuntimeError(f"crash-trial server did not start: {line!r}; stderr: {self.stderr()}")

    def stderr(self) -> str:
        self.errfile.seek(0)
        return self.errfile.read().decode(errors="replace")[-4000:]

    def readline(self, timeout: float) -> Optional[str]:
        """The next line, or None after `timeout` seconds without one."""
        deadline = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()  # type: ignore[union-attr]
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            r, _, _ = select.select([fd], [], [], left)
            if not r:
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                raise RuntimeError(f"crash-trial server exited; stderr: {self.stderr()}")
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return line.decode()

    def run(self, spec: Dict[str, Any], kill_after: Optional[Tuple[int, float]] = None,
            timeout: float = 120.0) -> Dict[str, Any]:
        """Runs one trial; `kill_after=(k, delay)` SIGKILLs the child `delay` s after its k-th COMMITTED line (k=0:
        after READY). Returns {'lines': [...], 'exit': str, 'killed_by_parent': bool}."""
        self.proc.stdin.write((json.dumps(spec) + "\n").encode())  # type: ignore[union-attr]
        self.proc.stdin.flush()  # type: ignore[union-attr]
        lines: List[str] = []
        pid = None
        committed = 0
        ready = False
        killed = False
        deadline = time.monotonic() + timeout
        while True:
            line = self.readline(max(0.0, deadline - time.monotonic()))
            if line is None:
                if pid is not None:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                raise TimeoutError(f"trial {spec} hung (no progress for {timeout} s); lines so far: {lines[-5:]}")
            tag = line.split(" ", 1)[0]
            if tag == "CHILD":
                pid = int(line.split()[1])
            elif tag == "EXIT":
                return {"lines": lines, "exit": line.split(" ", 2)[2], "killed_by_parent": killed}
            else:
                lines.append(line)
                committed += tag == "COMMITTED"
                ready = ready or tag == "READY"
            if (kill_after is not None and not killed and pid is not None and ready and committed >= kill_after[0]
                    and "DONE" not in lines):
                time.sleep(kill_after[1])
                try:
                    os.kill(pid, signal.SIGKILL)
                    killed = True
                except ProcessLookupError:  # it finished (and was reaped) first
                    kill_after = None

    def close(self) -> None:
        try:
            self.proc.stdin.close()  # type: ignore[union-attr]
            self.proc.wait(timeout=30)
        except Exception:
            self.proc.kill()
            self.proc.wait(timeout=30)
        self.errfile.close()


def _clean_error_problem(exc: BaseException, what: str) -> Optional[str]:
    """None when `exc` is a clean error (allowed type, message with words), else a description."""
    import json as _json
    if isinstance(exc, (_json.JSONDecodeError, UnicodeDecodeError)) or not isinstance(exc, CLEAN_ERRORS):
        return f"{what} raised {type(exc).__name__}: {exc!s:.300} (not a clean error type)"
    msg = str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)
    if " " not in msg.strip():
        return f"{what} raised {type(exc).__name__} without a message: {exc!r}"
    return None


def _load(kind: str, main: str) -> Tuple[Any, List[Tuple[int, int]], Callable[[int, int], Dict[str, np.ndarray]]]:
    """Opens a trial directory read-only: (object to close, listed runs `(physical start, n)`, reader of the rows
    of a listed run by its position in that list)."""
    if kind in ck.KINDS:
        return ck.load(kind, main)
    if kind == "numpy":
        from unienv_data.storages.numpy_memmap import NumpyMemmapStorage
        st = NumpyMemmapStorage.load_from(os.path.join(main, NUMPY_FILE), numpy_space())
        cap = st.capacity
        runs = [(s, (e - s) % cap + 1) for s, e in st.episode_segments()]

        def read_numpy(s: int, n: int) -> Dict[str, np.ndarray]:
            return {"rows": np.asarray(st.get((np.arange(n) + s) % cap))}
        return st, runs, read_numpy
    if kind == "flat":
        from unienv_data.storages.flattened import FlattenedStorage
        st = FlattenedStorage.load_from(main, torch_space())
        cap = st.capacity
        runs = [(s, (e - s) % cap + 1) for s, e in st.episode_segments()]

        def read_flat(s: int, n: int) -> Dict[str, np.ndarray]:
            import torch
            got = st.get(torch.from_numpy((np.arange(n) + s) % cap))
            return {k: v.numpy() for k, v in got.items()}
        return st, runs, read_flat
    from unienv_data.replay_buffer import ReplayBuffer
    from unienv_interface.backends.pytorch import PyTorchComputeBackend as TB
    rb = ReplayBuffer.load_from(main, backend=TB, is_memmap=True)
    logical = rb.episode_segments() or []
    runs = []
    starts = {}
    for a, b in logical:
        phys = int(rb.index_with_offset(a))
        runs.append((phys, b - a))
        starts[(phys, b - a)] = a

    def read_rb(s: int, n: int) -> Dict[str, np.ndarray]:
        a = starts[(s, n)]
        got = rb.get_at(slice(a, a + n))
        return {k: v.numpy() for k, v in got.items()}
    return rb, runs, read_rb


def _episode_problem(kind: str, seed: int, rows: Dict[str, np.ndarray], n: int) -> Tuple[Optional[int], Optional[str]]:
    """(episode id, None) when `rows` are exactly one whole episode of `n` rows, byte-identical to what was
    recorded; else (id or None, what is wrong)."""
    if kind == "numpy":
        r = rows["rows"]
        eid = int(r[0, 0])
        if r.shape != (n, 6):
            return None, f"rows of shape {r.shape}"
        ids, ts, ns = r[:, 0], r[:, 1], r[:, 2]
    else:
        ids, ts, ns = ck.ids_of(kind, rows) if kind in ck.KINDS else (rows["eid"], rows["t"], rows["n"])
        eid = int(ids[0])
    if not (ids == eid).all():
        return None, f"rows of several episodes {sorted(set(ids.tolist()))}"
    if ts.tolist() != list(range(n)) or not (ns == n).all():
        return eid, f"not one whole episode of {n} rows: steps {ts.tolist()}, lengths {ns.tolist()}"
    want = episode_arrays(kind, seed, eid, n)
    for k in want:
        if want[k].dtype != rows[k].dtype or want[k].tobytes() != np.ascontiguousarray(rows[k]).tobytes():
            return eid, f"field {k!r} differs from the recorded bytes"
    return eid, None


def _piece_problem(kind: str, seed: int, rows: Dict[str, np.ndarray], n: int
                   ) -> Tuple[Optional[int], int, int, Optional[str]]:
    """(episode id, first step, episode length, None) when `rows` are `n` consecutive steps of one recorded
    episode, byte-identical to what was recorded (a segment clipped by later writes keeps such a run, as in
    unienv 0.0.1b16); else (id or None, 0, 0, what is wrong)."""
    if kind == "numpy":
        r = rows["rows"]
        if r.shape != (n, 6):
            return None, 0, 0, f"rows of shape {r.shape}"
        ids, ts, ns = r[:, 0], r[:, 1], r[:, 2]
    else:
        ids, ts, ns = ck.ids_of(kind, rows) if kind in ck.KINDS else (rows["eid"], rows["t"], rows["n"])
    eid = int(ids[0])
    if not (ids == eid).all():
        return None, 0, 0, f"rows of several episodes {sorted(set(ids.tolist()))}"
    t0, full = int(ts[0]), int(ns[0])
    if ts.tolist() != list(range(t0, t0 + n)) or not (ns == full).all() or t0 + n > full:
        return eid, 0, 0, f"not consecutive steps of one episode: steps {ts.tolist()}, lengths {ns.tolist()}"
    want = episode_arrays(kind, seed, eid, full)
    for k in want:
        if want[k][t0:t0 + n].tobytes() != np.ascontiguousarray(rows[k]).tobytes():
            return eid, 0, 0, f"field {k!r} differs from the recorded bytes"
    return eid, t0, full, None


def check_directory(kind: str, plan: Dict[str, Any], path: str, required: Sequence[int], permitted: Sequence[int],
                    must_open: bool, what: str) -> List[str]:
    """Problems with one reopened directory: it must open (when `must_open`; otherwise it may also fail with a
    clean error), every listed segment must be one whole episode, byte-identical to the recorded one and at its
    recorded place, or the rows a clipped episode keeps (byte-identical, in place; not counted as listed), and
    the listed episode ids L must satisfy `required` <= L <= `permitted`."""
    problems: List[str] = []
    try:
        obj, runs, read = _load(kind, path)
    except BaseException as exc:  # noqa: BLE001 - classified below
        p = _clean_error_problem(exc, f"{what}: load_from")
        if p:
            return [p]
        if must_open:
            return [f"{what}: does not open after a completed commit point: {type(exc).__name__}: {exc!s:.300}"]
        return []
    try:
        placement = {e: (s, n) for e, s, n in plan["commits"]}
        listed: Dict[int, Tuple[int, int]] = {}
        for s, n in runs:
            try:
                rows = read(s, n)
            except BaseException as exc:  # noqa: BLE001
                problems.append(f"{what}: reading listed segment (start {s}, {n} rows) failed: "
                                f"{type(exc).__name__}: {exc!s:.200}")
                continue
            eid, p = _episode_problem(kind, plan["seed"], rows, n)
            if p and eid is not None:
                # a segment clipped by later writes: the rows it keeps, at their recorded place
                ceid, t0, full, cp = _piece_problem(kind, plan["seed"], rows, n)
                if cp is None and n < full:
                    cap = getattr(obj, "capacity", None)
                    rec = placement.get(ceid)
                    if rec is None or (s - t0) % (cap or (1 << 62)) != rec[0] or rec[1] != full:
                        problems.append(f"{what}: clipped episode {ceid} listed at (start {s}, {n} rows from step "
                                        f"{t0}), recorded at {rec}")
                    continue
            if p:
                problems.append(f"{what}: listed segment (start {s}, {n} rows) is torn or garbage"
                                f"{'' if eid is None else f' (episode {eid})'}: {p}")
                continue
            if eid in listed:
                problems.append(f"{what}: episode {eid} is listed twice")
            listed[eid] = (s, n)
            if placement.get(eid) != (s, n):
                problems.append(f"{what}: episode {eid} listed at (start {s}, {n} rows), recorded at "
                                f"{placement.get(eid)}")
        lost = sorted(set(required) - set(listed))
        if lost:
            problems.append(f"{what}: committed episode(s) {lost} lost (listed: {sorted(listed)}, required: "
                            f"{sorted(required)})")
        extra = sorted(set(listed) - set(permitted))
        if extra:
            problems.append(f"{what}: lists episode(s) {extra} that it may not hold (permitted: {sorted(permitted)})")
    finally:
        try:
            obj.close()
        except BaseException as exc:  # noqa: BLE001
            problems.append(f"{what}: close() after a read-only open raised {type(exc).__name__}: {exc}")
    return problems


def verify(plan: Dict[str, Any], main: str, snap: str, result: Dict[str, Any]) -> List[str]:
    """Every problem with what a killed (or finished) trial left behind (empty when all promises hold)."""
    kind, seed = plan["kind"], plan["seed"]
    lines = result["lines"]
    problems: List[str] = []
    tags = [ln.split(" ", 1)[0] for ln in lines]
    for ln in lines:
        if ln.startswith("ERROR"):
            problems.append("the recording process raised: " + json.loads(ln.split(" ", 1)[1])[-1500:])
    if "DONE" not in tags and not result["exit"].startswith("signal"):
        problems.append(f"the recording process ended early without being killed ({result['exit']})")
    committed = [ln.split()[1:] for ln in lines if ln.startswith("COMMITTED ")]
    commits = plan["commits"]
    for i, (e, chk) in enumerate(committed):
        if i >= len(commits) or int(e) != commits[i][0]:
            problems.append(f"COMMITTED lines out of plan order at {i}: {e}")
            return problems
        want = episode_checksum(episode_arrays(kind, seed, commits[i][0], commits[i][2]))
        if int(chk) != want:
            problems.append(f"episode {e}: printed checksum {chk} != recomputed {want}")
    k = len(committed)
    cap = plan["capacity"]

    # main directory. The episode in flight (commit index k) may have written some of its rows, or may even have
    # reached its commit point without printing. So: every printed episode that is still live must be listed,
    # except those whose rows the in-flight episode overlaps (a correct storage forgets them before overwriting);
    # the in-flight episode may be listed too (whole: checked row by row).
    live = live_after(plan, k)
    nxt = commits[k] if k < len(commits) else None
    required = [e for e, s, n in live if nxt is None or not runs_overlap((s, n), (nxt[1], nxt[2]), cap)]
    permitted = [e for e, _s, _n in live] + ([nxt[0]] if nxt is not None else [])
    problems += check_directory(kind, plan, main, required, permitted, must_open="READY" in tags,
                                what="main directory")

    # dumps to another directory. After a completed dumps (none in flight) it opens with exactly that state. A
    # dumps killed halfway may leave a destination that refuses to load with a clean error (the library's choice:
    # an "interrupted dump" marker); if it does open, it holds the state of the last completed dumps or of the
    # interrupted one: everything in both is there, nothing outside either, nothing torn.
    begun = [int(ln.split()[1]) for ln in lines if ln.startswith("SNAP-BEGIN ")]
    done = [int(ln.split()[1]) for ln in lines if ln.startswith("SNAPSHOT ")]
    if begun:
        after = {a["j"]: a["after"] for a in plan["actions"] if a["op"] == "snapshot"}
        states = [set(e for e, _s, _n in live_after(plan, after[done[-1]]))] if done else [set()]
        in_flight = begun[-1] not in done
        if in_flight:
            states.append(set(e for e, _s, _n in live_after(plan, after[begun[-1]])))
        problems += check_directory(kind, plan, snap, sorted(set.intersection(*states)), sorted(set.union(*states)),
                                    must_open=not in_flight, what="dumps destination")
    return problems


def trial_spec(kind: str, seed: int, root: str, mode: str, durable: bool, window: str = "all") -> Dict[str, Any]:
    return {"kind": kind, "seed": int(seed), "main": os.path.join(root, "main"), "snap": os.path.join(root, "snap"),
            "mode": mode, "durable": bool(durable), "window": window}


def timer_kill(kind: str, seed: int) -> Tuple[int, float]:
    """When the parent kills a timer-mode trial: after k COMMITTED lines, plus a delay (seconds)."""
    plan = make_plan(kind, seed)
    rng = np.random.default_rng([int(seed), _KIND_CODE[kind], 3])
    k = int(rng.integers(0, len(plan["commits"]) + 1))
    delay = float(rng.exponential(0.0015)) if rng.random() < 0.8 else float(rng.uniform(0.0, 0.03))
    return k, delay


def repro_command(kind: str, seed: int, mode: str, durable: bool, window: str = "all") -> str:
    return (f"python tests/_crash_child.py trial --kind {kind} --seed {seed} --mode {mode}"
            + (" --durable" if durable else "") + (f" --window {window}" if window != "all" else ""))


def _main(argv: Sequence[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("serve", help="fork server for the test suite (JSON specs on stdin)")
    t = sub.add_parser("trial", help="run one trial in a forked child, kill it, and check the directories")
    t.add_argument("--kind", choices=KINDS, required=True)
    t.add_argument("--seed", type=int, required=True)
    t.add_argument("--mode", choices=("point", "timer", "none"), default="point")
    t.add_argument("--durable", action="store_true")
    t.add_argument("--window", choices=("all", "snapshot"), default="all",
                   help="point mode: kill anywhere, or only inside a dumps to the snapshot directory")
    t.add_argument("--dir", default=None, help="where to record (default: a fresh temporary directory, kept)")
    args = ap.parse_args(argv)
    if args.cmd == "serve":
        serve()
        return 0
    root = args.dir or tempfile.mkdtemp(prefix=f"crash-{args.kind}-{args.seed}-")
    server = Server()
    try:
        spec = trial_spec(args.kind, args.seed, root, args.mode, args.durable, args.window)
        res = server.run(spec, kill_after=timer_kill(args.kind, args.seed) if args.mode == "timer" else None)
    finally:
        server.close()
    print("\n".join(res["lines"]))
    print("exit:", res["exit"])
    problems = verify(make_plan(args.kind, args.seed), spec["main"], spec["snap"], res)
    print(f"directories kept under {root}")
    print("\n".join(problems) if problems else "OK: every promise held")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
