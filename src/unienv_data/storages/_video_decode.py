"""How `VideoStorage` reads frames back from its video files, on PyAV (FFmpeg): `FrameDecoder` (one open file, frames
by number) and `DecoderCache` (the open decoders of a storage directory, and batch reads over its files).

Reading frame k seeks to the last keyframe at or before k (recorded while the file was written) and decodes forward,
or keeps decoding forward when the open decoder is already in that stretch, so random access is exact. Packets of
frames nobody asked for are decoded with ``skip_frame="NONREF"`` (H.264): a B-frame no other frame refers to is then
dropped instead of decoded. Only the frames asked for are converted to RGB, by one reused converter per decoder.

A batch read sorts the frames per file and decodes each file once, forward. Files are decoded in parallel threads
(decoding releases the GIL) that share the work with the calling thread (`share_work`); when a batch touches fewer
files than there are threads, long runs of one file are cut at keyframes into parts decoded by separate decoders of
that file, so a slice uses the threads too: runs of a few dozen frames where frames are costly to decode (intra-only
files, large frames), only runs of several hundred small inter-coded frames (see `min_split_frames`).

PyAV is imported on first use only.
"""
from __future__ import annotations

import os
import threading
from bisect import bisect_right
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor, wait
from fractions import Fraction
from typing import Any, Callable, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from unienv_data.base.errors import StorageFormatError, StorageNotFoundError

from . import _episode_files
from ._episode_files import copy_repeats
from ._video_codec import (_RGB_FORMATS, CONTAINERS, GRAY16_FORMATS, GRAY16_NATIVE, SLICED_CODECS, _av, _reformatter,
                            hold_av)
from ._video_index import EpisodeFile, RunFileIndex

#: slice threads of a decoder of a `SLICED_CODECS` file by default (128x128 FFV1: 760 f/s on one thread, 1,190 f/s
#: with two slice threads on 2 cores)
SLICE_DECODE_THREADS = 4
#: idle decoders kept per file (more than one lets parts of a long run of one file decode in parallel)
DECODERS_PER_FILE = 4
#: A run of one file is cut into parts for parallel threads only if every part keeps at least this many frames of
#: 128x128 inter-coded video (`MIN_SPLIT_FRAMES_COSTLY` for costlier frames, see `min_split_frames`). Such frames decode in ~0.1 ms,
#: so two threads on one file mostly trade the GIL back and forth: measured on 2 cores (H.264, GOP 10), a 64-frame
#: slice read at 7,700 f/s on one thread and 7,800 f/s cut in two (at 1.5x the CPU time); at 256x256 a cut made a
#: 64-frame slice 1.15x faster, and for FFV1 (every frame a keyframe, ~0.8 ms each at 128x128) 1.6x faster.
MIN_SPLIT_FRAMES = 128
#: The least frames per part for frames that cost more to decode (intra-only files, large frames).
MIN_SPLIT_FRAMES_COSTLY = 16
_REFERENCE_PIXELS = 128 * 128


def min_split_frames(file: EpisodeFile, pixels: int) -> int:
    """The least frames each part of a cut run of `file` keeps: `MIN_SPLIT_FRAMES_COSTLY` when frames are costly to
    decode (an intra-only file, or frames of at least twice 128x128 `pixels`), else `MIN_SPLIT_FRAMES`."""
    kf = file.keyframes
    costly = (kf is not None and len(kf) >= file.frames) or pixels >= 2 * _REFERENCE_PIXELS
    return MIN_SPLIT_FRAMES_COSTLY if costly else MIN_SPLIT_FRAMES


class FrameDecoder:
    """An open video file positioned somewhere in its stream; reads frames by number, exactly."""

    def __init__(self, path: str, file: EpisodeFile, shape: Tuple[int, int, int], fps: Fraction,
                 threads: Optional[int], container_format: Optional[str] = None) -> None:
        av = _av()
        self.path = path
        self.file = file
        try:
            self._container = av.open(path, "r", format=container_format)
        except FileNotFoundError:
            raise StorageNotFoundError(f"video file {path} listed in the metadata is missing") from None
        except av.error.FFmpegError as exc:
            raise StorageFormatError(f"video file {path} cannot be opened ({exc}): it is damaged") from None
        hold_av(self)
        try:
            streams = self._container.streams.video
            if not streams:
                raise StorageFormatError(f"video file {path} holds no video stream")
            self._stream = streams[0]
            cc = self._stream.codec_context
            if threads is None:             # automatic: slice threads where frames are coded in slices
                threads = min(SLICE_DECODE_THREADS, os.cpu_count() or 1) if cc.name in SLICED_CODECS else 1
                if threads > 1:
                    cc.thread_type = "SLICE"
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
        # H.264 decodes every packet the caller does not want with skip_frame="NONREF": a frame no other frame
        # refers to (most B-frames) is then dropped instead of decoded. Which frames were fed that way since the
        # last seek is remembered, so a later read of one of them seeks instead of decoding forward past it.
        self._cc = self._stream.codec_context
        self._skip_nonref = self._cc.name == "h264"
        self._skip_mode = "DEFAULT"
        self._wanted: "set[int]" = set()
        self._maybe_skipped: "set[int]" = set()
        self._formats_ok: "set[Tuple[str, str]]" = set()

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
        self._iter = self._frames()
        self.next_index = -1
        self._maybe_skipped.clear()

    def _frames(self) -> Any:
        """Decoded frames from the current position: `container.decode` with the per-packet frame skipping."""
        cc, container, stream = self._cc, self._container, self._stream
        to_index = self._pts_to_index
        for packet in container.demux(stream):
            if self._skip_nonref:
                pts = packet.pts
                mode = "DEFAULT"
                if pts is not None:
                    idx = int(round(pts * to_index))
                    if idx not in self._wanted:
                        mode = "NONREF"
                        self._maybe_skipped.add(idx)
                if mode != self._skip_mode:
                    cc.skip_frame = mode
                    self._skip_mode = mode
            yield from cc.decode(packet)

    def _check_depth(self, name: str, dst: np.ndarray) -> None:
        """uint16 frames are read from 16-bit gray files only, and 16-bit gray files into uint16 frames only:
        StorageFormatError otherwise (a conversion would scale 8-bit values up or cut 16-bit ones down)."""
        key = (name, dst.dtype.str)
        if key in self._formats_ok:
            return
        if (dst.dtype == np.uint16) != (name in GRAY16_FORMATS):
            raise StorageFormatError(f"video file {self.path} holds {name} frames, which cannot be read as "
                                     f"{dst.dtype} frames exactly (uint16 frames need a file pixel format of "
                                     f"{list(GRAY16_FORMATS)}, uint8 frames an 8-bit one)")
        self._formats_ok.add(key)

    def _convert_into(self, frame: Any, dst: np.ndarray) -> None:
        """Writes the decoded `frame` into `dst` as RGB, gray or (uint16 `dst`) 16-bit gray in this machine's byte
        order: converted by the reused converter, then copied straight from the converted frame's buffer (one copy;
        `to_ndarray` would add a second)."""
        name = frame.format.name
        self._check_depth(name, dst)
        # gray frames kept in an RGB file: every channel holds the value (exact codecs); G is the best kept one
        green = self._gray and name in _RGB_FORMATS
        if dst.dtype == np.uint16:
            target = GRAY16_NATIVE  # gray16le <-> gray16be is a byte swap (exact)
        else:
            target = "gray" if self._gray and not green else "rgb24"
        if name != target:
            frame = self._rf.reformat(frame, format=target, threads=1)
        if green or not dst.flags.c_contiguous:
            arr = frame.to_ndarray()
            dst[...] = (arr[:, :, 1] if green else arr).reshape(dst.shape)
            return
        plane, h = frame.planes[0], frame.height
        row = dst.nbytes // h  # bytes of one packed row: width x (3 or 1) x bytes per value
        src = np.frombuffer(plane, np.uint8)
        if plane.line_size == row:
            src = src[:h * row].reshape(h, row)
        else:  # rows padded for alignment
            src = src[:h * plane.line_size].reshape(h, plane.line_size)[:, :row]
        dst.reshape(-1).view(np.uint8).reshape(h, row)[...] = src

    def read(self, frames: Sequence[int], out: np.ndarray, rows: Sequence[int]) -> None:
        """Writes frame `frames[j]` into `out[rows[j]]`; `frames` must be increasing."""
        self._wanted = set(frames)
        for j, k in enumerate(frames):
            if not 0 <= k < self.file.frames:
                raise StorageFormatError(f"{self.path}: frame {k} requested but the file holds {self.file.frames}")
            kf = self._keyframe_before(k)
            reachable = (self._iter is not None or self.next_index == 0) and k not in self._maybe_skipped
            if kf is None:
                forward = reachable and 0 <= self.next_index <= k <= self.next_index + self._gop_guess
            else:
                forward = reachable and kf <= self.next_index <= k
            if not forward:
                self._seek(k)
            elif self._iter is None:
                self._iter = self._frames()
            self._convert_into(self._decode_until(k, can_restart=not forward), out[rows[j]])

    def _decode_until(self, k: int, can_restart: bool) -> Any:
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
            self._maybe_skipped.discard(idx)
            if idx == k:
                return frame
            if idx > k:
                if can_restart:
                    # the container's seek index landed past the keyframe: decode from the very start instead
                    self._container.seek(0, backward=True, any_frame=False, stream=self._stream)
                    self._iter = self._frames()
                    self.next_index = -1
                    self._maybe_skipped.clear()
                    can_restart = False
                    continue
                raise StorageFormatError(f"{self.path}: frame {k} is missing (decoding went from frame "
                                         f"{idx - 1 if idx else 0} to {idx})")


# ---------------------------------------------------------------------------------------------------- threads
_POOL: Optional[ThreadPoolExecutor] = None
_POOL_PID = -1
_POOL_SIZE = 0      # the pool's max_workers
_POOL_LOCK = threading.Lock()
_POOL_PREFIX = "unienv-video-decode"


def _forget_pool_after_fork() -> None:
    """In a forked child: the parent's pool threads do not exist here, and `_POOL_LOCK` may have been held by one
    of the parent's threads at fork time (it would never be released): start from a new lock and no pool."""
    global _POOL, _POOL_PID, _POOL_SIZE, _POOL_LOCK
    _POOL, _POOL_PID, _POOL_SIZE, _POOL_LOCK = None, -1, 0, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool_after_fork)


def _helpers(n: int) -> ThreadPoolExecutor:
    global _POOL, _POOL_PID, _POOL_SIZE
    with _POOL_LOCK:
        if _POOL is None or _POOL_PID != os.getpid() or _POOL_SIZE < n:
            if _POOL is not None and _POOL_PID == os.getpid():
                _POOL.shutdown(wait=False)  # IO_WORKERS grew: a larger pool replaces it
            _POOL = ThreadPoolExecutor(max_workers=n, thread_name_prefix=_POOL_PREFIX)
            _POOL_PID, _POOL_SIZE = os.getpid(), n
        return _POOL


def share_work(fn: Callable[[Any], None], items: List[Any], workers: int) -> None:
    """Calls `fn(x)` for every item, on the calling thread and up to `workers - 1` helper threads that all take the
    next item from one shared list until none is left. The caller never waits idle while items remain: on a busy
    machine, where a helper gets a core late or not at all, the caller simply does (nearly) all the work itself, and
    on idle cores the helpers take their share. After an error no new item is started; the first error is raised
    once every started item has finished."""
    if len(items) < 2 or workers <= 1 or threading.current_thread().name.startswith(_POOL_PREFIX):
        for x in items:
            fn(x)
        return
    lock = threading.Lock()
    pending: Iterator[Any] = iter(items)
    failed: List[BaseException] = []

    def drain() -> None:
        while not failed:
            with lock:
                x = next(pending, _pending_end)
            if x is _pending_end:
                return
            try:
                fn(x)
            except BaseException as exc:  # noqa: BLE001 - re-raised by the caller
                failed.append(exc)
                return

    n = min(workers - 1, len(items) - 1)
    pool = _helpers(n)
    futures = [pool.submit(drain) for _ in range(n)]
    drain()
    wait(futures)
    if failed:
        raise failed[0]


_pending_end = object()


# ---------------------------------------------------------------------------------------------------- decoder cache
Part = Tuple[EpisodeFile, np.ndarray, np.ndarray]  #: (file, increasing frame numbers, destination rows)


def _cut(part: Part, pixels: int) -> Optional[Tuple[Part, Part]]:
    """`part` cut in two at a keyframe near its middle (each half keeps at least `min_split_frames` frames), so the
    second half decodes from that keyframe without re-decoding anything of the first; None when there is no such
    place (unknown keyframes, too few frames)."""
    file, frames, rows = part
    n = frames.size
    least = min_split_frames(file, pixels)
    if file.keyframes is None or n < 2 * least:
        return None
    gop = np.searchsorted(np.asarray(file.keyframes), frames, side="right")  # which keyframe stretch each frame is in
    cuts = np.flatnonzero(gop[1:] > gop[:-1]) + 1
    cuts = cuts[(cuts >= least) & (cuts <= n - least)]
    if not cuts.size:
        return None
    c = int(cuts[np.argmin(np.abs(cuts - n / 2))])
    return (file, frames[:c], rows[:c]), (file, frames[c:], rows[c:])


def split_for_threads(parts: List[Part], workers: int, pixels: int = _REFERENCE_PIXELS) -> List[Part]:
    """While there are fewer parts than `workers`, cuts the longest part that can be cut (see `_cut`; `pixels`:
    pixels per frame)."""
    parts = list(parts)
    blocked: set = set()
    while len(parts) < workers:
        order = sorted((k for k in range(len(parts)) if k not in blocked), key=lambda k: -parts[k][1].size)
        if not order:
            break
        k = order[0]
        halves = _cut(parts[k], pixels)
        if halves is None:
            blocked.add(k)
            continue
        parts[k:k + 1] = list(halves)
        blocked = {b if b < k else b + 1 for b in blocked}
    return parts


class DecoderCache:
    """Decoders of recently read files of one storage directory, kept open for the next read: at most `size` in all
    (the least recently used file's closed first; `size` 0 closes each after use) and `DECODERS_PER_FILE` per file. A
    decoder is taken out while it reads, so two threads never share one. After `close_all()` every decoder is closed
    after use."""

    def __init__(self, directory: str, shape: Tuple[int, int, int], fps: Fraction, size: int,
                 threads: Optional[int]) -> None:
        self._dir = directory
        self._shape = shape
        self._fps = fps
        self.size = size
        self.threads = threads
        self._open: "OrderedDict[str, List[FrameDecoder]]" = OrderedDict()
        self._count = 0
        self._lock = threading.Lock()
        self._closed = False
        self._pid = os.getpid()

    def __len__(self) -> int:
        self._forget_inherited()
        return self._count

    def _forget_inherited(self) -> None:
        """In a forked child (DataLoader workers), forgets the decoders opened by the parent without touching them:
        their open files share one file offset with the parent and every sibling, so a read through one moves the
        others' position (reads then failed with 'the video ends before frame N'). The child opens its own. (They
        are not freed either: `_video_codec` keeps every inherited container holder alive in a child.)"""
        if self._pid != os.getpid():
            self._pid = os.getpid()
            self._lock = threading.Lock()       # a lock another thread held at fork time stays held in the child
            self._open = OrderedDict()
            self._count = 0

    def _acquire(self, file: EpisodeFile, first: int) -> FrameDecoder:
        """An idle decoder of `file` (preferably one already positioned at or before frame `first`), or a new one."""
        self._forget_inherited()
        dec: Optional[FrameDecoder] = None
        with self._lock:
            idle = self._open.get(file.uid)
            if idle:
                ahead = [j for j, d in enumerate(idle) if 0 <= d.next_index <= first]
                j = max(ahead, key=lambda j: idle[j].next_index) if ahead else len(idle) - 1
                dec = idle.pop(j)
                self._count -= 1
                if not idle:
                    del self._open[file.uid]
        if dec is None:
            dec = FrameDecoder(os.path.join(self._dir, file.name), file, self._shape, self._fps, self.threads,
                               CONTAINERS.get(file.name.rsplit(".", 1)[-1]))
        return dec

    def _release(self, dec: FrameDecoder) -> None:
        self._forget_inherited()
        if self.size == 0 or self._closed:
            dec.close()
            return
        evicted: List[FrameDecoder] = []
        with self._lock:
            idle = self._open.setdefault(dec.file.uid, [])
            self._open.move_to_end(dec.file.uid)
            idle.append(dec)
            self._count += 1
            if len(idle) > DECODERS_PER_FILE:
                evicted.append(idle.pop(0))
                self._count -= 1
            while self._count > self.size:
                uid, oldest = next(iter(self._open.items()))
                evicted.append(oldest.pop(0))
                self._count -= 1
                if not oldest:
                    del self._open[uid]
        for d in evicted:
            d.close()

    def drop(self, uid: str) -> None:
        """Closes the decoders of the file with content id `uid` (the file is going away)."""
        self._forget_inherited()
        with self._lock:
            decs = self._open.pop(uid, [])
            self._count -= len(decs)
        for d in decs:
            d.close()

    def close_all(self) -> None:
        """Closes every open decoder; later reads close theirs after use."""
        self._forget_inherited()
        self._closed = True
        with self._lock:
            decs = [d for idle in self._open.values() for d in idle]
            self._open.clear()
            self._count = 0
        for d in decs:
            d.close()

    def read_file(self, file: EpisodeFile, frames: Sequence[int], out: np.ndarray, rows: Sequence[int]) -> None:
        """Writes frame `frames[j]` of `file` into `out[rows[j]]`; `frames` must be increasing."""
        dec = self._acquire(file, int(frames[0]) if len(frames) else 0)
        try:
            dec.read(frames, out, rows)
        except BaseException:
            dec.close()
            raise
        self._release(dec)

    def read_rows(self, index: RunFileIndex, pos: np.ndarray, out: np.ndarray) -> None:
        """Writes the frame physical row `pos[k]` reads into `out[k]`, leaving unwritten rows alone: each frame is
        decoded once, each file forward; files (and parts of long runs, see `split_for_threads`) in parallel threads."""
        fids = index.row_file[pos]
        frames = index.row_frame[pos]
        sel = np.flatnonzero(fids >= 0)
        if not sel.size:
            return
        order = sel[np.lexsort((frames[sel], fids[sel]))]
        f_sorted = fids[order]
        cuts = np.flatnonzero(np.diff(f_sorted)) + 1
        groups = np.split(order, cuts)
        parts: List[Part] = []
        repeats = []
        for g in groups:
            uniq, first, inverse = np.unique(frames[g], return_index=True, return_inverse=True)
            parts.append((index.files[int(fids[g[0]])], uniq, g[first]))
            repeats.append((g, first, inverse))
        workers = _episode_files.IO_WORKERS
        parts = split_for_threads(parts, workers, self._shape[0] * self._shape[1])
        parts.sort(key=lambda p: -int(p[1].size))  # longest first: the threads finish at about the same time

        def run(part: Part) -> None:
            file, uniq, rows = part
            self.read_file(file, uniq.tolist(), out, rows.tolist())  # each frame decoded once, in place

        share_work(run, parts, workers)
        for g, first, inverse in repeats:
            copy_repeats(out, g, first, inverse)


__all__ = ["FrameDecoder", "DecoderCache", "split_for_threads", "min_split_frames", "share_work", "DECODERS_PER_FILE",
           "MIN_SPLIT_FRAMES", "MIN_SPLIT_FRAMES_COSTLY"]
