"""Helpers shared by the commands: errors, progress bar, JSON output, byte formatting, optional imports."""
from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import sys
import time
from typing import Any, Dict, List, Optional, TextIO


class CLIError(Exception):
    """A failure to report as one line (`unienv-data <command>: error: ...`) with exit code 1."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def optional_import(module: str, purpose: str, package: str, extra: Optional[str] = None) -> Any:
    """Imports `module`, or raises CLIError naming the package (and the extra) to install."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        how = f"pip install {package}" + (f" (or the extra: pip install 'unienv-storage[{extra}]')" if extra else "")
        raise CLIError(f"{purpose} needs {package}, which could not be imported ({exc}); install it: {how}") from None


def add_output_flags(p: argparse.ArgumentParser, json_flag: bool = True) -> None:
    if json_flag:
        p.add_argument("--json", action="store_true", help="print the result as one JSON object on stdout")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar on stderr")


def add_backend_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backend", choices=("auto", "numpy", "pytorch"), default="auto",
                   help="array library to read with (default: the one the dataset's array storages serve)")


def print_json(obj: Any, stream: Optional[TextIO] = None) -> None:
    """Strict JSON (parsable by jq and every JSON library): non-finite floats are written as the strings
    "Infinity", "-Infinity" and "NaN"."""
    out = stream or sys.stdout
    json.dump(_jsonable(obj), out, indent=1, sort_keys=False, allow_nan=False)
    out.write("\n")


def _jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if hasattr(x, "item") and callable(x.item) and getattr(x, "ndim", 1) == 0:
        return _jsonable(x.item())
    if isinstance(x, float) and not math.isfinite(x):
        return "NaN" if math.isnan(x) else ("Infinity" if x > 0 else "-Infinity")
    return x


def human_bytes(n: Optional[float]) -> str:
    """`1.5 MiB` style sizes."""
    if n is None:
        return "?"
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{int(n)} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover


def rate(n: float, seconds: float) -> float:
    return n / seconds if seconds > 0 else float("inf")


def table(rows: List[List[str]], indent: str = "  ") -> List[str]:
    """Left-aligned columns (the last column is not padded)."""
    if not rows:
        return []
    widths = [max(len(r[i]) for r in rows if i < len(r)) for i in range(max(len(r) for r in rows))]
    out = []
    for r in rows:
        cells = [c.ljust(widths[i]) if i < len(r) - 1 else c for i, c in enumerate(r)]
        out.append(indent + "  ".join(cells).rstrip())
    return out


class Progress:
    """A progress bar on stderr (no dependency).

    On a terminal it redraws one line at most ten times a second; otherwise (a pipe, a CI log) it prints one line
    when the work is done. `enabled=False` prints nothing."""

    def __init__(self, total: Optional[int], label: str, unit: str = "rows", enabled: bool = True,
                 stream: Optional[TextIO] = None) -> None:
        self.total = total
        self.label = label
        self.unit = unit
        self.enabled = enabled
        self.stream = stream or sys.stderr
        self.tty = enabled and hasattr(self.stream, "isatty") and self.stream.isatty()
        self.done = 0
        self.start = time.perf_counter()
        self._last = 0.0
        self._closed = False

    def update(self, n: int = 1) -> None:
        self.done += n
        if self.tty:
            now = time.perf_counter()
            if now - self._last >= 0.1:
                self._last = now
                self._draw(now)

    def _draw(self, now: float, final: bool = False) -> None:
        elapsed = max(now - self.start, 1e-9)
        speed = self.done / elapsed
        if self.total:
            frac = min(1.0, self.done / self.total)
            width = 24
            filled = int(round(frac * width))
            eta = "" if final or speed <= 0 else f" eta {max(0.0, (self.total - self.done) / speed):.0f}s"
            text = (f"\r{self.label} [{'#' * filled}{'.' * (width - filled)}] {frac * 100:3.0f}% "
                    f"{self.done}/{self.total} {self.unit} {speed:,.0f} {self.unit}/s{eta}")
        else:
            text = f"\r{self.label} {self.done} {self.unit} {speed:,.0f} {self.unit}/s"
        self.stream.write(text.ljust(79))
        self.stream.flush()

    def close(self) -> None:
        if self._closed or not self.enabled:
            self._closed = True
            return
        self._closed = True
        now = time.perf_counter()
        if self.tty:
            self._draw(now, final=True)
            self.stream.write("\n")
        else:
            secs = now - self.start
            self.stream.write(f"{self.label}: {self.done} {self.unit} in {secs:.2f} s "
                              f"({rate(self.done, secs):,.0f} {self.unit}/s)\n")
        self.stream.flush()

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        if exc_type is not None and not self.tty:
            self._closed = True        # the error speaks for itself: no "done" line before it
            return
        self.close()


def prepare_output_dir(path: str, known: Any, what: str, force: bool = False) -> None:
    """Makes `path` an empty directory. An existing non-empty one is cleared only when every entry in it is one of
    the names in `known` (what an earlier run of this command writes) or `force` is given; else CLIError."""
    import shutil
    if os.path.isfile(path):
        raise CLIError(f"{path} is a file; {what} needs a directory")
    if os.path.isdir(path):
        entries = os.listdir(path)
        foreign = [e for e in entries if e not in known and not e.startswith(".")]
        if foreign and not force:
            raise CLIError(f"{path} is not empty and does not look like the output of an earlier run "
                           f"({', '.join(sorted(foreign)[:5])}{' ...' if len(foreign) > 5 else ''}); choose another "
                           "directory, empty it, or pass --force to replace it")
        for e in entries:
            full = os.path.join(path, e)
            if os.path.isdir(full) and not os.path.islink(full):
                shutil.rmtree(full)
            else:
                os.unlink(full)
    os.makedirs(path, exist_ok=True)


def keys_summary(keys: Dict[str, Any]) -> str:
    return ", ".join(f"{k} {tuple(v)}" for k, v in keys.items())
