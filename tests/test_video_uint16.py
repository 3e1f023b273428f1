"""16-bit grayscale VideoStorage (uint16 frames, e.g. depth in millimetres): real FFV1 / PNG encodes read back
bit-exactly (random access, batches cut across threads, ring wrap-around, reopen, pickled readers), the refusal of
every setting that would narrow 16-bit values, and datasets that open in the reference (unienv 0.0.1b16) with
identical values both ways."""
from __future__ import annotations

import json
import os
import pickle
import subprocess
from pathlib import Path
from typing import Any, Dict, List, Optional

import numpy as np
import pytest

pytest.importorskip("av")

from unienv_data.testing.conformance import StorageConformance  # noqa: E402

from _third_party import has_venv, venv_python  # noqa: E402

from unienv_data.base.errors import StorageFormatError  # noqa: E402
from unienv_data.replay_buffer import ReplayBuffer  # noqa: E402
from unienv_data.storages._video_decode import MIN_SPLIT_FRAMES_COSTLY  # noqa: E402
from unienv_data.storages.video_storage import VideoStorage  # noqa: E402
from unienv_interface.backends import NumpyComputeBackend as NB  # noqa: E402
from unienv_interface.space import BoxSpace  # noqa: E402

FIXTURES = Path(__file__).parent / "fixtures"
FFV1 = {"codec": "ffv1", "file_ext": "mkv", "file_pixel_format": "gray16le"}


def depth_frames(n: int, shape: Any, seed: int = 0) -> np.ndarray:
    """Random 16-bit frames with the values 8-bit storage would lose (0, 255, 256, 65535, odd low bytes)."""
    frames = np.random.default_rng(seed).integers(0, 65536, size=(n,) + tuple(shape), dtype=np.uint16)
    flat = frames.reshape(n, -1)
    flat[:, :5] = [0, 255, 256, 65535, 0x1234]
    return frames


def space16(shape: Any = (6, 10), low: int = 0, high: int = 65535) -> BoxSpace:
    return BoxSpace(NB, low, high, np.uint16, shape=shape)


# ---------------------------------------------------------------------------------------------------- contract
class TestVideoUint16Conformance(StorageConformance):
    """The whole storage contract on 16-bit gray frames with narrower bounds (values outside them stay exact)."""

    supports_growable = True
    open_segment_rows_readable = False      # VideoStorage stages an append-built segment until mark_segment_end

    def make_space(self) -> BoxSpace:
        return space16((8, 12, 1), 0, 60000)

    def create(self, tmp_path: Any, capacity: Optional[int]) -> Any:
        return VideoStorage.create(self.space, capacity=capacity, cache_path=os.path.join(os.fspath(tmp_path), "v"),
                                   **FFV1)

    def load(self, path: Any, read_only: bool) -> Any:
        return VideoStorage.load_from(path, self.space, read_only=read_only)

    # rows of an open append-built segment become readable at mark_segment_end() (see test_video_storage.py)
    def test_append_segment(self, tmp_path: Any) -> None:
        st = self.new_storage(tmp_path)
        vals = self.values(3)
        st.mark_segment_start(1)
        for v in vals:
            st.append(v)
        st.mark_segment_end()
        assert st.get_segments() == [(1, 3)]
        for k, v in enumerate(vals):
            self.assert_equal(st.get(1 + k), v)

    def test_segment_longer_than_capacity_raises(self, tmp_path: Any) -> None:
        c = self.capacity
        st = self.new_storage(tmp_path)
        vals = self.values(c + 1)
        st.mark_segment_start(2)
        for v in vals[:c]:
            st.append(v)
        with pytest.raises(ValueError):
            st.append(vals[c])
        st.mark_segment_end()
        for k in range(c):
            self.assert_equal(st.get((2 + k) % c), vals[k])


# ---------------------------------------------------------------------------------------------------- round trips
@pytest.mark.parametrize("shape", [(6, 10), (5, 33, 1)])  # width 33: decoded rows are padded in memory
@pytest.mark.parametrize("codec,ext,pix", [("ffv1", "mkv", "gray16le"), ("png", "mp4", "gray16be")])
def test_uint16_ring_roundtrip_is_bit_exact(tmp_path: Path, shape: Any, codec: str, ext: str, pix: str) -> None:
    sp = space16(shape)
    st = VideoStorage.create(sp, cache_path=tmp_path / "v", capacity=5, codec=codec, file_ext=ext)
    assert (st.codec, st.file_pixel_format, st.is_exact) == (codec, pix, True)
    frames = depth_frames(12, shape, seed=1)
    truth = np.zeros((5,) + tuple(shape), np.uint16)
    k = 0
    for n in (3, 4, 2, 3):               # episodes of 3, 4, 2, 3 frames wrap the ring of 5 twice
        st.mark_segment_start(k % 5)
        for _ in range(n):
            st.append(frames[k])
            truth[k % 5] = frames[k]
            k += 1
        st.mark_segment_end()
    st.set([4, 1], frames[:2])           # scattered set: one new file per row
    truth[[4, 1]] = frames[:2]
    order = np.array([3, 0, 4, 4, 1, 2, 0])
    for reader in (st, VideoStorage.load_from(tmp_path / "v", sp), pickle.loads(pickle.dumps(st))):
        got = reader.get_numpy(order)
        assert got.dtype == np.uint16 and got.shape == (7,) + tuple(shape)
        np.testing.assert_array_equal(got, truth[order])
        np.testing.assert_array_equal(reader.get_numpy(slice(None)), truth)
        for i in (4, 0, 2):
            np.testing.assert_array_equal(reader.get_numpy(i), truth[i])


def test_uint16_replay_buffer_wrap_keeps_newest_frames(tmp_path: Path) -> None:
    """A buffer of capacity 4 given episodes of 4 and 3 frames keeps the last frame of the first one."""
    rb = ReplayBuffer.create(VideoStorage, space16((4, 4)), cache_path=tmp_path / "rb", capacity=4,
                             buffer_pixel_format="gray16le", decode_backend="pyav", hardware_acceleration=None, **FFV1)
    first = [np.full((4, 4), v, np.uint16) for v in (100, 200, 300, 65535)]
    second = [np.full((4, 4), v, np.uint16) for v in (256, 511, 4097)]
    for episode in (first, second):
        for f in episode:
            rb.append(f)
        rb.mark_segment_end()
    assert rb.get_segments() == [(0, 1), (1, 4)]
    for i, want in enumerate([first[-1]] + second):
        np.testing.assert_array_equal(rb.get_at(i), want)
    rb.close()


def test_uint16_long_run_read_in_parallel_parts(tmp_path: Path) -> None:
    """A slice long enough to be cut into parts decoded by separate decoders reads the same frames."""
    st = VideoStorage.create(space16((16, 16)), cache_path=tmp_path / "v", **FFV1)
    n = 4 * MIN_SPLIT_FRAMES_COSTLY + 3   # FFV1 files are intra-coded: runs of this many frames are cut
    frames = depth_frames(n, (16, 16), seed=2)
    st.extend_length(n)
    st.set(slice(0, n), frames)
    np.testing.assert_array_equal(st.get_numpy(slice(None)), frames)
    idx = np.random.default_rng(3).permutation(n)
    np.testing.assert_array_equal(st.get_numpy(idx), frames[idx])


# ---------------------------------------------------------------------------------------------------- refusals
@pytest.mark.parametrize("kwargs,expected", [
    ({"codec": "libx264"}, "codec must be one of"),
    ({"codec": "mpeg4"}, "codec must be one of"),
    ({"codec": "libx264rgb", "lossless": True}, "codec must be one of"),
    ({"codec": "ffv1", "file_pixel_format": "gray"}, "16-bit gray file_pixel_format"),
    ({"codec": "ffv1", "file_pixel_format": "gray12le"}, "16-bit gray file_pixel_format"),
    ({"codec": "ffv1", "file_pixel_format": "yuv420p16le"}, "16-bit gray file_pixel_format"),
    ({"codec": "ffv1", "buffer_pixel_format": "gray"}, "buffer_pixel_format must be 'gray16le'"),
    ({"codec": "ffv1", "buffer_pixel_format": "rgb24"}, "buffer_pixel_format must be 'gray16le'"),
])
def test_uint16_refuses_settings_that_narrow_values(tmp_path: Path, kwargs: Dict[str, Any], expected: str) -> None:
    with pytest.raises(ValueError, match=expected) as info:
        VideoStorage.create(space16(), cache_path=tmp_path / "v", file_ext="mkv", **kwargs)
    given = kwargs.get("buffer_pixel_format") or kwargs.get("file_pixel_format") or kwargs["codec"]
    assert repr(given) in str(info.value)          # names what was given
    assert not (tmp_path / "v").exists()


def test_uint16_color_and_other_dtypes_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"16-bit grayscale only.*\(6, 10, 3\)"):
        VideoStorage.create(space16((6, 10, 3)), cache_path=tmp_path / "a")
    with pytest.raises(ValueError, match="got dtype int16"):
        VideoStorage.create(BoxSpace(NB, 0, 100, np.int16, shape=(6, 10)), cache_path=tmp_path / "b")


def test_uint16_frames_are_not_narrowed_by_a_uint8_space_or_file(tmp_path: Path) -> None:
    st = VideoStorage.create(space16(), cache_path=tmp_path / "v", capacity=2, **FFV1)
    st.set(0, depth_frames(1, (6, 10))[0])
    st.close()
    with pytest.raises(ValueError, match="uint16 frames of shape.*uint8"):
        VideoStorage.load_from(tmp_path / "v", BoxSpace(NB, 0, 255, np.uint8, shape=(6, 10)))
    # an 8-bit file listed for uint16 frames (damaged metadata) is refused on read rather than scaled up
    g = VideoStorage.create(BoxSpace(NB, 0, 255, np.uint8, shape=(6, 10)), cache_path=tmp_path / "g", capacity=2,
                            codec="ffv1", lossless=True, file_ext="mkv")
    g.set(0, np.full((6, 10), 7, np.uint8))
    g.close()
    meta_path = tmp_path / "g" / "video_metadata.json"
    meta = json.loads(meta_path.read_text())
    meta["dtype"] = "uint16"
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(StorageFormatError, match="holds gray frames"):
        VideoStorage.load_from(tmp_path / "g", space16()).get_numpy(0)


def test_uint16_metadata_names_depth_formats(tmp_path: Path) -> None:
    st = VideoStorage.create(space16(), cache_path=tmp_path / "v", **FFV1)
    st.close()
    meta = json.loads((tmp_path / "v" / "video_metadata.json").read_text())
    assert (meta["dtype"], meta["file_pixel_format"], meta["buffer_pixel_format"], meta["codec_base"]) == \
        ("uint16", "gray16le", "gray16le", "ffv1")


# ---------------------------------------------------------------------------------------------------- reference
needs_reference = pytest.mark.skipif(not has_venv("unienv", "UNIENV_REFERENCE_PYTHON"),
                                     reason="reference venv (unienv==0.0.1b16) not found")


def _run_reference(args: List[str], cwd: Path) -> Any:
    # without PYTHONPATH: one pointing at this project's src/ would make the "reference" import our package
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([str(venv_python("unienv", "UNIENV_REFERENCE_PYTHON"))] + args, capture_output=True,
                          text=True, timeout=300, cwd=str(cwd), env=env)
    assert proc.returncode == 0, f"the reference failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


@needs_reference
def test_reference_opens_uint16_video_written_here(tmp_path: Path) -> None:
    """Episodes of 1, 2 and 2 frames in a ring of 4: the last one wraps (rows 3 and 0)."""
    d = tmp_path / "depth"
    rb = ReplayBuffer.create(VideoStorage, space16((6, 8)), cache_path=d, capacity=4, **FFV1)
    frames = depth_frames(5, (6, 8), seed=4)
    k = 0
    for n in (1, 2, 2):
        for _ in range(n):
            rb.append(frames[k])
            k += 1
        rb.mark_segment_end()
    rb.dumps(d)
    want = [rb.get_at(i).tolist() for i in range(len(rb))]
    segments = [list(s) for s in rb.get_segments()]
    rb.close()
    got = _run_reference([str(FIXTURES / "reference_open_buffers.py"),
                          json.dumps([{"path": str(d), "backend": "numpy"}])], tmp_path)[0]
    assert "error" not in got, got.get("trace")
    assert (got["len"], got["capacity"], got["offset"]) == (4, 4, 1)
    assert got["rows"] == want and got["segments"] == segments


@needs_reference
def test_uint16_video_written_by_reference_opens_here(tmp_path: Path) -> None:
    d = tmp_path / "depth"
    ref = _run_reference([str(FIXTURES / "reference_write_depth_video.py"), str(d)], tmp_path)
    rb = ReplayBuffer.load_from(d, backend=NB, compressed=False)     # the reference's tests pass compressed=False
    assert (len(rb), rb.offset) == (ref["len"], ref["offset"])
    assert [list(s) for s in rb.get_segments()] == ref["segments"]
    for i, row in enumerate(ref["rows"]):
        got = rb.get_at(i)
        assert got.dtype == np.uint16
        np.testing.assert_array_equal(got, np.array(row, np.uint16))
    order = np.array([3, 0, 2, 3, 1])
    np.testing.assert_array_equal(rb.storage.get_numpy(order), rb.storage.get_numpy(slice(None))[order])
    assert rb.storage.is_exact
    rb.close()
