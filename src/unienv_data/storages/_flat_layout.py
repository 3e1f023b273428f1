"""`FlatRowPlan`: how one structured sample maps onto a flat row, computed once per space.

Packing checks every leaf (keys, shape, dtype, bounds: see `unienv_data.base.values`) and also that each value
survives the cast to the row dtype (an int32 leaf in a float32 row must be below 2**24, a bool leaf is 0/1), so a
row never holds a value that would read back different. Unpacking slices the row per leaf and casts back.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from unienv_data.base.values import LeafConverter, is_lossless_cast, key_set_error
from unienv_interface.space import BinarySpace, DictSpace, Space, TextSpace, TupleSpace
from unienv_interface.space.space_utils.flatten_utils import FlatLeaf, flat_leaves, flatten_space

from ._flat_codec import compile_codec


def _torch_from_numpy() -> Any:
    import torch
    return torch.from_numpy


class _Leaf:
    __slots__ = ("info", "key", "path", "name", "start", "stop", "shape", "size", "conv", "leaf_np", "row_check",
                 "text", "is_binary", "same_dtype")

    def __init__(self, info: FlatLeaf, row_np: np.ndarray) -> None:
        self.info = info
        self.path = info.path
        self.key = info.path[0] if len(info.path) == 1 else None
        self.name = info.name or "<value>"
        self.start, self.stop, self.size = info.offset, info.offset + info.size, info.size
        self.text: Optional[TextSpace] = info.space if isinstance(info.space, TextSpace) else None
        self.is_binary = isinstance(info.space, BinarySpace)
        if self.text is None:
            self.conv: Optional[LeafConverter] = LeafConverter(info.space, f"key {self.name!r}")
            self.shape: Tuple[int, ...] = tuple(info.space.shape or ())
            self.leaf_np = self.conv.np_dtype
        else:
            self.conv = None
            self.shape = (info.size,)
            self.leaf_np = np.dtype(np.int64)
        rd = np.dtype(row_np)
        self.same_dtype = self.leaf_np == rd and not self.is_binary
        self.row_check = not is_lossless_cast(self.leaf_np, rd)


class FlatRowPlan:
    """Packs structured samples of `space` into rows of `flatten_space(space)` and back (NumPy in, NumPy out)."""

    def __init__(self, space: Space) -> None:
        self.space = space
        self.backend = space.backend
        self.flat_space = flatten_space(space)
        self.row_dtype = np.dtype(self.backend.numpy_dtype(self.flat_space.dtype))
        self.width = int(self.flat_space.shape[0])
        if self.backend.dtype_name(self.flat_space.dtype) == "bfloat16":
            raise TypeError("FlattenedStorage cannot use a bfloat16 row (every leaf is bfloat16); keep such data "
                            "in a PytorchTensorStorage")
        self.leaves: List[_Leaf] = [_Leaf(info, self.row_dtype) for info in flat_leaves(space)]
        self.is_flat_dict = isinstance(space, DictSpace) and all(len(lf.path) == 1 for lf in self.leaves)
        self._keys = frozenset(lf.key for lf in self.leaves) if self.is_flat_dict else frozenset()
        self._key_list = [lf.key for lf in self.leaves]
        #: whether a leaf is a text leaf (stored as code points; such plans are never compiled)
        self.has_text = any(lf.text is not None for lf in self.leaves)
        self._any_row_check = any(lf.row_check for lf in self.leaves)
        #: per leaf, the function turning a fresh NumPy leaf into the backend's array (None: keep NumPy)
        self.leaf_wrappers = self._make_wrappers()
        self._no_wrappers: List[Any] = [None] * len(self.leaves)
        self._wraps_nothing = all(w is None for w in self.leaf_wrappers)
        #: generated single-sample check / write and batch unflatten functions (see _flat_codec)
        self.codec = compile_codec(self)

    # ---------------------------------------------------------------- description
    def layout_json(self) -> List[Dict[str, Any]]:
        """The row layout as stored in metadata: key, dtype, shape, offset, size per leaf."""
        out = []
        for lf in self.leaves:
            sp = lf.info.space
            dtype = "text" if lf.text is not None else self.backend.dtype_name(sp.dtype)
            out.append({"key": lf.name if lf.info.path else "", "dtype": dtype, "shape": list(lf.shape),
                        "offset": lf.start, "size": lf.size})
        return out

    def native_bytes(self) -> int:
        """Bytes of one sample with every leaf in its own dtype."""
        return sum(lf.size * lf.leaf_np.itemsize for lf in self.leaves)

    def row_bytes(self) -> int:
        return self.width * self.row_dtype.itemsize

    def inflated_leaves(self) -> List[Tuple[str, str, int]]:
        """`(key, leaf dtype, factor)` for leaves stored at least twice their native size."""
        out = []
        for lf in self.leaves:
            factor = self.row_dtype.itemsize // max(1, lf.leaf_np.itemsize if not lf.is_binary else 1)
            if factor >= 2:
                out.append((lf.name, "bool" if lf.is_binary else lf.leaf_np.name, factor))
        return out

    # ---------------------------------------------------------------- packing
    def _fast_dict(self, value: Any) -> bool:
        """True when `value` takes the flat-dict fast path (its key set is checked here)."""
        if not self.is_flat_dict or self.has_text:
            return False
        if not isinstance(value, Mapping):
            raise TypeError(f"expected a dict with keys {self._key_list}, got {type(value).__name__}")
        if value.keys() != self._keys:
            self._key_error(value, ())
        return True

    def check_batch(self, value: Any, lead: Tuple[int, ...]) -> Optional[List[np.ndarray]]:
        """Checked leaf arrays (shape `lead + leaf shape`) of a batch of a flat dict space (None otherwise)."""
        if not self._fast_dict(value):
            return None
        arrs = [lf.conv.convert(value[lf.key], lead) for lf in self.leaves]  # type: ignore[union-attr]
        self.check_row_casts(arrs)
        return arrs

    def write_checked_batch(self, rows: np.ndarray, arrs: List[np.ndarray]) -> None:
        """Writes leaf arrays from `check_batch` into rows of shape `(n, width)`."""
        n = rows.shape[0]
        for lf, arr in zip(self.leaves, arrs):
            rows[:, lf.start:lf.stop] = arr.reshape(n, lf.size)

    def check_row_casts(self, arrs: List[np.ndarray]) -> None:
        """Refuses values that would not survive the cast to the row dtype (before anything is written)."""
        if not self._any_row_check:
            return
        for lf, arr in zip(self.leaves, arrs):
            if lf.row_check:
                staged = arr.reshape(-1).astype(self.row_dtype)
                self.verify_row_cast(staged, arr, lf)

    def verify_row_cast(self, dst: np.ndarray, arr: np.ndarray, lf: "_Leaf") -> None:
        """Refuses (ValueError naming the key) a value `arr` of leaf `lf` whose cast `dst` into the row dtype does
        not cast back to the same values."""
        with np.errstate(all="ignore"):
            back = dst.astype(lf.leaf_np)
        if not np.array_equal(back, arr.reshape(back.shape)):
            flat = arr.reshape(-1)
            bad = int(np.flatnonzero(back.reshape(-1) != flat)[0])
            raise ValueError(f"key {lf.name!r}: value {flat[bad].item()!r} ({lf.leaf_np.name}) is not exactly "
                             f"representable in the {self.row_dtype.name} flat row; keep this key in its own "
                             "storage (e.g. DictStorage) or use a wider dtype")

    def pack(self, value: Any, lead: Tuple[int, ...] = ()) -> np.ndarray:
        """Checked rows of shape `lead + (width,)` in the row dtype (a new array)."""
        row = np.empty(lead + (self.width,), dtype=self.row_dtype)
        if not lead and self.codec.pack_into is not None and self.codec.pack_into(value, row):
            return row
        if self.is_flat_dict:
            if not isinstance(value, Mapping):
                raise TypeError(f"expected a dict with keys {self._key_list}, got {type(value).__name__}")
            if value.keys() != self._keys:
                self._key_error(value, ())
            for lf in self.leaves:
                self._put(row, lf, value[lf.key], lead)
        else:
            for lf in self.leaves:
                self._put(row, lf, self._lookup(value, lf.path, lead), lead)
        return row

    def _key_error(self, value: Mapping, where: Tuple[Any, ...]) -> None:
        sp: Any = self.space
        for p in where:
            sp = sp[p]
        at = f" under {'/'.join(map(str, where))!r}" if where else ""
        raise key_set_error(value.keys(), sp.spaces, at)

    def _lookup(self, value: Any, path: Tuple[Any, ...], lead: Tuple[int, ...]) -> Any:
        sp: Any = self.space
        v = value
        for i, p in enumerate(path):
            if isinstance(sp, DictSpace):
                if not isinstance(v, Mapping):
                    raise TypeError(f"expected a dict at {'/'.join(map(str, path[:i])) or '<root>'}, got {type(v).__name__}")
                if v.keys() != sp.spaces.keys():
                    self._key_error(v, path[:i])
            elif isinstance(sp, TupleSpace):
                if not isinstance(v, (tuple, list)) or len(v) != len(sp.spaces):
                    raise ValueError(f"expected a sequence of {len(sp.spaces)} items at "
                                     f"{'/'.join(map(str, path[:i])) or '<root>'}, got {type(v).__name__}")
            v = v[p]
            sp = sp[p]
        return v

    def _put(self, row: np.ndarray, lf: _Leaf, v: Any, lead: Tuple[int, ...]) -> None:
        if lf.text is not None:
            self._put_text(row, lf, v, lead)
            return
        if not (lf.conv is not None):
            raise RuntimeError("internal invariant violated: lf.conv is not None")
        arr = lf.conv.convert(v, lead)
        dst = row[..., lf.start:lf.stop]
        dst[...] = arr.reshape(lead + (lf.size,))
        if lf.row_check:
            self.verify_row_cast(dst, arr, lf)

    def _put_text(self, row: np.ndarray, lf: _Leaf, v: Any, lead: Tuple[int, ...]) -> None:
        sp = lf.text
        if not (sp is not None):
            raise RuntimeError("internal invariant violated: sp is not None")
        items = [v] if not lead else list(np.asarray(v, dtype=object).reshape(-1))
        if lead and len(items) != int(np.prod(lead)):
            raise ValueError(f"key {lf.name!r}: expected {int(np.prod(lead))} strings, got {len(items)}")
        out = np.empty((len(items), lf.size), dtype=np.int64)
        for i, s in enumerate(items):
            if not isinstance(s, str):
                raise TypeError(f"key {lf.name!r}: expected a str, got {type(s).__name__}")
            if not sp.contains(s):
                raise ValueError(f"key {lf.name!r}: {s!r} is not in {sp.get_repr()} (length or characters)")
            pad = len(sp.charset_list or [])
            out[i] = [sp.char_index(c) for c in s] + [pad] * (sp.max_length - len(s))
        row[..., lf.start:lf.stop] = out.reshape(lead + (lf.size,))

    # ---------------------------------------------------------------- unpacking
    def _make_wrappers(self) -> List[Any]:
        """Per leaf: the function turning a fresh NumPy leaf into an array of the space's backend."""
        b = self.backend
        dev = self.space.device
        if b.simplified_name == "numpy":
            return [None] * len(self.leaves)
        out: List[Any] = []
        on_cpu = dev is None or str(dev) in ("cpu", "cpu:0")
        for lf in self.leaves:
            if lf.text is not None:
                out.append(None)
            elif lf.conv is not None and lf.conv.is_bf16:
                bf16 = b.dtype_from_name("bfloat16")
                out.append(lambda x, _b=b, _d=dev, _t=bf16: _b.from_numpy(x, device=_d).view(_t))
            elif b.simplified_name == "pytorch" and on_cpu:
                out.append(_torch_from_numpy())
            else:
                out.append(lambda x, _b=b, _d=dev: _b.from_numpy(x, device=_d))
        return out

    def unpack(self, rows: np.ndarray, to_backend: bool = False) -> Any:
        """Structured data from rows of shape `lead + (width,)`: NumPy leaves in their own dtypes, or arrays of
        the space's backend with `to_backend`. `rows` must be a fresh array (leaves may be views of it)."""
        fast = self.codec.unpack_batch
        if fast is not None and rows.ndim == 2 and (to_backend or self._wraps_nothing):
            return fast(rows)
        lead = rows.shape[:-1]
        leaves: List[Any] = []
        wrappers = self.leaf_wrappers if to_backend else self._no_wrappers
        for lf, wrap in zip(self.leaves, wrappers):
            part = rows[..., lf.start:lf.stop]
            if lf.text is not None:
                leaves.append(self._unpack_text(lf, part, lead))
                continue
            if lf.is_binary:
                arr = part != 0
            elif lf.same_dtype:
                arr = part
            else:
                arr = part.astype(lf.leaf_np)
            arr = arr.reshape(lead + lf.shape)
            leaves.append(arr if wrap is None else wrap(arr))
        if self.is_flat_dict:
            return dict(zip(self._key_list, leaves))
        return self._assemble(self.space, iter(leaves))

    def _unpack_text(self, lf: _Leaf, part: np.ndarray, lead: Tuple[int, ...]) -> Any:
        sp = lf.text
        if not (sp is not None):
            raise RuntimeError("internal invariant violated: sp is not None")
        chars = sp.charset_list or []
        def dec(r: np.ndarray) -> str:
            return "".join(chars[int(i)] for i in r if 0 <= int(i) < len(chars))
        if not lead:
            return dec(part)
        flat = part.reshape(-1, lf.size)
        out = np.empty(flat.shape[0], dtype=object)
        for i in range(flat.shape[0]):
            out[i] = dec(flat[i])
        return out.reshape(lead)

    def _assemble(self, sp: Space, it: Any) -> Any:
        if isinstance(sp, DictSpace):
            return {k: self._assemble(s, it) for k, s in sp.spaces.items()}
        if isinstance(sp, TupleSpace):
            return tuple(self._assemble(s, it) for s in sp.spaces)
        return next(it)

    def to_backend(self, data: Any) -> Any:
        """NumPy leaves of `unpack` as arrays of the space's backend and device."""
        b = self.backend
        if b.simplified_name == "numpy":
            return data
        dev = self.space.device
        bf16 = {lf.name for lf in self.leaves if lf.conv is not None and lf.conv.is_bf16}

        def conv(x: Any, name: str) -> Any:
            if isinstance(x, np.ndarray) and x.dtype != object:
                t = b.from_numpy(x, device=dev)
                return t.view(b.dtype_from_name("bfloat16")) if name in bf16 else t
            return x
        if self.is_flat_dict:
            return {k: conv(v, str(k)) for k, v in data.items()}
        return self._map(data, conv, ())

    def _map(self, data: Any, fn: Any, path: Tuple[Any, ...]) -> Any:
        if isinstance(data, dict):
            return {k: self._map(v, fn, path + (k,)) for k, v in data.items()}
        if isinstance(data, tuple):
            return tuple(self._map(v, fn, path + (i,)) for i, v in enumerate(data))
        return fn(data, "/".join(map(str, path)))

    def check_rows(self, rows: np.ndarray) -> np.ndarray:
        """Validates raw flat rows (from `set_flattened`): every leaf must read back to a valid value."""
        lead = rows.shape[:-1]
        repacked = self.pack(self.unpack(rows), lead)
        same = (repacked == rows) | (np.isnan(rows) & np.isnan(repacked)) if rows.dtype.kind == "f" else repacked == rows
        if not np.all(same):
            pos = np.argwhere(~same)[0]
            col = int(pos[-1])
            lf = next(lf for lf in self.leaves if lf.start <= col < lf.stop)
            raise ValueError(f"flat row column {col} (key {lf.name!r}) holds {rows[tuple(pos)].item()!r}, which is not "
                             f"a valid {lf.leaf_np.name if not lf.is_binary else 'bool'} value for that key")
        return rows
