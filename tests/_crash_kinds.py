"""Crash-trial storage kinds over HDF5 and video (used by tests/_crash_child.py; see its docstring).

  h5         HDF5Storage, fixed capacity (contiguous, memory-mapped datasets), NumPy Dict space
  h5grow     HDF5Storage, growable (chunked datasets; moves to a bigger file as it grows)
  h5flat     FlattenedStorage over an HDF5Storage (fixed capacity)
  h5rb       ReplayBuffer over an HDF5Storage (fixed capacity)
  video      VideoStorage, fixed-capacity ring, lossless codec, 16x16 RGB frames
  videogrow  VideoStorage, growable
  rbvideo    ReplayBuffer over a native-layout DictStorage whose image leaf is a (lossless) VideoStorage

Every row names its episode, step and episode length (video frames carry them in their first 12 bytes), so the
checker can tell a whole episode from a torn one and compare it bit for bit with what was recorded.
"""
from __future__ import annotations

import os
import warnings
import zlib
from typing import Any, Callable, Dict, List, Tuple

import numpy as np

KINDS = ("h5", "h5grow", "h5flat", "h5rb", "video", "videogrow", "rbvideo")
KIND_CODE = {"h5": 4, "h5grow": 5, "h5flat": 6, "h5rb": 7, "video": 8, "videogrow": 9, "rbvideo": 10}
#: kinds recorded through a ReplayBuffer (episodes at the tail, `dumps()` as the commit point)
BUFFER_KINDS = ("h5rb", "rbvideo")
#: growable kinds (no ring; a plan's "capacity" is then only the bound used for overlap arithmetic)
GROWABLE_KINDS = ("h5grow", "videogrow")
GROW_BOUND = 1 << 30
#: kinds stored as one file (its name inside the trial directory)
SINGLE_FILE = {"h5": "data.hdf5", "h5grow": "data.hdf5"}
VIDEO_KINDS = ("video", "videogrow")
FRAME = (16, 16, 3)
VIDEO_KWARGS = {"lossless": True}

_SPACES: Dict[str, Any] = {}


def _np_space(with_image: bool = False) -> Any:
    key = "img" if with_image else "np"
    if key not in _SPACES:
        from unienv_interface.backends import NumpyComputeBackend as NB
        from unienv_interface.space import BoxSpace, DictSpace
        leaves: Dict[str, Any] = {k: BoxSpace(NB, 0, 1 << 20, np.int32, shape=()) for k in ("eid", "t", "n", "chk")}
        leaves["x"] = BoxSpace(NB, -np.inf, np.inf, np.float32, shape=(3,))
        if with_image:
            leaves["img"] = BoxSpace(NB, 0, 255, np.uint8, shape=FRAME)
        _SPACES[key] = DictSpace(NB, leaves)
    return _SPACES[key]


def _frame_space() -> Any:
    if "frame" not in _SPACES:
        from unienv_interface.backends import NumpyComputeBackend as NB
        from unienv_interface.space import BoxSpace
        _SPACES["frame"] = BoxSpace(NB, 0, 255, np.uint8, shape=FRAME)
    return _SPACES["frame"]


def space_for(kind: str) -> Any:
    if kind in VIDEO_KINDS:
        return _frame_space()
    return _np_space(kind == "rbvideo")


def preload() -> None:
    """Imports (and builds) everything the trials of these kinds use, once, in the fork server."""
    import h5py  # noqa: F401
    import av  # noqa: F401
    for k in KINDS:
        space_for(k)
    import unienv_data.storages.dict_storage  # noqa: F401
    import unienv_data.storages.hdf5  # noqa: F401
    import unienv_data.storages.native_layout  # noqa: F401
    import unienv_data.storages.video_storage  # noqa: F401
    warnings.simplefilter("ignore")   # FlattenPromotionWarning of h5flat (int32 and float32 in one float64 row)


# ------------------------------------------------------------------------------------------------ episode content
def _frame_checksum(frame: np.ndarray) -> int:
    b = frame.tobytes()
    return zlib.crc32(b[:12] + b[16:]) & 0x7FFFFFFF


def episode_arrays(kind: str, seed: int, eid: int, n: int,
                   row_checksum: Callable[[int, int, int, np.ndarray], int]) -> Dict[str, np.ndarray]:
    """The rows of episode `eid`: video kinds {"frame": uint8 (n, 16, 16, 3)} (eid, t, n, checksum in the first
    16 bytes); the others the fields eid, t, n, x, chk (+ img for rbvideo)."""
    rng = np.random.default_rng([int(seed), int(eid), 77])
    if kind in VIDEO_KINDS:
        frames = rng.integers(0, 256, size=(n,) + FRAME, dtype=np.uint8)
        flat = frames.reshape(n, -1)
        for t in range(n):
            flat[t, :12] = np.frombuffer(np.array([eid, t, n], "<i4").tobytes(), np.uint8)
            flat[t, 12:16] = np.frombuffer(np.array([_frame_checksum(frames[t])], "<i4").tobytes(), np.uint8)
        return {"frame": frames}
    x = rng.standard_normal((n, 3)).astype(np.float32)
    out = {"eid": np.full(n, eid, np.int32), "t": np.arange(n, dtype=np.int32), "n": np.full(n, n, np.int32),
           "x": x, "chk": np.zeros(n, np.int32)}
    for t in range(n):
        out["chk"][t] = row_checksum(eid, t, n, x[t])
    if kind == "rbvideo":
        out["img"] = rng.integers(0, 256, size=(n,) + FRAME, dtype=np.uint8)
    return out


def step_value(kind: str, arrays: Dict[str, np.ndarray], t: int) -> Any:
    if kind in VIDEO_KINDS:
        return arrays["frame"][t].copy()
    return {k: np.array(v[t]) for k, v in arrays.items()}


def ids_of(kind: str, rows: Dict[str, np.ndarray]) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(episode ids, steps, lengths) read back from rows."""
    if kind in VIDEO_KINDS:
        f = rows["frame"]
        head = np.ascontiguousarray(f.reshape(f.shape[0], -1)[:, :12]).view("<i4")
        return head[:, 0], head[:, 1], head[:, 2]
    return rows["eid"], rows["t"], rows["n"]


# ------------------------------------------------------------------------------------------------ storages
def own_path(kind: str, main: str) -> str:
    """What a non-buffer kind's `dumps(own path)` names: its file or its directory."""
    return os.path.join(main, SINGLE_FILE[kind]) if kind in SINGLE_FILE else main


def snap_path(kind: str, snap: str) -> str:
    return os.path.join(snap, SINGLE_FILE[kind]) if kind in SINGLE_FILE else snap


def open_storage(kind: str, main: str, cap: int) -> Any:
    """A new storage (or buffer) of `kind` recording into `main`."""
    from unienv_data.replay_buffer import ReplayBuffer
    from unienv_data.storages.hdf5 import HDF5Storage
    space = space_for(kind)
    if kind in ("h5", "h5grow"):
        os.makedirs(main, exist_ok=True)
        return HDF5Storage.create(space, None if kind == "h5grow" else cap, cache_path=own_path(kind, main))
    if kind == "h5flat":
        from unienv_data.storages.flattened import FlattenedStorage
        return FlattenedStorage.create(space, HDF5Storage, capacity=cap, cache_path=main)
    if kind == "h5rb":
        return ReplayBuffer.create(HDF5Storage, space, cache_path=main, capacity=cap)
    from unienv_data.storages.video_storage import VideoStorage
    if kind in VIDEO_KINDS:
        return VideoStorage.create(space, capacity=None if kind == "videogrow" else cap, cache_path=main,
                                   **VIDEO_KWARGS)
    from unienv_data.storages.dict_storage import DictStorage
    from unienv_data.storages.native_layout import native_layout_kwargs
    return ReplayBuffer.create(DictStorage, space, cache_path=main, capacity=cap,
                               **native_layout_kwargs(space, image_storage="video", video_kwargs=VIDEO_KWARGS))


def _span(cap: Any, s: int, e: int) -> int:
    return (e - s) % cap + 1 if cap else e - s + 1


def load(kind: str, main: str) -> Tuple[Any, List[Tuple[int, int]], Callable[[int, int], Dict[str, np.ndarray]]]:
    """Opens a trial directory read-only: (object to close, listed runs `(physical start, n)`, reader of a run)."""
    space = space_for(kind)
    if kind in BUFFER_KINDS:
        from unienv_data.replay_buffer import ReplayBuffer
        from unienv_interface.backends import NumpyComputeBackend as NB
        rb = ReplayBuffer.load_from(main, backend=NB)
        runs: List[Tuple[int, int]] = []
        starts: Dict[Tuple[int, int], int] = {}
        for a, b in rb.episode_segments() or []:
            phys = int(rb.index_with_offset(a))
            runs.append((phys, b - a))
            starts[(phys, b - a)] = a

        def read_rb(s: int, n: int) -> Dict[str, np.ndarray]:
            a = starts[(s, n)]
            return {k: np.asarray(v) for k, v in rb.get_at(slice(a, a + n)).items()}
        return rb, runs, read_rb
    if kind in ("h5", "h5grow"):
        from unienv_data.storages.hdf5 import HDF5Storage
        st = HDF5Storage.load_from(own_path(kind, main), space)
    elif kind == "h5flat":
        from unienv_data.storages.flattened import FlattenedStorage
        st = FlattenedStorage.load_from(main, space)
    else:
        from unienv_data.storages.video_storage import VideoStorage
        st = VideoStorage.load_from(main, space)
    cap = st.capacity
    runs = [(s, _span(cap, s, e)) for s, e in st.episode_segments() or []]

    def read(s: int, n: int) -> Dict[str, np.ndarray]:
        idx = (np.arange(n) + s) % cap if cap else np.arange(n) + s
        got = st.get(idx)
        if kind in VIDEO_KINDS:
            return {"frame": np.asarray(got)}
        return {k: np.asarray(v) for k, v in got.items()}
    return st, runs, read


def segment_list_file(kind: str, main: str) -> Tuple[str, str]:
    """(JSON file, key) holding the authoritative segment list of a trial directory (for the checker's own test)."""
    from unienv_data.storages.hdf5 import STATE_SUFFIX
    if kind in ("h5", "h5grow"):
        return own_path(kind, main) + STATE_SUFFIX, "segments"
    if kind == "h5flat":
        return os.path.join(main, "inner_storage.hdf5" + STATE_SUFFIX), "segments"
    if kind == "h5rb":
        return os.path.join(main, "storage.hdf5" + STATE_SUFFIX), "segments"
    if kind in VIDEO_KINDS:
        return os.path.join(main, "video_metadata.json"), "segments"
    return os.path.join(main, "storage", "img", "video_metadata.json"), "segments"


def tamper_row(kind: str, main: str, row: int) -> None:
    """Changes the stored content of physical row `row` behind the library's back (segments untouched): for the
    checker's own test that a torn segment is reported."""
    if kind in VIDEO_KINDS or kind == "rbvideo":
        from unienv_data.storages.video_storage import VideoStorage
        d = main if kind in VIDEO_KINDS else os.path.join(main, "storage", "img")
        st = VideoStorage.load_from(d, _frame_space(), read_only=False)
        try:
            st.set(row, 255 - np.asarray(st.get(row)))
        finally:
            st.close()
        return
    import h5py
    path, key = {"h5": (own_path(kind, main), "x"), "h5grow": (own_path(kind, main), "x"),
                 "h5flat": (os.path.join(main, "inner_storage.hdf5"), "data"),
                 "h5rb": (os.path.join(main, "storage.hdf5"), "x")}[kind]
    with h5py.File(path, "r+") as f:
        ds = f[key]
        v = np.array(ds[row])
        v.reshape(-1)[-1] += 1
        ds[row] = v
