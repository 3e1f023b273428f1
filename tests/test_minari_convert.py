"""`unienv-data convert --from minari|hf` (into the native layout) and `--to minari`, checked by the real minari:
the Minari fixtures go in, come out as Minari folders again, and `minari.load_dataset` (in the minari venv, a
subprocess) reads exactly what minari read from the originals."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List

import numpy as np
import pytest

from tests._third_party import require_module, venv_python

pytest.importorskip("h5py")
pytest.importorskip("pyarrow")
pytest.importorskip("PIL")

FIXTURES = Path(__file__).resolve().parent / "fixtures"
MINARI = FIXTURES / "minari"

# run in the minari venv: load each dataset id with minari itself and save every array it returns
READ_WITH_MINARI = r"""
import os, sys, json
import numpy as np
import minari
os.environ["MINARI_DATASETS_PATH"] = sys.argv[1]
out = {}
facts = {}
for did in sys.argv[3:]:
    ds = minari.load_dataset(did)
    facts[did] = {"episodes": ds.total_episodes, "steps": ds.total_steps,
                  "observation_space": str(ds.observation_space), "action_space": str(ds.action_space)}
    for i, ep in enumerate(ds.iterate_episodes()):
        for field in ("observations", "actions", "rewards", "terminations", "truncations"):
            value = getattr(ep, field)
            items = value.items() if isinstance(value, dict) else [(None, value)]
            for k, v in items:
                out[f"{did}|ep{i}/{field}" + (f"/{k}" if k else "")] = np.asarray(v)
np.savez(os.path.join(sys.argv[2], "read.npz"), **out)
print(json.dumps(facts))
"""


def run_cli(*args: Any, check: bool = True) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "unienv_data"] + [str(a) for a in args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if check and proc.returncode != 0:
        raise AssertionError(f"{cmd} exited {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
    return proc


def read_with_minari(root: Path, ids: List[str], tmp: Path) -> Dict[str, Any]:
    py = venv_python("minari")
    script = tmp / "read_with_minari.py"
    script.write_text(READ_WITH_MINARI)
    proc = subprocess.run([str(py), str(script), str(root), str(tmp)] + ids, capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, PYTHONWARNINGS="ignore"))
    assert proc.returncode == 0, proc.stderr
    facts = json.loads(proc.stdout.strip().splitlines()[-1])
    with np.load(tmp / "read.npz") as z:
        arrays = {k: z[k] for k in z.files}
    return {"facts": facts, "arrays": arrays}


def expected(name: str) -> Dict[str, np.ndarray]:
    with np.load(MINARI / f"{name}.expected.npz") as z:
        return {k: z[k] for k in z.files}


@pytest.mark.parametrize("name", ["hdf5", "arrow", "dict_image", "dict_image_arrow"])
def test_from_minari_into_the_native_layout(name: str, tmp_path: Path) -> None:
    from unienv_data.integrations.minari import MinariAsUniEnvDataset
    from unienv_data.replay_buffer import ReplayBuffer
    from unienv_interface.backends import NumpyComputeBackend
    dst = tmp_path / "native"
    proc = run_cli("convert", MINARI / name, dst, "--from", "minari", "--layout", "native", "--json", "-q")
    summary = json.loads(proc.stdout)
    src = MinariAsUniEnvDataset.from_local(MINARI / name, include_next_observations=True)
    assert summary["rows"] == len(src) and summary["episodes"] == src.num_episodes == summary["episodes_written"]
    rb = ReplayBuffer.load_from(str(dst), backend=NumpyComputeBackend, read_only=True)
    try:
        assert sorted(rb.episode_segments()) == src.get_segments()
        got, want = rb.get_at(slice(None)), src.get_at(slice(None))

        def same(a: Any, b: Any, key: str) -> None:
            if isinstance(b, dict):
                for k in b:
                    same(a[k], b[k], f"{key}/{k}")
                return
            assert np.asarray(a).dtype == np.asarray(b).dtype, key
            np.testing.assert_array_equal(a, b, err_msg=key)
        same(got, want, "")
    finally:
        rb.close()


@pytest.mark.parametrize("fmt", ["hdf5", "arrow"])
def test_minari_roundtrip_is_read_back_by_minari(fmt: str, tmp_path: Path) -> None:
    names = ["hdf5", "arrow", "dict_image", "dict_image_arrow"]
    root = tmp_path / "minari_root"
    for name in names:
        native = tmp_path / f"native_{name}"
        run_cli("convert", MINARI / name, native, "--from", "minari", "--layout", "native", "-q")
        proc = run_cli("convert", native, root / f"rt_{name}-v0", "--to", "minari", "--minari-format", fmt,
                       "--json", "-q")
        assert json.loads(proc.stdout)["dataset_id"] == f"rt_{name}-v0"
    # and straight from one Minari folder to another (e.g. HDF5 to Arrow), no native copy in between
    run_cli("convert", MINARI / "dict_image", root / "direct-v0", "--from", "minari", "--to", "minari",
            "--minari-format", fmt, "-q")
    read = read_with_minari(root, [f"rt_{n}-v0" for n in names] + ["direct-v0"], tmp_path)
    for name, did in [(n, f"rt_{n}-v0") for n in names] + [("dict_image", "direct-v0")]:
        exp = expected(name)
        assert read["facts"][did]["episodes"] == len({k.split("/")[0] for k in exp})
        for key, want in exp.items():
            got = read["arrays"][f"{did}|{key}"]
            assert got.dtype == want.dtype, (did, key, got.dtype, want.dtype)
            np.testing.assert_array_equal(got, want, err_msg=f"{did} {key}")


def test_committed_fixtures_still_open_in_minari(tmp_path: Path) -> None:
    """The fixtures and their expected arrays agree with the minari the venv holds now."""
    names = ["hdf5", "arrow", "dict_image", "dict_image_arrow"]
    root = tmp_path / "root"
    root.mkdir()
    for name in names:
        os.symlink(MINARI / name, root / f"{name}-v0")
    read = read_with_minari(root, [f"{n}-v0" for n in names], tmp_path)
    for name in names:
        for key, want in expected(name).items():
            np.testing.assert_array_equal(read["arrays"][f"{name}-v0|{key}"], want, err_msg=f"{name} {key}")


def test_to_minari_needs_the_final_observations(tmp_path: Path) -> None:
    native = tmp_path / "native"
    run_cli("convert", MINARI / "hdf5", native, "--from", "minari", "--no-next-obs", "--layout", "native", "-q")
    proc = run_cli("convert", native, tmp_path / "out-v0", "--to", "minari", check=False)
    assert proc.returncode == 1 and "next_observations" in proc.stderr and "--final-observation" in proc.stderr
    run_cli("convert", native, tmp_path / "out2-v0", "--to", "minari", "--final-observation", "repeat", "-q")
    from unienv_data.integrations.minari import MinariAsUniEnvDataset
    back = MinariAsUniEnvDataset.from_local(tmp_path / "out2-v0")
    exp = expected("hdf5")
    np.testing.assert_array_equal(back.get_at(slice(None))["observations"],
                                  np.concatenate([exp[f"ep{e}/observations"][:-1] for e in range(3)]))
    np.testing.assert_array_equal(back.get_final_observation(0), exp["ep0/observations"][-2])  # repeated
    assert "unienv_final_observation" in back.dataset_metadata


def test_to_minari_refuses_rows_it_cannot_hold(tmp_path: Path) -> None:
    hf_dir = FIXTURES / "hf_datasets" / "dataset"
    require_module("datasets", "huggingface")
    native = tmp_path / "native"
    run_cli("convert", hf_dir, native, "--from", "hf", "--layout", "native", "-q")
    proc = run_cli("convert", native, tmp_path / "m-v0", "--to", "minari", check=False)
    assert proc.returncode == 1 and "observations" in proc.stderr
    proc = run_cli("convert", native, tmp_path / "x", check=False)
    assert proc.returncode != 0 and "--layout" in proc.stderr


def test_from_hf_into_the_native_layout(tmp_path: Path) -> None:
    datasets = require_module("datasets", "huggingface")
    from unienv_data.replay_buffer import ReplayBuffer
    from unienv_interface.backends import NumpyComputeBackend
    hf_dir = FIXTURES / "hf_datasets" / "dataset"
    dst = tmp_path / "native"
    summary = json.loads(run_cli("convert", hf_dir, dst, "--from", "hf", "--layout", "native", "--json", "-q").stdout)
    assert summary["rows"] == 7 and summary["from"] == "hf"
    hf = datasets.load_from_disk(str(hf_dir))
    rb = ReplayBuffer.load_from(str(dst), backend=NumpyComputeBackend, read_only=True)
    try:
        rows = rb.get_at(slice(None))
        for i in range(7):
            np.testing.assert_array_equal(rows["observation"][i], np.asarray(hf[i]["observation"], np.float32))
            np.testing.assert_array_equal(rows["camera"][i], np.asarray(hf[i]["camera"]))
            assert rows["task"][i] == hf[i]["task"]
        assert rows["grid"].dtype == np.uint8 and rows["extra"]["gear"].dtype == np.int8
    finally:
        rb.close()


def test_info_verify_plot_read_a_minari_folder(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    info = json.loads(run_cli("info", MINARI / "dict_image", "--json").stdout)
    assert info["kind"] == "Minari (hdf5)" and info["length"] == 7 and info["episodes"] == [[0, 4], [4, 7]]
    assert any("camera" in s and "uint8 (32, 32, 3)" in s for s in info["space_tree"])
    report = json.loads(run_cli("verify", MINARI / "arrow", "--json", "-q").stdout)
    assert report["ok"] and report["checked"]["rows_read"] == 9 and report["checked"]["episodes"] == 3
    plots = json.loads(run_cli("plot", MINARI / "dict_image_arrow", "--out", tmp_path / "plots", "--json",
                               "-q").stdout)
    assert plots["image_keys"] == ["observations/camera"] and plots["episodes"] == 2
    assert all(os.path.getsize(f) > 1000 for f in plots["files"])
    # a damaged copy: verify reports it, naming the file, and exits 1
    import shutil
    bad = tmp_path / "bad"
    shutil.copytree(MINARI / "hdf5", bad)
    h5 = bad / "data" / "main_data.hdf5"
    with open(h5, "r+b") as f:
        f.truncate(os.path.getsize(h5) // 2)
    proc = run_cli("verify", bad, check=False)
    assert proc.returncode == 1 and "DAMAGED" in proc.stdout and "main_data.hdf5" in proc.stdout


def test_from_hf_keeps_the_episodes_of_episode_index(tmp_path: Path) -> None:
    datasets = require_module("datasets", "huggingface")
    src = tmp_path / "hf"
    datasets.Dataset.from_dict({"episode_index": [0, 0, 1, 1, 1], "state": [[0.5, 1.0]] * 5}).save_to_disk(str(src))
    out = json.loads(run_cli("convert", src, tmp_path / "a", "--from", "hf", "--layout", "native", "--json",
                             "-q").stdout)
    assert out["episodes"] == 2 and out["episodes_written"] == 2
    out = json.loads(run_cli("convert", src, tmp_path / "b", "--from", "hf", "--layout", "native",
                             "--episode-column", "none", "--json", "-q").stdout)
    assert out["episodes"] == 0


def _record_cartpole(path: Path, episodes: int = 3, with_done: bool = False) -> Dict[str, List[np.ndarray]]:
    """CartPole recorded as docs/gym.md prescribes (ReplayBufferCollectionWrapper, keys obs / action / next_obs /
    reward / terminated / truncated); returns each episode's observations (n + 1), actions and rewards."""
    gym = require_module("gymnasium", "gym")
    from unienv_data.replay_buffer import ReplayBuffer, ReplayBufferCollectionWrapper
    from unienv_data.storages.dict_storage import DictStorage
    from unienv_data.storages.native_layout import native_layout_kwargs
    from unienv_interface.backends import NumpyComputeBackend as B
    from unienv_interface.space import BinarySpace, BoxSpace, DictSpace
    from unienv_interface.wrapper.gym_compat import FromGymnasiumEnv
    env = FromGymnasiumEnv(gym.make("CartPole-v1"))
    keys = {"obs": env.observation_space, "action": env.action_space, "next_obs": env.observation_space,
            "reward": BoxSpace(B, -np.inf, np.inf, np.float32, shape=()),
            "terminated": BinarySpace(B, ()), "truncated": BinarySpace(B, ())}
    if with_done:
        keys["done"] = BinarySpace(B, ())
    step = DictSpace(B, keys)
    buffer = ReplayBuffer.create(DictStorage, step, cache_path=str(path), capacity=None, **native_layout_kwargs(step))
    rec = ReplayBufferCollectionWrapper(env, buffer)
    rng = np.random.default_rng(0)
    seen: Dict[str, List[np.ndarray]] = {"observations": [], "actions": [], "rewards": []}
    for e in range(episodes):
        _, obs, _ = rec.reset(seed=e)
        o, a, r = [np.asarray(obs)], [], []
        done = False
        while not done:
            act = np.int64(rng.integers(2))
            obs, rew, term, trunc, _ = rec.step(act)
            o.append(np.asarray(obs))
            a.append(act)
            r.append(rew)
            done = bool(term or trunc)
        seen["observations"].append(np.stack(o))
        seen["actions"].append(np.asarray(a))
        seen["rewards"].append(np.asarray(r, np.float32))
    rec.close()
    buffer.dumps(str(path))
    buffer.close()
    return seen


@pytest.mark.parametrize("fmt", ["hdf5", "arrow"])
def test_a_collection_wrapper_recording_exports_to_minari(fmt: str, tmp_path: Path) -> None:
    """The keys docs/gym.md records with need no flag; minari reads the observations (the final one from next_obs),
    actions and rewards that were recorded."""
    seen = _record_cartpole(tmp_path / "cartpole", with_done=True)
    root = tmp_path / "root"
    proc = run_cli("convert", tmp_path / "cartpole", root / "cartpole-v0", "--to", "minari", "--minari-format", fmt,
                   "--json", "-q")
    assert json.loads(proc.stdout)["episodes"] == 3
    read = read_with_minari(root, ["cartpole-v0"], tmp_path)
    assert "Discrete(2)" in read["facts"]["cartpole-v0"]["action_space"]
    for e in range(3):
        for field in ("observations", "actions", "rewards"):
            got = read["arrays"][f"cartpole-v0|ep{e}/{field}"]
            np.testing.assert_array_equal(got, seen[field][e], err_msg=f"ep{e} {field}")
        n = len(seen["actions"][e])
        assert read["arrays"][f"cartpole-v0|ep{e}/observations"].shape == (n + 1, 4)
        assert read["arrays"][f"cartpole-v0|ep{e}/terminations"].tolist() == [False] * (n - 1) + [True]


def test_to_minari_map_exclude_and_the_error_that_says_how(tmp_path: Path) -> None:
    """Keys of other names: the error names the fields, the keys and --map; --map / --exclude make the export; a key
    Minari cannot hold is refused unless excluded; a next observation that is not the next step's is refused."""
    from unienv_data.replay_buffer import ReplayBuffer
    from unienv_data.storages.dict_storage import DictStorage
    from unienv_data.storages.native_layout import native_layout_kwargs
    from unienv_interface.backends import NumpyComputeBackend as B
    from unienv_interface.space import BinarySpace, BoxSpace, DictSpace
    space = DictSpace(B, {"state": BoxSpace(B, -np.inf, np.inf, np.float32, shape=(3,)),
                          "state_after": BoxSpace(B, -np.inf, np.inf, np.float32, shape=(3,)),
                          "cmd": BoxSpace(B, -1.0, 1.0, np.float32, shape=(2,)),
                          "r": BoxSpace(B, -np.inf, np.inf, np.float32, shape=()),
                          "term": BinarySpace(B, ()), "trunc": BinarySpace(B, ()),
                          "note": BoxSpace(B, 0, 9, np.int64, shape=())})
    rng = np.random.default_rng(1)
    states = rng.normal(size=(11, 3)).astype(np.float32)
    src = tmp_path / "src"
    rb = ReplayBuffer.create(DictStorage, space, cache_path=str(src), capacity=None, **native_layout_kwargs(space))
    for t in range(10):
        rb.append({"state": states[t], "state_after": states[t + 1], "cmd": rng.uniform(-1, 1, 2).astype(np.float32),
                   "r": np.float32(t), "term": t == 9, "trunc": False, "note": np.int64(t % 10)})
    rb.mark_segment_end()
    rb.dumps(str(src))
    rb.close()
    proc = run_cli("convert", src, tmp_path / "a-v0", "--to", "minari", check=False)
    assert proc.returncode == 1
    for words in ("observations", "actions", "--map", "'state'", "obs->observations"):
        assert words in proc.stderr, (words, proc.stderr)
    maps = ["--map", "state=observations", "--map", "state_after=next_observations", "--map", "cmd=actions",
            "--map", "r=rewards", "--map", "term=terminations", "--map", "trunc=truncations"]
    proc = run_cli("convert", src, tmp_path / "b-v0", "--to", "minari", *maps, check=False)
    assert proc.returncode == 1 and "note" in proc.stderr and "--exclude" in proc.stderr, proc.stderr
    proc = run_cli("convert", src, tmp_path / "c-v0", "--to", "minari", *maps, "--map", "note=infos", check=False)
    assert proc.returncode == 1 and "infos" in proc.stderr, proc.stderr
    run_cli("convert", src, tmp_path / "root" / "d-v0", "--to", "minari", *maps, "--exclude", "note", "-q")
    read = read_with_minari(tmp_path / "root", ["d-v0"], tmp_path)
    np.testing.assert_array_equal(read["arrays"]["d-v0|ep0/observations"], states)
    np.testing.assert_array_equal(read["arrays"]["d-v0|ep0/rewards"], np.arange(10, dtype=np.float32))
    # the same next observations as the state: row 0's is not row 1's state, so one would be lost
    proc = run_cli("convert", src, tmp_path / "e-v0", "--to", "minari", "--map", "state_after=observations",
                   "--map", "state=next_observations", *maps[4:], "--exclude", "note", check=False)
    assert proc.returncode == 1 and "row 0" in proc.stderr and "lose" in proc.stderr, proc.stderr
    # a flag of another format is refused, not ignored
    proc = run_cli("convert", src, tmp_path / "f-v0", "--to", "minari", *maps, "--exclude", "note", "--fps", "10",
                   check=False)
    assert proc.returncode != 0 and "--fps" in proc.stderr
    proc = run_cli("convert", src, tmp_path / "g", "--layout", "native", "--map", "state=observations", check=False)
    assert proc.returncode != 0 and "--map" in proc.stderr
