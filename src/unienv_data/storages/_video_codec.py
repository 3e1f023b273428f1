"""How `VideoStorage` turns frames into video files and back, on PyAV (FFmpeg): choosing an encoder, the pixel format
files are written in, encoding one file, decoding frames of a file by number, and the cache of open decoders.

Codecs. Lossy: H.264 (libx264), AV1 (libsvtav1), MPEG-4, hardware H.264/HEVC/AV1 encoders where they open.
Exact (``lossless=True``): FFV1, libx264rgb at qp 0, PNG-in-video, FFV-Huffyuv, with an RGB (or gray) file pixel
format. ``codec="auto"`` opens a tiny encoder of each candidate in turn (hardware first unless
``hardware_acceleration="none"``), encodes two real frames with it and keeps the first one that really works here;
`select_codec` also says why the others were skipped.

Encoding. `FrameEncoder` encodes frames one at a time into a hidden temporary file and records which frames became
keyframes; the caller renames the finished file into place (or discards it).

Decoding. Reading frame k seeks to the last recorded keyframe at or before k and decodes forward (or keeps decoding
forward when the open decoder is already in that stretch), so random access is exact. `DecoderCache` keeps recently
used decoders open; its batch read decodes each file once, frames in increasing order, files in parallel threads.

PyAV is imported on first use only: importing this module loads neither PyAV nor Pillow.
"""
from __future__ import annotations

import io
import math
import os
import threading
from bisect import bisect_right
from collections import OrderedDict
from dataclasses import dataclass
from fractions import Fraction
from types import ModuleType
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from unienv_data.base.errors import StorageFormatError, StorageNotFoundError

from ._episode_files import copy_repeats, import_optional, io_map, remove_quietly, temp_file_path
from ._video_index import EpisodeFile, RunFileIndex

#: container format of each file extension
CONTAINERS = {"mp4": "mp4", "mkv": "matroska", "mov": "mov"}
_ALIASES = {"h264": "libx264", "avc": "libx264", "x264": "libx264", "av1": "libsvtav1", "svtav1": "libsvtav1",
            "huffyuv": "ffvhuff", "mpeg-4": "mpeg4"}
#: codecs that are exact with an exact pixel format (libx264rgb only at qp 0, set by lossless=True)
_EXACT_CODECS = ("ffv1", "png", "ffvhuff")
_LOSSLESS_CAPABLE = _EXACT_CODECS + ("libx264rgb",)
HARDWARE_ENCODERS = ("h264_nvenc", "hevc_nvenc", "av1_nvenc", "h264_qsv", "hevc_qsv", "h264_videotoolbox",
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


def codec_family(name: str) -> str:
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


def probe_plan(plan: CodecPlan, shape: Tuple[int, int, int], fps: Fraction) -> Optional[str]:
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
        container = av.open(buf, "w", format=CONTAINERS[plan.file_ext])
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
        err = probe_plan(plan, shape, fps_fraction(fps))
        if err is not None:
            raise ValueError(f"encoder {name!r} does not work on this machine for {shape[1]}x{shape[0]} frames in "
                             f".{file_ext} ({err}); codec='auto' picks one that does")
        return plan, [[name, "ok"]]
    if lossless:
        candidates: Sequence[str] = (("ffv1", "libx264rgb", "ffvhuff", "png") if file_ext == "mkv"
                                     else ("libx264rgb", "ffv1", "png", "ffvhuff"))
    else:
        hw: Sequence[str] = () if hardware in ("none", "cpu") else HARDWARE_ENCODERS
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
        err = probe_plan(plan, shape, fps)
        if err is None:
            tried.append([name, "ok"])
            return plan, tried
        tried.append([name, f"does not open: {err}"])
    what = "lossless" if lossless else ("hardware" if hardware == "required" else "lossy")
    raise RuntimeError(f"codec='auto' found no {what} encoder that works on this machine for "
                       f"{shape[1]}x{shape[0]} frames in .{file_ext}; tried: " + "; ".join(f"{n} ({o})" for n, o in tried))


def fps_fraction(fps: Any) -> Fraction:
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
class EncodedFile:
    path: str
    frames: int
    nbytes: int
    keyframes: List[int]


class FrameEncoder:
    """Encodes frames one at a time into a hidden temporary file of the storage directory."""

    def __init__(self, directory: str, plan: CodecPlan, shape: Tuple[int, int, int], fps: Fraction) -> None:
        av = _av()
        self.path = temp_file_path(directory, plan.file_ext)
        self.frames = 0
        self.keyframes: List[int] = []
        self._fps = fps
        self._container: Any = av.open(self.path, "w", format=CONTAINERS[plan.file_ext])
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

    def finish(self) -> EncodedFile:
        """Flushes and closes the file; the caller renames it into place (or discards it)."""
        self._mux(self._setup.stream.encode(None))
        self._container.close()
        self._container = None
        kf = sorted(set(k for k in self.keyframes if 0 <= k < self.frames))
        if not kf or kf[0] != 0:
            kf = [0] + kf
        return EncodedFile(self.path, self.frames, os.path.getsize(self.path), kf)

    def discard(self) -> None:
        if self._container is not None:
            try:
                self._container.close()
            except Exception:  # noqa: BLE001 - the file is removed anyway
                pass
            self._container = None
        remove_quietly(self.path)


# ---------------------------------------------------------------------------------------------------- decoding
class FrameDecoder:
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



# ---------------------------------------------------------------------------------------------------- decoder cache
class DecoderCache:
    """Decoders of recently read files of one storage directory, kept open for the next read: at most `size`, the
    least recently used closed first (`size` 0 closes each after use). A decoder is taken out while it reads, so two
    threads never share one. After `close_all()` every decoder is closed after use."""

    def __init__(self, directory: str, shape: Tuple[int, int, int], fps: Fraction, size: int, threads: int) -> None:
        self._dir = directory
        self._shape = shape
        self._fps = fps
        self.size = size
        self.threads = threads
        self._open: "OrderedDict[str, FrameDecoder]" = OrderedDict()
        self._lock = threading.Lock()
        self._closed = False

    def __len__(self) -> int:
        return len(self._open)

    def _acquire(self, file: EpisodeFile) -> FrameDecoder:
        with self._lock:
            dec = self._open.pop(file.uid, None)
        if dec is None:
            dec = FrameDecoder(os.path.join(self._dir, file.name), file, self._shape, self._fps, self.threads,
                               CONTAINERS.get(file.name.rsplit(".", 1)[-1]))
        return dec

    def _release(self, dec: FrameDecoder) -> None:
        if self.size == 0 or self._closed:
            dec.close()
            return
        evicted: List[FrameDecoder] = []
        with self._lock:
            old = self._open.pop(dec.file.uid, None)
            if old is not None:
                evicted.append(old)
            self._open[dec.file.uid] = dec
            while len(self._open) > self.size:
                evicted.append(self._open.popitem(last=False)[1])
        for d in evicted:
            d.close()

    def drop(self, uid: str) -> None:
        """Closes the decoder of the file with content id `uid` (the file is going away)."""
        with self._lock:
            dec = self._open.pop(uid, None)
        if dec is not None:
            dec.close()

    def close_all(self) -> None:
        """Closes every open decoder; later reads close theirs after use."""
        self._closed = True
        with self._lock:
            decs = list(self._open.values())
            self._open.clear()
        for d in decs:
            d.close()

    def read_file(self, file: EpisodeFile, frames: Sequence[int], out: np.ndarray, rows: Sequence[int]) -> None:
        """Writes frame `frames[j]` of `file` into `out[rows[j]]`; `frames` must be increasing."""
        dec = self._acquire(file)
        try:
            dec.read(frames, out, rows)
        except BaseException:
            dec.close()
            raise
        self._release(dec)

    def read_rows(self, index: RunFileIndex, pos: np.ndarray, out: np.ndarray) -> None:
        """Writes the frame physical row `pos[k]` reads into `out[k]`, leaving unwritten rows alone: each file is
        decoded once, its frames in increasing order, different files in parallel threads."""
        fids = index.row_file[pos]
        frames = index.row_frame[pos]
        sel = np.flatnonzero(fids >= 0)
        if not sel.size:
            return
        order = sel[np.lexsort((frames[sel], fids[sel]))]
        f_sorted = fids[order]
        cuts = np.flatnonzero(np.diff(f_sorted)) + 1
        groups = np.split(order, cuts)
        jobs = []
        for g in groups:
            uniq, first, inverse = np.unique(frames[g], return_index=True, return_inverse=True)
            jobs.append((index.files[int(fids[g[0]])], uniq, g, first, inverse))

        def run(job: Tuple[EpisodeFile, np.ndarray, np.ndarray, np.ndarray, np.ndarray]) -> None:
            file, uniq, g, first, inverse = job
            self.read_file(file, uniq.tolist(), out, g[first].tolist())  # each frame decoded once, in place
            copy_repeats(out, g, first, inverse)

        io_map(run, jobs, min_parallel=2)


__all__ = ["CONTAINERS", "HARDWARE_ENCODERS", "DEFAULT_GOP", "CodecPlan", "select_codec", "probe_plan", "fps_fraction",
           "codec_family", "EncodedFile", "FrameEncoder", "FrameDecoder", "DecoderCache"]
