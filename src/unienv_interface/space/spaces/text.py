"""`TextSpace`: a string of bounded length over an optional character set."""
from __future__ import annotations

from typing import Any, FrozenSet, List, Mapping, Optional, Tuple, Union

import numpy as np

from unienv_interface.backends.base import BDeviceType, BDtypeType, BRNGType

from ..metadata import SpaceMetadata
from ..space import Space


class TextSpace(Space[str, BDeviceType, BDtypeType, BRNGType]):
    """Python strings with `min_length <= len(s) <= max_length`, every character in `charset` when one is set."""

    def __init__(self, backend: Any, max_length: int, *, min_length: int = 0,
                 charset: Union[None, str, FrozenSet[str]] = None, device: Any = None,
                 metadata: Optional[Mapping[str, Any]] = None) -> None:
        if isinstance(max_length, bool) or not isinstance(max_length, (int, np.integer)) or max_length < 0:
            raise ValueError(f"TextSpace max_length must be a non-negative int, got {max_length!r}")
        if isinstance(min_length, bool) or not isinstance(min_length, (int, np.integer)) or not 0 <= min_length <= max_length:
            raise ValueError(f"TextSpace min_length must be an int in [0, {max_length}], got {min_length!r}")
        super().__init__(backend, shape=None, device=device, dtype=None, metadata=metadata)
        self.max_length = int(max_length)
        self.min_length = int(min_length)
        self.charset: Optional[FrozenSet[str]] = None if charset is None else frozenset(charset)
        self.charset_list: Optional[List[str]] = None if self.charset is None else sorted(self.charset)
        self._char_index = None if self.charset_list is None else {c: i for i, c in enumerate(self.charset_list)}

    def _copy_with(self, metadata: SpaceMetadata) -> "TextSpace":
        return TextSpace(self._backend, self.max_length, min_length=self.min_length, charset=self.charset,
                         device=self._device, metadata=metadata)

    def char_index(self, c: str) -> int:
        """Position of `c` in the sorted charset (ValueError when the space has no charset or lacks `c`)."""
        if self._char_index is None:
            raise ValueError("this TextSpace has no character set")
        try:
            return self._char_index[c]
        except KeyError:
            raise ValueError(f"character {c!r} is not in the TextSpace charset") from None

    def _moved(self, backend: Any, device: Any) -> "TextSpace":
        return TextSpace(backend, self.max_length, min_length=self.min_length, charset=self.charset, device=device,
                         metadata=self._metadata)

    def is_bounded(self, manner: str = "both") -> bool:
        return True

    def contains(self, x: Any) -> bool:
        if not isinstance(x, str) or not self.min_length <= len(x) <= self.max_length:
            return False
        return self.charset is None or all(c in self.charset for c in x)

    def sample(self, rng: Any) -> Tuple[Any, str]:
        b = self._backend
        rng, n = b.random.random_discrete_uniform((), self.min_length, self.max_length + 1, rng=rng)
        n = int(np.asarray(b.to_numpy(n)))
        chars = self.charset_list or [chr(c) for c in range(32, 127)]
        rng, idx = b.random.random_discrete_uniform((n,), 0, len(chars), rng=rng)
        return rng, "".join(chars[int(i)] for i in np.asarray(b.to_numpy(idx)).reshape(-1))

    def create_empty(self) -> str:
        return ""

    def data_to(self, data: Any, backend: Any = None, device: Any = None) -> str:
        return data

    def get_repr(self, abbreviate: bool = False, include_backend: bool = True, include_device: bool = True,
                 include_dtype: bool = True) -> str:
        cs = "" if self.charset is None else f", charset={''.join(self.charset_list or [])!r}"
        return f"TextSpace(min_length={self.min_length}, max_length={self.max_length}{cs})"

    def is_subspaceeq(self, other: Space) -> bool:
        """True when `other` is a TextSpace of the same backend whose length range encloses this one's and whose
        charset holds this one's (a space without a charset is a subspace only of another without one)."""
        if not (isinstance(other, TextSpace) and other.backend is self._backend):
            return False
        if self.min_length < other.min_length or self.max_length > other.max_length:
            return False
        if self.charset is None or other.charset is None:
            return other.charset is None
        return self.charset <= other.charset

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, TextSpace) and other.backend is self._backend and other.max_length == self.max_length
                and other.min_length == self.min_length and other.charset == self.charset)

    __hash__ = None  # type: ignore[assignment]
