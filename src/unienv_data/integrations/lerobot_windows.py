"""`LeRobotWindows`: LeRobot's `delta_timestamps` access (the training pattern of ACT and diffusion policies) over a
batch with episodes, for a training loop: a LeRobot folder read in place (`LeRobotAsUniEnvDataset`) or the same data
after `unienv-data convert --from lerobot` (a `ReplayBuffer`).

    ds = LeRobotAsUniEnvDataset.from_local("path/to/dataset", NumpyComputeBackend)
    win = LeRobotWindows.from_delta_timestamps(ds, {"observation.image": [-0.1, 0.0], "action": [i / 10 for i in range(16)]})
    batch = win.get_batch(np.array([0, 17, 42]))
    # {"observation.image": (3, 2, H, W, 3) uint8, "observation.image_is_pad": (3, 2) bool,
    #  "action": (3, 16, A), "action_is_pad": (3, 16), "index": (3,), "episode_index": (3,)}
    loader = torch.utils.data.DataLoader(win, batch_size=64, shuffle=True, num_workers=2,
                                         collate_fn=LeRobotWindows.collate_fn)

Windows follow LeRobot: item `i` is anchored at frame `i`; frame `i + o` of a window that lies outside the anchor's
episode is a pad frame: it holds the episode's first (before the start) or last (after the end) frame and
`<key>_is_pad` is True there. A window never reads another episode's frames. Unlike LeRobot, cameras stay uint8 HWC
(`(B, T, H, W, C)`); nothing is converted to float before the batch reaches the training process.

Reads. `get_batch` (and `__getitems__`, which a torch DataLoader calls with a whole batch of indices) reads each camera
ONCE for the batch: the frames of every window are gathered, de-duplicated, and read in one call, which decodes each
video file once, forward, keyframe-seeking, with decoders kept open between batches (see `_lerobot_video`); cameras
are read in parallel threads. Tabular keys (state, action, ...) are loaded into memory once when the windows are made,
and every batch is one vectorised gather. Video files are scanned (frame numbers and keyframes) when the windows are
made, so DataLoader worker processes inherit the index instead of rebuilding it.

Backends and fps. A source opened with any backend (e.g. a `ReplayBuffer.load_from(..., backend=PyTorchComputeBackend)`)
gives the same NumPy batches: reads go through the source backend's `to_numpy`. `from_delta_timestamps` takes the fps
the source records (`recorded_fps`) and refuses a different `fps=`.
"""
from __future__ import annotations

import os
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from unienv_data.base.segments import episode_segments_of
from unienv_interface.space import BoxSpace

#: suffix of the pad-mask keys (LeRobot's spelling)
PAD_SUFFIX = "_is_pad"
#: how far `delta * fps` may be from a whole number of steps (LeRobot's default tolerance is 1e-4 s)
STEP_TOLERANCE = 1e-3


def offsets_from_delta_timestamps(delta_timestamps: Mapping[str, Sequence[float]], fps: float) -> Dict[str, np.ndarray]:
    """`{key: seconds}` as `{key: int64 step offsets}` at `fps`; a delta that is not a whole number of frames raises
    ValueError."""
    if fps <= 0:
        raise ValueError(f"fps must be positive, got {fps}")
    out: Dict[str, np.ndarray] = {}
    for key, deltas in delta_timestamps.items():
        d = np.asarray(list(deltas), np.float64)
        if d.ndim != 1 or d.size == 0:
            raise ValueError(f"delta_timestamps[{key!r}] must be a non-empty list of seconds, got {deltas!r}")
        steps = d * fps
        whole = np.round(steps)
        bad = np.flatnonzero(np.abs(steps - whole) > STEP_TOLERANCE)
        if bad.size:
            raise ValueError(f"delta_timestamps[{key!r}] holds {float(d[bad[0]])} s, which is not a whole number of "
                             f"frames at {fps} fps; use multiples of {1 / fps:.6g} s")
        out[key] = whole.astype(np.int64)
    return out


def _episode_bounds(source: Any, n: int) -> np.ndarray:
    segs = episode_segments_of(source)
    if not segs:
        return np.asarray([[0, n]], np.int64)
    b = np.asarray(segs, np.int64).reshape(-1, 2)
    if (b[:, 0] < 0).any() or (b[:, 1] > n).any() or (b[:, 1] <= b[:, 0]).any() or (b[1:, 0] < b[:-1, 1]).any():
        raise ValueError(f"the source's episodes {b.tolist()[:5]}... are not increasing, disjoint ranges inside "
                         f"[0, {n}); windows need them in row order")
    return b


def recorded_fps(source: Any) -> Dict[str, float]:
    """The frame rates `source` records, by where each is recorded: `"fps"` (the source's `fps` attribute, e.g. a
    LeRobot folder's), `"<key> metadata"` (an `fps` in a key's space metadata: LeRobot cameras, kept by `convert
    --from lerobot`). Empty when it records none. A `VideoStorage`'s own fps does not count: it is a playback rate
    that defaults to 15 when the recorder did not choose one, so a 50 Hz recording would be refused its true rate."""
    found: Dict[str, Optional[float]] = {"fps": _rate(getattr(source, "fps", None))}
    for key, sub in getattr(source.single_space, "spaces", {}).items():
        meta = getattr(sub, "metadata", None)
        found[f"{key} metadata"] = _rate(meta.get("fps")) if isinstance(meta, Mapping) else None
    return {where: rate for where, rate in found.items() if rate is not None}


def _rate(value: Any) -> Optional[float]:
    """`value` as a frame rate: a positive number (not a bool), else None."""
    if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool) and value > 0:
        return float(value)
    return None


def _describe(recorded: Mapping[str, float]) -> str:
    by_rate: Dict[float, List[str]] = {}
    for where, rate in recorded.items():
        by_rate.setdefault(rate, []).append(where)
    return "; ".join(f"{rate:g} fps ({', '.join(where)})" for rate, where in sorted(by_rate.items()))


def _is_camera(space: Any) -> bool:
    """A uint8 `(H, W, C)` box, whatever the space's backend (its dtype may be a torch or JAX dtype)."""
    if not isinstance(space, BoxSpace) or len(space.shape or ()) != 3:
        return False
    return space.backend.dtype_name(space.dtype) == "uint8"


class _Column:
    """Reads one key of the source at chosen rows: its column view, or the key of a group column (a ReplayBuffer
    in the native layout keeps low-dimensional keys together in one storage per dtype)."""

    def __init__(self, source: Any, key: str) -> None:
        self.key = key
        self.backend = source.single_space.backend
        self.group: Optional[str] = None
        groups = getattr(getattr(source, "storage", None), "groups", None) or {}
        for gname, members in groups.items():
            if key in members:
                self.group = gname
        self.view = source.get_column(self.group or key)

    def read(self, rows: Any) -> np.ndarray:
        data = self.view.get_at(rows)
        # a source opened with another backend (torch, JAX; maybe on a device) reads its arrays: NumPy from here on
        return self.backend.to_numpy(data[self.key] if self.group is not None else data)


class LeRobotWindows:
    """Windows of chosen keys at per-key step offsets, with LeRobot's pad masks, over a batch with episodes (see the
    module docstring). A map-style torch Dataset (`len`, `[i]`, `__getitems__`) without importing torch.

    `source`: a `LeRobotAsUniEnvDataset`, a `ReplayBuffer` or any batch with `get_column` and `get_segments`.
    `windows`: `{key: int step offsets}` (a sequence or 1-D int array, e.g. `{"observation.image": [-1, 0], "action": range(16)}`).
    `threads`: threads reading the cameras of a batch in parallel (default: one per camera).
    """

    def __init__(self, source: Any, windows: Mapping[str, Any], threads: Optional[int] = None) -> None:
        if not isinstance(windows, Mapping) or not windows:
            raise ValueError("windows must be a non-empty mapping {key: step offsets}, e.g. {'action': range(16)}")
        space = source.single_space
        keys = list(getattr(space, "spaces", {}))
        self.source = source
        self.offsets: Dict[str, np.ndarray] = {}
        for key, offs in windows.items():
            if key not in keys:
                raise KeyError(f"windows names {key!r}, which the source does not have (keys: {keys})")
            arr = np.asarray(list(offs))
            if arr.ndim != 1 or arr.size == 0 or arr.dtype.kind not in "iu":
                raise ValueError(f"windows[{key!r}] must be a non-empty list of int step offsets, got {offs!r}")
            self.offsets[key] = arr.astype(np.int64)
        n = len(source)
        self._n = n
        bounds = _episode_bounds(source, n)
        # every row's episode (rows outside every episode are their own one-row episode: never padded into others)
        self._ep_of_row = np.full(n, -1, np.int64)
        self._start = np.arange(n, dtype=np.int64)
        self._end = np.arange(1, n + 1, dtype=np.int64)
        for e, (s, t) in enumerate(bounds.tolist()):
            self._ep_of_row[s:t] = e
            self._start[s:t] = s
            self._end[s:t] = t
        self.cameras = [k for k in self.offsets if _is_camera(space.spaces[k])]
        self._columns = {k: _Column(source, k) for k in self.offsets}
        # tabular keys: loaded once, gathered per batch
        self._tables = {k: self._columns[k].read(slice(0, n)) for k in self.offsets if k not in self.cameras}
        scan = getattr(source, "scan_videos", None)
        if scan is not None and self.cameras:
            scan(self.cameras)
        self._threads = max(1, threads if threads is not None else len(self.cameras))
        self._pool: Optional[ThreadPoolExecutor] = None
        self._pool_pid = 0
        self._budget_pid = 0

    @classmethod
    def from_delta_timestamps(cls, source: Any, delta_timestamps: Mapping[str, Sequence[float]],
                              fps: Optional[float] = None, threads: Optional[int] = None) -> "LeRobotWindows":
        """Windows given in seconds, as LeRobot's `LeRobotDataset(..., delta_timestamps=...)` takes them.

        `fps` defaults to the frame rate the source records (see `recorded_fps`: a LeRobot folder's, or what a
        `ReplayBuffer` written by `convert --from lerobot` keeps in its camera keys and video files); a given `fps`
        that differs from the recorded one raises ValueError (the windows would be silently wrong). A source that
        records none needs `fps=`. To use other step offsets on purpose, build the windows from steps:
        `LeRobotWindows(source, offsets_from_delta_timestamps(delta_timestamps, fps))`."""
        recorded = recorded_fps(source)
        rates = sorted(set(recorded.values()))
        if fps is None:
            if not rates:
                raise ValueError("the source records no fps (neither an fps attribute, nor an 'fps' in its keys' "
                                 "space metadata, nor a VideoStorage); pass fps= to turn delta_timestamps into steps")
            if len(rates) > 1:
                raise ValueError(f"the source records several frame rates {_describe(recorded)}; pass fps= with the "
                                 "one delta_timestamps are measured in")
            fps = rates[0]
        elif rates and not any(abs(float(fps) - r) <= 1e-9 * max(1.0, r) for r in rates):
            raise ValueError(f"fps={fps} differs from the frame rate the source was recorded at: "
                             f"{_describe(recorded)}; leave fps= out (or pass the recorded value), or give step "
                             "offsets: LeRobotWindows(source, offsets_from_delta_timestamps(delta_timestamps, fps))")
        return cls(source, offsets_from_delta_timestamps(delta_timestamps, float(fps)), threads)

    # ------------------------------------------------------------------------------ torch Dataset protocol
    def __len__(self) -> int:
        return self._n

    def __getitem__(self, index: int) -> Dict[str, np.ndarray]:
        i = int(index)
        if not -self._n <= i < self._n:
            raise IndexError(f"window {i} is out of range: there are {self._n}")
        batch = self.get_batch(np.asarray([i % self._n], np.int64))
        return {k: v[0] for k, v in batch.items()}

    def __getitems__(self, indices: Any) -> Dict[str, np.ndarray]:
        if hasattr(indices, "detach"):
            indices = indices.detach().cpu().numpy()
        return self.get_batch(np.asarray(indices, np.int64))

    def __getstate__(self) -> Dict[str, Any]:
        state = dict(self.__dict__)
        state["_pool"] = None
        return state

    # ------------------------------------------------------------------------------ reads
    def window_rows(self, anchors: np.ndarray, key: str) -> Tuple[np.ndarray, np.ndarray]:
        """`(rows, is_pad)` of the windows of `key` anchored at `anchors`: both `(B, T)`; pad frames hold the
        episode's first or last row."""
        a = np.asarray(anchors, np.int64)
        f = a[:, None] + self.offsets[key][None, :]
        s = self._start[a][:, None]
        e = self._end[a][:, None]
        return np.clip(f, s, e - 1), (f < s) | (f >= e)

    def get_batch(self, anchors: Any) -> Dict[str, np.ndarray]:
        """The windows anchored at rows `anchors` (1-D ints in `[0, len)`), as NumPy arrays (see the module
        docstring for the keys)."""
        if self._budget_pid != os.getpid():
            self._share_cores()
        a = np.asarray(anchors, np.int64)
        if a.ndim != 1:
            raise IndexError(f"anchors must be a 1-D list of rows, got shape {a.shape}")
        if a.size and (a.min() < 0 or a.max() >= self._n):
            bad = int(a[(a < 0) | (a >= self._n)][0])
            raise IndexError(f"anchor {bad} is out of range: the source has {self._n} rows")
        out: Dict[str, np.ndarray] = {}
        pads: Dict[str, np.ndarray] = {}
        cams: List[Tuple[str, np.ndarray]] = []
        for key in self.offsets:
            rows, pad = self.window_rows(a, key)
            pads[key + PAD_SUFFIX] = pad
            if key in self._tables:
                out[key] = self._tables[key][rows]
            else:
                cams.append((key, rows))
        if len(cams) > 1 and self._threads > 1:
            results = list(self._executor().map(lambda kr: self._read_camera(*kr), cams))
        else:
            results = [self._read_camera(k, r) for k, r in cams]
        for (key, _), frames in zip(cams, results):
            out[key] = frames
        out.update(pads)
        out["index"] = a
        out["episode_index"] = self._ep_of_row[a] if a.size else np.zeros(0, np.int64)
        return out

    def _share_cores(self) -> None:
        """In a torch DataLoader worker, the cores are shared with the other workers: this process decodes with
        `cores // workers` threads (at least 1) instead of one per core, so 2 workers on 2 cores do not run 4-8
        decoding threads that take turns (measured: 2x slower with 240x320 frames)."""
        self._budget_pid = os.getpid()
        data_mod = sys.modules.get("torch.utils.data")
        info = data_mod.get_worker_info() if data_mod is not None else None
        if info is None:
            return
        from unienv_data.storages import _episode_files
        share = max(1, (os.cpu_count() or 1) // max(1, int(info.num_workers)))
        _episode_files.IO_WORKERS = min(_episode_files.IO_WORKERS, share)
        self._threads = min(self._threads, share)

    def _read_camera(self, key: str, rows: np.ndarray) -> np.ndarray:
        # every window row in one read: the source decodes each distinct frame once and copies repeats (pad frames,
        # overlapping windows) itself, so the frames land in their final places with a single copy
        frames = self._columns[key].read(rows.reshape(-1))
        return frames.reshape(rows.shape + frames.shape[1:])

    def _executor(self) -> ThreadPoolExecutor:
        if self._pool is None or self._pool_pid != os.getpid():
            self._pool = ThreadPoolExecutor(max_workers=self._threads, thread_name_prefix="unienv-lerobot-windows")
            self._pool_pid = os.getpid()
        return self._pool

    @staticmethod
    def collate_fn(batch: Any) -> Dict[str, Any]:
        """For a torch DataLoader: a batch from `__getitems__` becomes torch tensors without a copy (so worker
        processes hand it over in shared memory); a list of single items is stacked first."""
        import torch
        if isinstance(batch, list):
            batch = {k: np.stack([item[k] for item in batch]) for k in batch[0]}
        return {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in batch.items()}

    def close(self) -> None:
        """Stops the camera threads (the source stays open: close it yourself)."""
        if self._pool is not None:
            self._pool.shutdown(wait=False)
            self._pool = None


__all__ = ["LeRobotWindows", "offsets_from_delta_timestamps", "recorded_fps", "PAD_SUFFIX"]
