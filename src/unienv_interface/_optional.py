"""`import_optional`: the import of an optional dependency, with the error that names the extra providing it."""
from __future__ import annotations

import importlib
from types import ModuleType


def import_optional(module: str, extra: str, user: str) -> ModuleType:
    """Imports `module`, or raises ModuleNotFoundError saying that `user` needs it and which extra of this package
    provides it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ModuleNotFoundError(
            f"{user} needs the optional dependency {module.split('.')[0]!r}; install the extra: "
            f"pip install 'unienv-storage[{extra}]' ({exc})") from exc


__all__ = ["import_optional"]
