"""`unienv-data info PATH`: what a dataset holds, read from its metadata files only (no data is loaded).

Prints the kind (ReplayBuffer directory or storage), length and capacity, the episodes (segments), the space
tree, every storage with the keys it holds, its capacity, length, segments, bytes and how it stores them, the bytes
per key on disk next to the raw bytes of the same samples in their own dtype, and the format version of every
metadata file. Problems found in the metadata are listed (run `verify` for a full check). Another tool's dataset
(a LeRobot or Minari folder) is opened with its reader and summarised the same way, with what that format records
besides (a LeRobot dataset's fps, tasks and video codecs).
"""
from __future__ import annotations

import argparse
from typing import Any, Dict, List, Optional

import numpy as np

from ._common import add_output_flags, human_bytes, print_json, table


def add_parser(sub: Any) -> None:
    p = sub.add_parser("info", help="space tree, storages per key, capacity, length, segments, bytes, versions",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("path", metavar="PATH", help="dataset directory (or one .memmap array file)")
    p.add_argument("--episodes", action="store_true", help="list every episode's logical [start, end) range")
    add_output_flags(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from unienv_data.inspect import describe
    from ._foreign import describe_foreign, detect
    fmt = detect(args.path)   # another tool's dataset (a LeRobot or Minari folder)
    d = describe_foreign(fmt, args.path) if fmt else describe(args.path)
    if args.json:
        print_json(d)
        return 0
    for line in render(d, all_episodes=args.episodes):
        print(line)
    return 0


def raw_ratio(on_disk: int, raw: int) -> str:
    """On-disk bytes against the raw bytes, readable at any size: "1.02x raw" at 10% of raw and above, else a
    percentage with two significant digits ("0.49% of raw" for a well-compressed video key, never "0.00x raw")."""
    ratio = on_disk / raw
    if ratio >= 0.1:
        return f"{ratio:.2f}x raw"
    return f"{100 * ratio:.2g}% of raw"


def _ring_ratio(on_disk: int, raw: Optional[int], rows: int, ring_rows: int) -> str:
    """The ratio column of a key held in preallocated ring files: their size is that of `ring_rows` rows (the
    capacity) however many are written, so the ratio is against the raw bytes of that many rows (the total line
    says how much of it the disk has allocated)."""
    text = f"file size of a preallocated ring ({ring_rows} rows)"
    if raw and rows:
        text += ": " + raw_ratio(on_disk, raw * ring_rows // rows)
    return text


def render(d: Dict[str, Any], all_episodes: bool = False) -> List[str]:
    lines: List[str] = []
    versions = sorted({v for v in d["format_versions"].values() if v is not None})
    vtext = ", ".join("0 (reference unienv)" if v == 0 else str(v) for v in versions) or "?"
    lines.append(f"{d['path']}: {d['kind']} (format version {vtext})")
    cap = d["capacity"]
    captext = "growable (no fixed capacity)" if cap is None else f"capacity {cap} (a ring)"
    off = f", offset {d['offset']}" if d.get("offset") is not None else ""
    lines.append(f"  length {d['length']} steps, {captext}{off}")
    lengths = d["episode_lengths"]
    if lengths:
        lines.append(f"  episodes {len(lengths)}: {sum(lengths)} steps, lengths {min(lengths)}..{max(lengths)} "
                     f"(mean {np.mean(lengths):.1f})")
        eps = d["episodes"]
        if not all_episodes and len(eps) > 6:
            eps = eps[:3] + [None] + eps[-2:]
        lines.append("    " + ", ".join("..." if e is None else f"[{e[0]}, {e[1]})" for e in eps))
    else:
        lines.append("  episodes: none recorded")
    for k, v in (d.get("details") or {}).items():   # what another tool's dataset records besides (LeRobot tasks, ...)
        lines.append(f"  {k.replace('_', ' ')}: {_short(v)}")
    if d["space_tree"]:
        lines.append("space:")
        lines.extend("  " + s for s in _aligned_tree(d["space_tree"]))
    lines.append("storages:")
    rows = []
    for s in d["storages"]:
        name = "  " * s["depth"] + (s["path"] if s["depth"] == 0 else s["path"].rsplit("/", 1)[-1])
        if s["key"]:
            name += f"  [{s['key']}]"
        v = "?" if s["format_version"] is None else f"v{s['format_version']}"
        size = f"cap {s['capacity'] if s['capacity'] is not None else '-'} len {s['length']}"
        segs = "" if s["segments"] is None else f"{s['segments']} seg"
        rows.append([name, s["kind"], v, size, segs, human_bytes(s["total_bytes"]), s["details"]])
    lines.extend(table(rows))
    lines.append("bytes per key (on disk | raw samples in their own dtype):")
    raw = d["raw_bytes_per_key"]
    total = max(1, d["total_bytes"])
    rows = []
    for k, n in sorted(d["bytes_per_key"].items(), key=lambda kv: -kv[1]):
        r = raw.get(k)
        ratio = raw_ratio(n, r) if r else ""
        ring_rows = (d.get("preallocated_rows_per_key") or {}).get(k)
        if ring_rows is not None and ring_rows != d["length"]:
            ratio = _ring_ratio(n, r, d["length"] or 0, ring_rows)
        rows.append([k, human_bytes(n), f"{100 * n / total:5.1f}%", human_bytes(r) if r is not None else "", ratio])
    lines.extend(table(rows))
    lines.append(disk_total_line(d))
    notes = [n for s in d["storages"] for n in s["notes"]]
    for n in notes:
        lines.append(f"note: {n}")
    if d["problems"]:
        lines.append(f"problems ({len(d['problems'])}; run 'unienv-data verify' for a full check):")
        lines.extend(f"  {p}" for p in d["problems"])
    return lines


def _short(value: Any, limit: int = 160) -> str:
    """`value` on one line: a mapping as `key: value; ...`, cut at `limit` characters."""
    text = "; ".join(f"{k}: {v!r}" for k, v in value.items()) if isinstance(value, dict) else repr(value)
    return text if len(text) <= limit else text[:limit - 4] + " ..."


def _aligned_tree(tree: List[str]) -> List[str]:
    """The space tree's leaf descriptions lined up in one column."""
    rows = []
    for line in tree:
        stripped = line.lstrip(" ")
        indent = line[:len(line) - len(stripped)]
        if stripped.endswith("/") and "  " not in stripped:
            rows.append([indent + stripped, ""])
        else:
            key, _, desc = stripped.partition("  ")
            rows.append([indent + key, desc])
    return table(rows, indent="")


def disk_total_line(d: Dict[str, Any]) -> str:
    """The "total ... on disk" line of a `describe` summary: the allocated bytes, and the files' (apparent) sizes
    too when a preallocated ring leaves much of them unwritten (holes that take no disk space)."""
    alloc = d.get("allocated_bytes")
    if alloc is not None and alloc < 0.9 * d["total_bytes"]:
        return (f"  total {human_bytes(alloc)} allocated on disk, {human_bytes(d['total_bytes'])} apparent (the "
                "files' sizes; preallocated rows not yet written take no disk space)")
    return f"  total {human_bytes(d['total_bytes'])} on disk"
