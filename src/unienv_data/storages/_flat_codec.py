"""Per-space compiled single-sample paths of `FlatRowPlan`: the checks and the row writes of one sample of a flat
dict space, and the unflattening of a batch of rows, as straight-line functions generated once per plan.

Why generated code: a per-step append of a few small leaves is dominated by interpreter dispatch (a generic loop over
leaf descriptors, attribute lookups, branches on leaf kinds). The generated functions hold, per leaf, its key, row
slot, expected type / dtype / shape and the cheapest correct check as constants, so one call does only the work that
sample needs. `CompiledCodec.source` holds the generated text (tracebacks name the function and line in it).

The rules do not change. Per leaf, a value of the expected kind (a `torch.Tensor` of exactly the leaf's dtype and
shape on the pytorch backend; an ndarray of exactly that dtype and shape, or for a scalar leaf a NumPy scalar of that
dtype, on the NumPy backend) is checked here with the outcome `LeafConverter.convert` gives it (dtype and shape are
exact, so no cast happens; bounds below). Every other value, and any value that fails a check here, goes through
`LeafConverter.convert`, which applies the full rules of `unienv_data.base.values` and raises the error naming the key,
the expected and the given. Leaves that need a row-cast check (`FlatRowPlan.check_row_casts`) or hold bfloat16 always
take that general path. Every leaf is checked before the first byte is written.

Bounds on the short path: a leaf without finite bounds is not checked (a float leaf with infinite bounds accepts any
float, NaN included); a small leaf (<= 64 values) with one scalar `[low, high]` is checked with Python `min` / `max`
on its values, plus `sum` for floats (NaN makes the sum NaN, and passes no bound); any other bounded leaf with
`LeafConverter.check_bounds`.

How a checked value is read and written: tensor scalars through `item()`; 1-D small bounded tensor leaves through
`tolist()`, packed into the row with `struct` (their values are finite numbers or ints, which the lossless row dtype
holds exactly: the bounds check rejects NaN); other tensor leaves through `numpy()` (which refuses tensors it cannot
share: those take the general path); NumPy values as they are. All of these read the exact stored values.
"""
from __future__ import annotations

import struct
from itertools import count
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional

import numpy as np

if TYPE_CHECKING:
    from ._flat_layout import FlatRowPlan, _Leaf

_SERIAL = count()

#: `make_append(inner) -> append(value)`: the per-storage appender over an ArrayStorageBase `inner`; it checks one
#: sample and writes it into inner's next row (values that are not a plain dict go through `FlatRowPlan.pack`)
AppendFactory = Callable[[Any], Callable[[Any], None]]
#: `pack_into(value, row) -> bool`: checks one sample and writes it into a 1-D row of the row dtype; False, with
#: nothing checked or written, when `value` is not a plain dict with exactly the space's keys
Packer = Callable[[Any, np.ndarray], bool]
#: `unpack_batch(rows) -> dict`: the leaves of 2-D rows `(n, width)` (a fresh array: leaves may be views of it)
Unpacker = Callable[[np.ndarray], Dict[Any, Any]]

_STRUCT_CODES = {("f", 2): "e", ("f", 4): "f", ("f", 8): "d", ("i", 1): "b", ("i", 2): "h", ("i", 4): "i",
                 ("i", 8): "q", ("u", 1): "B", ("u", 2): "H", ("u", 4): "I", ("u", 8): "Q"}


class CompiledCodec:
    """The generated functions of one plan (all None where the plan's space does not qualify: see `compile_codec`)."""

    __slots__ = ("make_append", "pack_into", "unpack_batch", "copies_all", "source")

    def __init__(self, make_append: Optional[AppendFactory], pack_into: Optional[Packer],
                 unpack_batch: Optional[Unpacker], copies_all: bool, source: str) -> None:
        self.make_append = make_append
        self.pack_into = pack_into
        self.unpack_batch = unpack_batch
        #: every leaf of `unpack_batch` is a new array (all are cast from the row dtype), so it may read a view of
        #: the storage's rows directly
        self.copies_all = copies_all
        self.source = source


def _short_path(plan: "FlatRowPlan", lf: "_Leaf") -> bool:
    """Whether the leaf has a short path (else every value of it goes through `LeafConverter.convert`)."""
    conv = lf.conv
    return (conv is not None and not conv.is_bf16 and not lf.row_check
            and plan.backend.simplified_name in ("numpy", "pytorch"))


def _packs_values(plan: "FlatRowPlan", lf: "_Leaf") -> bool:
    """Whether a tensor leaf is read as a list of numbers and packed into the row with `struct` (see the module
    docstring: 1-D small leaves with scalar bounds, whose check needs the values anyway)."""
    conv = lf.conv
    return (plan.backend.simplified_name == "pytorch" and conv is not None and conv.small and len(lf.shape) == 1
            and (plan.row_dtype.kind, plan.row_dtype.itemsize) in _STRUCT_CODES)


def _bounds_lines(i: int, lf: "_Leaf", ns: Dict[str, Any], form: str, fail: str) -> List[str]:
    """Lines checking the bounds of `p<i>`, which is a Python / NumPy scalar (`form` "scalar"), an ndarray ("array")
    or a flat list of numbers ("list"); `fail` is a statement that raises the precise error (it runs only when the
    check here does not pass)."""
    conv = lf.conv
    if conv is None or conv.lo is None:
        return []
    p = f"p{i}"
    if form == "array" and not conv.small:
        return [f"C{i}.check_bounds({p})"]
    ns[f"LO{i}"], ns[f"HI{i}"] = conv.lo_s, conv.hi_s
    if form == "scalar":
        return [f"if not LO{i} <= {p} <= HI{i}:", f"    {fail}"]
    if form == "list":
        lines, vals = [], p
    else:
        lines, vals = [f"vals = {p}.tolist()" if len(lf.shape) == 1 else f"vals = {p}.reshape(-1).tolist()"], "vals"
    if conv.kind == "f":   # NaN passes neither bound, but min / max may skip it: the sum catches it
        lines += [f"tot = sum({vals})", f"if not (tot == tot and min({vals}) >= LO{i} and max({vals}) <= HI{i}):"]
    else:
        lines += [f"if not (min({vals}) >= LO{i} and max({vals}) <= HI{i}):"]
    return lines + [f"    {fail}"]


def _check_lines(plan: "FlatRowPlan", i: int, lf: "_Leaf", ns: Dict[str, Any]) -> List[str]:
    """Lines leaving the checked value of leaf `i` in `p<i>`, in the form `_write_lines` writes."""
    conv = lf.conv
    if conv is None:
        raise RuntimeError("internal invariant violated: compiled leaves hold arrays")
    ns[f"K{i}"], ns[f"C{i}"] = lf.key, conv
    general = f"p{i} = C{i}.convert(v, ())"
    lines = [f"v = value[K{i}]"]
    if not _short_path(plan, lf):
        lines.append(general)
        if lf.row_check:
            ns[f"X{i}"] = (lambda arr, _lf=lf: plan._verify_row_cast(
                np.asarray(arr).reshape(-1).astype(plan.row_dtype), np.asarray(arr), _lf))
            lines.append(f"X{i}(p{i})")
        return lines
    scalar = lf.shape == ()
    body: List[str]
    if plan.backend.simplified_name == "pytorch":
        import torch
        ns["TENSOR"] = torch.Tensor
        ns[f"D{i}"], ns[f"S{i}"] = lf.info.space.dtype, torch.Size(lf.shape)
        head = f"if type(v) is TENSOR and v.dtype is D{i} and v.shape == S{i}:"
        if scalar:   # item() reads any tensor (grad, other devices, lazy negation) exactly
            body = [f"p{i} = v.item()"] + _bounds_lines(i, lf, ns, "scalar", general)
        elif _packs_values(plan, lf):   # tolist() too
            general += ".tolist()"
            body = [f"p{i} = v.tolist()"] + _bounds_lines(i, lf, ns, "list", general)
        else:        # numpy() refuses what it cannot share (grad, other devices): the general path takes those
            bounds = _bounds_lines(i, lf, ns, "array", general)
            body = ["try:", f"    p{i} = v.numpy()", "except (RuntimeError, TypeError, ValueError):", f"    {general}"]
            body += (["else:"] + ["    " + ln for ln in bounds]) if bounds else []
    else:
        ns["NDARRAY"], ns[f"D{i}"], ns[f"S{i}"] = np.ndarray, conv.np_dtype, lf.shape
        if scalar:
            ns[f"G{i}"] = conv.np_dtype.type
            head = f"if type(v) is G{i}:"
            body = [f"p{i} = v"] + _bounds_lines(i, lf, ns, "scalar", general)
        else:
            head = f"if type(v) is NDARRAY and v.dtype is D{i} and v.shape == S{i}:"
            body = [f"p{i} = v"] + _bounds_lines(i, lf, ns, "array", general)
    return lines + [head] + ["    " + ln for ln in body] + ["else:", f"    {general}"]


def _write_lines(plan: "FlatRowPlan", lf: "_Leaf", i: int, ns: Dict[str, Any]) -> List[str]:
    """Lines writing the checked `p<i>` into the 1-D `row`."""
    if lf.shape == ():
        return [f"row[{lf.start}] = p{i}"]
    if _short_path(plan, lf) and _packs_values(plan, lf):
        code = _STRUCT_CODES[(plan.row_dtype.kind, plan.row_dtype.itemsize)]
        ns[f"P{i}"] = struct.Struct(f"={lf.size}{code}")
        return [f"P{i}.pack_into(row, {lf.start * plan.row_dtype.itemsize}, *p{i})"]
    if len(lf.shape) == 1:
        return [f"row[{lf.start}:{lf.stop}] = p{i}"]
    return [f"row[{lf.start}:{lf.stop}] = p{i}.reshape(-1)"]


def _unpack_expr(lf: "_Leaf", i: int, ns: Dict[str, Any], wrap: Any) -> str:
    if lf.shape == ():
        part = f"rows[:, {lf.start}]"
    elif len(lf.shape) == 1:
        part = f"rows[:, {lf.start}:{lf.stop}]"
    else:
        ns[f"R{i}"] = lf.shape
        part = f"rows[:, {lf.start}:{lf.stop}].reshape((rows.shape[0],) + R{i})"
    if lf.is_binary:
        part += ".astype(BOOL)"   # nonzero -> True, as `!= 0`
    elif not lf.same_dtype:
        ns[f"U{i}"] = lf.leaf_np
        part += f".astype(U{i})"
    if wrap is None:
        return part
    ns[f"W{i}"] = wrap
    return f"W{i}({part})"


def _define(name: str, lines: List[str], ns: Dict[str, Any], tag: str) -> Any:
    src = "\n".join(lines) + "\n"
    exec(compile(src, f"<unienv flat-row codec {tag}>", "exec"), ns)   # the text is kept in CompiledCodec.source
    return ns[name]


def _indent(lines: List[str], depth: int = 1) -> List[str]:
    return ["    " * depth + ln for ln in lines]


def compile_codec(plan: "FlatRowPlan") -> CompiledCodec:
    """The generated functions of `plan` (each None when the plan does not qualify: only flat dict spaces without
    text leaves are compiled; the generic methods of `FlatRowPlan` serve the rest)."""
    if not plan.is_flat_dict or plan._has_text or not plan.leaves:
        return CompiledCodec(None, None, None, False, "")
    tag = f"#{next(_SERIAL)}"
    ns: Dict[str, Any] = {"KEYS": plan._keys, "DICT": dict, "BOOL": np.dtype(np.bool_), "PACK": plan.pack}
    checks: List[str] = []
    writes: List[str] = []
    for i, lf in enumerate(plan.leaves):
        checks += _check_lines(plan, i, lf, ns)
        writes += _write_lines(plan, lf, i, ns)
    plain = "if type(value) is not DICT or value.keys() != KEYS:"
    append = (["def make_append(inner):", "    def append(value):",
               '        """Checks one sample and writes it at the open segment\'s next row."""',
               "        " + plain, "            inner._append_row_trusted(PACK(value))", "            return"]
              + _indent(checks, 2)
              + ["        pos = inner._claim_row()", "        row = inner._block.data[pos]"] + _indent(writes, 2)
              + ["        inner._seg_len += 1", "        inner._seg_clear_rows -= 1", "    return append"])
    pack = (["def pack_into(value, row):", "    " + plain, "        return False"]
            + _indent(checks) + _indent(writes) + ["    return True"])
    entries = ", ".join(f"K{i}: {_unpack_expr(lf, i, ns, w)}" for i, (lf, w) in enumerate(zip(plan.leaves, plan._wrappers)))
    unpack = ["def unpack_batch(rows):", f"    return {{{entries}}}"]
    source = "\n".join(append + [""] + pack + [""] + unpack)
    return CompiledCodec(_define("make_append", append, ns, tag + " append"),
                         _define("pack_into", pack, ns, tag + " pack"),
                         _define("unpack_batch", unpack, ns, tag + " unpack"),
                         all(lf.is_binary or not lf.same_dtype for lf in plan.leaves), source)


__all__ = ["CompiledCodec", "compile_codec"]
