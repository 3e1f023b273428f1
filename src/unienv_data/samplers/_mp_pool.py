"""The worker pool of `MultiprocessingSampler`, parent side: starting the worker processes with their pipes and the
shared-memory slot file, and shutting all of it down again.

`WorkerPool.shutdown` may run from a ``weakref.finalize`` hook of the sampler, so the pool never refers back to
the sampler; and it does nothing in a forked copy of the parent, whose workers are not its own.
"""
from __future__ import annotations

import mmap
import multiprocessing.connection
import os
import time
from typing import Any, List, Optional

import numpy as np

from unienv_data.base.files import remove_quietly

from ._mp_slots import close_mapping, map_slots, new_slot_path
from ._mp_worker import Carrier, worker_main


class WorkerPool:
    """Everything the workers hold, owned by the parent: `procs` and `conns` (the parent's end of each worker's
    pipe, same index), and with shared memory the slot file's `shm_path` (None once unlinked), mapping `mm` and
    `slots` view."""

    def __init__(self) -> None:
        self.owner_pid = os.getpid()
        self.procs: List[Any] = []
        self.conns: List[Any] = []
        self.shm_path: Optional[str] = None
        self.mm: Optional[mmap.mmap] = None
        self.slots: Optional[np.ndarray] = None
        self.closed = False

    def start(self, ctx: Any, sampler: Any, n_workers: int, n_slots: int, slot_bytes: Optional[int],
              base_seed: int, doze_time: float, daemon: Optional[bool]) -> None:
        """Creates the slot file (`n_slots` slots of `slot_bytes`, when that is not None) and starts `n_workers`
        processes of `ctx`, each serving its own copy of `sampler`."""
        if slot_bytes is not None:
            self.shm_path = new_slot_path()
            self.mm, self.slots = map_slots(self.shm_path, n_slots, slot_bytes, create=True)
        carrier = Carrier(sampler)
        for w in range(n_workers):
            mine, theirs = ctx.Pipe(duplex=True)
            p = ctx.Process(
                target=worker_main, name=f"unienv-sampler-worker-{w}",
                args=(w, carrier, theirs, self.shm_path, n_slots, slot_bytes or 0, base_seed, doze_time,
                      os.getpid()),
                daemon=True if daemon is None else bool(daemon))
            self.procs.append(p)
            self.conns.append(mine)
            try:
                p.start()
            finally:
                theirs.close()  # only the worker holds its end: its death shows as EOF here

    def unlink_slot_file(self) -> None:
        """Removes the slot file's name (every worker has mapped it, or the pool is shutting down)."""
        remove_quietly(self.shm_path)
        self.shm_path = None

    def shutdown(self, timeout: float = 5.0) -> None:
        """A stop message to every worker, join for up to `timeout` s, then terminate, then kill; then closes the
        pipes and processes and frees the slot file. Idempotent."""
        if self.closed:
            return
        self.closed = True
        if os.getpid() != self.owner_pid:  # a forked copy of the parent must not touch the parent's workers
            return
        try:
            for c in self.conns:
                try:
                    c.send(None)
                except (OSError, ValueError):
                    pass
            deadline = time.monotonic() + timeout
            alive = [p for p in self.procs if p.is_alive()]
            while alive and time.monotonic() < deadline:
                self._drain()  # a worker blocked on a full pipe would never read its stop message
                multiprocessing.connection.wait([p.sentinel for p in alive], timeout=0.02)
                alive = [p for p in alive if p.is_alive()]
            for p in alive:
                p.terminate()
            for p in alive:
                p.join(1.0)
                if p.is_alive():
                    p.kill()
                    p.join(1.0)
        finally:
            for c in self.conns:
                try:
                    c.close()
                except OSError:
                    pass
            for p in self.procs:
                try:
                    p.close()
                except ValueError:
                    pass
            self.slots = None
            close_mapping(self.mm)
            self.mm = None
            self.unlink_slot_file()

    def _drain(self) -> None:
        for c in self.conns:
            try:
                while c.poll():
                    c.recv()
            except (EOFError, OSError):
                pass


__all__ = ["WorkerPool"]
