#!/usr/bin/env python
"""Drives the reference `unienv` VideoStorage for `bench_video.py`; run under the peer venv's python
(`.bench-venvs/unienv/bin/python`), never imported by the project.

It reads one JSON command per line on stdin and answers each with one JSON line on its protocol stream (the
original stdout; everything else the process prints goes to stderr, so library or FFmpeg output cannot corrupt
the answers). Every timing is taken here, around the storage call alone, so the pipe costs nothing: ``s`` wall-clock seconds,
``cpu`` CPU seconds of this process (all its threads).

Commands (``op``):

  init     ``frames`` (.npy path, (N, H, W, 3) uint8), ``episodes``, ``steps``, ``plan`` (.npz path with ``rand``
           (R, B) and ``offs`` (R, S) int64), ``root`` (directory to create storages under)
  create   ``row`` (a name), ``kwargs`` (VideoStorage.create keyword arguments): builds the storage with a
           fixed capacity of all the frames
  write    ``row``, ``episode``: mark_segment_start / append every frame / mark_segment_end; answers ``s``
  size     ``row``: bytes of the video files
  seq      ``row``: reads every episode as one slice; answers per-episode ``s``, ``psnr``, ``exact``
  rand     ``row``, ``r``: reads batch ``rand[r]``; answers ``s`` (and ``matches``: equal to the row's own
           sequential decode, on the first call)
  slice    ``row``, ``r``: reads the slices at ``offs[r]`` (``slice`` frames each); answers ``s``
  close    closes every storage and exits

An error in a command is answered as ``{"error": "..."}`` and the driver goes on; only ``close`` (or EOF) ends it.
"""
from __future__ import annotations

import json
import os
import sys
import time
import traceback

for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

# protocol on a private copy of stdout; fd 1 becomes stderr for everything else
_PROTO = os.fdopen(os.dup(1), "w", buffering=1)
os.dup2(2, 1)
sys.stdout = sys.stderr

import numpy as np  # noqa: E402


def _psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float32) - b.astype(np.float32)) ** 2))
    return float("inf") if mse == 0 else float(10 * np.log10(255.0 ** 2 / mse))


def _dir_bytes(path: str) -> int:
    total = 0
    for dp, _dirs, files in os.walk(path):
        for f in files:
            if f.rsplit(".", 1)[-1] in ("mp4", "mkv", "mov", "avi"):
                total += os.path.getsize(os.path.join(dp, f))
    return total


class Driver:
    def __init__(self) -> None:
        self.frames: np.ndarray = np.empty(0)
        self.stores: dict = {}
        self.recon: dict = {}
        self.checked: set = set()

    def init(self, frames: str, episodes: int, steps: int, plan: str, root: str, slice: int) -> dict:
        import av
        import unienv_data
        self.frames = np.load(frames)  # in RAM, as the frames our rows encode
        self.E, self.T, self.S = int(episodes), int(steps), int(slice)
        p = np.load(plan)
        self.rand_plan, self.offs = p["rand"], p["offs"]
        self.root = root
        os.makedirs(root, exist_ok=True)
        try:
            from importlib.metadata import version
            ver = version("unienv")
        except Exception:  # noqa: BLE001
            ver = getattr(unienv_data, "__version__", "?")
        return {"unienv": ver, "av": av.__version__, "numpy": np.__version__, "python": sys.version.split()[0]}

    def create(self, row: str, kwargs: dict) -> dict:
        from unienv_interface.backends.numpy import NumpyComputeBackend
        from unienv_interface.space import BoxSpace
        from unienv_data.storages.video_storage import VideoStorage
        h, w = self.frames.shape[1:3]
        space = BoxSpace(NumpyComputeBackend, 0, 255, np.uint8, shape=(h, w, 3))
        # a fixed capacity, as our rows: the reference's growable storage only grows through a ReplayBuffer
        st = VideoStorage.create(space, cache_path=os.path.join(self.root, row), capacity=int(self.frames.shape[0]),
                                 **kwargs)
        self.stores[row] = st
        return {"codec": str(getattr(st, "codec", "?")), "decode_backend": str(getattr(st, "decode_backend", "?")),
                "cache_decoders": bool(getattr(st, "cache_decoders", False))}

    def write(self, row: str, episode: int) -> dict:
        import av.logging
        st, T = self.stores[row], self.T
        e = int(episode)
        src = self.frames
        t0, c0 = time.perf_counter(), time.process_time()
        st.mark_segment_start(e * T)
        for i in range(e * T, (e + 1) * T):
            st.append(src[i])
        st.mark_segment_end()
        dt, cpu = time.perf_counter() - t0, time.process_time() - c0
        av.logging.set_level(av.logging.ERROR)  # the reference restores FFmpeg's default log callback
        return {"s": dt, "cpu": cpu}

    def size(self, row: str) -> dict:
        return {"bytes": _dir_bytes(os.path.join(self.root, row))}

    def seq(self, row: str) -> dict:
        st, T = self.stores[row], self.T
        recon = np.empty((self.E * T,) + self.frames.shape[1:], np.uint8)
        times = []
        for e in range(self.E):
            t0 = time.perf_counter()
            out = np.asarray(st.get(slice(e * T, (e + 1) * T)))
            times.append(time.perf_counter() - t0)
            recon[e * T:(e + 1) * T] = out
        self.recon[row] = recon
        exact = bool(np.array_equal(recon, self.frames))
        return {"s": times, "exact": exact, "psnr": float("inf") if exact else _psnr(recon, self.frames)}

    def rand(self, row: str, r: int) -> dict:
        st = self.stores[row]
        idx = np.asarray(self.rand_plan[int(r)], dtype=np.int64)
        t0, c0 = time.perf_counter(), time.process_time()
        out = np.asarray(st.get(idx))
        dt, cpu = time.perf_counter() - t0, time.process_time() - c0
        res = {"s": dt, "cpu": cpu}
        if (row, "rand") not in self.checked and row in self.recon:
            self.checked.add((row, "rand"))
            res["matches"] = bool(np.array_equal(out, self.recon[row][idx]))
        return res

    def slice(self, row: str, r: int) -> dict:
        st, S = self.stores[row], self.S
        offs = [int(o) for o in self.offs[int(r)]]
        t0, c0 = time.perf_counter(), time.process_time()
        outs = [np.array(st.get(slice(o, o + S))) for o in offs]
        dt, cpu = time.perf_counter() - t0, time.process_time() - c0
        res = {"s": dt, "cpu": cpu}
        if (row, "slice") not in self.checked and row in self.recon:
            self.checked.add((row, "slice"))
            res["matches"] = all(bool(np.array_equal(x, self.recon[row][o:o + S])) for x, o in zip(outs, offs))
        return res

    def close(self) -> dict:
        for st in self.stores.values():
            try:
                st.close()
            except Exception:  # noqa: BLE001 - closing at exit
                pass
        self.stores.clear()
        return {"closed": True}


def main() -> None:
    drv = Driver()
    for line in sys.stdin:
        if not line.strip():
            continue
        cmd = json.loads(line)
        op = cmd.pop("op")
        try:
            res = getattr(drv, op)(**cmd)
        except Exception as exc:  # noqa: BLE001 - reported to the caller
            traceback.print_exc(file=sys.stderr)
            res = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
        _PROTO.write(json.dumps(res) + "\n")
        _PROTO.flush()
        if op == "close":
            break


if __name__ == "__main__":
    main()
