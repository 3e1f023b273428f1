"""VideoStorage: the shared SpaceStorage contract with an exact codec, plus real lossy and lossless encodes of tiny
frames, codec selection, streaming writers, crash leftovers, damaged files, exact random access and batch order."""
from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
from typing import Any, List, Optional

import numpy as np
import pytest

pytest.importorskip("av")

from unienv_data.testing.conformance import STATE_ERRORS, StorageConformance, expect_error  # noqa: E402

from unienv_data.base.errors import StorageFormatError, StorageNotFoundError, StorageStateError  # noqa: E402
from unienv_data.storages import _video_codec as codec_mod  # noqa: E402
from unienv_data.storages.video_storage import VideoStorage  # noqa: E402
from unienv_interface.backends import NumpyComputeBackend as NB  # noqa: E402
from unienv_interface.space import BinarySpace, BoxSpace, DictSpace  # noqa: E402


# ---------------------------------------------------------------------------------------------------- conformance
class _VideoConformance(StorageConformance):
    supports_growable = True
    open_segment_rows_readable = False
    create_kwargs: dict = {"codec": "ffv1", "lossless": True, "file_ext": "mkv"}

    def create(self, tmp_path: Any, capacity: Optional[int]) -> Any:
        return VideoStorage.create(self.space, capacity=capacity, cache_path=os.path.join(os.fspath(tmp_path), "video"),
                                   **self.create_kwargs)

    def load(self, path: Any, read_only: bool) -> Any:
        return VideoStorage.load_from(path, self.space, read_only=read_only)

    # Rows of an open append-built segment are encoded into a hidden file and only become visible at
    # mark_segment_end(); reading them before raises StorageStateError (the generic contract reads them at once).
    def test_append_segment(self, tmp_path: Any) -> None:
        st = self.new_storage(tmp_path)
        vals = self.values(3)
        st.mark_segment_start(1)
        assert st.has_open_segment
        for k, v in enumerate(vals):
            st.append(v)
            assert st.pending_segment_length == k + 1
            exc = expect_error(STATE_ERRORS, st.get, 1 + k)
            assert "mark_segment_end" in str(exc)
        st.get(0)  # rows outside the open segment stay readable
        st.mark_segment_end()
        assert not st.has_open_segment and st.pending_segment_length == 0
        assert st.episode_segments() == [(1, 3)]
        for k, v in enumerate(vals):
            self.assert_equal(st.get(1 + k), v)

    def test_segment_longer_than_capacity_raises(self, tmp_path: Any) -> None:
        c = self.capacity
        st = self.new_storage(tmp_path)
        vals = self.values(c + 1)
        st.mark_segment_start(2)
        for v in vals[:c]:
            st.append(v)
        expect_error((ValueError,), st.append, vals[c])
        assert st.pending_segment_length == c
        st.mark_segment_end()
        assert st.episode_segments() == [(2, 1)]
        for k in range(c):
            self.assert_equal(st.get((2 + k) % c), vals[k])


class TestVideoFFV1Conformance(_VideoConformance):
    def make_space(self) -> BoxSpace:
        return BoxSpace(NB, 0, 255, np.uint8, shape=(16, 16, 3))


torch = pytest.importorskip("torch")
from unienv_interface.backends.pytorch import PyTorchComputeBackend as TB  # noqa: E402


class TestVideoGrayTorchX264RGBConformance(_VideoConformance):
    """Grayscale frames with narrower bounds on the torch backend, kept exactly by libx264rgb at qp 0 in .mp4."""

    create_kwargs = {"codec": "libx264rgb", "lossless": True, "file_ext": "mp4"}

    def make_space(self) -> BoxSpace:
        return BoxSpace(TB, 0, 200, torch.uint8, shape=(8, 12))



# ---------------------------------------------------------------------------------------------------- helpers
H = W = 16
RGB = BoxSpace(NB, 0, 255, np.uint8, shape=(H, W, 3))
EXACT = {"codec": "ffv1", "lossless": True, "file_ext": "mkv"}


def smooth_frames(n: int, h: int = H, w: int = W, seed: int = 0, noise: float = 2.0) -> np.ndarray:
    """Camera-like frames: moving gradients and a moving square, plus a little noise."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float64)
    out = np.empty((n, h, w, 3), dtype=np.uint8)
    for t in range(n):
        r = 128 + 100 * np.sin((xx + 2 * t) / 7.0)
        g = 128 + 100 * np.cos((yy - t) / 5.0)
        b = np.full_like(xx, 60.0)
        x0 = (t * 2) % max(1, w - 6)
        b[4:10, x0:x0 + 6] = 230
        img = np.stack([r, g, b], axis=-1) + rng.normal(0, noise, (h, w, 3))
        out[t] = np.clip(np.round(img), 0, 255).astype(np.uint8)
    return out


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return float("inf") if mse == 0 else 10 * np.log10(255.0 ** 2 / mse)


def noise_frames(n: int, seed: int = 0, shape: Any = (H, W, 3)) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (n,) + tuple(shape), dtype=np.uint8)


def new(tmp_path: Any, name: str = "v", space: Any = RGB, **kwargs: Any) -> VideoStorage:
    kw = dict(EXACT)
    kw.update(kwargs)
    kw.setdefault("capacity", 40)
    return VideoStorage.create(space, cache_path=os.path.join(os.fspath(tmp_path), name), **kw)


def write_segment(st: VideoStorage, start: int, frames: np.ndarray) -> None:
    w = st.open_segment_writer()
    for f in frames:
        w.append(f)
    w.commit(start)


def listing(st: VideoStorage) -> List[str]:
    return sorted(os.listdir(st.cache_filename))


# ---------------------------------------------------------------------------------------------------- imports
def test_importing_the_package_loads_neither_pyav_nor_pillow() -> None:
    code = ("import sys, unienv_data, unienv_data.storages, unienv_data.storages.video_storage, "
            "unienv_data.storages.image_storage\n"
            "from unienv_data.base import resolve_storage_class\n"
            "resolve_storage_class('unienv_data.storages.video_storage.VideoStorage')\n"
            "bad = [m for m in ('av', 'PIL') if m in sys.modules]\n"
            "assert not bad, bad\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_missing_pyav_names_the_extra(monkeypatch: Any, tmp_path: Any) -> None:
    monkeypatch.setattr(codec_mod, "_AV", None)
    monkeypatch.setitem(sys.modules, "av", None)
    with pytest.raises(ModuleNotFoundError, match=r"unienv-storage\[video\]"):
        new(tmp_path)


# ---------------------------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("space, error, words", [
    (BoxSpace(NB, 0.0, 1.0, np.float32, shape=(H, W, 3)), ValueError, "dtype float32"),
    (BoxSpace(NB, 0, 255, np.uint8, shape=(H, W, 4)), ValueError, "shape (16, 16, 4)"),
    (BoxSpace(NB, 0, 255, np.uint8, shape=(3, H, W)), ValueError, "channels-first"),
    (BoxSpace(NB, 0, 255, np.uint8, shape=(H * W * 3,)), ValueError, "(H, W, 3)"),
    (BinarySpace(NB, (H, W)), TypeError, "BinarySpace"),
    (DictSpace(NB, {"a": RGB}), TypeError, "DictSpace"),
])
def test_non_image_spaces_are_refused(tmp_path: Any, space: Any, error: type, words: str) -> None:
    with pytest.raises(error) as info:
        VideoStorage.create(space, capacity=4, cache_path=os.path.join(os.fspath(tmp_path), "v"))
    assert "uint8" in str(info.value) and words in str(info.value)
    assert not os.path.exists(os.path.join(os.fspath(tmp_path), "v"))


@pytest.mark.parametrize("kwargs, words", [
    ({"codec": "libx264", "lossless": True}, "lossy"),
    ({"codec": "libsvtav1", "lossless": True}, "lossy"),
    ({"codec": "ffv1", "lossless": True, "file_pixel_format": "yuv420p"}, "exactly"),
    ({"codec": "libx264rgb", "lossless": True, "encoder_options": {"crf": 23}}, "lossy"),
    ({"codec": "no_such_encoder"}, "not a video encoder"),
    ({"codec": "libx264", "file_pixel_format": "rgb48le"}, "not supported"),
    ({"file_ext": "avi"}, "file_ext"),
    ({"fps": 0}, "fps"),
    ({"gop_size": 0}, "gop_size"),
    ({"seek_mode": "fast"}, "seek_mode"),
    ({"decode_backend": "torchcodec"}, "decode_backend"),
    ({"hardware_acceleration": "sometimes"}, "hardware_acceleration"),
    ({"buffer_pixel_format": "bgr24"}, "buffer_pixel_format"),
    ({"multiprocessing": True}, "one process"),
    ({"capacity": 0}, "capacity"),
])
def test_bad_create_arguments(tmp_path: Any, kwargs: dict, words: str) -> None:
    kw = {"codec": "auto", "lossless": False, "file_ext": "mp4"}
    kw.update(kwargs)
    with pytest.raises(ValueError, match=None) as info:
        new(tmp_path, **kw)
    assert words in str(info.value)


def test_cache_path_must_be_new_or_empty(tmp_path: Any) -> None:
    with pytest.raises(ValueError, match="cache_path is required"):
        VideoStorage.create(RGB, capacity=4)
    d = os.path.join(os.fspath(tmp_path), "v")
    os.makedirs(d)
    open(os.path.join(d, "old.mp4"), "wb").close()
    with pytest.raises(FileExistsError, match="already exists.*overwrite=True"):
        VideoStorage.create(RGB, capacity=4, cache_path=d)
    VideoStorage.create(RGB, capacity=4, cache_path=d, overwrite=True).close()     # the old files go
    assert "old.mp4" not in os.listdir(d)


def test_wrong_frames_are_refused_everywhere_and_nothing_is_written(tmp_path: Any) -> None:
    st = new(tmp_path)
    good = noise_frames(2)
    write_segment(st, 0, good)
    before = listing(st)
    bad = [("float frame", good[0].astype(np.float32) + 0.5), ("wrong shape", good[0][:, :8]),
           ("gray into rgb", good[0][:, :, 0]), ("int64 out of range", good[0].astype(np.int64) + 300)]
    for label, value in bad:
        with pytest.raises((ValueError, TypeError)) as info:
            st.set(5, value)
        assert "frame" in str(info.value), label
        with pytest.raises((ValueError, TypeError)):
            st.set(slice(5, 7), np.stack([good[0], value]) if value.shape == good[0].shape else value)
        w = st.open_segment_writer()
        with pytest.raises((ValueError, TypeError)):
            w.append(value)
        assert len(w) == 0
        w.abort()
    assert listing(st) == before
    np.testing.assert_array_equal(st.get(slice(0, 2)), good)


# ---------------------------------------------------------------------------------------------------- codecs
def test_auto_codec_opens_a_real_encoder_and_says_which(tmp_path: Any) -> None:
    st = new(tmp_path, codec="auto", lossless=False, file_ext="mp4")
    sel = st.codec_selection
    assert sel["requested"] == "auto" and sel["chosen"] == st.codec
    assert sel["tried"][-1] == [st.codec, "ok"]
    assert all(outcome != "ok" for _name, outcome in sel["tried"][:-1])
    meta = json.load(open(os.path.join(st.cache_filename, "video_metadata.json")))
    assert meta["codec"] == st.codec and meta["codec_selection"]["chosen"] == st.codec
    assert meta["codec_base"] == st.codec_base and meta["format_version"] == 1 and meta["lossless"] is False
    import av
    try:
        av.codec.Codec("h264_nvenc", "w")
        listed = True
    except Exception:
        listed = False
    names = [n for n, _o in sel["tried"]]
    if listed and st.codec != "h264_nvenc":
        # listed by this FFmpeg build, but it did not open here: auto fell back instead of failing later
        assert "h264_nvenc" in names and names.index("h264_nvenc") < names.index(st.codec)
    frames = smooth_frames(12)
    write_segment(st, 0, frames)
    assert psnr(st.get(slice(0, 12)), frames) > 25


def test_auto_software_only_and_lossless(tmp_path: Any) -> None:
    sw = new(tmp_path, "sw", codec="auto", lossless=False, hardware_acceleration="none")
    assert not any("nvenc" in n or "qsv" in n for n, _o in sw.codec_selection["tried"])
    assert sw.codec in ("libx264", "libsvtav1", "mpeg4") and not sw.is_exact
    try:
        hw = new(tmp_path, "hw", codec="auto", lossless=False, hardware_acceleration="required")
        assert hw.codec in codec_mod.HARDWARE_ENCODERS  # a machine whose hardware encoder really works
    except RuntimeError as exc:
        assert "no hardware encoder" in str(exc) and "tried" in str(exc)
    mkv = new(tmp_path, "mkv", codec="auto", lossless=True, file_ext="mkv")
    mp4 = new(tmp_path, "mp4", codec="auto", lossless=True, file_ext="mp4")
    assert mkv.is_exact and mp4.is_exact
    assert mkv.codec == "ffv1" and mp4.codec == "libx264rgb"
    assert mkv.gop_size == 1 and mp4.gop_size == 10 and sw.gop_size == 10  # intra codecs: every frame a keyframe
    frames = noise_frames(7)
    for st in (mkv, mp4):
        write_segment(st, 3, frames)
        np.testing.assert_array_equal(st.get(slice(3, 10)), frames)


def test_lossy_h264_round_trip_within_psnr_bound(tmp_path: Any) -> None:
    frames = smooth_frames(30, 32, 32)
    space = BoxSpace(NB, 0, 255, np.uint8, shape=(32, 32, 3))
    st = new(tmp_path, space=space, codec="h264", lossless=False, file_ext="mp4", capacity=None)
    assert st.codec == "libx264" and st.codec_base == "h264" and st.file_pixel_format == "yuv420p"
    st.mark_segment_start(0)
    for f in frames:
        st.append(f)
    st.mark_segment_end()
    got = st.get(slice(0, 30))
    assert psnr(got, frames) >= 27  # tiny 32x32 frames with 4:2:0 chroma; ~31.6 dB at 128x128 (see the report)
    assert st.nbytes_on_disk < frames.nbytes / 4


def test_lossy_av1_round_trip_if_available(tmp_path: Any) -> None:
    frames = smooth_frames(20, 32, 32)
    space = BoxSpace(NB, 0, 255, np.uint8, shape=(32, 32, 3))
    try:
        st = new(tmp_path, space=space, codec="av1", lossless=False, file_ext="mp4")
    except ValueError as exc:
        pytest.skip(f"libsvtav1 does not open here: {exc}")
    assert st.codec == "libsvtav1" and st.codec_base == "av1"
    write_segment(st, 5, frames)
    assert psnr(st.get(slice(5, 25)), frames) >= 22  # SVT-AV1 is weak on tiny frames


def test_lossy_reads_stay_inside_narrow_bounds(tmp_path: Any) -> None:
    space = BoxSpace(NB, 20, 200, np.uint8, shape=(H, W, 3))
    frames = np.clip(noise_frames(6), 20, 200).astype(np.uint8)
    st = new(tmp_path, space=space, codec="libx264", lossless=False, file_ext="mp4")
    write_segment(st, 0, frames)
    got = st.get(slice(0, 6))
    assert got.min() >= 20 and got.max() <= 200


# ---------------------------------------------------------------------------------------------------- random access
@pytest.mark.parametrize("kwargs", [
    {"codec": "ffv1", "lossless": True, "file_ext": "mkv", "gop_size": 4},
    {"codec": "libx264", "lossless": False, "file_ext": "mp4", "gop_size": 5},
    {"codec": "libsvtav1", "lossless": False, "file_ext": "mkv", "gop_size": 6},
])
def test_random_access_after_seeking_is_exact(tmp_path: Any, kwargs: dict) -> None:
    frames = smooth_frames(37, seed=3)
    try:
        st = new(tmp_path, capacity=None, **kwargs)
    except ValueError as exc:
        pytest.skip(f"{kwargs['codec']} does not open here: {exc}")
    write_segment(st, 0, frames)
    meta = json.load(open(os.path.join(st.cache_filename, "video_metadata.json")))
    keyframes = meta["files"][st.files[0]]["keyframes"]
    assert keyframes[0] == 0 and len(keyframes) >= 37 // (kwargs["gop_size"] + 1)
    sequential = st.get(slice(0, 37))
    if st.is_exact:
        np.testing.assert_array_equal(sequential, frames)
    rng = np.random.default_rng(1)
    for k in list(rng.permutation(37)) + [36, 0, 36, 35, 1, 20, 19, 21]:  # backwards, across keyframes, repeats
        np.testing.assert_array_equal(st.get(int(k)), sequential[k])
    fresh = VideoStorage.load_from(st.cache_filename, RGB)  # a cold decoder seeking straight into the middle
    np.testing.assert_array_equal(fresh.get(23), sequential[23])
    np.testing.assert_array_equal(fresh.get(22), sequential[22])


def test_batch_read_decodes_files_once_and_restores_order(tmp_path: Any) -> None:
    st = new(tmp_path, capacity=60, gop_size=3)
    model = np.zeros((60, H, W, 3), dtype=np.uint8)
    for e, start in enumerate((0, 12, 30, 44)):
        frames = noise_frames(10 + e, seed=e)
        write_segment(st, start, frames)
        model[start:start + len(frames)] = frames
    rng = np.random.default_rng(7)
    idx = rng.integers(0, 60, size=80)  # duplicates, unwritten rows, every file, random order
    np.testing.assert_array_equal(st.get(idx), model[idx])
    np.testing.assert_array_equal(st.get(idx[::-1].copy()), model[idx[::-1]])
    mask = rng.random(60) < 0.3
    np.testing.assert_array_equal(st.get(mask), model[mask])
    assert 1 <= len(st._decoders) <= 8  # decoders are kept for the next read


def test_torch_backend_returns_tensors(tmp_path: Any) -> None:
    space = BoxSpace(TB, 0, 255, torch.uint8, shape=(H, W, 3))
    st = new(tmp_path, space=space)
    frames = noise_frames(4)
    write_segment(st, 1, torch.from_numpy(frames))
    got = st.get(torch.tensor([4, 1]))
    assert isinstance(got, torch.Tensor) and got.dtype == torch.uint8
    np.testing.assert_array_equal(got.numpy(), frames[[3, 0]])
    assert isinstance(st.get(2), torch.Tensor)


# ---------------------------------------------------------------------------------------------------- writers
def test_writers_encode_while_appending_and_show_nothing_before_commit(tmp_path: Any) -> None:
    st = new(tmp_path, capacity=20)
    a, b, c = noise_frames(5, 1), noise_frames(3, 2), noise_frames(4, 3)
    w1, w2, w3 = st.open_segment_writer(), st.open_segment_writer(), st.open_segment_writer()
    for i in range(5):
        w1.append(a[i])
        if i < 3:
            w2.append(b[i])
        if i < 4:
            w3.append(c[i])
    temps = [n for n in listing(st) if n.startswith(".active-")]
    assert len(temps) == 3  # each writer streams into its own hidden file; nothing is buffered in memory
    assert st.files == [] and st.episode_segments() == []
    np.testing.assert_array_equal(st.get(slice(0, 20)), np.zeros((20, H, W, 3), np.uint8))
    w2.commit(18)  # wraps: rows 18, 19, 0
    w1.commit(2)
    w3.abort()
    assert st.episode_segments() == [(2, 6), (18, 0)]   # position order
    assert st.files == ["18_0.mkv", "2_6.mkv"]
    assert listing(st) == ["18_0.mkv", "2_6.mkv", "episode_index.json", "video_metadata.json"]  # the aborted temp file is gone
    np.testing.assert_array_equal(st.get([18, 19, 0]), b)
    np.testing.assert_array_equal(st.get(slice(2, 7)), a)
    with pytest.raises(StorageStateError):
        w1.commit(10)
    with pytest.raises(StorageStateError):
        w3.commit(10)


def test_commit_overlapping_the_open_segment_is_refused_and_can_be_retried(tmp_path: Any) -> None:
    st = new(tmp_path, capacity=20)
    w = st.open_segment_writer()
    frames = noise_frames(3)
    for f in frames:
        w.append(f)
    st.mark_segment_start(5)
    st.append(frames[0])
    with pytest.raises(StorageStateError, match="open"):
        w.commit(4)
    with pytest.raises(StorageStateError, match="mark_segment_end"):
        st.get([1, 5])
    with pytest.raises(StorageStateError):
        st.set(5, frames[1])
    w.commit(10)
    st.mark_segment_end()
    assert st.episode_segments() == [(5, 5), (10, 12)]   # position order
    np.testing.assert_array_equal(st.get(slice(10, 13)), frames)
    np.testing.assert_array_equal(st.get(5), frames[0])


def test_abort_and_close_leave_no_files_and_no_visible_rows(tmp_path: Any) -> None:
    st = new(tmp_path, capacity=10)
    write_segment(st, 0, noise_frames(2))
    st.mark_segment_start(4)
    for f in noise_frames(3, 9):
        st.append(f)
    assert any(n.startswith(".active-") for n in listing(st))
    st.abort_segment()
    assert listing(st) == ["0_1.mkv", "episode_index.json", "video_metadata.json"]
    w = st.open_segment_writer()
    w.append(noise_frames(1)[0])
    st.mark_segment_start(6)
    st.append(noise_frames(1)[0])
    st.close()
    assert listing(VideoStorage.load_from(st.cache_filename, RGB)) == ["0_1.mkv", "episode_index.json", "video_metadata.json"]
    with pytest.raises(StorageStateError, match="close"):
        w.commit(3)


# ---------------------------------------------------------------------------------------------------- set
def test_set_runs_replace_overlapping_files_without_reencoding_survivors(tmp_path: Any) -> None:
    st = new(tmp_path, capacity=20)
    a = noise_frames(10, 1)
    write_segment(st, 0, a)
    size_a = os.path.getsize(os.path.join(st.cache_filename, "0_9.mkv"))
    b = noise_frames(3, 2)
    st.set(slice(3, 6), b)
    assert st.files == ["0_9.mkv", "3_5.mkv"]
    assert os.path.getsize(os.path.join(st.cache_filename, "0_9.mkv")) == size_a  # untouched
    expect = a.copy()
    expect[3:6] = b
    np.testing.assert_array_equal(st.get(slice(0, 10)), expect)
    c = noise_frames(4, 3)
    st.set([9, 0, 8, 19], c)  # scattered: one file per contiguous run, including a lone row at the end
    expect = np.concatenate([expect, np.zeros((10, H, W, 3), np.uint8)])
    expect[[9, 0, 8, 19]] = c
    np.testing.assert_array_equal(st.get(slice(0, 20)), expect)
    d = noise_frames(20, 4)
    st.set(Ellipsis, d)  # a full rewrite leaves one file; every older file is deleted from disk
    assert st.files == ["0_19.mkv"] and listing(st) == ["0_19.mkv", "episode_index.json", "video_metadata.json"]
    np.testing.assert_array_equal(st.get(Ellipsis), d)
    st.set(slice(0, 20), d[::-1].copy())  # same range again: placed as 0_19~1, renamed 0_19 once the old one is gone
    assert st.files == ["0_19.mkv"] and listing(st) == ["0_19.mkv", "episode_index.json", "video_metadata.json"]
    np.testing.assert_array_equal(st.get(Ellipsis), d[::-1])


def test_growable_storage_grows_and_shrinks_files(tmp_path: Any) -> None:
    st = new(tmp_path, capacity=None)
    a = noise_frames(6)
    st.mark_segment_start(0)
    for f in a:
        st.append(f)
    st.mark_segment_end()
    write_segment(st, 6, a[:2])
    assert len(st) == 8
    st.shrink_length(3)
    assert len(st) == 5 and st.files == ["0_5.mkv"] and st.episode_segments() == []
    st.shrink_length(5)
    assert st.files == [] and listing(st) == ["episode_index.json", "video_metadata.json"]


# ---------------------------------------------------------------------------------------------------- persistence
def test_dumps_to_another_directory_and_again(tmp_path: Any) -> None:
    st = new(tmp_path, capacity=12)
    a = noise_frames(12)
    write_segment(st, 0, a[:6])
    write_segment(st, 6, a[6:])
    target = os.path.join(os.fspath(tmp_path), "copy")
    st.dumps(target)
    back = VideoStorage.load_from(target, RGB)
    np.testing.assert_array_equal(back.get(Ellipsis), a)
    assert back.episode_segments() == st.episode_segments() and back.codec == st.codec
    b = noise_frames(6, 5)
    st.set(slice(0, 6), b)
    st.dumps(target)  # the unchanged file is kept, the replaced one swapped, the stale one removed
    back2 = VideoStorage.load_from(target, RGB)
    np.testing.assert_array_equal(back2.get(slice(0, 6)), b)
    np.testing.assert_array_equal(back2.get(slice(6, 12)), a[6:])
    assert sorted(os.listdir(target)) == sorted(back2.files + ["episode_index.json", "video_metadata.json"])
    np.testing.assert_array_equal(back.get(slice(6, 12)), a[6:])  # an older reader of the target still works


def test_load_validates_metadata_and_files(tmp_path: Any) -> None:
    st = new(tmp_path, capacity=8)
    write_segment(st, 0, noise_frames(4))
    write_segment(st, 4, noise_frames(4, 1))
    st.close()
    d = st.cache_filename
    with pytest.raises(ValueError, match="capacity 8"):
        VideoStorage.load_from(d, RGB, capacity=5)
    with pytest.raises(ValueError, match="shape"):
        VideoStorage.load_from(d, BoxSpace(NB, 0, 255, np.uint8, shape=(H, W)))
    bad = os.path.join(os.fspath(tmp_path), "bad")
    shutil.copytree(d, bad)
    path = os.path.join(bad, "4_7.mkv")
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)
    with pytest.raises(StorageFormatError, match=r"4_7\.mkv is truncated"):
        VideoStorage.load_from(bad, RGB)
    os.unlink(path)
    with pytest.raises(StorageNotFoundError, match=r"4_7\.mkv .*missing"):
        VideoStorage.load_from(bad, RGB)
    meta_path = os.path.join(bad, "video_metadata.json")
    meta = json.load(open(meta_path))
    meta["runs"][0][2] = "../../etc/passwd"
    json.dump(meta, open(meta_path, "w"))
    with pytest.raises(StorageFormatError):
        VideoStorage.load_from(bad, RGB)
    open(meta_path, "w").write('{"storage_type": ')
    with pytest.raises(StorageFormatError, match="damaged"):
        VideoStorage.load_from(bad, RGB)


@pytest.mark.parametrize("damage, words", [
    (lambda m: m.update(file_ext=[1]), "file_ext"),
    (lambda m: (m["files"]["0_3.mkv"].update(frames=2 ** 33), m["runs"][0].__setitem__(3, 2 ** 32)), "file entry"),
    (lambda m: m.update(capacity=2 ** 40, length=2 ** 40), "rows"),
    (lambda m: m.update(segments=[[0, 4], [2, 4]]), "share rows"),
    (lambda m: m.update(shape={}), "shape"),
], ids=["file-ext-list", "frames-beyond-int32", "absurd-length", "overlapping-segments", "shape-object"])
def test_damaged_metadata_values_are_format_errors(tmp_path: Any, damage: Any, words: str) -> None:
    st = new(tmp_path, capacity=8)
    write_segment(st, 0, noise_frames(4))
    write_segment(st, 4, noise_frames(4, 1))
    st.close()
    meta_path = os.path.join(st.cache_filename, "video_metadata.json")
    meta = json.load(open(meta_path))
    damage(meta)
    json.dump(meta, open(meta_path, "w"))
    exc = expect_error((StorageFormatError,), VideoStorage.load_from, st.cache_filename, RGB)
    assert words in str(exc) and st.cache_filename in str(exc), str(exc)


def test_damaged_file_of_the_same_size_fails_on_read_naming_it(tmp_path: Any) -> None:
    st = new(tmp_path, capacity=8)
    write_segment(st, 0, noise_frames(8))
    st.close()
    path = os.path.join(st.cache_filename, "0_7.mkv")
    size = os.path.getsize(path)
    with open(path, "wb") as f:
        f.write(b"\0" * size)
    back = VideoStorage.load_from(st.cache_filename, RGB)
    with pytest.raises(StorageFormatError, match=r"0_7\.mkv"):
        back.get(3)


def test_crash_leftovers_are_ignored_on_load(tmp_path: Any) -> None:
    st = new(tmp_path, capacity=10)
    a = noise_frames(5)
    write_segment(st, 0, a)
    w = st.open_segment_writer()  # a writer in the middle of an episode when the process "dies"
    for f in noise_frames(3, 1):
        w.append(f)
    open(os.path.join(st.cache_filename, "5_9.mkv"), "wb").write(b"renamed but never recorded")
    back = VideoStorage.load_from(st.cache_filename, RGB, read_only=False)
    assert back.episode_segments() == [(0, 4)] and back.files == ["0_4.mkv"]
    np.testing.assert_array_equal(back.get(slice(0, 5)), a)
    np.testing.assert_array_equal(back.get(slice(5, 10)), np.zeros((5, H, W, 3), np.uint8))
    orphans = back.orphan_files()
    assert "5_9.mkv" in orphans and any(n.startswith(".active-") for n in orphans)
    write_segment(back, 5, a)  # placed as 5_9~1 (the orphan holds 5_9), then renamed over the orphan
    assert back.files == ["0_4.mkv", "5_9.mkv"] and "5_9.mkv" not in back.orphan_files()
    np.testing.assert_array_equal(back.get(slice(5, 10)), a)
    w.abort()


def test_pickled_copy_is_a_read_only_reader(tmp_path: Any) -> None:
    st = new(tmp_path, capacity=10)
    a = noise_frames(10)
    write_segment(st, 0, a)
    assert not st.is_multiprocessing_safe
    clone = pickle.loads(pickle.dumps(st))
    assert clone.is_multiprocessing_safe and not clone.is_mutable
    np.testing.assert_array_equal(clone.get([9, 0, 4]), a[[9, 0, 4]])
    with pytest.raises(StorageStateError, match="read-only"):
        clone.set(0, a[1])
    ro = VideoStorage.load_from(st.cache_filename, RGB, read_only=True, multiprocessing=True)
    assert ro.is_multiprocessing_safe
    with pytest.raises(ValueError, match="read_only"):
        VideoStorage.load_from(st.cache_filename, RGB, read_only=False, multiprocessing=True)


def _read_in_child(storage: VideoStorage, index: List[int]) -> Any:
    """Runs in a spawned process: reads frames from an unpickled (read-only) storage."""
    return storage.get(np.array(index)), storage.is_mutable


def test_spawned_reader_process_reads_the_same_frames(tmp_path: Any) -> None:
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    st = new(tmp_path, capacity=10)
    a = noise_frames(10)
    write_segment(st, 0, a)
    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        frames, mutable = pool.submit(_read_in_child, st, [7, 2, 7]).result(timeout=120)
    assert not mutable
    np.testing.assert_array_equal(frames, a[[7, 2, 7]])


def test_reference_written_directory_opens_read_only(tmp_path: Any) -> None:
    st = new(tmp_path, capacity=10, codec="libx264rgb", file_ext="mp4")
    a = noise_frames(7)
    write_segment(st, 8, a[:4])  # wraps: 8_1
    write_segment(st, 3, a[4:])
    st.close()
    d = st.cache_filename
    for name in os.listdir(d):
        if "~" in name:
            os.rename(os.path.join(d, name), os.path.join(d, name.split("~")[0] + ".mp4"))
    json.dump({"storage_type": "VideoStorage", "codec_base": "h264", "file_ext": ".mp4", "fps": 15,
               "file_pixel_format": None, "buffer_pixel_format": "rgb24", "encoder_options": None,
               "capacity": 10, "length": 10}, open(os.path.join(d, "video_metadata.json"), "w"))
    json.dump({"file_ranges": [[8, 1], [3, 5]]}, open(os.path.join(d, "episode_index.json"), "w"))
    ref = VideoStorage.load_from(d, RGB)
    assert ref.get_segments() == ref.episode_segments() == [(3, 5), (8, 1)]   # position order, as listed
    np.testing.assert_array_equal(ref.get([8, 9, 0, 1, 3, 4, 5]), a)
    with pytest.raises(ValueError, match="read-only"):
        VideoStorage.load_from(d, RGB, read_only=False)
    out = os.path.join(os.fspath(tmp_path), "converted")
    ref.dumps(out)
    conv = VideoStorage.load_from(out, RGB, read_only=False)
    np.testing.assert_array_equal(conv.get([8, 9, 0, 1, 3, 4, 5]), a)
    write_segment(conv, 6, a[:2])  # a converted copy is writable (with the reference's codec family: lossy)
    assert conv.codec_base == "h264" and not conv.is_exact
    assert conv.get([6, 7]).shape == (2, H, W, 3)
    np.testing.assert_array_equal(conv.get([8, 9, 0]), a[:3])


@pytest.mark.parametrize("kwargs", [EXACT, {"codec": "libx264rgb", "lossless": True, "file_ext": "mp4"},
                                    {"codec": "libx264", "lossless": False, "file_ext": "mp4"}])
def test_gray_frames_with_a_channel_axis(tmp_path: Any, kwargs: dict) -> None:
    space = BoxSpace(NB, 0, 255, np.uint8, shape=(H, W, 1))
    frames = smooth_frames(8)[..., 1:2].copy()
    st = new(tmp_path, space=space, **kwargs)
    write_segment(st, 2, frames)
    got = st.get(slice(2, 10))
    assert got.shape == (8, H, W, 1) and st.get(3).shape == (H, W, 1)
    if st.is_exact:
        np.testing.assert_array_equal(got, frames)
    else:
        assert psnr(got, frames) > 25
    back = VideoStorage.load_from(st.cache_filename, space)
    np.testing.assert_array_equal(back.get(slice(2, 10)), got)
    with pytest.raises(ValueError, match="shape"):
        VideoStorage.load_from(st.cache_filename, BoxSpace(NB, 0, 255, np.uint8, shape=(H, W)))
