"""One writer per dataset directory (base.writer_lock): a second writable open in another process is refused, one
in the same process takes over (the older buffer is closed with what it committed), readers are never blocked, and
a killed writer leaves no stale lock. Real files and real subprocesses."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from typing import Any

import numpy as np
import pytest

from unienv_data.base.errors import StorageStateError
from unienv_data.base.writer_lock import WriterLockError
from unienv_data.replay_buffer import ReplayBuffer
from unienv_data.storages.dict_storage import DictStorage
from unienv_data.storages.native_layout import native_layout_kwargs
from unienv_interface.backends import NumpyComputeBackend as NB
from unienv_interface.space import BoxSpace, DictSpace

SPACE = DictSpace(NB, {"x": BoxSpace(NB, -100.0, 100.0, np.float32, shape=(2,))})
SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")


def _episode(rb: ReplayBuffer, value: float, n: int) -> None:
    for _ in range(n):
        rb.append({"x": np.full(2, value, np.float32)})
    rb.mark_segment_end()


def _new(path: str) -> ReplayBuffer:
    rb = ReplayBuffer.create(DictStorage, SPACE, cache_path=path, capacity=None, **native_layout_kwargs(SPACE))
    _episode(rb, 0.0, 3)
    return rb


def _values(path: str) -> Any:
    rb = ReplayBuffer.load_from(path, backend=NB)
    try:
        return rb.episode_segments(), np.asarray(rb.get_at(slice(0, len(rb)))["x"])[:, 0].tolist()
    finally:
        rb.close()


def test_a_second_writer_in_this_process_takes_over_and_nothing_is_lost(tmp_path: Any) -> None:
    """The new-user trial's repro: two writable opens of one directory, each appending an episode, used to leave
    one episode lost and a row reading 0. Now the older buffer is closed (its committed state kept) and refuses
    further use, saying why."""
    path = str(tmp_path / "data")
    _new(path).close()
    a = ReplayBuffer.load_from(path, backend=NB, read_only=False)
    _episode(a, 1.0, 3)
    b = ReplayBuffer.load_from(path, backend=NB, read_only=False)     # takes over: `a` is closed first
    _episode(b, 2.0, 4)
    with pytest.raises(StorageStateError, match="opened for writing again in this process"):
        _episode(a, 3.0, 1)
    a.close()                                       # idempotent, writes nothing over `b`
    b.close()
    segs, xs = _values(path)
    assert segs == [(0, 3), (3, 6), (6, 10)]
    assert xs == [0.0] * 3 + [1.0] * 3 + [2.0] * 4


def test_reopening_without_closing_sees_what_the_old_buffer_committed(tmp_path: Any) -> None:
    """Code that reopens a directory for writing without closing the buffer it recorded with keeps working."""
    path = str(tmp_path / "data")
    rb = _new(path)
    _episode(rb, 1.0, 2)
    again = ReplayBuffer.load_from(path, backend=NB, read_only=False)
    assert len(again) == 5 and again.episode_segments() == [(0, 3), (3, 5)]
    _episode(again, 2.0, 1)
    again.close()
    assert _values(path)[1] == [0.0] * 3 + [1.0] * 2 + [2.0]


CHILD = textwrap.dedent("""
    import sys, time, numpy as np
    from unienv_data.replay_buffer import ReplayBuffer
    from unienv_interface.backends import NumpyComputeBackend as NB
    rb = ReplayBuffer.load_from(sys.argv[1], backend=NB, read_only=False)
    print("open", flush=True)
    if sys.argv[2] == "hold":
        time.sleep(60)
    import os, signal
    os.kill(os.getpid(), signal.SIGKILL)
""")


def test_another_process_is_refused_while_a_writer_lives_and_a_killed_writer_frees_it(tmp_path: Any) -> None:
    path = str(tmp_path / "data")
    _new(path).close()
    env = {**os.environ, "PYTHONPATH": SRC}
    holder = subprocess.Popen([sys.executable, "-c", CHILD, path, "hold"], stdout=subprocess.PIPE, env=env)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == b"open"
        with pytest.raises(WriterLockError, match=rf"pid {holder.pid}\).*read_only=True"):
            ReplayBuffer.load_from(path, backend=NB, read_only=False)
        with pytest.raises(WriterLockError):
            ReplayBuffer.create(DictStorage, SPACE, cache_path=path, capacity=None, overwrite=True,
                                **native_layout_kwargs(SPACE))
        other = DictSpace(NB, {"x": BoxSpace(NB, -1.0, 1.0, np.float32, shape=(2,))})
        with pytest.raises(ValueError, match="'x'") as err:       # the caller's own mistake is named first
            ReplayBuffer.load_from(path, backend=NB, read_only=False, single_instance_space=other)
        assert not isinstance(err.value, WriterLockError)
        reader = ReplayBuffer.load_from(path, backend=NB)          # readers take no lock
        assert len(reader) == 3
        reader.close()
    finally:
        holder.kill()
        holder.wait()
    assert holder.returncode == -signal.SIGKILL
    killed = subprocess.run([sys.executable, "-c", CHILD, path, "kill"], capture_output=True, env=env, timeout=120)
    assert killed.returncode == -signal.SIGKILL and killed.stdout.strip() == b"open"
    rb = ReplayBuffer.load_from(path, backend=NB, read_only=False)    # no stale lock after SIGKILL
    _episode(rb, 1.0, 1)
    rb.close()
    assert _values(path)[1] == [0.0] * 3 + [1.0]


def test_a_collected_writer_releases_the_lock(tmp_path: Any) -> None:
    path = str(tmp_path / "data")
    _new(path).close()
    code = ("import sys; from unienv_data.replay_buffer import ReplayBuffer as R; "
            "from unienv_interface.backends import NumpyComputeBackend as NB; "
            "R.load_from(sys.argv[1], backend=NB, read_only=False).close()")
    rb = ReplayBuffer.load_from(path, backend=NB, read_only=False)
    del rb                                          # no close(): the lock goes with the object
    proc = subprocess.run([sys.executable, "-c", code, path], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": SRC})
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.mark.parametrize("damage", ["directory", "link outside"])
def test_a_damaged_lock_file_is_a_format_error_and_nothing_outside_changes(tmp_path: Any, damage: str) -> None:
    from unienv_data.base.errors import StorageFormatError
    path = str(tmp_path / "data")
    _new(path).close()
    lock = os.path.join(path, ".writer.lock")
    os.unlink(lock)
    outside = tmp_path / "outside.txt"
    outside.write_text("keep me")
    if damage == "directory":
        os.mkdir(lock)
    else:
        os.symlink(outside, lock)
    with pytest.raises(StorageFormatError, match="writer.lock is not a plain file"):
        ReplayBuffer.load_from(path, backend=NB, read_only=False)
    assert outside.read_text() == "keep me"
    assert _values(path)[1] == [0.0] * 3          # readers are unaffected
