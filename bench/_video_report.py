"""The table and the target verdicts of `bench_video.py` (split out to keep that script short)."""
from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Tuple


def _f(x: Any, nd: int = 0) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    if isinstance(x, float) and math.isinf(x):
        return "inf"
    return f"{x:,.{nd}f}"


def _ratio(a: Any, b: Any) -> Optional[float]:
    if a is None or b is None or not b:
        return None
    return float(a) / float(b)


Target = Tuple[str, Optional[float], str, Optional[bool], Optional[float]]


def targets(out: Dict[str, Any]) -> List[Target]:
    """(what, measured, limit, passed, the same ratio in CPU time) for every target of issue #3 this run measured."""
    rows = {k: v for k, v in out["rows"].items() if "error" not in v and "rand_fps" in v}
    got: List[Target] = []

    def add(what: str, value: Optional[float], op: str, limit: float, cpu: Optional[float] = None) -> None:
        ok = None if value is None else (value <= limit if op == "<=" else value >= limit)
        got.append((what, value, f"{op} {limit:g}", ok, cpu))

    def both(a: Dict[str, Any], b: Dict[str, Any], key: str) -> Tuple[Optional[float], Optional[float]]:
        return _ratio(a[f"{key}_fps"], b[f"{key}_fps"]), _ratio(a[f"{key}_cpu_fps"], b[f"{key}_cpu_fps"])

    d = rows.get("ours-default")
    if d:
        add("ours-default bytes / raw (%)", 100 * d["bytes_ratio"], "<=", 1.0)
        add("ours-default PSNR (dB)", d["psnr"], ">=", 31.0)
        if "png" in rows:
            wall, cpu = both(d, rows["png"], "rand")
            add("ours-default rand-256 / png", wall, ">=", 1.0, cpu)
    for ours, ref in out["same_settings"].items():
        if ours in rows and ref in rows:
            wall, cpu = both(rows[ours], rows[ref], "rand")
            add(f"{ours} rand-256 / {ref}", wall, ">=", 2.0, cpu)
            wall, cpu = both(rows[ours], rows[ref], "encode")
            add(f"{ours} encode / {ref}", wall, ">=", 1.0, cpu)
    for name in [n for n, r in rows.items() if r["kind"] == "ours"]:
        r = rows[name]
        if (r.get("config") or {}).get("gop", 2) > 1:  # intra-only files: a slice costs what random frames cost
            add(f"{name} slice-64 / its rand-256", _ratio(r["slice_fps"], r["rand_fps"]), ">=", 3.0,
                _ratio(r["slice_cpu_fps"], r["rand_cpu_fps"]))
    for name in out["lossless"]:
        if name in rows:
            got.append((f"{name} bit-exact", None, "exact", bool(rows[name]["exact"]), None))
    return got


def render(out: Dict[str, Any]) -> str:
    p = out["protocol"]
    rows = out["rows"]
    mm, png = rows.get("memmap", {}), rows.get("png", {})
    h, w = p["frame"]
    lines = [f"\nVideo, {p['episodes']} x {p['steps']} frames of {h}x{w}x3 (raw {p['raw_bytes'] / 1e6:.1f} MB), "
             f"{p['repeats']} repeats (medians); data: {p['data']}", "",
             "| row | codec, GOP | bytes / raw | PSNR dB | encode f/s | seq f/s | rand-256 f/s | slice-64 f/s | "
             "rand / memmap | rand / png | slice / rand | encode / ref | rand / ref |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in rows.items():
        if "error" in r:
            lines.append(f"| {name} | FAILED: {r['error'][:100]} |" + " |" * 11)
            continue
        cfg = r.get("config") or {}
        gop = cfg.get("gop") if r["kind"] == "ours" else ((cfg.get("kwargs") or {}).get("encoder_options") or {}).get("g")
        codec = "-" if r["kind"] == "anchor" else f"{cfg.get('codec', '-')}, {gop or 'default'}"
        ref = rows.get(out["same_settings"].get(name, ""), {})
        q = "exact" if r.get("exact") else _f(r.get("psnr"), 2)
        lines.append(
            f"| {name} | {codec} | {_f(r.get('bytes_ratio'), 4)} | {q} | {_f(r.get('encode_fps'))} | "
            f"{_f(r.get('seq_fps'))} | {_f(r.get('rand_fps'))} | {_f(r.get('slice_fps'))} | "
            f"{_f(_ratio(r.get('rand_fps'), mm.get('rand_fps')), 4)} | {_f(_ratio(r.get('rand_fps'), png.get('rand_fps')), 2)} | "
            f"{_f(_ratio(r.get('slice_fps'), r.get('rand_fps')), 2)} | "
            f"{_f(_ratio(r.get('encode_fps'), ref.get('encode_fps')), 2)} | "
            f"{_f(_ratio(r.get('rand_fps'), ref.get('rand_fps')), 2)} |")
    lines += ["", "CPU time (frames per CPU-second of the process, all its threads; less sensitive to other load "
              "than wall time, blind to parallelism):", "",
              "| row | encode f/cpu-s | rand-256 f/cpu-s | slice-64 f/cpu-s |", "|---|---|---|---|"]
    for name, r in rows.items():
        if "rand_cpu_fps" in r:
            lines.append(f"| {name} | {_f(r.get('encode_cpu_fps'))} | {_f(r['rand_cpu_fps'])} | "
                         f"{_f(r['slice_cpu_fps'])} |")
    lines += ["", "Targets (issue #3; verdicts on wall time):", "",
              "| target | measured (wall) | limit | verdict | same ratio in CPU time |", "|---|---|---|---|---|"]
    for what, value, limit, ok, cpu in targets(out):
        shown = ("yes" if ok else "NO") if value is None else _f(value, 2)
        lines.append(f"| {what} | {shown} | {limit} | {'-' if ok is None else ('PASS' if ok else 'over')} | "
                     f"{_f(cpu, 2)} |")
    bad = [n for n, r in rows.items() if r.get("rand_matches_seq") is False or r.get("slice_matches_seq") is False]
    lines.append(f"\nCorrectness: random / slice reads equal the row's own sequential decode: "
                 f"{'all rows' if not bad else 'MISMATCH in ' + ', '.join(bad)}")
    spread = {n: r["rand_spread"] for n, r in rows.items() if "rand_spread" in r}
    if spread:
        lines.append("Noise: rand-256 spread (max - min) / median over repeats: "
                     + ", ".join(f"{n} {100 * s:.0f}%" for n, s in spread.items()))
    la0, la1 = out["env"].get("loadavg_start"), out["env"].get("loadavg_end")
    if la0 and la1:
        lines.append(f"Load average (1 min) at start / end: {la0[0]:.2f} / {la1[0]:.2f} on {out['env']['cpus']} CPUs")
    for note in out["notes"]:
        lines.append(f"Note: {note}")
    return "\n".join(lines) + "\n"
