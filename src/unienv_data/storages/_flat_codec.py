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
float, NaN included); a small leaf (<= 64 values) with one scalar `[low, high]` is checked on its values as a Python
list (min and max are the ends of `sorted(values)`), plus `sum` for floats (NaN makes the sum NaN, and passes no
bound); any other bounded leaf with `LeafConverter.check_bounds`.

How a checked value is read and written: tensor scalars through `item()`; 1-D small bounded tensor leaves through
`tolist()`, packed into the row with `struct` (their values are finite numbers or ints, which the lossless row dtype
holds exactly: the bounds check rejects NaN); other tensor leaves through `numpy()` (which refuses tensors it cannot
share: those take the general path); NumPy values as they are. All of these read the exact stored values. The
appender writes NumPy-written leaves through column views of the storage's array that it keeps (rebuilt when the
array changes, dropped on every slow path) and `struct`-packed ones into that array at the row's byte offset.

A plain dict is recognised by its type and key count, then every key is looked up (a missing key sends the value to
`FlatRowPlan.pack`, which raises the precise error), so the key check costs no set comparison. Batch reads of a space
whose non-binary leaves all share one dtype other than the row's cast the rows once and slice the leaves out of that
one fresh array (`_shared_cast`).
"""
from __future__ import annotations

from collections import OrderedDict

import struct
from itertools import count
from typing import TYPE_CHECKING, Any, Callable, Dict, List, NamedTuple, Optional

import numpy as np

from unienv_data.base.warn import GENERATED_PREFIX

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


class CompiledCodec(NamedTuple):
    """The generated functions of one plan (all None where the plan's space does not qualify: see `compile_codec`)."""

    make_append: Optional[AppendFactory]
    pack_into: Optional[Packer]
    unpack_batch: Optional[Unpacker]
    #: every leaf of `unpack_batch` is a new array (all are cast from the row dtype), so it may read a view of the
    #: storage's rows directly
    copies_all: bool
    source: str
    #: `unpack_view(rows)`: like `unpack_batch`, but `rows` may be a view of the storage's rows: every leaf is a new
    #: array (leaves in the row dtype are copied column by column, the others are cast), so a contiguous read copies
    #: only each leaf's own columns, never whole rows first
    unpack_view: Optional[Unpacker] = None


def _short_path(plan: "FlatRowPlan", lf: "_Leaf") -> bool:
    """Whether the leaf has a short path (else every value of it goes through `LeafConverter.convert`)."""
    conv = lf.conv
    return (conv is not None and not conv.is_bf16 and not lf.row_check
            and plan.backend.simplified_name in ("numpy", "pytorch"))


def _packs_values(plan: "FlatRowPlan", lf: "_Leaf") -> bool:
    """Whether a tensor leaf on the short path is read as a list of numbers and packed into the row with `struct`
    (see the module docstring: 1-D small leaves with scalar bounds, whose check needs the values anyway). NumPy
    leaves are written by NumPy: its cast-assignment of a few values costs less than `struct` packing them."""
    conv = lf.conv
    return (plan.backend.simplified_name == "pytorch" and _short_path(plan, lf) and conv is not None and conv.small
            and len(lf.shape) == 1 and (plan.row_dtype.kind, plan.row_dtype.itemsize) in _STRUCT_CODES)


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
    # the ends of the sorted values are their min and max (list.sort compares floats / small ints with type-specific
    # comparisons: cheaper than min() plus max()); NaN passes neither bound, but may sit anywhere after a sort: the
    # sum catches it (and an inf - inf pair, which the general path then judges). A "list" is the value to write:
    # sort a copy; the list read out of an array is this check's own: sort it in place
    srt = "srt" if form == "list" else vals
    sort = [f"srt = sorted({vals})"] if form == "list" else [f"{vals}.sort()"]
    if conv.kind == "f":
        lines += [f"tot = sum({vals})"] + sort + [f"if not (tot == tot and {srt}[0] >= LO{i} and {srt}[-1] <= HI{i}):"]
    else:
        lines += sort + [f"if not ({srt}[0] >= LO{i} and {srt}[-1] <= HI{i}):"]
    return lines + [f"    {fail}"]


def _check_lines(plan: "FlatRowPlan", i: int, lf: "_Leaf", ns: Dict[str, Any]) -> List[str]:
    """Lines leaving the checked value of leaf `i` in `p<i>`, in the form `_write_lines` writes."""
    conv = lf.conv
    if conv is None:
        raise RuntimeError("internal invariant violated: compiled leaves hold arrays")
    ns[f"K{i}"], ns[f"C{i}"] = lf.key, conv
    v = f"v{i}"
    general = f"p{i} = C{i}.convert({v}, ())"
    lines: List[str] = []
    if not _short_path(plan, lf):
        lines.append(general)
        if lf.row_check:
            ns[f"X{i}"] = (lambda arr, _lf=lf: plan.verify_row_cast(
                np.asarray(arr).reshape(-1).astype(plan.row_dtype), np.asarray(arr), _lf))
            lines.append(f"X{i}(p{i})")
        return lines
    scalar = lf.shape == ()
    body: List[str]
    if plan.backend.simplified_name == "pytorch":
        import torch
        ns["TENSOR"] = torch.Tensor
        ns[f"D{i}"], ns[f"S{i}"] = lf.info.space.dtype, torch.Size(lf.shape)
        head = f"if type({v}) is TENSOR and {v}.dtype is D{i} and {v}.shape == S{i}:"
        if scalar:   # item() reads any tensor (grad, other devices, lazy negation) exactly
            body = [f"p{i} = {v}.item()"] + _bounds_lines(i, lf, ns, "scalar", general)
        elif _packs_values(plan, lf):   # tolist() too
            general += ".tolist()"
            body = [f"p{i} = {v}.tolist()"] + _bounds_lines(i, lf, ns, "list", general)
        else:        # numpy() refuses what it cannot share (grad, other devices): the general path takes those
            bounds = _bounds_lines(i, lf, ns, "array", general)
            body = ["try:", f"    p{i} = {v}.numpy()", "except (RuntimeError, TypeError, ValueError):", f"    {general}"]
            body += (["else:"] + ["    " + ln for ln in bounds]) if bounds else []
    else:
        ns["NDARRAY"], ns[f"D{i}"], ns[f"S{i}"] = np.ndarray, conv.np_dtype, lf.shape
        if scalar:
            ns[f"G{i}"] = conv.np_dtype.type
            head = f"if type({v}) is G{i}:"
            body = [f"p{i} = {v}"] + _bounds_lines(i, lf, ns, "scalar", general)
        else:
            head = f"if type({v}) is NDARRAY and {v}.dtype is D{i} and {v}.shape == S{i}:"
            body = [f"p{i} = {v}"] + _bounds_lines(i, lf, ns, "array", general)
    return lines + [head] + ["    " + ln for ln in body] + ["else:", f"    {general}"]


def _write_lines(plan: "FlatRowPlan", ns: Dict[str, Any], buf: str, base: str, columns: bool) -> List[str]:
    """Lines writing every checked `p<i>`: `struct`-packed leaves go into the buffer `buf` at byte `base` + the
    leaf's offset (the storage's whole array: a fresh row view would cost NumPy a buffer export); the others into
    the 1-D `row`, or with `columns` into row `pos` of the leaf's column view `COL<i>` of the storage's array (an int
    index into a kept view costs NumPy less than a slice of a fresh row view)."""
    lines: List[str] = []
    for i, lf in enumerate(plan.leaves):
        if _packs_values(plan, lf):
            code = _STRUCT_CODES[(plan.row_dtype.kind, plan.row_dtype.itemsize)]
            ns[f"P{i}"] = struct.Struct(f"={lf.size}{code}")
            off = lf.start * plan.row_dtype.itemsize
            lines.append(f"P{i}.pack_into({buf}, {base} + {off}, *p{i})" if base else f"P{i}.pack_into({buf}, {off}, *p{i})")
            continue
        value = f"p{i}.reshape(-1)" if len(lf.shape) > 1 else f"p{i}"
        if columns:
            lines.append(f"COL{i}[pos] = {value}")
        elif lf.shape == ():
            lines.append(f"row[{lf.start}] = {value}")
        else:
            lines.append(f"row[{lf.start}:{lf.stop}] = {value}")
    return lines


def _column_names(plan: "FlatRowPlan", ns: Dict[str, Any]) -> List[str]:
    """The names of the column views the appender keeps (one per leaf NumPy writes), with their index in `ns`."""
    names = []
    for i, lf in enumerate(plan.leaves):
        if not _packs_values(plan, lf):
            ns[f"CI{i}"] = (slice(None), lf.start) if lf.shape == () else (slice(None), slice(lf.start, lf.stop))
            names.append(f"COL{i}")
    return names


def _shared_cast(plan: "FlatRowPlan") -> Optional[np.dtype]:
    """The one leaf dtype every non-binary leaf is cast to, when rows are better cast once as a whole (then sliced):
    at least two such leaves covering at least half of the row. One cast of a contiguous block costs far less than a
    strided cast per leaf; the leaves are then views of that one fresh array (never of the storage)."""
    cast = [lf for lf in plan.leaves if not lf.is_binary]
    dtypes = {lf.leaf_np for lf in cast}
    if len(cast) < 2 or len(dtypes) != 1 or any(lf.same_dtype or lf.conv is None or lf.conv.is_bf16 for lf in cast):
        return None
    if 2 * sum(lf.size for lf in cast) < plan.width:
        return None
    return next(iter(dtypes))


def _unpack_expr(lf: "_Leaf", i: int, ns: Dict[str, Any], wrap: Any, shared: bool, own: bool = False) -> str:
    """The expression of leaf `i` read from `rows` (or from the shared cast `cast`); with `own` a leaf that would be
    a view of `rows` is copied (`rows` may then be a view of the storage)."""
    src = "cast" if shared and not lf.is_binary else "rows"
    # the column index as a constant tuple (building the slice and the tuple per call costs about a third of a view)
    ns[f"I{i}"] = (slice(None), lf.start) if lf.shape == () else (slice(None), slice(lf.start, lf.stop))
    if len(lf.shape) <= 1:
        part = f"{src}[I{i}]"
    else:
        ns[f"R{i}"] = lf.shape
        part = f"{src}[I{i}].reshape(({src}.shape[0],) + R{i})"
    if lf.is_binary:
        part += ".astype(BOOL)"   # nonzero -> True, as `!= 0`
    elif not lf.same_dtype and not shared:
        ns[f"U{i}"] = lf.leaf_np
        part += f".astype(U{i})"
    elif own and not shared:
        part += ".copy()"
    if wrap is None:
        return part
    ns[f"W{i}"] = wrap
    return f"W{i}({part})"


#: compiled code by generated text: reopening a storage of a space seen before skips `compile` (~0.2 ms each)
_CODE_CACHE: "OrderedDict[str, Any]" = OrderedDict()
_CODE_CACHE_SIZE = 256


def _define(name: str, lines: List[str], ns: Dict[str, Any], tag: str) -> Any:
    src = "\n".join(lines) + "\n"
    code = _CODE_CACHE.get(src)
    if code is None:
        code = compile(src, f"{GENERATED_PREFIX}flat-row codec {tag}>", "exec")   # the text is kept in CompiledCodec.source
        _CODE_CACHE[src] = code
        while len(_CODE_CACHE) > _CODE_CACHE_SIZE:
            _CODE_CACHE.popitem(last=False)
    exec(code, ns)
    return ns[name]


def _indent(lines: List[str], depth: int = 1) -> List[str]:
    return ["    " * depth + ln for ln in lines]


def compile_codec(plan: "FlatRowPlan") -> CompiledCodec:
    """The generated functions of `plan` (each None when the plan does not qualify: only flat dict spaces without
    text leaves are compiled; the generic methods of `FlatRowPlan` serve the rest)."""
    if not plan.is_flat_dict or plan.has_text or not plan.leaves:
        return CompiledCodec(None, None, None, False, "")
    tag = f"#{next(_SERIAL)}"
    ns: Dict[str, Any] = {"DICT": dict, "BOOL": np.dtype(np.bool_), "PACK": plan.pack, "NKEYS": len(plan.leaves)}
    checks: List[str] = []
    for i, lf in enumerate(plan.leaves):
        checks += _check_lines(plan, i, lf, ns)
    ns["RB"] = plan.width * plan.row_dtype.itemsize
    # a plain dict with as many keys as the space and every key found holds exactly the space's keys; anything else
    # goes through `FlatRowPlan.pack`, which raises the precise error (or packs a non-dict Mapping)
    plain = "if type(value) is not DICT or len(value) != NKEYS:"
    lookup = ["try:", "    " + "; ".join(f"v{i} = value[K{i}]" for i in range(len(plan.leaves))),
              "except KeyError:"]
    cols = _column_names(plan, ns)
    # the column views are kept for the storage's current array `data` (`DATA`) and rebuilt when it changes (growth,
    # reload); every slow path drops them first, so a closed storage's rows are not kept alive by the appender
    keep = ["nonlocal " + ", ".join(["DATA"] + cols)] if cols else []
    drop = ["    " + " = ".join(["DATA"] + cols) + " = None"] if cols else []
    rebuild = (["if data is not DATA:", "    DATA = data"] + [f"    {c} = data[CI{c[3:]}]" for c in cols]) if cols else []
    append = (["def make_append(inner):", "    cap = inner._capacity"]
              + (["    " + " = ".join(["DATA"] + cols) + " = None"] if cols else [])
              + ["    def append(value):",
                 '        """Checks one sample and writes it at the open segment\'s next row."""']
              + _indent(keep, 2)
              + ["        " + plain, "            inner.append_checked_row(PACK(value))", "            return"]
              + _indent(lookup, 2) + ["            inner.append_checked_row(PACK(value))", "            return"]
              + _indent(checks, 2)
              # the common case of `inner._claim_row()`, inline: inside the open segment, rows known to be free ahead
              # and the ring not yet full (`_seg_clear_rows` is 0 whenever no segment is open and once the storage is
              # closed; a read-only storage never opens one); anything else asks `_claim_row`, which raises or grows
              + _indent(["n = inner._seg_len", "c = inner._seg_clear_rows",
                         "if c > 0 and n != cap:",
                         "    pos = inner._seg_start + n",
                         "    if cap is None:",
                         "        if pos >= inner._length:",
                         "            pos = -1",
                         "    elif pos >= cap:",
                         "        pos -= cap",
                         "else:",
                         "    pos = -1",
                         "if pos < 0:"] + drop + [
                         "    pos = inner._claim_row()",
                         "    n = inner._seg_len",
                         "    c = inner._seg_clear_rows",
                         "data = inner._block.data"] + rebuild, 2)
              + _indent(_write_lines(plan, ns, "data", "pos * RB", True), 2)
              + ["        inner._seg_len = n + 1", "        inner._seg_clear_rows = c - 1", "    return append"])
    pack = (["def pack_into(value, row):", "    " + plain, "        return False"]
            + _indent(lookup) + ["        return False"] + _indent(checks) + _indent(_write_lines(plan, ns, "row", "", False)) + ["    return True"])
    shared = _shared_cast(plan)
    entries = ", ".join(f"K{i}: {_unpack_expr(lf, i, ns, w, shared is not None)}"
                        for i, (lf, w) in enumerate(zip(plan.leaves, plan.leaf_wrappers)))
    unpack = ["def unpack_batch(rows):"]
    if shared is not None:
        ns["CAST"] = shared
        unpack.append("    cast = rows.astype(CAST)")
    unpack.append(f"    return {{{entries}}}")
    own_entries = ", ".join(f"K{i}: {_unpack_expr(lf, i, ns, w, shared is not None, own=True)}"
                            for i, (lf, w) in enumerate(zip(plan.leaves, plan.leaf_wrappers)))
    unpack_view = ["def unpack_view(rows):"] + unpack[1:-1] + [f"    return {{{own_entries}}}"]
    source = "\n".join(append + [""] + pack + [""] + unpack + [""] + unpack_view)
    return CompiledCodec(_define("make_append", append, ns, tag + " append"),
                         _define("pack_into", pack, ns, tag + " pack"),
                         _define("unpack_batch", unpack, ns, tag + " unpack"),
                         all(lf.is_binary or not lf.same_dtype for lf in plan.leaves), source,
                         _define("unpack_view", unpack_view, ns, tag + " unpack view"))


__all__ = ["CompiledCodec", "compile_codec"]
