"""The `unienv-data` command line, run as a real console script in subprocesses.

One small demo dataset is recorded per module (`demo_dir`); the other tests read it or work on copies. Datasets
are recorded with the NumPy backend (a subprocess then starts in ~0.3 s instead of ~1.5 s with torch); one test
records with the default backend (PyTorch when installed).
"""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List

import numpy as np
import pytest

pytest.importorskip("PIL")


def _command() -> List[str]:
    script = Path(sys.executable).with_name("unienv-data")
    if script.exists():
        return [str(script)]
    found = shutil.which("unienv-data")
    return [found] if found else [sys.executable, "-m", "unienv_data"]


CLI = _command()


def run_cli(*args: Any, check: bool = True, module: bool = False) -> subprocess.CompletedProcess:
    cmd = ([sys.executable, "-m", "unienv_data"] if module else CLI) + [str(a) for a in args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if check and proc.returncode != 0:
        raise AssertionError(f"{cmd} exited {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
    return proc


def run_json(*args: Any) -> Dict[str, Any]:
    return json.loads(run_cli(*args, "--json", "-q").stdout)


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("demo") / "ds"
    summary = run_json("demo", "--out", out, "--episodes", 5, "--steps", 40, "--backend", "numpy")
    assert summary["episodes"] == 5 and summary["steps"] == sum(summary["episode_lengths"])
    return out


@pytest.fixture
def demo_copy(demo_dir: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "copy"
    shutil.copytree(demo_dir, dst)
    return dst


def image_stats(path: Path) -> Dict[str, Any]:
    from PIL import Image
    with Image.open(path) as im:
        im.verify()
    with Image.open(path) as im:
        arr = np.asarray(im.convert("RGB"))
    colors = np.unique(arr.reshape(-1, 3), axis=0).shape[0]
    return {"size": arr.shape[1::-1], "colors": colors, "std": float(arr.std())}


def assert_nontrivial_png(path: Path, min_size: int = 200) -> None:
    assert path.is_file(), path
    st = image_stats(path)
    assert min(st["size"]) >= min_size // 2 and max(st["size"]) >= min_size, st
    assert st["colors"] > 20 and st["std"] > 10, f"{path} looks blank: {st}"


def read_all(path: Path) -> Dict[str, np.ndarray]:
    from unienv_data.inspect import open_dataset
    with open_dataset(str(path)) as ds:
        data = ds.read_numpy(np.arange(len(ds)))
        data["__episodes__"] = np.asarray(ds.episodes())
    return data


# ---------------------------------------------------------------------------------------------------- help / entry
def test_help_on_every_command() -> None:
    top = run_cli("--help")
    for name in ("demo", "info", "verify", "plot", "stats", "convert", "export-video"):
        assert name in top.stdout
        sub = run_cli(name, "--help")
        assert sub.stdout.startswith(f"usage: unienv-data {name}"), sub.stdout[:200]
    assert "usage: unienv-data" in run_cli("--help", module=True).stdout
    bare = run_cli(check=False)
    assert bare.returncode == 2 and "usage" in bare.stderr


def test_importing_the_package_and_the_cli_loads_no_optional_library() -> None:
    code = ("import sys, unienv_data, unienv_data.inspect, unienv_data.cli as c; c.build_parser(); "
            "print([m for m in ('matplotlib', 'PIL', 'av', 'torch', 'h5py') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# ---------------------------------------------------------------------------------------------------- demo / info
def test_demo_writes_a_native_layout_dataset_and_a_preview(demo_dir: Path) -> None:
    assert (demo_dir / "metadata.json").is_file()
    meta = json.loads((demo_dir / "storage" / "dict_storage_metadata.json").read_text())
    assert "@float32" in meta["groups"]                      # float32 leaves share one flat row
    assert meta["storage_map"]["obs/camera"]["path"].endswith(".memmap")
    assert_nontrivial_png(demo_dir / "preview.png")


def test_demo_text_summary_and_refusal_to_overwrite_foreign_dirs(tmp_path: Path) -> None:
    out = tmp_path / "d"
    proc = run_cli("demo", "--out", out, "--episodes", 2, "--steps", 20)
    assert "recorded 2 episodes" in proc.stdout and "bytes per key" in proc.stdout
    assert "recording: 2 episodes" in proc.stderr             # the progress bar's closing line off a terminal
    assert ("backend pytorch" in proc.stdout) == (importlib.util.find_spec("torch") is not None)
    run_cli("demo", "--out", out, "--episodes", 1, "--steps", 20, "-q", "--backend", "numpy")  # replaced
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    bad = run_cli("demo", "--out", foreign, "-q", check=False)
    assert bad.returncode == 1 and "not empty" in bad.stderr and (foreign / "notes.txt").exists()


def test_info_json_and_text(demo_dir: Path) -> None:
    d = run_json("info", demo_dir)
    assert d["kind"] == "ReplayBuffer" and d["format_versions"]["metadata.json"] == 1
    assert d["length"] == sum(d["episode_lengths"]) and len(d["episodes"]) == 5
    assert d["problems"] == []
    n = d["length"]
    assert d["raw_bytes_per_key"]["obs/camera"] == n * 64 * 64 * 3
    assert d["bytes_per_key"]["obs/camera"] >= n * 64 * 64 * 3
    assert d["raw_bytes_per_key"]["terminated"] == n                      # bools stay one byte
    kinds = {s["kind"] for s in d["storages"]}
    assert {"ReplayBuffer", "DictStorage", "FlattenedStorage"} <= kinds
    text = run_cli("info", demo_dir, "--episodes").stdout
    for needle in ("ReplayBuffer", "space:", "obs/", "camera", "uint8 (64, 64, 3)", "storages:", "bytes per key"):
        assert needle in text, needle


def test_info_into_a_reader_that_stops_early_is_quiet(demo_dir: Path) -> None:
    """`unienv-data info PATH | head -1`: the reader closes the pipe after one line; the command stops without an
    error message (it printed "error: BrokenPipeError")."""
    import fcntl
    read_end, write_end = os.pipe()
    fcntl.fcntl(write_end, getattr(fcntl, "F_SETPIPE_SZ", 1031), 4096)    # a pipe smaller than the JSON summary
    info = subprocess.Popen(CLI + ["info", "--json", str(demo_dir)], stdout=write_end, stderr=subprocess.PIPE)
    os.close(write_end)
    first = os.read(read_end, 100)
    os.close(read_end)                  # what `head` does once it has its lines
    _out, err = info.communicate(timeout=300)
    assert first.strip() and b"error" not in err.lower() and b"Exception" not in err, err.decode()[-2000:]
    assert info.returncode == 141


def test_info_on_a_nested_storage_and_on_a_non_dataset(demo_dir: Path, tmp_path: Path) -> None:
    d = run_json("info", demo_dir / "storage")
    assert d["kind"] == "DictStorage" and "obs/camera" in d["bytes_per_key"]
    bad = run_cli("info", tmp_path, check=False)
    assert bad.returncode == 1 and "holds no dataset metadata" in bad.stderr


# ---------------------------------------------------------------------------------------------------- verify
def test_verify_ok_then_truncated_file_is_reported(demo_copy: Path) -> None:
    ok = run_cli("verify", demo_copy)
    assert ok.returncode == 0 and ok.stdout.rstrip().endswith("OK")
    assert run_cli("verify", demo_copy / "storage", "-q").returncode == 0
    data = demo_copy / "storage" / "obs.camera.memmap"
    with open(data, "r+b") as f:
        f.truncate(data.stat().st_size // 3)
    bad = run_cli("verify", demo_copy, check=False)
    assert bad.returncode == 1
    assert "storage/obs.camera.memmap" in bad.stdout and "truncated" in bad.stdout
    report = json.loads(run_cli("verify", demo_copy, "--json", "-q", check=False).stdout)
    assert report["ok"] is False and any("obs.camera.memmap" in p for p in report["problems"])


def test_verify_and_info_count_the_rows_in_use_not_the_preallocated_ring(tmp_path: Path) -> None:
    ring = tmp_path / "ring"
    summary = run_json("demo", "--out", ring, "--episodes", 2, "--steps", 20, "--capacity", 3000, "--backend", "numpy")
    n = sum(summary["episode_lengths"])
    report = json.loads(run_cli("verify", ring, "--json", "-q").stdout)
    assert report["checked"]["rows_read"] == n and report["checked"]["capacity_rows"] == 3000
    text = run_cli("verify", ring)
    assert f"the {n} rows in use (of 3000 preallocated)" in text.stdout
    assert f"verifying rows: {n} rows in" in text.stderr           # the bar counts steps, as `stats` does
    d = run_json("info", ring)
    assert 0 < d["allocated_bytes"] <= d["total_bytes"] + 4096 * len(list(ring.rglob("*")))
    if d["allocated_bytes"] < 0.9 * d["total_bytes"]:            # sparse files (most file systems)
        assert "allocated on disk" in run_cli("info", ring).stdout


def test_verify_reports_damaged_metadata_and_checksum_mismatch(demo_copy: Path) -> None:
    wrote = run_cli("verify", demo_copy, "--write-checksums", "-q")
    assert (demo_copy / "checksums.sha256").is_file() and "wrote" in wrote.stdout
    assert "files checked" in run_cli("verify", demo_copy, "-q").stdout
    inner = demo_copy / "storage" / "@float32" / "inner_storage.memmap"
    raw = bytearray(inner.read_bytes())
    raw[7] ^= 0xFF                                            # same size, different content
    inner.write_bytes(bytes(raw))
    bad = run_cli("verify", demo_copy, "-q", check=False)
    assert bad.returncode == 1 and "inner_storage.memmap: SHA-256" in bad.stdout
    (demo_copy / "checksums.sha256").unlink()
    (demo_copy / "storage" / "dict_storage_metadata.json").write_text("{not json")
    bad = run_cli("verify", demo_copy, "-q", check=False)
    assert bad.returncode == 1 and "dict_storage_metadata.json: metadata is damaged" in bad.stdout


# ---------------------------------------------------------------------------------------------------- plot
def test_plot_writes_png_charts_and_contact_sheet(demo_dir: Path, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "plots"
    res = run_json("plot", demo_dir, "--out", out)
    names = sorted(os.path.basename(f) for f in res["files"])
    assert names == ["episode_lengths.png", "frames_obs.camera.png", "value_ranges.png"]
    for name in names:
        assert_nontrivial_png(out / name)
    assert "obs/camera" not in res["charted_keys"] and "reward" in res["charted_keys"]


# ---------------------------------------------------------------------------------------------------- convert
def test_convert_between_layouts_keeps_values_and_episodes(demo_dir: Path, tmp_path: Path) -> None:
    pytest.importorskip("av")
    src = read_all(demo_dir)
    flat = tmp_path / "flat"
    res = run_json("convert", demo_dir, flat, "--layout", "flattened", "--chunk", 37)
    assert res["episodes_written"] == 5 and res["rows"] == len(src["reward"])
    assert any("promotes" in w for w in res["warnings"])     # uint8 frames in a float32 row: the warning is shown
    video = tmp_path / "video"
    run_json("convert", flat, video, "--layout", "native-video", "--lossless")
    back = tmp_path / "back"
    run_json("convert", video, back, "--layout", "native")
    for path in (flat, video, back):
        got = read_all(path)
        assert sorted(got) == sorted(src)
        for k in src:
            np.testing.assert_array_equal(got[k], src[k], err_msg=f"{path.name}: {k}")
    assert json.loads((video / "storage" / "dict_storage_metadata.json").read_text())["storage_map"]["obs/camera"][
        "type"].endswith("VideoStorage")
    assert run_cli("verify", video, "-q").returncode == 0


def test_convert_to_native_video_keeps_the_source_fps(tmp_path: Path) -> None:
    pytest.importorskip("av")
    from unienv_data.cli.convert import storage_for_layout
    from unienv_data.replay_buffer import ReplayBuffer
    from unienv_interface.backends import NumpyComputeBackend as B
    from unienv_interface.space import BoxSpace, DictSpace
    space = DictSpace(B, {"camera": BoxSpace(B, 0, 255, np.uint8, shape=(16, 16, 3)),
                          "reward": BoxSpace(B, -1.0, 1.0, np.float32, shape=())})
    cls, kw = storage_for_layout(space, "native-video", lossless=True, fps=30)
    rb = ReplayBuffer.create(cls, space, cache_path=str(tmp_path / "src"), capacity=None, **kw)
    for t in range(6):
        rb.append({"camera": np.full((16, 16, 3), 30 * t, np.uint8), "reward": np.float32(t / 10)})
    rb.mark_segment_end()
    rb.dumps()
    rb.close()

    def video_fps(root: Path) -> List[Any]:
        return [json.loads(m.read_text())["fps"] for m in root.rglob("*.json")
                if '"codec"' in m.read_text() and '"fps"' in m.read_text()]

    assert video_fps(tmp_path / "src") == [30]
    res = run_json("convert", tmp_path / "src", tmp_path / "dst", "--layout", "native-video", "--lossless")
    assert res["fps"] == 30 and video_fps(tmp_path / "dst") == [30]      # not VideoStorage's default 15
    np.testing.assert_array_equal(read_all(tmp_path / "dst")["camera"], read_all(tmp_path / "src")["camera"])


def test_convert_unwraps_a_ring_and_refuses_a_non_empty_destination(tmp_path: Path) -> None:
    ring = tmp_path / "ring"
    summary = run_json("demo", "--out", ring, "--episodes", 6, "--steps", 30, "--capacity", 90, "--seed", 3,
                       "--backend", "numpy")
    assert summary["steps"] == 90 and summary["steps_recorded"] > 90    # the ring wrapped
    assert summary["episodes"] < 6                                        # and dropped the oldest episodes
    assert run_cli("verify", ring, "-q").returncode == 0
    dst = tmp_path / "native"
    run_json("convert", ring, dst, "--layout", "native")
    a, b = read_all(ring), read_all(dst)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    assert run_json("info", dst)["offset"] == 0
    again = run_cli("convert", ring, dst, "--layout", "native", "-q", check=False)
    assert again.returncode == 1 and "not empty" in again.stderr


# ---------------------------------------------------------------------------------------------------- export-video
def test_export_video_writes_every_frame(demo_dir: Path, tmp_path: Path) -> None:
    av = pytest.importorskip("av")
    out = tmp_path / "cam.mp4"
    res = run_json("export-video", demo_dir, "obs/camera", out)
    n = len(read_all(demo_dir)["reward"])
    assert res["frames"] == n and out.stat().st_size > 1000
    with av.open(str(out)) as container:
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    assert len(frames) == n and frames[0].shape == (64, 64, 3)
    one = run_json("export-video", demo_dir, "obs.camera", tmp_path / "ep.mkv", "--episode", -1)
    assert one["frames"] == one["rows"][1] - one["rows"][0]
    bad = run_cli("export-video", demo_dir, "reward", tmp_path / "x.mp4", check=False)
    assert bad.returncode == 1 and "obs/camera" in bad.stderr


def test_demo_with_video_storage_verifies(tmp_path: Path) -> None:
    pytest.importorskip("av")
    out = tmp_path / "vid"
    s = run_json("demo", "--out", out, "--episodes", 2, "--steps", 20, "--video", "--backend", "numpy")
    assert s["video_codec"] and s["verified"]["camera_psnr_db"] > 25
    assert run_cli("verify", out, "-q").returncode == 0


# ---------------------------------------------------------------------------------------------------- in process
def test_demo_falls_back_without_the_native_layout(monkeypatch: pytest.MonkeyPatch) -> None:
    from unienv_data.cli.demo import build_space, choose_layout, pick_backend
    monkeypatch.setitem(sys.modules, "unienv_data.storages.native_layout", None)
    space = build_space(pick_backend("numpy"), 16)
    desc, _cls, kwargs = choose_layout(space, video=False, lossless=False)
    assert desc.startswith("fallback layout") and set(kwargs["storage_cls_map"]) == {"obs/camera", "*"}
    from unienv_data.cli._common import CLIError
    with pytest.raises(CLIError, match="native layout"):
        choose_layout(space, video=True, lossless=False)


def _small_dataset(path: Path) -> None:
    from unienv_interface.backends import NumpyComputeBackend as B
    from unienv_interface.space import BinarySpace, BoxSpace, DictSpace
    from unienv_data.replay_buffer import ReplayBuffer
    from unienv_data.storages.dict_storage import DictStorage
    from unienv_data.storages.native_layout import native_layout_kwargs
    space = DictSpace(B, {"x": BoxSpace(B, -1.0, 1.0, np.float32, shape=(3,)),
                          "y": BoxSpace(B, -1.0, 1.0, np.float32, shape=()),
                          "cam": BoxSpace(B, 0, 255, np.uint8, shape=(8, 8, 3)), "done": BinarySpace(B, ())})
    rb = ReplayBuffer.create(DictStorage, space, cache_path=str(path), capacity=40, **native_layout_kwargs(space))
    for e in range(3):
        for t in range(10):
            rb.append({"x": np.full(3, t / 10, np.float32), "y": np.float32(-t / 10),
                       "cam": np.full((8, 8, 3), t, np.uint8), "done": np.bool_(t == 9)})
        rb.mark_segment_end()
    rb.dumps()
    rb.close()


def _mutate(obj: Any, rng: np.random.Generator) -> Any:
    """`obj` (parsed JSON) with one value replaced or one key removed, somewhere in the tree."""
    garbage = [None, -1, "x", 10 ** 12, [], {}, 1.5, True, "../../outside", [[1, 2], [3]], {"type": "DictSpace"}]
    if isinstance(obj, dict) and obj:
        key = list(obj)[rng.integers(len(obj))]
        if rng.random() < 0.2:
            return {k: v for k, v in obj.items() if k != key}
        if rng.random() < 0.5 and isinstance(obj[key], (dict, list)) and obj[key]:
            return {**obj, key: _mutate(obj[key], rng)}
        return {**obj, key: garbage[rng.integers(len(garbage))]}
    if isinstance(obj, list) and obj:
        i = int(rng.integers(len(obj)))
        return obj[:i] + [_mutate(obj[i], rng)] + obj[i + 1:]
    return garbage[rng.integers(len(garbage))]


def test_damaged_metadata_never_crashes_info_or_verify(tmp_path: Path) -> None:
    from unienv_data.cli.verify import verify
    from unienv_data.inspect import describe
    src = tmp_path / "src"
    _small_dataset(src)
    assert verify(str(src))["ok"]
    metas = sorted(p.relative_to(src) for p in src.rglob("*.json"))
    rng = np.random.default_rng(0)
    flagged = 0
    for trial in range(60):
        ds = tmp_path / f"t{trial}"
        shutil.copytree(src, ds)
        target = ds / metas[trial % len(metas)]
        if trial % 10 == 9:
            target.write_bytes(target.read_bytes()[: int(rng.integers(0, 40))])     # a torn file
        else:
            target.write_text(json.dumps(_mutate(json.loads(target.read_text()), rng)))
        describe(str(ds))                                      # never raises for a dataset it recognises
        report = verify(str(ds))
        assert isinstance(report["ok"], bool) and all(isinstance(p, str) and p for p in report["problems"])
        flagged += not report["ok"]
        shutil.rmtree(ds)
    assert flagged >= 30                                       # most mutations are damage, and are reported


def test_info_and_verify_read_an_hdf5_file_a_recorder_holds_open(tmp_path: Path) -> None:
    pytest.importorskip("h5py")
    from unienv_data.storages.hdf5 import HDF5Storage
    from unienv_interface.backends import NumpyComputeBackend as NB
    from unienv_interface.space import BoxSpace

    path = tmp_path / "rec.h5"
    st = HDF5Storage.create(BoxSpace(NB, -1.0, 1.0, np.float32, shape=(3,)), capacity=8, cache_path=str(path))
    try:
        st.mark_segment_start(0)
        for _ in range(3):
            st.append(np.zeros(3, np.float32))
        st.mark_segment_end()
        st.flush()  # the recorder keeps the file open (HDF5's file lock held) while a second process inspects it
        info = run_json("info", path)
        assert info["kind"] == "HDF5Storage" and info["episode_lengths"] == [3] and info["problems"] == []
        run_cli("verify", path)
    finally:
        st.close()


_RECORD_AND_HANG = r"""
import sys, time
import numpy as np
from unienv_interface.backends import NumpyComputeBackend as B
from unienv_interface.space import BinarySpace, BoxSpace, DictSpace
from unienv_data.replay_buffer import ReplayBuffer
from unienv_data.storages.dict_storage import DictStorage
from unienv_data.storages.native_layout import native_layout_kwargs

space = DictSpace(B, {"camera": BoxSpace(B, 0, 255, np.uint8, shape=(8, 8, 3)),
                      "state": BoxSpace(B, -np.inf, np.inf, np.float32, shape=(4,)),
                      "done": BinarySpace(B, ())})
rb = ReplayBuffer.create(DictStorage, space, cache_path=sys.argv[1], capacity=200, overwrite=True,
                         **native_layout_kwargs(space))
for e, n in enumerate([10, 17, 24, 30]):
    for t in range(n):
        rb.append({"camera": np.full((8, 8, 3), e * 40 + t, np.uint8), "state": np.full(4, t, np.float32),
                   "done": np.bool_(t == n - 1)})
        if e == 3 and t == 12:
            print("MID", flush=True)
            time.sleep(600)
    rb.mark_segment_end()
"""


def _kill_at_mid(script: str, out: Any) -> int:
    """Runs `script` on `out` in a real subprocess, SIGKILLs it once it prints MID; its return code."""
    import signal
    child = subprocess.Popen([sys.executable, "-c", script, str(out)], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "MID"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=60)
    return int(child.returncode)


def test_info_after_a_sigkill_sees_the_episodes_load_from_sees(tmp_path: Path) -> None:
    """A fixed-capacity native-layout buffer killed mid-episode (no close): its episodes are only in the
    DictStorage's commit log; `info` must read them from there as `load_from` does."""
    import signal

    from unienv_data.replay_buffer import ReplayBuffer
    out = tmp_path / "killed"
    assert _kill_at_mid(_RECORD_AND_HANG, out) == -signal.SIGKILL
    assert (out / "storage" / "dict_commit.log").is_file()
    rb = ReplayBuffer.load_from(str(out), backend="numpy")
    try:
        episodes, length = rb.episode_segments(), len(rb)
    finally:
        rb.close()
    assert episodes == [(0, 10), (10, 27), (27, 51)] and length == 51
    d = run_json("info", out)
    assert [tuple(e) for e in d["episodes"]] == episodes and d["length"] == length
    for s in d["storages"]:
        assert s["segments"] == 3, s
    text = run_cli("info", out).stdout
    assert "episodes 3: 51 steps" in text and "none recorded" not in text
    assert "dict_commit.log" in text                        # the note says where the episodes came from
    # the per-key line of a preallocated ring says it is the ring's file size, compared with that many raw rows
    per_key = text.split("bytes per key")[1]
    camera = next(line for line in per_key.splitlines() if line.strip().startswith("camera "))
    assert "preallocated ring (200 rows): 1.00x raw" in camera, camera
    report = json.loads(run_cli("verify", out, "--json", "-q").stdout)
    assert report["ok"] is True, report["problems"]


def test_convert_refuses_flags_of_another_format(tmp_path: Path) -> None:
    """A flag that does not apply to the conversion asked for is an error naming it, never silently ignored."""
    src = tmp_path / "none"
    for args, flag in ((["--layout", "native", "--map", "a=b"], "--map"),
                       (["--layout", "native", "--fps", "10"], "--fps"),
                       (["--layout", "native", "--no-next-obs"], "--no-next-obs"),
                       (["--layout", "native", "--episode-column", "ep"], "--episode-column"),
                       (["--to", "lerobot", "--dataset-id", "x-v0"], "--dataset-id")):
        proc = run_cli("convert", src, tmp_path / "dst", *args, check=False)
        assert proc.returncode != 0 and flag in proc.stderr, (args, proc.stderr)


_ENCODE_AND_HANG = r"""
import sys, time
import numpy as np
from unienv_data.replay_buffer import ReplayBuffer
from unienv_data.storages.video_storage import video_storages_in

rb = ReplayBuffer.load_from(sys.argv[1], backend="numpy", read_only=False)
video = video_storages_in(rb.storage)[0]
writer, writer_shape = video.open_segment_writer(), video.single_instance_space.shape
rng = np.random.default_rng(0)
for t in range(30):
    writer.append(rng.integers(0, 256, writer_shape, dtype=np.uint8))
print("MID", flush=True)
time.sleep(600)
"""


def test_verify_remove_orphans_deletes_what_a_killed_video_writer_left(tmp_path: Path) -> None:
    """A recorder killed while encoding an episode leaves a hidden `.active-*.tmp.mp4`; `info` and `verify` name it
    and the command that deletes it, `verify --remove-orphans`, which deletes only it (checksums still match)."""
    import signal
    pytest.importorskip("av")
    out = tmp_path / "vid"
    run_json("demo", "--out", out, "--episodes", 2, "--steps", 20, "--video", "--backend", "numpy")
    assert run_cli("verify", out, "-q", "--write-checksums").returncode == 0
    def dataset_files() -> Dict[Any, bytes]:   # the writer lock holds the last writer's pid: not dataset content
        return {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and p.name != ".writer.lock"}
    before = dataset_files()
    _kill_at_mid(_ENCODE_AND_HANG, out)
    left = [p for p in out.rglob(".active-*") if p.is_file()]
    assert len(left) == 1 and left[0].name.endswith(".tmp.mp4")
    rel = str(left[0].relative_to(out))
    hint = f"unienv-data verify --remove-orphans {out}"
    for cmd in ("info", "verify"):
        text = run_cli(cmd, out, "-q").stdout
        assert rel in text and hint in text, text
    # the flag: removes it, says so, then verifies the dataset (unchanged otherwise: the checksums match)
    text = run_cli("verify", "--remove-orphans", out, "-q").stdout
    assert f"removed 1 orphan file(s): {rel}" in text and text.rstrip().endswith("OK"), text
    assert not left[0].exists()
    assert dataset_files() == before
    report = run_json("verify", out, "--remove-orphans")
    assert report["ok"] and report["orphans_removed"] == [] and report["warnings"] == []
    assert "--remove-orphans" not in run_cli("info", out, "-q").stdout


def test_verify_needs_checksums_for_bytes_zeroed_inside_a_lossy_video(tmp_path: Path) -> None:
    """What docs/cli.md says verify catches: a truncated video without checksums; bytes zeroed in the middle of a
    lossy video (same size, the decoder conceals the damage) only with checksums written before."""
    pytest.importorskip("av")
    out = tmp_path / "vid"
    run_json("demo", "--out", out, "--episodes", 2, "--steps", 20, "--video", "--backend", "numpy")
    bare, summed, cut = tmp_path / "bare", tmp_path / "summed", tmp_path / "cut"
    for d in (bare, summed, cut):
        shutil.copytree(out, d)
    assert run_cli("verify", summed, "-q", "--write-checksums").returncode == 0
    for d in (bare, summed):
        video = sorted((d / "storage" / "obs.camera").glob("*.mp4"))[-1]
        data = bytearray(video.read_bytes())
        mid = len(data) // 2
        data[mid:mid + 300] = bytes(300)
        video.write_bytes(bytes(data))
    video = sorted((cut / "storage" / "obs.camera").glob("*.mp4"))[-1]
    video.write_bytes(video.read_bytes()[:-100])
    assert run_cli("verify", bare, "-q").returncode == 0           # not caught without checksums
    damaged = run_cli("verify", summed, "-q", check=False)
    assert damaged.returncode == 1 and "the file changed since the checksum was written" in damaged.stdout
    truncated = run_cli("verify", cut, "-q", check=False)
    assert truncated.returncode == 1 and "truncated" in truncated.stdout
    doc = (Path(__file__).resolve().parents[1] / "docs" / "cli.md").read_text()
    assert "without checksums" in doc and "decoder conceals" in doc


PLUGIN = '''
from unienv_data.base import register_storage
from unienv_data.storages.npz_storage import NPZStorage


@register_storage
class PluginNPZStorage(NPZStorage):
    """A plugin storage: a registered subclass, in a module the CLI does not know."""
'''

RECORD = '''
import sys
import numpy as np
from unienv_interface.backends import NumpyComputeBackend as B
from unienv_interface.space import BoxSpace
from unienv_data.replay_buffer import ReplayBuffer
from unienv_plugin_for_cli import PluginNPZStorage
with ReplayBuffer.create(PluginNPZStorage, BoxSpace(B, -1.0, 1.0, np.float32, shape=(3,)), cache_path=sys.argv[1],
                         capacity=None) as rb:
    for _ in range(3):
        rb.append(np.zeros(3, np.float32))
    rb.mark_segment_end()
'''


def test_import_option_loads_a_plugin_storage(tmp_path: Path) -> None:
    (tmp_path / "unienv_plugin_for_cli.py").write_text(PLUGIN)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path)] + sys.path))
    data = tmp_path / "ds"
    subprocess.run([sys.executable, "-c", RECORD, str(data)], env=env, check=True, timeout=300)

    def cli(*args: Any) -> subprocess.CompletedProcess:
        return subprocess.run(CLI + [str(a) for a in args], env=env, capture_output=True, text=True, timeout=300)

    plain = cli("verify", data)
    assert plain.returncode == 1, plain.stderr
    said = plain.stdout + plain.stderr      # verify reports damage on stdout
    assert "unienv_plugin_for_cli.PluginNPZStorage" in said and "--import MODULE" in said
    ok = cli("--import", "unienv_plugin_for_cli", "verify", data)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    both = cli("--import", "json", "--import", "unienv_plugin_for_cli", "info", data)
    assert both.returncode == 0, both.stderr
    missing = cli("--import", "no_such_plugin_module_xyz", "verify", data)
    assert missing.returncode == 2
    assert "--import no_such_plugin_module_xyz" in missing.stderr and "PYTHONPATH" in missing.stderr
    assert "Traceback" not in missing.stderr


def test_info_names_an_unfinished_create_and_the_way_out(tmp_path: Path) -> None:
    """A directory a killed `ReplayBuffer.create()` left (its storage directory and writer lock, no metadata.json):
    `info` says it is an unfinished create and names `overwrite=True`, as `load_from` does."""
    out = tmp_path / "rb"
    (out / "storage").mkdir(parents=True)
    (out / ".writer.lock").write_text("")
    res = run_cli("info", out, check=False)
    assert res.returncode != 0
    assert "did not finish" in res.stderr and "overwrite=True" in res.stderr, res.stderr
