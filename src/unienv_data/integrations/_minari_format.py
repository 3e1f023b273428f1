"""Minari's on-disk format, read with this project's own parser (no minari install needed).

A Minari dataset folder (what `minari` keeps under `MINARI_DATASETS_PATH/<dataset_id>/`) holds `data/`, and in it
`metadata.json`: `total_episodes`, `total_steps`, `data_format` ("hdf5" or "arrow"), `jpeg_encoding` (default
true), and the observation and action spaces as JSON strings (gymnasium spaces serialised by minari: Box, Discrete,
MultiDiscrete, MultiBinary, Dict, Tuple, Text). Episode `e` of `n` steps has `n + 1` observations and `n` actions,
rewards, terminations and truncations:

* HDF5: `data/main_data.hdf5`, one group `episode_<e>` per episode (attributes `id`, `seed`, `total_steps`,
  `options/...`) holding `observations`, `actions`, `rewards`, `terminations`, `truncations` (a Dict space is a
  group of its keys, a Tuple space a group of `_index_<i>`).
* Arrow: `data/<e>/` per episode, an Arrow IPC file (`part-0.arrow`) of `n + 1` rows (actions, rewards,
  terminations and truncations padded by one row at the end; Dict and Tuple spaces as structs, fixed-shape boxes
  as fixed-size lists of the flattened element) and `metadata.json` (`id`, `total_steps`, `seed`, `options`).

Image spaces (a uint8 Box of 2 or 3 dimensions, at least 32x32, bounds 0 and 255; minari's own rule) are stored as
JPEG bytes when `jpeg_encoding` is true; frames are decoded with Pillow exactly as minari decodes them. A file
that holds raw frames instead (datasets written before minari encoded images) is read as raw frames.

This module maps the space JSON onto this project's spaces (`parse_space`) and reads steps of episodes
(`HDF5Episodes`, `ArrowEpisodes`). A missing, truncated or inconsistent file raises StorageFormatError (or
StorageNotFoundError) naming the file.
"""
from __future__ import annotations

import io
import json
import os
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from unienv_data.base.errors import StorageFormatError, StorageNotFoundError
from unienv_data.base.files import load_json
from unienv_data.batches._tree import set_path
from unienv_data.storages._list_helpers import require_module
from unienv_interface.space import BinarySpace, BoxSpace, DictSpace, Space, TextSpace, TupleSpace

WHO = "MinariAsUniEnvDataset"
METADATA_FILE = "metadata.json"
HDF5_FILE = "main_data.hdf5"
STEP_FIELDS = ("rewards", "terminations", "truncations")
FORMATS = ("hdf5", "arrow")

#: A key path inside an observation or action: dict keys (str) and tuple positions (int).
Path = Tuple[Any, ...]


@dataclass(frozen=True)
class Leaf:
    """One array of a Minari space: where it sits, its element shape and dtype, and how it is stored."""

    path: Path
    shape: Tuple[int, ...]
    dtype: Optional[np.dtype]     # None for text
    image: bool = False           # JPEG-encoded on disk when the dataset's jpeg_encoding is true
    text: bool = False

    def where(self, field: str) -> str:
        return "/".join([field] + [str(p) for p in self.path])


def locate(dataset_dir: Any) -> str:
    """The `data/` folder of a Minari dataset given its folder (or the `data/` folder itself)."""
    root = os.path.abspath(os.fspath(dataset_dir))
    if not os.path.isdir(root):
        raise StorageNotFoundError(f"{WHO}: no Minari dataset folder at {root}")
    for cand in (os.path.join(root, "data"), root):
        if os.path.isfile(os.path.join(cand, METADATA_FILE)):
            return cand
    raise StorageNotFoundError(f"{WHO}: {root} is not a Minari dataset: neither {os.path.join(root, 'data', METADATA_FILE)}"
                               f" nor {os.path.join(root, METADATA_FILE)} exists")


def is_minari_dir(path: Any) -> bool:
    """Whether `path` looks like a Minari dataset folder (its metadata names a Minari data format)."""
    try:
        meta = read_metadata(locate(path))
    except (StorageFormatError, OSError):
        return False
    return meta.get("data_format") in FORMATS and "total_episodes" in meta


def read_metadata(data_dir: str) -> Dict[str, Any]:
    """`data/metadata.json`, with its fields checked."""
    path = os.path.join(data_dir, METADATA_FILE)
    meta = load_json(path, f"{WHO}: Minari metadata")
    if not isinstance(meta, dict):
        raise StorageFormatError(f"{WHO}: {path} must hold a JSON object")
    fmt = meta.get("data_format", "hdf5")
    if fmt not in FORMATS:
        raise StorageFormatError(f"{WHO}: {path} names the data format {fmt!r}; this reader knows {FORMATS}")
    n = meta.get("total_episodes")
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise StorageFormatError(f"{WHO}: {path}: total_episodes must be a non-negative int, got {n!r}")
    for key in ("observation_space", "action_space"):
        if not isinstance(meta.get(key), str):
            raise StorageFormatError(f"{WHO}: {path} does not record {key} (datasets that only name a gymnasium env "
                                     "spec are not supported: load them once with minari, which adds it)")
    return meta


def _load_space_json(text: Any, where: str) -> Dict[str, Any]:
    if isinstance(text, str):
        try:
            text = json.loads(text)
        except json.JSONDecodeError as exc:
            raise StorageFormatError(f"{where} is not valid JSON ({exc})") from None
    if not isinstance(text, dict) or "type" not in text:
        raise StorageFormatError(f"{where} must be a JSON object with a 'type'")
    return text


def _box_is_image(shape: Tuple[int, ...], dtype: np.dtype, low: np.ndarray, high: np.ndarray) -> bool:
    return (len(shape) in (2, 3) and shape[0] >= 32 and shape[1] >= 32 and dtype == np.uint8
            and bool(np.all(low == 0)) and bool(np.all(high == 255)))


def _cast_bounds(values: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Bounds in `dtype` (an integer dtype clips infinite or out-of-range bounds to its own range)."""
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        v = np.asarray(values, dtype=np.float64)
        v = np.where(np.isnan(v), 0, v)
        return np.clip(v, info.min, info.max).astype(dtype)
    return np.asarray(values).astype(dtype)


def parse_space(js: Any, backend: Any, device: Any, where: str, path: Path = (),
                leaves: Optional[List[Leaf]] = None,
                stored: Optional[Dict[Path, np.dtype]] = None) -> Tuple[Space, List[Leaf]]:
    """`(space, leaves)` of a Minari space JSON (a string or an already parsed object).

    Box keeps its dtype, shape and bounds; Discrete(n, start) is an int64 scalar Box in [start, start + n - 1];
    MultiDiscrete(nvec, start) a Box of its dtype in [start, start + nvec - 1]; MultiBinary(n) an int8 Box in
    [0, 1] (gymnasium's dtype); Dict a DictSpace; Tuple a TupleSpace; Text a TextSpace. `stored` gives, per leaf
    path, the dtype the data files really hold where it differs from the JSON's (the data wins: it is what minari
    returns)."""
    out = [] if leaves is None else leaves
    d = _load_space_json(js, where)
    kind = d["type"]
    here = f"{where} ({'/'.join(map(str, path)) or 'top'})"
    own = (stored or {}).get(path)

    def box(low: Any, high: Any, dtype: np.dtype, shape: Tuple[int, ...], image: bool = False) -> Space:
        dt = own if own is not None else dtype
        out.append(Leaf(path, shape, dt, image=image))
        lo = _cast_bounds(np.broadcast_to(np.asarray(low), shape), dt)
        hi = _cast_bounds(np.broadcast_to(np.asarray(high), shape), dt)
        return BoxSpace(backend, lo, hi, dt, device=device, shape=shape)

    try:
        if kind == "Box":
            dtype = np.dtype(d["dtype"])
            shape = tuple(int(s) for s in d["shape"])
            low = np.broadcast_to(np.asarray(d["low"], dtype=np.float64 if dtype.kind == "f" else None), shape)
            high = np.broadcast_to(np.asarray(d["high"], dtype=np.float64 if dtype.kind == "f" else None), shape)
            return box(low, high, dtype, shape, _box_is_image(shape, dtype, low, high)), out
        if kind == "Discrete":
            n, start = int(d["n"]), int(d.get("start", 0))
            return box(start, start + n - 1, np.dtype(np.int64), ()), out
        if kind == "MultiDiscrete":
            nvec = np.asarray(d["nvec"], dtype=np.int64)
            first = np.asarray(d.get("start", np.zeros_like(nvec)), dtype=np.int64)
            return box(first, first + nvec - 1, np.dtype(d.get("dtype", "int64")), nvec.shape), out
        if kind == "MultiBinary":
            bits = d["n"]
            bshape = (int(bits),) if isinstance(bits, int) else tuple(int(s) for s in bits)
            return box(0, 1, np.dtype(np.int8), bshape), out
        if kind == "Dict":
            subs = d["subspaces"]
            children = {str(k): parse_space(v, backend, device, where, path + (str(k),), out, stored)[0]
                        for k, v in subs.items()}
            return DictSpace(backend, children, device=device), out
        if kind == "Tuple":
            kids = [parse_space(v, backend, device, where, path + (i,), out, stored)[0]
                    for i, v in enumerate(d["subspaces"])]
            return TupleSpace(backend, kids, device=device), out
        if kind == "Text":
            out.append(Leaf(path, (), None, text=True))
            charset = d.get("charset")
            return TextSpace(backend, int(d["max_length"]), min_length=int(d.get("min_length", 0)),
                             charset=None if charset is None else str(charset), device=device), out
    except (KeyError, TypeError, ValueError) as exc:
        raise StorageFormatError(f"{here}: the {kind} space is malformed ({type(exc).__name__}: {exc})") from None
    raise StorageFormatError(f"{here}: unknown space type {kind!r} (known: Box, Discrete, MultiDiscrete, MultiBinary, "
                             "Dict, Tuple, Text)")


def decode_jpeg(data: Any, shape: Tuple[int, ...], where: str) -> np.ndarray:
    """One JPEG frame as minari decodes it (Pillow, uint8), checked against the space's shape."""
    image_mod = require_module("PIL.Image", "minari", WHO)
    try:
        frame = np.array(image_mod.open(io.BytesIO(bytes(data))), dtype=np.uint8)
    except Exception as exc:  # noqa: BLE001 - Pillow raises several types for a bad stream
        raise StorageFormatError(f"{where}: a frame is not a readable JPEG image ({type(exc).__name__}: {exc})") from None
    if frame.shape != shape:
        raise StorageFormatError(f"{where}: a frame decodes to shape {frame.shape}; the space has {shape}")
    return frame


#: rows are read as one contiguous span (then picked in memory) when the span is at most this many times their count
#: (HDF5's point selections cost far more per row than reading the rows in between)
SPAN_FACTOR = 8
#: ... and always when they lie within this many rows
MIN_SPAN = 64
#: bytes of whole low-dimensional columns kept in memory per open dataset (least recently used dropped first)
CACHE_BYTES = 256 * 2 ** 20
#: bytes of whole-dataset low-dimensional columns kept in memory per open dataset (random batches gather from them)
GLOBAL_BYTES = 512 * 2 ** 20


def _rows_key(rows: np.ndarray) -> Tuple[Any, Optional[np.ndarray]]:
    """A read key for `rows` and the positions in what it reads that give `rows` in their order (None: as read).

    Consecutive rows are one slice; rows close together one slice read whole and picked; others the sorted
    unique rows (an HDF5 point selection)."""
    if rows.size == 0:
        return slice(0, 0), None
    lo, hi = int(rows.min()), int(rows.max()) + 1
    if rows.size == hi - lo and np.all(np.diff(rows) == 1):
        return slice(lo, hi), None
    if hi - lo <= max(MIN_SPAN, SPAN_FACTOR * rows.size):
        return slice(lo, hi), rows - lo
    uniq, inverse = np.unique(rows, return_inverse=True)
    return uniq, inverse


class EpisodeSource:
    """Reads steps of the episodes of one Minari `data/` folder (HDF5Episodes or ArrowEpisodes)."""

    def __init__(self, data_dir: str, meta: Dict[str, Any], obs_leaves: Sequence[Leaf],
                 act_leaves: Sequence[Leaf]) -> None:
        self.data_dir = data_dir
        self.meta = meta
        self.obs_leaves = list(obs_leaves)
        self.act_leaves = list(act_leaves)
        self.jpeg = bool(meta.get("jpeg_encoding", True))
        self.num_episodes = int(meta["total_episodes"])
        self.lengths = np.zeros(self.num_episodes, dtype=np.int64)
        self._cache: "OrderedDict[Tuple[Any, ...], np.ndarray]" = OrderedDict()
        self._cache_bytes = 0
        self._global: Dict[Tuple[Any, ...], Optional[np.ndarray]] = {}
        self._global_bytes = 0
        self.step_dtypes: Dict[str, np.dtype] = {"rewards": np.dtype(np.float64),
                                                 "terminations": np.dtype(np.bool_),
                                                 "truncations": np.dtype(np.bool_)}

    def read(self, episode: int, rows: np.ndarray, fields: Sequence[str]) -> Dict[str, Any]:
        """`{field: {leaf path: array}}` (observations and actions) or `{field: array}` (the step fields) of steps
        `rows` (sorted or not) of `episode`, for each of `fields`: `observations` are those before each step,
        `next_observations` those after it."""
        out: Dict[str, Any] = {}
        for field in fields:
            if field == "observations":
                out[field] = self.read_observations(episode, rows)
            elif field == "next_observations":
                out[field] = self.read_observations(episode, rows + 1)
            elif field == "actions":
                out[field] = {leaf.path: self.read_leaf(episode, "actions", leaf, rows) for leaf in self.act_leaves}
            else:
                out[field] = self.read_step_field(episode, field, rows)
        return out

    def read_observations(self, episode: int, rows: np.ndarray) -> Dict[Path, np.ndarray]:
        """Observations `rows` of `episode` (row `n` is the one after the last step)."""
        return {leaf.path: self.read_leaf(episode, "observations", leaf, rows) for leaf in self.obs_leaves}

    def gather(self, field: str, episodes: np.ndarray, steps: np.ndarray) -> Optional[Any]:
        """Rows (`episodes[i]`, `steps[i]`) of `field` from whole-dataset columns held in memory (built on first
        use, up to GLOBAL_BYTES per dataset): `{leaf path: array}` for observations and actions, an array for the
        step fields; None when the field has images or text, or does not fit (then read episode by episode)."""
        if self.num_episodes == 0:
            return None
        if field in ("observations", "next_observations", "actions"):
            base = "actions" if field == "actions" else "observations"
            leaves = self.act_leaves if field == "actions" else self.obs_leaves
            if any(leaf.image or leaf.text for leaf in leaves):
                return None
            cols = [self._global_column(base, leaf) for leaf in leaves]
            if any(c is None for c in cols):
                return None
            starts = self._starts() + (np.arange(self.num_episodes) if base == "observations" else 0)
            rows = starts[episodes] + steps + (1 if field == "next_observations" else 0)
            return {leaf.path: c[rows] for leaf, c in zip(leaves, cols)}  # type: ignore[index]
        col = self._global_column(field, None)
        return None if col is None else col[self._starts()[episodes] + steps]

    def _starts(self) -> np.ndarray:
        return np.cumsum(self.lengths) - self.lengths

    def _global_column(self, field: str, leaf: Optional[Leaf]) -> Optional[np.ndarray]:
        key = (field, None if leaf is None else leaf.path)
        if key in self._global:
            return self._global[key]
        extra = 1 if field == "observations" else 0
        count = int(self.lengths.sum()) + extra * self.num_episodes
        if leaf is None:
            itemsize = self.step_dtypes[field].itemsize
        else:
            itemsize = (leaf.dtype.itemsize if leaf.dtype is not None else 8) * int(np.prod(leaf.shape))
        if self._global_bytes + count * itemsize > GLOBAL_BYTES:
            self._global[key] = None
            return None
        parts = []
        for e in range(self.num_episodes):
            rows = np.arange(int(self.lengths[e]) + extra, dtype=np.int64)
            parts.append(self._load_step_field(e, field, rows) if leaf is None else self._load_leaf(e, field, leaf, rows))
        whole = np.concatenate(parts)
        self._global[key] = whole
        self._global_bytes += whole.nbytes
        return whole

    def _cached(self, key: Tuple[Any, ...], count: int, load: Any, rows: np.ndarray) -> np.ndarray:
        """Rows `rows` of a whole column of `count` rows that `load(all_rows)` reads, kept in the LRU cache."""
        whole = self._cache.get(key)
        if whole is None:
            whole = load(np.arange(count, dtype=np.int64))
            if whole.nbytes <= CACHE_BYTES // 8:
                self._cache[key] = whole
                self._cache_bytes += whole.nbytes
                while self._cache_bytes > CACHE_BYTES:
                    _, old = self._cache.popitem(last=False)
                    self._cache_bytes -= old.nbytes
        else:
            self._cache.move_to_end(key)
        return whole[rows]

    def read_leaf(self, episode: int, field: str, leaf: Leaf, rows: np.ndarray) -> np.ndarray:
        """Rows `rows` of one leaf of `observations` or `actions` of `episode`. Low-dimensional leaves are read
        whole once and kept (random access then costs no file read); images and text are read row by row."""
        if leaf.image or leaf.text:
            return self._load_leaf(episode, field, leaf, rows)
        count = int(self.lengths[episode]) + (1 if field == "observations" else 0)
        return self._cached((episode, field, leaf.path), count,
                            lambda r: self._load_leaf(episode, field, leaf, r), rows)

    def read_step_field(self, episode: int, field: str, rows: np.ndarray) -> np.ndarray:
        return self._cached((episode, field), int(self.lengths[episode]),
                            lambda r: self._load_step_field(episode, field, r), rows)

    def _load_leaf(self, episode: int, field: str, leaf: Leaf, rows: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def stored_dtype(self, field: str, leaf: Leaf) -> Optional[np.dtype]:
        """The dtype the first episode's file holds for `leaf` of `field` (None: no episodes, text, JPEG)."""
        return None

    def _load_step_field(self, episode: int, field: str, rows: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def episode_attrs(self, episode: int) -> Dict[str, Any]:
        raise NotImplementedError

    def close(self) -> None:
        self._cache.clear()
        self._cache_bytes = 0
        self._global.clear()
        self._global_bytes = 0


class HDF5Episodes(EpisodeSource):
    """Episodes of `data/main_data.hdf5`."""

    def __init__(self, data_dir: str, meta: Dict[str, Any], obs_leaves: Sequence[Leaf],
                 act_leaves: Sequence[Leaf]) -> None:
        super().__init__(data_dir, meta, obs_leaves, act_leaves)
        require_module("h5py", "minari", WHO)     # named here, so the message names this reader and its extra
        from unienv_data.storages._hdf5_file import _open_file
        self.path = os.path.join(data_dir, HDF5_FILE)
        if not os.path.isfile(self.path):
            raise StorageNotFoundError(f"{WHO}: file not found: {self.path} (metadata.json says the data format is "
                                       "hdf5)")
        self._datasets: Dict[Tuple[int, str], Any] = {}
        self.file: Any = None
        if self.num_episodes == 0 and os.path.getsize(self.path) == 0:
            return  # minari creates the file empty and fills it with the first episode
        self.file = _open_file(self.path, "r", WHO)
        try:
            self._index_episodes()
        except BaseException:
            self.file.close()
            raise

    def _member(self, parent: Any, key: str, what: str, missing: str) -> Any:
        """`parent[key]` (an HDF5 group or dataset, called `what` in messages); StorageFormatError when it is
        missing (the message ends with `missing`) or cannot be read."""
        try:
            return parent[key]
        except KeyError:
            raise StorageFormatError(f"{WHO}: {self.path}{missing}") from None
        except (OSError, RuntimeError) as exc:
            raise StorageFormatError(f"{WHO}: {self.path}: {what} cannot be read ({exc}); the file is damaged") from None

    def _group(self, episode: int) -> Any:
        name = f"episode_{episode}"
        return self._member(self.file, name, f"the group {name!r}",
                            f" has no group {name!r} ({self.num_episodes} episodes are recorded in metadata.json); "
                            "the file is incomplete")

    def _dataset(self, episode: int, field: str, path: Path = ()) -> Any:
        parts = [field] + [f"_index_{p}" if isinstance(p, int) else str(p) for p in path]
        key = "/".join(parts)
        cached = self._datasets.get((episode, key))
        if cached is not None:
            return cached
        ds = self._datasets[(episode, key)] = self._member(
            self._group(episode), key, f"episode_{episode}/{key}",
            f": episode_{episode} has no dataset {key!r}; the file does not match the spaces in metadata.json")
        return ds

    def _index_episodes(self) -> None:
        for e in range(self.num_episodes):
            ds = self._dataset(e, "rewards")
            n = int(ds.shape[0]) if ds.shape else 0
            self.lengths[e] = n
            attrs = self._group(e).attrs
            if "total_steps" in attrs and int(attrs["total_steps"]) != n:
                raise StorageFormatError(f"{WHO}: {self.path}: episode_{e} says total_steps={int(attrs['total_steps'])}"
                                         f" but holds {n} rewards")
            for field in STEP_FIELDS[1:]:
                other = self._dataset(e, field)
                if other.shape[:1] != (n,):
                    raise StorageFormatError(f"{WHO}: {self.path}: episode_{e}/{field} has {other.shape[:1]} rows, "
                                             f"its rewards {n}")
            if e == 0:
                for field in STEP_FIELDS:
                    self.step_dtypes[field] = np.dtype(self._dataset(0, field).dtype)

    def _load_leaf(self, episode: int, field: str, leaf: Leaf, rows: np.ndarray) -> np.ndarray:
        ds = self._dataset(episode, field, leaf.path)
        where = f"{self.path}: episode_{episode}/{leaf.where(field)}"
        raw = self._rows(ds, rows, where)
        if leaf.text:
            out = np.empty(len(raw), dtype=object)
            out[:] = [v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in raw]
        elif leaf.image and self.jpeg and tuple(ds.shape[1:]) != leaf.shape:
            frames = [decode_jpeg(np.asarray(b, dtype=np.uint8).tobytes(), leaf.shape, where) for b in raw]
            out = np.stack(frames) if frames else np.zeros((0,) + leaf.shape, np.uint8)
        else:
            out = np.asarray(raw)
            if out.shape[1:] != leaf.shape:
                raise StorageFormatError(f"{WHO}: {where} holds elements of shape {out.shape[1:]}; the space in "
                                         f"metadata.json has {leaf.shape}")
            if leaf.dtype is not None and out.dtype != leaf.dtype:
                raise StorageFormatError(f"{WHO}: {where} holds {out.dtype}; the space in metadata.json has "
                                         f"{leaf.dtype}")
        return out

    @staticmethod
    def _rows(ds: Any, rows: np.ndarray, where: str) -> np.ndarray:
        """Rows `rows` of the h5py dataset `ds`, in their order (see `_rows_key`)."""
        key, pick = _rows_key(rows)
        try:
            raw = np.asarray(ds[key])
        except (OSError, RuntimeError, ValueError) as exc:
            raise StorageFormatError(f"{WHO}: {where} cannot be read ({exc}); the file is damaged") from None
        wanted = key.stop - key.start if isinstance(key, slice) else int(key.shape[0])
        if raw.shape[:1] != (wanted,):
            raise StorageFormatError(f"{WHO}: {where} holds fewer rows than its episode's steps; the file is "
                                     "incomplete")
        return raw if pick is None else raw[pick]

    def _load_step_field(self, episode: int, field: str, rows: np.ndarray) -> np.ndarray:
        return self._rows(self._dataset(episode, field), rows, f"{self.path}: episode_{episode}/{field}")

    def stored_dtype(self, field: str, leaf: Leaf) -> Optional[np.dtype]:
        if self.num_episodes == 0 or leaf.text:
            return None
        dt = np.dtype(self._dataset(0, field, leaf.path).dtype)
        return None if dt == object or (leaf.image and self.jpeg and dt == np.uint8 and
                                        tuple(self._dataset(0, field, leaf.path).shape[1:]) != leaf.shape) else dt

    def episode_attrs(self, episode: int) -> Dict[str, Any]:
        attrs: Dict[str, Any] = {}
        for k, v in self._group(episode).attrs.items():
            set_path(attrs, str(k).split("/"), v.item() if isinstance(v, np.generic) else v)
        return attrs

    def close(self) -> None:
        super().close()
        self._datasets.clear()
        try:
            if self.file is not None:
                self.file.close()
        except Exception:  # noqa: BLE001 - closing twice or after a failed open
            pass


class ArrowEpisodes(EpisodeSource):
    """Episodes of an Arrow-format `data/` folder (one folder of IPC files per episode)."""

    def __init__(self, data_dir: str, meta: Dict[str, Any], obs_leaves: Sequence[Leaf],
                 act_leaves: Sequence[Leaf]) -> None:
        super().__init__(data_dir, meta, obs_leaves, act_leaves)
        self.pa = require_module("pyarrow", "minari", WHO)
        require_module("pyarrow.ipc", "minari", WHO)
        self._tables: Dict[int, Any] = {}
        self._files: Dict[int, List[str]] = {}
        for e in range(self.num_episodes):
            table = self._table(e)
            n = table.num_rows - 1
            if n < 0:
                raise StorageFormatError(f"{WHO}: {self._files[e][0]} holds no rows; an episode has at least its "
                                         "first observation")
            self.lengths[e] = n
            if e == 0:
                for field in STEP_FIELDS:
                    self.step_dtypes[field] = np.dtype(table.schema.field(field).type.to_pandas_dtype())
        for e in range(self.num_episodes):  # the per-episode metadata files must agree with the data
            mpath = os.path.join(self.data_dir, str(e), METADATA_FILE)
            if os.path.exists(mpath):
                m = load_json(mpath, f"{WHO}: Minari metadata")
                if isinstance(m, dict) and "total_steps" in m and int(m["total_steps"]) != self.lengths[e]:
                    raise StorageFormatError(f"{WHO}: {mpath} says total_steps={m['total_steps']} but the episode's "
                                             f"Arrow data holds {self.lengths[e]} steps")

    def _table(self, episode: int) -> Any:
        table = self._tables.get(episode)
        if table is not None:
            return table
        folder = os.path.join(self.data_dir, str(episode))
        if not os.path.isdir(folder):
            raise StorageNotFoundError(f"{WHO}: episode folder not found: {folder} ({self.num_episodes} episodes are "
                                       "recorded in metadata.json)")
        files = sorted(f for f in os.listdir(folder) if not f.startswith((".", "_")) and f != METADATA_FILE)
        if not files:
            raise StorageNotFoundError(f"{WHO}: {folder} holds no Arrow file")
        tables = []
        pa = self.pa
        for name in files:
            path = os.path.join(folder, name)
            try:
                with pa.memory_map(path, "r") as source:
                    tables.append(pa.ipc.open_file(source).read_all())
            except (pa.ArrowInvalid, OSError) as exc:
                raise StorageFormatError(f"{WHO}: {path} is not a readable Arrow IPC file ({exc}); it may be "
                                         "truncated or damaged") from None
        table = tables[0] if len(tables) == 1 else pa.concat_tables(tables)
        for field in ("observations", "actions") + STEP_FIELDS:
            if field not in table.column_names:
                raise StorageFormatError(f"{WHO}: {os.path.join(folder, files[0])} has no column {field!r}")
        self._files[episode] = [os.path.join(folder, f) for f in files]
        self._tables[episode] = table
        return table

    def _column(self, episode: int, field: str, path: Path) -> Any:
        arr = self._table(episode).column(field)
        for p in path:
            arr = (arr.combine_chunks() if isinstance(arr, self.pa.ChunkedArray) else arr).field(str(p))
        return arr

    def _load_leaf(self, episode: int, field: str, leaf: Leaf, rows: np.ndarray) -> np.ndarray:
        from ._arrow_columns import column_to_numpy
        where = f"{self._files.get(episode, [str(episode)])[0]}: {leaf.where(field)}"
        arr = self._column(episode, field, leaf.path).take(self.pa.array(rows, type=self.pa.int64()))
        pa = self.pa
        if leaf.text:
            out = np.empty(len(arr), dtype=object)
            out[:] = arr.to_pylist()
            return out
        typ = arr.type
        if leaf.image and self.jpeg and (pa.types.is_binary(typ) or pa.types.is_large_binary(typ)):
            frames = [decode_jpeg(b, leaf.shape, where) for b in arr.to_pylist()]
            return np.stack(frames) if frames else np.zeros((0,) + leaf.shape, np.uint8)
        flat = (int(np.prod(leaf.shape)),) if leaf.shape else ()
        try:
            out = column_to_numpy(pa, arr, flat, leaf.dtype, where)
        except ValueError as exc:
            raise StorageFormatError(str(exc)) from None
        return out.reshape((len(rows),) + leaf.shape)

    def stored_dtype(self, field: str, leaf: Leaf) -> Optional[np.dtype]:
        if self.num_episodes == 0 or leaf.text:
            return None
        typ = self._column(0, field, leaf.path).type
        while hasattr(typ, "value_type"):
            typ = typ.value_type
        pa = self.pa
        if pa.types.is_binary(typ) or pa.types.is_large_binary(typ) or pa.types.is_string(typ):
            return None
        try:
            return np.dtype(typ.to_pandas_dtype())
        except (NotImplementedError, TypeError):
            return None

    def _load_step_field(self, episode: int, field: str, rows: np.ndarray) -> np.ndarray:
        from ._arrow_columns import column_to_numpy
        arr = self._table(episode).column(field).take(self.pa.array(rows, type=self.pa.int64()))
        try:
            return column_to_numpy(self.pa, arr, (), self.step_dtypes[field], f"{self._files[episode][0]}: {field}")
        except ValueError as exc:
            raise StorageFormatError(str(exc)) from None

    def episode_attrs(self, episode: int) -> Dict[str, Any]:
        path = os.path.join(self.data_dir, str(episode), METADATA_FILE)
        if not os.path.exists(path):
            return {"id": episode}
        m = load_json(path, f"{WHO}: Minari metadata")
        return m if isinstance(m, dict) else {"id": episode}

    def close(self) -> None:
        super().close()
        self._tables.clear()


def open_episodes(data_dir: str, meta: Dict[str, Any], obs_leaves: Sequence[Leaf],
                  act_leaves: Sequence[Leaf]) -> EpisodeSource:
    """The reader for the data format that `meta` names."""
    if meta.get("data_format", "hdf5") == "hdf5":
        return HDF5Episodes(data_dir, meta, obs_leaves, act_leaves)
    return ArrowEpisodes(data_dir, meta, obs_leaves, act_leaves)


__all__ = ["Leaf", "EpisodeSource", "HDF5Episodes", "ArrowEpisodes", "open_episodes", "parse_space", "locate",
           "is_minari_dir", "read_metadata", "decode_jpeg", "METADATA_FILE", "HDF5_FILE", "STEP_FIELDS", "FORMATS"]
