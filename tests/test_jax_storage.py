"""JAX end to end: a JAX space stored through the native layout and the backend adapter, read back as JAX arrays,
sampled from a replay buffer, and reopened; and JAX's default 32-bit mode (in a subprocess), where 64-bit values
are narrowed only when they fit exactly."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path
from typing import Any, Dict

import numpy as np
import pytest

from unienv_data.base.errors import BoundsWarning

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

from unienv_data.replay_buffer import ReplayBuffer  # noqa: E402
from unienv_data.samplers.step_sampler import StepSampler  # noqa: E402
from unienv_data.storages.backend_compat import ToBackendOrDeviceStorage  # noqa: E402
from unienv_data.storages.flattened import FlattenedStorage  # noqa: E402
from unienv_data.storages.native_layout import create_native_storage, load_native_storage  # noqa: E402
from unienv_data.storages.numpy_memmap import NumpyMemmapStorage  # noqa: E402
from unienv_interface.backends.jax import JaxComputeBackend as JB  # noqa: E402
from unienv_interface.space import BinarySpace, BoxSpace, DictSpace  # noqa: E402

REPO_SRC = str(Path(__file__).resolve().parents[1] / "src")


def jax_space() -> DictSpace:
    return DictSpace(JB, {
        "obs": BoxSpace(JB, -np.inf, np.inf, jnp.float32, shape=(4,)),
        "action": BoxSpace(JB, -1.0, 1.0, jnp.float32, shape=(2,)),
        "step": BoxSpace(JB, 0, 2**40, jnp.int64, shape=()),
        "done": BinarySpace(JB, ()),
        "image": BoxSpace(JB, 0, 255, jnp.uint8, shape=(6, 6, 3)),
    })


def episode(n: int, seed: int) -> Dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"obs": rng.standard_normal((n, 4)).astype(np.float32),
            "action": rng.uniform(-1, 1, (n, 2)).astype(np.float32),
            "step": (np.arange(n, dtype=np.int64) + 2**33),
            "done": np.arange(n) == n - 1,
            "image": rng.integers(0, 256, (n, 6, 6, 3), dtype=np.uint8)}


def as_jax(batch: Dict[str, np.ndarray], i: Any = None) -> Dict[str, Any]:
    return {k: jnp.asarray(v if i is None else v[i]) for k, v in batch.items()}


def assert_same(got: Dict[str, Any], want: Dict[str, np.ndarray]) -> None:
    assert set(got) == set(want)
    for key, value in got.items():
        assert isinstance(value, jax.Array), (key, type(value))
        assert value.dtype == want[key].dtype, (key, value.dtype, want[key].dtype)
        np.testing.assert_array_equal(np.asarray(value), want[key], err_msg=key)


def test_native_layout_serves_a_jax_space_and_reopens(tmp_path: Path) -> None:
    space = jax_space()
    ep = episode(5, 0)
    st = create_native_storage(space, capacity=16, cache_path=tmp_path / "native")
    assert isinstance(st, ToBackendOrDeviceStorage)
    st.mark_segment_start(0)
    for i in range(5):
        st.append(as_jax(ep, i))
    st.mark_segment_end()
    assert_same(st.get(slice(0, 5)), ep)
    assert_same(st.get(jnp.array([4, 0])), {k: v[[4, 0]] for k, v in ep.items()})
    st.dumps(tmp_path / "native")
    st.close()
    back = load_native_storage(tmp_path / "native", space)
    assert back.episode_segments() == [(0, 4)]
    assert_same(back.get(slice(0, 5)), ep)
    # the image stays uint8 on disk: the raw bytes of the native layout, not a promoted float row
    image_files = [p for p in (tmp_path / "native").rglob("*") if p.is_file() and "image" in str(p)
                   and p.suffix not in (".json",)]
    assert image_files and sum(p.stat().st_size for p in image_files) == 16 * 6 * 6 * 3
    back.close()


def test_jax_writes_are_checked_like_any_other(tmp_path: Path) -> None:
    st = create_native_storage(jax_space(), capacity=4)
    st.mark_segment_start(0)
    bad = as_jax(episode(1, 1), 0)
    bad["action"] = jnp.array([0.5, 3.0], jnp.float32)  # outside [-1, 1]: refused in the refusal mode
    with warnings.catch_warnings():
        warnings.simplefilter("error", BoundsWarning)
        with pytest.raises(ValueError, match="action"):
            st.append(bad)
    bad = as_jax(episode(1, 1), 0)
    bad["obs"] = jnp.zeros((2, 2), jnp.float32)  # same element count, wrong shape
    with pytest.raises(ValueError, match="obs"):
        st.append(bad)
    row = st.get(0)  # nothing of either refused step was written
    assert float(jnp.abs(row["obs"]).sum()) == 0.0 and float(jnp.abs(row["action"]).sum()) == 0.0


def test_replay_buffer_samples_jax_batches(tmp_path: Path) -> None:
    space = jax_space()
    flat_space = DictSpace(JB, {k: v for k, v in space.spaces.items() if k in ("obs", "action")})
    rb = ReplayBuffer.create(ToBackendOrDeviceStorage, flat_space, FlattenedStorage, NumpyMemmapStorage,
                             capacity=32, cache_path=tmp_path / "rb", backend="numpy")
    ep = {k: v for k, v in episode(20, 2).items() if k in ("obs", "action")}
    rb.extend(as_jax(ep))
    assert len(rb) == 20
    sampler = StepSampler(rb, batch_size=8, seed=0)
    batch = sampler.sample()
    assert isinstance(batch["obs"], jax.Array) and batch["obs"].shape == (8, 4)
    rows = {tuple(np.asarray(r).tolist()) for r in batch["obs"]}
    assert rows <= {tuple(r.tolist()) for r in ep["obs"]}
    rb.dumps()
    rb.close()
    again = ReplayBuffer.load_from(tmp_path / "rb", backend=JB)
    assert len(again) == 20
    assert_same(again.get_at(slice(0, 20)), ep)
    again.close()


_DEFAULT_MODE_SCRIPT = textwrap.dedent('''
    import sys, numpy as np
    import jax, jax.numpy as jnp
    assert not jax.config.read("jax_enable_x64")
    from unienv_interface.backends.jax import JaxComputeBackend as JB
    from unienv_interface.space import BinarySpace, BoxSpace, DictSpace
    from unienv_data.storages.native_layout import create_native_storage
    space = DictSpace(JB, {"obs": BoxSpace(JB, -np.inf, np.inf, jnp.float32, shape=(3,)),
                           "done": BinarySpace(JB, ()),
                           "image": BoxSpace(JB, 0, 255, jnp.uint8, shape=(4, 4, 3))})
    st = create_native_storage(space, capacity=4, cache_path=sys.argv[1])
    st.mark_segment_start(0)
    st.append({"obs": jnp.arange(3, dtype=jnp.float32), "done": jnp.array(True),
               "image": jnp.full((4, 4, 3), 200, jnp.uint8)})
    st.mark_segment_end()
    out = st.get(slice(0, 1))
    print(out["obs"].dtype, out["done"].dtype, out["image"].dtype, int(out["image"].sum()))
    try:
        JB.from_numpy(np.array([2**40], np.int64))
    except ValueError as exc:
        print("refused:", "JAX_ENABLE_X64" in str(exc))
    print("fits:", JB.from_numpy(np.array([7], np.int64)).dtype)
''')


def test_jax_default_32_bit_mode_in_a_subprocess(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "JAX_ENABLE_X64"}
    env["PYTHONPATH"] = REPO_SRC + os.pathsep + env.get("PYTHONPATH", "")
    env["JAX_PLATFORMS"] = "cpu"
    proc = subprocess.run([sys.executable, "-c", _DEFAULT_MODE_SCRIPT, str(tmp_path / "d")], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert lines == ["float32 bool uint8 9600", "refused: True", "fits: int32"], proc.stdout


# ---------------------------------------------------------------------------------------------------- conformance
from unienv_data.testing import StorageConformance  # noqa: E402


class TestJaxNativeLayoutConformance(StorageConformance):
    """A JAX space through the native layout (a backend adapter over NumPy children): the whole contract and the
    state machine, with JAX arrays in and out."""

    supports_growable = True
    state_machine_examples = 3  # every JAX operation costs a dispatch: fewer, equally long runs

    def make_space(self) -> DictSpace:
        return DictSpace(JB, {
            "obs": BoxSpace(JB, -np.inf, np.inf, jnp.float32, shape=(3,)),
            "action": BoxSpace(JB, -1.0, 1.0, jnp.float32, shape=(2,)),
            "step": BoxSpace(JB, 0, 1000, jnp.int64, shape=()),
            "done": BinarySpace(JB, ()),
        })

    def create(self, tmp_path: Any, capacity: Any) -> Any:
        return create_native_storage(self.space, capacity=capacity, cache_path=os.path.join(os.fspath(tmp_path), "n"))

    def load(self, path: Any, read_only: bool) -> Any:
        return load_native_storage(path, self.space, read_only=read_only)
