"""Opening a dataset's data (read-only unless asked) through the library's own `load_from`: `open_dataset` and `OpenedDataset`
(rows by logical index, single keys, episodes; see the package docstring)."""
from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from unienv_data.base.closing import ClosesOnExit
from unienv_data.base.errors import StorageFormatError
from unienv_data.base.ring import logical_row, run_length

from ._records import StorageNode
from ._space_json import is_image_leaf
from ._summary import rotation
from ._walk import walk


def choose_backend(root: StorageNode, name: str = "auto") -> Any:
    """The compute backend to open a dataset with: `name` ("numpy" / "pytorch"), or for "auto" the one its
    array storages serve (PyTorch when any `PytorchTensorStorage` is found, else NumPy)."""
    if name == "auto":
        name = "pytorch" if any(n.kind == "PytorchTensorStorage" for n in root.iter()) else "numpy"
    if name == "pytorch":
        try:
            from unienv_interface.backends.pytorch import PyTorchComputeBackend
        except ImportError as exc:
            raise ModuleNotFoundError(f"this dataset is stored with PyTorch tensors; install the extra: pip install "
                                      f"'unienv-storage[torch]' ({exc})") from None
        return PyTorchComputeBackend
    if name == "numpy":
        from unienv_interface.backends import NumpyComputeBackend
        return NumpyComputeBackend
    raise ValueError(f"backend must be 'auto', 'numpy' or 'pytorch', got {name!r}")


def flatten_tree(value: Any, prefix: Tuple[str, ...] = ()) -> Dict[str, Any]:
    """`{key path: leaf}` of a nested dict (tuples and lists index their entries)."""
    if isinstance(value, dict):
        out: Dict[str, Any] = {}
        for k, v in value.items():
            out.update(flatten_tree(v, prefix + (str(k),)))
        return out
    if isinstance(value, (tuple, list)) and not hasattr(value, "shape"):
        out = {}
        for i, v in enumerate(value):
            out.update(flatten_tree(v, prefix + (str(i),)))
        return out
    return {"/".join(prefix) or "<value>": value}


def _space_leaves(space: Any, prefix: Tuple[str, ...] = ()) -> Dict[str, Any]:
    from unienv_interface.space import DictSpace, TupleSpace
    if isinstance(space, DictSpace):
        out: Dict[str, Any] = {}
        for k, v in space.spaces.items():
            out.update(_space_leaves(v, prefix + (str(k),)))
        return out
    if isinstance(space, TupleSpace):
        out = {}
        for i, v in enumerate(space.spaces):
            out.update(_space_leaves(v, prefix + (str(i),)))
        return out
    return {"/".join(prefix) or "<value>": space}


def storage_columns(storage: Any) -> List[Tuple[Any, Tuple[str, ...], List[str]]]:
    """`(child storage, key prefix of its values, leaf keys it holds)` per child of a `DictStorage` (so a read of
    some keys gathers only the children holding them); one entry for the whole storage otherwise."""
    from unienv_data.storages.dict_storage import DictStorage
    if not isinstance(storage, DictStorage):
        return [(storage, (), list(_space_leaves(storage.single_instance_space)))]
    sep = storage.nested_separator
    groups = storage.groups
    out = []
    for key, child in storage.storages.items():
        if key in groups:
            prefix: Tuple[str, ...] = ()
        else:
            parts = tuple(key.split(sep))
            prefix = parts[:-1] if parts[-1] == "*" else parts
        out.append((child, prefix, list(_space_leaves(child.single_instance_space, prefix))))
    return out


class OpenedDataset(ClosesOnExit):
    """A dataset opened read-only: rows by logical index, single keys, episodes (see the module docstring)."""

    def __init__(self, path: str, root: StorageNode, obj: Any, backend: Any) -> None:
        self.path = path
        self.root = root
        self.obj = obj
        self.backend = backend
        self.is_buffer = root.kind == "ReplayBuffer"
        self.storage = obj.storage if self.is_buffer else obj
        self.space = obj.single_space if self.is_buffer else obj.single_instance_space
        self.capacity: Optional[int] = self.storage.capacity
        self._rot = 0 if self.is_buffer else rotation(root.runs, self.capacity)
        self.leaf_spaces: Dict[str, Any] = _space_leaves(self.space)
        self._columns = storage_columns(self.storage)

    def __len__(self) -> int:
        return len(self.obj)

    @property
    def kind(self) -> str:
        return self.root.kind

    def episodes(self) -> List[Tuple[int, int]]:
        """Recorded episodes as logical half-open ranges, oldest first."""
        if self.is_buffer:
            return sorted(self.obj.episode_segments() or [])
        segs = self.storage.episode_segments() or []
        cap = self.capacity
        runs = [(s, run_length(s, e, cap or None)) for s, e in segs]
        return sorted((logical_row(self._rot, s, cap or None), logical_row(self._rot, s, cap or None) + n)
                      for s, n in runs)

    def physical(self, logical: np.ndarray) -> np.ndarray:
        """Storage rows of logical indices (an int64 array)."""
        idx = np.asarray(logical, dtype=np.int64)
        if self.is_buffer:
            phys = self.obj.index_with_offset(idx)
            if isinstance(phys, slice):
                return np.arange(phys.start, phys.stop, phys.step or 1, dtype=np.int64)
            return np.asarray(phys, dtype=np.int64)
        if self.capacity and self._rot:
            return (idx + self._rot) % self.capacity
        return idx

    def image_keys(self) -> List[str]:
        """Leaf keys holding camera frames (see `is_image_leaf`)."""
        from unienv_interface.space.space_utils.serialization_utils import space_to_json
        out = []
        for k, sp in self.leaf_spaces.items():
            try:
                js = space_to_json(sp)
            except (TypeError, ValueError):
                continue
            if is_image_leaf(js):
                out.append(k)
        return out

    def columns(self) -> List[Tuple[Any, Tuple[str, ...], List[str]]]:
        """`(storage, key prefix of its values, leaf keys it holds)` for each child storage of a `DictStorage`
        (one entry for the whole storage otherwise); rows of these storages are physical rows."""
        return list(self._columns)

    def read(self, logical: Any) -> Any:
        """Samples at logical indices, as the storage returns them (backend arrays in nested dicts)."""
        if self.is_buffer:
            return self.obj.get_at(logical)
        return self.storage.get(self.physical(np.asarray(logical, dtype=np.int64)))

    def read_numpy(self, logical: Any, keys: Optional[Sequence[str]] = None) -> Dict[str, np.ndarray]:
        """`{leaf key: NumPy array}` at logical indices, reading only the child storages that hold `keys`."""
        wanted = set(self.leaf_spaces) if keys is None else set(keys)
        unknown = wanted - set(self.leaf_spaces)
        if unknown:
            raise KeyError(f"no key(s) {sorted(unknown)} in the dataset; its keys are {sorted(self.leaf_spaces)}")
        phys = self.physical(np.asarray(logical, dtype=np.int64))
        out: Dict[str, np.ndarray] = {}
        for child, prefix, ckeys in self._columns:
            if not wanted.intersection(ckeys):
                continue
            for k, v in flatten_tree(child.get(phys), prefix).items():
                if k in wanted:
                    out[k] = np.asarray(self.backend.to_numpy(v))
        return out

    def close(self) -> None:
        self.obj.close()


def open_dataset(path: str, backend: str = "auto", root: Optional[StorageNode] = None,
                 read_only: bool = True) -> OpenedDataset:
    """Opens the dataset at `path` with the library's own `load_from` (see the module docstring): read-only unless
    `read_only=False` (maintenance such as removing orphan files; no other process may write it meanwhile)."""
    from unienv_data.base.registry import resolve_storage_class
    from unienv_interface.space.space_utils.serialization_utils import json_to_space
    path = os.path.abspath(os.fspath(path))
    root = root or walk(path)
    problems = [p for n in root.iter() for p in n.problems]
    if problems:
        raise StorageFormatError("the dataset's metadata is damaged: " + "; ".join(problems))
    B = choose_backend(root, backend)
    if root.kind == "ReplayBuffer":
        from unienv_data.replay_buffer import ReplayBuffer
        obj: Any = ReplayBuffer.load_from(path, backend=B, read_only=read_only)
    else:
        if root.space_json is None:
            raise StorageFormatError(f"{path}: its metadata does not record the space, so it cannot be opened "
                                     "without code (load it with <StorageClass>.load_from(path, space))")
        name = (root.storage_type if "." in root.storage_type
                else f"unienv_data.storages.{_module_of(root.kind)}.{root.kind}")
        cls = resolve_storage_class(name, root.metadata_rel or path)
        obj = cls.load_from(path, json_to_space(root.space_json, B), read_only=read_only)
    return OpenedDataset(path, root, obj, B)


def _module_of(kind: str) -> str:
    return {"DictStorage": "dict_storage", "FlattenedStorage": "flattened", "VideoStorage": "video_storage",
            "ImageStorage": "image_storage", "TransformedStorage": "transformation",
            "ToBackendOrDeviceStorage": "backend_compat", "PytorchTensorStorage": "pytorch",
            "NumpyMemmapStorage": "numpy_memmap", "NPZStorage": "npz_storage", "HDF5Storage": "hdf5",
            "ParquetStorage": "parquet"}.get(kind, kind.lower())
