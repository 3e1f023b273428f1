"""`BatchSource`: any read-only `BatchBase` (a Minari, Hugging Face or LeRobot adapter) with the face of an
`OpenedDataset` that `convert` reads from: `space`, `capacity`, `len`, `episodes()`, `read(rows)`, `close()`."""
from __future__ import annotations

import os
from typing import Any, List, Optional, Tuple

import numpy as np


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


class BatchSource:
    """`batch` read as a dataset: its rows in order, its `get_segments()` as the episodes (none when it has no
    segment information), no fixed capacity."""

    def __init__(self, batch: Any, path: str, kind: str) -> None:
        self.batch = batch
        self.path = path
        self.kind = kind
        self.space = batch.single_space
        self.backend = batch.backend
        self.capacity: Optional[int] = None

    def __len__(self) -> int:
        return len(self.batch)

    def episodes(self) -> List[Tuple[int, int]]:
        fn = getattr(self.batch, "get_segments", None)
        segs = None if fn is None else fn()
        return sorted((int(s), int(e)) for s, e in (segs or []))

    def read(self, rows: Any) -> Any:
        return self.batch.get_at(np.asarray(rows, dtype=np.int64))

    def total_bytes(self) -> int:
        return folder_bytes(self.path)

    def close(self) -> None:
        self.batch.close()

    def __enter__(self) -> "BatchSource":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


__all__ = ["BatchSource", "folder_bytes"]
