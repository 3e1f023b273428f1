"""`BatchSource`: any read-only `BatchBase` (a Minari, Hugging Face or LeRobot adapter) with the face of an
`OpenedDataset` that `convert`, `plot` and `verify` read from: `space`, `capacity`, `len`, `episodes()`,
`read(rows)`, `leaf_spaces`, `image_keys()`, `read_numpy(rows, keys)`, `close()`."""
from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from unienv_data.base.closing import ClosesOnExit
from unienv_data.base.segments import episode_segments_of


def backend_class(name: str) -> Any:
    """The compute backend of `--backend` for a source of another tool ("auto": NumPy)."""
    if name == "pytorch":
        from unienv_interface.backends.pytorch import PyTorchComputeBackend
        return PyTorchComputeBackend
    from unienv_interface.backends import NumpyComputeBackend
    return NumpyComputeBackend


def folder_bytes(path: str) -> int:
    """Bytes of every file under `path` (a file's own size for a file)."""
    if os.path.isfile(path):
        return os.path.getsize(path)
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.path.getsize(os.path.join(root, f))
            except OSError:
                pass
    return total


class BatchSource(ClosesOnExit):
    """`batch` read as a dataset: its rows in order, its `get_segments()` as the episodes (none when it has no
    segment information), no fixed capacity.

    What the format's opener knows besides: `fps` (frames per second of its cameras; a `native-video` copy records
    it), `format_version` (the other tool's version of the files), `details` (format-specific facts `info` shows:
    tasks, robot type, ...) and `problems` (inconsistencies found on opening that `verify` and `info` report)."""

    def __init__(self, batch: Any, path: str, kind: str, fps: Optional[float] = None,
                 format_version: Optional[str] = None, details: Optional[Dict[str, Any]] = None,
                 problems: Optional[List[str]] = None) -> None:
        self.batch = batch
        self.path = path
        self.kind = kind
        self.fps = fps
        self.format_version = format_version
        self.details: Dict[str, Any] = dict(details or {})
        self.problems: List[str] = list(problems or [])
        self.space = batch.single_space
        self.backend = batch.backend
        self.capacity: Optional[int] = None
        from unienv_data.inspect import flatten_tree
        from unienv_data.inspect._open import _space_leaves
        self._flatten = flatten_tree
        self.leaf_spaces: Dict[str, Any] = _space_leaves(self.space)

    def __len__(self) -> int:
        return len(self.batch)

    def episodes(self) -> List[Tuple[int, int]]:
        segs = episode_segments_of(self.batch)
        return sorted((int(s), int(e)) for s, e in (segs or []))

    def read(self, rows: Any) -> Any:
        return self.batch.get_at(np.asarray(rows, dtype=np.int64))

    def image_keys(self) -> List[str]:
        """Leaf keys holding camera frames (see `unienv_data.inspect.is_image_leaf`)."""
        from unienv_data.inspect import is_image_leaf
        from unienv_interface.space.space_utils.serialization_utils import space_to_json
        out = []
        for k, sp in self.leaf_spaces.items():
            try:
                if is_image_leaf(space_to_json(sp)):
                    out.append(k)
            except (TypeError, ValueError):
                continue
        return out

    def read_numpy(self, rows: Any, keys: Optional[Sequence[str]] = None) -> Dict[str, np.ndarray]:
        """`{leaf key: NumPy array}` of `rows`."""
        wanted = list(self.leaf_spaces) if keys is None else list(keys)
        unknown = [k for k in wanted if k not in self.leaf_spaces]
        if unknown:
            raise KeyError(f"no key(s) {unknown} in the dataset; its keys are {sorted(self.leaf_spaces)}")
        tops = sorted({k.split("/", 1)[0] for k in wanted})
        out: Dict[str, np.ndarray] = {}
        idx = np.asarray(rows, dtype=np.int64)
        for top in tops:
            value = {top: self.batch.get_column([top]).get_at(idx)}   # reads only that field
            for k, v in self._flatten(value).items():
                if k in wanted:
                    out[k] = v if isinstance(v, np.ndarray) and v.dtype == object else np.asarray(self.backend.to_numpy(v))
        return out

    def total_bytes(self) -> int:
        return folder_bytes(self.path)

    def close(self) -> None:
        self.batch.close()


__all__ = ["BatchSource", "backend_class", "folder_bytes"]
