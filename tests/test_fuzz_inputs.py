"""Property-based fuzzing of hostile input (issue 6 items 4-6): malformed values and indices, damaged files.

Contract checked on every call into the library:
* a failure is a ValueError / TypeError / KeyError / IndexError / FileNotFoundError (or a subclass) whose message is
  a sentence (never a bare token), and never AssertionError, AttributeError, a raw JSONDecodeError or
  UnicodeDecodeError, OverflowError, MemoryError, RecursionError, ...; no call runs longer than HANG_S seconds
  (a segfault kills the test process and fails the run);
* a malformed value is refused (wrong shape, dtype that would change a value, key set, NaN / inf / out of bounds,
  ragged lists, strings, None, ...), and after a refused write the stored rows, segments, length and open-segment
  state are exactly what they were;
* a well-formed value is stored and reads back unchanged;
* indices follow the documented forms (ints, NumPy / 0-d integers, slices, `...`, integer arrays / tensors / lists,
  boolean masks of the storage length): a valid index reads and writes exactly the rows a plain NumPy model says,
  anything else raises;
* a damaged dataset directory (metadata JSON truncated, bytes flipped, fields deleted or given wrong types, huge or
  negative numbers, path traversal, unknown class names; data files truncated, extended, deleted, replaced) either
  opens and reads without an unclean error, or fails to open with a clean one.

Targets: FlattenedStorage over PytorchTensorStorage (a Dict space with bounded / unbounded float, int, uint8, bool
and nested leaves), PytorchTensorStorage, NumpyMemmapStorage and a ReplayBuffer over FlattenedStorage.
Example counts are sized for CI (well under a minute in all); `--soak` multiplies them.
"""
from __future__ import annotations

import contextlib
import copy
import json
import math
import os
import shutil
import signal
import threading
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import pytest

torch = pytest.importorskip("torch")

# values outside declared bounds are stored with a BoundsWarning by default; this file's refusal checks run in
# the refusal mode (the warning as an error), where they are refused like every other bad value
pytestmark = pytest.mark.filterwarnings("error::unienv_data.base.errors.BoundsWarning")
from unienv_data.base.errors import BoundsWarning  # noqa: E402

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as hs  # noqa: E402

from unienv_data.replay_buffer import ReplayBuffer  # noqa: E402
from unienv_data.storages.flattened import FlattenedStorage  # noqa: E402
from unienv_data.storages.numpy_memmap import NumpyMemmapStorage  # noqa: E402
from unienv_data.storages.pytorch import PytorchTensorStorage  # noqa: E402
from unienv_interface.backends import NumpyComputeBackend as NB  # noqa: E402
from unienv_interface.backends.pytorch import PyTorchComputeBackend as TB  # noqa: E402
from unienv_interface.space import BinarySpace, BoxSpace, DictSpace  # noqa: E402

CLEAN = (ValueError, TypeError, KeyError, IndexError, FileNotFoundError)
HANG_S = 10.0
CAP = 6
VALUE_EXAMPLES = 300
INDEX_EXAMPLES = 300
DAMAGE_EXAMPLES = 200
INF = float("inf")


def fuzz_settings(n: int, soak: int) -> Any:
    return settings(max_examples=n * soak, deadline=None, derandomize=soak == 1, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                           HealthCheck.data_too_large])


# =============================================================================================== the contract
class Hang(BaseException):
    """A library call ran past HANG_S seconds."""


@contextlib.contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_alarm(signum: int, frame: Any) -> None:
        raise Hang(f"no result after {seconds} s")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def unclean(exc: BaseException) -> Optional[str]:
    """None for a clean error, else what is wrong with it."""
    if isinstance(exc, (json.JSONDecodeError, UnicodeDecodeError)):
        return f"raw {type(exc).__name__} (not wrapped in a storage error): {exc}"
    if not isinstance(exc, CLEAN):
        return f"{type(exc).__name__} is not a clean error type: {exc!s:.300}"
    msg = str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)
    if " " not in msg.strip():
        return f"{type(exc).__name__} without a message: {exc!r:.200}"
    return None


def attempt(what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Tuple[bool, Any]:
    """(True, result) or (False, exception) when the call failed cleanly; AssertionError for anything else."""
    try:
        with time_limit(HANG_S), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            warnings.simplefilter("error", BoundsWarning)   # the refusal mode: out-of-bounds values are malformed
            return True, fn(*args, **kwargs)
    except Hang:
        raise AssertionError(f"{what}: hung for {HANG_S} s") from None
    except BaseException as exc:  # noqa: BLE001 - classified here
        problem = unclean(exc)
        if problem:
            raise AssertionError(f"{what}: {problem}") from exc
        return False, exc


# =============================================================================================== spaces
@dataclass(frozen=True)
class Leaf:
    path: Tuple[str, ...]
    shape: Tuple[int, ...]
    dtype: Any          # NumPy dtype
    low: float
    high: float

    @property
    def kind(self) -> str:
        return np.dtype(self.dtype).kind

    @property
    def bounded(self) -> bool:
        return not (math.isinf(self.low) and math.isinf(self.high))


DICT_LEAVES = (
    Leaf(("pos",), (3,), np.float32, -5.0, 5.0),
    Leaf(("free",), (2,), np.float32, -INF, INF),
    Leaf(("count",), (2,), np.int32, 0, 100),
    Leaf(("img",), (2, 2), np.uint8, 0, 255),
    Leaf(("done",), (), np.bool_, 0, 1),
    Leaf(("nested", "k"), (), np.int16, -1, 1),
)
_TORCH_DT = {np.dtype(np.float32): torch.float32, np.dtype(np.int32): torch.int32, np.dtype(np.uint8): torch.uint8,
             np.dtype(np.int16): torch.int16, np.dtype(np.bool_): torch.bool}


def leaf_space(backend: Any, leaf: Leaf) -> Any:
    if leaf.kind == "b":
        return BinarySpace(backend, leaf.shape)
    dt = _TORCH_DT[np.dtype(leaf.dtype)] if backend is TB else leaf.dtype
    return BoxSpace(backend, leaf.low, leaf.high, dt, shape=leaf.shape)


def dict_space() -> DictSpace:
    tree: Dict[str, Any] = {}
    for leaf in DICT_LEAVES:
        node = tree
        for k in leaf.path[:-1]:
            node = node.setdefault(k, {})
        node[leaf.path[-1]] = leaf_space(TB, leaf)
    return DictSpace(TB, tree)


SPACE = dict_space()
SPACE_WIDTH = sum(int(np.prod(leaf.shape, dtype=np.int64)) for leaf in DICT_LEAVES)
PTS_LEAF = Leaf((), (3,), np.float32, -5.0, 5.0)
NP_LEAF = Leaf((), (2, 2), np.uint8, 0, 255)
PTS_SPACE = leaf_space(TB, PTS_LEAF)
NP_SPACE = leaf_space(NB, NP_LEAF)


# =============================================================================================== values
def put(tree: Dict[str, Any], path: Sequence[str], value: Any) -> None:
    node = tree
    for k in path[:-1]:
        node = node.setdefault(k, {})
    node[path[-1]] = value


def take(tree: Any, path: Sequence[str]) -> Any:
    for k in path:
        tree = tree[k]
    return tree


def represent(arr: np.ndarray, how: str) -> Any:
    """`arr` as a torch tensor, a NumPy array, or a (nested) Python list / scalar."""
    if how == "torch":
        return torch.from_numpy(np.array(arr, copy=True))
    if how == "numpy":
        return np.array(arr, copy=True)
    return arr.tolist()


@hs.composite
def valid_leaf(draw: Any, leaf: Leaf, lead: Tuple[int, ...]) -> np.ndarray:
    shape = lead + leaf.shape
    n = int(np.prod(shape, dtype=np.int64))
    if leaf.kind == "b":
        elems = hs.booleans()
    elif leaf.kind == "f":
        elems = (hs.floats(width=32) if not leaf.bounded
                 else hs.floats(leaf.low, leaf.high, width=32, allow_nan=False))
    else:
        elems = hs.integers(int(leaf.low), int(leaf.high))
    vals = draw(hs.lists(elems, min_size=n, max_size=n))
    return np.array(vals, dtype=leaf.dtype).reshape(shape)


_JUNK = [
    ("None", lambda shape: None),
    ("str", lambda shape: "abc"),
    ("bytes", lambda shape: b"\x00\x01"),
    ("dict", lambda shape: {"x": 1}),
    ("set", lambda shape: {1, 2}),
    ("object", lambda shape: object()),
    ("ragged list", lambda shape: [[1], [1, 2]]),
    ("str array", lambda shape: np.full(shape, "a")),
    ("object array", lambda shape: np.full(shape, None, dtype=object)),
    ("complex array", lambda shape: np.zeros(shape, dtype=np.complex64)),
    ("datetime array", lambda shape: np.zeros(shape, dtype="datetime64[D]")),
    ("complex tensor", lambda shape: torch.zeros(shape, dtype=torch.complex64)),
    ("meta tensor", lambda shape: torch.zeros(shape, device="meta")),
    ("list of None", lambda shape: [None] * max(1, int(np.prod(shape, dtype=np.int64)))),
    ("Ellipsis", lambda shape: Ellipsis),
]


@hs.composite
def malformed_leaf(draw: Any, leaf: Leaf, lead: Tuple[int, ...]) -> Tuple[Any, str]:
    """A value that must be refused for `leaf` (batched by `lead`), and what is wrong with it."""
    shape = lead + leaf.shape
    good = draw(valid_leaf(leaf, lead))
    how = draw(hs.sampled_from(["torch", "numpy", "list"]))
    kinds = ["shape", "junk", "overflow"]
    if leaf.kind != "f" or leaf.bounded:
        kinds += ["nan", "inf"]
    if leaf.kind in "iub" or leaf.bounded:
        kinds.append("oob")
    if leaf.kind in "iub":
        kinds.append("frac")
    if leaf.kind == "f" and not leaf.bounded:
        kinds.append("int2float")
    kind = draw(hs.sampled_from(kinds))
    pos = tuple(draw(hs.integers(0, max(0, d - 1))) for d in shape) if good.size else None
    if kind == "shape":
        cands = {(), (1,), shape + (1,), (1,) + shape, (int(good.size) + 1,), (0,), (2,) + shape, shape[:-1]}
        if lead:
            cands |= {(lead[0] + 1,) + leaf.shape, (max(0, lead[0] - 1),) + leaf.shape}
        cands.discard(shape)
        bad_shape = draw(hs.sampled_from(sorted(cands)))
        return represent(np.zeros(bad_shape, dtype=leaf.dtype), how), f"shape {bad_shape} instead of {shape}"
    if kind == "junk":
        name, make = draw(hs.sampled_from(_JUNK))
        return make(shape), name
    if pos is None:  # an empty batch holds no element to spoil: use a wrong shape instead
        return represent(np.zeros((1,) + shape, dtype=leaf.dtype), how), "shape with an extra axis"
    if kind in ("nan", "inf"):
        arr = good.astype(np.float64 if how != "torch" else np.float32)
        arr[pos] = np.nan if kind == "nan" else draw(hs.sampled_from([INF, -INF]))
        return represent(arr, how), f"{kind} at {pos} of a {leaf.kind}-leaf bounded [{leaf.low}, {leaf.high}]"
    if kind == "frac":
        arr = good.astype(np.float64)
        arr[pos] = (0 if leaf.kind == "b" else int(leaf.low)) + 0.5
        return represent(arr, how), f"fraction at {pos} for an integer leaf"
    if kind == "oob":
        if leaf.kind == "f":
            d = draw(hs.sampled_from([1e-3, 0.5, 1.0, 1e6]))
            v = leaf.high + d if draw(hs.booleans()) else leaf.low - d
            arr = good.copy()
            arr[pos] = v
        else:
            d = draw(hs.integers(1, 1000))
            v = int(leaf.high) + d if draw(hs.booleans()) else int(leaf.low) - d
            arr = good.astype(np.int64)
            arr[pos] = v
        return represent(arr, how), f"value {v} at {pos} outside [{leaf.low}, {leaf.high}]"
    if kind == "overflow":
        if leaf.kind == "f":
            arr = good.astype(np.float64)
            arr[pos] = draw(hs.sampled_from([1e300, -1e300, 3.5e38]))
        else:
            arr = good.astype(np.int64)
            arr[pos] = draw(hs.sampled_from([2 ** 40, -(2 ** 40), 2 ** 62]))
        return represent(arr, "numpy" if how == "list" else how), f"value {arr[pos]} overflowing {np.dtype(leaf.dtype)}"
    # int2float: an integer that float32 cannot hold exactly
    arr = np.nan_to_num(good.astype(np.float64), nan=0.0, posinf=0.0, neginf=0.0).round().astype(np.int64)
    arr[pos] = draw(hs.sampled_from([2 ** 24 + 1, -(2 ** 24 + 3), 2 ** 31 - 1]))
    return represent(arr, "numpy" if how == "list" else how), f"int {arr[pos]} not exact in float32"


@hs.composite
def leaf_value(draw: Any, leaf: Leaf, lead: Tuple[int, ...], bad: bool) -> Tuple[Any, np.ndarray, Optional[str]]:
    """(value as given, intended NumPy value or None, what is malformed or None)."""
    if bad:
        v, why = draw(malformed_leaf(leaf, lead))
        return v, None, why  # type: ignore[return-value]
    arr = draw(valid_leaf(leaf, lead))
    how = draw(hs.sampled_from(["torch", "numpy", "list"] + (["noncontig", "bigendian"] if arr.ndim else [])))
    if how == "noncontig":
        wide = np.repeat(arr, 2, axis=-1)
        return torch.from_numpy(wide)[..., ::2], arr, None
    if how == "bigendian":
        return arr.astype(np.dtype(leaf.dtype).newbyteorder(">")), arr, None
    return represent(arr, how), arr, None


_STRUCTURE = ["missing key", "extra key", "renamed key", "non-str key", "not a dict", "nested as leaf",
              "leaf as dict"]


@hs.composite
def dict_value(draw: Any, lead: Tuple[int, ...], bad: bool) -> Tuple[Any, Dict[str, Any], Optional[str]]:
    """A value for SPACE (batched by `lead`): (value, intended {path: array}, what is malformed or None)."""
    value: Dict[str, Any] = {}
    intended: Dict[Tuple[str, ...], np.ndarray] = {}
    spoil = draw(hs.sampled_from(["leaf", "structure"])) if bad else None
    bad_leaf = draw(hs.sampled_from(DICT_LEAVES)) if spoil == "leaf" else None
    why = None
    for leaf in DICT_LEAVES:
        v, arr, w = draw(leaf_value(leaf, lead, leaf is bad_leaf))
        put(value, leaf.path, v)
        intended[leaf.path] = arr
        why = why or (w and f"key {'/'.join(leaf.path)}: {w}")
    if spoil == "structure":
        kind = draw(hs.sampled_from(_STRUCTURE))
        why = kind
        if kind == "missing key":
            path = draw(hs.sampled_from([leaf.path for leaf in DICT_LEAVES]))
            del take(value, path[:-1])[path[-1]]
        elif kind == "extra key":
            node = draw(hs.sampled_from([value, value["nested"]]))
            node["zzz"] = np.zeros(lead, np.float32)
        elif kind == "renamed key":
            value["Pos"] = value.pop("pos")
        elif kind == "non-str key":
            value[1] = value.pop("done")
        elif kind == "not a dict":
            value = draw(hs.sampled_from([None, [value["pos"], value["free"]], torch.zeros(3), "pos", 0]))
        elif kind == "nested as leaf":
            value["nested"] = torch.zeros(lead, dtype=torch.int16)
        else:
            value["count"] = {"x": value["count"]}
    return value, intended, why


def as_numpy_tree(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: as_numpy_tree(v) for k, v in x.items()}
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().numpy()
    return np.asarray(x)


def same_values(got: np.ndarray, want: np.ndarray) -> bool:
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape or got.dtype != np.dtype(want.dtype).newbyteorder("="):
        return False
    if got.dtype.kind == "f":
        return bool(np.array_equal(got, want.astype(got.dtype), equal_nan=True))
    return bool(np.array_equal(got, want))


def check_dict_readback(got: Any, intended: Dict[Tuple[str, ...], np.ndarray], what: str) -> None:
    g = as_numpy_tree(got)
    for path, want in intended.items():
        assert same_values(take(g, path), want), (f"{what}: key {'/'.join(path)} reads back {take(g, path)!r}, "
                                                 f"stored {want!r}")


# =============================================================================================== targets
def state_of(obj: Any) -> Tuple[Any, ...]:
    """Everything a refused write must leave unchanged."""
    if isinstance(obj, ReplayBuffer):
        st = obj.storage
        return (st.get_flattened(slice(None)).numpy().tobytes(), obj.episode_segments(), len(obj), obj.offset,
                obj.total_written, obj.has_open_segment, obj.open_segment_length)
    rows = obj.get_flattened(slice(None)) if hasattr(obj, "get_flattened") else obj.get(slice(None))
    rows = rows.numpy() if isinstance(rows, torch.Tensor) else np.asarray(rows)
    return (rows.tobytes(), obj.episode_segments(), len(obj), obj.has_open_segment, obj.pending_segment_length)


def make_flat() -> FlattenedStorage:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return FlattenedStorage.create(SPACE, PytorchTensorStorage, capacity=CAP)


def make_rb() -> ReplayBuffer:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ReplayBuffer.create(FlattenedStorage, SPACE, inner_storage_cls=PytorchTensorStorage, capacity=CAP)


def diff(before: Tuple[Any, ...], after: Tuple[Any, ...]) -> str:
    names = ["rows", "segments", "length", "4", "5", "6", "7"]
    return ", ".join(f"{names[i]}: {before[i]!r:.80} -> {after[i]!r:.80}" for i in range(len(before))
                     if before[i] != after[i])


def expect_refused(what: str, why: Optional[str], ok: bool, before: Tuple[Any, ...], after: Tuple[Any, ...]) -> None:
    if why is not None:
        assert not ok, f"{what} accepted a malformed value ({why})"
    if not ok:
        assert before == after, f"{what} failed but changed the storage: {diff(before, after)}"


@hs.composite
def batch_index(draw: Any, n: int) -> Tuple[Any, List[int]]:
    """A valid batch index over `n` rows without duplicates, and the positions it selects."""
    kind = draw(hs.sampled_from(["slice", "array", "list", "mask", "tensor"]))
    if kind == "slice":
        a = draw(hs.integers(0, n))
        b = draw(hs.integers(a, n))
        return slice(a, b), list(range(a, b))
    pos = draw(hs.lists(hs.integers(0, n - 1), unique=True, max_size=n))
    if kind == "mask":
        m = np.zeros(n, bool)
        m[pos] = True
        return m, sorted(pos)
    if kind == "list":
        return [p - n if draw(hs.booleans()) else p for p in pos], pos
    if kind == "tensor":
        return torch.tensor(pos, dtype=torch.int64), pos
    return np.array(pos, dtype=np.int64), pos


# =============================================================================================== value fuzzing
def filled_flat() -> FlattenedStorage:
    st = make_flat()
    st.set(slice(None), draw_fixed_batch(CAP))
    w0 = st.open_segment_writer()
    for _ in range(2):
        w0.append(st.get(0))
    w0.commit(1)
    return st


def test_flattened_storage_refuses_malformed_values(soak: int) -> None:
    @fuzz_settings(VALUE_EXAMPLES, soak)
    @given(data=hs.data())
    def run(data: Any) -> None:
        st = filled_flat()
        try:
            one_flat_example(st, data)
        finally:
            st.close()

    run()


def one_flat_example(st: FlattenedStorage, data: Any) -> None:
    op = data.draw(hs.sampled_from(["set", "set batch", "append", "writer", "set_flattened"]), label="op")
    bad = data.draw(hs.booleans(), label="malformed")
    before = state_of(st)
    if op in ("set", "append", "writer"):
        value, intended, why = data.draw(dict_value((), bad), label="value")
        if op == "set":
            i = data.draw(hs.integers(-CAP, CAP - 1), label="index")
            ok, _ = attempt("set", st.set, i, value)
            expect_refused("set", why, ok, before, state_of(st))
            if ok:
                check_dict_readback(st.get(i), intended, "set")
        elif op == "append":
            st.mark_segment_start(data.draw(hs.integers(0, CAP - 1), label="start"))
            before = state_of(st)
            try:
                ok, _ = attempt("append", st.append, value)
                expect_refused("append", why, ok, before, state_of(st))
            finally:
                st.abort_segment()
        else:
            w = st.open_segment_writer()
            w.append(st.get(0))
            ok, _ = attempt("writer.append", w.append, value)
            assert len(w) == (2 if ok else 1), f"writer length {len(w)} after a {'good' if ok else 'refused'} append"
            expect_refused("writer.append", why, ok, before, state_of(st))
            start = data.draw(hs.integers(0, CAP - 1), label="start")
            row0 = st.get(0)
            ok2, exc = attempt("writer.commit after a refused append", w.commit, start)
            assert ok2, f"the writer is unusable after a refused append: {exc}"
            if ok:
                check_dict_readback(st.get((start + 1) % CAP), intended, "writer.commit")
            check_dict_readback(st.get(start), {leaf.path: take(as_numpy_tree(row0), leaf.path)
                                                for leaf in DICT_LEAVES}, "writer.commit")
    elif op == "set batch":
        idx, pos = data.draw(batch_index(CAP), label="index")
        value, intended, why = data.draw(dict_value((len(pos),), bad), label="value")
        ok, _ = attempt("set(batch)", st.set, idx, value)
        expect_refused("set(batch)", why, ok, before, state_of(st))
        if ok and pos:
            check_dict_readback(st.get(np.array(pos)), intended, "set(batch)")
    else:
        lead = data.draw(hs.sampled_from([(), (1,), (2,)]), label="lead")
        idx: Any = data.draw(hs.integers(0, CAP - 1)) if lead == () else slice(0, lead[0])
        value, why = data.draw(malformed_flat_rows(lead, st.flat_space.shape[0]) if bad
                               else valid_flat_rows(st, lead), label="rows")
        ok, _ = attempt("set_flattened", st.set_flattened, idx, value)
        expect_refused("set_flattened", why, ok, before, state_of(st))


def draw_fixed_batch(n: int) -> Dict[str, Any]:
    """A deterministic valid batch of n samples for SPACE (torch tensors)."""
    rng = np.random.default_rng(n)
    out: Dict[str, Any] = {}
    for leaf in DICT_LEAVES:
        shape = (n,) + leaf.shape
        if leaf.kind == "b":
            arr = rng.random(shape) < 0.5
        elif leaf.kind == "f":
            arr = rng.uniform(-4, 4, shape).astype(leaf.dtype)
        else:
            arr = rng.integers(int(leaf.low), int(leaf.high) + 1, shape).astype(leaf.dtype)
        put(out, leaf.path, torch.from_numpy(arr))
    return out


@hs.composite
def valid_flat_rows(draw: Any, st: FlattenedStorage, lead: Tuple[int, ...]) -> Tuple[Any, None]:
    rows = st.get_flattened(slice(0, lead[0]) if lead else draw(hs.integers(0, CAP - 1)))
    return rows, None


@hs.composite
def malformed_flat_rows(draw: Any, lead: Tuple[int, ...], width: int) -> Tuple[Any, str]:
    kind = draw(hs.sampled_from(["width", "nan", "frac", "big", "negative", "junk", "ndim"]))
    how = draw(hs.sampled_from(["torch", "numpy"]))
    if kind == "width":
        w = draw(hs.sampled_from([width - 1, width + 1, 0]))
        return represent(np.zeros(lead + (w,), np.float32), how), f"width {w} instead of {width}"
    if kind == "ndim":
        return represent(np.zeros(lead + (1, width), np.float32), how), "an extra axis"
    if kind == "junk":
        name, make = draw(hs.sampled_from(_JUNK))
        return make(lead + (width,)), name
    fill = {"nan": np.nan, "frac": 0.5, "big": 300.0, "negative": -1.0}[kind]
    # every row holds bounded and integer leaves, so these values are invalid wherever they land
    return represent(np.full(lead + (width,), fill, np.float32), how), f"every entry {fill}"


@pytest.mark.parametrize("which", ["pytorch", "numpy"])
def test_array_storages_refuse_malformed_values(soak: int, which: str) -> None:
    @fuzz_settings(VALUE_EXAMPLES, soak)
    @given(data=hs.data())
    def run(data: Any) -> None:
        if which == "pytorch":
            st: Any = PytorchTensorStorage.create(PTS_SPACE, capacity=CAP)
            st.set(slice(None), torch.from_numpy(rows_for(list(range(CAP)), 0.0)))
        else:
            st = NumpyMemmapStorage.create(NP_SPACE, capacity=CAP)
            st.set(slice(None), encode_np(rows_for(list(range(CAP)), 0.0)))
        try:
            one_array_example(st, PTS_LEAF if which == "pytorch" else NP_LEAF, data)
        finally:
            st.close()

    run()


def one_array_example(st: Any, leaf: Leaf, data: Any) -> None:
    def readback(i: Any) -> np.ndarray:
        return as_numpy_tree(st.get(i))

    op = data.draw(hs.sampled_from(["set", "set batch", "append", "writer", "set_flattened"]), label="op")
    bad = data.draw(hs.booleans(), label="malformed")
    before = state_of(st)
    if op == "set batch":
        idx, pos = data.draw(batch_index(CAP), label="index")
        value, arr, why = data.draw(leaf_value(leaf, (len(pos),), bad), label="value")
        ok, _ = attempt("set(batch)", st.set, idx, value)
        expect_refused("set(batch)", why, ok, before, state_of(st))
        if ok and pos:
            assert same_values(readback(np.array(pos)), arr), "set(batch) did not store the value"
        return
    if op == "set_flattened":
        i = data.draw(hs.integers(0, CAP - 1), label="index")
        value, arr, why = data.draw(leaf_value(Leaf((), (int(np.prod(leaf.shape)),), leaf.dtype, leaf.low,
                                                    leaf.high), (), bad), label="value")
        ok, _ = attempt("set_flattened", st.set_flattened, i, value)
        expect_refused("set_flattened", why, ok, before, state_of(st))
        if ok:
            assert same_values(readback(i).reshape(-1), arr), "set_flattened did not store the value"
        return
    value, arr, why = data.draw(leaf_value(leaf, (), bad), label="value")
    if op == "set":
        i = data.draw(hs.integers(-CAP, CAP - 1), label="index")
        ok, _ = attempt("set", st.set, i, value)
        expect_refused("set", why, ok, before, state_of(st))
        if ok:
            assert same_values(readback(i), arr), "set did not store the value"
    elif op == "append":
        start = data.draw(hs.integers(0, CAP - 1), label="start")
        st.mark_segment_start(start)
        before = state_of(st)
        try:
            ok, _ = attempt("append", st.append, value)
            expect_refused("append", why, ok, before, state_of(st))
            if ok:
                assert same_values(readback(start), arr), "append did not store the value"
        finally:
            st.abort_segment()
    else:
        w = st.open_segment_writer()
        ok, _ = attempt("writer.append", w.append, value)
        assert len(w) == int(ok), f"writer length {len(w)} after a {'good' if ok else 'refused'} append"
        expect_refused("writer.append", why, ok, before, state_of(st))
        start = data.draw(hs.integers(0, CAP - 1), label="start")
        ok2, exc = attempt("writer.commit", w.commit, start)
        assert ok2, f"the writer is unusable after a refused append: {exc}"
        if ok:
            assert same_values(readback(start), arr), "writer.commit did not store the value"


def wrapped_rb() -> ReplayBuffer:
    rb = make_rb()
    rb.extend(draw_fixed_batch(CAP))
    rb.extend(draw_fixed_batch(3))            # full and wrapped: offset 3
    assert rb.offset == 3
    return rb


def test_replay_buffer_refuses_malformed_values(soak: int) -> None:
    @fuzz_settings(VALUE_EXAMPLES, soak)
    @given(data=hs.data())
    def run(data: Any) -> None:
        rb = wrapped_rb()
        try:
            one_rb_example(rb, data)
        finally:
            rb.close()

    run()


def one_rb_example(rb: ReplayBuffer, data: Any) -> None:
    op = data.draw(hs.sampled_from(["append", "extend", "set_at", "commit_segment"]), label="op")
    bad = data.draw(hs.booleans(), label="malformed")
    if op == "append":
        for _ in range(data.draw(hs.integers(0, 2), label="good steps first")):
            rb.append(rb.get_at(0))
        before = state_of(rb)
        value, intended, why = data.draw(dict_value((), bad), label="value")
        ok, _ = attempt("append", rb.append, value)
        expect_refused("append", why, ok, before, state_of(rb))
        if ok:
            check_dict_readback(rb.get_at(len(rb) - 1), intended, "append")
        rb.mark_segment_end()
    elif op == "extend":
        n = data.draw(hs.integers(1, CAP + 2), label="batch size")
        value, intended, why = data.draw(dict_value((n,), bad), label="value")
        before = state_of(rb)
        ok, _ = attempt("extend", rb.extend, value)
        expect_refused("extend", why, ok, before, state_of(rb))
        if ok:
            k = min(n, CAP)
            tail = {p: a[n - k:] for p, a in intended.items()}
            check_dict_readback(rb.get_at(slice(len(rb) - k, len(rb))), tail, "extend")
    elif op == "set_at":
        idx, pos = data.draw(batch_index(len(rb)), label="index")
        value, intended, why = data.draw(dict_value((len(pos),), bad), label="value")
        before = state_of(rb)
        ok, _ = attempt("set_at", rb.set_at, idx, value)
        expect_refused("set_at", why, ok, before, state_of(rb))
        if ok and pos:
            check_dict_readback(rb.get_at(np.array(pos)), intended, "set_at")
    else:
        w = rb.open_segment_writer()
        w.append(rb.get_at(0))
        before = state_of(rb)
        value, intended, why = data.draw(dict_value((), bad), label="value")
        ok, _ = attempt("writer.append", w.append, value)
        expect_refused("writer.append", why, ok, before, state_of(rb))
        assert len(w) == 1 + int(ok)
        ok2, exc = attempt("commit_segment", rb.commit_segment, w)
        assert ok2, f"the writer is unusable after a refused append: {exc}"
        if ok:
            check_dict_readback(rb.get_at(len(rb) - 1), intended, "commit_segment")


# =============================================================================================== value sweeps
# Hypothesis explores combinations; these sweeps make sure every kind of malformed value reaches every write path in
# every CI run (a derandomized search of a few hundred examples cannot promise that for rare branches).

def malformed_variants(leaf: Leaf, lead: Tuple[int, ...]) -> Iterator[Tuple[Any, str]]:
    """Every kind of malformed value for `leaf` (batched by `lead`), each as NumPy and as torch where possible."""
    shape = lead + leaf.shape
    good = np.zeros(shape, dtype=leaf.dtype)              # zeros lie inside every leaf's bounds
    first = (0,) * len(shape)
    cands = {(), (1,), shape + (1,), (1,) + shape, (int(good.size) + 1,), (0,), (2,) + shape, shape[:-1]}
    if lead:
        cands |= {(lead[0] + 1,) + leaf.shape, (max(0, lead[0] - 1),) + leaf.shape}
    cands.discard(shape)
    for sh in sorted(cands):
        yield np.zeros(sh, dtype=leaf.dtype), f"shape {sh} instead of {shape}"
        yield torch.from_numpy(np.zeros(sh, dtype=leaf.dtype)), f"tensor of shape {sh} instead of {shape}"
    for name, make in _JUNK:
        yield make(shape), name
    specials: List[Tuple[Any, str]] = []
    if leaf.kind != "f" or leaf.bounded:
        specials += [(np.nan, "nan"), (INF, "inf"), (-INF, "-inf")]
    if leaf.kind in "iub":
        specials += [((0 if leaf.kind == "b" else int(leaf.low)) + 0.5, "fraction"),
                     (int(leaf.high) + 1, "above the bounds"), (int(leaf.low) - 1, "below the bounds"),
                     (2 ** 40, "overflowing"), (2 ** 64 - 1, "overflowing unsigned")]
    else:
        if leaf.bounded:
            specials += [(leaf.high + 0.5, "above the bounds"), (leaf.low - 0.5, "below the bounds")]
        specials += [(1e300, "overflowing float32")]
        if not leaf.bounded:
            specials += [(2 ** 24 + 1, "an int float32 cannot hold")]
    if not good.size:
        return
    for v, why in specials:
        dt = np.uint64 if v == 2 ** 64 - 1 else (np.int64 if isinstance(v, int) else np.float64)
        arr = good.astype(dt)
        arr[first] = v
        yield arr, f"{why} ({v}) at {first}"
        if dt is not np.uint64:
            yield torch.from_numpy(arr), f"tensor with {why} ({v}) at {first}"
        yield arr.tolist(), f"list with {why} ({v}) at {first}"


def valid_dict(lead: Tuple[int, ...]) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for leaf in DICT_LEAVES:
        put(out, leaf.path, torch.from_numpy(np.zeros(lead + leaf.shape, dtype=leaf.dtype)))
    return out


def malformed_dicts(lead: Tuple[int, ...]) -> Iterator[Tuple[Any, str]]:
    """Every structural mistake, then every malformed leaf value in an otherwise valid dict."""
    for leaf in DICT_LEAVES:
        v = valid_dict(lead)
        del take(v, leaf.path[:-1])[leaf.path[-1]]
        yield v, f"missing key {'/'.join(leaf.path)}"
    for where in ((), ("nested",)):
        v = valid_dict(lead)
        take(v, where)["zzz"] = torch.zeros(lead)
        yield v, f"extra key at {where or 'top'}"
    v = valid_dict(lead)
    v["Pos"] = v.pop("pos")
    yield v, "renamed key"
    v = valid_dict(lead)
    v[1] = v.pop("done")
    yield v, "non-string key"
    v = valid_dict(lead)
    v["nested"] = torch.zeros(lead, dtype=torch.int16)
    yield v, "nested dict given as a leaf"
    v = valid_dict(lead)
    v["count"] = {"x": v["count"]}
    yield v, "leaf given as a dict"
    for junk in (None, [torch.zeros(lead + (3,))], torch.zeros(lead + (13,)), "pos", 0):
        yield junk, f"not a dict: {type(junk).__name__}"
    for leaf in DICT_LEAVES:
        for bad, why in malformed_variants(leaf, lead):
            v = valid_dict(lead)
            put(v, leaf.path, bad)
            yield v, f"key {'/'.join(leaf.path)}: {why}"


def sweep(make: Callable[[], Any], cases: Iterator[Tuple[str, Callable[[Any], Any], Any, str]]) -> None:
    """Runs every (op name, op(obj, value), value, why) on a fresh object; all must be refused cleanly and leave
    the object unchanged. Reports every failure, not just the first."""
    failures: List[str] = []
    n = 0
    for name, op, value, why in cases:
        n += 1
        obj = make()
        try:
            before = state_of(obj)
            try:
                ok, _ = attempt(name, op, obj, value)
                expect_refused(name, why, ok, before, state_of(obj))
            except AssertionError as exc:
                failures.append(f"{name} [{why}]: {str(exc).splitlines()[0][:200]}")
        finally:
            obj.close()
    assert not failures, f"{len(failures)} of {n} malformed writes were mishandled:\n" + "\n".join(failures[:40])


def _append_op(obj: Any, value: Any) -> None:
    obj.mark_segment_start(2)
    try:
        obj.append(value)
    finally:
        obj.abort_segment()


def _writer_op(obj: Any, value: Any) -> None:
    w = obj.open_segment_writer()
    w.append(value)
    w.commit(2)


def test_sweep_flattened_storage() -> None:
    def cases() -> Iterator[Tuple[str, Callable[[Any], Any], Any, str]]:
        for v, why in malformed_dicts(()):
            yield "set", lambda o, v: o.set(1, v), v, why
            yield "append", _append_op, v, why
            yield "writer.append", _writer_op, v, why
        for v, why in malformed_dicts((2,)):
            yield "set(batch)", lambda o, v: o.set(slice(2, 4), v), v, why
        for lead in ((), (2,)):
            for name, make in _JUNK + [("nan rows", lambda sh: np.full(sh, np.nan, np.float32)),
                                       ("rows of 300", lambda sh: np.full(sh, 300.0, np.float32)),
                                       ("rows of 0.5", lambda sh: torch.full(sh, 0.5))]:
                sh = lead + (SPACE_WIDTH,)
                yield ("set_flattened", lambda o, v, lead=lead: o.set_flattened(1 if not lead else slice(0, 2), v),
                       make(sh), name)
    sweep(filled_flat, cases())


def test_sweep_array_storages() -> None:
    for leaf, make in ((PTS_LEAF, lambda: PytorchTensorStorage.create(PTS_SPACE, capacity=CAP)),
                       (NP_LEAF, lambda: NumpyMemmapStorage.create(NP_SPACE, capacity=CAP))):
        def cases(leaf: Leaf = leaf) -> Iterator[Tuple[str, Callable[[Any], Any], Any, str]]:
            for v, why in malformed_variants(leaf, ()):
                yield "set", lambda o, v: o.set(1, v), v, why
                yield "append", _append_op, v, why
                yield "writer.append", _writer_op, v, why
            for v, why in malformed_variants(leaf, (2,)):
                yield "set(batch)", lambda o, v: o.set(slice(2, 4), v), v, why
            flat = Leaf((), (int(np.prod(leaf.shape)),), leaf.dtype, leaf.low, leaf.high)
            for v, why in malformed_variants(flat, ()):
                yield "set_flattened", lambda o, v: o.set_flattened(1, v), v, why
        sweep(make, cases())


def test_sweep_replay_buffer() -> None:
    def commit_op(rb: ReplayBuffer, value: Any) -> None:
        w = rb.open_segment_writer()
        w.append(value)
        rb.commit_segment(w)

    def append_op(rb: ReplayBuffer, value: Any) -> None:
        try:
            rb.append(value)
        finally:
            rb.abort_segment()

    def cases() -> Iterator[Tuple[str, Callable[[Any], Any], Any, str]]:
        for v, why in malformed_dicts(()):
            yield "append", append_op, v, why
            yield "writer.append + commit_segment", commit_op, v, why
        for n in (1, CAP - 1, CAP, CAP + 2):      # below, at and above the capacity (a separate code path)
            for v, why in malformed_dicts((n,)):
                yield f"extend({n} rows)", lambda o, v: o.extend(v), v, why
        for v, why in malformed_dicts((2,)):
            yield "set_at", lambda o, v: o.set_at(slice(1, 3), v), v, why
    sweep(wrapped_rb, cases())


# =============================================================================================== index fuzzing
_HUGE = [2 ** 31, 2 ** 63 - 1, 2 ** 63, 2 ** 64 - 1, 2 ** 64 - 2, 2 ** 64 - CAP, 2 ** 64, -(2 ** 63), -(2 ** 63) - 1,
         10 ** 30]
_INT_DTYPES = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64]
_TORCH_INT = [torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8]
_TORCH_NP = {torch.int8: np.int8, torch.int16: np.int16, torch.int32: np.int32, torch.int64: np.int64,
             torch.uint8: np.uint8}


def fits(v: int, dt: Any) -> bool:
    info = np.iinfo(dt)
    return info.min <= v <= info.max


@hs.composite
def any_index(draw: Any, n: int) -> Tuple[Any, str, Optional[List[int]], bool]:
    """(index, description, positions it must select or None when it must be refused, single).
    `positions` is the string "either" when both refusing and the list semantics are acceptable."""
    ints = hs.one_of(hs.integers(-3 * n, 3 * n), hs.sampled_from(_HUGE))
    kind = draw(hs.sampled_from(["int", "np int", "0-d", "bool", "float", "junk", "slice", "ellipsis", "list",
                                 "bool list", "mixed list", "array", "mask", "tensor", "tuple", "2-d",
                                 "near 2**64"]))

    def in_range(vs: Sequence[int]) -> bool:
        return all(-n <= v < n for v in vs)

    def norm(vs: Sequence[int]) -> List[int]:
        return [v + n if v < 0 else v for v in vs]

    if kind == "int":
        v = draw(ints)
        return v, f"int {v}", norm([v]) if in_range([v]) else None, True
    if kind == "np int":
        dt = draw(hs.sampled_from(_INT_DTYPES))
        v = draw(ints.filter(lambda x: fits(x, dt)))
        idx: Any = dt(v)
        return idx, f"NumPy scalar {idx!r}", norm([v]) if in_range([v]) else None, True
    if kind == "0-d":
        if draw(hs.booleans()):
            dt = draw(hs.sampled_from(_INT_DTYPES))
            v = draw(ints.filter(lambda x: fits(x, dt)))
            idx = np.array(v, dtype=dt)
        else:
            tdt = draw(hs.sampled_from(_TORCH_INT))
            v = draw(ints.filter(lambda x: fits(x, _TORCH_NP[tdt])))
            idx = torch.tensor(v, dtype=tdt)
        return idx, f"0-d {idx!r}", norm([v]) if in_range([v]) else None, True
    if kind == "bool":
        b = draw(hs.sampled_from([True, False, np.bool_(True), torch.tensor(True)]))
        return b, f"bool {b!r}", None, True
    if kind == "float":
        f = draw(hs.sampled_from([0.0, 1.0, 1.5, -1.0, float("nan"), INF, np.float64(1.0), np.float32(0.0),
                                  torch.tensor(1.0)]))
        return f, f"float {f!r}", None, True
    if kind == "junk":
        j = draw(hs.sampled_from([None, "0", b"0", {0: 1}, {0}, object(), 1 + 0j, range(2), [[0], [0, 1]],
                                  [0.5], ["a"], [None], np.array(["0"]), np.array([0.0]), torch.tensor([0.5]),
                                  np.array([1 + 0j]), np.array([None, 1], dtype=object)]))
        if isinstance(j, range):
            return j, "range", "either", False  # type: ignore[return-value]
        return j, f"junk {j!r:.40}", None, False
    if kind == "slice":
        bound = hs.one_of(hs.none(), hs.integers(-2 * n, 2 * n), hs.sampled_from(_HUGE))
        step = draw(hs.one_of(hs.none(), hs.sampled_from([1, 2, 3, 0, -1, -2, 2 ** 63, 10 ** 30]),
                              hs.sampled_from([0.5, "1", np.int64(2)])))
        s = slice(draw(bound), draw(bound), step)
        if isinstance(step, (float, str)):
            return s, f"slice {s}", None, False
        st_ = 1 if step is None else int(step)
        if st_ == 0:
            return s, f"slice {s}", None, False
        if st_ < 0:
            return s, f"slice {s}", "either", False  # type: ignore[return-value]
        return s, f"slice {s}", list(range(*s.indices(n))), False
    if kind == "ellipsis":
        return Ellipsis, "Ellipsis", list(range(n)), False
    if kind in ("list", "tuple"):
        vs = draw(hs.lists(ints, max_size=6))
        idx = list(vs) if kind == "list" else tuple(vs)
        want = norm(vs) if in_range(vs) else None
        return idx, f"{kind} {vs}", want if kind == "list" else ("either" if want is not None else None), False
    if kind == "bool list":
        m = draw(hs.lists(hs.booleans(), min_size=max(0, n - 1), max_size=n + 1))
        return m, f"bool list of {len(m)}", [i for i, b in enumerate(m) if b] if len(m) == n else None, False
    if kind == "near 2**64":   # unsigned values that wrap to valid negative indices if cast to int64
        vs = draw(hs.lists(hs.one_of(hs.integers(0, n - 1), hs.integers(2 ** 64 - n, 2 ** 64 - 1)), min_size=1,
                           max_size=4))
        idx = np.array(vs, dtype=np.uint64) if draw(hs.booleans()) else list(vs)
        return idx, f"{type(idx).__name__} {vs}", norm(vs) if in_range(vs) else None, False
    if kind == "mixed list":
        return [0, True], "list mixing ints and bools", None, False
    if kind == "array":
        dt = draw(hs.sampled_from(_INT_DTYPES))
        vs = draw(hs.lists(ints.filter(lambda x: fits(x, dt)), max_size=6))
        arr = np.array(vs, dtype=dt)
        return arr, f"{np.dtype(dt).name} array {vs}", norm(vs) if in_range(vs) else None, False
    if kind == "mask":
        ln = draw(hs.sampled_from([n, n, n - 1, n + 1, 0]))
        m = np.array(draw(hs.lists(hs.booleans(), min_size=ln, max_size=ln)), dtype=bool)
        if draw(hs.booleans()):
            m = torch.from_numpy(m)
        return m, f"mask of {ln}", [i for i, b in enumerate(np.asarray(m)) if b] if ln == n else None, False
    if kind == "tensor":
        tdt = draw(hs.sampled_from(_TORCH_INT))
        vs = draw(hs.lists(ints.filter(lambda x: fits(x, _TORCH_NP[tdt])), max_size=6))
        return torch.tensor(vs, dtype=tdt), f"{tdt} tensor {vs}", norm(vs) if in_range(vs) else None, False
    arr = np.zeros((2, 1), dtype=np.int64)
    return arr, "2-d array", None, False


def rows_for(positions: List[int], base: float) -> np.ndarray:
    return np.array([[base + p * 0.25, -p * 0.5, p % 3] for p in positions], dtype=np.float32).reshape(-1, 3)


@pytest.mark.parametrize("which", ["pytorch", "numpy", "flattened", "replay_buffer"])
def test_indices_follow_the_documented_forms(soak: int, which: str) -> None:
    """get / set with a fuzzed index against a plain NumPy model of the rows."""
    n = CAP
    if which == "pytorch":
        obj: Any = PytorchTensorStorage.create(PTS_SPACE, capacity=n)
        get, put_ = obj.get, obj.set
    elif which == "numpy":
        obj = NumpyMemmapStorage.create(NP_SPACE, capacity=n)
        get, put_ = obj.get, obj.set
    elif which == "flattened":
        obj = FlattenedStorage.create(DictSpace(TB, {"pos": PTS_SPACE}), PytorchTensorStorage, capacity=n)
        get, put_ = obj.get, obj.set
    else:
        obj = ReplayBuffer.create(FlattenedStorage, DictSpace(TB, {"pos": PTS_SPACE}),
                                  inner_storage_cls=PytorchTensorStorage, capacity=n)
        get, put_ = obj.get_at, obj.set_at

    def to_value(rows: np.ndarray, single: bool) -> Any:
        r = rows[0] if single else rows
        if which == "numpy":
            return encode_np(r)
        t = torch.from_numpy(np.array(r))
        return {"pos": t} if which in ("flattened", "replay_buffer") else t

    def from_value(v: Any) -> np.ndarray:
        if which == "numpy":
            return decode_np(np.asarray(v))
        v = v["pos"] if isinstance(v, dict) else v
        return v.numpy()

    model = rows_for(list(range(n)), 0.0)
    if which == "replay_buffer":
        rows = rows_for(list(range(n + 2)), 0.0)
        obj.extend({"pos": torch.from_numpy(rows[:n])})
        obj.extend({"pos": torch.from_numpy(rows[n:])})      # wrapped: offset 2
        assert obj.offset == 2
        model = rows[2:]
    else:
        put_(slice(None), to_value(model, False))
    if which == "numpy":
        model = decode_np(encode_np(model))

    @fuzz_settings(INDEX_EXAMPLES, soak)
    @given(data=hs.data())
    def run(data: Any) -> None:
        nonlocal model
        idx, desc, want, single = data.draw(any_index(n), label="index")
        ok, got = attempt(f"get({desc})", get, idx)
        if want is None:
            assert not ok, f"get({desc}) must be refused, returned {got!r:.120}"
        elif want != "either" or ok:
            if want == "either":
                want = [v + n if v < 0 else v for v in (list(idx) if not isinstance(idx, slice) else
                                                        range(*idx.indices(n)))]
            assert ok, f"get({desc}) refused a valid index: {got}"
            g = from_value(got)
            exp = model[want[0]] if single else model[want]
            assert g.shape == exp.shape and np.array_equal(g, exp), \
                f"get({desc}) returned rows {g.tolist()}, the model says {exp.tolist()}"
        # set the same index with fresh rows: the model says where they land
        count = 1 if single else (len(want) if isinstance(want, list) else 1)
        base = float(data.draw(hs.integers(1, 8), label="base")) / 4
        raw = rows_for(list(range(count)), base)
        rows = decode_np(encode_np(raw)) if which == "numpy" else raw
        before = state_of(obj)
        ok, err = attempt(f"set({desc})", put_, idx, to_value(raw, single))
        if want is None:
            assert not ok, f"set({desc}) must be refused, but it wrote"
            assert state_of(obj) == before, f"refused set({desc}) changed the storage"
        elif ok and isinstance(want, list):
            new = model.copy()
            for k, p in enumerate(want):
                new[p] = rows[k]
            after = from_value(get(slice(None)))
            assert np.array_equal(after, new), f"set({desc}) wrote rows {after.tolist()}, the model says {new.tolist()}"
            model = new
        elif ok:   # "either" accepted: whatever it did must match the list semantics
            model = from_value(get(slice(None)))
        elif want != "either":
            raise AssertionError(f"set({desc}) refused a valid index: {err}")
        else:
            assert state_of(obj) == before, f"refused set({desc}) changed the storage"

    try:
        run()
    finally:
        obj.close()


def encode_np(rows: np.ndarray) -> np.ndarray:
    """float rows (.., 3) -> uint8 (.., 2, 2) for the NumPy uint8 storage (a lossless code of the model rows)."""
    r = np.asarray(rows, dtype=np.float64)
    a = np.round(r[..., 0] * 4).astype(np.int64) % 256
    b = np.round(-r[..., 1] * 2).astype(np.int64) % 256
    c = np.round(r[..., 2]).astype(np.int64) % 256
    out = np.stack([a, b, c, (a + b + c) % 256], axis=-1).astype(np.uint8)
    return out.reshape(r.shape[:-1] + (2, 2))


def decode_np(v: np.ndarray) -> np.ndarray:
    """Inverse view used for comparisons: (.., 2, 2) uint8 -> (.., 4) uint8 (compared exactly)."""
    v = np.asarray(v)
    return v.reshape(v.shape[:-2] + (4,))


# =============================================================================================== damaged files
_JSON_JUNK: List[Any] = [
    None, True, False, 0, -1, -(10 ** 18), 10 ** 18, 10 ** 30, -(10 ** 30), 2 ** 63, 2 ** 64, 1.5, -0.0,
    float("nan"), INF, -INF, "", "x", "../../../../etc/passwd", "/etc/passwd", "..", ".", "os.system",
    "builtins.eval", "subprocess.Popen", "unienv_data.storages.flattened.Nope", "\u0000", "\u00e9\u00e9",
    "a" * 5000, [], [1], [[0, 1]], [[-1, 5]], [[0, 10 ** 30]], [[5, 0], [0, 5]], {}, {"type": "BoxSpace"},
    {"type": "DictSpace", "spaces": {}}, {"type": "Nope"},
    {"type": "BoxSpace", "shape": [10 ** 12], "low": 0, "high": 1, "dtype": "float32"},
    {"type": "BoxSpace", "shape": [-3], "low": 0, "high": 1, "dtype": "float32"},
    {"type": "BoxSpace", "shape": [3], "low": 0, "high": 1, "dtype": "no_such_dtype"},
    {"type": "BinarySpace", "shape": [10 ** 9, 10 ** 9]},
    {"type": "TextSpace", "max_length": 10 ** 15},
    {"type": "BatchedSpace", "single_space": {"type": "BinarySpace", "shape": []}, "batch_shape": [10 ** 10]},
    [0] * 300, "float32", "int64", "bool", "torch.float32", "float16",
]


def json_paths(obj: Any, prefix: Tuple[Any, ...] = ()) -> List[Tuple[Any, ...]]:
    out = [prefix]
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += json_paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj[:8]):
            out += json_paths(v, prefix + (i,))
    return out


JSON_DAMAGE = ["set field", "set field", "set field", "delete field", "add field", "truncate", "flip bytes", "garbage",
               "deep nesting", "not an object", "delete file", "directory", "empty"]
DATA_DAMAGE = ["truncate", "extend", "flip bytes", "delete file", "directory", "symlink out", "empty"]


@hs.composite
def damage(draw: Any, files: List[str]) -> List[Tuple[str, str, Any]]:
    """1-3 damage steps: (relative file, operation, parameters)."""
    steps = []
    for _ in range(draw(hs.integers(1, 3))):
        f = draw(hs.sampled_from(files))
        op = draw(hs.sampled_from(JSON_DAMAGE if f.endswith(".json") else DATA_DAMAGE))
        params = {"seed": draw(hs.integers(0, 2 ** 32 - 1)), "junk": draw(hs.sampled_from(range(len(_JSON_JUNK)))),
                  "frac": draw(hs.floats(0, 1)), "count": draw(hs.integers(1, 64))}
        steps.append((f, op, params))
    return steps


def apply_damage(root: str, steps: List[Tuple[str, str, Any]], outside: str) -> List[str]:
    log = []
    for rel, op, p in steps:
        path = os.path.join(root, rel)
        rng = np.random.default_rng(p["seed"])
        if not os.path.isfile(path) or os.path.islink(path):
            if op in ("directory", "symlink out") and not os.path.exists(path):
                pass
            else:
                continue
        size = os.path.getsize(path) if os.path.isfile(path) else 0
        if op == "set field" or op == "delete field" or op == "add field":
            try:
                with open(path) as f:
                    obj = json.load(f)
            except (ValueError, UnicodeDecodeError, RecursionError):
                continue
            paths = json_paths(obj)
            target = tuple(p["path"]) if "path" in p else paths[int(rng.integers(0, len(paths)))]
            if target not in paths:
                continue
            junk = copy.deepcopy(_JSON_JUNK[p["junk"]])
            if op == "add field":
                node = obj
                if isinstance(node, dict):
                    node[f"junk{int(rng.integers(0, 9))}"] = junk
            elif not target:
                obj = junk if op == "set field" else {}
            else:
                parent = obj
                for k in target[:-1]:
                    parent = parent[k]
                if op == "set field":
                    parent[target[-1]] = junk
                elif isinstance(parent, dict):
                    del parent[target[-1]]
                else:
                    parent.pop(target[-1])
            with open(path, "w") as f:
                json.dump(obj, f, allow_nan=True)
            log.append(f"{rel}: {op} {list(target)} = {junk!r:.60}")
        elif op == "truncate":
            with open(path, "r+b") as f:
                f.truncate(int(p["frac"] * size) if size else 0)
            log.append(f"{rel}: truncate to {int(p['frac'] * size)} of {size}")
        elif op == "extend":
            with open(path, "ab") as f:
                f.write(rng.integers(0, 256, p["count"], dtype=np.uint8).tobytes())
            log.append(f"{rel}: extend by {p['count']}")
        elif op == "flip bytes":
            if size:
                with open(path, "r+b") as f:
                    for _ in range(p["count"] % 8 + 1):
                        off = int(rng.integers(0, size))
                        f.seek(off)
                        b = f.read(1)
                        f.seek(off)
                        f.write(bytes([b[0] ^ int(rng.integers(1, 256))]))
            log.append(f"{rel}: flip bytes")
        elif op == "garbage":
            with open(path, "wb") as f:
                f.write(rng.integers(0, 256, p["count"] * 8, dtype=np.uint8).tobytes())
            log.append(f"{rel}: garbage")
        elif op == "deep nesting":
            with open(path, "w") as f:
                f.write("[" * 200_000 + "]" * 200_000)
            log.append(f"{rel}: deeply nested JSON")
        elif op == "not an object":
            with open(path, "w") as f:
                f.write(json.dumps(_JSON_JUNK[p["junk"]], allow_nan=True))
            log.append(f"{rel}: replaced by {_JSON_JUNK[p['junk']]!r:.60}")
        elif op == "empty":
            open(path, "wb").close()
            log.append(f"{rel}: emptied")
        elif op == "delete file":
            os.unlink(path)
            log.append(f"{rel}: deleted")
        elif op == "directory":
            if os.path.isfile(path):
                os.unlink(path)
            os.makedirs(path, exist_ok=True)
            log.append(f"{rel}: replaced by a directory")
        elif op == "symlink out":
            if os.path.lexists(path):
                os.unlink(path)
            os.symlink(outside, path)
            log.append(f"{rel}: symlink to a file outside the dataset")
    return log


def build_pristine(root: str) -> Dict[str, str]:
    """One small dataset of each kind, with segments (the ReplayBuffer one wrapped)."""
    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        d = os.path.join(root, "flat")
        st = FlattenedStorage.create(SPACE, PytorchTensorStorage, capacity=CAP, cache_path=d)
        batch = draw_fixed_batch(CAP)
        st.set(slice(None), batch)
        w = st.open_segment_writer()
        for i in range(3):
            w.append(st.get(i))
        w.commit(0)
        st.mark_segment_start(3)
        st.append(st.get(4))
        st.append(st.get(5))
        st.mark_segment_end()
        st.dumps(d)
        st.close()
        out["flat"] = d
        d = os.path.join(root, "pts")
        os.makedirs(d)
        p = PytorchTensorStorage.create(PTS_SPACE, capacity=CAP, cache_path=os.path.join(d, "data.memmap"))
        p.set(slice(None), torch.from_numpy(rows_for(list(range(CAP)), 0.0)))
        w = p.open_segment_writer()
        w.append(p.get(0))
        w.append(p.get(1))
        w.commit(4)
        p.flush()
        p.close()
        out["pts"] = d
        d = os.path.join(root, "rb")
        rb = ReplayBuffer.create(FlattenedStorage, SPACE, inner_storage_cls=PytorchTensorStorage, cache_path=d,
                                 capacity=CAP, is_memmap=True)
        for n in (4, 3, 2):
            for i in range(n):
                rb.append({k: (v[i] if not isinstance(v, dict) else {kk: vv[i] for kk, vv in v.items()})
                           for k, v in batch.items()})
            rb.mark_segment_end()
        rb.dumps()
        rb.close()
        out["rb"] = d
    return out


def open_and_use(kind: str, d: str, read_only: bool) -> List[str]:
    """Opens a (damaged) dataset and uses it; every call must succeed or fail cleanly. Returns notes."""
    notes: List[str] = []
    if kind == "rb":
        for name in ("is_loadable_from", "get_length_from_path", "get_capacity_from_path"):
            ok, r = attempt(f"ReplayBuffer.{name}", getattr(ReplayBuffer, name), d)
            if name == "is_loadable_from":
                assert ok and isinstance(r, bool), f"is_loadable_from must answer True/False, got {r!r}"
        attempt("ReplayBuffer.get_space_from_path", ReplayBuffer.get_space_from_path, d, backend=TB)
        ok, obj = attempt("ReplayBuffer.load_from", ReplayBuffer.load_from, d, backend=TB, read_only=read_only,
                          is_memmap=True)
    elif kind == "flat":
        ok, obj = attempt("FlattenedStorage.load_from", FlattenedStorage.load_from, d, SPACE, read_only=read_only)
    else:
        ok, obj = attempt("PytorchTensorStorage.load_from", PytorchTensorStorage.load_from,
                          os.path.join(d, "data.memmap"), PTS_SPACE, read_only=read_only)
    if not ok:
        notes.append(f"refused: {type(obj).__name__}: {obj!s:.100}")
        return notes
    try:
        n = len(obj)
        cap = obj.capacity
        assert cap is None or 0 <= n <= cap, f"opened with length {n} > capacity {cap}"
        get = obj.get_at if kind == "rb" else obj.get
        ok, segs = attempt("episode_segments", obj.episode_segments)
        attempt("get(all)", get, slice(None))
        if n:
            attempt("get(int)", get, n - 1)
            attempt("get(array)", get, np.arange(n)[::-1].copy())
        if ok and segs:
            for s, e in segs:
                if kind == "rb":
                    assert 0 <= s < e <= n, f"segment {(s, e)} outside the {n} rows"
                    attempt("get(segment)", get, slice(s, e))
                else:
                    assert 0 <= s < n and 0 <= e < n, f"segment {(s, e)} outside the {n} rows"
        if not read_only:
            if kind == "rb":
                attempt("extend", obj.extend, {k: (v[:1] if not isinstance(v, dict) else {kk: vv[:1] for kk, vv
                                                                                        in v.items()})
                                               for k, v in draw_fixed_batch(2).items()})
                attempt("dumps", obj.dumps)
            elif kind == "flat":
                attempt("set", obj.set, 0, {k: (v[0] if not isinstance(v, dict) else {kk: vv[0] for kk, vv in v.items()})
                                            for k, v in draw_fixed_batch(1).items()})
                attempt("flush", obj.flush)
            else:
                attempt("set", obj.set, 0, torch.zeros(3))
                attempt("flush", obj.flush)
        notes.append(f"opened: {n} rows, segments {segs if ok else 'error'}")
    finally:
        attempt("close", obj.close)
    return notes


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: Any) -> Dict[str, str]:
    return build_pristine(os.fspath(tmp_path_factory.mktemp("pristine")))


@pytest.mark.parametrize("kind", ["flat", "pts", "rb"])
def test_pristine_datasets_open(pristine: Dict[str, str], kind: str) -> None:
    """The undamaged datasets open and list their segments (the damage test starts from a sound state)."""
    notes = open_and_use(kind, pristine[kind], read_only=True)
    assert notes and notes[0].startswith("opened") and "[]" not in notes[0], notes


@pytest.mark.parametrize("kind", ["flat", "pts", "rb"])
def test_damaged_datasets_fail_cleanly(pristine: Dict[str, str], tmp_path: Any, soak: int, kind: str) -> None:
    src = pristine[kind]
    files = sorted(os.path.relpath(os.path.join(dp, f), src) for dp, _dn, fs in os.walk(src) for f in fs)
    outside = os.fspath(tmp_path / "outside.bin")
    with open(outside, "wb") as f:
        f.write(b"\x00" * 4096)
    counter = [0]

    @fuzz_settings(DAMAGE_EXAMPLES, soak)
    @given(steps=damage(files), read_only=hs.booleans())
    def run(steps: List[Tuple[str, str, Any]], read_only: bool) -> None:
        counter[0] += 1
        d = os.fspath(tmp_path / f"case{counter[0]}")
        shutil.copytree(src, d, symlinks=True)
        try:
            log = apply_damage(d, steps, outside)
            try:
                open_and_use(kind, d, read_only)
            except AssertionError as exc:
                raise AssertionError(f"{exc}\n  damage: {log}") from None
        finally:
            shutil.rmtree(d, ignore_errors=True)

    run()


# small junk pool for the every-field sweep (the full pool goes to top-level fields and to Hypothesis)
_SWEEP_JUNK = [None, "x", -1, 10 ** 30, 1.5, [], {}]
_RAW_DAMAGE = [("truncate", {"frac": 0.0}), ("truncate", {"frac": 0.5}), ("truncate", {"frac": 0.99}),
               ("flip bytes", {"count": 3}), ("garbage", {"count": 4}), ("deep nesting", {}), ("not an object", {}),
               ("empty", {}), ("delete file", {}), ("directory", {}), ("extend", {"count": 7}),
               ("symlink out", {})]


def damage_sweep_cases(src: str) -> Iterator[List[Tuple[str, str, Any]]]:
    """Every single-step damage worth trying on a pristine dataset, deterministically."""
    files = sorted(os.path.relpath(os.path.join(dp, f), src) for dp, _dn, fs in os.walk(src) for f in fs)
    base = {"seed": 1, "junk": 0, "frac": 0.5, "count": 3}
    for rel in files:
        for op, extra in _RAW_DAMAGE:
            if op in (JSON_DAMAGE if rel.endswith(".json") else DATA_DAMAGE):
                yield [(rel, op, {**base, **extra})]
        if not rel.endswith(".json"):
            continue
        with open(os.path.join(src, rel)) as f:
            obj = json.load(f)
        for path in json_paths(obj):
            for j, junk in enumerate(_JSON_JUNK):
                if junk in _SWEEP_JUNK or len(path) <= 1:   # the full pool on top-level fields
                    yield [(rel, "set field", {**base, "path": list(path), "junk": j})]
            if path:
                yield [(rel, "delete field", {**base, "path": list(path)})]


@pytest.mark.parametrize("kind", ["flat", "pts", "rb"])
def test_sweep_damaged_datasets(pristine: Dict[str, str], tmp_path: Any, kind: str) -> None:
    """Every single-step damage (each field of each metadata file set to junk or deleted, each file truncated,
    garbled, deleted, ...): opening and using the dataset fails cleanly or works. Reports every failure."""
    src = pristine[kind]
    outside = os.fspath(tmp_path / "outside.bin")
    with open(outside, "wb") as f:
        f.write(b"\x00" * 4096)
    failures: List[str] = []
    n = 0
    for i, steps in enumerate(damage_sweep_cases(src)):
        n += 1
        d = os.fspath(tmp_path / f"case{i}")
        shutil.copytree(src, d, symlinks=True)
        try:
            log = apply_damage(d, steps, outside)
            try:
                open_and_use(kind, d, read_only=i % 2 == 0)
            except AssertionError as exc:
                failures.append(f"{log}: {str(exc).splitlines()[0][:220]}")
        finally:
            shutil.rmtree(d, ignore_errors=True)
    assert not failures, f"{len(failures)} of {n} damaged datasets were mishandled:\n" + "\n".join(failures[:40])
