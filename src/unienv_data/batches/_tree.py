"""Helpers on nested sample data (dicts, tuples, lists of arrays) shared by the batch views.

Leaves are backend arrays (NumPy, torch, JAX) or NumPy object arrays (batched text). Index arrays are NumPy int64
and are converted to the leaf's own library (and device) before indexing.
"""
from __future__ import annotations

import sys
from typing import Any, Callable, Dict, Iterable, List, Sequence, Tuple, Union

import numpy as np

from unienv_interface.space import Space
from unienv_interface.space.spaces import DictSpace, TupleSpace

NestedKey = Union[str, int]


def map_leaves(data: Any, fn: Callable[[Any], Any]) -> Any:
    """`fn` applied to every leaf of `data` (the nesting is kept)."""
    if isinstance(data, dict):
        return {k: map_leaves(v, fn) for k, v in data.items()}
    if isinstance(data, tuple):
        return tuple(map_leaves(v, fn) for v in data)
    if isinstance(data, list):
        return [map_leaves(v, fn) for v in data]
    return fn(data)


def nested_dict(paths: Iterable[Sequence[Any]], values: Iterable[Any]) -> Dict[Any, Any]:
    """The nested dict holding each of `values` at its key path in `paths` (same order)."""
    root: Dict[Any, Any] = {}
    for path, value in zip(paths, values):
        set_path(root, path, value)
    return root
def set_path(root: Dict[Any, Any], path: Sequence[Any], value: Any) -> None:
    """`root[path[0]]...[path[-1]] = value`, creating the dicts on the way (`path` is not empty)."""
    node = root
    for key in path[:-1]:
        node = node.setdefault(key, {})
    node[path[-1]] = value


def zip_leaves(parts: Sequence[Any], fn: Callable[[List[Any]], Any]) -> Any:
    """`fn([leaf of parts[0], leaf of parts[1], ...])` for every leaf position of equally nested `parts`."""
    first = parts[0]
    if isinstance(first, dict):
        return {k: zip_leaves([p[k] for p in parts], fn) for k in first}
    if isinstance(first, tuple):
        return tuple(zip_leaves([p[i] for p in parts], fn) for i in range(len(first)))
    if isinstance(first, list):
        return [zip_leaves([p[i] for p in parts], fn) for i in range(len(first))]
    return fn(list(parts))


def _index_for(leaf: Any, backend: Any, idx: np.ndarray) -> Any:
    """`idx` in a form `leaf` can be indexed with (NumPy for NumPy leaves, else the backend on the leaf's device)."""
    if isinstance(leaf, np.ndarray):
        return idx
    return backend.from_numpy(idx, device=backend.device(leaf))


def _take_leaf(leaf: Any, idx: np.ndarray, backend: Any) -> Any:
    if isinstance(leaf, np.ndarray):
        return leaf[idx]
    torch = sys.modules.get("torch")
    if (torch is not None and type(leaf) is torch.Tensor and leaf.device.type == "cpu" and not leaf.requires_grad
            and leaf.ndim >= 1):
        # CPU tensors gather through NumPy: torch's row indexing of large rows (camera frames) is 10-100x slower
        try:
            arr = leaf.numpy()
        except (TypeError, RuntimeError):       # no NumPy dtype (bfloat16, ...): torch's own indexing
            pass
        else:
            return torch.from_numpy(arr.take(idx, axis=0))
    return leaf[_index_for(leaf, backend, idx)]


def take_rows(data: Any, idx: np.ndarray, backend: Any) -> Any:
    """Rows `idx` (1-D int64) of every leaf along the leading axis."""
    return map_leaves(data, lambda leaf: _take_leaf(leaf, idx, backend))


def to_host_numpy(leaf: Any) -> np.ndarray:
    """A leaf as a NumPy array on the host (a torch tensor through `.numpy()`, on the CPU first; no copy where the
    libraries allow)."""
    if isinstance(leaf, np.ndarray):
        return leaf
    if hasattr(leaf, "detach") and hasattr(leaf, "cpu"):
        return leaf.detach().cpu().numpy()  # type: ignore[no-any-return]
    return np.asarray(leaf)


def copy_into(dst: Any, src: Any) -> None:
    """Writes every leaf of `src` into the NumPy leaf at the same place of `dst` (equally nested); a ValueError
    names the first leaf whose shape differs."""
    if isinstance(dst, np.ndarray):
        arr = to_host_numpy(src)
        if tuple(arr.shape) != tuple(dst.shape):
            raise ValueError(f"copy_into: the data has shape {tuple(arr.shape)}, the destination {tuple(dst.shape)}")
        dst[...] = arr
        return
    if isinstance(dst, dict):
        for k, v in dst.items():
            copy_into(v, src[k])
        return
    if isinstance(dst, (tuple, list)):
        for v, w in zip(dst, src):
            copy_into(v, w)
        return
    raise TypeError(f"copy_into: the destination must be nested dicts / tuples / lists of NumPy arrays, got "
                    f"{type(dst).__name__}")


def take_row(data: Any, i: int) -> Any:
    """Row `i` of every leaf (the leading axis removed); NumPy scalars stay 0-d arrays."""
    def one(leaf: Any) -> Any:
        out = leaf[i]
        return np.asarray(out) if isinstance(out, np.generic) else out
    return map_leaves(data, one)


def add_lead_axis(data: Any) -> Any:
    """Every leaf with a new leading axis of size 1."""
    return map_leaves(data, lambda leaf: leaf[None])


def reshape_lead(data: Any, lead: Tuple[int, ...]) -> Any:
    """Every leaf's single leading axis reshaped to `lead` (e.g. `(B * T,)` to `(B, T)`)."""
    return map_leaves(data, lambda leaf: leaf.reshape(tuple(lead) + tuple(leaf.shape[1:])))


def gather_2d(data: Any, rows: np.ndarray, cols: np.ndarray, backend: Any) -> Any:
    """`leaf[rows, cols]` for every leaf with two leading axes (`rows`, `cols` broadcastable int64 arrays)."""
    def one(leaf: Any) -> Any:
        return leaf[_index_for(leaf, backend, rows), _index_for(leaf, backend, cols)]
    return map_leaves(data, one)


def select_column(data: Any, col: int) -> Any:
    """`leaf[:, col]` for every leaf with two leading axes."""
    return map_leaves(data, lambda leaf: leaf[:, col])


def concat_leaves(parts: Sequence[Any], backend: Any) -> Any:
    """Equally nested batches concatenated along the leading axis, leaf by leaf."""
    if len(parts) == 1:
        return parts[0]

    def cat(leaves: List[Any]) -> Any:
        if isinstance(leaves[0], np.ndarray):
            return np.concatenate(leaves, axis=0)
        return backend.concat(leaves, axis=0)
    return zip_leaves(parts, cat)


def normalize_nested_keys(nested_keys: Any) -> Tuple[NestedKey, ...]:
    """A key (str / int) or a sequence of keys as a tuple path; ValueError for an empty path."""
    if isinstance(nested_keys, (str, int)) and not isinstance(nested_keys, bool):
        return (nested_keys,)
    if isinstance(nested_keys, (list, tuple)):
        path = tuple(nested_keys)
        if not path:
            raise ValueError("nested_keys must name at least one key")
        for k in path:
            if isinstance(k, bool) or not isinstance(k, (str, int)):
                raise TypeError(f"nested keys must be str (dict keys) or int (tuple positions), got {k!r}")
        return path
    raise TypeError(f"nested_keys must be a key or a sequence of keys, got {nested_keys!r}")


def sub_space(space: Space, path: Tuple[NestedKey, ...]) -> Space:
    """The space at `path` inside `space`; KeyError / IndexError name the missing key and the available ones."""
    cur = space
    for depth, k in enumerate(path):
        where = "/".join(str(p) for p in path[:depth]) or "<root>"
        if isinstance(cur, DictSpace):
            if not isinstance(k, str) or k not in cur.spaces:
                raise KeyError(f"no key {k!r} at {where}; available keys: {list(cur.spaces)}")
            cur = cur.spaces[k]
        elif isinstance(cur, TupleSpace):
            if isinstance(k, bool) or not isinstance(k, int) or not -len(cur.spaces) <= k < len(cur.spaces):
                raise IndexError(f"no position {k!r} at {where}; the tuple has {len(cur.spaces)} entries")
            cur = cur.spaces[k]
        else:
            raise TypeError(f"cannot take key {k!r} at {where}: a {type(cur).__name__} has no nested fields")
    return cur


def sub_data(data: Any, path: Tuple[NestedKey, ...]) -> Any:
    """The field at `path` of nested `data`."""
    for k in path:
        data = data[k]
    return data


__all__ = ["map_leaves", "zip_leaves", "take_rows", "take_row", "add_lead_axis", "reshape_lead", "gather_2d",
           "select_column", "concat_leaves", "normalize_nested_keys", "sub_space", "sub_data", "collate_to_torch"]


#: Batches with more array bytes than this, returned by a DataLoader worker through a pipe, get a warning.
WORKER_TRANSFER_WARN_BYTES = 1 << 20
_warned_transfer = False


def warn_slow_worker_transfer(data: Any, what: str) -> None:
    """Warns once per process when a DataLoader worker is about to send a batch of more than
    `WORKER_TRANSFER_WARN_BYTES` array bytes through torch's per-batch transfer (`what` names how it travels)."""
    global _warned_transfer
    if _warned_transfer:
        return
    from torch.utils.data import get_worker_info
    if get_worker_info() is None:
        return
    total = [0]

    def add(leaf: Any) -> Any:
        total[0] += int(getattr(leaf, "nbytes", 0) or 0)
        return leaf
    map_leaves(data, add)
    if total[0] > WORKER_TRANSFER_WARN_BYTES:
        import warnings
        _warned_transfer = True
        warnings.warn(f"a DataLoader worker returns batches of {total[0] / 2 ** 20:.1f} MiB {what}; that transfer "
                      "costs more than reading the batch (memory-mapped data can be many times slower with workers "
                      "than without). Use unienv_data.integrations.torch_loader.shared_memory_dataloader(dataset, "
                      "batch_size, num_workers=N), whose workers hand batches over in shared memory, or "
                      "num_workers=0", RuntimeWarning, stacklevel=3)


def collate_to_torch(data: Any) -> Any:
    """A DataLoader collate function: an already batched result (dicts / tuples of arrays) with its NumPy leaves
    as torch tensors sharing their memory (`torch.from_numpy`), so workers hand batches over in shared memory;
    a plain list of single samples is stacked with torch's `default_collate` first. Imports torch."""
    import torch
    from torch.utils.data import default_collate
    if type(data) is list:
        return default_collate(data)

    def one(leaf: Any) -> Any:
        if isinstance(leaf, np.ndarray) and leaf.dtype != object:
            return torch.from_numpy(leaf if leaf.flags.writeable else leaf.copy())
        return leaf
    return map_leaves(data, one)
