"""Ring, segment, sampler and bounds semantics of unienv 0.0.1b16, checked against the reference itself.

tests/fixtures/semantics_scenarios.py runs the same scenarios under the reference venv's python and under ours;
every result must be equal. The known answers are asserted here too, so the semantics stay pinned when the
reference venv is absent (locally; CI always has it). The rest of the file covers what the reference cannot run
the same way (warnings, refusals, files).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any, Dict

import numpy as np
import pytest

from _third_party import has_venv, require_module, venv_python

torch = pytest.importorskip("torch")

from unienv_data.base import BoundsWarning, StorageFormatError  # noqa: E402
from unienv_data.replay_buffer import ReplayBuffer  # noqa: E402
from unienv_data.replay_buffer._metadata import read_metadata  # noqa: E402
from unienv_data.storages.dict_storage import DictStorage  # noqa: E402
from unienv_data.storages.flattened import FlattenedStorage  # noqa: E402
from unienv_data.storages.pytorch import PytorchTensorStorage  # noqa: E402
from unienv_interface.backends.numpy import NumpyComputeBackend as NB  # noqa: E402
from unienv_interface.backends.pytorch import PyTorchComputeBackend as TB  # noqa: E402
from unienv_interface.space import BinarySpace, BoxSpace, DictSpace  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = Path(__file__).parent / "fixtures" / "semantics_scenarios.py"


def run_scenarios(python: str, extra_path: str = "") -> Dict[str, Any]:
    env = dict(os.environ)
    env["PYTHONPATH"] = extra_path
    proc = subprocess.run([python, str(SCRIPT)], capture_output=True, text=True, timeout=300, env=env,
                          cwd=str(SCRIPT.parent))
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def here() -> Dict[str, Any]:
    return run_scenarios(sys.executable, str(ROOT / "src"))


#: scenarios whose answer differs from the reference on purpose (docs/differences.md): the reference's answer and why
LISTED_DIFFERENCES = {
    "dumps_with_open_episode": ({"first": "RuntimeError naming mark_segment_end", "listed": None},
                                "without maintain_segment_metadata, dumps() with an open episode works here "
                                "(reference-api.md section 7 item 25)"),
}


def test_known_answers(here: Dict[str, Any]) -> None:
    assert here["extends_are_segments"] == {"segments": [[0, 3], [3, 5]], "maintain": True}
    assert here["episodes_clip_the_oldest"]["segments"] == [[0, 1], [1, 4], [4, 8]]
    assert here["episodes_clip_the_oldest"]["rows"] == [float(i) for i in range(2, 10)]
    oversize = here["extend_wrap_and_oversize"]
    assert oversize["after_first"] == [[0, 3]] and oversize["after_second"] == [[0, 1], [1, 4]]
    assert oversize["after_oversize"] == [[0, 4]]
    for name in ("dqn_loop", "dqn_loop_maintained"):      # 10x the capacity, newest rows kept
        assert here[name]["len"] == 16 and here[name]["rows"] == [float(i) for i in range(144, 160)]
    assert here["dqn_loop_maintained"]["segments_after_end"] == [[0, 16]]
    assert here["multiprocessing_with_segment_metadata"] == "RuntimeError"
    assert here["unmaintained_segments"] == {"buffer": None, "storage": None, "open": False, "rows": [0.0, 1.0, 2.0]}
    assert here["dumps_with_open_episode"] == {"first": "dumped", "listed": None}     # reference: RuntimeError
    assert here["dumps_with_open_episode_maintained"] == {"first": "RuntimeError naming mark_segment_end",
                                                          "listed": [[0, 0]]}
    assert here["seeded_epoch_order"] == {"same": True, "is_permutation": True}
    assert here["out_of_bounds_values"] == {"len": 2, "rows": [[5.0, -7.0], [None, 0.0]]}


@pytest.mark.skipif(not has_venv("unienv", "UNIENV_REFERENCE_PYTHON"), reason="reference venv not found")
def test_same_results_as_the_reference(here: Dict[str, Any]) -> None:
    ref = run_scenarios(str(venv_python("unienv", "UNIENV_REFERENCE_PYTHON")))
    assert set(ref) == set(here)
    for name, (reference_answer, why) in LISTED_DIFFERENCES.items():
        assert ref[name] == reference_answer, f"{name}: the reference changed ({ref[name]}); {why}"
    diff = {k: {"reference": ref[k], "here": here[k]} for k in ref if ref[k] != here[k] and k not in LISTED_DIFFERENCES}
    assert not diff, json.dumps(diff, indent=1)


# ------------------------------------------------------------------------------------------------ bounds policy
def _flat(tmp: Any = None) -> ReplayBuffer:
    space = DictSpace(TB, {"a": BoxSpace(TB, -1.0, 1.0, torch.float32, shape=(2,)),
                           "u": BoxSpace(TB, 0, 100, torch.uint8, shape=()),
                           "i": BoxSpace(TB, -5, 5, torch.int32, shape=()),
                           "b": BinarySpace(TB, shape=())})
    return ReplayBuffer.create(FlattenedStorage, space, inner_storage_cls=PytorchTensorStorage, capacity=4,
                               is_memmap=False)


def _row(a: Any = (0.0, 0.0), u: int = 0, i: Any = 0, b: Any = False) -> Dict[str, Any]:
    return {"a": torch.tensor(a, dtype=torch.float32), "u": torch.tensor(u, dtype=torch.uint8),
            "i": i if not isinstance(i, int) else torch.tensor(i, dtype=torch.int32),
            "b": b if not isinstance(b, bool) else torch.tensor(b)}


def test_out_of_bounds_is_stored_with_one_warning_per_key_and_storage() -> None:
    rb = _flat()
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        rb.append(_row(a=(3.0, 0.0), u=200))
        rb.append(_row(a=(-4.0, float("nan")), u=201, i=9))
        rb.mark_segment_end()
    bounds = [w for w in got if issubclass(w.category, BoundsWarning)]
    assert sorted(str(w.message).split(":")[0] for w in bounds) == ["key 'a'", "key 'i'", "key 'u'"]
    assert issubclass(BoundsWarning, UserWarning)
    a = rb.get_at(slice(None))["a"]
    assert a[0].tolist() == [3.0, 0.0] and a[1, 0].item() == -4.0 and torch.isnan(a[1, 1])
    assert rb.get_at(slice(None))["u"].tolist() == [200, 201]
    other = _flat()                                  # another storage warns again
    with pytest.warns(BoundsWarning):
        other.append(_row(a=(2.0, 0.0)))


def test_bounds_warning_as_error_refuses_and_changes_nothing() -> None:
    rb = _flat()
    rb.append(_row(a=(0.5, 0.5)))
    with warnings.catch_warnings():
        warnings.simplefilter("error", BoundsWarning)
        for _ in range(2):                           # refused every time, not only the first
            with pytest.raises(BoundsWarning, match="key 'a'"):
                rb.append(_row(a=(1.5, 0.0)))
            with pytest.raises(BoundsWarning):
                rb.set_at(0, _row(a=(0.0, -1.5)))
    assert len(rb) == 1 and rb.get_at(0)["a"].tolist() == [0.5, 0.5]


def test_bounds_warning_as_error_refuses_even_after_a_lenient_warning() -> None:
    """A key that warned once (default filters) is still refused once the caller turns BoundsWarning into an error:
    the once-per-key rule silences the warning, not the refusal."""
    rb = _flat()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", BoundsWarning)
        rb.append(_row(a=(3.0, 0.0)))                # stored, warned (ignored here)
    with warnings.catch_warnings():
        warnings.simplefilter("error", BoundsWarning)
        with pytest.raises(BoundsWarning, match="key 'a'"):
            rb.append(_row(a=(9.0, 0.0)))
    assert len(rb) == 1 and rb.get_at(0)["a"].tolist() == [3.0, 0.0]
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        rb.append(_row(a=(5.0, 0.0)))                # lenient again: stored, not reported a second time
    assert len(rb) == 2 and not [w for w in got if issubclass(w.category, BoundsWarning)]


@pytest.mark.parametrize("bad", ["uint8_300", "int_fraction", "int_nan", "int_into_bool"])
def test_dtype_rules_stay_strict(bad: str) -> None:
    rb = _flat()
    row = {"uint8_300": lambda: _row(u=0) | {"u": torch.tensor(300, dtype=torch.int32)},
           "int_fraction": lambda: _row(i=torch.tensor(0.5)),
           "int_nan": lambda: _row(i=torch.tensor(float("nan"))),
           "int_into_bool": lambda: _row(b=torch.tensor(1, dtype=torch.int64) * 2)}[bad]()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", BoundsWarning)
        with pytest.raises((ValueError, TypeError)):
            rb.append(row)
    assert len(rb) == 0


# ------------------------------------------------------------------------------------------------ smaller points
def test_dict_storage_map_and_tuple_index() -> None:
    space = DictSpace(NB, {"x": BoxSpace(NB, -1.0, 1.0, np.float32, shape=(2,)),
                           "y": BoxSpace(NB, 0, 9, np.int64, shape=())})
    from unienv_data.storages.numpy_memmap import NumpyMemmapStorage
    st = DictStorage.create(space, {"x": NumpyMemmapStorage, "y": NumpyMemmapStorage}, capacity=3)
    assert set(st.storage_map) == {"x", "y"} and st.storage_map["x"].capacity == 3
    st.set(slice(0, 3), {"x": np.zeros((3, 2), np.float32), "y": np.arange(3)})
    with pytest.raises(TypeError, match=r"tuple index \(0, 1\)"):
        st.get((0, 1))
    assert st.get([0, 1])["y"].tolist() == [0, 1]


@pytest.mark.parametrize("cap", [4, None])
def test_memmap_file_with_appended_bytes_is_refused(tmp_path: Path, cap: Any) -> None:
    space = BoxSpace(TB, -10.0, 10.0, torch.float32, shape=(2,))
    p = tmp_path / "x.memmap"
    st = PytorchTensorStorage.create(space, capacity=cap, cache_path=p, is_memmap=True)
    if cap is None:
        st.extend_length(3)
    st.set(slice(0, 3), torch.ones(3, 2))
    st.dumps(p)
    st.close()
    before = p.read_bytes()
    with open(p, "ab") as f:
        f.write(b"\0\0\0")
    with pytest.raises(StorageFormatError) as info:
        PytorchTensorStorage.load_from(p, space, capacity=cap, is_memmap=True)
    msg = str(info.value)
    assert str(p) in msg and f"holds {len(before) + 3} bytes" in msg and "expected" in msg


def test_replay_buffer_and_storages_are_generic() -> None:
    """Subscripted as the reference's are (its PytorchTensorStorage is concrete: no parameters; the full table is in
    tests/test_reference_generics.py)."""
    from typing import Any as A
    for cls in (ReplayBuffer, FlattenedStorage):
        assert cls[A, A, A, A, A] is not None  # type: ignore[index]
    assert DictStorage[A, A, A, A] is not None  # type: ignore[index]
    with pytest.raises(TypeError):
        PytorchTensorStorage[A]  # type: ignore[index]


def test_libx264rgb_qp0_from_encoder_options_is_lossless(tmp_path: Path) -> None:
    av = require_module("av", "video")
    if "libx264rgb" not in av.codecs_available:
        pytest.skip("this FFmpeg build has no libx264rgb")
    from unienv_data.storages.video_storage import VideoStorage
    rb = ReplayBuffer.create(VideoStorage, BoxSpace(NB, 0, 255, np.uint8, shape=(16, 16, 3)),
                             cache_path=tmp_path / "v", capacity=None, codec="libx264rgb", file_ext="mkv",
                             file_pixel_format="rgb24", encoder_options={"qp": "0"})
    frames = np.random.default_rng(0).integers(0, 256, (6, 16, 16, 3), dtype=np.uint8)
    for f in frames:
        rb.append(f)
    rb.mark_segment_end()
    np.testing.assert_array_equal(rb.get_at(slice(None)), frames)
    rb.close()


def test_multiprocessing_rules(tmp_path: Path) -> None:
    space = BoxSpace(TB, -10.0, 10.0, torch.float32, shape=(2,))
    with pytest.raises(RuntimeError, match="maintain_segment_metadata=True with multiprocessing=True"):
        ReplayBuffer.create(PytorchTensorStorage, space, cache_path=tmp_path / "a", capacity=4, is_memmap=True,
                            multiprocessing=True, maintain_segment_metadata=True)
    # a growable buffer with maintained segments: shared read-only, refused writable (the reference's rules)
    rb = ReplayBuffer.create(PytorchTensorStorage, space, cache_path=tmp_path / "g", capacity=None, is_memmap=True,
                             maintain_segment_metadata=True)
    rb.extend(torch.ones(3, 2))
    rb.dumps()
    rb.close()
    with pytest.raises(RuntimeError, match="read_only=True"):
        ReplayBuffer.load_from(tmp_path / "g", backend=TB, is_memmap=True, multiprocessing=True, read_only=False)
    ro = ReplayBuffer.load_from(tmp_path / "g", backend=TB, is_memmap=True, multiprocessing=True, read_only=True)
    assert len(ro) == 3 and ro.get_segments() == [(0, 3)] and ro.is_multiprocessing_safe
    ro.close()


def test_maintained_segments_on_disk_never_list_overwritten_rows(tmp_path: Path) -> None:
    """With maintain_segment_metadata the list lives in metadata.json, written by dumps(): before the ring
    overwrites rows of a listed segment, the directory stops listing it (one record per segment), so a crash
    before the next dumps() never shows a listed episode holding other data; dumps() writes the clipped list."""
    space = BoxSpace(TB, -1e6, 1e6, torch.float32, shape=(2,))
    d = tmp_path / "rb"
    rb = ReplayBuffer.create(PytorchTensorStorage, space, cache_path=d, capacity=6, is_memmap=True,
                             maintain_segment_metadata=True)

    def on_disk() -> Any:       # metadata.json with the buffer's commit log applied: what a load would see
        return read_metadata(d)["physical_segments"]

    k = 0
    for n in (3, 3):
        for _ in range(n):
            rb.append(torch.full((2,), float(k)))
            k += 1
        rb.mark_segment_end()
        rb.dumps(d)
    assert on_disk() == [[0, 2], [3, 5]]
    rb.append(torch.full((2,), 99.0))          # row 0 of the first episode is overwritten
    assert on_disk() == [[3, 5]] and rb.get_segments() == [(0, 2), (2, 5)]
    crashed = ReplayBuffer.load_from(d, backend=TB, is_memmap=True)   # what a crash now would leave
    # only the intact episode, and only its rows: the window gave up the first episode before row 0 was written
    assert crashed.get_segments() == [(0, 3)] and crashed.get_at(slice(None))[:, 0].tolist() == [3.0, 4.0, 5.0]
    crashed.close()
    rb.append(torch.full((2,), 98.0))
    rb.mark_segment_end()
    rb.dumps(d)
    assert sorted(on_disk()) == [[0, 1], [2, 2], [3, 5]] and rb.get_segments() == [(0, 1), (1, 4), (4, 6)]
    rb.close()


def test_refused_append_past_the_capacity_changes_nothing() -> None:
    rb = ReplayBuffer.create(PytorchTensorStorage, BoxSpace(TB, -1e6, 1e6, torch.float32, shape=(2,)), capacity=3,
                             is_memmap=False, maintain_segment_metadata=True)
    for i in range(4):                                  # the open episode already rings
        rb.append(torch.full((2,), float(i)))
    with pytest.raises(ValueError):
        rb.append(torch.zeros(3))                       # wrong shape
    assert len(rb) == 3 and rb.get_at(slice(None))[:, 0].tolist() == [1.0, 2.0, 3.0]
    rb.mark_segment_end()
    assert rb.get_segments() == [(0, 3)]
