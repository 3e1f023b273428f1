"""Constructors that layers above `base` install here, for the few reference APIs that point upwards.

The reference puts some methods on lower-level classes that build higher-level objects: `BatchBase.get_slice` /
`get_column` return batch views (`unienv_data.batches`), and `HDF5Storage.load_replay_buffer_from_raw_hdf5` /
`ParquetStorage.load_replay_buffer_from_raw_parquet` return a `ReplayBuffer`. A layer only imports the ones below
it, so the owning layer installs its constructor here when it is imported (`import unienv_data` imports all of
them), and the lower layer calls it by name.

Hooks: `"batch.slice"` `(batch, index) -> SubIndexedBatch`, `"batch.column"` `(batch, nested_keys) -> SubItemBatch`,
`"buffer.over_storage"` `(storage, storage_name, count) -> ReplayBuffer` (read-only use, no segment metadata).
"""
from __future__ import annotations

from typing import Any, Callable, Dict

HOOK_NAMES = ("batch.slice", "batch.column", "buffer.over_storage")
_HOOKS: Dict[str, Callable[..., Any]] = {}


def install_hook(name: str, constructor: Callable[..., Any]) -> None:
    """Installs `constructor` under `name` (one of `HOOK_NAMES`); the owning layer calls this at import."""
    if name not in HOOK_NAMES:
        raise ValueError(f"unknown hook {name!r}; expected one of {list(HOOK_NAMES)}")
    _HOOKS[name] = constructor


def upper_layer(name: str) -> Callable[..., Any]:
    """The constructor installed under `name`."""
    found = _HOOKS.get(name)
    if found is None:  # only when a submodule was loaded without its package; `import unienv_data` installs all
        raise RuntimeError(f"nothing installed for {name!r}: import unienv_data (it imports every layer)")
    return found


__all__ = ["HOOK_NAMES", "install_hook", "upper_layer"]
