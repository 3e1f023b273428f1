"""Small helpers the file-format storages share (re-exported by `_list_storage`): optional imports with an error
naming the extra, capacity and count checks, new storage directories, numbered files in a directory, atomic file
replacement, hard-link-or-copy (from `base.files`), written-row runs."""
from __future__ import annotations

import os
import re
import shutil
from typing import Any, Callable, Dict, List, Optional

import numpy as np

from unienv_data.base.arguments import check_capacity, check_count, import_optional
from unienv_data.base.errors import StorageFormatError
from unienv_data.base.files import link_or_copy, replacing_allowed, replacing_file


def require_module(module: str, extra: str, who: str) -> Any:
    """Imports an optional dependency (see `unienv_data.base.arguments.import_optional`)."""
    return import_optional(module, extra, who)


def replace_file(write: Callable[[str], None], final: str) -> None:
    """Writes a file through `write(tmp_path)` and puts it in place of `final` (`replacing_file`)."""
    with replacing_file(final) as tmp:
        write(tmp)


def prepare_new_directory(path: Any, user: str) -> str:
    """Creates the directory a new storage lives in; an existing non-empty directory is refused, so a new storage
    never silently picks up old files."""
    if path is None:
        raise ValueError(f"{user} keeps its files in a directory: cache_path is required")
    path = os.fspath(path)
    if os.path.exists(path):
        if not os.path.isdir(path):
            raise FileExistsError(f"{user}: cache_path {path} exists and is not a directory")
        if os.listdir(path) and replacing_allowed():
            shutil.rmtree(path)         # create(..., overwrite=True): the old storage's files go
        elif os.listdir(path):
            raise FileExistsError(f"{user}: cache_path {path} is not empty; choose a new directory (a new storage "
                                  "never reuses old files)")
    os.makedirs(path, exist_ok=True)
    return path


def numbered_files(directory: str, pattern: "re.Pattern[str]", ext: Optional[str] = None) -> Dict[int, str]:
    """`{number: name}` of the files in `directory` whose names `pattern` matches (group 1: the number; with `ext`,
    group 2 must equal it). A directory that does not exist holds none."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return {}
    out: Dict[int, str] = {}
    for name in names:
        m = pattern.match(name)
        if m and (ext is None or m.group(2) == ext):
            out[int(m.group(1))] = name
    return out


def mask_to_runs(mask: np.ndarray) -> List[List[int]]:
    """`[[start, length], ...]` of the True runs of a 1-D bool array."""
    if not mask.size:
        return []
    padded = np.concatenate(([False], mask.astype(bool), [False]))
    edges = np.flatnonzero(padded[1:] != padded[:-1])
    return [[int(s), int(e - s)] for s, e in zip(edges[0::2], edges[1::2])]


#: the most rows a storage keeping one file (or one record) per row indexes (NPZ, Image, Video: frame numbers are
#: int32, and the per-row index and written mask cost bytes per row): more is damaged metadata
MAX_MASK_ROWS = 2 ** 31 - 1


def runs_to_mask(runs: Any, length: int, where: str) -> np.ndarray:
    """The bool mask of `[[start, length], ...]` runs (StorageFormatError naming a bad entry)."""
    if length > MAX_MASK_ROWS:
        raise StorageFormatError(f"{where}: {length} rows is beyond what a file-per-row storage holds "
                                 f"({MAX_MASK_ROWS}): the metadata is damaged")
    mask = np.zeros(length, dtype=bool)
    if not isinstance(runs, list):
        raise StorageFormatError(f"{where}: 'written' must be a list of [start, length] pairs")
    for i, r in enumerate(runs):
        ok = (isinstance(r, list) and len(r) == 2 and all(isinstance(v, int) and not isinstance(v, bool) for v in r)
              and r[0] >= 0 and r[1] > 0 and r[0] + r[1] <= length)
        if not ok:
            raise StorageFormatError(f"{where}: 'written' entry {i} = {r!r} is not a [start, length] run within "
                                     f"{length} rows")
        mask[r[0]:r[0] + r[1]] = True
    return mask


def _contiguous(arr: np.ndarray) -> np.ndarray:
    """`arr` as a C-contiguous array of the same shape (np.ascontiguousarray would make a 0-d array 1-d)."""
    return arr if arr.flags.c_contiguous else np.array(arr, order="C")
