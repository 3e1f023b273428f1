"""Writing a Minari dataset folder (HDF5 or Arrow format) that `minari.load_dataset` opens, without minari.

`write_minari(source, dst, dataset_id=None, data_format="hdf5", progress=None)` writes `dst/data/` from a source
whose rows are steps: `source.space` a DictSpace with `observations`, `actions`, `rewards`, `terminations`,
`truncations` and optionally `next_observations` - or the keys a `ReplayBufferCollectionWrapper` records (`obs`,
`action`, `reward`, `terminated`, `truncated`, `next_obs`; a `done` key is checked to be `terminated or truncated`
and left out), or any keys named with `keys={source key: field}` (`exclude=[...]` leaves keys out; a key Minari
cannot hold is refused, never dropped); `source.episodes()` the `(start, end)` row ranges of the
episodes; `source.read(rows)` nested arrays of those rows (an `OpenedDataset` of `unienv_data.inspect`, or the
`BatchSource` of a batch). Minari keeps `n + 1` observations for an `n`-step episode: the last one is the episode's
last `next_observations` row (inside an episode each `next_observations` row must equal the next
`observations` row, else the export is refused, since one of the two would be lost); a source without that key is
refused unless `final_observation="repeat"` (the last
observation written twice, and the metadata says so under `unienv_final_observation`).

Spaces map onto gymnasium's as minari serialises them: a float Box is a Box; an int64 scalar Box with finite
bounds a Discrete; a 1-D integer Box with finite bounds a MultiDiscrete; other Boxes stay Boxes; a BinarySpace a
MultiBinary (values written as int8 0/1, gymnasium's dtype); Dict, Tuple and Text map to themselves. Images are
written as raw uint8 frames (`jpeg_encoding: false` in the metadata), so nothing is lost on the way.

Rows outside every episode cannot be represented in Minari and are refused (ValueError naming how many).
The folder is written episode by episode (memory: one episode). `dst` must not exist or be empty.
"""
from __future__ import annotations

import json
import os
import re
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from unienv_data.storages._list_helpers import require_module
from unienv_interface.space import BinarySpace, BoxSpace, DictSpace, Space, TextSpace, TupleSpace

from ._minari_format import HDF5_FILE, METADATA_FILE

WHO = "write_minari"
#: The minari release whose on-disk layout this writer follows (minari 0.5.0 and later read it).
MINARI_FORMAT_VERSION = "0.5.0"
REQUIRED_KEYS = ("observations", "actions", "rewards", "terminations", "truncations")
#: every field a source key can be mapped to: the required ones and the observation after each step
FIELDS = REQUIRED_KEYS + ("next_observations",)
#: the keys of a `ReplayBufferCollectionWrapper` recording (`replay_buffer.collection_wrapper.CANONICAL_KEYS`) and the
#: Minari field each holds; its `done` is checked against terminations / truncations and left out
COLLECTION_KEYS = {"obs": "observations", "next_obs": "next_observations", "action": "actions",
                   "reward": "rewards", "terminated": "terminations", "truncated": "truncations"}
_DATASET_ID = re.compile(r"^([\w.-]+/)*[\w.]+(-[\w.]+)*-v\d+$")


def space_to_minari_json(space: Space, where: str = "space") -> Dict[str, Any]:
    """The minari (gymnasium) serialisation of `space` (see the module docstring for the mapping)."""
    if isinstance(space, DictSpace):
        return {"type": "Dict", "subspaces": {k: space_to_minari_json(v, f"{where}/{k}")
                                              for k, v in space.spaces.items()}}
    if isinstance(space, TupleSpace):
        return {"type": "Tuple", "subspaces": [space_to_minari_json(v, f"{where}/{i}")
                                               for i, v in enumerate(space.spaces)]}
    if isinstance(space, TextSpace):
        charset = "".join(space.charset_list) if space.charset_list is not None else None
        out: Dict[str, Any] = {"type": "Text", "max_length": space.max_length, "min_length": space.min_length}
        if charset is not None:
            out["charset"] = charset
        else:
            raise ValueError(f"{where}: a TextSpace without a charset has no gymnasium equivalent minari can read "
                             "back (gymnasium's Text needs its characters); give the space a charset")
        return out
    if isinstance(space, BinarySpace):
        if not space.shape:
            raise ValueError(f"{where}: a scalar BinarySpace has no gymnasium equivalent (MultiBinary needs a shape); "
                             "reshape it to (1,)")
        return {"type": "MultiBinary", "n": list(space.shape) if len(space.shape) > 1 else int(space.shape[0])}
    if isinstance(space, BoxSpace):
        dtype = np.dtype(space.backend.numpy_dtype(space.dtype))
        low = np.asarray(space.backend.to_numpy(space.low)) if not isinstance(space.low, np.ndarray) else space.low
        high = np.asarray(space.backend.to_numpy(space.high)) if not isinstance(space.high, np.ndarray) else space.high
        low = np.broadcast_to(low, space.shape)
        high = np.broadcast_to(high, space.shape)
        bounded = dtype.kind in "iu" and bool(np.all(high > low)) and (
            dtype.kind == "u" or bool(np.all(low > np.iinfo(dtype).min)) and bool(np.all(high < np.iinfo(dtype).max)))
        if bounded and dtype == np.int64 and space.shape == ():
            return {"type": "Discrete", "dtype": "int64", "start": int(low), "n": int(high) - int(low) + 1}
        if bounded and len(space.shape) == 1:
            return {"type": "MultiDiscrete", "dtype": str(dtype), "nvec": (high.astype(np.int64) - low + 1).tolist(),
                    "start": low.astype(np.int64).tolist()}
        return {"type": "Box", "dtype": str(dtype), "shape": list(space.shape), "low": low.tolist(),
                "high": high.tolist()}
    raise TypeError(f"{where}: a {type(space).__name__} has no Minari (gymnasium) equivalent")


def _leaves(space: Space, value: Any, path: Tuple[Any, ...] = ()) -> List[Tuple[Tuple[Any, ...], Space, Any]]:
    if isinstance(space, DictSpace):
        out = []
        for k, sp in space.spaces.items():
            out.extend(_leaves(sp, value[k], path + (k,)))
        return out
    if isinstance(space, TupleSpace):
        out = []
        for i, sp in enumerate(space.spaces):
            out.extend(_leaves(sp, value[i], path + (i,)))
        return out
    return [(path, space, value)]


def _leaf_array(space: Space, value: Any, backend: Any) -> np.ndarray:
    if isinstance(space, TextSpace):
        return np.asarray(value, dtype=object)
    arr = np.asarray(value if isinstance(value, np.ndarray) else backend.to_numpy(value))
    if isinstance(space, BinarySpace):
        return arr.astype(np.int8)
    return arr


def _leaf_keys(space: Space, prefix: str = "") -> List[str]:
    if isinstance(space, DictSpace):
        out: List[str] = []
        for k, sp in space.spaces.items():
            out.extend(_leaf_keys(sp, f"{prefix}{k}/"))
        return out
    return [prefix.rstrip("/")]


def _subspace(space: Space, key: str) -> Optional[Space]:
    """The space of the (possibly nested, `a/b`) key of a DictSpace, None when there is no such key."""
    for part in key.split("/"):
        if not isinstance(space, DictSpace) or part not in space.spaces:
            return None
        space = space.spaces[part]
    return space


def _value(row: Any, key: str) -> Any:
    for part in key.split("/"):
        row = row[part]
    return row


def _under(leaf: str, key: str) -> bool:
    return leaf == key or leaf.startswith(key + "/")


def resolve_keys(space: Space, keys: Optional[Mapping[str, str]] = None,
                 exclude: Sequence[str] = ()) -> Tuple[Dict[str, str], Optional[str]]:
    """`({minari field: source key}, the source's `done` key or None)` for a source of `space`.

    `keys` maps source keys (nested ones as `a/b`) to Minari fields (`observations`, `actions`, `rewards`,
    `terminations`, `truncations`, `next_observations`); a field it does not name is taken from the source key of the
    same name, else from the `ReplayBufferCollectionWrapper` key that holds it (`COLLECTION_KEYS`). `exclude` names
    source keys left out. A `done` key is left out too once the export has checked it is `terminations or
    truncations` on every row (the second value). Any other source key is a ValueError: Minari would lose it."""
    if not isinstance(space, DictSpace):
        raise ValueError(f"a Minari export needs rows that are dicts with the keys {list(REQUIRED_KEYS)}; the "
                         f"source's space is a {type(space).__name__}")
    keys = {k.replace(".", "/") if _subspace(space, k) is None else k: v for k, v in (keys or {}).items()}
    excluded = [k.replace(".", "/") if _subspace(space, k) is None else k for k in exclude]
    leaves = _leaf_keys(space)
    unknown = [k for k in list(keys) + excluded if _subspace(space, k) is None]
    if unknown:
        raise ValueError(f"the key(s) {unknown} given to map or exclude are not in the source; its keys are {leaves}")
    bad = {k: v for k, v in keys.items() if v not in FIELDS}
    if bad:
        raise ValueError(f"{bad}: a key can only be mapped to a Minari field, one of {list(FIELDS)}")
    fields: Dict[str, str] = {}
    for ours, field in keys.items():
        if field in fields:
            raise ValueError(f"the source keys {fields[field]!r} and {ours!r} are both mapped to {field!r}")
        fields[field] = ours
    taken = set(keys) | set(excluded)
    for field in FIELDS:
        if field in fields:
            continue
        candidates = [field] + [k for k, f in COLLECTION_KEYS.items() if f == field]
        for cand in candidates:
            if cand in space.spaces and cand not in taken:
                fields[field] = cand
                taken.add(cand)
                break
    missing = [f for f in REQUIRED_KEYS if f not in fields]
    if missing:
        wrapper = {f: k for k, f in COLLECTION_KEYS.items()}
        raise ValueError(
            f"a Minari export needs the fields {list(REQUIRED_KEYS)}; no key of the source holds {missing} (its keys "
            f"are {leaves}). Minari's own names and those of a ReplayBufferCollectionWrapper recording "
            f"({', '.join(f'{wrapper[f]}->{f}' for f in FIELDS)}) are found by themselves; name the others with "
            f"--map KEY=FIELD (write_minari(keys={{KEY: FIELD}})), e.g. --map {leaves[0]}={missing[0]}")
    done: Optional[str] = None
    if "done" in space.spaces and "done" not in taken:
        done = "done"
        taken.add(done)
    left = [leaf for leaf in leaves if not any(_under(leaf, k) for k in taken)]
    if left:
        raise ValueError(f"the source has keys Minari cannot hold: {left} (Minari keeps {list(REQUIRED_KEYS)}, the "
                         "observation after each episode's last step, and infos); leave them out with --exclude KEY "
                         "(write_minari(exclude=[KEY])), or map one onto a field with --map KEY=FIELD")
    return fields, done


def _equal_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per row of `a` and `b`: whether they hold the same values (NaN equal to NaN)."""
    if a.dtype == object:
        return np.asarray([x == y for x, y in zip(a.tolist(), b.tolist())], dtype=bool)
    same = a == b
    if a.dtype.kind in "fc":
        same |= np.isnan(a) & np.isnan(b)
    return same.reshape(same.shape[0], int(np.prod(same.shape[1:]))).all(axis=1)


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and bool(_equal_rows(a, b).all())


def _check_done(parts: List[Any], key: str, fields: Dict[str, List[Tuple[Tuple[Any, ...], np.ndarray]]],
                backend: Any, start: int) -> None:
    """The source's `done` must be `terminations or truncations` on every row: then leaving it out loses nothing."""
    done = np.concatenate([np.asarray(v if isinstance(v, np.ndarray) else backend.to_numpy(v))
                           for v in (_value(p, key) for p in parts)]).astype(np.bool_).reshape(-1)
    either = (fields["terminations"][0][1] | fields["truncations"][0][1]).reshape(-1)
    if done.shape != either.shape or not np.array_equal(done, either):
        bad = start + int(np.flatnonzero(done != either)[0]) if done.shape == either.shape else start
        raise ValueError(f"row {bad}: the source's {key!r} is not terminations or truncations, so Minari (which keeps "
                         f"only those two) would lose it; leave it out with --exclude {key} (write_minari("
                         f"exclude=[{key!r}])) if it may be dropped")


def default_dataset_id(dst: str) -> str:
    """`dst`'s folder name when it is a valid Minari id (`name-v0`), else that name with `-v0` appended."""
    base = os.path.basename(os.path.abspath(dst))
    return base if _DATASET_ID.match(base) else f"{base}-v0"


class _HDF5Writer:
    def __init__(self, data_dir: str) -> None:
        self.h5py = require_module("h5py", "minari", WHO)
        self.file = self.h5py.File(os.path.join(data_dir, HDF5_FILE), "w", track_order=True)

    def episode(self, e: int, fields: Dict[str, List[Tuple[Tuple[Any, ...], np.ndarray]]], steps: int) -> None:
        group = self.file.create_group(f"episode_{e}")
        group.attrs["id"] = e
        group.attrs["total_steps"] = steps
        for field, leaves in fields.items():
            for path, arr in leaves:
                parts = [field] + [f"_index_{p}" if isinstance(p, int) else str(p) for p in path]
                if arr.dtype == object:
                    group.create_dataset("/".join(parts), data=[str(s) for s in arr],
                                         dtype=self.h5py.string_dtype("utf-8"))
                else:
                    group.create_dataset("/".join(parts), data=arr, chunks=True if arr.size else None,
                                         maxshape=(None,) + arr.shape[1:])

    def close(self) -> None:
        self.file.close()


class _ArrowWriter:
    def __init__(self, data_dir: str) -> None:
        self.pa = require_module("pyarrow", "minari", WHO)
        require_module("pyarrow.ipc", "minari", WHO)
        self.data_dir = data_dir

    def _array(self, arr: np.ndarray, pad: int) -> Any:
        pa = self.pa
        if arr.dtype == object:
            return pa.array([str(s) for s in arr] + [None] * pad, type=pa.string())
        if arr.ndim == 1:
            return pa.array(np.pad(arr, (0, pad)), type=pa.from_numpy_dtype(arr.dtype))
        flat = arr.reshape(arr.shape[0], -1)
        flat = np.pad(flat, ((0, pad), (0, 0)))
        typ = pa.list_(pa.from_numpy_dtype(arr.dtype), flat.shape[1])
        return pa.FixedSizeListArray.from_arrays(pa.array(flat.reshape(-1)), type=typ)

    def _nest(self, leaves: List[Tuple[Tuple[Any, ...], np.ndarray]], pad: int, depth: int = 0) -> Any:
        if len(leaves) == 1 and len(leaves[0][0]) == depth:
            return self._array(leaves[0][1], pad)
        names: List[str] = []
        groups: Dict[str, List[Tuple[Tuple[Any, ...], np.ndarray]]] = {}
        for path, arr in leaves:
            key = str(path[depth])
            if key not in groups:
                names.append(key)
                groups[key] = []
            groups[key].append((path, arr))
        arrays = [self._nest(groups[k], pad, depth + 1) for k in names]
        return self.pa.StructArray.from_arrays(arrays, names=names)

    def episode(self, e: int, fields: Dict[str, List[Tuple[Tuple[Any, ...], np.ndarray]]], steps: int) -> None:
        pa = self.pa
        cols = {}
        for field, leaves in fields.items():
            cols[field] = self._nest(leaves, 0 if field == "observations" else 1)
        folder = os.path.join(self.data_dir, str(e))
        os.makedirs(folder)
        table = pa.table(cols)
        with pa.OSFile(os.path.join(folder, "part-0.arrow"), "wb") as sink:
            with pa.ipc.new_file(sink, table.schema) as writer:
                writer.write_table(table)
        with open(os.path.join(folder, METADATA_FILE), "w", encoding="utf-8") as f:
            json.dump({"id": e, "total_steps": steps}, f)

    def close(self) -> None:
        pass


def write_minari(source: Any, dst: str, dataset_id: Optional[str] = None, data_format: str = "hdf5",
                 final_observation: str = "next", chunk: int = 256,
                 progress: Optional[Callable[[int], None]] = None, keys: Optional[Mapping[str, str]] = None,
                 exclude: Sequence[str] = ()) -> Dict[str, Any]:
    """Writes `source` as a Minari dataset at `dst` (see the module docstring); returns a summary dict.

    `keys` / `exclude` pick the source keys of the Minari fields (see `resolve_keys`; a recording of
    `ReplayBufferCollectionWrapper` needs neither). Each step's next observation must be the next step's observation
    inside an episode (Minari stores one sequence of observations); a source where it is not is refused."""
    if data_format not in ("hdf5", "arrow"):
        raise ValueError(f"data_format must be 'hdf5' or 'arrow', got {data_format!r}")
    if final_observation not in ("next", "repeat"):
        raise ValueError(f"final_observation must be 'next' or 'repeat', got {final_observation!r}")
    space = source.space
    src_keys, done_key = resolve_keys(space, keys, exclude)
    has_next = "next_observations" in src_keys
    if not has_next and final_observation != "repeat":
        raise ValueError("Minari keeps the observation after each episode's last step, and the source has no "
                         "'next_observations' (or 'next_obs') to take it from; add that key (or map one onto it: "
                         "--map KEY=next_observations), or accept repeating the last observation "
                         "(final_observation='repeat', CLI: --final-observation repeat)")
    dataset_id = dataset_id or default_dataset_id(dst)
    if not _DATASET_ID.match(dataset_id):
        raise ValueError(f"dataset_id {dataset_id!r} is not a Minari id: (namespace/)name-v<version>, e.g. "
                         "'cartpole-random-v0'")
    n = len(source)
    episodes = sorted((int(s), int(e)) for s, e in source.episodes())
    covered = sum(e - s for s, e in episodes)
    if covered != n:
        raise ValueError(f"{n - covered} of the source's {n} rows lie outside every episode; Minari holds only "
                         "episodes (convert those rows into episodes, or drop them, first)")
    spaces: Dict[str, Space] = {}
    for f, k in src_keys.items():
        sub = _subspace(space, k)
        if sub is None:     # resolve_keys found every key; a space that changed since is the caller's
            raise KeyError(f"the source has no key {k!r}")
        spaces[f] = sub
    obs_space = spaces["observations"]
    if has_next and space_to_minari_json(spaces["next_observations"]) != space_to_minari_json(obs_space):
        raise ValueError(f"the source's {src_keys['next_observations']!r} has another space than its "
                         f"{src_keys['observations']!r}; Minari stores both as one sequence of observations")
    obs_json = space_to_minari_json(obs_space, "observations")
    act_json = space_to_minari_json(spaces["actions"], "actions")
    data_dir = os.path.join(dst, "data")
    os.makedirs(data_dir, exist_ok=True)
    if os.listdir(data_dir):
        raise FileExistsError(f"{data_dir} is not empty; write the Minari dataset into a new folder")
    writer: Any = _HDF5Writer(data_dir) if data_format == "hdf5" else _ArrowWriter(data_dir)
    backend = getattr(source, "backend", None)
    reward_dtype = None
    read_fields = list(src_keys)
    try:
        for e, (s, t) in enumerate(episodes):
            parts: List[Any] = []
            for c in range(s, t, chunk):
                parts.append(source.read(np.arange(c, min(t, c + chunk), dtype=np.int64)))
                if progress is not None:
                    progress(min(t, c + chunk) - c)
            fields: Dict[str, List[Tuple[Tuple[Any, ...], np.ndarray]]] = {}
            for field in read_fields:
                per_leaf: Dict[Tuple[Any, ...], List[np.ndarray]] = {}
                for part in parts:
                    for path, leaf_sp, value in _leaves(spaces[field], _value(part, src_keys[field])):
                        per_leaf.setdefault(path, []).append(_leaf_array(leaf_sp, value, backend))
                fields[field] = [(p, np.concatenate(v)) for p, v in per_leaf.items()]
            if has_next:
                nxt = dict(fields.pop("next_observations"))
                for p, a in fields["observations"]:
                    if not _same(a[1:], nxt[p][:-1]):
                        row = s + 1 + int(np.flatnonzero(~_equal_rows(a[1:], nxt[p][:-1]))[0])
                        raise ValueError(
                            f"row {row - 1}: {src_keys['next_observations']!r} is not the {src_keys['observations']!r} "
                            f"of row {row} in the episode [{s}, {t}); Minari stores one sequence of observations, so "
                            "the export would lose one of them. Leave the next observations out "
                            f"(--exclude {src_keys['next_observations']} --final-observation repeat) only if the "
                            "last one may be lost")
                final = {p: a[-1:] for p, a in nxt.items()}
            else:
                final = {p: a[-1:] for p, a in fields["observations"]}
            fields["observations"] = [(p, np.concatenate([a, final[p]])) for p, a in fields["observations"]]
            fields["terminations"] = [(p, a.astype(np.bool_)) for p, a in fields["terminations"]]
            fields["truncations"] = [(p, a.astype(np.bool_)) for p, a in fields["truncations"]]
            if done_key is not None:
                _check_done(parts, done_key, fields, backend, s)
            reward_dtype = str(fields["rewards"][0][1].dtype)
            writer.episode(e, {f: fields[f] for f in REQUIRED_KEYS}, t - s)
    finally:
        writer.close()
    meta: Dict[str, Any] = {
        "total_episodes": len(episodes), "total_steps": n, "data_format": data_format, "jpeg_encoding": False,
        "observation_space": json.dumps(obs_json), "action_space": json.dumps(act_json),
        "dataset_id": dataset_id, "minari_version": MINARI_FORMAT_VERSION,
        "algorithm_name": "unienv-data convert", "author": ["unienv-storage"], "author_email": [],
        "code_permalink": "", "dataset_size": 0.0,
    }
    if not has_next:
        meta["unienv_final_observation"] = "the last step's observation, repeated (the source had none after it)"
    from unienv_data.base.files import atomic_write_json
    atomic_write_json(os.path.join(data_dir, METADATA_FILE), meta)
    return {"dataset_id": dataset_id, "data_format": data_format, "episodes": len(episodes), "steps": n,
            "rewards_dtype": reward_dtype, "path": os.path.abspath(dst)}


__all__ = ["write_minari", "resolve_keys", "COLLECTION_KEYS", "FIELDS", "space_to_minari_json", "default_dataset_id",
           "MINARI_FORMAT_VERSION"]
