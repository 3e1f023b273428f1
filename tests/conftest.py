"""Suite-wide pytest options.

`--soak` turns the reliability tests (crash trials, concurrency stress, fuzzing) into long runs: trial counts and
Hypothesis example counts are multiplied by `--soak-factor` (default 20). Without it they are sized for CI.
"""
from __future__ import annotations

from typing import Any

import pytest


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
