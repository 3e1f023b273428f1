"""Helpers shared by the storages that keep rows in files of their own (`VideoStorage`: one file per written run,
`ImageStorage`: one file per row): optional imports, image-space checks, new directories, temporary files, atomic
placement of files, run arithmetic, and `RunFileIndex`, the map from physical rows to `(file, frame)`.

Files are never modified in place: a file is written under a hidden temporary name and renamed into place, so
hard links (used by `dumps` into another directory) never see a later change.
"""
from __future__ import annotations

import importlib
import os
import shutil
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple, TypeVar

import numpy as np

from unienv_data.base.errors import StorageFormatError
from unienv_interface.space import BoxSpace, Space

T = TypeVar("T")
R = TypeVar("R")

#: Prefix of the hidden temporary files a storage writes before renaming them into place; loads ignore them.
TEMP_PREFIX = ".active-"


# ---------------------------------------------------------------------------------------------------- imports
def import_optional(module: str, extra: str, user: str) -> ModuleType:
    """Imports `module`, or raises ModuleNotFoundError telling which extra of this package provides it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ModuleNotFoundError(
            f"{user} needs the '{module}' package; install the extra: pip install 'unienv-storage[{extra}]' "
            f"({exc})") from exc


# ---------------------------------------------------------------------------------------------------- arguments
def check_capacity(capacity: Any) -> Optional[int]:
    """A positive int capacity, or None (growable)."""
    if capacity is None:
        return None
    if isinstance(capacity, (bool, np.bool_)) or not isinstance(capacity, (int, np.integer)) or int(capacity) <= 0:
        raise ValueError(f"capacity must be a positive int or None (growable), got {capacity!r}")
    return int(capacity)


def image_shape(space: Any, user: str) -> Tuple[int, int, int]:
    """`(height, width, channels)` of an image space: a uint8 BoxSpace of shape (H, W, 3) (RGB), or (H, W) or
    (H, W, 1) (grayscale, channels 1; values keep the space's own shape).

    Anything else raises TypeError (not a Box) or ValueError (wrong dtype or shape), naming what is expected."""
    expected = "a uint8 BoxSpace of shape (H, W, 3) (RGB), (H, W) or (H, W, 1) (grayscale)"
    if not isinstance(space, Space):
        raise TypeError(f"{user} stores images: expected {expected}, got {type(space).__name__}")
    if not isinstance(space, BoxSpace):
        raise TypeError(f"{user} stores images: expected {expected}, got a {type(space).__name__}")
    dtype_name = space.backend.dtype_name(space.dtype)
    if dtype_name != "uint8":
        raise ValueError(f"{user} stores images: expected {expected}, got dtype {dtype_name} "
                         "(convert frames to uint8, or store them in an array storage)")
    shape = tuple(int(d) for d in space.shape)
    if len(shape) == 3 and shape[2] in (1, 3):
        h, w, c = shape
    elif len(shape) == 2:
        (h, w), c = shape, 1
    else:
        raise ValueError(f"{user} stores images: expected {expected}, got shape {shape}"
                         + (" (channels-first? use HWC)" if len(shape) == 3 and shape[0] in (1, 3) else "")
                         + (" (RGBA is not supported: drop the alpha channel)" if len(shape) == 3 and shape[2] == 4 else ""))
    if h <= 0 or w <= 0:
        raise ValueError(f"{user} stores images: height and width must be positive, got shape {shape}")
    return h, w, c


def full_range(space: BoxSpace) -> bool:
    """Whether a uint8 box allows every value 0..255 (else lossy reads are clipped into its bounds)."""
    return bool(np.all(space.low_numpy == 0) and np.all(space.high_numpy == 255))


def reject_extra_args(user: str, args: Sequence[Any], kwargs: Dict[str, Any]) -> None:
    if args:
        raise TypeError(f"{user} takes no extra positional arguments, got {tuple(args)!r}")
    if kwargs:
        raise TypeError(f"{user} got unexpected keyword argument(s) {sorted(kwargs)}")


# ---------------------------------------------------------------------------------------------------- files
def prepare_new_directory(path: Any, user: str) -> str:
    """Creates the directory a new storage lives in; an existing non-empty directory is refused, so a new storage
    never silently picks up old files."""
    if path is None:
        raise ValueError(f"{user} keeps its files in a directory: cache_path is required")
    path = os.fspath(path)
    if os.path.exists(path):
        if not os.path.isdir(path):
            raise FileExistsError(f"{user}: cache_path {path} exists and is not a directory")
        if os.listdir(path):
            raise FileExistsError(f"{user}: cache_path {path} is not empty; choose a new directory (a new storage "
                                  "never reuses old files)")
    os.makedirs(path, exist_ok=True)
    return path


def temp_file_path(directory: str, ext: str) -> str:
    """A fresh hidden temporary file name inside `directory` (ignored by loads)."""
    return os.path.join(directory, f"{TEMP_PREFIX}{uuid.uuid4().hex}.tmp.{ext}")


def is_temp_name(name: str) -> bool:
    return name.startswith(TEMP_PREFIX)


def remove_quietly(path: Optional[str]) -> None:
    if path is None:
        return
    try:
        os.unlink(path)
    except OSError:
        pass


def place_copy(src: str, dst: str) -> None:
    """Makes `dst` a copy of `src` atomically (readers see the old `dst` or the whole new one): a hard link when the
    file system allows it (files are never modified in place, so the link never sees a later change), else a copy,
    each made under a temporary name and renamed over `dst`."""
    if os.path.exists(dst) and same_file(src, dst):
        return  # already a link to the same immutable file
    directory = os.path.dirname(os.path.abspath(dst))
    ext = dst.rsplit(".", 1)[-1] if "." in os.path.basename(dst) else "bin"
    tmp = temp_file_path(directory, ext)
    try:
        try:
            os.link(src, tmp)
        except OSError:
            shutil.copyfile(src, tmp)
        os.replace(tmp, dst)
    finally:
        # rename() between two links of one file does nothing and keeps both names
        if os.path.lexists(tmp):
            remove_quietly(tmp)


def same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.abspath(a) == os.path.abspath(b)


# ---------------------------------------------------------------------------------------------------- IO pool
_POOL: Optional[ThreadPoolExecutor] = None
_POOL_PID = -1
IO_WORKERS = max(1, min(8, os.cpu_count() or 1))
_POOL_PREFIX = "unienv-episode-io"
_POOL_LOCK = threading.Lock()


def io_map(fn: Callable[[T], R], items: List[T], min_parallel: int = 2) -> List[R]:
    """`[fn(x) for x in items]`, on a process-wide thread pool when there are at least `min_parallel` items
    (file decoding and encoding release the GIL). Recreated after a fork."""
    global _POOL, _POOL_PID
    if len(items) < min_parallel or IO_WORKERS == 1 or threading.current_thread().name.startswith(_POOL_PREFIX):
        return [fn(x) for x in items]  # small, or already on the pool (waiting on it from inside could deadlock)
    with _POOL_LOCK:
        if _POOL is None or _POOL_PID != os.getpid():
            _POOL = ThreadPoolExecutor(max_workers=IO_WORKERS, thread_name_prefix=_POOL_PREFIX)
            _POOL_PID = os.getpid()
        pool = _POOL
    return list(pool.map(fn, items))


# ---------------------------------------------------------------------------------------------------- runs
def last_occurrences(positions: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """`(unique sorted positions, index of each one's last occurrence in positions)`: duplicates, last one wins."""
    if positions.size <= 1:
        return positions.astype(np.int64, copy=True), np.arange(positions.size, dtype=np.int64)
    rev = positions[::-1]
    uniq, first_rev = np.unique(rev, return_index=True)
    return uniq.astype(np.int64), (positions.size - 1 - first_rev).astype(np.int64)


def consecutive_runs(sorted_positions: np.ndarray) -> List[Tuple[int, int]]:
    """`(offset, length)` of each maximal run of consecutive values in a sorted unique array."""
    n = int(sorted_positions.size)
    if n == 0:
        return []
    breaks = np.flatnonzero(np.diff(sorted_positions) != 1) + 1
    edges = [0] + breaks.tolist() + [n]
    return [(edges[i], edges[i + 1] - edges[i]) for i in range(len(edges) - 1)]


def mask_to_runs(mask: np.ndarray) -> List[List[int]]:
    """`[[start, length], ...]` of the True stretches of a boolean mask."""
    if mask.size == 0:
        return []
    padded = np.concatenate(([False], mask, [False])).astype(np.int8)
    d = np.diff(padded)
    starts, ends = np.flatnonzero(d == 1), np.flatnonzero(d == -1)
    return [[int(s), int(e - s)] for s, e in zip(starts, ends)]


def runs_to_mask(runs: Any, n: int, where: str) -> np.ndarray:
    """The inverse of `mask_to_runs`, validating every `[start, length]` pair against `n` rows."""
    if not isinstance(runs, list):
        raise StorageFormatError(f"{where}: expected a list of [start, length] pairs, got {type(runs).__name__}")
    mask = np.zeros(n, dtype=bool)
    for i, item in enumerate(runs):
        ok = isinstance(item, list) and len(item) == 2 and all(
            isinstance(v, int) and not isinstance(v, bool) for v in item)
        if ok:
            s, k = item
            ok = 0 <= s and 0 < k and s + k <= n
        if not ok:
            raise StorageFormatError(f"{where}: entry {i} = {item!r} is not a valid [start, length] run within {n} rows")
        mask[item[0]:item[0] + item[1]] = True
    return mask


def ring_positions(start: int, length: int, capacity: Optional[int]) -> np.ndarray:
    """Physical rows of a run of `length` rows from `start` (wrapping a ring of `capacity`)."""
    pos = np.arange(start, start + length, dtype=np.int64)
    if capacity is not None:
        pos %= capacity
    return pos


def describe_rows(positions: Iterable[int]) -> str:
    rows = sorted(set(int(p) for p in positions))
    if len(rows) > 6:
        return f"{rows[:3]} ... {rows[-2:]} ({len(rows)} rows)"
    return str(rows)


# ---------------------------------------------------------------------------------------------------- row -> file map
@dataclass
class EpisodeFile:
    """One immutable file of consecutive frames. `uid` identifies its content across copies (dumps)."""

    name: str
    frames: int
    nbytes: int
    uid: str = field(default_factory=lambda: uuid.uuid4().hex)
    keyframes: Optional[List[int]] = None   #: frame numbers of keyframes (None: unknown, always seek)
    refs: int = 0                           #: rows that currently read from this file

    def to_json(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {"frames": self.frames, "bytes": self.nbytes, "uid": self.uid}
        if self.keyframes is not None:
            out["keyframes"] = list(self.keyframes)
        return out


class RunFileIndex:
    """Which file and frame every physical row reads from (`-1`: the row was never written and reads as zeros).

    A new file placed on rows takes them over; rows of older files it covers are simply re-pointed, so a file only
    partly overwritten keeps serving its other rows without being rewritten (no re-encoding, no generation loss).
    A file that no row points to any more is returned to the caller for deletion.
    """

    def __init__(self, n_rows: int) -> None:
        self.row_file = np.full(n_rows, -1, dtype=np.int32)
        self.row_frame = np.zeros(n_rows, dtype=np.int32)
        self.files: Dict[int, EpisodeFile] = {}
        self._next_id = 0

    @property
    def n_rows(self) -> int:
        return int(self.row_file.shape[0])

    def names(self) -> Dict[str, int]:
        return {f.name: fid for fid, f in self.files.items()}

    def snapshot(self) -> Tuple[np.ndarray, np.ndarray, Dict[int, EpisodeFile], Dict[int, int], int]:
        """State to `restore` after a failed change."""
        return (self.row_file.copy(), self.row_frame.copy(), dict(self.files),
                {fid: f.refs for fid, f in self.files.items()}, self._next_id)

    def restore(self, snap: Tuple[np.ndarray, np.ndarray, Dict[int, EpisodeFile], Dict[int, int], int]) -> None:
        self.row_file, self.row_frame, self.files, refs, self._next_id = snap
        self.files = dict(self.files)
        for fid, f in self.files.items():
            f.refs = refs[fid]

    def _release_rows(self, rows: np.ndarray) -> List[EpisodeFile]:
        """Un-points `rows`; returns the files no row points to any more."""
        old = self.row_file[rows]
        old = old[old >= 0]
        freed: List[EpisodeFile] = []
        if old.size:
            ids, counts = np.unique(old, return_counts=True)
            for fid, cnt in zip(ids.tolist(), counts.tolist()):
                f = self.files[fid]
                f.refs -= cnt
                if f.refs <= 0:
                    freed.append(self.files.pop(fid))
        self.row_file[rows] = -1
        self.row_frame[rows] = 0
        return freed

    def place(self, file: EpisodeFile, rows: np.ndarray, first_frame: int = 0) -> List[EpisodeFile]:
        """Points `rows[k]` at frame `first_frame + k` of `file`; returns the files that became unreferenced."""
        freed = self._release_rows(rows)
        fid = self._next_id
        self._next_id += 1
        file.refs = int(rows.size)
        self.files[fid] = file
        self.row_file[rows] = fid
        self.row_frame[rows] = np.arange(first_frame, first_frame + rows.size, dtype=np.int32)
        return freed

    def resize(self, n_rows: int) -> List[EpisodeFile]:
        """Grows (new rows unwritten) or shrinks (rows past the end released); returns freed files."""
        cur = self.n_rows
        if n_rows == cur:
            return []
        if n_rows > cur:
            self.row_file = np.concatenate([self.row_file, np.full(n_rows - cur, -1, dtype=np.int32)])
            self.row_frame = np.concatenate([self.row_frame, np.zeros(n_rows - cur, dtype=np.int32)])
            return []
        freed = self._release_rows(np.arange(n_rows, cur, dtype=np.int64))
        self.row_file = self.row_file[:n_rows].copy()
        self.row_frame = self.row_frame[:n_rows].copy()
        return freed

    def clear(self) -> List[EpisodeFile]:
        freed = list(self.files.values())
        self.files = {}
        self.row_file[:] = -1
        self.row_frame[:] = 0
        return freed

    # ------------------------------------------------------------------ persistence
    def runs(self) -> List[List[Any]]:
        """`[[row, length, file name, first frame], ...]`: maximal stretches of rows reading consecutive frames of
        one file."""
        rf, fr = self.row_file, self.row_frame
        n = rf.shape[0]
        if n == 0:
            return []
        brk = np.ones(n, dtype=bool)
        brk[1:] = (rf[1:] != rf[:-1]) | (fr[1:] != fr[:-1] + 1)
        starts = np.flatnonzero(brk)
        ends = np.append(starts[1:], n)
        out: List[List[Any]] = []
        for s, e in zip(starts.tolist(), ends.tolist()):
            fid = int(rf[s])
            if fid >= 0:
                out.append([s, e - s, self.files[fid].name, int(fr[s])])
        return out

    def to_json(self) -> Dict[str, Any]:
        return {"files": {f.name: f.to_json() for f in self.files.values()}, "runs": self.runs()}

    @classmethod
    def from_json(cls, files: Any, runs: Any, n_rows: int, where: str) -> "RunFileIndex":
        """Rebuilds the index from metadata, validating every entry (StorageFormatError names the bad one)."""
        if not isinstance(files, dict):
            raise StorageFormatError(f"{where}: 'files' must be an object mapping file names to their description")
        if not isinstance(runs, list):
            raise StorageFormatError(f"{where}: 'runs' must be a list of [row, length, file, first frame] entries")
        idx = cls(n_rows)
        by_name: Dict[str, int] = {}
        for name, desc in files.items():
            ok = isinstance(name, str) and bool(name) and "/" not in name and "\\" not in name and isinstance(desc, dict)
            frames = desc.get("frames") if ok else None
            nbytes = desc.get("bytes") if ok else None
            uid = desc.get("uid", "") if ok else None
            kf = desc.get("keyframes") if ok else None
            ok = ok and _is_count(frames, 1) and _is_count(nbytes, 0) and isinstance(uid, str)
            if ok and kf is not None:
                ok = isinstance(kf, list) and all(_is_count(k, 0) and k < frames for k in kf)  # type: ignore[operator]
            if not ok:
                raise StorageFormatError(f"{where}: file entry {name!r} = {desc!r} is not valid")
            fid = idx._next_id
            idx._next_id += 1
            idx.files[fid] = EpisodeFile(name, int(frames), int(nbytes), uid or uuid.uuid4().hex,  # type: ignore[arg-type]
                                         sorted(int(k) for k in kf) if kf is not None else None)
            by_name[name] = fid
        for i, run in enumerate(runs):
            ok = (isinstance(run, list) and len(run) == 4 and _is_count(run[0], 0) and _is_count(run[1], 1)
                  and isinstance(run[2], str) and _is_count(run[3], 0))
            if ok:
                row, length, name, frame0 = run
                ok = row + length <= n_rows and name in by_name and frame0 + length <= idx.files[by_name[name]].frames
            if not ok:
                raise StorageFormatError(f"{where}: run entry {i} = {run!r} is not a valid [row, length, file, first "
                                         f"frame] within {n_rows} rows and the listed files")
            sl = slice(run[0], run[0] + run[1])
            if np.any(idx.row_file[sl] >= 0):
                raise StorageFormatError(f"{where}: run entry {i} = {run!r} overlaps an earlier run")
            fid = by_name[run[2]]
            idx.row_file[sl] = fid
            idx.row_frame[sl] = np.arange(run[3], run[3] + run[1], dtype=np.int32)
            idx.files[fid].refs += run[1]
        for fid in [fid for fid, f in idx.files.items() if f.refs == 0]:
            del idx.files[fid]  # listed but unused (left by an interrupted change): ignored
        return idx


def _is_count(v: Any, minimum: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= minimum


__all__ = ["TEMP_PREFIX", "import_optional", "check_capacity", "image_shape", "full_range", "reject_extra_args",
           "prepare_new_directory", "temp_file_path", "is_temp_name", "remove_quietly", "place_copy", "same_file",
           "io_map", "last_occurrences", "consecutive_runs", "mask_to_runs", "runs_to_mask", "ring_positions",
           "describe_rows", "EpisodeFile", "RunFileIndex"]
