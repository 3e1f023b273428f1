"""The local read path of the Ray buffer service: a learner process samples the service's directory itself.

Every row written here carries its episode id in every leaf, so a row that mixes two episodes (copied while the
actor overwrote it) or a row of an episode the actor had already dropped is visible in the data itself."""
from __future__ import annotations

import os
import time
from typing import Any, Dict, List

import numpy as np
import pytest

from unienv_interface.backends import NumpyComputeBackend as B
from unienv_interface.space import BoxSpace, DictSpace

pytestmark = [pytest.mark.ray, pytest.mark.xdist_group("ray")]

TIMEOUT = 60.0


def make_space() -> DictSpace:
    return DictSpace(B, {
        "obs": BoxSpace(B, 0, 1 << 40, np.int64, shape=(3,)),
        "img": BoxSpace(B, 0, 255, np.uint8, shape=(16, 16, 3)),
        "eid": BoxSpace(B, 0, 1 << 30, np.int32, shape=()),
    })


def length_of(eid: int) -> int:
    return 3 + eid % 7


def episode(eid: int) -> Dict[str, np.ndarray]:
    """Rows of episode `eid`: obs = (eid, t, eid * 1000 + t), an image filled with eid % 251, eid."""
    n = length_of(eid)
    t = np.arange(n)
    return {"obs": np.stack([np.full(n, eid), t, eid * 1000 + t], 1).astype(np.int64),
            "img": np.full((n, 16, 16, 3), eid % 251, np.uint8),
            "eid": np.full(n, eid, np.int32)}


def check_rows(batch: Dict[str, np.ndarray]) -> np.ndarray:
    """Asserts that every row is one whole row of one episode; returns the episode ids."""
    eid = batch["eid"].astype(np.int64)
    obs = batch["obs"]
    assert (obs[:, 0] == eid).all(), "obs and eid leaves disagree"
    assert (obs[:, 2] == eid * 1000 + obs[:, 1]).all(), "a torn obs row"
    assert ((obs[:, 1] >= 0) & (obs[:, 1] < 3 + eid % 7)).all()
    img = batch["img"].reshape(len(eid), -1)
    assert (img == (eid % 251)[:, None]).all(), "an image mixing two episodes"
    return eid


@pytest.fixture(scope="module", autouse=True)
def _ship_this_module_by_value(ray_cluster: Any) -> None:
    import sys

    ray_cluster.cloudpickle.register_pickle_by_value(sys.modules[__name__])


def test_local_sampler_round_trip_and_errors(ray_cluster: Any, tmp_path: Any) -> None:
    from unienv_data.integrations.ray import LocalSampler, start_buffer_service

    client = start_buffer_service(str(tmp_path / "buffer"), make_space(), capacity=100, timeout_s=TIMEOUT)
    try:
        local = client.local_sampler(16, seed=3)
        with pytest.raises(ValueError, match="no committed episode"):
            local.sample()
        client.commit([episode(e) for e in range(4)])
        batch = local.sample()                           # sees the commit at the next batch
        assert batch["obs"].shape == (16, 3) and batch["img"].shape == (16, 16, 16, 3)
        assert set(check_rows(batch)) <= {0, 1, 2, 3}
        batch["obs"][0, 0] = -1                          # batches are this process's own copies
        assert local.committed_rows == sum(length_of(e) for e in range(4))
        again = LocalSampler(client.info()["directory"], 16, seed=3)  # Ray-free, from the directory
        first = client.local_sampler(16, seed=3).sample()
        assert (again.sample()["obs"] == first["obs"]).all()         # seeded: reproducible
        again.close()
        with pytest.raises(ValueError, match="batch_size"):
            client.local_sampler(0)
        with pytest.raises(FileNotFoundError, match="holds no replay buffer"):
            client.local_sampler(4, directory=str(tmp_path / "elsewhere"))
        local.close()
    finally:
        client.shutdown()


def first_rows() -> np.ndarray:
    """Absolute row where episode k starts, when episodes 0, 1, 2, ... are committed in order."""
    return np.concatenate([[0], np.cumsum([length_of(e) for e in range(100_000)])])


def test_an_overwrite_before_the_copy_redraws_the_rows_it_reached(ray_cluster: Any, tmp_path: Any) -> None:
    """Deterministic: the actor overwrites the oldest episodes after the sampler read its view and before it copies
    the rows it drew (the actor's own code, run in this process between the two steps)."""
    from unienv_data.integrations.ray._actor import BufferActor
    from unienv_data.integrations.ray.local_sampler import LocalSampler
    from unienv_interface.space.space_utils.serialization_utils import space_to_json

    directory = str(tmp_path / "buffer")
    actor = BufferActor(directory, space_to_json(make_space()), "native", 40)
    actor.commit([(episode(e), length_of(e)) for e in range(6)])     # 3+4+5+6+7+8 = 33 rows of 40

    class Racing(LocalSampler):
        """Lets the actor commit once, between drawing the first rows and copying them."""
        raced = False

        def _gather(self, phys: np.ndarray) -> Any:
            if not self.raced:
                self.raced = True
                # 9 + 3 rows: rows 33..44 overwrite physical rows 0..4, all of episode 0 and part of episode 1
                actor.commit([(episode(6), length_of(6)), (episode(7), length_of(7))])
            return super()._gather(phys)

    sampler = Racing(directory, 200, seed=0)
    eids = check_rows(sampler.sample())
    assert sampler.redrawn_rows > 0                      # it drew rows of episodes 0 and 1 from its first view
    assert not np.isin(eids, [0]).any()                  # none came back from the overwritten episode 0
    assert {6, 7} & set(eids.tolist())
    assert set(eids.tolist()) <= {1, 2, 3, 4, 5, 6, 7}   # episode 1 keeps its last 2 rows (clipped, as in
    assert tuple(actor.segments()[0]) == (0, 2)          # unienv 0.0.1b16); episode 2 is the oldest whole one
    assert tuple(actor.segments()[1]) == (2, 7)
    assert int(actor.read(2, 3)["eid"][0]) == 2
    plain = LocalSampler(directory, 200, seed=0)         # no race: nothing to redraw
    assert set(check_rows(plain.sample()).tolist()) <= {1, 2, 3, 4, 5, 6, 7} and plain.redrawn_rows == 0
    plain.close()
    sampler.close()
    actor.close()


def test_consistent_batches_under_concurrent_wrapping_commits(ray_cluster: Any, tmp_path: Any) -> None:
    ray = ray_cluster
    from unienv_data.integrations.ray import start_buffer_service

    client = start_buffer_service(str(tmp_path / "buffer"), make_space(), capacity=48, timeout_s=TIMEOUT)

    @ray.remote(num_cpus=0)
    class Writer:
        def run(self, client: Any, seconds: float, at_least: int) -> int:
            # for `seconds`, and on until `at_least` episodes are in (a loaded machine commits fewer per second)
            eid, deadline, limit = 0, time.monotonic() + seconds, time.monotonic() + TIMEOUT
            while (time.monotonic() < deadline or eid < at_least) and time.monotonic() < limit:
                client.commit([episode(eid), episode(eid + 1)])
                eid += 2
            return eid

    writer = Writer.remote()
    running = writer.run.remote(client, 4.0, 24)
    starts = first_rows()
    local = None
    batches, seen = 0, set()
    try:
        deadline = time.monotonic() + TIMEOUT
        while not os.path.exists(os.path.join(client.info()["directory"], "service_view.bin")):
            assert time.monotonic() < deadline
        local = client.local_sampler(64, seed=1)
        while local.committed_rows == 0:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        t_end = time.monotonic() + 3.0
        # sample for 3 s, and on while the writer still commits until the batches have followed the ring
        while time.monotonic() < t_end or (len(seen) <= 10 and time.monotonic() < deadline):
            view = local._current()                       # the episodes listed when this batch starts
            # the episode holding the oldest listed row (it may be clipped: its first rows overwritten)
            oldest = int(np.searchsorted(starts, int(view.starts[0]), side="right")) - 1
            eids = check_rows(local.sample())            # never a row mixing two episodes
            assert eids.min() >= oldest, "a row of an episode dropped before the batch began"
            seen.update(eids.tolist())
            batches += 1
        committed = ray.get(running, timeout=TIMEOUT)
    finally:
        if local is not None:
            local.close()
        client.shutdown()
    assert committed > 20 and batches > 50
    assert len(seen) > 10                                 # it followed the ring as it wrapped


def test_local_sampler_follows_an_actor_restart(ray_cluster: Any, tmp_path: Any) -> None:
    ray = ray_cluster
    from unienv_data.integrations.ray import start_buffer_service

    client = start_buffer_service(str(tmp_path / "buffer"), make_space(), capacity=30, timeout_s=TIMEOUT)
    try:
        client.commit([episode(e) for e in range(3)])
        local = client.local_sampler(32, seed=0)
        assert set(check_rows(local.sample())) <= {0, 1, 2}
        pid = client.info()["pid"]
        ray.kill(client.actor, no_restart=False)
        deadline = time.monotonic() + TIMEOUT
        while True:
            try:
                if client.info()["pid"] != pid:
                    break
            except ray.exceptions.RayActorError:
                pass
            assert time.monotonic() < deadline, "the actor did not come back"
            time.sleep(0.05)
        assert set(check_rows(local.sample())) <= {0, 1, 2}   # the reopened actor republished the same episodes
        for e in range(3, 9):                                  # wraps the ring of 30 rows
            client.commit(episode(e))
        eids = check_rows(local.sample())
        listed = {int(client.read(s, s + 1)["eid"][0]) for s, _ in client.segments()}
        assert set(eids) <= listed and 0 not in listed
        local.close()
    finally:
        client.shutdown()


def test_growable_buffer(ray_cluster: Any, tmp_path: Any) -> None:
    from unienv_data.integrations.ray import start_buffer_service

    client = start_buffer_service(str(tmp_path / "buffer"), make_space(), capacity=None, timeout_s=TIMEOUT)
    try:
        client.commit(episode(0))
        local = client.local_sampler(8, seed=0)
        assert set(check_rows(local.sample())) == {0}
        client.commit([episode(e) for e in range(1, 40)])     # grows the files past what the sampler mapped
        eids = check_rows(local.sample())
        assert eids.max() > 0 and local.committed_rows == sum(length_of(e) for e in range(40))
        local.close()
    finally:
        client.shutdown()
