"""A disk-backed replay-buffer service on Ray: one actor owns the buffer, collectors and learners hold a client.

* `start_buffer_service(directory, space=..., capacity=...)` starts the actor (``num_cpus=0``, restarted by Ray
  after a crash) over a `ReplayBuffer` in `directory` (created there, or reopened when it already holds one) and
  returns a `BufferClient`. `connect_buffer_service(name)` finds a named one.
* A `BufferClient` is small and picklable: pass it to collector and learner tasks / actors.
* Collectors: `client.episode_builder()` builds each episode locally in NumPy arrays (steps checked as they come)
  and commits whole episodes, one remote call for `episodes_per_call` of them. Nothing of an episode reaches the
  buffer before its commit, so a collector killed mid-episode leaves only whole episodes behind. On the actor's
  node the arrays live in shared-memory slabs (`_slabs`) and a call carries only their names; with
  ``transport="direct"`` the collector writes the rows into the buffer's files itself between a reservation and a
  commit call (`_direct`).
  `client.commit(...)` commits ready-made episode batches; `client.adopt(path)` takes in a whole shard directory
  written locally (`write_shard`) in one call.
* Learners: `client.local_sampler(batch_size)` (the actor's node or a shared filesystem) reads the buffer directory
  in the learner's process (`local_sampler.LocalSampler`); from anywhere, `client.sample(batch_size)` returns
  batches of NumPy arrays through a `RemoteSampler` that keeps `prefetch` requests in flight, each bringing back
  many batches gathered in one call by the actor.

A call returns once its episodes are durable (data, then metadata by atomic rename; calls that arrive together
share one dump). Ray is imported only when a function needs it, so importing this module does not bind Ray before
`init_local_cluster` sets its environment.
"""
from __future__ import annotations

import collections
import os
import time
from typing import TYPE_CHECKING, Any, Deque, Dict, List, Optional, Sequence, Tuple

from unienv_interface.space import Space
from unienv_interface.space.space_utils.serialization_utils import space_to_json

from ._actor import BufferActor, StorageSpec, numpy_space
from ._direct import DirectWriter
from ._slabs import SlabPool, slab_dir
from .episodes import Episode, EpisodeBuilder, EpisodeLayout, episode_from_batch

if TYPE_CHECKING:
    from .local_sampler import LocalSampler

#: Seconds every wait on the service gives up after (a `TimeoutError`), unless the client is told otherwise.
DEFAULT_TIMEOUT_S = 120.0
#: Bytes a sampling call aims to bring back (many small-vector batches per call, about one image batch).
DEFAULT_BLOCK_BYTES = 8 << 20
#: seconds a remote sampler waits before asking a restarting buffer actor again
RESTART_POLL_S = 0.1

_ACTOR_CLASS: Any = None


def _ray() -> Any:
    import ray

    return ray


def _actor_class() -> Any:
    global _ACTOR_CLASS
    if _ACTOR_CLASS is None:
        _ACTOR_CLASS = _ray().remote(BufferActor)
    return _ACTOR_CLASS


def start_buffer_service(directory: str, space: Optional[Space] = None, *, capacity: Optional[int] = None,
                         storage: StorageSpec = "native", name: Optional[str] = None,
                         namespace: Optional[str] = None, max_restarts: int = -1, timeout_s: float = DEFAULT_TIMEOUT_S,
                         prefetch: int = 2, **actor_options: Any) -> "BufferClient":
    """Starts the buffer actor over `directory` and returns a client once it has opened the buffer.

    Args:
        directory: the buffer's directory, on a filesystem the actor's node sees (on a multi-node cluster: a shared
            one, or pin the actor to the node that holds it with ``scheduling_strategy``). Reopened when it holds a
            buffer; else created (it must be empty or missing).
        space: the space of one step (any backend: the service stores and returns NumPy). Required to create; when
            given for an existing buffer it must equal the stored one.
        capacity: rows of the ring (None: a growable buffer); used only to create.
        storage: "native" (each leaf in its own dtype, images in their own arrays; needs a DictSpace), "flat" (one
            FlattenedStorage row over a memory-mapped array), or ``(storage_cls, kwargs)``; used only to create.
        name, namespace: register the actor under this name (see `connect_buffer_service`).
        max_restarts: how often Ray restarts the actor after a crash (-1: always).
        timeout_s: limit of every wait of the returned client (``TimeoutError``).
        prefetch: sampling requests the client keeps in flight.
        **actor_options: more ``ray.remote`` actor options (``scheduling_strategy``, ``resources``, ...).

    Raises:
        ValueError / TypeError: bad arguments, or a space that does not match the stored one (the actor is killed).
        FileExistsError: `directory` holds files but no buffer.
        TimeoutError: the actor did not open the buffer within `timeout_s`.
    """
    ray = _ray()
    if not isinstance(directory, (str, os.PathLike)):
        raise TypeError(f"directory must be a path, got {type(directory).__name__}")
    if capacity is not None and (isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1):
        raise ValueError(f"capacity must be a positive int or None, got {capacity!r}")
    if space is not None and not isinstance(space, Space):
        raise TypeError(f"space must be a Space, got {type(space).__name__}")
    space_json = None if space is None else space_to_json(space)
    # threaded: commits queued at the same time share one durable point (see BufferActor)
    options: Dict[str, Any] = {"num_cpus": 0, "max_restarts": int(max_restarts), "max_task_retries": 0,
                               "max_concurrency": 8}
    if name is not None:
        options["name"] = name
    if namespace is not None:
        options["namespace"] = namespace
    options.update(actor_options)
    handle = _actor_class().options(**options).remote(os.path.abspath(os.fspath(directory)), space_json, storage,
                                                      capacity)
    try:
        info = ray.get(handle.info.remote(), timeout=timeout_s)
    except BaseException as exc:
        ray.kill(handle, no_restart=True)
        cause = getattr(exc, "cause", None)
        if isinstance(cause, (ValueError, TypeError, FileExistsError)):
            raise type(cause)(str(cause)) from None
        raise
    return BufferClient(handle, info["space"], timeout_s=timeout_s, prefetch=prefetch)


def connect_buffer_service(name: str, namespace: Optional[str] = None, *, timeout_s: float = DEFAULT_TIMEOUT_S,
                           prefetch: int = 2) -> "BufferClient":
    """A client of the running service registered as `name` (``ValueError`` from Ray when there is none)."""
    ray = _ray()
    handle = ray.get_actor(name, namespace=namespace)
    info = ray.get(handle.info.remote(), timeout=timeout_s)
    return BufferClient(handle, info["space"], timeout_s=timeout_s, prefetch=prefetch)


class BufferClient:
    """The handle collectors and learners use (picklable; see the module docstring).

    Every wait gives up after `timeout_s` with a ``TimeoutError``. Errors the actor raises (a refused episode, an
    empty buffer) come back as Ray task errors whose message names the cause; the checks the client can do itself
    (keys, shapes, dtypes, bounds) raise before any remote call.
    """

    def __init__(self, actor: Any, space_json: Dict[str, Any], *, timeout_s: float = DEFAULT_TIMEOUT_S,
                 prefetch: int = 2) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        if prefetch < 1:
            raise ValueError(f"prefetch must be >= 1, got {prefetch}")
        self.actor = actor
        self.space_json = space_json
        self.timeout_s = float(timeout_s)
        self.prefetch = int(prefetch)
        self._space: Optional[Space] = None
        self._layout: Optional[EpisodeLayout] = None
        self._samplers: Dict[int, RemoteSampler] = {}
        self._node_id: Optional[str] = None

    def __getstate__(self) -> Dict[str, Any]:
        return {"actor": self.actor, "space_json": self.space_json, "timeout_s": self.timeout_s,
                "prefetch": self.prefetch}

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self.__init__(state["actor"], state["space_json"], timeout_s=state["timeout_s"],  # type: ignore[misc]
                      prefetch=state["prefetch"])

    # ------------------------------------------------------------------ basics
    @property
    def space(self) -> Space:
        """The space of one step, on NumPy (what batches hold)."""
        if self._space is None:
            self._space = numpy_space(self.space_json)
        return self._space

    @property
    def layout(self) -> EpisodeLayout:
        """The leaves of the space (what episodes are checked against)."""
        if self._layout is None:
            self._layout = EpisodeLayout(self.space)
        return self._layout

    def get(self, ref: Any) -> Any:
        """``ray.get(ref)`` with the client's timeout."""
        return _ray().get(ref, timeout=self.timeout_s)

    def __len__(self) -> int:
        """Rows in the buffer now (one remote call)."""
        return int(self.get(self.actor.length.remote()))

    def info(self) -> Dict[str, Any]:
        """The service's facts: length, capacity, segments, directory, pid, whether it reopened its directory."""
        return dict(self.get(self.actor.info.remote()))

    def segments(self) -> Optional[List[Tuple[int, int]]]:
        """Logical `(start, end)` ranges of the stored episodes, oldest first."""
        return self.get(self.actor.segments.remote())

    def read(self, start: int, stop: int) -> Any:
        """Logical rows `[start, stop)` (NumPy, the space's structure)."""
        return self.get(self.actor.read.remote(int(start), int(stop)))

    # ------------------------------------------------------------------ writes
    def episode_builder(self, episodes_per_call: int = 1, max_in_flight: int = 0,
                        transport: str = "auto") -> "RemoteEpisodeBuilder":
        """A local builder whose finished episodes go to the service `episodes_per_call` per remote call (see
        `RemoteEpisodeBuilder` for `transport`)."""
        return RemoteEpisodeBuilder(self, episodes_per_call=episodes_per_call, max_in_flight=max_in_flight,
                                    transport=transport)

    def node_id(self) -> Optional[str]:
        """The Ray node the service's actor runs on (asked once per client)."""
        if self._node_id is None:
            self._node_id = self.get(self.actor.node_id.remote())
        return self._node_id

    def _episodes(self, episodes: Any) -> List[Episode]:
        if isinstance(episodes, Episode):
            return [episodes]
        if isinstance(episodes, dict) or not isinstance(episodes, (list, tuple)):
            return [episode_from_batch(self.layout, episodes)]
        return [e if isinstance(e, Episode) else episode_from_batch(self.layout, e) for e in episodes]

    def commit_async(self, episodes: Any) -> Any:
        """Checks `episodes` here (an `Episode`, a batch dict of `(n, ...)` arrays, or a list of them) and sends
        them in one call; returns the call's ObjectRef (resolves to the buffer length once they are durable)."""
        eps = self._episodes(episodes)
        if not eps:
            raise ValueError("commit: no episodes given")
        return self.actor.commit.remote([(e.data, e.length) for e in eps])

    def commit(self, episodes: Any) -> int:
        """`commit_async` and wait: returns the buffer length once every given episode is durable."""
        return int(self.get(self.commit_async(episodes)))

    def adopt(self, path: str, remove: bool = False) -> Tuple[int, int]:
        """Makes the service copy every episode of the shard directory `path` (see `write_shard`) in one call;
        returns `(episodes, rows)` once they are durable. `path` must be visible to the actor's node."""
        return tuple(self.get(self.actor.adopt.remote(os.path.abspath(os.fspath(path)), bool(remove))))  # type: ignore[return-value]

    # ------------------------------------------------------------------ reads
    def sampler(self, batch_size: int, *, prefetch: Optional[int] = None, batches_per_call: Optional[int] = None,
                seed: Optional[int] = None) -> "RemoteSampler":
        """A new `RemoteSampler` of `batch_size` rows (prefetch defaults to the client's)."""
        return RemoteSampler(self, batch_size, prefetch=self.prefetch if prefetch is None else prefetch,
                             batches_per_call=batches_per_call, seed=seed)

    def local_sampler(self, batch_size: int, *, seed: Optional[int] = None,
                      directory: Optional[str] = None) -> "LocalSampler":
        """A `LocalSampler`: batches gathered in this process from the buffer directory (read-only, memory-mapped),
        for learners on the actor's node or on a shared filesystem; as fast as an in-process sampler, no remote
        call per batch. `directory` is where this process sees the buffer (default: the actor's path).
        ``FileNotFoundError`` when it is not visible here: use `sampler` from other nodes."""
        from .local_sampler import LocalSampler

        path = self.info()["directory"] if directory is None else os.fspath(directory)
        return LocalSampler(path, batch_size, seed=seed, timeout_s=self.timeout_s)

    def sample(self, batch_size: int) -> Any:
        """A batch of `batch_size` uniformly drawn rows (NumPy arrays, read-only) from a sampler this client keeps
        per batch size, with `prefetch` requests in flight."""
        sampler = self._samplers.get(batch_size)
        if sampler is None:
            sampler = self._samplers[batch_size] = self.sampler(batch_size)
        return sampler.sample()

    # ------------------------------------------------------------------ lifecycle
    def flush(self) -> None:
        """Makes the service dump its buffer (every commit already did)."""
        self.get(self.actor.flush.remote())

    def close(self) -> None:
        """Drops this client's in-flight sampling requests (the service keeps running)."""
        for sampler in self._samplers.values():
            sampler.close()
        self._samplers.clear()

    def shutdown(self) -> int:
        """Closes the buffer (a final dump) and ends the actor; returns the final length. Other clients fail
        afterwards."""
        self.close()
        ray = _ray()
        n = int(self.get(self.actor.close.remote()))
        ray.kill(self.actor, no_restart=True)
        return n


class RemoteEpisodeBuilder:
    """Builds episodes locally and commits them to the service (made by `BufferClient.episode_builder`).

    `append(step)` checks the step and copies it into local arrays (no remote call). `end_episode()` finishes the
    episode (bounds checked) and queues it; every `episodes_per_call` queued episodes go to the service in one call.
    With `max_in_flight=0` that call is waited for, so when `end_episode()` returns after sending, the episodes are
    durable; with `max_in_flight=k > 0` up to `k` calls stay outstanding while the collector builds the next
    episodes (the oldest is waited for first; with direct writes up to `k` reservations and `k` commits: a batch's
    rows are written once its reservation is back, at the next send). `flush()` sends what is queued and waits for everything. Episodes
    that are queued or in flight when the collector dies are lost as wholes; none is ever partly in the buffer.

    `transport`: how episodes reach the buffer. ``"object_store"``: as NumPy arrays in the call (Ray's object
    store; works from any node). ``"shared_memory"``: the builder's arrays live in shared-memory slabs (`_slabs`)
    and a call carries only their names; the actor copies the rows straight from them, which spares the collector
    the serialization and the copy into the object store (needs the actor's node). ``"direct"``: the collector
    writes the rows into the buffer's files itself between a reservation call and a commit call (`_direct`), so
    collectors copy in parallel and the actor only keeps the books (needs the actor's node and a memory-mapped
    storage: the "native" and "flat" layouts; opt-in: on this project's loaded 2-core test machine it did not beat
    shared memory measurably, see docs/ray.md). ``"auto"`` (default): shared memory when this process runs on the
    actor's node, else the object store.
    """

    TRANSPORTS = ("auto", "object_store", "shared_memory", "direct")

    def __init__(self, client: BufferClient, episodes_per_call: int = 1, max_in_flight: int = 0,
                 transport: str = "auto") -> None:
        if episodes_per_call < 1:
            raise ValueError(f"episodes_per_call must be >= 1, got {episodes_per_call}")
        if max_in_flight < 0:
            raise ValueError(f"max_in_flight must be >= 0, got {max_in_flight}")
        if transport not in self.TRANSPORTS:
            raise ValueError(f"transport must be one of {self.TRANSPORTS}, got {transport!r}")
        self.client = client
        self.episodes_per_call = int(episodes_per_call)
        self.max_in_flight = int(max_in_flight)
        self._pool: Optional[SlabPool] = None
        self._direct: Optional[DirectWriter] = None
        if transport != "object_store":
            directory = slab_dir()
            here = str(_ray().get_runtime_context().get_node_id())
            same_node = directory is not None and client.node_id() == here
            if transport in ("shared_memory", "direct") and not same_node:
                raise ValueError(f"transport={transport!r} needs the collector on the actor's node with a writable "
                                 "/dev/shm; use 'auto' or 'object_store'")
            if same_node and directory is not None:
                self._pool = SlabPool(client.layout.shapes, client.layout.dtypes, directory)
            if same_node and transport == "direct":
                self._direct = _direct_writer(client, required=True)
        #: the transport in use: "direct", "shared_memory" or "object_store"
        self.transport = "object_store" if self._pool is None else "shared_memory"
        if self._direct is not None:
            self.transport = "direct"
        self._builder = EpisodeBuilder(client.layout, pool=self._pool)
        self._queued: List[Episode] = []
        self._in_flight: Deque[Tuple[Any, int, int, List[Any]]] = collections.deque()
        # direct writes whose reservation call is out: (reserve ref, episodes, packed rows, slabs)
        self._reserving: Deque[Tuple[Any, List[Episode], List[Any], List[Any]]] = collections.deque()
        #: episodes and rows the service has acknowledged as durable
        self.committed_episodes = 0
        self.committed_rows = 0

    def __len__(self) -> int:
        """Steps of the episode being built."""
        return len(self._builder)

    def append(self, step: Any) -> None:
        """Adds one step (checked now: KeyError / TypeError / ValueError naming the leaf; nothing is added then)."""
        self._builder.append(step)

    def abort_episode(self) -> None:
        """Drops the episode being built."""
        self._builder.abort()

    def end_episode(self, info: Optional[Dict[str, Any]] = None) -> None:
        """Finishes the episode being built and queues it (sent when `episodes_per_call` are queued)."""
        self._queued.append(self._builder.finish(info))
        if len(self._queued) >= self.episodes_per_call:
            self._send()

    def _send(self) -> None:
        if not self._queued:
            return
        episodes, self._queued = self._queued, []
        actor = self.client.actor
        slabs = [e.slab for e in episodes if e.slab is not None]
        direct = self._direct
        if direct is not None and (direct.capacity is None or sum(e.length for e in episodes) <= direct.capacity):
            # packed (so checked) before anything is reserved; the reservation answers while the next episode is
            # built, and its rows are written and committed at the next send (or at once without calls in flight)
            packed = [direct.pack(e.data, e.length) for e in episodes]
            ref = actor.reserve.remote([e.length for e in episodes], os.getpid())
            self._reserving.append((ref, episodes, packed, slabs))
            while len(self._reserving) > self.max_in_flight:
                self._write_reserved()
            return
        if slabs:
            ref = actor.commit_slabs.remote([(e.slab.path, e.slab.rows, e.length) for e in episodes])
        else:
            ref = actor.commit.remote([(e.data, e.length) for e in episodes])
        self._in_flight.append((ref, len(episodes), sum(e.length for e in episodes), slabs))
        while len(self._in_flight) > self.max_in_flight:
            self._wait_oldest()

    def _write_reserved(self) -> None:
        """Waits for the oldest reservation, writes its episodes into the buffer's files, sends their commit."""
        ref, episodes, packed, slabs = self._reserving.popleft()
        try:
            incarnation, placed = self.client.get(ref)
        except BaseException:
            self._give_back(slabs)
            raise
        actor = self.client.actor
        tokens = [token for token, _ in placed]
        try:
            for rows, (_, start) in zip(packed, placed):
                self._direct.write(rows, start)  # type: ignore[union-attr]
        except BaseException:
            actor.cancel_reserved.remote(incarnation, tokens)
            raise
        finally:
            self._give_back(slabs)                       # the rows are in the buffer's files: the slabs are free
        commit = actor.commit_reserved.remote(incarnation, tokens)
        self._in_flight.append((commit, len(episodes), sum(e.length for e in episodes), []))
        while len(self._in_flight) > self.max_in_flight:
            self._wait_oldest()

    def _wait_oldest(self) -> None:
        ref, n_eps, rows, slabs = self._in_flight[0]
        try:
            self.client.get(ref)
        except TimeoutError:
            raise                   # the call may still read its slabs: they stay out of the pool
        except BaseException:
            self._in_flight.popleft()
            self._give_back(slabs)  # the call ended (failed): its slabs are free again
            raise
        self._in_flight.popleft()
        self._give_back(slabs)
        self.committed_episodes += n_eps
        self.committed_rows += rows

    def _give_back(self, slabs: List[Any]) -> None:
        if self._pool is not None:
            for slab in slabs:
                self._pool.give(slab)

    @property
    def queued_episodes(self) -> int:
        """Finished episodes not sent yet."""
        return len(self._queued)

    def flush(self) -> None:
        """Sends the queued episodes and waits until every sent episode is durable."""
        self._send()
        while self._reserving:
            self._write_reserved()
        while self._in_flight:
            self._wait_oldest()

    def close(self) -> None:
        """`flush()`, then removes this builder's shared-memory slabs (the builder is useless afterwards)."""
        try:
            self.flush()
        finally:
            if self._direct is not None:
                self._direct.close()
                self._direct = None
            if self._pool is not None:
                paths = self._pool.paths
                self._pool.close()
                try:
                    self.client.actor.forget_slabs.remote(paths)
                except Exception:   # the actor is gone: nothing maps them
                    pass
                self._pool = None


def _direct_writer(client: BufferClient, required: bool) -> Optional[DirectWriter]:
    """A `DirectWriter` over the service's files when the storage allows direct writes (else None, or ValueError
    when `required`)."""
    info = client.get(client.actor.direct_info.remote())
    if info["supported"]:
        try:
            return DirectWriter(info["directory"], client.layout)
        except (OSError, ValueError) as exc:
            info["why"] = str(exc)
    if required:
        raise ValueError(f"transport='direct' is not possible: {info['why']}; use 'auto' or 'shared_memory'")
    return None


def _split(block: Any, index: slice) -> Any:
    if isinstance(block, dict):
        return {k: _split(v, index) for k, v in block.items()}
    return block[index]


class RemoteSampler:
    """Batches of uniformly drawn rows, fetched `batches_per_call` at a time with `prefetch` calls in flight.

    Each call makes the actor draw ``batches_per_call * batch_size`` indices and gather them with one read per
    array; the block comes back through Ray's object store (zero-copy, read-only NumPy views) and is cut into
    batches here. Rows come from whole committed episodes as of the moment the actor served the call, so a batch
    may lag the newest commits by up to ``prefetch * batches_per_call`` batches. A request lost to an actor restart
    is sent again (every `RESTART_POLL_S` while the actor restarts, up to the client's timeout).
    """

    def __init__(self, client: BufferClient, batch_size: int, *, prefetch: int = 2,
                 batches_per_call: Optional[int] = None, seed: Optional[int] = None) -> None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        if prefetch < 1:
            raise ValueError(f"prefetch must be >= 1, got {prefetch}")
        if batches_per_call is None:
            per_batch = max(1, client.layout.step_bytes * batch_size)
            batches_per_call = max(1, min(256, DEFAULT_BLOCK_BYTES // per_batch))
        if batches_per_call < 1:
            raise ValueError(f"batches_per_call must be >= 1, got {batches_per_call}")
        self.client = client
        self.batch_size = batch_size
        self.prefetch = int(prefetch)
        self.batches_per_call = int(batches_per_call)
        self._seed = seed
        self._calls = 0
        self._pending: Deque[Tuple[Any, Optional[Tuple[int, ...]]]] = collections.deque()
        self._block: Any = None
        self._next = 0

    def _request(self) -> None:
        seed = None if self._seed is None else (int(self._seed), self._calls)
        self._calls += 1
        ref = self.client.actor.sample.remote(self.batch_size, self.batches_per_call, seed)
        self._pending.append((ref, seed))

    def _fetch(self) -> Any:
        ray = _ray()
        while len(self._pending) < self.prefetch:
            self._request()
        ref, seed = self._pending.popleft()
        self._request()
        deadline = time.monotonic() + self.client.timeout_s
        while True:
            try:
                return self.client.get(ref)
            except ray.exceptions.RayActorError:
                # the actor died under the request and Ray restarts it (a request sent while it is still
                # restarting fails too, as ActorUnavailableError): ask again until it answers or the timeout ends
                if time.monotonic() > deadline:
                    raise
                time.sleep(RESTART_POLL_S)
                ref = self.client.actor.sample.remote(self.batch_size, self.batches_per_call, seed)

    def sample(self) -> Any:
        """The next batch (NumPy arrays in the space's structure, `batch_size` rows, read-only)."""
        if self._block is None or self._next >= self.batches_per_call:
            self._block = self._fetch()
            self._next = 0
        b = self._next
        self._next += 1
        return _split(self._block, slice(b * self.batch_size, (b + 1) * self.batch_size))

    def __iter__(self) -> "RemoteSampler":
        return self

    def __next__(self) -> Any:
        return self.sample()

    def close(self) -> None:
        """Cancels the requests in flight, waits (up to the client's timeout) for those already running, and drops
        the current block; their results and errors are discarded."""
        ray = _ray()
        refs = [ref for ref, _ in self._pending]
        for ref in refs:
            try:
                ray.cancel(ref)
            except Exception:       # already finished or the actor is gone: nothing to cancel
                pass
        if refs:
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=self.client.timeout_s)
            for ref in ready:
                try:
                    ray.get(ref, timeout=0)
                except Exception:   # cancelled, or the buffer closed under it: nobody wants this block
                    pass
        self._pending.clear()
        self._block = None


def write_shard(path: str, space: Space, episodes: Sequence[Any], *, storage: StorageSpec = "native") -> int:
    """Writes `episodes` (`Episode`s or batch dicts) into a new buffer directory `path` for `BufferClient.adopt`;
    returns the rows written. Durable when it returns (data, then metadata). Ray is not needed."""
    from ._actor import open_or_create

    if os.path.exists(path) and os.listdir(path):
        raise FileExistsError(f"write_shard: {path} already exists and is not empty")
    from .episodes import commit_episodes

    buffer, _ = open_or_create(os.fspath(path), space_to_json(space), storage, None)
    try:
        layout = EpisodeLayout(buffer.single_space)
        eps = [e if isinstance(e, Episode) else episode_from_batch(layout, e) for e in episodes]
        return commit_episodes(buffer, eps, durable=True)
    finally:
        buffer.close()


__all__ = ["BufferClient", "RemoteEpisodeBuilder", "RemoteSampler", "connect_buffer_service", "start_buffer_service",
           "write_shard", "DEFAULT_TIMEOUT_S"]
