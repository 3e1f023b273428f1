"""The small environment contract that recorders and bridges need: `Env` and `Wrapper`.

`reset(seed=...)` returns `(context, obs, info)`; `step(action)` returns `(obs, reward, terminated, truncated,
info)`. A batched environment (`batch_size` an int) describes batched data in its spaces already.
"""
from .env import ActType, ContextType, Env, ObsType, RenderFrame
from .wrapper import Wrapper

__all__ = ["Env", "Wrapper", "ContextType", "ObsType", "ActType", "RenderFrame"]
