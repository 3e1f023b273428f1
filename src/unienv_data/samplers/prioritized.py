"""Prioritized experience replay: `SumTree` (NumPy) and `PrioritizedSampler`.

Probabilities and weights. Sample `i` is drawn with probability `P(i) = q_i / sum_j q_j`, where
`q_i = (p_i + eps) ** alpha` and `p_i` is its priority (`alpha = 0` is uniform). New samples get the largest
priority given so far (`max_priority`, initially 1.0), so each is likely to be seen once before its priority is
known. Importance weights are `w_i = (N * P(i)) ** -beta`, normalised by the largest weight over the whole buffer
(`weight_normalization="buffer"`, the usual choice: weights lie in (0, 1] and do not depend on the batch) or over
the drawn batch (`"batch"`); both reduce to `(q_i / q_min) ** -beta`.

How indices map to buffer rows. Priorities are kept per *physical row* of the ring, not per logical index:
logical index 0 (the oldest sample) moves every time the ring overwrites a row, but a physical row holds the same
sample until it is overwritten. The sampler finds a ring buffer through `index_with_offset` / `offset` / `count` /
`capacity` (also behind index-preserving views such as `SliceStackedBatch`, through their `index_source`) and
converts rows to logical indices with the current offset, `(row - offset) % capacity`, only when it reads.
Each row carries a generation counter, bumped whenever the row is overwritten; `sample()` hands out *keys*
(`generation * 2**bits + row`, int64) and `update_priorities(keys, priorities)` ignores keys whose row has been
overwritten since they were drawn, so a late TD-error update never lands on the new sample in that row.
`keys_for(logical_indices)` makes keys for samples chosen by other means.

Noticing writes. Before every sample / update the sampler compares the buffer's `count` and `offset` (and, when
the buffer provides it, a monotone `total_written` counter) with what it saw last, and gives the rows written in
between the maximum priority. Without `total_written` the number of rows written is only known modulo the
capacity once the ring is full, so the sampler must be called at least once per `capacity - 1` rows written
(a write of exactly a multiple of the capacity rows between two calls would go unnoticed). A batch without a
ring (growable buffer, any other BatchBase) is keyed by index; rows past the last seen length are new; a shorter
length means the batch was cleared, and every priority restarts.

Concurrent writers (a multiprocessing buffer filled by other processes): `count` and `offset` are read one
after the other and the rows after that, so a draw that races with a ring overwrite may read a row newer than the
one its priority belongs to; its key then no longer matches and its priority update is ignored.

Cost: `update_priorities` and `sample` are O(k log n) NumPy operations (k rows, n = capacity).
"""
from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import numpy as np

from unienv_data.base.common import BatchBase, BatchSampler
from unienv_data.base.indexing import normalize_index

WEIGHT_NORMALIZATIONS = ("buffer", "batch")


class SumTree:
    """A complete binary tree over `capacity` non-negative leaf values keeping subtree sums and minima.

    `update` and `find` work on whole arrays of leaves / query points at once, in O(k log n). Leaves start at 0;
    the minimum is taken over the positive leaves (+inf when there is none).
    """

    def __init__(self, capacity: int) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, (int, np.integer)) or capacity < 1:
            raise ValueError(f"SumTree capacity must be a positive int, got {capacity!r}")
        self.capacity = int(capacity)
        self._leaves = 1 << max(0, (self.capacity - 1).bit_length())
        self._depth = self._leaves.bit_length() - 1
        self._sum = np.zeros(2 * self._leaves, dtype=np.float64)
        self._min = np.full(2 * self._leaves, np.inf, dtype=np.float64)

    @property
    def total(self) -> float:
        """Sum of all leaves."""
        return float(self._sum[1])

    @property
    def min(self) -> float:
        """Smallest positive leaf (+inf when every leaf is 0)."""
        return float(self._min[1])

    def _check_indices(self, indices: Any) -> np.ndarray:
        idx = np.asarray(indices)
        if idx.dtype.kind not in "iu":
            raise TypeError(f"SumTree indices must be integers, got dtype {idx.dtype}")
        idx = idx.astype(np.int64).reshape(-1)
        if idx.size and (idx.min() < 0 or idx.max() >= self.capacity):
            bad = idx[(idx < 0) | (idx >= self.capacity)][0]
            raise IndexError(f"SumTree index {int(bad)} is out of range for capacity {self.capacity}")
        return idx

    def get(self, indices: Any) -> np.ndarray:
        """Leaf values at `indices`."""
        return self._sum[self._check_indices(indices) + self._leaves]

    def values(self) -> np.ndarray:
        """All leaf values (a copy)."""
        return self._sum[self._leaves:self._leaves + self.capacity].copy()

    def update(self, indices: Any, values: Any) -> None:
        """Sets leaves `indices` to `values` (non-negative, finite; for repeated indices the last one wins)."""
        idx = self._check_indices(indices)
        val = np.asarray(values, dtype=np.float64)
        if val.ndim == 0:
            val = np.full(idx.shape, float(val))
        val = val.reshape(-1)
        if val.shape != idx.shape:
            raise ValueError(f"got {idx.shape[0]} indices but {val.shape[0]} values")
        if idx.size == 0:
            return
        if not np.all(np.isfinite(val)) or np.any(val < 0):
            raise ValueError("SumTree values must be finite and non-negative")
        if idx.size > 1:
            # last occurrence of each index wins
            rev_unique, rev_pos = np.unique(idx[::-1], return_index=True)
            val = val[::-1][rev_pos]
            idx = rev_unique
        self.update_unchecked(idx, val)

    def update_unchecked(self, idx: np.ndarray, val: np.ndarray) -> None:
        """`update` without its checks, for callers that made them: `idx` distinct in-range int64 indices, `val`
        finite, non-negative float64 values of the same shape."""
        nodes = idx + self._leaves
        self._sum[nodes] = val
        self._min[nodes] = np.where(val > 0, val, np.inf)
        s, m = self._sum, self._min
        s_pairs, m_pairs = s.reshape(-1, 2), m.reshape(-1, 2)      # row k holds the children of node k
        width = self._leaves
        while width > 1:
            nodes = nodes >> 1
            width >>= 1
            if nodes.size >= width:
                s[width:2 * width] = s_pairs[width:2 * width, 0] + s_pairs[width:2 * width, 1]
                m[width:2 * width] = np.minimum(m_pairs[width:2 * width, 0], m_pairs[width:2 * width, 1])
                continue
            sc = s_pairs.take(nodes, axis=0)
            s[nodes] = sc[:, 0] + sc[:, 1]
            mc = m_pairs.take(nodes, axis=0)
            m[nodes] = np.minimum(mc[:, 0], mc[:, 1])

    def clear(self) -> None:
        self._sum[:] = 0.0
        self._min[:] = np.inf

    def find(self, prefix: Any) -> np.ndarray:
        """For each query `u` in `[0, total)`: the leaf `i` with `sum(leaves[:i]) <= u < sum(leaves[:i + 1])`
        (never a zero leaf)."""
        u = np.array(prefix, dtype=np.float64).reshape(-1)
        s = self._sum
        node = np.ones(u.shape[0], dtype=np.int64)
        for _ in range(self._depth):
            node <<= 1
            lv = s.take(node)
            go_right = u >= lv
            np.subtract(u, lv, out=u, where=go_right)
            node += go_right
        bad = s.take(node) <= 0
        if bad.any():   # rounding sent a query into an empty subtree: descend again, never entering one
            node[bad] = self._find_guarded(np.array(prefix, dtype=np.float64).reshape(-1)[bad]) + self._leaves
        return node - self._leaves

    def _find_guarded(self, u: np.ndarray) -> np.ndarray:
        s = self._sum
        node = np.ones(u.shape[0], dtype=np.int64)
        for _ in range(self._depth):
            left = node << 1
            lv = s[left]
            go_right = ((u >= lv) & (s[left + 1] > 0)) | (lv <= 0)
            u = np.where(go_right, u - lv, u)
            node = left + go_right
        return node - self._leaves

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """`n` leaves drawn with probability proportional to their value (with replacement)."""
        total = self.total
        if not total > 0:
            raise ValueError("cannot sample from a SumTree whose leaves are all 0")
        return self.find(rng.random(n) * total)


def _ring_of(data: Any) -> Optional[Any]:
    """The ring buffer behind `data` (itself or through index-preserving views), or None."""
    b = data
    for _ in range(64):
        if b is None:
            return None
        if all(hasattr(b, a) for a in ("index_with_offset", "offset", "count", "capacity")):
            return b
        b = getattr(b, "index_source", None)
    return None


class PrioritizedSampler(BatchSampler[Any, Any, Any, Any, Any, Any, Any, Any, Any, Any]):
    """Draws `batch_size` samples of `data` with probability by priority (see the module docstring).

    `sample()` returns `(batch, info)`; `info["index"]` holds the keys to pass to `update_priorities`,
    `info["logical_index"]` the logical indices that were read, and `info["weight"]` the importance weights
    (float32 backend array on the data's device). `beta` may be changed between calls (annealing); `alpha` too
    (every leaf is recomputed).
    """

    def __init__(self, data: BatchBase, batch_size: int, alpha: float = 0.6, beta: float = 0.4, eps: float = 1e-6,
                 seed: Optional[int] = None, *, max_priority: float = 1.0, weight_normalization: str = "buffer",
                 device: Any = None) -> None:
        super().__init__(data.single_space, getattr(data, "single_metadata_space", None), batch_size)
        if not (np.isfinite(alpha) and alpha >= 0):
            raise ValueError(f"alpha must be a finite number >= 0, got {alpha!r}")
        if not (np.isfinite(beta) and beta >= 0):
            raise ValueError(f"beta must be a finite number >= 0, got {beta!r}")
        if not (np.isfinite(eps) and eps >= 0):
            raise ValueError(f"eps must be a finite number >= 0, got {eps!r}")
        if not (np.isfinite(max_priority) and max_priority > 0):
            raise ValueError(f"max_priority must be a finite number > 0, got {max_priority!r}")
        if weight_normalization not in WEIGHT_NORMALIZATIONS:
            raise ValueError(f"weight_normalization must be one of {WEIGHT_NORMALIZATIONS}, got {weight_normalization!r}")
        self.data = data
        self._alpha = float(alpha)
        self.beta = float(beta)
        self.eps = float(eps)
        self.max_priority = float(max_priority)
        self.weight_normalization = weight_normalization
        self.device_out = device
        self.np_rng = np.random.default_rng(seed)
        self._ring = _ring_of(data)
        cap = None
        if self._ring is not None:
            cap = self._ring.capacity
        if cap is None:
            self._ring = None
        self._cap: Optional[int] = cap
        size = cap if cap is not None else max(1024, len(data))
        self._bits = max(1, (cap - 1).bit_length()) if cap is not None else 40
        self._gen_limit = 1 << (62 - self._bits)
        self._tree = SumTree(size)
        self._raw = np.zeros(size, dtype=np.float64)
        self._gen = np.zeros(size, dtype=np.int64)
        self._occupied = np.zeros(size, dtype=bool)
        self._seen_count = 0
        self._seen_offset = 0
        self._seen_total: Optional[int] = None
        self.sync()

    # ------------------------------------------------------------------ parameters
    @property
    def alpha(self) -> float:
        return self._alpha

    @alpha.setter
    def alpha(self, value: float) -> None:
        if not (np.isfinite(value) and value >= 0):
            raise ValueError(f"alpha must be a finite number >= 0, got {value!r}")
        self._alpha = float(value)
        rows = np.flatnonzero(self._occupied)
        self._tree.update(rows, self._leaf(self._raw[rows]))

    def manual_seed(self, seed: int) -> None:
        self.np_rng = np.random.default_rng(seed)

    def _leaf(self, raw: np.ndarray) -> np.ndarray:
        return np.power(raw + self.eps, self._alpha)

    # ------------------------------------------------------------------ keeping up with the buffer
    def _grow(self, n: int) -> None:
        size = self._tree.capacity
        if n <= size:
            return
        new = max(2 * size, n)
        tree = SumTree(new)
        rows = np.flatnonzero(self._occupied)
        tree.update(rows, self._tree.get(rows))
        self._tree = tree
        self._raw = np.concatenate([self._raw, np.zeros(new - size)])
        self._gen = np.concatenate([self._gen, np.zeros(new - size, dtype=np.int64)])
        self._occupied = np.concatenate([self._occupied, np.zeros(new - size, dtype=bool)])

    def _reset(self) -> None:
        self._tree.clear()
        self._raw[:] = 0.0
        self._occupied[:] = False
        self._gen = (self._gen + 1) % self._gen_limit

    def _add_rows(self, rows: np.ndarray) -> None:
        if rows.size == 0:
            return
        rows = np.unique(rows)
        was = self._occupied[rows]
        self._gen[rows[was]] = (self._gen[rows[was]] + 1) % self._gen_limit
        self._occupied[rows] = True
        self._raw[rows] = self.max_priority
        self._tree.update_unchecked(rows, self._leaf(np.full(rows.shape[0], self.max_priority)))

    def sync(self) -> None:
        """Gives rows written since the last call the maximum priority (called by every sample / update)."""
        if self._ring is None:
            n = len(self.data)
            if n < self._seen_count:
                self._reset()
                self._seen_count = 0
            self._grow(n)
            self._add_rows(np.arange(self._seen_count, n, dtype=np.int64))
            self._seen_count = n
            return
        ring, C = self._ring, int(self._cap)  # type: ignore[arg-type]
        c1, o1 = int(ring.count), int(ring.offset)
        t1 = getattr(ring, "total_written", None)
        c0, o0, t0 = self._seen_count, self._seen_offset, self._seen_total
        if c1 < c0 or (t1 is not None and t0 is not None and int(t1) < t0):
            self._reset()
            self._add_rows((o1 + np.arange(c1, dtype=np.int64)) % C)
        else:
            if t1 is not None and t0 is not None:
                n_new = int(t1) - t0
            elif c1 < C:
                n_new = c1 - c0
            else:
                tail0, tail1 = (o0 + c0) % C, (o1 + c1) % C
                d = (tail1 - tail0) % C
                n_new = d if d >= C - c0 else d + C
            if n_new >= C or n_new >= c1:
                self._add_rows((o1 + np.arange(c1, dtype=np.int64)) % C)
            elif n_new > 0:
                self._add_rows(((o0 + c0) + np.arange(n_new, dtype=np.int64)) % C)
        self._seen_count, self._seen_offset = c1, o1
        self._seen_total = None if t1 is None else int(t1)

    # ------------------------------------------------------------------ keys
    def _rows_to_logical(self, rows: np.ndarray) -> np.ndarray:
        if self._ring is None:
            return rows
        return (rows - self._seen_offset) % int(self._cap)  # type: ignore[arg-type]

    def _keys(self, rows: np.ndarray) -> np.ndarray:
        return (self._gen[rows] << self._bits) | rows

    def keys_for(self, logical_indices: Any) -> np.ndarray:
        """Keys (for `update_priorities`) of the samples now at `logical_indices`."""
        self.sync()
        pos = normalize_index(logical_indices, self._seen_count, type(self).__name__).positions()
        rows = pos if self._ring is None else (pos + self._seen_offset) % int(self._cap)  # type: ignore[arg-type]
        return self._keys(rows)

    def logical_indices_of(self, keys: Any) -> np.ndarray:
        """Current logical index of each key's sample, or -1 where its row has since been overwritten."""
        self.sync()
        rows, ok = self._decode(keys)
        out = np.full(rows.shape[0], -1, dtype=np.int64)
        out[ok] = self._rows_to_logical(rows[ok])
        return out

    def _decode(self, keys: Any) -> Tuple[np.ndarray, np.ndarray]:
        k = np.asarray(keys if isinstance(keys, np.ndarray) else self.data.backend.to_numpy(keys)
                       if self.data.backend.is_backendarray(keys) else keys)
        if k.dtype.kind not in "iu":
            raise TypeError(f"keys must be integers (as returned by sample()), got dtype {k.dtype}")
        k = k.astype(np.int64).reshape(-1)
        if k.size and k.min() < 0:
            raise ValueError(f"keys must be non-negative (as returned by sample()), got {int(k.min())}")
        rows = k & ((1 << self._bits) - 1)
        gens = k >> self._bits
        inside = rows < self._tree.capacity
        safe = np.where(inside, rows, 0)
        ok = inside & self._occupied[safe] & (self._gen[safe] == gens)
        return rows, ok

    # ------------------------------------------------------------------ priorities
    def update_priorities(self, indices: Any, priorities: Any) -> int:
        """Sets the priorities of the samples `indices` (keys from `sample()`); returns how many were applied
        (keys of overwritten rows are skipped). Priorities must be finite and >= 0 (pass |TD error|); for a
        repeated key the last priority wins (`max_priority` still counts every applied value)."""
        self.sync()
        rows, ok = self._decode(indices)
        p = priorities if isinstance(priorities, np.ndarray) else (
            self.data.backend.to_numpy(priorities) if self.data.backend.is_backendarray(priorities) else priorities)
        pr = np.asarray(p, dtype=np.float64).reshape(-1)
        if pr.shape[0] != rows.shape[0]:
            raise ValueError(f"got {rows.shape[0]} indices but {pr.shape[0]} priorities")
        bad = ~np.isfinite(pr) | (pr < 0)
        if bad.any():
            j = int(np.flatnonzero(bad)[0])
            raise ValueError(f"priorities must be finite and >= 0; priority {pr[j]!r} at position {j} is not "
                             "(pass the absolute TD error)")
        if not ok.any():
            return 0
        rows, pr = rows[ok], pr[ok]
        self.max_priority = max(self.max_priority, float(pr.max()))
        if rows.size > 1:
            uniq, pos = np.unique(rows[::-1], return_index=True)
            rows, pr = uniq, pr[::-1][pos]
        self._raw[rows] = pr
        self._tree.update_unchecked(rows, self._leaf(pr))
        return int(rows.shape[0])

    def priorities_of(self, keys: Any) -> np.ndarray:
        """The priority (before `eps` and `alpha`) of each key's sample; NaN for overwritten rows."""
        self.sync()
        rows, ok = self._decode(keys)
        out = np.full(rows.shape[0], np.nan)
        out[ok] = self._raw[rows[ok]]
        return out

    def probabilities(self) -> np.ndarray:
        """The probability of drawing each logical index `0 .. len(data) - 1` now."""
        self.sync()
        n = self._seen_count
        rows = np.arange(n, dtype=np.int64)
        if self._ring is not None:
            rows = (rows + self._seen_offset) % int(self._cap)  # type: ignore[arg-type]
        q = self._tree.get(rows)
        total = self._tree.total
        return q / total if total > 0 else q

    # ------------------------------------------------------------------ sampling
    def sample_keys(self) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        """`(keys, logical_indices, weights)` of `batch_size` draws (NumPy arrays; weights float64)."""
        self.sync()
        if self._seen_count == 0 or not self._tree.total > 0:
            raise IndexError("cannot sample from an empty batch" if self._seen_count == 0 else
                             "every priority is 0 (use eps > 0)")
        rows = self._tree.sample(self.np_rng, self.batch_size)
        q = self._tree.get(rows)
        q_min = self._tree.min if self.weight_normalization == "buffer" else float(q.min())
        weights = np.power(q / q_min, -self.beta)
        return self._keys(rows), self._rows_to_logical(rows), weights

    def sample_index(self) -> np.ndarray:
        """Logical indices of `batch_size` prioritized draws."""
        return self.sample_keys()[1]

    def _info(self, keys: np.ndarray, logical: np.ndarray, weights: np.ndarray) -> Dict[str, Any]:
        B = self.data.backend
        w = B.from_numpy(weights.astype(np.float32), device=self.device_out if self.device_out is not None
                         else self.data.device)
        return {"index": keys, "logical_index": logical, "weight": w}

    def _move(self, data: Any) -> Any:
        if self.device_out is None:
            return data
        return self.single_space.data_to(data, device=self.device_out)

    def sample(self) -> Tuple[Any, Dict[str, Any]]:
        """`(batch, info)` with `info["index"]` (keys), `info["logical_index"]` and `info["weight"]`."""
        keys, logical, weights = self.sample_keys()
        return self._move(self.data.get_at(logical)), self._info(keys, logical, weights)

    def sample_with_metadata(self) -> Tuple[Any, Dict[str, Any]]:
        """Like `sample()`, with the data's own metadata under `info["metadata"]`."""
        keys, logical, weights = self.sample_keys()
        data, meta = self.data.get_at_with_metadata(logical)
        info = self._info(keys, logical, weights)
        info["metadata"] = meta
        return self._move(data), info

    def sample_flat(self) -> Any:
        keys, logical, weights = self.sample_keys()
        return self.data.get_flattened_at(logical)

    def sample_flat_with_metadata(self) -> Tuple[Any, Dict[str, Any]]:
        keys, logical, weights = self.sample_keys()
        data, meta = self.data.get_flattened_at_with_metadata(logical)
        info = self._info(keys, logical, weights)
        info["metadata"] = meta
        return data, info


__all__ = ["SumTree", "PrioritizedSampler"]
