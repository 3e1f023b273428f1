"""`CombinedBatch`: several batches of one space concatenated end to end."""
from __future__ import annotations

from unienv_data.base.common import BatchT
from unienv_interface.backends.base import BArrayType, BDeviceType, BDtypeType, BRNGType
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, Callable, List, Optional, Sequence, Tuple

import numpy as np

from unienv_data.base.common import BatchBase
from unienv_data.base.indexing import normalize_index

from . import _tree
from ._segments import SegmentIndex


class CombinedBatch(BatchBase[BatchT, BArrayType, BDeviceType, BDtypeType, BRNGType]):
    """The batches `batches` one after the other: index `i` is index `i - start(k)` of the batch `k` it falls in.

    Lengths are read on every call, so growing sources (replay buffers) stay addressable. A batch index is split
    by source, each source gets ONE read of its rows (a slice when the request is a contiguous slice), and the rows
    come back in the caller's order. With `use_thread_pool=True` the per-source reads run in a thread pool (for
    sources that block on I/O). Results are moved to `device` (default: the first batch's device).

    Every batch must have the same `single_space` and backend (wrap others in `ToBackendOrDeviceBatch` first);
    metadata is combined when every batch has the same metadata space, else dropped (`single_metadata_space` is
    None). Writes are routed to the sources and need every source to be mutable. `get_segments()` reports each
    source's segments shifted to its position (a source without segments is one segment), so windows never span
    two sources. The view never closes the batches it combines; `close()` only stops its thread pool.
    """

    def __init__(self, batches: Sequence[BatchBase], device: Any = None, use_thread_pool: bool = False) -> None:
        batches = list(batches)
        if not batches:
            raise ValueError("CombinedBatch needs at least one batch")
        for i, b in enumerate(batches):
            if not isinstance(b, BatchBase):
                raise TypeError(f"batches[{i}] must be a BatchBase, got {type(b).__name__}")
        first = batches[0]
        for i, b in enumerate(batches[1:], 1):
            if b.backend is not first.backend:
                raise ValueError(f"batches[{i}] uses backend {b.backend}, batches[0] uses {first.backend}; wrap it in "
                                 "ToBackendOrDeviceBatch first")
            if b.single_space != first.single_space:
                raise ValueError(f"batches[{i}] has space {b.single_space!r}, batches[0] has {first.single_space!r}")
        metas = [b.single_metadata_space for b in batches]
        meta = metas[0] if all(m is not None and m == metas[0] for m in metas) else None
        space = first.single_space if device is None else first.single_space.to(device=device)
        if meta is not None and device is not None:
            meta = meta.to(device=device)
        super().__init__(space, meta)
        self.batches = batches
        self.target_device = device if device is not None else first.device
        self.use_thread_pool = bool(use_thread_pool)
        self._pool: Optional[ThreadPoolExecutor] = None

    # ------------------------------------------------------------------ layout
    def _bounds(self) -> np.ndarray:
        """`[0, len(b0), len(b0) + len(b1), ...]`."""
        out = np.zeros(len(self.batches) + 1, dtype=np.int64)
        np.cumsum([len(b) for b in self.batches], out=out[1:])
        return out

    def __len__(self) -> int:
        return sum(len(b) for b in self.batches)

    @property
    def is_mutable(self) -> bool:  # type: ignore[override]
        return all(b.is_mutable for b in self.batches)

    def locate(self, idx: Any) -> Tuple[np.ndarray, np.ndarray]:
        """`(source, local_index)` arrays of the positions `idx` addresses."""
        bounds = self._bounds()
        pos = normalize_index(idx, int(bounds[-1]), type(self).__name__).positions()
        src = np.searchsorted(bounds[1:], pos, side="right")
        return src, pos - bounds[src]

    def episode_segments(self) -> List[Tuple[int, int]]:
        """Every source's segment partition (unrecorded runs included), shifted to its place."""
        out: List[Tuple[int, int]] = []
        start = 0
        for b in self.batches:
            n = len(b)
            out.extend((start + s, start + e) for s, e in SegmentIndex.of(b, n).partition())
            start += n
        return out

    def get_segments(self) -> List[Tuple[int, int]]:
        """The same as `episode_segments()` (a batch of this project; unienv 0.0.1b16 has no such method here)."""
        return self.episode_segments()

    # ------------------------------------------------------------------ reads
    def _move(self, k: int, data: Any, metadata: bool = False) -> Any:
        b = self.batches[k]
        if self.target_device is None or str(b.device) == str(self.target_device) or data is None:
            return data
        sp = b.single_metadata_space if metadata else b.single_space
        return sp.data_to(data, device=self.target_device)  # type: ignore[union-attr]

    def _run(self, jobs: Sequence[Callable[[], Any]]) -> List[Any]:
        if not self.use_thread_pool or len(jobs) < 2:
            return [j() for j in jobs]
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=min(8, len(self.batches)),
                                            thread_name_prefix="CombinedBatch")
        return [f.result() for f in [self._pool.submit(j) for j in jobs]]

    def _read(self, idx: Any, flat: bool, with_meta: bool) -> Tuple[Any, Optional[Any]]:
        bounds = self._bounds()
        total = int(bounds[-1])
        norm = normalize_index(idx, total, type(self).__name__)
        with_meta = with_meta and self.single_metadata_space is not None

        def read(k: int, local: Any) -> Tuple[Any, Optional[Any]]:
            b = self.batches[k]
            if flat:
                d, m = (b.get_flattened_at_with_metadata(local) if with_meta else (b.get_flattened_at(local), None))
            else:
                d, m = b.get_at_with_metadata(local) if with_meta else (b.get_at(local), None)
            return self._move(k, d), self._move(k, m, metadata=True)

        if norm.single is not None:
            k = int(np.searchsorted(bounds[1:], norm.single, side="right"))
            return read(k, int(norm.single - bounds[k]))
        if norm.slc is not None and norm.slc.step == 1:
            s, e = norm.slc.start, norm.slc.stop
            hit = [k for k in range(len(self.batches)) if max(s, bounds[k]) < min(e, bounds[k + 1])] or [0]
            jobs = [partial(read, k, slice(int(max(s, bounds[k]) - bounds[k]), int(min(e, bounds[k + 1]) - bounds[k])))
                    for k in hit]
            return self._combine(self._run(jobs), None)
        pos = norm.positions()
        src = np.searchsorted(bounds[1:], pos, side="right")
        local = pos - bounds[src]
        if pos.shape[0] == 0:
            return read(0, local)
        if (src == src[0]).all():
            return read(int(src[0]), local)
        order = np.argsort(src, kind="stable")
        src_sorted = src[order]
        ks = np.unique(src_sorted)
        starts = np.searchsorted(src_sorted, ks, side="left")
        ends = np.searchsorted(src_sorted, ks, side="right")
        parts = self._run([partial(read, int(k), local[order[int(a):int(z)]]) for k, a, z in zip(ks, starts, ends)])
        if (np.diff(src) >= 0).all():        # already grouped by source: the parts are in the caller's order
            return self._combine(parts, None)
        inverse = np.empty_like(order)
        inverse[order] = np.arange(order.shape[0], dtype=order.dtype)
        return self._combine(parts, inverse)

    def _combine(self, parts: List[Tuple[Any, Optional[Any]]], inverse: Optional[np.ndarray]) -> Tuple[Any, Optional[Any]]:
        data = _tree.concat_leaves([p[0] for p in parts], self.backend)
        meta = None if parts[0][1] is None else _tree.concat_leaves([p[1] for p in parts], self.backend)
        if inverse is not None:
            data = _tree.take_rows(data, inverse, self.backend)
            if meta is not None:
                meta = _tree.take_rows(meta, inverse, self.backend)
        return data, meta

    def get_at(self, idx: Any) -> Any:
        return self._read(idx, flat=False, with_meta=False)[0]

    def get_at_with_metadata(self, idx: Any) -> Tuple[Any, Optional[Any]]:
        return self._read(idx, flat=False, with_meta=True)

    def get_flattened_at(self, idx: Any) -> Any:
        return self._read(idx, flat=True, with_meta=False)[0]

    def get_flattened_at_with_metadata(self, idx: Any) -> Tuple[Any, Optional[Any]]:
        return self._read(idx, flat=True, with_meta=True)

    # ------------------------------------------------------------------ writes
    def _write(self, idx: Any, value: Any, flat: bool) -> None:
        if not self.is_mutable:
            raise NotImplementedError("CombinedBatch: not every source batch is mutable")
        bounds = self._bounds()
        norm = normalize_index(idx, int(bounds[-1]), type(self).__name__)
        if norm.single is not None:
            k = int(np.searchsorted(bounds[1:], norm.single, side="right"))
            b, local = self.batches[k], int(norm.single - bounds[k])
            b.set_flattened_at(local, value) if flat else b.set_at(local, value)
            return
        pos = norm.positions()
        src = np.searchsorted(bounds[1:], pos, side="right")
        local = pos - bounds[src]
        for k in np.unique(src).tolist():
            sel = np.flatnonzero(src == k)
            b = self.batches[k]
            part = _tree.take_rows(value, sel, self.backend)
            if flat:
                b.set_flattened_at(local[sel], part)
            else:
                b.set_at(local[sel], part)

    def set_at(self, idx: Any, value: Any) -> None:
        """Writes through to the source batches (each gets one write of its rows)."""
        self._write(idx, value, flat=False)

    def set_flattened_at(self, idx: Any, value: Any) -> None:
        self._write(idx, value, flat=True)

    def close(self) -> None:
        """Stops the thread pool (the source batches stay open)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


__all__ = ["CombinedBatch"]
