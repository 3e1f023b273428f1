"""A single-node Ray cluster that listens on the loopback interface only.

Ray picks the node's routable address and binds its gRPC servers to every interface unless it believes it runs
without cluster support; the environment in `LOOPBACK_ENV` makes it choose 127.0.0.1, so every server (GCS,
raylet, object manager, workers) listens on loopback only. The variables must be in the environment *before*
``import ray`` in this process and in the processes Ray starts, which `init_local_cluster` ensures by setting them
in ``os.environ`` before it imports Ray.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Optional, Set, Tuple

#: Environment that keeps a local Ray node on 127.0.0.1 and off the network (no usage-stats reporting).
LOOPBACK_ENV: Dict[str, str] = {
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_DISABLE_DOCKER_CPU_WARNING": "1",
}

_DEFAULT_OBJECT_STORE_BYTES = 1 << 30


def init_local_cluster(
    num_cpus: int = 2,
    object_store_bytes: int = _DEFAULT_OBJECT_STORE_BYTES,
    temp_dir: Optional[str] = None,
    **init_kwargs: Any,
) -> Any:
    """Start (or join, if this process already started one) a loopback-only single-node Ray cluster.

    Args:
        num_cpus: CPUs the node advertises to Ray's scheduler.
        object_store_bytes: size of the shared-memory object store (bounded; default 1 GiB).
        temp_dir: Ray's session directory; a fresh short directory under the system temp dir by default (Ray's
            Unix socket paths must stay short).
        **init_kwargs: passed on to ``ray.init``.

    Returns:
        What ``ray.init`` returns (the context of the running cluster).

    Raises:
        ValueError: ``num_cpus`` < 1 or ``object_store_bytes`` < 78 MiB (Ray's minimum).
        RuntimeError: Ray was imported before with settings that bind it to every interface (the cluster is shut
            down again; start a fresh process, or call this before anything imports Ray).
    """
    if num_cpus < 1:
        raise ValueError(f"init_local_cluster: num_cpus must be >= 1, got {num_cpus}")
    if object_store_bytes < 78 * (1 << 20):
        raise ValueError(f"init_local_cluster: object_store_bytes must be >= 78 MiB, got {object_store_bytes}")
    os.environ.update(LOOPBACK_ENV)
    import ray  # after the environment is set: ray reads it at import time
    from ray._private import ray_constants

    if ray_constants.ENABLE_RAY_CLUSTER and not ray.is_initialized():
        raise RuntimeError(
            "init_local_cluster: Ray was imported before init_local_cluster could set its environment, so it would "
            "listen on every interface; call init_local_cluster before anything imports ray, or export "
            + " ".join(f"{k}={v}" for k, v in LOOPBACK_ENV.items()))

    if ray.is_initialized():
        return ray.get_runtime_context()
    if temp_dir is None:
        temp_dir = tempfile.mkdtemp(prefix="unienv-ray-")
    kwargs: Dict[str, Any] = dict(
        num_cpus=num_cpus,
        object_store_memory=int(object_store_bytes),
        include_dashboard=False,
        log_to_driver=False,
        _temp_dir=temp_dir,
        configure_logging=False,
    )
    kwargs.update(init_kwargs)
    context = ray.init(**kwargs)
    if Path("/proc/net/tcp").exists():
        exposed = non_loopback_listeners()
        if exposed:
            ray.shutdown()
            raise RuntimeError(
                "init_local_cluster: Ray listens beyond loopback "
                f"({', '.join(f'{a}:{p}' for a, p, _ in exposed[:4])}); it was imported before "
                "init_local_cluster could set its environment, so start a fresh process")
    return context


def _listening_sockets() -> Set[Tuple[str, int, int]]:
    """(address, port, inode) of every TCP socket in LISTEN state on this host, read from /proc/net."""
    found: Set[Tuple[str, int, int]] = set()
    for name, width in (("tcp", 8), ("tcp6", 32)):
        path = Path("/proc/net") / name
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            fields = line.split()
            if len(fields) < 10 or fields[3] != "0A":  # 0A = TCP_LISTEN
                continue
            address_hex, port_hex = fields[1].split(":")
            found.add((_decode_address(address_hex, width), int(port_hex, 16), int(fields[9])))
    return found


def _decode_address(address_hex: str, width: int) -> str:
    if width == 8:
        raw = bytes.fromhex(address_hex)[::-1]
        return ".".join(str(b) for b in raw)
    words = [bytes.fromhex(address_hex[i:i + 8])[::-1].hex() for i in range(0, 32, 8)]
    joined = "".join(words)
    return ":".join(joined[i:i + 4] for i in range(0, 32, 4))


def _is_loopback(address: str) -> bool:
    if address.startswith("127."):
        return True
    return address in ("0000:0000:0000:0000:0000:0000:0000:0001",) or address.endswith(
        "0000:ffff:7f00:0001")


def _socket_inodes_of(pid: int) -> Set[int]:
    inodes: Set[int] = set()
    fd_dir = Path(f"/proc/{pid}/fd")
    try:
        entries = list(fd_dir.iterdir())
    except OSError:
        return inodes
    for entry in entries:
        try:
            target = os.readlink(entry)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    return inodes


def _descendants(pid: int) -> List[int]:
    children: Dict[int, List[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    out: List[int] = []
    stack = [pid]
    while stack:
        current = stack.pop()
        for child in children.get(current, []):
            out.append(child)
            stack.append(child)
    return out


def non_loopback_listeners(root_pid: Optional[int] = None) -> List[Tuple[str, int, int]]:
    """Listening TCP sockets held by ``root_pid`` (default: this process) or its descendants on a non-loopback address.

    Returns (address, port, pid) triples; an empty list means every listener of the process tree is on 127.0.0.0/8
    or ::1. Linux only (reads /proc).
    """
    root = os.getpid() if root_pid is None else int(root_pid)
    owner: Dict[int, int] = {}
    for pid in [root, *_descendants(root)]:
        for inode in _socket_inodes_of(pid):
            owner[inode] = pid
    return sorted(
        (address, port, owner[inode])
        for address, port, inode in _listening_sockets()
        if inode in owner and not _is_loopback(address)
    )
