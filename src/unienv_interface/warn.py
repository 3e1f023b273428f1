"""Warnings that point at the user's code: `warn_user` gives `warnings.warn` the stack level of the first frame
outside this library, however deep the call went (a storage's `create` reached through the `SpaceStorage` wrappers,
a replay buffer's `create`, a composite storage creating its children, an append through several layers, a
transformation applied by a storage). The data package re-exports it from `unienv_data.base.warn`."""
from __future__ import annotations

import os
import sys
import warnings
from typing import Tuple, Type

#: directories whose frames are the library's own (a warning never points into them): this package and
#: unienv_data, which the distribution installs beside it
_INTERFACE_DIR = os.path.dirname(os.path.abspath(__file__))
_LIBRARY_DIRS: Tuple[str, ...] = tuple(os.path.join(d, "") for d in (
    _INTERFACE_DIR, os.path.join(os.path.dirname(_INTERFACE_DIR), "unienv_data")))
#: the file name prefix of code this library compiles at run time (the flat-row codecs of `_flat_codec`)
GENERATED_PREFIX = "<unienv "


def _is_library(filename: str) -> bool:
    return filename.startswith(GENERATED_PREFIX) or os.path.abspath(filename).startswith(_LIBRARY_DIRS)


def caller_stacklevel() -> int:
    """The `stacklevel` that makes a `warnings.warn` called by this function's caller point at the first frame
    outside this library (1 would point at the caller itself)."""
    frame = sys._getframe(1)          # the function that warns
    level = 1
    while frame is not None and _is_library(frame.f_code.co_filename):
        frame = frame.f_back          # type: ignore[assignment]
        level += 1
    return level


def warn_user(message: str, category: Type[Warning]) -> None:
    """`warnings.warn(message, category)` attributed to the user's line that led to it (see `caller_stacklevel`)."""
    warnings.warn(message, category, stacklevel=caller_stacklevel())


__all__ = ["GENERATED_PREFIX", "caller_stacklevel", "warn_user"]
