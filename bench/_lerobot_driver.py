"""The lerobot side of `bench_lerobot.py`, run under the lerobot venv's python (lerobot 0.4.4, see
scripts/venvs/lerobot.sh). Two commands:

    write ROOT SHAPE EPISODES FRAMES     writes a LeRobot v3.0 dataset with lerobot's default video encoding
                                         (AV1 libsvtav1, crf 30, GOP 2) at 10 fps; SHAPE is pusht or aloha
    load ROOT PLAN.json OUT.npz          contender (a): LeRobotDataset(..., delta_timestamps=...) through a torch
                                         DataLoader; PLAN holds the worker count, batches, seed and the check indices

`load` prints one JSON line (timings) and saves the check items (cameras back to uint8 HWC) to OUT.npz.
"""
from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np

FPS = 10
SHAPES = {"pusht": {"observation.image": (96, 96, 3)},
          "aloha": {"observation.images.top": (240, 320, 3), "observation.images.wrist": (240, 320, 3)}}


def frame_image(h: int, w: int, t: int, episode: int, seed: int) -> np.ndarray:
    """Smooth gradients, a moving square and mild noise: video-like content the encoder treats like a camera."""
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    img = np.empty((h, w, 3), np.float32)
    img[..., 0] = 120 + 80 * np.sin(x / w * 3.1 + t * 0.3 + seed)
    img[..., 1] = 100 + 60 * np.cos(y / h * 2.7 - t * 0.2 + episode)
    img[..., 2] = 60 + 50 * np.sin((x + y) / (w + h) * 4.0 + seed)
    s = max(4, h // 12)
    cy, cx = (h // 4 + 2 * t) % (h - s), (w // 5 + 3 * t + 5 * episode) % (w - s)
    img[cy:cy + s, cx:cx + s] = (230, 40, 40)
    img += np.random.default_rng(t * 1000 + episode).normal(0, 2, img.shape).astype(np.float32)
    return np.clip(img, 0, 255).astype(np.uint8)


def write(root: str, shape: str, episodes: int, frames: int) -> None:
    from lerobot.datasets.lerobot_dataset import LeRobotDataset
    out = Path(root)
    if out.exists():
        shutil.rmtree(out)
    names = ["height", "width", "channels"]
    feats: dict = {"observation.state": {"dtype": "float32", "shape": (14,), "names": [f"j{i}" for i in range(14)]},
                   "action": {"dtype": "float32", "shape": (14,), "names": [f"j{i}" for i in range(14)]}}
    for cam, hwc in SHAPES[shape].items():
        feats[cam] = {"dtype": "video", "shape": hwc, "names": names}
    ds = LeRobotDataset.create(repo_id=f"bench/{shape}", fps=FPS, features=feats, root=out, robot_type="bench",
                               use_videos=True)
    rng = np.random.default_rng(16)
    for ep in range(episodes):
        for t in range(frames):
            frame = {"observation.state": rng.standard_normal(14).astype(np.float32),
                     "action": rng.standard_normal(14).astype(np.float32), "task": "push the block"}
            for j, (cam, (h, w, _)) in enumerate(SHAPES[shape].items()):
                frame[cam] = frame_image(h, w, t, ep, seed=j)
            ds.add_frame(frame)
        ds.save_episode()
    ds.finalize()
    shutil.rmtree(out / "images", ignore_errors=True)
    print(json.dumps({"written": str(out), "frames": episodes * frames}))


def load(root: str, plan_path: str, out_path: str) -> None:
    t_start = time.perf_counter()
    import torch
    from lerobot.datasets.lerobot_dataset import LeRobotDataset
    plan = json.loads(Path(plan_path).read_text())
    torch.set_num_threads(1)
    info = json.loads((Path(root) / "meta" / "info.json").read_text())
    cams = [k for k, v in info["features"].items() if v["dtype"] == "video"]
    obs = [k for k in info["features"] if k.startswith("observation.")]
    dt = 1.0 / info["fps"]
    delta = {k: [o * dt for o in plan["obs_offsets"]] for k in obs}
    delta["action"] = [o * dt for o in plan["action_offsets"]]
    t0 = time.perf_counter()
    ds = LeRobotDataset(plan["repo_id"], root=root, delta_timestamps=delta)
    open_s = time.perf_counter() - t0
    # the check: items at fixed indices, compared with (b) and (d) by the bench
    check = {}
    if plan["check"]:
        items = [ds[int(i)] for i in plan["check"]]
        for k in cams:
            v = torch.stack([it[k] for it in items])  # (B, T, C, H, W) float32 in [0, 1]
            check[k] = (v * 255).round().to(torch.uint8).permute(0, 1, 3, 4, 2).contiguous().numpy()
        for k in [k for k in delta if k not in cams]:
            check[k] = torch.stack([it[k] for it in items]).numpy()
            check[k + "_is_pad"] = torch.stack([it[k + "_is_pad"] for it in items]).numpy()
        for k in cams:
            check[k + "_is_pad"] = torch.stack([it[k + "_is_pad"] for it in items]).numpy()
    if plan.get("check_only"):
        np.savez(out_path, **check)
        print(json.dumps({"checked": len(plan["check"])}))
        return
    t0 = time.perf_counter()
    gen = torch.Generator().manual_seed(plan["seed"])
    w = plan["workers"]
    # shuffled without replacement, epoch after epoch (the timing runs for a minimum time, not one epoch)
    sampler = torch.utils.data.RandomSampler(ds, num_samples=plan["batch_size"] * plan["max_batches"], generator=gen)
    loader = torch.utils.data.DataLoader(ds, batch_size=plan["batch_size"], sampler=sampler, num_workers=w,
                                          drop_last=True, persistent_workers=False,
                                         prefetch_factor=2 if w else None)
    it = iter(loader)
    batch = next(it)
    first = time.perf_counter() - t0 + open_s
    assert batch[cams[0]].shape[1] == len(plan["obs_offsets"])
    t1 = time.perf_counter()
    n = 0
    batches = 0
    while batches < plan["batches"] or (time.perf_counter() - t1 < plan["min_seconds"] and
                                        batches < plan["max_batches"] - 1):
        batch = next(it)
        n += batch["action"].shape[0]
        batches += 1
    dt_run = time.perf_counter() - t1
    del it, loader
    np.savez(out_path, **check)
    print(json.dumps({"batches": batches, "samples_per_s": n / dt_run, "first_batch_s": first, "setup_s": t0 - t_start}))


if __name__ == "__main__":
    if sys.argv[1] == "write":
        write(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
    elif sys.argv[1] == "load":
        load(sys.argv[2], sys.argv[3], sys.argv[4])
    else:
        raise SystemExit(f"unknown command {sys.argv[1]!r}: use write or load")
