"""Property-based state machines for `FlattenedStorage` over a memory-mapped `PytorchTensorStorage`.

Each machine drives one storage through random sequences of writes, append-built segments, segment writers,
clears, bad inputs and dump / close / reopen cycles, and after every step compares it with a plain-Python model:

* rows: a list of `(a, b, c)` tuples (a: float32[3] in [-1, 1], b: int in [-100, 100], c: bool);
* segments (the kit's `unienv_data.testing.state_machine.StorageModel`): a list of `(start, length)` runs, oldest first. Recording a segment clips every older segment that
  shares rows with it to its other rows (one or two runs; none left: gone), as unienv 0.0.1b16 does. While an
  append-built segment is open, each appended row is cut out of the recorded segments the same way (those rows
  no longer hold what the segment says; see `SpaceStorage._free_rows_from`). `set` never touches segments.
  `get_segments()` reports the runs as inclusive physical `(start, end)` pairs with
  `end = (start + length - 1) % capacity` (no modulo when growable), in position order.

Values outside the declared bounds are stored with a `BoundsWarning` by default; these machines run with that
warning turned into an error (the refusal mode), so out-of-bounds values are among the bad inputs.

The fixed-capacity machine uses a ring of 7 rows; the growable one (`capacity=None`) also extends and shrinks.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any, List, Optional, Tuple

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

torch = pytest.importorskip("torch")

from unienv_data.base.errors import StorageStateError  # noqa: E402
from unienv_data.storages.flattened import FlattenedStorage  # noqa: E402
from unienv_data.storages.pytorch import PytorchTensorStorage  # noqa: E402
from unienv_data.testing.state_machine import StorageModel as KitModel  # noqa: E402
from unienv_interface.backends.pytorch import PyTorchComputeBackend as TB  # noqa: E402
from unienv_interface.space import BinarySpace, BoxSpace, DictSpace  # noqa: E402

pytestmark = pytest.mark.filterwarnings("error::unienv_data.base.errors.BoundsWarning")

CAPACITY = 7
MAX_GROW_LEN = 18
BAD_INPUT_ERRORS = (ValueError, TypeError, KeyError, IndexError)


def make_space() -> DictSpace:
    return DictSpace(TB, {
        "c": BinarySpace(TB, ()),
        "a": BoxSpace(TB, -1.0, 1.0, torch.float32, shape=(3,)),
        "b": BoxSpace(TB, -100, 100, torch.int16, shape=()),
    })


SPACE = make_space()

Row = Tuple[np.ndarray, int, bool]
ZERO_ROW: Row = (np.zeros(3, dtype=np.float32), 0, False)

# ----------------------------------------------------------------------------------------------- strategies
f32_unit = st.floats(-1.0, 1.0, width=32)
rows_st = st.tuples(
    st.lists(f32_unit, min_size=3, max_size=3).map(lambda xs: np.array(xs, dtype=np.float32)),
    st.integers(-100, 100),
    st.booleans(),
)
single_form_st = st.sampled_from(["torch", "numpy", "python"])
batch_form_st = st.sampled_from(["torch", "numpy"])
index_form_st = st.sampled_from(["torch", "numpy", "list"])
#: what a mutating step does afterwards: nothing, a commit point, or close + reopen
then_st = st.sampled_from(["none", "none", "flush", "reopen"])

BAD_VALUE_KINDS = [
    "a_short", "a_long", "a_extra_dim", "b_vector", "c_vector", "a_oob", "a_inf", "a_nan", "b_oob", "b_nan",
    "b_frac", "b_overflow", "c_two", "missing_key", "extra_key", "renamed_key", "not_a_dict", "none_leaf",
    "str_leaf", "complex_leaf",
]
BAD_INDEX_KINDS = ["idx_past_end", "idx_before_start", "idx_bool", "idx_float", "idx_array_oob", "idx_2d", "idx_float_tensor"]


# ----------------------------------------------------------------------------------------------- value builders
def _stack(rows: List[Row]) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    a = np.stack([r[0] for r in rows]).astype(np.float32) if rows else np.zeros((0, 3), dtype=np.float32)
    b = np.array([r[1] for r in rows], dtype=np.int16)
    c = np.array([r[2] for r in rows], dtype=np.bool_)
    return a, b, c


def _to_form(arr: Any, form: str) -> Any:
    if form == "torch" and isinstance(arr, np.ndarray):
        return torch.from_numpy(np.array(arr, copy=True))
    return arr


def single_value(row: Row, form: str) -> dict:
    a, b, c = row
    if form == "torch":
        return {"a": torch.from_numpy(a.copy()), "b": torch.tensor(b, dtype=torch.int16), "c": torch.tensor(c)}
    if form == "numpy":
        return {"a": a.copy(), "b": np.array(b, dtype=np.int16), "c": np.array(c)}
    return {"a": [float(x) for x in a], "b": int(b), "c": bool(c)}


def batch_value(rows: List[Row], form: str) -> dict:
    a, b, c = _stack(rows)
    return {"a": _to_form(a, form), "b": _to_form(b, form), "c": _to_form(c, form)}


def flat_row(row: Row) -> np.ndarray:
    """The reference row layout: keys sorted (a, b, c), promoted to float32 on torch."""
    a, b, c = row
    return np.concatenate([a, np.array([b, int(c)], dtype=np.float32)]).astype(np.float32)


def index_value(indices: List[int], form: str) -> Any:
    if form == "torch":
        return torch.tensor(indices, dtype=torch.int64)
    if form == "numpy":
        return np.array(indices, dtype=np.int64)
    return list(indices)


def bad_value(kind: str, rows: List[Row], batched: bool, bad_pos: int, form: str) -> Any:
    """A malformed single sample (batched=False, rows has one entry) or batch, broken at row `bad_pos`."""
    a, b, c = _stack(rows)
    if not batched:
        a, b, c = a[0].copy(), b[0].copy(), c[0].copy()
        b, c = np.array(b), np.array(c)
    at = (bad_pos,) if batched else ()
    d: dict = {"a": a, "b": b, "c": c}
    if kind == "a_short":
        d["a"] = a[..., :2]
    elif kind == "a_long":
        d["a"] = np.concatenate([a, np.zeros(a.shape[:-1] + (1,), np.float32)], axis=-1)
    elif kind == "a_extra_dim":
        d["a"] = a[..., None]
    elif kind == "b_vector":
        d["b"] = b[..., None]
    elif kind == "c_vector":
        d["c"] = np.stack([c, c], axis=-1)
    elif kind in ("a_oob", "a_inf", "a_nan"):
        a = a.copy()
        a[at + (1,)] = {"a_oob": 1.5, "a_inf": -np.inf, "a_nan": np.nan}[kind]
        d["a"] = a
    elif kind == "b_oob":
        b = b.astype(np.int32)
        b[at] = 101
        d["b"] = b
    elif kind in ("b_nan", "b_frac"):
        b = b.astype(np.float32)
        b[at] = np.nan if kind == "b_nan" else 2.5
        d["b"] = b
    elif kind == "b_overflow":
        b = b.astype(np.int32)
        b[at] = 40000
        d["b"] = b
    elif kind == "c_two":
        c = c.astype(np.int64)
        c[at] = 2
        d["c"] = c
    elif kind == "missing_key":
        del d["c"]
    elif kind == "extra_key":
        d["extra"] = b.copy()
    elif kind == "renamed_key":
        d["x"] = d.pop("a")
    elif kind == "none_leaf":
        d["a"] = None
    elif kind == "str_leaf":
        d["a"] = "abc"
    elif kind == "complex_leaf":
        d["a"] = a.astype(np.complex64)
    else:  # pragma: no cover - guards the kind list
        assert kind == "not_a_dict", kind
    out = {k: _to_form(v, form) for k, v in d.items()}
    if kind == "not_a_dict":
        return [out["a"], out["b"], out["c"]]
    return out


# ----------------------------------------------------------------------------------------------- the model
def StorageModel(capacity: Optional[int]) -> KitModel:
    """The kit's model (unienv_data.testing.state_machine) with this module's zero row."""
    return KitModel(capacity, ZERO_ROW)


# ----------------------------------------------------------------------------------------------- machines
class _FlattenedStorageMachine(RuleBasedStateMachine):
    """Rules shared by the fixed-capacity and the growable machine (see the module docstring)."""

    capacity: Optional[int] = CAPACITY

    def __init__(self) -> None:
        super().__init__()
        self.tmp = tempfile.mkdtemp(prefix="unienv-sm-")
        self.path = os.path.join(self.tmp, "flat")
        self.storage = FlattenedStorage.create(SPACE, PytorchTensorStorage, capacity=self.capacity,
                                               cache_path=self.path)
        self.model = StorageModel(self.capacity)
        self.writers: List[List[Any]] = []  # [writer, rows]

    def teardown(self) -> None:
        try:
            self.storage.close()
        finally:
            shutil.rmtree(self.tmp, ignore_errors=True)

    # ------------------------------------------------------------------ helpers
    def _max_segment_len(self) -> int:
        return self.capacity if self.capacity else 6

    def _room(self) -> int:
        """How many rows a growable storage may still grow by (the tests keep it small)."""
        return CAPACITY if self.capacity else max(0, MAX_GROW_LEN - len(self.model))

    def _draw_start(self, data: Any) -> int:
        if self.capacity:
            return data.draw(st.integers(-self.capacity, 2 * self.capacity - 1), label="start")
        n = len(self.model)
        return data.draw(st.integers(-n, n), label="start")

    def _draw_index(self, data: Any) -> int:
        n = len(self.model)
        return data.draw(st.integers(-n, n - 1), label="index")

    def _assert_matches_model(self, st_: FlattenedStorage) -> None:
        m = self.model
        assert len(st_) == len(m)
        got = st_.get(Ellipsis)
        assert set(got.keys()) == {"a", "b", "c"}
        a, b, c = _stack(m.rows)
        assert got["a"].dtype == torch.float32 and tuple(got["a"].shape) == (len(m), 3)
        assert got["b"].dtype == torch.int16 and tuple(got["b"].shape) == (len(m),)
        assert got["c"].dtype == torch.bool and tuple(got["c"].shape) == (len(m),)
        np.testing.assert_array_equal(got["a"].numpy(), a)
        np.testing.assert_array_equal(got["b"].numpy(), b)
        np.testing.assert_array_equal(got["c"].numpy(), c)
        assert st_.episode_segments() == m.expected_segments()

    def _then(self, then: str) -> None:
        """Optionally ends a step with a commit point (flush) or a close + reopen, so that persistence is
        exercised right after every kind of change."""
        if then == "flush":
            self.storage.flush()
        elif then == "reopen" and self.model.open is None:
            self._reopen()

    # ------------------------------------------------------------------ invariants
    @invariant()
    def storage_equals_model(self) -> None:
        self._assert_matches_model(self.storage)
        assert self.storage.has_open_segment == (self.model.open is not None)
        assert self.storage.capacity == self.capacity

    # ------------------------------------------------------------------ random access writes
    @precondition(lambda self: len(self.model) > 0)
    @rule(data=st.data(), row=rows_st, form=single_form_st, then=then_st)
    def set_at_int(self, data: Any, row: Row, form: str, then: str) -> None:
        i = self._draw_index(data)
        kind = data.draw(st.sampled_from(["int", "np_int", "tensor0d"]), label="int_kind")
        idx: Any = {"int": i, "np_int": np.int64(i), "tensor0d": torch.tensor(i)}[kind]
        self.storage.set(idx, single_value(row, form))
        self.model.write(self.model.norm_index(i), row)
        self._then(then)

    @precondition(lambda self: len(self.model) > 0)
    @rule(data=st.data(), form=batch_form_st, index_form=index_form_st)
    def set_at_index_array(self, data: Any, form: str, index_form: str) -> None:
        n = len(self.model)
        indices = data.draw(st.lists(st.integers(-n, n - 1), min_size=0, max_size=2 * n), label="indices")
        rows = data.draw(st.lists(rows_st, min_size=len(indices), max_size=len(indices)), label="rows")
        self.storage.set(index_value(indices, index_form), batch_value(rows, form))
        for i, r in zip(indices, rows):  # duplicates: the last occurrence wins
            self.model.write(self.model.norm_index(i), r)

    @precondition(lambda self: len(self.model) > 0)
    @rule(data=st.data(), form=batch_form_st)
    def set_at_mask_or_slice(self, data: Any, form: str) -> None:
        n = len(self.model)
        if data.draw(st.booleans(), label="use_mask"):
            mask = data.draw(st.lists(st.booleans(), min_size=n, max_size=n), label="mask")
            positions = [i for i, m in enumerate(mask) if m]
            index: Any = torch.tensor(mask) if form == "torch" else np.array(mask)
        else:
            start = data.draw(st.integers(-n, n), label="slice_start")
            stop = data.draw(st.integers(-n, n), label="slice_stop")
            step = data.draw(st.integers(1, 3), label="slice_step")
            index = slice(start, stop, step)
            positions = list(range(n))[index]
        rows = data.draw(st.lists(rows_st, min_size=len(positions), max_size=len(positions)), label="rows")
        self.storage.set(index, batch_value(rows, form))
        for p, r in zip(positions, rows):
            self.model.write(p, r)

    @precondition(lambda self: len(self.model) > 0)
    @rule(data=st.data(), row=rows_st)
    def set_flattened_at_int(self, data: Any, row: Row) -> None:
        i = self._draw_index(data)
        self.storage.set_flattened(i, torch.from_numpy(flat_row(row)))
        self.model.write(self.model.norm_index(i), row)

    # ------------------------------------------------------------------ reads
    @precondition(lambda self: len(self.model) > 0)
    @rule(data=st.data(), index_form=index_form_st)
    def read_back(self, data: Any, index_form: str) -> None:
        m = self.model
        i = self._draw_index(data)
        one = self.storage.get(i)
        a, b, c = m.rows[m.norm_index(i)]
        assert tuple(one["a"].shape) == (3,) and tuple(one["b"].shape) == () and tuple(one["c"].shape) == ()
        np.testing.assert_array_equal(one["a"].numpy(), a)
        assert int(one["b"]) == b and bool(one["c"]) == c
        flat = self.storage.get_flattened(i)
        assert flat.dtype == torch.float32 and tuple(flat.shape) == (5,)
        np.testing.assert_array_equal(flat.numpy(), flat_row(m.rows[m.norm_index(i)]))
        n = len(m)
        indices = data.draw(st.lists(st.integers(-n, n - 1), max_size=2 * n), label="read_indices")
        got = self.storage.get(index_value(indices, index_form))
        ea, eb, ec = _stack([m.rows[m.norm_index(j)] for j in indices])
        np.testing.assert_array_equal(got["a"].numpy(), ea)
        np.testing.assert_array_equal(got["b"].numpy(), eb)
        np.testing.assert_array_equal(got["c"].numpy(), ec)
        # reads are copies: writing into them must not change the storage
        got["a"].fill_(0.5)
        one["a"].fill_(0.5)
        flat.fill_(0.5)

    # ------------------------------------------------------------------ append-built segments
    @precondition(lambda self: self.model.open is None)
    @rule(data=st.data(), form=single_form_st, finish=st.sampled_from(["end", "abort"]), then=then_st)
    def append_built_segment(self, data: Any, form: str, finish: str, then: str) -> None:
        """mark_segment_start + several appends + mark_segment_end (or abort_segment), all in one step."""
        start = self._draw_start(data)
        max_len = min(self._max_segment_len(), self._room())
        rows = data.draw(st.lists(rows_st, max_size=max_len), label="rows")
        self.storage.mark_segment_start(start)
        self.model.open = [self.model.norm_start(start), 0]
        assert self.storage.has_open_segment
        for r in rows:
            self.storage.append(single_value(r, form))
            self.model.append_open(r)
        if self.capacity and len(rows) == self.capacity:
            # one more row would overwrite the segment's own first row
            with pytest.raises((ValueError, RuntimeError)):
                self.storage.append(single_value(rows[0], form))
        if finish == "end":
            self.storage.mark_segment_end()
            self.model.record(*self.model.open)
        else:
            self.storage.abort_segment()
        self.model.open = None
        assert not self.storage.has_open_segment
        self._then(then)

    @precondition(lambda self: self.model.open is None)
    @rule(data=st.data())
    def open_segment(self, data: Any) -> None:
        """Opens an append-built segment that stays open across later steps."""
        start = self._draw_start(data)
        self.storage.mark_segment_start(start)
        self.model.open = [self.model.norm_start(start), 0]

    @precondition(lambda self: self.model.open is not None)
    @rule(data=st.data())
    def second_segment_start_is_refused(self, data: Any) -> None:
        with pytest.raises(StorageStateError):
            self.storage.mark_segment_start(self._draw_start(data))

    @precondition(lambda self: self.model.open is not None and self.model.open[1] < self._max_segment_len()
                  and self._room() > 0)
    @rule(row=rows_st, form=single_form_st)
    def append_to_open_segment(self, row: Row, form: str) -> None:
        self.storage.append(single_value(row, form))
        self.model.append_open(row)

    @precondition(lambda self: self.model.open is not None)
    @rule(then=then_st)
    def end_open_segment(self, then: str) -> None:
        self.storage.mark_segment_end()
        assert self.model.open is not None
        self.model.record(*self.model.open)
        self.model.open = None
        self._then(then)

    @rule(then=then_st)
    def abort_segment(self, then: str) -> None:
        """abort_segment: forgets the open segment (a no-op when none is open)."""
        self.storage.abort_segment()
        self.model.open = None
        self._then(then)

    @precondition(lambda self: self.model.open is None)
    @rule(row=rows_st)
    def append_without_open_segment_is_refused(self, row: Row) -> None:
        with pytest.raises(RuntimeError):
            self.storage.append(single_value(row, "torch"))
        self.storage.mark_segment_end()  # a no-op when nothing is open

    # ------------------------------------------------------------------ segment writers
    @precondition(lambda self: len(self.writers) < 3)
    @rule()
    def open_writer(self) -> None:
        w = self.storage.open_segment_writer()
        assert w.length == 0 and len(w) == 0 and not w.is_finished
        self.writers.append([w, []])

    @precondition(lambda self: any(len(rows) < self._max_segment_len() for _w, rows in self.writers))
    @rule(data=st.data(), form=single_form_st)
    def writer_append(self, data: Any, form: str) -> None:
        eligible = [e for e in self.writers if len(e[1]) < self._max_segment_len()]
        entry = data.draw(st.sampled_from(eligible), label="writer")
        k = data.draw(st.integers(1, self._max_segment_len() - len(entry[1])), label="n_rows")
        rows = data.draw(st.lists(rows_st, min_size=k, max_size=k), label="rows")
        for r in rows:
            entry[0].append(single_value(r, form))
            entry[1].append(r)
        assert entry[0].length == len(entry[1])

    @precondition(lambda self: len(self.writers) > 0)
    @rule(data=st.data(), finish_first=st.booleans(), then=then_st)
    def writer_commit(self, data: Any, finish_first: bool, then: str) -> None:
        entry = data.draw(st.sampled_from(self.writers), label="writer")
        w, rows = entry
        n = len(self.model)
        if not self.capacity and n + len(rows) > MAX_GROW_LEN:
            start = data.draw(st.integers(0, max(0, n - len(rows))), label="start")  # keep the storage small
        else:
            start = self._draw_start(data)
        if finish_first:
            w.finish()
            w.finish()  # idempotent
            assert w.is_finished
            with pytest.raises(StorageStateError):
                w.append(single_value(ZERO_ROW, "torch"))
        w.commit(start)
        self.model.commit(start, rows)
        self.writers.remove(entry)
        with pytest.raises(StorageStateError):
            w.commit(start)
        with pytest.raises(StorageStateError):
            w.append(single_value(ZERO_ROW, "torch"))
        self._then(then)

    @precondition(lambda self: len(self.writers) > 0)
    @rule(data=st.data())
    def writer_abort(self, data: Any) -> None:
        entry = data.draw(st.sampled_from(self.writers), label="writer")
        entry[0].abort()
        self.writers.remove(entry)
        with pytest.raises(StorageStateError):
            entry[0].commit(0)

    # ------------------------------------------------------------------ clear / persistence
    @rule(then=then_st)
    def clear(self, then: str) -> None:
        self.storage.clear()
        self.model.clear()
        self._then(then)

    def _reopen(self) -> None:
        self.storage.close()
        self.storage.close()  # idempotent
        for w, _rows in self.writers:  # writers of the closed storage are dropped
            w.abort()
        self.writers = []
        self.storage = FlattenedStorage.load_from(self.path, SPACE, read_only=False)
        assert self.storage.is_mutable

    @precondition(lambda self: self.model.open is None)
    @rule()
    def dumps_close_reopen(self) -> None:
        """dumps to the cache directory, close, load_from(read_only=False)."""
        self.storage.dumps(self.path)
        self._reopen()

    @precondition(lambda self: self.model.open is None)
    @rule()
    def close_reopen(self) -> None:
        """close persists a writable memory-mapped storage by itself."""
        self._reopen()

    @precondition(lambda self: self.model.open is None)
    @rule()
    def flush(self) -> None:
        """A commit point without closing."""
        self.storage.flush()

    @precondition(lambda self: self.model.open is None)
    @rule(use_dumps=st.booleans())
    def peek_read_only(self, use_dumps: bool) -> None:
        """After a commit point, a second, read-only handle sees exactly the model."""
        if use_dumps:
            self.storage.dumps(self.path)
        else:
            self.storage.flush()
        peek = FlattenedStorage.load_from(self.path, SPACE, read_only=True)
        try:
            assert not peek.is_mutable
            self._assert_matches_model(peek)
            with pytest.raises(StorageStateError):  # ReadOnlyStorageError
                peek.mark_segment_start(0)
            if len(self.model):
                with pytest.raises(StorageStateError):
                    peek.set(0, single_value(ZERO_ROW, "torch"))
        finally:
            peek.close()

    # ------------------------------------------------------------------ bad input
    @rule(data=st.data(), kind=st.sampled_from(BAD_VALUE_KINDS + BAD_INDEX_KINDS), form=batch_form_st,
          where=st.sampled_from(["set_single", "set_batch", "append", "writer_append", "set_flattened"]))
    def bad_input_is_rejected(self, data: Any, kind: str, form: str, where: str) -> None:
        """A malformed value or index raises ValueError/TypeError/KeyError/IndexError and changes nothing."""
        m = self.model
        n = len(m)
        target = where
        if kind in BAD_INDEX_KINDS:
            target = "set_single"
            value = single_value(data.draw(rows_st, label="row"), form)
            index: Any = {
                "idx_past_end": n, "idx_before_start": -n - 1, "idx_bool": True, "idx_float": 1.0,
                "idx_array_oob": np.array([0, n], dtype=np.int64) if n else np.array([n], dtype=np.int64),
                "idx_2d": np.zeros((1, 1), dtype=np.int64), "idx_float_tensor": torch.tensor([0.0]),
            }[kind]
            if kind in ("idx_array_oob", "idx_2d", "idx_float_tensor"):
                k = int(np.size(index)) if kind != "idx_float_tensor" else 1
                value = batch_value(data.draw(st.lists(rows_st, min_size=k, max_size=k), label="rows"), form)
            with pytest.raises(BAD_INPUT_ERRORS):
                self.storage.set(index, value)
            return
        if n == 0 and target in ("set_single", "set_batch", "set_flattened"):
            target = "append"
        if target == "set_single":
            value = bad_value(kind, [data.draw(rows_st, label="row")], False, 0, form)
            with pytest.raises(BAD_INPUT_ERRORS):
                self.storage.set(self._draw_index(data), value)
        elif target == "set_batch":
            indices = data.draw(st.lists(st.integers(-n, n - 1), min_size=1, max_size=n), label="indices")
            rows = data.draw(st.lists(rows_st, min_size=len(indices), max_size=len(indices)), label="rows")
            bad_pos = data.draw(st.integers(0, len(indices) - 1), label="bad_pos")
            with pytest.raises(BAD_INPUT_ERRORS):
                self.storage.set(index_value(indices, form), bad_value(kind, rows, True, bad_pos, form))
        elif target == "append":
            value = bad_value(kind, [data.draw(rows_st, label="row")], False, 0, form)
            opened_here = m.open is None
            if opened_here:
                if self._room() == 0:
                    return
                self.storage.mark_segment_start(self._draw_start(data))
            elif m.open[1] >= self._max_segment_len() or self._room() == 0:
                return
            try:
                with pytest.raises(BAD_INPUT_ERRORS):
                    self.storage.append(value)
                assert self.storage.has_open_segment  # a rejected row leaves the segment open
            finally:
                if opened_here:
                    self.storage.abort_segment()
        elif target == "writer_append":
            value = bad_value(kind, [data.draw(rows_st, label="row")], False, 0, form)
            open_entries = [e for e in self.writers if len(e[1]) < self._max_segment_len()]
            if open_entries:
                w, rows = data.draw(st.sampled_from(open_entries), label="writer")
                with pytest.raises(BAD_INPUT_ERRORS):
                    w.append(value)
                assert w.length == len(rows)
            else:
                w = self.storage.open_segment_writer()
                with pytest.raises(BAD_INPUT_ERRORS):
                    w.append(value)
                assert w.length == 0
                w.abort()
        else:  # set_flattened: a flat row one of whose columns is not a valid value of its key
            row = flat_row(data.draw(rows_st, label="row"))
            col, bad = data.draw(st.sampled_from([(0, 1.5), (1, np.nan), (3, 2.5), (3, 101.0), (4, 2.0), (4, 0.5),
                                                  (-1, 0.0)]), label="bad_column")
            if col < 0:
                row = np.concatenate([row, [0.0]]).astype(np.float32)  # wrong width
            else:
                row[col] = bad
            with pytest.raises(BAD_INPUT_ERRORS):
                self.storage.set_flattened(self._draw_index(data), torch.from_numpy(row))


class FixedCapacityMachine(_FlattenedStorageMachine):
    """A ring of CAPACITY rows."""

    capacity = CAPACITY

    @rule(k=st.integers(0, 4))
    def extend_and_shrink_are_noops(self, k: int) -> None:
        self.storage.extend_length(k)
        self.storage.shrink_length(k)

    @precondition(lambda self: self.model.open is None)
    @rule(data=st.data())
    def too_long_writer_commit_is_refused(self, data: Any) -> None:
        """A writer holding more rows than the capacity cannot be committed; nothing is written."""
        w = self.storage.open_segment_writer()
        for r in data.draw(st.lists(rows_st, min_size=CAPACITY + 1, max_size=CAPACITY + 1), label="rows"):
            w.append(single_value(r, "torch"))
        with pytest.raises(ValueError):
            w.commit(self._draw_start(data))
        w.abort()


class GrowableMachine(_FlattenedStorageMachine):
    """capacity=None: the storage grows on appends / commits past its end and with extend_length."""

    capacity = None

    @precondition(lambda self: len(self.model) < MAX_GROW_LEN)
    @rule(data=st.data(), then=then_st)
    def extend_length(self, data: Any, then: str) -> None:
        k = data.draw(st.integers(0, min(4, MAX_GROW_LEN - len(self.model))), label="k")
        self.storage.extend_length(k)
        for _ in range(k):
            self.model.rows.append(ZERO_ROW)
        self._then(then)

    @rule(data=st.data(), then=then_st)
    def shrink_length(self, data: Any, then: str) -> None:
        k = data.draw(st.integers(0, len(self.model)), label="k")
        self.storage.shrink_length(k)
        self.model.shrink(k)
        self._then(then)

    @rule(k=st.integers(-3, -1))
    def negative_extend_or_too_large_shrink_is_refused(self, k: int) -> None:
        with pytest.raises(ValueError):
            self.storage.extend_length(k)
        with pytest.raises(ValueError):
            self.storage.shrink_length(len(self.model) - k)


_SETTINGS = settings(max_examples=120, stateful_step_count=40, deadline=None,
                     suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                            HealthCheck.data_too_large])

TestFixedCapacityFlattenedStorage = FixedCapacityMachine.TestCase
TestFixedCapacityFlattenedStorage.settings = _SETTINGS
TestGrowableFlattenedStorage = GrowableMachine.TestCase
TestGrowableFlattenedStorage.settings = _SETTINGS

