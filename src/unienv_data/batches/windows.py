"""`WindowDataset`: training windows with per-key offsets inside an episode, with pad masks (like LeRobot's
`delta_timestamps`, in steps), as a batch, a torch ``Dataset`` and a sampler source.

```python
ds = WindowDataset(buffer, {"observation.image": [-1, 0], "action": range(16)}, pad=True)
item = ds[0]     # {"observation.image": (2, H, W, C), "action": (16, A),
                 #  "observation.image_is_pad": (2,), "action_is_pad": (16,), "index": (), "episode_index": ()}
```

Keys. See `unienv_data.batches._columns`: a top-level key is used as is (flat dotted keys such as
`"observation.image"` work), `"a/b"` names the nested key `b` of `a`, a tuple `("a", "b")` too. A key may name a
sub-dict; it is windowed as a whole. Output keys are the keys as given (tuples joined with `"/"`).

Episodes are the source's segments (`episode_segments()`, see `_segments.py`; a source without segments is one
episode). Frame `a + o` of the window anchored at `a` is a *pad* frame when it lies outside the anchor's episode:
it then holds the episode's first (before the start) or last (after the end) frame, and `<key>_is_pad` is True
there. A window never reads another episode's data.

Items. The dataset has one item per anchor. `pad=True`: every frame of every episode is an anchor. `pad=False`:
only anchors whose every window fits inside the episode (no pad frame at all; `_is_pad` is all False). Each item
also holds `"index"` (the anchor's index in the source) and `"episode_index"` (the episode's number, in order).
The anchor table is built when the dataset is made; call `refresh()` after the source grew.

Reads. A batch of items reads each key ONCE for all its `B * T` frames (a column read when the source serves the
key as a column, e.g. a `ReplayBuffer` over a `DictStorage`; else one read of whole rows shared by those keys).

Normalisation. `stats` (a dataset directory or `stats.json` path, or a dict, see `unienv_data.stats`) with
`normalize={key: mode}`: `"mean_std"` gives `(x - mean) / std`, `"min_max"` maps `[min, max]` to `[-1, 1]`,
`"quantile"` maps `[q01, q99]` to `[-1, 1]` (not clipped); the result is float32. A zero spread (std, max - min)
is replaced by 1, so a constant feature becomes 0 (or -1 for the ranges) instead of a division by zero.

Training. `len`, `ds[i]` (one item) and `ds.__getitems__(indices)` (a whole batch, one read per key) make it a
map-style torch Dataset. The recommended loader is ``shared_memory_dataloader(ds, batch_size, num_workers=N)``
(`unienv_data.integrations.torch_loader`, see docs/batches.md): its workers call `get_at_into`, which gathers the
windows of array columns straight into a shared-memory batch slot (no intermediate batch, no copy in the training
process). A plain DataLoader takes ``collate_fn=WindowDataset.collate_fn`` (batches as torch tensors, zero-copy
from NumPy). As a `BatchBase` it feeds the samplers: ``StepSampler(ds, batch_size=64, seed=0).sample()`` is a
random batch of windows.
"""
from __future__ import annotations

import os
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from unienv_data.base.common import BatchBase
from unienv_data.base.indexing import normalize_index
from unienv_interface.space import Space
from unienv_interface.space.spaces import BinarySpace, BoxSpace, DictSpace
from unienv_interface.space.space_utils import batch_utils

from . import _tree
from ._columns import ColumnReader, KeyPath, path_name, resolve_key
from ._segments import SegmentIndex, check_unrecorded

NORMALIZE_MODES = ("mean_std", "min_max", "quantile")
PAD_SUFFIX = "_is_pad"


def _offsets(key: Any, offsets: Any) -> np.ndarray:
    try:
        arr = np.asarray(list(offsets) if not isinstance(offsets, np.ndarray) else offsets)
    except TypeError:
        raise TypeError(f"windows[{key!r}] must be a sequence of int offsets (e.g. [-1, 0] or range(16)), got "
                        f"{offsets!r}") from None
    if arr.ndim != 1 or arr.shape[0] == 0:
        raise ValueError(f"windows[{key!r}] must be a non-empty 1-D sequence of int offsets, got shape {arr.shape}")
    if arr.dtype.kind not in "iu":
        raise ValueError(f"windows[{key!r}] must hold int step offsets, got {arr.tolist()!r} (dtype {arr.dtype}); "
                         "offsets count steps, not seconds")
    return arr.astype(np.int64)


class _Key:
    def __init__(self, name: str, path: KeyPath, offsets: np.ndarray, mode: Optional[str]) -> None:
        self.name = name
        self.path = path
        self.offsets = offsets
        self.mode = mode
        self.scale: Any = None
        self.shift: Any = None


class WindowDataset(BatchBase[Any, Any, Any, Any, Any]):
    """Windows of chosen keys at per-key step offsets inside each episode (see the module docstring).

    `source`: a `BatchBase` (a `ReplayBuffer`, any batch view). `windows`: `{key: int offsets}`. `pad`: anchors at
    every frame with pad masks (True) or only where every window fits (False). `stats`, `normalize`: per-key
    normalisation. `unrecorded`: how frames outside every recorded segment are grouped ("run" or "single");
    `include_unrecorded=False` anchors only in recorded (complete) episodes. Read-only; never closes `source`.
    """

    is_mutable = False

    def __init__(self, source: BatchBase, windows: Mapping[Any, Any], pad: bool = True, *,
                 stats: Any = None, normalize: Optional[Mapping[Any, str]] = None, unrecorded: str = "run",
                 include_unrecorded: bool = True) -> None:
        if not isinstance(source, BatchBase):
            raise TypeError(f"source must be a BatchBase (a ReplayBuffer or a batch view), got {type(source).__name__}")
        if not isinstance(windows, Mapping) or not windows:
            raise ValueError("windows must be a non-empty mapping {key: offsets}, e.g. {'action': range(16)}")
        self.source = source
        self.pad = bool(pad)
        self.unrecorded = check_unrecorded(unrecorded)
        self.include_unrecorded = bool(include_unrecorded)
        normalize = dict(normalize or {})
        keys: List[_Key] = []
        for key, offs in windows.items():
            path = resolve_key(source.single_space, key)
            name = key if isinstance(key, str) else path_name(path)
            keys.append(_Key(name, path, _offsets(key, offs), None))
        by_name = {k.name: k for k in keys}
        for nkey, mode in normalize.items():
            name = nkey if isinstance(nkey, str) else path_name(resolve_key(source.single_space, nkey))
            if name not in by_name:
                raise KeyError(f"normalize names {nkey!r}, which is not one of the windowed keys {list(by_name)}")
            if mode not in NORMALIZE_MODES:
                raise ValueError(f"normalize[{nkey!r}] must be one of {NORMALIZE_MODES}, got {mode!r}")
            by_name[name].mode = mode
        self.keys = keys
        if any(k.mode for k in keys):
            if stats is None:
                raise ValueError("normalize needs stats: pass stats=<dataset dir or stats.json> (write it with "
                                 "`unienv-data stats PATH` or unienv_data.stats.compute_stats)")
            self._prepare_normalization(stats, source)
        names = [k.name for k in keys] + [k.name + PAD_SUFFIX for k in keys] + ["index", "episode_index"]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"the output keys {dup} would collide; rename or drop the windowed key(s)")
        B, dev = source.backend, source.device
        i64 = B.dtype_from_name("int64")
        fields: Dict[str, Space] = {}
        for k in keys:
            T = int(k.offsets.shape[0])
            sub = _tree.sub_space(source.single_space, k.path)
            if k.mode is not None:
                f32 = B.dtype_from_name("float32")
                sub = BoxSpace(B, -np.inf, np.inf, f32, device=dev, shape=tuple(sub.shape or ()))  # type: ignore[attr-defined]
            fields[k.name] = batch_utils.batch_space(sub, T)
        for k in keys:
            fields[k.name + PAD_SUFFIX] = BinarySpace(B, (int(k.offsets.shape[0]),), device=dev)
        fields["index"] = BoxSpace(B, 0, np.iinfo(np.int64).max, i64, device=dev, shape=())
        fields["episode_index"] = BoxSpace(B, 0, np.iinfo(np.int64).max, i64, device=dev, shape=())
        super().__init__(DictSpace(B, fields, device=dev), None)
        self._reader = ColumnReader(source, [k.path for k in keys])
        self.refresh()

    # ------------------------------------------------------------------ setup
    def _prepare_normalization(self, stats: Any, source: BatchBase) -> None:
        from unienv_data.stats import as_stats
        from unienv_data.stats import stats_path
        table = as_stats(stats)
        where = (stats_path(stats) if isinstance(stats, (str, os.PathLike)) else "the statistics given as a dict")
        B, dev = source.backend, source.device
        f32 = B.dtype_from_name("float32")
        for k in self.keys:
            if k.mode is None:
                continue
            sub = _tree.sub_space(source.single_space, k.path)
            if not isinstance(sub, (BoxSpace, BinarySpace)):
                raise TypeError(f"normalize[{k.name!r}]: only array leaves can be normalised, the key holds a "
                                f"{type(sub).__name__}")
            sname = path_name(k.path)
            if sname not in table:
                raise KeyError(f"normalize[{k.name!r}]: {where} has no feature {sname!r} (it has {sorted(table)}); "
                               "compute statistics of this dataset with `unienv-data stats PATH`")
            st = table[sname]
            if k.mode == "mean_std":
                lo, spread = st["mean"], st["std"]
                shift, scale = lo, np.where(spread > 0, spread, 1.0)
            else:
                lo, hi = (st["min"], st["max"]) if k.mode == "min_max" else (st["q01"], st["q99"])
                spread = hi - lo
                half = np.where(spread > 0, spread, 2.0) / 2.0
                shift, scale = lo + half, half
            shape = tuple(sub.shape or ())
            # what compute_stats writes for this leaf: per entry up to 1 axis, per entry of the last axis above
            fits = {shape, shape if len(shape) <= 1 else shape[-1:]}
            if tuple(np.shape(shift)) not in fits:
                raise ValueError(f"normalize[{k.name!r}]: {where} holds {sname!r} statistics of shape "
                                 f"{tuple(np.shape(shift))}, but the key's leaf shape is {shape} (statistics of "
                                 f"shape {' or '.join(str(f) for f in sorted(fits))} fit); these statistics belong "
                                 "to another dataset: compute this one's with `unienv-data stats PATH`")
            k.shift = B.from_numpy(np.asarray(shift, np.float32), dtype=f32, device=dev)
            k.scale = B.from_numpy(np.asarray(scale, np.float32), dtype=f32, device=dev)

    def refresh(self) -> None:
        """Rebuilds the anchor table from the source's current length and segments."""
        n = len(self.source)
        seg = SegmentIndex.of(self.source, n, self.unrecorded)
        starts, ends = seg.pieces(self.include_unrecorded)
        lo_off = min(0, min(int(k.offsets.min()) for k in self.keys))
        hi_off = max(0, max(int(k.offsets.max()) for k in self.keys))
        if self.pad:
            a_lo, a_hi = starts, ends
        else:
            a_lo, a_hi = starts - lo_off, ends - hi_off
        counts = np.maximum(a_hi - a_lo, 0)
        total = int(counts.sum())
        ep = np.repeat(np.arange(starts.shape[0], dtype=np.int64), counts)
        first = np.repeat(np.cumsum(counts) - counts, counts)
        self._anchors = (np.repeat(a_lo, counts) + (np.arange(total, dtype=np.int64) - first)).astype(np.int64)
        self._episode = ep
        self._ep_start = starts[ep].astype(np.int64)
        self._ep_end = ends[ep].astype(np.int64)
        self.episodes = np.stack([starts, ends], axis=1).astype(np.int64) if starts.size else np.zeros((0, 2), np.int64)

    # ------------------------------------------------------------------ basics
    def __len__(self) -> int:
        return int(self._anchors.shape[0])

    @property
    def anchors(self) -> np.ndarray:
        """The source index of every item's anchor frame."""
        return self._anchors

    @property
    def index_source(self) -> BatchBase:
        return self.source

    # ------------------------------------------------------------------ reads
    def get_at(self, idx: Any) -> Any:
        norm = normalize_index(idx, len(self), type(self).__name__)
        out = self.read_items(norm.positions())
        return _tree.take_row(out, 0) if norm.single is not None else out

    def __getitems__(self, indices: Any) -> Any:
        """A whole batch of items (what a torch DataLoader asks for), one read per key."""
        if hasattr(indices, "detach"):
            indices = indices.detach().cpu().numpy()
        idx = np.asarray(indices, dtype=np.int64)
        if idx.ndim != 1:
            raise IndexError(f"__getitems__ needs a 1-D sequence of indices, got shape {idx.shape}")
        return self.get_at(idx)

    def _frames(self, items: np.ndarray) -> Tuple[np.ndarray, Dict[KeyPath, np.ndarray], Dict[str, np.ndarray]]:
        """`(anchors, {path: the B * T source frames to read}, {name: (B, T) pad mask})` of `items`."""
        a = self._anchors[items]
        s = self._ep_start[items][:, None]
        e = self._ep_end[items][:, None]
        frames: Dict[KeyPath, np.ndarray] = {}
        pads: Dict[str, np.ndarray] = {}
        for k in self.keys:
            f = a[:, None] + k.offsets[None, :]
            pads[k.name] = (f < s) | (f >= e)
            frames[k.path] = np.clip(f, s, e - 1).reshape(-1)
        return a, frames, pads

    def get_at_into(self, idx: Any, out: Dict[str, Any]) -> None:
        """Writes the batch of items at `idx` (a 1-D int sequence) into `out`: a dict with the keys of a batch whose
        leaves are writable NumPy arrays of the batch's shapes and dtypes (e.g. views into a shared-memory slot,
        as `shared_memory_dataloader`'s workers give). Windows of array columns are gathered straight into `out`
        (no intermediate batch); normalised keys and other fields are computed as by `read_items` and copied.
        The values equal `read_items(idx)`'s."""
        norm = normalize_index(idx, len(self), type(self).__name__)
        if norm.single is not None:
            raise IndexError(f"get_at_into needs a 1-D sequence of indices, got the single index {idx!r}")
        items = norm.positions().astype(np.int64)
        nb = int(items.shape[0])
        a, frames, pads = self._frames(items)

        def flat(leaf: Any) -> np.ndarray:
            # (B, T, ...) -> (B * T, ...): a view of a C-contiguous array, so the gather lands in `out`
            if not isinstance(leaf, np.ndarray) or not leaf.flags.c_contiguous or leaf.shape[:2] != (nb, T):
                raise ValueError(f"get_at_into: out[{k.name!r}] must hold C-contiguous NumPy arrays with leading "
                                 f"axes ({nb}, {T}), got "
                                 f"{tuple(leaf.shape) if isinstance(leaf, np.ndarray) else type(leaf).__name__}")
            return leaf.reshape((nb * T,) + leaf.shape[2:])
        dests: Dict[KeyPath, Any] = {}
        for k in self.keys:
            if k.mode is None:
                T = int(k.offsets.shape[0])
                dests[k.path] = _tree.map_leaves(out[k.name], flat)
        self._reader.read_into({p: frames[p] for p in dests}, dests)
        for k in self.keys:
            if k.mode is not None:
                v = self._reader.read({k.path: frames[k.path]})[k.path]
                v = _tree.reshape_lead(v, (nb, int(k.offsets.shape[0])))
                B = self.backend
                _tree.copy_into(out[k.name], (B.astype(v, B.dtype_from_name("float32")) - k.shift) / k.scale)
            out[k.name + PAD_SUFFIX][...] = pads[k.name]
        out["index"][...] = a
        out["episode_index"][...] = self._episode[items]

    def read_items(self, items: np.ndarray) -> Dict[str, Any]:
        """The items at positions `items` (1-D int64 in `[0, len)`), batched."""
        items = np.asarray(items, dtype=np.int64)
        a, frames, pads = self._frames(items)
        data = self._reader.read(frames)
        B, dev = self.backend, self.device
        out: Dict[str, Any] = {}
        nb = int(items.shape[0])
        for k in self.keys:
            v = _tree.reshape_lead(data[k.path], (nb, int(k.offsets.shape[0])))
            if k.mode is not None:
                v = (B.astype(v, B.dtype_from_name("float32")) - k.shift) / k.scale
            out[k.name] = v
        for k in self.keys:
            out[k.name + PAD_SUFFIX] = B.from_numpy(pads[k.name], device=dev)
        out["index"] = B.from_numpy(a, dtype=B.dtype_from_name("int64"), device=dev)
        out["episode_index"] = B.from_numpy(self._episode[items], dtype=B.dtype_from_name("int64"), device=dev)
        return out

    @staticmethod
    def collate_fn(data: Any) -> Any:
        """For a torch DataLoader: a batch from `__getitems__` passes through with its NumPy arrays as torch tensors
        (zero-copy), so worker processes hand it over in shared memory instead of pickling it; a list of single
        items (a wrapper without `__getitems__`) is stacked first. In a worker, a batch over 1 MiB warns once: torch
        then copies it into a fresh shared-memory segment per tensor; `shared_memory_dataloader` avoids that."""
        out = _tree.collate_to_torch(data)
        _tree.warn_slow_worker_transfer(out, "as torch tensors (one new shared-memory segment and file descriptor "
                                             "per tensor)")
        return out


__all__ = ["WindowDataset", "NORMALIZE_MODES", "PAD_SUFFIX"]
