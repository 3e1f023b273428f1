"""Ray integration: a disk-backed replay-buffer service and a Ray Data datasource over our storages.

Importing this package imports Ray (the ``ray`` extra: ``pip install "unienv[ray]"``); ``import unienv_data``
never does.

* `init_local_cluster` starts a single-node Ray cluster bound to the loopback interface only (tests, demos,
  benchmarks). On a real cluster call ``ray.init(address=...)`` yourself instead; see docs/ray.md.
"""
from __future__ import annotations

import importlib
from typing import Any, Dict

# Public name -> submodule that defines it. Resolved lazily (PEP 562), so importing a submodule such as
# ``unienv_data.integrations.ray._local`` does not import Ray before its environment is set.
_EXPORTS: Dict[str, str] = {
    "LOOPBACK_ENV": "_local",
    "init_local_cluster": "_local",
    "non_loopback_listeners": "_local",
    "BufferClient": "service",
    "RemoteEpisodeBuilder": "service",
    "RemoteSampler": "service",
    "connect_buffer_service": "service",
    "start_buffer_service": "service",
    "write_shard": "service",
    "LocalSampler": "local_sampler",
    "Episode": "episodes",
    "EpisodeBuilder": "episodes",
    "EpisodeLayout": "episodes",
    "commit_episodes": "episodes",
    "episode_from_batch": "episodes",
    "UnienvDatasource": "datasource",
    "read_unienv": "datasource",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module_name = _EXPORTS.get(name)
    if module_name is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module_name}"), name)
    globals()[name] = value
    return value


def __dir__() -> list:
    return sorted(set(globals()) | set(_EXPORTS))
