"""How `VideoStorage` turns frames into video files, on PyAV (FFmpeg): choosing an encoder, the pixel format files
are written in, and encoding one file (`_video_decode` reads them back).

Codecs. Lossy: H.264 (libx264), AV1 (libsvtav1), MPEG-4, hardware H.264/HEVC/AV1 encoders where they open.
Exact (``lossless=True``): FFV1, libx264rgb at qp 0, PNG-in-video, FFV-Huffyuv, with an RGB (or gray) file pixel
format. ``codec="auto"`` opens a tiny encoder of each candidate in turn (hardware first unless
``hardware_acceleration="none"``), encodes two real frames with it and keeps the first one that really works here;
`select_codec` also says why the others were skipped.

Encoding. `FrameEncoder` encodes frames one at a time into a hidden temporary file and records which frames became
keyframes; the caller renames the finished file into place (or discards it).

PyAV is imported on first use only: importing this module loads neither PyAV nor Pillow.
"""
from __future__ import annotations

import io
import math
import os
import sys
import threading
import weakref
from dataclasses import dataclass
from fractions import Fraction
from types import ModuleType
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ._episode_files import import_optional, remove_quietly, temp_file_path

# ---------------------------------------------------------------------------------------------------- fork safety
#: every live object of this package holding an open PyAV container (`FrameEncoder`, `FrameDecoder`)
_AV_HOLDERS: "weakref.WeakSet[Any]" = weakref.WeakSet()
#: in a forked child, the holders inherited from the parent, kept alive for good (see `_pin_inherited_holders`)
_INHERITED_HOLDERS: List[Any] = []


def hold_av(holder: Any) -> None:
    """Registers an object holding an open PyAV container, so a forked child never frees it (see below)."""
    _AV_HOLDERS.add(holder)


def _pin_inherited_holders() -> None:
    """In a forked child (a DataLoader worker): keeps every container holder inherited from the parent alive for the
    child's lifetime. Freeing one there frees its codec context, and a codec that decodes or encodes with FFmpeg's
    slice threads (FFV1) then waits for threads that exist only in the parent, forever: a worker that collected an
    unclosed VideoStorage it inherited hung. The child never uses them (`DecoderCache` opens its own)."""
    _INHERITED_HOLDERS.extend(_AV_HOLDERS)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_pin_inherited_holders)


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
#: 16-bit gray formats (the file pixel formats of uint16 frames): converting between them only swaps bytes (exact)
GRAY16_FORMATS = ("gray16le", "gray16be")
#: the 16-bit gray format whose bytes are this machine's uint16 arrays (frames are handed to and read from PyAV in it)
GRAY16_NATIVE = "gray16le" if sys.byteorder == "little" else "gray16be"
#: encoders that store 16-bit gray frames exactly
_GRAY16_CODECS = ("ffv1", "ffvhuff", "png")
_DEFAULT_OPTIONS: Dict[str, Dict[str, str]] = {
    # (libx264 also gets the B-frame layout of `_x264_frame_layout` unless the caller sets one)
    "libx264": {"preset": "veryfast", "crf": "23"},
    "libx264rgb": {"preset": "veryfast", "crf": "23"},
    "libsvtav1": {"preset": "10", "crf": "35"},
}
#: keyframe interval of inter-coded codecs: random access decodes on average about half of it per frame read
DEFAULT_GOP = 10
#: frames of at most this many pixels are encoded on one thread. FFmpeg's automatic threading splits a small frame
#: into slices encoded in parallel, which costs more than it saves: libx264 on 128x128 frames took ~30% more CPU per
#: frame, wrote ~9% more bytes and ran no faster on a 2-core machine (measured with bench/bench_video.py); the
#: caller's threads (one encoder per writer) are the better place for parallelism. Larger frames keep FFmpeg's
#: automatic thread count; ``encoder_options={"threads": "N"}`` overrides both.
SINGLE_THREAD_ENCODE_PIXELS = 320 * 240
#: codecs that code every frame on its own in independent slices (FFV1 version 3): their encoders keep FFmpeg's
#: automatic threads even for small frames (128x128: 700 f/s on one thread, 850-980 f/s with two, same bytes), and
#: their decoders use slice threads (see `_video_decode.SLICE_DECODE_THREADS`)
SLICED_CODECS = ("ffv1",)


# ---------------------------------------------------------------------------------------------------- PyAV
_AV: Optional[ModuleType] = None


#: SVT-AV1's log level (0 fatal, 1 errors, 2 warnings, 3 info): the encoder prints ~20 `Svt[info]` lines of its
#: settings to stderr each time it opens, unless SVT_LOG says less; it reads the variable when it first logs
SVT_LOG_LEVEL = "1"


def _av() -> Any:
    """PyAV, imported on first use; also quiets SVT-AV1's info log (errors still show) unless SVT_LOG is set."""
    global _AV
    if _AV is None:
        os.environ.setdefault("SVT_LOG", SVT_LOG_LEVEL)
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


def _format_is_exact(pix_fmt: str, channels: int, dtype: str = "uint8") -> bool:
    if dtype == "uint16":
        return channels == 1 and pix_fmt in GRAY16_FORMATS
    if pix_fmt in _RGB_FORMATS:
        return True
    return channels == 1 and pix_fmt == "gray"


def is_exact_file(codec: str, pix_fmt: str) -> bool:
    """Whether files of codec family `codec` in `pix_fmt` (as a reference-written directory describes them) hold
    frames bit-exactly: an intra lossless codec with an RGB, 8-bit gray or 16-bit gray pixel format."""
    return codec in _EXACT_CODECS and (pix_fmt in _RGB_FORMATS or pix_fmt == "gray" or pix_fmt in GRAY16_FORMATS)


def _default_pix_fmt(codec: str, formats: List[str], shape: Tuple[int, int, int], exact: bool,
                     dtype: str = "uint8") -> str:
    h, w, c = shape
    if dtype == "uint16":
        for p in (GRAY16_NATIVE,) + GRAY16_FORMATS:
            if p in formats:
                return p
        raise ValueError(f"encoder {codec!r} has no 16-bit gray pixel format (it supports {formats}); uint16 frames "
                         f"need one of {list(GRAY16_FORMATS)}, e.g. codec='ffv1'")
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


def _check_uint16_request(codec: str, file_pixel_format: Optional[str]) -> None:
    """uint16 frames are kept bit-exactly in a 16-bit gray file pixel format by an exact codec: ValueError naming what
    is expected and what was given otherwise (they are never narrowed to 8 bits)."""
    if codec not in _GRAY16_CODECS:
        raise ValueError(f"uint16 frames are stored losslessly as 16-bit gray video: codec must be one of "
                         f"{list(_GRAY16_CODECS)} (e.g. codec='ffv1' with file_ext='mkv') or 'auto', got {codec!r}")
    if file_pixel_format is not None and str(file_pixel_format) not in GRAY16_FORMATS:
        raise ValueError(f"uint16 frames need a 16-bit gray file_pixel_format, one of {list(GRAY16_FORMATS)} (or None), "
                         f"got {file_pixel_format!r}: {file_pixel_format!r} cannot hold 16-bit values exactly")


def _make_plan(codec: str, lossless: bool, shape: Tuple[int, int, int], file_pixel_format: Optional[str],
               encoder_options: Optional[Dict[str, Any]], gop_size: Optional[int], file_ext: str,
               dtype: str = "uint8") -> CodecPlan:
    """A plan for one encoder; ValueError when the request cannot be met with it. Without a `gop_size`, intra-coded
    codecs (FFV1, PNG, FFV-Huffyuv) make every frame a keyframe (random access decodes one frame, ~5% more bytes) and
    inter-coded ones use `DEFAULT_GOP`. uint16 (grayscale) frames are always stored exactly (`_check_uint16_request`)."""
    if dtype == "uint16":
        _check_uint16_request(codec, file_pixel_format)
        lossless = True
    if lossless and codec not in _LOSSLESS_CAPABLE:
        raise ValueError(f"codec {codec!r} is lossy and cannot store frames exactly; for lossless=True use one of "
                         f"{list(_LOSSLESS_CAPABLE)} (e.g. codec='ffv1' with file_ext='mkv', or codec='libx264rgb'), "
                         "or codec='auto'")
    formats = _encoder_formats(codec)
    user = {str(k): str(v) for k, v in (encoder_options or {}).items()}
    # libx264rgb at the caller's qp 0 (and no crf of theirs) is as exact as lossless=True
    user_exact = codec == "libx264rgb" and user.get("qp") in ("0", "0.0") and "crf" not in user
    capable = codec in _EXACT_CODECS or (codec == "libx264rgb" and (lossless or user_exact))
    if file_pixel_format is None:
        pix = _default_pix_fmt(codec, formats, shape, capable, dtype)
    else:
        pix = str(file_pixel_format)
        if pix not in formats:
            raise ValueError(f"file_pixel_format {pix!r} is not supported by encoder {codec!r}; it supports {formats}")
    channels = shape[2]
    if lossless and not _format_is_exact(pix, channels, dtype):
        exact_ok = [f for f in formats if _format_is_exact(f, channels, dtype)]
        raise ValueError(f"file_pixel_format {pix!r} cannot hold {'gray' if channels == 1 else 'rgb24'} frames "
                         f"exactly (YUV conversion / chroma subsampling); with lossless=True use one of {exact_ok}")
    opts = dict(_DEFAULT_OPTIONS.get(codec, {})) if not (lossless and codec == "libx264rgb") else {"preset": "veryfast"}
    if _RATE_KEYS.intersection(user):
        # the caller chose the rate control: a default crf left next to their qp would win inside x264 (crf is
        # checked first), so their options would not be what the encoder gets
        opts = {k: v for k, v in opts.items() if k not in _RATE_KEYS}
    if lossless and codec == "libx264rgb":
        for key in ("crf", "qp"):
            if key in user and float(user[key]) != 0:
                raise ValueError(f"encoder_options {key}={user[key]} makes libx264rgb lossy, but lossless=True; drop it")
        user.pop("crf", None)
        opts["qp"] = "0"
    exact = capable and _format_is_exact(pix, channels, dtype)
    gop = gop_size if gop_size is not None else (1 if codec in _EXACT_CODECS else DEFAULT_GOP)
    if codec == "libx264" and not _B_FRAME_KEYS.intersection(user):
        opts.update(_x264_frame_layout(gop))
    opts.update(user)
    return CodecPlan(codec, pix, tuple(sorted(opts.items())), exact, gop, file_ext)


#: encoder options that choose the rate control (the caller's replace every default one)
_RATE_KEYS = frozenset(("crf", "qp", "b", "bit_rate", "cq", "qscale", "global_quality"))

#: encoder options that say how B-frames are laid out (a caller setting any of them keeps x264's own layout)
_B_FRAME_KEYS = frozenset(("bf", "x264-params", "x264opts", "b-pyramid", "b_strategy", "b-adapt"))


def _x264_frame_layout(gop: int) -> Dict[str, str]:
    """One B-frame between anchors, always, never a reference: with GOP 10, I B P B P B P B P P. Reading frame k then
    decodes the keyframe, the P-frames up to k (or the anchor after a B-frame k) and k itself; the decoder drops the
    other B-frames unread (skip_frame="NONREF", see `_video_decode`). Measured with bench/bench_video.py (128x128
    camera-like frames, GOP 10) against no B-frames: ~10% fewer bytes at the same PSNR, random and sequential reads
    as fast or a little faster, encoding as fast. Longer B runs (3, 8) read random frames 10-20% faster still but no
    sequential run faster, so a 64-frame slice falls under 3x the random rate; x264's own adaptive layout (up to 3
    B-frames, some of them references) reads random frames ~15% slower than none."""
    if gop < 3:
        return {"bf": "0"}
    return {"x264-params": "bframes=1:b-adapt=0:b-pyramid=none"}


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
        # FFmpeg's messages of a failing candidate (e.g. "Cannot load libcuda.so.1") are kept out of the caller's
        # log when PyAV logging is on: the failure is reported in `tried` instead
        with av.logging.Capture():
            buf = io.BytesIO()
            container = av.open(buf, "w", format=CONTAINERS[plan.file_ext])
            try:
                enc = _StreamSetup(container, plan, shape, fps)
                deep = plan.pix_fmt in GRAY16_FORMATS
                for i in range(2):
                    frame = enc.frame_from(np.full((h, w, 3) if c == 3 else (h, w), (10000 if deep else 40) * i,
                                                   dtype=np.uint16 if deep else np.uint8))
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
                 hardware: str, dtype: str = "uint8") -> Tuple[CodecPlan, List[List[str]]]:
    """`(plan, tried)`: the encoder plan to use and `[candidate, outcome]` for every candidate looked at. `dtype`
    "uint16" (grayscale frames) asks for an exact 16-bit gray plan whatever `lossless` says."""
    requested = str(codec).lower()
    if dtype == "uint16":
        lossless = True
    tried: List[List[str]] = []
    if requested != "auto":
        name = _ALIASES.get(requested, requested)
        if not _encoder_exists(name):
            raise ValueError(f"codec {codec!r} is not a video encoder of this PyAV/FFmpeg build; use codec='auto' or "
                             f"one of {[c for c in _LOSSLESS_CAPABLE + _SOFTWARE_LOSSY if _encoder_exists(c)]}")
        plan = _make_plan(name, lossless, shape, file_pixel_format, encoder_options, gop_size, file_ext, dtype)
        err = probe_plan(plan, shape, fps_fraction(fps))
        if err is not None:
            raise ValueError(f"encoder {name!r} does not work on this machine for {shape[1]}x{shape[0]} frames in "
                             f".{file_ext} ({err}); codec='auto' picks one that does")
        return plan, [[name, "ok"]]
    if dtype == "uint16":
        candidates: Sequence[str] = ("ffv1", "ffvhuff", "png") if file_ext == "mkv" else ("ffv1", "png", "ffvhuff")
    elif lossless:
        candidates = (("ffv1", "libx264rgb", "ffvhuff", "png") if file_ext == "mkv"
                      else ("libx264rgb", "ffv1", "png", "ffvhuff"))
    else:
        hw: Sequence[str] = () if hardware in ("none", "cpu") else HARDWARE_ENCODERS
        candidates = tuple(hw) + (() if hardware == "required" else _SOFTWARE_LOSSY)
    for name in candidates:
        if not _encoder_exists(name):
            tried.append([name, "not in this build"])
            continue
        try:
            plan = _make_plan(name, lossless, shape, file_pixel_format, encoder_options, gop_size, file_ext, dtype)
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
        if (h * w <= SINGLE_THREAD_ENCODE_PIXELS and "threads" not in plan.options_dict
                and plan.codec not in SLICED_CODECS):
            cc.thread_count = 1
        if plan.options:
            stream.options = plan.options_dict
        self.stream = stream
        self._replicate = c == 1 and plan.pix_fmt in _RGB_FORMATS
        if plan.pix_fmt in GRAY16_FORMATS:
            self._in_fmt = GRAY16_NATIVE  # uint16 frames: their bytes as they are in memory
        else:
            self._in_fmt = "rgb24" if (c == 3 or self._replicate) else "gray"
        self._pix = plan.pix_fmt
        self._rf = _reformatter()
        self._frame_cls = _av().VideoFrame

    def frame_from(self, arr: np.ndarray) -> Any:
        """A frame of the stream's pixel format from one frame of the storage's dtype (uint16 only for a 16-bit gray
        plan, uint8 otherwise: a frame of another dtype raises TypeError rather than being narrowed)."""
        want = np.uint16 if self._in_fmt in GRAY16_FORMATS else np.uint8
        if arr.dtype != want:
            raise TypeError(f"a {self._pix} video stream takes {np.dtype(want).name} frames, got {arr.dtype}")
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
        hold_av(self)
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


__all__ = ["CONTAINERS", "HARDWARE_ENCODERS", "DEFAULT_GOP", "GRAY16_FORMATS", "GRAY16_NATIVE", "is_exact_file", "CodecPlan", "select_codec", "probe_plan", "fps_fraction",
           "codec_family", "EncodedFile", "FrameEncoder"]
