"""The options of `VideoStorage` that leave its files as they are, checked for `create` / `load_from`: how frames
are decoded (seek mode, backend, decoder cache size and threads per decoder), whether encoders may run on hardware,
and the pixel format of the frames handed in and out.
"""
from __future__ import annotations

from typing import Any, Dict, Sequence, Tuple

from ._episode_files import check_count

_SEEK_MODES = ("exact", "approximate")
_DECODE_BACKENDS = ("auto", "pyav")
_HW_VALUES = ("auto", "none", "cpu", "required")


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


def buffer_format_for(shape: Tuple[int, int, int], dtype: str) -> str:
    """The pixel format of the frames handed in and out (the reference's ``buffer_pixel_format``): "rgb24" for RGB,
    "gray" for uint8 grayscale, "gray16le" for uint16 grayscale (the reference's name for 16-bit depth frames)."""
    if dtype == "uint16":
        return "gray16le"
    return "rgb24" if shape[2] == 3 else "gray"


def runtime_options(seek_mode: Any, hardware_acceleration: Any, decode_backend: Any, buffer_pixel_format: Any,
                    shape: Tuple[int, int, int], cache_decoders: Any, decoder_cache_size: Any,
                    decoder_threads: Any, dtype: str = "uint8") -> Dict[str, Any]:
    """The checked options of `VideoStorage.create` / `load_from` that do not change the files: how frames are
    decoded (seek mode, backend, decoder cache size and threads), where encoders run, the buffer pixel format."""
    expected_buf = buffer_format_for(shape, dtype)
    if buffer_pixel_format is not None and buffer_pixel_format != expected_buf:
        raise ValueError(f"buffer_pixel_format must be {expected_buf!r} for {dtype} frames of shape "
                         f"{shape[:2] if shape[2] == 1 else shape}, got {buffer_pixel_format!r}")
    if decoder_cache_size is None:
        # reopening a decoder costs ~1-2 ms (container + codec open), about as much as decoding a GOP of small
        # frames: keep many open for small frames, fewer for large ones (~8 decoded frames held per decoder)
        frame_bytes = shape[0] * shape[1] * 3
        size = int(min(64, max(8, (256 << 20) // (8 * frame_bytes))))
    else:
        size = check_count(decoder_cache_size, "decoder_cache_size")
    return {"seek_mode": _pick(seek_mode, _SEEK_MODES, "seek_mode"),
            "hardware_acceleration": _normalize_hw(hardware_acceleration),
            "decode_backend": _pick(decode_backend, _DECODE_BACKENDS, "decode_backend"),
            "decoder_cache_size": size if cache_decoders else 0,
            "decoder_threads": None if decoder_threads is None else check_count(decoder_threads, "decoder_threads")}


__all__ = ["buffer_format_for", "runtime_options"]
