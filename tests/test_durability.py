"""Issue 17: an ended episode is durable by default (a SIGKILL in a real subprocess loses at most the episode in
progress), `with` closes and commits, `create()` never replaces a dataset silently, `load_from` serves any backend,
metadata files follow the umask, and the errors and the repr name what matters."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from typing import Any

import numpy as np
import pytest
from _third_party import require_module

from unienv_data.base.files import atomic_write_json
from unienv_data.replay_buffer import ReplayBuffer
from unienv_data.replay_buffer._buffer_log import BUFFER_LOG_FILE
from unienv_data.replay_buffer._metadata import read_metadata
from unienv_data.storages.dict_storage import DictStorage
from unienv_data.storages.flattened import FlattenedStorage
from unienv_data.storages.native_layout import create_native_storage, native_layout_kwargs
from unienv_data.storages.numpy_memmap import NumpyMemmapStorage
from unienv_interface.backends import NumpyComputeBackend as NB
from unienv_interface.backends import resolve_backend
from unienv_interface.space import BinarySpace, BoxSpace, DictSpace, TextSpace

STEPS = 7          # per episode
DONE = 5           # episodes ended before the kill

# The recording process: DONE ended episodes, then part of one more, then SIGKILL (no close, no dumps, no atexit).
CHILD = textwrap.dedent("""
    import os, signal, sys
    import numpy as np
    from unienv_data.replay_buffer import ReplayBuffer
    from unienv_data.storages.dict_storage import DictStorage
    from unienv_data.storages.flattened import FlattenedStorage
    from unienv_data.storages.native_layout import create_native_storage, native_layout_kwargs
    from unienv_data.storages.numpy_memmap import NumpyMemmapStorage
    from unienv_interface.backends import NumpyComputeBackend as NB
    from unienv_interface.space import BinarySpace, BoxSpace, DictSpace
    kind, path, steps, done = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    img = BoxSpace(NB, 0, 255, np.uint8, shape=(16, 16, 3))
    space = DictSpace(NB, {"obs": BoxSpace(NB, -10, 10, np.float32, shape=(3,)), "done": BinarySpace(NB, shape=()),
                           "image": img})
    def step(e, t):
        return {"obs": np.full(3, e + t / 100, np.float32), "done": np.bool_(t == steps - 1),
                "image": np.full((16, 16, 3), 10 * e + t, np.uint8)}
    if kind == "rb-flat":
        flat = DictSpace(NB, {"obs": space["obs"], "x": BoxSpace(NB, 0, 1000, np.float32, shape=())})
        step = lambda e, t: {"obs": np.full(3, e + t / 100, np.float32), "x": np.float32(10 * e + t)}
        target = ReplayBuffer.create(FlattenedStorage, flat, NumpyMemmapStorage, cache_path=path, capacity=1000)
    elif kind == "rb-native":
        target = ReplayBuffer.create(DictStorage, space, cache_path=path, capacity=1000, **native_layout_kwargs(space))
    elif kind == "rb-video":
        target = ReplayBuffer.create(DictStorage, space, cache_path=path, capacity=1000,
                                     **native_layout_kwargs(space, image_storage="video",
                                                            video_kwargs={"lossless": True}))
    elif kind == "rb-writer":
        target = ReplayBuffer.create(DictStorage, space, cache_path=path, capacity=None, **native_layout_kwargs(space))
    elif kind == "native":
        target = create_native_storage(space, capacity=1000, cache_path=path)
    elif kind == "rb-with-raise":
        try:
            with ReplayBuffer.create(DictStorage, space, cache_path=path, capacity=1000,
                                     **native_layout_kwargs(space)) as rb:
                for e in range(done):
                    for t in range(steps):
                        rb.append(step(e, t))
                    rb.mark_segment_end()
                for t in range(3):
                    rb.append(step(done, t))
                raise RuntimeError("the environment crashed")
        except RuntimeError:
            sys.exit(0)
    for e in range(done):
        if kind == "rb-writer":
            w = target.open_segment_writer()
            for t in range(steps):
                w.append(step(e, t))
            target.commit_segment(w)
            continue
        if kind == "native":
            target.mark_segment_start(e * steps)
        for t in range(steps):
            target.append(step(e, t))
        target.mark_segment_end()
    if kind == "native":
        target.mark_segment_start(done * steps)
    for t in range(3):          # the episode in progress
        target.append(step(done, t))
    os.kill(os.getpid(), signal.SIGKILL)
""")


def _space() -> DictSpace:
    return DictSpace(NB, {"obs": BoxSpace(NB, -10, 10, np.float32, shape=(3,)), "done": BinarySpace(NB, shape=()),
                          "image": BoxSpace(NB, 0, 255, np.uint8, shape=(16, 16, 3))})


def _record_and_kill(kind: str, path: str) -> int:
    proc = subprocess.run([sys.executable, "-c", CHILD, kind, path, str(STEPS), str(DONE)], capture_output=True,
                          timeout=120)
    assert proc.returncode in (-signal.SIGKILL, 0), proc.stderr.decode()[-2000:]
    return proc.returncode


def _check_episode(get: Any, e: int, start: int, flat: bool = False) -> None:
    rows = get(slice(start, start + STEPS))
    want = np.array([e + t / 100 for t in range(STEPS)], np.float32)
    np.testing.assert_array_equal(np.asarray(rows["obs"])[:, 0], want)
    if flat:
        np.testing.assert_array_equal(np.asarray(rows["x"]), [10 * e + t for t in range(STEPS)])
    else:
        np.testing.assert_array_equal(np.asarray(rows["image"])[:, 0, 0, 0], [10 * e + t for t in range(STEPS)])


@pytest.mark.parametrize("kind", ["rb-flat", "rb-native", "rb-video", "rb-writer", "rb-with-raise"])
def test_ended_episodes_survive_sigkill_of_the_recording_process(tmp_path: Any, kind: str) -> None:
    if kind == "rb-video":
        require_module("av", "video")
    path = str(tmp_path / "data")
    rc = _record_and_kill(kind, path)
    assert rc == (0 if kind == "rb-with-raise" else -signal.SIGKILL)
    rb = ReplayBuffer.load_from(path, backend=NB)
    try:
        # every ended episode is back, whole; the episode in progress is gone
        assert len(rb) == DONE * STEPS
        assert rb.episode_segments() == [(e * STEPS, (e + 1) * STEPS) for e in range(DONE)]
        for e in range(DONE):
            _check_episode(rb.get_at, e, e * STEPS, flat=kind == "rb-flat")
    finally:
        rb.close()


@pytest.mark.parametrize("copy", ["ram", "shared"])
def test_ended_episodes_survive_sigkill_when_read_back_into_memory(tmp_path: Any, copy: str) -> None:
    """The episodes a killed recorder committed are in the native layout's commit log, newer than the files' own
    metadata: a copy into RAM (`is_memmap=False`, shared memory with `multiprocessing=True`) takes them from the log
    as the memory-mapped open does (it read the files' metadata only: 'committed rows are missing')."""
    path = str(tmp_path / "data")
    assert _record_and_kill("rb-native", path) == -signal.SIGKILL
    rb = ReplayBuffer.load_from(path, backend=NB, is_memmap=False, multiprocessing=copy == "shared")
    try:
        assert len(rb) == DONE * STEPS
        assert rb.episode_segments() == [(e * STEPS, (e + 1) * STEPS) for e in range(DONE)]
        for e in range(DONE):
            _check_episode(rb.get_at, e, e * STEPS)
    finally:
        rb.close()


def test_ended_segments_of_a_storage_survive_sigkill(tmp_path: Any) -> None:
    path = str(tmp_path / "native")
    assert _record_and_kill("native", path) == -signal.SIGKILL
    st = DictStorage.load_from(path, _space(), capacity=1000)
    try:
        assert st.episode_segments() == [(e * STEPS, (e + 1) * STEPS - 1) for e in range(DONE)]
        for e in range(DONE):
            _check_episode(st.get, e, e * STEPS)
    finally:
        st.close()


def _steps(e: int, n: int = STEPS) -> list:
    return [{"obs": np.full(3, e + t / 100, np.float32), "done": np.bool_(False),
             "image": np.full((16, 16, 3), 10 * e + t, np.uint8)} for t in range(n)]


def test_bulk_turns_per_episode_persistence_off_and_persists_once_at_the_end(tmp_path: Any) -> None:
    path = str(tmp_path / "rb")
    space = _space()
    rb = ReplayBuffer.create(DictStorage, space, cache_path=path, capacity=100, **native_layout_kwargs(space))
    assert rb.durable and rb.storage is not None and rb.storage.durable
    with rb.bulk():
        assert not rb.durable and not rb.storage.durable
        for s in _steps(0):
            rb.append(s)
        rb.mark_segment_end()
        assert ReplayBuffer.get_length_from_path(path) == 0      # not persisted per episode
    assert rb.durable and ReplayBuffer.get_length_from_path(path) == STEPS
    rb.durable = False
    for s in _steps(1):
        rb.append(s)
    rb.mark_segment_end()
    assert ReplayBuffer.get_length_from_path(path) == STEPS
    rb.durable = True
    for s in _steps(2):
        rb.append(s)
    rb.mark_segment_end()
    assert ReplayBuffer.get_length_from_path(path) == 3 * STEPS
    rb.close()


@pytest.mark.parametrize("maintain", [True, False])
def test_a_wrapping_durable_ring_lists_only_intact_episodes_at_every_step(tmp_path: Any, maintain: bool) -> None:
    """Per-episode durability + ring clipping (+ the buffer's own segment list): a copy of the directory taken after
    any append or episode end (what a SIGKILL leaves) reopens with every listed segment holding one episode's
    consecutive steps, and each per-episode write leaves `_disk_meta` equal to the metadata.json on disk."""
    import json
    import shutil
    path = str(tmp_path / "rb")
    space = DictSpace(NB, {"step": BoxSpace(NB, 0, 1000, np.float32, shape=(2,))})
    rb = ReplayBuffer.create(FlattenedStorage, space, NumpyMemmapStorage, cache_path=path, capacity=16,
                             maintain_segment_metadata=maintain)

    def check_copy(k: int) -> int:
        snap = str(tmp_path / f"snap{k}")
        shutil.copytree(path, snap)
        back = ReplayBuffer.load_from(snap, backend=NB)
        rows = back.get_at(np.arange(len(back)))["step"] if len(back) else np.zeros((0, 2), np.float32)
        segs = back.episode_segments() or []
        for s, e in segs:
            ep, t = rows[s:e, 0], rows[s:e, 1]
            assert (ep == ep[0]).all() and (np.diff(t) == 1).all(), (k, s, e, rows[s:e].tolist())
        back.close()
        shutil.rmtree(snap)
        return len(segs)

    k = listed = 0
    for e, n in enumerate([3, 5, 2, 7, 1, 4, 6, 3, 5, 2, 4, 7]):    # 49 steps through a ring of 16
        for t in range(n):
            rb.append({"step": np.array([e, t], np.float32)})
            k += 1
            check_copy(k)
        rb.mark_segment_end()
        shown = read_metadata(path)             # metadata.json with the buffer's commit log applied
        assert shown == rb._disk_meta
        k += 1
        listed = check_copy(k)
    assert rb.offset != 0 and listed >= 3      # the ring wrapped and ended episodes stayed listed
    rb.close()
    before = os.stat(os.path.join(path, "metadata.json")).st_mtime_ns
    ro = ReplayBuffer.load_from(path, backend=NB)
    assert ro._disk_meta is None
    ro.close()
    assert os.stat(os.path.join(path, "metadata.json")).st_mtime_ns == before    # a read-only load never writes


def test_with_block_commits_an_open_episode_on_a_normal_exit(tmp_path: Any) -> None:
    path = str(tmp_path / "rb")
    space = _space()
    with ReplayBuffer.create(DictStorage, space, cache_path=path, capacity=100, **native_layout_kwargs(space)) as rb:
        for s in _steps(0):
            rb.append(s)
    assert rb.storage is None           # closed
    back = ReplayBuffer.load_from(path, backend="numpy")
    assert back.episode_segments() == [(0, STEPS)]
    back.close()


def test_storage_with_block_records_or_drops_the_open_segment(tmp_path: Any) -> None:
    space = _space()
    with create_native_storage(space, capacity=50, cache_path=str(tmp_path / "a")) as st:
        st.mark_segment_start(0)
        for s in _steps(0):
            st.append(s)
    back = DictStorage.load_from(str(tmp_path / "a"), space, capacity=50)
    assert back.episode_segments() == [(0, STEPS - 1)]
    back.close()
    with pytest.raises(KeyError):
        with create_native_storage(space, capacity=50, cache_path=str(tmp_path / "b")) as st:
            st.mark_segment_start(0)
            st.append(_steps(0)[0])
            raise KeyError("boom")
    back = DictStorage.load_from(str(tmp_path / "b"), space, capacity=50)
    assert back.episode_segments() == []
    back.close()


# ------------------------------------------------------------------------------------------ create() never wipes
def _flat_space() -> DictSpace:
    return DictSpace(NB, {"a": BoxSpace(NB, 0, 1, np.float32, shape=(2,)), "b": BoxSpace(NB, 0, 9, np.float32, shape=())})


def test_create_refuses_an_existing_dataset_unless_overwrite(tmp_path: Any) -> None:
    path = str(tmp_path / "rb")
    space = _flat_space()
    with ReplayBuffer.create(FlattenedStorage, space, NumpyMemmapStorage, cache_path=path, capacity=10) as rb:
        rb.extend({"a": np.full((4, 2), 0.5, np.float32), "b": np.arange(4, dtype=np.float32)})
    with pytest.raises(FileExistsError) as err:
        ReplayBuffer.create(FlattenedStorage, space, NumpyMemmapStorage, cache_path=path, capacity=10)
    msg = str(err.value)
    assert path in msg and "overwrite=True" in msg and "load_from" in msg
    assert ReplayBuffer.get_length_from_path(path) == 4       # untouched
    rb = ReplayBuffer.create(FlattenedStorage, space, NumpyMemmapStorage, cache_path=path, capacity=10, overwrite=True)
    assert len(rb) == 0
    rb.close()
    # an empty directory (e.g. from tempfile.mkdtemp) is fine
    empty = tmp_path / "empty"
    empty.mkdir()
    ReplayBuffer.create(FlattenedStorage, space, NumpyMemmapStorage, cache_path=str(empty), capacity=10).close()


def test_storage_create_refuses_an_existing_dataset_unless_overwrite(tmp_path: Any) -> None:
    space = _space()
    path = str(tmp_path / "native")
    create_native_storage(space, capacity=10, cache_path=path).close()
    with pytest.raises(FileExistsError, match="overwrite=True"):
        create_native_storage(space, capacity=10, cache_path=path)
    create_native_storage(space, capacity=10, cache_path=path, overwrite=True).close()
    flat = str(tmp_path / "flat")
    FlattenedStorage.create(_flat_space(), NumpyMemmapStorage, capacity=4, cache_path=flat).close()
    with pytest.raises(FileExistsError, match="overwrite=True"):
        FlattenedStorage.create(_flat_space(), NumpyMemmapStorage, capacity=4, cache_path=flat)
    raw = str(tmp_path / "x.memmap")
    NumpyMemmapStorage.create(BoxSpace(NB, 0, 1, np.float32, shape=(2,)), capacity=4, cache_path=raw).close()
    with pytest.raises(FileExistsError, match="overwrite=True"):
        NumpyMemmapStorage.create(BoxSpace(NB, 0, 1, np.float32, shape=(2,)), capacity=4, cache_path=raw)
    NumpyMemmapStorage.create(BoxSpace(NB, 0, 1, np.float32, shape=(2,)), capacity=4, cache_path=raw,
                              overwrite=True).close()


# ------------------------------------------------------------------------------------------ any backend on load
def _recorded(tmp_path: Any) -> str:
    path = str(tmp_path / "rb")
    with ReplayBuffer.create(FlattenedStorage, _flat_space(), NumpyMemmapStorage, cache_path=path, capacity=10) as rb:
        for i in range(3):
            rb.append({"a": np.full(2, 0.5, np.float32), "b": np.float32(i)})
        rb.mark_segment_end()
    return path


@pytest.mark.parametrize("backend", ["torch", "pytorch", "TORCH", "module"])
def test_numpy_recorded_buffer_opens_as_torch(tmp_path: Any, backend: str) -> None:
    torch = require_module("torch", "torch")
    path = _recorded(tmp_path)
    rb = ReplayBuffer.load_from(path, backend=torch if backend == "module" else backend, read_only=False)
    try:
        got = rb.get_at(slice(0, 3))
        assert isinstance(got["b"], torch.Tensor) and got["b"].tolist() == [0.0, 1.0, 2.0]
        rb.append({"a": torch.full((2,), 0.25), "b": torch.tensor(7.0)})
        rb.mark_segment_end()
        assert "served as pytorch" in repr(rb)
    finally:
        rb.close()
    back = ReplayBuffer.load_from(path, backend="numpy")       # still a NumPy dataset on disk
    assert back.get_at(3)["b"] == np.float32(7.0) and back.episode_segments() == [(0, 3), (3, 4)]
    back.close()


def test_torch_recorded_buffer_opens_as_numpy_and_jax(tmp_path: Any) -> None:
    torch = require_module("torch", "torch")
    from unienv_data.storages.pytorch import PytorchTensorStorage
    TB = resolve_backend("torch")
    space = DictSpace(TB, {"a": BoxSpace(TB, 0, 1, torch.float32, shape=(2,))})
    path = str(tmp_path / "rb")
    with ReplayBuffer.create(FlattenedStorage, space, PytorchTensorStorage, cache_path=path, capacity=4) as rb:
        rb.append({"a": torch.full((2,), 0.5)})
    rb = ReplayBuffer.load_from(path, backend=np)
    assert isinstance(rb.get_at(0)["a"], np.ndarray)
    rb.close()
    jnp = require_module("jax.numpy", "jax")
    rb = ReplayBuffer.load_from(path, backend=jnp)
    assert type(rb.get_at(0)["a"]).__module__.startswith("jax")
    rb.close()


def test_resolve_backend_accepts_classes_names_and_modules() -> None:
    assert resolve_backend(NB) is NB and resolve_backend("numpy") is NB and resolve_backend(np) is NB
    with pytest.raises(ValueError, match="unknown backend name 'numpi'"):
        resolve_backend("numpi")
    with pytest.raises(TypeError, match="ComputeBackend class"):
        resolve_backend(3)
    # spaces take every spelling too
    assert BoxSpace("numpy", 0, 1, np.float32, shape=(2,)) == BoxSpace(NB, 0, 1, np.float32, shape=(2,))
    from unienv_data.storages.backend_compat import ToBackendOrDeviceStorage
    st = ToBackendOrDeviceStorage.create(BoxSpace(NB, 0, 1, np.float32, shape=(2,)), NumpyMemmapStorage, capacity=2,
                                         backend=np)
    assert st.inner_backend is NB
    st.close()


# ------------------------------------------------------------------------------------------ files and errors
def test_metadata_files_follow_the_umask(tmp_path: Any) -> None:
    old = os.umask(0o022)
    try:
        path = _recorded(tmp_path)
        atomic_write_json(str(tmp_path / "x.json"), {"a": 1})
    finally:
        os.umask(old)
    found = [os.path.join(d, f) for d, _, fs in os.walk(tmp_path) for f in fs if f.endswith(".json")]
    assert len(found) >= 4 and os.path.join(path, "metadata.json") in found
    for f in found:
        assert os.stat(f).st_mode & 0o777 == 0o644, f
    assert not [f for _, _, fs in os.walk(tmp_path) for f in fs if f.endswith(".tmp")]


def test_load_from_with_another_space_names_the_differing_key(tmp_path: Any) -> None:
    path = _recorded(tmp_path)
    other = DictSpace(NB, {"a": BoxSpace(NB, 0, 2, np.float32, shape=(2,)), "b": BoxSpace(NB, 0, 9, np.float32, shape=())})
    with pytest.raises(ValueError) as err:
        ReplayBuffer.load_from(path, backend="numpy", single_instance_space=other)
    msg = str(err.value)
    assert "key 'a'" in msg and "stored" in msg and "given" in msg and "'b'" not in msg and len(msg) < 500


def test_text_space_without_charset_is_reported_at_its_key() -> None:
    space = DictSpace(NB, {"a": BoxSpace(NB, 0, 1, np.float32, shape=(2,)), "note": TextSpace(NB, max_length=5)})
    with pytest.raises(ValueError) as err:
        create_native_storage(space, capacity=4)
    assert "'note'" in str(err.value) and "<root>" not in str(err.value) and "charset" in str(err.value)


def test_replay_buffer_repr_says_what_it_holds(tmp_path: Any) -> None:
    path = _recorded(tmp_path)
    rb = ReplayBuffer.load_from(path, backend="numpy")
    text = repr(rb)
    rb.close()
    for part in ("len=3", "capacity=10", "segments=1", "FlattenedStorage", path):
        assert part in text, text
    assert "closed" in repr(rb)



# ------------------------------------------------------------------------------------------ CLI messages
def test_verify_does_not_call_out_of_bounds_values_inside_their_bounds(tmp_path: Any) -> None:
    from unienv_data.cli.verify import render, verify
    path = str(tmp_path / "rb")
    space = DictSpace(NB, {"a": BoxSpace(NB, 0, 1, np.float32, shape=(2,))})
    with ReplayBuffer.create(FlattenedStorage, space, NumpyMemmapStorage, cache_path=path, capacity=4) as rb:
        rb.append({"a": np.full(2, 0.5, np.float32)})
        rb.append({"a": np.full(2, 0.5, np.float32)})
    raw = np.memmap(os.path.join(path, "storage", "inner_storage.memmap"), dtype=np.float32, mode="r+", shape=(4, 2))
    raw[1, 0] = 7.0         # damage: a recorded value outside [0, 1]
    raw.flush()
    del raw
    report = verify(path)
    text = "\n".join(render(report))
    # stored values outside the bounds are accepted when recorded (a BoundsWarning): a note, not damage
    assert report["ok"] and "outside its space bounds" in text and "stored as given" in text
    assert "recorded values inside their space bounds" not in text
    assert "1 key(s) hold values outside their space bounds" in text


def test_info_ratio_is_readable_for_tiny_keys() -> None:
    from unienv_data.cli.info import raw_ratio
    assert raw_ratio(49, 10_000) == "0.49% of raw"
    assert raw_ratio(1_020, 1_000) == "1.02x raw"
    assert "0.00x" not in raw_ratio(3, 100_000)


# ------------------------------------------------ a growable native layout killed between two children's commits
def _growable_kwargs(space: DictSpace, layout: str) -> dict:
    """The native layout with its image leaf in memory-mapped arrays, lossless video, or (every child) HDF5."""
    if layout == "video":
        require_module("av", "video")
        return native_layout_kwargs(space, image_storage="video", video_kwargs={"lossless": True})
    kw = native_layout_kwargs(space)
    if layout == "hdf5":
        require_module("h5py", "hdf5")
        from unienv_data.storages.hdf5 import HDF5Storage
        kw["storage_cls_map"] = {k: (v if v is FlattenedStorage else HDF5Storage)
                                 for k, v in kw["storage_cls_map"].items()}
        kw["key_kwargs"] = {k: ({**v, "inner_storage_cls": HDF5Storage} if "inner_storage_cls" in v else v)
                            for k, v in kw.get("key_kwargs", {}).items()}
        for k, v in kw["storage_cls_map"].items():
            if v is FlattenedStorage:
                kw["key_kwargs"].setdefault(k, {"inner_storage_cls": HDF5Storage})
    return kw


def _replace_child_files(src: str, dst: str, rel: str) -> None:
    """Puts `src`'s copy of child `rel` (its file or directory and its sidecars `rel.*`) in place of `dst`'s."""
    for root in (dst, src):
        for name in os.listdir(root):
            if name == rel or name.startswith(rel + "."):
                p = os.path.join(root, name)
                if root == dst:
                    shutil.rmtree(p) if os.path.isdir(p) else os.remove(p)
                elif os.path.isdir(p):
                    shutil.copytree(p, os.path.join(dst, name))
                else:
                    shutil.copy2(p, os.path.join(dst, name))


def _crash_between_children(tmp_path: Any, layout: str, newer: str) -> str:
    """A growable native-layout buffer as a SIGKILL leaves it between two children's commits of episode 1: the
    children of `newer` ("image": only the image child, "others": every child but the image) hold episode 1, the
    rest and metadata.json hold only episode 0 (the state after episode 0's commit point)."""
    space = _space()
    path = str(tmp_path / "rb")
    rb = ReplayBuffer.create(DictStorage, space, cache_path=path, capacity=None, **_growable_kwargs(space, layout))
    paths = rb.storage.storage_paths
    for t in range(STEPS):
        rb.append(_steps(0)[t])
    rb.mark_segment_end()
    before = str(tmp_path / "before")
    shutil.copytree(path, before)
    for t in range(STEPS):
        rb.append(_steps(1)[t])
    rb.mark_segment_end()
    rb.close()
    for key, rel in paths.items():
        if (key == "image") != (newer == "image"):
            _replace_child_files(os.path.join(before, "storage"), os.path.join(path, "storage"), rel)
    if newer == "image":      # the buffer's state as episode 0's commit point left it: metadata.json and its log
        for name in ("metadata.json", BUFFER_LOG_FILE):
            if os.path.exists(os.path.join(before, name)):
                shutil.copy2(os.path.join(before, name), os.path.join(path, name))
    # DictStorage's commit log (children that keep only length and segments leave them to it): the crash came
    # before episode 1's commit record
    log = os.path.join(before, "storage", "dict_commit.log")
    if os.path.exists(log):
        shutil.copy2(log, os.path.join(path, "storage", "dict_commit.log"))
    return path


@pytest.mark.parametrize("layout", ["array", "video", "hdf5"])
def test_growable_native_layout_reopens_at_what_every_child_committed(tmp_path: Any, layout: str) -> None:
    """One child persisted episode 1, the others and the buffer did not: the buffer reopens (read-only and writable)
    with episode 0 only; a writable open trims the uncommitted tail, so recording goes on from there."""
    path = _crash_between_children(tmp_path, layout, newer="image")
    for read_only in (True, False):
        rb = ReplayBuffer.load_from(path, backend=NB, read_only=read_only)
        try:
            assert len(rb) == STEPS and len(rb.storage) == STEPS
            assert rb.episode_segments() == [(0, STEPS)]
            _check_episode(rb.get_at, 0, 0)
            assert np.asarray(rb.storage.get(slice(None))["image"]).shape[0] == STEPS
            if not read_only:
                for e in (1, 2):
                    for step in _steps(e):
                        rb.append(step)
                    rb.mark_segment_end()
        finally:
            rb.close()
    rb = ReplayBuffer.load_from(path, backend=NB)
    try:
        assert rb.episode_segments() == [(e * STEPS, (e + 1) * STEPS) for e in range(3)]
        for e in range(3):
            _check_episode(rb.get_at, e, e * STEPS)
    finally:
        rb.close()


@pytest.mark.parametrize("layout", ["array", "hdf5"])
def test_growable_native_layout_missing_committed_rows_is_damage(tmp_path: Any, layout: str) -> None:
    """metadata.json committed episode 1 but the image child holds only episode 0: a StorageFormatError names the
    image file (nothing committed is dropped silently)."""
    from unienv_data.base.errors import StorageFormatError
    path = _crash_between_children(tmp_path, layout, newer="others")
    with pytest.raises(StorageFormatError, match=r"count 14 exceeds.*image"):
        ReplayBuffer.load_from(path, backend=NB)


GROW_WRITER = textwrap.dedent("""
    import sys
    import numpy as np
    from unienv_data.replay_buffer import ReplayBuffer
    from unienv_data.storages.dict_storage import DictStorage
    from unienv_data.storages.native_layout import native_layout_kwargs
    from unienv_interface.backends import NumpyComputeBackend as NB
    from unienv_interface.space import BoxSpace, DictSpace
    space = DictSpace(NB, {"image": BoxSpace(NB, 0, 255, np.uint8, shape=(32, 32, 3)),
                           "state": BoxSpace(NB, -1e9, 1e9, np.float32, shape=(4,)),
                           "action": BoxSpace(NB, -1.0, 1.0, np.float32, shape=(2,))})
    rb = ReplayBuffer.create(DictStorage, space, cache_path=sys.argv[1], capacity=None, **native_layout_kwargs(space))
    print("ready", flush=True)
    e = 0
    while True:
        for t in range(40):
            rb.append({"image": np.full((32, 32, 3), (e * 41 + t) % 256, np.uint8),
                       "state": np.array([e, t, e, t], np.float32), "action": np.array([0.5, t / 100], np.float32)})
        rb.mark_segment_end()
        e += 1
""")


def test_growable_native_layout_survives_sigkill_from_outside(tmp_path: Any) -> None:
    """The new-user trial: a growable native-layout buffer appended to in a tight loop, SIGKILLed from outside at
    random moments (1 in 4 kills used to land between two children's commits and the dataset no longer opened).
    Every reopen works, lists whole episodes only, and every listed row is the recorded one."""
    rng = np.random.default_rng(4)
    for trial in range(6):
        path = str(tmp_path / f"g{trial}")
        proc = subprocess.Popen([sys.executable, "-c", GROW_WRITER, path], stdout=subprocess.PIPE)
        try:
            assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
            time.sleep(float(rng.uniform(0.05, 0.8)))
        finally:
            proc.kill()
            proc.wait()
        for read_only in (True, False):
            rb = ReplayBuffer.load_from(path, backend=NB, read_only=read_only)
            try:
                segs = rb.episode_segments()
                assert segs == [(e * 40, (e + 1) * 40) for e in range(len(segs))]
                assert len(rb) == 40 * len(segs)
                if segs:
                    rows = rb.get_at(slice(0, len(rb)))
                    state = np.asarray(rows["state"])
                    e, t = np.repeat(np.arange(len(segs)), 40), np.tile(np.arange(40), len(segs))
                    np.testing.assert_array_equal(state[:, 0], e)
                    np.testing.assert_array_equal(state[:, 1], t)
                    np.testing.assert_array_equal(np.asarray(rows["image"])[:, 0, 0, 0], (e * 41 + t) % 256)
            finally:
                rb.close()


# ------------------------------------------------------------------ a FlattenedStorage on disk: its commit log
# The recording process: a ReplayBuffer over FlattenedStorage on a memory-mapped inner storage (a ring of RING rows,
# smaller than the steps recorded), ENDED episodes of FLAT_LENS[e] steps (appended and ended, or through a segment
# writer; a line "ENDED e" after each commit point), then PARTIAL steps of one more, then SIGKILL (no close, no
# flush, no atexit).
FLAT_CHILD = textwrap.dedent("""
    import os, signal, sys
    import numpy as np
    from unienv_data.replay_buffer import ReplayBuffer
    from unienv_data.storages.flattened import FlattenedStorage
    from unienv_interface.backends import NumpyComputeBackend as NB
    from unienv_interface.space import BoxSpace, DictSpace
    path, inner, ring, ended, partial = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    lens, how = [int(n) for n in sys.argv[6].split(",")], sys.argv[7]
    if inner == "torch":
        import torch
        from unienv_data.storages.pytorch import PytorchTensorStorage
        from unienv_interface.backends.pytorch import PyTorchComputeBackend as B
        cls, kw, f32, arr = PytorchTensorStorage, {"is_memmap": True}, torch.float32, torch.tensor
    else:
        from unienv_data.storages.numpy_memmap import NumpyMemmapStorage
        B, cls, kw, f32, arr = NB, NumpyMemmapStorage, {}, np.float32, np.array
    space = DictSpace(B, {"obs": BoxSpace(B, 0, 1000, f32, shape=(3,)), "x": BoxSpace(B, 0, 1e6, f32, shape=())})
    rb = ReplayBuffer.create(FlattenedStorage, space, cls, cache_path=path, capacity=ring, **kw)
    step = lambda e, t, n: {"obs": arr([e, t, n], dtype=f32), "x": arr(1000 * e + t, dtype=f32)}
    for e in range(ended):
        w = rb.open_segment_writer() if how == "writer" else rb
        for t in range(lens[e]):
            w.append(step(e, t, lens[e]))
        rb.commit_segment(w) if how == "writer" else rb.mark_segment_end()
        os.write(1, b"ENDED %d\\n" % e)
    for t in range(partial):
        rb.append(step(ended, t, lens[ended]))
    os.kill(os.getpid(), signal.SIGKILL)
""")
FLAT_LENS = [5, 7, 3, 6, 4, 8, 5, 2, 7, 6, 3, 5]
RING = 16


def _flat_ring_space() -> DictSpace:
    return DictSpace(NB, {"obs": BoxSpace(NB, 0, 1000, np.float32, shape=(3,)),
                          "x": BoxSpace(NB, 0, 1e6, np.float32, shape=())})


def _flat_ring_step(e: int, t: int) -> dict:
    return {"obs": np.array([e, t, FLAT_LENS[e]], np.float32), "x": np.float32(1000 * e + t)}


def _record_flat_episodes(st: Any, episodes: range, pos: int) -> int:
    """Appends episodes `episodes` (lengths FLAT_LENS) into the ring from position `pos`; the next position."""
    for e in episodes:
        st.mark_segment_start(pos % RING)
        for t in range(FLAT_LENS[e]):
            st.append(_flat_ring_step(e, t))
        st.mark_segment_end()
        pos += FLAT_LENS[e]
    return pos


def _listed_episodes(rb: ReplayBuffer) -> list:
    """`(episode, first step, last step)` of every listed segment, checking that its rows are consecutive steps of
    one recorded episode with the values that episode wrote."""
    found = []
    for s, end in rb.episode_segments() or []:
        rows = rb.get_at(np.arange(s, end))
        obs, x = np.asarray(rows["obs"]), np.asarray(rows["x"])
        e = int(obs[0, 0])
        t = np.arange(int(obs[0, 1]), int(obs[0, 1]) + (end - s))
        want = np.stack([np.full(len(t), e), t, np.full(len(t), FLAT_LENS[e])], axis=1).astype(np.float32)
        np.testing.assert_array_equal(obs, want)
        np.testing.assert_array_equal(x, (1000 * e + t).astype(np.float32))
        found.append((e, int(t[0]), int(t[-1])))
    return found


def _copy_without(path: str, dst: str, name: str) -> str:
    shutil.copytree(path, dst)
    os.unlink(os.path.join(dst, "storage", name))
    return dst


@pytest.mark.parametrize("inner,how,ended,partial", [("numpy", "append", 2, 0), ("numpy", "append", 7, 0),
                                                     ("numpy", "writer", 7, 0), ("numpy", "append", 6, 3),
                                                     ("numpy", "writer", 9, 4), ("torch", "append", 8, 5)])
def test_flattened_ring_survives_sigkill_through_its_commit_log(tmp_path: Any, inner: str, how: str, ended: int,
                                                                 partial: int) -> None:
    """A ReplayBuffer over FlattenedStorage on a memory-mapped ring, SIGKILLed in a real subprocess after `ended`
    episodes (appended, or committed through a segment writer; and `partial` steps of the next one): the commit points went to `flattened_commit.log`, the inner
    storage's own `.meta.json` is as `create` wrote it (stale: without the log the episodes are gone), and the
    reopen lists exactly what the same buffer in memory lists after the same ended episodes (whole or clipped by
    the wrap; an episode whose rows the killed episode started overwriting may be dropped whole), with the values
    recorded. `unienv-data verify` passes and says the state comes from the log; a writable reopen records on and
    its close leaves a compacted log and a sidecar that alone describe the storage."""
    import json

    from unienv_data.cli.verify import verify
    from unienv_data.inspect import walk
    if inner == "torch":
        require_module("torch", "torch")
    path = str(tmp_path / "rb")
    lens = ",".join(map(str, FLAT_LENS))
    proc = subprocess.run([sys.executable, "-c", FLAT_CHILD, path, inner, str(RING), str(ended), str(partial), lens,
                           how], capture_output=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]
    assert proc.stdout.decode().split() == [w for e in range(ended) for w in ("ENDED", str(e))]
    storage = os.path.join(path, "storage")
    with open(os.path.join(storage, "inner_storage.memmap.meta.json")) as f:
        assert json.load(f)["segments"] == []           # not rewritten at any commit point: the log holds them
    with open(os.path.join(storage, "flattened_commit.log"), "rb") as f:
        assert len(f.read().splitlines()) >= ended       # a base record, then one line per commit (or drop)

    # the same ended episodes in memory: what the killed buffer committed
    mem = ReplayBuffer.create(FlattenedStorage, _flat_ring_space(), NumpyMemmapStorage, capacity=RING)
    for e in range(ended):
        for t in range(FLAT_LENS[e]):
            mem.append(_flat_ring_step(e, t))
        mem.mark_segment_end()
    committed = _listed_episodes(mem)
    mem.close()
    assert sum(FLAT_LENS[:ended]) <= RING or len(committed) < ended     # the ring wrapped where it should

    rb = ReplayBuffer.load_from(path, backend=NB)
    try:
        got = _listed_episodes(rb)
    finally:
        rb.close()
    if partial == 0:
        assert got == committed
    else:
        # the killed episode's rows [written, written + partial) were being written over the oldest rows: episodes
        # holding none of them are listed as committed, the others may be gone (never torn, never half-listed)
        written = sum(FLAT_LENS[:ended])
        starts = np.cumsum([0] + FLAT_LENS[:ended])
        untouched = [c for c in committed if starts[c[0]] + c[1] >= written + partial - RING]
        assert set(untouched) <= set(got) <= set(committed), (got, committed)
        assert all(e != ended for e, _a, _b in got)
    assert got, "nothing was committed"

    # without the log, the inner storage's stale sidecar lists no episode: the log was needed
    bare = ReplayBuffer.load_from(_copy_without(path, str(tmp_path / "bare"), "flattened_commit.log"), backend=NB)
    try:
        assert not bare.episode_segments()
    finally:
        bare.close()

    report = verify(path)
    assert report["ok"], report["problems"]
    notes = [n for node in walk(path).iter() for n in node.notes]
    assert any("flattened_commit.log" in n and "newer than its own metadata file" in n for n in notes), notes

    # recording goes on after a writable reopen; its close compacts the log and writes the sidecar
    rb = ReplayBuffer.load_from(path, backend=NB, read_only=False)
    for e in (ended + 1, ended + 2):
        for t in range(FLAT_LENS[e]):
            rb.append(_flat_ring_step(e, t))
        rb.mark_segment_end()
    after = _listed_episodes(rb)
    assert [e for e, _a, _b in after][-2:] == [ended + 1, ended + 2]
    rb.close()
    with open(os.path.join(storage, "flattened_commit.log"), "rb") as f:
        assert len(f.read().splitlines()) == 1
    bare = ReplayBuffer.load_from(_copy_without(path, str(tmp_path / "bare2"), "flattened_commit.log"), backend=NB)
    try:
        assert _listed_episodes(bare) == after              # the sidecar alone describes the storage again
    finally:
        bare.close()
    assert verify(path)["ok"]


def test_flattened_close_compacts_its_log_and_dumps_elsewhere_carry_none(tmp_path: Any) -> None:
    """A FlattenedStorage's commit points append to its log; `flush()` and `close()` write the inner storage's own
    metadata and compact the log to one record, so that file alone describes the storage; a dump into another
    directory leaves no log there (a stale one there is removed) and opens with the same episodes."""
    import json

    from unienv_data.storages._commit_log import read_log
    space = _flat_ring_space()
    path = str(tmp_path / "flat")
    st = FlattenedStorage.create(space, NumpyMemmapStorage, capacity=RING, cache_path=path)
    log, side = os.path.join(path, "flattened_commit.log"), os.path.join(path, "inner_storage.memmap.meta.json")
    assert not os.path.exists(log)                  # written at the first commit point
    pos = _record_flat_episodes(st, range(5), 0)    # 25 steps through a ring of 16
    segs = st.episode_segments()
    with open(log, "rb") as f:
        assert len(f.read().splitlines()) >= 5
    with open(side) as f:
        assert json.load(f)["segments"] == []
    st.flush()
    with open(log, "rb") as f:
        assert len(f.read().splitlines()) == 1
    with open(side) as f:
        meta = json.load(f)
    assert read_log(log, RING) == (meta["length"], [tuple(r) for r in meta["segments"]])
    # a dump into another directory that holds a stale log: the log goes, the files describe the dump
    other = str(tmp_path / "other")
    os.makedirs(other)
    with open(os.path.join(other, "flattened_commit.log"), "wb") as f:
        f.write(b"not a log\n")
    st.dumps(other)
    assert not os.path.exists(os.path.join(other, "flattened_commit.log"))
    st.mark_segment_start(pos % RING)
    for t in range(FLAT_LENS[5]):
        st.append(_flat_ring_step(5, t))
    st.mark_segment_end()
    final = st.episode_segments()
    st.close()
    with open(log, "rb") as f:
        assert len(f.read().splitlines()) == 1
    os.unlink(log)                                   # the sidecar alone describes the closed storage
    back = FlattenedStorage.load_from(path, space)
    assert back.episode_segments() == final
    back.close()
    dumped = FlattenedStorage.load_from(other, space)
    assert dumped.episode_segments() == segs
    dumped.close()


def test_flattened_dumps_into_its_own_directory_rewrite_the_log_only_when_it_changed(tmp_path: Any) -> None:
    """A `dumps` into the storage's own directory after another one with no commit in between leaves the log's one
    base record as it is (the same file); a storage reopened and dumped without a commit removes the log it was
    opened with (its files hold the same state); each time the directory reopens with the same episodes."""
    space = _flat_ring_space()
    path = str(tmp_path / "flat")
    log = os.path.join(path, "flattened_commit.log")
    st = FlattenedStorage.create(space, NumpyMemmapStorage, capacity=RING, cache_path=path)
    pos = _record_flat_episodes(st, range(3), 0)
    segs = st.episode_segments()
    st.dumps(path)
    first = os.stat(log)
    st.dumps(path)
    again = os.stat(log)
    assert (again.st_ino, again.st_mtime_ns) == (first.st_ino, first.st_mtime_ns)
    st.mark_segment_start(pos % RING)               # a commit: the next dumps writes a new base
    st.append(_flat_ring_step(3, 0))
    st.mark_segment_end()
    segs = st.episode_segments()
    st.dumps(path)
    assert os.stat(log).st_ino != first.st_ino
    st.close()
    back = FlattenedStorage.load_from(path, space, read_only=False)
    assert back.episode_segments() == segs
    back.dumps(path)                                # nothing committed since it opened: the files say it all
    assert not os.path.exists(log)
    back.close()
    reopened = FlattenedStorage.load_from(path, space)
    assert reopened.episode_segments() == segs
    reopened.close()


def test_flattened_child_of_a_logging_dict_storage_keeps_no_log_of_its_own(tmp_path: Any) -> None:
    """In the native layout the DictStorage's log holds its FlattenedStorage children's state: no
    `flattened_commit.log` is ever written in their directories (one commit record per episode), and a
    FlattenedStorage with a log of its own that a logging DictStorage takes as a child hands it over (its file goes,
    the DictStorage's log records the commits)."""
    space = DictSpace(NB, {**_space().spaces, "reward": BoxSpace(NB, -10, 10, np.float32, shape=())})
    steps = lambda e: [{**s, "reward": np.float32(e)} for s in _steps(e)]   # noqa: E731
    path = str(tmp_path / "rb")
    rb = ReplayBuffer.create(DictStorage, space, cache_path=path, capacity=50, **native_layout_kwargs(space))
    for e in range(3):
        for s in steps(e):
            rb.append(s)
        rb.mark_segment_end()
    flat_dirs = [os.path.join(path, "storage", rel) for key, rel in rb.storage.storage_paths.items()
                 if isinstance(rb.storage.storages[key], FlattenedStorage)]
    assert flat_dirs
    assert not any(os.path.exists(os.path.join(d, "flattened_commit.log")) for d in flat_dirs)
    with open(os.path.join(path, "storage", "dict_commit.log"), "rb") as f:
        assert len(f.read().splitlines()) == 4              # base + one record per episode
    rb.close()
    rb = ReplayBuffer.load_from(path, backend=NB, read_only=False)
    for s in steps(3):
        rb.append(s)
    rb.mark_segment_end()
    assert not any(os.path.exists(os.path.join(d, "flattened_commit.log")) for d in flat_dirs)
    rb.close()

    # a FlattenedStorage that kept its own log, taken over by a DictStorage that keeps one
    flat_space = DictSpace(NB, {"obs": space["obs"], "reward": space["reward"]})
    d = str(tmp_path / "dict")
    os.makedirs(d)
    flat = FlattenedStorage.create(flat_space, NumpyMemmapStorage, capacity=20, cache_path=os.path.join(d, "obs"))
    flat.mark_segment_start(0)
    flat.append({"obs": np.zeros(3, np.float32), "reward": np.float32(0)})
    flat.mark_segment_end()
    own = os.path.join(d, "obs", "flattened_commit.log")
    assert os.path.exists(own)
    st = DictStorage(flat_space, {"*": flat}, storage_paths={"*": "obs"}, cache_filename=d, owns_children=True,
                     commit_log=True)
    st.write_metadata(d)
    assert not os.path.exists(own)
    st.mark_segment_start(1)
    st.append({"obs": np.ones(3, np.float32), "reward": np.float32(1)})
    st.mark_segment_end()
    assert not os.path.exists(own)
    with open(os.path.join(d, "dict_commit.log"), "rb") as f:
        assert len(f.read().splitlines()) == 2
    st.close()
    assert not os.path.exists(own)
    back = DictStorage.load_from(d, flat_space)
    assert back.episode_segments() == [(0, 0), (1, 1)]
    back.close()


def test_flattened_log_replays_to_the_storage_state_at_every_step(tmp_path: Any) -> None:
    """Through a ring that wraps many times (episodes clipped and dropped whole), the log read back after every
    commit point is exactly the storage's length and segment list (whichever records the commits and drops chose),
    and after every append it lists no row the open episode has written."""
    from unienv_data.base.ring import ring_intervals
    from unienv_data.storages._commit_log import read_log
    space = _flat_ring_space()
    path = str(tmp_path / "flat")
    st = FlattenedStorage.create(space, NumpyMemmapStorage, capacity=RING, cache_path=path)
    log = os.path.join(path, "flattened_commit.log")
    rng = np.random.default_rng(3)
    pos = 0
    for e in range(60):
        n = int(rng.integers(1, 9))
        st.mark_segment_start(pos % RING)
        for t in range(n):
            st.append({"obs": np.array([e, t, n], np.float32), "x": np.float32(t)})
            logged = read_log(log, RING)
            if logged is not None:
                written = {r for lo, hi in ring_intervals(pos % RING, t + 1, RING) for r in range(lo, hi)}
                listed = {r for s, k in logged[1] for lo, hi in ring_intervals(s, k, RING) for r in range(lo, hi)}
                assert not written & listed, (e, t, logged)
        st.mark_segment_end()
        pos += n
        seg_log = st.segment_log()
        assert seg_log is not None
        assert read_log(log, RING) == (len(st), [tuple(r) for r in seg_log.to_json()])
    with open(log, "rb") as f:
        kinds = {line.split(b'"t":"')[1][:3] for line in f.read().splitlines()}
    # every change replays as ops (one short line each): no whole list was needed, wrap after wrap
    assert {b"bas", b"add", b"cut", b"ops"} <= kinds and b"seg" not in kinds
    st.close()


def test_flattened_commit_log_is_never_written_through_a_link(tmp_path: Any) -> None:
    """A commit log replaced by a symbolic link (to a file outside the dataset) is never written through: the file
    it points to is left as it was (the link is replaced by the log, or appending through it is a
    StorageFormatError naming it); a log replaced by a directory is a StorageFormatError when the storage is
    opened."""
    from unienv_data.base.errors import StorageFormatError
    space = _flat_ring_space()
    path = str(tmp_path / "flat")
    st = FlattenedStorage.create(space, NumpyMemmapStorage, capacity=RING, cache_path=path)
    log = os.path.join(path, "flattened_commit.log")
    outside = tmp_path / "outside.txt"
    outside.write_bytes(b"precious\n")
    os.symlink(outside, log)
    for e in range(3):
        st.mark_segment_start(e)
        st.append(_flat_ring_step(e, 0))
        try:
            st.mark_segment_end()
        except StorageFormatError as exc:
            assert "symbolic link" in str(exc)
            os.unlink(log)
    assert outside.read_bytes() == b"precious\n"
    assert not os.path.islink(log)
    st.close()
    os.unlink(log)
    os.makedirs(log)
    with pytest.raises(StorageFormatError, match="not a plain file"):
        FlattenedStorage.load_from(path, space, read_only=False)


# ------------------------------------------------ the buffer's own commit log (buffer_commit.log)
def test_buffer_commit_points_append_to_its_log_and_a_crash_copy_reopens_every_ended_episode(tmp_path: Any) -> None:
    """Durable commit points append one record each to `buffer_commit.log` and leave metadata.json as it is; a copy
    of the directory taken at any commit point (as a kill leaves it) reopens with every ended episode; a copy whose
    log ends in a torn line reopens at the record before; close() folds the log into metadata.json (a new
    generation) and removes it; a log left from an older generation (a kill between the two) is ignored."""
    import json

    from unienv_data.inspect import describe
    from unienv_data.replay_buffer._buffer_log import GENERATION_KEY
    from unienv_data.storages._commit_log import read_records
    path = str(tmp_path / "rb")
    space = DictSpace(NB, {"step": BoxSpace(NB, 0, 1000, np.float32, shape=(2,))})
    rb = ReplayBuffer.create(FlattenedStorage, space, NumpyMemmapStorage, cache_path=path, capacity=12,
                             maintain_segment_metadata=True)
    meta_file, log = os.path.join(path, "metadata.json"), os.path.join(path, BUFFER_LOG_FILE)
    inode = os.stat(meta_file).st_ino
    ended: list = []
    for e, n in enumerate([3, 4, 2, 5, 3]):             # 17 steps through a ring of 12
        for t in range(n):
            rb.append({"step": np.array([e, t], np.float32)})
        rb.mark_segment_end()
        ended.append(rb.episode_segments())
        snap = str(tmp_path / f"snap{e}")
        shutil.copytree(path, snap)
        back = ReplayBuffer.load_from(snap, backend=NB)
        assert back.episode_segments() == ended[-1] and len(back) == len(rb)
        seen = describe(snap)            # `unienv-data info` reads the log too: the offset and episodes load_from opens
        assert seen["length"] == len(back) and [tuple(e) for e in seen["episodes"]] == sorted(ended[-1])
        assert np.array_equal(back.get_at(np.arange(len(back)))["step"], rb.get_at(np.arange(len(rb)))["step"])
        back.close()
    assert os.stat(meta_file).st_ino == inode and len(read_records(log)) >= 5
    torn = str(tmp_path / "torn")                          # the last record torn by a kill while it was appended
    shutil.copytree(path, torn)
    with open(os.path.join(torn, BUFFER_LOG_FILE), "rb") as f:
        data = f.read()
    with open(os.path.join(torn, BUFFER_LOG_FILE), "wb") as f:
        f.write(data[:data.rstrip(b"\n").rfind(b"\n") + 1] + b"0badc0de {\"g\": 1, \"cou")
    back = ReplayBuffer.load_from(torn, backend=NB)         # the state of the record before: whole episodes only
    rows = back.get_at(np.arange(len(back)))["step"] if len(back) else np.zeros((0, 2), np.float32)
    segs = back.episode_segments()
    assert segs and len(back) < 12
    for s, e in segs:
        ep = int(rows[s, 0])
        assert (rows[s:e, 0] == ep).all() and rows[s:e, 1].tolist() == list(range([3, 4, 2, 5, 3][ep]))
    back.close()
    stale = str(tmp_path / "stale")
    shutil.copytree(path, stale)
    rb.close()
    assert not os.path.exists(log)
    with open(meta_file) as f:
        folded = json.load(f)
    assert folded[GENERATION_KEY] == 1 and folded["count"] == 12     # created at 0, folded at close
    # a kill between metadata.json's new generation and the log's removal: the old records do not apply again
    shutil.copy2(meta_file, os.path.join(stale, "metadata.json"))
    back = ReplayBuffer.load_from(stale, backend=NB)
    assert back.episode_segments() == ended[-1] and len(back) == 12
    back.close()
    ro = ReplayBuffer.load_from(path, backend=NB)          # a read-only open changes no file
    before = {n: os.stat(os.path.join(path, n)).st_mtime_ns for n in os.listdir(path)}
    ro.close()
    assert {n: os.stat(os.path.join(path, n)).st_mtime_ns for n in os.listdir(path)} == before
