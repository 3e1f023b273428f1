"""The commit log of a disk-backed `DictStorage` or `FlattenedStorage`: one record per commit point holding the
committed length and segment list of the array storages under it, instead of each rewriting its own metadata file.

Without it every memory-mapped array storage rewrites its own metadata file (`<file>.meta.json`) at every commit
point (one atomic file replace each), and in a `DictStorage` a process killed between two of them leaves children
that disagree. With it, the storages that keep nothing but their length and segment list in their metadata
(memory-mapped array storages, under any wrappers: see `SpaceStorage.commit_log_leaf`), the *leaves*, leave that
state to the log, and a commit point is one appended line, written after the rows: the record is the commit.
Children of a `DictStorage` that persist more than that (a `VideoStorage`'s file index, HDF5) still persist
themselves, before the record.

Files (the reference ignores both): `dict_commit.log` next to `dict_storage_metadata.json` (one record for all
the children), `flattened_commit.log` next to `flattened_metadata.json` (for the inner storage of a
`FlattenedStorage` that is not the child of a logging `DictStorage`: the DictStorage's log holds that state then).
Each line is `<crc32 hex> <json>`; a line that does not check (torn by a crash while being appended) ends the log.
Records:

* `{"t": "base", "len": L, "runs": [[start, length], ...]}`: the whole state (first line);
* `{"t": "add", "len": L, "run": [start, length]}`: a commit (the run is recorded as `SegmentLog.add` does);
* `{"t": "len", "len": L}`: a commit that recorded no segment;
* `{"t": "segs", "len": L, "runs": [...]}`: segments dropped before their rows are overwritten (whole list);
* `{"t": "cut", "len": L, "run": [start, length]}`: the same, as the rows cut out of the list
  (`SegmentLog.drop_overlapping`), when that is all that changed (the usual drop: a ring's oldest episode about
  to be overwritten), so a drop, like a commit, writes a line of the same size whatever the number of segments;
* `{"t": "ops", "len": L, "ops": [[...], ...]}`: several such changes in order (`SegmentLog.apply_op`: `add`, `cut`,
  and `back`, the rest of a run an ended episode stopped overwriting, put back in its place).

`LeafCommitLog` is the owner's side (both storages use it): it records the commits and drops, and `flush()` /
`close()` / `dumps()` into the owner's own directory write every leaf's own metadata, then `compact()` the log to
one base record (atomically), so the leaves' files alone describe the storage again (for the reference). A log
grown past `COMPACT_BYTES` is compacted the same way at a commit point. On `load_from`, `adopt_log` gives each leaf
the state the log commits (newer than the leaves' own files after a crash). A leaf is held by one log at a time:
a log taking a leaf over retires the log that held it (its file is removed).
"""
from __future__ import annotations

import errno
import json
import os
import zlib
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from unienv_data.base.errors import StorageFormatError
from unienv_data.base.files import PathLike, is_durable, remove_if_present, replacing_file
from unienv_data.base.segments import SegmentLog
from unienv_data.base.storage import SpaceStorage

#: a `DictStorage`'s log, next to its `dict_storage_metadata.json`
DICT_LOG_FILE = "dict_commit.log"
#: a `FlattenedStorage`'s log, next to its `flattened_metadata.json`
FLATTENED_LOG_FILE = "flattened_commit.log"
COMPACT_BYTES = 1 << 20

Runs = List[Tuple[int, int]]


def _line(record: Dict[str, Any]) -> bytes:
    body = json.dumps(record, separators=(",", ":")).encode("utf-8")
    return b"%08x " % (zlib.crc32(body) & 0xFFFFFFFF) + body + b"\n"


def _log_bytes(path: str) -> Optional[bytes]:
    """The bytes of the log file at `path`, None when there is none; StorageFormatError when it is no plain file."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None
    except (IsADirectoryError, NotADirectoryError) as exc:
        raise StorageFormatError(f"{path} is not a plain file ({exc.strerror}): the commit log is damaged; restore "
                                 "the dataset from a copy") from None


def read_log(path: str, capacity: Optional[int]) -> Optional[Tuple[int, Runs]]:
    """The committed `(length, runs)` a log file holds, or None when there is none. A damaged first record is a
    StorageFormatError (the base is replaced atomically, so it is never torn); a torn record after it ends the
    log (a crash while it was appended: that commit did not happen)."""
    data = _log_bytes(path)
    if data is None:
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
            elif kind in ("add", "cut"):
                log.apply_op([kind, *rec["run"]])
            elif kind == "ops":
                for op in rec["ops"]:
                    log.apply_op(op)
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


def read_records(path: str) -> List[Dict[str, Any]]:
    """The records of a log file in this format (`<crc32 hex> <json>` lines), up to the first that does not check
    (torn by a crash while it was appended); [] when there is no file."""
    data = _log_bytes(path)
    records: List[Dict[str, Any]] = []
    if data is None:
        return records
    for raw in data.split(b"\n"):
        rec = _parse(raw)
        if rec is None:
            break
        records.append(rec)
    return records


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


class LogFile:
    """The writer side of one log file: appends records to `path` (kept open) and compacts it to one base record."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: Optional[int] = None
        self._size = 0
        self._removed = False       # `remove()` removed the file and nothing was written since

    def append(self, record: Dict[str, Any]) -> None:
        """Appends one record (fsync'ed when durable, see `base.files.set_durable`)."""
        if self._fd is None:
            # the umask decides the mode; never through a link (nothing outside the dataset may change)
            flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0)
            try:
                self._fd = os.open(self.path, flags, 0o666)
            except (IsADirectoryError, NotADirectoryError) as exc:
                raise StorageFormatError(f"{self.path} is not a plain file ({exc.strerror}): the commit log is "
                                         "damaged; restore the dataset from a copy") from None
            except OSError as exc:
                if exc.errno != errno.ELOOP:
                    raise
                raise StorageFormatError(f"{self.path} is a symbolic link: a commit log is never written through "
                                         "one; remove the link") from None
            self._size = os.fstat(self._fd).st_size
        line = _line(record)
        self._removed = False
        os.write(self._fd, line)
        self._size += len(line)
        if is_durable():
            os.fsync(self._fd)

    @property
    def size(self) -> int:
        """Bytes in the file (as far as this writer knows: since it opened it)."""
        return self._size

    def compact(self, length: int, runs: Runs) -> None:
        """Replaces the log with one base record (write a temporary file, rename over the log)."""
        self.close()
        self._removed = False
        with replacing_file(self.path) as tmp:
            with open(tmp, "wb") as f:
                f.write(_line({"t": "base", "len": int(length), "runs": [[int(s), int(n)] for s, n in runs]}))

    def remove(self) -> None:
        """Closes and removes the file (once: a log this writer removed stays absent until it writes again)."""
        self.close()
        if not self._removed:
            remove_if_present(self.path)
            self._removed = True

    def close(self) -> None:
        """Closes the file (the next `append` reopens it)."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)


def adopt_log(path: str, capacity: Optional[int], leaves: Iterable[Tuple[str, SpaceStorage]]) -> bool:
    """Gives every leaf the committed length and segments the log at `path` holds (`adopt_committed`; after a crash
    the log is newer than the leaves' own metadata files); each pair is `(where, leaf)`, `where` naming the log and
    leaf in errors. False when there is no log."""
    logged = read_log(path, capacity)
    if logged is None:
        return False
    for where, leaf in leaves:
        leaf.adopt_committed(logged[0], logged[1], where)
    return True


def _state_of(leaf: SpaceStorage) -> Tuple[int, List[List[int]]]:
    seg_log = leaf.segment_log()
    return len(leaf), (seg_log.to_json() if seg_log is not None else [])


def _holder(leaf: SpaceStorage) -> Optional["LeafCommitLog"]:
    """The log holding `leaf`'s state: the one whose drop listener the leaf calls."""
    holder = getattr(leaf.drop_listener, "__self__", None)
    return holder if isinstance(holder, LeafCommitLog) else None


class LeafCommitLog:
    """The commit log an owner storage keeps in its directory for `leaves` (storages whose only per-commit state is
    their length and segment list: `commit_log_leaf()` of its children / inner storage); see the module docstring.

    The leaves share one state (a `DictStorage`'s children record the same segments); it is read from the first.
    The owner calls `record_commit()` at each of its commit points (after every leaf's rows are written), `compact()`
    after the leaves wrote their own metadata (`flush`, `dumps` into its own directory, `persist_committed`), and
    `close(...)` when it closes. The log sets each leaf's `drop_listener`, so segments a leaf drops before their rows
    are overwritten are recorded first; with `listen_commits` also its `commit_listener`, so the leaf's own commit
    points (`mark_segment_end`, segment writers) are records of this log (an owner that wraps a single leaf and does
    not see those calls itself: `FlattenedStorage`).

    `lazy`: the file is written at the first record (the first is a base record), not when the log starts; an owner
    that a `DictStorage` may take as a child uses it, so a log that DictStorage's log replaces never writes a file.
    Starting a log on a leaf another log holds retires that log (its file is removed, after this log's base record
    is written)."""

    def __init__(self, directory: PathLike, file_name: str, leaves: Sequence[SpaceStorage], *, lazy: bool = False,
                 listen_commits: bool = False) -> None:
        if not leaves:
            raise ValueError("a commit log needs at least one leaf storage to hold the state of")
        self._file = LogFile(os.path.join(os.fspath(directory), file_name))
        self._leaves = list(leaves)
        self._capacity = self._leaves[0].capacity
        #: the journal ops (`SegmentLog.ops_since`) the file holds after its last whole list (base or `segs`)
        self._ops: List[Any] = []
        #: per leaf segment log (by id): `(log, its pstate, len(self._ops))` when the list it persisted at that
        #: pstate is the list the file held after that many ops; a leaf whose journal since then starts with the
        #: ops written since is in step with the file without building or comparing any list
        self._synced: Dict[int, Tuple[SegmentLog, int, int]] = {}
        self._started = False
        #: the `(length, runs)` of the base record when nothing was appended after it (a compaction to the same
        #: state then rewrites nothing)
        self._clean_base: Optional[Tuple[int, List[List[int]]]] = None
        self._active = True
        previous = {id(h): h for h in map(_holder, self._leaves) if h is not None and h is not self}
        if not lazy or previous:
            self._write_base(*self.state())   # the base record first: the log it takes the leaves from is removed after
        for h in previous.values():
            h.retire()
        for leaf in self._leaves:
            leaf.drop_listener = self.record_drop
            if listen_commits:
                leaf.commit_listener = self.record_commit

    @property
    def path(self) -> str:
        """The log file."""
        return self._file.path

    @property
    def active(self) -> bool:
        """False once closed or retired (then every method but `close` does nothing)."""
        return self._active

    def state(self) -> Tuple[int, List[List[int]]]:
        """The leaves' current `(length, runs)`."""
        return _state_of(self._leaves[0])

    def record_drop(self, leaf: SpaceStorage) -> None:
        """A leaf dropped segments (their rows are about to be overwritten): the first leaf to do so records the
        shorter list, before any leaf overwrites a row (the leaves' `drop_listener`)."""
        seg_log = leaf.segment_log()
        if not self._active or seg_log is None:
            return
        if not self._started:
            self._write_base(len(leaf), seg_log.to_json())
            return
        self._record(leaf, seg_log, commit=False)

    def record_commit(self, leaf: Optional[SpaceStorage] = None) -> None:
        """A commit point: one record of the leaves' state, written after their rows (the owner calls it; with
        `listen_commits` the leaves' `commit_listener` too). With durable commit points (`set_durable`) the leaves
        persist themselves first (their rows are synced before the record)."""
        if not self._active:
            return
        if is_durable():
            for lf in self._leaves:
                lf.persist_committed()
        first = self._leaves[0]
        seg_log = first.segment_log()
        if not self._started or seg_log is None:
            self._write_base(*self.state())
            return
        self._record(first, seg_log, commit=True)
        if self._file.size > COMPACT_BYTES:
            self._write_base(*self.state())

    def _record(self, leaf: SpaceStorage, seg_log: SegmentLog, commit: bool) -> None:
        """Appends what changed in `leaf`'s persisted list since the file was last in step with it: the journal ops
        (`add`, `cut`, `ops` records: a line of the same size whatever the number of segments), a `len` record for a
        commit that changed no list, nothing for a drop the file holds already; the whole list (`segs`) when the
        leaf's journal cannot say (then every leaf holding that same list is in step again)."""
        length = len(leaf)
        known = self._synced.get(id(seg_log))
        ops = seg_log.ops_since(known[1]) if known is not None and known[0] is seg_log else None
        if ops is not None:
            written = self._ops[known[2]:]      # type: ignore[index]
            if ops[:len(written)] == written:
                extra = ops[len(written):]
                if extra:
                    self._clean_base = None
                    if len(extra) == 1 and extra[0][0] in ("add", "cut"):
                        self._file.append({"t": extra[0][0], "len": length, "run": list(extra[0][1:])})
                    else:
                        self._file.append({"t": "ops", "len": length, "ops": [list(op) for op in extra]})
                    self._ops.extend(extra)
                elif commit:
                    self._clean_base = None
                    self._file.append({"t": "len", "len": length})
                self._synced[id(seg_log)] = (seg_log, seg_log.pstate, len(self._ops))
                return
        runs = seg_log.to_json()
        self._clean_base = None
        self._file.append({"t": "segs", "len": length, "runs": runs})
        self._in_step(runs, seg_log)

    def _in_step(self, runs: List[List[int]], holder: Optional[SegmentLog] = None) -> None:
        """The file now holds the whole list `runs` (no op after it): every leaf persisting that list is in step."""
        self._ops = []
        self._synced = {}
        if not self._active:
            return
        for leaf in self._leaves:
            log = leaf.segment_log()
            if log is not None and (log is holder or log.to_json() == runs):
                self._synced[id(log)] = (log, log.pstate, 0)

    def compact(self) -> None:
        """Replaces the log with one base record of the current state (after the leaves wrote their own files, so
        that the files alone describe them again)."""
        if self._active:
            self._compact_to(*self.state())

    def _compact_to(self, length: int, runs: List[List[int]]) -> None:
        """`compact` to a known state. A log that recorded nothing yet holds no news: its file (the state the
        storage was opened with, if any) goes, and the next record starts a new one with its base. A log whose only
        record is a base of this very state is left as it is (a `dumps` after `dumps` rewrites nothing)."""
        if not self._started:
            self._file.remove()
        elif self._clean_base != (length, runs):
            self._write_base(length, runs)

    def _write_base(self, length: int, runs: List[List[int]]) -> None:
        """Replaces the file with one base record of `(length, runs)`."""
        self._file.compact(length, [(a, b) for a, b in runs])
        self._in_step(runs)
        self._clean_base = (length, runs)
        self._started = True

    def close(self, close_leaves: Optional[Callable[[], None]] = None, *, compact: bool = True) -> None:
        """Stops logging (the leaves' listeners are removed), runs `close_leaves` (the owner closing its children,
        which write their own metadata files), then, with `compact`, replaces the log with the state the leaves
        had before closing. A closed or retired log only runs `close_leaves`."""
        if not self._active:
            if close_leaves is not None:
                close_leaves()
            return
        state = self.state() if compact and not any(leaf.is_closed for leaf in self._leaves) else None
        self._detach()
        try:
            if close_leaves is not None:
                close_leaves()
        finally:
            self._file.close()
        if state is not None:
            self._compact_to(*state)

    def retire(self) -> None:
        """Hands the leaves over to another log: stops logging and removes the file (that log holds the state)."""
        self._detach()
        self._file.remove()

    def _detach(self) -> None:
        self._active = False
        for leaf in self._leaves:
            if _holder(leaf) is self:
                leaf.drop_listener = None
            if leaf.commit_listener == self.record_commit:
                leaf.commit_listener = None


__all__ = ["DICT_LOG_FILE", "FLATTENED_LOG_FILE", "COMPACT_BYTES", "LeafCommitLog", "LogFile", "adopt_log",
           "read_log", "read_records"]
