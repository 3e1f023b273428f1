"""`unienv-data demo`: record synthetic robot episodes with the native layout, reopen, sample, summarise.

The dataset is a `ReplayBuffer` directory (so `info` / `verify` / `plot` / `convert` open it without code) over a
`DictStorage` in the native layout (`unienv_data.storages.native_layout`): the float32 leaves share one flat row,
the int16 and bool leaves keep their dtype, and the 64x64 camera frames sit in their own uint8 array storage or,
with `--video`, in a `VideoStorage`. When the native layout cannot be imported the demo falls back to a
`FlattenedStorage` for the low-dimensional keys next to an array storage for the frames (and says so).

The scene: a coloured disc (the robot) on a tiled floor steers toward a dark goal ring; an episode ends when
the disc reaches the goal (`terminated`) or after `--steps` steps (`truncated`), so episode lengths differ.
"""
from __future__ import annotations

import argparse
import colorsys
import os
import sys
import time
import warnings
from typing import Any, Dict, Iterator, List, Optional, Tuple

import numpy as np

from ._common import CLIError, Progress, add_output_flags, human_bytes, prepare_output_dir, print_json, rate, table

#: what an earlier demo run leaves in its directory (cleared before a new run)
DEMO_ENTRIES = {"metadata.json", "storage", "storage.memmap", "preview.png", "plots", "dataset", "checksums.sha256"}


def add_parser(sub: Any) -> None:
    p = sub.add_parser("demo", help="record a synthetic robot dataset, reopen it, sample it, summarise it",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, metavar="DIR", help="directory to write the dataset into (replaced if an "
                   "earlier demo wrote it)")
    p.add_argument("--episodes", type=int, default=12, help="episodes to record (default 12)")
    p.add_argument("--steps", type=int, default=100, help="maximum steps per episode (default 100)")
    p.add_argument("--video", action="store_true", help="store camera frames as video (VideoStorage, lossy H.264 "
                   "by default) instead of a uint8 array")
    p.add_argument("--lossless", action="store_true", help="with --video: a lossless codec (frames read back exactly)")
    p.add_argument("--image-size", type=int, default=64, help="camera frame height and width (default 64)")
    p.add_argument("--capacity", type=int, default=None,
                   help="ring capacity in steps (default: none, the dataset grows; a smaller one makes the ring wrap)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--backend", choices=("auto", "numpy", "pytorch"), default="auto",
                   help="array library (default: PyTorch when installed, else NumPy)")
    p.add_argument("--force", action="store_true", help="replace --out even if it holds other files")
    add_output_flags(p)
    p.set_defaults(run=run)


# ---------------------------------------------------------------------------------------------------- the scene
class Scene:
    """Renders a disc at `pos` and a goal ring (with a centre dot) at `goal` (both in [-1, 1]^2) on a tiled floor."""

    def __init__(self, size: int = 64) -> None:
        if size < 16:
            raise CLIError(f"--image-size must be at least 16, got {size}")
        self.size = size
        yy, xx = np.mgrid[0:size, 0:size].astype(np.float32)
        self.xx, self.yy = xx, yy
        tile = max(4, size // 8)
        checker = ((xx // tile + yy // tile) % 2).astype(np.float32)
        shade = 1.0 - 0.15 * (yy / size)                       # a little darker toward the bottom
        base = np.array([232, 226, 212], np.float32) - 18 * checker[..., None]
        self.floor = np.clip(base * shade[..., None], 0, 255).astype(np.uint8)
        self.radius = max(2.0, size / 12)

    def _px(self, p: np.ndarray) -> Tuple[float, float]:
        return float((p[0] + 1) * 0.5 * (self.size - 1)), float((1 - p[1]) * 0.5 * (self.size - 1))

    def render(self, pos: np.ndarray, goal: np.ndarray, color: Tuple[int, int, int]) -> np.ndarray:
        img = self.floor.copy()
        gx, gy = self._px(goal)
        dg = np.sqrt((self.xx - gx) ** 2 + (self.yy - gy) ** 2)
        r = self.radius
        img[(dg >= r * 1.15) & (dg <= r * 1.6)] = (35, 35, 35)
        img[dg <= r * 0.35] = (35, 35, 35)
        cx, cy = self._px(pos)
        d = np.sqrt((self.xx - cx) ** 2 + (self.yy - cy) ** 2)
        img[d <= r + 1] = (30, 30, 30)
        img[d <= r] = color
        return img


def episode_color(e: int) -> Tuple[int, int, int]:
    r, g, b = colorsys.hsv_to_rgb((e * 0.618034) % 1.0, 0.8, 0.95)
    return int(r * 255), int(g * 255), int(b * 255)


def episode_steps(rng: np.random.Generator, scene: Scene, max_steps: int, color: Tuple[int, int, int]
                  ) -> Iterator[Dict[str, Any]]:
    """One episode: the disc is steered to the goal by a noisy P-controller."""
    goal = rng.uniform(-0.7, 0.7, 2)
    pos = rng.uniform(-0.85, 0.85, 2)
    while np.linalg.norm(goal - pos) < 0.8:
        pos = rng.uniform(-0.85, 0.85, 2)
    vel = np.zeros(2)
    for t in range(max_steps):
        camera = scene.render(pos, goal, color)
        action = np.clip(2.0 * (goal - pos) - 0.8 * vel + rng.normal(0.0, 0.6, 2), -1.0, 1.0)
        obs_pos, obs_vel = pos.copy(), vel.copy()
        vel = 0.75 * vel + 0.25 * action
        pos = np.clip(pos + 0.05 * vel, -1.0, 1.0)
        dist = float(np.linalg.norm(goal - pos))
        terminated = dist < 0.06
        truncated = (t == max_steps - 1) and not terminated
        yield {
            "obs": {"position": obs_pos.astype(np.float32), "velocity": obs_vel.astype(np.float32),
                    "camera": camera},
            "action": action.astype(np.float32),
            "reward": np.asarray(-dist, dtype=np.float32),
            "gripper_mode": np.asarray(0 if dist > 0.5 else 1 if dist > 0.15 else 2, dtype=np.int16),
            "terminated": np.asarray(terminated),
            "truncated": np.asarray(truncated),
        }
        if terminated:
            return


def build_space(B: Any, size: int) -> Any:
    from unienv_interface.space import BinarySpace, BoxSpace, DictSpace
    f32 = B.dtype_from_name("float32")
    return DictSpace(B, {
        "obs": {"position": BoxSpace(B, -1.0, 1.0, f32, shape=(2,)),
                "velocity": BoxSpace(B, -1.0, 1.0, f32, shape=(2,)),
                "camera": BoxSpace(B, 0, 255, B.dtype_from_name("uint8"), shape=(size, size, 3))},
        "action": BoxSpace(B, -1.0, 1.0, f32, shape=(2,)),
        "reward": BoxSpace(B, -np.inf, np.inf, f32, shape=()),
        "gripper_mode": BoxSpace(B, 0, 2, B.dtype_from_name("int16"), shape=()),
        "terminated": BinarySpace(B, ()),
        "truncated": BinarySpace(B, ()),
    })


def pick_backend(name: str) -> Any:
    if name in ("auto", "pytorch"):
        try:
            from unienv_interface.backends.pytorch import PyTorchComputeBackend
            return PyTorchComputeBackend
        except ImportError:
            if name == "pytorch":
                raise CLIError("--backend pytorch needs PyTorch: pip install 'unienv-storage[torch]'") from None
    from unienv_interface.backends import NumpyComputeBackend
    return NumpyComputeBackend


def choose_layout(space: Any, video: bool, lossless: bool) -> Tuple[str, Any, Dict[str, Any]]:
    """`(description, storage class, ReplayBuffer.create kwargs)`: the native layout, or the fallback."""
    try:
        from unienv_data.storages.dict_storage import DictStorage
        from unienv_data.storages.native_layout import native_layout_kwargs
        video_kwargs = {"lossless": True} if lossless else None
        kwargs = native_layout_kwargs(space, image_storage="video" if video else "array", video_kwargs=video_kwargs)
        return ("native layout (DictStorage: one flat row per dtype group, images in their own "
                f"{'VideoStorage' if video else 'uint8 array storage'})"), DictStorage, kwargs
    except Exception as exc:  # noqa: BLE001 - a missing or broken module: fall back, saying why
        reason = f"{type(exc).__name__}: {exc}"
    if video:
        raise CLIError(f"--video needs the native layout (unienv_data.storages.native_layout), which is unavailable "
                       f"here ({reason})")
    try:
        from unienv_data.storages.dict_storage import DictStorage
        from unienv_data.storages.flattened import FlattenedStorage
        from unienv_data.storages.metadata_routing import backend_array_storage
    except Exception as exc:  # noqa: BLE001
        raise CLIError(f"the demo needs unienv_data.storages.dict_storage; it could not be imported ({exc}; the "
                       f"native layout failed with {reason})") from None
    array_cls = backend_array_storage(space)
    kwargs = {"storage_cls_map": {"obs/camera": array_cls, "*": FlattenedStorage},
              "key_kwargs": {"*": {"inner_storage_cls": array_cls}}}
    return (f"fallback layout (the native layout is unavailable: {reason}): FlattenedStorage for the "
            "low-dimensional keys, a uint8 array storage for the frames"), DictStorage, kwargs


# ---------------------------------------------------------------------------------------------------- the job
def record(out: str, episodes: int, steps: int, video: bool, lossless: bool, size: int, capacity: Optional[int],
           seed: int, B: Any, progress: bool) -> Dict[str, Any]:
    from unienv_data.replay_buffer import ReplayBuffer
    space = build_space(B, size)
    layout, storage_cls, kwargs = choose_layout(space, video, lossless)
    scene = Scene(size)
    rng = np.random.default_rng(seed)
    kept: Dict[int, List[Dict[str, Any]]] = {}
    write_s = 0.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")      # the fallback layout may warn about promotion; the summary says it
        rb = ReplayBuffer.create(storage_cls, space, cache_path=out, capacity=capacity, **kwargs)
    try:
        with Progress(episodes, "recording", "episodes", enabled=progress) as bar:
            for e in range(episodes):
                keep = e in (0, episodes - 1)
                for step in episode_steps(rng, scene, steps, episode_color(e)):
                    t0 = time.perf_counter()
                    rb.append(step)
                    write_s += time.perf_counter() - t0
                    if keep:
                        kept.setdefault(e, []).append(step)
                t0 = time.perf_counter()
                rb.mark_segment_end()
                write_s += time.perf_counter() - t0
                bar.update(1)
        t0 = time.perf_counter()
        rb.dumps()
        write_s += time.perf_counter() - t0
        codec = None
        storage: Any = rb.storage
        if video and hasattr(storage, "get_column"):
            codec = getattr(storage.get_column("obs/camera"), "codec", None)
        total_steps = rb.total_written
    finally:
        rb.close()
    return {"layout": layout, "space": space, "kept": kept, "write_s": write_s, "codec": codec,
            "total_steps": total_steps}


def check_readback(ds: Any, kept: Dict[int, List[Dict[str, Any]]], episodes: List[Tuple[int, int]],
                   n_recorded: int) -> Dict[str, Any]:
    """Compares the first and last recorded episodes (when still in the ring) with what reads back."""
    from unienv_data.inspect import flatten_tree
    out: Dict[str, Any] = {"episodes_checked": 0, "steps_checked": 0, "exact_keys": True, "camera_psnr_db": None}
    psnrs = []
    first = n_recorded - len(episodes)          # the ring may have dropped the oldest episodes
    for e, steps in kept.items():
        i = e - first
        if not 0 <= i < len(episodes):
            continue
        s, end = episodes[i]
        if end - s != len(steps):
            raise CLIError(f"episode {e} reads back with {end - s} steps, {len(steps)} were recorded")
        got = ds.read_numpy(np.arange(s, end))
        want = {k: np.stack([flatten_tree(st)[k] for st in steps]) for k in got}
        for k, v in got.items():
            if k == "obs/camera":
                mse = float(np.mean((v.astype(np.float64) - want[k]) ** 2))
                psnrs.append(float("inf") if mse == 0 else 10 * np.log10(255.0 ** 2 / mse))
            elif not np.array_equal(v, want[k]):
                raise CLIError(f"key {k!r} of episode {e} did not read back what was recorded")
        out["episodes_checked"] += 1
        out["steps_checked"] += len(steps)
    if psnrs:
        out["camera_psnr_db"] = min(psnrs)
    return out


def sample(ds: Any, seed: int) -> Dict[str, Any]:
    """Times random step batches (StepSampler) and windows (SliceSampler) from the reopened buffer."""
    from unienv_data.samplers import SliceSampler, StepSampler
    rb = ds.obj
    out: Dict[str, Any] = {}
    steps: StepSampler[Any, Any, Any, Any, Any] = StepSampler(rb, batch_size=256, seed=seed)
    batch = steps.sample()
    t0 = time.perf_counter()
    n = 0
    while n < 20 or (time.perf_counter() - t0 < 0.3 and n < 200):
        batch = steps.sample()
        n += 1
    secs = time.perf_counter() - t0
    out["step_batches"] = {"batch_size": 256, "batches": n, "seconds": secs, "steps_per_s": rate(256 * n, secs),
                           "shapes": {k: list(v.shape) for k, v in _leaves(batch).items()}}
    longest = max((e - s for s, e in ds.episodes()), default=len(ds))
    window = max(1, min(16, longest))
    windows = SliceSampler(rb, batch_size=32, window=window, seed=seed, include_unrecorded=False)
    data, mask = windows.sample()
    t0 = time.perf_counter()
    n = 0
    while n < 10 or (time.perf_counter() - t0 < 0.3 and n < 100):
        data, mask = windows.sample()
        n += 1
    secs = time.perf_counter() - t0
    out["windows"] = {"batch_size": 32, "window": window, "batches": n, "seconds": secs,
                      "windows_per_s": rate(32 * n, secs), "steps_per_s": rate(32 * window * n, secs),
                      "shapes": {k: list(v.shape) for k, v in _leaves(data).items()},
                      "mask_shape": list(mask.shape), "all_valid": bool(np.asarray(ds.backend.to_numpy(mask)).all())}
    return out


def _leaves(tree: Any) -> Dict[str, Any]:
    from unienv_data.inspect import flatten_tree
    return flatten_tree(tree)


def run(args: argparse.Namespace) -> int:
    from unienv_data import inspect
    from ._images import episode_sheet
    if args.episodes < 1 or args.steps < 1:
        raise CLIError("--episodes and --steps must be at least 1")
    if args.capacity is not None and args.capacity < args.steps:
        raise CLIError(f"--capacity must hold at least one whole episode (--steps {args.steps})")
    if args.lossless and not args.video:
        raise CLIError("--lossless applies to --video")
    out = os.path.abspath(args.out)
    prepare_output_dir(out, DEMO_ENTRIES, "demo", force=args.force)
    B = pick_backend(args.backend)
    progress = not args.quiet
    rec = record(out, args.episodes, args.steps, args.video, args.lossless, args.image_size, args.capacity, args.seed,
                 B, progress)
    desc = inspect.describe(out)
    with inspect.open_dataset(out, backend=B.simplified_name) as ds:
        episodes = ds.episodes()
        verified = check_readback(ds, rec["kept"], episodes, args.episodes)
        sampled = sample(ds, args.seed)
        preview: Optional[str] = os.path.join(out, "preview.png")
        try:
            sheet = episode_sheet(ds, "obs/camera", episodes, max_rows=4, max_cols=8,
                                  title=f"unienv-data demo: {len(episodes)} episodes, obs/camera")
            sheet.save(preview)
        except CLIError as exc:               # Pillow is missing: everything else still ran
            print(f"unienv-data demo: no preview: {exc}", file=sys.stderr)
            preview = None
        n_steps = len(ds)
    lengths = [e - s for s, e in episodes]
    summary = {
        "path": out, "layout": rec["layout"], "backend": B.simplified_name, "video_codec": rec["codec"],
        "episodes_recorded": args.episodes, "steps_recorded": rec["total_steps"], "episodes": len(episodes),
        "steps": n_steps, "episode_lengths": lengths, "capacity": desc["capacity"],
        "write_seconds": rec["write_s"], "write_steps_per_s": rate(rec["total_steps"], rec["write_s"]),
        "bytes_per_key": desc["bytes_per_key"], "raw_bytes_per_key": desc["raw_bytes_per_key"],
        "total_bytes": desc["total_bytes"], "verified": verified, "sampling": sampled, "preview": preview,
    }
    if args.json:
        print_json(summary)
        return 0
    print_summary(summary)
    return 0


def print_summary(s: Dict[str, Any]) -> None:
    lengths = s["episode_lengths"]
    print(f"recorded {s['episodes_recorded']} episodes ({s['steps_recorded']} steps) into {s['path']}")
    codec = f"; video codec {s['video_codec']}" if s["video_codec"] else ""
    print(f"  {s['layout']}; backend {s['backend']}{codec}")
    print(f"  write: {s['write_seconds']:.3f} s, {s['write_steps_per_s']:,.0f} steps/s (append + commit + dumps)")
    if lengths:
        print(f"reopened read-only: {s['episodes']} episodes, {s['steps']} steps, episode lengths "
              f"{min(lengths)}..{max(lengths)} (mean {np.mean(lengths):.1f})")
    v = s["verified"]
    psnr = v["camera_psnr_db"]
    cam = "frames exact" if psnr is None or psnr == float("inf") else f"frames at PSNR {psnr:.1f} dB (lossy video)"
    print(f"  read back {v['episodes_checked']} episodes ({v['steps_checked']} steps): every low-dimensional key "
          f"exact, {cam}")
    b = s["sampling"]["step_batches"]
    w = s["sampling"]["windows"]
    print(f"  random batches (StepSampler, 256): {b['steps_per_s']:,.0f} steps/s; shapes "
          + ", ".join(f"{k} {tuple(v)}" for k, v in b["shapes"].items()))
    print(f"  windows (SliceSampler, 32 x {w['window']} steps): {w['windows_per_s']:,.0f} windows/s, "
          f"{w['steps_per_s']:,.0f} steps/s; mask {tuple(w['mask_shape'])}, all valid: {w['all_valid']}")
    print("bytes per key (on disk / raw in its own dtype):")
    raw = s["raw_bytes_per_key"]
    rows = [[k, human_bytes(n), human_bytes(raw.get(k)) if k in raw else "", ]
            for k, n in sorted(s["bytes_per_key"].items(), key=lambda kv: -kv[1])]
    for line in table(rows):
        print(line)
    from .info import disk_total_line
    print(disk_total_line(s))
    if s["preview"]:
        print(f"preview: {s['preview']}")
    print(f"next: unienv-data info {s['path']}   |   unienv-data verify {s['path']}   |   "
          f"unienv-data plot {s['path']}")
