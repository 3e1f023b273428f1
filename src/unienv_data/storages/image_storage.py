"""`ImageStorage`: one image file per row (PNG, JPEG or WebP, through Pillow).

Layout of the storage directory::

    image_metadata.json     format, options, capacity, length, which rows hold a file ("written"), segments
    <row>.<ext>             the image of one row (ext: png / jpeg / webp)

Differences from the reference, on purpose:

* A row is either unwritten (it reads as zeros, like a fresh array storage) or written; the metadata records which.
  A written row whose file is missing or damaged raises an error naming the file: it never reads as zeros.
* PNG is the default (exact). JPEG is always lossy; WebP is lossy unless ``lossless=True``; ``lossless=True`` with
  JPEG is refused. Lossy reads of a box with narrower bounds than 0..255 are clipped into the bounds.
* Grayscale (H, W) spaces are supported as well as (H, W, 3).
* ``dumps(path)`` into another directory works: files are hard-linked (or copied) there, then the metadata written.

Every file is written under a temporary name and renamed into place, so a reader sees the old or the new image,
never a torn one. Rows written by ``set`` are recorded in the metadata at once; rows appended to an open segment when
the segment ends (a crash before that loses only the open segment).
"""
from __future__ import annotations

from unienv_interface.backends.base import BArrayType, BDeviceType, BDtypeType, BRNGType
import os
from typing import Any, Dict, List, Optional

import numpy as np

from unienv_data.base.errors import StorageFormatError, StorageNotFoundError
from unienv_data.base.files import FORMAT_VERSION, PathLike, atomic_write_json, read_json, require_fields
from unienv_data.base.forwarding import forwarded
from unienv_data.base.indexing import normalize_index
from unienv_data.base.registry import register_storage, storage_type_name
from unienv_data.base.segments import SegmentLog
from unienv_interface.space import Space

from ._episode_files import (FileRowStorage, check_loaded_capacity, check_rows_fields, check_stored_shape, copy_repeats,
                             image_shape, import_optional, io_map, mask_to_runs, place_copy, prepare_new_directory,
                             remove_quietly, runs_to_mask, temp_file_path)

METADATA_FILE = "image_metadata.json"
_FORMATS = {"PNG": "png", "JPEG": "jpeg", "WEBP": "webp"}
_FORMAT_ALIASES = {"JPG": "JPEG"}


def _pil_image() -> Any:
    return import_optional("PIL.Image", "video", "ImageStorage")


def _check_quality(quality: Any) -> int:
    if isinstance(quality, (bool, np.bool_)) or not isinstance(quality, (int, np.integer)) or not 0 <= quality <= 100:
        raise ValueError(f"quality must be an int in [0, 100], got {quality!r}")
    return int(quality)


@register_storage
class ImageStorage(FileRowStorage[BArrayType, BArrayType, BDeviceType, BDtypeType, BRNGType]):
    """Rows of a (H, W, 3) or (H, W) uint8 BoxSpace, one image file each (see the module docstring).

    `create(space, *, format="PNG", quality=75, lossless=None, compress_level=1, image_options=None, capacity=None,
    cache_path (required, new or empty directory), multiprocessing=False)`; `load_from(path, space, *,
    capacity=None, read_only=True, multiprocessing=False)`. `is_exact` tells whether images read back bit-exactly.
    Pickling gives a read-only copy (for reader processes); `is_multiprocessing_safe` when opened read-only.
    """

    def __init__(self, single_instance_space: Space, directory: str, fmt: str, save_options: Dict[str, Any],
                 exact: bool, capacity: Optional[int], length: int, written: np.ndarray, segments: SegmentLog, *,
                 read_only: bool = False, quality: int = 75, persistent_segments: bool = True) -> None:
        super().__init__(single_instance_space, directory, capacity, length, segments, read_only, exact, "image")
        self._fmt = fmt
        self._ext = _FORMATS[fmt]
        self._save_options = dict(save_options)
        self._exact = exact
        self._quality = quality
        self._written = written
        self._saved_log_version = segments.version
        #: False for a directory the reference wrote: it keeps no segment list of its own
        self._persistent_segments = persistent_segments
        self._Image = _pil_image()

    # ------------------------------------------------------------------ construction
    @classmethod
    def create(cls, single_instance_space: Space, *args: Any, capacity: Optional[int] = None,
               cache_path: Optional[PathLike] = None, multiprocessing: bool = False, format: str = "PNG",
               quality: int = 75, lossless: Optional[bool] = None, compress_level: int = 1,
               image_options: Optional[Dict[str, Any]] = None, **kwargs: Any) -> "ImageStorage":
        """A new, empty storage in the directory `cache_path` (created; it must not hold files already)."""
        _shape, cap = cls._check_create_args(single_instance_space, args, kwargs, capacity, multiprocessing)
        fmt = str(format).upper()
        fmt = _FORMAT_ALIASES.get(fmt, fmt)
        if fmt not in _FORMATS:
            raise ValueError(f"format must be one of {sorted(_FORMATS)}, got {format!r}")
        q = _check_quality(quality)
        if lossless is not None and not isinstance(lossless, (bool, np.bool_)):
            raise TypeError(f"lossless must be a bool or None, got {lossless!r}")
        if isinstance(compress_level, bool) or not isinstance(compress_level, int) or not 0 <= compress_level <= 9:
            raise ValueError(f"compress_level must be an int in [0, 9], got {compress_level!r}")
        if image_options is not None and not isinstance(image_options, dict):
            raise TypeError(f"image_options must be a dict of Pillow save options, got {image_options!r}")
        if fmt == "JPEG" and lossless:
            raise ValueError("JPEG is lossy and cannot store images exactly; use format='PNG' or format='WEBP' with "
                             "lossless=True")
        if fmt == "PNG":
            exact, options = True, {"compress_level": compress_level}
        elif fmt == "JPEG":
            exact, options = False, {"quality": q}
        else:
            exact = bool(lossless)
            options = {"lossless": exact, "quality": q}
        options.update(image_options or {})
        if fmt == "WEBP" and bool(options.get("lossless")) != exact:
            raise ValueError("pass lossless=True/False, not image_options['lossless']")
        directory = prepare_new_directory(cache_path, cls.__name__)
        st = cls(single_instance_space, directory, fmt, options, exact, cap, 0, np.zeros(cap or 0, dtype=bool),
                 SegmentLog(cap), quality=q)
        st.write_metadata()
        return st

    @classmethod
    def load_from(cls, path: PathLike, single_instance_space: Space, *, capacity: Optional[int] = None,
                  read_only: bool = True, multiprocessing: bool = False, **kwargs: Any) -> "ImageStorage":
        """Opens a storage directory, checking its metadata against the space and `capacity` (when given).

        Directories written by the reference (no format_version) open too: a row counts as written when its file
        exists."""
        cls._check_load_args(single_instance_space, kwargs, read_only, multiprocessing)
        directory, meta_path, meta, version = cls._read_directory(path, METADATA_FILE)
        st = cls._from_metadata(directory, meta, meta_path, single_instance_space, read_only, version)
        check_loaded_capacity(st, capacity)
        return st

    @classmethod
    def _from_metadata(cls, directory: str, meta: Dict[str, Any], where: str, space: Space, read_only: bool,
                       version: int) -> "ImageStorage":
        require_fields(meta, ("storage_type", "format", "capacity", "length"), where)
        cls._check_storage_type(meta, where)
        fmt = _FORMAT_ALIASES.get(str(meta["format"]).upper(), str(meta["format"]).upper())
        if fmt not in _FORMATS:
            raise StorageFormatError(f"{where}: unknown image format {meta['format']!r}")
        cap, length = check_rows_fields(meta, where)
        n_rows = cap if cap is not None else length
        quality = meta.get("quality", 75)
        if version == 0:
            ext = _FORMATS[fmt]
            written = np.array([os.path.isfile(os.path.join(directory, f"{i}.{ext}")) for i in range(n_rows)],
                               dtype=bool)
            options: Dict[str, Any] = {"quality": quality} if fmt != "PNG" else {}
            exact = fmt == "PNG"
            segments = SegmentLog(cap)
        else:
            require_fields(meta, ("shape", "dtype", "written", "segments", "save_options", "lossless"), where)
            image_shape(space, cls.__name__)
            check_stored_shape(meta, space, directory, "images")
            if not isinstance(meta["save_options"], dict):
                raise StorageFormatError(f"{where}: 'save_options' must be an object")
            written = runs_to_mask(meta["written"], n_rows, f"{where} 'written'")
            options = dict(meta["save_options"])
            exact = bool(meta["lossless"])
            segments = SegmentLog.from_json(meta["segments"], cap, length, where)
        return cls(space, directory, fmt, options, exact, cap, length, written, segments, read_only=read_only,
                   quality=quality if isinstance(quality, int) else 75,
                   persistent_segments=version >= 1)   # a reference-written directory keeps no segment list

    # ------------------------------------------------------------------ properties
    format: str = forwarded("_fmt")
    is_exact: bool = forwarded("_exact", "Whether images read back bit-exactly (PNG, lossless WebP).")

    def _path(self, row: int) -> str:
        return os.path.join(self._dir, f"{row}.{self._ext}")

    # ------------------------------------------------------------------ metadata
    def _metadata(self) -> Dict[str, Any]:
        return {"storage_type": storage_type_name(type(self)), "format_version": FORMAT_VERSION, "format": self._fmt,
                "quality": self._quality, "lossless": self._exact, "save_options": self._save_options,
                "shape": list(self._frame_shape), "dtype": "uint8", "capacity": self._capacity,
                "length": self._length, "written": mask_to_runs(self._written), "segments": self._segments.to_json()}

    def write_metadata(self, target: Optional[str] = None) -> None:
        """Writes the metadata file into the storage directory (atomically), or into the directory `target`."""
        atomic_write_json(os.path.join(target or self._dir, METADATA_FILE), self._metadata())
        if target is None:
            self._meta_dirty = False
            self._saved_log_version = self._segments.version

    @property
    def _dirty(self) -> bool:
        """Rows appended to a still-open segment count too: `flush()` records them."""
        return self._meta_dirty or self._segments.version != self._saved_log_version

    # ------------------------------------------------------------------ reads
    def _read_row(self, row: int) -> np.ndarray:
        path = self._path(row)
        h, w, c = self._shape
        try:
            with self._Image.open(path) as im:
                im.load()
                if im.size != (w, h):
                    raise StorageFormatError(f"image file {path} (row {row}) is {im.size[0]}x{im.size[1]}, expected "
                                             f"{w}x{h}")
                mode = im.mode
                if c == 3 and mode != "RGB":
                    raise StorageFormatError(f"image file {path} (row {row}) has mode {mode}, expected RGB")
                if c == 1 and mode not in ("L", "RGB"):
                    raise StorageFormatError(f"image file {path} (row {row}) has mode {mode}, expected L")
                arr = np.array(im, dtype=np.uint8)
        except FileNotFoundError:
            raise StorageNotFoundError(f"image file {path} for row {row} is missing (the metadata records the row "
                                       "as written)") from None
        except StorageFormatError:
            raise
        except (OSError, SyntaxError, ValueError) as exc:
            raise StorageFormatError(f"image file {path} for row {row} is damaged or truncated ({exc})") from None
        if c == 1 and arr.ndim == 3:
            arr = np.ascontiguousarray(arr[:, :, 1])  # WebP keeps gray as RGB with equal channels
        return arr.reshape(self._frame_shape)

    def get_numpy(self, index: Any) -> np.ndarray:
        """Images at `index` as a fresh uint8 NumPy array; unwritten rows are zeros. A written row whose file is
        missing or damaged raises StorageNotFoundError / StorageFormatError naming the file."""
        self._check_open()
        norm = normalize_index(index, self._length, type(self).__name__)
        if norm.single is not None:
            p = norm.single
            out = self._read_row(p) if self._written[p] else self._zeros(None)
            return self._finish_read(out)
        pos = norm.positions()
        out = self._zeros(int(pos.size))
        sel = np.flatnonzero(self._written[pos]) if pos.size else np.zeros(0, dtype=np.int64)
        if sel.size:
            uniq, first, inverse = np.unique(pos[sel], return_index=True, return_inverse=True)
            dest = sel[first]

            def read_into(j: int) -> None:
                out[dest[j]] = self._read_row(int(uniq[j]))

            io_map(read_into, list(range(int(uniq.size))), min_parallel=4)  # each file read once, in place
            copy_repeats(out, sel, first, inverse)
        return self._finish_read(out)

    # ------------------------------------------------------------------ writes
    def _encode_to_temp(self, arr: np.ndarray) -> str:
        tmp = temp_file_path(self._dir, self._ext)
        if arr.ndim == 3 and arr.shape[2] == 1:
            arr = arr[:, :, 0]
        try:
            self._Image.fromarray(np.ascontiguousarray(arr)).save(tmp, format=self._fmt, **self._save_options)
        except BaseException:
            remove_quietly(tmp)
            raise
        return tmp

    def _write_rows(self, pos: np.ndarray, arr: np.ndarray, persist: bool) -> None:
        """Writes checked images `arr[k]` at rows `pos[k]` (unique): all files to temporary names first, then renamed
        into place; the metadata is written when rows became written and `persist`."""
        temps: List[Optional[str]] = [None] * int(pos.size)

        def encode(k: int) -> None:
            temps[k] = self._encode_to_temp(arr[k])

        try:
            io_map(encode, list(range(int(pos.size))), min_parallel=4)
        except BaseException:
            for t in temps:
                remove_quietly(t)
            raise
        for k, row in enumerate(pos.tolist()):
            os.replace(temps[k], self._path(row))  # type: ignore[arg-type]
        fresh = ~self._written[pos]
        if fresh.any():
            self._written[pos] = True
            self._meta_dirty = True
        if persist and self._dirty:
            self.write_metadata()

    def set(self, index: Any, value: Any) -> None:
        """Checks the images (shape, dtype) and writes one file per addressed row (duplicates: the last one wins)."""
        self.check_writable()
        rows = self._rows_to_write(index, value)
        if rows is not None:
            self._write_rows(rows[0], rows[1], True)

    # ------------------------------------------------------------------ segments and writers
    def append(self, value: Any) -> None:
        """Writes one image at the open segment's next row (recorded in the metadata when the segment ends)."""
        self.check_writable()
        arr = self._conv.convert_single(value)
        pos = self._next_write_position()
        self._write_rows(np.array([pos], dtype=np.int64), arr[None], persist=False)
        self._advance_segment()

    def mark_segment_end(self) -> None:
        super().mark_segment_end()
        if not self._read_only and not self._closed and self._dirty:
            self.write_metadata()

    def record_segment(self, start: int, length: int) -> None:
        super().record_segment(start, length)
        if not self._read_only and self._dirty:
            self.write_metadata()

    def on_segments_dropped(self) -> None:
        # an image replaces its row's file as soon as it is written: the segments it overwrites leave the metadata
        # first, so a crash never leaves a listed episode holding a frame of another
        if not self._read_only and not self._closed:
            self.write_metadata()

    def has_persistent_segments(self) -> bool:
        """True unless the directory was written by the reference: this storage's metadata then holds its segment
        list, rewritten at every commit and before segments are dropped."""
        return self._persistent_segments

    def prepare_element(self, value: Any) -> Any:
        return np.array(self._conv.convert_single(value), copy=True)

    def stack_prepared(self, items: List[Any]) -> Any:
        return np.stack(items) if items else self._zeros(0)

    def set_prepared(self, index: Any, batch: Any) -> None:
        self.check_writable()
        norm = normalize_index(index, self._length, type(self).__name__)
        self._write_rows(norm.positions(), batch, persist=False)

    # ------------------------------------------------------------------ length
    def _grow_rows(self, new_length: int) -> None:
        """New rows are unwritten (read as zeros)."""
        self._written = np.concatenate([self._written, np.zeros(new_length - self._length, dtype=bool)])
        self._length = new_length
        self._meta_dirty = True

    def _drop_rows(self, new_len: int) -> None:
        """Removes rows from `new_len` on and their files (the metadata first)."""
        self.after_shrink(new_len)
        gone = np.flatnonzero(self._written[new_len:]) + new_len
        self._written = self._written[:new_len].copy()
        self._length = new_len
        self.write_metadata()
        for row in gone.tolist():
            remove_quietly(self._path(row))

    def clear(self) -> None:
        """Aborts the open segment, forgets all segments, deletes every image (rows read as zeros again) and
        empties a growable storage."""
        self.check_writable()
        self.abort_segment()
        self._segments.clear()
        gone = np.flatnonzero(self._written)
        self._written[:] = False
        if self._capacity is None:
            self._written = np.zeros(0, dtype=bool)
            self._length = 0
        self.write_metadata()
        for row in gone.tolist():
            remove_quietly(self._path(row))

    # ------------------------------------------------------------------ persistence
    def dumps(self, path: PathLike) -> None:
        """Writes the storage to `path`: its own directory only flushes the metadata; another directory gets
        hard links (or copies) of the image files, then its metadata."""
        target = self._dump_target(path)
        if target is None:
            return
        old_rows: np.ndarray = np.zeros(0, dtype=np.int64)
        old_meta_path = os.path.join(target, METADATA_FILE)
        old_ext = self._ext
        if os.path.exists(old_meta_path):
            try:
                old = read_json(old_meta_path, "ImageStorage metadata")
                n_old = old["capacity"] if old.get("capacity") is not None else old["length"]
                old_rows = np.flatnonzero(runs_to_mask(old["written"], int(n_old), old_meta_path))
                old_ext = _FORMATS.get(str(old.get("format", "")).upper(), self._ext)
            except (StorageFormatError, KeyError, TypeError, ValueError):
                old_rows = np.zeros(0, dtype=np.int64)
        rows = np.flatnonzero(self._written).tolist()
        io_map(lambda r: place_copy(self._path(r), os.path.join(target, f"{r}.{self._ext}")), rows, min_parallel=8)
        self.write_metadata(target)
        keep = set(rows) if old_ext == self._ext else set()
        for r in old_rows.tolist():
            if r not in keep:
                remove_quietly(os.path.join(target, f"{r}.{old_ext}"))

    def _persist_on_close(self) -> None:
        """Writes pending metadata (a still-open segment's rows included)."""
        if not self._read_only and self._dirty:
            self.write_metadata()

    # ------------------------------------------------------------------ pickling (reader processes)
    def __getstate__(self) -> Dict[str, Any]:
        self._check_open()
        return {"space": self.single_instance_space, "dir": self._dir, "meta": self._metadata()}

    def __setstate__(self, state: Dict[str, Any]) -> None:
        other = type(self)._from_metadata(state["dir"], state["meta"], "pickled ImageStorage", state["space"], True,
                                          FORMAT_VERSION)
        self.__dict__.update(other.__dict__)
        other.__dict__.clear()   # what it held is self's now: emptied, its garbage collection releases nothing


__all__ = ["ImageStorage", "METADATA_FILE"]
