"""A Ray Data datasource over datasets this library wrote: `read_unienv(path)` -> `ray.data.Dataset`.

Built on Ray Data's documented extension point (`ray.data.Datasource` with `get_read_tasks` and
`estimate_inmemory_data_size`, read through `ray.data.read_datasource`). See docs/ray-data.md.

* What it reads: a `ReplayBuffer` directory or a storage directory (`FlattenedStorage`, a native-layout
  `DictStorage` with image, video or array leaves, `HDF5Storage`, ...): anything `unienv_data.inspect.open_dataset`
  opens, read-only, with every check the storages make on load.
* Columns: one per space leaf, nested keys joined with "/" (`{"obs": {"joint": ...}}` -> "obs/joint"; a space
  that is a single leaf gives the column "value"), each in the leaf's own dtype and per-row shape (Arrow tensor
  columns for leaves with a shape, plain Arrow columns for scalars; never Python objects, except text leaves,
  which become Arrow strings). Before them five bookkeeping columns: `episode_id` (int64, 0 = the oldest recorded
  episode when the read was planned), `step` (int64, 0-based row within the episode), `episode_start` and
  `episode_end` (bool) and `index` (int64, the row's logical index in the dataset, 0 = oldest; for a buffer what
  `buffer.get_at(index)` reads). `meta_prefix` renames them.
* Rows: only committed (recorded) episodes, oldest first, each whole; rows outside every episode (written by
  `extend`, an append-built episode still open when the metadata was written, the surviving tail of an episode
  the ring overwrote) only with `include_unsegmented=True`, as runs with `episode_id == -1`.
* Splitting: the episodes are cut into exactly `override_num_blocks` read tasks (or Ray's own choice) of about equal
  row counts, never inside an episode; a task yields blocks of whole episodes, each at most the DataContext's
  `target_max_block_size` (only an episode larger than that alone is sliced, by Ray). When there are fewer
  episodes than requested blocks, the extra tasks are empty: otherwise Ray would split blocks by rows and cut
  episodes.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Dict, Iterable, List, Optional, Sequence, Type

from unienv_data.base.files import PathLike

from ._datasource_plan import (KEY_SEPARATOR, META_COLUMNS, ROOT_COLUMN, ReadPlan, Run, plan_read, zero_batch,
                               split_runs)
from ._datasource_read import read_runs

__all__ = ["UnienvDatasource", "read_unienv", "default_num_blocks", "META_COLUMNS", "ROOT_COLUMN", "KEY_SEPARATOR"]

_DEFAULT_BLOCK_BYTES = 128 * 1024 * 1024


class _UnienvDatasourceBase:
    """A `ray.data.Datasource` over a dataset directory written by this library (see the module docstring).

    The dataset is opened and planned once, when the datasource is made (so a missing or damaged directory fails
    here, not inside a Ray task); each read task reopens it read-only in its own worker and reads its episodes by
    storage row. Every node that runs a read task must see the files at the same path (a shared filesystem), or pass
    `local_only=True` to keep the reads on the node that made the datasource.

    Args:
        path: the dataset directory (or an HDF5 / array file).
        columns: data columns to read (default: all), by column name (see the module docstring).
        backend: how the storages are opened: "auto" (what the dataset was written with), "numpy" or "pytorch".
        include_unsegmented: also read rows outside every recorded episode (as `episode_id` -1).
        meta_prefix: prepended to the bookkeeping column names (needed when a data column is named like one).
        local_only: run every read task on this node (for files that only this node sees).

    Raises:
        FileNotFoundError: `path` does not exist (`StorageNotFoundError`).
        StorageFormatError: `path` holds no dataset this library can open, or its metadata or files are damaged.
        KeyError / ValueError / TypeError: bad `columns`, `meta_prefix` or `backend`.
    """

    def __init__(self, path: PathLike, *, columns: Optional[Sequence[str]] = None, backend: str = "auto",
                 include_unsegmented: bool = False, meta_prefix: str = "", local_only: bool = False) -> None:
        super().__init__()      # ray.data.Datasource's, through the class `_datasource_class` makes
        self._plan: ReadPlan = plan_read(path, columns=columns, backend=backend,
                                         include_unsegmented=bool(include_unsegmented), meta_prefix=meta_prefix)
        self._local_only = bool(local_only)

    @property
    def plan(self) -> ReadPlan:
        """What the read returns: path, columns, episode runs (made when the datasource was made)."""
        return self._plan

    @property
    def supports_distributed_reads(self) -> bool:
        """False with `local_only=True`: Ray then runs every read task on the driver's node."""
        return not self._local_only

    def get_name(self) -> str:
        """The name Ray gives the read operator."""
        return "ReadUnienv"

    def estimate_inmemory_data_size(self) -> Optional[int]:
        """Bytes the read returns in memory (every column in its dtype, bookkeeping included)."""
        return int(self._plan.num_rows * self._plan.row_nbytes)

    def get_read_tasks(self, parallelism: int, per_task_row_limit: Optional[int] = None,
                       data_context: Optional[Any] = None) -> List[Any]:
        """Exactly `parallelism` read tasks (one for an empty dataset), each a consecutive range of whole episodes of
        about equal row count; tasks beyond the number of episodes are empty (see the module docstring)."""
        if isinstance(parallelism, bool) or not isinstance(parallelism, int) or parallelism < 1:
            raise ValueError(f"parallelism must be an int >= 1, got {parallelism!r}")
        from ray.data import ReadTask
        plan = self._plan
        block_rows = self._block_rows(data_context)
        schema = self._schema()
        groups: List[List[Run]] = split_runs(plan.runs, parallelism)
        empty_dataset = not groups
        if empty_dataset:
            groups = [[]]
        else:
            groups += [[] for _ in range(parallelism - len(groups))]
        tasks = []
        for runs in groups:
            rows = sum(r.length for r in runs)
            meta = _block_metadata(rows, rows * plan.row_nbytes)
            fn = functools.partial(_read_task, _subplan(plan, runs), block_rows, empty_dataset)
            kwargs: Dict[str, Any] = {}
            if schema is not None:
                kwargs["schema"] = schema
            if per_task_row_limit is not None:
                kwargs["per_task_row_limit"] = per_task_row_limit
            tasks.append(ReadTask(fn, meta, **kwargs))
        return tasks

    def _block_rows(self, data_context: Optional[Any]) -> int:
        target = getattr(data_context, "target_max_block_size", None) if data_context is not None else None
        if target is None:
            from ray.data import DataContext
            try:
                target = DataContext.get_current().target_max_block_size
            except AttributeError:
                target = None
        target = int(target or _DEFAULT_BLOCK_BYTES)
        return max(1, target // max(1, self._plan.row_nbytes))

    def _schema(self) -> Optional[Any]:
        """The Arrow schema of every block, when no text column makes it depend on the data."""
        if any(c.dtype == "object" for c in self._plan.columns):
            return None
        try:    # one zero row: Ray cannot tell a tensor column's type from zero rows
            return _to_block(self._plan, zero_batch(self._plan, 1)).schema
        except Exception:       # a schema is optional: Ray reads it from the first block instead
            return None


def _subplan(plan: ReadPlan, runs: List[Run]) -> ReadPlan:
    """`plan` restricted to `runs` (what one read task ships)."""
    return dataclasses.replace(plan, runs=tuple(runs))


def _read_task(plan: ReadPlan, block_rows: int, empty_dataset: bool) -> Iterable[Any]:
    """The body of one read task: Arrow blocks of whole episodes. The single task of an empty dataset yields one
    empty block, so the dataset still has its schema; the empty tasks that pad a split yield nothing."""
    if not plan.runs:
        if empty_dataset:
            yield _to_block(plan, zero_batch(plan, 1)).slice(0, 0)
        return
    for batch in read_runs(plan, plan.runs, block_rows):
        yield _to_block(plan, batch)


def _to_block(plan: ReadPlan, batch: Dict[str, Any]) -> Any:
    """A `pyarrow.Table` of `batch` (a read's `{column: ndarray}`), built column by column from the planned dtypes:
    1-D columns as plain Arrow arrays over the NumPy buffers (zero-copy for contiguous numeric ones), columns with a
    per-row shape as Ray's fixed-shape tensor arrays. Ray's generic `batch_to_block` infers every 1-D column's type
    by looking at its values (`pyarrow.infer_type`), which cost more than the read itself; a plan with a text column
    still goes through it (Arrow strings)."""
    import pyarrow as pa
    from ray.data.block import BlockAccessor
    if any(c.dtype == "object" for c in plan.columns):
        return BlockAccessor.batch_to_block(batch)
    from ray.data.extensions import ArrowTensorArray
    arrays = [pa.array(arr) if arr.ndim == 1 else ArrowTensorArray.from_numpy(arr, column_name=name)
              for name, arr in batch.items()]
    return pa.Table.from_arrays(arrays, names=list(batch))


def _block_metadata(num_rows: int, size_bytes: int) -> Any:
    """`BlockMetadata` for a read task, across the Ray versions the `ray` extra allows (older ones take a schema)."""
    from ray.data.block import BlockMetadata
    kwargs: Dict[str, Any] = {"num_rows": int(num_rows), "size_bytes": int(size_bytes), "input_files": None,
                              "exec_stats": None}
    if "schema" in {f.name for f in dataclasses.fields(BlockMetadata)}:
        kwargs["schema"] = None
    return BlockMetadata(**kwargs)


def read_unienv(path: PathLike, *, columns: Optional[Sequence[str]] = None, backend: str = "auto",
                include_unsegmented: bool = False, meta_prefix: str = "", local_only: bool = False,
                override_num_blocks: Optional[int] = None, **read_args: Any) -> Any:
    """A `ray.data.Dataset` of the dataset at `path`: `ray.data.read_datasource(UnienvDatasource(path, ...),
    override_num_blocks=..., **read_args)`.

    `override_num_blocks` is the number of read tasks (and so of read blocks, before any later repartitioning).
    When None, `default_num_blocks`: one per CPU of the cluster, fewer for a small dataset (blocks of at least
    1 MiB, or 16 MiB when every column is a plain array), more for a large one (blocks of at most 128 MiB). Ray's
    own choice, which starts at 200 tasks and suits file formats better than a storage every task reopens, is what
    `ray.data.read_datasource(UnienvDatasource(path))` makes. `read_args` go to `read_datasource` (e.g.
    `concurrency`, `num_cpus`). See `UnienvDatasource` for the other arguments and the errors.
    """
    if override_num_blocks is not None and (isinstance(override_num_blocks, bool)
                                            or not isinstance(override_num_blocks, int) or override_num_blocks < 1):
        raise ValueError(f"override_num_blocks must be None or an int >= 1, got {override_num_blocks!r}")
    source = _datasource_class()(path, columns=columns, backend=backend, include_unsegmented=include_unsegmented,
                                 meta_prefix=meta_prefix, local_only=local_only)
    import ray
    import ray.data
    if override_num_blocks is None:
        cpus = int(ray.cluster_resources().get("CPU", 1)) if ray.is_initialized() else 1
        override_num_blocks = default_num_blocks(source.estimate_inmemory_data_size(), cpus,
                                                 len(source.plan.runs), copy_only=source.plan.copy_only)
    return ray.data.read_datasource(source, override_num_blocks=override_num_blocks, **read_args)


_MIN_BLOCK_BYTES = 1 << 20
_MIN_COPY_BLOCK_BYTES = 16 << 20


def default_num_blocks(nbytes: int, cpus: int, runs: int, copy_only: bool = False) -> int:
    """The number of read tasks `read_unienv` makes when not told: one per CPU, at most one per episode and one per
    MiB of data (per 16 MiB when `copy_only`: every column comes from an array storage, whose rows cost a copy, so a
    smaller task costs Ray more than it reads), and at least one per 128 MiB (never below 1)."""
    min_block = _MIN_COPY_BLOCK_BYTES if copy_only else _MIN_BLOCK_BYTES
    wanted = min(max(1, cpus), max(1, nbytes // min_block), max(1, runs))
    return int(max(wanted, -(-nbytes // _DEFAULT_BLOCK_BYTES), 1))


_DATASOURCE_CLASS: Optional[Type[Any]] = None


def _datasource_class() -> Type[Any]:
    """`UnienvDatasource`: made on first use, so that importing this module (or `read_unienv`) does not import Ray
    (`init_local_cluster` must run before anything imports Ray)."""
    global _DATASOURCE_CLASS
    if _DATASOURCE_CLASS is None:
        from ray.data import Datasource
        cls = type("UnienvDatasource", (_UnienvDatasourceBase, Datasource),
                   {"__module__": __name__, "__qualname__": "UnienvDatasource",
                    "__doc__": _UnienvDatasourceBase.__doc__})
        _DATASOURCE_CLASS = cls
    return _DATASOURCE_CLASS


def __getattr__(name: str) -> Any:
    if name == "UnienvDatasource":
        return _datasource_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
