"""The Ray Data datasource (`read_unienv`) over real datasets on disk, read by the session's local Ray cluster.

Every dataset is written with the library (replay buffers over FlattenedStorage, the native layout with an image leaf,
ImageStorage, HDF5, bare storages) from data kept in the test, and what Ray returns is compared with it: column
dtypes and shapes, bytes, episode ids and boundaries, which episodes a wrapped ring still holds, how the rows split
into blocks, and the errors for open episodes, missing, damaged and changed datasets.
"""
from __future__ import annotations

import os
import shutil
from typing import Any, Dict, Iterator, List, Sequence

import numpy as np
import pytest

pytestmark = [pytest.mark.ray, pytest.mark.xdist_group("ray")]

ray = pytest.importorskip("ray")
torch = pytest.importorskip("torch")

from unienv_data.base.errors import StorageFormatError, StorageStateError  # noqa: E402
from unienv_data.integrations.ray._datasource_plan import Run, split_runs  # noqa: E402
from unienv_data.integrations.ray.datasource import UnienvDatasource, default_num_blocks, read_unienv  # noqa: E402
from unienv_data.replay_buffer import ReplayBuffer  # noqa: E402
from unienv_data.storages.dict_storage import DictStorage  # noqa: E402
from unienv_data.storages.flattened import FlattenedStorage  # noqa: E402
from unienv_data.storages.hdf5 import HDF5Storage  # noqa: E402
from unienv_data.storages.image_storage import ImageStorage  # noqa: E402
from unienv_data.storages.native_layout import native_layout_kwargs  # noqa: E402
from unienv_data.storages.numpy_memmap import NumpyMemmapStorage  # noqa: E402
from unienv_interface.backends import NumpyComputeBackend as NB  # noqa: E402
from unienv_interface.backends.pytorch import PyTorchComputeBackend as TB  # noqa: E402
from unienv_interface.space import BinarySpace, BoxSpace, DictSpace  # noqa: E402

META = ("episode_id", "step", "episode_start", "episode_end", "index")


@pytest.fixture(autouse=True)
def _quiet_ray_data(ray_cluster: Any) -> Iterator[None]:
    ctx = ray.data.DataContext.get_current()
    old = ctx.enable_progress_bars, ctx.print_on_execution_start
    ctx.enable_progress_bars = False
    ctx.print_on_execution_start = False
    yield
    ctx.enable_progress_bars, ctx.print_on_execution_start = old


# ------------------------------------------------------------------------------------------------ data and datasets
def flat_space() -> DictSpace:
    """All float32, so a FlattenedStorage row keeps every leaf's dtype."""
    return DictSpace(NB, {
        "obs": DictSpace(NB, {"joint": BoxSpace(NB, -10.0, 10.0, np.float32, shape=(5,)),
                              "pose": BoxSpace(NB, -10.0, 10.0, np.float32, shape=(2, 3))}),
        "reward": BoxSpace(NB, -10.0, 10.0, np.float32, shape=()),
    })


def flat_episode(rng: np.random.Generator, n: int) -> Dict[str, np.ndarray]:
    return {"obs/joint": rng.uniform(-10, 10, (n, 5)).astype(np.float32),
            "obs/pose": rng.uniform(-10, 10, (n, 2, 3)).astype(np.float32),
            "reward": rng.uniform(-10, 10, n).astype(np.float32)}


def nested(flat: Dict[str, Any], i: int) -> Dict[str, Any]:
    """Row `i` of `{"a/b": array}` as the nested sample the space takes."""
    out: Dict[str, Any] = {}
    for key, arr in flat.items():
        parts = key.split("/")
        d = out
        for p in parts[:-1]:
            d = d.setdefault(p, {})
        d[parts[-1]] = arr[i]
    return out


def commit(rb: ReplayBuffer, episode: Dict[str, np.ndarray], convert: Any = None) -> None:
    w = rb.open_segment_writer()
    n = len(next(iter(episode.values())))
    for i in range(n):
        row = nested(episode, i)
        w.append(convert(row) if convert else row)
    rb.commit_segment(w)


def flat_buffer(path: str, capacity: int) -> ReplayBuffer:
    return ReplayBuffer.create(FlattenedStorage, flat_space(), inner_storage_cls=NumpyMemmapStorage,
                               cache_path=path, capacity=capacity, is_memmap=True)


def collect(ds: Any) -> Dict[str, np.ndarray]:
    """Every row of a Ray dataset as `{column: array}` in logical order (sorted by the `index` column)."""
    parts: Dict[str, List[np.ndarray]] = {}
    for batch in ds.iter_batches(batch_size=None, batch_format="numpy"):
        for k, v in batch.items():
            parts.setdefault(k, []).append(v)
    if not parts:
        return {}
    out = {k: np.concatenate(v) for k, v in parts.items()}
    order = np.argsort(out["index" if "index" in out else "_index"], kind="stable")
    return {k: v[order] for k, v in out.items()}


def expected_meta(lengths: Sequence[int], first_index: int = 0) -> Dict[str, np.ndarray]:
    ids = np.concatenate([np.full(n, e) for e, n in enumerate(lengths)])
    step = np.concatenate([np.arange(n) for n in lengths])
    ends = np.concatenate([np.arange(n) == n - 1 for n in lengths])
    return {"episode_id": ids, "step": step, "episode_start": step == 0, "episode_end": ends,
            "index": np.arange(first_index, first_index + sum(lengths))}


def assert_same(got: Dict[str, np.ndarray], want: Dict[str, np.ndarray]) -> None:
    for k, w in want.items():
        g = got[k]
        assert g.dtype == w.dtype, (k, g.dtype, w.dtype)
        assert g.shape == w.shape, (k, g.shape, w.shape)
        assert g.tobytes() == w.tobytes(), k


def concat(episodes: Sequence[Dict[str, np.ndarray]]) -> Dict[str, np.ndarray]:
    return {k: np.concatenate([e[k] for e in episodes]) for k in episodes[0]}


# ------------------------------------------------------------------------------------------------ columns and bytes
def test_flat_buffer_columns_dtypes_shapes_and_bytes(tmp_path: Any) -> None:
    rng = np.random.default_rng(0)
    lengths = [7, 1, 12, 5, 9]
    episodes = [flat_episode(rng, n) for n in lengths]
    rb = flat_buffer(str(tmp_path / "rb"), 64)
    for e in episodes:
        commit(rb, e)
    rb.dumps()
    rb.close()

    ds = read_unienv(tmp_path / "rb", override_num_blocks=2)
    schema = ds.schema()
    assert list(schema.names) == list(META) + ["obs/joint", "obs/pose", "reward"]
    got = collect(ds)
    assert_same(got, {**expected_meta(lengths), **concat(episodes)})
    assert got["obs/pose"].shape == (sum(lengths), 2, 3) and got["obs/pose"].dtype == np.float32
    # typed tensor columns in the blocks themselves, not pickled objects
    block = ray.get(ds.to_arrow_refs()[0], timeout=60)
    assert "tensor" in type(block.schema.field("obs/pose").type).__name__.lower()
    assert str(block.schema.field("reward").type) == "float"


def test_native_layout_with_image_leaf_on_torch(tmp_path: Any) -> None:
    space = DictSpace(TB, {
        "image": BoxSpace(TB, 0, 255, torch.uint8, shape=(8, 6, 3)),
        "state": BoxSpace(TB, -5.0, 5.0, torch.float32, shape=(4,)),
        "count": BoxSpace(TB, 0, 1 << 40, torch.int64, shape=()),
        "done": BinarySpace(TB, ()),
    })
    rng = np.random.default_rng(1)
    lengths = [6, 3, 8]
    episodes = [{"image": rng.integers(0, 256, (n, 8, 6, 3), dtype=np.uint8),
                 "state": rng.uniform(-5, 5, (n, 4)).astype(np.float32),
                 "count": rng.integers(0, 1 << 40, n, dtype=np.int64),
                 "done": np.arange(n) == n - 1} for n in lengths]
    rb = ReplayBuffer.create(DictStorage, space, cache_path=str(tmp_path / "rb"), capacity=32,
                             **native_layout_kwargs(space))
    for e in episodes:
        commit(rb, e, lambda row: {k: torch.from_numpy(np.asarray(v)) for k, v in row.items()})
    rb.dumps()
    rb.close()

    got = collect(read_unienv(tmp_path / "rb", override_num_blocks=3))
    assert_same(got, {**expected_meta(lengths), **concat(episodes)})
    # a subset of columns reads only those (and the bookkeeping)
    sub = collect(read_unienv(tmp_path / "rb", columns=["done", "image"], override_num_blocks=1))
    assert set(sub) == set(META) | {"done", "image"}
    assert_same(sub, {"image": concat(episodes)["image"], "done": concat(episodes)["done"]})


def test_image_storage_png_and_single_leaf_space(tmp_path: Any) -> None:
    space = BoxSpace(NB, 0, 255, np.uint8, shape=(5, 4, 3))
    rng = np.random.default_rng(2)
    frames = [rng.integers(0, 256, (n, 5, 4, 3), dtype=np.uint8) for n in (4, 2, 5)]
    rb = ReplayBuffer.create(ImageStorage, space, cache_path=str(tmp_path / "rb"), capacity=20)
    for ep in frames:
        w = rb.open_segment_writer()
        for f in ep:
            w.append(f)
        rb.commit_segment(w)
    rb.dumps()
    rb.close()
    got = collect(read_unienv(tmp_path / "rb", override_num_blocks=2))
    assert_same(got, {**expected_meta([4, 2, 5]), "value": np.concatenate(frames)})


def test_lossless_video_leaf_and_bfloat16_refused(tmp_path: Any) -> None:
    space = DictSpace(NB, {"image": BoxSpace(NB, 0, 255, np.uint8, shape=(16, 16, 3)),
                           "x": BoxSpace(NB, -1.0, 1.0, np.float32, shape=(2,))})
    rng = np.random.default_rng(10)
    episodes = [{"image": rng.integers(0, 256, (n, 16, 16, 3), dtype=np.uint8),
                 "x": rng.uniform(-1, 1, (n, 2)).astype(np.float32)} for n in (5, 3)]
    rb = ReplayBuffer.create(DictStorage, space, cache_path=str(tmp_path / "rb"), capacity=16,
                             **native_layout_kwargs(space, image_storage="video", video_kwargs={"lossless": True}))
    for e in episodes:
        commit(rb, e)
    rb.dumps()
    rb.close()
    assert_same(collect(read_unienv(tmp_path / "rb", override_num_blocks=2)),
                {**expected_meta([5, 3]), **concat(episodes)})

    bf = DictSpace(TB, {"w": BoxSpace(TB, -1.0, 1.0, torch.bfloat16, shape=(2,))})
    rb = ReplayBuffer.create(DictStorage, bf, cache_path=str(tmp_path / "bf"), capacity=4,
                             **native_layout_kwargs(bf))
    rb.dumps()
    rb.close()
    with pytest.raises(TypeError, match="bfloat16"):
        read_unienv(tmp_path / "bf")


def test_hdf5_buffer(tmp_path: Any) -> None:
    rng = np.random.default_rng(3)
    episodes = [flat_episode(rng, n) for n in (3, 6)]
    rb = ReplayBuffer.create(HDF5Storage, flat_space(), cache_path=str(tmp_path / "rb"), capacity=16)
    for e in episodes:
        commit(rb, e)
    rb.dumps()
    rb.close()
    assert_same(collect(read_unienv(tmp_path / "rb")), {**expected_meta([3, 6]), **concat(episodes)})


# ------------------------------------------------------------------------------------------------ rings and episodes
def test_wrapped_ring_reads_surviving_episodes_oldest_first(tmp_path: Any) -> None:
    rng = np.random.default_rng(4)
    cap = 40
    lengths = [9, 14, 6, 8, 13, 7, 10]              # 67 rows into 40: the ring wraps, and episode 4 wraps with it
    episodes = [flat_episode(rng, n) for n in lengths]
    rb = flat_buffer(str(tmp_path / "rb"), cap)
    for e in episodes:
        commit(rb, e)
    # an episode survives when it and everything committed after it fit in the ring
    survivors = [i for i in range(len(lengths)) if sum(lengths[i:]) <= cap]
    assert survivors == [3, 4, 5, 6]
    # the overwritten episode keeps its last rows as a clipped segment (unienv 0.0.1b16's rule); make them rows of
    # no segment, as rows written by extend are, to read them as the unsegmented rows below
    rb.storage.forget_segments(int(rb.index_with_offset(0)), cap - sum(lengths[3:]))
    rb.dumps()
    first = rb.episode_segments()[0][0]            # rows of the overwritten episode's tail come first, in no episode
    physical = [int(rb.index_with_offset(s)) for s, _ in rb.episode_segments()]
    assert any(p + n > cap for p, n in zip(physical, [lengths[i] for i in survivors])), "no episode wraps the ring"
    rb.close()

    want = concat([episodes[i] for i in survivors])
    got = collect(read_unienv(tmp_path / "rb", override_num_blocks=3))
    assert_same(got, {**expected_meta([lengths[i] for i in survivors], first), **want})

    # the leftover rows of the overwritten episode only with include_unsegmented, as episode -1
    every = collect(read_unienv(tmp_path / "rb", include_unsegmented=True, override_num_blocks=2))
    assert len(every["index"]) == cap and np.array_equal(every["index"], np.arange(cap))
    stale = every["episode_id"] == -1
    assert stale.sum() == first and not every["episode_start"][stale].any() and (every["step"][stale] == -1).all()
    assert_same({k: v[~stale] for k, v in every.items()}, want)


def test_bare_storage_directory_with_a_wrapping_segment(tmp_path: Any) -> None:
    rng = np.random.default_rng(5)
    path = str(tmp_path / "flat")
    st = FlattenedStorage.create(flat_space(), NumpyMemmapStorage, capacity=12, cache_path=path, is_memmap=True)
    a, b = flat_episode(rng, 5), flat_episode(rng, 6)
    for start, ep in ((2, a), (9, b)):          # b occupies rows 9, 10, 11, 0, 1, 2 (and clips a, which used row 2)
        w = st.open_segment_writer()
        for i in range(len(ep["reward"])):
            w.append(nested(ep, i))
        w.commit(start)
    c = flat_episode(rng, 4)
    w = st.open_segment_writer()
    for i in range(4):
        w.append(nested(c, i))
    w.commit(4)                                 # rows 4..7
    st.forget_segments(3, 1)    # what is left of a (row 3, clipped as unienv 0.0.1b16 does) belongs to no episode
    st.dumps(path)
    st.close()
    got = collect(read_unienv(path, override_num_blocks=2))
    # a bare storage is read from the start of the segment that wraps: b first (logical rows 0..5), row 3 (logical
    # 6) belongs to no episode, then c (logical 7..10)
    want = {**expected_meta([6, 4]), **concat([b, c])}
    want["index"] = np.array([0, 1, 2, 3, 4, 5, 7, 8, 9, 10])
    assert_same(got, want)


def test_open_and_uncommitted_episodes_are_not_read(tmp_path: Any) -> None:
    rng = np.random.default_rng(6)
    done = flat_episode(rng, 5)
    rb = flat_buffer(str(tmp_path / "rb"), 32)
    commit(rb, done)
    writer = rb.open_segment_writer()               # an episode in a writer, never committed
    pending = flat_episode(rng, 4)
    for i in range(4):
        writer.append(nested(pending, i))
    open_ep = flat_episode(rng, 3)                  # an append-built episode still open when the metadata is written
    for i in range(3):
        rb.append(nested(open_ep, i))
    rb.dumps()
    assert len(rb) == 8
    writer.abort()
    rb.close()

    got = collect(read_unienv(tmp_path / "rb"))
    assert_same(got, {**expected_meta([5]), **done})
    every = collect(read_unienv(tmp_path / "rb", include_unsegmented=True))
    assert list(every["episode_id"]) == [0] * 5 + [-1] * 3
    assert_same({k: v[5:] for k, v in every.items() if k in open_ep}, open_ep)


def test_empty_dataset_has_schema_and_no_rows(tmp_path: Any) -> None:
    rb = flat_buffer(str(tmp_path / "rb"), 16)
    rb.dumps()
    rb.close()
    ds = read_unienv(tmp_path / "rb", override_num_blocks=4)
    assert ds.count() == 0
    assert list(ds.schema().names) == list(META) + ["obs/joint", "obs/pose", "reward"]
    assert collect(ds) == {}


# ------------------------------------------------------------------------------------------------ splitting
def test_split_runs_is_balanced_contiguous_and_never_splits_a_run() -> None:
    rng = np.random.default_rng(7)
    lengths = rng.integers(1, 60, 50)
    runs = [Run(i, int(s), int(s), int(n)) for i, (s, n) in enumerate(zip(np.cumsum(lengths) - lengths, lengths))]
    for parts in (1, 2, 3, 7, 49, 50, 51, 200):
        groups = split_runs(runs, parts)
        assert len(groups) == min(parts, len(runs)) and all(groups)
        assert [r for g in groups for r in g] == runs
        if parts <= 7:
            sizes = [sum(r.length for r in g) for g in groups]
            assert max(sizes) - min(sizes) <= 2 * int(lengths.max()), sizes
    with pytest.raises(ValueError, match="parts"):
        split_runs(runs, 0)


def test_blocks_hold_whole_episodes_and_cover_every_row_once(tmp_path: Any) -> None:
    rng = np.random.default_rng(8)
    lengths = [int(n) for n in rng.integers(1, 30, 40)]
    rb = flat_buffer(str(tmp_path / "rb"), 2000)
    for n in lengths:
        commit(rb, flat_episode(rng, n))
    rb.dumps()
    rb.close()
    for n_blocks in (1, 3, 8):
        ds = read_unienv(tmp_path / "rb", override_num_blocks=n_blocks).materialize()
        blocks = [ray.get(ref, timeout=60) for ref in ds.to_arrow_refs()]
        blocks = [b for b in blocks if b.num_rows]
        assert len(blocks) == n_blocks
        seen = []
        for block in blocks:
            ids = block.column("episode_id").to_numpy()
            steps = block.column("step").to_numpy()
            for e in np.unique(ids):
                assert np.array_equal(np.sort(steps[ids == e]), np.arange(lengths[e])), (n_blocks, e)
            seen.append(block.column("index").to_numpy())
        assert np.array_equal(np.sort(np.concatenate(seen)), np.arange(sum(lengths)))

    # more blocks than episodes: padded with empty tasks, so Ray does not cut episodes to make up the number
    source = UnienvDatasource(tmp_path / "rb")
    tasks = source.get_read_tasks(100)
    assert len(tasks) == 100 and sum(t.metadata.num_rows for t in tasks) == sum(lengths)
    assert sum(1 for t in tasks if t.metadata.num_rows) == 40
    got = collect(read_unienv(tmp_path / "rb", override_num_blocks=60))
    assert np.array_equal(got["episode_id"], expected_meta(lengths)["episode_id"])
    assert source.supports_distributed_reads and not UnienvDatasource(tmp_path / "rb",
                                                                      local_only=True).supports_distributed_reads


def test_default_number_of_blocks() -> None:
    mib = 1 << 20
    assert default_num_blocks(500 * mib, cpus=2, runs=1000) == 4              # one per 128 MiB at least
    assert default_num_blocks(100 * mib, cpus=2, runs=1000) == 2              # one per CPU
    assert default_num_blocks(3 * mib, cpus=8, runs=1000) == 3                # blocks of at least 1 MiB
    assert default_num_blocks(40 * mib, cpus=8, runs=1000, copy_only=True) == 2   # 16 MiB for plain arrays
    assert default_num_blocks(10 * mib, cpus=8, runs=1000, copy_only=True) == 1
    assert default_num_blocks(500 * mib, cpus=8, runs=5) == 5                 # no more than the episodes
    assert default_num_blocks(10_000 * mib, cpus=2, runs=10) == 79            # blocks of at most 128 MiB
    assert default_num_blocks(0, cpus=4, runs=0) == 1


def test_blocks_are_typed_like_rays_own_conversion() -> None:
    """The datasource builds its Arrow blocks itself (Ray's `batch_to_block` infers each 1-D column's type from its
    values, slowly); the result must be what Ray would have made, for every dtype a leaf can have."""
    from ray.data.block import BlockAccessor
    from unienv_data.integrations.ray._datasource_plan import ColumnSpec, ReadPlan
    from unienv_data.integrations.ray.datasource import _to_block
    rng = np.random.default_rng(11)
    batch = {"f32": rng.standard_normal((6, 2, 3), dtype=np.float32), "f16": np.arange(6, dtype=np.float16),
             "flags": rng.integers(0, 2, (6, 4)).astype(bool), "done": np.arange(6) % 2 == 0,
             "u64": np.arange(6, dtype=np.uint64), "i8": rng.integers(-9, 9, (6, 5), dtype=np.int8),
             "strided": rng.standard_normal((6, 10), dtype=np.float32)[:, ::3]}
    specs = tuple(ColumnSpec(k, k, str(v.dtype), v.shape[1:], v[0].nbytes) for k, v in batch.items())
    plan = ReadPlan(path="x", backend="numpy", kind="x", capacity=None, length=6, columns=specs, meta_names=(),
                    runs=(), unsegmented_rows=0)
    mine, theirs = _to_block(plan, batch), BlockAccessor.batch_to_block(batch)
    assert mine.schema == theirs.schema
    for k, v in batch.items():
        assert_same({k: BlockAccessor.for_block(mine).to_numpy(k)}, {k: np.ascontiguousarray(v)})


def test_plan_knows_which_datasets_only_copy(tmp_path: Any) -> None:
    """Array storages (memmap, flattened) are read by a copy and get larger default blocks; image files decode."""
    rb = flat_buffer(str(tmp_path / "flat"), 8)
    rb.dumps()
    rb.close()
    assert UnienvDatasource(tmp_path / "flat").plan.copy_only
    space = DictSpace(NB, {"image": BoxSpace(NB, 0, 255, np.uint8, shape=(4, 4, 3)),
                           "x": BoxSpace(NB, -1.0, 1.0, np.float32, shape=(2,))})
    kwargs = native_layout_kwargs(space)
    kwargs["storage_cls_map"]["image"] = ImageStorage
    rb = ReplayBuffer.create(DictStorage, space, cache_path=str(tmp_path / "png"), capacity=8, **kwargs)
    rb.dumps()
    rb.close()
    assert not UnienvDatasource(tmp_path / "png").plan.copy_only
    assert UnienvDatasource(tmp_path / "png", columns=["x"]).plan.copy_only


# ------------------------------------------------------------------------------------------------ errors
def test_missing_damaged_and_changed_datasets_raise_clear_errors(tmp_path: Any) -> None:
    with pytest.raises(FileNotFoundError, match="no such file"):
        read_unienv(tmp_path / "nope")
    os.makedirs(tmp_path / "empty")
    with pytest.raises(StorageFormatError, match="no dataset metadata"):
        read_unienv(tmp_path / "empty")

    rng = np.random.default_rng(9)
    rb = flat_buffer(str(tmp_path / "rb"), 32)
    for n in (4, 5):
        commit(rb, flat_episode(rng, n))
    rb.dumps()
    rb.close()
    with pytest.raises(KeyError, match="nope"):
        read_unienv(tmp_path / "rb", columns=["nope"])

    damaged = tmp_path / "damaged"
    shutil.copytree(tmp_path / "rb", damaged)
    (damaged / "metadata.json").write_text('{"type": "ReplayBuffer", "count": ')
    with pytest.raises(StorageFormatError, match="metadata"):
        read_unienv(damaged)
    truncated = tmp_path / "truncated"
    shutil.copytree(tmp_path / "rb", truncated)
    data = [os.path.join(d, f) for d, _, fs in os.walk(truncated) for f in fs if f.endswith(".memmap")]
    assert data
    with open(data[0], "r+b") as f:
        f.truncate(16)
    with pytest.raises(StorageFormatError, match="truncated"):
        read_unienv(truncated)

    # planned, then the buffer is written over before the read runs: the task refuses rows it was not planned for
    ds = read_unienv(tmp_path / "rb", override_num_blocks=1)
    rb = ReplayBuffer.load_from(tmp_path / "rb", backend=NB, read_only=False, is_memmap=True)
    commit(rb, flat_episode(rng, 30))                # 39 rows into 32: both planned episodes are overwritten
    rb.dumps()
    rb.close()
    with pytest.raises(StorageStateError, match="no longer recorded"):     # Ray's task error subclasses it
        ds.materialize()


def test_bookkeeping_names_can_be_prefixed(tmp_path: Any) -> None:
    space = DictSpace(NB, {"step": BoxSpace(NB, 0.0, 1e6, np.float32, shape=()),
                           "x": BoxSpace(NB, -1.0, 1.0, np.float32, shape=(2,))})
    rb = ReplayBuffer.create(FlattenedStorage, space, inner_storage_cls=NumpyMemmapStorage,
                             cache_path=str(tmp_path / "rb"), capacity=8, is_memmap=True)
    w = rb.open_segment_writer()
    for i in range(3):
        w.append({"step": np.float32(10 + i), "x": np.zeros(2, np.float32)})
    rb.commit_segment(w)
    rb.dumps()
    rb.close()
    with pytest.raises(ValueError, match="meta_prefix"):
        read_unienv(tmp_path / "rb")
    got = collect(read_unienv(tmp_path / "rb", meta_prefix="_"))
    assert list(got["step"]) == [10.0, 11.0, 12.0] and list(got["_step"]) == [0, 1, 2]
