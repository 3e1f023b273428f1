#!/usr/bin/env python
"""Serving a LeRobot dataset to a training loop: lerobot itself against this library, in one run (issue 16).

Data: LeRobot v3.0 datasets written by the real lerobot 0.4.4 (its venv, `scripts/venvs/lerobot.sh`; built by this
script when missing) with lerobot's default video encoding (AV1 libsvtav1, crf 30, GOP 2) at 10 fps, state and action
float32[14], cached under `.bench-data/` (git-ignored):
  pusht   one 96x96 camera (`observation.image`)
  aloha   two 240x320 cameras (`observation.images.top`, `observation.images.wrist`)
Full run: 50 episodes x 200 frames per shape; `--quick`: 10 episodes x 100 frames (the output says so).

Access (ACT / diffusion-policy training): shuffled batches of 64 samples; every `observation.*` key at
delta_timestamps [-0.1, 0.0] (2 frames per camera), `action` at 16 steps [0, 0.1, ..., 1.5], pad masks at episode
edges. Every contender runs in its own process with a torch DataLoader (batch 64, shuffle with the same seeded
generator, drop_last, workers 0 and 2); samples/s is measured after the first batch over at least `--batches`
batches and `--min-seconds` seconds (default 30 and 10 s, quick 4 and 2 s; the sampler runs epoch after epoch).

Contenders:
  (a) lerobot     `LeRobotDataset(root, delta_timestamps=...)` + DataLoader, in the lerobot venv
                  (`_lerobot_driver.py`); frames come as float32 CHW, as lerobot hands them to training
  (b) in-place    `LeRobotAsUniEnvDataset` on the same folder + `LeRobotWindows` (uint8 HWC, one read per camera
                  per batch) + the same DataLoader, `collate_fn=LeRobotWindows.collate_fn`
  (c) converted   `unienv-data convert --from lerobot` (default layout native-video: the video re-encoded as this
                  library encodes by default) opened as a `ReplayBuffer` + `LeRobotWindows`
  (d) limit       bare PyAV: exactly the frames a batch needs, de-duplicated, sorted per file, decoded forward with
                  containers kept open (seek only when the next frame is more than a GOP ahead or behind), tabular
                  windows by one NumPy gather; the same DataLoader (one process per worker)
With workers, (b), (c) and (d) run under `shared_memory_dataloader` (batches handed over in reused shared-memory
slots, epoch after epoch with persistent workers); (a) under lerobot's usual DataLoader.

Reported per shape and worker count: samples/s, first-batch latency (opening the dataset + the first batch), peak
RSS (the contender's process tree, sampled every 0.1 s); the ratios (b)/(a), (c)/(a), (b)/(d); and the equality
check: the items at fixed anchors (episode starts and ends included) from (a), (b) and (d) must hold bit-equal frames,
equal tabular windows and equal pad masks ((c) is re-encoded, so its frames are compared by PSNR; its tabular windows
and masks must be equal). The last line is
    lerobot ratios: in-place X.XXx converted Y.YYx limit Z.ZZx
the worst (b)/(a), (c)/(a) and (b)/(d) over the shapes and worker counts that ran.

Usage:  python bench/bench_lerobot.py [--quick] [--shapes pusht,aloha] [--workers 0,2] [--batches N] [--min-seconds S]
        [--lerobot-python PATH] [--json PATH]
"""
from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, Dict, List, Optional, Tuple  # noqa: E402

import numpy as np  # noqa: E402

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "src"))
DATA = ROOT / ".bench-data"
DRIVER = HERE / "_lerobot_driver.py"
FPS = 10
BATCH = 64
OBS_OFFSETS = [-1, 0]
ACTION_OFFSETS = list(range(16))
CONTENDERS = ("a", "b", "c", "d")
NAMES = {"a": "lerobot", "b": "in-place", "c": "converted", "d": "limit"}


# ------------------------------------------------------------------------------------------------ data
def lerobot_python(given: Optional[str]) -> str:
    if given:
        return given
    for cand in (ROOT / ".venvs" / "lerobot" / "bin" / "python", Path(os.environ.get("LEROBOT_PYTHON", "/nonexistent"))):
        if cand.exists():
            return str(cand)
    print("building the lerobot venv (scripts/build_venvs.sh lerobot) ...", flush=True)
    subprocess.run(["bash", str(ROOT / "scripts" / "build_venvs.sh"), "lerobot"], cwd=ROOT, check=True)
    return str(ROOT / ".venvs" / "lerobot" / "bin" / "python")


def dataset(py: str, shape: str, episodes: int, frames: int) -> Path:
    root = DATA / f"{shape}-{episodes}x{frames}"
    if not (root / ".complete").exists():
        print(f"writing {root.name} with lerobot (AV1 libsvtav1 crf 30 GOP 2) ...", flush=True)
        root.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([py, str(DRIVER), "write", str(root), shape, str(episodes), str(frames)], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        (root / ".complete").write_text("ok\n")
    return root


def converted(root: Path) -> Path:
    dst = root.parent / (root.name + "-native")
    if not (dst / ".complete").exists():
        print(f"converting {root.name} (unienv-data convert --from lerobot) ...", flush=True)
        if dst.exists():
            shutil.rmtree(dst)
        code = "import sys; from unienv_data.cli import main; sys.exit(main())"
        env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
        subprocess.run([sys.executable, "-c", code, "convert", str(root), str(dst), "--from", "lerobot"], check=True,
                       stdout=subprocess.DEVNULL, env=env)
        (dst / ".complete").write_text("ok\n")
    return dst


def check_anchors(episodes: int, frames: int) -> List[int]:
    """Episode starts and ends (pads on both sides) and a few inside, in a fixed order."""
    rows = [0, 1, frames - 1, frames - 8, frames, frames + 1, 2 * frames - 1, episodes * frames - 1,
            episodes * frames - 16, (episodes // 2) * frames + frames // 2]
    rng = np.random.default_rng(7)
    rows += rng.integers(0, episodes * frames, 6).tolist()
    return [int(r) for r in rows]


# ------------------------------------------------------------------------------------------------ RSS
def _tree_rss(pid: int) -> int:
    kids: Dict[int, List[int]] = {}
    rss: Dict[int, int] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                parts = f.read().rsplit(")", 1)[1].split()
            kids.setdefault(int(parts[1]), []).append(int(d))
            rss[int(d)] = int(parts[21]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, IndexError, ValueError):
            pass
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        total += rss.get(p, 0)
        todo.extend(kids.get(p, []))
    return total


def run_measured(cmd: List[str], env: Optional[Dict[str, str]] = None) -> Tuple[Dict[str, Any], int]:
    """Runs `cmd` (prints one JSON line last), sampling its process tree's RSS; returns (json, peak RSS bytes)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    peak = [0]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _tree_rss(proc.pid))
            done.wait(0.1)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    out, err = proc.communicate()
    done.set()
    t.join()
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:4])} ... failed ({proc.returncode}):\n{err[-3000:]}")
    lines = [ln for ln in out.strip().splitlines() if ln.startswith("{")]
    return json.loads(lines[-1]), peak[0]


# ------------------------------------------------------------------------------------------------ contenders
class BareDecode:
    """(d): bare PyAV decoding of exactly the frames a batch needs, plus NumPy window gathers (its own parsing of the
    LeRobot v3.0 metadata: nothing of this library)."""

    def __init__(self, root: str) -> None:
        import pyarrow.parquet as pq
        info = json.loads((Path(root) / "meta" / "info.json").read_text())
        self.root = root
        self.fps = info["fps"]
        self.cams = [k for k, v in info["features"].items() if v["dtype"] == "video"]
        self.hwc = {k: tuple(info["features"][k]["shape"]) for k in self.cams}
        obs = [k for k in info["features"] if k.startswith("observation.")]
        self.offsets = {k: np.asarray(OBS_OFFSETS) for k in obs}
        self.offsets["action"] = np.asarray(ACTION_OFFSETS)
        eps = pq.read_table(sorted((Path(root) / "meta" / "episodes").rglob("*.parquet"))).to_pylist()
        eps.sort(key=lambda e: e["dataset_from_index"])
        n = eps[-1]["dataset_to_index"]
        self.n = n
        self.start = np.empty(n, np.int64)
        self.end = np.empty(n, np.int64)
        self.ep = np.empty(n, np.int64)
        self.file_of: Dict[str, np.ndarray] = {k: np.empty(n, np.int64) for k in self.cams}
        self.frame_of: Dict[str, np.ndarray] = {k: np.empty(n, np.int64) for k in self.cams}
        self.paths: Dict[str, List[str]] = {k: [] for k in self.cams}
        vpath = info["video_path"]
        for e in eps:
            s, t = e["dataset_from_index"], e["dataset_to_index"]
            self.start[s:t], self.end[s:t], self.ep[s:t] = s, t, e["episode_index"]
            for k in self.cams:
                p = os.path.join(root, vpath.format(video_key=k, chunk_index=e[f"videos/{k}/chunk_index"],
                                                    file_index=e[f"videos/{k}/file_index"]))
                if p not in self.paths[k]:
                    self.paths[k].append(p)
                self.file_of[k][s:t] = self.paths[k].index(p)
                first = int(round(e[f"videos/{k}/from_timestamp"] * self.fps))
                self.frame_of[k][s:t] = first + np.arange(t - s)
        data = pq.read_table(sorted((Path(root) / "data").rglob("*.parquet")),
                             columns=[k for k in self.offsets if k not in self.cams]).to_pydict()
        self.tables = {k: np.asarray(v, np.float32) for k, v in data.items()}
        self._open: Dict[Tuple[str, int], Any] = {}
        self._pid = os.getpid()
        self._rf: Any = None

    def __len__(self) -> int:
        return self.n

    def __getitems__(self, idx: Any) -> Dict[str, np.ndarray]:
        return self.get_batch(np.asarray(idx, np.int64))

    def get_batch(self, a: np.ndarray) -> Dict[str, np.ndarray]:
        out: Dict[str, np.ndarray] = {}
        for k, offs in self.offsets.items():
            f = a[:, None] + offs[None, :]
            s, e = self.start[a][:, None], self.end[a][:, None]
            rows = np.clip(f, s, e - 1)
            out[k + "_is_pad"] = (f < s) | (f >= e)
            if k in self.cams:
                uniq, inv = np.unique(rows.reshape(-1), return_inverse=True)
                frames = np.empty((uniq.size,) + self.hwc[k], np.uint8)
                self._decode(k, uniq, frames)
                out[k] = frames[inv.reshape(rows.shape)]
            else:
                out[k] = self.tables[k][rows]
        out["index"] = a
        return out

    def _decode(self, cam: str, rows: np.ndarray, dst: np.ndarray) -> None:
        import av
        if self._pid != os.getpid() or self._rf is None:
            self._open, self._pid = {}, os.getpid()
            self._rf = av.video.reformatter.VideoReformatter()
        fid, fr = self.file_of[cam][rows], self.frame_of[cam][rows]
        order = np.lexsort((fr, fid))
        for f in np.unique(fid).tolist():
            sel = order[fid[order] == f]
            st = self._open.get((cam, f))
            if st is None:
                c = av.open(self.paths[cam][f])
                s = c.streams.video[0]
                s.codec_context.thread_count = 1  # no frame-thread delay to flush at every seek
                scale = float(s.time_base * self.fps)
                keys = np.unique([int(round(p.pts * scale)) for p in c.demux(s) if p.pts is not None and p.is_keyframe])
                st = self._open[(cam, f)] = {"c": c, "s": s, "it": None, "last": -10**9, "scale": scale,
                                             "keys": keys}
            for j in sel.tolist():
                k = int(fr[j])
                # forward from the last decoded frame unless a keyframe lies in between (then seek to the one before k)
                kb = st["keys"][np.searchsorted(st["keys"], k, side="right") - 1]
                if st["it"] is None or not (kb <= st["last"] < k):
                    st["c"].seek(int(round(kb / st["scale"])), stream=st["s"], backward=True)
                    st["it"] = st["c"].decode(st["s"])
                while True:
                    frame = next(st["it"])
                    idx = int(round(frame.pts * st["scale"]))
                    st["last"] = idx
                    if idx == k:
                        break
                # one reused converter (a new one per frame, as `to_ndarray(format=...)` makes, costs more than decoding)
                dst[j] = self._rf.reformat(frame, format="rgb24", threads=1).to_ndarray()


def contender_main(which: str, path: str, plan: Dict[str, Any], out_npz: str) -> None:
    t_start = time.perf_counter()
    import torch
    from unienv_interface.backends.numpy import NumpyComputeBackend
    from unienv_data.integrations.lerobot_windows import LeRobotWindows
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    src: Any = None
    if which == "d":
        ds: Any = BareDecode(path)
        collate = LeRobotWindows.collate_fn
    else:
        if which == "b":
            from unienv_data.integrations.lerobot import LeRobotAsUniEnvDataset
            src = LeRobotAsUniEnvDataset.from_local(path, NumpyComputeBackend)
        else:
            from unienv_data.replay_buffer import ReplayBuffer
            src = ReplayBuffer.load_from(path, backend=NumpyComputeBackend)
        keys = [k for k in src.single_space.spaces if k.startswith("observation.")]
        windows = {k: OBS_OFFSETS for k in keys}
        windows["action"] = ACTION_OFFSETS
        ds = LeRobotWindows(src, windows)
        collate = LeRobotWindows.collate_fn
    open_s = time.perf_counter() - t0
    check = {}
    if plan["check"]:
        check = {k: v for k, v in ds.get_batch(np.asarray(plan["check"], np.int64)).items()
                 if k not in ("index", "episode_index")}
    t0 = time.perf_counter()
    w = plan["workers"]
    if w:
        # workers hand batches over in reused shared-memory slots (a fresh 59 MB segment per aloha batch capped 2
        # workers below the single process); shuffled without replacement, epoch after epoch
        from unienv_data.integrations.torch_loader import shared_memory_dataloader
        loader: Any = shared_memory_dataloader(ds, plan["batch_size"], shuffle=True, drop_last=True, seed=plan["seed"],
                                               num_workers=w, prefetch_factor=2, persistent_workers=True)

        def epochs() -> Any:
            while True:
                yield from loader
        it = epochs()
    else:
        gen = torch.Generator().manual_seed(plan["seed"])
        # shuffled without replacement, epoch after epoch (the timing runs for a minimum time, not one epoch)
        sampler = torch.utils.data.RandomSampler(ds, num_samples=plan["batch_size"] * plan["max_batches"],
                                                 generator=gen)
        loader = torch.utils.data.DataLoader(ds, batch_size=plan["batch_size"], sampler=sampler, num_workers=0,
                                             drop_last=True, collate_fn=collate)
        it = iter(loader)
    batch = next(it)
    first = time.perf_counter() - t0 + open_s
    t1 = time.perf_counter()
    n = 0
    batches = 0
    while batches < plan["batches"] or (time.perf_counter() - t1 < plan["min_seconds"] and
                                        batches < plan["max_batches"] - 1):
        batch = next(it)
        n += batch["action"].shape[0]
        batches += 1
    run_s = time.perf_counter() - t1
    del it, loader
    np.savez(out_npz, **check)
    print(json.dumps({"batches": batches, "samples_per_s": n / run_s, "first_batch_s": first, "setup_s": t0 - t_start}))


# ------------------------------------------------------------------------------------------------ the run
def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return float("inf") if mse == 0 else 10 * np.log10(255.0 ** 2 / mse)


def compare(results: Dict[str, Dict[str, np.ndarray]], cams: List[str]) -> List[str]:
    """Problems found between the check items of (a), (b), (d) (exact) and (c) (tabular exact, frames by PSNR)."""
    problems: List[str] = []
    ref = results["a"]
    for c in ("b", "d", "c"):
        got = results.get(c)
        if got is None:
            continue
        for k, v in ref.items():
            if k not in got:
                problems.append(f"({c}) lacks {k}")
                continue
            g = got[k]
            if k in cams and c == "c":
                if g.shape != v.shape:
                    problems.append(f"({c}) {k}: shape {g.shape} != {v.shape}")
                else:
                    p = psnr(g, v)
                    if p < 30:
                        problems.append(f"({c}) {k}: PSNR {p:.1f} dB against lerobot's frames (< 30 dB)")
                continue
            if g.shape != v.shape or not np.array_equal(g, v):
                diff = "shape" if g.shape != v.shape else f"{int(np.sum(g != v))} values differ"
                problems.append(f"({c}) {k}: not equal to lerobot's ({diff})")
    return problems


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="10 episodes x 100 frames, fewer batches")
    ap.add_argument("--shapes", default="pusht,aloha")
    ap.add_argument("--workers", default="0,2")
    ap.add_argument("--batches", type=int, default=None, help="timed batches after the first (default 30, quick 4)")
    ap.add_argument("--min-seconds", type=float, default=None,
                    help="keep timing batches until this many seconds passed (default 10, quick 2)")
    ap.add_argument("--contenders", default="a,b,c,d")
    ap.add_argument("--lerobot-python", default=None)
    ap.add_argument("--json", default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--_contender", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--_path", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--_plan", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--_out", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args._contender:
        contender_main(args._contender, args._path, json.loads(Path(args._plan).read_text()), args._out)
        return
    episodes, frames = (10, 100) if args.quick else (50, 200)
    batches = args.batches or (4 if args.quick else 30)
    min_seconds = args.min_seconds if args.min_seconds is not None else (2.0 if args.quick else 10.0)
    shapes = [s for s in args.shapes.split(",") if s]
    workers = [int(w) for w in args.workers.split(",") if w]
    which = [c for c in args.contenders.split(",") if c]
    py = lerobot_python(args.lerobot_python)
    t_all = time.perf_counter()
    print(f"bench_lerobot: {'QUICK: ' if args.quick else ''}{episodes} episodes x {frames} frames at {FPS} fps per "
          f"shape, batch {BATCH}, at least {batches} timed batches and {min_seconds:g} s; load: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} "
          f"{os.getloadavg()[2]:.2f} on {os.cpu_count()} cores", flush=True)
    rows: List[Dict[str, Any]] = []
    problems_all: Dict[str, List[str]] = {}
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    lerobot_env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    lerobot_env.pop("PYTHONPATH", None)
    tmp = Path(tempfile.mkdtemp(prefix="bench-lerobot-"))
    try:
        for shape in shapes:
            root = dataset(py, shape, episodes, frames)
            conv = converted(root) if "c" in which else None
            info = json.loads((root / "meta" / "info.json").read_text())
            cams = [k for k, v in info["features"].items() if v["dtype"] == "video"]
            for w in workers:
                checks: Dict[str, Dict[str, np.ndarray]] = {}
                for c in which:
                    plan = {"workers": w, "batches": batches, "batch_size": BATCH, "seed": args.seed,
                            "min_seconds": min_seconds, "max_batches": 400,
                            "check": check_anchors(episodes, frames) if w == workers[0] else [],
                            "obs_offsets": OBS_OFFSETS, "action_offsets": ACTION_OFFSETS,
                            "repo_id": f"bench/{shape}"}
                    pf, of = tmp / f"plan-{c}.json", tmp / f"out-{c}.npz"
                    pf.write_text(json.dumps(plan))
                    if c == "a":
                        cmd = [py, str(DRIVER), "load", str(root), str(pf), str(of)]
                    else:
                        path = str(conv if c == "c" else root)
                        cmd = [sys.executable, str(Path(__file__).resolve()), "--_contender", c, "--_path", path,
                               "--_plan", str(pf), "--_out", str(of)]
                    res, peak = run_measured(cmd, env=env if c != "a" else lerobot_env)
                    row = {"shape": shape, "workers": w, "contender": c, **res, "peak_rss_mb": peak / 2 ** 20}
                    rows.append(row)
                    print(f"  {shape:6s} w={w} ({c}) {NAMES[c]:9s} {res['samples_per_s']:9.1f} samples/s "
                          f"({res['batches']} batches)  first "
                          f"{res['first_batch_s']:6.2f} s  peak RSS {peak / 2 ** 20:7.0f} MiB", flush=True)
                    if plan["check"]:
                        with np.load(of) as z:
                            checks[c] = {k: z[k] for k in z.files}
                if checks and "a" in checks:
                    problems_all[shape] = compare(checks, cams)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    # ---- table and ratios
    print()
    print(f"{'shape':6s} {'workers':>7s} {'contender':12s} {'samples/s':>10s} {'first batch s':>13s} "
          f"{'peak RSS MiB':>12s} {'vs lerobot':>10s}")
    by = {(r["shape"], r["workers"], r["contender"]): r for r in rows}
    worst = {"in-place": float("inf"), "converted": float("inf"), "limit": float("inf")}
    for r in rows:
        a = by.get((r["shape"], r["workers"], "a"))
        ratio = f"{r['samples_per_s'] / a['samples_per_s']:9.2f}x" if a else "-"
        print(f"{r['shape']:6s} {r['workers']:7d} ({r['contender']}) {NAMES[r['contender']]:8s} "
              f"{r['samples_per_s']:10.1f} {r['first_batch_s']:13.2f} {r['peak_rss_mb']:12.0f} {ratio:>10s}")
    for shape in shapes:
        for w in workers:
            g = {c: by.get((shape, w, c)) for c in CONTENDERS}
            parts = []
            for name, num, den in (("in-place", "b", "a"), ("converted", "c", "a"), ("limit", "b", "d")):
                if g[num] and g[den]:
                    v = g[num]["samples_per_s"] / g[den]["samples_per_s"]
                    worst[name] = min(worst[name], v)
                    parts.append(f"({num})/({den}) {v:.2f}x")
            print(f"ratios {shape} w={w}: " + ", ".join(parts))
    for shape, probs in problems_all.items():
        print(f"equality {shape}: " + ("(a), (b), (d) bit-equal frames, equal tabular windows and pad masks; (c) "
                                       "tabular and masks equal, frames within PSNR 30 dB" if not probs
                                       else "PROBLEMS: " + "; ".join(probs)))
    print(f"total {time.perf_counter() - t_all:.0f} s; load after: {os.getloadavg()[0]:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "problems": problems_all}, indent=1))
    fmt = {k: (f"{v:.2f}x" if v != float("inf") else "n/a") for k, v in worst.items()}
    print(f"lerobot ratios: in-place {fmt['in-place']} converted {fmt['converted']} limit {fmt['limit']}")


if __name__ == "__main__":
    main()
