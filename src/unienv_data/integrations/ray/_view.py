"""The service's published view: which rows of its buffer directory are committed, for readers on the same node.

The buffer actor keeps one small binary file, `VIEW_FILE`, in the buffer directory. It is never replaced (readers
keep it open); every update is a few ``pwrite`` calls under a sequence counter (a seqlock): the writer makes the
counter odd, writes the fields, makes it even again, and a reader accepts what it read only when the counter was
the same even value before and after. The file is advisory: the durable truth stays the buffer's metadata (written
by atomic rename at every commit); the view is rebuilt from it whenever the actor (re)opens the directory.

Rows are numbered by *absolute* position: the n-th row ever written at the tail of the ring is row n (its physical
row is ``n % capacity``), so the numbers never repeat even when the ring wraps. Fields (little-endian int64):

=====  ==========================================================================================================
word   meaning
=====  ==========================================================================================================
0      sequence counter (odd while the writer is updating)
1      `MAGIC`
2      ``reserved``: every row below ``reserved - capacity`` may be overwritten (published *before* the rows are
       written, so a reader that checks it after reading rows knows whether they could have changed meanwhile)
3      ``committed``: rows below this are written and durable
4      rows the buffer holds (its length)
5      capacity (-1: a growable buffer, whose rows are never overwritten)
6      number of published segments
7      number of view updates ever (for diagnostics)
8..    ``(absolute start, length)`` of each whole committed episode, oldest first; an episode any of whose rows may
       be overwritten (``start < reserved - capacity``) is never listed
=====  ==========================================================================================================

Ray-free (used by the actor and by `LocalSampler` alike). A reader's guarantee rests on the writer publishing
``reserved`` before overwriting rows and on system calls ordering memory accesses, as they do on Linux; it holds on
one node (one page cache). On a network filesystem it is only as strong as that filesystem's coherence.
"""
from __future__ import annotations

import os
import struct
import time
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import numpy as np

#: Name of the view file in the buffer directory.
VIEW_FILE = "service_view.bin"
#: Format tag in word 1 ("unienvV1" as an integer).
MAGIC = int.from_bytes(b"unienvV1", "little")
_HEADER_WORDS = 8
_HEADER_BYTES = 8 * _HEADER_WORDS
_WORD = struct.Struct("<q")
_THREE = struct.Struct("<3q")
_SEQ, _MAGIC, _RESERVED, _COMMITTED, _COUNT, _CAP, _NSEG, _UPDATES = range(_HEADER_WORDS)


def view_path(directory: str) -> str:
    """Where the view file of the buffer in `directory` lives."""
    return os.path.join(os.fspath(directory), VIEW_FILE)


@dataclass(frozen=True)
class View:
    """One consistent reading of the view file (see the module docstring)."""

    seq: int
    reserved: int
    committed: int
    count: int
    capacity: Optional[int]
    #: absolute start and length of every listed episode, oldest first (int64 arrays)
    starts: np.ndarray
    lengths: np.ndarray

    @property
    def drop_below(self) -> int:
        """Episodes starting below this absolute row may be overwritten (never for a growable buffer)."""
        return -1 if self.capacity is None else self.reserved - self.capacity


def _pack(words: Sequence[int]) -> bytes:
    return np.asarray(words, dtype="<i8").tobytes()


class ViewWriter:
    """The actor's side: keeps the view file of one buffer directory up to date (one writer per directory).

    `start(count, offset, capacity)` continues the numbering of a view left by an earlier incarnation so that
    absolute positions never go backwards; `reserve(end)` announces rows about to be overwritten; `publish(...)`
    lists what is committed."""

    def __init__(self, directory: str) -> None:
        self.path = view_path(directory)
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        self.seq = 0
        self.reserved = 0
        self.committed = 0
        self.updates = 0

    def start(self, count: int, offset: int, capacity: Optional[int], segments: Sequence[Tuple[int, int]]) -> int:
        """Picks the absolute position of the buffer's tail after (re)opening and publishes the view; returns it.

        The tail's number must leave ``tail % capacity`` equal to the physical tail ``(offset + count) %
        capacity`` and must not be below any number an earlier incarnation published (readers may still hold
        rows numbered by it); both hold for the smallest such number at or above the old ones."""
        old = self._read_old()
        floor = max(count, old[0], old[1])
        self.seq = old[2] + (old[2] & 1)
        self.updates = old[3]
        if capacity is None:
            tail = max(count, floor)
        else:
            residue = (offset + count) % capacity
            tail = floor + (residue - floor) % capacity
        self.reserved = self.committed = tail
        self.publish(tail, count, capacity, segments)
        return tail

    def _read_old(self) -> Tuple[int, int, int, int]:
        """`(reserved, committed, seq, updates)` of a view an earlier incarnation left (zeros when none or torn)."""
        raw = os.pread(self._fd, _HEADER_BYTES, 0)
        if len(raw) < _HEADER_BYTES:
            return 0, 0, 0, 0
        h = np.frombuffer(raw, dtype="<i8")
        if int(h[_MAGIC]) != MAGIC:
            return 0, 0, 0, 0
        return max(0, int(h[_RESERVED])), max(0, int(h[_COMMITTED])), max(0, int(h[_SEQ])), max(0, int(h[_UPDATES]))

    def _begin(self) -> None:
        self.seq += 1                                     # odd: readers wait or retry
        os.pwrite(self._fd, _pack([self.seq]), 0)

    def _end(self) -> None:
        self.seq += 1
        self.updates += 1
        os.pwrite(self._fd, _pack([self.seq]), 0)

    def reserve(self, end: int) -> None:
        """Announces that rows up to absolute `end` are about to be written (rows below ``end - capacity`` may be
        overwritten from now on); call before writing them. Never lowers what was announced."""
        if end <= self.reserved:
            return
        self._begin()
        self.reserved = int(end)
        os.pwrite(self._fd, _pack([MAGIC, self.reserved]), 8 * _MAGIC)
        self._end()

    def publish(self, committed: int, count: int, capacity: Optional[int],
                segments: Sequence[Tuple[int, int]]) -> None:
        """Lists the committed rows: `committed` is the absolute end of the rows written and durable, `count` the
        buffer's length, `segments` its logical ``(start, end)`` episode ranges (as ``episode_segments()`` gives them).
        Episodes that rows reserved for overwriting reach are left out."""
        self.committed = int(committed)
        self.reserved = max(self.reserved, self.committed)
        first = self.committed - int(count)
        drop_below = -1 if capacity is None else self.reserved - capacity
        table: List[int] = []
        for s, e in segments:
            if first + s >= drop_below:
                table += (first + s, e - s)
        body = _pack([MAGIC, self.reserved, self.committed, int(count), -1 if capacity is None else int(capacity),
                      len(table) // 2, self.updates + 1] + table)
        self._begin()
        os.pwrite(self._fd, body, 8)
        self._end()

    def close(self) -> None:
        """Closes the file (the view stays for readers)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class ViewReader:
    """A reader's side: consistent readings of a view file (see the module docstring).

    Raises:
        FileNotFoundError: the directory holds no view file (no buffer service has opened it).
    """

    def __init__(self, directory: str, timeout_s: float = 120.0) -> None:
        path = view_path(directory)
        if not os.path.exists(path):
            raise FileNotFoundError(f"{path} does not exist: no buffer service has opened {directory} (the local "
                                    "read path needs the directory the service writes, on this node or a shared "
                                    "filesystem)")
        self.path = path
        self.timeout_s = float(timeout_s)
        self._fd = os.open(path, os.O_RDONLY)
        self.view: Optional[View] = None

    def _header(self) -> np.ndarray:
        """A header read at an instant the counter was even and unchanged around it (retries while the writer
        updates; TimeoutError after `timeout_s`, e.g. when the writer died mid-update and no new one came)."""
        deadline = None
        while True:
            raw = os.pread(self._fd, _HEADER_BYTES, 0)
            again = os.pread(self._fd, 8, 0)
            if len(raw) == _HEADER_BYTES:
                h = np.frombuffer(raw, dtype="<i8")
                if int(h[_MAGIC]) != MAGIC:
                    raise ValueError(f"{self.path} is not a buffer-service view file (bad format tag)")
                if not int(h[_SEQ]) & 1 and raw[:8] == again:
                    return h
            deadline = deadline or time.monotonic() + self.timeout_s
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.path}: the writer did not finish an update within {self.timeout_s} s")
            time.sleep(0.0002)

    def seq(self) -> int:
        """The sequence counter now (cheap: one read; odd while the writer updates)."""
        raw = os.pread(self._fd, 8, 0)
        return _WORD.unpack(raw)[0] if len(raw) == 8 else -1  # type: ignore[no-any-return]

    def reserved(self) -> int:
        """``reserved`` (word 2) read consistently (the hot path of every batch: two small reads)."""
        raw = os.pread(self._fd, 24, 0)
        if len(raw) == 24 and os.pread(self._fd, 8, 0) == raw[:8]:
            seq, magic, reserved = _THREE.unpack(raw)
            if not seq & 1 and magic == MAGIC:
                return reserved  # type: ignore[no-any-return]
        return int(self._header()[_RESERVED])

    def refresh(self) -> View:
        """The current view (re-read only when the counter changed since the last one)."""
        current = self.view
        if current is not None and self.seq() == current.seq:
            return current
        deadline = time.monotonic() + self.timeout_s
        while True:
            h = self._header()
            seq, n = int(h[_SEQ]), int(h[_NSEG])
            body = os.pread(self._fd, 16 * n, _HEADER_BYTES) if n else b""
            if self.seq() == seq and len(body) == 16 * n:
                table = np.frombuffer(body, dtype="<i8").reshape(n, 2)
                cap = int(h[_CAP])
                self.view = View(seq, int(h[_RESERVED]), int(h[_COMMITTED]), int(h[_COUNT]),
                                 None if cap < 0 else cap, table[:, 0].copy(), table[:, 1].copy())
                return self.view
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.path}: no consistent view within {self.timeout_s} s")

    def close(self) -> None:
        """Closes the file."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


__all__ = ["MAGIC", "VIEW_FILE", "View", "ViewReader", "ViewWriter", "view_path"]
