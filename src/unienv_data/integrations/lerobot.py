"""`LeRobotAsUniEnvDataset`: a LeRobot dataset (v2.0, v2.1 or v3.0, on disk or from the Hugging Face Hub) read in
place as a `BatchBase` of flat dict samples.

    from unienv_interface.backends.numpy import NumpyComputeBackend
    from unienv_data.integrations.lerobot import LeRobotAsUniEnvDataset

    ds = LeRobotAsUniEnvDataset.from_local("path/to/dataset", NumpyComputeBackend)
    sample = ds[0]                      # {"observation.state": (6,) float32, "observation.images.top": (H, W, 3) uint8, ...}
    batch = ds.get_at(np.arange(64))    # the same keys, batched
    ds.get_segments()                   # [(start, end), ...] per episode: samplers and windows stay inside episodes

The space is a flat `DictSpace` keyed by LeRobot's dotted feature names; cameras (`video` and `image` features) are
uint8 `BoxSpace`s of shape (height, width, channels). Tabular columns are loaded once into NumPy arrays (exact values,
the dtypes of `info.json`); `image` cameras are PNG bytes in the parquet, decoded on read; `video` cameras are decoded
through this project's own video read path (see `_lerobot_video`), giving the frames PyAV decodes, as lerobot's
PyAV path does. The per-frame task text comes back as metadata: `get_at_with_metadata(i)[1]["task"]`.
"""
from __future__ import annotations

import io
import os
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from unienv_interface.backends.base import BArrayType, BDeviceType, BDtypeType, BRNGType
from unienv_interface.space import BinarySpace, BoxSpace, DictSpace, Space
from unienv_data.base.closing import ClosesOnExit
from unienv_data.base.common import BatchBase, BatchT
from unienv_data.base.errors import StorageFormatError
from unienv_data.base.indexing import normalize_index

from ._lerobot_format import (TABULAR_DTYPES, EpisodeMetadata, LeRobotFeature, LeRobotLayout, LeRobotSchema,
                              load_layout, parse_info)

#: accepted `video_backend` values (only PyAV decodes here; "auto" picks it)
VIDEO_BACKENDS = ("auto", "pyav")
#: `Space.metadata["kind"]` of the features whose meaning LeRobot fixes
FEATURE_KINDS = {"observation.state": "proprio", "action": "action"}


def _feature_space(feature: LeRobotFeature, backend: Any, device: Any, fps: int) -> Space:
    if feature.is_camera:
        meta = {"kind": "image", "format": "rgb", "layout": "HWC", "fps": fps, "source": feature.name}
        return BoxSpace(backend, 0, 255, np.uint8, device=device, shape=feature.hwc, metadata=meta)
    dtype = TABULAR_DTYPES[feature.dtype]
    kind = FEATURE_KINDS.get(feature.name)
    meta2 = {"kind": kind} if kind else None
    if dtype.kind == "b":
        return BinarySpace(backend, shape=feature.shape, device=device, metadata=meta2)
    if dtype.kind == "f":
        low, high = -np.inf, np.inf
    else:
        info = np.iinfo(dtype)
        low, high = info.min, info.max
    return BoxSpace(backend, low, high, dtype, device=device, shape=feature.shape, metadata=meta2)


def _recorded_spaces(layout: LeRobotLayout, features: List[str], backend: Any, device: Any) -> Dict[str, Space]:
    """The spaces `meta/unienv_spaces.json` records for tabular `features` (a dataset `convert --to lerobot` wrote:
    bounds, scalar shapes); their columns of `layout` are reshaped to those shapes. A recorded space is passed over
    (with a warning) when it no longer fits the feature or its values, e.g. after LeRobot itself edited the dataset."""
    import warnings
    from unienv_interface.space.space_utils.serialization_utils import json_to_space
    from ._lerobot_format import SPACES_FILE, read_recorded_spaces
    recorded = read_recorded_spaces(layout.root)
    out: Dict[str, Space] = {}
    for k in features:
        f = layout.schema.features[k]
        if k not in recorded or f.is_camera or k not in layout.columns:
            continue
        col = layout.columns[k]
        why = None
        try:
            space = json_to_space(recorded[k], backend, device)
        except (ValueError, TypeError) as exc:
            raise StorageFormatError(f"{os.path.join(layout.root, 'meta', SPACES_FILE)}: feature {k!r}: {exc}") \
                from None
        if not isinstance(space, (BoxSpace, BinarySpace)):
            why = f"a {type(space).__name__}"
        else:
            dtype = np.dtype(np.bool_) if isinstance(space, BinarySpace) else np.dtype(backend.numpy_dtype(space.dtype))
            if dtype != col.dtype or int(np.prod(space.shape)) != int(np.prod(f.shape)):
                why = f"{dtype} {tuple(space.shape)}, the feature is {col.dtype} {tuple(f.shape)}"
            elif isinstance(space, BoxSpace) and col.size:
                shaped = col.reshape((col.shape[0],) + tuple(space.shape))
                if not (bool(np.all(shaped >= space.low_numpy)) and bool(np.all(shaped <= space.high_numpy))):
                    why = "values outside its bounds"
        if why is not None:
            warnings.warn(f"{layout.root}: the space recorded for {k!r} in meta/{SPACES_FILE} does not fit the data "
                          f"({why}); LeRobot's own feature type is used", stacklevel=3)
            continue
        layout.columns[k] = col.reshape((col.shape[0],) + tuple(space.shape or ()))
        out[k] = space
    return out


def _select(schema: LeRobotSchema, include: Optional[Sequence[str]], exclude: Optional[Sequence[str]],
            decode_video: bool) -> List[str]:
    names = list(schema.features)
    for what, given in (("include_features", include), ("exclude_features", exclude)):
        if given is not None:
            if isinstance(given, str):
                raise TypeError(f"{what} must be a list of feature names, got the string {given!r}")
            unknown = [k for k in given if k not in schema.features]
            if unknown:
                raise KeyError(f"{what} names {unknown}, which the dataset does not have (features: {names})")
    if include is not None:
        names = [k for k in names if k in include]
    if exclude is not None:
        names = [k for k in names if k not in exclude]
    if not decode_video:
        names = [k for k in names if not schema.features[k].is_video]
    return names


class LeRobotAsUniEnvDataset(ClosesOnExit, BatchBase[BatchT, BArrayType, BDeviceType, BDtypeType, BRNGType]):
    """A LeRobot dataset as a read-only batch of flat dict samples, one per frame (see the module docstring)."""

    is_mutable = False

    def __init__(self, layout: LeRobotLayout, features: List[str], backend: Any, device: Any = None,
                 threads: Optional[int] = None) -> None:
        schema = layout.schema
        spaces = {k: _feature_space(schema.features[k], backend, device, schema.fps) for k in features}
        spaces.update(_recorded_spaces(layout, features, backend, device))
        cameras: Dict[str, Any] = {}
        from ._lerobot_video import CameraFrames
        for k in features:
            f = schema.features[k]
            if f.is_video:
                fid, frame = layout.video_rows[k]
                cameras[k] = CameraFrames(layout.root, k, f.hwc, schema.fps, layout.video_files[k], fid, frame,
                                          threads)
        self._setup(layout, features, DictSpace(backend, spaces, device=device), device, cameras)

    def _setup(self, layout: LeRobotLayout, features: List[str], space: DictSpace, device: Any,
               cameras: Dict[str, Any]) -> None:
        """Sets every field; `__init__` and `_only` (whose view shares this dataset's open cameras) both end here."""
        super().__init__(space)
        self._layout = layout
        self._schema = layout.schema
        self._features = list(features)
        self._device = device
        self._n = layout.num_rows
        self._cameras = cameras
        self._closed = False
        self._init_episode_lookup()

    def _init_episode_lookup(self) -> None:
        eps = self._layout.episodes
        self._starts = np.asarray([e.dataset_from_index for e in eps] or [0], np.int64)
        self._episode_ids = np.asarray([e.index for e in eps] or [0], np.int64)
        self._task_text = {int(i): t for i, t in self._layout.tasks.items()}

    # ------------------------------------------------------------------------------------------ constructors
    @classmethod
    def from_local(cls, dataset_dir: Union[str, "os.PathLike[str]"], backend: Any, device: Any = None,
                   include_features: Optional[Sequence[str]] = None,
                   exclude_features: Optional[Sequence[str]] = None, decode_video: bool = True,
                   video_backend: str = "auto", video_hwaccel: Any = "auto") -> "LeRobotAsUniEnvDataset":
        """Opens the LeRobot dataset in `dataset_dir` (the folder holding `meta/info.json`).

        `include_features` / `exclude_features` pick features by name; `decode_video=False` leaves the `video`
        cameras out of the space (nothing is decoded). `video_backend` is "auto" or "pyav" (frames are decoded by
        PyAV through this project's read path); `video_hwaccel` is accepted for compatibility: "auto" and None
        decode on the CPU, anything else raises ValueError.
        """
        if video_backend not in VIDEO_BACKENDS:
            raise ValueError(f"video_backend must be one of {VIDEO_BACKENDS} (frames decode through PyAV), got "
                             f"{video_backend!r}")
        if video_hwaccel not in ("auto", None, "none", False):
            raise ValueError(f"video_hwaccel {video_hwaccel!r} is not available: frames decode on the CPU; pass "
                             "'auto' or None")
        from unienv_interface.backends.resolve import resolve_backend
        backend = resolve_backend(backend)          # before any file is read: a typo is the caller's
        root = os.fspath(dataset_dir)
        if not os.path.isdir(root):
            raise FileNotFoundError(f"{root} is not a directory; pass the LeRobot dataset folder (it holds "
                                    "meta/info.json)")
        schema = parse_info(root)
        features = _select(schema, include_features, exclude_features, decode_video)
        layout = load_layout(root, features)
        return cls(layout, features, backend, device)

    @classmethod
    def from_hub(cls, repo_id: str, backend: Any, device: Any = None, revision: Optional[str] = None,
                 local_dir: Optional[Union[str, "os.PathLike[str]"]] = None,
                 download: Optional[Callable[..., str]] = None, **kw: Any) -> "LeRobotAsUniEnvDataset":
        """Downloads the dataset `repo_id` from the Hugging Face Hub (`huggingface_hub.snapshot_download`, into
        `local_dir` or the Hub cache) and opens it with `from_local` (`**kw` are its options).

        `download` replaces `snapshot_download` (same keyword arguments: `repo_id`, `repo_type`, `revision`,
        `local_dir`; returns the folder), e.g. to fetch from a mirror.
        """
        if not isinstance(repo_id, str) or not repo_id:
            raise TypeError(f"repo_id must be a non-empty string like 'lerobot/pusht', got {repo_id!r}")
        if download is None:
            try:
                from huggingface_hub import snapshot_download
            except ImportError as exc:
                raise ModuleNotFoundError("LeRobotAsUniEnvDataset.from_hub needs huggingface_hub; install the "
                                          f"extra: pip install 'unienv-storage[lerobot]' ({exc})") from exc
            download = snapshot_download
        path = download(repo_id=repo_id, repo_type="dataset", revision=revision,
                        local_dir=None if local_dir is None else os.fspath(local_dir))
        return cls.from_local(path, backend, device=device, **kw)

    # ------------------------------------------------------------------------------------------ BatchBase
    def __len__(self) -> int:
        return self._n

    def _check_open(self) -> None:
        if self._closed:
            from unienv_data.base.errors import StorageClosedError
            raise StorageClosedError("this LeRobotAsUniEnvDataset was closed; open the dataset again")

    def _read_numpy(self, rows: np.ndarray) -> Dict[str, np.ndarray]:
        self._check_open()
        out: Dict[str, np.ndarray] = {}
        for k in self._features:
            f = self._schema.features[k]
            if f.is_video:
                arr = np.empty((rows.size,) + f.hwc, np.uint8)
                self._cameras[k].read(rows, arr)
                out[k] = arr
            elif f.is_image:
                out[k] = self._decode_images(k, f, rows)
            else:
                out[k] = self._layout.columns[k][rows]
        return out

    def _decode_images(self, key: str, f: LeRobotFeature, rows: np.ndarray) -> np.ndarray:
        from unienv_data.storages._episode_files import import_optional
        Image = import_optional("PIL.Image", "video", "Reading LeRobot image cameras")
        h, w, c = f.hwc
        out = np.empty((rows.size, h, w, c), np.uint8)
        blobs = self._layout.images[key]
        for j, r in enumerate(rows.tolist()):
            try:
                with Image.open(io.BytesIO(blobs[r])) as im:
                    arr = np.asarray(im.convert("RGB" if c == 3 else "L"))
            except Exception as exc:  # noqa: BLE001 - PIL raises many kinds for damaged bytes
                raise StorageFormatError(f"{self._layout.root}: image {key!r} of row {r} cannot be decoded "
                                         f"({type(exc).__name__}: {exc})") from None
            if arr.shape[:2] != (h, w):
                raise StorageFormatError(f"{self._layout.root}: image {key!r} of row {r} is {arr.shape[1]}x"
                                         f"{arr.shape[0]}, info.json declares {w}x{h}")
            out[j] = arr.reshape(h, w, c)
        return out

    def _to_backend(self, data: Dict[str, np.ndarray]) -> Dict[str, Any]:
        be = self.backend
        return {k: be.from_numpy(v, device=self._device) for k, v in data.items()}

    def get_at(self, idx: Any) -> Any:
        """Sample(s) at `idx`: an int gives one sample, anything else (slice, int array, mask) a batch."""
        norm = normalize_index(idx, self._n, "LeRobot dataset")
        data = self._to_backend(self._read_numpy(norm.positions()))
        return {k: v[0] for k, v in data.items()} if norm.is_single else data

    def get_at_with_metadata(self, idx: Any) -> Tuple[Any, Dict[str, Any]]:
        """Sample(s) at `idx` and `{"task": text, "episode_index": LeRobot episode index}` (a list of texts and an
        int64 array for a batch)."""
        norm = normalize_index(idx, self._n, "LeRobot dataset")
        rows = norm.positions()
        data = self._to_backend(self._read_numpy(rows))
        texts = [self._task_text.get(t, "") for t in self._layout.task_per_row[rows].tolist()]
        ep_idx = self._episode_ids[np.searchsorted(self._starts, rows, side="right") - 1]
        if norm.is_single:
            return {k: v[0] for k, v in data.items()}, {"task": texts[0], "episode_index": int(ep_idx[0])}
        return data, {"task": texts, "episode_index": ep_idx}

    def get_column(self, nested_keys: Any) -> BatchBase:
        """A read-only view of one feature: a dotted name (`"observation.state"`) or its parts (`["observation",
        "state"]`). Only that feature is read."""
        key = nested_keys if isinstance(nested_keys, str) else ".".join(str(k) for k in nested_keys)
        if key not in self._features:
            raise KeyError(f"feature {key!r} is not in this dataset's space (keys: {self._features})")
        from unienv_data.batches import SubItemBatch
        return SubItemBatch(self._only([key]), [key])

    def _only(self, features: List[str]) -> "LeRobotAsUniEnvDataset":
        space: Any = self.single_space
        view = object.__new__(type(self))
        type(self)._setup(view, self._layout, features,
                          DictSpace(self.backend, {k: space[k] for k in features}, device=self._device), self._device,
                          {k: c for k, c in self._cameras.items() if k in features})
        return view

    def scan_videos(self, features: Optional[Sequence[str]] = None) -> None:
        """Learns every video file's frame numbers and keyframes now (by demuxing, no decoding) instead of on first
        read; DataLoader worker processes forked afterwards inherit what was learned. `features`: only these
        cameras (default: every video camera read)."""
        self._check_open()
        for k, cam in self._cameras.items():
            if features is None or k in features:
                cam.scan_all()

    def get_segments(self) -> List[Tuple[int, int]]:
        """Every episode as a half-open `(start, end)` range of rows, in row order."""
        return [(e.dataset_from_index, e.dataset_to_index) for e in self._layout.episodes]

    def get_episode(self, episode_index: int) -> Any:
        """All frames of the `episode_index`-th episode (in row order; `episode_metadata[i].index` is its LeRobot
        episode index)."""
        eps = self._layout.episodes
        if isinstance(episode_index, bool) or not isinstance(episode_index, (int, np.integer)):
            raise TypeError(f"episode_index must be an int, got {episode_index!r}")
        if not -len(eps) <= int(episode_index) < len(eps):
            raise IndexError(f"episode {int(episode_index)} is out of range: the dataset has {len(eps)} episodes")
        e = eps[int(episode_index)]
        return self.get_at(slice(e.dataset_from_index, e.dataset_to_index))

    @property
    def num_episodes(self) -> int:
        return len(self._layout.episodes)

    @property
    def fps(self) -> int:
        return self._schema.fps

    @property
    def schema(self) -> LeRobotSchema:
        return self._schema

    @property
    def episode_metadata(self) -> List[EpisodeMetadata]:
        return list(self._layout.episodes)

    @property
    def tasks(self) -> Dict[int, str]:
        """task_index -> task text."""
        return dict(self._layout.tasks)

    @property
    def dataset_dir(self) -> str:
        return self._layout.root

    def close(self) -> None:
        """Closes the open video decoders; later reads raise StorageClosedError."""
        if not self._closed:
            for cam in self._cameras.values():
                cam.close()
            self._closed = True

    def __repr__(self) -> str:
        return (f"LeRobotAsUniEnvDataset({self._layout.root!r}, {self._schema.codebase_version}, {self._n} frames, "
                f"{self.num_episodes} episodes, {self._schema.fps} fps, features {self._features})")


__all__ = ["LeRobotAsUniEnvDataset", "LeRobotSchema", "LeRobotFeature", "EpisodeMetadata", "VIDEO_BACKENDS"]
