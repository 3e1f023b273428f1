"""Video ring directories written here open in the reference (unienv==0.0.1b16) with identical values (issue 13).

The reference reads a VideoStorage directory by file name: `<start>_<end>.<ext>` holds frames 0.. of rows
start..end, listed in `episode_index.json`. Wrap-arounds here used to leave files the reference misreads (a partly
overwritten file kept serving its other rows; a same-range replacement was named `<start>_<end>~1`). Seeded random
sequences of episodes (append + mark_segment_end), extends, segment-writer commits, overwrites through `set_at`,
and dumps (into the buffer's own directory and into a second directory, dumped into again) are replayed with real
FFV1 encoding; the reference then opens every dumped directory in one subprocess, and every row it reads, the
length and the offset must equal what this project reads, and so must the segments of sequences built from episodes
and segment-writer commits alone (the reference lists every file as a segment, including files that `extend` and
`set_at` write, which record no segment here: a difference of segment semantics, not of values).
"""
from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Any, Dict, List

import numpy as np
import pytest

from _third_party import has_venv, require_module
from test_reference_opens_ours import ours, reference_open

from unienv_data.replay_buffer import ReplayBuffer
from unienv_interface.backends.numpy import NumpyComputeBackend as NB
from unienv_interface.space import BoxSpace

needs_reference = pytest.mark.skipif(not has_venv("unienv", "UNIENV_REFERENCE_PYTHON"),
                                     reason="reference venv (unienv==0.0.1b16) not found")

SEQUENCES = 12


def _frames(rng: np.random.Generator, n: int, shape: tuple) -> np.ndarray:
    return rng.integers(0, 256, (n,) + shape, dtype=np.uint8)


def _replay(seed: int, tmp: Path) -> List[Dict[str, Any]]:
    """Runs one random sequence; returns the reference requests with what this project reads."""
    from unienv_data.storages.video_storage import VideoStorage
    rnd = random.Random(seed)
    rng = np.random.default_rng(seed)
    cap = rnd.randint(3, 8)
    shape = (6, 8, 3) if seed % 2 else (6, 8)
    d = tmp / f"seq{seed}"
    other = tmp / f"seq{seed}_copy"
    rb = ReplayBuffer.create(VideoStorage, BoxSpace(NB, 0, 255, np.uint8, shape=shape), cache_path=d,
                             capacity=cap, codec="ffv1", file_ext="mkv")
    cases: List[Dict[str, Any]] = []
    ops: List[str] = []
    segments_only = seed % 4 in (0, 1)
    choices = ["episode", "episode", "writer", "dump_other"] + ([] if segments_only else ["extend", "set"])
    for _step in range(rnd.randint(5, 9)):
        op = rnd.choice(choices)
        n = rnd.randint(1, cap)
        if op == "episode":
            for f in _frames(rng, n, shape):
                rb.append(f)
            rb.mark_segment_end()
        elif op == "extend":
            rb.extend(_frames(rng, n, shape))
        elif op == "writer":
            w = rb.open_segment_writer()
            for f in _frames(rng, n, shape):
                w.append(f)
            rb.commit_segment(w)
        elif op == "set" and len(rb):
            lo = rnd.randrange(len(rb))
            hi = rnd.randint(lo + 1, len(rb))
            rb.set_at(slice(lo, hi), _frames(rng, hi - lo, shape))
        elif op == "dump_other" and len(rb):
            rb.dumps(other)
        ops.append(f"{op}({n})")
    if not len(rb):
        for f in _frames(rng, 2, shape):
            rb.append(f)
        rb.mark_segment_end()
    rb.dumps(d)
    rb.dumps(other)
    want = ours(rb)
    for path in (d, other):
        files = sorted(os.listdir(path / "storage")) if (path / "storage").is_dir() else sorted(os.listdir(path))
        cases.append({"path": str(path), "backend": "numpy", "want": want, "ops": ops, "files": files,
                      "segments": segments_only})
    rb.close()
    return cases


def _episodes(capacity: int, lengths: List[int], tmp: Path) -> Dict[str, Any]:
    """Episodes of `lengths` frames into a ring of `capacity` (the two cases of issue 13)."""
    from unienv_data.storages.video_storage import VideoStorage
    d = tmp / f"eps{capacity}_{'_'.join(map(str, lengths))}"
    rb = ReplayBuffer.create(VideoStorage, BoxSpace(NB, 0, 255, np.uint8, shape=(4, 4)), cache_path=d,
                             capacity=capacity, codec="ffv1", file_ext="mkv")
    v = 0
    for n in lengths:
        for _ in range(n):
            v += 1
            rb.append(np.full((4, 4), v, np.uint8))
        rb.mark_segment_end()
    rb.dumps(d)
    case = {"path": str(d), "backend": "numpy", "want": ours(rb), "ops": [f"episodes {lengths}"],
            "files": sorted(os.listdir(d / "storage")), "segments": True}
    rb.close()
    return case


@needs_reference
def test_reference_reads_random_video_rings_written_here(tmp_path: Path) -> None:
    require_module("av", "video")
    # a partly overwritten file (trimmed to the rows it still serves) and a same-range replacement (renamed from
    # 0_1~1.mkv once 0_1.mkv is gone)
    cases = [_episodes(4, [4, 3], tmp_path), _episodes(5, [2, 3, 2], tmp_path)]
    assert cases[0]["files"] == ["0_2.mkv", "3_3.mkv", "episode_index.json", "video_metadata.json"]
    assert cases[1]["files"] == ["0_1.mkv", "2_4.mkv", "episode_index.json", "video_metadata.json"]
    cases += [c for seed in range(SEQUENCES) for c in _replay(seed, tmp_path)]
    got = reference_open([{"path": c["path"], "backend": c["backend"]} for c in cases], tmp_path)
    assert len(got) == len(cases)
    problems = []
    for case, res in zip(cases, got):
        where = f"{os.path.basename(case['path'])} after {' '.join(case['ops'])} (files {case['files']})"
        if "error" in res:
            problems.append(f"{where}: the reference failed: {res['error']}")
            continue
        for key in ("len", "capacity", "offset", "rows") + (("segments",) if case["segments"] else ()):
            if json.dumps(res[key], sort_keys=True) != json.dumps(case["want"][key], sort_keys=True):
                shown = (res[key], case["want"][key]) if key != "rows" else (
                    [i for i, (a, b) in enumerate(zip(res[key], case["want"][key])) if a != b], "rows differ there")
                problems.append(f"{where}: {key} differs:\n  reference {shown[0]}\n  here      {shown[1]}")
    assert not problems, "\n".join(problems)


# ---------------------------------------------------------------------------------------------------- no reference
def test_lossy_partly_overwritten_file_is_kept_and_left_out_of_episode_index(tmp_path: Path) -> None:
    """A lossy file is never re-encoded (that would change its rows here): dumps keeps it and episode_index.json
    leaves it out, so the reference raises for its rows instead of reading another episode's frames."""
    require_module("av", "video")
    from unienv_data.storages.video_storage import VideoStorage
    st = VideoStorage.create(BoxSpace(NB, 0, 255, np.uint8, shape=(16, 16, 3)), cache_path=tmp_path / "v",
                             capacity=4, codec="auto", lossless=False)
    if st.is_exact:
        pytest.skip(f"no lossy encoder here ({st.codec_selection})")
    rng = np.random.default_rng(0)
    for n in (4, 3):
        st.mark_segment_start(0)
        for f in _frames(rng, n, (16, 16, 3)):
            st.append(f)
        st.mark_segment_end()
    before = st.get_numpy(np.arange(4))
    st.dumps(tmp_path / "v")
    ext = st.file_ext
    assert st.files == [f"0_2.{ext}", f"0_3.{ext}"]
    np.testing.assert_array_equal(st.get_numpy(np.arange(4)), before)
    with open(tmp_path / "v" / "episode_index.json") as fh:
        assert json.load(fh) == {"file_ranges": [[0, 2]]}
    st.close()


CRASH_CHILD = r"""
import random, sys, numpy as np
from unienv_interface.backends.numpy import NumpyComputeBackend as NB
from unienv_interface.space import BoxSpace
from unienv_data.storages.video_storage import VideoStorage
d, other, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
rnd = random.Random(seed)
st = VideoStorage.create(BoxSpace(NB, 0, 255, np.uint8, shape=(4, 4)), cache_path=d, capacity=7, codec="ffv1",
                         file_ext="mkv")
pos = 0
for eid in range(1, 31):
    n = rnd.randint(1, 5)
    st.mark_segment_start(pos % 7)
    for k in range(n):
        st.append(np.full((4, 4), eid * 8 + k, np.uint8))
    st.mark_segment_end()
    print(f"{eid} {pos % 7} {n}", flush=True)
    pos += n
    st.dumps(d if rnd.random() < 0.5 else other)
print("end", flush=True)
"""


def test_sigkill_during_ring_commits_and_trimming_dumps_keeps_committed_rows(tmp_path: Path) -> None:
    """SIGKILL at random moments of a lossless video ring that commits episodes and trims files in dumps (own
    directory and another one): the directory reopens here with every row of the last committed state (a row of
    the episode being written may already read its new frame only if that episode had been committed)."""
    import signal
    import subprocess
    import sys
    import time
    require_module("av", "video")
    from unienv_data.storages.video_storage import VideoStorage
    space = BoxSpace(NB, 0, 255, np.uint8, shape=(4, 4))
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1] / "src") + os.pathsep
               + os.environ.get("PYTHONPATH", ""))
    for trial in range(4):
        d, other = tmp_path / f"ring{trial}", tmp_path / f"copy{trial}"
        proc = subprocess.Popen([sys.executable, "-c", CRASH_CHILD, str(d), str(other), str(trial)],
                                stdout=subprocess.PIPE, text=True, env=env)
        lines: List[str] = []
        assert proc.stdout is not None
        while len(lines) < 3 + 2 * trial:       # killed after a few commits (dumps and trims in flight)
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line.strip())
        time.sleep(0.05 * trial)
        proc.send_signal(signal.SIGKILL)
        rest, _ = proc.communicate()
        lines += [ln for ln in rest.split("\n") if ln]
        expect = np.zeros(7, dtype=np.int64)
        last = 0
        for line in lines:
            if line == "end":
                continue
            eid, start, n = map(int, line.split())
            for k in range(n):
                expect[(start + k) % 7] = eid * 8 + k
            last = eid
        st = VideoStorage.load_from(d, space)
        got = st.get_numpy(np.arange(7))[:, 0, 0].astype(np.int64)
        # the next episode (last + 1) may have committed before its line was printed
        ok = (got == expect) | (got // 8 == last + 1)
        assert ok.all(), f"trial {trial}: rows {got.tolist()} vs committed {expect.tolist()} (last episode {last})"
        st.close()
        if (other / "video_metadata.json").exists():
            VideoStorage.load_from(other, space).close()


def test_growable_shrink_and_same_range_set_leave_reference_names_after_dumps(tmp_path: Path) -> None:
    """A growable lossless storage: a file cut by `shrink_length` and a file split by `set` serve fewer rows than their
    name says until `dumps`, which re-encodes their remaining rows bit-exactly into files named for them; values here
    never change and episode_index.json then lists a file for every written row."""
    require_module("av", "video")
    from unienv_data.storages.video_storage import VideoStorage
    st = VideoStorage.create(BoxSpace(NB, 0, 255, np.uint8, shape=(6, 8)), cache_path=tmp_path / "g", codec="ffv1",
                             file_ext="mkv")
    rng = np.random.default_rng(3)
    st.mark_segment_start(0)
    for f in _frames(rng, 10, (6, 8)):
        st.append(f)
    st.mark_segment_end()
    st.set(slice(3, 5), _frames(rng, 2, (6, 8)))
    st.shrink_length(2)                                 # rows 0..7 remain
    before = st.get_numpy(np.arange(len(st)))
    assert st.files == ["0_9.mkv", "3_4.mkv"]
    with open(tmp_path / "g" / "episode_index.json") as fh:
        assert json.load(fh) == {"file_ranges": [[3, 4]]}     # the cut file is hidden from the reference
    st.dumps(tmp_path / "g")
    assert st.files == ["0_2.mkv", "3_4.mkv", "5_7.mkv"]
    np.testing.assert_array_equal(st.get_numpy(np.arange(len(st))), before)
    with open(tmp_path / "g" / "episode_index.json") as fh:
        assert json.load(fh) == {"file_ranges": [[0, 2], [3, 4], [5, 7]]}
    st.close()
    back = VideoStorage.load_from(tmp_path / "g", BoxSpace(NB, 0, 255, np.uint8, shape=(6, 8)))
    np.testing.assert_array_equal(back.get_numpy(np.arange(len(back))), before)
    assert sorted(os.listdir(tmp_path / "g")) == ["0_2.mkv", "3_4.mkv", "5_7.mkv", "episode_index.json",
                                                   "video_metadata.json"]
    back.close()
