"""What a Ray Data read of a stored dataset reads: columns, episode runs, their split into read tasks, and the read.

Nothing here imports Ray: the driver plans (`plan_read`, `split_runs`) and each read task runs
`_datasource_read.read_runs` on its share of the plan, in whatever process Ray runs it. The datasource itself
(`datasource.py`) only wraps these in Ray's `Datasource` / `ReadTask` types.

Rows are planned by *physical* position: the storage rows a run occupies when the plan is made. A read task
reopens the dataset, checks that every episode it was given is still recorded at those rows, and reads them with
one gather per child storage and block. Logical positions (0 = oldest row) are only reported, in the `index` column.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from unienv_data.base.files import PathLike
from unienv_data.inspect import OpenedDataset, open_dataset

#: The bookkeeping columns every read adds (before `meta_prefix`), in the order they come first in each block.
META_COLUMNS: Tuple[str, ...] = ("episode_id", "step", "episode_start", "episode_end", "index")
#: The column of a dataset whose space is a single leaf (not a dict or tuple).
ROOT_COLUMN = "value"
#: How nested keys are joined into one column name (`{"obs": {"joint": ...}}` -> "obs/joint").
KEY_SEPARATOR = "/"
_META_BYTES_PER_ROW = 8 + 8 + 1 + 1 + 8    # episode_id, step, episode_start, episode_end, index


@dataclass(frozen=True)
class Run:
    """Rows read together and never split between blocks: one recorded episode (`episode_id` >= 0), or with
    `include_unsegmented=True` a maximal run of rows that belong to no episode (`episode_id` == -1)."""

    episode_id: int
    logical_start: int    #: first row in the dataset's logical order (0 = oldest)
    physical_start: int   #: first storage row (a run may wrap past the end of a ring)
    length: int


@dataclass(frozen=True)
class ColumnSpec:
    """One data column: the leaf it comes from, its element dtype and per-row shape."""

    name: str                  #: the column name in the Ray dataset
    key: str                   #: the leaf key as `unienv_data.inspect` names it ("obs/joint", "<value>")
    dtype: str                 #: NumPy dtype name of the leaf ("float32", "bool", "object" for text)
    shape: Tuple[int, ...]     #: per-row shape
    nbytes: int                #: bytes per row (an estimate for text)


@dataclass(frozen=True)
class ReadPlan:
    """Everything a read needs, made once by the driver (`plan_read`); small enough to ship to every task."""

    path: str
    backend: str
    kind: str                              #: "ReplayBuffer", "DictStorage", "FlattenedStorage", ...
    capacity: Optional[int]
    length: int                            #: rows in the dataset when planned (logical length)
    columns: Tuple[ColumnSpec, ...]
    meta_names: Tuple[str, ...]            #: the bookkeeping column names, prefix applied, in META_COLUMNS order
    runs: Tuple[Run, ...]
    unsegmented_rows: int                  #: rows outside every episode (read only with include_unsegmented)
    #: every planned column is held by an array storage (in memory or memory-mapped, possibly flattened), so reading
    #: a row costs a copy, not a decode; `read_unienv` then makes fewer, larger blocks by default
    copy_only: bool = False

    @property
    def num_rows(self) -> int:
        """Rows the read returns."""
        return sum(r.length for r in self.runs)

    @property
    def num_episodes(self) -> int:
        """Recorded episodes the read returns."""
        return sum(1 for r in self.runs if r.episode_id >= 0)

    @property
    def row_nbytes(self) -> int:
        """In-memory bytes of one output row (data columns and bookkeeping columns)."""
        return sum(c.nbytes for c in self.columns) + _META_BYTES_PER_ROW


# ---------------------------------------------------------------------------------------------------- planning
def _leaf_paths(space: Any, prefix: Tuple[str, ...] = ()) -> List[Tuple[Tuple[str, ...], Any]]:
    from unienv_interface.space import DictSpace, TupleSpace
    if isinstance(space, DictSpace):
        out: List[Tuple[Tuple[str, ...], Any]] = []
        for k, v in space.spaces.items():
            out.extend(_leaf_paths(v, prefix + (str(k),)))
        return out
    if isinstance(space, TupleSpace):
        out = []
        for i, v in enumerate(space.spaces):
            out.extend(_leaf_paths(v, prefix + (str(i),)))
        return out
    return [(prefix, space)]


def _column_spec(path: Tuple[str, ...], space: Any) -> ColumnSpec:
    from unienv_interface.space import BinarySpace, BoxSpace
    key = KEY_SEPARATOR.join(path) or "<value>"
    name = KEY_SEPARATOR.join(path) or ROOT_COLUMN
    shape = tuple(int(d) for d in (space.shape or ()))
    count = int(np.prod(shape)) if shape else 1
    if isinstance(space, BinarySpace):
        return ColumnSpec(name, key, "bool", shape, count)
    if isinstance(space, BoxSpace):
        dtype = space.backend.dtype_name(space.dtype)
        try:
            if dtype == "bfloat16":  # NumPy knows it only once ml_dtypes (e.g. JAX) is imported; Arrow never does
                raise TypeError(dtype)
            itemsize = np.dtype(dtype).itemsize
        except TypeError:
            raise TypeError(f"leaf {key!r} has dtype {dtype}, which NumPy and Arrow cannot hold; a Ray Data read "
                            "needs NumPy dtypes (store it as float32, or read it with the library)") from None
        return ColumnSpec(name, key, dtype, shape, count * itemsize)
    max_length = getattr(space, "max_length", None)
    return ColumnSpec(name, key, "object", shape, count * int(max_length or 64))


def _column_specs(space: Any, columns: Optional[Sequence[str]]) -> Tuple[ColumnSpec, ...]:
    specs = [_column_spec(p, sp) for p, sp in _leaf_paths(space)]
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise ValueError(f"leaf keys {dup} collide once nested keys are joined with {KEY_SEPARATOR!r}; rename the "
                         "keys that contain the separator")
    if columns is None:
        return tuple(specs)
    if isinstance(columns, str):
        raise TypeError(f"columns must be a sequence of column names, got the string {columns!r}")
    wanted = list(columns)
    by_name = {s.name: s for s in specs}
    unknown = [c for c in wanted if c not in by_name]
    if unknown:
        raise KeyError(f"columns {unknown} are not in the dataset; its data columns are {names}")
    if len(set(wanted)) != len(wanted):
        raise ValueError(f"columns lists a name twice: {wanted}")
    return tuple(by_name[c] for c in wanted)


def plan_read(path: PathLike, *, columns: Optional[Sequence[str]] = None, backend: str = "auto",
              include_unsegmented: bool = False, meta_prefix: str = "") -> ReadPlan:
    """Opens the dataset at `path` read-only (every check the storages make on load applies), records what a read
    returns, and closes it again.

    Raises:
        FileNotFoundError: (`StorageNotFoundError`) `path` does not exist.
        StorageFormatError: `path` holds no dataset, or its metadata or files are damaged.
        KeyError: a name in `columns` is not a data column.
        ValueError: a data column would be named like a bookkeeping column (pass `meta_prefix`), or leaf keys
            collide once joined.
    """
    if not isinstance(meta_prefix, str):
        raise TypeError(f"meta_prefix must be a str, got {type(meta_prefix).__name__}")
    full = os.path.abspath(os.fspath(path))
    with open_dataset(full, backend) as ds:
        specs = _column_specs(ds.space, columns)
        meta_names = tuple(meta_prefix + m for m in META_COLUMNS)
        all_names = [s.name for s in _column_specs(ds.space, None)]
        clash = sorted(set(meta_names) & set(all_names))
        if clash:
            raise ValueError(f"the dataset has data columns named {clash}, like the bookkeeping columns "
                             f"{list(meta_names)}; pass meta_prefix (e.g. meta_prefix='_') to rename those")
        runs, unsegmented = _plan_runs(ds, include_unsegmented)
        backend_name = backend if backend != "auto" else ds.backend.simplified_name
        return ReadPlan(path=full, backend=str(backend_name), kind=ds.kind, capacity=ds.capacity, length=len(ds),
                        columns=specs, meta_names=meta_names, runs=tuple(runs), unsegmented_rows=unsegmented,
                        copy_only=_copy_only(ds, specs))


def _copy_only(ds: OpenedDataset, specs: Sequence[ColumnSpec]) -> bool:
    """Whether every child storage holding a planned column is an array storage (`ArrayStorageBase`: NumPy memmap,
    PyTorch tensors), directly or inside wrappers such as `FlattenedStorage`."""
    from unienv_data.base.wrapper import WrappedStorage
    from unienv_data.storages._array_storage import ArrayStorageBase
    wanted = {s.key for s in specs}
    for child, _prefix, keys in ds.columns():
        if not wanted.intersection(keys):
            continue
        inner = child
        while isinstance(inner, WrappedStorage):
            inner = inner.inner_storage
        if not isinstance(inner, ArrayStorageBase):
            return False
    return True


def _plan_runs(ds: OpenedDataset, include_unsegmented: bool) -> Tuple[List[Run], int]:
    """Episodes (and the gaps between them) in logical order, with their physical first rows."""
    n = len(ds)
    spans: List[Tuple[int, int, int]] = []      # (episode id, logical start, length)
    cursor = 0
    unsegmented = 0
    for eid, (s, e) in enumerate(ds.episodes()):
        if s > cursor:
            unsegmented += s - cursor
            spans.append((-1, cursor, s - cursor))
        spans.append((eid, s, e - s))
        cursor = e
    if n > cursor:
        unsegmented += n - cursor
        spans.append((-1, cursor, n - cursor))
    if not include_unsegmented:
        spans = [sp for sp in spans if sp[0] >= 0]
    if not spans:
        return [], unsegmented
    phys = ds.physical(np.array([sp[1] for sp in spans], dtype=np.int64))
    return [Run(eid, s, int(p), length) for (eid, s, length), p in zip(spans, phys)], unsegmented


def split_runs(runs: Sequence[Run], parts: int) -> List[List[Run]]:
    """`runs` cut into `min(parts, len(runs))` consecutive, non-empty groups of about equal row counts; no run is
    ever split. Raises ValueError for `parts` < 1."""
    if isinstance(parts, bool) or not isinstance(parts, (int, np.integer)) or parts < 1:
        raise ValueError(f"parts must be an int >= 1, got {parts!r}")
    m = min(int(parts), len(runs))
    if m == 0:
        return []
    ends = np.cumsum([r.length for r in runs])
    total = int(ends[-1])
    cuts = [0]
    for k in range(1, m):
        target = total * k / m
        j = int(np.searchsorted(ends, target))          # first run whose end reaches the target
        if j + 1 < len(runs) and j > 0 and abs(ends[j - 1] - target) < abs(ends[j] - target):
            j -= 1
        cut = j + 1                                     # the group ends after run j
        cut = max(cut, cuts[-1] + 1)                    # every group holds at least one run ...
        cut = min(cut, len(runs) - (m - k))             # ... and enough runs remain for the groups after it
        cuts.append(cut)
    cuts.append(len(runs))
    return [list(runs[a:b]) for a, b in zip(cuts[:-1], cuts[1:])]


def chunk_runs(runs: Sequence[Run], max_rows: int) -> List[List[Run]]:
    """Consecutive runs grouped so that a group holds at most `max_rows` rows, except a single run longer than that
    (runs are never split)."""
    out: List[List[Run]] = []
    current: List[Run] = []
    rows = 0
    for r in runs:
        if current and rows + r.length > max_rows:
            out.append(current)
            current, rows = [], 0
        current.append(r)
        rows += r.length
    if current:
        out.append(current)
    return out


# ---------------------------------------------------------------------------------------------------- columns
def meta_arrays(runs: Sequence[Run]) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """`(episode_id, step, episode_start, episode_end, index)` of every row of `runs`, in order. Rows outside every
    episode have episode_id and step -1 and both flags False."""
    lengths = np.array([r.length for r in runs], dtype=np.int64)
    total = int(lengths.sum())
    ids = np.array([r.episode_id for r in runs], dtype=np.int64)
    firsts = np.cumsum(lengths) - lengths                       # first output row of each run
    pos = np.arange(total, dtype=np.int64)
    episode_id = np.repeat(ids, lengths)
    step = pos - np.repeat(firsts, lengths)
    index = step + np.repeat(np.array([r.logical_start for r in runs], dtype=np.int64), lengths)
    in_episode = episode_id >= 0
    episode_end = in_episode & (step == np.repeat(lengths - 1, lengths))
    episode_start = in_episode & (step == 0)
    step = np.where(in_episode, step, -1)
    return episode_id, step, episode_start, episode_end, index


def zero_batch(plan: ReadPlan, rows: int = 0) -> Dict[str, np.ndarray]:
    """A batch of `rows` zero rows with every planned column in its dtype and per-row shape."""
    out: Dict[str, np.ndarray] = {}
    for name, dtype in zip(plan.meta_names, ("int64", "int64", "bool", "bool", "int64")):
        out[name] = np.zeros((rows,), dtype=dtype)
    for spec in plan.columns:
        out[spec.name] = np.zeros((rows,) + spec.shape, dtype=spec.dtype)
    return out
