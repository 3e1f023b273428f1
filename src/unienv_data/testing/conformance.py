"""The `SpaceStorage` contract, stated once (see docs/testing.md).

`StorageConformance` is a mixin of test methods (its name does not start with "Test", so pytest does not collect
it on its own). Each storage's test module subclasses it as `TestSomething(StorageConformance)` and provides:

* `make_space()`: the single-instance space (called once per test; must give equal spaces on every call);
* `create(tmp_path, capacity)`: a new, empty storage (`capacity=None` only when `supports_growable`);
* `dump_path(tmp_path)` / `load(path, read_only)`: where `dumps` writes and how `load_from` reopens it (the default
  `reopen(storage, tmp_path, read_only)` is "dumps, then load_from without passing a capacity");
* optionally `sample_value(rng)` (one valid element; the default draws one from the space with a NumPy Generator)
  and `assert_equal(actual, expected)` (default: same structure, library, dtype, shape and exact values).

Class attributes: `capacity` (the ring size the fixed-capacity tests use), `supports_growable`,
`shares_rows_when_pickled` (memory-mapped or shared-memory storages: a pickled copy sees later writes),
`spawn_check` (run the one test that hands the storage to a real `multiprocessing` spawn child, which reads a row
and writes another; set it with `shares_rows_when_pickled` for a storage meant for multiprocessing buffers),
`reopens_from_cache_path` (False where `load(cache_filename, ...)` does not reopen the storage),
`open_segment_rows_readable` (False where an append-built segment is staged until `mark_segment_end`),
`state_machine_examples` / `state_machine_steps` (the size of `test_state_machine` and
`test_state_machine_growable`, which run `unienv_data.testing.state_machine` through these same hooks).

Expected errors: wrong indices raise IndexError / TypeError; wrong values ValueError / TypeError (KeyError for dict
keys); state violations (closed, read-only, no open segment, writer misuse) raise an error that is both a
RuntimeError and a ValueError (`StorageStateError`), never a bare AssertionError, TypeError or AttributeError.
After any refused write, the storage holds exactly what it held before.
"""
from __future__ import annotations

import gc
import multiprocessing
import os
import pickle
import warnings
from concurrent.futures import ProcessPoolExecutor
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np
import pytest

from unienv_data.base.errors import BoundsWarning
from unienv_interface.space import DictSpace

try:  # torch is an optional extra; the suite also serves NumPy-only storages
    import torch
except ImportError:  # pragma: no cover - exercised only without torch
    torch = None  # type: ignore[assignment]

from unienv_data.testing.trees import (  # noqa: F401 (re-exported: the kit's helpers were first defined here)
    assert_tree_equal,
    backend_array,
    copy_tree,
    expect_error,
    INDEX_ERRORS,
    index_positions,
    invalid_leaf_values,
    is_bounded_float_leaf,
    is_float_leaf,
    is_int_leaf,
    is_jax,
    is_torch,
    leaf_bounds,
    leaf_dtype_name,
    leaf_numpy,
    mutate_in_place,
    sample_from_space,
    sample_leaf_numpy,
    space_leaves,
    stack_tree,
    STATE_ERRORS,
    STRUCTURE_ERRORS,
    tree_drop,
    tree_get,
    tree_leaves,
    tree_map,
    tree_replace,
    VALUE_ERRORS,
    zeros_like_tree,
)

def _child_read_and_write(storage: Any, read_index: int, write_index: int, value: Any) -> Any:
    """Runs in a spawned process: reads one row of an unpickled storage and writes another."""
    row = storage.get(read_index)
    storage.set(write_index, value)
    return row


# ---------------------------------------------------------------------------------------------------- the contract
class StorageConformance:
    """The SpaceStorage contract; subclass as `TestX(StorageConformance)` and implement the hooks."""

    capacity: int = 6
    supports_growable: bool = False
    #: values outside a Box's bounds are stored (with a BoundsWarning); False where a layer refuses them by design
    stores_out_of_bounds: bool = True
    shares_rows_when_pickled: bool = False
    spawn_check: bool = False
    seed: int = 1234
    #: False where an open append-built segment is staged (VideoStorage encodes it into a hidden file): its rows
    #: are invisible until mark_segment_end and abort_segment discards them; the state machine then models that
    #: and reads only the other rows meanwhile
    open_segment_rows_readable: bool = True
    #: True (the default): a storage with a `cache_filename` reopens from it with `load(cache_filename, read_only)`
    #: after `close()` alone (no `dumps`), and a fresh `load` of it lists no segment dropped for an overwrite
    #: (`test_close_persists_without_dumps`, `test_dropped_segments_persisted_before_overwrite`); False where the
    #: cache path is not what `load` opens
    reopens_from_cache_path: bool = True
    #: the state machine's size: runs (Hypothesis examples) and steps per run
    state_machine_examples: int = 6
    state_machine_steps: int = 15

    # ------------------------------------------------------------------ hooks
    def make_space(self) -> Any:
        raise NotImplementedError

    def create(self, tmp_path: Any, capacity: Optional[int]) -> Any:
        raise NotImplementedError

    def dump_path(self, tmp_path: Any) -> str:
        return os.path.join(os.fspath(tmp_path), "dump")

    def load(self, path: Any, read_only: bool) -> Any:
        raise NotImplementedError

    def reopen(self, storage: Any, tmp_path: Any, read_only: bool) -> Any:
        path = self.dump_path(tmp_path)
        storage.dumps(path)
        return self.load(path, read_only)

    def sample_value(self, rng: np.random.Generator) -> Any:
        return sample_from_space(self.space, rng)

    def assert_equal(self, actual: Any, expected: Any) -> None:
        assert_tree_equal(actual, expected)

    # ------------------------------------------------------------------ plumbing
    def setup_method(self, method: Any) -> None:
        self._space: Any = None
        self._rng = np.random.default_rng(self.seed)
        self._opened: List[Any] = []
        self._dirs = 0

    def teardown_method(self, method: Any) -> None:
        for st in reversed(self._opened):
            try:
                st.close()
            except Exception:  # noqa: BLE001 - cleanup only
                pass
        self._opened = []

    @property
    def space(self) -> Any:
        if self._space is None:
            self._space = self.make_space()
        return self._space

    def new_dir(self, tmp_path: Any) -> str:
        self._dirs += 1
        d = os.path.join(os.fspath(tmp_path), f"case{self._dirs}")
        os.makedirs(d, exist_ok=True)
        return d

    def new_storage(self, tmp_path: Any, capacity: Any = "default") -> Any:
        cap = self.capacity if capacity == "default" else capacity
        st = self.create(self.new_dir(tmp_path), cap)
        self._opened.append(st)
        return st

    def reopened(self, st: Any, tmp_path: Any, read_only: bool) -> Any:
        out = self.reopen(st, self.new_dir(tmp_path), read_only)
        self._opened.append(out)
        return out

    def values(self, n: int) -> List[Any]:
        return [self.sample_value(self._rng) for _ in range(n)]

    def filled(self, tmp_path: Any, capacity: Any = "default") -> Tuple[Any, List[Any]]:
        """A fixed-capacity storage whose every row holds a distinct known value."""
        st = self.new_storage(tmp_path, capacity)
        vals = self.values(len(st))
        for i, v in enumerate(vals):
            st.set(i, v)
        return st, vals

    def append_segment(self, st: Any, start: int, n: int = 1) -> List[Any]:
        """Records an append-built segment of `n` new values at row `start` of `st`; returns the values."""
        vals = self.values(n)
        st.mark_segment_start(start)
        for v in vals:
            st.append(v)
        st.mark_segment_end()
        return vals

    def filled_writer(self, st: Any, n: int) -> Tuple[Any, List[Any]]:
        """A new segment writer of `st` holding `n` new values (not committed), and the values."""
        w = st.open_segment_writer()
        vals = self.values(n)
        for v in vals:
            w.append(v)
        return w, vals

    def assert_closed_segments(self, st: Any, expected: List[Tuple[int, int]]) -> None:
        """No segment of `st` is open (nothing pending) and its recorded episodes are `expected`."""
        assert not st.has_open_segment
        assert st.pending_segment_length == 0
        assert st.episode_segments() == expected

    def assert_rows(self, st: Any, expected: Sequence[Any]) -> None:
        assert len(st) == len(expected)
        for i, v in enumerate(expected):
            self.assert_equal(st.get(i), v)

    def snapshot(self, st: Any) -> Any:
        return (st.get(Ellipsis) if len(st) else None, st.episode_segments())

    def assert_unchanged(self, st: Any, snap: Any) -> None:
        data, segs = snap
        if data is not None:
            self.assert_equal(st.get(Ellipsis), data)
        else:
            assert len(st) == 0
        assert st.episode_segments() == segs

    def require_growable(self) -> None:
        if not self.supports_growable:
            pytest.skip("this storage has a fixed capacity only")

    # ================================================================== size
    def test_len_and_capacity(self, tmp_path: Any) -> None:
        st = self.new_storage(tmp_path)
        assert st.capacity == self.capacity
        assert len(st) == self.capacity
        assert st.is_mutable
        assert st.episode_segments() == []
        assert not st.has_open_segment
        assert st.pending_segment_length == 0

    def test_fixed_capacity_extend_and_shrink_are_no_ops(self, tmp_path: Any) -> None:
        st, vals = self.filled(tmp_path)
        st.extend_length(3)
        assert len(st) == self.capacity and st.capacity == self.capacity
        st.shrink_length(2)
        assert len(st) == self.capacity
        self.assert_rows(st, vals)

    def test_new_rows_read_as_zero(self, tmp_path: Any) -> None:
        st = self.new_storage(tmp_path)
        zero = zeros_like_tree(self.values(1)[0])
        for i in range(len(st)):
            self.assert_equal(st.get(i), zero)

    # ================================================================== set / get, single index forms
    def _single_index_forms(self) -> List[Tuple[str, Any, int]]:
        c = self.capacity
        forms = [("int", 2, 2), ("negative int", -1, c - 1), ("negative int -capacity", -c, 0),
                 ("numpy int64", np.int64(3), 3), ("numpy uint8", np.uint8(1), 1),
                 ("0-d numpy array", np.array(4), 4)]
        if torch is not None:
            forms.append(("0-d torch tensor", torch.tensor(c - 2), c - 2))
            forms.append(("0-d torch int32 tensor", torch.tensor(0, dtype=torch.int32), 0))
        return forms

    def test_set_get_single_index_forms(self, tmp_path: Any) -> None:
        st, model = self.filled(tmp_path)
        for label, index, pos in self._single_index_forms():
            v = self.values(1)[0]
            st.set(index, v)
            model[pos] = v
            got = st.get(index)
            try:
                self.assert_equal(got, v)
            except AssertionError as exc:
                raise AssertionError(f"get({label}) after set({label}): {exc}") from None
            self.assert_rows(st, model)

    # ================================================================== set / get, batch index forms
    def _batch_index_forms(self) -> List[Tuple[str, Any]]:
        c = self.capacity
        b = self.space.backend
        mask = np.zeros(c, dtype=bool)
        mask[[0, 2, c - 1]] = True
        forms: List[Tuple[str, Any]] = [
            ("slice", slice(1, 4)), ("slice with step", slice(None, None, 2)), ("negative slice start", slice(-3, None)),
            ("Ellipsis", Ellipsis), ("int list", [4, 0, 2]), ("int list with negatives", [-1, -c, 1]),
            ("numpy int array", np.array([c - 1, 3, 1])), ("numpy int32 array", np.array([2, 5 % c], dtype=np.int32)),
            ("backend int array", b.from_numpy(np.array([1, c - 2, 0]))),
            ("numpy bool mask", mask), ("backend bool mask", b.from_numpy(~mask)),
        ]
        if torch is not None and b.simplified_name != "pytorch":
            forms.append(("torch int tensor", torch.tensor([0, c - 1])))
        return forms

    def test_set_get_batch_index_forms(self, tmp_path: Any) -> None:
        st, model = self.filled(tmp_path)
        c = self.capacity
        for label, index in self._batch_index_forms():
            pos = index_positions(index, c)
            new = self.values(len(pos))
            st.set(index, stack_tree(new))
            for p, v in zip(pos, new):
                model[int(p)] = v
            got = st.get(index)
            try:
                self.assert_equal(got, stack_tree([model[int(p)] for p in pos]))
                self.assert_rows(st, model)
            except AssertionError as exc:
                raise AssertionError(f"index form {label}: {exc}") from None

    def test_space_samples_round_trip(self, tmp_path: Any) -> None:
        """Whatever the space itself samples is a valid element: it is stored and read back exactly."""
        st = self.new_storage(tmp_path)
        rng = self.space.backend.random.random_number_generator(self.seed)
        drawn = []
        for i in range(3):
            rng, v = self.space.sample(rng)
            drawn.append(v)
            st.set(i, v)
        for i, v in enumerate(drawn):
            self.assert_equal(st.get(i), v)
        st.set(slice(3, 5), stack_tree(drawn[:2]))
        self.assert_equal(st.get(slice(3, 5)), stack_tree(drawn[:2]))

    def test_get_batch_results_are_batched(self, tmp_path: Any) -> None:
        st, model = self.filled(tmp_path)
        one = st.get([3])
        self.assert_equal(one, stack_tree([model[3]]))
        one_slice = st.get(slice(3, 4))
        self.assert_equal(one_slice, stack_tree([model[3]]))

    def test_get_empty_batches(self, tmp_path: Any) -> None:
        st, model = self.filled(tmp_path)
        ref = stack_tree([model[0]])
        for label, index in (("empty slice", slice(3, 3)), ("empty list", []),
                             ("all-false mask", np.zeros(self.capacity, dtype=bool))):
            got = st.get(index)
            for (path, leaf), (_p, ref_leaf) in zip(tree_leaves(got), tree_leaves(ref)):
                arr, dtype, _lib = leaf_numpy(leaf)
                ref_arr, ref_dtype, _ = leaf_numpy(ref_leaf)
                assert arr.shape == (0,) + ref_arr.shape[1:], f"{label} {path}: shape {arr.shape}"
                assert dtype == ref_dtype, f"{label} {path}: dtype {dtype}"

    def test_set_duplicate_indices_last_wins(self, tmp_path: Any) -> None:
        st, model = self.filled(tmp_path)
        a, b = self.values(2)
        st.set([1, 1], stack_tree([a, b]))
        model[1] = b
        self.assert_rows(st, model)

    # ================================================================== copies
    def test_get_returns_copies(self, tmp_path: Any) -> None:
        st, model = self.filled(tmp_path)
        results = [st.get(0), st.get(slice(0, 3)), st.get([4, 5 % self.capacity]), st.get(Ellipsis)]
        for r in results:
            immutable = all(is_jax(x) for _p, x in tree_leaves(r))
            assert mutate_in_place(r) > 0 or immutable, "get() results should be writable copies"
        self.assert_rows(st, model)

    def test_get_results_do_not_follow_later_writes(self, tmp_path: Any) -> None:
        st, model = self.filled(tmp_path)
        single, batch = st.get(1), st.get(slice(0, 3))
        kept_single, kept_batch = copy_tree(single), copy_tree(batch)
        new = self.values(3)
        st.set(slice(0, 3), stack_tree(new))
        self.assert_equal(single, kept_single)
        self.assert_equal(batch, kept_batch)

    def test_set_copies_the_value(self, tmp_path: Any) -> None:
        st = self.new_storage(tmp_path)
        v = self.values(1)[0]
        kept = copy_tree(v)
        st.set(0, v)
        batch = stack_tree(self.values(2))
        kept_batch = copy_tree(batch)
        st.set(slice(1, 3), batch)
        mutate_in_place(v)
        mutate_in_place(batch)
        self.assert_equal(st.get(0), kept)
        self.assert_equal(st.get(slice(1, 3)), kept_batch)

    # ================================================================== segments built by append
    def test_append_segment(self, tmp_path: Any) -> None:
        st = self.new_storage(tmp_path)
        vals = self.values(3)
        st.mark_segment_start(1)
        assert st.has_open_segment
        for k, v in enumerate(vals):
            st.append(v)
            assert st.pending_segment_length == k + 1
            self.assert_equal(st.get(1 + k), v)
        st.mark_segment_end()
        self.assert_closed_segments(st, [(1, 3)])
        for k, v in enumerate(vals):
            self.assert_equal(st.get(1 + k), v)

    def test_append_segment_wraps_the_ring(self, tmp_path: Any) -> None:
        c = self.capacity
        st = self.new_storage(tmp_path)
        vals = self.values(4)
        st.mark_segment_start(c - 2)
        for v in vals:
            st.append(v)
        st.mark_segment_end()
        segs = st.episode_segments()
        assert segs == [(c - 2, 1)]
        start, end = segs[0]
        assert end < start
        positions = [c - 2, c - 1, 0, 1]
        for p, v in zip(positions, vals):
            self.assert_equal(st.get(p), v)
        self.assert_equal(st.get(np.array(positions)), stack_tree(vals))

    def test_segment_start_is_taken_modulo_capacity(self, tmp_path: Any) -> None:
        c = self.capacity
        st = self.new_storage(tmp_path)
        a, b = self.values(2)
        st.mark_segment_start(-1)
        st.append(a)
        st.mark_segment_end()
        st.mark_segment_start(c + 1)
        st.append(b)
        st.mark_segment_end()
        assert st.episode_segments() == [(1, 1), (c - 1, c - 1)]   # position order
        self.assert_equal(st.get(c - 1), a)
        self.assert_equal(st.get(1), b)

    def test_later_segment_clips_overwritten_older_ones(self, tmp_path: Any) -> None:
        """An older segment keeps its rows that were not overwritten (unienv 0.0.1b16's rule); segments are
        listed in position order."""
        c = self.capacity
        st = self.new_storage(tmp_path)
        for start in (0, 2):
            self.append_segment(st, start, 2)
        assert st.episode_segments() == [(0, 1), (2, 3)]
        self.append_segment(st, 3, 2)
        assert st.episode_segments() == [(0, 1), (2, 2), (3, 4)]
        st.mark_segment_start(c - 1)
        for v in self.values(2):
            st.append(v)
        st.mark_segment_end()
        assert st.episode_segments() == [(1, 1), (2, 2), (3, 4), (c - 1, 0)]

    def test_empty_segment_is_not_recorded(self, tmp_path: Any) -> None:
        st = self.new_storage(tmp_path)
        st.mark_segment_start(2)
        st.mark_segment_end()
        assert st.episode_segments() == []
        assert not st.has_open_segment

    def test_mark_segment_start_twice_raises(self, tmp_path: Any) -> None:
        st = self.new_storage(tmp_path)
        st.mark_segment_start(0)
        st.append(self.values(1)[0])
        expect_error(STATE_ERRORS, st.mark_segment_start, 3)
        assert st.has_open_segment and st.pending_segment_length == 1
        st.mark_segment_end()
        assert st.episode_segments() == [(0, 0)]

    def test_mark_segment_end_without_open_segment_is_a_no_op(self, tmp_path: Any) -> None:
        st = self.new_storage(tmp_path)
        st.mark_segment_end()
        st.abort_segment()
        assert st.episode_segments() == [] and not st.has_open_segment

    def test_append_without_open_segment_raises(self, tmp_path: Any) -> None:
        st, _vals = self.filled(tmp_path)
        snap = self.snapshot(st)
        v = self.values(1)[0]
        exc = expect_error((RuntimeError,), st.append, v)
        assert isinstance(exc, ValueError), f"{type(exc).__name__} should also be a ValueError (StorageStateError)"
        self.assert_unchanged(st, snap)
        st.mark_segment_start(0)
        st.append(v)
        st.mark_segment_end()
        expect_error((RuntimeError,), st.append, v)

    def test_segment_longer_than_capacity_raises(self, tmp_path: Any) -> None:
        c = self.capacity
        st = self.new_storage(tmp_path)
        vals = self.values(c + 1)
        st.mark_segment_start(2)
        for v in vals[:c]:
            st.append(v)
        assert st.pending_segment_length == c
        expect_error((ValueError,), st.append, vals[c])
        assert st.pending_segment_length == c
        for k in range(c):
            self.assert_equal(st.get((2 + k) % c), vals[k])
        st.mark_segment_end()
        assert st.episode_segments() == [(2, 1)]

    def test_abort_segment(self, tmp_path: Any) -> None:
        st = self.new_storage(tmp_path)
        self.append_segment(st, 0, 2)
        st.mark_segment_start(3)
        st.append(self.values(1)[0])
        st.abort_segment()
        self.assert_closed_segments(st, [(0, 1)])
        expect_error(STATE_ERRORS, st.append, self.values(1)[0])
        self.append_segment(st, 4)
        assert st.episode_segments() == [(0, 1), (4, 4)]

    # ================================================================== segment writers
    def test_writers_commit_in_any_order_including_wraps(self, tmp_path: Any) -> None:
        c = self.capacity
        assert c >= 6, "this test lays out three segments in a ring of at least 6 rows"
        st, model = self.filled(tmp_path)
        writers = [st.open_segment_writer() for _ in range(3)]
        plans = [(writers[0], 1, 2), (writers[1], 3, 2), (writers[2], c - 1, 2)]  # the last wraps: rows c-1, 0
        contents = {}
        for w, _start, n in plans:
            vals = self.values(n)
            for v in vals:
                w.append(v)
            contents[id(w)] = vals
            assert len(w) == n and w.length == n
        self.assert_rows(st, model)  # nothing is written before commit
        for w, start, n in (plans[2], plans[0], plans[1]):
            w.commit(start)
            for k, v in enumerate(contents[id(w)]):
                model[(start + k) % c] = v
        self.assert_rows(st, model)
        assert st.episode_segments() == [(1, 2), (3, 4), (c - 1, 0)]   # position order

    def test_writer_commit_overlapping_clips_older_segment(self, tmp_path: Any) -> None:
        st = self.new_storage(tmp_path)
        w1, w2 = st.open_segment_writer(), st.open_segment_writer()
        a = self.values(3)
        b = self.values(2)
        for v in a:
            w1.append(v)
        for v in b:
            w2.append(v)
        w1.commit(0)
        assert st.episode_segments() == [(0, 2)]
        w2.commit(2)
        assert st.episode_segments() == [(0, 1), (2, 3)]
        self.assert_equal(st.get(0), a[0])
        self.assert_equal(st.get(1), a[1])
        self.assert_equal(st.get(2), b[0])
        self.assert_equal(st.get(3), b[1])

    def test_writer_finish_then_commit(self, tmp_path: Any) -> None:
        st = self.new_storage(tmp_path)
        w, vals = self.filled_writer(st, 2)
        assert not w.is_finished
        w.finish()
        w.finish()
        assert w.is_finished
        expect_error(STATE_ERRORS, w.append, self.values(1)[0])
        assert len(w) == 2
        w.commit(4)
        assert st.episode_segments() == [(4, 5 % self.capacity)]
        self.assert_equal(st.get(4), vals[0])
        self.assert_equal(st.get(5 % self.capacity), vals[1])

    def test_writer_commit_twice_raises_and_changes_nothing(self, tmp_path: Any) -> None:
        st, _ = self.filled(tmp_path)
        w, _ = self.filled_writer(st, 2)
        w.commit(0)
        snap = self.snapshot(st)
        expect_error(STATE_ERRORS, w.commit, 3)
        self.assert_unchanged(st, snap)
        expect_error(STATE_ERRORS, w.append, self.values(1)[0])
        expect_error(STATE_ERRORS, w.abort)
        self.assert_unchanged(st, snap)

    def test_writer_commit_after_abort_raises_and_changes_nothing(self, tmp_path: Any) -> None:
        st, _ = self.filled(tmp_path)
        snap = self.snapshot(st)
        w, _ = self.filled_writer(st, 2)
        w.abort()
        assert w.is_finished
        expect_error(STATE_ERRORS, w.commit, 0)
        expect_error(STATE_ERRORS, w.append, self.values(1)[0])
        self.assert_unchanged(st, snap)

    def test_writer_longer_than_capacity_raises_and_changes_nothing(self, tmp_path: Any) -> None:
        st, _ = self.filled(tmp_path)
        self.append_segment(st, 0)
        snap = self.snapshot(st)
        w, _ = self.filled_writer(st, self.capacity + 1)
        expect_error((ValueError,), w.commit, 1)
        self.assert_unchanged(st, snap)

    def test_empty_writer_commit_records_nothing(self, tmp_path: Any) -> None:
        st, _ = self.filled(tmp_path)
        snap = self.snapshot(st)
        w = st.open_segment_writer()
        w.commit(2)
        self.assert_unchanged(st, snap)

    def test_writer_keeps_a_snapshot_of_appended_values(self, tmp_path: Any) -> None:
        st = self.new_storage(tmp_path)
        w = st.open_segment_writer()
        v = self.values(1)[0]
        kept = copy_tree(v)
        w.append(v)
        mutate_in_place(v)
        w.commit(0)
        self.assert_equal(st.get(0), kept)

    def test_writer_and_append_segments_coexist(self, tmp_path: Any) -> None:
        st = self.new_storage(tmp_path)
        w, wv = self.filled_writer(st, 2)
        av = self.values(2)
        st.mark_segment_start(0)
        for v in av:
            st.append(v)
        st.mark_segment_end()
        w.commit(3)
        assert st.episode_segments() == [(0, 1), (3, 4)]
        self.assert_equal(st.get(slice(0, 2)), stack_tree(av))
        self.assert_equal(st.get(slice(3, 5)), stack_tree(wv))

    # ================================================================== clear
    def test_clear_resets(self, tmp_path: Any) -> None:
        st, vals = self.filled(tmp_path)
        zero = zeros_like_tree(vals[0])
        nonzero_rows = 0
        for v in vals:
            try:
                self.assert_equal(v, zero)
            except AssertionError:
                nonzero_rows += 1
        assert nonzero_rows > 0, "the test needs rows that differ from zero"
        self.append_segment(st, 0)
        st.mark_segment_start(2)
        st.append(self.values(1)[0])
        st.clear()
        self.assert_closed_segments(st, [])
        assert len(st) == self.capacity
        for i in range(len(st)):
            self.assert_equal(st.get(i), zero)
        v = self.values(1)[0]
        st.mark_segment_start(1)
        st.append(v)
        st.mark_segment_end()
        assert st.episode_segments() == [(1, 1)]
        self.assert_equal(st.get(1), v)

    # ================================================================== persistence
    def _storage_with_segments(self, tmp_path: Any) -> Tuple[Any, List[Any]]:
        c = self.capacity
        st, model = self.filled(tmp_path)
        self.append_segment(st, 1, 2)
        w, wrap = self.filled_writer(st, 2)
        w.commit(c - 1)
        model = [st.get(i) for i in range(c)]
        assert st.episode_segments() == [(1, 2), (c - 1, 0)]
        return st, model

    def test_dumps_and_load_round_trip(self, tmp_path: Any) -> None:
        st, model = self._storage_with_segments(tmp_path)
        segs = st.episode_segments()
        back = self.reopened(st, tmp_path, read_only=False)
        assert back.capacity == self.capacity
        assert len(back) == self.capacity
        assert back.episode_segments() == segs
        self.assert_rows(back, model)
        self.assert_equal(back.get(Ellipsis), stack_tree(model))
        v = self.values(1)[0]
        back.set(0, v)
        self.assert_equal(back.get(0), v)
        self.assert_rows(st, model)  # the original is independent of the reloaded copy

    def test_load_read_only_round_trip(self, tmp_path: Any) -> None:
        st, model = self._storage_with_segments(tmp_path)
        back = self.reopened(st, tmp_path, read_only=True)
        assert not back.is_mutable
        assert back.episode_segments() == st.episode_segments()
        self.assert_rows(back, model)

    def test_dumps_twice_to_the_same_path(self, tmp_path: Any) -> None:
        st, _ = self._storage_with_segments(tmp_path)
        d = self.new_dir(tmp_path)
        path = self.dump_path(d)
        st.dumps(path)
        v = self.values(1)[0]
        st.set(3, v)
        st.dumps(path)
        back = self.load(path, True)
        self._opened.append(back)
        self.assert_equal(back.get(3), v)
        self.assert_rows(back, [st.get(i) for i in range(self.capacity)])

    def test_dumps_into_own_cache_path(self, tmp_path: Any) -> None:
        st, model = self._storage_with_segments(tmp_path)
        own = st.cache_filename
        if own is None:
            pytest.skip("in-memory storage: no cache path of its own")
        st.dumps(own)
        back = self.load(own, True)
        self._opened.append(back)
        assert back.episode_segments() == st.episode_segments()
        self.assert_rows(back, model)

    def _own_cache_path(self, st: Any) -> Any:
        own = st.cache_filename
        if own is None or not self.reopens_from_cache_path:
            pytest.skip("no cache path of its own to reopen (in memory, or reopens_from_cache_path = False)")
        return own

    def test_close_persists_without_dumps(self, tmp_path: Any) -> None:
        """`close()` commits: a file-backed storage written, then closed without `dumps`, reopens from its cache
        path with its rows, length and segments (ring, and growable after `extend_length` + `set`)."""
        caps: List[Optional[int]] = [self.capacity] + ([None] if self.supports_growable else [])
        for cap in caps:
            st = self.new_storage(tmp_path, cap)
            own = self._own_cache_path(st)
            if cap is None:
                st.extend_length(3)
            vals = self.values(3)
            st.set(1, vals[1])
            st.mark_segment_start(2)
            st.append(vals[2])
            st.mark_segment_end()
            st.set(0, vals[0])
            model, n, segs = [st.get(i) for i in range(len(st))], len(st), st.episode_segments()
            st.close()
            back = self.load(own, True)
            self._opened.append(back)
            hint = (f"{type(st).__name__} (capacity={cap}) closed without dumps() and reopened from its cache path "
                    f"{own!r}: {{}}. close() commits: implement the `flush()` hook (SpaceStorage.close() calls it "
                    "on a writable storage) to write the length, segment list and rows to the cache path, or "
                    "override close() to do so")
            assert len(back) == n, hint.format(f"length {len(back)}, expected {n}")
            assert back.episode_segments() == segs, hint.format(
                f"segments {back.episode_segments()}, expected {segs}")
            for i, v in enumerate(model):
                try:
                    self.assert_equal(back.get(i), v)
                except AssertionError as exc:
                    raise AssertionError(hint.format(f"row {i} differs: {exc}")) from None

    def _storage_persisting_segments(self, tmp_path: Any) -> Tuple[Any, Any]:
        """A new storage with its own cache path, for the tests of what its files list after a row is overwritten
        (skipped for staged open segments and storages that keep no segment list in their files)."""
        if not self.open_segment_rows_readable:
            pytest.skip("the open segment is staged: recorded rows are overwritten only at mark_segment_end")
        st = self.new_storage(tmp_path)
        own = self._own_cache_path(st)
        if not st.has_persistent_segments():
            pytest.skip("the storage does not persist its own segment list")
        return st, own

    def _assert_row0_in_no_listed_segment(self, st: Any, own: Any, after: str, fix: str) -> None:
        """A fresh `load` of `own` (no close, as after a crash) lists no segment holding row 0, which an append
        just overwrote; then the open segment is aborted."""
        fresh = self.load(own, True)
        self._opened.append(fresh)
        listed = fresh.episode_segments()
        stale = [r for r in listed if r[0] <= 0 <= r[1] or (r[1] < r[0])]
        assert not stale, (
            f"{type(st).__name__}: after {after}, a fresh load of {own!r} still lists {stale} (all listed: "
            f"{listed}); a crash now would leave a segment whose rows hold other data. {fix}")
        st.abort_segment()

    def test_dropped_segments_persisted_before_overwrite(self, tmp_path: Any) -> None:
        """A segment dropped because a new segment starts overwriting its rows is gone from the files *before*
        those rows are written (`on_segments_dropped` hook): a fresh `load` of the cache path (no close, as after a
        crash) never lists it."""
        st, own = self._storage_persisting_segments(tmp_path)
        c = self.capacity
        self.append_segment(st, 0, 3)
        self.append_segment(st, 3, c - 3)
        st.mark_segment_start(0)
        st.append(self.values(1)[0])        # cuts row 0 out of the segment (0, 2): that segment is dropped
        self._assert_row0_in_no_listed_segment(
            st, own, "an append overwrote row 0", "Persist the shorter segment list in the `on_segments_dropped()` "
            "hook (SpaceStorage calls it after dropping segments and before writing their rows)")

    def test_cleared_segments_persisted_before_overwrite(self, tmp_path: Any) -> None:
        """`clear()` forgets every segment in the files too, before a later append overwrites their rows: a fresh
        `load` of the cache path (no close, as after a crash) after `clear()` and one append lists no segment
        holding the new row."""
        st, own = self._storage_persisting_segments(tmp_path)
        self.append_segment(st, 0, 3)
        st.clear()
        st.mark_segment_start(0)
        st.append(self.values(1)[0])        # overwrites row 0 of the cleared segment (0, 2)
        self._assert_row0_in_no_listed_segment(
            st, own, "clear() and an append over row 0", "`SpaceStorage.clear()` calls the `on_segments_dropped()` "
            "hook: persist the segment list there")

    def test_read_only_refuses_writes(self, tmp_path: Any) -> None:
        st, model = self._storage_with_segments(tmp_path)
        path = self.dump_path(self.new_dir(tmp_path))
        st.dumps(path)
        ro = self.load(path, True)
        self._opened.append(ro)
        snap = self.snapshot(ro)
        v = self.values(1)[0]
        expect_error(STATE_ERRORS, ro.set, 0, v)
        expect_error(STATE_ERRORS, ro.set, slice(0, 2), stack_tree(self.values(2)))
        expect_error(STATE_ERRORS, ro.mark_segment_start, 0)
        expect_error(STATE_ERRORS, ro.append, v)
        expect_error(STATE_ERRORS, ro.open_segment_writer)
        expect_error(STATE_ERRORS, ro.clear)
        self.assert_unchanged(ro, snap)
        self.assert_rows(ro, model)
        assert not ro.has_open_segment
        ro.close()
        again = self.load(path, True)  # and nothing reached the files
        self._opened.append(again)
        self.assert_rows(again, model)
        assert again.episode_segments() == st.episode_segments()

    def test_read_only_refuses_set_flattened(self, tmp_path: Any) -> None:
        st, model = self._storage_with_segments(tmp_path)
        ro = self.reopened(st, tmp_path, read_only=True)
        if not hasattr(ro, "set_flattened"):
            pytest.skip("no flattened accessors")
        snap = self.snapshot(ro)
        flat = ro.get_flattened(1)
        expect_error(STATE_ERRORS, ro.set_flattened, 0, flat)
        self.assert_unchanged(ro, snap)

    # ================================================================== close
    def test_use_after_close_raises_clear_error(self, tmp_path: Any) -> None:
        st, _ = self.filled(tmp_path)
        w = st.open_segment_writer()
        w.append(self.values(1)[0])
        v = self.values(1)[0]
        st.close()
        st.close()  # idempotent
        checks = [("get", lambda: st.get(0)), ("get batch", lambda: st.get(slice(0, 2))),
                  ("set", lambda: st.set(0, v)), ("mark_segment_start", lambda: st.mark_segment_start(0)),
                  ("append", lambda: st.append(v)), ("episode_segments", lambda: st.episode_segments()),
                  ("open_segment_writer", lambda: st.open_segment_writer()), ("writer commit", lambda: w.commit(0)),
                  ("dumps", lambda: st.dumps(self.dump_path(self.new_dir(tmp_path)))), ("clear", lambda: st.clear())]
        for label, fn in checks:
            try:
                fn()
            except (TypeError, AttributeError, AssertionError) as exc:
                pytest.fail(f"{label} after close raised an unclear {type(exc).__name__}: {exc}")
            except STATE_ERRORS as exc:
                assert "close" in str(exc).lower(), f"{label} after close: message should say it is closed: {exc}"
            else:
                pytest.fail(f"{label} after close did not raise")

    def test_context_manager_closes(self, tmp_path: Any) -> None:
        st = self.new_storage(tmp_path)
        with st as same:
            assert same is st
            same.set(0, self.values(1)[0])
        expect_error(STATE_ERRORS, st.get, 0)

    # ================================================================== bad indices
    def _bad_indices(self) -> List[Tuple[str, Any, int]]:
        """`(label, index, how many values a lenient reading would take)`; 0 means one single value."""
        c = self.capacity
        out: List[Tuple[str, Any, int]] = [
            ("bool True", True, 0), ("bool False", False, 0), ("numpy bool", np.bool_(True), 0),
            ("float", 1.0, 0), ("numpy float", np.float64(2.0), 0), ("None", None, 0), ("str", "1", 0),
            ("too large", c, 0), ("too small", -c - 1, 0), ("numpy int too large", np.int64(c + 3), 0),
            ("partly out of range array", np.array([0, c]), 2), ("partly out of range list", [1, -c - 1], 2),
            ("2-D array", np.array([[0, 1]]), 2), ("float array", np.array([0.0, 1.0]), 2),
            ("short mask", np.ones(c - 1, dtype=bool), c - 1), ("long mask", np.ones(c + 1, dtype=bool), c + 1),
            ("mixed bool/int list", [True, 2], 2),
        ]
        if torch is not None:
            out.append(("0-d torch bool", torch.tensor(True), 0))
            out.append(("0-d torch float", torch.tensor(1.0), 0))
            out.append(("torch index out of range", torch.tensor([0, c]), 2))
        return out

    def test_bad_indices_rejected_by_get(self, tmp_path: Any) -> None:
        st, _ = self.filled(tmp_path)
        for label, index, _n in self._bad_indices():
            try:
                expect_error(INDEX_ERRORS, st.get, index)
            except pytest.fail.Exception as exc:
                raise AssertionError(f"get({label}): {exc}") from None

    def test_bad_indices_rejected_by_set_and_nothing_written(self, tmp_path: Any) -> None:
        st, _ = self.filled(tmp_path)
        snap = self.snapshot(st)
        for label, index, n in self._bad_indices():
            value = self.values(1)[0] if n == 0 else stack_tree(self.values(n))
            try:
                expect_error(INDEX_ERRORS, st.set, index, value)
            except pytest.fail.Exception as exc:
                raise AssertionError(f"set({label}): {exc}") from None
            self.assert_unchanged(st, snap)

    def test_bad_segment_starts_rejected(self, tmp_path: Any) -> None:
        st = self.new_storage(tmp_path)
        for bad in (True, 1.5, None, "0"):
            expect_error(INDEX_ERRORS, st.mark_segment_start, bad)
            assert not st.has_open_segment
        w = st.open_segment_writer()
        w.append(self.values(1)[0])
        expect_error(INDEX_ERRORS, w.commit, 1.0)
        assert st.episode_segments() == []

    # ================================================================== bad values
    def _invalid_values(self, valid: Any) -> List[Tuple[str, str, Any]]:
        """`(category, description, bad element)` built from a valid element by breaking one leaf."""
        out = []
        for path, leaf_space in space_leaves(self.space):
            leaf = tree_get(valid, path)
            where = "/".join(map(str, path)) or "<value>"
            for category, bad in invalid_leaf_values(leaf_space, leaf):
                out.append((category, f"{category} at {where}", tree_replace(valid, path, bad)))
        return out

    def _check_rejected(self, tmp_path: Any, category: str) -> None:
        st, _ = self.filled(tmp_path)
        valid = self.values(1)[0]
        cases = [(d, bad) for cat, d, bad in self._invalid_values(valid) if cat == category]
        if not cases:
            pytest.skip(f"the space has no leaf where '{category}' applies")
        snap = self.snapshot(st)
        for desc, bad in cases:
            try:
                expect_error(VALUE_ERRORS, st.set, 0, bad)
                self.assert_unchanged(st, snap)
                # a batch in which only the second element is bad writes nothing at all
                batch = self._batch_with_bad_second(valid, bad)
                if batch is not None:
                    expect_error(VALUE_ERRORS, st.set, slice(0, 2), batch)
                    self.assert_unchanged(st, snap)
                st.mark_segment_start(0)
                expect_error(VALUE_ERRORS, st.append, bad)
                assert st.pending_segment_length == 0
                st.abort_segment()
                self.assert_unchanged(st, snap)
                w = st.open_segment_writer()
                expect_error(VALUE_ERRORS, w.append, bad)
                assert len(w) == 0
                w.abort()
                self.assert_unchanged(st, snap)
            except (AssertionError, pytest.fail.Exception) as exc:
                raise AssertionError(f"{desc}: {exc}") from None

    def _batch_with_bad_second(self, valid: Any, bad: Any) -> Any:
        """`stack([valid, bad])` where only leaves of equal dtype and shape differ, else None."""
        pairs = list(zip(tree_leaves(valid), tree_leaves(bad)))
        for (_p1, a), (_p2, b) in pairs:
            if isinstance(b, str):
                return None
            na, da, la = leaf_numpy(a)
            nb, db, lb = leaf_numpy(b)
            if da != db or na.shape != nb.shape or la != lb:
                return None
        return stack_tree([valid, bad])

    def test_rejects_wrong_shape_with_same_element_count(self, tmp_path: Any) -> None:
        self._check_rejected(tmp_path, "wrong shape, same element count")

    def test_rejects_non_array_leaf(self, tmp_path: Any) -> None:
        self._check_rejected(tmp_path, "not an array")

    def test_rejects_fraction_into_int_leaf(self, tmp_path: Any) -> None:
        self._check_rejected(tmp_path, "fraction into int leaf")

    def test_rejects_value_outside_int_dtype_range(self, tmp_path: Any) -> None:
        self._check_rejected(tmp_path, "out of the int dtype's range")

    def test_rejects_out_of_bounds_when_bounds_warnings_are_errors(self, tmp_path: Any) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("error", BoundsWarning)
            self._check_rejected(tmp_path, "out of bounds")

    def test_rejects_nan_in_bounded_float_leaf_when_bounds_warnings_are_errors(self, tmp_path: Any) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("error", BoundsWarning)
            self._check_rejected(tmp_path, "NaN into bounded float leaf")

    @pytest.mark.parametrize("category", ["out of bounds", "NaN into bounded float leaf"])
    def test_stores_out_of_bounds_with_one_bounds_warning(self, tmp_path: Any, category: str) -> None:
        """The default policy: a value outside the declared bounds is stored as given, with a BoundsWarning
        naming the key, once per key and storage."""
        st, _ = self.filled(tmp_path)
        valid = self.values(1)[0]
        cases = [(d, bad) for cat, d, bad in self._invalid_values(valid) if cat == category]
        if not cases:
            pytest.skip(f"the space has no leaf where '{category}' applies")
        if not self.stores_out_of_bounds:
            for desc, bad in cases:
                expect_error(VALUE_ERRORS, st.set, 0, bad)
            return
        for i, (desc, bad) in enumerate(cases):
            with warnings.catch_warnings(record=True) as first:
                warnings.simplefilter("always")
                st.set(0, bad)
            with warnings.catch_warnings(record=True) as again:
                warnings.simplefilter("always")
                st.set(1, bad)
            n1 = sum(issubclass(w.category, BoundsWarning) for w in first)
            n2 = sum(issubclass(w.category, BoundsWarning) for w in again)
            # one per storage that checks the key (a FlattenedStorage and the storage under it: up to two)
            assert i > 0 or n1 >= 1, f"{desc}: no BoundsWarning"
            assert n2 == 0, f"{desc}: the same key warned again"
            self.assert_equal(st.get(0), bad)
            self.assert_equal(st.get(1), bad)

    def test_rejects_int_not_representable_in_float_leaf(self, tmp_path: Any) -> None:
        self._check_rejected(tmp_path, "int not representable in the float leaf")

    def test_rejects_non_boolean_into_binary_leaf(self, tmp_path: Any) -> None:
        self._check_rejected(tmp_path, "non-boolean into binary leaf")
        self._check_rejected(tmp_path, "fraction into binary leaf")

    def test_nan_in_unbounded_float_leaf_round_trips(self, tmp_path: Any) -> None:
        paths = [(p, s) for p, s in space_leaves(self.space) if is_float_leaf(s) and not is_bounded_float_leaf(s)]
        if not paths:
            pytest.skip("the space has no unbounded float leaf")
        st = self.new_storage(tmp_path)
        v = self.values(1)[0]
        for path, s in paths:
            arr = leaf_numpy(tree_get(v, path))[0].astype(np.float64)
            arr.reshape(-1)[:1] = np.nan
            v = tree_replace(v, path, backend_array(s, arr))
        st.set(2, v)
        self.assert_equal(st.get(2), v)

    def test_rejects_batch_of_wrong_length(self, tmp_path: Any) -> None:
        st, _ = self.filled(tmp_path)
        snap = self.snapshot(st)
        expect_error(VALUE_ERRORS, st.set, slice(0, 3), stack_tree(self.values(2)))
        expect_error(VALUE_ERRORS, st.set, [0, 1], stack_tree(self.values(3)))
        expect_error(VALUE_ERRORS, st.set, 0, stack_tree(self.values(1)))
        expect_error(VALUE_ERRORS, st.set, slice(0, 1), self.values(1)[0])
        self.assert_unchanged(st, snap)

    def test_rejects_wrong_dict_keys(self, tmp_path: Any) -> None:
        if not isinstance(self.space, DictSpace):
            pytest.skip("not a dict space")
        st, _ = self.filled(tmp_path)
        snap = self.snapshot(st)
        valid = self.values(1)[0]
        first_path = next(space_leaves(self.space))[0]
        missing = tree_drop(valid, first_path)
        extra = dict(valid)
        extra["unexpected_key"] = tree_get(valid, first_path)
        for label, bad in (("missing key", missing), ("extra key", extra), ("a list instead of a dict", [valid])):
            try:
                expect_error(STRUCTURE_ERRORS, st.set, 0, bad)
                st.mark_segment_start(0)
                expect_error(STRUCTURE_ERRORS, st.append, bad)
                st.abort_segment()
            except pytest.fail.Exception as exc:
                raise AssertionError(f"{label}: {exc}") from None
            self.assert_unchanged(st, snap)

    # ================================================================== growable storages
    def test_growable_starts_empty_and_append_grows(self, tmp_path: Any) -> None:
        self.require_growable()
        st = self.new_storage(tmp_path, None)
        assert st.capacity is None
        assert len(st) == 0
        vals = self.values(5)
        st.mark_segment_start(0)
        for k, v in enumerate(vals[:3]):
            st.append(v)
            assert len(st) == k + 1
        st.mark_segment_end()
        st.mark_segment_start(3)
        for v in vals[3:]:
            st.append(v)
        st.mark_segment_end()
        assert len(st) == 5
        assert st.episode_segments() == [(0, 2), (3, 4)]
        self.assert_rows(st, vals)
        expect_error(INDEX_ERRORS, st.get, 5)

    def test_growable_extend_and_shrink_length(self, tmp_path: Any) -> None:
        self.require_growable()
        st = self.new_storage(tmp_path, None)
        st.extend_length(4)
        assert len(st) == 4
        vals = self.values(4)
        st.set(slice(0, 4), stack_tree(vals))
        self.assert_rows(st, vals)
        st.shrink_length(1)
        assert len(st) == 3
        expect_error(INDEX_ERRORS, st.get, 3)
        expect_error(INDEX_ERRORS, st.set, 3, vals[0])
        st.extend_length(2)
        assert len(st) == 5
        zero = zeros_like_tree(vals[0])
        self.assert_rows(st, vals[:3] + [zero, zero])
        expect_error(VALUE_ERRORS, st.shrink_length, 6)
        expect_error(VALUE_ERRORS, st.extend_length, -1)
        assert len(st) == 5

    def test_growable_segments_after_shrink(self, tmp_path: Any) -> None:
        self.require_growable()
        st = self.new_storage(tmp_path, None)
        vals = self.values(5)
        st.mark_segment_start(0)
        for v in vals[:2]:
            st.append(v)
        st.mark_segment_end()
        st.mark_segment_start(2)
        for v in vals[2:]:
            st.append(v)
        st.mark_segment_end()
        assert st.episode_segments() == [(0, 1), (2, 4)]
        st.shrink_length(2)
        assert len(st) == 3
        assert st.episode_segments() == [(0, 1)]
        expect_error(INDEX_ERRORS, st.mark_segment_start, 4)
        assert not st.has_open_segment
        new = self.values(2)
        st.mark_segment_start(len(st))
        for v in new:
            st.append(v)
        st.mark_segment_end()
        assert len(st) == 5
        assert st.episode_segments() == [(0, 1), (3, 4)]
        self.assert_rows(st, vals[:3] + new)

    def test_growable_writer_commit_grows(self, tmp_path: Any) -> None:
        self.require_growable()
        st = self.new_storage(tmp_path, None)
        w1, w2 = st.open_segment_writer(), st.open_segment_writer()
        a, b = self.values(3), self.values(2)
        for v in a:
            w1.append(v)
        for v in b:
            w2.append(v)
        w2.commit(0)
        assert len(st) == 2
        w1.commit(len(st))
        assert len(st) == 5
        assert st.episode_segments() == [(0, 1), (2, 4)]
        self.assert_rows(st, b + a)

    def test_growable_clear_empties(self, tmp_path: Any) -> None:
        self.require_growable()
        st = self.new_storage(tmp_path, None)
        self.append_segment(st, 0, 3)
        st.clear()
        assert len(st) == 0
        assert st.episode_segments() == []
        v = self.values(1)[0]
        st.mark_segment_start(0)
        st.append(v)
        st.mark_segment_end()
        assert len(st) == 1
        self.assert_equal(st.get(0), v)

    def test_growable_dumps_round_trip(self, tmp_path: Any) -> None:
        self.require_growable()
        st = self.new_storage(tmp_path, None)
        vals = self.values(3)
        st.mark_segment_start(0)
        for v in vals:
            st.append(v)
        st.mark_segment_end()
        back = self.reopened(st, tmp_path, read_only=False)
        assert back.capacity is None
        assert len(back) == 3
        assert back.episode_segments() == [(0, 2)]
        self.assert_rows(back, vals)
        more = self.values(2)
        back.mark_segment_start(3)
        for v in more:
            back.append(v)
        back.mark_segment_end()
        self.assert_rows(back, vals + more)
        assert back.episode_segments() == [(0, 2), (3, 4)]

    # ================================================================== the state machine
    def test_state_machine(self) -> None:
        """Random sequences of every operation against a plain-Python model (`unienv_data.testing.state_machine`),
        on a ring of `capacity` rows."""
        from unienv_data.testing.state_machine import run_storage_state_machine
        run_storage_state_machine(type(self), self.capacity, self.state_machine_examples, self.state_machine_steps)

    def test_state_machine_growable(self) -> None:
        """The state machine on a growable storage (`capacity=None`)."""
        self.require_growable()
        from unienv_data.testing.state_machine import run_storage_state_machine
        run_storage_state_machine(type(self), None, self.state_machine_examples, self.state_machine_steps)

    # ================================================================== pickling
    def test_pickle_round_trip(self, tmp_path: Any) -> None:
        st, model = self._storage_with_segments(tmp_path)
        clone = pickle.loads(pickle.dumps(st))
        self._opened.append(clone)
        assert clone.capacity == st.capacity
        assert clone.episode_segments() == st.episode_segments()
        self.assert_rows(clone, model)

    def test_pickled_copy_shares_rows(self, tmp_path: Any) -> None:
        if not self.shares_rows_when_pickled:
            pytest.skip("in-process memory: a pickled copy is independent")
        st, model = self.filled(tmp_path)
        assert st.is_multiprocessing_safe, (
            f"{type(st).__name__}: shares_rows_when_pickled is True but is_multiprocessing_safe is False; a storage "
            "whose pickled copies (other processes) read and write the same rows overrides the "
            "`is_multiprocessing_safe` property to return True (ReplayBuffer(multiprocessing=True) requires it)")
        clone = pickle.loads(pickle.dumps(st))
        self.assert_rows(clone, model)
        a, b = self.values(2)
        st.set(1, a)
        self.assert_equal(clone.get(1), a)
        clone.set(2, b)
        self.assert_equal(st.get(2), b)
        clone.close()  # a worker closing its copy must not take the rows away from the original
        del clone
        gc.collect()
        model[1], model[2] = a, b
        self.assert_rows(st, model)

    def test_spawned_child_sees_the_same_rows(self, tmp_path: Any) -> None:
        if not self.spawn_check:
            pytest.skip("the spawn check runs on selected storages only (it costs a process start)")
        st, model = self.filled(tmp_path)
        new = self.values(1)[0]
        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=1, mp_context=ctx) as pool:
            row = pool.submit(_child_read_and_write, st, 3, 4, new).result(timeout=120)
        self.assert_equal(row, model[3])
        self.assert_equal(st.get(4), new)
        model[4] = new
        self.assert_rows(st, model)
