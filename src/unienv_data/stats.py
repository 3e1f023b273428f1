"""Per-feature normalisation statistics of a dataset (like LeRobot's `stats`), streamed over the data in chunks.

For every numeric leaf of the data (`"a/b"` key paths, flat keys such as `"observation.image"` as they are):
`mean`, `std` (population, ddof=0), `min`, `max`, the quantiles `q01`, `q10`, `q50`, `q90`, `q99`, and `count`
(how many values each entry summarises).

Which entries. A leaf of 0 or 1 axes per step (a scalar reward, a joint vector) is summarised entry by entry
(stats of shape `()` or `(D,)`). A leaf of 2 or more axes per step is summarised per entry of its LAST axis, over
all other axes and all steps: an `(H, W, C)` camera gets per-channel stats of shape `(C,)`. The stats therefore
broadcast against the data (`(x - mean) / std` works on one step or a batch).

Streaming. `StatsAccumulator.update` takes one chunk at a time; mean and variance are merged chunk by chunk in
float64 (Chan's parallel formula), min and max exactly. Quantiles come from a uniform random sample of the values
(a reservoir of at most `reservoir_size` values per entry, seeded): they are EXACT when every entry has at most
`reservoir_size` values, otherwise approximate (the rank error is about `1 / sqrt(reservoir_size)`, 0.3% for the
default 100,000). Memory is bounded by the reservoir and the chunk.

File. `write_stats(dataset_dir, stats)` writes `stats.json` beside the dataset's metadata with an atomic rename
(readers see the old or the new file, never a torn one); `read_stats(path)` reads it back (a dataset directory or
the file itself). Bool leaves count as 0 / 1; text and other non-numeric leaves are left out.
"""
from __future__ import annotations

import os
from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from unienv_data.base.errors import StorageFormatError
from unienv_data.base.files import atomic_write_json, read_json
from unienv_data.batches._columns import path_name

STATS_FILE = "stats.json"
STATS_FORMAT_VERSION = 1
QUANTILES: Dict[str, float] = {"q01": 0.01, "q10": 0.10, "q50": 0.50, "q90": 0.90, "q99": 0.99}
STAT_NAMES = ("mean", "std", "min", "max") + tuple(QUANTILES)
DEFAULT_RESERVOIR = 100_000
DEFAULT_CHUNK = 1024
_BLOCK_ELEMENTS = 1 << 20      # values merged at a time (8 MiB of float64)

PathLike = Union[str, "os.PathLike[str]"]


class _LeafStats:
    """Running statistics of one leaf (see the module docstring for which entries)."""

    def __init__(self, step_shape: Tuple[int, ...], reservoir_size: int, rng: np.random.Generator) -> None:
        self.step_shape = tuple(step_shape)
        self.entry_shape: Tuple[int, ...] = self.step_shape if len(self.step_shape) <= 1 else self.step_shape[-1:]
        self.count = 0
        self.mean = np.zeros(self.entry_shape, np.float64)
        self.m2 = np.zeros(self.entry_shape, np.float64)
        self.min = np.full(self.entry_shape, np.inf)
        self.max = np.full(self.entry_shape, -np.inf)
        self.reservoir_size = int(reservoir_size)
        self.reservoir = np.zeros((0,) + self.entry_shape, np.float64)
        self.rng = rng

    def update(self, chunk: np.ndarray) -> None:
        x = np.asarray(chunk)
        if x.dtype == np.bool_:
            x = x.astype(np.uint8)
        if tuple(x.shape[1:]) != self.step_shape:
            raise ValueError(f"a chunk of shape {x.shape} does not hold steps of shape {self.step_shape}")
        vals: np.ndarray = x.reshape((-1,) + self.entry_shape)    # (values, *entry_shape)
        per_value = max(1, int(np.prod(self.entry_shape)))
        block = max(1, _BLOCK_ELEMENTS // per_value)          # bounded float64 temporaries for camera chunks
        total = int(np.shape(vals)[0])
        for s in range(0, total, block):
            self._update_block(vals[s:s + block].astype(np.float64, copy=False))

    def _update_block(self, v64: np.ndarray) -> None:
        m = int(v64.shape[0])
        if m == 0:
            return
        c_mean = v64.mean(axis=0)
        c_m2 = ((v64 - c_mean) ** 2).sum(axis=0)
        n = self.count
        tot = n + m
        delta = c_mean - self.mean
        self.mean = self.mean + delta * (m / tot)
        self.m2 = self.m2 + c_m2 + delta ** 2 * (n * m / tot)
        self.count = tot
        self.min = np.minimum(self.min, v64.min(axis=0))
        self.max = np.maximum(self.max, v64.max(axis=0))
        self._sample(v64, n)

    def _sample(self, v64: np.ndarray, seen: int) -> None:
        """Reservoir sampling (Algorithm R), vectorised over a chunk: value `seen + j` replaces a random slot
        with probability `R / (seen + j + 1)`; later values win collisions, as in the sequential algorithm."""
        R = self.reservoir_size
        m = int(v64.shape[0])
        fill = max(0, min(m, R - self.reservoir.shape[0]))
        if fill:
            self.reservoir = np.concatenate([self.reservoir, v64[:fill]], axis=0)
        if fill == m:
            return
        t = seen + np.arange(fill, m, dtype=np.int64)               # global positions of the rest
        slots = (self.rng.random(t.shape[0]) * (t + 1)).astype(np.int64)
        keep = slots < R
        if keep.any():
            self.reservoir[slots[keep]] = v64[fill:][keep]

    def result(self) -> Dict[str, Any]:
        if self.count == 0:
            raise ValueError("no values were seen")
        var = np.maximum(self.m2 / self.count, 0.0)
        out: Dict[str, Any] = {"mean": self.mean, "std": np.sqrt(var), "min": self.min, "max": self.max}
        qs = np.quantile(self.reservoir, list(QUANTILES.values()), axis=0)
        for (name, _), q in zip(QUANTILES.items(), qs):
            out[name] = q
        out["count"] = self.count
        return out


class StatsAccumulator:
    """Streams chunks `{leaf key: array (steps, *step_shape)}` into per-leaf statistics (see the module docstring).

    `reservoir_size`: values kept per entry for the quantiles; `seed`: seeds the reservoir's draws."""

    def __init__(self, reservoir_size: int = DEFAULT_RESERVOIR, seed: int = 0) -> None:
        if isinstance(reservoir_size, bool) or not isinstance(reservoir_size, (int, np.integer)) or reservoir_size < 1:
            raise ValueError(f"reservoir_size must be a positive int, got {reservoir_size!r}")
        self.reservoir_size = int(reservoir_size)
        self.rng = np.random.default_rng(seed)
        self.leaves: Dict[str, _LeafStats] = {}
        self.steps = 0

    def update(self, chunk: Mapping[str, Any]) -> None:
        """Adds one chunk: every value an array whose leading axis is the steps (non-numeric leaves are skipped)."""
        lengths = set()
        for key, value in chunk.items():
            arr = np.asarray(value)
            if arr.dtype.kind not in "biuf":
                continue
            if arr.ndim == 0:
                raise ValueError(f"stats chunk {key!r}: expected an array with a leading steps axis, got a scalar")
            lengths.add(int(arr.shape[0]))
            leaf = self.leaves.get(key)
            if leaf is None:
                leaf = self.leaves[key] = _LeafStats(tuple(arr.shape[1:]), self.reservoir_size, self.rng)
            leaf.update(arr)
        if len(lengths) > 1:
            raise ValueError(f"the keys of one stats chunk hold different numbers of steps: {sorted(lengths)}")
        self.steps += lengths.pop() if lengths else 0

    def result(self) -> Dict[str, Dict[str, Any]]:
        """`{leaf key: {stat name: NumPy float64 array, "count": int}}` of every leaf seen."""
        return {k: leaf.result() for k, leaf in self.leaves.items()}


def _leaf_dict(data: Any, backend: Any) -> Dict[str, np.ndarray]:
    out: Dict[str, np.ndarray] = {}

    def visit(x: Any, prefix: Tuple[Any, ...]) -> None:
        if isinstance(x, dict):
            for k, v in x.items():
                visit(v, prefix + (k,))
        elif isinstance(x, (tuple, list)):
            for i, v in enumerate(x):
                visit(v, prefix + (i,))
        else:
            out[path_name(prefix)] = x if isinstance(x, np.ndarray) else np.asarray(backend.to_numpy(x))
    visit(data, ())
    return out


def compute_stats(data: Any, *, keys: Optional[Sequence[str]] = None, chunk_size: int = DEFAULT_CHUNK,
                  reservoir_size: int = DEFAULT_RESERVOIR, seed: int = 0,
                  read_chunk: Optional[Callable[[np.ndarray], Mapping[str, Any]]] = None,
                  progress: Optional[Callable[[int], None]] = None) -> Dict[str, Any]:
    """Statistics of every numeric leaf of `data` (a `BatchBase`: a `ReplayBuffer`, a storage view, ...), read
    `chunk_size` steps at a time; `keys` limits them to some leaves (`"a/b"` paths). `read_chunk(indices)` may
    replace the reads (it returns `{leaf key: array}` for those logical indices). Returns the JSON-ready document
    `write_stats` writes: `{"format_version", "steps", "reservoir_size", "features": {key: {stat: list}}}`."""
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, (int, np.integer)) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")
    n = len(data)
    if n == 0:
        raise ValueError("the data is empty: there is nothing to compute statistics of")
    wanted = None if keys is None else list(keys)
    acc = StatsAccumulator(reservoir_size, seed)
    for s in range(0, n, int(chunk_size)):
        idx = np.arange(s, min(n, s + int(chunk_size)), dtype=np.int64)
        chunk = dict(read_chunk(idx)) if read_chunk is not None else _leaf_dict(data.get_at(idx), data.backend)
        if wanted is not None:
            missing = [k for k in wanted if k not in chunk]
            if missing:
                raise KeyError(f"no key(s) {missing} in the data; its leaves are {sorted(chunk)}")
            chunk = {k: chunk[k] for k in wanted}
        acc.update(chunk)
        if progress is not None:
            progress(int(idx.shape[0]))
    return stats_document(acc)


def stats_document(acc: StatsAccumulator) -> Dict[str, Any]:
    """The JSON-ready document of an accumulator's statistics."""
    feats: Dict[str, Dict[str, Any]] = {}
    for key, res in acc.result().items():
        feats[key] = {name: np.asarray(res[name]).tolist() for name in STAT_NAMES}
        feats[key]["count"] = int(res["count"])
    return {"format_version": STATS_FORMAT_VERSION, "steps": acc.steps, "reservoir_size": acc.reservoir_size,
            "quantiles": dict(QUANTILES), "features": feats}


def stats_path(path: PathLike) -> str:
    """Where the statistics of the dataset at `path` live: `path/stats.json` for a directory, else `path` itself
    when it names a `.json` file, else `path + ".stats.json"` (a single-file dataset)."""
    p = os.fspath(path)
    if os.path.isdir(p):
        return os.path.join(p, STATS_FILE)
    if p.endswith(".json"):
        return p
    return p + "." + STATS_FILE


def write_stats(path: PathLike, stats: Mapping[str, Any]) -> str:
    """Writes the statistics document beside the dataset at `path` (see `stats_path`) atomically; returns the file."""
    target = stats_path(path)
    atomic_write_json(target, dict(stats))
    return target


def read_stats(path: PathLike) -> Dict[str, Dict[str, np.ndarray]]:
    """`{leaf key: {stat name: NumPy float64 array}}` from a statistics file (or a dataset directory holding one);
    StorageNotFoundError when there is none (run `unienv-data stats PATH` or `compute_stats` first)."""
    target = stats_path(path)
    doc = read_json(target, "statistics file (write it with `unienv-data stats PATH`)")
    return parse_stats(doc, target)


def parse_stats(doc: Mapping[str, Any], where: str = "statistics") -> Dict[str, Dict[str, np.ndarray]]:
    """The arrays of a statistics document (what `compute_stats` returns or `stats.json` holds)."""
    version = doc.get("format_version")
    if not isinstance(version, int) or version > STATS_FORMAT_VERSION:
        raise StorageFormatError(f"{where}: format_version {version!r} is not one this library reads (it reads up "
                                 f"to {STATS_FORMAT_VERSION}); recompute it with `unienv-data stats`")
    feats = doc.get("features")
    if not isinstance(feats, dict):
        raise StorageFormatError(f"{where}: no 'features' object; recompute it with `unienv-data stats`")
    out: Dict[str, Dict[str, np.ndarray]] = {}
    for key, entry in feats.items():
        missing = [s for s in STAT_NAMES if s not in entry]
        if missing:
            raise StorageFormatError(f"{where}: feature {key!r} lacks {missing}; recompute it with `unienv-data stats`")
        out[key] = {s: np.asarray(entry[s], dtype=np.float64) for s in STAT_NAMES}
    return out


def as_stats(stats: Union[PathLike, Mapping[str, Any]]) -> Dict[str, Dict[str, np.ndarray]]:
    """Statistics given as a path (dataset directory or file), a document, or already parsed arrays."""
    if isinstance(stats, (str, os.PathLike)):
        return read_stats(stats)
    if "features" in stats:
        return parse_stats(stats)
    return {k: {s: np.asarray(v[s], dtype=np.float64) for s in v} for k, v in stats.items()}


__all__ = ["STATS_FILE", "QUANTILES", "STAT_NAMES", "StatsAccumulator", "compute_stats", "stats_document",
           "stats_path", "write_stats", "read_stats", "parse_stats", "as_stats"]
