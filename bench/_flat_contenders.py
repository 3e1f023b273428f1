"""The contenders of bench_flattened.py: FlattenedStorage over each inner array storage."""
from __future__ import annotations

import warnings
from typing import Any, Dict, List

import numpy as np
import torch

from _flat_workloads import KEYS, SLICE_LEN, Contender, Plan


class StorageApiOps(Contender):
    """The timed ops through the storage API (`mark_segment_start` / `append` / `mark_segment_end`, `set` of chunks,
    `get` of batches and slices), for any storage of the workload's dict space. Subclasses prepare `plan`, `steps`
    (one dict per step), `chunk_data` (`(start, end, dict)` per chunk), `rand` (batch indices as the storage takes
    them) and `own` (how a slice's leaf is copied out)."""

    plan: Plan
    steps: List[Dict[str, Any]]
    chunk_data: List[Any]
    rand: List[Any]
    own: Any

    def append_all(self, st: Any) -> int:
        steps = self.steps
        for s, e in self.plan.episodes:
            st.mark_segment_start(s)
            for i in range(s, e):
                st.append(steps[i])
            st.mark_segment_end()
        return self.plan.n

    def bulk_all(self, st: Any) -> int:
        for s, e, chunk in self.chunk_data:
            st.set(slice(s, e), chunk)
        return self.plan.n

    def batch_all(self, st: Any) -> int:
        for idx in self.rand:
            st.get(idx)
        return len(self.rand)

    def slice_all(self, st: Any) -> int:
        own = self.own
        for o in self.plan.offsets.tolist():
            {k: own(v) for k, v in st.get(slice(o, o + SLICE_LEN)).items()}
        return len(self.plan.offsets)

    def close(self, st: Any) -> None:
        st.close()


class Flat(StorageApiOps):
    """FlattenedStorage over an inner array storage."""

    backend = "pytorch"
    is_memmap = True

    def __init__(self) -> None:
        from unienv_data.storages.flattened import FlattenedStorage
        self.FlattenedStorage = FlattenedStorage
        self.caught: List[str] = []

    def inner_cls(self) -> type:
        raise NotImplementedError

    def make_space(self) -> Any:
        from unienv_interface.space import BinarySpace, BoxSpace, DictSpace
        if self.backend == "pytorch":
            from unienv_interface.backends.pytorch import PyTorchComputeBackend as B
            dt: Dict[str, Any] = {"float32": torch.float32, "bool": torch.bool}
            dev: Any = "cpu"
        else:
            from unienv_interface.backends.numpy import NumpyComputeBackend as B
            dt = {"float32": np.float32, "bool": np.bool_}
            dev = None
        bounds = {"action": (-1.0, 1.0)}
        spaces = {}
        for name, shape, dtype in KEYS:
            if dtype == "bool":
                spaces[name] = BinarySpace(B, shape=shape, dtype=dt[dtype], device=dev)
            else:
                lo, hi = bounds.get(name, (-np.inf, np.inf))
                spaces[name] = BoxSpace(B, lo, hi, dt[dtype], shape=shape, device=dev)
        return DictSpace(B, spaces, device=dev)

    def prepare(self, plan: Plan) -> None:
        self.plan = plan
        self.space = self.make_space()
        src: Dict[str, Any]
        self.rand: List[Any]
        if self.backend == "pytorch":
            src = {k: torch.from_numpy(plan.data[k]) for k in plan.keys}      # zero-copy views
            self.rand = [torch.from_numpy(np.ascontiguousarray(r)) for r in plan.rand]
            self.own = lambda v: v.clone()
            self.to_np = lambda v: v.numpy()
        else:
            src = {k: plan.data[k] for k in plan.keys}
            self.rand = [np.ascontiguousarray(r) for r in plan.rand]
            self.own = lambda v: np.array(v, copy=True)
            self.to_np = np.asarray
        self.steps = [{k: t[i] for k, t in src.items()} for i in range(plan.n)]
        self.chunk_data = [(s, e, {k: t[s:e] for k, t in src.items()}) for s, e in plan.chunks]

    def create(self, path: str) -> Any:
        with warnings.catch_warnings(record=True) as got:
            warnings.simplefilter("always")
            st = self.FlattenedStorage.create(self.space, self.inner_cls(), capacity=self.plan.n,
                                              cache_path=path if self.is_memmap else None, is_memmap=self.is_memmap)
        for w in got:
            msg = f"{w.category.__name__}: {w.message}"
            if msg not in self.caught:
                self.caught.append(msg)
        return st

    def reopen(self, st: Any, path: str) -> Any:
        st.dumps(path)
        st.close()
        kwargs = {} if self.is_memmap else {"is_memmap": False}
        st2 = self.FlattenedStorage.load_from(path, self.space, **kwargs)
        st2.get(self.rand[0])
        return st2

    def read(self, st: Any, idx: np.ndarray) -> Dict[str, np.ndarray]:
        native = torch.from_numpy(idx) if self.backend == "pytorch" else idx
        return {k: self.to_np(v) for k, v in st.get(native).items()}

class FlatTorchMemmap(Flat):
    name, label, medium, limit = "torch-memmap", "FlattenedStorage(PytorchTensorStorage, memmap)", "disk", "raw-disk"
    same_limit = "raw-disk-torch"

    def inner_cls(self) -> type:
        from unienv_data.storages.pytorch import PytorchTensorStorage
        return PytorchTensorStorage


class FlatTorchRam(FlatTorchMemmap):
    name, label, medium, limit = "torch-ram", "FlattenedStorage(PytorchTensorStorage, RAM)", "ram", "raw-ram"
    same_limit = "raw-ram-torch"
    is_memmap = False


class FlatNumpyMemmap(Flat):
    name, label, medium, limit = "numpy-memmap", "FlattenedStorage(NumpyMemmapStorage, memmap)", "disk", "raw-disk"
    backend = "numpy"

    def inner_cls(self) -> type:
        from unienv_data.storages.numpy_memmap import NumpyMemmapStorage
        return NumpyMemmapStorage


CONFIGS = {c.name: c for c in (FlatTorchMemmap, FlatTorchRam, FlatNumpyMemmap)}
