"""On-disk compatibility with the reference `unienv` 0.0.1b16, both ways.

* Reference -> us: `tests/fixtures/reference_v0_0_1b16/` was written by the reference itself
  (`tests/fixtures/make_reference_fixtures.py`, run with the reference venv); `expected.json` holds every value as
  the reference read it back, so these tests need no reference install.
* Us -> reference: we write a FlattenedStorage / PytorchTensorStorage, then the reference (its venv's python, in a
  subprocess running `tests/fixtures/reference_read_check.py`) loads it and prints what it reads. Skipped when the
  reference venv is missing.

Values are compared exactly: same dtype, and for floats the same bits (so -0.0 != 0.0).
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any, Dict, List

import numpy as np
import pytest
from _third_party import VENVS, has_venv, venv_python

torch = pytest.importorskip("torch")

from unienv_data.storages.flattened import FlattenedStorage  # noqa: E402
from unienv_data.storages.pytorch import PytorchTensorStorage  # noqa: E402
from unienv_interface.backends.pytorch import PyTorchComputeBackend as B  # noqa: E402
from unienv_interface.space import BinarySpace, BoxSpace, DictSpace  # noqa: E402

HERE = Path(__file__).resolve().parent
FIXTURES = HERE / "fixtures" / "reference_v0_0_1b16"
CHECKER = HERE / "fixtures" / "reference_read_check.py"
REPO = HERE.parent
# the reference venv (unienv==0.0.1b16 + torch); UNIENV_REFERENCE_PYTHON overrides where it is looked for
REFERENCE_PYTHON = Path(os.environ.get("UNIENV_REFERENCE_PYTHON", VENVS / "unienv" / "bin" / "python"))

EXPECTED: Dict[str, Any] = json.loads((FIXTURES / "expected.json").read_text())
FLAT = EXPECTED["flattened"]
BOX = EXPECTED["box_uint8"]


# ---------------------------------------------------------------- helpers
def make_leaf(spec: Dict[str, Any]):
    shape = tuple(spec["shape"])
    if spec["kind"] == "binary":
        return BinarySpace(B, shape=shape)
    low = -float("inf") if spec.get("low") is None else spec["low"]
    high = float("inf") if spec.get("high") is None else spec["high"]
    return BoxSpace(B, low, high, getattr(torch, spec["dtype"]), shape=shape)


def make_dict_space(spec: Dict[str, Dict[str, Any]]) -> DictSpace:
    return DictSpace(B, {k: make_leaf(v) for k, v in spec.items()})


def assert_exact(got: Any, expected: Any, dtype: str, what: str) -> None:
    """`got` (a tensor) holds exactly `expected` (nested lists) in `dtype`: same shape, dtype and bits."""
    assert isinstance(got, torch.Tensor), f"{what}: expected a tensor, got {type(got).__name__}"
    got_np = got.detach().cpu().numpy()
    want = np.asarray(expected, dtype=np.dtype(dtype))
    assert got_np.dtype == want.dtype, f"{what}: dtype {got_np.dtype}, expected {want.dtype}"
    assert got_np.shape == want.shape, f"{what}: shape {got_np.shape}, expected {want.shape}"
    same = np.array_equal(np.ascontiguousarray(got_np).view(np.uint8), np.ascontiguousarray(want).view(np.uint8))
    assert same, f"{what}: got {got_np.tolist()}, expected {want.tolist()}"


def leaf_dtype(spec: Dict[str, Any]) -> str:
    return "bool" if spec["kind"] == "binary" else spec["dtype"]


def assert_sample(got: Any, expected: Dict[str, Any], space_spec: Dict[str, Any], what: str) -> None:
    assert isinstance(got, dict), f"{what}: expected a dict sample, got {type(got).__name__}"
    assert sorted(got) == sorted(expected), f"{what}: keys {sorted(got)}, expected {sorted(expected)}"
    for key, spec in space_spec.items():
        assert_exact(got[key], expected[key], leaf_dtype(spec), f"{what}[{key!r}]")


def stack_rows(rows: List[Dict[str, Any]]) -> Dict[str, List[Any]]:
    return {k: [r[k] for r in rows] for k in rows[0]}


def assert_same_json(got: Any, want: Any, what: str) -> None:
    """Exact equality of JSON values, telling -0.0 from 0.0 and 1 from 1.0 / True."""
    g, w = json.dumps(got, sort_keys=True), json.dumps(want, sort_keys=True)
    assert g == w, f"{what}:\n got  {g}\n want {w}"


def tree_digest(root: Path) -> Dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def reference_copy(tmp_path: Path) -> Path:
    """A private copy of the committed fixtures (tests must never touch the committed files)."""
    dst = tmp_path / "reference_v0_0_1b16"
    shutil.copytree(FIXTURES, dst)
    return dst


# ---------------------------------------------------------------- reference -> us
def test_fixtures_are_small_and_complete() -> None:
    files = tree_digest(FIXTURES)
    assert set(files) == {"expected.json", "box_uint8.memmap", "flattened/flattened_metadata.json",
                          "flattened/inner_storage.memmap"}
    total = sum((FIXTURES / f).stat().st_size for f in files)
    assert total < 8 * 1024, f"reference fixtures take {total} bytes; keep them to a few KB"
    # the reference layout: raw rows, no header; metadata with exactly the reference's three fields
    width = FLAT["flat_row"]["shape"][0]
    assert (FIXTURES / "flattened" / "inner_storage.memmap").stat().st_size == FLAT["capacity"] * width * 4
    assert (FIXTURES / BOX["file"]).stat().st_size == BOX["capacity"] * 2 * 3
    assert FLAT["metadata"] == {"storage_type": "FlattenedStorage",
                                "inner_storage_type": "unienv_data.storages.pytorch.PytorchTensorStorage",
                                "inner_storage_path": "inner_storage.memmap"}


@pytest.mark.parametrize("capacity", [None, FLAT["capacity"]], ids=["no-capacity", "right-capacity"])
def test_load_reference_flattened(reference_copy: Path, capacity: Any) -> None:
    path = reference_copy / FLAT["dir"]
    before = tree_digest(reference_copy)
    kwargs = {} if capacity is None else {"capacity": capacity}
    st = FlattenedStorage.load_from(path, make_dict_space(FLAT["space"]), **kwargs)
    try:
        assert st.capacity == FLAT["capacity"]
        assert len(st) == FLAT["length"]
        for i, row in enumerate(FLAT["rows"]):
            assert_sample(st.get(i), row, FLAT["space"], f"row {i}")
        n = FLAT["length"]
        assert_sample(st.get(slice(0, n)), stack_rows(FLAT["rows"]), FLAT["space"], "batch get(0:n)")
        assert_exact(st.get_flattened(slice(0, n)), FLAT["flat_rows"], FLAT["flat_row"]["dtype"], "flat rows")
        for i, flat in enumerate(FLAT["flat_rows"]):
            assert_exact(st.get_flattened(i), flat, FLAT["flat_row"]["dtype"], f"flat row {i}")
    finally:
        st.close()
    assert tree_digest(reference_copy) == before, "a read-only load changed or added files in the reference directory"


@pytest.mark.parametrize("capacity", [1, FLAT["capacity"] - 1, FLAT["capacity"] + 1, 100])
def test_load_reference_flattened_wrong_capacity(reference_copy: Path, capacity: int) -> None:
    with pytest.raises(ValueError):
        FlattenedStorage.load_from(reference_copy / FLAT["dir"], make_dict_space(FLAT["space"]), capacity=capacity)


def test_committed_fixtures_untouched_by_direct_load() -> None:
    """Loading the committed directory itself (read-only) must leave it byte-for-byte as the reference wrote it."""
    before = tree_digest(FIXTURES)
    st = FlattenedStorage.load_from(FIXTURES / FLAT["dir"], make_dict_space(FLAT["space"]))
    st.get(0)
    st.close()
    box = PytorchTensorStorage.load_from(FIXTURES / BOX["file"], make_leaf({"kind": "box", **BOX}))
    box.get(0)
    box.close()
    assert tree_digest(FIXTURES) == before


def _box_space():
    return BoxSpace(B, BOX["low"], BOX["high"], torch.uint8, shape=tuple(BOX["shape"]))


@pytest.mark.parametrize("capacity", [None, BOX["capacity"]], ids=["no-capacity", "right-capacity"])
def test_load_reference_tensor_storage(reference_copy: Path, capacity: Any) -> None:
    before = tree_digest(reference_copy)
    kwargs = {} if capacity is None else {"capacity": capacity}
    st = PytorchTensorStorage.load_from(reference_copy / BOX["file"], _box_space(), **kwargs)
    try:
        assert st.capacity == BOX["capacity"]
        assert len(st) == BOX["capacity"]
        assert_exact(st.get(slice(0, BOX["capacity"])), BOX["values"], BOX["dtype"], "box rows")
        for i, v in enumerate(BOX["values"]):
            assert_exact(st.get(i), v, BOX["dtype"], f"box row {i}")
    finally:
        st.close()
    assert tree_digest(reference_copy) == before


@pytest.mark.parametrize("capacity", [1, BOX["capacity"] - 1, BOX["capacity"] + 1])
def test_load_reference_tensor_storage_wrong_capacity(reference_copy: Path, capacity: int) -> None:
    with pytest.raises(ValueError):
        PytorchTensorStorage.load_from(reference_copy / BOX["file"], _box_space(), capacity=capacity)


def test_load_reference_flattened_wrong_space(reference_copy: Path) -> None:
    """A space whose flat row has another width does not match the reference file."""
    spec = dict(FLAT["space"])
    spec["obs"] = {**spec["obs"], "shape": [5]}
    with pytest.raises(ValueError):
        FlattenedStorage.load_from(reference_copy / FLAT["dir"], make_dict_space(spec))


# ---------------------------------------------------------------- us -> reference
needs_reference = pytest.mark.skipif(
    not has_venv("unienv", "UNIENV_REFERENCE_PYTHON"),
    reason=f"reference venv not found at {REFERENCE_PYTHON} (unienv==0.0.1b16 with torch); "
           "cannot check that the reference reads what we write")


def reference_read(request: Dict[str, Any]) -> Dict[str, Any]:
    proc = subprocess.run([str(venv_python("unienv", "UNIENV_REFERENCE_PYTHON")), str(CHECKER), json.dumps(request)], capture_output=True,
                          text=True, timeout=300, cwd=str(HERE), env={**os.environ, "PYTHONPATH": ""})
    assert proc.returncode == 0, (f"the reference could not read {request['path']} "
                                  f"(exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout)


OUR_CAPACITY = 5


def our_rows() -> List[Dict[str, Any]]:
    """Rows we write (values exact in float32; different from the reference fixture's)."""
    rows = []
    for i in range(OUR_CAPACITY):
        rows.append({
            "action": [0.75 - 0.5 * i if i < 4 else 1.0, -1.0 + 0.375 * i],
            "done": i % 2 == 1,
            "obs": [-3.5 * i, 0.0625 * i, 1e6 + i, -7.0],
            "reward": 0.125 * i - 0.5,
        })
    return rows


def _to_tensors(row: Dict[str, Any], space_spec: Dict[str, Any]) -> Dict[str, Any]:
    return {k: torch.tensor(row[k], dtype=getattr(torch, leaf_dtype(space_spec[k]))) for k in space_spec}


def _write_ours(space_spec: Dict[str, Any], rows: List[Dict[str, Any]], mode: str, tmp_path: Path) -> Path:
    """Writes `rows` with our FlattenedStorage (rows 0-2 with set, the rest as an appended segment)."""
    space = make_dict_space(space_spec)
    work, out = tmp_path / "work", tmp_path / "out"
    cache = {"memmap_in_place": out, "memmap_dumps_elsewhere": work, "ram_dumps": None}[mode]
    st = FlattenedStorage.create(space, PytorchTensorStorage, capacity=len(rows),
                                 cache_path=None if cache is None else str(cache))
    tensors = [_to_tensors(r, space_spec) for r in rows]
    st.set(slice(0, 2), {k: torch.stack([tensors[i][k] for i in range(2)]) for k in space_spec})
    st.set(2, tensors[2])
    st.mark_segment_start(3)
    for t in tensors[3:]:
        st.append(t)
    st.mark_segment_end()
    st.dumps(str(out))
    st.close()
    return out


@needs_reference
@pytest.mark.parametrize("mode", ["memmap_in_place", "memmap_dumps_elsewhere", "ram_dumps"])
def test_reference_reads_our_flattened(tmp_path: Path, mode: str) -> None:
    rows = our_rows()
    out = _write_ours(FLAT["space"], rows, mode, tmp_path)
    got = reference_read({"kind": "flattened", "path": str(out), "capacity": OUR_CAPACITY, "space": FLAT["space"]})
    assert got["len"] == OUR_CAPACITY and got["capacity"] == OUR_CAPACITY
    assert got["flat_row"] == FLAT["flat_row"]
    assert_same_json(got["rows"], rows, "rows the reference read one by one")
    assert_same_json(got["batch_rows"], stack_rows(rows), "rows the reference read as one batch")
    # and the raw rows are the ones we read back ourselves
    ours = FlattenedStorage.load_from(out, make_dict_space(FLAT["space"]))
    try:
        assert_exact(ours.get_flattened(slice(0, OUR_CAPACITY)), got["flat_rows"], FLAT["flat_row"]["dtype"],
                     "our flat rows vs the reference's")
    finally:
        ours.close()


@needs_reference
def test_reference_reads_fixture_after_we_write_it(reference_copy: Path) -> None:
    """Open the reference's own directory writable with our library, change a row, close: the reference still reads
    the whole directory, with our change."""
    path = reference_copy / FLAT["dir"]
    st = FlattenedStorage.load_from(path, make_dict_space(FLAT["space"]), read_only=False)
    new_row = {"action": [0.5, 0.5], "done": False, "obs": [9.0, 8.0, 7.0, 6.0], "reward": 42.0}
    st.set(3, _to_tensors(new_row, FLAT["space"]))
    st.dumps(str(path))
    st.close()
    got = reference_read({"kind": "flattened", "path": str(path), "capacity": FLAT["capacity"],
                          "space": FLAT["space"]})
    want = list(FLAT["rows"])
    want[3] = new_row
    assert_same_json(got["rows"], want, "rows the reference read")


@needs_reference
@pytest.mark.parametrize("in_place", [True, False], ids=["memmap_in_place", "dumps_elsewhere"])
def test_reference_reads_our_tensor_storage(tmp_path: Path, in_place: bool) -> None:
    out = tmp_path / "box.memmap"
    st = PytorchTensorStorage.create(_box_space(), capacity=4,
                                     cache_path=str(out if in_place else tmp_path / "work.memmap"))
    values = [[[(i * 67 + j * 5 + k * 11) % 256 for k in range(3)] for j in range(2)] for i in range(4)]
    values[3][1][2] = 255
    st.set(slice(0, 3), torch.tensor(values[:3], dtype=torch.uint8))
    st.set(3, torch.tensor(values[3], dtype=torch.uint8))
    st.dumps(str(out))
    st.close()
    leaf = {"kind": "box", "dtype": "uint8", "shape": [2, 3], "low": 0, "high": 255}
    got = reference_read({"kind": "tensor", "path": str(out), "capacity": 4, "leaf": leaf})
    assert_same_json(got, {"len": 4, "capacity": 4, "values": values}, "what the reference read")
