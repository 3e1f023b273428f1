"""The read a Ray Data read task runs: reopen the dataset, check the planned episodes are still there, read them.

No Ray import here either. The driver validated the whole dataset when it planned the read (the library's own
`load_from` of the buffer or storage, see `_datasource_plan.plan_read`); a read task opens only the storage that
holds the rows, read-only, with that storage's own checks on load, and takes the recorded segments from the same
place the `ReplayBuffer` would (the storage's persisted log, else the buffer's metadata). It does not re-run the
buffer-level validation, whose cost grows with the square of the number of episodes.
"""
from __future__ import annotations

import os
from typing import Any, Dict, Iterator, List, Optional, Sequence, Set, Tuple

import numpy as np

from unienv_data.base.errors import StorageFormatError, StorageStateError
from unienv_data.base.files import confined_path, read_json
from unienv_data.base.registry import resolve_storage_class
from unienv_data.base.ring import run_length
from unienv_data.base.storage import SpaceStorage
from unienv_data.inspect import choose_backend, flatten_tree, open_dataset, storage_columns, walk
from unienv_data.replay_buffer._buffer_log import apply_buffer_log
from unienv_interface.space.space_utils.serialization_utils import json_to_space

from ._datasource_plan import ReadPlan, Run, chunk_runs, meta_arrays

_BUFFER_METADATA = "metadata.json"


class TaskStorage:
    """The storage a read task reads from, with the physical segments recorded in the dataset right now."""

    def __init__(self, storage: SpaceStorage, backend: Any, recorded: Set[Tuple[int, int]], owner: Any) -> None:
        self.storage = storage
        self.backend = backend
        self.capacity: Optional[int] = storage.capacity
        #: recorded segments as physical (start, length)
        self.recorded = recorded
        self._owner = owner
        self.children = storage_columns(storage)

    def close(self) -> None:
        """Closes what was opened (the storage, or the dataset around it)."""
        self._owner.close()


def _runs_of(segments: Optional[List[Tuple[int, int]]], capacity: Optional[int]) -> Set[Tuple[int, int]]:
    """Inclusive physical `(start, end)` pairs as `(start, length)`."""
    out = set()
    for s, e in segments or []:
        out.add((int(s), run_length(int(s), int(e), capacity or None)))
    return out


def open_for_task(plan: ReadPlan) -> TaskStorage:
    """Opens the storage holding the dataset's rows, read-only (see the module docstring)."""
    if plan.kind != "ReplayBuffer":
        ds = open_dataset(plan.path, plan.backend)
        segs = ds.storage.episode_segments()
        return TaskStorage(ds.storage, ds.backend, _runs_of(segs, ds.capacity), ds)
    meta_path = os.path.join(plan.path, _BUFFER_METADATA)
    meta = apply_buffer_log(plan.path, read_json(meta_path, "ReplayBuffer metadata"))    # commits since it was written
    try:
        backend = choose_backend(walk(plan.path) if plan.backend == "auto" else None, plan.backend)  # type: ignore[arg-type]
        space = json_to_space(meta["single_instance_space"], backend)
        storage_cls = resolve_storage_class(meta["storage_cls"], meta_path)
        full = confined_path(plan.path, meta["storage_path_relative"], meta_path)
        cap = meta["capacity"]
    except (KeyError, TypeError) as exc:
        raise StorageFormatError(f"{meta_path}: changed since the read was planned and is no longer valid "
                                 f"({type(exc).__name__}: {exc})") from None
    storage = storage_cls.load_from(full, space, capacity=cap, read_only=True)
    if cap != plan.capacity:
        storage.close()
        raise StorageStateError(f"{meta_path}: capacity is now {cap}, the read was planned for {plan.capacity}")
    # the same rule as ReplayBuffer.load_from: a maintained list (physical_segments) is authoritative; otherwise a
    # storage that persists its own segment list is, and else the buffer's own list (buffer_segments)
    listed = meta.get("physical_segments")
    maintain = bool(meta.get("maintain_segment_metadata", listed is not None))
    if listed is None:
        listed = meta.get("buffer_segments")
    if listed is not None and (maintain or not storage.has_persistent_segments()):
        recorded = _runs_of([tuple(p) for p in listed], cap)
    else:
        recorded = _runs_of(storage.episode_segments(), cap)
    return TaskStorage(storage, backend, recorded, storage)


def check_runs(task: TaskStorage, plan: ReadPlan, runs: Sequence[Run]) -> None:
    """Raises StorageStateError when an episode of `runs` is no longer recorded at its planned rows (the dataset
    was written after the read was planned) or a run lies beyond the storage."""
    cap = task.capacity
    rows = len(task.storage) if cap is None else cap
    for r in runs:
        if r.episode_id >= 0 and (r.physical_start, r.length) not in task.recorded:
            raise StorageStateError(
                f"{plan.path}: episode {r.episode_id} (storage rows {r.physical_start}.."
                f"{r.physical_start + r.length - 1}{' mod ' + str(cap) if cap else ''}) is no longer recorded there; "
                "the dataset was written after the read was planned (read a dataset no process writes to, or a copy "
                "made with dumps())")
        if cap is None and r.physical_start + r.length > rows:
            raise StorageStateError(f"{plan.path}: rows {r.physical_start}..{r.physical_start + r.length - 1} lie "
                                    f"beyond the storage's {rows} rows; the dataset shrank after the read was planned")


def physical_index(runs: Sequence[Run], capacity: Optional[int]) -> Any:
    """A slice when the runs cover consecutive storage rows without wrapping, else an int64 index array."""
    total = sum(r.length for r in runs)
    first = runs[0].physical_start
    expect = first
    contiguous = True
    for r in runs:
        if r.physical_start != expect:
            contiguous = False
            break
        expect = r.physical_start + r.length
    if contiguous and (capacity is None or first + total <= capacity):
        return slice(first, first + total)
    idx = np.concatenate([np.arange(r.physical_start, r.physical_start + r.length, dtype=np.int64) for r in runs])
    return idx % capacity if capacity else idx


def read_chunk(task: TaskStorage, plan: ReadPlan, runs: Sequence[Run]) -> Dict[str, np.ndarray]:
    """`{column: array}` of the rows of `runs`: bookkeeping columns first, then the planned data columns in the
    space's key order, each in its leaf's dtype and per-row shape (checked against the plan)."""
    out: Dict[str, np.ndarray] = dict(zip(plan.meta_names, meta_arrays(runs)))
    idx = physical_index(runs, task.capacity)
    rows = sum(r.length for r in runs)
    by_key = {c.key: c for c in plan.columns}
    got: Dict[str, np.ndarray] = {}
    for child, prefix, keys in task.children:
        if not any(k in by_key for k in keys):
            continue
        for key, value in flatten_tree(child.get(idx), prefix).items():
            spec = by_key.get(key)
            if spec is None:
                continue
            arr = np.asarray(task.backend.to_numpy(value))
            if spec.dtype != "object" and (arr.dtype != np.dtype(spec.dtype) or arr.shape != (rows,) + spec.shape):
                raise StorageFormatError(f"{plan.path}: leaf {key!r} read back as {arr.dtype}{list(arr.shape)}, "
                                         f"expected {spec.dtype}{[rows, *spec.shape]} from its space")
            got[spec.name] = arr
    for spec in plan.columns:
        out[spec.name] = got[spec.name]
    return out


def read_runs(plan: ReadPlan, runs: Sequence[Run], max_rows: int) -> Iterator[Dict[str, np.ndarray]]:
    """Opens the dataset's storage, checks that `runs` are still recorded (`check_runs`) and yields one
    `{column: array}` batch per group of whole runs of at most `max_rows` rows (a longer single run is one batch)."""
    if not runs:
        return
    task = open_for_task(plan)
    try:
        check_runs(task, plan, runs)
        for group in chunk_runs(runs, max(1, int(max_rows))):
            yield read_chunk(task, plan, group)
    finally:
        task.close()
