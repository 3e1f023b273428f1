"""The LeRobot dataset layout (v2.0, v2.1, v3.0), read by this project's own parser: `load_layout(root)` gives the
schema (`meta/info.json`), the tasks, the episodes, every tabular column as one NumPy array in episode order, the PNG
bytes of `image` cameras, and where each row's frame of each `video` camera lies (file and frame number).

Layouts:

* v2.0 / v2.1: `meta/episodes.jsonl` (`tasks` is a list of task strings per episode), `meta/tasks.jsonl`, one data
  parquet and one video per episode (`data_path` / `video_path` templates with `episode_chunk`, `episode_index`,
  `video_key`);
* v3.0: `meta/episodes/chunk-*/file-*.parquet` (one row per episode: its data file, row range, and for each video
  camera its file and `from_timestamp` inside it), `meta/tasks.parquet` (task strings with their `task_index`), data
  and videos packed several episodes per file (`chunk_index` / `file_index` templates).

A frame of a video camera is the one at `from_timestamp + timestamp` of its row (lerobot's own rule), i.e. frame
number `round((from_timestamp + timestamp) * fps)` of the file. Anything missing, unreadable or inconsistent raises
`StorageFormatError` naming the file. pyarrow is imported by `load_layout` only.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from unienv_data.base.errors import StorageFormatError, StorageNotFoundError
from unienv_data.base.files import load_json
from unienv_data.storages._episode_files import import_optional

#: codebase versions this parser reads
SUPPORTED_VERSIONS = ("v2.0", "v2.1", "v3.0")
#: LeRobot feature dtypes of tabular columns -> NumPy dtypes
TABULAR_DTYPES = {name: np.dtype(name) for name in (
    "float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")}
TABULAR_DTYPES["bool"] = np.dtype(np.bool_)
CAMERA_DTYPES = ("video", "image")
#: `meta/` file of a dataset `convert --to lerobot` wrote: the space of each tabular feature as this project had it
#: (bounds, the scalar shape `()` that LeRobot stores as `[1]`); LeRobot does not read it, `LeRobotAsUniEnvDataset`
#: does
SPACES_FILE = "unienv_spaces.json"
SPACES_FORMAT = "unienv_data LeRobot feature spaces"
#: how error messages name a JSON file of a LeRobot dataset's `meta/` folder
_LEROBOT_FILE = "LeRobot dataset metadata file"
#: lerobot's standard file templates per layout, used where `meta/info.json` has no `data_path` / `video_path`
V2_DATA_PATH = "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet"
V2_VIDEO_PATH = "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4"
V3_DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
V3_VIDEO_PATH = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"


def read_recorded_spaces(root: str) -> Dict[str, Any]:
    """`{feature name: space JSON}` of `meta/SPACES_FILE`; `{}` when the dataset has none. A damaged file is a
    StorageFormatError (it was written by this project, so damage is not expected)."""
    path = os.path.join(root, "meta", SPACES_FILE)
    if not os.path.isfile(path):
        return {}
    raw = load_json(path, _LEROBOT_FILE)
    if not isinstance(raw, dict) or raw.get("format") != SPACES_FORMAT or not isinstance(raw.get("features"), dict):
        raise StorageFormatError(f"{path}: expected {{'format': {SPACES_FORMAT!r}, 'features': {{name: space}}}}; "
                                 "delete the file to read the dataset with LeRobot's own feature types")
    return dict(raw["features"])


@dataclass
class LeRobotFeature:
    """One entry of `info.json`'s `features`."""

    name: str
    dtype: str
    shape: Tuple[int, ...]
    names: Any = None
    info: Optional[Dict[str, Any]] = None   #: a video feature's `info` (codec, pix_fmt, fps, ...)

    @property
    def is_video(self) -> bool:
        return self.dtype == "video"

    @property
    def is_image(self) -> bool:
        return self.dtype == "image"

    @property
    def is_camera(self) -> bool:
        return self.dtype in CAMERA_DTYPES

    @property
    def hwc(self) -> Tuple[int, int, int]:
        """A camera's frame shape as (height, width, channels), whichever order `info.json` lists."""
        shp = tuple(self.shape)
        names = list(self.names) if isinstance(self.names, (list, tuple)) else None
        if len(shp) == 3 and names and len(names) == 3 and names[0] in ("channels", "channel", "c"):
            return (shp[1], shp[2], shp[0])
        if len(shp) != 3:
            raise StorageFormatError(f"camera feature {self.name!r} has shape {list(shp)}; expected 3 dimensions "
                                     "(height, width, channels)")
        if shp[0] in (1, 3) and shp[2] not in (1, 3):
            return (shp[1], shp[2], shp[0])
        return (shp[0], shp[1], shp[2])


@dataclass
class LeRobotSchema:
    """`meta/info.json` of a LeRobot dataset."""

    codebase_version: str
    robot_type: Optional[str]
    fps: int
    total_episodes: int
    total_frames: int
    total_tasks: int
    chunks_size: int
    features: Dict[str, LeRobotFeature]
    data_path: str
    video_path: str
    splits: Optional[Dict[str, str]] = None
    info: Dict[str, Any] = field(default_factory=dict)   #: the whole info.json

    @property
    def is_v3(self) -> bool:
        return self.codebase_version.startswith("v3")


@dataclass
class EpisodeMetadata:
    """One episode: its `index`, `length`, first task (`task_index`, `task`) and every task it lists (`tasks`)."""

    index: int
    length: int
    task_index: int = 0
    task: str = ""
    tasks: List[str] = field(default_factory=list)
    #: rows of this episode in the dataset's row order, half open
    dataset_from_index: int = 0
    dataset_to_index: int = 0
    data_chunk_index: Optional[int] = None
    data_file_index: Optional[int] = None


@dataclass
class VideoFileRef:
    """Where one episode's frames of one video camera are: a file (relative to the root) and its first frame."""

    path: str
    first_frame: float   #: `from_timestamp * fps` (frames of the file before this episode)


@dataclass
class LeRobotLayout:
    """Everything `load_layout` read: the schema, tasks, episodes, tabular columns, image bytes, video places."""

    root: str
    schema: LeRobotSchema
    tasks: Dict[int, str]
    episodes: List[EpisodeMetadata]
    columns: Dict[str, np.ndarray]                 #: tabular feature -> (rows, *shape) array
    images: Dict[str, List[Optional[bytes]]]       #: image camera -> encoded bytes per row
    #: video camera -> (file path per row index into `video_files`, frame number per row), and the file list
    video_rows: Dict[str, Tuple[np.ndarray, np.ndarray]]
    video_files: Dict[str, List[str]]
    task_per_row: np.ndarray                       #: task_index per row (-1 where the data has none)

    @property
    def num_rows(self) -> int:
        return sum(e.length for e in self.episodes)


# ---------------------------------------------------------------------------------------------------- small readers
def _read_jsonl(path: str) -> List[Dict[str, Any]]:
    rows: List[Dict[str, Any]] = []
    try:
        with open(path, "r", encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if line.strip():
                    row = json.loads(line)
                    if not isinstance(row, dict):
                        raise StorageFormatError(f"{path}, line {n}: expected a JSON object, got {line.strip()[:80]}")
                    rows.append(row)
    except FileNotFoundError:
        raise StorageNotFoundError(f"{path} is missing: the LeRobot dataset is incomplete") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise StorageFormatError(f"{path} is not valid JSON lines ({exc}): the file is damaged") from None
    return rows


def read_parquet(path: str, columns: Optional[List[str]] = None, optional: Tuple[str, ...] = ()) -> Any:
    """The pyarrow Table of `path` (only `columns` when given, plus those of `optional` the file has);
    StorageFormatError naming the file when it is missing, truncated or lacks a column."""
    pq = import_optional("pyarrow.parquet", "parquet", "Reading LeRobot datasets")
    import pyarrow as pa
    if not os.path.isfile(path):
        raise StorageNotFoundError(f"{path} is missing: the LeRobot dataset is incomplete")
    try:
        schema_names = pq.read_schema(path).names
        if columns is not None:
            absent = [c for c in columns if c not in schema_names]
            if absent:
                raise StorageFormatError(f"{path} has no column(s) {absent} (it has {schema_names})")
            columns = list(columns) + [c for c in optional if c in schema_names and c not in columns]
        return pq.read_table(path, columns=columns)
    except (pa.ArrowInvalid, pa.ArrowIOError, OSError) as exc:
        raise StorageFormatError(f"{path} cannot be read as parquet ({exc}): the file is truncated or damaged") from None


def _int(v: Any, where: str, what: str) -> int:
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
        raise StorageFormatError(f"{where}: {what} must be an integer, got {v!r}")
    return int(v)


# ---------------------------------------------------------------------------------------------------- schema
def _template(info: Dict[str, Any], key: str, default: str, v3: bool, path: str) -> str:
    """`info[key]`, a file template of the layout (lerobot's standard one when absent or null); StorageFormatError
    when it is not a string that formats with the layout's fields."""
    raw = info.get(key)
    if raw is None:
        return default
    fields: Dict[str, Any] = ({"chunk_index": 0, "file_index": 0} if v3 else {"episode_chunk": 0, "episode_index": 0})
    try:
        if not isinstance(raw, str):
            raise TypeError(f"a string is needed, got {type(raw).__name__}")
        raw.format(video_key="camera", **fields)
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise StorageFormatError(f"{path}: {key!r} is {raw!r}, which is not a file template with the fields "
                                 f"{sorted(fields)} ({exc!r})") from None
    return raw


def parse_info(root: str) -> LeRobotSchema:
    """`meta/info.json` as a `LeRobotSchema`; StorageFormatError for an unsupported `codebase_version`."""
    path = os.path.join(root, "meta", "info.json")
    info = load_json(path, _LEROBOT_FILE)
    if not isinstance(info, dict):
        raise StorageFormatError(f"{path} must hold a JSON object")
    version = info.get("codebase_version")
    if version not in SUPPORTED_VERSIONS:
        raise StorageFormatError(f"{path}: codebase_version {version!r} is not supported (this reader knows "
                                 f"{', '.join(SUPPORTED_VERSIONS)}); convert the dataset with lerobot's own "
                                 "conversion scripts first")
    feats = info.get("features")
    if not isinstance(feats, dict) or not feats:
        raise StorageFormatError(f"{path}: 'features' must be a non-empty object")
    features: Dict[str, LeRobotFeature] = {}
    for name, spec in feats.items():
        if not isinstance(spec, dict) or "dtype" not in spec or "shape" not in spec:
            raise StorageFormatError(f"{path}: feature {name!r} needs 'dtype' and 'shape', got {spec!r}")
        shape = spec["shape"]
        if not isinstance(shape, (list, tuple)) or not all(isinstance(s, int) and s >= 0 for s in shape):
            raise StorageFormatError(f"{path}: feature {name!r} has shape {shape!r}; expected a list of sizes")
        features[name] = LeRobotFeature(name, str(spec["dtype"]), tuple(shape), spec.get("names"),
                                        spec.get("info") or spec.get("video_info"))
    if "fps" not in info:
        raise StorageFormatError(f"{path} has no 'fps'")
    v3 = str(version).startswith("v3")
    data_path = _template(info, "data_path", V3_DATA_PATH if v3 else V2_DATA_PATH, v3, path)
    video_path = _template(info, "video_path", V3_VIDEO_PATH if v3 else V2_VIDEO_PATH, v3, path)
    return LeRobotSchema(
        codebase_version=version, robot_type=info.get("robot_type"), fps=_int(info["fps"], path, "fps"),
        total_episodes=int(info.get("total_episodes", 0)), total_frames=int(info.get("total_frames", 0)),
        total_tasks=int(info.get("total_tasks", 0)), chunks_size=int(info.get("chunks_size", 1000)),
        features=features, data_path=data_path, video_path=video_path,
        splits=info.get("splits"), info=info)


# ---------------------------------------------------------------------------------------------------- tasks, episodes
def _tasks_v3(root: str) -> Dict[int, str]:
    path = os.path.join(root, "meta", "tasks.parquet")
    if not os.path.exists(path):
        return {}   # no task text, as lerobot datasets without tasks have
    table = read_parquet(path)
    names = table.schema.names
    if "task_index" not in names:
        raise StorageFormatError(f"{path} has no 'task_index' column (it has {names})")
    text_col = "task" if "task" in names else next(
        (n for n in names if n != "task_index" and str(table.schema.field(n).type) in ("string", "large_string")),
        None)
    if text_col is None:
        raise StorageFormatError(f"{path} holds no task strings (columns {names})")
    idx = table.column("task_index").to_pylist()
    text = table.column(text_col).to_pylist()
    return {int(i): str(t) for i, t in zip(idx, text)}


def _tasks_v2(root: str) -> Dict[int, str]:
    path = os.path.join(root, "meta", "tasks.jsonl")
    out: Dict[int, str] = {}
    if not os.path.exists(path):
        return out   # no task text, as lerobot datasets without tasks have
    for row in _read_jsonl(path):
        if "task_index" not in row or "task" not in row:
            raise StorageFormatError(f"{path}: every line needs 'task_index' and 'task', got {row!r}")
        out[_int(row["task_index"], path, "task_index")] = str(row["task"])
    return out


def load_tasks(root: str) -> Dict[int, str]:
    """task_index -> task text of the LeRobot dataset at `root` (`meta/tasks.parquet` or `meta/tasks.jsonl`)."""
    return _tasks_v3(root) if parse_info(root).is_v3 else _tasks_v2(root)


def _episode_tasks(raw: Any, where: str) -> List[str]:
    if raw is None:
        return []
    if isinstance(raw, str):
        return [raw]
    if isinstance(raw, (list, tuple, np.ndarray)):
        return [str(t) for t in raw]
    raise StorageFormatError(f"{where}: 'tasks' must be a list of task strings, got {raw!r}")


def _episodes_v2(root: str) -> List[Dict[str, Any]]:
    path = os.path.join(root, "meta", "episodes.jsonl")
    rows = _read_jsonl(path)
    for r in rows:
        if "episode_index" not in r or "length" not in r:
            raise StorageFormatError(f"{path}: every line needs 'episode_index' and 'length', got {r!r}")
        r["_where"] = path
    return rows


def _episodes_v3(root: str) -> List[Dict[str, Any]]:
    base = os.path.join(root, "meta", "episodes")
    files: List[str] = []
    for dirpath, _dirs, names in os.walk(base):
        files += [os.path.join(dirpath, n) for n in names if n.endswith(".parquet")]
    if not files:
        raise StorageNotFoundError(f"{base} holds no episode parquet files: the LeRobot v3.0 dataset is incomplete")
    rows: List[Dict[str, Any]] = []
    for path in sorted(files):
        table = read_parquet(path)
        keep = [n for n in table.schema.names if not n.startswith("stats/")]
        for r in table.select(keep).to_pylist():
            if "episode_index" not in r or "length" not in r:
                raise StorageFormatError(f"{path}: every row needs 'episode_index' and 'length'")
            r["_where"] = path
            rows.append(r)
    return rows


# ---------------------------------------------------------------------------------------------------- columns
def column_to_numpy(col: Any, feature: LeRobotFeature, n: int, where: str) -> np.ndarray:
    """A pyarrow (chunked) column of a tabular feature as a `(n, *shape)` array of the feature's dtype."""
    import pyarrow as pa
    dtype = TABULAR_DTYPES[feature.dtype]
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if arr.null_count:
        raise StorageFormatError(f"{where}: column {feature.name!r} holds {arr.null_count} null values")
    shape = tuple(feature.shape)
    size = int(np.prod(shape)) if shape else 1
    while pa.types.is_fixed_size_list(arr.type) or pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type):
        if not pa.types.is_fixed_size_list(arr.type):
            lengths = np.diff(np.asarray(arr.offsets))
            if lengths.size and (lengths.min() != lengths.max()):
                raise StorageFormatError(f"{where}: column {feature.name!r} holds lists of different lengths")
        arr = arr.flatten()
    values = arr.to_numpy(zero_copy_only=False)
    if values.size != n * size:
        raise StorageFormatError(f"{where}: column {feature.name!r} holds {values.size} values for {n} rows of shape "
                                 f"{list(shape)} (expected {n * size})")
    if values.dtype != dtype:
        if not np.can_cast(values.dtype, dtype, casting="same_kind") or (
                values.dtype.kind == "f" and dtype.kind == "f" and values.dtype.itemsize > dtype.itemsize):
            raise StorageFormatError(f"{where}: column {feature.name!r} is stored as {values.dtype}, but info.json "
                                     f"declares {feature.dtype}")
        values = values.astype(dtype)
    return values.reshape((n,) + shape)


def _image_bytes(col: Any, root: str, where: str, name: str) -> List[Optional[bytes]]:
    """The encoded bytes of an `image` column (structs of `bytes` and `path`; a path is relative to the root)."""
    out: List[Optional[bytes]] = []
    for v in col.to_pylist():
        if isinstance(v, dict):
            b, p = v.get("bytes"), v.get("path")
        else:
            b, p = v, None
        if b is None and p:
            full = p if os.path.isabs(p) else os.path.join(root, p)
            try:
                with open(full, "rb") as f:
                    b = f.read()
            except OSError as exc:
                raise StorageFormatError(f"{where}: image {name!r} refers to {full}, which cannot be read ({exc})") \
                    from None
        if b is None:
            raise StorageFormatError(f"{where}: image column {name!r} has a row with neither bytes nor a path")
        out.append(bytes(b))
    return out


def _rows_without_episode_column(table: Any, r: Dict[str, Any], v3: bool, path: str) -> np.ndarray:
    """Rows of episode `r` in a data file with no `episode_index` column: the whole file (v2, one file per episode),
    or from `dataset_from_index` less the file's first `index` (v3, packed; 0 without an `index` column)."""
    e, length = int(r["episode_index"]), int(r["length"])
    start = 0
    if v3:
        if r.get("dataset_from_index") is None:
            raise StorageFormatError(f"{path} has no 'episode_index' column and {r['_where']} gives episode {e} no "
                                     "'dataset_from_index': its rows cannot be found")
        first = table.column("index")[0].as_py() if "index" in table.schema.names and table.num_rows else 0
        start = int(r["dataset_from_index"]) - int(first)
    if start < 0 or start + length > table.num_rows:
        raise StorageFormatError(f"{path}: episode {e} should have {length} rows from row {start} (per {r['_where']}), "
                                 f"but the file has {table.num_rows} rows: the episode indices do not match the data")
    return np.arange(start, start + length)


# ---------------------------------------------------------------------------------------------------- the whole layout
def load_layout(root: str, features: Optional[List[str]] = None) -> LeRobotLayout:
    """Reads the LeRobot dataset at `root` (only the named `features` of its columns and cameras when given)."""
    import_optional("pyarrow", "parquet", "Reading LeRobot datasets")
    root = os.path.abspath(root)
    schema = parse_info(root)
    wanted = list(schema.features) if features is None else list(features)
    tasks = _tasks_v3(root) if schema.is_v3 else _tasks_v2(root)
    task_ids = {t: i for i, t in tasks.items()}
    raw_eps = _episodes_v3(root) if schema.is_v3 else _episodes_v2(root)
    raw_eps.sort(key=lambda r: int(r["episode_index"]))
    seen = [int(r["episode_index"]) for r in raw_eps]
    if len(set(seen)) != len(seen):
        raise StorageFormatError(f"{raw_eps[0]['_where']}: episode indices repeat ({seen[:20]} ...)")

    tab = [k for k in wanted if not schema.features[k].is_camera]
    imgs = [k for k in wanted if schema.features[k].is_image]
    vids = [k for k in wanted if schema.features[k].is_video]
    for k in tab:
        if schema.features[k].dtype not in TABULAR_DTYPES:
            raise StorageFormatError(
                f"feature {k!r} has dtype {schema.features[k].dtype!r}, which this reader does not map to an array "
                f"(known: {sorted(TABULAR_DTYPES)} and {list(CAMERA_DTYPES)}); leave it out with exclude_features")
    need = sorted(set(tab) | set(imgs) | {"episode_index"} | ({"timestamp"} if vids else set())
                  | {c for c in ("task_index", "index") if c in schema.features})

    # group episodes by data file; read each file once
    by_file: Dict[str, List[Dict[str, Any]]] = {}
    for r in raw_eps:
        e = int(r["episode_index"])
        if schema.is_v3:
            try:
                rel = schema.data_path.format(chunk_index=int(r["data/chunk_index"]),
                                              file_index=int(r["data/file_index"]))
            except (KeyError, TypeError, ValueError) as exc:
                raise StorageFormatError(f"{r['_where']}: episode {e} has no valid data file ({exc})") from None
        else:
            rel = schema.data_path.format(episode_chunk=e // max(schema.chunks_size, 1), episode_index=e)
        by_file.setdefault(rel, []).append(r)

    parts: Dict[int, Dict[str, Any]] = {}   # episode -> {column: array/list}
    for rel, eps in by_file.items():
        path = os.path.join(root, rel)
        table = read_parquet(path, [c for c in need if c in schema.features], optional=("episode_index", "index"))
        n_file = table.num_rows
        ep_col = column_to_numpy(table.column("episode_index"), LeRobotFeature("episode_index", "int64", (1,)),
                                 n_file, path).reshape(-1) if "episode_index" in table.schema.names else None
        for r in eps:
            e, length = int(r["episode_index"]), int(r["length"])
            rows = np.flatnonzero(ep_col == e) if ep_col is not None else _rows_without_episode_column(
                table, r, schema.is_v3, path)
            if rows.size != length or (rows.size and rows[-1] - rows[0] + 1 != rows.size):
                raise StorageFormatError(
                    f"{path}: episode {e} should have {length} consecutive rows (per {r['_where']}), but its "
                    f"episode_index column has {rows.size}{'' if rows.size < 2 else ' (not consecutive)'}: the "
                    "episode indices do not match the data")
            if schema.is_v3 and "dataset_from_index" in r and "index" in table.schema.names and rows.size:
                first = table.column("index")[int(rows[0])].as_py()
                if int(first) != int(r["dataset_from_index"]):
                    raise StorageFormatError(f"{path}: episode {e} starts at index {first}, but {r['_where']} says "
                                             f"{r['dataset_from_index']}: the episode indices do not match the data")
            lo, hi = (int(rows[0]), int(rows[-1]) + 1) if rows.size else (0, 0)
            sub = table.slice(lo, hi - lo)
            entry: Dict[str, Any] = {}
            for k in tab:
                entry[k] = column_to_numpy(sub.column(k), schema.features[k], hi - lo, path)
            for k in imgs:
                entry[k] = _image_bytes(sub.column(k), root, path, k)
            if vids:
                entry["__timestamp"] = column_to_numpy(sub.column("timestamp"), LeRobotFeature(
                    "timestamp", "float64", (1,)), hi - lo, path).reshape(-1) if "timestamp" in schema.features \
                    else np.arange(hi - lo, dtype=np.float64) / schema.fps
            if "task_index" in schema.features:
                entry["__task"] = column_to_numpy(sub.column("task_index"), LeRobotFeature(
                    "task_index", "int64", (1,)), hi - lo, path).reshape(-1)
            parts[e] = entry

    episodes: List[EpisodeMetadata] = []
    at = 0
    for r in raw_eps:
        e, length = int(r["episode_index"]), int(r["length"])
        ep_tasks = _episode_tasks(r.get("tasks"), r["_where"])
        first_task_rows = parts[e].get("__task")
        if first_task_rows is not None and first_task_rows.size:
            ti = int(first_task_rows[0])
        else:
            ti = task_ids.get(ep_tasks[0], -1) if ep_tasks else -1
        episodes.append(EpisodeMetadata(
            index=e, length=length, task_index=ti, task=tasks.get(ti, ep_tasks[0] if ep_tasks else ""),
            tasks=ep_tasks, dataset_from_index=at, dataset_to_index=at + length,
            data_chunk_index=r.get("data/chunk_index"), data_file_index=r.get("data/file_index")))
        at += length
    n = at

    columns: Dict[str, np.ndarray] = {}
    for k in tab:
        f = schema.features[k]
        columns[k] = (np.concatenate([parts[e.index][k] for e in episodes]) if episodes
                      else np.zeros((0,) + tuple(f.shape), TABULAR_DTYPES[f.dtype]))
    images = {k: [b for e in episodes for b in parts[e.index][k]] for k in imgs}
    task_per_row = (np.concatenate([parts[e.index]["__task"] for e in episodes]) if episodes and
                    "task_index" in schema.features else np.full(n, -1, np.int64))

    video_rows: Dict[str, Tuple[np.ndarray, np.ndarray]] = {}
    video_files: Dict[str, List[str]] = {}
    for k in vids:
        files: List[str] = []
        file_ids: Dict[str, int] = {}
        fid = np.empty(n, np.int32)
        frame = np.empty(n, np.int64)
        for r, ep in zip(raw_eps, episodes):
            e = ep.index
            if schema.is_v3:
                try:
                    rel = schema.video_path.format(video_key=k, chunk_index=int(r[f"videos/{k}/chunk_index"]),
                                                   file_index=int(r[f"videos/{k}/file_index"]))
                    t0 = float(r[f"videos/{k}/from_timestamp"])
                except (KeyError, TypeError, ValueError) as exc:
                    raise StorageFormatError(f"{r['_where']}: episode {e} has no valid video file for {k!r} "
                                             f"({exc})") from None
            else:
                rel = schema.video_path.format(episode_chunk=e // max(schema.chunks_size, 1), video_key=k,
                                               episode_index=e)
                t0 = 0.0
            j = file_ids.setdefault(rel, len(files))
            if j == len(files):
                files.append(rel)
            s, t = ep.dataset_from_index, ep.dataset_to_index
            fid[s:t] = j
            frame[s:t] = np.rint((t0 + parts[e]["__timestamp"]) * schema.fps).astype(np.int64)
        video_rows[k] = (fid, frame)
        video_files[k] = files
    return LeRobotLayout(root, schema, tasks, episodes, columns, images, video_rows, video_files, task_per_row)


__all__ = ["SUPPORTED_VERSIONS", "LeRobotFeature", "LeRobotSchema", "EpisodeMetadata", "LeRobotLayout",
           "parse_info", "load_layout", "load_tasks", "read_parquet", "column_to_numpy"]
