"""The on-disk layout of a `VideoStorage` directory: checking the metadata file of a directory being opened (and the
episode index of one written by the reference `unienv`), the sizes of the files it lists, names for new files,
orphan files, and the file copies of `dumps` into another directory.

Layout of the storage directory::

    video_metadata.json     configuration, length, segments, and the episode index: every file (frames, bytes,
                            keyframes, content id) and which rows read which frames ("runs")
    <start>_<end>.<ext>     one video per committed segment / written run, rows start..end inclusive (end < start
                            when the run wraps the ring); "<start>_<end>~<k>.<ext>" when that name is still in use
    .active-*.tmp.<ext>     files being encoded; never listed in the metadata, ignored by loads
    episode_index.json      for the reference `unienv`: `{"file_ranges": [[start, end], ...]}` of the files that
                            serve exactly the rows their plain `<start>_<end>` name says (written after the metadata)

The reference reads a file named `<start>_<end>` as frames 0.. of rows start..end. A file here may serve fewer rows
(partly overwritten) or carry a `~<k>` name; `reference_ranges` leaves those out of `episode_index.json`, so the
reference never reads them (it raises for their rows instead of reading wrong frames). `dumps` / `close` trim partly
overwritten files of lossless storages, and `~<k>` files take their plain name once it is free (`settle_names`), so
after a dump every row of a lossless storage is listed.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from unienv_data.base.errors import StorageFormatError, StorageNotFoundError
from unienv_data.base.files import atomic_write_json, confined_path, read_json, require_fields
from unienv_data.base.segments import SegmentLog
from unienv_data.base.ring import run_length
from unienv_interface.space import Space

from ._episode_files import (check_capacity, check_count, check_rows_fields, check_stored_shape, is_temp_name,
                             place_copy, remove_quietly, ring_positions)
from ._video_codec import CONTAINERS, CodecPlan, fps_fraction, is_exact_file
from ._video_index import EpisodeFile, RunFileIndex

METADATA_FILE = "video_metadata.json"
REFERENCE_INDEX_FILE = "episode_index.json"
#: fields every metadata file of this package holds
METADATA_FIELDS = ("storage_type", "codec", "file_ext", "fps", "file_pixel_format", "shape", "dtype", "capacity",
                   "length", "files", "runs", "segments", "gop_size", "encoder_options", "lossless")


@dataclass
class VideoLayout:
    """What the metadata of a storage directory describes."""

    plan: CodecPlan
    fps: Any
    capacity: Optional[int]
    length: int
    index: RunFileIndex
    segments: SegmentLog
    selection: Optional[Dict[str, Any]]


def parse_metadata(directory: str, meta: Dict[str, Any], where: str, space: Space) -> VideoLayout:
    """Checks metadata (its `METADATA_FIELDS` present, its storage type checked by the caller) against `space`;
    StorageFormatError names what is damaged, ValueError what does not match the space."""
    check_stored_shape(meta, space, directory, "frames")
    cap, length = check_rows_fields(meta, where)
    ext = meta["file_ext"]
    if not isinstance(ext, str) or ext not in CONTAINERS:
        raise StorageFormatError(f"{where}: unknown file_ext {ext!r}")
    opt = meta["encoder_options"]
    if not isinstance(opt, dict) or not isinstance(meta["codec"], str) or not isinstance(meta["file_pixel_format"], str):
        raise StorageFormatError(f"{where}: invalid codec description")
    try:
        fps_fraction(meta["fps"])
        gop = check_count(meta["gop_size"], "gop_size", minimum=1)
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
    return VideoLayout(plan, meta["fps"], cap, length, index, segments, sel if isinstance(sel, dict) else None)


def parse_reference(directory: str, meta: Dict[str, Any], where: str, capacity: Any) -> VideoLayout:
    """The layout of a directory written by the reference `unienv` (no format_version): its files are listed in
    `episode_index.json` as `[start, end]` row ranges; their keyframes are unknown (every read seeks)."""
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
        n = run_length(s, e, cap)
        if n <= 0:
            raise StorageFormatError(f"{index_path}: entry {i} = {item!r} has end before start")
        name = f"{s}_{e}.{ext}"
        full = confined_path(directory, name, index_path)
        if not os.path.isfile(full):
            raise StorageNotFoundError(f"video file {full} listed in {index_path} is missing")
        index.place(EpisodeFile(name, n, os.path.getsize(full), keyframes=None), ring_positions(s, n, cap))
        segments.add(s, n)
    codec = str(meta.get("codec_base") or "h264")
    pix = str(meta.get("file_pixel_format") or "yuv420p")
    plan = CodecPlan(codec, pix, (), is_exact_file(codec, pix), 1, ext if ext in CONTAINERS else "mp4")
    return VideoLayout(plan, meta["fps"], cap, length, index, segments,
                       {"requested": "reference", "chosen": codec, "tried": []})


def verify_files(directory: str, index: RunFileIndex, meta_path: str) -> None:
    """Every file the index lists exists with the size recorded when it was written."""
    for f in index.files.values():
        full = os.path.join(directory, f.name)
        try:
            size = os.path.getsize(full)
        except OSError:
            raise StorageNotFoundError(f"video file {full} listed in {meta_path} is missing") from None
        if size != f.nbytes:
            state = "truncated" if size < f.nbytes else "changed"
            raise StorageFormatError(f"video file {full} is {state}: it holds {size} bytes, the metadata recorded "
                                     f"{f.nbytes} when it was written")


def new_file_name(directory: str, rows: np.ndarray, ext: str, taken: set) -> str:
    """`<first row>_<last row>.<ext>`, or `...~<k>.<ext>` when that name is `taken` or already in the directory."""
    stem = f"{int(rows[0])}_{int(rows[-1])}"
    name, k = f"{stem}.{ext}", 0
    while name in taken or os.path.exists(os.path.join(directory, name)):
        k += 1
        name = f"{stem}~{k}.{ext}"
    return name


def plain_name(name: str) -> str:
    """`<start>_<end>.<ext>` of a file name that may carry a `~<k>` suffix."""
    stem, ext = name.rsplit(".", 1)
    return f"{stem.split('~')[0]}.{ext}"


def reference_ranges(index: RunFileIndex, capacity: Optional[int]) -> List[List[int]]:
    """`[[start, end], ...]` (sorted by start) of the files the reference reads correctly: every frame still served
    by the rows its plain name `<start>_<end>` says. A file is placed on consecutive rows named by the first and last
    (frame k on the k-th row) and a row only ever leaves it, so it serves all of them while every frame has a row."""
    out: List[List[int]] = []
    for f in index.files.values():
        if f.refs != f.frames or "~" in f.name:
            continue
        try:
            s, e = (int(v) for v in f.name.rsplit(".", 1)[0].split("_"))
        except ValueError:
            continue
        if run_length(s, e, capacity) == f.frames:
            out.append([s, e])
    return sorted(out)


def write_reference_index(directory: str, index: RunFileIndex, capacity: Optional[int]) -> None:
    """Writes `episode_index.json` (atomically) listing `reference_ranges`: the reference reads only the files it
    lists (when they all exist) instead of every `*_*.<ext>` file of the directory."""
    atomic_write_json(os.path.join(directory, REFERENCE_INDEX_FILE),
                      {"file_ranges": reference_ranges(index, capacity)})


def settle_names(directory: str, names: List[str], live: Any) -> Dict[str, str]:
    """For each `~<k>` name of `names` whose plain name no file of `live` uses: links (copies where links are
    refused) the file to its plain name, replacing a leftover there that no row reads. Returns `{old: plain}` of
    the files now present under both names; the caller records the plain names (metadata) and then deletes the old
    ones, so a crash at any moment leaves every listed name present."""
    done: Dict[str, str] = {}
    for name in names:
        plain = plain_name(name)
        if plain == name or plain in live or plain in done.values():
            continue
        try:
            place_copy(os.path.join(directory, name), os.path.join(directory, plain))
        except OSError:
            continue    # keeps its `~<k>` name (left out of episode_index.json)
        done[name] = plain
    return done


def orphan_names(directory: str, live: Any, ext: str) -> List[str]:
    """Video and temporary files of the directory that are not in `live` (the files rows read from)."""
    return sorted(n for n in os.listdir(directory)
                  if n not in live and n != METADATA_FILE and (n.endswith("." + ext) or is_temp_name(n)))


def dump_files(directory: str, index: RunFileIndex, target: str,
               metadata: Callable[[Dict[str, str]], Dict[str, Any]], capacity: Optional[int]) -> None:
    """Copies (hard-links where possible) the files of `index` from `directory` into the directory `target`, then
    writes `metadata(rename)` there (`rename`: file name here -> name there) and deletes the files an earlier dump
    left there that the new metadata does not list. Files already there with the same content and size are reused.
    A file copied under a `~<k>` name (its plain name was taken by an earlier dump's file) is given its plain name
    once that file is gone; `episode_index.json` is written last."""
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
    for f in sorted(index.files.values(), key=lambda x: x.name):
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
            place_copy(os.path.join(directory, f.name), os.path.join(target, name))
        rename[f.name] = name
        used.add(name)
    atomic_write_json(old_meta_path, metadata(rename))
    for name in old_files:
        if name not in used:
            remove_quietly(os.path.join(target, name))
    settled = settle_names(target, sorted(used), used)
    if settled:
        rename = {k: settled.get(v, v) for k, v in rename.items()}
        atomic_write_json(old_meta_path, metadata(rename))
        for name in settled:
            remove_quietly(os.path.join(target, name))
    there = RunFileIndex(index.n_rows)
    there.row_file, there.row_frame = index.row_file, index.row_frame
    for fid, f in index.files.items():
        there.files[fid] = EpisodeFile(rename[f.name], f.frames, f.nbytes, f.uid, f.keyframes, f.refs)
    write_reference_index(target, there, capacity)


__all__ = ["METADATA_FILE", "REFERENCE_INDEX_FILE", "METADATA_FIELDS", "VideoLayout", "parse_metadata",
           "parse_reference", "verify_files", "new_file_name", "plain_name", "reference_ranges", "write_reference_index",
           "settle_names", "orphan_names", "dump_files"]
