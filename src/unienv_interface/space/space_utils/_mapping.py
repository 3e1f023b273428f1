"""The check every reader of a `DictSpace` value makes before it walks the value's keys."""
from __future__ import annotations

from typing import Any

from ..spaces import DictSpace


def check_dict_value(space: DictSpace, data: Any, what: str, *, allow_extra: bool = False) -> None:
    """TypeError unless `data` is a mapping; KeyError naming the missing (and, unless `allow_extra`, the
    unexpected) keys when its keys are not `space`'s. `what` names the caller in the message."""
    if not hasattr(data, "keys"):
        raise TypeError(f"{what}: a DictSpace value must be a mapping with keys {list(space.spaces)}, got "
                        f"{type(data).__name__}")
    missing = [k for k in space.spaces if k not in data]
    extra = [] if allow_extra else [k for k in data.keys() if k not in space.spaces]
    if missing or extra:
        raise KeyError(f"{what}: expected keys {list(space.spaces)}; missing {missing}, unexpected {extra}")
