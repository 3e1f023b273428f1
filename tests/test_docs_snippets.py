"""Every ```python block of docs/*.md and README.md runs, and so do the examples.

The blocks of one page run in order in one namespace (a page may build a storage in one block and read it in the
next), in a fresh temporary working directory; paths written as "/tmp/..." in a block are moved into that
directory too, so concurrent test runs never share files. Markers, as a comment line inside a block:

* `# doc: no-run`: the block is only compiled (syntax-checked), not run;
* `# doc: requires mod1, mod2`: the rest of the page is skipped when one of the modules cannot be imported.
"""
from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest

ROOT = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.S | re.M)
REQUIRES = re.compile(r"^\s*#\s*doc:\s*requires\s+(.+)$", re.M)


def python_blocks(path: Path) -> List[Tuple[int, str]]:
    """`(line number, code)` of every ```python block of a Markdown file."""
    text = path.read_text()
    return [(text.count("\n", 0, m.start(1)) + 1, m.group(1)) for m in FENCE.finditer(text)]


#: every page with at least one python block (pages of prose and shell commands only have nothing to run)
PAGES = [p for p in sorted((ROOT / "docs").rglob("*.md")) + [ROOT / "README.md"] if python_blocks(p)]


def _page_id(path: Path) -> str:
    return str(path.relative_to(ROOT))


def test_the_docs_have_snippets() -> None:
    assert len(PAGES) >= 12 and sum(len(python_blocks(p)) for p in PAGES) >= 20


@pytest.mark.parametrize("path", PAGES, ids=_page_id)
def test_snippets_compile(path: Path) -> None:
    for line, code in python_blocks(path):
        compile(code, f"{path}:{line}", "exec")


@pytest.mark.parametrize("path", PAGES, ids=_page_id)
def test_snippets_run(path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocks = python_blocks(path)
    monkeypatch.chdir(tmp_path)
    namespace: Dict[str, Any] = {"__name__": "__doc_snippet__"}
    for line, code in blocks:
        if "# doc: no-run" in code:
            continue
        for match in REQUIRES.finditer(code):
            for module in (m.strip() for m in match.group(1).split(",")):
                if importlib.util.find_spec(module) is None:
                    pytest.skip(f"{_page_id(path)}:{line} needs {module}")
        code = code.replace('"/tmp/', f'"{tmp_path}/').replace("'/tmp/", f"'{tmp_path}/")
        try:
            exec(compile(code, f"{path}:{line}", "exec"), namespace)
        except Exception as exc:
            raise AssertionError(f"the snippet at {_page_id(path)}:{line} failed: {type(exc).__name__}: {exc}") from exc
    for value in list(namespace.values()):        # release files the page left open
        close = getattr(value, "close", None)
        if callable(close) and type(value).__module__.startswith("unienv_data"):
            try:
                close()
            except Exception:  # noqa: BLE001 - best effort cleanup
                pass


# ---------------------------------------------------------------------------------------------------- examples
def _run_example(name: str, *args: Any) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / name)] + [str(a) for a in args],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{name} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc


def test_example_record_gym(tmp_path: Path) -> None:
    from _third_party import require_module
    require_module("gymnasium", "gym")
    out = tmp_path / "gym"
    proc = _run_example("record_gym.py", "--out", out, "--episodes", 3, "--max-steps", 30)
    assert "recorded 3 episodes" in proc.stdout and "from CartPole-v1" in proc.stdout
    assert "reopened from disk" in proc.stdout and "in 3 episodes" in proc.stdout
    assert (out / "metadata.json").is_file()


def test_example_train_dataloader(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    proc = _run_example("train_dataloader.py", "--data", tmp_path / "ds", "--epochs", 2, "--episodes", 3,
                        "--batch-size", 32)
    assert "epoch 2" in proc.stdout and "windows" in proc.stdout
