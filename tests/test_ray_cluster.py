"""The local Ray cluster the suite starts listens on loopback only and shuts down with the session."""
from __future__ import annotations

from typing import Any

import pytest

pytestmark = [pytest.mark.ray, pytest.mark.xdist_group("ray")]


def test_local_cluster_listens_on_loopback_only(ray_cluster: Any) -> None:
    from unienv_data.integrations.ray import non_loopback_listeners

    @ray_cluster.remote(num_cpus=0)
    def echo(value: int) -> int:
        return value

    assert ray_cluster.get(echo.remote(7), timeout=60) == 7
    assert non_loopback_listeners() == []


def test_init_local_cluster_rejects_bad_sizes() -> None:
    pytest.importorskip("ray")
    from unienv_data.integrations.ray import init_local_cluster

    with pytest.raises(ValueError, match="num_cpus"):
        init_local_cluster(num_cpus=0)
    with pytest.raises(ValueError, match="object_store_bytes"):
        init_local_cluster(object_store_bytes=1024)
