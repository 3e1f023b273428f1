"""Frames of a LeRobot `video` camera, read through this project's own video read path
(`storages._video_decode.DecoderCache`): a batch is sorted per file and each file decoded once, forward, files in
parallel threads, decoders kept open between batches.

LeRobot's files are not written by `VideoStorage`, so what that path needs to know about a file (its frame count and
keyframes) is learned the first time the file is read, by demuxing its packets (no decoding). That scan also finds
a missing or truncated file before any frame is decoded, and names it in a `StorageFormatError`.
"""
from __future__ import annotations

import os
import threading
from fractions import Fraction
from typing import Dict, List, Optional, Tuple

import numpy as np

from unienv_data.base.errors import StorageFormatError, StorageNotFoundError
from unienv_data.storages._video_codec import _av
from unienv_data.storages._video_decode import DecoderCache
from unienv_data.storages._video_index import EpisodeFile, RunFileIndex

#: open decoders kept per camera between reads
DECODERS_KEPT = 16


def scan_video(path: str, fps: int) -> Tuple[np.ndarray, List[int]]:
    """`(frame numbers, keyframe numbers)` of the first video stream of `path` (sorted), from its packets'
    timestamps at `fps`."""
    av = _av()
    if not os.path.isfile(path):
        raise StorageNotFoundError(f"video file {path} is missing: the LeRobot dataset is incomplete")
    try:
        with av.open(path, "r") as container:
            if not container.streams.video:
                raise StorageFormatError(f"video file {path} holds no video stream")
            stream = container.streams.video[0]
            scale = float(stream.time_base * fps)
            frames: List[int] = []
            keys: List[int] = []
            for packet in container.demux(stream):
                if packet.pts is None or packet.size == 0:
                    continue
                k = int(round(packet.pts * scale))
                frames.append(k)
                if packet.is_keyframe:
                    keys.append(k)
    except av.error.FFmpegError as exc:
        raise StorageFormatError(f"video file {path} cannot be read ({exc}): it is truncated or damaged") from None
    if not frames:
        raise StorageFormatError(f"video file {path} holds no frames: it is truncated or damaged")
    return np.unique(np.asarray(frames, np.int64)), sorted(set(keys)) or [0]


class CameraFrames:
    """The frames of one video camera: row -> (file, frame number), read in batches through a `DecoderCache`."""

    def __init__(self, root: str, key: str, hwc: Tuple[int, int, int], fps: int, files: List[str],
                 file_of_row: np.ndarray, frame_of_row: np.ndarray, threads: Optional[int] = None) -> None:
        self.root = root
        self.key = key
        self.hwc = hwc
        self.fps = fps
        self._index = RunFileIndex(int(file_of_row.shape[0]))
        self._index.row_file[:] = file_of_row
        self._index.row_frame[:] = frame_of_row
        self._files: Dict[int, EpisodeFile] = {}
        for fid, rel in enumerate(files):
            # frames 0 until scanned: `_ensure_scanned` fills in the frame count and keyframes before any read
            self._files[fid] = EpisodeFile(rel, 0, 0, uid=rel)
        self._index.files = dict(self._files)
        self._scanned: Dict[int, bool] = {}
        self._threads = threads
        self._lock = threading.Lock()
        self._cache = self._new_cache()
        self._pid = os.getpid()

    def _new_cache(self) -> DecoderCache:
        return DecoderCache(self.root, self.hwc, Fraction(self.fps), DECODERS_KEPT, self._threads)

    def __getstate__(self) -> Dict[str, object]:
        # sent to another process (DataLoader workers, spawn): open decoders and the lock stay behind
        state = dict(self.__dict__)
        del state["_cache"], state["_lock"]
        return state

    def __setstate__(self, state: Dict[str, object]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
        self._cache = self._new_cache()
        self._pid = os.getpid()

    def _ensure_scanned(self, fids: np.ndarray) -> None:
        for fid in np.unique(fids).tolist():
            if self._scanned.get(fid):
                continue
            with self._lock:
                if self._scanned.get(fid):
                    continue
                f = self._files[fid]
                path = os.path.join(self.root, f.name)
                present, keys = scan_video(path, self.fps)
                used = np.unique(self._index.row_frame[self._index.row_file == fid])
                absent = used[~np.isin(used, present)]
                if absent.size:
                    raise StorageFormatError(
                        f"video file {path} holds {present.size} frames (numbers {int(present[0])}..."
                        f"{int(present[-1])} at {self.fps} fps), but the dataset's rows of {self.key!r} need frame "
                        f"{int(absent[0])}: the file is truncated or the episode metadata does not match it")
                f.frames, f.keyframes, f.nbytes = int(present[-1]) + 1, keys, os.path.getsize(path)
                self._scanned[fid] = True

    def read(self, rows: np.ndarray, out: np.ndarray) -> None:
        """Writes the frame of row `rows[j]` into `out[j]` (uint8, HWC)."""
        if not rows.size:
            return
        if self._pid != os.getpid():
            # a forked child (DataLoader workers): the parent's open decoders are not shared, each process opens its own
            self._lock = threading.Lock()
            self._cache = self._new_cache()
            self._pid = os.getpid()
        self._ensure_scanned(self._index.row_file[rows])
        # `read_rows` takes physical rows of the index: the dataset's rows are those
        self._cache.read_rows(self._index, rows, out)

    def close(self) -> None:
        self._cache.close_all()


__all__ = ["CameraFrames", "scan_video", "DECODERS_KEPT"]
