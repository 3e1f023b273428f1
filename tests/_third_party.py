"""Where the tests find third-party packages that run outside the project's venv.

The reference (unienv 0.0.1b16), lerobot and minari pin dependencies that do not fit next to ours, so each lives in
its own venv under `.venvs/<name>/`, built by `scripts/venvs/<name>.sh` (all of them: `bash scripts/build_venvs.sh`),
and tests drive it in a subprocess. Packages that do fit (gymnasium, datasets) are imported directly.

Locally a missing venv or package skips the test with the command that builds it. Under CI (`CI` set to a true
value) it fails instead: CI builds every venv first, so a skip there would hide exactly the regression the test
exists for.
"""
from __future__ import annotations

import importlib
import os
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parent.parent
VENVS = REPO / ".venvs"


def in_ci() -> bool:
    """True when running under CI (the `CI` environment variable holds a true value)."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def _missing(what: str, how: str) -> None:
    message = f"{what} is missing; build it with `{how}`"
    if in_ci():
        pytest.fail(f"{message} (CI must run this test, not skip it)", pytrace=False)
    pytest.skip(message)


def venv_python(name: str, env_override: str | None = None) -> Path:
    """The python of the third-party venv `name` (`.venvs/<name>/bin/python`); skips (fails under CI) without it.

    `env_override` names an environment variable that, when set, points at another python to use instead.
    """
    if env_override and os.environ.get(env_override):
        path = Path(os.environ[env_override])
    else:
        path = VENVS / name / "bin" / "python"
    if not path.exists():
        _missing(f"the {name} venv ({path})", f"bash scripts/build_venvs.sh {name}")
    return path


def has_venv(name: str, env_override: str | None = None) -> bool:
    """Whether the venv exists (for skipif marks); under CI a missing venv still reports True so the test fails."""
    if env_override and os.environ.get(env_override):
        return Path(os.environ[env_override]).exists() or in_ci()
    return (VENVS / name / "bin" / "python").exists() or in_ci()


def require_module(module: str, extra: str) -> ModuleType:
    """Import `module` (like pytest.importorskip), but fail under CI, where the `extra` must be installed."""
    try:
        return importlib.import_module(module)
    except ImportError:
        _missing(f"the Python package {module!r}", f"pip install -e '.[{extra}]' (scripts/run.sh installs it)")
        raise  # unreachable: _missing skips or fails
