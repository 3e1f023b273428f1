#!/usr/bin/env python
"""LeRobot in, training windows out, LeRobot out.

1. Opens a LeRobot dataset in place (`--src`, any v2.0 / v2.1 / v3.0 folder; without one, a small v3.0 dataset is
   written first with this library's exporter) as `LeRobotAsUniEnvDataset`.
2. Draws training windows the way ACT / diffusion policies train: shuffled anchors, two frames of every camera
   (the previous step and the current one) and a chunk of the next `--chunk` actions, padded with a mask at episode
   ends, never reaching into the next episode (`SliceStackedBatch` over the dataset's episodes).
3. Converts the dataset into this library's native layout (`unienv-data convert --from lerobot`), then back out to
   LeRobot v3.0 (`unienv-data convert --to lerobot`), and checks the tabular values and every frame's task came back
   unchanged.

    python examples/lerobot_roundtrip.py --out /tmp/lerobot-roundtrip
    python examples/lerobot_roundtrip.py --src path/to/lerobot_dataset --out /tmp/lerobot-roundtrip
"""
from __future__ import annotations

import argparse
import os
import shutil

import numpy as np

from unienv_data.batches import SliceStackedBatch
from unienv_data.cli import main as cli
from unienv_data.integrations.lerobot import LeRobotAsUniEnvDataset
from unienv_data.integrations.lerobot_export import LeRobotV3Writer
from unienv_interface.backends.numpy import NumpyComputeBackend


def write_demo_dataset(path: str, episodes: int = 4, fps: int = 10) -> None:
    """A small LeRobot v3.0 dataset: a 48x64 camera, 6-d state and action, episodes of 20-30 frames."""
    rng = np.random.default_rng(0)
    w = LeRobotV3Writer(path, fps, {"observation.state": ("float32", (6,)), "action": ("float32", (6,)),
                                    "observation.images.top": ("video", (48, 64, 3))}, robot_type="demo")
    yy, xx = np.mgrid[0:48, 0:64]
    for e in range(episodes):
        n = int(rng.integers(20, 31))
        t = np.arange(n)[:, None, None]
        frames = np.stack([(120 + 80 * np.sin(xx / 9 + t * 0.3 + e)) + 0 * yy,
                           100 + 60 * np.cos(yy / 7 - t * 0.2) + 0 * xx,
                           np.broadcast_to(60 + 3 * t, (n, 48, 64))], axis=-1).clip(0, 255).astype(np.uint8)
        w.begin_episode("pick the cube" if e % 2 == 0 else "place the cube")
        w.add_frames({"observation.state": rng.standard_normal((n, 6)).astype(np.float32),
                      "action": rng.standard_normal((n, 6)).astype(np.float32), "observation.images.top": frames})
        w.end_episode()
    w.finish()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--src", default=None, help="a LeRobot dataset folder (default: write a small one)")
    ap.add_argument("--out", default="/tmp/lerobot-roundtrip", help="working directory (replaced)")
    ap.add_argument("--batch", type=int, default=8, help="windows per batch")
    ap.add_argument("--chunk", type=int, default=8, help="actions per window")
    args = ap.parse_args()
    shutil.rmtree(args.out, ignore_errors=True)
    os.makedirs(args.out)
    src = args.src or os.path.join(args.out, "source")
    if args.src is None:
        write_demo_dataset(src)

    # 1. LeRobot in
    ds = LeRobotAsUniEnvDataset.from_local(src, NumpyComputeBackend)
    print(ds)
    cameras = [k for k in ds.single_space.keys() if ds.schema.features[k].is_camera]

    # 2. training windows: cameras at steps [-1, 0], actions at [0, chunk)
    frames = SliceStackedBatch(ds.get_column(cameras[0]) if len(cameras) == 1 else ds, [-1, 0])
    actions = SliceStackedBatch(ds.get_column("action"), list(range(args.chunk)))
    rng = np.random.default_rng(0)
    anchors = rng.permutation(len(ds))[:args.batch]
    cam, _ = frames.get_at_with_metadata(anchors)
    act, act_meta = actions.get_at_with_metadata(anchors)
    mask = np.asarray(act_meta["slice_valid_mask"])   # False where a window runs past its episode's end
    print(f"windows: frames {np.shape(cam)} uint8, actions {np.shape(act)}, valid action steps per window "
          f"{mask.sum(1).tolist()}")

    # 3. into the native layout and back out to LeRobot v3.0
    native, back = os.path.join(args.out, "native"), os.path.join(args.out, "lerobot_out")
    assert cli(["convert", src, native, "--from", "lerobot", "-q"]) == 0
    assert cli(["convert", native, back, "--to", "lerobot", "--fps", str(ds.fps), "-q",
                "--task-key", "task_index", "--task-names", src]) == 0     # every frame's task text kept
    again = LeRobotAsUniEnvDataset.from_local(back, NumpyComputeBackend)
    a, b = ds.get_at(slice(None)), again.get_at(slice(None))
    for key in ("observation.state", "action"):
        if key in a:
            np.testing.assert_array_equal(a[key], b[key])
    assert ds.get_at_with_metadata(slice(None))[1]["task"] == again.get_at_with_metadata(slice(None))[1]["task"]
    for key in cameras:
        print(f"{key}: mean absolute difference after two encodings {np.abs(a[key] - b[key].astype(float)).mean():.2f}")
    print(f"round trip ok: {len(again)} frames, {again.num_episodes} episodes, segments {again.get_segments()[:3]} ...")
    ds.close()
    again.close()


if __name__ == "__main__":
    main()
