"""Warnings that point at the user's code: `warn_user` and `caller_stacklevel` live in `unienv_interface.warn` (the
interface package's transformations use them too, and it never imports this package); re-exported here."""
from __future__ import annotations

from unienv_interface.warn import GENERATED_PREFIX, caller_stacklevel, warn_user

__all__ = ["GENERATED_PREFIX", "caller_stacklevel", "warn_user"]
