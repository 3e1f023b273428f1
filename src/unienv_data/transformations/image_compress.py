"""`ImageCompressTransformation`: uint8 images kept as JPEG (or another Pillow format) bytes in a fixed budget.

Each image `(H, W, C)` (C = 1 or 3; `(H, W)` with `last_channel=False`) becomes one uint8 row of `budget` bytes:
the encoded file from byte 0, then zeros. The row layout is the reference's, so either library decodes the
other's rows. The budget is `max_size_bytes` when given, else `H * W * C // ratio + 1 + header_bytes`, where
`ratio` is `compression_ratio` or, for JPEG, a conservative ratio for `init_quality` (60% of the typical JPEG
compression ratio at that quality, interpolated between measured points) and `header_bytes` (default 1024 for
JPEG) covers the fixed markers and tables, which dominate small images.

Encoding starts at `init_quality` and lowers the quality in steps of 10 down to a floor of 20 (or `init_quality`
when lower) until the file fits; an image that does not fit even at the floor raises ValueError naming the budget
and the size it needed. `direct_inverse(space)` (alias `direction_inverse`) gives `ImageDecompressTransformation`,
which decodes rows back to uint8 images. Needs Pillow (the `video` extra), imported when images are encoded or
decoded.
"""
from __future__ import annotations

import io
import math
from typing import Any, Dict, Mapping, Optional, Tuple

import numpy as np

from unienv_interface.space import BoxSpace, Space
from unienv_interface.transformations import DataTransformation, register_transformation
from unienv_interface.transformations.serialization_utils import check_param_names

#: JPEG quality -> typical compression ratio (public measurements of baseline JPEG on photographs)
_JPEG_QUALITY = np.array([55, 60, 65, 70, 75, 80, 85, 90, 95, 100], dtype=np.float64)
_JPEG_RATIO = np.array([43.27, 36.90, 34.24, 31.50, 26.00, 25.06, 19.08, 14.30, 9.88, 5.27], dtype=np.float64)
#: the share of the typical ratio a default budget counts on
_SAFETY = 0.6
#: fixed per-file allowance (markers, quantization and Huffman tables) for formats with a default budget
DEFAULT_HEADER_BYTES = {"JPEG": 1024}
#: the lowest quality the encoder tries before giving up
MIN_QUALITY = 20
QUALITY_STEP = 10


def default_compression_ratio(format: str, quality: int) -> int:
    """The conservative compression ratio a default budget assumes for `format` at `quality` (JPEG only)."""
    if format.upper() not in ("JPEG", "JPG"):
        raise ValueError(f"no default compression ratio for format {format!r}: give max_size_bytes or "
                         "compression_ratio")
    q = float(min(max(quality, _JPEG_QUALITY[0]), _JPEG_QUALITY[-1]))
    return math.floor(float(np.interp(q, _JPEG_QUALITY, _JPEG_RATIO)) * _SAFETY)


def _pil() -> Any:
    try:
        from PIL import Image
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("image compression needs Pillow: pip install 'unienv-storage[video]'") from exc
    return Image


def _uint8(backend: Any) -> Any:
    return backend.dtype_from_name("uint8")


def _image_shape(space: Space, last_channel: bool, who: str) -> Tuple[int, ...]:
    """The trailing image shape of `space` ((H, W, C) or (H, W)), checking it is a uint8 image Box."""
    if not isinstance(space, BoxSpace):
        raise TypeError(f"{who} needs a BoxSpace of uint8 images, got {type(space).__name__}")
    if space.backend.numpy_dtype(space.dtype) != np.uint8:
        raise TypeError(f"{who} needs uint8 images, got dtype {space.backend.dtype_name(space.dtype)}")
    shape = tuple(space.shape)
    if last_channel:
        if len(shape) < 3 or shape[-1] not in (1, 3):
            raise ValueError(f"{who} needs images of shape (..., H, W, 1 or 3) (last_channel=True), got {shape}")
        return shape[-3:]
    if len(shape) < 2:
        raise ValueError(f"{who} needs images of shape (..., H, W) (last_channel=False), got {shape}")
    return shape[-2:]


def _to_numpy(space: Space, data: Any) -> np.ndarray:
    b = space.backend
    return np.asarray(b.to_numpy(data)) if b.is_backendarray(data) else np.asarray(data)


@register_transformation
class ImageCompressTransformation(DataTransformation):
    """uint8 images to fixed-size rows of encoded bytes (see the module docstring)."""

    has_inverse = True

    def __init__(self, init_quality: int = 70, max_size_bytes: Optional[int] = None,
                 compression_ratio: Optional[float] = None, mode: Optional[str] = None, format: str = "JPEG",
                 last_channel: bool = True, header_bytes: Optional[int] = None) -> None:
        if isinstance(init_quality, bool) or not isinstance(init_quality, (int, np.integer)) or not 1 <= init_quality <= 100:
            raise ValueError(f"init_quality must be an int in [1, 100], got {init_quality!r}")
        if max_size_bytes is not None and compression_ratio is not None:
            raise ValueError("give max_size_bytes or compression_ratio, not both")
        if max_size_bytes is not None and (isinstance(max_size_bytes, bool) or not isinstance(max_size_bytes, (int, np.integer))
                                           or max_size_bytes < 1):
            raise ValueError(f"max_size_bytes must be a positive int, got {max_size_bytes!r}")
        if compression_ratio is not None and not (isinstance(compression_ratio, (int, float, np.number))
                                                  and compression_ratio > 0):
            raise ValueError(f"compression_ratio must be a positive number, got {compression_ratio!r}")
        if not isinstance(format, str) or not format:
            raise ValueError(f"format must be a Pillow format name such as 'JPEG', got {format!r}")
        if header_bytes is not None and (not isinstance(header_bytes, (int, np.integer)) or header_bytes < 0):
            raise ValueError(f"header_bytes must be a non-negative int, got {header_bytes!r}")
        self.init_quality = int(init_quality)
        self.max_size_bytes = None if max_size_bytes is None else int(max_size_bytes)
        if max_size_bytes is None and compression_ratio is None:
            compression_ratio = default_compression_ratio(format, self.init_quality)
        self.compression_ratio = None if compression_ratio is None else compression_ratio
        self.mode = mode
        self.format = format
        self.last_channel = bool(last_channel)
        self.header_bytes = int(header_bytes) if header_bytes is not None else DEFAULT_HEADER_BYTES.get(format.upper(), 0)

    # ------------------------------------------------------------------ spaces
    def budget_bytes(self, source_space: Space) -> int:
        """The bytes per image in the stored rows for images of `source_space`."""
        image = _image_shape(source_space, self.last_channel, type(self).__name__)
        if self.max_size_bytes is not None:
            return self.max_size_bytes
        if self.compression_ratio is None:
            raise ValueError(f"{type(self).__name__} needs max_size_bytes or compression_ratio to size its rows")
        return int(math.prod(image) // self.compression_ratio) + 1 + self.header_bytes

    def get_target_space_from_source(self, source_space: Space) -> BoxSpace:
        image = _image_shape(source_space, self.last_channel, type(self).__name__)
        if not isinstance(source_space, BoxSpace):
            raise TypeError(f"{type(self).__name__} compresses uint8 BoxSpace images, got {type(source_space).__name__}")
        lead = tuple(source_space.shape)[:-len(image)]
        return BoxSpace(source_space.backend, 0, 255, _uint8(source_space.backend),
                        shape=lead + (self.budget_bytes(source_space),), device=source_space.device)

    # ------------------------------------------------------------------ encoding
    def encode_to_size(self, image: np.ndarray, max_bytes: int) -> Tuple[bytes, int]:
        """`(encoded bytes, quality used)` for one uint8 image, the quality lowered in steps until it fits in
        `max_bytes`; ValueError when it does not fit even at the floor quality."""
        Image = _pil()
        arr = image[..., 0] if image.ndim == 3 and image.shape[-1] == 1 else image
        pil = Image.fromarray(np.ascontiguousarray(arr))
        if self.mode is not None and pil.mode != self.mode:
            pil = pil.convert(self.mode)
        floor = min(MIN_QUALITY, self.init_quality)
        quality = self.init_quality
        while True:
            buf = io.BytesIO()
            pil.save(buf, format=self.format, quality=quality)
            data = buf.getvalue()
            if len(data) <= max_bytes:
                return data, quality
            if quality <= floor:
                raise ValueError(f"an image of shape {tuple(image.shape)} needs {len(data)} bytes as {self.format} "
                                 f"even at quality {quality}, but the budget is {max_bytes} bytes per image; raise "
                                 "max_size_bytes (or lower compression_ratio)")
            quality = max(quality - QUALITY_STEP, floor)

    def transform(self, source_space: Space, data: Any) -> Any:
        """Images of `source_space` (with optional extra leading batch axes) as uint8 rows of encoded bytes."""
        image = _image_shape(source_space, self.last_channel, type(self).__name__)
        a: Any = _to_numpy(source_space, data)
        shape = tuple(source_space.shape or ())
        if a.dtype != np.uint8:
            raise TypeError(f"{type(self).__name__}: expected uint8 images, got {a.dtype}")
        if a.ndim < len(shape) or tuple(a.shape[a.ndim - len(shape):]) != shape:
            raise ValueError(f"{type(self).__name__}: expected images of shape (..., {', '.join(map(str, shape))}), "
                             f"got {tuple(a.shape)}")
        budget = self.budget_bytes(source_space)
        flat = a.reshape((-1,) + image)
        out: Any = np.zeros((flat.shape[0], budget), dtype=np.uint8)
        for i in range(flat.shape[0]):
            encoded, _quality = self.encode_to_size(flat[i], budget)
            out[i, :len(encoded)] = np.frombuffer(encoded, dtype=np.uint8)
        out = out.reshape(a.shape[:a.ndim - len(image)] + (budget,))
        b = source_space.backend
        return b.from_numpy(out, dtype=_uint8(b), device=source_space.device)

    def direct_inverse(self, source_space: Optional[Space] = None) -> "ImageDecompressTransformation":
        if source_space is None:
            raise ValueError("the inverse of ImageCompressTransformation needs the image space (it restores H, W, C)")
        image = _image_shape(source_space, self.last_channel, type(self).__name__)
        return ImageDecompressTransformation(target_height=image[0], target_width=image[1],
                                             target_channels=image[2] if self.last_channel else None,
                                             mode=self.mode, format=self.format)

    # ------------------------------------------------------------------ JSON
    def to_json(self) -> Dict[str, Any]:
        return {"init_quality": self.init_quality, "max_size_bytes": self.max_size_bytes,
                "compression_ratio": self.compression_ratio, "mode": self.mode, "format": self.format,
                "last_channel": self.last_channel, "header_bytes": self.header_bytes}

    @classmethod
    def from_json(cls, params: Mapping[str, Any]) -> "ImageCompressTransformation":
        names = ("init_quality", "max_size_bytes", "compression_ratio", "mode", "format", "last_channel",
                 "header_bytes")
        check_param_names(params, names, (), cls.__name__)
        return cls(**{k: params[k] for k in names if k in params})


@register_transformation
class ImageDecompressTransformation(DataTransformation):
    """Rows of encoded image bytes (zero-padded) back to uint8 images `(H, W, C)` (or `(H, W)` without channels).

    A row of only zeros (never written) decodes to a black image; bytes that are not a decodable image, or decode
    to another size, raise ValueError naming the row."""

    has_inverse = True

    def __init__(self, target_height: int, target_width: int, target_channels: Optional[int] = 3,
                 mode: Optional[str] = None, format: Optional[str] = None) -> None:
        for name, v in (("target_height", target_height), ("target_width", target_width)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        if target_channels is not None and target_channels not in (1, 3):
            raise ValueError(f"target_channels must be 1, 3 or None, got {target_channels!r}")
        self.target_height = int(target_height)
        self.target_width = int(target_width)
        self.target_channels = None if target_channels is None else int(target_channels)
        self.mode = mode
        self.format = format

    @property
    def image_shape(self) -> Tuple[int, ...]:
        """`(H, W, C)`, or `(H, W)` without channels."""
        hw = (self.target_height, self.target_width)
        return hw if self.target_channels is None else hw + (self.target_channels,)

    def _check_source(self, source_space: Space) -> BoxSpace:
        if not isinstance(source_space, BoxSpace) or source_space.backend.numpy_dtype(source_space.dtype) != np.uint8 \
                or len(source_space.shape) < 1:
            raise TypeError(f"{type(self).__name__} needs a uint8 BoxSpace of byte rows (..., budget), got "
                            f"{source_space}")
        return source_space

    def get_target_space_from_source(self, source_space: Space) -> BoxSpace:
        src = self._check_source(source_space)
        return BoxSpace(src.backend, 0, 255, _uint8(src.backend), shape=tuple(src.shape)[:-1] + self.image_shape,
                        device=src.device)

    def decode_bytes(self, row: np.ndarray, index: int = 0) -> np.ndarray:
        """One zero-padded row of encoded bytes as a uint8 image of `image_shape`."""
        if not row.any():
            return np.zeros(self.image_shape, dtype=np.uint8)
        Image = _pil()
        try:
            with Image.open(io.BytesIO(row.tobytes()), formats=None if self.format is None else [self.format]) as img:
                if self.mode is not None and img.mode != self.mode:
                    img = img.convert(self.mode)
                elif self.target_channels == 3 and img.mode != "RGB":
                    img = img.convert("RGB")
                elif self.target_channels in (1, None) and img.mode not in ("L", "1"):
                    img = img.convert("L")
                out = np.asarray(img, dtype=np.uint8)
        except (OSError, SyntaxError) as exc:   # Pillow's errors for unreadable data
            raise ValueError(f"row {index} does not hold a decodable {self.format or 'image'} file: {exc}") from None
        if out.ndim == 2 and self.target_channels is not None:
            out = np.repeat(out[..., None], self.target_channels, axis=-1)
        if out.shape != self.image_shape:
            raise ValueError(f"row {index} decodes to an image of shape {out.shape}, expected {self.image_shape}")
        return out

    def transform(self, source_space: Space, data: Any) -> Any:
        src = self._check_source(source_space)
        a: Any = _to_numpy(src, data)
        budget = src.shape[-1]
        if a.dtype != np.uint8 or a.ndim < 1 or a.shape[-1] != budget:
            raise ValueError(f"{type(self).__name__}: expected uint8 rows of {budget} bytes, got {a.dtype} of shape "
                             f"{tuple(a.shape)}")
        flat = a.reshape(-1, budget)
        out: Any = np.empty((flat.shape[0],) + self.image_shape, dtype=np.uint8)
        for i in range(flat.shape[0]):
            out[i] = self.decode_bytes(flat[i], i)
        out = out.reshape(a.shape[:-1] + self.image_shape)
        return src.backend.from_numpy(out, dtype=_uint8(src.backend), device=src.device)

    def direct_inverse(self, source_space: Optional[Space] = None) -> ImageCompressTransformation:
        if source_space is None:
            raise ValueError("the inverse of ImageDecompressTransformation needs the byte-row space (its last axis is "
                             "the budget)")
        src = self._check_source(source_space)
        return ImageCompressTransformation(max_size_bytes=int(src.shape[-1]), mode=self.mode,
                                           format=self.format or "JPEG", last_channel=self.target_channels is not None)

    def to_json(self) -> Dict[str, Any]:
        return {"target_height": self.target_height, "target_width": self.target_width,
                "target_channels": self.target_channels, "mode": self.mode, "format": self.format}

    @classmethod
    def from_json(cls, params: Mapping[str, Any]) -> "ImageDecompressTransformation":
        names = ("target_height", "target_width", "target_channels", "mode", "format")
        check_param_names(params, names, ("target_height", "target_width"), cls.__name__)
        return cls(**{k: params[k] for k in names if k in params})


__all__ = ["ImageCompressTransformation", "ImageDecompressTransformation", "default_compression_ratio",
           "DEFAULT_HEADER_BYTES", "MIN_QUALITY", "QUALITY_STEP"]
