#!/usr/bin/env python
"""Train a small policy by behaviour cloning from a recorded dataset, through a PyTorch DataLoader.

The dataset is one written by `unienv-data demo` (recorded into `--data` first when that directory holds none):
steps with `obs/position`, `obs/velocity`, a 64x64 `obs/camera` frame and a 2-d `action`. The policy maps the
observation to the action; the loss is the mean squared error.

The DataLoader reads through `unienv_data.integrations.pytorch.UniEnvAsPyTorchDataset`: its `__getitems__` reads
a whole batch with one gather per storage, and worker processes (`--workers`) map the same memory-mapped files
instead of copying them. Without that module the example falls back to a minimal Dataset doing the same.
At the end it draws windows of consecutive steps (`SliceSampler`), what a sequence model would train on.

    python examples/train_dataloader.py --data /tmp/unienv-demo --epochs 5 --workers 2
"""
from __future__ import annotations

import argparse
import contextlib
import io
import os
import time
from typing import Any, Dict, Optional

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from unienv_data.replay_buffer import ReplayBuffer
from unienv_data.samplers import SliceSampler
from unienv_interface.backends.pytorch import PyTorchComputeBackend


class BufferDataset(Dataset):  # type: ignore[type-arg]
    """The fallback: a map-style Dataset over a ReplayBuffer, batched reads through `__getitems__`."""

    def __init__(self, buffer: ReplayBuffer) -> None:
        self.buffer = buffer

    def __len__(self) -> int:
        return len(self.buffer)

    def __getitem__(self, i: int) -> Any:
        return self.buffer.get_at(int(i))

    def __getitems__(self, indices: Any) -> Any:
        return self.buffer.get_at(np.asarray(indices, dtype=np.int64))

    @staticmethod
    def collate_fn(batch: Any) -> Any:
        return batch


def make_dataset(buffer: ReplayBuffer) -> Any:
    try:
        from unienv_data.integrations.pytorch import UniEnvAsPyTorchDataset
    except ImportError:
        return BufferDataset(buffer)
    return UniEnvAsPyTorchDataset(buffer)


class Policy(nn.Module):
    """A small CNN on the camera frame, concatenated with position and velocity, to a tanh action."""

    def __init__(self, action_dim: int = 2) -> None:
        super().__init__()
        self.cnn = nn.Sequential(
            nn.Conv2d(3, 16, 5, stride=2, padding=2), nn.ReLU(),
            nn.Conv2d(16, 32, 5, stride=2, padding=2), nn.ReLU(),
            nn.AdaptiveAvgPool2d(4), nn.Flatten(), nn.Linear(32 * 16, 64), nn.ReLU())
        self.head = nn.Sequential(nn.Linear(64 + 4, 64), nn.ReLU(), nn.Linear(64, action_dim), nn.Tanh())

    def forward(self, obs: Dict[str, torch.Tensor]) -> torch.Tensor:
        frames = obs["camera"].permute(0, 3, 1, 2).float() / 255.0        # uint8 NHWC -> float NCHW
        state = torch.cat([obs["position"], obs["velocity"]], dim=-1)
        return self.head(torch.cat([self.cnn(frames), state], dim=-1))   # type: ignore[no-any-return]


def main(argv: Optional[list] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True, help="dataset directory (recorded with `unienv-data demo` if empty)")
    ap.add_argument("--episodes", type=int, default=12, help="episodes to record when --data holds no dataset")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--workers", type=int, default=2, help="DataLoader worker processes (0: read in this process)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads for the model (a small model: 1-4)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)

    if not os.path.isfile(os.path.join(args.data, "metadata.json")):
        from unienv_data.cli import main as cli
        print(f"recording a dataset with: unienv-data demo --out {args.data} --episodes {args.episodes}")
        with contextlib.redirect_stdout(io.StringIO()):
            code = cli(["demo", "--out", args.data, "--episodes", str(args.episodes), "--backend", "pytorch", "-q"])
        if code != 0:
            return code

    buffer = ReplayBuffer.load_from(args.data, backend=PyTorchComputeBackend)    # read-only, memory-mapped
    dataset = make_dataset(buffer)
    loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=True, num_workers=args.workers,
                        collate_fn=type(dataset).collate_fn, persistent_workers=args.workers > 0)
    policy = Policy()
    optim = torch.optim.Adam(policy.parameters(), lr=3e-3)
    print(f"training on {len(buffer)} steps ({len(buffer.get_segments() or [])} episodes) from {args.data}, "
          f"{args.workers} DataLoader workers")
    for epoch in range(1, args.epochs + 1):
        t0, total, n = time.perf_counter(), 0.0, 0
        for batch in loader:
            loss = nn.functional.mse_loss(policy(batch["obs"]), batch["action"])
            optim.zero_grad()
            loss.backward()
            optim.step()
            total += float(loss.detach()) * batch["action"].shape[0]
            n += batch["action"].shape[0]
        secs = time.perf_counter() - t0
        print(f"epoch {epoch}: loss {total / n:.4f}  ({n / secs:,.0f} steps/s)")

    windows = SliceSampler(buffer, batch_size=16, window=8, seed=args.seed)
    data, mask = windows.sample()
    print(f"windows for a sequence model: obs/camera {tuple(data['obs']['camera'].shape)}, action "
          f"{tuple(data['action'].shape)}, mask {tuple(mask.shape)}")
    buffer.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
