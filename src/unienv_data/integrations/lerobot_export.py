"""`LeRobotV3Writer`: writes a LeRobot v3.0 dataset that lerobot's own `LeRobotDataset` opens, episode by episode.

    w = LeRobotV3Writer(out_dir, fps=10, features={"observation.state": ("float32", (6,)),
                                                   "observation.images.top": ("video", (48, 64, 3))})
    w.begin_episode("pick the cube")
    w.add_frames({"observation.state": states, "observation.images.top": frames})   # any number of calls
    w.end_episode()
    w.finish()                                                                        # meta/ files last

Layout written (what lerobot 0.4.4 writes and reads): `data/chunk-000/file-000.parquet` (every frame: the tabular
features, then `timestamp` = frame_index / fps, `frame_index`, `episode_index`, `index`, `task_index`),
`videos/<camera>/chunk-000/file-000.mp4` (each camera's episodes one after another in one file, encoded by this
project's video encoder, `storages._video_codec`; an episode's `from_timestamp` is where it starts), and `meta/`:
`info.json`, `tasks.parquet`, `episodes/chunk-000/file-000.parquet`, `stats.json` (tabular features), and, when
`spaces` are given, `unienv_spaces.json` (the source's space of each tabular feature: bounds, scalar shapes).

Frames stream straight into the encoders and tabular rows into the parquet writer one episode at a time, so memory
holds one episode's tabular rows at most. Every camera is written as `video` (AV1 by libsvtav1 at crf 30, GOP 2,
yuv420p by default: lerobot's own default encoding). Tabular features must be scalars or 1-D (LeRobot stores them as
fixed-size lists); the names `timestamp`, `frame_index`, `episode_index`, `index` and `task_index` are written by the
writer itself.
"""
from __future__ import annotations

import json
import os
from fractions import Fraction
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from unienv_data.base.files import atomic_write_json
from unienv_data.storages._episode_files import import_optional, remove_quietly

from ._lerobot_format import TABULAR_DTYPES, V3_DATA_PATH, V3_VIDEO_PATH

#: columns the writer makes itself
RESERVED = ("timestamp", "frame_index", "episode_index", "index", "task_index")
CODEBASE_VERSION = "v3.0"
DATA_PATH = V3_DATA_PATH
VIDEO_PATH = V3_VIDEO_PATH
#: lerobot's default video encoding (lerobot.datasets.video_utils.encode_video_frames)
DEFAULT_CODEC = "libsvtav1"
DEFAULT_ENCODER_OPTIONS = {"crf": "30"}
DEFAULT_GOP = 2


def _arrow_type(dtype: np.dtype, shape: Tuple[int, ...]) -> Any:
    import pyarrow as pa
    base = pa.from_numpy_dtype(dtype)
    if shape in ((), (1,)):
        return base
    return pa.list_(base, int(shape[0]))


class LeRobotV3Writer:
    """Writes a LeRobot v3.0 dataset into the empty folder `root` (see the module docstring).

    `features` maps each feature name to `(dtype, shape)`: a NumPy dtype name for tabular features (shape `()` or
    `(n,)`), or `"video"` with `(height, width, 3)` for a camera. `codec` / `encoder_options` / `gop` choose the
    video encoding (default: lerobot's own, AV1 crf 30 GOP 2; `codec="auto"` takes the first lossy encoder that works).
    `spaces` (optional) maps tabular feature names to the `BoxSpace` / `BinarySpace` they come from: `finish` records
    them in `meta/unienv_spaces.json` (bounds and scalar shapes LeRobot's info.json cannot say), which
    `LeRobotAsUniEnvDataset` reads back and LeRobot ignores.
    """

    def __init__(self, root: str, fps: int, features: Mapping[str, Tuple[str, Sequence[int]]],
                 robot_type: Optional[str] = None, codec: str = DEFAULT_CODEC,
                 encoder_options: Optional[Dict[str, Any]] = None, gop: int = DEFAULT_GOP,
                 spaces: Optional[Mapping[str, Any]] = None) -> None:
        import_optional("pyarrow", "parquet", "Writing LeRobot datasets")
        if isinstance(fps, bool) or not isinstance(fps, (int, np.integer)) or fps <= 0:
            raise ValueError(f"fps must be a positive int (LeRobot stores an integer fps), got {fps!r}")
        self.root = os.path.abspath(root)
        self.fps = int(fps)
        self.robot_type = robot_type
        self.tabular: Dict[str, Tuple[np.dtype, Tuple[int, ...]]] = {}
        self.cameras: Dict[str, Tuple[int, int, int]] = {}
        for name, (dtype, shape) in features.items():
            shape = tuple(int(s) for s in shape)
            if name in RESERVED:
                raise ValueError(f"feature {name!r} is written by the exporter itself; map or drop the source key")
            if dtype == "video":
                if len(shape) != 3 or shape[2] != 3:
                    raise ValueError(f"camera {name!r} must have shape (height, width, 3), got {shape}")
                self.cameras[name] = (shape[0], shape[1], shape[2])
                continue
            dt = np.dtype(dtype)
            if dt.name not in TABULAR_DTYPES:
                raise TypeError(f"feature {name!r} has dtype {dt}, which LeRobot does not store (use one of "
                                f"{sorted(TABULAR_DTYPES)})")
            if len(shape) > 1:
                raise ValueError(f"feature {name!r} has shape {shape}; LeRobot tabular features are scalars or 1-D: "
                                 "reshape it to one dimension first")
            self.tabular[name] = (dt, shape if shape else (1,))
        if not self.tabular and not self.cameras:
            raise ValueError("no features to write")
        self._spaces: Dict[str, Dict[str, Any]] = {}
        for name, space in (spaces or {}).items():
            if name not in self.tabular:
                raise KeyError(f"spaces names {name!r}, which is not a tabular feature (those are "
                               f"{sorted(self.tabular)})")
            from unienv_interface.space.space_utils.serialization_utils import space_to_json
            js = space_to_json(space)
            dt, shape = self.tabular[name]
            declared = "bool" if js.get("type") == "BinarySpace" else str(np.dtype(space.backend.numpy_dtype(
                space.dtype)))
            if declared != dt.name or int(np.prod(space.shape)) != int(np.prod(shape)):
                raise ValueError(f"feature {name!r}: its space ({declared} {tuple(space.shape)}) does not match the "
                                 f"feature ({dt.name} {shape})")
            self._spaces[name] = js
        os.makedirs(self.root, exist_ok=True)
        self._codec_request = codec
        self._encoder_options = dict(DEFAULT_ENCODER_OPTIONS if encoder_options is None else encoder_options)
        self._gop = int(gop)
        self._plans: Dict[str, Any] = {}
        self._encoders: Dict[str, Any] = {}
        self._writer: Any = None
        self._schema: Any = None
        self._tasks: Dict[str, int] = {}
        self._episodes: List[Dict[str, Any]] = []
        self._rows = 0
        self._ep: Optional[Dict[str, Any]] = None
        self._stats: Dict[str, List[np.ndarray]] = {k: [] for k in self.tabular}
        self._finished = False

    # ------------------------------------------------------------------------------------------ episodes
    def begin_episode(self, task: str = "") -> None:
        """Opens the next episode; its frames have the task text `task` unless `add_frames` gives theirs."""
        if self._ep is not None:
            raise RuntimeError("an episode is open; call end_episode() first")
        if not isinstance(task, str):
            raise TypeError(f"task must be a string, got {task!r}")
        self._ep = {"task": task, "length": 0, "cols": {k: [] for k in self.tabular}, "tasks": [],
                    "first_frame": {k: (self._encoders[k].frames if k in self._encoders else 0) for k in self.cameras}}

    def _task_index(self, task: str) -> int:
        return self._tasks.setdefault(task, len(self._tasks))

    def add_frames(self, values: Dict[str, Any], tasks: Optional[Sequence[str]] = None) -> None:
        """Appends frames to the open episode: `values[name]` holds them on the first axis, for every feature;
        `tasks` (optional) the task text of each frame (default: the episode's task)."""
        ep = self._ep
        if ep is None:
            raise RuntimeError("no open episode; call begin_episode() first")
        missing = set(self.tabular) | set(self.cameras)
        missing -= set(values)
        if missing:
            raise KeyError(f"add_frames needs every feature; missing {sorted(missing)}")
        n: Optional[int] = None
        arrays: Dict[str, np.ndarray] = {}
        for name in list(self.tabular) + list(self.cameras):
            a = np.asarray(values[name])
            if n is None:
                n = int(a.shape[0])
            if a.shape[0] != n:
                raise ValueError(f"feature {name!r} has {a.shape[0]} frames, others {n}")
            arrays[name] = a
        count = int(n or 0)
        texts = [ep["task"]] * count if tasks is None else list(tasks)
        if len(texts) != count or not all(isinstance(t, str) for t in texts):
            raise ValueError(f"tasks must hold one task text per frame ({count}), got {len(texts)} entries")
        converted: Dict[str, np.ndarray] = {}      # everything checked before anything is kept or encoded
        for name, (dt, shape) in self.tabular.items():
            a = arrays[name]
            if a.dtype != dt:
                if not np.can_cast(a.dtype, dt, casting="safe"):
                    raise TypeError(f"feature {name!r}: got {a.dtype} values, declared {dt} (the cast would change "
                                    "values)")
                a = a.astype(dt)
            if int(np.prod(a.shape[1:])) != int(np.prod(shape)):
                raise ValueError(f"feature {name!r} needs values of shape {shape}, got {a.shape[1:]}")
            converted[name] = a.reshape((a.shape[0],) + shape)
        for name, hwc in self.cameras.items():
            a = arrays[name]
            if a.dtype != np.uint8 or a.shape[1:] != hwc:
                raise ValueError(f"camera {name!r} needs uint8 frames of shape {hwc}, got {a.dtype} {a.shape[1:]}")
        for name, a in converted.items():
            ep["cols"][name].append(a)
        for name in self.cameras:
            enc = self._encoder(name)
            for frame in arrays[name]:
                enc.add(frame)
        ep["tasks"].extend(texts)
        ep["length"] += count

    def end_episode(self) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq
        ep = self._ep
        if ep is None:
            raise RuntimeError("no open episode")
        self._ep = None
        n = ep["length"]
        if n == 0:
            raise ValueError("an episode needs at least one frame")
        e = len(self._episodes)
        cols: Dict[str, Any] = {}
        for name, (dt, shape) in self.tabular.items():
            a = np.concatenate(ep["cols"][name])
            self._stats[name].append(a)
            if shape == (1,):
                cols[name] = pa.array(a.reshape(-1), type=_arrow_type(dt, shape))
            else:
                cols[name] = pa.FixedSizeListArray.from_arrays(pa.array(a.reshape(-1)), int(shape[0]))
        frame_index = np.arange(n, dtype=np.int64)
        cols["timestamp"] = pa.array((frame_index / self.fps).astype(np.float32))
        cols["frame_index"] = pa.array(frame_index)
        cols["episode_index"] = pa.array(np.full(n, e, np.int64))
        cols["index"] = pa.array(np.arange(self._rows, self._rows + n, dtype=np.int64))
        cols["task_index"] = pa.array(np.asarray([self._task_index(t) for t in ep["tasks"]], np.int64))
        table = pa.table(cols)
        if self._writer is None:
            path = os.path.join(self.root, DATA_PATH.format(chunk_index=0, file_index=0))
            os.makedirs(os.path.dirname(path), exist_ok=True)
            self._schema = table.schema
            self._writer = pq.ParquetWriter(path, table.schema)
        self._writer.write_table(table.cast(self._schema))
        row: Dict[str, Any] = {"episode_index": e, "tasks": list(dict.fromkeys(ep["tasks"])), "length": n,
                               "data/chunk_index": 0, "data/file_index": 0,
                               "dataset_from_index": self._rows, "dataset_to_index": self._rows + n}
        for name in self.cameras:
            first = ep["first_frame"][name]
            row[f"videos/{name}/chunk_index"] = 0
            row[f"videos/{name}/file_index"] = 0
            row[f"videos/{name}/from_timestamp"] = first / self.fps
            row[f"videos/{name}/to_timestamp"] = (first + n) / self.fps
        row["meta/episodes/chunk_index"] = 0
        row["meta/episodes/file_index"] = 0
        self._episodes.append(row)
        self._rows += n

    # ------------------------------------------------------------------------------------------ video
    def _encoder(self, name: str) -> Any:
        enc = self._encoders.get(name)
        if enc is None:
            from unienv_data.storages._video_codec import FrameEncoder, select_codec
            hwc = self.cameras[name]
            fps = Fraction(self.fps)
            codec = self._codec_request
            if codec == DEFAULT_CODEC:
                from unienv_data.storages._video_codec import _encoder_exists
                codec = codec if _encoder_exists(codec) else "auto"
            plan, _tried = select_codec(codec, False, hwc, None, self._encoder_options, self._gop, "mp4", fps, "none")
            directory = os.path.join(self.root, os.path.dirname(VIDEO_PATH.format(
                video_key=name, chunk_index=0, file_index=0)))
            os.makedirs(directory, exist_ok=True)
            enc = FrameEncoder(directory, plan, hwc, fps)
            self._plans[name] = plan
            self._encoders[name] = enc
        return enc

    # ------------------------------------------------------------------------------------------ finish
    def finish(self) -> Dict[str, Any]:
        """Closes the files and writes `meta/`; returns the info.json written."""
        import pyarrow as pa
        import pyarrow.parquet as pq
        from unienv_data.storages._video_codec import codec_family
        if self._ep is not None:
            raise RuntimeError("an episode is still open; call end_episode() first")
        if not self._episodes:
            raise ValueError("no episode was written")
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        video_info: Dict[str, Dict[str, Any]] = {}
        for name, enc in self._encoders.items():
            done = enc.finish()
            final = os.path.join(self.root, VIDEO_PATH.format(video_key=name, chunk_index=0, file_index=0))
            os.replace(done.path, final)
            plan = self._plans[name]
            h, w, c = self.cameras[name]
            video_info[name] = {"video.height": h, "video.width": w, "video.codec": codec_family(plan.codec),
                                "video.pix_fmt": plan.pix_fmt, "video.is_depth_map": False, "video.fps": self.fps,
                                "video.channels": c, "has_audio": False}
        self._encoders.clear()
        meta = os.path.join(self.root, "meta")
        os.makedirs(os.path.join(meta, "episodes", "chunk-000"), exist_ok=True)
        # tasks: the task strings are the pandas index of lerobot's DataFrame (pandas metadata says so)
        texts = sorted(self._tasks, key=self._tasks.__getitem__)
        tasks = pa.table({"task_index": pa.array([self._tasks[t] for t in texts], pa.int64()),
                          "task": pa.array(texts, pa.string())})
        pandas_meta = {"index_columns": ["task"], "column_indexes": [], "columns": [
            {"name": "task_index", "field_name": "task_index", "pandas_type": "int64", "numpy_type": "int64",
             "metadata": None},
            {"name": "task", "field_name": "task", "pandas_type": "unicode", "numpy_type": "object",
             "metadata": None}], "creator": {"library": "unienv_data", "version": "1"}, "pandas_version": "2.2.0"}
        tasks = tasks.replace_schema_metadata({b"pandas": json.dumps(pandas_meta).encode()})
        pq.write_table(tasks, os.path.join(meta, "tasks.parquet"))
        pq.write_table(pa.Table.from_pylist(self._episodes),
                       os.path.join(meta, "episodes", "chunk-000", "file-000.parquet"))
        features: Dict[str, Any] = {}
        for name, (dt, shape) in self.tabular.items():
            features[name] = {"dtype": dt.name, "shape": list(shape), "names": None}
        for name, hwc in self.cameras.items():
            features[name] = {"dtype": "video", "shape": list(hwc), "names": ["height", "width", "channels"],
                              "info": video_info.get(name, {})}
        for name, dtn in (("timestamp", "float32"), ("frame_index", "int64"), ("episode_index", "int64"),
                          ("index", "int64"), ("task_index", "int64")):
            features[name] = {"dtype": dtn, "shape": [1], "names": None}
        info = {"codebase_version": CODEBASE_VERSION, "robot_type": self.robot_type,
                "total_episodes": len(self._episodes), "total_frames": self._rows, "total_tasks": len(self._tasks),
                "chunks_size": 1000, "data_files_size_in_mb": 100, "video_files_size_in_mb": 200, "fps": self.fps,
                "splits": {"train": f"0:{len(self._episodes)}"}, "data_path": DATA_PATH,
                "video_path": VIDEO_PATH if self.cameras else None, "features": features}
        stats: Dict[str, Any] = {}
        for name, parts in self._stats.items():
            a = np.concatenate(parts).astype(np.float64)
            stats[name] = {"min": a.min(0).tolist(), "max": a.max(0).tolist(), "mean": a.mean(0).tolist(),
                           "std": a.std(0).tolist(), "count": [int(a.shape[0])]}
        atomic_write_json(os.path.join(meta, "stats.json"), stats)
        if self._spaces:
            from ._lerobot_format import SPACES_FILE, SPACES_FORMAT
            atomic_write_json(os.path.join(meta, SPACES_FILE), {"format": SPACES_FORMAT, "features": self._spaces})
        atomic_write_json(os.path.join(meta, "info.json"), info)   # last: its presence marks a complete dataset
        self._finished = True
        return info

    def abort(self) -> None:
        """Drops the open files (the folder keeps what was already written; delete it)."""
        for enc in self._encoders.values():
            enc.discard()
        self._encoders.clear()
        if self._writer is not None:
            try:
                self._writer.close()
            except Exception:  # noqa: BLE001
                pass
            self._writer = None
            remove_quietly(os.path.join(self.root, DATA_PATH.format(chunk_index=0, file_index=0)))


__all__ = ["LeRobotV3Writer", "RESERVED", "DEFAULT_CODEC", "DEFAULT_ENCODER_OPTIONS", "DEFAULT_GOP"]
