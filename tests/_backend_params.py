"""The compute backends a backend-parametrized test runs on: NumPy always, PyTorch and JAX when their extras are
installed (CI installs both). Shared by the space tests."""
from __future__ import annotations

from typing import Any, List

import pytest

from unienv_interface.backends import NumpyComputeBackend as NB

try:
    import torch

    from unienv_interface.backends.pytorch import PyTorchComputeBackend as TB
except ImportError:  # pragma: no cover - the torch extra is not installed
    torch = None  # type: ignore[assignment]
    TB = None  # type: ignore[assignment,misc]

needs_torch = pytest.mark.skipif(torch is None, reason="needs the torch extra")
BACKENDS: List[Any] = [pytest.param(NB, id="numpy"), pytest.param(TB, id="pytorch", marks=needs_torch)]
try:  # JAX joins every backend-parametrized test when the `jax` extra is installed
    from unienv_interface.backends.jax import JaxComputeBackend as JB
    BACKENDS.append(pytest.param(JB, id="jax"))
except ModuleNotFoundError:  # pragma: no cover - the jax extra is not installed
    JB = None  # type: ignore[assignment,misc]

__all__ = ["BACKENDS", "JB", "NB", "TB", "needs_torch", "torch"]
