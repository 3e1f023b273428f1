"""The commit log of a disk-backed `DictStorage`: one record per commit point for all its children.

Without it every child rewrites its own metadata file at every commit point (one atomic file replace each), and a
process killed between two of them leaves children that disagree. With it, the children that keep nothing but
their length and segment list in their metadata (memory-mapped array storages, and `FlattenedStorage` over one:
see `SpaceStorage.commit_log_leaf`) leave that state to the log, and a commit point is one appended line, written
after every child's rows: the record is the commit. Children that persist more than that (a `VideoStorage`'s file
index, HDF5) still persist themselves, before the record.

File `dict_commit.log` next to `dict_storage_metadata.json` (the reference ignores it). Each line is
`<crc32 hex> <json>`; a line that does not check (torn by a crash while being appended) ends the log. Records:

* `{"t": "base", "len": L, "runs": [[start, length], ...]}`: the whole state (first line);
* `{"t": "add", "len": L, "run": [start, length]}`: a commit (the run is recorded as `SegmentLog.add` does);
* `{"t": "len", "len": L}`: a commit that recorded no segment;
* `{"t": "segs", "len": L, "runs": [...]}`: segments dropped before their rows are overwritten (whole list).

`flush()` / `close()` / `dumps()` into its own directory write every child's own metadata, then replace the log
with one base record (atomically), so the children's files alone describe the storage again (for the reference).
A log grown past `COMPACT_BYTES` is compacted the same way at a commit point.
"""
from __future__ import annotations

import json
import os
import zlib
from typing import Any, Dict, List, Optional, Tuple

from unienv_data.base.errors import StorageFormatError
from unienv_data.base.files import is_durable, replacing_file
from unienv_data.base.segments import SegmentLog

LOG_FILE = "dict_commit.log"
COMPACT_BYTES = 1 << 20

Runs = List[Tuple[int, int]]


def _line(record: Dict[str, Any]) -> bytes:
    body = json.dumps(record, separators=(",", ":")).encode("utf-8")
    return b"%08x " % (zlib.crc32(body) & 0xFFFFFFFF) + body + b"\n"


def read_log(path: str, capacity: Optional[int]) -> Optional[Tuple[int, Runs]]:
    """The committed `(length, runs)` a log file holds, or None when there is none. A damaged first record is a
    StorageFormatError (the base is replaced atomically, so it is never torn); a torn record after it ends the
    log (a crash while it was appended: that commit did not happen)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    length: Optional[int] = None
    log = SegmentLog(capacity)
    for i, raw in enumerate(data.split(b"\n")):
        rec = _parse(raw)
        if rec is None:
            if i == 0:
                raise StorageFormatError(f"{path}: its first record (the base state) is damaged")
            break
        kind = rec.get("t")
        try:
            if i == 0 and kind != "base":
                raise StorageFormatError(f"{path}: the first record must be the base state, got {kind!r}")
            if kind in ("base", "segs"):
                log = SegmentLog(capacity, [(int(s), int(n)) for s, n in rec["runs"]])
            elif kind == "add":
                s, n = rec["run"]
                log.add(int(s), int(n))
            elif kind != "len":
                raise StorageFormatError(f"{path}: record {i + 1} has unknown type {kind!r}")
            length = int(rec["len"])
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, StorageFormatError):
                raise
            raise StorageFormatError(f"{path}: record {i + 1} is malformed ({exc})") from None
    if length is None:
        return None
    return length, log.runs()


def _parse(raw: bytes) -> Optional[Dict[str, Any]]:
    if len(raw) < 10 or raw[8:9] != b" ":
        return None
    body = raw[9:]
    try:
        if int(raw[:8], 16) != zlib.crc32(body) & 0xFFFFFFFF:
            return None
        rec = json.loads(body)
    except ValueError:
        return None
    return rec if isinstance(rec, dict) else None


class CommitLog:
    """The writer side: appends records to `path` (kept open) and compacts it to one base record."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: Optional[int] = None
        self._size = 0

    def append(self, record: Dict[str, Any]) -> None:
        if self._fd is None:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)  # the umask decides
            self._size = os.fstat(self._fd).st_size
        line = _line(record)
        os.write(self._fd, line)
        self._size += len(line)
        if is_durable():
            os.fsync(self._fd)

    @property
    def size(self) -> int:
        return self._size

    def compact(self, length: int, runs: Runs) -> None:
        """Replaces the log with one base record (write a temporary file, rename over the log)."""
        self.close()
        with replacing_file(self.path) as tmp:
            with open(tmp, "wb") as f:
                f.write(_line({"t": "base", "len": int(length), "runs": [[int(s), int(n)] for s, n in runs]}))

    def close(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)


__all__ = ["LOG_FILE", "COMPACT_BYTES", "CommitLog", "read_log"]
