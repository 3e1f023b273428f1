"""`VideoStorage`: image frames kept as video files on PyAV (FFmpeg), one file per written run of rows.

Layout of the storage directory::

    video_metadata.json     configuration, length, segments, and the episode index: every file (frames, bytes,
                            keyframes, content id) and which rows read which frames ("runs")
    <start>_<end>.<ext>     one video per committed segment / written run, rows start..end inclusive (end < start
                            when the run wraps the ring); "<start>_<end>~<k>.<ext>" when that name is still in use
    .active-*.tmp.<ext>     files being encoded; never listed in the metadata, ignored by loads

Writing. A segment writer (`open_segment_writer`) and an append-built segment (`mark_segment_start` / `append` /
`mark_segment_end`) encode each frame as it arrives into a hidden temporary file; on commit the file is renamed into
place and the metadata (one JSON file, replaced atomically) starts listing it. Before that nothing of it is
visible, and a crash leaves only an ignored temporary file. `set` encodes every contiguous run of the written rows
into one new file the same way. Rows of older files that a new file covers are re-pointed to the new file; an older
file keeps serving its other rows unchanged (no re-encoding, so no generation loss) and is deleted once no row
reads from it.

Reading. Every file records its keyframes while it is written. Reading frame k seeks to the last keyframe at or
before k and decodes forward (or keeps decoding forward when the open decoder is already in that stretch), so random
access is exact. A small cache keeps recently used decoders open. A batch read decodes each file once, frames in
increasing order, files in parallel threads, and puts the rows back in the caller's order.

Codecs. Lossy: H.264 (libx264), AV1 (libsvtav1), MPEG-4, hardware H.264/HEVC/AV1 encoders where they open.
Exact (``lossless=True``): FFV1, libx264rgb at qp 0, PNG-in-video, FFV-Huffyuv, with an RGB (or gray) file pixel
format. ``codec="auto"`` opens a tiny encoder of each candidate in turn (hardware first unless
``hardware_acceleration="none"``) and keeps the first one that really works here; ``storage.codec`` and the metadata
say which one was chosen and why the others were skipped.

Limits (documented rather than silently worked around): rows of the open append-built segment cannot be read or
`set` until `mark_segment_end` (StorageStateError); a `set` with scattered indices makes one small file per
contiguous run; partly overwritten files keep their bytes on disk until fully replaced; the storage is written by one
process (`multiprocessing=True` only for read-only opens); decoding runs on the CPU.
"""
from __future__ import annotations

import io
import math
import os
import threading
import uuid
import weakref
from bisect import bisect_right
from collections import OrderedDict
from dataclasses import dataclass
from fractions import Fraction
from types import ModuleType
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from unienv_data.base.errors import StorageFormatError, StorageNotFoundError, StorageStateError
from unienv_data.base.files import (FORMAT_VERSION, PathLike, atomic_write_json, check_format_version, confined_path,
                                    read_json, require_fields)
from unienv_data.base.indexing import normalize_index
from unienv_data.base.registry import register_storage, storage_type_name
from unienv_data.base.segment_writer import SegmentWriter
from unienv_data.base.segments import SegmentLog
from unienv_data.base.storage import SpaceStorage
from unienv_data.base.values import LeafConverter
from unienv_interface.space import BoxSpace, Space

from ._episode_files import (EpisodeFile, RunFileIndex, check_capacity, consecutive_runs, describe_rows, full_range,
                             image_shape, import_optional, io_map, is_temp_name, last_occurrences, place_copy,
                             prepare_new_directory, remove_quietly, ring_positions, same_file, temp_file_path)

METADATA_FILE = "video_metadata.json"
REFERENCE_INDEX_FILE = "episode_index.json"

_CONTAINERS = {"mp4": "mp4", "mkv": "matroska", "mov": "mov"}
_ALIASES = {"h264": "libx264", "avc": "libx264", "x264": "libx264", "av1": "libsvtav1", "svtav1": "libsvtav1",
            "huffyuv": "ffvhuff", "mpeg-4": "mpeg4"}
#: codecs that are exact with an exact pixel format (libx264rgb only at qp 0, set by lossless=True)
_EXACT_CODECS = ("ffv1", "png", "ffvhuff")
_LOSSLESS_CAPABLE = _EXACT_CODECS + ("libx264rgb",)
_HARDWARE = ("h264_nvenc", "hevc_nvenc", "av1_nvenc", "h264_qsv", "hevc_qsv", "h264_videotoolbox",
             "hevc_videotoolbox", "h264_amf")
_SOFTWARE_LOSSY = ("libx264", "libsvtav1", "mpeg4")
#: 8-bit packed / planar RGB formats: converting rgb24 to and from them is a pure reordering (exact)
_RGB_FORMATS = ("rgb24", "bgr24", "bgr0", "rgb0", "0rgb", "0bgr", "rgba", "bgra", "argb", "abgr", "gbrp")
_DEFAULT_OPTIONS: Dict[str, Dict[str, str]] = {
    # no B-frames: a frame then depends only on the frames before it back to its keyframe, so random access
    # decodes ~15% less for ~8% more bytes (measured on 128x128 camera-like frames, GOP 10)
    "libx264": {"preset": "veryfast", "crf": "23", "bf": "0"},
    "libx264rgb": {"preset": "veryfast", "crf": "23"},
    "libsvtav1": {"preset": "10", "crf": "35"},
}
#: keyframe interval of inter-coded codecs: random access decodes on average about half of it per frame read
DEFAULT_GOP = 10
_SEEK_MODES = ("exact", "approximate")
_DECODE_BACKENDS = ("auto", "pyav")
_HW_VALUES = ("auto", "none", "cpu", "required")


# ---------------------------------------------------------------------------------------------------- PyAV
_AV: Optional[ModuleType] = None


def _av() -> Any:
    global _AV
    if _AV is None:
        _AV = import_optional("av", "video", "VideoStorage")
    return _AV


def _reformatter() -> Any:
    return import_optional("av.video.reformatter", "video", "VideoStorage").VideoReformatter()


def _encoder_exists(name: str) -> bool:
    av = _av()
    try:
        codec = av.codec.Codec(name, "w")
    except Exception:  # noqa: BLE001 - UnknownCodecError and friends
        return False
    return codec.type == "video"


def _encoder_formats(name: str) -> List[str]:
    codec = _av().codec.Codec(name, "w")
    return [f.name for f in (codec.video_formats or [])]


def _codec_family(name: str) -> str:
    """The codec an encoder produces (its decoder's name), e.g. libx264 -> h264."""
    try:
        return str(_av().codec.Codec(name, "w").canonical_name)
    except Exception:  # noqa: BLE001
        return name


# ---------------------------------------------------------------------------------------------------- codec plans
@dataclass(frozen=True)
class CodecPlan:
    """How frames are encoded: encoder, file pixel format, encoder options, and whether it is exact."""

    codec: str
    pix_fmt: str
    options: Tuple[Tuple[str, str], ...]
    exact: bool
    gop_size: int
    file_ext: str

    @property
    def options_dict(self) -> Dict[str, str]:
        return dict(self.options)


def _format_is_exact(pix_fmt: str, channels: int) -> bool:
    if pix_fmt in _RGB_FORMATS:
        return True
    return channels == 1 and pix_fmt == "gray"


def _default_pix_fmt(codec: str, formats: List[str], shape: Tuple[int, int, int], exact: bool) -> str:
    h, w, c = shape
    if exact:
        prefs = (["gray"] if c == 1 else []) + ["rgb24", "bgr0", "gbrp", "bgr24", "rgba", "bgra"]
    else:
        even = h % 2 == 0 and w % 2 == 0
        prefs = (["gray"] if c == 1 and codec.startswith("libx264") else [])
        prefs += (["yuv420p"] if even else []) + ["yuv444p", "rgb24", "bgr0", "nv12", "yuv420p"]
    for p in prefs:
        if p in formats:
            return p
    if not formats:
        raise ValueError(f"encoder {codec!r} lists no pixel formats")
    return formats[0]


def _make_plan(codec: str, lossless: bool, shape: Tuple[int, int, int], file_pixel_format: Optional[str],
               encoder_options: Optional[Dict[str, Any]], gop_size: Optional[int], file_ext: str) -> CodecPlan:
    """A plan for one encoder; ValueError when the request cannot be met with it. Without a `gop_size`, intra-coded
    codecs (FFV1, PNG, FFV-Huffyuv) make every frame a keyframe (random access decodes one frame, ~5% more bytes) and
    inter-coded ones use `DEFAULT_GOP`."""
    if lossless and codec not in _LOSSLESS_CAPABLE:
        raise ValueError(f"codec {codec!r} is lossy and cannot store frames exactly; for lossless=True use one of "
                         f"{list(_LOSSLESS_CAPABLE)} (e.g. codec='ffv1' with file_ext='mkv', or codec='libx264rgb'), "
                         "or codec='auto'")
    formats = _encoder_formats(codec)
    capable = codec in _EXACT_CODECS or (codec == "libx264rgb" and lossless)
    if file_pixel_format is None:
        pix = _default_pix_fmt(codec, formats, shape, capable)
    else:
        pix = str(file_pixel_format)
        if pix not in formats:
            raise ValueError(f"file_pixel_format {pix!r} is not supported by encoder {codec!r}; it supports {formats}")
    channels = shape[2]
    if lossless and not _format_is_exact(pix, channels):
        exact_ok = [f for f in formats if _format_is_exact(f, channels)]
        raise ValueError(f"file_pixel_format {pix!r} cannot hold {'gray' if channels == 1 else 'rgb24'} frames "
                         f"exactly (YUV conversion / chroma subsampling); with lossless=True use one of {exact_ok}")
    opts = dict(_DEFAULT_OPTIONS.get(codec, {})) if not (lossless and codec == "libx264rgb") else {"preset": "veryfast"}
    user = {str(k): str(v) for k, v in (encoder_options or {}).items()}
    if lossless and codec == "libx264rgb":
        for key in ("crf", "qp"):
            if key in user and float(user[key]) != 0:
                raise ValueError(f"encoder_options {key}={user[key]} makes libx264rgb lossy, but lossless=True; drop it")
        user.pop("crf", None)
        opts["qp"] = "0"
    opts.update(user)
    exact = capable and _format_is_exact(pix, channels)
    gop = gop_size if gop_size is not None else (1 if codec in _EXACT_CODECS else DEFAULT_GOP)
    return CodecPlan(codec, pix, tuple(sorted(opts.items())), exact, gop, file_ext)


_PROBES: Dict[Tuple[Any, ...], Optional[str]] = {}
_PROBE_LOCK = threading.Lock()


def _probe(plan: CodecPlan, shape: Tuple[int, int, int], fps: Fraction) -> Optional[str]:
    """Encodes two frames with `plan` into an in-memory container: None when that works, else the error."""
    key = (plan, shape, fps)
    with _PROBE_LOCK:
        if key in _PROBES:
            return _PROBES[key]
    av = _av()
    h, w, c = shape
    err: Optional[str] = None
    try:
        buf = io.BytesIO()
        container = av.open(buf, "w", format=_CONTAINERS[plan.file_ext])
        try:
            enc = _StreamSetup(container, plan, shape, fps)
            for i in range(2):
                frame = enc.frame_from(np.full((h, w, 3) if c == 3 else (h, w), 40 * i, dtype=np.uint8))
                frame.pts = i
                for pkt in enc.stream.encode(frame):
                    container.mux(pkt)
            for pkt in enc.stream.encode(None):
                container.mux(pkt)
        finally:
            container.close()
        if not buf.getvalue():
            err = "wrote no bytes"
    except Exception as exc:  # noqa: BLE001 - any failure means "does not work here"
        err = f"{type(exc).__name__}: {exc}"
    with _PROBE_LOCK:
        _PROBES[key] = err
    return err


def select_codec(codec: str, lossless: bool, shape: Tuple[int, int, int], file_pixel_format: Optional[str],
                 encoder_options: Optional[Dict[str, Any]], gop_size: Optional[int], file_ext: str, fps: Fraction,
                 hardware: str) -> Tuple[CodecPlan, List[List[str]]]:
    """`(plan, tried)`: the encoder plan to use and `[candidate, outcome]` for every candidate looked at."""
    requested = str(codec).lower()
    tried: List[List[str]] = []
    if requested != "auto":
        name = _ALIASES.get(requested, requested)
        if not _encoder_exists(name):
            raise ValueError(f"codec {codec!r} is not a video encoder of this PyAV/FFmpeg build; use codec='auto' or "
                             f"one of {[c for c in _LOSSLESS_CAPABLE + _SOFTWARE_LOSSY if _encoder_exists(c)]}")
        plan = _make_plan(name, lossless, shape, file_pixel_format, encoder_options, gop_size, file_ext)
        err = _probe(plan, shape, _fps_fraction(fps))
        if err is not None:
            raise ValueError(f"encoder {name!r} does not work on this machine for {shape[1]}x{shape[0]} frames in "
                             f".{file_ext} ({err}); codec='auto' picks one that does")
        return plan, [[name, "ok"]]
    if lossless:
        candidates: Sequence[str] = (("ffv1", "libx264rgb", "ffvhuff", "png") if file_ext == "mkv"
                                     else ("libx264rgb", "ffv1", "png", "ffvhuff"))
    else:
        hw: Sequence[str] = () if hardware in ("none", "cpu") else _HARDWARE
        candidates = tuple(hw) + (() if hardware == "required" else _SOFTWARE_LOSSY)
    for name in candidates:
        if not _encoder_exists(name):
            tried.append([name, "not in this build"])
            continue
        try:
            plan = _make_plan(name, lossless, shape, file_pixel_format, encoder_options, gop_size, file_ext)
        except ValueError as exc:
            tried.append([name, f"unsuitable: {exc}"])
            continue
        err = _probe(plan, shape, fps)
        if err is None:
            tried.append([name, "ok"])
            return plan, tried
        tried.append([name, f"does not open: {err}"])
    what = "lossless" if lossless else ("hardware" if hardware == "required" else "lossy")
    raise RuntimeError(f"codec='auto' found no {what} encoder that works on this machine for "
                       f"{shape[1]}x{shape[0]} frames in .{file_ext}; tried: " + "; ".join(f"{n} ({o})" for n, o in tried))


def _fps_fraction(fps: Any) -> Fraction:
    if isinstance(fps, Fraction):
        return fps
    if isinstance(fps, (bool, np.bool_)) or not isinstance(fps, (int, float, np.integer, np.floating)):
        raise TypeError(f"fps must be a positive number, got {fps!r}")
    if not math.isfinite(float(fps)) or not 0 < float(fps) <= 1000:
        raise ValueError(f"fps must be in (0, 1000], got {fps!r}")
    return Fraction(float(fps)).limit_denominator(100000) if isinstance(fps, (float, np.floating)) else Fraction(int(fps))


# ---------------------------------------------------------------------------------------------------- encoding
class _StreamSetup:
    """A configured video stream in an output container, and the frame conversion into its pixel format."""

    def __init__(self, container: Any, plan: CodecPlan, shape: Tuple[int, int, int], fps: Fraction) -> None:
        h, w, c = shape
        stream = container.add_stream(plan.codec, rate=fps)
        stream.width, stream.height = w, h
        stream.pix_fmt = plan.pix_fmt
        cc = stream.codec_context
        cc.time_base = 1 / fps
        cc.gop_size = plan.gop_size
        if plan.options:
            stream.options = plan.options_dict
        self.stream = stream
        self._replicate = c == 1 and plan.pix_fmt in _RGB_FORMATS
        self._in_fmt = "rgb24" if (c == 3 or self._replicate) else "gray"
        self._pix = plan.pix_fmt
        self._rf = _reformatter()
        self._frame_cls = _av().VideoFrame

    def frame_from(self, arr: np.ndarray) -> Any:
        if arr.ndim == 3 and arr.shape[2] == 1:
            arr = arr[:, :, 0]
        if self._replicate:
            arr = np.repeat(arr[:, :, None], 3, axis=2)
        frame = self._frame_cls.from_ndarray(np.ascontiguousarray(arr), format=self._in_fmt)
        if self._in_fmt != self._pix:
            frame = self._rf.reformat(frame, format=self._pix, threads=1)
        return frame


@dataclass
class _Encoded:
    path: str
    frames: int
    nbytes: int
    keyframes: List[int]


class _FrameEncoder:
    """Encodes frames one at a time into a hidden temporary file of the storage directory."""

    def __init__(self, directory: str, plan: CodecPlan, shape: Tuple[int, int, int], fps: Fraction) -> None:
        av = _av()
        self.path = temp_file_path(directory, plan.file_ext)
        self.frames = 0
        self.keyframes: List[int] = []
        self._fps = fps
        self._container: Any = av.open(self.path, "w", format=_CONTAINERS[plan.file_ext])
        try:
            self._setup = _StreamSetup(self._container, plan, shape, fps)
        except BaseException:
            self.discard()
            raise

    def _mux(self, packets: Any) -> None:
        for pkt in packets:
            if pkt.is_keyframe and pkt.pts is not None:
                tb = pkt.time_base or self._setup.stream.time_base
                self.keyframes.append(int(round(pkt.pts * tb * self._fps)))
            self._container.mux(pkt)

    def add(self, arr: np.ndarray) -> None:
        frame = self._setup.frame_from(arr)
        frame.pts = self.frames
        self._mux(self._setup.stream.encode(frame))
        self.frames += 1

    def finish(self) -> _Encoded:
        """Flushes and closes the file; the caller renames it into place (or discards it)."""
        self._mux(self._setup.stream.encode(None))
        self._container.close()
        self._container = None
        kf = sorted(set(k for k in self.keyframes if 0 <= k < self.frames))
        if not kf or kf[0] != 0:
            kf = [0] + kf
        return _Encoded(self.path, self.frames, os.path.getsize(self.path), kf)

    def discard(self) -> None:
        if self._container is not None:
            try:
                self._container.close()
            except Exception:  # noqa: BLE001 - the file is removed anyway
                pass
            self._container = None
        remove_quietly(self.path)


# ---------------------------------------------------------------------------------------------------- decoding
class _FrameDecoder:
    """An open video file positioned somewhere in its stream; reads frames by number, exactly."""

    def __init__(self, path: str, file: EpisodeFile, shape: Tuple[int, int, int], fps: Fraction, threads: int,
                 container_format: Optional[str] = None) -> None:
        av = _av()
        self.path = path
        self.file = file
        try:
            self._container = av.open(path, "r", format=container_format)
        except FileNotFoundError:
            raise StorageNotFoundError(f"video file {path} listed in the metadata is missing") from None
        except av.error.FFmpegError as exc:
            raise StorageFormatError(f"video file {path} cannot be opened ({exc}): it is damaged") from None
        try:
            streams = self._container.streams.video
            if not streams:
                raise StorageFormatError(f"video file {path} holds no video stream")
            self._stream = streams[0]
            cc = self._stream.codec_context
            cc.thread_count = threads
            h, w, c = shape
            if (cc.width, cc.height) != (w, h):
                raise StorageFormatError(f"video file {path} holds {cc.width}x{cc.height} frames, expected {w}x{h}")
            tb = self._stream.time_base
            self._pts_to_index = float(tb * fps)
            self._index_to_pts = float(1 / (tb * fps))
        except BaseException:
            self.close()
            raise
        self._rf = _reformatter()
        self._gray = shape[2] == 1
        self._iter: Any = None
        self.next_index = 0
        self._gop_guess = 32

    def close(self) -> None:
        c = getattr(self, "_container", None)
        if c is not None:
            try:
                c.close()
            except Exception:  # noqa: BLE001
                pass
            self._container = None

    def _keyframe_before(self, k: int) -> Optional[int]:
        kf = self.file.keyframes
        if kf is None:
            return None
        i = bisect_right(kf, k)
        return kf[i - 1] if i else 0

    def _seek(self, k: int) -> None:
        kf = self._keyframe_before(k)
        target = kf if kf is not None else k
        ts = int(round(target * self._index_to_pts))
        self._container.seek(ts, backward=True, any_frame=False, stream=self._stream)
        self._iter = self._container.decode(self._stream)
        self.next_index = -1

    def _convert(self, frame: Any) -> np.ndarray:
        name = frame.format.name
        # gray frames kept in an RGB file: every channel holds the value (exact codecs); G is the best kept one
        green = self._gray and name in _RGB_FORMATS
        target = "gray" if self._gray and not green else "rgb24"
        if name != target:
            frame = self._rf.reformat(frame, format=target, threads=1)
        arr = frame.to_ndarray()
        return arr[:, :, 1] if green else arr

    def read(self, frames: Sequence[int], out: np.ndarray, rows: Sequence[int]) -> None:
        """Writes frame `frames[j]` into `out[rows[j]]`; `frames` must be increasing."""
        for j, k in enumerate(frames):
            if not 0 <= k < self.file.frames:
                raise StorageFormatError(f"{self.path}: frame {k} requested but the file holds {self.file.frames}")
            kf = self._keyframe_before(k)
            reachable = self._iter is not None or self.next_index == 0
            if kf is None:
                forward = reachable and 0 <= self.next_index <= k <= self.next_index + self._gop_guess
            else:
                forward = reachable and kf <= self.next_index <= k
            if not forward:
                self._seek(k)
            elif self._iter is None:
                self._iter = self._container.decode(self._stream)
            dst = out[rows[j]]
            dst[...] = self._decode_until(k, can_restart=not forward).reshape(dst.shape)

    def _decode_until(self, k: int, can_restart: bool) -> np.ndarray:
        while True:
            try:
                frame = next(self._iter)
            except StopIteration:
                raise StorageFormatError(f"{self.path}: the video ends before frame {k} (the metadata promises "
                                         f"{self.file.frames} frames): the file is truncated or damaged") from None
            except _av().error.FFmpegError as exc:
                raise StorageFormatError(f"{self.path}: decoding failed before frame {k} ({exc}): the file is "
                                         "damaged") from None
            if frame.pts is None:
                raise StorageFormatError(f"{self.path}: a decoded frame has no timestamp")
            idx = int(round(frame.pts * self._pts_to_index))
            self.next_index = idx + 1
            if idx == k:
                return self._convert(frame)
            if idx > k:
                if can_restart:
                    # the container's seek index landed past the keyframe: decode from the very start instead
                    self._container.seek(0, backward=True, any_frame=False, stream=self._stream)
                    self._iter = self._container.decode(self._stream)
                    self.next_index = -1
                    can_restart = False
                    continue
                raise StorageFormatError(f"{self.path}: frame {k} is missing (decoding went from frame "
                                         f"{idx - 1 if idx else 0} to {idx})")


# ---------------------------------------------------------------------------------------------------- writer
class VideoSegmentWriter(SegmentWriter):
    """Encodes appended frames straight into a hidden temporary file; `commit(start)` renames it into place and
    records it, `abort()` deletes it. Many writers may be open at once (each has its own file)."""

    def __init__(self, storage: "VideoStorage") -> None:
        super().__init__(storage)
        self._vs = storage
        self._encoder: Optional[_FrameEncoder] = None
        self._lost = False

    def _append(self, value: Any) -> None:
        vs = self._vs
        vs._check_writable()
        arr = vs._conv.convert_single(value)
        if self._encoder is None:
            if self._lost:
                raise StorageStateError("this writer's frames were lost in a failed commit; abort it")
            self._encoder = vs._new_encoder()
        self._encoder.add(arr)

    def _commit(self, start: int) -> None:
        if self._length and self._encoder is None:
            raise StorageStateError("this writer's frames were lost in a failed commit or when its storage was "
                                    "closed; abort it")
        self._vs._commit_encoder(self._encoder, start, self._length, self._forget_encoder)

    def _forget_encoder(self) -> None:
        """Called once the encoder's file is finished (committed or failed): it no longer belongs to the writer."""
        self._encoder = None
        self._lost = True

    def _release_rows(self) -> None:
        self._drop()

    def _drop(self) -> None:
        if self._encoder is not None:
            self._encoder.discard()
            self._encoder = None
            self._lost = True

    def __del__(self) -> None:
        try:
            self._drop()
        except Exception:  # noqa: BLE001
            pass


# ---------------------------------------------------------------------------------------------------- storage
def _pick(value: Any, allowed: Sequence[Any], name: str) -> Any:
    v = value.lower() if isinstance(value, str) else value
    if v not in allowed:
        raise ValueError(f"{name} must be one of {list(allowed)}, got {value!r}")
    return v


def _normalize_hw(value: Any) -> str:
    if value is None or value is False:
        return "none"
    if value is True:
        return "required"
    v = str(value).lower()
    if v in ("cuda", "nvenc", "gpu", "hardware"):
        return "required"
    return str(_pick(v, _HW_VALUES, "hardware_acceleration"))


def _check_count(value: Any, name: str, minimum: int) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or int(value) < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return int(value)


@register_storage
class VideoStorage(SpaceStorage[Any, Any, Any, Any, Any]):
    """Frames of a (H, W, 3) or (H, W) uint8 BoxSpace stored as video files (see the module docstring).

    `create(space, *, codec="auto", lossless=False, fps=15, gop_size=None, file_ext="mp4", file_pixel_format=None,
    encoder_options=None, capacity=None, cache_path (required, new or empty directory), multiprocessing=False,
    hardware_acceleration="auto", seek_mode="exact", decode_backend="auto", buffer_pixel_format=None,
    cache_decoders=True, decoder_cache_size=None, decoder_threads=1)`.

    * ``gop_size`` (keyframe interval): default 10 for inter-coded codecs (H.264, AV1, ...), 1 for intra-coded
      ones (FFV1, PNG); keyframe positions are recorded while writing and random reads seek to them.
    * ``lossless=True`` stores frames bit-exactly (FFV1 / libx264rgb qp 0 / PNG / FFV-Huffyuv); asking a lossy codec
      for it raises ValueError. Lossy reads of a box with narrower bounds than 0..255 are clipped into the bounds.
    * ``capacity=None`` grows; a fixed capacity is a ring.
    * ``codec`` / ``codec_base`` / ``file_pixel_format`` / ``is_exact`` / ``codec_selection`` tell what was chosen.
    * Recently used decoders stay open (``decoder_cache_size``: default 64 for small frames, down to 8 for large
      ones; ``cache_decoders=False`` closes each after use); ``decoder_threads`` (default 1) threads per decoder -
      batch reads decode different files in parallel threads instead.
    * ``seek_mode`` ("exact"; "approximate" is accepted and still exact), ``decode_backend`` ("auto"/"pyav") and
      ``hardware_acceleration`` ("auto": hardware encoders first when they open; "none"/"cpu"; "required") are
      validated. Decoding always runs on the CPU.
    * ``dumps(path)`` to another directory copies (hard-links where possible) the files and writes the metadata
      there; ``load_from`` checks the metadata and that every listed file exists with its recorded size.
    * Pickling gives a read-only copy of the committed state (for reader processes).
    """

    single_file_ext: Optional[str] = None

    def __init__(self, single_instance_space: Space, directory: str, plan: CodecPlan, fps: Any,
                 capacity: Optional[int], length: int, index: RunFileIndex, segments: SegmentLog, *,
                 read_only: bool = False, selection: Optional[Dict[str, Any]] = None, format_version: int = FORMAT_VERSION,
                 decoder_cache_size: int = 8, decoder_threads: int = 1, seek_mode: str = "exact",
                 hardware_acceleration: str = "auto", decode_backend: str = "auto") -> None:
        super().__init__(single_instance_space)
        self._shape = image_shape(single_instance_space, type(self).__name__)
        self._frame_shape = tuple(int(d) for d in (single_instance_space.shape or ()))
        self._dir = directory
        self._plan = plan
        self._fps = _fps_fraction(fps)
        self._fps_value: Any = int(self._fps) if self._fps.denominator == 1 else float(self._fps)
        self._codec_base: Optional[str] = None
        self._capacity = capacity
        self._length = capacity if capacity is not None else length
        self._index = index
        self._segments = segments
        self._read_only = read_only
        self._selection = selection or {"requested": plan.codec, "chosen": plan.codec, "tried": [[plan.codec, "ok"]]}
        self._format_version = format_version
        self._conv = LeafConverter(single_instance_space, "frame")
        box: BoxSpace = single_instance_space  # type: ignore[assignment]
        self._clip = None if (plan.exact or full_range(box)) else (box.low_numpy, box.high_numpy)
        self._decoders: "OrderedDict[str, _FrameDecoder]" = OrderedDict()
        self._dec_lock = threading.Lock()
        self._decoder_cache_size = decoder_cache_size
        self._decoder_threads = decoder_threads
        self.seek_mode = seek_mode
        self.hardware_acceleration = hardware_acceleration
        self.decode_backend = decode_backend
        self._seg_encoder: Optional[_FrameEncoder] = None
        self._writers: "weakref.WeakSet[VideoSegmentWriter]" = weakref.WeakSet()
        self._meta_dirty = False
        self._plan_checked = False

    # ------------------------------------------------------------------ construction
    @classmethod
    def create(cls, single_instance_space: Space, *args: Any, capacity: Optional[int] = None,
               cache_path: Optional[PathLike] = None, multiprocessing: bool = False, codec: str = "auto",
               lossless: bool = False, fps: Any = 15, gop_size: Optional[int] = None, file_ext: str = "mp4",
               file_pixel_format: Optional[str] = None, encoder_options: Optional[Dict[str, Any]] = None,
               buffer_pixel_format: Optional[str] = None, seek_mode: str = "exact", hardware_acceleration: Any = "auto",
               decode_backend: str = "auto", cache_decoders: bool = True, decoder_cache_size: Optional[int] = None,
               decoder_threads: int = 1, **kwargs: Any) -> "VideoStorage":
        """A new, empty storage in the directory `cache_path` (created; it must not hold files already)."""
        name = f"{cls.__name__}.create()"
        if args:
            raise TypeError(f"{name} takes no extra positional arguments, got {args!r}")
        if kwargs:
            raise TypeError(f"{name} got unexpected keyword argument(s) {sorted(kwargs)}")
        shape = image_shape(single_instance_space, cls.__name__)
        cap = check_capacity(capacity)
        if multiprocessing:
            raise ValueError("VideoStorage is written by one process: create it with multiprocessing=False and hand "
                             "read-only copies (load_from(read_only=True) or pickling) to reader processes")
        if not isinstance(lossless, (bool, np.bool_)):
            raise TypeError(f"lossless must be a bool, got {lossless!r}")
        ext = str(file_ext).lower().lstrip(".")
        if ext not in _CONTAINERS:
            raise ValueError(f"file_ext must be one of {sorted(_CONTAINERS)}, got {file_ext!r}")
        fps_frac = _fps_fraction(fps)
        gop = None if gop_size is None else _check_count(gop_size, "gop_size", 1)
        opts = cls._runtime_options(seek_mode, hardware_acceleration, decode_backend, buffer_pixel_format, shape,
                                    cache_decoders, decoder_cache_size, decoder_threads)
        if encoder_options is not None and not isinstance(encoder_options, dict):
            raise TypeError(f"encoder_options must be a dict of encoder option names to values, got {encoder_options!r}")
        if not isinstance(codec, str):
            raise TypeError(f"codec must be a string (an encoder name or 'auto'), got {codec!r}")
        plan, tried = select_codec(codec, bool(lossless), shape, file_pixel_format, encoder_options, gop, ext, fps_frac,
                                   opts["hardware_acceleration"])
        directory = prepare_new_directory(cache_path, cls.__name__)
        selection = {"requested": codec, "chosen": plan.codec, "tried": tried}
        st = cls(single_instance_space, directory, plan, fps, cap, 0, RunFileIndex(cap or 0), SegmentLog(cap),
                 selection=selection, **opts)
        st._plan_checked = True
        st._write_metadata()
        return st

    @staticmethod
    def _runtime_options(seek_mode: Any, hardware_acceleration: Any, decode_backend: Any, buffer_pixel_format: Any,
                         shape: Tuple[int, int, int], cache_decoders: Any, decoder_cache_size: Any,
                         decoder_threads: Any) -> Dict[str, Any]:
        expected_buf = "rgb24" if shape[2] == 3 else "gray"
        if buffer_pixel_format is not None and buffer_pixel_format != expected_buf:
            raise ValueError(f"buffer_pixel_format must be {expected_buf!r} for frames of shape "
                             f"{shape[:2] if shape[2] == 1 else shape}, got {buffer_pixel_format!r}")
        if decoder_cache_size is None:
            # reopening a decoder costs ~1-2 ms (container + codec open), about as much as decoding a GOP of small
            # frames: keep many open for small frames, fewer for large ones (~8 decoded frames held per decoder)
            frame_bytes = shape[0] * shape[1] * 3
            size = int(min(64, max(8, (256 << 20) // (8 * frame_bytes))))
        else:
            size = _check_count(decoder_cache_size, "decoder_cache_size", 0)
        return {"seek_mode": _pick(seek_mode, _SEEK_MODES, "seek_mode"),
                "hardware_acceleration": _normalize_hw(hardware_acceleration),
                "decode_backend": _pick(decode_backend, _DECODE_BACKENDS, "decode_backend"),
                "decoder_cache_size": size if cache_decoders else 0,
                "decoder_threads": _check_count(decoder_threads, "decoder_threads", 0)}

    @classmethod
    def load_from(cls, path: PathLike, single_instance_space: Space, *, capacity: Optional[int] = None,
                  read_only: bool = True, multiprocessing: bool = False, seek_mode: str = "exact",
                  hardware_acceleration: Any = "auto", decode_backend: str = "auto",
                  buffer_pixel_format: Optional[str] = None, cache_decoders: bool = True,
                  decoder_cache_size: Optional[int] = None,
                  decoder_threads: int = 1, **kwargs: Any) -> "VideoStorage":
        """Opens a storage directory, checking its metadata against the space and `capacity` (when given) and that
        every listed video file exists with the size recorded when it was written."""
        if kwargs:
            raise TypeError(f"{cls.__name__}.load_from() got unexpected keyword argument(s) {sorted(kwargs)}")
        shape = image_shape(single_instance_space, cls.__name__)
        if multiprocessing and not read_only:
            raise ValueError("VideoStorage is written by one process: multiprocessing=True needs read_only=True")
        opts = cls._runtime_options(seek_mode, hardware_acceleration, decode_backend, buffer_pixel_format, shape,
                                    cache_decoders, decoder_cache_size, decoder_threads)
        directory = os.fspath(path)
        if not os.path.isdir(directory):
            raise StorageNotFoundError(f"VideoStorage directory not found: {directory}")
        meta_path = os.path.join(directory, METADATA_FILE)
        meta = read_json(meta_path, "VideoStorage metadata")
        version = check_format_version(meta, meta_path)
        if version == 0:
            return cls._load_reference(directory, meta, meta_path, single_instance_space, shape, capacity, read_only,
                                       opts)
        st = cls._from_metadata(directory, meta, meta_path, single_instance_space, shape, read_only, opts)
        cap_arg = check_capacity(capacity)
        if cap_arg is not None and cap_arg != st._capacity:
            hint = "omit capacity (the storage is growable)" if st._capacity is None else f"pass capacity={st._capacity} or omit it"
            raise ValueError(f"{directory} was written with capacity {st._capacity}, not {cap_arg}: {hint}")
        st._verify_files()
        return st

    @classmethod
    def _from_metadata(cls, directory: str, meta: Dict[str, Any], where: str, space: Space,
                       shape: Tuple[int, int, int], read_only: bool, opts: Dict[str, Any]) -> "VideoStorage":
        require_fields(meta, ("storage_type", "codec", "file_ext", "fps", "file_pixel_format", "shape", "dtype",
                              "capacity", "length", "files", "runs", "segments", "gop_size", "encoder_options",
                              "lossless"), where)
        if meta["storage_type"] not in (storage_type_name(cls), cls.__name__):
            raise StorageFormatError(f"{where} describes a {meta['storage_type']!r}, not a VideoStorage")
        want = list(space.shape or ())
        if meta["shape"] != want or meta["dtype"] != "uint8":
            raise ValueError(f"{directory} holds {meta['dtype']} frames of shape {meta['shape']}, but the space asks for "
                             f"uint8 {want}")
        cap, length = meta["capacity"], meta["length"]
        if cap is not None and (not isinstance(cap, int) or isinstance(cap, bool) or cap <= 0):
            raise StorageFormatError(f"{where}: invalid capacity {cap!r}")
        if not isinstance(length, int) or isinstance(length, bool) or length < 0 or (cap is not None and length != cap):
            raise StorageFormatError(f"{where}: invalid length {length!r} for capacity {cap!r}")
        ext = meta["file_ext"]
        if ext not in _CONTAINERS:
            raise StorageFormatError(f"{where}: unknown file_ext {ext!r}")
        opt = meta["encoder_options"]
        if not isinstance(opt, dict) or not isinstance(meta["codec"], str) or not isinstance(meta["file_pixel_format"], str):
            raise StorageFormatError(f"{where}: invalid codec description")
        try:
            fps_frac = _fps_fraction(meta["fps"])
            gop = _check_count(meta["gop_size"], "gop_size", 1)
        except (TypeError, ValueError) as exc:
            raise StorageFormatError(f"{where}: {exc}") from None
        plan = CodecPlan(meta["codec"], meta["file_pixel_format"], tuple(sorted((str(k), str(v)) for k, v in opt.items())),
                         bool(meta["lossless"]), gop, ext)
        n_rows = cap if cap is not None else length
        index = RunFileIndex.from_json(meta["files"], meta["runs"], n_rows, where)
        for f in index.files.values():
            confined_path(directory, f.name, where)
        segments = SegmentLog.from_json(meta["segments"], cap, length, where)
        sel = meta.get("codec_selection")
        if not (isinstance(sel, dict) and isinstance(sel.get("tried", []), list)
                and all(isinstance(t, list) for t in sel.get("tried", []))):
            sel = None
        st = cls(space, directory, plan, meta["fps"], cap, length, index, segments,
                 read_only=read_only, selection=sel if isinstance(sel, dict) else None, **opts)
        return st

    @classmethod
    def _load_reference(cls, directory: str, meta: Dict[str, Any], where: str, space: Space,
                        shape: Tuple[int, int, int], capacity: Optional[int], read_only: bool,
                        opts: Dict[str, Any]) -> "VideoStorage":
        """A directory written by the reference `unienv` (no format_version): opened read-only."""
        if not read_only:
            raise ValueError(f"{directory} was written by the reference unienv VideoStorage; it opens read-only here "
                             "(dumps() it to a new directory to get a writable copy)")
        require_fields(meta, ("file_ext", "fps", "capacity", "length"), where)
        cap = meta["capacity"]
        length = meta["length"]
        if cap is not None and (not isinstance(cap, int) or isinstance(cap, bool) or cap <= 0):
            raise StorageFormatError(f"{where}: invalid capacity {cap!r}")
        if not isinstance(length, int) or isinstance(length, bool) or length < 0:
            raise StorageFormatError(f"{where}: invalid length {length!r}")
        cap_arg = check_capacity(capacity)
        if cap_arg is not None and cap is not None and cap_arg != cap:
            raise ValueError(f"{directory} was written with capacity {cap}, not {cap_arg}")
        ext = str(meta["file_ext"]).lstrip(".")
        index_path = os.path.join(directory, REFERENCE_INDEX_FILE)
        ranges = read_json(index_path, "VideoStorage episode index").get("file_ranges")
        if not isinstance(ranges, list):
            raise StorageFormatError(f"{index_path}: 'file_ranges' must be a list of [start, end] pairs")
        n_rows = cap if cap is not None else length
        index = RunFileIndex(n_rows)
        segments = SegmentLog(cap)
        for i, item in enumerate(ranges):
            if not (isinstance(item, list) and len(item) == 2 and all(isinstance(v, int) and not isinstance(v, bool)
                                                                      and 0 <= v < max(n_rows, 1) for v in item)):
                raise StorageFormatError(f"{index_path}: entry {i} = {item!r} is not a [start, end] pair within {n_rows} rows")
            s, e = item
            n = (e - s) % cap + 1 if cap is not None else e - s + 1
            if n <= 0:
                raise StorageFormatError(f"{index_path}: entry {i} = {item!r} has end before start")
            name = f"{s}_{e}.{ext}"
            full = confined_path(directory, name, index_path)
            if not os.path.isfile(full):
                raise StorageNotFoundError(f"video file {full} listed in {index_path} is missing")
            index.place(EpisodeFile(name, n, os.path.getsize(full), keyframes=None), ring_positions(s, n, cap))
            segments.add(s, n)
        codec = str(meta.get("codec_base") or "h264")
        plan = CodecPlan(codec, str(meta.get("file_pixel_format") or "yuv420p"), (), False, 1, ext if ext in _CONTAINERS else "mp4")
        return cls(space, directory, plan, meta["fps"], cap, length, index, segments, read_only=True,
                   selection={"requested": "reference", "chosen": codec, "tried": []}, format_version=0, **opts)

    def _verify_files(self) -> None:
        for f in self._index.files.values():
            full = os.path.join(self._dir, f.name)
            try:
                size = os.path.getsize(full)
            except OSError:
                raise StorageNotFoundError(f"video file {full} listed in {self._meta_path} is missing") from None
            if size != f.nbytes:
                state = "truncated" if size < f.nbytes else "changed"
                raise StorageFormatError(f"video file {full} is {state}: it holds {size} bytes, the metadata recorded "
                                         f"{f.nbytes} when it was written")

    # ------------------------------------------------------------------ properties
    @property
    def capacity(self) -> Optional[int]:
        return self._capacity

    def __len__(self) -> int:
        return self._length

    @property
    def cache_filename(self) -> Optional[str]:
        return self._dir

    @property
    def is_mutable(self) -> bool:
        return not self._read_only

    @property
    def is_multiprocessing_safe(self) -> bool:
        """True when opened read-only: readers in other processes then see the same immutable files."""
        return self._read_only

    @property
    def codec(self) -> str:
        """The encoder new files are written with (e.g. 'libx264', 'ffv1')."""
        return self._plan.codec

    @property
    def codec_base(self) -> str:
        """The codec family of the files (e.g. 'h264', 'ffv1', 'av1')."""
        if self._codec_base is None:
            self._codec_base = _codec_family(self._plan.codec) if self._format_version else self._plan.codec
        return self._codec_base

    @property
    def codec_selection(self) -> Dict[str, Any]:
        """`{"requested", "chosen", "tried": [[candidate, outcome], ...]}` from the codec choice at create()."""
        return {"requested": self._selection.get("requested"), "chosen": self._selection.get("chosen"),
                "tried": [list(t) for t in self._selection.get("tried", [])]}

    @property
    def file_pixel_format(self) -> str:
        return self._plan.pix_fmt

    @property
    def encoder_options(self) -> Dict[str, str]:
        return self._plan.options_dict

    @property
    def is_exact(self) -> bool:
        """Whether frames read back bit-exactly (a lossless codec with an exact pixel format)."""
        return self._plan.exact

    lossless = is_exact

    @property
    def fps(self) -> Any:
        return self._fps_value

    @property
    def gop_size(self) -> int:
        return self._plan.gop_size

    @property
    def file_ext(self) -> str:
        return self._plan.file_ext

    @property
    def files(self) -> List[str]:
        """Names of the video files rows currently read from."""
        return sorted(f.name for f in self._index.files.values())

    @property
    def nbytes_on_disk(self) -> int:
        """Bytes of the video files rows read from (partly overwritten files count whole)."""
        return sum(f.nbytes for f in self._index.files.values())

    @property
    def _meta_path(self) -> str:
        return os.path.join(self._dir, METADATA_FILE)

    def _segment_log(self) -> Optional[SegmentLog]:
        return self._segments

    # ------------------------------------------------------------------ metadata
    def _metadata(self, rename: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
        idx = self._index.to_json()
        if rename:
            idx["files"] = {rename.get(k, k): v for k, v in idx["files"].items()}
            idx["runs"] = [[r, n, rename.get(name, name), f0] for r, n, name, f0 in idx["runs"]]
        plan = self._plan
        c = self._shape[2]
        return {"storage_type": storage_type_name(type(self)), "format_version": FORMAT_VERSION,
                "codec": plan.codec, "codec_base": self.codec_base, "codec_selection": self.codec_selection,
                "lossless": plan.exact, "file_ext": plan.file_ext, "fps": self._fps_value, "gop_size": plan.gop_size,
                "file_pixel_format": plan.pix_fmt, "buffer_pixel_format": "rgb24" if c == 3 else "gray",
                "encoder_options": plan.options_dict, "shape": list(self._frame_shape), "dtype": "uint8",
                "capacity": self._capacity, "length": self._length, "segments": self._segments.to_json(),
                "files": idx["files"], "runs": idx["runs"]}

    def _write_metadata(self) -> None:
        atomic_write_json(self._meta_path, self._metadata())
        self._meta_dirty = False

    def flush(self) -> None:
        """Writes the metadata if only the length changed since the last commit (commits write it themselves)."""
        self._check_open()
        if not self._read_only and self._meta_dirty:
            self._write_metadata()

    # ------------------------------------------------------------------ encoders
    def _new_encoder(self) -> _FrameEncoder:
        if not self._plan_checked:
            self._ensure_plan()
        return _FrameEncoder(self._dir, self._plan, self._shape, self._fps)

    def _ensure_plan(self) -> None:
        """Before the first write after a load: the recorded encoder must work here; an automatically chosen one (or
        the codec of a converted reference dataset) is chosen again when it does not (files of different encoders mix
        freely: each file is decoded on its own)."""
        err = _probe(self._plan, self._shape, self._fps)
        if err is not None:
            if self._selection.get("requested") not in ("auto", "reference"):
                raise RuntimeError(f"encoder {self._plan.codec!r} recorded for {self._dir} does not work on this "
                                   f"machine ({err}); new frames cannot be written")
            plan, tried = select_codec("auto", self._plan.exact, self._shape,
                                       self._plan.pix_fmt if self._plan.exact else None, None, self._plan.gop_size,
                                       self._plan.file_ext, self._fps, self.hardware_acceleration)
            self._plan = plan
            self._selection = {"requested": "auto", "chosen": plan.codec, "tried": tried}
            self._meta_dirty = True
        self._plan_checked = True

    def _encode_rows(self, frames: np.ndarray) -> _Encoded:
        enc = self._new_encoder()
        try:
            for k in range(frames.shape[0]):
                enc.add(frames[k])
            return enc.finish()
        except BaseException:
            enc.discard()
            raise

    # ------------------------------------------------------------------ committing files
    def _file_name(self, rows: np.ndarray, taken: set) -> str:
        stem = f"{int(rows[0])}_{int(rows[-1])}"
        ext = self._plan.file_ext
        name, k = f"{stem}.{ext}", 0
        while name in taken or os.path.exists(os.path.join(self._dir, name)):
            k += 1
            name = f"{stem}~{k}.{ext}"
        return name

    def _install(self, encoded: List[Tuple[_Encoded, np.ndarray]], record: Optional[Tuple[int, int]] = None) -> None:
        """Renames encoded temporary files into place for their rows, records `record` as a segment, and writes the
        metadata: all or nothing. Files no row reads any more are deleted afterwards."""
        snap = self._index.snapshot()
        seg_runs = self._segments.runs()
        taken = set(self._index.names())
        placed: List[str] = []
        freed: List[EpisodeFile] = []
        try:
            for enc, rows in encoded:
                name = self._file_name(rows, taken)
                taken.add(name)
                final = os.path.join(self._dir, name)
                os.replace(enc.path, final)
                placed.append(final)
                freed += self._index.place(EpisodeFile(name, enc.frames, enc.nbytes, keyframes=enc.keyframes), rows)
            if record is not None:
                self._segments.add(*record)
            self._write_metadata()
        except BaseException:
            self._index.restore(snap)
            log = SegmentLog(self._capacity)
            log._runs = list(seg_runs)
            log.version = self._segments.version + 1
            self._segments = log
            for p in placed:
                remove_quietly(p)
            for enc, _rows in encoded:
                remove_quietly(enc.path)
            raise
        self._delete_files(freed)

    def _delete_files(self, files: List[EpisodeFile]) -> None:
        live = set(self._index.names())
        for f in files:
            self._drop_decoder(f.uid)
            if f.name not in live:
                remove_quietly(os.path.join(self._dir, f.name))

    def _open_rows_mask(self, pos: np.ndarray) -> np.ndarray:
        if self._seg_start is None or self._seg_len == 0:
            return np.zeros(pos.shape, dtype=bool)
        off = pos - self._seg_start
        if self._capacity is not None:
            off %= self._capacity
        return (off >= 0) & (off < self._seg_len)

    def _refuse_open_rows(self, pos: np.ndarray, what: str) -> None:
        mask = self._open_rows_mask(pos)
        if mask.any():
            raise StorageStateError(
                f"cannot {what} rows {describe_rows(pos[mask])} of {type(self).__name__}: they belong to the open "
                f"(uncommitted) append-built segment starting at {self._seg_start}; call mark_segment_end() first")

    def _commit_encoder(self, enc: Optional[_FrameEncoder], start: int, length: int,
                        on_finished: Optional[Any] = None) -> None:
        """Places a writer's or an append-built segment's file at `start` and records the segment. A refused commit
        (rows of the open append-built segment) leaves the encoder untouched; once the file is finished it belongs
        to this call (`on_finished()` tells the owner)."""
        if length == 0 or enc is None:
            if enc is not None:
                enc.discard()
            if on_finished is not None:
                on_finished()
            return
        rows = ring_positions(start, length, self._capacity)
        self._refuse_open_rows(rows, "commit over")
        if on_finished is not None:
            on_finished()
        try:
            encoded = enc.finish()
        except BaseException:
            enc.discard()
            raise
        if self._capacity is None and start + length > self._length:
            self._grow_to(start + length)
        self._install([(encoded, rows)], record=(start, length))

    # ------------------------------------------------------------------ reads
    def _frame_zero(self, n: Optional[int]) -> np.ndarray:
        return np.zeros(self._frame_shape if n is None else (n,) + self._frame_shape, dtype=np.uint8)

    def _acquire_decoder(self, file: EpisodeFile) -> _FrameDecoder:
        with self._dec_lock:
            dec = self._decoders.pop(file.uid, None)
        if dec is None:
            dec = _FrameDecoder(os.path.join(self._dir, file.name), file, self._shape, self._fps, self._decoder_threads,
                                _CONTAINERS.get(file.name.rsplit(".", 1)[-1]))
        return dec

    def _release_decoder(self, dec: _FrameDecoder) -> None:
        if self._decoder_cache_size == 0 or self._closed:
            dec.close()
            return
        evicted: List[_FrameDecoder] = []
        with self._dec_lock:
            old = self._decoders.pop(dec.file.uid, None)
            if old is not None:
                evicted.append(old)
            self._decoders[dec.file.uid] = dec
            while len(self._decoders) > self._decoder_cache_size:
                evicted.append(self._decoders.popitem(last=False)[1])
        for d in evicted:
            d.close()

    def _drop_decoder(self, uid: str) -> None:
        with self._dec_lock:
            dec = self._decoders.pop(uid, None)
        if dec is not None:
            dec.close()

    def _read_file(self, file: EpisodeFile, frames: Sequence[int], out: np.ndarray, rows: Sequence[int]) -> None:
        dec = self._acquire_decoder(file)
        try:
            dec.read(frames, out, rows)
        except BaseException:
            dec.close()
            raise
        self._release_decoder(dec)

    def get_numpy(self, index: Any) -> np.ndarray:
        """Frames at `index` as a fresh uint8 NumPy array ((H, W, 3) / (H, W), with a leading batch axis unless the
        index is a single int)."""
        self._check_open()
        norm = normalize_index(index, self._length, type(self).__name__)
        if norm.single is not None:
            p = norm.single
            self._refuse_open_rows(np.array([p]), "read")
            fid = int(self._index.row_file[p])
            out = self._frame_zero(None)
            if fid >= 0:
                self._read_file(self._index.files[fid], [int(self._index.row_frame[p])], out[None], [0])
            return self._finish_read(out)
        pos = norm.positions()
        out = self._frame_zero(int(pos.size))
        if pos.size == 0:
            return out
        self._refuse_open_rows(pos, "read")
        fids = self._index.row_file[pos]
        frames = self._index.row_frame[pos]
        sel = np.flatnonzero(fids >= 0)
        if sel.size:
            order = sel[np.lexsort((frames[sel], fids[sel]))]
            f_sorted = fids[order]
            cuts = np.flatnonzero(np.diff(f_sorted)) + 1
            groups = np.split(order, cuts)
            jobs = []
            for g in groups:
                uniq, first, inverse = np.unique(frames[g], return_index=True, return_inverse=True)
                jobs.append((self._index.files[int(fids[g[0]])], uniq, g, first, inverse))

            def run(job: Tuple[EpisodeFile, np.ndarray, np.ndarray, np.ndarray, np.ndarray]) -> None:
                file, uniq, g, first, inverse = job
                self._read_file(file, uniq.tolist(), out, g[first].tolist())  # each frame decoded once, in place
                if uniq.size != g.size:  # repeated rows: copy from the first occurrence
                    src = g[first[inverse]]
                    dup = src != g
                    out[g[dup]] = out[src[dup]]

            io_map(run, jobs, min_parallel=2)
        return self._finish_read(out)

    def _finish_read(self, out: np.ndarray) -> np.ndarray:
        if self._clip is not None:
            np.clip(out, self._clip[0], self._clip[1], out=out)
        return out

    def get(self, index: Any) -> Any:
        """Frame(s) at `index` as arrays of the space's backend; rows never written read as zeros. Rows of the open
        append-built segment raise StorageStateError until `mark_segment_end()`."""
        sp = self.single_instance_space
        return sp.backend.from_numpy(self.get_numpy(index), device=sp.device)

    # ------------------------------------------------------------------ writes
    def set(self, index: Any, value: Any) -> None:
        """Checks the frames (shape, dtype) and encodes every contiguous run of the addressed rows into one new file
        (duplicates: the last one wins). Rows of older files covered by it read the new frames; nothing becomes
        visible unless every file was written and the metadata updated."""
        self._check_writable()
        norm = normalize_index(index, self._length, type(self).__name__)
        if norm.single is not None:
            arr = self._conv.convert(value, ())[None]
            pos = np.array([norm.single], dtype=np.int64)
        else:
            n = norm.count()
            arr = self._conv.convert(value, (n,))
            if n == 0:
                return
            pos = norm.positions()
            if n > 1:
                pos, src = last_occurrences(pos)
                if pos.size != n or np.any(src != np.arange(n)):
                    arr = arr[src]
        self._refuse_open_rows(pos, "set")
        encoded: List[Tuple[_Encoded, np.ndarray]] = []
        try:
            for off, ln in consecutive_runs(pos):
                encoded.append((self._encode_rows(arr[off:off + ln]), pos[off:off + ln]))
        except BaseException:
            for enc, _rows in encoded:
                remove_quietly(enc.path)
            raise
        self._install(encoded)

    # ------------------------------------------------------------------ append-built segments
    def mark_segment_start(self, start_index: int) -> None:
        """Opens an append-built segment at `start_index`; its frames are encoded as they arrive and become visible
        (as one file) at `mark_segment_end()`."""
        super().mark_segment_start(start_index)
        self._seg_encoder = None

    def append(self, value: Any) -> None:
        """Encodes one frame at the open segment's next row (a growable storage grows by that row at once)."""
        self._check_writable()
        if self._seg_start is None:
            raise StorageStateError(f"Cannot append to {type(self).__name__} without an open segment; call "
                                    "mark_segment_start(start) first")
        cap = self._capacity
        if cap is not None and self._seg_len >= cap:
            raise ValueError(f"the open segment already holds {self._seg_len} rows = the capacity {cap}; one more "
                             "would overwrite its own first row")
        arr = self._conv.convert_single(value)
        if self._seg_encoder is None:
            self._seg_encoder = self._new_encoder()
        if cap is None:
            pos = self._seg_start + self._seg_len
            if pos >= self._length:
                self._grow_to(pos + 1)
        self._seg_encoder.add(arr)
        self._seg_len += 1

    def mark_segment_end(self) -> None:
        """Commits the open segment: its file becomes visible and the segment is recorded (empty: nothing)."""
        self._check_open()
        if self._seg_start is None:
            return
        start, n, enc = self._seg_start, self._seg_len, self._seg_encoder
        self._seg_start, self._seg_len, self._seg_clear_rows = None, 0, 0
        self._seg_encoder = None
        self._commit_encoder(enc, start, n)

    def abort_segment(self) -> None:
        """Drops the open segment: its temporary file is deleted and the rows keep their previous frames."""
        enc = getattr(self, "_seg_encoder", None)
        self._seg_encoder = None
        if enc is not None:
            enc.discard()
        super().abort_segment()

    def open_segment_writer(self) -> VideoSegmentWriter:
        """A writer that encodes while appending and places its file on `commit(start)`."""
        self._check_writable()
        w = VideoSegmentWriter(self)
        self._writers.add(w)
        return w

    # ------------------------------------------------------------------ length
    def _grow_to(self, n: int) -> None:
        self._index.resize(n)
        self._length = n
        self._meta_dirty = True

    def extend_length(self, length: int) -> None:
        """Adds `length` unwritten rows (read as zeros) at the end of a growable storage; no-op for a fixed capacity."""
        self._check_writable()
        if self._capacity is not None:
            return
        n = _check_count(length, "extend_length", 0)
        if n:
            self._grow_to(self._length + n)

    def shrink_length(self, length: int) -> None:
        """Removes `length` rows from the end of a growable storage (their segments are forgotten; files no row reads
        any more are deleted); no-op for a fixed capacity."""
        self._check_writable()
        if self._capacity is not None:
            return
        if isinstance(length, bool) or not isinstance(length, (int, np.integer)) or not 0 <= length <= self._length:
            raise ValueError(f"shrink_length needs an int in [0, {self._length}], got {length!r}")
        if not length:
            return
        new_len = self._length - int(length)
        if self._seg_start is not None and self._seg_start + self._seg_len > new_len:
            self.abort_segment()
        freed = self._index.resize(new_len)
        self._length = new_len
        self._segments.truncate(new_len)
        self._write_metadata()
        self._delete_files(freed)

    def clear(self) -> None:
        """Aborts the open segment, forgets all segments, deletes every file (all rows read as zeros again) and empties
        a growable storage."""
        self._check_writable()
        self.abort_segment()
        self._segments.clear()
        freed = self._index.clear()
        if self._capacity is None:
            self._index.resize(0)
            self._length = 0
        self._write_metadata()
        self._delete_files(freed)

    # ------------------------------------------------------------------ persistence
    def dumps(self, path: PathLike) -> None:
        """Writes the committed state to `path`: its own directory only flushes the metadata; another directory gets
        copies (hard links where possible) of the files and its own metadata. An open append-built segment is not
        part of it. Dumping again into the same directory reuses files it already holds."""
        self._check_open()
        target = os.fspath(path)
        if os.path.isdir(target) and same_file(target, self._dir):
            if not self._read_only:
                self._write_metadata()
            return
        os.makedirs(target, exist_ok=True)
        old_files: Dict[str, Tuple[str, int]] = {}
        old_meta_path = os.path.join(target, METADATA_FILE)
        if os.path.exists(old_meta_path):
            try:
                old = read_json(old_meta_path, "VideoStorage metadata")
                for name, desc in (old.get("files") or {}).items():
                    if isinstance(desc, dict):
                        old_files[str(name)] = (str(desc.get("uid", "")), int(desc.get("bytes", -1)))
            except (StorageFormatError, TypeError, ValueError, AttributeError):
                old_files = {}
        old_by_content = {v: k for k, v in old_files.items()}
        rename: Dict[str, str] = {}
        used: set = set()
        for f in sorted(self._index.files.values(), key=lambda x: x.name):
            name = old_by_content.get((f.uid, f.nbytes), "")
            dst = os.path.join(target, name)
            if not (name and name not in used and os.path.isfile(dst) and os.path.getsize(dst) == f.nbytes):
                name = f.name  # not there yet: copy it under a name that no file there uses
                stem, ext = name.rsplit(".", 1)
                stem = stem.split("~")[0]
                k = 0
                while name in used or name in old_files or os.path.exists(os.path.join(target, name)):
                    k += 1
                    name = f"{stem}~{k}.{ext}"
                place_copy(os.path.join(self._dir, f.name), os.path.join(target, name))
            rename[f.name] = name
            used.add(name)
        atomic_write_json(old_meta_path, self._metadata(rename))
        for name in old_files:
            if name not in used:
                remove_quietly(os.path.join(target, name))

    def orphan_files(self) -> List[str]:
        """Files in the directory that no row reads from (left by an interrupted write or crash); safe to delete when
        no other process is writing this storage (see `remove_orphan_files`)."""
        self._check_open()
        live = set(self._index.names())
        ext = "." + self._plan.file_ext
        return sorted(n for n in os.listdir(self._dir)
                      if n not in live and n != METADATA_FILE and (n.endswith(ext) or is_temp_name(n)))

    def remove_orphan_files(self) -> List[str]:
        """Deletes `orphan_files()` (and temporary files of writers of this process that are still open are kept)."""
        self._check_writable()
        keep = {w._encoder.path for w in list(self._writers) if w._encoder is not None}
        if self._seg_encoder is not None:
            keep.add(self._seg_encoder.path)
        removed = [n for n in self.orphan_files() if os.path.join(self._dir, n) not in keep]
        for n in removed:
            remove_quietly(os.path.join(self._dir, n))
        return removed

    def close(self) -> None:
        """Drops the open append-built segment and the files of open writers (their commit then raises), writes
        pending metadata, and closes the decoders. Idempotent."""
        if self._closed:
            return
        try:
            self._discard_encoders()
            if not self._read_only and self._meta_dirty:
                self._write_metadata()
        finally:
            self._close_decoders()
            self._closed = True

    def _discard_encoders(self) -> None:
        enc = self._seg_encoder
        self._seg_encoder = None
        if enc is not None:
            enc.discard()
        self._seg_start, self._seg_len, self._seg_clear_rows = None, 0, 0
        for w in list(self._writers):
            w._drop()

    def _close_decoders(self) -> None:
        with self._dec_lock:
            decs = list(self._decoders.values())
            self._decoders.clear()
        for d in decs:
            d.close()

    def _release(self) -> None:
        self._discard_encoders()
        self._close_decoders()

    # ------------------------------------------------------------------ pickling (reader processes)
    def __getstate__(self) -> Dict[str, Any]:
        self._check_open()
        return {"space": self.single_instance_space, "dir": self._dir, "meta": self._metadata(),
                "format_version": self._format_version,
                "opts": {"seek_mode": self.seek_mode, "hardware_acceleration": self.hardware_acceleration,
                         "decode_backend": self.decode_backend, "decoder_cache_size": self._decoder_cache_size,
                         "decoder_threads": self._decoder_threads}}

    def __setstate__(self, state: Dict[str, Any]) -> None:
        space = state["space"]
        shape = image_shape(space, type(self).__name__)
        other = VideoStorage._from_metadata(state["dir"], state["meta"], "pickled VideoStorage", space, shape, True,
                                            state["opts"])
        self.__dict__.update(other.__dict__)
        self._format_version = state["format_version"]
        other._closed = True  # its decoders (none) and encoders (none) now belong to self


__all__ = ["VideoStorage", "VideoSegmentWriter", "CodecPlan", "select_codec", "METADATA_FILE"]
