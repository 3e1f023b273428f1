"""gymnasium environments both ways (needs the `gym` extra).

* `FromGymnasiumEnv(gym_env)`: a gymnasium env as an `Env` on the NumPy backend. Spaces come from
  `gym_utils.from_gym_space` (a Discrete action becomes an int64 `BoxSpace` of shape `()`); `reset(seed=...)`
  returns `(None, obs, info)` (gymnasium envs have no context); `step` passes reward, terminated and truncated
  through unchanged.
* `ToGymnasiumEnv(env)`: an unbatched `Env` as a `gymnasium.Env`. With a context space, the gymnasium observation
  combines context and observation in one Dict (the keys of both when both are Dicts, else `"context"` /
  `"observation"` entries).
"""
from __future__ import annotations

import copy
from typing import Any, Dict, Generic, Optional, Sequence, SupportsFloat, Tuple, Union

import numpy as np

try:
    import gymnasium as gym
except ImportError as _exc:  # pragma: no cover - depends on the environment
    raise ImportError("unienv_interface.wrapper.gym_compat needs gymnasium: pip install 'unienv-storage[gym]'") from _exc

from unienv_interface.backends.base import BArrayType, BDeviceType, BDtypeType, BRNGType
from unienv_interface.backends.numpy import NumpyComputeBackend
from unienv_interface.env_base._forwarding import Forwarded
from unienv_interface.env_base.env import ActType, ContextType, Env, ObsType, RenderFrame, StepResult
from unienv_interface.space import DictSpace, Space
from unienv_interface.space.space_utils import gym_utils


def _no_mask(mask: Any, who: str) -> None:
    if mask is not None:
        raise ValueError(f"{who} wraps a single (unbatched) environment: reset(mask=...) does not apply; call "
                         "reset() without a mask")


class FromGymnasiumEnv(
    Env[np.ndarray, None, ObsType, ActType, RenderFrame, Any, np.dtype, np.random.Generator],
    Generic[ObsType, ActType, RenderFrame],
):
    """A `gymnasium.Env` seen through the `Env` contract (NumPy backend, unbatched, no context)."""

    def __init__(self, env: Any) -> None:
        if not isinstance(env, gym.Env):
            raise TypeError(f"FromGymnasiumEnv needs a gymnasium.Env, got {type(env).__name__}")
        self.env = env
        self._metadata: Optional[Dict[str, Any]] = None
        self._render_fps: Optional[int] = None
        self.backend = NumpyComputeBackend
        self.device = None
        self.batch_size = None
        self.action_space = gym_utils.from_gym_space(env.action_space, self.backend)
        self.observation_space = gym_utils.from_gym_space(env.observation_space, self.backend)
        self.context_space = None

    @property  # type: ignore[override]
    def metadata(self) -> Dict[str, Any]:
        return dict(self.env.metadata) if self._metadata is None else self._metadata

    @metadata.setter
    def metadata(self, value: Optional[Dict[str, Any]]) -> None:
        self._metadata = value

    @property  # type: ignore[override]
    def render_mode(self) -> Optional[str]:
        return self.env.render_mode  # type: ignore[no-any-return]

    @render_mode.setter
    def render_mode(self, value: Optional[str]) -> None:
        self.env.render_mode = value

    @property  # type: ignore[override]
    def render_fps(self) -> Optional[int]:
        return self.env.metadata.get("render_fps") if self._render_fps is None else self._render_fps

    @render_fps.setter
    def render_fps(self, value: Optional[int]) -> None:
        self._render_fps = value

    @property  # type: ignore[override]
    def rng(self) -> np.random.Generator:
        """The gymnasium env's own `np_random` (shared, so sampling here advances it)."""
        return self.env.np_random  # type: ignore[no-any-return]

    @rng.setter
    def rng(self, value: np.random.Generator) -> None:
        self.env.np_random = value

    def step(self, action: Any) -> StepResult:
        obs, reward, terminated, truncated, info = self.env.step(gym_utils.to_gym_data(self.action_space, action))
        return gym_utils.from_gym_data(self.observation_space, obs), reward, terminated, truncated, info

    def reset(self, *args: Any, mask: Optional[Any] = None, seed: Optional[int] = None,
              **kwargs: Any) -> Tuple[None, Any, Dict[str, Any]]:
        """`(None, obs, info)`; keyword arguments other than `options` are passed inside gymnasium's `options`."""
        _no_mask(mask, "FromGymnasiumEnv")
        options = kwargs.pop("options", None)
        if kwargs:
            options = {**(options or {}), **kwargs}
        obs, info = self.env.reset(*args, seed=seed, options=options)
        return None, gym_utils.from_gym_data(self.observation_space, obs), info

    def render(self) -> Any:
        return self.env.render()

    def close(self) -> None:
        self.env.close()

    def __str__(self) -> str:
        return f"{type(self).__name__}<{self.env}>"

    # the gymnasium env is not an `Env`, so `unwrapped` stays this object; attribute lookups reach into it
    def has_wrapper_attr(self, name: str) -> bool:
        return hasattr(self, name) or hasattr(self.env, name) or bool(
            hasattr(self.env, "has_wrapper_attr") and self.env.has_wrapper_attr(name))

    def get_wrapper_attr(self, name: str) -> Any:
        if hasattr(self, name):
            return getattr(self, name)
        if hasattr(self.env, "get_wrapper_attr"):
            return self.env.get_wrapper_attr(name)
        return getattr(self.env, name)

    def set_wrapper_attr(self, name: str, value: Any) -> None:
        if hasattr(self, name):
            setattr(self, name, value)
        elif hasattr(self.env, "set_wrapper_attr"):
            self.env.set_wrapper_attr(name, value)
        else:
            setattr(self.env, name, value)


def combine_context_obs_space(context_space: Optional[Space], observation_space: Space) -> Space:
    """The space of `combine_context_obs` values (the observation space itself without a context space)."""
    if context_space is None:
        return observation_space
    if isinstance(context_space, DictSpace) and isinstance(observation_space, DictSpace):
        clash = sorted(set(context_space.spaces) & set(observation_space.spaces))
        if clash:
            raise ValueError(f"context and observation spaces share key(s) {clash}; one would hide the other in the "
                             "combined gymnasium observation: rename them")
        spaces: Dict[str, Space] = {**context_space.spaces, **observation_space.spaces}
    elif isinstance(context_space, DictSpace):
        spaces = {**context_space.spaces, "observation": observation_space}
    elif isinstance(observation_space, DictSpace):
        spaces = {**observation_space.spaces, "context": context_space}
    else:
        spaces = {"context": context_space, "observation": observation_space}
    return DictSpace(context_space.backend, spaces, device=context_space.device)


def combine_context_obs(context: Any, observation: Any) -> Any:
    """Context and observation as one value (see `combine_context_obs_space`)."""
    if context is None:
        return observation
    if isinstance(context, dict) and isinstance(observation, dict):
        return {**context, **observation}
    if isinstance(context, dict):
        return {**context, "observation": observation}
    if isinstance(observation, dict):
        return {**observation, "context": context}
    return {"context": context, "observation": observation}


class ToGymnasiumEnv(
    gym.Env[Any, Any],
    Generic[BArrayType, ContextType, ObsType, ActType, RenderFrame, BDeviceType, BDtypeType, BRNGType],
):
    """An unbatched `Env` as a `gymnasium.Env` (spaces through `gym_utils.to_gym_space`; reward as float,
    terminated / truncated as bool)."""

    def __init__(self, env: Env) -> None:
        if not isinstance(env, Env):
            raise TypeError(f"ToGymnasiumEnv needs a unienv_interface Env, got {type(env).__name__}")
        if env.batch_size is not None:
            raise ValueError(f"ToGymnasiumEnv wraps a single environment; this one is batched (batch_size "
                             f"{env.batch_size}); gymnasium vector envs are not supported")
        self.env = env
        self._metadata: Optional[Dict[str, Any]] = None
        self._combined_space = combine_context_obs_space(env.context_space, env.observation_space)
        self.action_space = gym_utils.to_gym_space(env.action_space)
        self.observation_space = gym_utils.to_gym_space(self._combined_space)
        self._episode_context: Any = None

    @property  # type: ignore[override]
    def metadata(self) -> Dict[str, Any]:
        if self._metadata is not None:
            return self._metadata
        meta = dict(self.env.metadata)
        if self.env.render_fps is not None:
            meta["render_fps"] = self.env.render_fps
        return meta

    @metadata.setter
    def metadata(self, value: Dict[str, Any]) -> None:
        self._metadata = value

    render_mode: Forwarded[Optional[str]] = Forwarded(write_through=True)

    def _gym_obs(self, obs: Any) -> Any:
        # a fresh copy of the context each time: gymnasium observations of different calls must not share objects
        return gym_utils.to_gym_data(self._combined_space,
                                     combine_context_obs(copy.deepcopy(self._episode_context), obs))

    def step(self, action: Any) -> Tuple[Any, SupportsFloat, bool, bool, Dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(gym_utils.from_gym_data(self.env.action_space, action))
        return self._gym_obs(obs), float(reward), bool(terminated), bool(truncated), info

    def reset(self, *, seed: Optional[int] = None, options: Optional[Dict[str, Any]] = None,
              **kwargs: Any) -> Tuple[Any, Dict[str, Any]]:
        _no_mask(kwargs.pop("mask", None), "ToGymnasiumEnv")
        super().reset(seed=seed)
        context, obs, info = self.env.reset(seed=seed, **{**kwargs, **(options or {})})
        self._episode_context = context
        return self._gym_obs(obs), info

    def render(self) -> Union[Any, Sequence[Any], None]:  # type: ignore[override]
        return self.env.render()

    def close(self) -> None:
        self.env.close()

    def __str__(self) -> str:
        return f"{type(self).__name__}<{self.env}>"


__all__ = ["FromGymnasiumEnv", "ToGymnasiumEnv", "combine_context_obs_space", "combine_context_obs"]
