"""Hypothesis state machines for `ReplayBuffer` over a memory-mapped `FlattenedStorage(PytorchTensorStorage)`.

The model is plain Python, in logical terms only (index 0 = oldest sample):

* `rows`: the ids of the stored samples, oldest first. Adding `k` samples appends them; a ring of capacity `C`
  then drops the oldest `len(rows) - C` ids from the front (those physical rows were overwritten).
* `segments`: recorded episodes as logical half-open `(start, end)` ranges. When `d` ids are dropped from the
  front every range shifts by `-d`, and a range that would start below 0 lost rows and is clipped to the rows
  left (gone when none is left), as in unienv 0.0.1b16. With `maintain_segment_metadata=True` (the maintained
  machine) every `extend` batch is a segment too.
* an open append-built episode (`open_start`, `open_len`): its rows count in `len()` at once (single process),
  it is recorded by `mark_segment_end()`; while it is open `extend` and `commit_segment` raise an error that says
  to call `mark_segment_end`. An episode longer than the ring keeps its newest `capacity` rows (the maintained
  machine appends past the capacity; the other ends its episode there, since the storage's own log then records
  the ring-long part and the rest as two segments, as the reference's storages do).
* segment writers: a list of ids each; `commit_segment` places the episode at the tail at commit time.

Every sample is `{"id": int32, "v": float32[2]}` with `v` a function of `id`, so the whole buffer is checked
against `rows` after each step. The fixed machine uses a ring of 9 rows; the growable one `capacity=None`.
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

from unienv_data.replay_buffer import ReplayBuffer  # noqa: E402
from unienv_data.storages.flattened import FlattenedStorage  # noqa: E402
from unienv_data.storages.pytorch import PytorchTensorStorage  # noqa: E402
from unienv_interface.backends.pytorch import PyTorchComputeBackend as TB  # noqa: E402
from unienv_interface.space import BoxSpace, DictSpace  # noqa: E402

CAPACITY = 9
MAX_WRITERS = 3

SPACE = DictSpace(TB, {
    "id": BoxSpace(TB, -(1 << 20), 1 << 20, torch.int32, shape=()),
    "v": BoxSpace(TB, -100.0, 100.0, torch.float32, shape=(2,)),
})


def row_v(i: int) -> np.ndarray:
    return np.array([(i % 97) * 0.5, -float(i % 89)], dtype=np.float32)


def single(i: int) -> dict:
    return {"id": torch.tensor(i, dtype=torch.int32), "v": torch.from_numpy(row_v(i))}


def batch(ids: List[int]) -> dict:
    return {"id": torch.tensor(ids, dtype=torch.int32),
            "v": torch.from_numpy(np.stack([row_v(i) for i in ids]).astype(np.float32))}


def read_ids(data: dict) -> List[int]:
    ids = data["id"].numpy()
    v = data["v"].numpy()
    if ids.ndim == 0:
        ids, v = ids[None], v[None]
    want_v = np.stack([row_v(int(i)) for i in ids]) if ids.size else np.zeros((0, 2), np.float32)
    np.testing.assert_array_equal(v, want_v, err_msg=f"v does not belong to ids {ids.tolist()}")
    return [int(i) for i in ids]


class BufferModel:
    def __init__(self, capacity: Optional[int], maintain: bool = False) -> None:
        self.capacity = capacity
        self.maintain = maintain
        self.rows: List[int] = []
        self.segments: List[Tuple[int, int]] = []
        self.open_start: Optional[int] = None
        self.open_len = 0

    def add(self, ids: List[int]) -> None:
        self.rows.extend(ids)
        if self.capacity is not None and len(self.rows) > self.capacity:
            d = len(self.rows) - self.capacity
            self.rows = self.rows[d:]
            self.segments = [(max(s - d, 0), e - d) for s, e in self.segments if e - d > 0]
            if self.open_start is not None:
                self.open_start -= d
                if self.open_start < 0:         # the open episode keeps its newest rows
                    self.open_len += self.open_start
                    self.open_start = 0

    def begin_or_continue(self) -> None:
        if self.open_start is None:
            self.open_start, self.open_len = len(self.rows), 0

    def end_episode(self) -> None:
        if self.open_start is not None and self.open_len:
            self.segments.append((self.open_start, self.open_start + self.open_len))
        self.open_start, self.open_len = None, 0

    def clear(self) -> None:
        self.rows, self.segments = [], []
        self.open_start, self.open_len = None, 0


class _ReplayBufferMachine(RuleBasedStateMachine):
    capacity: Optional[int] = CAPACITY
    maintain = False

    def __init__(self) -> None:
        super().__init__()
        self.tmp = tempfile.mkdtemp(prefix="rb_sm_")
        self.dirs = [os.path.join(self.tmp, "a"), os.path.join(self.tmp, "b")]
        self.dir_idx = 0
        self.rb = ReplayBuffer.create(FlattenedStorage, SPACE, inner_storage_cls=PytorchTensorStorage,
                                      cache_path=self.dirs[0], capacity=self.capacity, is_memmap=True,
                                      maintain_segment_metadata=self.maintain)
        self.model = BufferModel(self.capacity, self.maintain)
        self.writers: List[Tuple[Any, List[int]]] = []
        self.stale_writers: List[Any] = []
        self.next_id = 1

    def teardown(self) -> None:
        try:
            self.rb.close()
        finally:
            shutil.rmtree(self.tmp, ignore_errors=True)

    def fresh_ids(self, n: int) -> List[int]:
        ids = list(range(self.next_id, self.next_id + n))
        self.next_id += n
        return ids

    def snapshot(self) -> Tuple[int, List[int], Any]:
        return len(self.rb), self.all_ids(), self.rb.episode_segments()

    def all_ids(self) -> List[int]:
        return read_ids(self.rb.get_at(slice(None))) if len(self.rb) else []

    # ------------------------------------------------------------------------------------------ rules
    @rule(n=st.integers(1, 4), end=st.booleans())
    def append(self, n: int, end: bool) -> None:
        for i in self.fresh_ids(n):
            if self.capacity is not None and self.model.open_len == self.capacity and not self.maintain:
                self.rb.mark_segment_end()
                self.model.end_episode()
            self.rb.append(single(i))
            self.model.begin_or_continue()
            self.model.open_len += 1
            self.model.add([i])
        if end:
            self.rb.mark_segment_end()
            self.model.end_episode()

    @rule()
    def mark_segment_end(self) -> None:
        self.rb.mark_segment_end()
        self.model.end_episode()

    @rule()
    def abort_segment(self) -> None:
        self.rb.abort_segment()
        self.model.open_start, self.model.open_len = None, 0

    @rule(n=st.integers(1, 12))
    def extend(self, n: int) -> None:
        ids = self.fresh_ids(n)
        if self.model.open_start is not None:
            before = self.snapshot()
            with pytest.raises(RuntimeError, match="mark_segment_end"):
                self.rb.extend(batch(ids))
            assert self.snapshot() == before
            return
        self.rb.extend(batch(ids))
        self.model.add(ids)
        if self.maintain:       # every extended batch is a segment (its newest rows when longer than the ring)
            kept = len(ids) if self.capacity is None else min(len(ids), self.capacity)
            end = len(self.model.rows)
            self.model.segments.append((end - kept, end))

    @precondition(lambda self: len(self.writers) < MAX_WRITERS)
    @rule()
    def open_writer(self) -> None:
        self.writers.append((self.rb.open_segment_writer(), []))

    @precondition(lambda self: len(self.writers) > 0)
    @rule(which=st.integers(0, MAX_WRITERS - 1), n=st.integers(1, 5))
    def writer_append(self, which: int, n: int) -> None:
        w, ids = self.writers[which % len(self.writers)]
        for i in self.fresh_ids(n):
            w.append(single(i))
            ids.append(i)
        assert len(w) == len(ids)

    @precondition(lambda self: len(self.writers) > 0)
    @rule(which=st.integers(0, MAX_WRITERS - 1))
    def commit(self, which: int) -> None:
        k = which % len(self.writers)
        w, ids = self.writers[k]
        if self.model.open_start is not None and ids:   # an empty writer places nothing, even then (the reference)
            before = self.snapshot()
            with pytest.raises(RuntimeError, match="mark_segment_end"):
                self.rb.commit_segment(w)
            assert self.snapshot() == before
            return
        if self.capacity is not None and len(ids) > self.capacity:
            before = self.snapshot()
            with pytest.raises(ValueError):
                self.rb.commit_segment(w)
            assert self.snapshot() == before
            return
        self.rb.commit_segment(w)
        self.writers.pop(k)
        start = len(self.model.rows)
        self.model.add(ids)
        if ids:
            d = start + len(ids) - len(self.model.rows)
            self.model.segments.append((start - d, start - d + len(ids)))

    @precondition(lambda self: len(self.writers) > 0)
    @rule(which=st.integers(0, MAX_WRITERS - 1))
    def abort_writer(self, which: int) -> None:
        w, _ids = self.writers.pop(which % len(self.writers))
        w.abort()
        with pytest.raises((ValueError, RuntimeError)):
            self.rb.commit_segment(w)

    @rule()
    def clear(self) -> None:
        self.rb.clear()
        self.model.clear()

    @rule(elsewhere=st.booleans())
    def dumps_close_reopen(self, elsewhere: bool) -> None:
        if self.model.open_start is not None:
            self.rb.mark_segment_end()
            self.model.end_episode()
        if elsewhere:
            self.dir_idx = 1 - self.dir_idx
        target = self.dirs[self.dir_idx]
        self.rb.dumps(target)
        self.rb.close()
        self.rb = ReplayBuffer.load_from(target, backend=TB, is_memmap=True, read_only=False)
        self.stale_writers.extend(w for w, _ in self.writers)
        self.writers = []

    @rule()
    def close_reopen_without_dumps(self) -> None:
        """`close()` of a memory-mapped buffer is a commit point too (an open episode ends first)."""
        if self.model.open_start is not None:
            self.rb.mark_segment_end()
            self.model.end_episode()
        self.rb.close()
        self.rb = ReplayBuffer.load_from(self.dirs[self.dir_idx], backend=TB, is_memmap=True, read_only=False)
        self.stale_writers.extend(w for w, _ in self.writers)
        self.writers = []

    @precondition(lambda self: len(self.stale_writers) > 0)
    @rule()
    def commit_stale_writer(self) -> None:
        before = self.snapshot()
        w = self.stale_writers.pop()
        with pytest.raises(ValueError):
            self.rb.commit_segment(w)
        assert self.snapshot() == before

    @rule(data=st.data())
    def read_some(self, data: Any) -> None:
        n = len(self.model.rows)
        if n == 0:
            with pytest.raises(IndexError):
                self.rb.get_at(0)
            return
        i = data.draw(st.integers(-n, n - 1))
        assert read_ids(self.rb.get_at(i)) == [self.model.rows[i]]
        picks = data.draw(st.lists(st.integers(-n, n - 1), max_size=6))
        got = read_ids(self.rb.get_at(np.array(picks, dtype=np.int64)))
        assert got == [self.model.rows[p] for p in picks]
        with pytest.raises(IndexError):
            self.rb.get_at(n)

    # ------------------------------------------------------------------------------------------ invariants
    @invariant()
    def same_length(self) -> None:
        assert len(self.rb) == len(self.model.rows)
        if self.capacity is not None:
            assert 0 <= self.rb.offset < self.capacity
        else:
            assert self.rb.offset == 0

    @invariant()
    def same_rows(self) -> None:
        assert self.all_ids() == self.model.rows

    @invariant()
    def same_segments(self) -> None:
        assert self.rb.episode_segments() == sorted(self.model.segments)
        for s, e in self.model.segments:
            assert 0 <= s < e <= len(self.model.rows)


MACHINE_SETTINGS = settings(max_examples=150, stateful_step_count=40, deadline=None,
                            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


class FixedReplayBufferMachine(_ReplayBufferMachine):
    capacity = CAPACITY


class GrowableReplayBufferMachine(_ReplayBufferMachine):
    capacity = None


class MaintainedFixedReplayBufferMachine(_ReplayBufferMachine):
    """`maintain_segment_metadata=True`: the buffer's own segment list, the reference's semantics."""
    capacity = CAPACITY
    maintain = True


TestFixedReplayBuffer = FixedReplayBufferMachine.TestCase
TestFixedReplayBuffer.settings = MACHINE_SETTINGS
TestGrowableReplayBuffer = GrowableReplayBufferMachine.TestCase
TestGrowableReplayBuffer.settings = settings(MACHINE_SETTINGS, max_examples=80)
TestMaintainedFixedReplayBuffer = MaintainedFixedReplayBufferMachine.TestCase
TestMaintainedFixedReplayBuffer.settings = settings(MACHINE_SETTINGS, max_examples=100)
