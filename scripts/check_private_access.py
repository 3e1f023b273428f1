"""Fail when library code reads another object's private attributes.

A private attribute (``_name``, not a dunder) belongs to the class that defines it: code outside that class uses the
public API or a named, documented hook instead. This scan walks ``src/`` and reports every ``x._name`` whose ``x`` is
not ``self``, ``cls``, ``super()`` or ``type(self)``. The few accesses the project accepts are listed, with a reason,
in ``scripts/private_access_allowlist.txt`` (one ``path: expression`` a line; ``#`` starts a comment).

Usage: ``python scripts/check_private_access.py [--list]`` (``--list`` prints every access, allowed or not).
Exit status 1 when an access is not on the list, or when the list names one that no longer exists.
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path
from typing import List, Set, Tuple

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src"
ALLOWLIST = ROOT / "scripts" / "private_access_allowlist.txt"
MAX_ALLOWED = 10

# Leading-underscore names that are public API of the standard library (namedtuple's methods, os._exit, sys._getframe).
STDLIB_PUBLIC = frozenset({"_asdict", "_replace", "_fields", "_make", "_field_defaults", "_exit", "_getframe"})
OWN = frozenset({"self", "cls"})


def _is_own(value: ast.expr) -> bool:
    if isinstance(value, ast.Name):
        return value.id in OWN
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Name):
        return value.func.id in ("super", "type")
    return False


def scan(src: Path = SRC) -> List[Tuple[str, int, str]]:
    """Every private access in ``src`` as ``(path relative to src, line, expression)``."""
    found = []
    for path in sorted(src.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        rel = path.relative_to(src).as_posix()
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute):
                continue
            name = node.attr
            if not name.startswith("_") or (name.startswith("__") and name.endswith("__")):
                continue
            if name in STDLIB_PUBLIC or _is_own(node.value):
                continue
            found.append((rel, node.lineno, ast.unparse(node)))
    return found


def read_allowlist(path: Path = ALLOWLIST) -> Set[str]:
    entries = set()
    if path.exists():
        for raw in path.read_text(encoding="utf-8").splitlines():
            line = raw.split("#", 1)[0].strip()
            if line:
                entries.add(line)
    return entries


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list", action="store_true", help="print every access found, allowed or not")
    args = parser.parse_args(argv)
    found = scan()
    allowed = read_allowlist()
    used = set()
    bad = []
    for rel, line, expr in found:
        key = f"{rel}: {expr}"
        if key in allowed:
            used.add(key)
        else:
            bad.append(f"src/{rel}:{line}: {expr}")
        if args.list:
            print(f"src/{rel}:{line}: {expr}{'  (allowed)' if key in allowed else ''}")
    status = 0
    if bad:
        print(f"{len(bad)} private attribute access(es) from outside the owning class:")
        for item in bad:
            print(f"  {item}")
        print("Use the public API or a named hook; see scripts/check_private_access.py.")
        status = 1
    stale = sorted(allowed - used)
    if stale:
        print(f"{len(stale)} allow-list entr(y/ies) match nothing any more; remove them from {ALLOWLIST.name}:")
        for item in stale:
            print(f"  {item}")
        status = 1
    if len(allowed) > MAX_ALLOWED:
        print(f"the allow-list holds {len(allowed)} entries; at most {MAX_ALLOWED} are accepted")
        status = 1
    if status == 0:
        print(f"private access check: {len(found)} allowed access(es), {len(allowed)} allow-list entries")
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
