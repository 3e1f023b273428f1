#!/usr/bin/env python
"""Record episodes from a Gymnasium-style environment into a ReplayBuffer in the native layout.

Runs without Gymnasium: `ReachEnv` below implements the Gymnasium API itself (`reset(seed=...)` returns
`(obs, info)`, `step(action)` returns `(obs, reward, terminated, truncated, info)`, `observation_space` /
`action_space` with `low`, `high`, `shape`, `dtype`). When Gymnasium is installed, `ReachEnv` is a real
`gymnasium.Env` with `gymnasium.spaces`, and `--env ID` records any registered environment whose spaces are
Box / Discrete / Dict (random actions), e.g. `--env CartPole-v1`.

    python examples/record_gym.py --out /tmp/reach --episodes 20
    unienv-data info /tmp/reach          # what was stored, bytes per key
    unienv-data plot /tmp/reach          # episode lengths, values over time, camera frames
"""
from __future__ import annotations

import argparse
from typing import Any, Dict, Optional, Tuple

import numpy as np

try:
    import gymnasium as gym
    from gymnasium import spaces as gym_spaces
except ImportError:  # the example works without it
    gym = None
    gym_spaces = None

from unienv_interface.backends import NumpyComputeBackend as B
from unienv_interface.space import BinarySpace, BoxSpace, DictSpace
from unienv_data.replay_buffer import ReplayBuffer
from unienv_data.storages.dict_storage import DictStorage
from unienv_data.storages.native_layout import native_layout_kwargs


# ---------------------------------------------------------------------------------------------------- the environment
class _Box:
    """The part of `gymnasium.spaces.Box` this example uses (when Gymnasium is not installed)."""

    def __init__(self, low: Any, high: Any, shape: Tuple[int, ...], dtype: Any) -> None:
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)
        self.low = np.broadcast_to(np.asarray(low, self.dtype), self.shape)
        self.high = np.broadcast_to(np.asarray(high, self.dtype), self.shape)


def _box(low: Any, high: Any, shape: Tuple[int, ...], dtype: Any) -> Any:
    return gym_spaces.Box(low, high, shape, dtype) if gym_spaces is not None else _Box(low, high, shape, dtype)


def _dict(spaces: Dict[str, Any]) -> Any:
    return gym_spaces.Dict(spaces) if gym_spaces is not None else dict(spaces)


class ReachEnv(gym.Env if gym is not None else object):  # type: ignore[misc]
    """A point robot in [-1, 1]^2 that must reach a goal; observes its position and a top-down camera image."""

    metadata = {"render_modes": ["rgb_array"]}

    def __init__(self, size: int = 32, max_steps: int = 60) -> None:
        self.size, self.max_steps = size, max_steps
        self.observation_space = _dict({"position": _box(-1.0, 1.0, (2,), np.float32),
                                        "camera": _box(0, 255, (size, size, 3), np.uint8)})
        self.action_space = _box(-1.0, 1.0, (2,), np.float32)
        self._rng = np.random.default_rng()
        yy, xx = np.mgrid[0:size, 0:size]
        self._xx, self._yy = xx, yy

    def _obs(self) -> Dict[str, np.ndarray]:
        img = np.full((self.size, self.size, 3), 235, np.uint8)
        for point, color, radius in ((self.goal, (40, 160, 70), 3.0), (self.pos, (220, 60, 40), 2.5)):
            px = (point + 1) * 0.5 * (self.size - 1)
            img[(self._xx - px[0]) ** 2 + (self._yy - px[1]) ** 2 <= radius ** 2] = color
        return {"position": self.pos.astype(np.float32), "camera": img}

    def reset(self, *, seed: Optional[int] = None, options: Optional[Dict[str, Any]] = None
              ) -> Tuple[Dict[str, np.ndarray], Dict[str, Any]]:
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self.pos = self._rng.uniform(-0.9, 0.9, 2)
        self.goal = self._rng.uniform(-0.9, 0.9, 2)
        self.t = 0
        return self._obs(), {"goal": self.goal.copy()}

    def step(self, action: np.ndarray) -> Tuple[Dict[str, np.ndarray], float, bool, bool, Dict[str, Any]]:
        self.pos = np.clip(self.pos + 0.1 * np.clip(action, -1, 1), -1, 1)
        self.t += 1
        dist = float(np.linalg.norm(self.goal - self.pos))
        terminated = dist < 0.08
        truncated = self.t >= self.max_steps and not terminated
        return self._obs(), -dist, terminated, truncated, {"goal": self.goal.copy()}


# ---------------------------------------------------------------------------------------------------- spaces
def to_unienv_space(space: Any) -> Any:
    """A unienv space (NumPy backend) for a Gymnasium-style space: Box, Discrete, MultiBinary or Dict."""
    if isinstance(space, dict) or isinstance(getattr(space, "spaces", None), dict):
        items = space.items() if isinstance(space, dict) else space.spaces.items()
        return DictSpace(B, {str(k): to_unienv_space(v) for k, v in items})
    if type(space).__name__ == "MultiBinary":
        return BinarySpace(B, tuple(space.shape))
    if hasattr(space, "n") and not hasattr(space, "low"):                   # Discrete(n, start)
        start = int(getattr(space, "start", 0))
        return BoxSpace(B, start, start + int(space.n) - 1, np.int64, shape=())
    if hasattr(space, "low"):                                              # Box
        dtype = np.dtype(space.dtype)
        return BoxSpace(B, np.asarray(space.low, dtype), np.asarray(space.high, dtype), dtype,
                        shape=tuple(space.shape))
    raise TypeError(f"this example records Box, Discrete, MultiBinary and Dict spaces, not {type(space).__name__}")


def step_space(env: Any) -> Any:
    """What one recorded step holds: the observation before the action, the action, reward and end flags."""
    return DictSpace(B, {
        "obs": to_unienv_space(env.observation_space),
        "action": to_unienv_space(env.action_space),
        "reward": BoxSpace(B, -np.inf, np.inf, np.float32, shape=()),
        "terminated": BinarySpace(B, ()),
        "truncated": BinarySpace(B, ()),
    })


def as_value(space: Any, x: Any) -> Any:
    """An environment value in the dtype of `space` (observations and actions may come as Python numbers)."""
    if isinstance(space, DictSpace):
        return {k: as_value(space.spaces[k], x[k]) for k in space.spaces}
    return np.asarray(x, dtype=B.numpy_dtype(space.dtype))


# ---------------------------------------------------------------------------------------------------- recording
def record(env: Any, out: str, episodes: int, seed: int, video: bool, policy: Any) -> ReplayBuffer:
    space = step_space(env)
    buffer = ReplayBuffer.create(DictStorage, space, cache_path=out, capacity=None, overwrite=True,  # --out is replaced
                                 **native_layout_kwargs(space, image_storage="video" if video else "array"))
    for e in range(episodes):
        obs, info = env.reset(seed=seed + e)
        done = False
        while not done:
            action = policy(obs, info)
            next_obs, reward, terminated, truncated, info = env.step(action)
            buffer.append({"obs": as_value(space.spaces["obs"], obs),
                           "action": as_value(space.spaces["action"], action),
                           "reward": np.float32(reward), "terminated": np.bool_(terminated),
                           "truncated": np.bool_(truncated)})
            obs, done = next_obs, terminated or truncated
        buffer.mark_segment_end()   # one episode = one segment, on disk at once: a crash loses at most the next one
    return buffer


def main(argv: Optional[list] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="dataset directory to write (replaced)")
    ap.add_argument("--episodes", type=int, default=10)
    ap.add_argument("--max-steps", type=int, default=60, help="ReachEnv: steps before an episode is truncated")
    ap.add_argument("--env", default=None, help="a Gymnasium environment id (needs gymnasium); default: ReachEnv")
    ap.add_argument("--video", action="store_true", help="store camera frames as video (needs PyAV)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.env:
        if gym is None:
            ap.error("--env needs gymnasium: pip install gymnasium")
        env = gym.make(args.env, max_episode_steps=args.max_steps)
        env.action_space.seed(args.seed)
        policy = lambda obs, info: env.action_space.sample()  # noqa: E731 - random actions
    else:
        env = ReachEnv(max_steps=args.max_steps)
        rng = np.random.default_rng(args.seed)
        policy = lambda obs, info: np.clip(1.5 * (info["goal"] - obs["position"]) + rng.normal(0, 0.3, 2),  # noqa: E731
                                           -1, 1).astype(np.float32)
    buffer = record(env, args.out, args.episodes, args.seed, args.video, policy)
    lengths = [e - s for s, e in buffer.get_segments() or []]
    print(f"recorded {len(lengths)} episodes ({len(buffer)} steps, lengths {min(lengths)}..{max(lengths)}) from "
          f"{args.env or 'ReachEnv'} into {args.out}")
    print("storages: " + ", ".join(f"{k} -> {type(c).__name__}" for k, c in buffer.storage.storages.items()))
    buffer.close()
    print(f"look inside: unienv-data info {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
