#!/usr/bin/env python
"""Train a small policy by behaviour cloning from a recorded dataset, through a PyTorch DataLoader.

The dataset is one written by `unienv-data demo` (recorded into `--data` first when that directory holds none):
steps with `obs/position`, `obs/velocity`, a 64x64 `obs/camera` frame and a 2-d `action`. The policy maps the
observation to an action chunk (the next `--chunk` actions); the loss is the mean squared error over the steps of
the chunk that lie inside the episode.

The recommended pattern (docs/batches.md): the buffer opened with `backend="numpy"` (reads are fastest there, and
the loader hands back torch tensors anyway), a `WindowDataset` naming the keys and their step offsets (pad masks
where a window leaves its episode), and `shared_memory_dataloader`, whose worker processes (`--workers`) map the
same memory-mapped files and hand batches back through shared memory.

    python examples/train_dataloader.py --data /tmp/unienv-demo --epochs 5 --workers 2
"""
from __future__ import annotations

import argparse
import contextlib
import io
import os
import time
from typing import Dict, Optional

import torch
from torch import nn

from unienv_data.batches import WindowDataset
from unienv_data.integrations.torch_loader import shared_memory_dataloader
from unienv_data.replay_buffer import ReplayBuffer


class Policy(nn.Module):
    """A small CNN on the camera frame, concatenated with position and velocity, to a chunk of tanh actions."""

    def __init__(self, chunk: int, action_dim: int = 2) -> None:
        super().__init__()
        self.chunk, self.action_dim = chunk, action_dim
        self.cnn = nn.Sequential(
            nn.Conv2d(3, 16, 5, stride=2, padding=2), nn.ReLU(),
            nn.Conv2d(16, 32, 5, stride=2, padding=2), nn.ReLU(),
            nn.AdaptiveAvgPool2d(4), nn.Flatten(), nn.Linear(32 * 16, 64), nn.ReLU())
        self.head = nn.Sequential(nn.Linear(64 + 4, 64), nn.ReLU(), nn.Linear(64, chunk * action_dim), nn.Tanh())

    def forward(self, batch: Dict[str, torch.Tensor]) -> torch.Tensor:
        frames = batch["obs/camera"][:, 0].permute(0, 3, 1, 2).float() / 255.0     # (B, 1, H, W, C) uint8 -> NCHW
        state = torch.cat([batch["obs/position"][:, 0], batch["obs/velocity"][:, 0]], dim=-1)
        out = self.head(torch.cat([self.cnn(frames), state], dim=-1))
        return out.view(-1, self.chunk, self.action_dim)   # type: ignore[no-any-return]


def main(argv: Optional[list] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True, help="dataset directory (recorded with `unienv-data demo` if empty)")
    ap.add_argument("--episodes", type=int, default=12, help="episodes to record when --data holds no dataset")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--chunk", type=int, default=8, help="actions predicted per step (an action chunk)")
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

    buffer = ReplayBuffer.load_from(args.data, backend="numpy")     # read-only, memory-mapped
    windows = {"obs/camera": [0], "obs/position": [0], "obs/velocity": [0], "action": range(args.chunk)}
    dataset = WindowDataset(buffer, windows, pad=True)              # one item per step, pad masks at episode ends
    loader = shared_memory_dataloader(dataset, batch_size=args.batch_size, shuffle=True, seed=args.seed,
                                      num_workers=args.workers, persistent_workers=args.workers > 0)
    policy = Policy(args.chunk)
    optim = torch.optim.Adam(policy.parameters(), lr=3e-3)
    print(f"training on {len(buffer)} steps ({len(dataset.episodes)} episodes) from {args.data}, "
          f"{args.workers} DataLoader workers")
    for epoch in range(1, args.epochs + 1):
        t0, total, n = time.perf_counter(), 0.0, 0
        for batch in loader:
            keep = (~batch["action_is_pad"]).unsqueeze(-1).float()         # (B, chunk, 1): steps inside the episode
            err = (policy(batch) - batch["action"]) ** 2 * keep
            loss = err.sum() / (keep.sum() * policy.action_dim)
            optim.zero_grad()
            loss.backward()
            optim.step()
            total += float(loss.detach()) * batch["action"].shape[0]
            n += batch["action"].shape[0]
        secs = time.perf_counter() - t0
        print(f"epoch {epoch}: loss {total / n:.4f}  ({n / secs:,.0f} windows/s)")
        del batch                                                          # frees its shared-memory slot

    print(f"windows for a sequence model: obs/camera {tuple(dataset[0]['obs/camera'].shape)}, action "
          f"{tuple(dataset[0]['action'].shape)}, action_is_pad {tuple(dataset[0]['action_is_pad'].shape)}")
    buffer.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
