"""The limits of bench_flattened.py: one plain ndarray per key, no checks, on the same medium as the contender.

  raw-disk        np.memmap(..., mode="w+") per key, used through .view(np.ndarray), fed NumPy rows of the workload
  raw-ram         np.empty + fill(0) per key, fed NumPy rows
  raw-disk-torch  raw-disk fed the same torch tensors as the torch configs: `a[i] = t.numpy()` per key and step,
  raw-ram-torch   `a[s:e] = t.numpy()` per chunk; batches are gathered with the torch index (`idx.numpy()`) and
                  returned as tensors (`torch.from_numpy`); slices are cloned as plain tensors (`clone()` per key),
                  as the torch configs' slices are
"""
from __future__ import annotations

import json
import os
from typing import Any, Dict, List

import numpy as np

from _flat_workloads import SLICE_LEN, Contender, Plan


class _RawHandle:
    def __init__(self, arrays: Dict[str, np.ndarray]) -> None:
        self.arrays: Any = arrays   # dict key -> ndarray; None once closed
        self.episode_starts: List[int] = []


class RawBase(Contender):
    """One plain ndarray per key; per-step rows are numpy views of the workload."""

    def prepare(self, plan: Plan) -> None:
        self.plan = plan
        self.steps = [{k: plan.data[k][i] for k in plan.keys} for i in range(plan.n)]
        self.chunk_data = [(s, e, {k: plan.data[k][s:e] for k in plan.keys}) for s, e in plan.chunks]
        self.shapes = {k: (tuple(plan.data[k].shape[1:]), plan.data[k].dtype.name) for k in plan.keys}

    def append_all(self, h: _RawHandle) -> int:
        items = list(h.arrays.items())
        steps = self.steps
        for s, e in self.plan.episodes:
            h.episode_starts.append(s)
            for i in range(s, e):
                row = steps[i]
                for k, a in items:
                    a[i] = row[k]
        return self.plan.n

    def bulk_all(self, h: _RawHandle) -> int:
        items = list(h.arrays.items())
        for s, e, chunk in self.chunk_data:
            for k, a in items:
                a[s:e] = chunk[k]
        h.episode_starts = [s for s, _ in self.plan.episodes]
        return self.plan.n

    def batch_all(self, h: _RawHandle) -> int:
        items = list(h.arrays.items())
        for idx in self.plan.rand:
            {k: a[idx] for k, a in items}
        return len(self.plan.rand)

    def slice_all(self, h: _RawHandle) -> int:
        items = list(h.arrays.items())
        for o in self.plan.offsets.tolist():
            {k: np.array(a[o:o + SLICE_LEN], copy=True) for k, a in items}
        return len(self.plan.offsets)

    def read(self, h: _RawHandle, idx: np.ndarray) -> Dict[str, np.ndarray]:
        return {k: a[idx] for k, a in h.arrays.items()}

    def close(self, h: _RawHandle) -> None:
        h.arrays = None

    def _write_meta(self, h: _RawHandle, path: str) -> None:
        meta = {"n": self.plan.n, "episode_starts": list(map(int, h.episode_starts)),
                "keys": {k: [list(shape), dt] for k, (shape, dt) in self.shapes.items()}}
        with open(os.path.join(path, "meta.json"), "w") as f:
            json.dump(meta, f)

    @staticmethod
    def _read_meta(path: str) -> Dict[str, Any]:
        with open(os.path.join(path, "meta.json")) as f:
            return json.load(f)


class RawDisk(RawBase):
    name, label, medium = "raw-disk", "np.memmap per key (.view(np.ndarray))", "disk"

    def create(self, path: str) -> _RawHandle:
        os.makedirs(path, exist_ok=True)
        arrays = {}
        for k, (shape, dt) in self.shapes.items():
            mm = np.memmap(os.path.join(path, f"{k}.bin"), mode="w+", dtype=np.dtype(dt), shape=(self.plan.n, *shape))
            arrays[k] = mm.view(np.ndarray)   # plain ndarray view; keeps the mapping alive
        return _RawHandle(arrays)

    def reopen(self, h: _RawHandle, path: str) -> _RawHandle:
        self._write_meta(h, path)
        self.close(h)
        meta = self._read_meta(path)
        arrays = {k: np.memmap(os.path.join(path, f"{k}.bin"), mode="r", dtype=np.dtype(dt),
                               shape=(meta["n"], *shape)).view(np.ndarray)
                  for k, (shape, dt) in meta["keys"].items()}
        h2 = _RawHandle(arrays)
        h2.episode_starts = meta["episode_starts"]
        self.read(h2, self.plan.rand[0])
        return h2


class RawRam(RawBase):
    name, label, medium = "raw-ram", "np.empty + fill(0) per key", "ram"

    def create(self, path: str) -> _RawHandle:
        arrays = {}
        for k, (shape, dt) in self.shapes.items():
            a = np.empty((self.plan.n, *shape), dtype=np.dtype(dt))
            a.fill(0)  # fault every page in now: writes then measure steady state, not first touch
            arrays[k] = a
        return _RawHandle(arrays)

    def reopen(self, h: _RawHandle, path: str) -> _RawHandle:
        os.makedirs(path, exist_ok=True)
        for k, a in h.arrays.items():
            np.save(os.path.join(path, f"{k}.npy"), a)
        self._write_meta(h, path)
        self.close(h)
        meta = self._read_meta(path)
        h2 = _RawHandle({k: np.load(os.path.join(path, f"{k}.npy")) for k in meta["keys"]})
        h2.episode_starts = meta["episode_starts"]
        self.read(h2, self.plan.rand[0])
        return h2



class _TorchFed:
    """Mixin: the same limit, fed torch tensors and returning tensors exactly where the torch configs do."""

    def prepare(self, plan: Plan) -> None:
        import torch
        super().prepare(plan)  # type: ignore[misc]
        self.torch = torch
        src = {k: torch.from_numpy(plan.data[k]) for k in plan.keys}      # zero-copy views, as the torch configs
        self.steps = [{k: t[i] for k, t in src.items()} for i in range(plan.n)]
        self.chunk_data = [(s, e, {k: t[s:e] for k, t in src.items()}) for s, e in plan.chunks]
        self.rand_t = [torch.from_numpy(np.ascontiguousarray(r)) for r in plan.rand]

    def append_all(self, h: _RawHandle) -> int:
        items = list(h.arrays.items())
        steps = self.steps
        for s, e in self.plan.episodes:  # type: ignore[attr-defined]
            h.episode_starts.append(s)
            for i in range(s, e):
                row = steps[i]
                for k, a in items:
                    a[i] = row[k].numpy()
        return self.plan.n  # type: ignore[attr-defined,no-any-return]

    def bulk_all(self, h: _RawHandle) -> int:
        items = list(h.arrays.items())
        for s, e, chunk in self.chunk_data:
            for k, a in items:
                a[s:e] = chunk[k].numpy()
        h.episode_starts = [s for s, _ in self.plan.episodes]  # type: ignore[attr-defined]
        return self.plan.n  # type: ignore[attr-defined,no-any-return]

    def batch_all(self, h: _RawHandle) -> int:
        items = list(h.arrays.items())
        from_numpy = self.torch.from_numpy
        for idx in self.rand_t:
            i = idx.numpy()
            {k: from_numpy(a[i]) for k, a in items}
        return len(self.rand_t)

    def slice_all(self, h: _RawHandle) -> int:
        items = list(h.arrays.items())
        from_numpy = self.torch.from_numpy
        for o in self.plan.offsets.tolist():  # type: ignore[attr-defined]
            {k: from_numpy(a[o:o + SLICE_LEN]).clone() for k, a in items}
        return len(self.plan.offsets)  # type: ignore[attr-defined]


class RawDiskTorchFed(_TorchFed, RawDisk):  # type: ignore[misc]  # chunk_data holds tensors here
    name, label = "raw-disk-torch", "np.memmap per key, fed the same torch tensors (t.numpy(), clone())"


class RawRamTorchFed(_TorchFed, RawRam):  # type: ignore[misc]
    name, label = "raw-ram-torch", "np.empty + fill(0) per key, fed the same torch tensors (t.numpy(), clone())"


LIMITS = {c.name: c for c in (RawDisk, RawRam, RawDiskTorchFed, RawRamTorchFed)}
