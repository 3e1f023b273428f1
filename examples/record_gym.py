#!/usr/bin/env python
"""Record a gymnasium environment into a ReplayBuffer, every finished episode persisted as it ends.

The gymnasium env is seen through `FromGymnasiumEnv` (spaces converted: a Discrete action becomes an int64 box),
and `ReplayBufferCollectionWrapper` records each step into the buffer's keys and ends a segment at each episode
end. The buffer is on disk (`cache_path`), so every ended episode is persisted as it ends (the default per-episode
durability, docs/guarantees.md): a crash loses at most the episode in progress, with no `dump_on_episode_end`
(which would also rewrite every storage's own metadata after each episode). Needs
gymnasium (`pip install 'unienv-storage[gym]'`).

    python examples/record_gym.py --out /tmp/cartpole --episodes 20
    python examples/record_gym.py --out /tmp/pendulum --env Pendulum-v1 --episodes 5 --max-steps 100
    unienv-data info /tmp/cartpole          # what was stored, bytes per key
    unienv-data plot /tmp/cartpole          # episode lengths, values over time
"""
from __future__ import annotations

import argparse
from typing import Any, Optional

import numpy as np

try:
    import gymnasium as gym
except ImportError:
    raise SystemExit("this example needs gymnasium: pip install 'unienv-storage[gym]'")

from unienv_interface.backends import NumpyComputeBackend as B
from unienv_interface.env_base import Env
from unienv_interface.space import BinarySpace, BoxSpace, DictSpace
from unienv_interface.wrapper.gym_compat import FromGymnasiumEnv
from unienv_data.replay_buffer import ReplayBuffer, ReplayBufferCollectionWrapper
from unienv_data.storages.dict_storage import DictStorage
from unienv_data.storages.native_layout import native_layout_kwargs


def step_space(env: Env) -> DictSpace:
    """What one recorded step holds (the wrapper fills exactly these keys): the observation the action was taken
    in, the action, the next observation, the reward and the end flags."""
    return DictSpace(B, {
        "obs": env.observation_space,
        "action": env.action_space,
        "next_obs": env.observation_space,
        "reward": BoxSpace(B, -np.inf, np.inf, np.float32, shape=()),
        "terminated": BinarySpace(B, ()),
        "truncated": BinarySpace(B, ()),
    })


def record(env_id: str, out: str, episodes: int, max_steps: int, seed: int) -> ReplayBuffer:
    env = FromGymnasiumEnv(gym.make(env_id, max_episode_steps=max_steps))
    space = step_space(env)
    buffer = ReplayBuffer.create(DictStorage, space, cache_path=out, capacity=None, overwrite=True,
                                 **native_layout_kwargs(space))   # --out is replaced
    recorder = ReplayBufferCollectionWrapper(env, buffer)     # each ended episode is persisted as it ends
    rng = B.random.random_number_generator(seed)          # the random policy's own generator
    for e in range(episodes):
        recorder.reset(seed=seed + e)
        done = False
        while not done:
            rng, action = env.action_space.sample(rng)
            _obs, _reward, terminated, truncated, _info = recorder.step(action)
            done = bool(terminated or truncated)
        # here the episode is one segment of the buffer, and on disk
    recorder.close()
    return buffer


def main(argv: Optional[list] = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--out", required=True, help="dataset directory to write (replaced)")
    ap.add_argument("--env", default="CartPole-v1", help="a gymnasium environment id (default: CartPole-v1)")
    ap.add_argument("--episodes", type=int, default=10)
    ap.add_argument("--max-steps", type=int, default=200, help="steps before an episode is truncated")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    buffer = record(args.env, args.out, args.episodes, args.max_steps, args.seed)
    lengths = [e - s for s, e in buffer.episode_segments() or []]
    print(f"recorded {len(lengths)} episodes ({len(buffer)} steps, lengths {min(lengths)}..{max(lengths)}) from "
          f"{args.env} into {args.out}")
    buffer.close()
    reopened = ReplayBuffer.load_from(args.out, backend=B)
    print(f"reopened from disk: {len(reopened)} steps in {len(reopened.episode_segments() or [])} episodes; keys "
          f"{sorted(reopened.single_space.spaces)}")
    reopened.close()
    print(f"look inside: unienv-data info {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
