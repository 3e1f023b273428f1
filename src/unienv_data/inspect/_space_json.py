"""Space JSON as metadata files write it, read without building a space: leaves, sizes, one-line descriptions."""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import numpy as np


def leaf_items(space_json: Any, path: Tuple[str, ...] = ()) -> List[Tuple[Tuple[str, ...], Dict[str, Any]]]:
    """`[(key path, leaf JSON)]` of a space JSON, in its key order (tuples index their entries "0", "1", ...)."""
    if not isinstance(space_json, dict):
        return []
    kind = space_json.get("type")
    if kind == "DictSpace" and isinstance(space_json.get("spaces"), dict):
        out: List[Tuple[Tuple[str, ...], Dict[str, Any]]] = []
        for k, v in space_json["spaces"].items():
            out.extend(leaf_items(v, path + (str(k),)))
        return out
    if kind == "TupleSpace" and isinstance(space_json.get("spaces"), list):
        out = []
        for i, v in enumerate(space_json["spaces"]):
            out.extend(leaf_items(v, path + (str(i),)))
        return out
    return [(path, space_json)]


def itemsize(dtype_name: Any) -> int:
    """Bytes per element of a dtype written in metadata (bfloat16 included); 0 when unknown."""
    name = str(dtype_name).replace("torch.", "")
    if name == "bfloat16":
        return 2
    try:
        return int(np.dtype(name).itemsize)
    except TypeError:
        return 0


def leaf_nbytes(leaf: Dict[str, Any]) -> int:
    """Bytes of one sample of a Box / Binary leaf in its own dtype (0 for other leaves)."""
    if leaf.get("type") not in ("BoxSpace", "BinarySpace"):
        return 0
    n = 1
    for d in leaf.get("shape") or []:
        n *= int(d)
    return n * itemsize(leaf.get("dtype", "bool"))


def is_image_leaf(leaf: Dict[str, Any]) -> bool:
    """uint8 Box leaves shaped (H, W), (H, W, 1), (H, W, 3) or (H, W, 4), and leaves marked `kind: image`."""
    meta = leaf.get("metadata")
    if isinstance(meta, dict) and meta.get("kind") == "image":
        return True
    if leaf.get("type") != "BoxSpace" or str(leaf.get("dtype")) != "uint8":
        return False
    shape = list(leaf.get("shape") or [])
    return (len(shape) == 3 and shape[-1] in (1, 3, 4) and min(shape[:2]) >= 8) or (
        len(shape) == 2 and min(shape) >= 8)


def _bound_text(v: Any) -> str:
    if isinstance(v, list):
        flat = np.asarray(v, dtype=np.float64).ravel()
        return f"{_num(flat.min())}..{_num(flat.max())}" if flat.size else "[]"
    return _num(v)


def _num(v: Any) -> str:
    if isinstance(v, (int, np.integer)) and not isinstance(v, bool):
        return str(int(v))
    try:
        f = float(v)
    except (TypeError, ValueError):
        return str(v)
    if np.isinf(f):
        return "inf" if f > 0 else "-inf"
    return f"{f:g}"


def describe_leaf(leaf: Dict[str, Any]) -> str:
    """One line describing a leaf space JSON, e.g. `Box float32 (2,) [-1, 1]`."""
    kind = leaf.get("type", "?")
    shape = tuple(leaf.get("shape") or [])
    if kind == "BoxSpace":
        return f"Box {leaf.get('dtype')} {shape} [{_bound_text(leaf.get('low'))}, {_bound_text(leaf.get('high'))}]"
    if kind == "BinarySpace":
        return f"Binary {leaf.get('dtype', 'bool')} {shape}"
    if kind == "TextSpace":
        return f"Text length {leaf.get('min_length')}..{leaf.get('max_length')}"
    return str(kind)


def space_tree_lines(space_json: Any, indent: str = "  ") -> List[str]:
    """The space as indented lines: sub-dicts as `key/`, leaves as `key  <description>`."""
    lines: List[str] = []

    def visit(js: Any, depth: int, name: Optional[str]) -> None:
        kind = js.get("type") if isinstance(js, dict) else None
        if kind in ("DictSpace", "TupleSpace") and isinstance(js.get("spaces"), (dict, list)):
            if name is not None:
                lines.append(f"{indent * depth}{name}/")
                depth += 1
            items = js["spaces"].items() if isinstance(js["spaces"], dict) else enumerate(js["spaces"])
            for k, v in items:
                visit(v, depth, str(k))
            return
        lines.append(f"{indent * depth}{name if name is not None else '<value>'}  {describe_leaf(js or {})}")

    visit(space_json, 0, None)
    return lines


def _sub_json(space_json: Optional[Dict[str, Any]], path: Tuple[str, ...]) -> Optional[Dict[str, Any]]:
    node = space_json
    for p in path:
        if not isinstance(node, dict) or node.get("type") != "DictSpace" or p not in (node.get("spaces") or {}):
            return None
        node = node["spaces"][p]
    return node


def _prune_json(space_json: Dict[str, Any], keep: List[Tuple[str, ...]]) -> Dict[str, Any]:
    """The sub-dict JSON holding exactly the leaves `keep` (paths relative to `space_json`)."""
    if () in keep or space_json.get("type") != "DictSpace":
        return space_json
    out: Dict[str, Any] = {}
    for k, v in (space_json.get("spaces") or {}).items():
        sub = [p[1:] for p in keep if p and p[0] == k]
        if sub:
            out[k] = _prune_json(v, sub)
    return {"type": "DictSpace", "spaces": out}
