"""Direct writes into the buffer service's files (`_direct`): collectors on the actor's node reserve rows, write them
into the storage's files themselves and commit. Byte-identical round trips (native and flat layouts, a wrapping
ring), collectors killed between reserve and commit (only whole episodes stay visible, the buffer goes on), and the
ring never handing out rows a live collector still holds. The in-process tests drive the Ray-free `BufferActor`
with real processes as collectors."""
from __future__ import annotations

import glob
import os
import subprocess
import sys
import threading
import time
from typing import Any, Dict, List

import numpy as np
import pytest

from test_ray_service import TIMEOUT, assert_same, episode, make_space, steps_of
from unienv_interface.space.space_utils.serialization_utils import space_to_json

pytestmark = [pytest.mark.ray, pytest.mark.xdist_group("ray")]


@pytest.fixture(scope="module", autouse=True)
def _ship_this_module_by_value(ray_cluster: Any) -> None:
    """Ray's workers cannot import test modules: cloudpickle sends them by value."""
    ray_cluster.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray_cluster.cloudpickle.register_pickle_by_value(sys.modules["test_ray_service"])


def _by_episode(client: Any) -> Dict[int, Dict[str, np.ndarray]]:
    """Every listed episode of the service, keyed by the episode id its rows carry."""
    data = client.read(0, len(client))
    return {int(data["obs"][s, 0]): {k: v[s:e] for k, v in data.items()} for s, e in client.segments()}


def test_direct_round_trip_is_byte_identical(ray_cluster: Any, tmp_path: Any) -> None:
    from unienv_data.integrations.ray import start_buffer_service

    ray = ray_cluster

    @ray.remote(num_cpus=0)
    def collect(client: Any, transport: str, lengths: List[int]) -> Dict[str, Any]:
        # one call at a time: both transports then place every episode at the same rows
        builder = client.episode_builder(episodes_per_call=2, max_in_flight=0, transport=transport)
        for eid, n in enumerate(lengths):
            for step in steps_of(episode(eid, n)):
                builder.append(step)
            builder.end_episode()
        builder.close()
        return {"transport": builder.transport, "rows": builder.committed_rows}

    lengths = [5, 260, 9, 1, 70, 90, 33]                   # 468 rows into 400: the ring wraps, 2 episodes per call
    for storage in ("native", "flat"):
        files = {}
        for transport in ("direct", "shared_memory"):
            client = start_buffer_service(str(tmp_path / f"{storage}-{transport}"), make_space(), capacity=400,
                                          storage=storage, timeout_s=TIMEOUT)
            out = ray.get(collect.remote(client, transport, lengths), timeout=TIMEOUT)
            assert out == {"transport": transport, "rows": sum(lengths)}
            got = _by_episode(client)
            assert sorted(got) == [1, 2, 3, 4, 5, 6]        # the wrap overwrote episode 0 and clipped episode 1
            for eid, rows in got.items():                   # (its last rows stay listed, as in unienv 0.0.1b16)
                n = len(rows["obs"])
                assert_same(rows, {k: v[len(v) - n:] for k, v in episode(eid, lengths[eid]).items()})
                assert eid == 1 or n == lengths[eid]
            info = client.info()
            assert info["pending_reservations"] == 0 and info["abandoned_rows"] == 0
            assert len(client) == 400
            client.shutdown()
            root = str(tmp_path / f"{storage}-{transport}")
            files[transport] = {os.path.relpath(p, root): open(p, "rb").read()
                                for p in glob.glob(os.path.join(root, "**", "*.memmap"), recursive=True)}
        assert files["direct"] and files["direct"] == files["shared_memory"]   # the same bytes on disk

    client = start_buffer_service(str(tmp_path / "auto"), make_space(), capacity=400, timeout_s=TIMEOUT)
    assert ray.get(collect.remote(client, "auto", [4, 6]), timeout=TIMEOUT)["transport"] == "shared_memory"
    client.shutdown()


def test_collector_killed_between_reserve_and_commit(ray_cluster: Any, tmp_path: Any) -> None:
    from unienv_data.integrations.ray import LocalSampler, start_buffer_service

    ray = ray_cluster
    client = start_buffer_service(str(tmp_path / "buffer"), make_space(), capacity=200, timeout_s=TIMEOUT)

    @ray.remote(num_cpus=0, max_restarts=0)
    class Stuck:
        """Reserves rows for an episode, writes them, and never commits (until it is killed)."""

        def reserve_and_write(self, client: Any, eid: int, n: int) -> int:
            from unienv_data.integrations.ray._direct import DirectWriter

            writer = DirectWriter(client.info()["directory"], client.layout)
            _, placed = client.get(client.actor.reserve.remote([n], os.getpid()))
            writer.write(writer.pack(episode(eid, n), n), placed[0][1])
            return os.getpid()

    def kill(actor: Any, pid: int) -> None:
        ray.kill(actor)
        deadline = time.monotonic() + TIMEOUT
        while client.info()["pending_reservations"]:     # the actor notices the process is gone
            assert time.monotonic() < deadline, f"collector pid {pid} still counts as alive"
            time.sleep(0.05)

    client.commit([episode(0, 10), episode(1, 12)])
    # the newest rows: the buffer's tail goes back over them
    stuck = Stuck.remote()
    pid = ray.get(stuck.reserve_and_write.remote(client, 777, 15), timeout=TIMEOUT)
    assert len(client) == 22 + 15 and client.segments() == [(0, 10), (10, 22)]
    kill(stuck, pid)
    info = client.info()
    assert len(client) == 22 and info["rolled_back_rows"] == 15 and info["abandoned_rows"] == 15
    assert client.segments() == [(0, 10), (10, 22)]
    client.commit(episode(2, 8))                          # the buffer goes on, over the abandoned rows
    assert client.segments() == [(0, 10), (10, 22), (22, 30)]
    assert_same(_by_episode(client)[2], episode(2, 8))

    # rows below a later commit: they stay, unlisted, and nobody samples them
    stuck = Stuck.remote()
    pid = ray.get(stuck.reserve_and_write.remote(client, 778, 20), timeout=TIMEOUT)
    client.commit(episode(3, 5))
    kill(stuck, pid)
    assert len(client) == 30 + 20 + 5 and client.info()["rolled_back_rows"] == 15
    assert client.segments() == [(0, 10), (10, 22), (22, 30), (50, 55)]
    assert sorted(_by_episode(client)) == [0, 1, 2, 3]
    drawn = np.concatenate([client.sampler(64, batches_per_call=4, seed=s).sample()["obs"][:, 0] for s in range(5)])
    local = LocalSampler(client.info()["directory"], 64, seed=0)
    drawn = np.concatenate([drawn] + [local.sample()["obs"][:, 0] for _ in range(5)])
    local.close()
    assert set(drawn.astype(int).tolist()) == {0, 1, 2, 3}   # never a row of the abandoned episode
    for eid in range(4, 12):                              # the ring reclaims the rows
        client.commit(episode(eid, 25))
    assert sorted(_by_episode(client))[-1] == 11 and 778 not in _by_episode(client)
    client.shutdown()


# ---------------------------------------------------------------------- Ray-free: the actor's bookkeeping
def _actor(tmp_path: Any, capacity: int) -> Any:
    from unienv_data.integrations.ray._actor import BufferActor

    actor = BufferActor(str(tmp_path / "buffer"), space_to_json(make_space()), "native", capacity)
    assert actor.open_error is None
    return actor


def _episodes(actor: Any) -> Dict[int, Dict[str, np.ndarray]]:
    data = actor.read(0, actor.length())
    return {int(data["obs"][s, 0]): {k: v[s:e] for k, v in data.items()} for s, e in actor.segments()}


def test_the_ring_waits_for_rows_a_live_collector_holds(tmp_path: Any) -> None:
    from unienv_data.integrations.ray._direct import DirectWriter

    actor = _actor(tmp_path, 10)
    writer = DirectWriter(actor.directory, actor.layout)
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        inc, [(token, start)] = actor.reserve([6], sleeper.pid)        # rows 0..5, held by a live process
        done = threading.Event()
        errors: List[BaseException] = []

        def overwrite() -> None:
            try:
                actor.commit([(episode(1, 6), 6)])                     # rows 6..9 and 0..1: must wait
            except BaseException as exc:                               # pragma: no cover - reported below
                errors.append(exc)
            done.set()

        thread = threading.Thread(target=overwrite)
        thread.start()
        assert not done.wait(0.6)                                      # still waiting for the reservation
        writer.write(writer.pack(episode(0, 6), 6), start)
        assert actor.commit_reserved(inc, [token]) in (6, 10)                 # 10: the waiting commit went first
        assert done.wait(TIMEOUT) and not errors
        thread.join()
        got = _episodes(actor)
        assert sorted(got) == [0, 1] and actor.length() == 10          # episode 0 lost its first rows: clipped
        assert_same(got[1], episode(1, 6))
        assert_same(got[0], {k: v[6 - len(got[0]["obs"]):] for k, v in episode(0, 6).items()})

        inc, [(token, start)] = actor.reserve([4], sleeper.pid)
        sleeper.kill()
        sleeper.wait(TIMEOUT)
        t0 = time.monotonic()
        actor.commit([(episode(2, 8), 8)])                             # the holder is gone: no wait
        assert time.monotonic() - t0 < 5 and actor.abandoned_rows == 4
        with pytest.raises(ValueError, match="unknown"):
            actor.commit_reserved(inc, [token])                        # too late: nothing lands
        with pytest.raises(ValueError, match="unknown"):
            actor.commit_reserved("another incarnation", [token])
        got = _episodes(actor)
        assert sorted(got) == [1, 2]                                   # episode 1 keeps its last rows (clipped)
        assert_same(got[1], {k: v[6 - len(got[1]["obs"]):] for k, v in episode(1, 6).items()})
    finally:
        sleeper.kill()
        sleeper.wait(TIMEOUT)
        writer.close()
        actor.close()


def test_reservations_are_checked_and_unsupported_storages_refuse(tmp_path: Any) -> None:
    from unienv_data.integrations.ray._actor import BufferActor
    from unienv_data.integrations.ray._direct import DirectWriter
    from unienv_data.storages.video_storage import VideoStorage
    from unienv_data.storages.dict_storage import DictStorage
    from unienv_data.storages.native_layout import native_layout_kwargs

    actor = _actor(tmp_path, 10)
    with pytest.raises(ValueError, match="do not fit in the capacity 10"):
        actor.reserve([6, 5], os.getpid())
    with pytest.raises(ValueError, match="at least one row"):
        actor.reserve([0], os.getpid())
    writer = DirectWriter(actor.directory, actor.layout)
    bad = episode(0, 3)
    bad["img"] = bad["img"].astype(np.int16)
    with pytest.raises(ValueError, match="img"):
        writer.pack(bad, 3)                                             # refused before any row is reserved
    writer.close()
    actor.close()

    kwargs = native_layout_kwargs(make_space(), image_storage="video")
    video = BufferActor(str(tmp_path / "video"), space_to_json(make_space()), (DictStorage, kwargs), 10)
    assert video.open_error is None and isinstance(video.buffer.storage.get_column("img"), VideoStorage)
    info = video.direct_info()
    assert not info["supported"] and "img" in info["why"]
    with pytest.raises(ValueError, match="direct writes are not possible"):
        video.reserve([3], os.getpid())
    video.close()
