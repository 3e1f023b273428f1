"""Which file and frame every physical row of a `VideoStorage` reads: `EpisodeFile` (one immutable video file of
consecutive frames) and `RunFileIndex` (the row -> `(file, frame)` map, its changes, and its JSON form in the metadata).
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from unienv_data.base.errors import StorageFormatError


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

    def add_file(self, file: EpisodeFile) -> int:
        """Lists `file` under a new id (no row points to it yet); returns the id."""
        fid = self._next_id
        self._next_id += 1
        self.files[fid] = file
        return fid

    def place(self, file: EpisodeFile, rows: np.ndarray, first_frame: int = 0) -> List[EpisodeFile]:
        """Points `rows[k]` at frame `first_frame + k` of `file`; returns the files that became unreferenced."""
        freed = self._release_rows(rows)
        file.refs = int(rows.size)
        fid = self.add_file(file)
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
            ok = ok and int(frames) < 2 ** 31  # type: ignore[arg-type]  # frame numbers are int32
            if ok and kf is not None:
                ok = isinstance(kf, list) and all(_is_count(k, 0) and k < frames for k in kf)  # type: ignore[operator]
            if not ok:
                raise StorageFormatError(f"{where}: file entry {name!r} = {desc!r} is not valid")
            by_name[name] = idx.add_file(EpisodeFile(
                name, int(frames), int(nbytes), uid or uuid.uuid4().hex,  # type: ignore[arg-type]
                sorted(int(k) for k in kf) if kf is not None else None))
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


__all__ = ["EpisodeFile", "RunFileIndex"]
