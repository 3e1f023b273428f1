"""Suite-wide pytest options.

`--soak` turns the reliability tests (crash trials, concurrency stress, fuzzing) into long runs: trial counts and
Hypothesis example counts are multiplied by `--soak-factor` (default 20). Without it they are sized for CI.
"""
from __future__ import annotations

from typing import Any

import os

import pytest

from unienv_data.integrations.ray._local import LOOPBACK_ENV

# Before any test module can import Ray: Ray reads these at import time (see init_local_cluster).
os.environ.update(LOOPBACK_ENV)
# JAX joins the backend-parametrized tests with its full dtype set (64-bit included), like NumPy and torch; the
# default 32-bit mode, which narrows 64-bit data, is tested in a subprocess (tests/test_jax_storage.py).
os.environ.setdefault("JAX_ENABLE_X64", "1")


def pytest_addoption(parser: Any) -> None:
    group = parser.getgroup("unienv reliability")
    group.addoption("--soak", action="store_true", default=False,
                    help="long reliability runs: more crash trials, stress rounds and fuzz examples")
    group.addoption("--soak-factor", action="store", type=int, default=20,
                    help="how many times the CI trial counts a --soak run does (default 20)")


def soak_factor(config: Any) -> int:
    """1 in a normal run; the `--soak-factor` (>= 1) with `--soak`."""
    if not config.getoption("--soak", default=False):
        return 1
    return max(1, int(config.getoption("--soak-factor", default=20)))


@pytest.fixture(scope="session")
def soak(request: Any) -> int:
    """Multiplier for trial counts: 1 in CI, `--soak-factor` with `--soak`."""
    return soak_factor(request.config)


@pytest.fixture(scope="session")
def ray_cluster() -> Any:
    """A loopback-only single-node Ray cluster for the whole test session (module `ray` imported lazily).

    Skips when the `ray` extra is not installed. Tests that use it carry ``pytest.mark.xdist_group("ray")`` so that
    under ``-n 2 --dist loadgroup`` one worker runs them all against one cluster. Shut down with ``ray.shutdown()``
    at the end of the session (never ``ray stop``, which would stop clusters that are not ours).
    """
    ray = pytest.importorskip("ray")
    from unienv_data.integrations.ray import init_local_cluster

    init_local_cluster(num_cpus=2, object_store_bytes=1 << 30)
    try:
        yield ray
    finally:
        ray.shutdown()
