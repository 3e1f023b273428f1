"""A replay buffer's commit log, `buffer_commit.log` next to its `metadata.json`: one appended line per commit point.

A durable buffer on disk persists its state (count, offset, its own segment list) at every ended episode, and
before rows its directory shows are overwritten (see `ReplayBuffer._guard_committed_rows`). Rewriting
`metadata.json` each time is a temporary file put in place of the old one; appending one line is a single write
(issue 17: a commit point of the native layout went from 0.64 ms to about a third of that). The storages keep their
own logs the same way (`unienv_data.storages._commit_log`, whose line format this log shares).

Records (`<crc32 hex> <json>` lines; a line that does not check was torn by a crash and ends the log):

* `{"g": G, "count": C, "offset": O}`: the buffer's count and offset; with `"k": KEY` and `"add": [s, e]` one
  segment (inclusive physical pair) appended to the list `metadata[KEY]`, or with `"k": KEY, "segs": [...]` the
  whole list (`KEY` is `physical_segments` or `buffer_segments`).

`G` is the `commit_generation` of the `metadata.json` the record builds on. Writing `metadata.json` into the
buffer's own directory (`flush`, `dumps`, `close`, and a writable `load_from` that found a log) raises the
generation, then removes the log; a crash between the two leaves records of an older generation, which
`apply_buffer_log` skips. The reference reads `metadata.json` only: after a clean close there is no log.
"""
from __future__ import annotations

import os
from typing import Any, Dict, Optional

from unienv_data.base.errors import StorageFormatError
from unienv_data.storages._commit_log import LogFile, read_records

#: the log file, in the buffer's directory
BUFFER_LOG_FILE = "buffer_commit.log"
#: the metadata key holding the generation the log builds on (absent: 0)
GENERATION_KEY = "commit_generation"
_SEGMENT_KEYS = ("physical_segments", "buffer_segments")


def apply_buffer_log(path: str, meta: Dict[str, Any]) -> Dict[str, Any]:
    """`meta` (a buffer's `metadata.json`) with the records of its directory's log applied (a new dict), or `meta`
    itself when the log holds no record of its generation. StorageFormatError for a record that checks but is
    malformed."""
    log_path = os.path.join(path, BUFFER_LOG_FILE)
    generation = meta.get(GENERATION_KEY, 0)
    out = meta
    for i, rec in enumerate(read_records(log_path)):
        if rec.get("g") != generation:
            continue            # written before metadata.json was last rewritten: it holds this state already
        if out is meta:
            out = dict(meta)
        count, offset, key = rec.get("count"), rec.get("offset"), rec.get("k")
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (count, offset)):
            raise StorageFormatError(f"{log_path}: record {i + 1} must hold int count and offset, got {rec!r}")
        out["count"], out["offset"] = count, offset
        if key is None:
            continue
        if key not in _SEGMENT_KEYS:
            raise StorageFormatError(f"{log_path}: record {i + 1} names an unknown segment list {key!r}")
        if "add" in rec:
            out[key] = list(out.get(key) or []) + [rec["add"]]
        elif "segs" in rec:
            out[key] = rec["segs"]
        else:
            raise StorageFormatError(f"{log_path}: record {i + 1} names {key!r} but holds no segments")
    return out


class BufferCommitLog:
    """The writer side: `record(meta, shown)` appends the change from `shown` (what the directory shows now:
    metadata.json and the log so far) to `meta`; `remove()` once metadata.json holds it all."""

    def __init__(self, directory: str) -> None:
        self._file = LogFile(os.path.join(directory, BUFFER_LOG_FILE))

    @property
    def path(self) -> str:
        """The log file."""
        return self._file.path

    def record(self, meta: Dict[str, Any], shown: Dict[str, Any], segments_key: Optional[str]) -> None:
        """Appends one record that turns `shown` into `meta` (both in the metadata.json form, of the generation
        `meta[GENERATION_KEY]`); `segments_key` names the buffer's own segment list, None when it keeps none."""
        rec: Dict[str, Any] = {"g": meta.get(GENERATION_KEY, 0), "count": meta["count"], "offset": meta["offset"]}
        if segments_key is not None:
            new, old = meta.get(segments_key), shown.get(segments_key)
            if new != old:
                rec["k"] = segments_key
                if new is not None and old is not None and len(new) == len(old) + 1 and new[:-1] == old:
                    rec["add"] = new[-1]
                else:
                    rec["segs"] = new
        self._file.append(rec)

    def remove(self) -> None:
        """Closes and removes the log (metadata.json now holds everything it recorded)."""
        self._file.remove()

    def close(self) -> None:
        """Closes the file (the next `record` reopens it)."""
        self._file.close()


__all__ = ["BUFFER_LOG_FILE", "GENERATION_KEY", "BufferCommitLog", "apply_buffer_log"]
