"""What `ReplayBuffer.load_from` needs besides the metadata: opening the storage on any backend and device, the
message for a space that differs from the stored one, and the buffer's `repr`."""
from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Tuple, Type

from unienv_data.base.errors import StorageFormatError
from unienv_data.base.storage import SpaceStorage
from unienv_data.storages._dict_routing import check_stored_space
from unienv_data.storages.backend_compat import ToBackendOrDeviceStorage
from unienv_interface.backends.resolve import resolve_backend
from unienv_interface.space import Space
from unienv_interface.space.space_utils.serialization_utils import json_to_space

#: the backends a storage may have been recorded on, tried in this order when the requested one does not open it
_RECORDING_BACKENDS = ("numpy", "pytorch")


def _host_candidates(space: Space) -> List[Any]:
    """Backends (on the CPU) to open the stored data with when `space`'s backend / device cannot open it."""
    out = []
    if space.device is not None and str(space.device) not in ("cpu", "cpu:0"):
        out.append(space.backend)           # the recording backend, kept on the CPU
    for name in _RECORDING_BACKENDS:
        try:
            backend = resolve_backend(name)
        except ImportError:                 # torch not installed: nothing was recorded with it here
            continue
        if backend not in out and backend is not space.backend:
            out.append(backend)
    return out


def check_storage_kwargs(storage_cls: Type[SpaceStorage], kwargs: Dict[str, Any]) -> None:
    """Refuses the keyword arguments `ReplayBuffer.load_from` would pass on to the storage (`**storage_kwargs`, as
    the reference does) that are meant for `load_from` itself, with a TypeError that names the keyword and what
    to pass instead (a `space=` would otherwise reach the storage, or clash with this module's own parameters)."""
    if "space" in kwargs:
        raise TypeError("ReplayBuffer.load_from() got an unexpected keyword argument 'space': pass the space as "
                        "single_instance_space=... (it must equal the stored space; other keyword arguments go to "
                        f"{storage_cls.__name__}.load_from)")
    for name in ("storage_cls", "full", "space_json"):
        if name in kwargs:
            raise TypeError(f"ReplayBuffer.load_from() got an unexpected keyword argument {name!r} (the keyword "
                            f"arguments besides backend, device, read_only, multiprocessing and "
                            f"single_instance_space go to {storage_cls.__name__}.load_from, which takes no {name!r})")


def load_storage_as(storage_cls: Type[SpaceStorage], full: str, space: Space, space_json: Dict[str, Any], /, *,
                    capacity: Optional[int], read_only: bool, multiprocessing: bool,
                    **kwargs: Any) -> Tuple[SpaceStorage, SpaceStorage]:
    """`(served, stored)`: the storage at `full` opened to serve `space`. When the storage cannot serve `space`'s
    backend / device itself (e.g. NumPy memmaps read as torch tensors, or data kept on the CPU served on a GPU), it
    is opened on the backend it was recorded with and wrapped in a `ToBackendOrDeviceStorage` that converts every
    read and write (DLPack where the libraries allow it); `stored` is then the inner storage (what lies on disk).

    The first four parameters are positional-only, so that the caller's storage keyword arguments never clash
    with them (`check_storage_kwargs` names the ones meant for `load_from` itself)."""
    check_storage_kwargs(storage_cls, kwargs)
    try:
        st = storage_cls.load_from(full, space, capacity=capacity, read_only=read_only,
                                   multiprocessing=multiprocessing, **kwargs)
        return st, st
    except StorageFormatError:
        raise
    except (TypeError, ValueError) as exc:
        first: BaseException = exc
    for backend in _host_candidates(space):
        try:
            host_space = json_to_space(space_json, backend, None)
            inner = storage_cls.load_from(full, host_space, capacity=capacity, read_only=read_only,
                                          multiprocessing=multiprocessing, **kwargs)
        except StorageFormatError:
            raise
        except (TypeError, ValueError):
            continue
        try:
            served: ToBackendOrDeviceStorage[Any, Any, Any, Any, Any, Any, Any, Any, Any, Any]
            served = ToBackendOrDeviceStorage(space, inner, os.path.basename(full))
        except (TypeError, ValueError):
            inner.close()
            continue
        served.owns_inner_storage = True
        return served, inner
    raise first


def stored_space_difference(stored_json: Dict[str, Any], given: Space, path: str, meta_path: str) -> str:
    """The message for a `single_instance_space` that is not the stored one: the keys that differ, each with the
    stored and the given space (the storage loaders' comparison), and what to do."""
    try:
        check_stored_space(stored_json, given, path, meta_path, "/")
    except ValueError as exc:
        return f"{exc}; pass the space the buffer was recorded with, or single_instance_space=None to use the stored one"
    return f"the given space does not match the one stored in {path}"


def describe_buffer(buffer: Any, stored: Optional[SpaceStorage] = None) -> str:
    """`ReplayBuffer(len=..., capacity=..., segments=..., storage=..., path=...)`; `stored`: the storage as it lies
    on disk when the buffer serves it through a backend / device wrapper (else None)."""
    st = buffer.storage
    if st is None:
        return f"ReplayBuffer(closed, path={buffer.cache_path!r})"
    try:
        segs = buffer.episode_segments()
        n_segs: Any = "n/a" if segs is None else len(segs)
    except Exception:  # noqa: BLE001 - a description never raises
        n_segs = "?"
    kind = type(st).__name__ if stored is None else f"{type(stored).__name__} served as {st.backend.simplified_name}"
    parts = [f"len={len(buffer)}", f"capacity={buffer.capacity}", f"segments={n_segs}", f"storage={kind}",
             f"backend={st.backend.simplified_name}", f"path={buffer.cache_path!r}"]
    if buffer.open_segment_length:
        parts.append(f"open_episode={buffer.open_segment_length} rows")
    if not st.is_mutable:
        parts.append("read_only")
    if buffer.multiprocessing:
        parts.append("multiprocessing")
    return "ReplayBuffer(" + ", ".join(parts) + ")"
