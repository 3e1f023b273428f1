"""Recording real gymnasium environments: `FromGymnasiumEnv` + `ReplayBufferCollectionWrapper` hold exactly the
transitions the raw env gives for the same seeds and actions, one segment per episode, durable after each episode
(`dump_on_episode_end`); `ToGymnasiumEnv` passes gymnasium's own env checker; per_env recording of a batched env;
the refusals (unknown keys, step before reset, bad layouts)."""
from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import pytest

from _third_party import require_module

gym = require_module("gymnasium", "gym")

from unienv_data.base.errors import BoundsWarning  # noqa: E402
from unienv_data.replay_buffer import ReplayBuffer, ReplayBufferCollectionWrapper  # noqa: E402
from unienv_data.replay_buffer.collection_wrapper import CANONICAL_KEYS  # noqa: E402
from unienv_data.storages.dict_storage import DictStorage  # noqa: E402
from unienv_data.storages.native_layout import native_layout_kwargs  # noqa: E402
from unienv_interface.backends import NumpyComputeBackend as NB  # noqa: E402
from unienv_interface.env_base import Env, Wrapper  # noqa: E402
from unienv_interface.space import BinarySpace, BoxSpace, DictSpace, Space  # noqa: E402
from unienv_interface.space.space_utils import batch_utils  # noqa: E402
from unienv_interface.wrapper.gym_compat import FromGymnasiumEnv, ToGymnasiumEnv  # noqa: E402

SEEDS = [0, 1, 2, 3, 4]
MAX_STEPS = 14          # short enough that some episodes are truncated, long enough that others terminate


def _actions(n: int = 2000) -> np.ndarray:
    return np.random.default_rng(7).integers(0, 2, size=n)


def _raw_transitions() -> Tuple[List[Dict[str, Any]], List[int]]:
    """The transitions of the raw gymnasium CartPole for SEEDS and `_actions()`, and the episode lengths."""
    env = gym.make("CartPole-v1", max_episode_steps=MAX_STEPS)
    actions, k, rows, lengths = _actions(), 0, [], []
    for seed in SEEDS:
        obs, _ = env.reset(seed=seed)
        n, done = 0, False
        while not done:
            a = int(actions[k])
            k += 1
            nxt, reward, term, trunc, _ = env.step(a)
            rows.append({"obs": obs, "next_obs": nxt, "action": a, "reward": reward, "terminated": term,
                         "truncated": trunc})
            obs, done, n = nxt, term or trunc, n + 1
        lengths.append(n)
    env.close()
    return rows, lengths


def _step_space(env: Env) -> DictSpace:
    return DictSpace(NB, {"obs": env.observation_space, "next_obs": env.observation_space,
                          "action": env.action_space, "reward": BoxSpace(NB, -np.inf, np.inf, np.float64, shape=()),
                          "terminated": BinarySpace(NB, ()), "truncated": BinarySpace(NB, ()),
                          "done": BinarySpace(NB, ())})


def _record(env: Env, buffer: ReplayBuffer, **kwargs: Any) -> ReplayBufferCollectionWrapper:
    wrapper = ReplayBufferCollectionWrapper(env, buffer, **kwargs)
    actions, k = _actions(), 0
    for seed in SEEDS:
        ctx, _obs, _ = wrapper.reset(seed=seed)
        assert ctx is None
        done = False
        while not done:
            _, _, term, trunc, _ = wrapper.step(np.asarray(actions[k], dtype=np.int64))
            k += 1
            done = term or trunc
    return wrapper


def _assert_matches(buffer: ReplayBuffer, rows: List[Dict[str, Any]], lengths: List[int]) -> None:
    assert len(buffer) == len(rows)
    ends = np.cumsum(lengths).tolist()
    assert buffer.episode_segments() == list(zip([0] + ends[:-1], ends))     # one segment per episode
    got = buffer.get_at(np.arange(len(rows)))
    for key in ("obs", "next_obs"):
        want = np.stack([r[key] for r in rows])
        assert got[key].dtype == np.float32 and np.array_equal(got[key], want), key   # bit for bit
    assert got["action"].dtype == np.int64 and got["action"].tolist() == [r["action"] for r in rows]
    assert got["reward"].tolist() == [r["reward"] for r in rows]
    for key in ("terminated", "truncated"):
        assert got[key].tolist() == [bool(r[key]) for r in rows], key
    assert got["done"].tolist() == [bool(r["terminated"] or r["truncated"]) for r in rows]


def test_cartpole_recording_equals_the_raw_env(tmp_path: Any) -> None:
    rows, lengths = _raw_transitions()
    assert any(r["terminated"] for r in rows) and any(r["truncated"] for r in rows)   # both kinds of episode end
    env = FromGymnasiumEnv(gym.make("CartPole-v1", max_episode_steps=MAX_STEPS))
    assert env.action_space == BoxSpace(NB, 0, 1, np.int64, shape=())
    space = _step_space(env)
    out = os.fspath(tmp_path / "cartpole")
    buffer = ReplayBuffer.create(DictStorage, space, cache_path=out, capacity=None, **native_layout_kwargs(space))
    _record(env, buffer, dump_on_episode_end=True, dump_path=out)
    _assert_matches(buffer, rows, lengths)
    buffer.close()
    reloaded = ReplayBuffer.load_from(out, backend=NB)
    _assert_matches(reloaded, rows, lengths)                      # what the dumps made durable
    reloaded.close()


def test_each_finished_episode_is_durable_before_the_next(tmp_path: Any) -> None:
    env = FromGymnasiumEnv(gym.make("CartPole-v1", max_episode_steps=MAX_STEPS))
    space = DictSpace(NB, {"obs": env.observation_space, "action": env.action_space})
    dst = os.fspath(tmp_path / "dump")
    buffer = ReplayBuffer.create(DictStorage, space, capacity=200, **native_layout_kwargs(space))   # in RAM
    wrapper = ReplayBufferCollectionWrapper(env, buffer, dump_on_episode_end=True, dump_path=dst)
    actions = _actions()
    seen = []
    for e, seed in enumerate(SEEDS[:3]):
        wrapper.reset(seed=seed)
        done = False
        while not done:
            _, _, term, trunc, _ = wrapper.step(np.int64(actions[len(buffer)]))
            done = term or trunc
        on_disk = ReplayBuffer.load_from(dst, backend=NB)
        seen.append((len(on_disk), len(on_disk.episode_segments() or [])))
        assert np.array_equal(on_disk.get_at(np.arange(len(on_disk)))["obs"],
                              buffer.get_at(np.arange(len(buffer)))["obs"])
        on_disk.close()
    assert [s for _, s in seen] == [1, 2, 3]
    assert [n for n, _ in seen] == sorted(n for n, _ in seen)


def test_reset_mid_episode_ends_the_segment() -> None:
    env = FromGymnasiumEnv(gym.make("CartPole-v1"))
    space = DictSpace(NB, {"obs": env.observation_space, "reward": BoxSpace(NB, -10.0, 10.0, np.float32, shape=())})
    buffer = ReplayBuffer.create(DictStorage, space, capacity=50, **native_layout_kwargs(space))
    wrapper = ReplayBufferCollectionWrapper.shared(env, buffer, dump_on_reset_boundary=False)
    wrapper.reset(seed=0)
    for _ in range(3):
        wrapper.step(np.int64(0))
    wrapper.reset(seed=1)                  # the 3-step episode was cut short: it is still its own segment
    wrapper.step(np.int64(1))
    wrapper.step(np.int64(1))
    assert buffer.has_open_segment
    wrapper.reset(seed=2)
    assert buffer.episode_segments() == [(0, 3), (3, 5)]
    assert buffer.get_at(0)["reward"].dtype == np.float32


def test_buffer_without_dict_space_records_next_obs() -> None:
    env = FromGymnasiumEnv(gym.make("CartPole-v1"))
    buffer = ReplayBuffer.create(DictStorage, DictSpace(NB, {"x": env.observation_space}), capacity=4,
                                 **native_layout_kwargs(DictSpace(NB, {"x": env.observation_space})))
    unchecked = ReplayBufferCollectionWrapper(env, buffer)     # keys are checked at step, as the reference does
    unchecked.reset(seed=0)
    with pytest.raises(KeyError, match=r"key\(s\) \['x'\] that the default transition builder cannot fill"):
        unchecked.step(np.int64(1))
    assert len(buffer) == 0
    wrapper = ReplayBufferCollectionWrapper(
        env, buffer, transition_builder=lambda **kw: {"x": kw["next_obs"]}, validate_transition=True)
    _, obs0, _ = wrapper.reset(seed=0)
    obs1 = wrapper.step(np.int64(1))[0]
    assert np.array_equal(buffer.get_at(0)["x"], obs1) and not np.array_equal(obs0, obs1)


def test_refusals() -> None:
    env = FromGymnasiumEnv(gym.make("CartPole-v1"))
    space = DictSpace(NB, {"obs": env.observation_space})
    buffer = ReplayBuffer.create(DictStorage, space, capacity=4, **native_layout_kwargs(space))
    with pytest.raises(ValueError, match="need dump_path"):
        ReplayBufferCollectionWrapper(env, buffer, dump_on_episode_end=True)
    with pytest.raises(ValueError, match="per_env mode needs a batched env"):
        ReplayBufferCollectionWrapper.per_env(env, [buffer])
    for key in ("context", "env_index"):
        sp = DictSpace(NB, {"obs": env.observation_space, key: BoxSpace(NB, 0, 9, np.int64, shape=())})
        other = ReplayBuffer.create(DictStorage, sp, capacity=4, **native_layout_kwargs(sp))
        keyed = ReplayBufferCollectionWrapper(env, other)        # builds: the key is refused at step
        keyed.reset(seed=0)
        with pytest.raises(KeyError, match=f"'{key}' key"):
            keyed.step(np.int64(0))
        assert len(other) == 0
    wrapper = ReplayBufferCollectionWrapper(env, buffer)
    with pytest.raises(RuntimeError, match=r"step\(\) before reset\(\)"):
        wrapper.step(np.int64(0))
    with pytest.raises(ValueError, match="reset\\(mask=...\\) does not apply"):
        env.reset(mask=np.array([True]))
    with pytest.raises(TypeError, match="needs a gymnasium.Env"):
        FromGymnasiumEnv(env)  # type: ignore[arg-type]
    assert set(CANONICAL_KEYS) == {"obs", "next_obs", "action", "reward", "terminated", "truncated", "done",
                                   "context", "env_index"}


def test_scalar_keys_refuse_values_their_dtype_cannot_hold() -> None:
    env = FromGymnasiumEnv(gym.make("CartPole-v1"))
    space = DictSpace(NB, {"obs": env.observation_space, "reward": BoxSpace(NB, 0, 5, np.int64, shape=())})
    buffer = ReplayBuffer.create(DictStorage, space, capacity=4, **native_layout_kwargs(space))
    wrapper = ReplayBufferCollectionWrapper(env, buffer)
    wrapper.reset(seed=0)
    wrapper.step(np.int64(0))                          # CartPole's reward 1.0 is an exact integer
    assert buffer.get_at(0)["reward"].tolist() == 1
    wrapper.env.env = gym.wrappers.TransformReward(wrapper.env.env, lambda r: r * 0.5)   # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="transition key 'reward': 0.5 cannot be stored exactly as int64"):
        wrapper.step(np.int64(0))


class _OutOfBounds(gym.Env):
    """Observations outside the declared Box bounds (as some real envs produce)."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed: Optional[int] = None, options: Optional[dict] = None) -> Tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.t = 0
        return np.array([0.5, 5.0], np.float32), {}

    def step(self, action: Any) -> Tuple[np.ndarray, float, bool, bool, dict]:
        self.t += 1
        return np.array([-7.0, 0.25], np.float32), 1.0, self.t >= 2, False, {}


def test_observations_outside_their_bounds_are_recorded() -> None:
    """The bounds policy: values outside the declared Box are stored as given, with a BoundsWarning."""
    env = FromGymnasiumEnv(_OutOfBounds())
    space = DictSpace(NB, {"obs": env.observation_space, "next_obs": env.observation_space})
    buffer = ReplayBuffer.create(DictStorage, space, capacity=4, **native_layout_kwargs(space))
    wrapper = ReplayBufferCollectionWrapper(env, buffer)
    wrapper.reset(seed=0)
    with pytest.warns(BoundsWarning):
        wrapper.step(np.int64(0))
        wrapper.step(np.int64(1))
    got = buffer.get_at(np.arange(2))
    assert got["obs"].tolist() == [[0.5, 5.0], [-7.0, 0.25]]
    assert got["next_obs"].tolist() == [[-7.0, 0.25], [-7.0, 0.25]]


# ---------------------------------------------------------------------------------------------------- batched envs
class _VectorCartPole(Env):
    """N CartPoles stepped together (a batched `Env`: spaces and flags carry the leading axis N); an episode that
    ends is reset automatically with the next seed, and `reset(mask=...)` resets only the masked slots."""

    def __init__(self, n: int) -> None:
        self.envs = [FromGymnasiumEnv(gym.make("CartPole-v1", max_episode_steps=MAX_STEPS)) for _ in range(n)]
        self.backend, self.device, self.batch_size = NB, None, n
        self.observation_space = batch_utils.batch_space(self.envs[0].observation_space, n)
        self.action_space = batch_utils.batch_space(self.envs[0].action_space, n)
        self.next_seed = 100

    def reset(self, *, mask: Optional[Any] = None, seed: Optional[int] = None, **kw: Any) -> Tuple[Any, Any, Dict]:
        idx = [i for i in range(self.batch_size or 0) if mask is None or mask[i]]
        obs = [self.envs[i].reset(seed=None if seed is None else seed + i)[1] for i in idx]
        return None, np.stack(obs), {}

    def step(self, action: Any) -> Tuple[Any, Any, Any, Any, Dict]:
        out = [e.step(np.int64(a)) for e, a in zip(self.envs, action)]
        obs = np.stack([o[0] for o in out])
        term = np.array([o[2] for o in out])
        trunc = np.array([o[3] for o in out])
        for i in np.flatnonzero(term | trunc):     # autoreset: the next observation starts the next episode
            self.next_seed += 1
            obs[i] = self.envs[i].reset(seed=self.next_seed)[1]
        return obs, np.array([o[1] for o in out]), term, trunc, {}


def test_per_env_recording_of_a_batched_env(tmp_path: Any) -> None:
    venv = _VectorCartPole(3)
    single = DictSpace(NB, {"action": venv.envs[0].action_space, "terminated": BinarySpace(NB, ()),
                            "env_index": BoxSpace(NB, 0, 2, np.int64, shape=()),
                            "reward": BoxSpace(NB, 0.0, 1.0, np.float32, shape=())})
    buffers = [ReplayBuffer.create(DictStorage, single, capacity=None, **native_layout_kwargs(single))
               for _ in range(3)]
    wrapper = ReplayBufferCollectionWrapper(venv, buffers, dump_on_episode_end=True, dump_path=os.fspath(tmp_path))
    assert wrapper.replay_mode == "per_env"
    wrapper.reset(seed=0)
    rng = np.random.default_rng(3)
    ends = [0, 0, 0]
    for _ in range(40):
        _, _, term, trunc, _ = wrapper.step(rng.integers(0, 2, size=3))
        ends = [e + int(d) for e, d in zip(ends, term | trunc)]
    for i, rb in enumerate(buffers):
        assert len(rb) == 40 and rb.get_at(np.arange(40))["env_index"].tolist() == [i] * 40
        assert len(rb.episode_segments() or []) == ends[i] and ends[i] >= 2
        on_disk = ReplayBuffer.load_from(os.path.join(os.fspath(tmp_path), str(i)), backend=NB)
        assert len(on_disk.episode_segments() or []) == ends[i]       # each buffer dumped to its own directory
        on_disk.close()
    # a masked reset ends the open episodes of the masked slots only
    open_before = [rb.has_open_segment for rb in buffers]
    wrapper.reset(mask=np.array([True, False, False]))
    assert [rb.has_open_segment for rb in buffers] == [False] + open_before[1:]


def test_shared_recording_of_a_batched_env_extends() -> None:
    venv = _VectorCartPole(2)
    single = DictSpace(NB, {"obs": venv.envs[0].observation_space, "env_index": BoxSpace(NB, 0, 1, np.int64, shape=())})
    rb = ReplayBuffer.create(DictStorage, single, capacity=None, **native_layout_kwargs(single))
    wrapper = ReplayBufferCollectionWrapper.shared(venv, rb)
    _, obs0, _ = wrapper.reset(seed=5)
    wrapper.step(np.array([0, 1]))
    got = rb.get_at(np.arange(2))
    assert got["env_index"].tolist() == [0, 1] and np.array_equal(got["obs"], obs0)


def test_shared_batched_recording_refuses_a_segment_aware_buffer() -> None:
    venv = _VectorCartPole(2)
    single = DictSpace(NB, {"obs": venv.envs[0].observation_space})
    aware = ReplayBuffer.create(DictStorage, single, capacity=None, maintain_segment_metadata=True,
                                **native_layout_kwargs(single))
    with pytest.raises(ValueError, match="Cannot auto-resolve.*segment-aware"):
        ReplayBufferCollectionWrapper(venv, aware)
    with pytest.raises(ValueError, match="needs a segment-unaware replay buffer"):
        ReplayBufferCollectionWrapper.shared(venv, aware)
    plain = ReplayBuffer.create(DictStorage, single, capacity=None, **native_layout_kwargs(single))
    wrapper = ReplayBufferCollectionWrapper(venv, plain)
    assert wrapper.replay_mode == "shared"
    with pytest.raises(ValueError, match="needs a segment-unaware replay buffer"):
        wrapper.set_replay_buffers(aware)
    one = FromGymnasiumEnv(gym.make("CartPole-v1"))      # an unbatched env records into it, one segment an episode
    assert ReplayBufferCollectionWrapper(one, aware).replay_mode == "shared"


def test_set_replay_buffers_swaps_between_episodes() -> None:
    env = FromGymnasiumEnv(gym.make("CartPole-v1"))
    space = DictSpace(NB, {"obs": env.observation_space})
    a, b = (ReplayBuffer.create(DictStorage, space, capacity=50, **native_layout_kwargs(space)) for _ in range(2))
    wrapper = ReplayBufferCollectionWrapper(env, a)
    wrapper.reset(seed=0)
    wrapper.step(np.int64(0))
    with pytest.raises(RuntimeError, match="an episode is open"):
        wrapper.set_replay_buffers(b)
    assert wrapper.set_replay_buffers(b, finalize_old_segments=True) == [a]
    wrapper.step(np.int64(0))
    assert (len(a), len(b), a.episode_segments()) == (1, 1, [(0, 1)])
    other = DictSpace(NB, {"obs": BoxSpace(NB, -1.0, 1.0, np.float32, shape=(4,))})
    c = ReplayBuffer.create(DictStorage, other, capacity=5, **native_layout_kwargs(other))
    with pytest.raises(ValueError, match="require_same_space=False"):
        wrapper.set_replay_buffers(c, allow_mid_episode=True)


# ---------------------------------------------------------------------------------------------------- both ways
def test_to_gymnasium_env_passes_gymnasiums_checker() -> None:
    from gymnasium.utils.env_checker import check_env
    inner = FromGymnasiumEnv(gym.make("CartPole-v1"))
    wrapped = ToGymnasiumEnv(Wrapper(inner))
    assert wrapped.action_space == gym.spaces.Discrete(2)         # the Discrete comes back as a Discrete
    assert wrapped.observation_space == gym.make("CartPole-v1").observation_space
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")        # the checker's advice about CartPole's infinite bounds
        check_env(wrapped, skip_render_check=True)
    raw = gym.make("CartPole-v1")
    o1, _ = raw.reset(seed=11)
    o2, _ = wrapped.reset(seed=11)
    assert np.array_equal(o1, o2)
    for a in [0, 1, 1, 0]:
        r1, r2 = raw.step(a), wrapped.step(np.int64(a))
        assert np.array_equal(r1[0], r2[0]) and r1[1:4] == r2[1:4]


class _GoalEnv(Env):
    """An env with a context (a goal drawn at reset): ToGymnasiumEnv merges it into a Dict observation."""

    def __init__(self) -> None:
        self.backend = NB
        self.observation_space = DictSpace(NB, {"pos": BoxSpace(NB, -1.0, 1.0, np.float32, shape=(2,))})
        self.context_space = DictSpace(NB, {"goal": BoxSpace(NB, -1.0, 1.0, np.float32, shape=(2,))})
        self.action_space = BoxSpace(NB, -1.0, 1.0, np.float32, shape=(2,))
        self.rng = np.random.default_rng(0)

    def reset(self, *, mask: Any = None, seed: Optional[int] = None, **kw: Any) -> Tuple[Any, Any, Dict]:
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.pos = np.zeros(2, np.float32)
        return {"goal": self.sample_context()["goal"]}, {"pos": self.pos.copy()}, {}

    def step(self, action: Any) -> Tuple[Any, Any, Any, Any, Dict]:
        self.pos = np.clip(self.pos + 0.1 * action, -1, 1).astype(np.float32)
        return {"pos": self.pos.copy()}, 0.0, False, False, {}


def test_context_is_recorded_and_merged_for_gymnasium() -> None:
    env = _GoalEnv()
    space = DictSpace(NB, {"obs": env.observation_space, "context": env.context_space, "action": env.action_space})
    rb = ReplayBuffer.create(DictStorage, space, capacity=10, **native_layout_kwargs(space))
    wrapper = ReplayBufferCollectionWrapper(env, rb, validate_transition=True)
    ctx, _, _ = wrapper.reset(seed=3)
    wrapper.step(np.ones(2, np.float32))
    assert np.array_equal(rb.get_at(0)["context"]["goal"], ctx["goal"])
    g = ToGymnasiumEnv(_GoalEnv())
    assert set(g.observation_space.spaces) == {"goal", "pos"}
    obs, _ = g.reset(seed=3)
    assert np.array_equal(obs["goal"], ctx["goal"]) and g.observation_space.contains(obs)


def test_transformation_builder_and_reset_boundary_dumps(tmp_path: Any) -> None:
    from unienv_interface.transformations import IdentityTransformation
    env = FromGymnasiumEnv(gym.make("CartPole-v1"))
    space = DictSpace(NB, {"obs": env.observation_space, "action": env.action_space, "done": BinarySpace(NB, ())})
    rb = ReplayBuffer.create(DictStorage, space, capacity=20, **native_layout_kwargs(space))
    out = os.fspath(tmp_path / "rb")
    wrapper = ReplayBufferCollectionWrapper(env, rb, transition_builder=IdentityTransformation(),
                                            dump_on_reset_boundary=True, dump_path=out)
    _, obs0, _ = wrapper.reset(seed=0)
    wrapper.step(np.int64(1))
    wrapper.step(np.int64(0))
    assert not os.path.exists(os.path.join(out, "metadata.json"))     # nothing dumped before a reset
    wrapper.reset(seed=1)
    on_disk = ReplayBuffer.load_from(out, backend=NB)
    assert on_disk.episode_segments() == [(0, 2)]
    got = on_disk.get_at(np.arange(2))
    assert np.array_equal(got["obs"][0], obs0) and got["action"].tolist() == [1, 0] and not got["done"].any()
    on_disk.close()


def test_numpy_env_into_a_torch_buffer() -> None:
    torch = pytest.importorskip("torch")
    from unienv_interface.backends.pytorch import PyTorchComputeBackend as TB
    env = FromGymnasiumEnv(gym.make("CartPole-v1"))
    space = DictSpace(TB, {"obs": env.observation_space.to(TB), "action": env.action_space.to(TB),
                           "reward": BoxSpace(TB, -10.0, 10.0, torch.float32, shape=()), "done": BinarySpace(TB, ())})
    rb = ReplayBuffer.create(DictStorage, space, capacity=8, **native_layout_kwargs(space))
    wrapper = ReplayBufferCollectionWrapper(env, rb, validate_transition=True)
    _, obs0, _ = wrapper.reset(seed=0)
    wrapper.step(np.int64(1))
    got = rb.get_at(0)
    assert torch.equal(got["obs"], torch.from_numpy(obs0)) and got["action"].dtype == torch.int64
    assert got["reward"].item() == 1.0 and got["done"].dtype == torch.bool


def test_unbatch_scalar_takes_a_slot_only_of_a_batched_env() -> None:
    # the reference's helper, which code written for it calls: a batched env's slot, an unbatched env's value as is
    one = ReplayBufferCollectionWrapper(FromGymnasiumEnv(gym.make("CartPole-v1")), ReplayBuffer.create(
        DictStorage, DictSpace(NB, {"reward": BoxSpace(NB, 0.0, 1.0, np.float32, shape=())}), capacity=2,
        **native_layout_kwargs(DictSpace(NB, {"reward": BoxSpace(NB, 0.0, 1.0, np.float32, shape=())}))))
    assert one._unbatch_scalar(1.0, 0) == 1.0 and one._unbatch_scalar([4, 5], 1) == [4, 5]
    venv = _VectorCartPole(3)
    single = DictSpace(NB, {"obs": venv.envs[0].observation_space})
    many = ReplayBufferCollectionWrapper(venv, ReplayBuffer.create(DictStorage, single, capacity=None,
                                                                   **native_layout_kwargs(single)))
    assert many._unbatch_scalar(np.array([1.0, 2.0, 3.0]), 1) == 2.0


def test_build_canonical_source_space_has_the_shapes_the_transformation_gets() -> None:
    # the reference's helper (code written for it calls it): a batched env's spaces are not batched twice
    venv = _VectorCartPole(3)
    single = DictSpace(NB, {"obs": venv.envs[0].observation_space, "reward": BoxSpace(NB, 0.0, 1.0, np.float32, shape=()),
                            "env_index": BoxSpace(NB, 0, 2, np.int64, shape=())})
    wrapper = ReplayBufferCollectionWrapper(venv, ReplayBuffer.create(DictStorage, single, capacity=None,
                                                                      **native_layout_kwargs(single)))
    src = wrapper._build_canonical_source_space(single, is_batched=True)
    assert isinstance(src, DictSpace)
    assert [src.spaces[k].shape for k in ("obs", "reward", "env_index")] == [(3, 4), (3,), (3,)]
    env = FromGymnasiumEnv(gym.make("CartPole-v1"))
    one = ReplayBufferCollectionWrapper(env, ReplayBuffer.create(DictStorage, single, capacity=2,
                                                                 **native_layout_kwargs(single)))
    with pytest.raises(KeyError, match="'env_index' key"):
        one._build_canonical_source_space(single)
    assert one._build_canonical_source_space(single["obs"]) is single["obs"]
