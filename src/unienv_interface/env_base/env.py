"""`Env`: a stateful environment with typed spaces and the `reset` / `step` / `render` / `close` lifecycle."""
from __future__ import annotations

import abc
from typing import Any, Dict, Generic, Optional, Sequence, SupportsFloat, Tuple, TypeVar, Union

from unienv_interface.backends.base import BArrayType, BDeviceType, BDtypeType, BRNGType
from unienv_interface.space import Space
from unienv_interface.space.space_utils import batch_utils

ContextType = TypeVar("ContextType")
ObsType = TypeVar("ObsType")
ActType = TypeVar("ActType")
RenderFrame = TypeVar("RenderFrame")

StepResult = Tuple[Any, Union[SupportsFloat, Any], Union[bool, Any], Union[bool, Any], Dict[str, Any]]


class Env(abc.ABC, Generic[BArrayType, ContextType, ObsType, ActType, RenderFrame, BDeviceType, BDtypeType, BRNGType]):
    """An environment: `action_space`, `observation_space` and an optional `context_space` (a per-episode value
    such as a goal, returned by `reset`), a compute `backend` and `device`, and a random generator `rng`.

    * `batch_size is None`: one environment; the spaces describe single values.
    * `batch_size == N` (N >= 1): N environments stepped together; the spaces already carry the leading axis of
      size N (never batch them again), and reward / terminated / truncated are arrays of shape `(N,)`.

    `reset(*, mask=None, seed=None, **kwargs)` returns `(context, obs, info)` (with a `mask`, a batched env returns
    only the reset slots); `step(action)` returns `(obs, reward, terminated, truncated, info)`.

    Type parameters, in the reference's order: array, context, observation, action, render frame, device, dtype,
    random generator (e.g. `Env[np.ndarray, None, np.ndarray, np.ndarray, Any, Any, np.dtype, np.random.Generator]`).
    """

    metadata: Dict[str, Any] = {"render_modes": []}
    render_mode: Optional[str] = None
    render_fps: Optional[int] = None

    backend: Any
    device: Any = None
    batch_size: Optional[int] = None

    action_space: Space
    observation_space: Space
    context_space: Optional[Space] = None

    rng: Any = None

    @abc.abstractmethod
    def step(self, action: Any) -> StepResult:
        """Advances the environment by one step: `(obs, reward, terminated, truncated, info)`."""

    @abc.abstractmethod
    def reset(self, *, mask: Optional[Any] = None, seed: Optional[int] = None,
              **kwargs: Any) -> Tuple[Any, Any, Dict[str, Any]]:
        """Starts a new episode (of the slots in `mask`, for a batched env): `(context, obs, info)`."""

    def render(self) -> Union[RenderFrame, Sequence[RenderFrame], None]:
        """A frame of the current state in `render_mode` (None when the environment does not render)."""
        return None

    def close(self) -> None:
        """Releases the environment's resources (nothing by default)."""

    def __enter__(self) -> "Env":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __str__(self) -> str:
        return f"<{type(self).__name__} instance>"

    # ------------------------------------------------------------------ sampling
    def sample_space(self, space: Space) -> Any:
        """A sample of `space` drawn with (and advancing) `self.rng`."""
        self.rng, value = space.sample(self.rng)
        return value

    def sample_action(self) -> Any:
        """A random action from `action_space`."""
        return self.sample_space(self.action_space)

    def sample_observation(self) -> Any:
        """A random observation from `observation_space`."""
        return self.sample_space(self.observation_space)

    def sample_context(self) -> Any:
        """A random context from `context_space` (None without one)."""
        return None if self.context_space is None else self.sample_space(self.context_space)

    # ------------------------------------------------------------------ masked resets of batched envs
    def update_observation_post_reset(self, old_obs: Any, newobs_masked: Any, mask: Any) -> Any:
        """The full batched observation with the reset slots (`mask`) replaced by `newobs_masked`."""
        self._require_batched("update_observation_post_reset")
        return batch_utils.set_at(self.observation_space, old_obs, mask, newobs_masked)

    def update_context_post_reset(self, old_context: Any, new_context: Any, mask: Any) -> Any:
        """The full batched context with the reset slots (`mask`) replaced by `new_context` (None without one)."""
        self._require_batched("update_context_post_reset")
        if self.context_space is None:
            return None
        return batch_utils.set_at(self.context_space, old_context, mask, new_context)

    def _require_batched(self, what: str) -> None:
        if self.batch_size is None:
            raise RuntimeError(f"{what} applies to batched environments (batch_size is None for {self})")

    # ------------------------------------------------------------------ wrapper chain
    @property
    def unwrapped(self) -> "Env":
        """The innermost environment (this one, for an environment that wraps nothing)."""
        return self

    @property
    def prev_wrapper_layer(self) -> Optional["Env"]:
        """The environment this one wraps (None for an environment that wraps nothing)."""
        return None

    def has_wrapper_attr(self, name: str) -> bool:
        """Whether `name` is an attribute of this environment or of one it wraps."""
        return hasattr(self, name)

    def get_wrapper_attr(self, name: str) -> Any:
        """Attribute `name` of this environment or of the nearest one it wraps that has it."""
        return getattr(self, name)

    def set_wrapper_attr(self, name: str, value: Any) -> None:
        """Sets `name` on the nearest layer that has it (this one when none does)."""
        setattr(self, name, value)


__all__ = ["Env", "ContextType", "ObsType", "ActType", "RenderFrame", "StepResult"]
