"""`LeRobotWindows`: LeRobot's delta_timestamps windows over the LeRobot fixtures (written by the real lerobot, see
tests/test_lerobot.py) read in place and after `convert --from lerobot`; pad masks at episode edges, equality with a
brute-force per-row reading, with lerobot's own frames (expected.json hashes) and with lerobot's own
`LeRobotDataset(delta_timestamps=...)` in its venv; torch DataLoader workers.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path
from typing import Any, Dict

import numpy as np
import pytest

from _third_party import has_venv, require_module

require_module("pyarrow", "parquet")
require_module("av", "video")

from unienv_interface.backends.numpy import NumpyComputeBackend  # noqa: E402
from unienv_data.integrations.lerobot import LeRobotAsUniEnvDataset  # noqa: E402
from unienv_data.integrations.lerobot_windows import LeRobotWindows, offsets_from_delta_timestamps  # noqa: E402

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "lerobot"
ROOT = Path(__file__).resolve().parent.parent
# v30_video / v30_multifile: episodes of 12, 15 and 10 frames (rows [0, 12), [12, 27), [27, 37))
BOUNDS = [(0, 12), (12, 27), (27, 37)]
OBS = [-1, 0]
ACT = list(range(16))


def open_ds(name: str) -> LeRobotAsUniEnvDataset:
    return LeRobotAsUniEnvDataset.from_local(FIXTURES / name, NumpyComputeBackend)


def windows_of(ds: Any) -> LeRobotWindows:
    keys = [k for k in ds.single_space.spaces if k.startswith("observation.")]
    return LeRobotWindows(ds, {**{k: OBS for k in keys}, "action": ACT})


def brute_force(ds: LeRobotAsUniEnvDataset, anchor: int, key: str, offsets: list) -> Dict[str, np.ndarray]:
    """One row at a time: the episode of `anchor`, each offset clamped into it."""
    s, e = next(b for b in BOUNDS if b[0] <= anchor < b[1])
    rows = [min(max(anchor + o, s), e - 1) for o in offsets]
    pad = [not s <= anchor + o < e for o in offsets]
    return {"value": np.stack([ds.get_at(r)[key] for r in rows]), "pad": np.asarray(pad)}


@pytest.mark.parametrize("name", ["v30_video", "v30_multifile"])
def test_every_window_equals_a_brute_force_reading(name: str) -> None:
    with open_ds(name) as ds:
        win = windows_of(ds)
        anchors = np.arange(len(ds))
        batch = win.get_batch(anchors[::-1].copy())  # any order
        for j, a in enumerate(anchors[::-1].tolist()):
            for key, offs in win.offsets.items():
                want = brute_force(ds, a, key, offs.tolist())
                np.testing.assert_array_equal(batch[key][j], want["value"], err_msg=f"{key} at anchor {a}")
                np.testing.assert_array_equal(batch[key + "_is_pad"][j], want["pad"])
            assert batch["index"][j] == a
            assert batch["episode_index"][j] == next(i for i, b in enumerate(BOUNDS) if b[0] <= a < b[1])


def test_past_an_episodes_end_is_padding_never_the_next_episode() -> None:
    exp = json.loads((FIXTURES / "v30_video" / "expected.json").read_text())
    action = np.asarray(exp["tabular"]["action"], np.float32)
    cam = exp["cameras"][0]
    with open_ds("v30_video") as ds:
        win = LeRobotWindows(ds, {"action": ACT, cam: [-1, 0, 1, 2]})
        b = win.get_batch(np.asarray([10, 11, 12, 36]))
        # anchor 10: action rows 10, 11, then pads holding row 11 (the episode's last), never row 12
        assert b["action_is_pad"][0].tolist() == [False, False] + [True] * 14
        np.testing.assert_array_equal(b["action"][0, 2:], np.repeat(action[11][None], 14, axis=0))
        assert not any(np.array_equal(b["action"][0, t], action[12]) for t in range(16))
        # anchor 12 (first of episode 1): the camera's frame before is a pad holding frame 12 itself
        assert b[cam + "_is_pad"][2].tolist() == [True, False, False, False]
        frames = b[cam][2]
        hashes = [hashlib.sha256(np.ascontiguousarray(f).tobytes()).hexdigest() for f in frames]
        assert hashes == [exp["frame_sha256"][cam][r] for r in (12, 12, 13, 14)]
        # the last row of the dataset: everything after it is padding with that row
        assert b["action_is_pad"][3].tolist() == [False] + [True] * 15
        hashes = [hashlib.sha256(np.ascontiguousarray(f).tobytes()).hexdigest() for f in b[cam][3]]
        assert hashes == [exp["frame_sha256"][cam][r] for r in (35, 36, 36, 36)]
        assert b[cam].dtype == np.uint8


def test_delta_timestamps_in_seconds_and_bad_requests() -> None:
    assert offsets_from_delta_timestamps({"a": [-0.1, 0.0, 0.2]}, 10)["a"].tolist() == [-1, 0, 2]
    with pytest.raises(ValueError, match="whole number of frames"):
        offsets_from_delta_timestamps({"a": [0.05]}, 10)
    with pytest.raises(ValueError, match="non-empty"):
        offsets_from_delta_timestamps({"a": []}, 10)
    with open_ds("v30_video") as ds:
        win = LeRobotWindows.from_delta_timestamps(ds, {"action": [0.0, 0.1]})
        assert win.offsets["action"].tolist() == [0, 1]
        with pytest.raises(KeyError, match="observation.nothing"):
            LeRobotWindows(ds, {"observation.nothing": [0]})
        with pytest.raises(ValueError, match="int step offsets"):
            LeRobotWindows(ds, {"action": [0.5]})
        with pytest.raises(IndexError, match="37"):
            win.get_batch(np.asarray([37]))
        with pytest.raises(IndexError):
            win[-38]
        item = win[-1]
        assert item["action"].shape == (2, 6) and item["action_is_pad"].tolist() == [False, True]


def test_windows_over_the_converted_layout_match_in_place(tmp_path: Path) -> None:
    from unienv_data.cli import main
    from unienv_data.replay_buffer import ReplayBuffer
    dst = tmp_path / "native"
    assert main(["convert", str(FIXTURES / "v30_multifile"), str(dst), "--from", "lerobot"]) == 0
    rb = ReplayBuffer.load_from(dst, backend=NumpyComputeBackend)
    with open_ds("v30_multifile") as ds:
        a, b = windows_of(ds), windows_of(rb)
        anchors = np.arange(len(ds))
        wa, wb = a.get_batch(anchors), b.get_batch(anchors)
        for key in wa:
            if key in a.cameras:  # re-encoded: close, not equal
                assert wb[key].shape == wa[key].shape
                mse = np.mean((wb[key].astype(np.float64) - wa[key]) ** 2)
                assert 10 * np.log10(255 ** 2 / max(mse, 1e-9)) > 30
            else:
                np.testing.assert_array_equal(wb[key], wa[key], err_msg=key)
    rb.close()


def convert(tmp_path: Path, name: str = "v30_multifile", *extra: str) -> Path:
    from unienv_data.cli import main
    dst = tmp_path / "native"
    assert main(["convert", str(FIXTURES / name), str(dst), "--from", "lerobot", *extra]) == 0
    return dst


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_from_delta_timestamps_over_a_converted_buffer_of_either_backend(tmp_path: Path, backend: str) -> None:
    """A converted buffer opened with the torch backend (its spaces' dtypes are torch dtypes) gives the same
    windows, as NumPy, as the numpy-backed one and the folder read in place; the fps is the recorded one."""
    from unienv_data.replay_buffer import ReplayBuffer
    if backend == "torch":
        require_module("torch", "torch")
        from unienv_interface.backends.pytorch import PyTorchComputeBackend as be
    else:
        be = NumpyComputeBackend
    dt = {"observation.images.top": [-0.1, 0.0], "observation.state": [0.0], "action": [0.0, 0.1, 0.2]}
    rb = ReplayBuffer.load_from(convert(tmp_path), backend=be)
    try:
        win = LeRobotWindows.from_delta_timestamps(rb, dt, fps=10)
        assert win.cameras == ["observation.images.top"]    # a uint8 HWC key, whatever the backend's dtype
        assert win.offsets["action"].tolist() == [0, 1, 2]
        # without fps=: the one the converted buffer records (10)
        assert LeRobotWindows.from_delta_timestamps(rb, dt).offsets["action"].tolist() == [0, 1, 2]
        anchors = np.arange(len(rb))
        got = win.get_batch(anchors)
        with open_ds("v30_multifile") as ds:
            want = LeRobotWindows.from_delta_timestamps(ds, dt).get_batch(anchors)
        assert set(got) == set(want)
        for k, v in want.items():
            assert isinstance(got[k], np.ndarray) and got[k].dtype == v.dtype, k
            if k == "observation.images.top":   # re-encoded: close, not equal
                assert got[k].shape == v.shape
                mse = np.mean((got[k].astype(np.float64) - v) ** 2)
                assert 10 * np.log10(255 ** 2 / max(mse, 1e-9)) > 30
            else:
                np.testing.assert_array_equal(got[k], v, err_msg=k)
    finally:
        rb.close()


def test_a_wrong_fps_is_refused_and_a_missing_one_found(tmp_path: Path) -> None:
    from unienv_data.integrations.lerobot_windows import recorded_fps
    from unienv_data.replay_buffer import ReplayBuffer
    rb = ReplayBuffer.load_from(convert(tmp_path), backend=NumpyComputeBackend)
    try:
        assert set(recorded_fps(rb).values()) == {10.0}
        assert "observation.images.top metadata" in recorded_fps(rb)
        with pytest.raises(ValueError, match=r"fps=30 .*10 fps"):
            LeRobotWindows.from_delta_timestamps(rb, {"action": [0.0, 0.1]}, fps=30)
        assert LeRobotWindows.from_delta_timestamps(rb, {"action": [0.0, 0.1]}).offsets["action"].tolist() == [0, 1]
        # step offsets stay free: the constructor takes them as given
        assert LeRobotWindows(rb, offsets_from_delta_timestamps({"action": [0.0, 0.1]}, 30)).offsets["action"].tolist() == [0, 3]
    finally:
        rb.close()
    with open_ds("v30_video") as ds:
        with pytest.raises(ValueError, match=r"fps=20 .*10 fps \(fps"):
            LeRobotWindows.from_delta_timestamps(ds, {"action": [0.0, 0.1]}, fps=20)


def test_a_video_storages_default_rate_is_not_a_recorded_fps(tmp_path: Path) -> None:
    """A camera recorded into VideoStorage without an fps (its playback rate defaults to 15) does not pin the
    windows' fps: a 50 Hz recording takes fps=50."""
    from unienv_data.replay_buffer import ReplayBuffer
    from unienv_data.storages.dict_storage import DictStorage
    from unienv_data.storages.native_layout import native_layout_kwargs
    from unienv_interface.space import BoxSpace, DictSpace
    B = NumpyComputeBackend
    sp = DictSpace(B, {"cam": BoxSpace(B, 0, 255, np.uint8, shape=(16, 16, 3)),
                       "action": BoxSpace(B, -1.0, 1.0, np.float32, shape=(2,))})
    rb = ReplayBuffer.create(DictStorage, sp, cache_path=str(tmp_path / "rb"), capacity=None,
                             **native_layout_kwargs(sp, image_storage="video"))
    for t in range(6):
        rb.append({"cam": np.full((16, 16, 3), t, np.uint8), "action": np.zeros(2, np.float32)})
    rb.mark_segment_end()
    win = LeRobotWindows.from_delta_timestamps(rb, {"action": [0.0, 0.02, 0.04]}, fps=50)
    assert win.offsets["action"].tolist() == [0, 1, 2]
    rb.close()


def test_fps_is_needed_only_where_nothing_records_one(tmp_path: Path) -> None:
    """A buffer without cameras records no fps: fps= is required, and taken as given."""
    from unienv_data.replay_buffer import ReplayBuffer
    from unienv_data.storages.flattened import FlattenedStorage
    from unienv_data.storages.numpy_memmap import NumpyMemmapStorage
    with open_ds("v30_video") as ds:
        space = ds.single_space
        tab = {k: space.spaces[k] for k in ("action", "observation.state")}
        rows = ds.get_at(np.arange(len(ds)))
    from unienv_interface.space import DictSpace
    sp = DictSpace(NumpyComputeBackend, tab)
    rb = ReplayBuffer.create(FlattenedStorage, sp, inner_storage_cls=NumpyMemmapStorage, cache_path=str(tmp_path / "rb"))
    rb.extend({k: rows[k] for k in tab})
    with pytest.raises(ValueError, match="records no fps"):
        LeRobotWindows.from_delta_timestamps(rb, {"action": [0.0, 0.1]})
    assert LeRobotWindows.from_delta_timestamps(rb, {"action": [0.0, 0.1]}, fps=30).offsets["action"].tolist() == [0, 3]
    rb.close()


def test_dataloader_workers_give_the_same_batches() -> None:
    torch = require_module("torch", "torch")
    with open_ds("v30_multifile") as ds:
        win = windows_of(ds)
        batches = [np.asarray([0, 11, 12, 26, 36]), np.asarray([5, 27, 30])]
        loader = torch.utils.data.DataLoader(win, batch_sampler=batches, num_workers=2,
                                             collate_fn=LeRobotWindows.collate_fn)
        for idx, got in zip(batches, loader):
            want = win.get_batch(idx)
            assert set(got) == set(want)
            for k, v in want.items():
                assert isinstance(got[k], torch.Tensor)
                np.testing.assert_array_equal(got[k].numpy(), v, err_msg=k)
            assert got[win.cameras[0]].dtype == torch.uint8


def test_shared_memory_dataloader_serves_windows_in_reused_slots() -> None:
    """Workers hand batches over through the loader's shared-memory slots (no fresh segment per batch): every
    epoch's batches equal `get_batch` of the same anchors, and 3 epochs (15 batches) run in the 8 slots."""
    torch = require_module("torch", "torch")
    from unienv_data.integrations import torch_loader
    from unienv_data.integrations.torch_loader import shared_memory_dataloader
    with open_ds("v30_multifile") as ds:
        win = windows_of(ds)
        loader = shared_memory_dataloader(win, batch_size=8, shuffle=True, seed=3, num_workers=2,
                                          persistent_workers=True)
        seen = 0
        for _epoch in range(3):
            for got in loader:
                want = win.get_batch(got["index"].numpy())
                assert set(got) == set(want)
                for k, v in want.items():
                    np.testing.assert_array_equal(got[k].numpy(), v, err_msg=k)
                assert got[win.cameras[0]].dtype == torch.uint8
                # the frames ARE the parent's mapping of a slot (no per-batch shared-memory segment)
                assert any(np.shares_memory(got[win.cameras[0]].numpy(), view)
                           for _, view, _ in torch_loader._MAPPED.values())
                seen += int(got["index"].shape[0])
                del got
        assert seen == 3 * len(win)
        with pytest.raises(TypeError, match="__getitems__"):
            shared_memory_dataloader([1, 2, 3], batch_size=2)


@pytest.mark.skipif(not has_venv("lerobot"), reason="needs the lerobot venv (bash scripts/build_venvs.sh lerobot)")
def test_equal_to_lerobots_own_delta_timestamps(tmp_path: Path) -> None:
    """lerobot 0.4.4's LeRobotDataset(delta_timestamps=...) in its venv (bench/_lerobot_driver.py): the same frames
    bit for bit, the same tabular windows and pad masks."""
    from _third_party import venv_python
    py = venv_python("lerobot")
    name = "v30_multifile"
    anchors = [0, 1, 11, 12, 13, 26, 27, 36]
    plan = {"workers": 0, "batches": 0, "batch_size": 1, "seed": 0, "check": anchors, "check_only": True,
            "obs_offsets": OBS, "action_offsets": ACT, "repo_id": f"unienv/{name}"}
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", HF_HOME=str(tmp_path / "hf"))
    env.pop("PYTHONPATH", None)
    proc = subprocess.run([str(py), str(ROOT / "bench" / "_lerobot_driver.py"), "load", str(FIXTURES / name),
                           str(tmp_path / "plan.json"), str(tmp_path / "out.npz")], capture_output=True, text=True,
                          env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with np.load(tmp_path / "out.npz") as z:
        theirs = {k: z[k] for k in z.files}
    with open_ds(name) as ds:
        ours = windows_of(ds).get_batch(np.asarray(anchors))
    assert set(theirs) <= set(ours)
    for k, v in theirs.items():
        np.testing.assert_array_equal(ours[k], v, err_msg=k)
