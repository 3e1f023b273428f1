"""VideoStorage's read path: H.264 files with B-frames read exactly while unwanted B-frames are skipped (also across
reads that continue an open decoder), long runs cut at keyframes for parallel decoders, the work-sharing thread
helper, and the default encoder layout and threading. Real encodes and decodes of small frames, no mocks."""
from __future__ import annotations

import io
import os
import threading
from fractions import Fraction
from typing import Any, List

import numpy as np
import pytest

av = pytest.importorskip("av")

from unienv_data.storages import _episode_files, _video_decode  # noqa: E402
from unienv_data.storages._video_codec import _StreamSetup, select_codec  # noqa: E402
from unienv_data.storages._video_decode import (DECODERS_PER_FILE, MIN_SPLIT_FRAMES,  # noqa: E402
                                                MIN_SPLIT_FRAMES_COSTLY, min_split_frames, share_work,
                                                split_for_threads)
from unienv_data.storages._video_index import EpisodeFile  # noqa: E402
from unienv_data.storages.video_storage import VideoStorage  # noqa: E402
from unienv_interface.backends import NumpyComputeBackend as NB  # noqa: E402
from unienv_interface.space import BoxSpace  # noqa: E402

H = W = 32
SPACE = BoxSpace(NB, 0, 255, np.uint8, shape=(H, W, 3))


def _frames(n: int, seed: int = 0) -> np.ndarray:
    """Smooth moving content (so P/B-frames really predict) plus a little noise."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:H, 0:W].astype(np.float32)
    out = np.empty((n, H, W, 3), np.uint8)
    for t in range(n):
        base = 128 + 90 * np.sin((xx + 1.5 * t) / 6.0)[..., None] * np.array([1.0, 0.6, -0.8])
        out[t] = np.clip(base + 10 * np.cos((yy - t) / 5.0)[..., None] + rng.normal(0, 2, (H, W, 3)), 0, 255)
    return out


def _h264_or_skip() -> None:
    try:
        select_codec("libx264", False, (H, W, 3), None, None, None, "mp4", Fraction(15), "none")
    except (ValueError, RuntimeError) as exc:
        pytest.skip(f"libx264 does not work here: {exc}")


def _storage(tmp_path: Any, episodes: int, steps: int, **kwargs: Any) -> "tuple[VideoStorage, np.ndarray]":
    _h264_or_skip()
    st = VideoStorage.create(SPACE, cache_path=os.path.join(os.fspath(tmp_path), "v"), **kwargs)
    frames = _frames(episodes * steps)
    for e in range(episodes):
        st.mark_segment_start(e * steps)
        for i in range(e * steps, (e + 1) * steps):
            st.append(frames[i])
        st.mark_segment_end()
    return st, frames


def _picture_types(path: str) -> str:
    with av.open(path) as c:
        return "".join(" IPB"[int(getattr(f.pict_type, "value", f.pict_type))] for f in c.decode(video=0))


# ---------------------------------------------------------------------------------------------------- layout
def test_default_h264_layout_has_non_reference_b_frames(tmp_path: Any) -> None:
    st, frames = _storage(tmp_path, 1, 40)
    assert st.codec == "libx264" or st.codec.endswith(("_nvenc", "_qsv", "_videotoolbox", "_amf"))
    if st.codec != "libx264":
        pytest.skip(f"codec='auto' chose the hardware encoder {st.codec}")
    assert "bframes=1" in st.encoder_options.get("x264-params", "")
    types = _picture_types(os.path.join(st._dir, st.files[0]))
    assert types[:10] == "IBPBPBPBPP" and types[10] == "I"  # GOP 10: one B-frame between anchors
    full = st.get(slice(0, 40))
    assert 10 * np.log10(255 ** 2 / np.mean((full.astype(np.float32) - frames) ** 2)) > 28
    st.close()


def test_caller_b_frame_options_keep_x264_layout(tmp_path: Any) -> None:
    _h264_or_skip()
    plan, _ = select_codec("libx264", False, (H, W, 3), None, {"bf": "3"}, 30, "mp4", Fraction(15), "none")
    assert "x264-params" not in plan.options_dict and plan.options_dict["bf"] == "3"
    plan1, _ = select_codec("libx264", False, (H, W, 3), None, None, 2, "mp4", Fraction(15), "none")
    assert plan1.options_dict.get("bf") == "0"  # GOP 2 leaves no room for a B-frame


def test_small_frames_encode_on_one_thread() -> None:
    _h264_or_skip()
    plan, _ = select_codec("libx264", False, (H, W, 3), None, None, None, "mp4", Fraction(15), "none")
    container = av.open(io.BytesIO(), "w", format="mp4")
    try:
        assert _StreamSetup(container, plan, (H, W, 3), Fraction(15)).stream.codec_context.thread_count == 1
    finally:
        container.close()
    plan_t, _ = select_codec("libx264", False, (H, W, 3), None, {"threads": "2"}, None, "mp4", Fraction(15), "none")
    container = av.open(io.BytesIO(), "w", format="mp4")
    try:
        assert _StreamSetup(container, plan_t, (H, W, 3), Fraction(15)).stream.codec_context.thread_count != 1
    finally:
        container.close()
    # FFV1 codes every frame in slices: it keeps FFmpeg's automatic threads
    plan_f, _ = select_codec("ffv1", True, (H, W, 3), None, None, None, "mkv", Fraction(15), "none")
    container = av.open(io.BytesIO(), "w", format="matroska")
    try:
        assert _StreamSetup(container, plan_f, (H, W, 3), Fraction(15)).stream.codec_context.thread_count != 1
    finally:
        container.close()


# ---------------------------------------------------------------------------------------------------- exact reads
@pytest.mark.parametrize("options", [None, {"bf": "3"}, {"x264-params": "bframes=3:b-adapt=0:b-pyramid=none"}],
                         ids=["default", "x264-pyramid", "b3-flat"])
def test_reads_with_skipped_b_frames_equal_sequential_decode(tmp_path: Any, options: Any) -> None:
    st, _frames_in = _storage(tmp_path, 2, 60, codec="libx264", gop_size=30, encoder_options=options)
    full = np.concatenate([st.get(slice(0, 60)), st.get(slice(60, 120))])
    # one frame at a time, forward: every read continues the cached decoder, whose B-frame reordering already fed
    # later packets (some with skip_frame=NONREF) during the previous read
    for step in (1, 2, 3):
        for k in range(0, 120, step):
            np.testing.assert_array_equal(st.get(k), full[k])
    rng = np.random.default_rng(1)
    for _ in range(40):
        idx = rng.integers(0, 120, int(rng.integers(1, 40)))
        np.testing.assert_array_equal(st.get(idx), full[idx])
        o = int(rng.integers(0, 100))
        np.testing.assert_array_equal(st.get(slice(o, o + 20)), full[o:o + 20])
    reopened = VideoStorage.load_from(st._dir, SPACE)
    np.testing.assert_array_equal(reopened.get(np.arange(119, -1, -7)), full[np.arange(119, -1, -7)])
    reopened.close()
    st.close()


def test_long_runs_are_split_and_read_by_several_decoders(tmp_path: Any, monkeypatch: Any) -> None:
    monkeypatch.setattr(_episode_files, "IO_WORKERS", 3)
    monkeypatch.setattr(_video_decode, "MIN_SPLIT_FRAMES", 16)  # small test files: split runs of 32 frames and up
    st, _f = _storage(tmp_path, 1, 120, codec="libx264", gop_size=10)
    full = st.get(slice(0, 120))  # one file, split into parts decoded in parallel
    single = VideoStorage.load_from(st._dir, SPACE, decoder_cache_size=0)
    monkeypatch.setattr(_episode_files, "IO_WORKERS", 1)
    np.testing.assert_array_equal(single.get(slice(0, 120)), full)  # the same frames without any split
    monkeypatch.setattr(_episode_files, "IO_WORKERS", 3)
    # idle decoders of the one file are kept for the next read; how many parts ran on their own decoder depends on
    # scheduling (the calling thread takes parts no idle worker picked up), so only the bound is exact
    assert 1 <= len(st._decoders) <= DECODERS_PER_FILE
    for o in (0, 5, 37, 56):
        np.testing.assert_array_equal(st.get(slice(o, o + 64)), full[o:o + 64])
    idx = np.r_[np.arange(100, 20, -1), [3, 3, 119]]
    np.testing.assert_array_equal(st.get(idx), full[idx])
    single.close()
    st.close()


def test_ffv1_decoders_use_slice_threads_unless_told(tmp_path: Any) -> None:
    st = VideoStorage.create(SPACE, cache_path=os.path.join(os.fspath(tmp_path), "f"), codec="ffv1", file_ext="mkv",
                             lossless=True, capacity=24)
    frames = _frames(24)
    st.set(slice(0, 24), frames)
    np.testing.assert_array_equal(st.get(np.arange(23, -1, -5)), frames[np.arange(23, -1, -5)])
    decoders = [d for idle in st._decoders._open.values() for d in idle]
    want = min(_video_decode.SLICE_DECODE_THREADS, os.cpu_count() or 1)
    assert decoders and all(d._cc.thread_count == want for d in decoders)
    one = VideoStorage.load_from(st._dir, SPACE, decoder_threads=1)
    np.testing.assert_array_equal(one.get(slice(3, 20)), frames[3:20])
    assert all(d._cc.thread_count == 1 for idle in one._decoders._open.values() for d in idle)
    one.close()
    h264, _f = _storage(tmp_path, 1, 12)              # inter-coded: one thread per decoder by default
    h264.get(np.arange(12))
    assert all(d._cc.thread_count == 1 for idle in h264._decoders._open.values() for d in idle)
    h264.close()
    st.close()


# ---------------------------------------------------------------------------------------------------- helpers
def _file(keyframes: Any, frames: int = 300) -> EpisodeFile:
    return EpisodeFile("f.mp4", frames, 1, keyframes=keyframes)


def test_split_for_threads_cuts_at_keyframes(monkeypatch: Any) -> None:
    monkeypatch.setattr(_video_decode, "MIN_SPLIT_FRAMES", 16)
    f = _file(list(range(0, 300, 10)))
    frames = np.arange(100, 164)
    parts = split_for_threads([(f, frames, np.arange(64))], 2)
    assert len(parts) == 2
    assert np.array_equal(np.concatenate([p[1] for p in parts]), frames)
    assert np.array_equal(np.concatenate([p[2] for p in parts]), np.arange(64))
    assert parts[1][1][0] % 10 == 0 and all(p[1].size >= 16 for p in parts)
    assert len(split_for_threads([(f, frames, np.arange(64))], 4)) == 2  # halves of 32 have no cut leaving 16 + 16
    long = np.arange(100, 228)
    four = split_for_threads([(f, long, np.arange(128))], 4)
    assert len(four) == 4 and np.array_equal(np.concatenate([p[1] for p in four]), long)
    # nothing to cut: unknown keyframes, too short, no keyframe inside, or enough parts already
    assert len(split_for_threads([(_file(None), frames, np.arange(64))], 2)) == 1
    assert len(split_for_threads([(f, np.arange(100, 120), np.arange(20))], 2)) == 1
    assert len(split_for_threads([(_file([0]), frames, np.arange(64))], 2)) == 1
    two = [(f, frames, np.arange(64)), (f, frames + 100, np.arange(64))]
    assert len(split_for_threads(two, 2)) == 2


def test_costly_frames_are_cut_into_shorter_parts() -> None:
    # the threshold follows the decode cost per frame: intra-only files and large frames split short slices too
    inter = _file(list(range(0, 300, 10)))
    intra = _file(list(range(300)))
    assert min_split_frames(inter, 128 * 128) == MIN_SPLIT_FRAMES
    assert min_split_frames(inter, 256 * 256) == MIN_SPLIT_FRAMES_COSTLY
    assert min_split_frames(inter, 1920 * 1080) == MIN_SPLIT_FRAMES_COSTLY
    assert min_split_frames(intra, 128 * 128) == MIN_SPLIT_FRAMES_COSTLY
    frames = np.arange(100, 164)
    assert len(split_for_threads([(inter, frames, np.arange(64))], 2, 128 * 128)) == 1
    assert len(split_for_threads([(inter, frames, np.arange(64))], 2, 256 * 256)) == 2
    parts = split_for_threads([(intra, frames, np.arange(64))], 2, 128 * 128)
    assert len(parts) == 2 and np.array_equal(np.concatenate([p[1] for p in parts]), frames)


def test_share_work_runs_every_item_once_and_raises_errors() -> None:
    seen: List[int] = []
    lock = threading.Lock()

    def fn(x: int) -> None:
        with lock:
            seen.append(x)

    share_work(fn, list(range(50)), 3)
    assert sorted(seen) == list(range(50))
    nested: List[str] = []
    share_work(lambda x: share_work(lambda y: nested.append(threading.current_thread().name), [1, 2], 3),
               list(range(4)), 3)
    assert len(nested) == 8

    def bad(x: int) -> None:
        if x == 7:
            raise KeyError("item 7")

    with pytest.raises(KeyError, match="item 7"):
        share_work(bad, list(range(20)), 3)


_FORKED_READERS = r"""
import os, sys
import numpy as np
from unienv_data.storages.video_storage import VideoStorage
from unienv_interface.backends import NumpyComputeBackend as NB
from unienv_interface.space import BoxSpace
kwargs = {"codec": "ffv1"} if sys.argv[2] == "ffv1" else {}
st = VideoStorage.create(BoxSpace(NB, 0, 255, np.uint8, shape=(64, 64, 3)), cache_path=sys.argv[1], **kwargs)
noise = np.random.default_rng(0).integers(0, 256, (600, 64, 64, 3), dtype=np.uint8)   # files far above FFmpeg's
for e in range(2):                                                                     # 32 KiB read buffer
    st.mark_segment_start(e * 300)
    for frame in noise[e * 300:(e + 1) * 300]:
        st.append(frame)
    st.mark_segment_end()
want = st.get_numpy(np.arange(600))                 # the parent's decoders are now open
pids = []
for seed in (1, 2):
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            rng = np.random.default_rng(seed)
            for _ in range(40):
                rows = np.sort(rng.choice(600, 24, replace=False))
                if not np.array_equal(st.get_numpy(rows), want[rows]):
                    code = 1
                    break
        except BaseException:  # any failure is the child's exit status
            code = 2
        os._exit(code)
    pids.append(pid)
codes = [os.WEXITSTATUS(os.waitpid(pid, 0)[1]) for pid in pids]
same = np.array_equal(st.get_numpy(np.arange(600)), want)      # the parent's decoders still read right
st.close()
print(codes, same)
"""


@pytest.mark.parametrize("codec", ["h264", "ffv1"])
def test_forked_readers_never_share_the_parents_open_decoders(tmp_path: Any, codec: str) -> None:
    """A parent that read frames (so its decoders are open) forks two readers, as a DataLoader with workers does.
    Each child reads many random frames at the same time as the other: an inherited decoder shares its file offset
    with the parent and the sibling, so it must never be used in a child (reads failed with 'the video ends before
    frame N' or gave other frames). Nor may a child free one: an FFV1 decoder decodes with slice threads, which
    exist only in the parent, and freeing its codec context in the child waited for them forever (a DataLoader
    worker hung). The parent is a fresh interpreter: forking the test runner itself (with its own threads, e.g.
    pytest-xdist's) could leave a child waiting on a lock held at fork time."""
    import subprocess
    import sys
    if codec == "h264":
        _h264_or_skip()
    src = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")
    run = subprocess.run([sys.executable, "-c", _FORKED_READERS, os.path.join(os.fspath(tmp_path), "v"), codec],
                         capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": src})
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip() == "[0, 0] True", run.stdout + run.stderr[-2000:]


_FORKED_COLLECTOR = r"""
import gc, os, sys
import numpy as np
from unienv_data.storages.video_storage import VideoStorage
from unienv_interface.backends import NumpyComputeBackend as NB
from unienv_interface.space import BoxSpace
st = VideoStorage.create(BoxSpace(NB, 0, 255, np.uint8, shape=(64, 64, 3)), cache_path=sys.argv[1], codec="ffv1")
st.mark_segment_start(0)
for frame in np.random.default_rng(0).integers(0, 256, (120, 64, 64, 3), dtype=np.uint8):
    st.append(frame)
st.mark_segment_end()
st.get_numpy(np.arange(120))        # the decoders are open, their slice threads waiting
gc.disable()
cycle = [st]
cycle.append(cycle)                 # left unclosed in a reference cycle, as a script or an earlier test may leave it
del st, cycle
pid = os.fork()
if pid == 0:
    gc.collect()                    # a DataLoader worker collecting the garbage it inherited
    os._exit(0)
_, status = os.waitpid(pid, 0)
print("child exit", os.WEXITSTATUS(status))
"""


def test_a_forked_child_collecting_an_inherited_unclosed_storage_does_not_hang(tmp_path: Any) -> None:
    """A VideoStorage left unclosed (in a reference cycle) when a DataLoader forks its workers: a worker that collects
    it must not free the inherited FFV1 decoders, whose codec contexts wait for slice threads that exist only in the
    parent (the worker hung forever; found as a hung test run)."""
    import subprocess
    import sys
    src = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")
    run = subprocess.run([sys.executable, "-c", _FORKED_COLLECTOR, os.path.join(os.fspath(tmp_path), "v")],
                         capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": src})
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip() == "child exit 0", run.stdout + run.stderr[-2000:]
