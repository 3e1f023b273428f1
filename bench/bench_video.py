#!/usr/bin/env python
"""VideoStorage against a uint8 memmap, PNG files and the reference `unienv` VideoStorage, in one run.

Data: E episodes x T frames of 128x128x3 uint8 (default 10 x 300, the W2 camera), synthetic but video-like (a
drifting gradient, moving shapes, Gaussian sensor noise sigma 2), from the shared video benchmark's generator
(`../shared/bench/video_bench.py`, `make_frames`) when importable, else a built-in generator of the same kind.

Rows (each one file / directory per row, every row sees the same frames and the same index plan):

  memmap          np.memmap of (N, H, W, 3) uint8: one row assignment per frame, flush per episode; reads gather
  png             one PNG file per frame (Pillow, default compression); reads open every file
  ours-default    VideoStorage.create(space) with its defaults (codec="auto": here libx264 crf 23 veryfast, GOP 10,
                  one non-reference B-frame between anchors)
  ours-x264-g30   VideoStorage, libx264 crf 23 veryfast, keyframe every 30 frames, x264's default 3 B-frames: the
                  reference's settings (shared video benchmark: ref-x264-g30)
  ours-ffv1       VideoStorage, lossless FFV1 in .mkv (every frame a keyframe)
  ours-x264rgb    VideoStorage, lossless libx264rgb qp 0 (GOP 10)
  ref-*           the reference VideoStorage (unienv 0.0.1b16, peer venv), driven by `_video_reference_driver.py`
                  in a subprocess under the peer venv's python: ref-x264-g30 (its settings in the shared
                  benchmark), ref-as-ours-default (the codec, options and GOP ours-default chose in this run),
                  ref-ffv1-g1 (our lossless FFV1 settings), ref-default (its own defaults: codec "auto"; fails on a
                  CPU-only machine)

Operations (both libraries through the storage API; capacity N, one segment per episode):

  encode   mark_segment_start(e*T), append(frame) x T, mark_segment_end(): frames/s per episode, median over the
           episodes. Episodes are interleaved over rows (episode e of every row, then e+1).
  seq      get(slice) of each whole episode: frames/s, median over episodes; PSNR / exactness come from it
  rand     get(idx) for a batch of 256 uniform random indices (same batches for every row): frames/s, median
  slice    get(slice(o, o+64)) at 4 random offsets per repeat (may cross episodes): frames/s, median
  Random batches and slices are interleaved: repeat r of every row, then r+1, the row order reversed on odd
  repeats. The first random batch and slice of every row are checked against the row's own sequential decode.

Targets (issue #3): ours-default rand >= 1.0x png; rand >= 2x the reference at the same settings; slice >= 3x the
row's own rand; encode >= the reference at the same settings; ours-default <= 1% of raw bytes at PSNR >= 31 dB;
lossless rows bit-exact.

Usage:  .venv/bin/python bench/bench_video.py [--quick] [--repeats N] [--rows a,b] [--no-reference]
        [--peer-python PATH] [--json PATH] [--profile]
The reference column is skipped, with a note, when the peer venv is missing
(`bash ../shared/bench/setup_peers.sh` from the project root creates it).
"""
from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from typing import Any, Callable, Dict, List, Optional, Tuple  # noqa: E402

import av  # noqa: E402
import av.logging  # noqa: E402
import numpy as np  # noqa: E402
from PIL import Image  # noqa: E402

from _video_report import render  # noqa: E402  (bench/ is on sys.path when this script runs)
from unienv_data.storages.video_storage import VideoStorage  # noqa: E402
from unienv_interface.backends import NumpyComputeBackend  # noqa: E402
from unienv_interface.space import BoxSpace  # noqa: E402

av.logging.set_level(av.logging.ERROR)

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
HARNESS_DIR = os.environ.get("UNIENV_BENCH_HARNESS", os.path.join(os.path.dirname(REPO), "shared", "bench"))
PEER_PYTHON = os.environ.get("UNIENV_BENCH_PEER_PYTHON", os.path.join(REPO, ".bench-venvs", "unienv", "bin", "python"))
DRIVER = os.path.join(HERE, "_video_reference_driver.py")
SEED = 20240611
H = W = 128
EPISODES, STEPS, QUICK_EPISODES = 10, 300, 2
BATCH, SLICE, SLICES_PER_REPEAT = 256, 64, 4
X264 = {"crf": "23", "preset": "veryfast"}

#: our rows: name -> VideoStorage.create keyword arguments
OURS: Dict[str, Dict[str, Any]] = {
    "ours-default": {},
    "ours-x264-g30": {"codec": "libx264", "gop_size": 30, "encoder_options": dict(X264, g="30", bf="3")},
    "ours-ffv1": {"codec": "ffv1", "lossless": True, "file_ext": "mkv"},
    "ours-x264rgb": {"codec": "libx264rgb", "lossless": True},
}
#: reference rows: name -> its VideoStorage.create keyword arguments
REFERENCE: Dict[str, Dict[str, Any]] = {
    "ref-x264-g30": {"codec": "libx264", "encoder_options": dict(X264, g="30")},
    "ref-as-ours-default": {},  # filled in at run time from the storage of ours-default
    "ref-ffv1-g1": {"codec": "ffv1", "file_ext": "mkv", "file_pixel_format": "bgr0", "encoder_options": {"g": "1"}},
    "ref-default": {},
}
#: our row -> the reference row at the same codec settings
SAME_SETTINGS = {"ours-default": "ref-as-ours-default", "ours-x264-g30": "ref-x264-g30", "ours-ffv1": "ref-ffv1-g1"}
LOSSLESS = ("ours-ffv1", "ours-x264rgb", "ref-ffv1-g1")
ROW_ORDER = ["memmap", "png", *OURS, *REFERENCE]


# ---------------------------------------------------------------------------------------------- data
def _builtin_frames(episodes: int, steps: int, seed: int) -> np.ndarray:
    """Video-like frames without the shared generator: a drifting gradient, bouncing squares, noise sigma 2."""
    rng = np.random.default_rng([seed, episodes, steps])
    yy, xx = np.mgrid[0:H, 0:W].astype(np.float32)
    out = np.empty((episodes * steps, H, W, 3), np.uint8)
    for e in range(episodes):
        c0, c1 = rng.uniform(20, 235, (2, 3)).astype(np.float32)
        pos = rng.uniform(20, 100, (4, 2))
        vel = rng.uniform(-1.2, 1.2, (4, 2))
        cols = rng.uniform(0, 255, (4, 3)).astype(np.float32)
        for t in range(steps):
            g = 0.5 + 0.5 * np.sin(2 * np.pi * (0.6 * (xx + 0.5 * yy) / W + 0.004 * t))
            frame = c0 * (1 - g)[..., None] + c1 * g[..., None]
            for k in range(4):
                y0, x0 = (pos[k] - 10).astype(int)
                frame[max(y0, 0):y0 + 20, max(x0, 0):x0 + 20] = cols[k]
            pos += vel
            bounce = (pos < 10) | (pos > H - 10)
            vel[bounce] *= -1
            pos = np.clip(pos, 10, H - 10)
            out[e * steps + t] = np.clip(frame + rng.normal(0, 2.0, frame.shape), 0, 255).astype(np.uint8)
    return out


def make_frames(episodes: int, steps: int) -> Tuple[np.ndarray, str]:
    path = os.path.join(HARNESS_DIR, "video_bench.py")
    try:
        spec = importlib.util.spec_from_file_location("_shared_video_bench", path)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot load {path}")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        av.logging.set_level(av.logging.ERROR)
        return mod.make_frames(episodes, steps, H, W), f"make_frames() of {path}, seed {mod.SEED}"
    except (ImportError, FileNotFoundError, AttributeError) as exc:
        return _builtin_frames(episodes, steps, SEED), f"built-in generator, seed {SEED} (shared one unavailable: {exc!r})"


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float32) - b.astype(np.float32)) ** 2))
    return math.inf if mse == 0 else 10 * math.log10(255.0 ** 2 / mse)


def dir_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(dp, f)) for dp, _d, fs in os.walk(path) for f in fs
               if not f.endswith(".json"))


# ---------------------------------------------------------------------------------------------- rows
class Row:
    """One contender. `write(e)`, `seq()`, `rand(r)`, `slice(r)` answer dicts with the seconds `s` (and, on the first
    read, `matches`: the frames equal the row's own sequential decode)."""

    def __init__(self, name: str, frames: np.ndarray, steps: int, root: str, rand: np.ndarray, offs: np.ndarray):
        self.name, self.frames, self.T = name, frames, steps
        self.E = frames.shape[0] // steps
        self.dir = os.path.join(root, name)
        self.rand_plan, self.offs = rand, offs
        self.recon: Optional[np.ndarray] = None
        self.checked: set = set()
        self.info: Dict[str, Any] = {}

    # to implement: _create(), _write(e), _get(index), nbytes()
    def create(self) -> Dict[str, Any]:
        self._create()
        return self.info

    def write(self, e: int) -> Dict[str, Any]:
        t0, c0 = time.perf_counter(), time.process_time()
        self._write(e)
        return {"s": time.perf_counter() - t0, "cpu": time.process_time() - c0}

    def seq(self) -> Dict[str, Any]:
        T, times = self.T, []
        recon = np.empty_like(self.frames)
        for e in range(self.E):
            t0 = time.perf_counter()
            out = self._get(slice(e * T, (e + 1) * T))
            times.append(time.perf_counter() - t0)
            recon[e * T:(e + 1) * T] = out
        self.recon = recon
        exact = bool(np.array_equal(recon, self.frames))
        return {"s": times, "exact": exact, "psnr": math.inf if exact else psnr(recon, self.frames)}

    def _check(self, what: str, got: List[np.ndarray], want: List[np.ndarray], res: Dict[str, Any]) -> None:
        if what not in self.checked and self.recon is not None:
            self.checked.add(what)
            res["matches"] = all(bool(np.array_equal(g, w)) for g, w in zip(got, want))

    def rand(self, r: int) -> Dict[str, Any]:
        idx = self.rand_plan[r]
        t0, c0 = time.perf_counter(), time.process_time()
        out = self._get(idx)
        res: Dict[str, Any] = {"s": time.perf_counter() - t0, "cpu": time.process_time() - c0}
        if self.recon is not None:
            self._check("rand", [out], [self.recon[idx]], res)
        return res

    def slice(self, r: int) -> Dict[str, Any]:
        offs = [int(o) for o in self.offs[r]]
        t0, c0 = time.perf_counter(), time.process_time()
        outs = [self._get(slice(o, o + SLICE)) for o in offs]
        res: Dict[str, Any] = {"s": time.perf_counter() - t0, "cpu": time.process_time() - c0}
        if self.recon is not None:
            self._check("slice", outs, [self.recon[o:o + SLICE] for o in offs], res)
        return res

    def size(self) -> Dict[str, Any]:
        return {"bytes": self.nbytes()}

    def close(self) -> None:
        pass

    def _create(self) -> None:
        raise NotImplementedError

    def _write(self, e: int) -> None:
        raise NotImplementedError

    def _get(self, index: Any) -> np.ndarray:
        raise NotImplementedError

    def nbytes(self) -> int:
        return dir_bytes(self.dir)


class MemmapRow(Row):
    def _create(self) -> None:
        os.makedirs(self.dir)
        self.mm = np.memmap(os.path.join(self.dir, "frames.u8"), np.uint8, "w+", shape=self.frames.shape)

    def _write(self, e: int) -> None:
        for i in range(e * self.T, (e + 1) * self.T):
            self.mm[i] = self.frames[i]
        self.mm.flush()

    def _get(self, index: Any) -> np.ndarray:
        return np.array(self.mm[index])


class PngRow(Row):
    def _create(self) -> None:
        os.makedirs(self.dir)

    def _path(self, i: int) -> str:
        return os.path.join(self.dir, f"{i}.png")

    def _write(self, e: int) -> None:
        for i in range(e * self.T, (e + 1) * self.T):
            Image.fromarray(self.frames[i]).save(self._path(i), format="PNG")

    def _get(self, index: Any) -> np.ndarray:
        ids = range(*index.indices(self.frames.shape[0])) if isinstance(index, slice) else np.asarray(index).tolist()
        out = np.empty((len(ids), H, W, 3), np.uint8)
        for j, i in enumerate(ids):
            with Image.open(self._path(i)) as im:
                out[j] = np.asarray(im)
        return out


class OursRow(Row):
    def _create(self) -> None:
        space = BoxSpace(NumpyComputeBackend, 0, 255, np.uint8, shape=(H, W, 3))
        self.st = VideoStorage.create(space, capacity=self.frames.shape[0], cache_path=self.dir, **OURS[self.name])
        self.info = {"codec": self.st.codec, "gop": self.st.gop_size, "pix_fmt": self.st.file_pixel_format,
                     "options": self.st.encoder_options}

    def _write(self, e: int) -> None:
        st, src = self.st, self.frames
        st.mark_segment_start(e * self.T)
        for i in range(e * self.T, (e + 1) * self.T):
            st.append(src[i])
        st.mark_segment_end()

    def _get(self, index: Any) -> np.ndarray:
        return self.st.get(index)

    def close(self) -> None:
        self.st.close()


class ReferenceDriver:
    """The reference VideoStorage in a subprocess under the peer venv's python (one process for every ref row)."""

    def __init__(self, python: str, root: str, frames_path: str, plan_path: str, episodes: int, steps: int) -> None:
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
        self.log_path = os.path.join(root, "reference-driver.log")
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen([python, DRIVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self._log, text=True, env=env, cwd=root)
        self.info = self.call("init", frames=frames_path, episodes=episodes, steps=steps, plan=plan_path,
                              root=os.path.join(root, "ref"), slice=SLICE)

    def call(self, op: str, **kw: Any) -> Dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(dict(kw, op=op)) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            self._log.flush()
            with open(self.log_path) as f:
                tail = f.read()[-2000:]
            raise RuntimeError(f"reference driver exited during {op!r}; its stderr ends with:\n{tail}")
        res: Dict[str, Any] = json.loads(line)
        return res

    def close(self) -> None:
        try:
            self.call("close")
        except (RuntimeError, OSError, ValueError):
            pass
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self._log.close()


class RefRow(Row):
    """A reference row: every operation runs (and is timed) in the driver process."""

    driver: ReferenceDriver

    settings: Dict[str, Any] = {}

    def create(self) -> Dict[str, Any]:
        res = self.driver.call("create", row=self.name, kwargs=self.settings)
        return dict(res, kwargs=self.settings)

    def write(self, e: int) -> Dict[str, Any]:
        return self.driver.call("write", row=self.name, episode=e)

    def seq(self) -> Dict[str, Any]:
        return self.driver.call("seq", row=self.name)

    def rand(self, r: int) -> Dict[str, Any]:
        return self.driver.call("rand", row=self.name, r=r)

    def slice(self, r: int) -> Dict[str, Any]:
        return self.driver.call("slice", row=self.name, r=r)

    def size(self) -> Dict[str, Any]:
        return self.driver.call("size", row=self.name)


# ---------------------------------------------------------------------------------------------- run
def med(xs: List[float]) -> float:
    return statistics.median(xs) if xs else math.nan


def run(args: argparse.Namespace, log: Callable[[str], None]) -> Dict[str, Any]:
    episodes = args.episodes or (QUICK_EPISODES if args.quick else EPISODES)
    repeats = 2 if args.quick and not args.repeats else (args.repeats or 9)
    frames, source = make_frames(episodes, STEPS)
    n = frames.shape[0]
    rng = np.random.default_rng([SEED, H, 7])
    rand = rng.integers(0, n, size=(repeats, BATCH), dtype=np.int64)
    offs = rng.integers(0, n - SLICE + 1, size=(repeats, SLICES_PER_REPEAT), dtype=np.int64)
    log(f"data: {episodes} x {STEPS} frames of {H}x{W}x3 ({frames.nbytes / 1e6:.1f} MB raw) from {source}")
    names = [r for r in ROW_ORDER if r in args.rows] if args.rows else list(ROW_ORDER)
    root = tempfile.mkdtemp(prefix="bench-video-")
    out: Dict[str, Any] = {"protocol": {"episodes": episodes, "steps": STEPS, "repeats": repeats, "batch": BATCH,
                                        "slice": SLICE, "slices_per_repeat": SLICES_PER_REPEAT, "data": source,
                                        "raw_bytes": int(frames.nbytes), "frame": [H, W]},
                           "same_settings": SAME_SETTINGS, "lossless": list(LOSSLESS),
                           "env": {"av": av.__version__, "numpy": np.__version__, "cpus": os.cpu_count(),
                                   "loadavg_start": os.getloadavg()}, "rows": {}, "notes": []}
    driver: Optional[ReferenceDriver] = None
    try:
        refs = [r for r in names if r in REFERENCE]
        if refs and args.no_reference:
            out["notes"].append("reference rows skipped (--no-reference)")
            names = [r for r in names if r not in REFERENCE]
        elif refs and not os.path.exists(args.peer_python):
            out["notes"].append(f"reference rows skipped: no peer venv python at {args.peer_python} "
                                "(create it with `bash ../shared/bench/setup_peers.sh` from the project root)")
            names = [r for r in names if r not in REFERENCE]
        elif refs:
            np.save(os.path.join(root, "frames.npy"), frames)
            np.savez(os.path.join(root, "plan.npz"), rand=rand, offs=offs)
            driver = ReferenceDriver(args.peer_python, root, os.path.join(root, "frames.npy"),
                                     os.path.join(root, "plan.npz"), episodes, STEPS)
            out["env"]["reference"] = driver.info
            log(f"reference driver: {driver.info}")
        kinds = {"memmap": MemmapRow, "png": PngRow, **{k: OursRow for k in OURS}, **{k: RefRow for k in REFERENCE}}
        rows: List[Row] = []
        for name in names:
            row = kinds[name](name, frames, STEPS, root, rand, offs)
            if isinstance(row, RefRow) and driver is not None:
                row.driver = driver
                row.settings = REFERENCE[name]
                if name == "ref-as-ours-default":
                    dflt = out["rows"].get("ours-default", {}).get("config") or {}
                    if "codec" not in dflt:
                        out["notes"].append(f"{name} skipped: it copies the settings of ours-default, not run")
                        continue
                    row.settings = {"codec": dflt["codec"],
                                    "encoder_options": dict(dflt["options"], g=str(dflt["gop"]))}
                    if dflt.get("pix_fmt") and dflt["pix_fmt"] != "yuv420p":
                        row.settings["file_pixel_format"] = dflt["pix_fmt"]
            rec: Dict[str, Any] = {"kind": "reference" if name in REFERENCE else ("ours" if name in OURS else "anchor")}
            out["rows"][name] = rec
            try:
                cfg = row.create()
            except Exception as exc:  # noqa: BLE001 - reported in the table
                cfg = {"error": f"{type(exc).__name__}: {exc}"}
            rec["config"] = cfg
            if "error" in cfg:
                rec["error"] = cfg["error"]
                log(f"  {name:18s} create FAILED: {rec['error'][:160]}")
                continue
            rows.append(row)
        # ---- encode: episode e of every row, then e + 1
        times: Dict[str, List[float]] = {r.name: [] for r in rows}
        cpus: Dict[str, List[float]] = {r.name: [] for r in rows}
        for e in range(episodes):
            for row in (rows if e % 2 == 0 else rows[::-1]):
                if "error" in out["rows"][row.name]:
                    continue
                took = row.write(e)
                if "error" in took:
                    out["rows"][row.name]["error"] = took["error"]
                    log(f"  {row.name:18s} write FAILED: {took['error'][:160]}")
                    continue
                times[row.name].append(float(took["s"]))
                cpus[row.name].append(float(took["cpu"]))
        rows = [r for r in rows if "error" not in out["rows"][r.name]]
        for row in rows:
            res = out["rows"][row.name]
            res["encode_fps"] = STEPS / med(times[row.name])
            res["encode_cpu_fps"] = STEPS / med(cpus[row.name])
            res["encode_s_samples"] = [round(t, 4) for t in times[row.name]]
            res["bytes"] = int(row.size()["bytes"])
            res["bytes_ratio"] = res["bytes"] / frames.nbytes
        log("  encode " + "  ".join(f"{r.name}={out['rows'][r.name]['encode_fps']:.0f}" for r in rows))
        # ---- sequential decode (quality, exactness, the reference frames for the read checks)
        for row in rows:
            sq = row.seq()
            res = out["rows"][row.name]
            if "error" in sq:
                raise RuntimeError(f"{row.name} seq: {sq['error']}")
            res.update(seq_fps=STEPS / med(sq["s"]), exact=sq["exact"], psnr=sq["psnr"])
        log("  seq    " + "  ".join(f"{r.name}={out['rows'][r.name]['seq_fps']:.0f}" for r in rows))
        # ---- random batches and slices, interleaved per repeat
        samples: Dict[Tuple[str, str], List[float]] = {}
        for r in range(repeats):
            for row in (rows if r % 2 == 0 else rows[::-1]):
                res = out["rows"][row.name]
                for what, fn, count in (("rand", row.rand, BATCH), ("slice", row.slice, SLICE * SLICES_PER_REPEAT)):
                    got = fn(r)
                    if "error" in got:
                        raise RuntimeError(f"{row.name} {what}: {got['error']}")
                    samples.setdefault((row.name, what), []).append(count / got["s"])
                    samples.setdefault((row.name, what + "_cpu"), []).append(count / max(got["cpu"], 1e-6))
                    if "matches" in got:
                        res[f"{what}_matches_seq"] = got["matches"]
        for row in rows:
            res = out["rows"][row.name]
            for what in ("rand", "slice"):
                xs = samples[(row.name, what)]
                res[f"{what}_fps"] = med(xs)
                res[f"{what}_fps_samples"] = [round(x, 1) for x in xs]
                res[f"{what}_spread"] = (max(xs) - min(xs)) / med(xs) if xs else math.nan
                res[f"{what}_cpu_fps"] = med(samples[(row.name, what + "_cpu")])
        if args.profile and "ours-default" in [r.name for r in rows]:
            out["profile"] = profile_reads(next(r for r in rows if r.name == "ours-default"), repeats)
        for row in rows:
            row.close()
    finally:
        if driver is not None:
            driver.close()
        shutil.rmtree(root, ignore_errors=True)
    out["env"]["loadavg_end"] = os.getloadavg()
    return out


def profile_reads(row: Row, repeats: int) -> str:
    import cProfile
    import io
    import pstats
    prof = cProfile.Profile()
    prof.enable()
    for r in range(repeats):
        row.rand(r)
    prof.disable()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(18)
    return buf.getvalue()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help=f"{QUICK_EPISODES} episodes, 2 repeats (smoke run)")
    ap.add_argument("--episodes", type=int, default=0, help=f"episodes of {STEPS} frames (default {EPISODES})")
    ap.add_argument("--repeats", type=int, default=0, help="random-batch / slice repeats (default 9; --quick 2)")
    ap.add_argument("--rows", type=lambda s: [x for x in s.split(",") if x], default=None,
                    help="comma-separated subset of: " + ",".join(ROW_ORDER))
    ap.add_argument("--no-reference", action="store_true", help="skip the reference rows")
    ap.add_argument("--peer-python", default=PEER_PYTHON, help="python of the peer venv with unienv installed")
    ap.add_argument("--json", default=None, help="write every sample, median and target to this file")
    ap.add_argument("--profile", action="store_true", help="cProfile of ours-default random batches after the table")
    args = ap.parse_args()
    if args.rows:
        unknown = [r for r in args.rows if r not in ROW_ORDER]
        if unknown:
            ap.error(f"unknown rows {unknown}; choose from {ROW_ORDER}")
    t_start = time.perf_counter()

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - t_start:6.1f}s] {msg}", flush=True)

    out = run(args, log)
    out["total_s"] = time.perf_counter() - t_start
    print(render(out))
    if "profile" in out:
        print(out["profile"])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1, default=str)
    log(f"done in {out['total_s']:.0f}s")


if __name__ == "__main__":
    main()
