"""`Wrapper`: an `Env` around another `Env` that forwards everything unless a subclass overrides it."""
from __future__ import annotations

from typing import Any, Dict, Generic, Optional, Sequence, Tuple, TypeVar, Union

from unienv_interface.backends.base import BArrayType, BDeviceType, BDtypeType, BRNGType

from unienv_interface.space import Space

from ._forwarding import Forwarded
from .env import ActType, ContextType, Env, ObsType, RenderFrame, StepResult

# the types this layer exposes (the wrapped env's are Env's own type variables)
WrapperBArrayT = TypeVar("WrapperBArrayT")
WrapperContextT = TypeVar("WrapperContextT")
WrapperObsT = TypeVar("WrapperObsT")
WrapperActT = TypeVar("WrapperActT")
WrapperRenderFrame = TypeVar("WrapperRenderFrame")
WrapperBDeviceT = TypeVar("WrapperBDeviceT")
WrapperBDtypeT = TypeVar("WrapperBDtypeT")
WrapperBRngT = TypeVar("WrapperBRngT")


class Wrapper(
    Env[WrapperBArrayT, WrapperContextT, WrapperObsT, WrapperActT, WrapperRenderFrame, WrapperBDeviceT,
        WrapperBDtypeT, WrapperBRngT],
    Generic[WrapperBArrayT, WrapperContextT, WrapperObsT, WrapperActT, WrapperRenderFrame, WrapperBDeviceT,
            WrapperBDtypeT, WrapperBRngT,
            BArrayType, ContextType, ObsType, ActType, RenderFrame, BDeviceType, BDtypeType, BRNGType],
):
    """Forwards the lifecycle, spaces, backend, device, batch size and rng to `env`.

    A subclass may assign `action_space`, `observation_space`, `context_space`, `metadata` or `rng` to override
    them for this layer only (assigning None goes back to forwarding); a replacement space must keep the batching
    of the wrapped env.

    Type parameters, as in the reference: this layer's eight (in `Env`'s order), then the wrapped env's eight."""

    def __init__(self, env: Env) -> None:
        if not isinstance(env, Env):
            raise TypeError(f"Wrapper needs a unienv_interface Env, got {type(env).__name__} (wrap a gymnasium env "
                            "with unienv_interface.wrapper.gym_compat.FromGymnasiumEnv first)")
        self.env = env
        self._action_space: Optional[Space] = None
        self._observation_space: Optional[Space] = None
        self._context_space: Optional[Space] = env.context_space
        self._metadata: Optional[Dict[str, Any]] = None
        self._rng: Any = None

    # ------------------------------------------------------------------ forwarded attributes
    # the wrapped env's values; `metadata`, the spaces and `rng` may be overridden for this layer (see the class
    # docstring), `render_mode` and `render_fps` assignments go to the wrapped env
    metadata: Forwarded[Dict[str, Any]] = Forwarded(override=True)
    render_mode: Forwarded[Optional[str]] = Forwarded(write_through=True)
    render_fps: Forwarded[Optional[int]] = Forwarded(write_through=True)
    backend: Forwarded[Any] = Forwarded()
    device: Forwarded[Any] = Forwarded()
    action_space: Forwarded[Space] = Forwarded(override=True)
    observation_space: Forwarded[Space] = Forwarded(override=True)
    rng: Forwarded[Any] = Forwarded(override=True)

    @property  # type: ignore[override]
    def batch_size(self) -> Optional[int]:
        return self.env.batch_size

    @batch_size.setter
    def batch_size(self, value: Optional[int]) -> None:
        raise AttributeError(f"{type(self).__name__}.batch_size is the wrapped env's ({self.env.batch_size}); a "
                             "wrapper cannot change it")

    @property  # type: ignore[override]
    def context_space(self) -> Optional[Space]:
        return self._context_space

    @context_space.setter
    def context_space(self, space: Optional[Space]) -> None:
        self._context_space = space

    # ------------------------------------------------------------------ lifecycle
    def step(self, action: Any) -> StepResult:
        return self.env.step(action)

    def reset(self, *args: Any, mask: Optional[Any] = None, seed: Optional[int] = None,
              **kwargs: Any) -> Tuple[Any, Any, Dict[str, Any]]:
        return self.env.reset(*args, mask=mask, seed=seed, **kwargs)

    def render(self) -> Union[WrapperRenderFrame, Sequence[WrapperRenderFrame], None]:
        return self.env.render()

    def close(self) -> None:
        self.env.close()

    # ------------------------------------------------------------------ wrapper chain
    @property
    def unwrapped(self) -> Env:
        return self.env.unwrapped

    @property
    def prev_wrapper_layer(self) -> Env:
        return self.env

    def has_wrapper_attr(self, name: str) -> bool:
        return hasattr(self, name) or self.env.has_wrapper_attr(name)

    def get_wrapper_attr(self, name: str) -> Any:
        if hasattr(self, name):
            return getattr(self, name)
        try:
            return self.env.get_wrapper_attr(name)
        except AttributeError:
            raise AttributeError(f"neither {type(self).__name__} nor the environments it wraps have an attribute "
                                 f"{name!r}") from None

    def set_wrapper_attr(self, name: str, value: Any) -> None:
        layer: Optional[Env] = self
        while layer is not None:
            if hasattr(layer, name):
                setattr(layer, name, value)
                return
            layer = layer.prev_wrapper_layer
        raise AttributeError(f"neither {type(self).__name__} nor the environments it wraps have an attribute "
                             f"{name!r} to set")

    def __str__(self) -> str:
        return f"<{type(self).__name__}{self.env}>"

    def __repr__(self) -> str:
        return str(self)


__all__ = ["Wrapper", "WrapperBArrayT", "WrapperContextT", "WrapperObsT", "WrapperActT", "WrapperRenderFrame",
           "WrapperBDeviceT", "WrapperBDtypeT", "WrapperBRngT"]
