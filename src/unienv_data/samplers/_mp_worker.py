"""The worker process of `MultiprocessingSampler`: receiving the wrapped sampler, seeding it, and answering the
parent's requests with packed batches until told to stop or orphaned.

Protocol. The parent sends a list of requests per message, each ``(request id, kind, args, slot, seed state)``
(``None`` stops the worker). The worker answers each on the same pipe with ``(tag, worker, request id, body,
payload)``: ``"ready"`` once after starting; ``"fatal"`` when starting failed and ``"err"`` when a request failed,
both with body ``(pickled exception or None, traceback text)``; ``"ok"`` with body ``(layout id, description or
None)`` and a payload (None when the batch is in the slot).

`worker_main` is the process target: a top-level function, so that ``spawn`` and ``forkserver`` can import it.
"""
from __future__ import annotations

import io
import mmap
import os
import pickle
import random
import signal
import sys
import traceback
from multiprocessing.reduction import ForkingPickler
from typing import Any, Dict, Optional, Tuple

import numpy as np

from ._mp_packing import pack
from ._mp_slots import close_mapping, map_slots

SAMPLE_KINDS = ("sample", "sample_flat", "sample_with_metadata", "sample_flat_with_metadata")
"""Requests answered by calling that method of the wrapped sampler."""
EPOCH_KINDS = ("get_at", "get_flattened_at", "get_at_with_metadata", "get_flattened_at_with_metadata")
"""Requests for one chunk of an epoch, answered by calling that method of the sampler's data."""


class _ByValuePickler(ForkingPickler):
    """multiprocessing's pickler (shared locks, shared arrays and file descriptors go to the child) without torch's
    tensor reductions: tensors travel by value. torch would move each tensor to shared memory and pass a file
    descriptor that is closed again as soon as the tensor is freed, which for temporaries (the state tensor a
    `torch.Generator` pickles itself as) happens before the child is launched."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.dispatch_table = {t: r for t, r in self.dispatch_table.items()
                               if not str(getattr(t, "__module__", "")).startswith("torch")}


class Carrier:
    """Hands the wrapped sampler to a worker. Under fork the object is inherited; otherwise it is pickled when the
    process is started and unpickled inside the worker, so a failure there is reported with its traceback."""

    def __init__(self, obj: Any, blob: Optional[bytes] = None) -> None:
        """`obj`: the sampler; `blob`: instead, the sampler pickled (how a carrier arrives in a spawned worker),
        unpickled by the first `get()`."""
        self._obj = obj
        self._blob = blob

    def __reduce__(self) -> Any:
        buf = io.BytesIO()
        _ByValuePickler(buf, pickle.HIGHEST_PROTOCOL).dump(self._obj)
        return (Carrier, (None, buf.getvalue()))

    def get(self) -> Any:
        if self._blob is not None:
            obj, self._blob = pickle.loads(self._blob), None
            return obj
        return self._obj


def _derive_seed(base: int, worker: int) -> int:
    """The seed of `worker`: a function of the base seed and the worker index only, so `manual_seed(s)` restarts
    exactly the streams of a sampler created with `seed=s`."""
    return int(np.random.SeedSequence([base, worker, 0x5A3D]).generate_state(1)[0])


def _reseed(sampler: Any, seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.manual_seed(seed)
    reseed = getattr(sampler, "manual_seed", None)
    if callable(reseed):
        reseed(seed)


def _exception_payload(exc: BaseException) -> Tuple[Optional[bytes], str]:
    """`(pickled exception or None when it does not survive a pickle round trip, traceback text)`."""
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    try:
        blob: Optional[bytes] = pickle.dumps(exc)
        pickle.loads(blob)  # type: ignore[arg-type]
    except Exception:
        blob = None
    return blob, text


def _reply(conn: Any, message: Any) -> bool:
    """Sends `message` to the parent; False when the parent's end is gone."""
    try:
        conn.send(message)
        return True
    except OSError:
        return False


class _Server:
    """The state of one worker: its sampler, its slots, its seed, the batch layouts it has described."""

    def __init__(self, worker: int, sampler: Any, conn: Any, slots: Optional[np.ndarray], base_seed: int) -> None:
        self.worker = worker
        self.sampler = sampler
        self.conn = conn
        self.slots = slots
        self.seed_state: Any = (0, base_seed)
        self.perm_key: Any = None
        self.perm = np.zeros(0, dtype=np.int64)
        self.spec_ids: Dict[Any, int] = {}
        _reseed(sampler, _derive_seed(base_seed, worker))

    def serve(self, task: Any) -> bool:
        """Answers one request; False when the parent's end of the pipe is gone."""
        req_id, kind, args, slot, seed_state = task
        try:
            if seed_state != self.seed_state:  # manual_seed() in the parent: the new base seed comes along
                self.seed_state = seed_state
                _reseed(self.sampler, _derive_seed(seed_state[1], self.worker))
            if kind in SAMPLE_KINDS:
                out = getattr(self.sampler, kind)()
            elif kind not in EPOCH_KINDS:
                raise ValueError(f"unknown request {kind!r}")
            else:  # one chunk of an epoch: the permutation is recomputed from its seed, so requests stay small
                epoch_seed, n, start, stop = args
                if self.perm_key != (epoch_seed, n):
                    self.perm, self.perm_key = np.random.default_rng(epoch_seed).permutation(n), (epoch_seed, n)
                out = getattr(self.sampler.data, kind)(self.perm[start:stop])
            spec, payload = pack(out, None if slot is None or self.slots is None else self.slots[slot])
            del out
            try:
                sid = self.spec_ids.get(spec)
                described: Any = ((sid, None) if sid is not None
                                  else (self.spec_ids.setdefault(spec, len(self.spec_ids)), spec))
            except TypeError:  # a leaf that is not hashable: send the full description every time
                described = (-1, spec)
            message = ForkingPickler.dumps(("ok", self.worker, req_id, described, payload))
        except BaseException as exc:  # reported to the parent, which re-raises it
            return _reply(self.conn, ("err", self.worker, req_id, _exception_payload(exc), None))
        try:
            self.conn.send_bytes(message)
            return True
        except OSError:
            return False


def worker_main(worker: int, carrier: Carrier, conn: Any, shm_path: Optional[str], n_slots: int,
                slot_bytes: int, base_seed: int, doze_time: float, parent_pid: int) -> None:
    """A worker: answers the requests that arrive on its pipe `conn` (a list of requests per message) until a
    stop message, or until its parent is gone (checked every `doze_time` seconds while idle)."""
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    except ValueError:
        pass
    mm: Optional[mmap.mmap] = None
    slots: Optional[np.ndarray] = None
    try:
        sampler = carrier.get()
        torch = sys.modules.get("torch")
        if torch is not None:
            torch.set_num_threads(1)
        if shm_path is not None:
            mm, slots = map_slots(shm_path, n_slots, slot_bytes, create=False)
        server = _Server(worker, sampler, conn, slots, base_seed)
    except BaseException as exc:
        _reply(conn, ("fatal", worker, None, _exception_payload(exc), None))
        return
    running = _reply(conn, ("ready", worker, None, None, None))
    while running:
        try:
            if not conn.poll(doze_time):
                running = os.getppid() == parent_pid
                continue
            tasks = conn.recv()
        except (EOFError, OSError):
            break
        if tasks is None:
            break
        for task in tasks:
            if not server.serve(task):
                running = False
                break
    server.slots = slots = None
    close_mapping(mm)


__all__ = ["SAMPLE_KINDS", "EPOCH_KINDS", "Carrier", "worker_main"]
