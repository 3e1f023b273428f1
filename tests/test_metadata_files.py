"""`atomic_write_json`: readers see the old or the new file, and an unchanged rewrite is skipped only while the
file on disk is still the one this process wrote."""
from __future__ import annotations

import json
import os
from pathlib import Path

from unienv_data.base.files import atomic_write_json, read_json


def test_unchanged_rewrite_is_skipped_and_changed_one_is_not(tmp_path: Path) -> None:
    path = tmp_path / "meta.json"
    atomic_write_json(path, {"length": 3, "segments": [[0, 3]]})
    first = os.stat(path)
    atomic_write_json(path, {"length": 3, "segments": [[0, 3]]})
    assert os.stat(path).st_ino == first.st_ino            # no rename: the same file stays
    atomic_write_json(path, {"length": 4, "segments": [[0, 4]]})
    assert os.stat(path).st_ino != first.st_ino
    assert read_json(str(path), "test") == {"length": 4, "segments": [[0, 4]]}
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]


def test_a_file_someone_else_replaced_or_removed_is_written_again(tmp_path: Path) -> None:
    path = tmp_path / "meta.json"
    atomic_write_json(path, {"a": 1})
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"a": 2}))
    os.replace(other, path)                                 # another writer renamed its own file in
    atomic_write_json(path, {"a": 1})
    assert read_json(str(path), "test") == {"a": 1}
    os.unlink(path)
    atomic_write_json(path, {"a": 1})
    assert read_json(str(path), "test") == {"a": 1}


def test_damaged_in_place_is_written_again(tmp_path: Path) -> None:
    path = tmp_path / "meta.json"
    atomic_write_json(path, {"segments": [[0, 5], [5, 5]]})
    with open(path, "w") as f:                              # truncated in place (same inode)
        f.write("{")
    atomic_write_json(path, {"segments": [[0, 5], [5, 5]]})
    assert read_json(str(path), "test") == {"segments": [[0, 5], [5, 5]]}


def test_a_durable_request_rewrites_what_was_written_without_fsync(tmp_path: Path) -> None:
    path = tmp_path / "meta.json"
    atomic_write_json(path, {"a": 1}, durable=False)
    ino = os.stat(path).st_ino
    atomic_write_json(path, {"a": 1}, durable=True)
    assert os.stat(path).st_ino != ino
    ino = os.stat(path).st_ino
    atomic_write_json(path, {"a": 1}, durable=False)     # already durable: nothing to add
    assert os.stat(path).st_ino == ino
