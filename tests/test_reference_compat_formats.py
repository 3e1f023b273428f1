"""On-disk compatibility of HDF5Storage, NPZStorage and ParquetStorage (alone and as FlattenedStorage's inner
storage) with the reference `unienv` 0.0.1b16, both ways.

* Reference -> us: `tests/fixtures/reference_formats_v0_0_1b16/` was written by the reference itself
  (`tests/fixtures/make_reference_format_fixtures.py make`, run with the reference venv); `expected.json` holds
  every row as the reference read it back, so these tests need no reference install.
* Us -> reference: we write storages of every format, then the reference (its venv's python, in one subprocess
  running the same script's `read` mode) opens them and reports every row. Skipped when the reference venv is
  missing. The reference venv has no pyarrow: it borrows this venv's (a symlink on its PYTHONPATH).

Values are compared exactly: same dtype and, for floats, the same bits.
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

pytest.importorskip("h5py")
pytest.importorskip("pyarrow")

from unienv_data.base.errors import StorageNotFoundError  # noqa: E402
from unienv_data.storages.flattened import FlattenedStorage  # noqa: E402
from unienv_data.storages.hdf5 import HDF5Storage  # noqa: E402
from unienv_data.storages.npz_storage import NPZStorage  # noqa: E402
from unienv_data.storages.parquet import ParquetStorage  # noqa: E402
from unienv_interface.backends import NumpyComputeBackend as B  # noqa: E402
from unienv_interface.space import BinarySpace, BoxSpace, DictSpace, TextSpace  # noqa: E402

HERE = Path(__file__).resolve().parent
FIXTURES = HERE / "fixtures" / "reference_formats_v0_0_1b16"
SCRIPT = HERE / "fixtures" / "make_reference_format_fixtures.py"
REPO = HERE.parent
REFERENCE_PYTHON = Path(os.environ.get("UNIENV_REFERENCE_PYTHON", VENVS / "unienv" / "bin" / "python"))

EXPECTED: Dict[str, Any] = json.loads((FIXTURES / "expected.json").read_text())["fixtures"]
INF = float("inf")
CLASSES = {"hdf5": HDF5Storage, "npz": NPZStorage, "parquet": ParquetStorage}


# ---------------------------------------------------------------------------------------------------- helpers
def make_space(spec: Dict[str, Any]) -> Any:
    kind = spec["kind"]
    if kind == "dict":
        return DictSpace(B, {k: make_space(v) for k, v in spec["spaces"].items()})
    if kind == "binary":
        return BinarySpace(B, tuple(spec["shape"]))
    if kind == "text":
        return TextSpace(B, max_length=spec["max_length"])
    low = -INF if spec.get("low") is None else spec["low"]
    high = INF if spec.get("high") is None else spec["high"]
    return BoxSpace(B, low, high, np.dtype(spec["dtype"]), shape=tuple(spec["shape"]))


def to_value(spec: Dict[str, Any], v: Any) -> Any:
    kind = spec["kind"]
    if kind == "dict":
        return {k: to_value(s, v[k]) for k, s in spec["spaces"].items()}
    if kind == "text":
        return v
    return np.array(v, dtype=bool if kind == "binary" else np.dtype(spec["dtype"]))


def stack(spec: Dict[str, Any], rows: List[Any]) -> Any:
    if spec["kind"] == "dict":
        return {k: stack(s, [r[k] for r in rows]) for k, s in spec["spaces"].items()}
    if spec["kind"] == "text":
        out = np.empty(len(rows), dtype=object)
        out[:] = rows
        return out
    return np.stack([to_value(spec, r) for r in rows])


def lists(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: lists(x) for k, x in v.items()}
    if isinstance(v, str):
        return v
    if isinstance(v, np.ndarray) and v.dtype == object:
        return [lists(x) for x in v.tolist()]
    return np.asarray(v).tolist()


def assert_exact(got: Any, want: Any, spec: Dict[str, Any], what: str, batch: bool = False) -> None:
    """`got` holds exactly the JSON value `want` in the space's dtypes (same shape, same bits)."""
    kind = spec["kind"]
    if kind == "dict":
        assert isinstance(got, dict) and sorted(got) == sorted(spec["spaces"]), f"{what}: keys {sorted(got)}"
        for k, s in spec["spaces"].items():
            assert_exact(got[k], want[k], s, f"{what}[{k!r}]", batch)
        return
    if kind == "text":
        if batch:
            assert isinstance(got, np.ndarray) and got.dtype == object, f"{what}: {type(got).__name__}"
            assert got.tolist() == want, f"{what}: {got.tolist()} != {want}"
        else:
            assert isinstance(got, str) and got == want, f"{what}: {got!r} != {want!r}"
        return
    dtype = np.dtype(bool) if kind == "binary" else np.dtype(spec["dtype"])
    assert isinstance(got, np.ndarray), f"{what}: expected an ndarray, got {type(got).__name__}"
    w = np.asarray(want, dtype=dtype)
    assert got.dtype == dtype and got.shape == w.shape, f"{what}: {got.dtype}{got.shape}, expected {dtype}{w.shape}"
    assert np.ascontiguousarray(got).tobytes() == np.ascontiguousarray(w).tobytes(), \
        f"{what}: {got.tolist()} != {w.tolist()}"


def tree_digest(root: Path) -> Dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def load(fx: Dict[str, Any], root: Path, **kw: Any) -> Any:
    space = make_space(fx["space"])
    if fx["kind"] == "flattened":
        return FlattenedStorage.load_from(root / fx["path"], space, **kw)
    return CLASSES[fx["kind"]].load_from(root / fx["path"], space, **kw)


@pytest.fixture
def reference_copy(tmp_path: Path) -> Path:
    dst = tmp_path / "ref"
    shutil.copytree(FIXTURES, dst)
    return dst


# ---------------------------------------------------------------------------------------------------- reference -> us
def test_fixtures_are_small_and_complete() -> None:
    files = tree_digest(FIXTURES)
    sizes = {f: (FIXTURES / f).stat().st_size for f in files}
    assert sum(sizes.values()) < 40 * 1024, f"fixtures take {sum(sizes.values())} bytes; keep them to a few KB"
    assert max(sizes.values()) < 16 * 1024
    assert set(EXPECTED) == {"hdf5_dict", "hdf5_growable", "npz_box", "npz_growable", "parquet_dict", "parquet_box",
                             "flattened_hdf5", "flattened_npz", "flattened_parquet"}
    assert EXPECTED["npz_box"]["metadata"] == {"storage_type": "NPZStorage", "compressed": True, "capacity": 4,
                                               "length": 4}
    assert set(EXPECTED["parquet_dict"]["metadata"]) == {"piece_size", "num_rows", "column_shapes", "compression",
                                                         "column_dtypes"}
    assert EXPECTED["flattened_hdf5"]["metadata"] == {"storage_type": "FlattenedStorage",
                                                      "inner_storage_type": "unienv_data.storages.hdf5.HDF5Storage",
                                                      "inner_storage_path": "inner_storage.hdf5"}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_load_reference_fixture(reference_copy: Path, name: str) -> None:
    fx = EXPECTED[name]
    before = tree_digest(reference_copy)
    kw: Dict[str, Any] = {"missing_ok": True} if fx.get("missing_rows") else {}
    if "parquet" in name and fx["capacity"] is not None:
        kw["capacity"] = fx["capacity"]  # the reference's Parquet metadata records no capacity (see the test below)
    st = load(fx, reference_copy, **kw)
    try:
        n = fx["len"]
        assert len(st) == n and st.capacity == fx["capacity"], (len(st), st.capacity)
        assert st.get_segments() is None and st.episode_segments() == []  # the reference records none
        for i, row in enumerate(fx["rows"]):
            assert_exact(st.get(i), row, fx["space"], f"{name} row {i}")
        idx = np.array([n - 1, 0, n - 1, 1 % n])
        assert_exact(st.get(idx), _stacked_json(fx, idx), fx["space"], f"{name} batch", True)
        if fx["kind"] == "flattened":
            flat = np.asarray(st.get_flattened(slice(0, n)))
            want = np.asarray(fx["flat_rows"], dtype=np.dtype(fx["flat_row"]["dtype"]))
            assert flat.dtype == want.dtype and flat.tobytes() == want.tobytes()
    finally:
        st.close()
    assert tree_digest(reference_copy) == before, "a read-only load changed files of the reference directory"


def _stacked_json(fx: Dict[str, Any], idx: np.ndarray) -> Any:
    rows = [fx["rows"][int(i)] for i in idx]

    def walk(spec: Dict[str, Any], items: List[Any]) -> Any:
        if spec["kind"] == "dict":
            return {k: walk(s, [it[k] for it in items]) for k, s in spec["spaces"].items()}
        return items
    return walk(fx["space"], rows)


@pytest.mark.parametrize("name", ["hdf5_dict", "npz_box", "parquet_box", "flattened_hdf5", "flattened_parquet"])
def test_reference_fixture_wrong_capacity(reference_copy: Path, name: str) -> None:
    fx = EXPECTED[name]
    with pytest.raises(ValueError, match=f"capacity={fx['capacity']}"):
        load(fx, reference_copy, capacity=fx["capacity"] + 1)


def test_reference_growable_fixtures_take_a_capacity_only_when_it_fits(reference_copy: Path) -> None:
    with pytest.raises(ValueError, match="omit capacity"):
        load(EXPECTED["hdf5_growable"], reference_copy, capacity=5)
    # the reference's Parquet metadata records no capacity: the row count makes a valid fixed capacity
    st = load(EXPECTED["parquet_dict"], reference_copy, capacity=5)
    assert st.capacity == 5 and len(st) == 5
    with pytest.raises(ValueError, match="capacity=5"):
        load(EXPECTED["parquet_dict"], reference_copy, capacity=6)


def test_reference_npz_row_without_file(reference_copy: Path) -> None:
    fx = EXPECTED["npz_box"]
    st = load(fx, reference_copy)
    assert_exact(st.get(2), fx["rows"][2], fx["space"], "row 2")
    with pytest.raises(StorageNotFoundError, match="missing_ok=True"):
        st.get(3)
    lenient = load(fx, reference_copy, missing_ok=True)
    assert lenient.get(3).tolist() == [[0, 0, 0], [0, 0, 0]]


def test_reference_fixtures_wrong_space(reference_copy: Path) -> None:
    spec = json.loads(json.dumps(EXPECTED["hdf5_dict"]["space"]))
    spec["spaces"]["reward"]["dtype"] = "float32"
    with pytest.raises(ValueError, match="reward"):
        HDF5Storage.load_from(reference_copy / "hdf5_dict.hdf5", make_space(spec))
    spec = json.loads(json.dumps(EXPECTED["parquet_dict"]["space"]))
    spec["spaces"]["obs"]["shape"] = [4]
    with pytest.raises(ValueError, match="obs"):
        ParquetStorage.load_from(reference_copy / "parquet_dict", make_space(spec))
    with pytest.raises(ValueError):
        NPZStorage.load_from(reference_copy / "npz_growable", make_space({**EXPECTED["npz_growable"]["space"],
                                                                          "shape": [3]})).get(0)


def test_build_space_from_reference_files(reference_copy: Path) -> None:
    count, cap, space = HDF5Storage.build_space_from_hdf5_file(reference_copy / "hdf5_dict.hdf5")
    assert (count, cap) == (5, 5)
    assert sorted(space.spaces) == ["action", "done", "obs", "reward", "task"]
    assert isinstance(space.spaces["task"], TextSpace) and space.spaces["task"].max_length == 16
    assert space.spaces["obs"].spaces["img"].dtype == np.uint8 and space.spaces["obs"].spaces["img"].shape == (2, 2)
    count, cap, space = HDF5Storage.build_space_from_hdf5_file(reference_copy / "hdf5_growable.hdf5")
    assert (count, cap) == (5, None) and isinstance(space, BoxSpace) and space.shape == (2,)
    count, cap, space = ParquetStorage.build_space_from_parquet_file(reference_copy / "parquet_dict")
    assert (count, cap) == (5, 5) and sorted(space.spaces) == ["done", "obs", "reward", "task"]
    inferred = HDF5Storage.load_from(reference_copy / "hdf5_dict.hdf5", HDF5Storage.build_space_from_hdf5_file(
        reference_copy / "hdf5_dict.hdf5")[2])
    assert inferred.get(3)["task"] == EXPECTED["hdf5_dict"]["rows"][3]["task"]


def test_committed_fixtures_untouched_by_read_only_loads() -> None:
    before = tree_digest(FIXTURES)
    for name, fx in EXPECTED.items():
        st = load(fx, FIXTURES, **({"missing_ok": True} if fx.get("missing_rows") else {}))
        st.get(slice(0, len(st)))
        st.close()
    assert tree_digest(FIXTURES) == before


# ---------------------------------------------------------------------------------------------------- us -> reference
needs_reference = pytest.mark.skipif(
    not has_venv("unienv", "UNIENV_REFERENCE_PYTHON"),
    reason=f"reference venv not found at {REFERENCE_PYTHON} (unienv==0.0.1b16 with h5py); cannot check that the "
           "reference reads what we write")


def reference_read(requests: List[Dict[str, Any]], tmp: Path) -> List[Dict[str, Any]]:
    import pyarrow
    lend = tmp / "lend"
    lend.mkdir(exist_ok=True)
    link = lend / "pyarrow"
    if not link.exists():
        link.symlink_to(os.path.dirname(pyarrow.__file__))
    def run(batch: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
        proc = subprocess.run([str(venv_python("unienv", "UNIENV_REFERENCE_PYTHON")), str(SCRIPT), "read",
                               json.dumps(batch)], capture_output=True, text=True, timeout=300, cwd=str(tmp),
                              env={**os.environ, "PYTHONPATH": str(lend)})
        assert proc.returncode == 0, f"the reference reader failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}"
        return json.loads(proc.stdout)

    results = run(requests)
    # CPython 3.11 can raise a spurious "SystemError: AST constructor recursion depth mismatch" from
    # `ast.literal_eval` (NumPy reads .npy headers with it), rarely, in a process running threads
    # (python/cpython#106905): an interpreter bug in the reference's process, not a reading difference. Those
    # requests run once more, in a fresh process; any other failure stands.
    flaky = [i for i, r in enumerate(results) if "AST constructor recursion depth mismatch" in str(r.get("error", ""))]
    if flaky:
        for i, again in zip(flaky, run([requests[i] for i in flaky])):
            results[i] = again
    return results


def _rows_for(spec: Dict[str, Any], n: int, salt: int) -> List[Any]:
    """Deterministic JSON rows of a space spec; floats are multiples of 1/8 (exact in float32)."""
    def leaf(s: Dict[str, Any], i: int, k: int) -> Any:
        if s["kind"] == "dict":
            return {key: leaf(sub, i, k + 7 * j) for j, (key, sub) in enumerate(s["spaces"].items())}
        if s["kind"] == "text":
            return ["go", "", "ünï", "stop here", "x"][(i + k + salt) % 5]
        shape = s["shape"]
        size = int(np.prod(shape)) if shape else 1
        if s["kind"] == "binary":
            vals = [(i + k + j + salt) % 2 == 0 for j in range(size)]
        elif np.dtype(s["dtype"]).kind in "iu":
            vals = [(3 * i + k + j + salt) % 50 for j in range(size)]
        else:
            lo = -1.0 if s.get("low") is not None else -64.0
            vals = [max(lo, min(-lo, 0.125 * ((5 * i + 3 * j + k + salt) % 17) - 1.0)) for j in range(size)]
        arr = np.array(vals).reshape(shape) if shape else np.array(vals[0])
        return arr.tolist()
    return [leaf(spec, i, 0) for i in range(n)]


def _write(st: Any, spec: Dict[str, Any], rows: List[Any]) -> None:
    """rows[:2] with one batch set, rows[2] alone, the rest appended as a segment (growable storages grow)."""
    if st.capacity is None:
        st.extend_length(3)
    st.set(slice(0, 2), stack(spec, rows[:2]))
    st.set(2, to_value(spec, rows[2]))
    st.mark_segment_start(3)
    for r in rows[3:]:
        st.append(to_value(spec, r))
    st.mark_segment_end()


def _cases(tmp: Path) -> List[Dict[str, Any]]:
    """Writes storages of every format with this library; returns the reference read requests (with our rows)."""
    cases: List[Dict[str, Any]] = []
    dict_spec, flat_spec = EXPECTED["hdf5_dict"]["space"], EXPECTED["parquet_dict"]["space"]
    fl_spec = EXPECTED["flattened_hdf5"]["space"]

    def add(kind: str, path: Path, spec: Dict[str, Any], capacity: Any, rows: List[Any], **extra: Any) -> None:
        cases.append({"kind": kind, "path": str(path), "space": spec, "capacity": capacity, "want": rows, **extra})

    rows = _rows_for(dict_spec, 5, 1)
    st = HDF5Storage.create(make_space(dict_spec), 5, cache_path=str(tmp / "h_dict.hdf5"))
    _write(st, dict_spec, rows)
    st.close()
    add("hdf5", tmp / "h_dict.hdf5", dict_spec, 5, rows)

    spec = EXPECTED["hdf5_growable"]["space"]
    rows = _rows_for(spec, 9, 2)
    st = HDF5Storage.create(make_space(spec), None, cache_path=str(tmp / "h_grow.hdf5"), compression="gzip")
    _write(st, spec, rows)
    st.close()
    add("hdf5", tmp / "h_grow.hdf5", spec, None, rows)

    rows = _rows_for(dict_spec, 4, 3)
    st = HDF5Storage.create(make_space(dict_spec), 4)  # in memory, then dumped
    _write(st, dict_spec, rows)
    st.dumps(tmp / "h_mem.hdf5")
    add("hdf5", tmp / "h_mem.hdf5", dict_spec, 4, rows)

    spec = EXPECTED["npz_box"]["space"]
    rows = _rows_for(spec, 4, 4)
    st = NPZStorage.create(make_space(spec), capacity=5, cache_path=str(tmp / "n_work"))
    _write(st, spec, rows)
    st.dumps(tmp / "n_box")  # elsewhere (the reference cannot); row 4 never written
    add("npz", tmp / "n_box", spec, None, rows + [[[0, 0, 0], [0, 0, 0]]])

    spec = EXPECTED["npz_growable"]["space"]
    rows = _rows_for(spec, 6, 5)
    st = NPZStorage.create(make_space(spec), cache_path=str(tmp / "n_grow"), compressed=False)
    _write(st, spec, rows)
    st.close()
    add("npz", tmp / "n_grow", spec, None, rows)

    rows = _rows_for(flat_spec, 7, 6)
    st = ParquetStorage.create(make_space(flat_spec), cache_path=str(tmp / "p_dict"), piece_size=2)
    _write(st, flat_spec, rows)
    st.close()
    add("parquet", tmp / "p_dict", flat_spec, None, rows)

    spec = EXPECTED["parquet_box"]["space"]
    rows = _rows_for(spec, 5, 7)
    st = ParquetStorage.create(make_space(spec), capacity=5, cache_path=str(tmp / "p_work"), compression="zstd")
    _write(st, spec, rows)
    st.dumps(tmp / "p_box")
    add("parquet", tmp / "p_box", spec, 5, rows)

    for name, cls in (("HDF5Storage", HDF5Storage), ("NPZStorage", NPZStorage), ("ParquetStorage", ParquetStorage)):
        rows = _rows_for(fl_spec, 4, 8)
        st = FlattenedStorage.create(make_space(fl_spec), cls, capacity=4, cache_path=str(tmp / f"f_work_{name}"))
        _write(st, fl_spec, rows)
        st.dumps(tmp / f"f_{name}")
        add("flattened", tmp / f"f_{name}", fl_spec, 4, rows, inner=name)

    # a reference directory we opened writable and changed: the reference still reads all of it
    for name, row in (("hdf5_dict", 1), ("parquet_dict", 3), ("npz_box", 0)):
        fx = EXPECTED[name]
        shutil.copytree(FIXTURES, tmp / f"copy_{name}", dirs_exist_ok=True)
        st = load(fx, tmp / f"copy_{name}", read_only=False)
        new = _rows_for(fx["space"], row + 1, 9)[row]
        st.set(row, to_value(fx["space"], new))
        st.close()
        want = list(fx["rows"])
        want[row] = new
        add(fx["kind"], tmp / f"copy_{name}" / fx["path"], fx["space"], fx["capacity"], want)
    return cases


def _check(case: Dict[str, Any], got: Dict[str, Any]) -> List[str]:
    where = f"{case['kind']} {os.path.basename(case['path'])}"
    if "error" in got:
        return [f"{where}: the reference failed: {got['error']}\n{got.get('trace', '')}"]
    want, problems = case["want"], []
    if got["len"] != len(want):
        problems.append(f"{where}: len {got['len']} != {len(want)}")
    if json.dumps(got["rows"], sort_keys=True) != json.dumps(want, sort_keys=True):
        problems.append(f"{where}: rows the reference read differ:\n got  {got['rows']}\n want {want}")
    if json.dumps(got["batch"], sort_keys=True) != json.dumps(_stacked(case["space"], want), sort_keys=True):
        problems.append(f"{where}: the reference's batch read differs: {got['batch']}")
    if case["kind"] == "flattened" and got["inner_type"] != case["inner"]:
        problems.append(f"{where}: inner storage {got['inner_type']}, expected {case['inner']}")
    return problems


@needs_reference
@pytest.mark.filterwarnings("ignore::unienv_data.storages.flattened.FlattenPromotionWarning")
def test_reference_reads_what_we_write(tmp_path: Path) -> None:
    """HDF5 (fixed with text, growable gzip, in-memory dumped), NPZ (dumped elsewhere, growable), Parquet (growable
    in pieces, fixed dumped elsewhere), FlattenedStorage over each, and reference fixtures we changed: the reference
    opens every one (one subprocess) and reads exactly our rows, one by one and as one batch."""
    cases = _cases(tmp_path)
    results = reference_read([{k: v for k, v in c.items() if k != "want"} for c in cases], tmp_path)
    assert len(results) == len(cases) == 13
    problems = [p for case, got in zip(cases, results) for p in _check(case, got)]
    assert not problems, "\n".join(problems)


def _stacked(spec: Dict[str, Any], rows: List[Any]) -> Any:
    if spec["kind"] == "dict":
        return {k: _stacked(s, [r[k] for r in rows]) for k, s in spec["spaces"].items()}
    return rows
