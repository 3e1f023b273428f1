"""LeRobot bridge: `LeRobotAsUniEnvDataset` on datasets written by the real lerobot (tests/fixtures/lerobot/, made by
tests/fixtures/make_lerobot_fixtures.py with lerobot 0.4.4 for v3.0 and 0.3.3 for v2.1), and the export to LeRobot
v3.0 checked by the real lerobot 0.4.4 in its venv (.venvs/lerobot).

Each fixture's expected.json holds what lerobot's own `LeRobotDataset` reads: tabular values (compared exactly), the
task of every frame, the episodes, and the SHA-256 of every camera frame as lerobot decodes it (PyAV): this library's
frames must match those bit for bit.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any, Dict, List

import numpy as np
import pytest

from _third_party import require_module

require_module("pyarrow", "parquet")
require_module("av", "video")

from unienv_interface.backends.numpy import NumpyComputeBackend  # noqa: E402
from unienv_data.base.errors import StorageClosedError, StorageFormatError  # noqa: E402
from unienv_data.integrations.lerobot import LeRobotAsUniEnvDataset  # noqa: E402

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "lerobot"
NAMES = ["v30_video", "v30_multifile", "v30_image", "v21_video", "v21_image"]


def expected(name: str) -> Dict[str, Any]:
    return json.loads((FIXTURES / name / "expected.json").read_text())


def sha(frame: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(frame).tobytes()).hexdigest()


def open_fixture(name: str, **kw: Any) -> LeRobotAsUniEnvDataset:
    return LeRobotAsUniEnvDataset.from_local(FIXTURES / name, NumpyComputeBackend, **kw)


def copy_fixture(name: str, tmp_path: Path) -> Path:
    dst = tmp_path / name
    shutil.copytree(FIXTURES / name, dst)
    return dst


# ---------------------------------------------------------------------------------------------------- equal to lerobot
@pytest.mark.parametrize("name", NAMES)
def test_every_value_equals_lerobots_reading(name: str) -> None:
    exp = expected(name)
    with open_fixture(name) as ds:
        assert ds.schema.codebase_version == exp["codebase_version"]
        assert (len(ds), ds.num_episodes, ds.fps) == (exp["num_frames"], exp["num_episodes"], exp["fps"])
        data, meta = ds.get_at_with_metadata(np.arange(len(ds)))
        for key, values in exp["tabular"].items():
            want = np.asarray(values, dtype=data[key].dtype).reshape(data[key].shape)
            np.testing.assert_array_equal(data[key], want, err_msg=key)
        for cam, hashes in exp["frame_sha256"].items():
            assert data[cam].dtype == np.uint8 and data[cam].shape[1:] == ds.single_space[cam].shape
            assert [sha(f) for f in data[cam]] == hashes, f"{cam}: frames differ from lerobot's decoding"
        assert meta["task"] == exp["task"]
        got = [{"index": e.index, "length": e.length, "tasks": e.tasks} for e in ds.episode_metadata]
        assert got == exp["episodes"]


@pytest.mark.parametrize("name", ["v30_video", "v21_video"])
def test_episode_tasks_come_from_the_tasks_files(name: str) -> None:
    # the reference returned "" for every v3.0 episode (meta/tasks.parquet unread) and the first task for every v2.1
    # episode (tasks is a list per episode)
    with open_fixture(name) as ds:
        eps = ds.episode_metadata
        assert [e.task for e in eps] == ["pick the cube", "place the cube", "pick the cube"]
        assert [e.task_index for e in eps] == [0, 1, 0]
        if name == "v21_video":
            assert eps[1].tasks == ["place the cube", "wave"]
            assert ds.get_at_with_metadata(26)[1]["task"] == "wave"


def test_random_batches_equal_sequential_reads() -> None:
    with open_fixture("v30_multifile") as ds:
        full = ds.get_at(slice(None))
        idx = np.array([36, 0, 13, 13, 35, 5, 20, 1, 36])
        got = ds.get_at(idx)
        for k in full:
            np.testing.assert_array_equal(got[k], full[k][idx], err_msg=k)
        one = ds[-1]
        for k in full:
            np.testing.assert_array_equal(one[k], full[k][36], err_msg=k)
        assert ds.single_space.contains(one)


def test_space_is_flat_dict_of_dotted_names_with_uint8_hwc_cameras() -> None:
    with open_fixture("v30_multifile") as ds:
        sp = ds.single_space
        assert set(sp.keys()) >= {"observation.state", "action", "observation.images.top",
                                   "observation.images.wrist", "timestamp", "episode_index", "task_index"}
        assert sp["observation.images.top"].shape == (48, 64, 3)
        assert sp["observation.images.wrist"].shape == (32, 32, 3)
        assert np.dtype(sp["observation.images.top"].dtype) == np.uint8
        assert np.dtype(sp["observation.state"].dtype) == np.float32 and sp["observation.state"].shape == (6,)


def test_out_of_range_and_bad_indices_raise() -> None:
    with open_fixture("v30_image") as ds:
        with pytest.raises(IndexError):
            ds.get_at(37)
        with pytest.raises(IndexError):
            ds.get_at(np.array([0, 40]))
        with pytest.raises(IndexError):
            ds.get_episode(3)
        with pytest.raises(TypeError):
            ds.get_at(1.5)


def test_episode_column_and_segments() -> None:
    with open_fixture("v30_video") as ds:
        assert ds.get_segments() == [(0, 12), (12, 27), (27, 37)]
        ep = ds.get_episode(1)
        assert ep["frame_index"].reshape(-1).tolist() == list(range(15))
        assert set(ep["episode_index"].reshape(-1).tolist()) == {1}
        col = ds.get_column(["observation", "state"])
        assert len(col) == 37
        np.testing.assert_array_equal(col.get_at(np.arange(37)), ds.get_at(np.arange(37))["observation.state"])
        with pytest.raises(KeyError):
            ds.get_column("observation.nothing")


def test_windows_of_the_slice_sampler_stay_inside_episodes() -> None:
    from unienv_data.batches import SliceStackedBatch
    with open_fixture("v30_video") as ds:
        view = SliceStackedBatch(ds, [-2, -1, 0, 1])
        win = view.get_at(np.array([0, 12, 26, 27]))
        ep = win["episode_index"].reshape(4, 4)
        # frames outside the anchor's episode are filled from the edge frame of the same episode, never the next
        assert ep.tolist() == [[0, 0, 0, 0], [1, 1, 1, 1], [1, 1, 1, 1], [2, 2, 2, 2]]
        frames = win["observation.images.top"]
        assert frames.shape == (4, 4, 48, 64, 3)
        full = ds.get_at(slice(None))["observation.images.top"]
        np.testing.assert_array_equal(frames[1, 2], full[12])


def test_feature_selection_and_no_video() -> None:
    with open_fixture("v30_multifile", include_features=["action", "observation.images.wrist"]) as ds:
        assert set(ds.single_space.keys()) == {"action", "observation.images.wrist"}
        assert set(ds[3].keys()) == {"action", "observation.images.wrist"}
    with open_fixture("v30_multifile", decode_video=False, exclude_features=["index"]) as ds:
        assert not any(k.startswith("observation.images") for k in ds.single_space.keys())
        assert "index" not in ds.single_space.keys()
    with pytest.raises(KeyError):
        open_fixture("v30_video", include_features=["nope"])
    with pytest.raises(ValueError):
        open_fixture("v30_video", video_backend="torchcodec")


def test_pytorch_backend_gives_tensors() -> None:
    torch = require_module("torch", "torch")
    from unienv_interface.backends.pytorch import PyTorchComputeBackend
    with LeRobotAsUniEnvDataset.from_local(FIXTURES / "v30_image", PyTorchComputeBackend) as ds:
        b = ds.get_at(np.arange(4))
        assert isinstance(b["observation.images.top"], torch.Tensor)
        assert b["observation.images.top"].dtype == torch.uint8
        assert [sha(x) for x in b["observation.images.top"].numpy()] == \
            expected("v30_image")["frame_sha256"]["observation.images.top"][:4]


def test_pickled_copy_reads_the_same_frames() -> None:
    # what DataLoader workers under spawn receive: the copy opens its own decoders
    import pickle
    with open_fixture("v30_multifile") as ds:
        idx = np.array([3, 30, 14])
        want = ds.get_at(idx)
        copy = pickle.loads(pickle.dumps(ds))
        got, meta = copy.get_at_with_metadata(idx)
        for k in want:
            np.testing.assert_array_equal(got[k], want[k], err_msg=k)
        assert meta["episode_index"].tolist() == [0, 2, 1]
        copy.close()


_FORKED: Any = None


def _frames_in_child(rows: list) -> list:
    return [sha(f) for f in _FORKED.get_at(np.asarray(rows))["observation.images.top"]]


def test_forked_worker_reads_the_same_frames() -> None:
    # what DataLoader workers under fork inherit: a dataset whose decoders the parent already opened
    import multiprocessing
    global _FORKED
    with open_fixture("v30_video") as ds:
        want = [sha(f) for f in ds.get_at(np.arange(37))["observation.images.top"]]
        _FORKED = ds
        try:
            with multiprocessing.get_context("fork").Pool(1) as pool:
                got = pool.map(_frames_in_child, [[0, 5, 20], [36, 1]])
        finally:
            _FORKED = None
    assert got == [[want[0], want[5], want[20]], [want[36], want[1]]]


def test_closed_dataset_refuses_reads() -> None:
    ds = open_fixture("v30_video")
    ds.get_at(0)
    ds.close()
    with pytest.raises(StorageClosedError):
        ds.get_at(0)


def test_from_hub_downloads_then_opens(tmp_path: Path) -> None:
    calls = []

    def download(**kw: Any) -> str:
        calls.append(kw)
        dst = Path(kw["local_dir"])
        shutil.copytree(FIXTURES / "v21_video", dst)
        return str(dst)

    ds = LeRobotAsUniEnvDataset.from_hub("someone/toy", NumpyComputeBackend, revision="v2.1",
                                         local_dir=tmp_path / "snap", download=download, decode_video=False)
    assert calls == [{"repo_id": "someone/toy", "repo_type": "dataset", "revision": "v2.1",
                      "local_dir": str(tmp_path / "snap")}]
    assert len(ds) == 37 and ds.num_episodes == 3


def test_from_hub_uses_snapshot_download_of_huggingface_hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # without network: huggingface_hub in offline mode finds nothing and says so (its own error, not ours)
    hub = require_module("huggingface_hub", "lerobot")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import importlib
    importlib.reload(importlib.import_module("huggingface_hub.constants"))
    try:
        with pytest.raises(Exception) as info:
            LeRobotAsUniEnvDataset.from_hub("someone/not-cached", NumpyComputeBackend, local_dir=tmp_path / "x")
        assert type(info.value).__module__.startswith("huggingface_hub"), repr(info.value)
    finally:
        monkeypatch.delenv("HF_HUB_OFFLINE")
        importlib.reload(importlib.import_module("huggingface_hub.constants"))
    assert hub is not None


# ---------------------------------------------------------------------------------------------------- bad input
def test_missing_data_parquet_is_named(tmp_path: Path) -> None:
    root = copy_fixture("v30_multifile", tmp_path)
    victim = root / "data" / "chunk-000" / "file-001.parquet"
    victim.unlink()
    with pytest.raises(StorageFormatError, match="file-001.parquet"):
        LeRobotAsUniEnvDataset.from_local(root, NumpyComputeBackend)


def test_truncated_data_parquet_is_named(tmp_path: Path) -> None:
    root = copy_fixture("v21_video", tmp_path)
    victim = root / "data" / "chunk-000" / "episode_000001.parquet"
    victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])
    with pytest.raises(StorageFormatError, match="episode_000001.parquet"):
        LeRobotAsUniEnvDataset.from_local(root, NumpyComputeBackend)


@pytest.mark.parametrize("damage", ["missing", "truncated"])
def test_bad_video_is_named(tmp_path: Path, damage: str) -> None:
    root = copy_fixture("v30_video", tmp_path)
    victim = root / "videos" / "observation.images.top" / "chunk-000" / "file-000.mp4"
    if damage == "missing":
        victim.unlink()
    else:
        victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 3])
    # opening reads only the parquet files; the video is checked when its frames are first read
    with LeRobotAsUniEnvDataset.from_local(root, NumpyComputeBackend) as ds:
        assert ds.get_column("action").get_at(0).shape == (6,)
        with pytest.raises(StorageFormatError, match="file-000.mp4"):
            ds.get_at(np.arange(37))


def test_unsupported_codebase_version_is_named(tmp_path: Path) -> None:
    root = copy_fixture("v30_image", tmp_path)
    info_path = root / "meta" / "info.json"
    info = json.loads(info_path.read_text())
    info["codebase_version"] = "v1.6"
    info_path.write_text(json.dumps(info))
    with pytest.raises(StorageFormatError, match=r"info\.json.*v1\.6"):
        LeRobotAsUniEnvDataset.from_local(root, NumpyComputeBackend)


def test_episode_indices_not_matching_the_data_are_named(tmp_path: Path) -> None:
    root = copy_fixture("v21_video", tmp_path)
    path = root / "meta" / "episodes.jsonl"
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    lines[2]["episode_index"] = 7       # the data file of episode 7 does not exist: named
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    with pytest.raises(StorageFormatError, match="episode_000007.parquet"):
        LeRobotAsUniEnvDataset.from_local(root, NumpyComputeBackend)
    lines[2]["episode_index"] = 2
    lines[2]["length"] = 11             # the data holds 10 rows of episode 2
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    with pytest.raises(StorageFormatError, match="episode_000002.parquet"):
        LeRobotAsUniEnvDataset.from_local(root, NumpyComputeBackend)


def test_v3_episode_rows_not_matching_the_data_are_named(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq
    root = copy_fixture("v30_video", tmp_path)
    path = root / "meta" / "episodes" / "chunk-000" / "file-000.parquet"
    table = pq.read_table(path)
    ep = table.column("episode_index").to_pylist()
    ep[1] = 5
    table = table.set_column(table.schema.get_field_index("episode_index"), "episode_index",
                             pa.array(ep, type=table.schema.field("episode_index").type))
    pq.write_table(table, path)
    with pytest.raises(StorageFormatError, match="file-000.parquet"):
        LeRobotAsUniEnvDataset.from_local(root, NumpyComputeBackend)


@pytest.mark.parametrize("name", ["v21_video", "v30_video"])
def test_info_without_file_templates_or_tasks_uses_lerobots_standard_layout(tmp_path: Path, name: str) -> None:
    """No `data_path` / `video_path` in info.json: lerobot's standard templates of that version; no tasks file: no
    task text (the reference reads such folders too)."""
    root = copy_fixture(name, tmp_path)
    info_path = root / "meta" / "info.json"
    info = json.loads(info_path.read_text())
    del info["data_path"], info["video_path"]
    info_path.write_text(json.dumps(info))
    for tasks in ("tasks.jsonl", "tasks.parquet"):
        (root / "meta" / tasks).unlink(missing_ok=True)
    with open_fixture(name) as intact, LeRobotAsUniEnvDataset.from_local(root, NumpyComputeBackend) as ds:
        assert len(ds) == len(intact)
        rows = np.array([0, len(ds) // 2, len(ds) - 1])
        got, want = ds.get_at(rows), intact.get_at(rows)
        for key in want:
            np.testing.assert_array_equal(got[key], want[key])
        assert ds.tasks == {}   # (v2.1's episodes.jsonl still names each episode's tasks)


@pytest.mark.parametrize("bad", ["data/{nope}.parquet", 7, "data/{episode_index"])
def test_malformed_data_path_is_named(tmp_path: Path, bad: Any) -> None:
    root = copy_fixture("v21_image", tmp_path)
    info_path = root / "meta" / "info.json"
    info = json.loads(info_path.read_text())
    info["data_path"] = bad
    info_path.write_text(json.dumps(info))
    with pytest.raises(StorageFormatError, match=r"info\.json.*'data_path'"):
        LeRobotAsUniEnvDataset.from_local(root, NumpyComputeBackend)


@pytest.mark.parametrize("name", ["v21_image", "v30_multifile"])
def test_data_files_without_an_episode_index_column(tmp_path: Path, name: str) -> None:
    """Data parquet files without `episode_index`: v2 reads the episode's whole file, v3 finds the rows from the
    episode's `dataset_from_index` and the file's first `index` (the reference reads such files too)."""
    import pyarrow.parquet as pq
    root = copy_fixture(name, tmp_path)
    info_path = root / "meta" / "info.json"
    info = json.loads(info_path.read_text())
    del info["features"]["episode_index"]
    info_path.write_text(json.dumps(info))
    files = sorted((root / "data").rglob("*.parquet"))
    for path in files:
        table = pq.read_table(path)
        pq.write_table(table.drop(["episode_index"]), path)
    with open_fixture(name) as intact, LeRobotAsUniEnvDataset.from_local(root, NumpyComputeBackend) as ds:
        assert len(ds) == len(intact)
        rows = np.arange(len(ds))
        got, want = ds.get_at(rows), intact.get_at(rows)
        assert set(got) == set(want) - {"episode_index"}
        for key in got:
            np.testing.assert_array_equal(got[key], want[key])
    # an episode longer than its file is still an error naming the file
    table = pq.read_table(files[-1])
    pq.write_table(table.slice(0, table.num_rows - 1), files[-1])
    with pytest.raises(StorageFormatError, match=files[-1].name):
        LeRobotAsUniEnvDataset.from_local(root, NumpyComputeBackend)


def test_not_a_dataset_folder(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        LeRobotAsUniEnvDataset.from_local(tmp_path / "nothing", NumpyComputeBackend)
    (tmp_path / "empty").mkdir()
    with pytest.raises(StorageFormatError, match="info.json"):
        LeRobotAsUniEnvDataset.from_local(tmp_path / "empty", NumpyComputeBackend)


def test_import_unienv_data_does_not_import_pyarrow_or_av() -> None:
    import subprocess
    import sys
    code = ("import sys, unienv_data, unienv_data.integrations.lerobot; "
            "print(sorted(m for m in ('pyarrow', 'av', 'torch', 'lerobot', 'huggingface_hub') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env=dict(os.environ))
    assert out.stdout.strip() == "[]"


# ---------------------------------------------------------------------------------------------------- convert
def _cli(*argv: str) -> int:
    from unienv_data.cli import main
    return main([str(a) for a in argv])


def _read_with_lerobot(root: Path, tmp_path: Path, venv: str = "lerobot") -> Dict[str, Any]:
    """What lerobot's own LeRobotDataset reads from `root` (tests/fixtures/lerobot_read.py in the venv `venv`:
    lerobot 0.4.4, or 0.3.3 in "lerobot_v21")."""
    import subprocess
    from _third_party import venv_python
    py = venv_python(venv)
    out = tmp_path / "lerobot_read.npz"
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", HF_HOME=str(tmp_path / "hf"))
    env.pop("PYTHONPATH", None)
    proc = subprocess.run([str(py), str(FIXTURES.parent / "lerobot_read.py"), str(root), str(out)],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    z = np.load(out)
    got: Dict[str, Any] = {k: z[k] for k in z.files if k != "__meta__"}
    got["__meta__"] = json.loads(str(z["__meta__"]))
    return got


@pytest.mark.parametrize("venv,name", [("lerobot", "v30_multifile"), ("lerobot", "v30_image"),
                                       ("lerobot_v21", "v21_video"), ("lerobot_v21", "v21_image")])
def test_equal_to_lerobot_reading_the_fixture_now(tmp_path: Path, venv: str, name: str) -> None:
    # the live form of expected.json: the lerobot that wrote the fixture reads it, in its venv, and this library's
    # reading equals it value for value and frame for frame
    theirs = _read_with_lerobot(FIXTURES / name, tmp_path, venv)
    with open_fixture(name) as ds:
        ours, meta = ds.get_at_with_metadata(slice(None))
    assert set(ours) == {k for k in theirs if k != "__meta__"}
    for k, v in ours.items():
        np.testing.assert_array_equal(theirs[k].reshape(v.shape), v, err_msg=k)
    assert theirs["__meta__"]["task"] == meta["task"]


def test_convert_from_lerobot_keeps_values_and_episodes(tmp_path: Path) -> None:
    from unienv_data.inspect import open_dataset
    assert _cli("convert", FIXTURES / "v30_multifile", tmp_path / "native", "--from", "lerobot", "--layout",
                "native", "-q") == 0
    with open_fixture("v30_multifile") as ds, open_dataset(str(tmp_path / "native")) as ours:
        assert ours.episodes() == ds.get_segments()
        want = ds.get_at(slice(None))
        got = ours.read(np.arange(len(ds)))
        for k in want:
            np.testing.assert_array_equal(np.asarray(got[k]), want[k], err_msg=k)


def test_convert_from_lerobot_defaults_to_native_video_at_the_dataset_fps(tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture) -> None:
    dst = tmp_path / "nv"
    assert _cli("convert", FIXTURES / "v21_video", dst, "--from", "lerobot", "--lossless", "-q", "--json") == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["layout"] == "native-video" and summary["fps"] == 10 and summary["from"] == "lerobot"
    recorded = []
    for meta in dst.rglob("*.json"):
        d = json.loads(meta.read_text())
        if isinstance(d, dict) and "fps" in d and "codec" in json.dumps(d):
            recorded.append(d["fps"])
    assert recorded and set(recorded) == {10}, recorded        # the videos' metadata, not VideoStorage's 15
    with open_fixture("v21_video") as ds:
        want = ds.get_at(slice(None))
        segments = ds.get_segments()
    from unienv_data.inspect import open_dataset
    with open_dataset(str(dst)) as ours:
        assert ours.episodes() == segments
        got = ours.read(np.arange(len(ours)))
    np.testing.assert_array_equal(np.asarray(got["observation.images.top"]), want["observation.images.top"])


def test_convert_from_lerobot_gives_lossy_videos_a_short_gop(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    def gops(root: Path) -> List[Any]:
        return [json.loads(m.read_text())["gop_size"] for m in root.rglob("*.json") if '"gop_size"' in m.read_text()]

    assert _cli("convert", FIXTURES / "v21_video", tmp_path / "short", "--from", "lerobot", "-q") == 0
    assert gops(tmp_path / "short") and set(gops(tmp_path / "short")) == {2}   # LeRobot's, for random windows
    assert _cli("convert", FIXTURES / "v21_video", tmp_path / "long", "--from", "lerobot", "--gop", "8", "-q") == 0
    assert gops(tmp_path / "long") and set(gops(tmp_path / "long")) == {8}
    capsys.readouterr()
    assert _cli("convert", FIXTURES / "v21_video", tmp_path / "flat", "--from", "lerobot", "--layout", "native",
                "--gop", "4", "-q") == 1
    assert "--gop applies to --layout native-video" in capsys.readouterr().err


def test_convert_lerobot_to_lerobot_takes_the_source_fps(tmp_path: Path) -> None:
    # --from and --to combine through the generic tables; without --fps the source's is used
    out = tmp_path / "v30"
    assert _cli("convert", FIXTURES / "v21_video", out, "--from", "lerobot", "--to", "lerobot", "--task-key",
                "task_index", "--task-names", FIXTURES / "v21_video", "-q") == 0
    exp = expected("v21_video")
    with LeRobotAsUniEnvDataset.from_local(out, NumpyComputeBackend) as ds:
        assert ds.schema.codebase_version == "v3.0" and ds.fps == exp["fps"]
        assert ds.get_segments() == [(0, 12), (12, 27), (27, 37)]
        assert ds.get_at_with_metadata(slice(None))[1]["task"] == exp["task"]
    # a failed export leaves no DST behind, and DST is free for the next run
    bad = tmp_path / "bad"
    assert _cli("convert", FIXTURES / "v21_video", bad, "--from", "lerobot", "--to", "lerobot", "--lossless",
                "-q") == 1
    assert not bad.exists()


def test_convert_to_lerobot_opens_in_lerobot_with_equal_values(tmp_path: Path) -> None:
    native, out = tmp_path / "native", tmp_path / "lerobot"
    assert _cli("convert", FIXTURES / "v30_multifile", native, "--from", "lerobot", "--layout", "native", "-q") == 0
    assert _cli("convert", native, out, "--to", "lerobot", "--fps", "10", "--task", "stack the cubes", "-q") == 0
    with open_fixture("v30_multifile") as src:
        want = src.get_at(slice(None))
        segments = src.get_segments()
    theirs = _read_with_lerobot(out, tmp_path)
    meta = theirs["__meta__"]
    assert meta["fps"] == 10 and meta["lerobot_version"] == "0.4.4"
    assert [(e["index"], e["length"], e["tasks"]) for e in meta["episodes"]] == \
        [(i, e - s, ["stack the cubes"]) for i, (s, e) in enumerate(segments)]
    assert set(meta["task"]) == {"stack the cubes"}
    for k in ("observation.state", "action", "frame_index", "episode_index", "index", "timestamp"):
        np.testing.assert_array_equal(theirs[k].reshape(want[k].shape), want[k], err_msg=k)
    with LeRobotAsUniEnvDataset.from_local(out, NumpyComputeBackend) as mine:
        ours = mine.get_at(slice(None))
    for cam in ("observation.images.top", "observation.images.wrist"):
        diff = np.abs(theirs[cam].astype(np.int16) - want[cam].astype(np.int16)).mean()
        assert diff < 6.0, f"{cam}: mean difference {diff:.2f} from the source frames"
        # lerobot and this library decode the exported files to the same bytes
        np.testing.assert_array_equal(theirs[cam], ours[cam], err_msg=cam)


def _record_native(path: Path, space: Any, lengths: Any, make_row: Any) -> List[Any]:
    """A native-layout buffer at `path` holding one episode per entry of `lengths`, step `t` of an `n`-step episode
    being `make_row(t, n)`; dumped and closed. The rows, in order."""
    from unienv_data.cli.convert import storage_for_layout
    from unienv_data.replay_buffer import ReplayBuffer
    cls, kw = storage_for_layout(space, "native")
    rb = ReplayBuffer.create(cls, space, cache_path=str(path), capacity=None, **kw)
    rows = []
    for n in lengths:
        for t in range(n):
            row = make_row(t, n)
            rows.append(row)
            rb.append(row)
        rb.mark_segment_end()
    rb.dumps()
    rb.close()
    return rows


def test_convert_to_lerobot_maps_keys(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    from unienv_interface.space import BoxSpace, DictSpace
    B = NumpyComputeBackend
    space = DictSpace(B, {"obs": DictSpace(B, {"joints": BoxSpace(B, -1.0, 1.0, np.float32, shape=(3,)),
                                                "cam": BoxSpace(B, 0, 255, np.uint8, shape=(16, 16, 3))}),
                          "act": BoxSpace(B, -1.0, 1.0, np.float64, shape=(2,)),
                          "grid": BoxSpace(B, 0.0, 1.0, np.float32, shape=(2, 2))})
    rng = np.random.default_rng(0)
    rows = _record_native(tmp_path / "rb", space, (5, 7), lambda t, n: {
        "obs": {"joints": rng.uniform(-1, 1, 3).astype(np.float32), "cam": np.full((16, 16, 3), 20 * t, np.uint8)},
        "act": rng.uniform(-1, 1, 2), "grid": np.zeros((2, 2), np.float32)})
    out = tmp_path / "lr"
    # a 2-D tabular key cannot become a LeRobot feature: the error names it and says what to do
    assert _cli("convert", tmp_path / "rb", out, "--to", "lerobot", "--fps", "5", "-q") == 1
    capfd.readouterr()
    assert _cli("convert", tmp_path / "rb", out, "--to", "lerobot", "--exclude", "grid") == 1  # no --fps
    err = capfd.readouterr().err
    assert "needs --fps N" in err and "converting" not in err      # the error, without a progress line before it
    assert _cli("convert", tmp_path / "rb", out, "--to", "lerobot", "--fps", "5", "--exclude", "grid",
                "--map", "obs/cam=observation.images.front", "--map", "obs.joints=observation.state",
                "--map", "act=action", "-q") == 0
    assert "Svt[info]" not in capfd.readouterr().err               # the AV1 encoder's settings log is quiet
    with LeRobotAsUniEnvDataset.from_local(out, NumpyComputeBackend) as ds:
        assert ds.get_segments() == [(0, 5), (5, 12)] and ds.fps == 5
        assert set(ds.single_space.keys()) == {"observation.images.front", "observation.state", "action",
                                               "timestamp", "frame_index", "episode_index", "index", "task_index"}
        got = ds.get_at(slice(None))
        np.testing.assert_array_equal(got["observation.state"], np.stack([r["obs"]["joints"] for r in rows]))
        np.testing.assert_array_equal(got["action"], np.stack([r["act"] for r in rows]))
        assert got["action"].dtype == np.float64
        cam = np.stack([r["obs"]["cam"] for r in rows]).astype(np.int16)
        assert np.abs(got["observation.images.front"].astype(np.int16) - cam).mean() < 6.0


def test_info_and_verify_on_lerobot_folders(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert _cli("info", FIXTURES / "v21_video", "--json") == 0
    d = json.loads(capsys.readouterr().out)
    assert d["kind"] == "LeRobot v2.1" and d["length"] == 37 and d["episode_lengths"] == [12, 15, 10]
    assert d["details"]["tasks"] == {"0": "pick the cube", "1": "place the cube", "2": "wave"}
    assert d["details"]["fps"] == 10 and d["format_versions"] == {"lerobot": "v2.1"}
    assert _cli("verify", FIXTURES / "v30_multifile", "-q") == 0
    assert "OK" in capsys.readouterr().out
    root = copy_fixture("v30_video", tmp_path)
    victim = root / "videos" / "observation.images.top" / "chunk-000" / "file-000.mp4"
    victim.write_bytes(victim.read_bytes()[:3000])
    assert _cli("verify", root, "-q") == 1
    out = capsys.readouterr().out
    assert "DAMAGED" in out and "file-000.mp4" in out


def test_example_lerobot_roundtrip(tmp_path: Path) -> None:
    import subprocess
    import sys
    example = FIXTURES.parent.parent.parent / "examples" / "lerobot_roundtrip.py"
    proc = subprocess.run([sys.executable, str(example), "--out", str(tmp_path / "rt")], capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "round trip ok: " in proc.stdout and "windows: frames (8, 2, 48, 64, 3) uint8" in proc.stdout


def test_plot_on_a_lerobot_folder(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    pytest.importorskip("matplotlib")
    assert _cli("plot", FIXTURES / "v30_multifile", "--out", tmp_path / "plots", "-q", "--json") == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["episodes"] == 3 and summary["steps"] == 37
    assert set(summary["image_keys"]) == {"observation.images.top", "observation.images.wrist"}
    names = sorted(os.path.basename(f) for f in summary["files"])
    assert "frames_observation.images.wrist.png" in names and "episode_lengths.png" in names
    assert all((tmp_path / "plots" / n).stat().st_size > 1000 for n in names)


def test_round_trip_keeps_every_frames_task(tmp_path: Path) -> None:
    native, out = tmp_path / "native", tmp_path / "lerobot"
    src = FIXTURES / "v21_video"          # episode 1 has two tasks
    assert _cli("convert", src, native, "--from", "lerobot", "--layout", "native", "-q") == 0
    assert _cli("convert", native, out, "--to", "lerobot", "--fps", "10", "--task-key", "task_index",
                "--task-names", src, "-q") == 0
    exp = expected("v21_video")
    theirs = _read_with_lerobot(out, tmp_path)
    assert theirs["__meta__"]["task"] == exp["task"]
    assert [e["tasks"] for e in theirs["__meta__"]["episodes"]] == [e["tasks"] for e in exp["episodes"]]
    with LeRobotAsUniEnvDataset.from_local(out, NumpyComputeBackend) as ds:
        assert ds.get_at_with_metadata(slice(None))[1]["task"] == exp["task"]
        assert [e.tasks for e in ds.episode_metadata] == [["pick the cube"], ["place the cube", "wave"],
                                                          ["pick the cube"]]
    names = tmp_path / "names.json"
    names.write_text(json.dumps(["pick the cube"]))       # index 1 and 2 have no text: refused, named
    assert _cli("convert", native, tmp_path / "x", "--to", "lerobot", "--fps", "10", "--task-key", "task_index",
                "--task-names", names, "-q") == 1


def test_lerobot_round_trip_keeps_bounds_and_scalar_shapes(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """`--to lerobot` then `--from lerobot`: the action's bounds and the scalar `done` come back as they were
    (meta/unienv_spaces.json, which lerobot 0.4.4 ignores while reading the same values); the export says its video
    is lossy and how to keep frames exact."""
    from unienv_data.replay_buffer import ReplayBuffer
    from unienv_interface.space import BinarySpace, BoxSpace, DictSpace
    B = NumpyComputeBackend
    space = DictSpace(B, {"action": BoxSpace(B, -1.0, 1.0, np.float32, shape=(2,)),
                          "reward": BoxSpace(B, -np.inf, np.inf, np.float32, shape=()),
                          "step": BoxSpace(B, 0, 100, np.int64, shape=()),
                          "done": BinarySpace(B, ()),
                          "camera": BoxSpace(B, 0, 255, np.uint8, shape=(32, 32, 3))})
    rng = np.random.default_rng(0)
    rows = _record_native(tmp_path / "rb", space, (6, 4), lambda t, n: {
        "action": rng.uniform(-1, 1, 2).astype(np.float32), "reward": np.float32(t), "step": np.int64(t),
        "done": t == n - 1, "camera": rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)})
    lr, back = tmp_path / "lr", tmp_path / "back"
    capsys.readouterr()
    assert _cli("convert", tmp_path / "rb", lr, "--to", "lerobot", "--fps", "10", "-q") == 0
    out = capsys.readouterr().out
    notes = [line for line in out.splitlines() if "lossy" in line]
    assert len(notes) == 1 and "--crf" in notes[0] and "--lossless" in notes[0], out
    recorded = json.loads((lr / "meta" / "unienv_spaces.json").read_text())["features"]
    assert set(recorded) == {"action", "reward", "step", "done"}
    # lerobot itself opens the folder and reads the values written
    theirs = _read_with_lerobot(lr, tmp_path)
    for k in ("action", "reward", "step", "done"):
        want = np.stack([r[k] for r in rows])
        np.testing.assert_array_equal(theirs[k].reshape(want.shape), want, err_msg=k)
    assert _cli("convert", lr, back, "--from", "lerobot", "--layout", "native", "-q") == 0
    rb2 = ReplayBuffer.load_from(str(back), backend=B)
    try:
        sp = rb2.single_space
        assert isinstance(sp["action"], BoxSpace) and sp["action"].shape == (2,)
        assert np.all(sp["action"].low_numpy == -1.0) and np.all(sp["action"].high_numpy == 1.0)
        assert isinstance(sp["done"], BinarySpace) and sp["done"].shape == ()
        assert sp["reward"].shape == () and sp["step"].shape == ()
        assert int(sp["step"].low_numpy) == 0 and int(sp["step"].high_numpy) == 100
        got = rb2.get_at(slice(None))
        for k in ("action", "reward", "step", "done"):
            np.testing.assert_array_equal(got[k], np.stack([r[k] for r in rows]), err_msg=k)
    finally:
        rb2.close()


def test_replay_buffer_load_from_on_a_lerobot_folder_says_how_to_read_it() -> None:
    """`ReplayBuffer.load_from` of a LeRobot folder: still a StorageNotFoundError (a FileNotFoundError), naming the
    missing file and the two ways to read the folder."""
    from unienv_data.base.errors import StorageNotFoundError
    from unienv_data.replay_buffer import ReplayBuffer
    folder = str(FIXTURES / "v30_video")
    with pytest.raises(StorageNotFoundError) as err:
        ReplayBuffer.load_from(folder, backend=NumpyComputeBackend)
    assert isinstance(err.value, FileNotFoundError)
    msg = str(err.value)
    assert os.path.join(folder, "metadata.json") in msg
    assert f"LeRobotAsUniEnvDataset.from_local({folder!r}" in msg and "--from lerobot" in msg
    # the hint is the reader's: it opens the folder
    with LeRobotAsUniEnvDataset.from_local(folder, NumpyComputeBackend) as ds:
        assert len(ds) == 37
