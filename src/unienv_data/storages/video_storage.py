"""`VideoStorage`: image frames kept as video files on PyAV (FFmpeg), one file per written run of rows.

This module is the `VideoStorage` class: creating and opening, writing (`set`, append-built segments, committing
encoded files all or nothing), reading, length, persistence and pickling. It composes the private modules
`_video_codec` (choosing an encoder, encoding files, pixel formats), `_video_decode` (decoding, the decoder cache),
`_video_index` (which file and frame every row reads), `_video_layout` (the directory: metadata checks, file names,
dumps), `_video_options` (decoding options) and `_video_writer` (the segment writer); `_episode_files` holds what it
shares with `ImageStorage`.

Writing. A segment writer (`open_segment_writer`) and an append-built segment (`mark_segment_start` / `append` /
`mark_segment_end`) encode each frame as it arrives into a hidden temporary file; on commit the file is renamed into
place and the metadata (one JSON file, replaced atomically) starts listing it. Before that nothing of it is
visible, and a crash leaves only an ignored temporary file. `set` encodes every contiguous run of the written rows
into one new file the same way. Rows of older files that a new file covers are re-pointed to the new file; an older
file keeps serving its other rows unchanged (a commit re-encodes nothing) and is deleted once no row reads from it.

Files for the reference `unienv`, which reads `<start>_<end>.<ext>` as exactly rows start..end: every metadata
write also writes `episode_index.json` listing the files that serve exactly the rows of their name; `dumps` and
`close` re-encode the rest of each partly overwritten file of a lossless storage bit-exactly into files named for
its remaining rows (`_trim_for_reference`); a file placed as `<start>_<end>~<k>` (its plain name still in use) takes
the plain name once that is free (`_settle_names`).

Reading. Every file records its keyframes while it is written and random access is exact (see `_video_decode`). A
batch read decodes each file once and puts the rows back in the caller's order.

Codecs. ``codec="auto"`` keeps the first candidate encoder that really works here; ``storage.codec`` and the metadata
say which one was chosen and why the others were skipped.

Limits (documented rather than silently worked around): rows of the open append-built segment cannot be read or
`set` until `mark_segment_end` (StorageStateError); a `set` with scattered indices makes one small file per
contiguous run; partly overwritten files of a lossy storage keep their bytes on disk until fully replaced (and the
reference, which they are hidden from, raises for their rows); the storage is written by one
process (`multiprocessing=True` only for read-only opens); decoding runs on the CPU.
"""
from __future__ import annotations

from unienv_interface.backends.base import BArrayType, BDeviceType, BDtypeType, BRNGType
import os
import weakref
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from unienv_data.base.errors import StorageStateError
from unienv_data.base.storage import SpaceStorage
from unienv_data.base.files import FORMAT_VERSION, PathLike, atomic_write_json, require_fields
from unienv_data.base.indexing import normalize_index
from unienv_data.base.registry import register_storage, storage_type_name
from unienv_data.base.segments import SegmentLog
from unienv_interface.space import Space

from ._episode_files import (FileRowStorage, check_count, check_loaded_capacity, consecutive_runs, describe_rows,
                             prepare_new_directory, remove_quietly, ring_positions)
from ._video_codec import (CONTAINERS, DEFAULT_GOP, CodecPlan, EncodedFile, FrameEncoder, codec_family, fps_fraction,
                           probe_plan, select_codec)
from ._video_decode import DecoderCache
from ._video_index import EpisodeFile, RunFileIndex
from ._video_layout import (METADATA_FIELDS, METADATA_FILE, REFERENCE_INDEX_FILE, VideoLayout, dump_files,
                            new_file_name, orphan_names, parse_metadata, parse_reference, settle_names, verify_files,
                            write_reference_index)
from ._video_options import buffer_format_for, runtime_options
from ._video_writer import VideoSegmentWriter, VideoStorageHooks


#: frames decoded and re-encoded at a time when a partly overwritten file is trimmed
_TRIM_CHUNK = 64


@register_storage
class VideoStorage(FileRowStorage[BArrayType, BArrayType, BDeviceType, BDtypeType, BRNGType]):
    """Frames of a (H, W, 3) or (H, W) uint8 BoxSpace, or of a (H, W) / (H, W, 1) uint16 one (16-bit grayscale, e.g.
    depth in millimetres), stored as video files (see the module docstring).

    `create(space, *, codec="auto", lossless=False, fps=15, gop_size=None, file_ext="mp4", file_pixel_format=None,
    encoder_options=None, capacity=None, cache_path (required, new or empty directory), multiprocessing=False,
    hardware_acceleration="auto", seek_mode="exact", decode_backend="auto", buffer_pixel_format=None,
    cache_decoders=True, decoder_cache_size=None, decoder_threads=None)`.

    * ``gop_size`` (keyframe interval): default 10 for inter-coded codecs (H.264, AV1, ...), 1 for intra-coded
      ones (FFV1, PNG); keyframe positions are recorded while writing and random reads seek to them.
    * ``lossless=True`` stores frames bit-exactly (FFV1 / libx264rgb qp 0 / PNG / FFV-Huffyuv); asking a lossy codec
      for it raises ValueError. Lossy reads of a box with narrower bounds than 0..255 are clipped into the bounds.
    * uint16 frames are always stored bit-exactly in a 16-bit gray file pixel format ("gray16le", as the reference
      writes depth video; "gray16be" for PNG) by FFV1 (``codec="ffv1"``, ``file_ext="mkv"``; ``codec="auto"`` picks
      it), FFV-Huffyuv or PNG; ``buffer_pixel_format`` is then "gray16le". A lossy codec or an 8-bit file pixel
      format raises ValueError: 16-bit values are never narrowed.
    * ``capacity=None`` grows; a fixed capacity is a ring.
    * ``codec`` / ``codec_base`` / ``file_pixel_format`` / ``is_exact`` / ``codec_selection`` tell what was chosen.
    * Recently used decoders stay open (``decoder_cache_size``: default 64 for small frames, down to 8 for large
      ones; ``cache_decoders=False`` closes each after use); ``decoder_threads``: threads per decoder (default
      None: FFmpeg's slice threads, up to 4, for FFV1, whose frames are coded in slices - 1.5x faster on 2 cores -
      and 1 for everything else, where batch reads decode different files in parallel threads instead).
    * ``seek_mode`` ("exact"; "approximate" is accepted and still exact), ``decode_backend`` ("auto"/"pyav") and
      ``hardware_acceleration`` ("auto": hardware encoders first when they open; "none"/"cpu"; "required") are
      validated. Decoding always runs on the CPU.
    * ``dumps(path)`` to another directory copies (hard-links where possible) the files and writes the metadata
      there; ``load_from`` checks the metadata and that every listed file exists with its recorded size.
    * Pickling gives a read-only copy of the committed state (for reader processes).
    """

    frame_dtypes = ("uint8", "uint16")
    _lists_segments = True      # unienv 0.0.1b16 lists a video storage's segments in get_segments()

    def __init__(self, single_instance_space: Space, directory: str, plan: CodecPlan, fps: Any,
                 capacity: Optional[int], length: int, index: RunFileIndex, segments: SegmentLog, *,
                 read_only: bool = False, selection: Optional[Dict[str, Any]] = None, format_version: int = FORMAT_VERSION,
                 decoder_cache_size: int = 8, decoder_threads: Optional[int] = None, seek_mode: str = "exact",
                 hardware_acceleration: str = "auto", decode_backend: str = "auto", plan_checked: bool = False) -> None:
        """The storage of `directory` as `create` / `load_from` found it; `plan_checked`: the encoder `plan` was
        just chosen and tried on this machine (`create`), so the first write does not try it again."""
        super().__init__(single_instance_space, directory, capacity, length, segments, read_only, plan.exact, "frame")
        self._plan = plan
        self._fps = fps_fraction(fps)
        self._fps_value: Any = int(self._fps) if self._fps.denominator == 1 else float(self._fps)
        self._codec_base: Optional[str] = None
        self._index = index
        self._selection = selection or {"requested": plan.codec, "chosen": plan.codec, "tried": [[plan.codec, "ok"]]}
        self._format_version = format_version
        self._decoders = DecoderCache(directory, self._shape, self._fps, decoder_cache_size, decoder_threads)
        self.seek_mode = seek_mode
        self.hardware_acceleration = hardware_acceleration
        self.decode_backend = decode_backend
        self._seg_encoder: Optional[FrameEncoder] = None
        self._writers: "weakref.WeakSet[VideoSegmentWriter]" = weakref.WeakSet()
        self._plan_checked = plan_checked

    # ------------------------------------------------------------------ construction
    @classmethod
    def create(cls, single_instance_space: Space, *args: Any, capacity: Optional[int] = None,
               cache_path: Optional[PathLike] = None, multiprocessing: bool = False, codec: str = "auto",
               lossless: bool = False, fps: Any = 15, gop_size: Optional[int] = None, file_ext: str = "mp4",
               file_pixel_format: Optional[str] = None, encoder_options: Optional[Dict[str, Any]] = None,
               buffer_pixel_format: Optional[str] = None, seek_mode: str = "exact", hardware_acceleration: Any = "auto",
               decode_backend: str = "auto", cache_decoders: bool = True, decoder_cache_size: Optional[int] = None,
               decoder_threads: Optional[int] = None, **kwargs: Any) -> "VideoStorage":
        """A new, empty storage in the directory `cache_path` (created; it must not hold files already)."""
        shape, cap = cls._check_create_args(single_instance_space, args, kwargs, capacity, multiprocessing)
        if not isinstance(lossless, (bool, np.bool_)):
            raise TypeError(f"lossless must be a bool, got {lossless!r}")
        ext = str(file_ext).lower().lstrip(".")
        if ext not in CONTAINERS:
            raise ValueError(f"file_ext must be one of {sorted(CONTAINERS)}, got {file_ext!r}")
        fps_frac = fps_fraction(fps)
        gop = None if gop_size is None else check_count(gop_size, "gop_size", minimum=1)
        dtype = cls._space_dtype(single_instance_space)
        opts = runtime_options(seek_mode, hardware_acceleration, decode_backend, buffer_pixel_format, shape,
                               cache_decoders, decoder_cache_size, decoder_threads, dtype)
        if encoder_options is not None and not isinstance(encoder_options, dict):
            raise TypeError(f"encoder_options must be a dict of encoder option names to values, got {encoder_options!r}")
        if not isinstance(codec, str):
            raise TypeError(f"codec must be a string (an encoder name or 'auto'), got {codec!r}")
        plan, tried = select_codec(codec, bool(lossless), shape, file_pixel_format, encoder_options, gop, ext, fps_frac,
                                   opts["hardware_acceleration"], dtype)
        directory = prepare_new_directory(cache_path, cls.__name__)
        selection = {"requested": codec, "chosen": plan.codec, "tried": tried}
        st = cls(single_instance_space, directory, plan, fps, cap, 0, RunFileIndex(cap or 0), SegmentLog(cap),
                 selection=selection, plan_checked=True, **opts)
        st.write_metadata()
        return st

    @classmethod
    def load_from(cls, path: PathLike, single_instance_space: Space, *, capacity: Optional[int] = None,
                  read_only: bool = True, multiprocessing: bool = False, seek_mode: str = "exact",
                  hardware_acceleration: Any = "auto", decode_backend: str = "auto",
                  buffer_pixel_format: Optional[str] = None, cache_decoders: bool = True,
                  decoder_cache_size: Optional[int] = None,
                  decoder_threads: Optional[int] = None, **kwargs: Any) -> "VideoStorage":
        """Opens a storage directory, checking its metadata against the space and `capacity` (when given) and that
        every listed video file exists with the size recorded when it was written."""
        shape = cls._check_load_args(single_instance_space, kwargs, read_only, multiprocessing)
        opts = runtime_options(seek_mode, hardware_acceleration, decode_backend, buffer_pixel_format, shape,
                               cache_decoders, decoder_cache_size, decoder_threads,
                               cls._space_dtype(single_instance_space))
        directory, meta_path, meta, version = cls._read_directory(path, METADATA_FILE)
        if version == 0:
            return cls._load_reference(directory, meta, meta_path, single_instance_space, capacity, read_only, opts)
        st = cls._from_metadata(directory, meta, meta_path, single_instance_space, read_only, opts)
        check_loaded_capacity(st, capacity)
        st.check_files()
        return st

    @classmethod
    def _from_layout(cls, space: Space, directory: str, layout: VideoLayout, read_only: bool,
                     opts: Dict[str, Any], **kwargs: Any) -> "VideoStorage":
        return cls(space, directory, layout.plan, layout.fps, layout.capacity, layout.length, layout.index,
                   layout.segments, read_only=read_only, selection=layout.selection, **kwargs, **opts)

    @classmethod
    def _from_metadata(cls, directory: str, meta: Dict[str, Any], where: str, space: Space, read_only: bool,
                       opts: Dict[str, Any]) -> "VideoStorage":
        require_fields(meta, METADATA_FIELDS, where)
        cls._check_storage_type(meta, where)
        return cls._from_layout(space, directory, parse_metadata(directory, meta, where, space), read_only, opts)

    @classmethod
    def _load_reference(cls, directory: str, meta: Dict[str, Any], where: str, space: Space, capacity: Optional[int],
                        read_only: bool, opts: Dict[str, Any]) -> "VideoStorage":
        """A directory written by the reference `unienv` (no format_version): opened read-only."""
        if not read_only:
            raise ValueError(f"{directory} was written by the reference unienv VideoStorage; it opens read-only here "
                             "(dumps() it to a new directory to get a writable copy)")
        layout = parse_reference(directory, meta, where, capacity)
        return cls._from_layout(space, directory, layout, True, opts, format_version=0)

    @staticmethod
    def _space_dtype(space: Space) -> str:
        """The dtype name of an image space ("uint8" or "uint16")."""
        return str(space.backend.dtype_name(space.dtype))

    # ------------------------------------------------------------------ properties
    @property
    def codec(self) -> str:
        """The encoder new files are written with (e.g. 'libx264', 'ffv1')."""
        return self._plan.codec

    @property
    def codec_base(self) -> str:
        """The codec family of the files (e.g. 'h264', 'ffv1', 'av1')."""
        if self._codec_base is None:
            self._codec_base = codec_family(self._plan.codec) if self._format_version else self._plan.codec
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

    def check_files(self) -> None:
        """Checks that every video file the metadata lists exists with the size recorded when it was written
        (StorageNotFoundError / StorageFormatError naming the file otherwise); `load_from` runs it."""
        self._check_open()
        verify_files(self._dir, self._index, self._meta_path)

    @property
    def _meta_path(self) -> str:
        return os.path.join(self._dir, METADATA_FILE)

    # ------------------------------------------------------------------ metadata
    def _metadata(self, rename: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
        idx = self._index.to_json()
        if rename:
            idx["files"] = {rename.get(k, k): v for k, v in idx["files"].items()}
            idx["runs"] = [[r, n, rename.get(name, name), f0] for r, n, name, f0 in idx["runs"]]
        plan = self._plan
        # the bare class name, as unienv 0.0.1b16 writes and requires (loading here takes the module path too)
        return {"storage_type": type(self).__name__, "format_version": FORMAT_VERSION,
                "codec": plan.codec, "codec_base": self.codec_base, "codec_selection": self.codec_selection,
                "lossless": plan.exact, "file_ext": plan.file_ext, "fps": self._fps_value, "gop_size": plan.gop_size,
                "file_pixel_format": plan.pix_fmt, "buffer_pixel_format": buffer_format_for(self._shape, self._dtype.name),
                "encoder_options": plan.options_dict, "shape": list(self._frame_shape), "dtype": self._dtype.name,
                "capacity": self._capacity, "length": self._length, "segments": self._segments.to_json(),
                "files": idx["files"], "runs": idx["runs"]}

    def write_metadata(self) -> None:
        """Writes the metadata file of the storage directory (atomically), and the reference's index next to it."""
        atomic_write_json(self._meta_path, self._metadata())
        self._meta_dirty = False
        write_reference_index(self._dir, self._index, self._capacity)

    # ------------------------------------------------------------------ encoders
    def _new_encoder(self) -> FrameEncoder:
        if not self._plan_checked:
            self._ensure_plan()
        return FrameEncoder(self._dir, self._plan, self._shape, self._fps)

    def _ensure_plan(self) -> None:
        """Before the first write after a load: the recorded encoder must work here; an automatically chosen one (or
        the codec of a converted reference dataset) is chosen again when it does not (files of different encoders mix
        freely: each file is decoded on its own)."""
        err = probe_plan(self._plan, self._shape, self._fps)
        if err is not None:
            if self._selection.get("requested") not in ("auto", "reference"):
                raise RuntimeError(f"encoder {self._plan.codec!r} recorded for {self._dir} does not work on this "
                                   f"machine ({err}); new frames cannot be written")
            plan, tried = select_codec("auto", self._plan.exact, self._shape,
                                       self._plan.pix_fmt if self._plan.exact else None, None, self._plan.gop_size,
                                       self._plan.file_ext, self._fps, self.hardware_acceleration, self._dtype.name)
            self._plan = plan
            self._selection = {"requested": "auto", "chosen": plan.codec, "tried": tried}
            self._meta_dirty = True
        self._plan_checked = True

    def _encode_rows(self, frames: np.ndarray) -> EncodedFile:
        enc = self._new_encoder()
        try:
            for k in range(frames.shape[0]):
                enc.add(frames[k])
            return enc.finish()
        except BaseException:
            enc.discard()
            raise

    # ------------------------------------------------------------------ committing files
    def _install(self, encoded: List[Tuple[EncodedFile, np.ndarray]],
                 record: Optional[Tuple[int, int]] = None) -> None:
        """Renames encoded temporary files into place for their rows, records `record` as a segment, and writes the
        metadata: all or nothing. Files no row reads any more are deleted afterwards, then `~<k>` names settled."""
        snap = self._index.snapshot()
        seg_runs = self._segments.runs()
        taken = set(self._index.names())
        placed: List[str] = []
        freed: List[EpisodeFile] = []
        try:
            for enc, rows in encoded:
                freed += self._place(enc, rows, taken, placed)
            if record is not None:
                self._segments.add(*record)
            self.write_metadata()
        except BaseException:
            self._index.restore(snap)
            log = SegmentLog(self._capacity, seg_runs)
            log.version = self._segments.version + 1
            self._segments = log
            for p in placed:
                remove_quietly(p)
            for enc, _rows in encoded:
                remove_quietly(enc.path)
            raise
        self._delete_files(freed)
        self._settle_names()

    def _place(self, enc: EncodedFile, rows: np.ndarray, taken: set, placed: List[str]) -> List[EpisodeFile]:
        """Renames one encoded file into place under a new name and points `rows` at it; returns the files freed."""
        name = new_file_name(self._dir, rows, self._plan.file_ext, taken)
        taken.add(name)
        final = os.path.join(self._dir, name)
        os.replace(enc.path, final)
        placed.append(final)
        return self._index.place(EpisodeFile(name, enc.frames, enc.nbytes, keyframes=enc.keyframes), rows)

    def _trim_for_reference(self) -> None:
        """Trims every partly overwritten file (`_trim_partly_served`) in one all-or-nothing commit. Run by `dumps`
        and `close`, not by every commit: on a ring most partly overwritten files are soon overwritten whole, and
        until then episode_index.json leaves them out (the reference raises for their rows, never misreads them)."""
        if self._read_only or not self._plan.exact:
            return
        trims = self._trim_partly_served()
        if trims:
            self._install(trims)

    def _trim_partly_served(self) -> List[Tuple[EncodedFile, np.ndarray]]:
        """New files for the rows that still read a partly overwritten file (one per run of consecutive frames, a
        run across the ring's end staying one wrapped file), so that every file serves exactly the rows its name
        says, which is how the reference `unienv` reads a directory. Lossless storages only: their frames re-encode
        bit-exactly, so no row changes value (a lossy re-encode would; such a file is kept and left out of
        episode_index.json instead). Decoded and encoded in chunks."""
        partial = {fid for fid, f in self._index.files.items() if f.refs < f.frames}
        if not partial:
            return []
        by_name = self._index.names()
        pieces = [[row, n, by_name[name], first] for row, n, name, first in self._index.runs() if by_name[name] in partial]
        cap = self._capacity
        if cap is not None:     # a run that goes on past the ring's end stays one (wrapped) file, as it was written
            heads = {(fid, first): k for k, (row, n, fid, first) in enumerate(pieces) if row == 0}
            for piece in pieces:
                k = heads.get((piece[2], piece[3] + piece[1])) if piece[0] + piece[1] == cap else None
                if k is not None and pieces[k] is not piece and pieces[k][1]:
                    piece[1] += pieces[k][1]
                    pieces[k][1] = 0
        out: List[Tuple[EncodedFile, np.ndarray]] = []
        try:
            for row, n, fid, first in pieces:
                if not n:
                    continue
                enc = self._new_encoder()
                try:
                    for k in range(0, n, _TRIM_CHUNK):
                        m = min(_TRIM_CHUNK, n - k)
                        buf = self._zeros(m)
                        self._decoders.read_file(self._index.files[fid], list(range(first + k, first + k + m)), buf,
                                                 list(range(m)))
                        for j in range(m):
                            enc.add(buf[j])
                    out.append((enc.finish(), ring_positions(row, n, cap)))
                except BaseException:
                    enc.discard()
                    raise
        except BaseException:
            for enc_file, _rows in out:
                remove_quietly(enc_file.path)
            raise
        return out

    def _settle_names(self) -> None:
        """Gives files placed under `<start>_<end>~<k>` (the plain name was still taken when they were placed) their
        plain name once it is free: link, record in the metadata, then delete the old name (a crash at any moment
        leaves every name the metadata lists present)."""
        names = sorted(n for n in self._index.names() if "~" in n)
        if not names:
            return
        settled = settle_names(self._dir, names, self._index.names())
        if not settled:
            return
        renamed = [(f, f.name) for f in self._index.files.values() if f.name in settled]
        for f, old in renamed:
            f.name = settled[old]
        try:
            self.write_metadata()
        except BaseException:
            for f, old in renamed:
                remove_quietly(os.path.join(self._dir, f.name))
                f.name = old
            raise
        for old in settled:
            remove_quietly(os.path.join(self._dir, old))

    def _delete_files(self, files: List[EpisodeFile]) -> None:
        live = set(self._index.names())
        for f in files:
            self._decoders.drop(f.uid)
            if f.name not in live:
                remove_quietly(os.path.join(self._dir, f.name))

    def _refuse_open_rows(self, pos: np.ndarray, what: str) -> None:
        if self._seg_start is None or self._seg_len == 0:
            return
        off = pos - self._seg_start
        if self._capacity is not None:
            off %= self._capacity
        mask = (off >= 0) & (off < self._seg_len)
        if mask.any():
            raise StorageStateError(
                f"cannot {what} rows {describe_rows(pos[mask])} of {type(self).__name__}: they belong to the open "
                f"(uncommitted) append-built segment starting at {self._seg_start}; call mark_segment_end() first")

    def _commit_encoder(self, enc: Optional[FrameEncoder], start: int, length: int,
                        on_finished: Optional[Any] = None) -> None:
        """Places a writer's or an append-built segment's file at `start` and records the segment. A refused commit
        (rows of the open append-built segment) leaves the encoder untouched; once the file is finished it belongs
        to this call (`on_finished()` tells the owner)."""
        encoded = self._finish_encoder(enc, start, length, on_finished)
        if encoded is not None:
            self._install_encoded(encoded, start, length)

    def _finish_encoder(self, enc: Optional[FrameEncoder], start: int, length: int,
                        on_finished: Optional[Any] = None) -> Optional[EncodedFile]:
        """Phase one of a commit: finishes the encoder's hidden temporary file for rows `[start, start + length)`
        (nothing is placed or recorded); None for an empty segment."""
        if length == 0 or enc is None:
            if enc is not None:
                enc.discard()
            if on_finished is not None:
                on_finished()
            return None
        rows = ring_positions(start, length, self._capacity)
        self._refuse_open_rows(rows, "commit over")
        if on_finished is not None:
            on_finished()
        try:
            return enc.finish()
        except BaseException:
            enc.discard()
            raise

    def _install_encoded(self, encoded: EncodedFile, start: int, length: int) -> None:
        """Phase two: renames a finished file into place for its rows and records the segment (all or nothing;
        on an error the file is deleted)."""
        if self._capacity is None and start + length > self._length:
            self._grow_to(start + length)
        self._install([(encoded, ring_positions(start, length, self._capacity))], record=(start, length))

    def has_persistent_segments(self) -> bool:
        # each commit rewrites the metadata with the segment list (reference-written directories: read-only)
        return bool(self._format_version)

    # ------------------------------------------------------------------ reads
    def get_numpy(self, index: Any) -> np.ndarray:
        """Frames at `index` as a fresh uint8 (uint16) NumPy array ((H, W, 3) / (H, W), with a leading batch axis unless the
        index is a single int); rows never written read as zeros. Rows of the open append-built segment raise
        StorageStateError until `mark_segment_end()`."""
        self._check_open()
        norm = normalize_index(index, self._length, type(self).__name__)
        if norm.single is not None:
            p = norm.single
            self._refuse_open_rows(np.array([p]), "read")
            fid = int(self._index.row_file[p])
            out = self._zeros(None)
            if fid >= 0:
                self._decoders.read_file(self._index.files[fid], [int(self._index.row_frame[p])], out[None], [0])
            return self._finish_read(out)
        pos = norm.positions()
        out = self._zeros(int(pos.size))
        if pos.size == 0:
            return out
        self._refuse_open_rows(pos, "read")
        self._decoders.read_rows(self._index, pos, out)
        return self._finish_read(out)

    # ------------------------------------------------------------------ writes
    def set(self, index: Any, value: Any) -> None:
        """Checks the frames (shape, dtype) and encodes every contiguous run of the addressed rows into one new file
        (duplicates: the last one wins). Rows of older files covered by it read the new frames; nothing becomes
        visible unless every file was written and the metadata updated."""
        self.check_writable()
        rows = self._rows_to_write(index, value)
        if rows is None:
            return
        pos, arr = rows
        self._refuse_open_rows(pos, "set")
        encoded: List[Tuple[EncodedFile, np.ndarray]] = []
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
        self.check_writable()
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
        self.check_writable()
        w = VideoSegmentWriter(self, VideoStorageHooks(self.check_writable, self._conv.convert_single,
                                                       self._new_encoder, self._finish_encoder, self._install_encoded))
        self._writers.add(w)
        return w

    # ------------------------------------------------------------------ length
    def _grow_to(self, n: int) -> None:
        self._index.resize(n)
        self._length = n
        self._meta_dirty = True

    def _grow_rows(self, new_length: int) -> None:
        """New rows are unwritten (read as zeros)."""
        self._grow_to(new_length)

    def _drop_rows(self, new_len: int) -> None:
        """Removes rows from `new_len` on (files no row reads any more are deleted, after the metadata)."""
        self.after_shrink(new_len)
        freed = self._index.resize(new_len)
        self._length = new_len
        self.write_metadata()
        self._delete_files(freed)

    def clear(self) -> None:
        """Aborts the open segment, forgets all segments, deletes every file (all rows read as zeros again) and empties
        a growable storage."""
        self.check_writable()
        self.abort_segment()
        self._segments.clear()
        freed = self._index.clear()
        if self._capacity is None:
            self._index.resize(0)
            self._length = 0
        self.write_metadata()
        self._delete_files(freed)

    # ------------------------------------------------------------------ persistence
    def dumps(self, path: PathLike) -> None:
        """Writes the committed state to `path`: its own directory only flushes the metadata; another directory gets
        copies (hard links where possible) of the files and its own metadata. An open append-built segment is not
        part of it. Dumping again into the same directory reuses files it already holds. Partly overwritten files of
        a lossless storage are first re-encoded bit-exactly into files named for the rows they still serve, so the
        reference `unienv` reads every row (one all-or-nothing commit; `_trim_for_reference`)."""
        self._check_open()
        self._trim_for_reference()
        target = self._dump_target(path)
        if target is not None:
            dump_files(self._dir, self._index, target, self._metadata, self._capacity)

    def orphan_files(self) -> List[str]:
        """Files in the directory that no row reads from (left by an interrupted write or crash); safe to delete when
        no other process is writing this storage (see `remove_orphan_files`)."""
        self._check_open()
        return orphan_names(self._dir, set(self._index.names()), self._plan.file_ext)

    def remove_orphan_files(self) -> List[str]:
        """Deletes `orphan_files()` (and temporary files of writers of this process that are still open are kept)."""
        self.check_writable()
        keep = {w.temporary_path for w in list(self._writers) if w.temporary_path is not None}
        if self._seg_encoder is not None:
            keep.add(self._seg_encoder.path)
        removed = [n for n in self.orphan_files() if os.path.join(self._dir, n) not in keep]
        for n in removed:
            remove_quietly(os.path.join(self._dir, n))
        return removed

    def close(self) -> None:
        """Drops the open append-built segment and the files of open writers (their commit then raises), trims
        partly overwritten files of a lossless storage for the reference (see `dumps`), writes pending metadata, and
        closes the decoders. Idempotent."""
        if self._closed:
            return
        try:
            self._discard_encoders()
            try:
                self._trim_for_reference()
            finally:
                if not self._read_only and self._meta_dirty:
                    self.write_metadata()
        finally:
            self._decoders.close_all()
            self._closed = True

    def _discard_encoders(self) -> None:
        enc = self._seg_encoder
        self._seg_encoder = None
        if enc is not None:
            enc.discard()
        self._seg_start, self._seg_len, self._seg_clear_rows = None, 0, 0
        for w in list(self._writers):
            w.discard_files()

    def _release(self) -> None:
        self._discard_encoders()
        self._decoders.close_all()

    # ------------------------------------------------------------------ pickling (reader processes)
    def __getstate__(self) -> Dict[str, Any]:
        self._check_open()
        return {"space": self.single_instance_space, "dir": self._dir, "meta": self._metadata(),
                "format_version": self._format_version,
                "opts": {"seek_mode": self.seek_mode, "hardware_acceleration": self.hardware_acceleration,
                         "decode_backend": self.decode_backend, "decoder_cache_size": self._decoders.size,
                         "decoder_threads": self._decoders.threads}}

    def __setstate__(self, state: Dict[str, Any]) -> None:
        space = state["space"]
        type(self)._image_shape(space)
        other = type(self)._from_metadata(state["dir"], state["meta"], "pickled VideoStorage", space, True,
                                          state["opts"])
        self.__dict__.update(other.__dict__)
        self._format_version = state["format_version"]
        other.__dict__.clear()  # its decoders (none) and encoders (none) are self's now: its collection frees nothing


def video_storages_in(storage: Optional[SpaceStorage]) -> List[VideoStorage]:
    """Every `VideoStorage` in the tree of `storage` (itself, or reached through `child_storages()`: a
    `DictStorage`'s keys, a wrapper's inner storage), in tree order; `[]` for None."""
    found: List[VideoStorage] = []
    stack: List[SpaceStorage] = [] if storage is None else [storage]
    while stack:
        st = stack.pop()
        if isinstance(st, VideoStorage):
            found.append(st)
        else:
            stack.extend(reversed(st.child_storages()))
    return found


__all__ = ["VideoStorage", "video_storages_in", "VideoSegmentWriter", "CodecPlan", "select_codec", "METADATA_FILE", "REFERENCE_INDEX_FILE",
           "DEFAULT_GOP"]
