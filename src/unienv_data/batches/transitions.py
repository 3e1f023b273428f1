"""Transition targets read from the following rows of the same episode, so nothing is stored twice:
`NextObservationBatch` (the next observation) and `NStepReturnBatch` (TorchRL `MultiStep`-like n-step returns).

Layout assumed. Row `t` holds the observation `o_t`, the action taken at `t`, and the reward and flags that action
produced (`r_t`, `terminated_t`, optionally `truncated_t`). The next observation `o_{t+1}` is then row `t + 1` of
the same episode (episodes are the source's segments, see `_segments.py`).

The last row of an episode has no following row: its next observation is not stored. Such rows get
`next_valid = False` and `next_<obs>` holds their own observation (a placeholder, never another episode's data).
When that last step is terminal this is harmless: the target does not bootstrap (`n_step_discount` is 0). When the
episode was cut (time limit, end of recording) the target cannot be formed: mask those rows out with `next_valid`,
or record the final observation as one extra row at the episode's end.
"""
from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import numpy as np

from unienv_data.base.common import BatchBase
from unienv_data.base.indexing import normalize_index
from unienv_interface.space.spaces import BinarySpace, BoxSpace, DictSpace

from . import _tree
from ._view import RowView
from ._columns import ColumnReader, KeyPath, path_name, resolve_key
from ._segments import SegmentCache, check_unrecorded


def _key_name(key: Any, path: KeyPath) -> str:
    return key if isinstance(key, str) else path_name(path)


class NextObservationBatch(RowView, BatchBase[Any, Any, Any, Any, Any]):
    """Sample `i` is sample `i` of `batch` (a dict) plus `next_<obs>`, the observation of row `i + 1` when it is in
    the same episode, and `next_valid` (False on an episode's last row; see the module docstring).

    `observation_key`: the observation field (a key or `"a/b"` path; a sub-dict works). `next_key`: the output
    name (default `"next_" + observation_key`). Read-only; each read makes one read of the rows and one read of the
    observation field at the following rows. Never closes `batch`."""

    is_mutable = False

    def __init__(self, batch: BatchBase, observation_key: Any = "observation", next_key: Optional[str] = None, *,
                 unrecorded: str = "run") -> None:
        if not isinstance(batch, BatchBase):
            raise TypeError(f"batch must be a BatchBase, got {type(batch).__name__}")
        if not isinstance(batch.single_space, DictSpace):
            raise TypeError(f"{type(self).__name__} adds fields to each sample, so the batch's samples must be dicts "
                            f"(a DictSpace), got {type(batch.single_space).__name__}")
        self.batch = batch
        self.obs_path = resolve_key(batch.single_space, observation_key)
        self.next_key = next_key or "next_" + _key_name(observation_key, self.obs_path)
        self.unrecorded = check_unrecorded(unrecorded)
        fields = dict(self._extra_fields())
        clash = [k for k in fields if k in batch.single_space.spaces]
        if clash:
            raise ValueError(f"the batch's samples already have the key(s) {clash}; pick another next_key")
        super().__init__(DictSpace(batch.backend, {**batch.single_space.spaces, **fields}, device=batch.device),
                         batch.single_metadata_space)
        self._seg_cache = SegmentCache(self.unrecorded)
        self._obs_reader = ColumnReader(batch, [self.obs_path])

    def _extra_fields(self) -> Dict[str, Any]:
        B = self.batch.backend
        return {self.next_key: _tree.sub_space(self.batch.single_space, self.obs_path),
                "next_valid": BinarySpace(B, (), device=self.batch.device)}

    def _bounds(self, anchors: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        return self._seg_cache.get(self.batch).bounds(anchors)

    def get_at(self, idx: Any) -> Any:
        return self.get_at_with_metadata(idx)[0]

    def get_at_with_metadata(self, idx: Any) -> Tuple[Any, Optional[Any]]:
        norm = normalize_index(idx, len(self.batch), type(self).__name__)
        a = norm.positions()
        data, meta = self.batch.get_at_with_metadata(a)
        data = dict(data)
        data.update(self._extras(a))
        if norm.single is not None:
            data = _tree.take_row(data, 0)
            meta = None if meta is None else _tree.take_row(meta, 0)
        return data, meta

    def _extras(self, a: np.ndarray) -> Dict[str, Any]:
        _, e = self._bounds(a)
        valid = a + 1 < e
        nxt = np.where(valid, a + 1, a)
        obs = self._obs_reader.read({self.obs_path: nxt})[self.obs_path]
        return {self.next_key: obs, "next_valid": self.backend.from_numpy(valid, device=self.device)}


class NStepReturnBatch(NextObservationBatch):
    """Sample `i` is sample `i` of `batch` plus its n-step target, like TorchRL's `MultiStep`:

    * `n_step_return`: `sum_{k<m} gamma**k * r_{i+k}`, over `m` steps: `n`, or fewer where the episode ends first
      (its last row, a `terminated` step, or a `truncated` step: the sum includes that step and stops);
    * `n_step_count`: that effective `m` (1..n);
    * `n_step_done`: a terminal step is among the summed ones (the target does not bootstrap);
    * `n_step_discount`: `gamma**m`, or 0 when `n_step_done` (so the target is `return + discount * V(next)`);
    * `next_<obs>`: the observation of row `i + m`; `next_valid`: whether that row exists in the episode and no
      terminal / truncation flag ended it first (False: `next_<obs>` is a placeholder, see the module docstring).

    `reward_key`, `terminated_key` (None: no terminal flags), `truncated_key` (None by default): field names (keys or
    `"a/b"` paths). The sum is computed in float64 and returned as the reward's float dtype (float32 for integer
    rewards). Each read makes one read of the rows, one of the rewards (and one per flag) for the `n` following
    rows, and one of the next observations."""

    def __init__(self, batch: BatchBase, n: int, gamma: float, *, reward_key: Any = "reward",
                 terminated_key: Optional[Any] = "terminated", truncated_key: Optional[Any] = None,
                 observation_key: Any = "observation", next_key: Optional[str] = None, unrecorded: str = "run") -> None:
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
            raise ValueError(f"n must be a positive int (steps summed), got {n!r}")
        if isinstance(gamma, bool) or not isinstance(gamma, (int, float, np.floating)) or not 0.0 <= gamma <= 1.0:
            raise ValueError(f"gamma must be a float in [0, 1], got {gamma!r}")
        if not isinstance(batch, BatchBase):
            raise TypeError(f"batch must be a BatchBase, got {type(batch).__name__}")
        self.n = int(n)
        self.gamma = float(gamma)
        space = batch.single_space
        self.reward_path = resolve_key(space, reward_key)
        try:
            self.terminated_path = None if terminated_key is None else resolve_key(space, terminated_key)
        except KeyError as exc:
            raise KeyError(f"{exc.args[0]}; pass terminated_key=None when the data has no terminal flags") from None
        self.truncated_path = None if truncated_key is None else resolve_key(space, truncated_key)
        rdt = np.dtype(batch.backend.numpy_dtype(_tree.sub_space(space, self.reward_path).dtype))  # type: ignore[attr-defined]
        self._ret_dtype = rdt if rdt.kind == "f" else np.dtype(np.float32)
        super().__init__(batch, observation_key, next_key, unrecorded=unrecorded)
        paths = [self.reward_path] + [p for p in (self.terminated_path, self.truncated_path) if p is not None]
        self._step_reader = ColumnReader(batch, paths)

    def _extra_fields(self) -> Dict[str, Any]:
        B, dev = self.batch.backend, self.batch.device
        fields = super()._extra_fields()
        fdt = B.dtype_from_name(self._ret_dtype.name)
        fields.update({
            "n_step_return": BoxSpace(B, -np.inf, np.inf, fdt, device=dev, shape=()),
            "n_step_count": BoxSpace(B, 1, self.n, B.dtype_from_name("int64"), device=dev, shape=()),
            "n_step_done": BinarySpace(B, (), device=dev),
            "n_step_discount": BoxSpace(B, 0.0, 1.0, fdt, device=dev, shape=()),
        })
        return fields

    def _flags(self, got: Dict[KeyPath, Any], path: Optional[KeyPath], shape: Tuple[int, int]) -> np.ndarray:
        if path is None:
            return np.zeros(shape, dtype=bool)
        arr = np.asarray(self.backend.to_numpy(got[path])).reshape(shape[0] * shape[1], -1).any(axis=1)
        return arr.reshape(shape)

    def _extras(self, a: np.ndarray) -> Dict[str, Any]:
        s, e = self._bounds(a)
        B_, n = int(a.shape[0]), self.n
        f = a[:, None] + np.arange(n, dtype=np.int64)[None, :]
        inside = f < e[:, None]
        rows = np.clip(f, s[:, None], e[:, None] - 1).reshape(-1)
        want = {p: rows for p in self._step_reader.paths}
        got = self._step_reader.read(want)
        r = np.asarray(self.backend.to_numpy(got[self.reward_path]), dtype=np.float64).reshape(B_, n, -1)
        if r.shape[2] != 1:
            raise ValueError(f"reward {path_name(self.reward_path)!r} must hold one number per step, got shape "
                             f"{r.shape[2:]} per step")
        term = self._flags(got, self.terminated_path, (B_, n)) & inside
        trunc = self._flags(got, self.truncated_path, (B_, n)) & inside
        stop = term | trunc
        before: np.ndarray = np.cumsum(stop, axis=1) - stop              # flags strictly before step k
        included = inside & (before == 0)
        m = included.sum(axis=1).astype(np.int64)
        done = (term & included).any(axis=1)
        flagged = (stop & included).any(axis=1)
        disc = self.gamma ** np.arange(n, dtype=np.float64)
        ret = (r[:, :, 0] * disc[None, :] * included).sum(axis=1)
        nxt_idx = a + m
        valid = (nxt_idx < e) & ~flagged
        nxt = np.where(valid, nxt_idx, a + m - 1)
        obs = self._obs_reader.read({self.obs_path: nxt})[self.obs_path]
        B, dev = self.backend, self.device
        fdt = B.dtype_from_name(self._ret_dtype.name)
        bootstrap = np.where(done, 0.0, self.gamma ** m.astype(np.float64))
        return {self.next_key: obs, "next_valid": B.from_numpy(valid, device=dev),
                "n_step_return": B.from_numpy(ret.astype(self._ret_dtype), dtype=fdt, device=dev),
                "n_step_count": B.from_numpy(m, dtype=B.dtype_from_name("int64"), device=dev),
                "n_step_done": B.from_numpy(done, device=dev),
                "n_step_discount": B.from_numpy(bootstrap.astype(self._ret_dtype), dtype=fdt, device=dev)}


__all__ = ["NextObservationBatch", "NStepReturnBatch"]
