"""The test kit (`unienv_data.testing`) as a third party uses it: the example storage and test class of
docs/testing.md (the page's code itself, run here) pass the whole contract and the state machine; importing
`unienv_data` needs neither pytest nor hypothesis."""
from __future__ import annotations

import subprocess
import sys
import types
from pathlib import Path

from test_docs_snippets import python_blocks
from unienv_data.testing.state_machine import StorageModel

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "testing.md"

# The page's blocks, run in order in one real module (so that pickling the example storage finds its class). The
# last block (a standalone state machine run) is left to tests/test_docs_snippets.py.
_doc = types.ModuleType("unienv_docs_testing_example")
sys.modules[_doc.__name__] = _doc
for _line, _code in python_blocks(DOC)[:2]:
    exec(compile(_code, f"{DOC}:{_line}", "exec"), _doc.__dict__)

TestDictOfListsStorage = _doc.TestDictOfListsStorage
DictOfListsStorage = _doc.DictOfListsStorage


def test_the_page_holds_the_example() -> None:
    blocks = python_blocks(DOC)
    assert len(blocks) == 4     # the example, its tests, a standalone state machine run, a create helper
    assert "class DictOfListsStorage(SpaceStorage)" in blocks[0][1]
    assert "class TestDictOfListsStorage(StorageConformance)" in blocks[1][1]


def test_importing_unienv_data_needs_neither_pytest_nor_hypothesis() -> None:
    code = ("import sys, unienv_data, unienv_data.storages, unienv_data.replay_buffer, unienv_data.base; "
            "bad = [m for m in ('pytest', 'hypothesis', 'unienv_data.testing') if m in sys.modules]; "
            "assert not bad, bad")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**__import__("os").environ, "PYTHONPATH": str(ROOT / "src")})
    assert proc.returncode == 0, proc.stderr


def test_model_segment_rule() -> None:
    """The model's segment rule on hand-checked cases (so a model bug cannot hide a storage bug)."""
    m = StorageModel(7, 0)
    m.record(5, 3)                      # rows 5, 6, 0
    assert m.expected_segments() == [(5, 0)]
    m.record(1, 2)
    assert m.expected_segments() == [(1, 2), (5, 0)]   # position order
    m.record(0, 1)                      # row 0 clips the wrapping segment to rows 5, 6
    assert m.expected_segments() == [(0, 0), (1, 2), (5, 6)]
    m.record(0, 7)                      # the whole ring
    assert m.expected_segments() == [(0, 6)]
    g = StorageModel(None, 0)
    g.commit(0, [1] * 4)
    g.commit(4, [2] * 2)
    assert len(g) == 6 and g.expected_segments() == [(0, 3), (4, 5)]
    g.shrink(1)
    assert g.expected_segments() == [(0, 3)]


def test_staged_model_discards_aborted_rows() -> None:
    """A staged segment (VideoStorage) writes its rows at mark_segment_end only; abort discards them."""
    m = StorageModel(4, 0, staged=True)
    m.record(0, 2)
    m.open = [1, 0]
    m.append_open(7)
    assert m.rows == [0, 0, 0, 0] and m.expected_segments() == [(0, 1)]
    m.abort_open()
    assert m.rows == [0, 0, 0, 0] and m.expected_segments() == [(0, 1)]
    m.open = [1, 0]
    m.append_open(7)
    m.end_open()
    assert m.rows == [0, 7, 0, 0] and m.expected_segments() == [(0, 0), (1, 1)]
