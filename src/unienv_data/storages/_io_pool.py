"""One bounded thread pool per process for the per-file IO of file-backed storages (reference-api §5.10).

Decoding and encoding files (zlib in NPZ, Parquet codecs, image codecs) and the file system calls themselves
release the GIL, so reading or writing many small files scales with cores up to `IO_POOL_WORKERS` threads.

* `shared_io_pool()` creates the pool on first use; a forked child gets a new one (pool threads do not survive
  `fork`, and a lock held by one of them at fork time would never be released in the child).
* `map_io(fn, items)` is `list(map(fn, items))`: in the calling thread for fewer than `min_parallel` items or when
  called from a pool thread (a pool thread waiting on the same bounded pool could deadlock), on the pool otherwise.
  The items are split into one contiguous run per worker (one task each, so a batch of hundreds of small files
  costs a handful of task hand-offs, not hundreds). Results keep the order of `items`; the first exception raised
  by `fn` propagates once every run has finished, so no file operation is still running behind the caller's back
  when it sees the error (a run stops at its first failing item).
"""
from __future__ import annotations

import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Iterable, List, Optional, TypeVar

T = TypeVar("T")

#: Threads of the shared pool.
IO_POOL_WORKERS: int = min(8, os.cpu_count() or 1)
#: Batches with fewer items than this run in the calling thread.
PARALLEL_IO_MIN_ITEMS: int = 4

_THREAD_PREFIX = "unienv-io"

_state_lock = threading.Lock()
_pool: Optional[ThreadPoolExecutor] = None
_pool_pid: Optional[int] = None
_pool_threads: "set[int]" = set()


def _reset_after_fork() -> None:
    global _pool, _pool_pid, _state_lock, _pool_threads
    _pool, _pool_pid, _state_lock, _pool_threads = None, None, threading.Lock(), set()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)


def _mark_pool_thread() -> None:
    _pool_threads.add(threading.get_ident())


def shared_io_pool() -> ThreadPoolExecutor:
    """This process's IO pool (created on first use, and again in a forked child)."""
    global _pool, _pool_pid
    pid = os.getpid()
    pool = _pool
    if pool is not None and _pool_pid == pid:
        return pool
    with _state_lock:
        if _pool is None or _pool_pid != pid:
            _pool = ThreadPoolExecutor(max_workers=IO_POOL_WORKERS, thread_name_prefix=_THREAD_PREFIX,
                                       initializer=_mark_pool_thread)
            _pool_pid = pid
        return _pool


def in_io_pool_thread() -> bool:
    """True when the calling thread is one of the shared pool's workers."""
    return threading.get_ident() in _pool_threads


def map_io(fn: Callable[[Any], T], items: Iterable[Any], min_parallel: int = PARALLEL_IO_MIN_ITEMS) -> List[T]:
    """`[fn(x) for x in items]`, on the shared pool when there are enough items (see the module docstring)."""
    seq = list(items)
    if len(seq) < max(2, min_parallel) or IO_POOL_WORKERS <= 1 or in_io_pool_thread():
        return [fn(x) for x in seq]
    pool = shared_io_pool()
    k = min(IO_POOL_WORKERS, len(seq))
    bounds = [len(seq) * i // k for i in range(k + 1)]
    futures: List[Future] = [pool.submit(_run, fn, seq[bounds[i]:bounds[i + 1]]) for i in range(k)]
    error: Optional[BaseException] = None
    out: List[Any] = []
    for fut in futures:
        try:
            out.extend(fut.result())
        except BaseException as exc:  # noqa: BLE001 - re-raised below, once every run is done
            if error is None:
                error = exc
    if error is not None:
        raise error
    return out


def _run(fn: Callable[[Any], T], items: List[Any]) -> List[T]:
    return [fn(x) for x in items]


__all__ = ["IO_POOL_WORKERS", "PARALLEL_IO_MIN_ITEMS", "shared_io_pool", "in_io_pool_thread", "map_io"]
