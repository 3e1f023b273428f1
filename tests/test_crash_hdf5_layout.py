"""Why HDF5Storage survives a kill at any instant (docs/guarantees.md, "HDF5"): after its file is written, a commit
point of an uncompressed layout changes only bytes inside the datasets' data (memory-mapped rows, preallocated
chunks); HDF5's own structures (superblock, object headers, chunk index, heaps) are never rewritten in place, the
state goes to the sidecar `<file>.state.json` by an atomic rename, and growth or trimming writes a new file that
replaces the old one by a rename.

Checked byte for byte: the file before and after writes + `flush()` differs only inside the data extents that
h5py reports for the datasets.
"""
from __future__ import annotations

import json
import os
from typing import Any, List, Tuple

import numpy as np
import pytest

h5py = pytest.importorskip("h5py")

from unienv_data.storages.hdf5 import STATE_SUFFIX, HDF5Storage  # noqa: E402
from unienv_interface.backends import NumpyComputeBackend as NB  # noqa: E402
from unienv_interface.space import BoxSpace, DictSpace  # noqa: E402

SPACE = DictSpace(NB, {"x": BoxSpace(NB, -1e6, 1e6, np.float32, shape=(3,)),
                       "k": BoxSpace(NB, 0, 1 << 30, np.int64, shape=())})


def _rows(n: int, base: int) -> Any:
    return {"x": np.arange(3 * n, dtype=np.float32).reshape(n, 3) + base, "k": np.arange(n, dtype=np.int64) + base}


def _data_extents(path: str) -> List[Tuple[int, int]]:
    """Byte ranges of the file that hold dataset rows (contiguous data, or every allocated chunk)."""
    out = []
    with h5py.File(path, "r") as f:
        for name in ("x", "k"):
            ds = f[name]
            if ds.chunks is None:
                out.append((ds.id.get_offset(), ds.id.get_offset() + ds.id.get_storage_size()))
            else:
                for i in range(ds.id.get_num_chunks()):
                    info = ds.id.get_chunk_info(i)
                    out.append((info.byte_offset, info.byte_offset + info.size))
    return out


def _changed_outside(before: bytes, after: bytes, extents: List[Tuple[int, int]]) -> List[int]:
    a = np.frombuffer(before, np.uint8)
    b = np.frombuffer(after[:len(before)], np.uint8)
    diff = np.flatnonzero(a != b)
    inside = np.zeros(diff.size, bool)
    for lo, hi in extents:
        inside |= (diff >= lo) & (diff < hi)
    return diff[~inside].tolist()


@pytest.mark.parametrize("layout", ["contiguous", "chunked", "growable"])
def test_commit_points_change_only_row_bytes(tmp_path: Any, layout: str) -> None:
    path = os.fspath(tmp_path / "d.hdf5")
    if layout == "growable":
        st = HDF5Storage.create(SPACE, None, cache_path=path)
        st.extend_length(40)                 # moves to a new file with spare rows once
        st.shrink_length(10)                 # removes 10 rows: length 30, 40 allocated
    else:
        st = HDF5Storage.create(SPACE, 40, cache_path=path, chunks=(8,) if layout == "chunked" else None)
    st.flush()
    before = open(path, "rb").read()
    extents = _data_extents(path)
    for rep in range(3):                     # writes, segments, commit points: all on the same file
        st.mark_segment_start(0)
        for i in range(5):
            st.append({k: v[i] for k, v in _rows(5, 100 * rep).items()})
        st.mark_segment_end()
        st.set(slice(6, 10), _rows(4, 7 + rep))
        st.flush()
        st.dumps(path)                       # its own path: a flush
    after = open(path, "rb").read()
    assert len(after) == len(before), (len(before), len(after))
    assert before != after
    assert _changed_outside(before, after, extents) == []
    with open(path + STATE_SUFFIX) as f:
        state = json.load(f)
    assert state["segments"] == [[0, 5]] and state["length"] == (30 if layout == "growable" else 40)
    back = HDF5Storage.load_from(path, SPACE)
    assert back.episode_segments() == [(0, 4)] and back.get(7)["k"] == 8 + 2
    back.close()
    st.close()


def test_growth_and_trimming_replace_the_file(tmp_path: Any) -> None:
    """A growable file on disk is never resized in place: it moves to a new file (new inode, new file id), and
    a state sidecar of the file it replaced is ignored."""
    path = os.fspath(tmp_path / "g.hdf5")
    st = HDF5Storage.create(SPACE, None, cache_path=path)
    st.durable = False      # segment ends do not commit here: the first file's sidecar stays to be ignored
    ino = os.stat(path).st_ino
    st.mark_segment_start(0)
    for i in range(3):
        st.append({k: v[i] for k, v in _rows(3, 0).items()})
    st.mark_segment_end()
    assert os.stat(path).st_ino != ino                      # grew: a new file took the path
    stale = json.load(open(path + STATE_SUFFIX))            # the sidecar of the first file (written at create)
    with h5py.File(path, "r") as f:
        assert f["x"].shape[0] >= 64 and json.loads(f.attrs["unienv_storage"])["file_id"] != stale["file_id"]
    back = HDF5Storage.load_from(path, SPACE)    # the new file's own attribute: the state when it was written
    assert len(back) == 0 and back.episode_segments() == []
    back.close()
    st.flush()                                   # a commit point: the new file's own sidecar
    assert json.load(open(path + STATE_SUFFIX))["file_id"] != stale["file_id"]
    back = HDF5Storage.load_from(path, SPACE)
    assert len(back) == 3 and back.episode_segments() == [(0, 2)]
    back.close()
    st.close()                                               # trimmed: another new file, exactly 3 rows
    with h5py.File(path, "r") as f:
        assert f["x"].shape == (3, 3) and f["x"].maxshape == (None, 3)
    assert HDF5Storage.load_from(path, SPACE).episode_segments() == [(0, 2)]


@pytest.mark.parametrize("capacity", [None, 12])
def test_zeroing_rows_drops_their_segments_on_disk_first(tmp_path: Any, capacity: Any) -> None:
    """`shrink_length` and `clear` zero rows of recorded segments: the state on disk stops listing those segments
    before the rows change (as a ring overwrite does), without waiting for the next commit point."""
    path = os.fspath(tmp_path / "z.hdf5")
    st = HDF5Storage.create(SPACE, capacity, cache_path=path)
    for start in (0, 4):
        st.mark_segment_start(start)
        for i in range(4):
            st.append({k: v[i] for k, v in _rows(4, start).items()})
        st.mark_segment_end()
    st.flush()
    assert json.load(open(path + STATE_SUFFIX))["segments"] == [[0, 4], [4, 4]]
    if capacity is None:
        st.shrink_length(2)                  # cuts into the second segment
        assert json.load(open(path + STATE_SUFFIX))["segments"] == [[0, 4]]
    st.clear()
    assert json.load(open(path + STATE_SUFFIX))["segments"] == []
    st.close()
