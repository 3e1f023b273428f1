"""Packing a sampled batch into one byte buffer and unpacking it again, for `MultiprocessingSampler`.

A batch (nested dicts, tuples and lists of NumPy arrays, CPU torch tensors and other objects) is described by a
hashable tuple: its structure, and for every array leaf its dtype, shape and byte offset in the buffer. The worker
copies the leaves into a shared-memory slot or a fresh bytearray (`pack`); the parent rebuilds the batch from the
description and the buffer (`unpack`). Leaves of any other kind travel inside the description, by pickle.

Importing this module does not import torch: torch leaves are recognised only when torch is already loaded.
"""
from __future__ import annotations

import sys
from typing import Any, List, Optional, Tuple

import numpy as np

ALIGN = 64
"""Every leaf starts at a multiple of this many bytes."""


def align(n: int) -> int:
    """`n` rounded up to a multiple of `ALIGN`."""
    return (n + ALIGN - 1) // ALIGN * ALIGN


def _torch_leaf(x: Any) -> bool:
    torch = sys.modules.get("torch")
    return (torch is not None and type(x) is torch.Tensor and x.layout == torch.strided
            and x.device.type == "cpu" and not x.is_quantized)


def _plan_tree(x: Any, sources: List[Tuple[Any, int, Any]], cursor: List[int]) -> Any:
    """The description of `x` (a hashable tuple: structure, dtypes, shapes, byte offsets). Every array leaf is
    appended to `sources` as `(leaf spec, offset, source array)`, and `cursor[0]` advances past it.

    Leaf tags: "N" NumPy array, "T" CPU tensor of a NumPy-representable dtype (copied through its NumPy view),
    "B" other CPU tensor (bfloat16, ...; copied as raw bytes), "O" anything else (sent by pickle)."""
    if type(x) is dict:
        return ("D", tuple((k, _plan_tree(v, sources, cursor)) for k, v in x.items()))
    if type(x) is tuple or type(x) is list:
        return ("U" if type(x) is tuple else "L", tuple(_plan_tree(v, sources, cursor) for v in x))
    if type(x) is np.ndarray and not x.dtype.hasobject:
        tag, arr, dtype = "N", x, x.dtype
    elif _torch_leaf(x):
        t = x.detach()
        try:
            tag, arr = "T", t.numpy()
            dtype = arr.dtype
        except TypeError:  # no NumPy dtype (bfloat16, ...): raw bytes
            import torch
            tag, arr, dtype = "B", t.contiguous().reshape(-1).view(torch.uint8).numpy(), t.dtype
        x = arr if tag == "T" else t
    else:
        return ("O", x)
    n = int(arr.nbytes)
    off = cursor[0]
    cursor[0] = off + align(n)
    spec = (tag, dtype, tuple(x.shape), off, n)
    if n:
        sources.append((spec, off, arr))
    return spec


def pack(batch: Any, slot: Optional[np.ndarray]) -> Tuple[Any, Optional[bytearray]]:
    """`(description, payload)`: the array leaves are copied into `slot` when they fit (payload None), else into
    a new bytearray (the payload)."""
    sources: List[Tuple[Any, int, Any]] = []
    cursor = [0]
    spec = _plan_tree(batch, sources, cursor)
    total = cursor[0]
    payload: Optional[bytearray] = None
    if slot is not None and total <= slot.shape[0]:
        dst = slot
    else:
        payload = bytearray(total)
        dst = np.frombuffer(payload, dtype=np.uint8)
    for (tag, dtype, shape, off, n), _, src in sources:
        if tag == "B":
            dst[off:off + n] = src
        else:
            dst[off:off + n].view(src.dtype).reshape(src.shape)[...] = src
    return spec, payload


def batch_layout(spec: Any, n: int) -> Optional[Tuple[Any, int]]:
    """`(description, bytes)` of a batch of `n` items laid out like the one-item batch described by `spec` (every
    array leaf's leading axis 1 becomes `n`, offsets packed again), or None when some leaf cannot be laid out
    ahead (a pickled "O" leaf, raw-bytes "B" leaf, or a leaf without the leading axis 1)."""
    cursor = [0]

    def walk(sp: Any) -> Any:
        tag = sp[0]
        if tag == "D":
            return ("D", tuple((k, walk(v)) for k, v in sp[1]))
        if tag in ("U", "L"):
            return (tag, tuple(walk(v) for v in sp[1]))
        if tag not in ("N", "T") or len(sp[2]) == 0 or sp[2][0] != 1:
            raise LookupError
        _, dtype, shape, _, _ = sp
        shape = (int(n),) + tuple(shape[1:])
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        off = cursor[0]
        cursor[0] = off + align(nbytes)
        return (tag, dtype, shape, off, nbytes)
    try:
        out = walk(spec)
    except LookupError:
        return None
    return out, cursor[0]


def leaf_views(spec: Any, buf: np.ndarray) -> Any:
    """The batch described by `spec` as writable NumPy views into `buf` (uint8), every array leaf in place: what a
    reader fills so that `unpack(spec, buf, copy=False)` is the batch without a copy."""
    tag = spec[0]
    if tag == "D":
        return {k: leaf_views(v, buf) for k, v in spec[1]}
    if tag in ("U", "L"):
        parts = [leaf_views(v, buf) for v in spec[1]]
        return tuple(parts) if tag == "U" else parts
    _, dtype, shape, off, n = spec
    return buf[off:off + n].view(dtype).reshape(shape)


def _leaf_bytes(buf: Optional[np.ndarray], off: int, n: int) -> np.ndarray:
    if buf is None:
        raise RuntimeError("internal invariant violated: an array leaf without a buffer")
    return buf[off:off + n]


def unpack(spec: Any, buf: Optional[np.ndarray], copy: bool) -> Any:
    """Rebuilds a batch described by `spec` from `buf`; with `copy`, every array owns its memory."""
    tag = spec[0]
    if tag == "D":
        return {k: unpack(v, buf, copy) for k, v in spec[1]}
    if tag == "U":
        return tuple(unpack(v, buf, copy) for v in spec[1])
    if tag == "L":
        return [unpack(v, buf, copy) for v in spec[1]]
    if tag == "O":
        return spec[1]
    _, dtype, shape, off, n = spec
    if tag == "B":
        import torch
        if n == 0:
            return torch.empty(shape, dtype=dtype)
        raw = _leaf_bytes(buf, off, n)
        return torch.from_numpy(raw.copy() if copy else raw).view(dtype).reshape(shape)
    if n == 0:
        arr = np.empty(shape, dtype=dtype)
    else:
        arr = _leaf_bytes(buf, off, n).view(dtype).reshape(shape)
        if copy:
            arr = arr.copy()
    if tag == "N":
        return arr
    import torch
    return torch.from_numpy(arr)


__all__ = ["ALIGN", "align", "pack", "unpack"]
