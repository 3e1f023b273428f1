"""`MinariAsUniEnvDataset`: a Minari dataset folder (HDF5 or Arrow format) as a read-only `BatchBase`.

`MinariAsUniEnvDataset.from_local(dataset_dir, backend, device=None)` reads the folder with this project's own
parser (`_minari_format`; no minari install needed). One row per step, in episode order:

* `observations`: the observation before the step (a dict for a Dict space, a tuple for a Tuple space);
* `actions`, `rewards`, `terminations`, `truncations`: the step's values, in the dtypes minari stores (a Discrete
  space is an int64 scalar; JPEG-encoded image observations are decoded exactly as minari decodes them);
* `next_observations` (only with `include_next_observations=True`): the observation after the step. An episode
  of `n` steps has `n + 1` observations; without this key the last one is reachable through
  `get_final_observation(i)`.

Episodes are the batch's segments (`get_segments()`), so `SliceSampler`, `SegmentSampler` and windows never mix
two episodes. `get_episode(i)` reads one episode's steps, `episode_metadata` lists `index`, `start`, `length`,
`seed` (and `options` when recorded) per episode, `get_at_with_metadata` adds the episode index and the step
within it to every row. Indices follow the library's rules (an index out of range raises IndexError).

Needs h5py (HDF5 format) or pyarrow (Arrow format) and Pillow for JPEG images: the `minari` extra.
"""
from __future__ import annotations

import os
import warnings
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from unienv_data.base.closing import ClosesOnExit
from unienv_data.base.common import BatchBase
from unienv_data.base.indexing import normalize_index
from unienv_interface.space import BinarySpace, BoxSpace, DictSpace, Space, TupleSpace

from ._minari_format import WHO, EpisodeSource, Path, locate, open_episodes, parse_space, read_metadata


def _assemble(space: Space, leaves: Dict[Path, Any], path: Path = ()) -> Any:
    """The nested value of `space` from `{leaf path: value}`."""
    if isinstance(space, DictSpace):
        return {k: _assemble(sp, leaves, path + (k,)) for k, sp in space.spaces.items()}
    if isinstance(space, TupleSpace):
        return tuple(_assemble(sp, leaves, path + (i,)) for i, sp in enumerate(space.spaces))
    return leaves[path]


def _step_space(backend: Any, device: Any, dtype: np.dtype) -> Space:
    if dtype == np.bool_:
        return BinarySpace(backend, (), device=device)
    if dtype.kind == "f":
        return BoxSpace(backend, -np.inf, np.inf, dtype, device=device, shape=())
    info = np.iinfo(dtype)
    return BoxSpace(backend, info.min, info.max, dtype, device=device, shape=())


class MinariAsUniEnvDataset(ClosesOnExit, BatchBase[Any, Any, Any, Any, Any]):
    """A read-only batch of the steps of a Minari dataset (see the module docstring)."""

    is_mutable = False

    @staticmethod
    def from_local(dataset_dir: Any, backend: Any = None, device: Any = None,
                   include_next_observations: bool = False) -> "MinariAsUniEnvDataset":
        """Opens the Minari dataset at `dataset_dir` (its folder, or its `data/` folder) read-only.

        `backend` defaults to NumPy. StorageFormatError (StorageNotFoundError for a missing file) names the file
        when the folder is not a readable Minari dataset."""
        if backend is None:
            from unienv_interface.backends import NumpyComputeBackend
            backend = NumpyComputeBackend
        data_dir = locate(dataset_dir)
        meta = read_metadata(data_dir)
        where = os.path.join(data_dir, "metadata.json")
        obs_space, obs_leaves = parse_space(meta["observation_space"], backend, device, f"{where}: observation_space")
        act_space, act_leaves = parse_space(meta["action_space"], backend, device, f"{where}: action_space")
        source = open_episodes(data_dir, meta, obs_leaves, act_leaves)
        try:
            spaces = {"observations": (obs_space, obs_leaves), "actions": (act_space, act_leaves)}
            for field, (_sp, leaves) in list(spaces.items()):
                stored = {}
                for leaf in leaves:
                    dt = source.stored_dtype(field, leaf)
                    if dt is not None and leaf.dtype is not None and dt != leaf.dtype:
                        stored[leaf.path] = dt
                        warnings.warn(f"{WHO}: {leaf.where(field)} is declared {leaf.dtype} in {where} but the data "
                                      f"files hold {dt}; it is read as stored (as minari reads it)", stacklevel=2)
                if stored:
                    spaces[field] = parse_space(meta["observation_space" if field == "observations" else
                                                     "action_space"], backend, device, f"{where}: {field}",
                                                stored=stored)
            (obs_space, source.obs_leaves), (act_space, source.act_leaves) = spaces["observations"], spaces["actions"]
        except BaseException:
            source.close()
            raise
        return MinariAsUniEnvDataset(source, obs_space, act_space, include_next_observations)

    def __init__(self, source: EpisodeSource, observation_space: Space, action_space: Space,
                 include_next_observations: bool = False, fields: Optional[Sequence[str]] = None, *,
                 parent: Optional["MinariAsUniEnvDataset"] = None) -> None:
        """`fields` and `parent` make a column view (`get_column`): only those fields are read, through the files of
        `parent`, which owns them (closing `parent` closes the view; closing the view leaves the files open)."""
        backend, device = observation_space.backend, observation_space.device
        spaces: Dict[str, Space] = {"observations": observation_space, "actions": action_space}
        for field, dtype in source.step_dtypes.items():
            spaces[field] = _step_space(backend, device, dtype)
        if include_next_observations:
            spaces["next_observations"] = observation_space
        if fields is not None:  # a view of some fields (get_column): only those are read
            spaces = {k: v for k, v in spaces.items() if k in fields}
        super().__init__(DictSpace(backend, spaces, device=device))
        self.source = source
        self.observation_space = observation_space
        self.action_space = action_space
        self.include_next_observations = bool(include_next_observations)
        self.dataset_metadata: Dict[str, Any] = dict(source.meta)
        self._lengths = source.lengths.astype(np.int64)
        row_space = self.single_space
        self._fields: List[str] = list(row_space.spaces) if isinstance(row_space, DictSpace) else []
        self._ends = np.cumsum(self._lengths)
        self._starts = self._ends - self._lengths
        self._closed = False
        self._parent = parent   # a column view reads through its parent's files

    # ---- sizes and episodes ----
    def __len__(self) -> int:
        return int(self._ends[-1]) if self._ends.size else 0

    @property
    def data_dir(self) -> str:
        """The dataset's `data/` folder."""
        return self.source.data_dir

    @property
    def data_format(self) -> str:
        return str(self.dataset_metadata.get("data_format", "hdf5"))

    @property
    def num_episodes(self) -> int:
        return int(self._lengths.size)

    def episode_range(self, episode: int) -> Tuple[int, int]:
        """The rows `[start, end)` of episode `episode` (negative counts from the end)."""
        e = self._episode_index(episode)
        return int(self._starts[e]), int(self._ends[e])

    def _episode_index(self, episode: Any) -> int:
        if isinstance(episode, bool) or not isinstance(episode, (int, np.integer)):
            raise TypeError(f"an episode index must be an int, got {type(episode).__name__}")
        n = self.num_episodes
        if not -n <= int(episode) < n:
            raise IndexError(f"episode {int(episode)} is out of range for a dataset of {n} episodes "
                             f"(valid: {-n}..{n - 1})")
        return int(episode) % n

    def get_segments(self) -> List[Tuple[int, int]]:
        """Every episode with at least one step as a `(start, end)` row range."""
        return [(int(s), int(e)) for s, e in zip(self._starts, self._ends) if e > s]

    @property
    def episode_metadata(self) -> List[Dict[str, Any]]:
        """Per episode: `index`, `start`, `length`, `seed` (None when not recorded) and `options` if recorded."""
        out = []
        for e in range(self.num_episodes):
            attrs = self.source.episode_attrs(e)
            item: Dict[str, Any] = {"index": e, "start": int(self._starts[e]), "length": int(self._lengths[e]),
                                    "seed": None if attrs.get("seed") is None else int(attrs["seed"])}
            if "options" in attrs:
                item["options"] = attrs["options"]
            out.append(item)
        return out

    def get_episode(self, episode: int) -> Any:
        """All steps of episode `episode` (a batch)."""
        s, e = self.episode_range(episode)
        return self.get_at(slice(s, e))

    def get_final_observation(self, episode: int) -> Any:
        """The observation after the last step of episode `episode` (the `n + 1`-th of an `n`-step episode)."""
        e = self._episode_index(episode)
        self._check_open()
        leaves = self.source.read_observations(e, np.array([int(self._lengths[e])], dtype=np.int64))
        return self._to_backend(_assemble(self.observation_space, leaves), single=True)

    # ---- reads ----
    @property
    def is_closed(self) -> bool:
        """True after `close()` (a column view: after its own `close()`; reads also stop when its parent closes)."""
        return self._closed

    def _check_open(self) -> None:
        if self._closed or (self._parent is not None and self._parent.is_closed):
            from unienv_data.base.errors import StorageClosedError
            raise StorageClosedError(f"{WHO} of {self.data_dir} was closed; open it again with from_local")

    def _to_backend(self, value: Any, single: bool) -> Any:
        if isinstance(value, dict):
            return {k: self._to_backend(v, single) for k, v in value.items()}
        if isinstance(value, tuple):
            return tuple(self._to_backend(v, single) for v in value)
        if value.dtype == object:     # text
            return value[0] if single else value
        arr = self.backend.from_numpy(np.ascontiguousarray(value), device=self.device)
        return arr[0, ...] if single else arr

    def _read_numpy(self, positions: np.ndarray) -> Tuple[Dict[str, Any], np.ndarray, np.ndarray]:
        """`(fields as nested NumPy values, episode of each row, step of each row)` of dataset rows `positions`."""
        self._check_open()
        episodes = np.searchsorted(self._ends, positions, side="right")
        steps = positions - self._starts[episodes]
        n = positions.size
        parts: Dict[str, Dict[Path, np.ndarray]] = {}
        per_episode = []
        for field in self._fields:
            got = self.source.gather(field, episodes, steps) if n > 1 else None
            if got is None:
                per_episode.append(field)
            else:
                parts[field] = got if isinstance(got, dict) else {(): got}
        order = np.argsort(episodes, kind="stable")
        uniq, first = np.unique(episodes[order], return_index=True)
        bounds = np.append(first, n)
        for j, e in enumerate(uniq.tolist() if per_episode else []):
            sel = order[bounds[j]:bounds[j + 1]] if uniq.size > 1 else np.arange(n)
            got = self.source.read(int(e), steps[sel], per_episode)
            for field, value in got.items():
                leaves = value if isinstance(value, dict) else {(): value}
                bucket = parts.setdefault(field, {})
                for path, arr in leaves.items():
                    if uniq.size == 1:
                        bucket[path] = arr
                        continue
                    if path not in bucket:
                        bucket[path] = np.empty((n,) + arr.shape[1:], dtype=arr.dtype)
                    bucket[path][sel] = arr
        out: Dict[str, Any] = {}
        row_space = self.single_space
        if not isinstance(row_space, DictSpace):
            raise RuntimeError("internal invariant violated: the row space is a DictSpace")
        for field, sp in row_space.spaces.items():
            got_leaves = parts.get(field)
            if got_leaves is None:     # no rows: empty arrays of every leaf
                got_leaves = {}
                self._empty_leaves(sp, (), got_leaves)
            out[field] = _assemble(sp, got_leaves)
        return out, episodes, steps

    def _empty_leaves(self, space: Space, path: Path, out: Dict[Path, np.ndarray]) -> None:
        if isinstance(space, DictSpace):
            for k, sp in space.spaces.items():
                self._empty_leaves(sp, path + (k,), out)
        elif isinstance(space, TupleSpace):
            for i, sp in enumerate(space.spaces):
                self._empty_leaves(sp, path + (i,), out)
        elif isinstance(space, (BoxSpace, BinarySpace)):
            out[path] = np.zeros((0,) + tuple(space.shape), dtype=self.backend.numpy_dtype(space.dtype))
        else:
            out[path] = np.empty(0, dtype=object)

    def get_at(self, idx: Any) -> Any:
        """Step(s) at `idx`: `{"observations", "actions", "rewards", "terminations", "truncations"}`."""
        return self.get_at_with_metadata(idx)[0]

    def get_at_with_metadata(self, idx: Any) -> Tuple[Any, Dict[str, Any]]:
        """Step(s) at `idx` and `{"episode_index", "step_index"}` (int64) of each."""
        norm = normalize_index(idx, len(self))
        data, episodes, steps = self._read_numpy(norm.positions())
        single = norm.is_single
        meta = {"episode_index": self.backend.from_numpy(episodes.astype(np.int64), device=self.device),
                "step_index": self.backend.from_numpy(steps.astype(np.int64), device=self.device)}
        if single:
            meta = {k: v[0, ...] for k, v in meta.items()}
        return self._to_backend(data, single), meta

    def read_numpy(self, positions: Any) -> Dict[str, Any]:
        """Rows `positions` (an int array) as nested NumPy values, whatever the backend (for exporters)."""
        return self._read_numpy(np.asarray(positions, dtype=np.int64).reshape(-1))[0]

    def get_column(self, nested_keys: Any) -> BatchBase:
        """A read-only view of one field (`"actions"`, `("observations", "camera")`, ...); reads only that field."""
        from unienv_data.batches import SubItemBatch
        keys = [nested_keys] if isinstance(nested_keys, (str, int)) else list(nested_keys)
        if not keys or keys[0] not in self._fields:
            return super().get_column(nested_keys)
        view = MinariAsUniEnvDataset(self.source, self.observation_space, self.action_space,
                                     self.include_next_observations, fields=[keys[0]], parent=self)
        return SubItemBatch(view, keys)

    def get_episode_column(self, episode: int, nested_keys: Any) -> Any:
        """One field of every step of episode `episode`."""
        s, e = self.episode_range(episode)
        return self.get_column(nested_keys).get_at(slice(s, e))

    def close(self) -> None:
        """Closes the dataset's files; reads afterwards raise StorageClosedError."""
        if not self._closed:
            self._closed = True
            if self._parent is None:   # a column view does not own the files
                self.source.close()

    def __reduce__(self) -> Any:
        """Pickles as the folder and options (a DataLoader worker reopens the files in its own process)."""
        if self._closed:
            from unienv_data.base.errors import StorageClosedError
            raise StorageClosedError(f"{WHO} of {self.data_dir} was closed; a closed dataset cannot be pickled")
        return (_reopen, (self.data_dir, self.backend, self.device, self.include_next_observations,
                          None if self._parent is None else list(self._fields)))


def _reopen(data_dir: str, backend: Any, device: Any, include_next_observations: bool,
            fields: Optional[List[str]]) -> MinariAsUniEnvDataset:
    ds = MinariAsUniEnvDataset.from_local(data_dir, backend=backend, device=device,
                                          include_next_observations=include_next_observations)
    if fields is None:
        return ds
    return MinariAsUniEnvDataset(ds.source, ds.observation_space, ds.action_space, include_next_observations,
                                 fields=fields)


__all__ = ["MinariAsUniEnvDataset"]
