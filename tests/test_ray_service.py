"""The Ray replay-buffer service on the session's loopback-only local cluster: round trips, whole episodes only when a
collector dies mid-episode, no committed episode lost when the buffer actor dies and restarts, client-side checks,
shard adoption, prefetching samplers, timeouts."""
from __future__ import annotations

import os
import pickle
import time
import warnings
from typing import Any, Dict, List

import numpy as np
import pytest

from unienv_data.base.errors import BoundsWarning

from unienv_interface.backends import NumpyComputeBackend as B
from unienv_interface.space import BinarySpace, BoxSpace, DictSpace

pytestmark = [pytest.mark.ray, pytest.mark.xdist_group("ray")]

TIMEOUT = 60.0


def make_space() -> DictSpace:
    return DictSpace(B, {
        "obs": BoxSpace(B, -1e6, 1e6, np.float32, shape=(4,)),
        "act": BoxSpace(B, -1, 100, np.int16, shape=(2,)),
        "img": BoxSpace(B, 0, 255, np.uint8, shape=(8, 8, 3)),
        "done": BinarySpace(B, ()),
    })


def episode(eid: int, length: int) -> Dict[str, np.ndarray]:
    """Steps of episode `eid`: obs = (eid, t, eid * 1000 + t, 0.5), act = (t % 100, eid % 100), a patterned image."""
    t = np.arange(length)
    rng = np.random.default_rng(eid)
    return {"obs": np.stack([np.full(length, eid), t, eid * 1000 + t, np.full(length, 0.5)], 1).astype(np.float32),
            "act": np.stack([t % 100, np.full(length, eid % 100)], 1).astype(np.int16),
            "img": rng.integers(0, 256, (length, 8, 8, 3), dtype=np.uint8),
            "done": t == length - 1}


def steps_of(batch: Dict[str, np.ndarray]) -> List[Dict[str, np.ndarray]]:
    n = len(batch["done"])
    return [{k: v[i] for k, v in batch.items()} for i in range(n)]


def assert_same(a: Dict[str, np.ndarray], b: Dict[str, np.ndarray]) -> None:
    assert sorted(a) == sorted(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
        assert a[k].tobytes() == b[k].tobytes(), k


def kill_and_wait_restart(ray: Any, client: Any) -> Dict[str, Any]:
    """Kills the service actor as a crash would (Ray restarts it) and waits until the new incarnation answers."""
    pid = client.info()["pid"]
    ray.kill(client.actor, no_restart=False)
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        try:
            info = client.info()
        except ray.exceptions.RayActorError:          # calls that meet the dying incarnation fail
            time.sleep(0.05)
            continue
        if info["pid"] != pid:
            return info
        time.sleep(0.05)
    raise AssertionError("the buffer actor did not come back")


@pytest.fixture(scope="module", autouse=True)
def _ship_this_module_by_value(ray_cluster: Any) -> None:
    """Remote functions defined here use this module's helpers; Ray's workers cannot import a test module, so
    cloudpickle sends it by value."""
    import sys

    ray_cluster.cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture()
def service(ray_cluster: Any, tmp_path: Any) -> Any:
    from unienv_data.integrations.ray import start_buffer_service

    client = start_buffer_service(str(tmp_path / "buffer"), make_space(), capacity=2_000, timeout_s=TIMEOUT)
    yield client
    try:
        client.shutdown()
    except Exception:       # a test may have ended the actor already
        pass


def test_round_trip_builder_batches_and_samples(service: Any) -> None:
    lengths = [5, 9, 3]
    builder = service.episode_builder()
    for eid, n in enumerate(lengths[:2]):
        for step in steps_of(episode(eid, n)):
            builder.append(step)
        builder.end_episode()
    assert builder.committed_rows == 14 and builder.committed_episodes == 2
    assert service.commit([episode(2, 3), episode(3, 7)]) == 24           # two episodes, one call
    assert len(service) == 24
    assert service.segments() == [(0, 5), (5, 14), (14, 17), (17, 24)]
    rows = service.read(0, 24)
    expected = {k: np.concatenate([episode(e, n)[k] for e, n in enumerate(lengths + [7])]) for k in rows}
    assert_same(rows, expected)

    sampler = service.sampler(6, prefetch=2, batches_per_call=3, seed=1)
    for _ in range(7):                                                    # crosses block boundaries
        batch = sampler.sample()
        assert batch["obs"].shape == (6, 4) and batch["img"].shape == (6, 8, 8, 3) and batch["act"].dtype == np.int16
        eid, t = batch["obs"][:, 0].astype(int), batch["obs"][:, 1].astype(int)
        assert (batch["obs"][:, 2] == eid * 1000 + t).all()              # whole committed rows
        assert (batch["act"][:, 1] == eid).all()
    again = service.sampler(6, prefetch=1, batches_per_call=3, seed=1)
    first = service.sampler(6, prefetch=3, batches_per_call=3, seed=1).sample()
    assert_same(again.sample(), first)                                   # seeded: reproducible
    sampler.close()
    assert service.sample(5)["done"].shape == (5,)


def test_client_pickles_into_collector_tasks(ray_cluster: Any, service: Any) -> None:
    ray = ray_cluster

    @ray.remote(num_cpus=0)
    def collect(client: Any, first: int, n_episodes: int) -> int:
        builder = client.episode_builder(episodes_per_call=2, max_in_flight=1)
        for eid in range(first, first + n_episodes):
            for step in steps_of(episode(eid, 4 + eid % 3)):
                builder.append(step)
            builder.end_episode()
        builder.flush()
        return builder.committed_rows

    restored = pickle.loads(pickle.dumps(service))
    assert restored.space_json == service.space_json
    refs = [collect.remote(service, 0, 5), collect.remote(service, 100, 4)]
    rows = ray.get(refs, timeout=TIMEOUT)
    assert len(service) == sum(rows)
    segs = service.segments()
    assert len(segs) == 9 and sum(e - s for s, e in segs) == sum(rows)
    data = service.read(0, len(service))
    for s, e in segs:                                                   # every episode whole and contiguous
        eid = int(data["obs"][s, 0])
        assert_same({k: v[s:e] for k, v in data.items()}, episode(eid, 4 + eid % 3))


def test_bad_input_is_refused_at_the_client(service: Any) -> None:
    builder = service.episode_builder()
    good = steps_of(episode(0, 2))[0]
    before = service.info()
    with pytest.raises(KeyError, match="missing \\['done'\\]"):
        builder.append({k: v for k, v in good.items() if k != "done"})
    with pytest.raises(KeyError, match="unexpected \\['extra'\\]"):
        builder.append({**good, "extra": np.zeros(1)})
    with pytest.raises(ValueError, match="'obs': expected shape \\(4,\\), got \\(5,\\)"):
        builder.append({**good, "obs": np.zeros(5, np.float32)})
    with pytest.raises(ValueError, match="'act'.*0.5"):
        builder.append({**good, "act": np.array([0.5, 1.0])})           # a cast that changes a value
    with pytest.raises(TypeError, match="'img'"):
        builder.append({**good, "img": "not an image"})
    assert len(builder) == 0                                             # refused steps add nothing
    builder.append({**good, "act": np.array([1, 2], np.int64)})          # lossless casts pass
    builder.append({**good, "act": np.array([101, 0], np.int16)})        # out of bounds: caught at the end,
    with warnings.catch_warnings():                                      # refused in the refusal mode
        warnings.simplefilter("error", BoundsWarning)
        with pytest.raises(ValueError, match="'act'.*101.*outside"):
            builder.end_episode()
    builder.abort_episode()
    with pytest.raises(ValueError, match="no steps"):
        builder.end_episode()
    bad = episode(1, 3)
    bad["img"] = bad["img"][:2]
    with pytest.raises(ValueError, match="'img' has 2 steps"):
        service.commit(bad)
    with pytest.raises(ValueError, match="expected shape"):
        service.commit({**episode(1, 3), "obs": np.zeros((3, 2), np.float32)})
    after = service.info()
    assert after["commits"] == before["commits"] and after["length"] == 0   # nothing reached the actor


def test_actor_side_checks_and_open_errors(ray_cluster: Any, service: Any, tmp_path: Any) -> None:
    ray = ray_cluster
    from unienv_data.integrations.ray import start_buffer_service

    with pytest.raises(ray.exceptions.RayTaskError, match="declared 5 steps, holds 3"):
        service.get(service.actor.commit.remote([(episode(0, 3), 5)]))   # bypassing the client: checked there too
    assert len(service) == 0
    other = DictSpace(B, {"x": BoxSpace(B, 0.0, 1.0, np.float32, shape=(1,))})
    with pytest.raises(ValueError, match="stores another space"):
        start_buffer_service(service.info()["directory"], other, timeout_s=TIMEOUT)
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "file.txt").write_text("x")
    with pytest.raises(FileExistsError, match="holds no replay buffer"):
        start_buffer_service(str(tmp_path / "junk"), other, capacity=4, timeout_s=TIMEOUT)
    with pytest.raises(ValueError, match="capacity"):
        start_buffer_service(str(tmp_path / "new"), other, capacity=0)


def test_killed_collector_leaves_only_whole_episodes(ray_cluster: Any, service: Any) -> None:
    ray = ray_cluster
    length = 7

    @ray.remote(num_cpus=0, max_restarts=0)
    class Collector:
        def run(self, client: Any) -> None:          # commits episodes forever, until it is killed
            builder = client.episode_builder()
            eid = 0
            while True:
                for step in steps_of(episode(eid, length)):
                    builder.append(step)
                    time.sleep(0.0005)
                builder.end_episode()
                eid += 1

    collector = Collector.remote()
    running = collector.run.remote(service)
    deadline = time.monotonic() + TIMEOUT
    while len(service) < 4 * length:
        assert time.monotonic() < deadline, "the collector committed nothing"
        time.sleep(0.01)
    time.sleep(0.003)                                   # most likely mid-episode now
    ray.kill(collector)
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(running, timeout=TIMEOUT)               # it is dead now
    time.sleep(0.2)                                     # a commit it had sent may still land, whole
    segs = service.segments()
    n = len(service)
    assert n % length == 0 and sum(e - s for s, e in segs) == n
    data = service.read(0, n)
    for i, (s, e) in enumerate(segs):
        assert (s, e) == (i * length, (i + 1) * length)
        assert_same({k: v[s:e] for k, v in data.items()}, episode(i, length))
    time.sleep(0.05)
    assert len(service) == n                             # nothing trickles in after the kill


def test_restarted_buffer_actor_keeps_every_committed_episode(ray_cluster: Any, service: Any) -> None:
    ray = ray_cluster
    lengths = [3, 8, 1, 5, 13]
    builder = service.episode_builder(episodes_per_call=2)
    for eid, n in enumerate(lengths):
        for step in steps_of(episode(eid, n)):
            builder.append(step)
        builder.end_episode()
    builder.flush()
    committed = {k: np.concatenate([episode(e, n)[k] for e, n in enumerate(lengths)]) for k in episode(0, 1)}
    info = kill_and_wait_restart(ray, service)           # a crash: Ray restarts the actor from its directory
    assert info["reopened"] and info["commits"] == 0
    assert len(service) == sum(lengths) == builder.committed_rows
    assert service.segments() == [(0, 3), (3, 11), (11, 12), (12, 17), (17, 30)]
    assert_same(service.read(0, sum(lengths)), committed)  # byte-identical
    service.commit(episode(9, 2))                         # and it goes on
    assert len(service) == sum(lengths) + 2
    assert service.sample(4)["obs"].shape == (4, 4)


def test_sampler_survives_an_actor_restart(ray_cluster: Any, service: Any) -> None:
    ray = ray_cluster
    service.commit(episode(0, 10))
    sampler = service.sampler(4, prefetch=3, batches_per_call=1, seed=0)
    sampler.sample()
    ray.kill(service.actor, no_restart=False)
    for _ in range(5):
        assert sampler.sample()["obs"].shape == (4, 4)
    sampler.close()


def test_shard_adoption(ray_cluster: Any, service: Any, tmp_path: Any) -> None:
    from unienv_data.integrations.ray import write_shard

    shard = str(tmp_path / "shard")
    assert write_shard(shard, make_space(), [episode(5, 4), episode(6, 2), episode(7, 3)]) == 9
    with pytest.raises(FileExistsError):
        write_shard(shard, make_space(), [episode(8, 1)])
    service.commit(episode(1, 2))
    assert service.adopt(shard, remove=True) == (3, 9)
    assert not os.path.exists(shard)
    assert service.segments() == [(0, 2), (2, 6), (6, 8), (8, 11)]
    expected = {k: np.concatenate([episode(e, n)[k] for e, n in ((1, 2), (5, 4), (6, 2), (7, 3))]) for k in
                episode(0, 1)}
    assert_same(service.read(0, 11), expected)
    other = str(tmp_path / "other")
    write_shard(other, DictSpace(B, {"x": BoxSpace(B, 0.0, 1.0, np.float32, shape=(1,))}),
                [{"x": np.zeros((2, 1), np.float32)}])
    with pytest.raises(Exception, match="stores another space"):
        service.adopt(other)
    assert len(service) == 11


def test_flat_storage_and_reconnect_by_name(ray_cluster: Any, tmp_path: Any) -> None:
    from unienv_data.integrations.ray import connect_buffer_service, start_buffer_service

    space = DictSpace(B, {"obs": BoxSpace(B, -1.0, 1.0, np.float32, shape=(3,)),
                          "rew": BoxSpace(B, -1.0, 1.0, np.float32, shape=())})
    client = start_buffer_service(str(tmp_path / "flat"), space, capacity=10, storage="flat", name="svc-flat-test",
                                  timeout_s=TIMEOUT)
    try:
        other = connect_buffer_service("svc-flat-test", timeout_s=TIMEOUT)
        for i in range(4):                                      # 4 x 3 rows into a ring of 10: the first one is
            other.commit({"obs": np.full((3, 3), i / 10, np.float32), "rew": np.zeros(3, np.float32)})   # clipped
        assert len(client) == 10 and client.segments() == [(0, 1), (1, 4), (4, 7), (7, 10)]
        assert client.read(1, 2)["obs"][0, 0] == np.float32(0.1)
    finally:
        assert client.shutdown() == 10


def test_every_wait_has_a_timeout(ray_cluster: Any, service: Any) -> None:
    ray = ray_cluster
    from unienv_data.integrations.ray import BufferClient

    @ray.remote(num_cpus=0)
    def slow() -> int:
        time.sleep(30)
        return 1

    impatient = BufferClient(service.actor, service.space_json, timeout_s=0.2)
    ref = slow.remote()
    t0 = time.monotonic()
    with pytest.raises(TimeoutError):
        impatient.get(ref)
    assert time.monotonic() - t0 < 5
    ray.cancel(ref, force=True)
    with pytest.raises(ValueError, match="timeout_s"):
        BufferClient(service.actor, service.space_json, timeout_s=0)


def test_service_listens_on_loopback_only(ray_cluster: Any, service: Any) -> None:
    from unienv_data.integrations.ray import non_loopback_listeners

    service.commit(episode(0, 2))
    assert non_loopback_listeners() == []


def test_concurrent_commits_share_dumps_and_stay_durable(ray_cluster: Any, service: Any) -> None:
    ray = ray_cluster

    @ray.remote(num_cpus=0)
    def collect(client: Any, first: int, n_episodes: int) -> int:
        refs = [client.commit_async(episode(e, 2 + e % 5)) for e in range(first, first + n_episodes)]
        client.get(refs)                                   # every call returned: its episode is durable
        return sum(2 + e % 5 for e in range(first, first + n_episodes))

    rows = sum(ray.get([collect.remote(service, 100 * i, 12) for i in range(4)], timeout=TIMEOUT))
    info = service.info()
    assert info["commits"] == 48 and info["length"] == rows
    # Whether calls arrive together here depends on how Ray dispatches them on a loaded machine: sharing itself is
    # checked by construction in test_commits_queued_behind_a_dump_share_the_next_one
    assert 1 <= info["dumps"] <= info["commits"]
    kill_and_wait_restart(ray, service)                    # nothing acknowledged is lost
    segs = service.segments()
    assert len(service) == rows and len(segs) == 48
    data = service.read(0, rows)
    found = set()
    for s, e in segs:
        eid = int(data["obs"][s, 0])
        assert_same({k: v[s:e] for k, v in data.items()}, episode(eid, 2 + eid % 5))
        found.add(eid)
    assert found == {100 * i + e for i in range(4) for e in range(12)}


def test_commits_queued_behind_a_dump_share_the_next_one(tmp_path: Any) -> None:
    """Group commit, by construction: while one dump runs (the actor's dump lock held here), commits on other threads
    write their episodes and queue; the next dump makes all of them durable at once, and none of them is on disk
    before it (the actor's buffer does not persist each episode on its own)."""
    import threading

    from unienv_data.integrations.ray._actor import BufferActor
    from unienv_data.replay_buffer import ReplayBuffer
    from unienv_interface.space.space_utils.serialization_utils import space_to_json

    directory = str(tmp_path / "buffer")
    actor = BufferActor(directory, space_to_json(make_space()), "native", 200)
    n = 6
    errors: List[BaseException] = []

    def commit(eid: int) -> None:
        try:
            actor.commit([(episode(eid, 2 + eid % 5), 2 + eid % 5)])
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=commit, args=(eid,)) for eid in range(n)]
    with actor._dump_lock:                                 # a dump in progress
        for t in threads:
            t.start()
        deadline = time.monotonic() + TIMEOUT
        while actor._written < n and time.monotonic() < deadline:
            time.sleep(0.01)
        assert actor._written == n and not errors          # every call wrote its episode and waits for a dump
        on_disk = ReplayBuffer.load_from(directory, backend=B, read_only=True)
        assert len(on_disk) == 0 and not on_disk.episode_segments()   # nothing persisted per episode
        on_disk.close()
        assert all(t.is_alive() for t in threads)          # no call returned before its episode was durable
    for t in threads:
        t.join(TIMEOUT)
    assert not errors and not any(t.is_alive() for t in threads)
    assert actor.dumps == 1 and actor.commits == n         # one dump made all six durable
    on_disk = ReplayBuffer.load_from(directory, backend=B, read_only=True)
    segs = on_disk.episode_segments()
    assert segs is not None and len(segs) == n
    data = on_disk.get_at(slice(0, len(on_disk)))
    assert {int(data["obs"][s, 0]) for s, _ in segs} == set(range(n))
    for s, e in segs:
        eid = int(data["obs"][s, 0])
        assert_same({k: v[s:e] for k, v in data.items()}, episode(eid, 2 + eid % 5))
    on_disk.close()
    actor.close()


def test_collectors_on_the_actors_node_use_shared_memory_slabs(ray_cluster: Any, service: Any) -> None:
    ray = ray_cluster

    @ray.remote(num_cpus=0)
    def collect(client: Any, transport: str, eids: List[int], lengths: List[int]) -> Dict[str, Any]:
        builder = client.episode_builder(episodes_per_call=2, max_in_flight=1, transport=transport)
        for eid, n in zip(eids, lengths):
            for step in steps_of(episode(eid, n)):
                builder.append(step)
            builder.end_episode()
        builder.flush()
        slabs = [] if builder._pool is None else builder._pool.paths
        alive = [os.path.exists(p) for p in slabs]
        builder.close()
        return {"transport": builder.transport, "rows": builder.committed_rows, "slabs": slabs, "alive": alive,
                "after_close": [os.path.exists(p) for p in slabs]}

    lengths = [3, 300, 7, 1, 9]                            # 300 > the builder's first 256 rows: a bigger slab
    shm = ray.get(collect.remote(service, "auto", [0, 1, 2, 3, 4], lengths), timeout=TIMEOUT)
    assert shm["transport"] == "shared_memory" and shm["rows"] == sum(lengths)
    assert shm["slabs"] and all(shm["alive"]) and not any(shm["after_close"])   # closed: files removed
    plain = ray.get(collect.remote(service, "object_store", [5, 6], [4, 2]), timeout=TIMEOUT)
    assert plain["transport"] == "object_store" and not plain["slabs"]
    segs = service.segments()
    data = service.read(0, len(service))
    got = {int(data["obs"][s, 0]): {k: v[s:e] for k, v in data.items()} for s, e in segs}
    for eid, n in zip(range(7), lengths + [4, 2]):
        assert_same(got[eid], episode(eid, n))             # byte-identical through either transport
    with pytest.raises(ray.exceptions.RayTaskError, match="not a slab file"):
        service.get(service.actor.commit_slabs.remote([("/etc/passwd", 4, 2)]))
    with pytest.raises(ValueError, match="transport must be one of"):
        service.episode_builder(transport="carrier pigeon")


def test_slabs_of_dead_collectors_are_removed(tmp_path: Any) -> None:
    import subprocess
    import sys

    from unienv_data.integrations.ray._slabs import SLAB_PREFIX, SlabCache, SlabPool, slab_dir

    directory = slab_dir()
    if directory is None:
        pytest.skip("no /dev/shm on this machine")
    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                           timeout=TIMEOUT)
    dead = os.path.join(directory, f"{SLAB_PREFIX}{int(child.stdout)}-test")
    with open(dead, "wb") as f:
        f.write(b"x" * 64)
    pool = SlabPool([(2,)], [np.dtype(np.float32)], directory)
    mine = pool.take(8)
    mine.arrays[0][:] = 1.5
    cache = SlabCache([(2,)], [np.dtype(np.float32)])        # collects dead collectors' files when it starts
    assert not os.path.exists(dead) and os.path.exists(mine.path)
    assert (cache.leaves(mine.path, 8, 3)[0] == 1.5).all()
    with pytest.raises(ValueError, match="length 9"):
        cache.leaves(mine.path, 8, 9)
    pool.close()
    assert not os.path.exists(mine.path)
    cache.collect_dead()                                      # unmaps slabs whose file is gone
    assert not cache._maps
