"""Whether another process on this machine still runs: used to tell a lock or a reservation left behind by a killed
process from one a live process holds."""
from __future__ import annotations

import os


def pid_alive(pid: int) -> bool:
    """Whether process `pid` still runs on this machine. A zombie (killed or exited, not yet reaped by its parent)
    counts as gone; a process we may not signal counts as running."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:              # it exists but is not ours to signal
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:              # no /proc (or it just went away): trust the signal check
        return True
    # "pid (comm) state ...": comm may hold spaces and parentheses, the state follows the last ')'
    state = stat[stat.rfind(b")") + 2:stat.rfind(b")") + 3]
    return state not in (b"Z", b"X")


__all__ = ["pid_alive"]
