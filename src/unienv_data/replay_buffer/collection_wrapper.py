"""`ReplayBufferCollectionWrapper`: an `Env` wrapper that records every transition into replay buffers.

Modes (`replay_mode`):

* `"shared"`: one buffer. An unbatched env (or a batched one of size 1) appends one transition per step and ends
  the buffer's segment at each episode end, so every episode is one segment. A batched env of size B > 1 writes
  the B transitions of a step with `extend` (rows of different slots interleave; no segments), so it refuses a
  segment-aware buffer (`maintain_segment_metadata=True`, or a storage listing segments), as the reference does.
* `"per_env"`: one buffer per slot of a batched env (B > 1); slot i appends into buffer i, one segment per episode.
* `"auto"`: `"shared"` for one buffer, `"per_env"` for B buffers and a batch size of B.

What is recorded: the default builder fills the keys of the buffer's `DictSpace` among `obs` (the observation the
action was taken in), `next_obs`, `action`, `reward`, `terminated`, `truncated`, `done` (terminated or truncated),
`context` and `env_index`; any other key is a KeyError when a transition is built (at `step`, as the
reference). A buffer whose space is not a DictSpace records `next_obs` only. `transition_builder` replaces the
default: a callable receiving the keyword arguments `cached_obs, cached_context, action, next_obs, reward,
terminated, truncated, env_index, rb_single_space`, or a `DataTransformation` applied to the canonical dict.

Scalars (reward, flags, env_index) are converted to the dtype of their key's space, refusing values that dtype
cannot hold (a fraction into an integer, 2 into a boolean). Observations are recorded as they come, outside their
declared bounds too (the buffer's storage applies the library's bounds policy).

Episode boundaries: an episode ends at `terminated or truncated`, and also when `reset()` starts a new one first,
so episodes never run into each other. A buffer with a `cache_path` persists every ended episode by itself (its
per-episode durability). `dump_on_episode_end` / `dump_on_reset_boundary` add a `buffer.dumps(...)` after each
ended episode / each reset: into the buffer's own directory every storage then rewrites its own metadata (the
directory alone is in the reference's form), into another one it is a full copy, and a buffer in memory gets its
episodes onto disk that way. One buffer dumps to `dump_path`; with several buffers (per_env) buffer i dumps to
`<dump_path>/<i>`, so no buffer overwrites another's dump.
"""
from __future__ import annotations

import os
from typing import Any, Callable, Dict, List, Literal, Optional, Sequence, Tuple, Union

import numpy as np

from unienv_data.base.forwarding import forwarded
from unienv_interface.backends.base import BArrayType, BDeviceType, BDtypeType, BRNGType
from unienv_interface.env_base.env import ActType, ContextType, Env, ObsType, RenderFrame, StepResult
from unienv_interface.env_base.wrapper import Wrapper
from unienv_interface.space import BinarySpace, BoxSpace, DictSpace, Space
from unienv_interface.space.space_utils import batch_utils
from unienv_interface.transformations import DataTransformation

from .replay_buffer import ReplayBuffer

PathLike = Union[str, "os.PathLike[str]"]
ReplayMode = Literal["auto", "shared", "per_env"]

#: the keys the default transition builder can fill
CANONICAL_KEYS = ("obs", "next_obs", "action", "reward", "terminated", "truncated", "done", "context", "env_index")
_SCALAR_KEYS = ("reward", "terminated", "truncated", "done", "env_index")


def _host(value: Any) -> np.ndarray:
    """A Python / NumPy scalar or an array of any backend as a NumPy array."""
    if isinstance(value, (bool, int, float, np.generic, np.ndarray)):
        return np.asarray(value)
    from unienv_interface.backends import get_backend_from_tensor
    return np.asarray(get_backend_from_tensor(value).to_numpy(value))


def _scalar_to(value: Any, space: Space, key: str) -> Any:
    """A reward / flag / index (Python scalar or array of any backend) as data of `space` (its dtype and backend)."""
    if not isinstance(space, (BoxSpace, BinarySpace)):
        return value
    b = space.backend
    a = _host(value)
    target = b.numpy_dtype(space.dtype)
    if a.dtype.kind not in "biuf":
        raise TypeError(f"transition key {key!r}: expected a number, got {a.dtype} ({value!r:.60})")
    with np.errstate(all="ignore"):
        out = a.astype(target)
        exact = target.kind == "f" or np.array_equal(out.astype(a.dtype), a)
    if not exact:
        raise ValueError(f"transition key {key!r}: {value!r:.60} cannot be stored exactly as {target} (the dtype of "
                         f"the buffer's {key!r} space); give the key a dtype that holds it")
    return b.from_numpy(np.array(out, order="C"), dtype=space.dtype, device=space.device)


class ReplayBufferCollectionWrapper(
    Wrapper[BArrayType, ContextType, ObsType, ActType, RenderFrame, BDeviceType, BDtypeType, BRNGType,
            BArrayType, ContextType, ObsType, ActType, RenderFrame, BDeviceType, BDtypeType, BRNGType],
):
    """Records every step of `env` into `replay_buffers` (see the module docstring for modes, keys and dumps)."""

    @classmethod
    def shared(cls, env: Env, replay_buffer: ReplayBuffer, **kwargs: Any) -> "ReplayBufferCollectionWrapper":
        """One buffer for the whole env (`replay_mode="shared"`)."""
        return cls(env, replay_buffer, replay_mode="shared", **kwargs)

    @classmethod
    def per_env(cls, env: Env, replay_buffers: Sequence[ReplayBuffer], **kwargs: Any) -> "ReplayBufferCollectionWrapper":
        """One buffer per slot of a batched env (`replay_mode="per_env"`)."""
        return cls(env, replay_buffers, replay_mode="per_env", **kwargs)

    def __init__(self, env: Env, replay_buffers: Union[ReplayBuffer, Sequence[ReplayBuffer]],
                 replay_mode: ReplayMode = "auto",
                 transition_builder: Optional[Union[Callable[..., Any], DataTransformation]] = None,
                 validate_transition: bool = False, dump_on_episode_end: bool = False,
                 dump_on_reset_boundary: bool = False, dump_path: Optional[PathLike] = None) -> None:
        super().__init__(env)
        if (dump_on_episode_end or dump_on_reset_boundary) and dump_path is None:
            raise ValueError("dump_path must be provided: dump_on_episode_end / dump_on_reset_boundary need "
                             "dump_path (the directory the buffer is dumped to)")
        if transition_builder is not None and not (callable(transition_builder)
                                                   or isinstance(transition_builder, DataTransformation)):
            raise TypeError(f"transition_builder must be a callable or a DataTransformation, got "
                            f"{type(transition_builder).__name__}")
        self._builder = transition_builder
        self._validate_flag = bool(validate_transition)
        self._dump_on_episode_end = bool(dump_on_episode_end)
        self._dump_on_reset_boundary = bool(dump_on_reset_boundary)
        self.dump_path: Optional[PathLike] = dump_path
        buffers = self._as_list(replay_buffers)
        mode = self._resolve_mode(replay_mode, buffers)
        self._check_layout(buffers, mode)
        self._replay_buffers: List[ReplayBuffer] = buffers
        self._replay_mode = mode
        self._cached_obs: Any = None
        self._cached_context: Any = None
        self._initialized = False

    # ------------------------------------------------------------------ public state
    replay_buffers: List[ReplayBuffer] = forwarded("_replay_buffers", "The buffers being recorded into.")
    replay_mode: str = forwarded("_replay_mode", '`"shared"` or `"per_env"` (`"auto"` resolved).')

    # ------------------------------------------------------------------ lifecycle
    def reset(self, *args: Any, mask: Optional[Any] = None, seed: Optional[int] = None,
              **kwargs: Any) -> Tuple[Any, Any, Dict[str, Any]]:
        """Resets the env; an episode still open in the affected buffers ends here (and is dumped with
        `dump_on_reset_boundary`)."""
        context, obs, info = self.env.reset(*args, mask=mask, seed=seed, **kwargs)
        if self._initialized:
            self._end_open_episodes(mask)
            if mask is not None:
                if self._cached_context is not None:
                    context = self.env.update_context_post_reset(self._cached_context, context, mask)
                if self._cached_obs is not None:
                    obs = self.env.update_observation_post_reset(self._cached_obs, obs, mask)
        self._cached_context, self._cached_obs = context, obs
        self._initialized = True
        return context, obs, info

    def step(self, action: Any) -> StepResult:
        """Steps the env and records the transition; an episode that ends here ends its buffer's segment."""
        if not self._initialized:
            raise RuntimeError("Cannot call step() before reset(): call reset() first so the first observation is "
                               "known")
        obs, reward, terminated, truncated, info = self.env.step(action)
        context = self._cached_context if self.context_space is not None else None
        if self._replay_mode == "per_env":
            self._record_per_env(self._cached_obs, context, action, obs, reward, terminated, truncated)
        else:
            self._record_shared(self._cached_obs, context, action, obs, reward, terminated, truncated)
        self._cached_obs = obs
        return obs, reward, terminated, truncated, info

    # ------------------------------------------------------------------ recording
    def _record_shared(self, prev_obs: Any, context: Any, action: Any, obs: Any, reward: Any, terminated: Any,
                       truncated: Any) -> None:
        rb = self._replay_buffers[0]
        B = self.batch_size
        if B is None:
            self._append(rb, 0, prev_obs, context, action, obs, reward, terminated, truncated, None)
        elif B == 1:
            self._append_slot(rb, 0, prev_obs, context, action, obs, reward, terminated, truncated, None)
        else:
            env_index = self.backend.arange(B, dtype=self.backend.default_integer_dtype)
            t = self._build(prev_obs, context, action, obs, reward, terminated, truncated, env_index, rb, batched=True)
            if self._validate_flag:
                self._validate(t, batch_utils.batch_space(rb.single_space, B))
            rb.extend(t)
            if self._dump_on_episode_end and bool(np.any(self._done_numpy(terminated, truncated))):
                self._dump(0)

    def _record_per_env(self, prev_obs: Any, context: Any, action: Any, obs: Any, reward: Any, terminated: Any,
                        truncated: Any) -> None:
        for i, rb in enumerate(self._replay_buffers):
            self._append_slot(rb, i, prev_obs, context, action, obs, reward, terminated, truncated, i)

    def _append_slot(self, rb: ReplayBuffer, i: int, prev_obs: Any, context: Any, action: Any, obs: Any,
                     reward: Any, terminated: Any, truncated: Any, env_index: Optional[int]) -> None:
        osp = self.observation_space
        self._append(rb, i, batch_utils.get_at(osp, prev_obs, i),
                     None if context is None or self.context_space is None else
                     batch_utils.get_at(self.context_space, context, i),
                     batch_utils.get_at(self.action_space, action, i), batch_utils.get_at(osp, obs, i),
                     self._unbatch_scalar(reward, i), self._unbatch_scalar(terminated, i),
                     self._unbatch_scalar(truncated, i), env_index)

    def _unbatch_scalar(self, value: Any, index: int) -> Any:
        """Slot `index` of a batched env's reward / flag array; an unbatched env's value unchanged (the
        reference's name: code written for it calls this)."""
        return value if self.batch_size is None else value[index]

    def _append(self, rb: ReplayBuffer, slot: int, prev_obs: Any, context: Any, action: Any, obs: Any, reward: Any,
                terminated: Any, truncated: Any, env_index: Optional[int]) -> None:
        t = self._build(prev_obs, context, action, obs, reward, terminated, truncated, env_index, rb, batched=False)
        self._validate(t, rb.single_space)
        rb.append(t)
        if bool(terminated) or bool(truncated):
            rb.mark_segment_end()
            if self._dump_on_episode_end:
                self._dump(slot)

    # ------------------------------------------------------------------ transitions
    def _build(self, prev_obs: Any, context: Any, action: Any, obs: Any, reward: Any, terminated: Any,
               truncated: Any, env_index: Any, rb: ReplayBuffer, *, batched: bool) -> Any:
        space = rb.single_space
        if self._builder is None or isinstance(self._builder, DataTransformation):
            # checked here, when a transition is built (as the reference does), not when the wrapper is built
            self._check_keys(space, self._replay_mode)
        else:
            return self._builder(cached_obs=prev_obs, cached_context=context, action=action, next_obs=obs,
                                 reward=reward, terminated=terminated, truncated=truncated, env_index=env_index,
                                 rb_single_space=space)
        if not isinstance(space, DictSpace):
            return self._env_value("next_obs", obs, space, batched)
        if isinstance(self._builder, DataTransformation):
            raw = {"obs": prev_obs, "next_obs": obs, "action": action, "context": context, "reward": reward,
                   "terminated": terminated, "truncated": truncated, "env_index": env_index}
            canonical = self._canonical(space, raw, batched, convert_env_values=False)
            return self._builder.transform(self._build_canonical_source_space(space, is_batched=batched), canonical)
        raw = {"obs": prev_obs, "next_obs": obs, "action": action, "context": context, "reward": reward,
               "terminated": terminated, "truncated": truncated, "env_index": env_index}
        return self._canonical(space, raw, batched, convert_env_values=True)

    def _env_space(self, key: str, batched: bool) -> Space:
        """The env-side space of `obs` / `next_obs` / `action` / `context` for one recorded row (or batch)."""
        sp = {"obs": self.observation_space, "next_obs": self.observation_space, "action": self.action_space,
              "context": self.context_space}[key]
        if sp is None:
            raise KeyError(f"the env has no {key}_space, so the transition has no {key!r}")
        if self.batch_size is not None and not batched:
            return batch_utils.get_single_space(sp)
        return sp

    def _env_value(self, key: str, value: Any, target: Space, batched: bool) -> Any:
        """An env-side value moved to the backend / device of the buffer's space (unchanged when they agree)."""
        env_space = self._env_space(key, batched)
        if target.backend is env_space.backend and target.device == env_space.device:
            return value
        return env_space.data_to(value, target.backend, target.device)

    def _canonical(self, space: DictSpace, raw: Dict[str, Any], batched: bool, convert_env_values: bool) -> Dict[str, Any]:
        out: Dict[str, Any] = {}
        for key, sub in space.spaces.items():
            if key in ("reward", "terminated", "truncated", "env_index"):
                out[key] = _scalar_to(raw[key], sub, key)
            elif key == "done":
                out[key] = _scalar_to(self._done_numpy(raw["terminated"], raw["truncated"]), sub, key)
            else:
                v = raw[key]
                out[key] = self._env_value(key, v, sub, batched) if convert_env_values else v
        return out

    def _build_canonical_source_space(self, rb_single_space: Space, *, is_batched: bool = False) -> Space:
        """The space of the canonical dict a `DataTransformation` builder receives for a buffer of
        `rb_single_space` (the reference's name: code written for it calls this): env-side keys take the env's
        spaces (already batched for a batched env, one slot's when `is_batched` is False), scalar keys the
        buffer's, batched when `is_batched`. A space that is not a DictSpace is returned as is; KeyError for a key
        the default builder cannot fill."""
        if not isinstance(rb_single_space, DictSpace):
            return rb_single_space
        self._check_keys(rb_single_space, self._replay_mode)
        spaces: Dict[str, Space] = {}
        for key, sub in rb_single_space.spaces.items():
            if key in _SCALAR_KEYS:
                spaces[key] = batch_utils.batch_space(sub, self.batch_size) if is_batched and self.batch_size else sub
            else:
                spaces[key] = self._env_space(key, is_batched)
        return DictSpace(rb_single_space.backend, spaces)

    @staticmethod
    def _done_numpy(terminated: Any, truncated: Any) -> np.ndarray:
        return np.logical_or(_host(terminated).astype(bool), _host(truncated).astype(bool))

    def _validate(self, transition: Any, target: Space) -> None:
        if not self._validate_flag or target.contains(transition):
            return
        if isinstance(target, DictSpace) and isinstance(transition, dict):
            bad = [k for k, s in target.spaces.items() if k not in transition or not s.contains(transition[k])]
            raise ValueError(f"the built transition does not match target space (the buffer's space): key(s) {bad} "
                             f"do not match {[target.spaces[k] for k in bad if k in target.spaces]}")
        raise ValueError(f"the built transition does not match target space (the buffer's space) {target}")

    # ------------------------------------------------------------------ layout and keys
    @staticmethod
    def _as_list(replay_buffers: Union[ReplayBuffer, Sequence[ReplayBuffer]]) -> List[ReplayBuffer]:
        buffers = [replay_buffers] if isinstance(replay_buffers, ReplayBuffer) else list(replay_buffers)
        for i, rb in enumerate(buffers):
            if not isinstance(rb, ReplayBuffer):
                raise TypeError(f"replay_buffers[{i}] is a {type(rb).__name__}, not a ReplayBuffer")
        if not buffers:
            raise ValueError("replay_buffers is empty: give one buffer (shared) or one per env slot (per_env)")
        return buffers

    def _resolve_mode(self, mode: str, buffers: List[ReplayBuffer]) -> Literal["shared", "per_env"]:
        if mode == "shared":
            return "shared"
        if mode == "per_env":
            return "per_env"
        if mode != "auto":
            raise ValueError(f"replay_mode must be 'auto', 'shared' or 'per_env', got {mode!r}")
        B, K = self.batch_size, len(buffers)
        if K == 1:
            if B is not None and B > 1 and self._keeps_segments(buffers[0]):
                raise ValueError(f"Cannot auto-resolve a replay mode for 1 buffer and batch_size {B}: the replay buffer "
                                 "is segment-aware (it keeps episode segments), and shared mode with batch_size > 1 "
                                 "writes interleaved slots without segments; give one buffer per env slot (per_env) or "
                                 "a segment-unaware buffer")
            return "shared"
        if B is not None and B > 1 and K == B:
            return "per_env"
        raise ValueError(f"Cannot auto-resolve a replay mode for {K} buffers and batch_size {B}: give one buffer (shared) "
                         "or one per env slot (per_env), or pass replay_mode")

    def _check_layout(self, buffers: List[ReplayBuffer], mode: str) -> None:
        B, K = self.batch_size, len(buffers)
        if mode == "shared" and K != 1:
            raise ValueError(f"shared mode records into exactly 1 replay buffer, got {K}")
        if mode == "shared" and B is not None and B > 1 and self._keeps_segments(buffers[0]):
            raise ValueError(f"shared mode with batch_size {B} > 1 needs a segment-unaware replay buffer (it writes the "
                             "slots' rows interleaved, with no episode segments); this one keeps segments "
                             "(maintain_segment_metadata=True or a storage listing segments): use per_env mode")
        if mode == "per_env":
            if B is None or B < 2:
                raise ValueError(f"per_env mode needs a batched env with batch_size > 1, got batch_size {B}")
            if K != B:
                raise ValueError(f"per_env mode needs exactly one replay buffer per env slot: {K} buffers for batch_size "
                                 f"{B}")

    @staticmethod
    def _keeps_segments(rb: ReplayBuffer) -> bool:
        """Whether `rb` is segment-aware as the reference defines it: it keeps its own segment list, or its
        storage lists segments (`get_segments()` is not None)."""
        return bool(rb.maintain_segment_metadata) or rb.get_segments() is not None

    def _check_keys(self, space: Space, mode: str) -> None:
        """KeyError for a key of the buffer's space that the default builder cannot fill (unknown, `context`
        without a context_space, `env_index` without a batched env)."""
        if not isinstance(space, DictSpace):
            return
        unknown = [k for k in space.spaces if k not in CANONICAL_KEYS]
        if unknown:
            raise KeyError(f"the buffer's space has key(s) {unknown} that the default transition builder cannot "
                           f"fill; known keys: {list(CANONICAL_KEYS)}. Remove them or pass a transition_builder")
        if "context" in space.spaces and self.context_space is None:
            raise KeyError("the buffer's space has a 'context' key but the env has no context_space: remove the key")
        if "env_index" in space.spaces and mode == "shared" and (self.batch_size or 1) == 1:
            raise KeyError("the buffer's space has an 'env_index' key, which exists only for a batched env (per_env "
                           "mode, or shared mode with batch_size > 1): remove the key")

    # ------------------------------------------------------------------ episode ends and dumps
    def _end_open_episodes(self, mask: Optional[Any]) -> None:
        if self._replay_mode == "per_env":
            m = None if mask is None else np.asarray(self._done_numpy(mask, False))
            slots = [i for i in range(len(self._replay_buffers)) if m is None or bool(m[i])]
        else:
            slots = [0]
        for i in slots:
            rb = self._replay_buffers[i]
            if rb.has_open_segment:
                rb.mark_segment_end()
            if self._dump_on_reset_boundary and len(rb) > 0:
                self._dump(i)

    def _dump_target(self, slot: int) -> str:
        if self.dump_path is None:
            raise RuntimeError("cannot dump: dump_path is None (set wrapper.dump_path)")
        base = os.fspath(self.dump_path)
        return base if len(self._replay_buffers) == 1 else os.path.join(base, str(slot))

    def _dump(self, slot: int) -> None:
        path = self._dump_target(slot)
        os.makedirs(path, exist_ok=True)
        self._replay_buffers[slot].dumps(path)

    # ------------------------------------------------------------------ swapping buffers
    def set_replay_buffers(self, replay_buffers: Union[ReplayBuffer, Sequence[ReplayBuffer]], *,
                           replay_mode: Optional[ReplayMode] = None, require_same_space: bool = True,
                           allow_mid_episode: bool = False, finalize_old_segments: bool = False,
                           dump_old: bool = False) -> List[ReplayBuffer]:
        """Records into other buffers from now on and returns the old ones.

        An episode open in an old buffer blocks the swap (RuntimeError) unless `finalize_old_segments` (end it
        there), `dump_old` (end it, then dump the old buffers to `dump_path`) or `allow_mid_episode` (leave it open;
        the episode continues in the new buffer) is given. With `require_same_space` the new buffers must have the
        old buffers' spaces (ValueError otherwise)."""
        new = self._as_list(replay_buffers)
        mode = self._resolve_mode(replay_mode, new) if replay_mode is not None else self._replay_mode
        self._check_layout(new, mode)
        old = self._replay_buffers
        if require_same_space:
            for i, (a, b) in enumerate(zip(old, new)):
                if a.single_space != b.single_space:
                    raise ValueError(f"new buffer {i} has a different single_space, {b.single_space}, than the old one "
                                     f"{a.single_space}; pass "
                                     "require_same_space=False to allow it")
        open_eps = any(rb.has_open_segment for rb in old)
        if open_eps and not (allow_mid_episode or finalize_old_segments or dump_old):
            raise RuntimeError("an episode is open in the current buffer(s) (open segments): pass "
                               "finalize_old_segments=True (end it there), dump_old=True, or allow_mid_episode=True")
        if finalize_old_segments or dump_old:
            for rb in old:
                if rb.has_open_segment:
                    rb.mark_segment_end()
        if dump_old:
            for i, rb in enumerate(old):
                if len(rb) > 0:
                    self._dump(i)
        self._replay_buffers = new
        self._replay_mode = mode
        return old

    buffer_swap = set_replay_buffers


__all__ = ["ReplayBufferCollectionWrapper", "CANONICAL_KEYS"]
