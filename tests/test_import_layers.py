"""The package's import structure: no module imports another that imports it back (directly or around a loop), and
the layer contracts of pyproject.toml hold (`lint-imports`, also run by `scripts/run.sh mypy`)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Set

import pytest
from _third_party import in_ci, require_module

grimp = require_module("grimp", "dev")  # comes with import-linter

ROOT = Path(__file__).resolve().parents[1]


def _cycles(graph: "grimp.ImportGraph") -> List[List[str]]:
    """Strongly connected components of more than one module (iterative Tarjan)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    on_stack: Set[str] = set()
    stack: List[str] = []
    out: List[List[str]] = []
    counter = 0
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.find_modules_directly_imported_by(child)))))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return out


def test_no_import_cycles_between_modules() -> None:
    graph = grimp.build_graph("unienv_interface", "unienv_data", include_external_packages=False,
                              exclude_type_checking_imports=True)
    assert _cycles(graph) == []


def test_cycle_finder_sees_a_cycle(tmp_path: Path) -> None:
    pkg = tmp_path / "cyc_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from cyc_pkg import b\n")
    (pkg / "b.py").write_text("def f():\n    from cyc_pkg import a\n")
    sys.path.insert(0, str(tmp_path))
    try:
        graph = grimp.build_graph("cyc_pkg", include_external_packages=False)
    finally:
        sys.path.remove(str(tmp_path))
    assert _cycles(graph) == [["cyc_pkg.a", "cyc_pkg.b"]]


def test_layer_contracts_hold() -> None:
    exe = Path(sys.executable).with_name("lint-imports")
    if not exe.exists():
        if in_ci():
            pytest.fail("lint-imports is not installed (the dev extra); CI must run this test")
        pytest.skip("lint-imports is not installed (the dev extra)")
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    run = subprocess.run([str(exe), "--config", str(ROOT / "pyproject.toml")], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]


def _private_access_scan() -> "object":
    import importlib.util
    spec = importlib.util.spec_from_file_location("check_private_access", ROOT / "scripts" / "check_private_access.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_no_library_code_reads_another_objects_private_attributes() -> None:
    """scripts/check_private_access.py (also run by `scripts/run.sh mypy`) passes: the allow-list is honoured and
    holds at most 10 entries."""
    run = subprocess.run([sys.executable, str(ROOT / "scripts" / "check_private_access.py")], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]


def test_the_private_access_scan_finds_outside_reads(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text(
        "class A:\n"
        "    def f(self, other):\n"
        "        return self._x, type(self)._y, super()._z, other._w\n"
        "def g(a, t):\n"
        "    return a._v, t._replace(), t.__len__()\n")
    found = [expr for _, _, expr in _private_access_scan().scan(tmp_path)]  # type: ignore[attr-defined]
    assert sorted(found) == ["a._v", "other._w"]
