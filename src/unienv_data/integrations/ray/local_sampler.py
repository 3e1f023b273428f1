"""`LocalSampler`: a learner on the buffer's node samples the service's directory in its own process.

The remote sampler pays a call and object-store copies per block; a learner that sees the buffer directory (the
actor's node, or a shared filesystem) can instead open it read-only (memory-mapped) and gather batches itself, at
the speed of an in-process sampler. Which rows it may draw comes from the view the actor publishes after every
commit (`_view`: whole committed, durable episodes, in absolute row numbers), checked with one small read per
batch; new episodes show up at the next batch.

Consistency while the actor keeps committing into a wrapping ring (a seqlock): the actor announces the rows it is
about to overwrite before it writes them. A batch is gathered, then the announcement is read again; every sampled
row whose episode could have been overwritten meanwhile is drawn again (from the refreshed view) until none is. So
a batch holds only rows of episodes that were whole and committed for the whole time their rows were copied, never
a row mixing two episodes, never a row of a dropped episode.

Ray-free: usable in any process of the node (a DataLoader worker, a script) given the directory.
"""
from __future__ import annotations

import os
import time
from typing import Any, Dict, Optional, Tuple

import numpy as np

from unienv_data.replay_buffer import ReplayBuffer
from unienv_interface.backends import NumpyComputeBackend

from ._view import View, ViewReader

#: Rounds of redrawing rows that an overwrite reached before `sample` gives up (each round refreshes the view).
MAX_REDRAWS = 1000


def _scatter(batch: Any, positions: np.ndarray, rows: Any) -> None:
    if isinstance(batch, dict):
        for k in batch:
            _scatter(batch[k], positions, rows[k])
        return
    batch[positions] = rows


class LocalSampler:
    """Batches of `batch_size` rows drawn uniformly (with replacement) from the whole committed episodes of the
    service's buffer in `directory`, read in this process (see the module docstring).

    Args:
        directory: the buffer directory the service writes (``client.info()["directory"]``), as seen from here.
        batch_size: rows per batch.
        seed: seeds the row draws (None: fresh entropy).
        timeout_s: how long a read of the view waits for the writer to finish an update.

    Raises:
        FileNotFoundError: `directory` holds no buffer or no service view (not on this node / filesystem).
        ValueError: a bad `batch_size`, or a storage that cannot be read while the actor writes it (only
            memory-mapped storages can: the "native" and "flat" layouts; use the remote sampler otherwise).
    """

    def __init__(self, directory: str, batch_size: int, *, seed: Optional[int] = None,
                 timeout_s: float = 120.0) -> None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        directory = os.path.abspath(os.fspath(directory))
        if not ReplayBuffer.is_loadable_from(directory):
            raise FileNotFoundError(f"{directory} holds no replay buffer here; the local read path needs the "
                                    "service's directory on this node (or a shared filesystem): use "
                                    "client.sampler() from other nodes")
        self.directory = directory
        self.batch_size = batch_size
        self._reader = ViewReader(directory, timeout_s)
        self._rng = np.random.default_rng(seed)
        self._buffer: Optional[ReplayBuffer] = None
        self._rows = 0
        self._open()
        self._view: Optional[View] = None
        self._cum: np.ndarray = np.zeros(0, np.int64)
        self._contiguous = False
        self._first_phys = 0
        #: rows drawn again because an overwrite reached their episode while they were copied
        self.redrawn_rows = 0
        #: batches returned
        self.batches = 0

    # ------------------------------------------------------------------ opening
    def _open(self) -> None:
        if self._buffer is not None:
            self._buffer.close()
        buffer = ReplayBuffer.load_from(self.directory, backend=NumpyComputeBackend, read_only=True)
        st = buffer.storage
        if st is None or not st.is_multiprocessing_safe:
            name = type(st).__name__
            buffer.close()
            raise ValueError(f"the local read path needs a memory-mapped storage (the 'native' or 'flat' layout); "
                             f"{self.directory} holds a {name}, which cannot be read while the actor writes it: "
                             "use client.sampler() instead")
        self._buffer = buffer
        self._rows = len(st)

    @property
    def buffer(self) -> ReplayBuffer:
        """The read-only buffer this sampler reads rows from (its length and segments are as of opening)."""
        if self._buffer is None:
            raise ValueError("the LocalSampler is closed")
        return self._buffer

    # ------------------------------------------------------------------ the view
    def _current(self) -> View:
        view = self._reader.refresh()
        if view is not self._view:
            self._view = view
            self._cum = np.cumsum(view.lengths)
            # episodes back to back: a draw maps to its physical row by one addition (and a wrap)
            self._contiguous = bool(view.starts.size) and bool(
                np.all(view.starts[1:] == view.starts[:-1] + view.lengths[:-1]))
            if view.starts.size:
                first = int(view.starts[0])
                self._first_phys = first if view.capacity is None else first % view.capacity
            if view.capacity is None and view.committed > self._rows:
                self._open()                 # a growable buffer grew past the rows mapped here
        return view

    @property
    def committed_rows(self) -> int:
        """Rows of whole committed episodes the next batch draws from (refreshes the view)."""
        view = self._current()
        return int(self._cum[-1]) if view.lengths.size else 0

    def _draw(self, view: View, n: int, skip_below: int = -1) -> Tuple[np.ndarray, Optional[np.ndarray]]:
        """`(physical rows, absolute rows or None)` of `n` uniform draws over the episodes `view` lists that start
        at or above `skip_below` (one at least: see `_usable`; absolute rows are left to `_absolute` when the
        episodes are back to back)."""
        cum, cap = self._cum, view.capacity
        k = 0 if skip_below <= int(view.starts[0]) else int(np.searchsorted(view.starts, skip_below, side="left"))
        base, total = (int(cum[k - 1]) if k else 0), int(cum[-1])
        if self._contiguous:
            lo = self._first_phys + base
            phys = self._rng.integers(lo, lo + total - base, size=n, dtype=np.int64)
            if cap is not None:
                np.subtract(phys, cap, out=phys, where=phys >= cap)
            return phys, None
        u = self._rng.integers(base, total, size=n, dtype=np.int64)
        seg = np.searchsorted(cum, u, side="right")
        rows = view.starts[seg] + u - (cum[seg] - view.lengths[seg])
        return (rows if cap is None else rows % cap), rows

    def _absolute(self, view: View, phys: np.ndarray, rows: Optional[np.ndarray]) -> np.ndarray:
        if rows is not None:
            return rows
        cap = view.capacity
        return int(view.starts[0]) + (phys - self._first_phys if cap is None else (phys - self._first_phys) % cap)

    def _usable(self) -> View:
        """The current view, once it lists an episode no announced overwrite reaches (waits while a commit
        overwrites every listed episode; TimeoutError after the reader's timeout)."""
        deadline = None
        while True:
            view = self._current()
            if not view.lengths.size:
                raise ValueError(f"sample: the buffer in {self.directory} has no committed episode yet")
            if int(view.starts[-1]) >= view.drop_below:
                return view
            deadline = deadline or time.monotonic() + self._reader.timeout_s
            if time.monotonic() > deadline:
                raise TimeoutError(f"sample: every episode of the buffer in {self.directory} stayed announced for "
                                   f"overwriting for {self._reader.timeout_s} s")
            time.sleep(0.0005)

    def _gather(self, phys: np.ndarray) -> Any:
        return self.buffer.storage.get(phys)  # type: ignore[union-attr]

    # ------------------------------------------------------------------ sampling
    def sample(self) -> Any:
        """The next batch: NumPy arrays in the space's structure, `batch_size` rows each (fresh, writable copies).

        Raises:
            ValueError: the buffer has no committed episode yet.
            RuntimeError: rows kept being overwritten while they were copied for `MAX_REDRAWS` rounds (the ring
                is far too small for the commit rate).
        """
        view = self._usable()
        phys, rows = self._draw(view, self.batch_size, view.drop_below)   # not from episodes being overwritten
        batch = self._gather(phys)
        if view.capacity is not None:
            self._settle(batch, view, phys, rows)
        self.batches += 1
        return batch

    def _settle(self, batch: Any, view: View, phys: np.ndarray, rows: Optional[np.ndarray]) -> None:
        """Redraws, until none is left, the rows whose episode an overwrite announced after `view` may have reached
        while they were copied (rows drawn from `view`, already gathered into `batch`)."""
        positions: Optional[np.ndarray] = None           # batch positions of the rows drawn last (None: all)
        for _ in range(MAX_REDRAWS):
            drop_below = self._reader.reserved() - view.capacity  # type: ignore[operator]
            if int(view.starts[0]) >= drop_below:
                return                                   # no episode of `view` was reached: every row is whole
            absolute = self._absolute(view, phys, rows)
            episode = np.searchsorted(view.starts, absolute, side="right") - 1
            bad = np.flatnonzero(view.starts[episode] < drop_below)
            if not bad.size:
                return
            self.redrawn_rows += int(bad.size)
            positions = bad if positions is None else positions[bad]
            view = self._usable()                        # it knows the overwrite: draws skip what it reaches
            phys, rows = self._draw(view, int(bad.size), view.drop_below)
            _scatter(batch, positions, self._gather(phys))
        raise RuntimeError(f"sample: rows were overwritten while being copied {MAX_REDRAWS} times in a row; the ring "
                           "is too small for the commit rate")

    def __iter__(self) -> "LocalSampler":
        return self

    def __next__(self) -> Any:
        return self.sample()

    def info(self) -> Dict[str, Any]:
        """The current view in numbers: committed rows and episodes, the buffer length, redrawn rows, batches."""
        view = self._current()
        return {"episodes": int(view.lengths.size), "committed_rows": self.committed_rows, "length": view.count,
                "capacity": view.capacity, "redrawn_rows": self.redrawn_rows, "batches": self.batches,
                "view_updates": view.seq // 2}

    def close(self) -> None:
        """Closes the buffer and the view file. Idempotent."""
        if self._buffer is not None:
            self._buffer.close()
            self._buffer = None
        self._reader.close()


__all__ = ["LocalSampler", "MAX_REDRAWS"]
