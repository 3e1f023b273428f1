"""A Hypothesis state machine that drives any `SpaceStorage` against a plain-Python model.

`StorageModel` is the model: the rows (any Python values, compared with the conformance class's `assert_equal`)
and the recorded segments of a ring (`capacity`) or of a growable storage (`capacity=None`):

* segments are `(start, length)` runs, oldest first. Recording a segment clips every older segment that shares
  rows with it to its other rows (one or two runs; none left: gone), as unienv 0.0.1b16 does. While an
  append-built segment is open, each appended row is cut out of the recorded segments the same way. `set` never
  touches segments. `episode_segments()` reports the runs as inclusive physical `(start, end)` pairs with
  `end = (start + length - 1) % capacity` (no modulo when growable), in position order.

`storage_state_machine(conformance_cls, capacity)` builds a `RuleBasedStateMachine` from a `StorageConformance`
subclass (its `make_space` / `create` / `reopen` / `sample_value` / `assert_equal` hooks): random writes (single,
index arrays, slices, masks), reads, append-built segments (ended or aborted, left open across steps), up to three
segment writers committed or aborted in any order, clears, bad values and bad indices (refused, nothing changed),
dumps + reopen (read-write and read-only) and, for growable storages, `extend_length` / `shrink_length`. After
every step the whole storage is compared with the model. `run_storage_state_machine` runs it as one test; the
conformance class calls it from `test_state_machine` and `test_state_machine_growable`.

Values outside a Box's declared bounds are among the bad inputs: the machine turns `BoundsWarning` into an error
(the refusal mode) while it offers them.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import warnings
from typing import TYPE_CHECKING, Any, List, Optional, Set, Tuple, Type

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test

from unienv_data.base.errors import BoundsWarning
from unienv_data.testing.trees import (
    INDEX_ERRORS,
    STATE_ERRORS,
    STRUCTURE_ERRORS,
    invalid_leaf_values,
    space_leaves,
    stack_tree,
    tree_get,
    tree_replace,
    zeros_like_tree,
)

if TYPE_CHECKING:  # the conformance class runs this machine; the machine only calls the class's hooks
    from unienv_data.testing.conformance import StorageConformance

__all__ = ["StorageModel", "StorageStateMachine", "storage_state_machine", "run_storage_state_machine"]

#: what a refused value may raise (a wrong dict key is a KeyError)
BAD_VALUE_ERRORS = STRUCTURE_ERRORS
#: how far the growable machine lets a storage grow (keeps every step cheap)
MAX_GROW_LEN = 14


# ----------------------------------------------------------------------------------------------- the model
class StorageModel:
    """Rows and segment runs of a ring (`capacity`) or a growable list (`capacity=None`); `zero` is what a new
    row holds.

    `staged=True` models storages whose append-built segment is staged (VideoStorage): appended rows are invisible
    and cut no recorded segment until `mark_segment_end`, which writes and records them; `abort_segment` discards
    them (a growable storage keeps the length it grew to, with the rows' previous values)."""

    def __init__(self, capacity: Optional[int], zero: Any, staged: bool = False) -> None:
        self.capacity = capacity
        self.zero = zero
        self.staged = staged
        #: rows appended to the open segment, not yet written (staged storages only)
        self.pending: List[Any] = []
        self.rows: List[Any] = [zero] * capacity if capacity else []
        self.segments: List[Tuple[int, int]] = []
        #: `[start, length]` of the open append-built segment, or None
        self.open: Optional[List[int]] = None

    def __len__(self) -> int:
        return len(self.rows)

    def pos(self, start: int, i: int) -> int:
        """The physical position of the `i`-th row of a run starting at `start`."""
        return (start + i) % self.capacity if self.capacity else start + i

    def cells(self, start: int, length: int) -> Set[int]:
        """The positions of a run."""
        return {self.pos(start, i) for i in range(length)}

    def norm_start(self, start: int) -> int:
        """A (valid) segment start as a position: modulo the capacity, or counted from the end when negative."""
        if self.capacity:
            return start % self.capacity
        return start + len(self.rows) if start < 0 else start

    def norm_index(self, i: int) -> int:
        """A (valid) row index as a position."""
        return i + len(self.rows) if i < 0 else i

    def write(self, p: int, row: Any) -> None:
        """Writes one row; a growable model grows (with zero rows) to reach `p`."""
        while p >= len(self.rows):
            if self.capacity is not None:
                raise IndexError(f"model position {p} is past the capacity {self.capacity}")
            self.rows.append(self.zero)
        self.rows[p] = row

    def clip(self, seg: Tuple[int, int], victims: Set[int]) -> List[Tuple[int, int]]:
        """The runs left of `seg` once the rows `victims` are overwritten, in ring order."""
        out: List[List[int]] = []
        run: Optional[List[int]] = None
        for i in range(seg[1]):
            p = self.pos(seg[0], i)
            if p in victims:
                run = None
            elif run is None:
                run = [p, 1]
                out.append(run)
            else:
                run[1] += 1
        return [(int(a), int(b)) for a, b in out]

    def cut(self, victims: Set[int]) -> None:
        """Cuts the rows `victims` out of every recorded segment."""
        self.segments = [r for s in self.segments for r in self.clip(s, victims)]

    def record(self, start: int, length: int) -> None:
        """Records a segment (empty ones are not recorded)."""
        if length <= 0:
            return
        self.cut(self.cells(start, length))
        self.segments.append((start, length))

    def append_open(self, row: Any) -> None:
        """Appends one row to the open append-built segment."""
        if self.open is None:
            raise ValueError("model: no open segment")
        p = self.pos(self.open[0], self.open[1])
        if self.staged:
            if p >= len(self.rows):
                self.write(p, self.zero)
            self.pending.append(row)
        else:
            self.cut({p})
            self.write(p, row)
        self.open[1] += 1

    def end_open(self) -> None:
        """`mark_segment_end()`: records the open segment (a staged one writes its rows first)."""
        if self.open is None:
            return
        start, n = self.open
        for i, r in enumerate(self.pending):
            self.write(self.pos(start, i), r)
        self.open, self.pending = None, []
        self.record(start, n)

    def abort_open(self) -> None:
        """`abort_segment()`: forgets the open segment (a staged one's rows are discarded)."""
        self.open, self.pending = None, []

    def commit(self, start: int, rows: List[Any]) -> None:
        """A segment writer's commit at `start`."""
        s = self.norm_start(start)
        for i, r in enumerate(rows):
            self.write(self.pos(s, i), r)
        self.record(s, len(rows))

    def clear(self) -> None:
        """`clear()`: no segments, zero rows (a growable model is emptied)."""
        self.open, self.pending = None, []
        self.segments = []
        self.rows = [self.zero] * self.capacity if self.capacity else []

    def shrink(self, k: int) -> None:
        """`shrink_length(k)` of a growable storage: drops the last `k` rows and the segments that used them."""
        n = len(self.rows) - k
        self.rows = self.rows[:n]
        self.segments = [(s, m) for s, m in self.segments if s + m <= n]
        if self.open is not None and self.open[0] + self.open[1] > n:
            self.open = None

    def expected_segments(self) -> List[Tuple[int, int]]:
        """What `episode_segments()` must return."""
        return sorted((s, self.pos(s, n - 1)) for s, n in self.segments)


# ----------------------------------------------------------------------------------------------- the machine
seeds_st = st.integers(0, 2**32 - 1)
#: what a mutating step does afterwards: nothing, or dumps + reopen
then_st = st.sampled_from(["none", "none", "none", "reopen"])


class StorageStateMachine(RuleBasedStateMachine):
    """Rules for any storage; `storage_state_machine` makes the concrete class (conformance hooks + capacity)."""

    conformance_class: Type["StorageConformance"]     # set by `storage_state_machine`
    capacity: Optional[int] = 6

    def __init__(self) -> None:
        super().__init__()
        self.kit = self.conformance_class()
        self.kit.setup_method(None)
        self.tmp = tempfile.mkdtemp(prefix="unienv-kit-sm-")
        self._dirs = 0
        self.storage = self.kit.create(self._new_dir(), self.capacity)
        self.model = StorageModel(self.capacity, zeros_like_tree(self._value(0)),
                                  staged=not self.kit.open_segment_rows_readable)
        #: open segment writers: [writer, rows]
        self.writers: List[List[Any]] = []

    def teardown(self) -> None:
        try:
            for w, _rows in self.writers:
                try:
                    w.abort()
                except Exception:  # noqa: BLE001 - cleanup only
                    pass
            self.storage.close()
        finally:
            self.kit.teardown_method(None)
            shutil.rmtree(self.tmp, ignore_errors=True)

    # ------------------------------------------------------------------ helpers
    def _new_dir(self) -> str:
        self._dirs += 1
        d = os.path.join(self.tmp, f"s{self._dirs}")
        os.makedirs(d, exist_ok=True)
        return d

    def _value(self, seed: int) -> Any:
        return self.kit.sample_value(np.random.default_rng(seed))

    def _max_segment_len(self) -> int:
        return self.capacity if self.capacity else 5

    def _room(self) -> int:
        """How many rows a growable storage may still grow by (kept small)."""
        return self.capacity if self.capacity else max(0, MAX_GROW_LEN - len(self.model))

    def _draw_start(self, data: Any) -> int:
        if self.capacity:
            return data.draw(st.integers(-self.capacity, 2 * self.capacity - 1), label="start")
        n = len(self.model)
        return data.draw(st.integers(-n, n), label="start")

    def _draw_index(self, data: Any) -> int:
        n = len(self.model)
        return data.draw(st.integers(-n, n - 1), label="index")

    def _draw_rows(self, data: Any, k: int) -> List[Any]:
        return [self._value(s) for s in data.draw(st.lists(seeds_st, min_size=k, max_size=k), label="seeds")]

    def _open_rows_hidden(self) -> bool:
        return self.model.open is not None and not self.kit.open_segment_rows_readable

    def _assert_matches_model(self, storage: Any) -> None:
        m = self.model
        assert len(storage) == len(m), f"len {len(storage)}, model {len(m)}"
        if len(m):
            if self._open_rows_hidden():
                hidden = m.cells(m.open[0], m.open[1]) if m.open else set()
                shown = [p for p in range(len(m)) if p not in hidden]
                if shown:
                    self.kit.assert_equal(storage.get(np.array(shown)), stack_tree([m.rows[p] for p in shown]))
            else:
                self.kit.assert_equal(storage.get(Ellipsis), stack_tree(m.rows))
        segs = storage.episode_segments()
        if segs is not None:
            assert segs == m.expected_segments(), f"segments {segs}, model {m.expected_segments()}"

    def _then(self, then: str) -> None:
        if then == "reopen" and self.model.open is None:
            self._reopen()

    def _reopen(self) -> None:
        for w, _rows in self.writers:
            w.abort()
        self.writers = []
        back = self.kit.reopen(self.storage, self._new_dir(), False)
        self.storage.close()
        self.storage = back
        assert self.storage.is_mutable
        assert self.storage.capacity == self.capacity

    # ------------------------------------------------------------------ invariant
    @invariant()
    def storage_equals_model(self) -> None:
        """After every step: same length, rows, segments and open-segment state as the model."""
        self._assert_matches_model(self.storage)
        assert self.storage.has_open_segment == (self.model.open is not None)
        assert self.storage.pending_segment_length == (self.model.open[1] if self.model.open else 0)
        for w, rows in self.writers:
            assert len(w) == len(rows)

    # ------------------------------------------------------------------ random access
    @precondition(lambda self: len(self.model) > 0 and not self._open_rows_hidden())
    @rule(data=st.data(), seed=seeds_st, kind=st.sampled_from(["int", "np_int"]), then=then_st)
    def set_single(self, data: Any, seed: int, kind: str, then: str) -> None:
        """`set(i, value)` at an int or NumPy int index (negative ones count from the end)."""
        i = self._draw_index(data)
        v = self._value(seed)
        self.storage.set(np.int64(i) if kind == "np_int" else i, v)
        self.model.write(self.model.norm_index(i), v)
        self._then(then)

    @precondition(lambda self: len(self.model) > 0 and not self._open_rows_hidden())
    @rule(data=st.data(), as_array=st.booleans())
    def set_index_array(self, data: Any, as_array: bool) -> None:
        """`set(indices, batch)` with duplicates allowed (the last occurrence wins)."""
        n = len(self.model)
        indices = data.draw(st.lists(st.integers(-n, n - 1), min_size=1, max_size=n + 2), label="indices")
        rows = self._draw_rows(data, len(indices))
        self.storage.set(np.array(indices, dtype=np.int64) if as_array else list(indices), stack_tree(rows))
        for i, r in zip(indices, rows):
            self.model.write(self.model.norm_index(i), r)

    @precondition(lambda self: len(self.model) > 0 and not self._open_rows_hidden())
    @rule(data=st.data(), use_mask=st.booleans())
    def set_slice_or_mask(self, data: Any, use_mask: bool) -> None:
        """`set` at a slice (any step) or a boolean mask that selects at least one row."""
        n = len(self.model)
        index: Any
        if use_mask:
            mask = data.draw(st.lists(st.booleans(), min_size=n, max_size=n).filter(any), label="mask")
            positions = [i for i, m in enumerate(mask) if m]
            index = np.array(mask)
        else:
            start = data.draw(st.integers(-n, n - 1), label="slice_start")
            step = data.draw(st.integers(1, 3), label="slice_step")
            index = slice(start, None, step)
            positions = list(range(n))[index]
        rows = self._draw_rows(data, len(positions))
        self.storage.set(index, stack_tree(rows))
        for p, r in zip(positions, rows):
            self.model.write(p, r)

    @precondition(lambda self: len(self.model) > 0 and not self._open_rows_hidden())
    @rule(data=st.data())
    def read_back(self, data: Any) -> None:
        """`get(i)` and `get(indices)` return the model's rows (as batches for an index list)."""
        m = self.model
        i = self._draw_index(data)
        self.kit.assert_equal(self.storage.get(i), m.rows[m.norm_index(i)])
        n = len(m)
        indices = data.draw(st.lists(st.integers(-n, n - 1), min_size=1, max_size=n + 2), label="read_indices")
        self.kit.assert_equal(self.storage.get(indices), stack_tree([m.rows[m.norm_index(j)] for j in indices]))

    # ------------------------------------------------------------------ append-built segments
    @precondition(lambda self: self.model.open is None)
    @rule(data=st.data(), finish=st.sampled_from(["end", "abort"]), then=then_st)
    def append_built_segment(self, data: Any, finish: str, then: str) -> None:
        """mark_segment_start + appends + mark_segment_end (or abort_segment) in one step; a ring refuses the row
        that would overwrite the segment's own first row."""
        start = self._draw_start(data)
        k = data.draw(st.integers(0, min(self._max_segment_len(), self._room())), label="n_rows")
        rows = self._draw_rows(data, k)
        self.storage.mark_segment_start(start)
        self.model.open = [self.model.norm_start(start), 0]
        for r in rows:
            self.storage.append(r)
            self.model.append_open(r)
        if self.capacity and k == self.capacity:
            try:
                self.storage.append(rows[0])
            except (ValueError, RuntimeError):
                pass
            else:
                raise AssertionError("an append-built segment grew past the capacity")
        self._finish_open(abort=finish != "end", then=then)

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
        """A second mark_segment_start while one is open raises StorageStateError."""
        try:
            self.storage.mark_segment_start(self._draw_start(data))
        except STATE_ERRORS as exc:
            assert isinstance(exc, RuntimeError) and isinstance(exc, ValueError), repr(exc)
        else:
            raise AssertionError("a second mark_segment_start was accepted")

    @precondition(lambda self: self.model.open is not None and self.model.open[1] < self._max_segment_len()
                  and self._room() > 0)
    @rule(seed=seeds_st)
    def append_to_open_segment(self, seed: int) -> None:
        """One append to the segment left open."""
        v = self._value(seed)
        self.storage.append(v)
        self.model.append_open(v)

    @precondition(lambda self: self.model.open is not None)
    @rule(abort=st.booleans(), then=then_st)
    def end_open_segment(self, abort: bool, then: str) -> None:
        """Ends (records) or aborts the segment left open."""
        assert self.model.open is not None
        self._finish_open(abort, then)

    def _finish_open(self, abort: bool, then: str) -> None:
        """Aborts or ends (records) the open segment, in the storage and in the model; then does `then`."""
        if abort:
            self.storage.abort_segment()
            self.model.abort_open()
        else:
            self.storage.mark_segment_end()
            self.model.end_open()
        self._then(then)

    @precondition(lambda self: self.model.open is None)
    @rule(seed=seeds_st)
    def append_without_open_segment_is_refused(self, seed: int) -> None:
        """append without an open segment raises StorageStateError; mark_segment_end / abort are no-ops."""
        try:
            self.storage.append(self._value(seed))
        except STATE_ERRORS:
            pass
        else:
            raise AssertionError("append without an open segment was accepted")
        self.storage.mark_segment_end()
        self.storage.abort_segment()

    # ------------------------------------------------------------------ segment writers
    @precondition(lambda self: len(self.writers) < 3)
    @rule()
    def open_writer(self) -> None:
        """open_segment_writer (several may be open at once)."""
        w = self.storage.open_segment_writer()
        assert len(w) == 0 and not w.is_finished
        self.writers.append([w, []])

    @precondition(lambda self: any(len(rows) < self._max_segment_len() for _w, rows in self.writers))
    @rule(data=st.data())
    def writer_append(self, data: Any) -> None:
        """Appends rows to one open writer (nothing reaches the storage before commit)."""
        eligible = [e for e in self.writers if len(e[1]) < self._max_segment_len()]
        entry = data.draw(st.sampled_from(eligible), label="writer")
        k = data.draw(st.integers(1, self._max_segment_len() - len(entry[1])), label="n_rows")
        for r in self._draw_rows(data, k):
            entry[0].append(r)
            entry[1].append(r)

    @precondition(lambda self: len(self.writers) > 0 and not self._open_rows_hidden())
    @rule(data=st.data(), finish_first=st.booleans(), then=then_st)
    def writer_commit(self, data: Any, finish_first: bool, then: str) -> None:
        """Commits one writer at a random start (in any order); it cannot be used again."""
        entry = data.draw(st.sampled_from(self.writers), label="writer")
        w, rows = entry
        n = len(self.model)
        if not self.capacity and n + len(rows) > MAX_GROW_LEN:
            start = data.draw(st.integers(0, max(0, n - len(rows))), label="start")
        else:
            start = self._draw_start(data)
        if finish_first:
            w.finish()
            assert w.is_finished
        w.commit(start)
        self.model.commit(start, rows)
        self.writers.remove(entry)
        try:
            w.commit(start)
        except STATE_ERRORS:
            pass
        else:
            raise AssertionError("a segment writer was committed twice")
        self._then(then)

    @precondition(lambda self: len(self.writers) > 0)
    @rule(data=st.data())
    def writer_abort(self, data: Any) -> None:
        """Aborts one writer: nothing is written, and it cannot be committed afterwards."""
        entry = data.draw(st.sampled_from(self.writers), label="writer")
        entry[0].abort()
        self.writers.remove(entry)
        try:
            entry[0].commit(0)
        except STATE_ERRORS:
            pass
        else:
            raise AssertionError("an aborted segment writer was committed")

    # ------------------------------------------------------------------ clear / persistence
    @rule(then=then_st)
    def clear(self, then: str) -> None:
        """clear(): zero rows (a growable storage empties), no segments, the open segment aborted."""
        self.storage.clear()
        self.model.clear()
        self._then(then)

    @precondition(lambda self: self.model.open is None)
    @rule()
    def reopen(self) -> None:
        """dumps + load (read-write) through the conformance class's `reopen` hook."""
        self._reopen()

    @precondition(lambda self: self.model.open is None)
    @rule()
    def peek_read_only(self) -> None:
        """A read-only copy (dumps + load) holds exactly the model and refuses writes."""
        peek = self.kit.reopen(self.storage, self._new_dir(), True)
        try:
            assert not peek.is_mutable
            self._assert_matches_model(peek)
            try:
                peek.mark_segment_start(0)
            except STATE_ERRORS:
                pass
            else:
                raise AssertionError("a read-only storage accepted mark_segment_start")
        finally:
            peek.close()

    # ------------------------------------------------------------------ bad input
    @rule(data=st.data(), seed=seeds_st, where=st.sampled_from(["set", "append", "writer_append"]))
    def bad_value_is_refused(self, data: Any, seed: int, where: str) -> None:
        """One leaf broken (wrong shape, not an array, fraction into an int, out of the dtype's range or bounds, NaN
        where bounded, non-boolean into a binary leaf ...): refused with ValueError / TypeError / KeyError and
        nothing changed."""
        valid = self._value(seed)
        cases = [(path, bad) for path, leaf in space_leaves(self.kit.space)
                 for _cat, bad in invalid_leaf_values(leaf, tree_get(valid, path))]
        path, bad_leaf = data.draw(st.sampled_from(cases), label="bad_leaf")
        bad = tree_replace(valid, path, bad_leaf)
        m = self.model
        with warnings.catch_warnings():
            warnings.simplefilter("error", BoundsWarning)
            if where == "set" and len(m) and not self._open_rows_hidden():
                self._refused(self.storage.set, self._draw_index(data), bad)
            elif where == "writer_append" or (where == "set" and not self._open_rows_hidden()):
                w = self.storage.open_segment_writer()
                self._refused(w.append, bad)
                assert len(w) == 0
                w.abort()
            elif m.open is None:
                if self._room() == 0:
                    return
                self.storage.mark_segment_start(self._draw_start(data))
                try:
                    self._refused(self.storage.append, bad)
                    assert self.storage.has_open_segment and self.storage.pending_segment_length == 0
                finally:
                    self.storage.abort_segment()
            elif m.open[1] < self._max_segment_len() and self._room() > 0:
                self._refused(self.storage.append, bad)
                assert self.storage.has_open_segment  # a refused row leaves the segment open

    @rule(data=st.data(), seed=seeds_st,
          kind=st.sampled_from(["past_end", "before_start", "bool", "float", "none", "array_oob", "2d"]))
    def bad_index_is_refused(self, data: Any, seed: int, kind: str) -> None:
        """A bad index raises IndexError / TypeError from get and set, and nothing changes."""
        n = len(self.model)
        index: Any = {"past_end": n, "before_start": -n - 1, "bool": True, "float": 1.0, "none": None,
                      "array_oob": np.array([0, n]), "2d": np.zeros((1, 1), dtype=np.int64)}[kind]
        v = self._value(seed)
        value = stack_tree([v] * int(np.size(index))) if isinstance(index, np.ndarray) else v
        self._refused(self.storage.get, index, errors=INDEX_ERRORS)
        if not self._open_rows_hidden():
            self._refused(self.storage.set, index, value, errors=INDEX_ERRORS)

    @staticmethod
    def _refused(fn: Any, *args: Any, errors: Tuple[Type[BaseException], ...] = BAD_VALUE_ERRORS) -> None:
        try:
            fn(*args)
        except AssertionError:
            raise AssertionError(f"{getattr(fn, '__name__', fn)} raised a bare AssertionError") from None
        except errors:
            return
        raise AssertionError(f"{getattr(fn, '__name__', fn)} accepted a bad input")


class _FixedCapacityRules(StorageStateMachine):
    """Extra rules of a ring."""

    @rule(k=st.integers(0, 3))
    def extend_and_shrink_are_no_ops(self, k: int) -> None:
        """extend_length / shrink_length do nothing on a fixed capacity."""
        self.storage.extend_length(k)
        self.storage.shrink_length(k)

    @precondition(lambda self: not self._open_rows_hidden())
    @rule(data=st.data())
    def too_long_writer_commit_is_refused(self, data: Any) -> None:
        """A writer holding more rows than the capacity cannot be committed; nothing is written."""
        assert self.capacity is not None
        w = self.storage.open_segment_writer()
        for r in self._draw_rows(data, self.capacity + 1):
            w.append(r)
        self._refused(w.commit, self._draw_start(data), errors=(ValueError,))
        w.abort()


class _GrowableRules(StorageStateMachine):
    """Extra rules of a growable storage (`capacity=None`)."""

    @precondition(lambda self: len(self.model) < MAX_GROW_LEN and not self._open_rows_hidden())
    @rule(data=st.data(), then=then_st)
    def extend_length(self, data: Any, then: str) -> None:
        """extend_length(k) adds k zero rows."""
        k = data.draw(st.integers(0, min(4, MAX_GROW_LEN - len(self.model))), label="k")
        self.storage.extend_length(k)
        self.model.rows.extend([self.model.zero] * k)
        self._then(then)

    @precondition(lambda self: not self._open_rows_hidden())
    @rule(data=st.data(), then=then_st)
    def shrink_length(self, data: Any, then: str) -> None:
        """shrink_length(k) drops the last k rows and the segments that used them."""
        k = data.draw(st.integers(0, len(self.model)), label="k")
        self.storage.shrink_length(k)
        self.model.shrink(k)
        self._then(then)

    @rule(k=st.integers(-3, -1))
    def negative_extend_or_too_large_shrink_is_refused(self, k: int) -> None:
        """extend_length(<0) and shrink_length(> len) raise ValueError."""
        self._refused(self.storage.extend_length, k, errors=(ValueError,))
        self._refused(self.storage.shrink_length, len(self.model) - k, errors=(ValueError,))


def storage_state_machine(conformance_cls: Type["StorageConformance"],
                          capacity: Optional[int]) -> Type[StorageStateMachine]:
    """The state machine of the storage `conformance_cls` describes, as a ring of `capacity` rows or (None)
    growable. Its `.TestCase` is a unittest class pytest collects; `run_storage_state_machine` runs it directly."""
    base: Type[StorageStateMachine] = _FixedCapacityRules if capacity is not None else _GrowableRules
    name = f"{conformance_cls.__name__}{'Growable' if capacity is None else 'Fixed'}Machine"
    return type(name, (base,), {"conformance_class": conformance_cls, "capacity": capacity})


def run_storage_state_machine(conformance_cls: Type["StorageConformance"], capacity: Optional[int],
                              max_examples: int = 8, steps: int = 15) -> None:
    """Runs the state machine of `conformance_cls` (`max_examples` runs of up to `steps` steps each); a failure
    raises with the shortest step sequence Hypothesis found. The environment variable
    `UNIENV_STATE_MACHINE_FACTOR` (an int, default 1) multiplies `max_examples`, for long local or nightly runs."""
    factor = os.environ.get("UNIENV_STATE_MACHINE_FACTOR", "1")
    try:
        max_examples *= max(1, int(factor))
    except ValueError:
        raise ValueError(f"UNIENV_STATE_MACHINE_FACTOR must be an int, got {factor!r}") from None
    machine = storage_state_machine(conformance_cls, capacity)
    run_state_machine_as_test(machine, settings=settings(
        max_examples=max_examples, stateful_step_count=steps, deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large]))
