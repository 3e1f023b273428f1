#!/usr/bin/env python
"""The Ray buffer service against the same work in one process, measured in the same run.

Workloads (/work/shared/bench/workloads.py): W1 "proprio" (obs f32[64], action f32[8], reward f32, terminated bool;
50 episodes x 400 steps) and W2 "camera" (W1 + image uint8[128,128,3]; 10 x 300). The buffer is the native layout
(ReplayBuffer(DictStorage, native_layout_kwargs), memory-mapped) in a fresh directory for every measurement.

Collect: every step is a dict of the workload's rows (what an env hands over), appended one at a time; every
episode is durable in the buffer (data, then metadata by atomic rename) before the collector counts it.
  in-process (lib)     ReplayBuffer segment writer: writer.append(step) per step, commit_segment, dumps()
  in-process (batch)   EpisodeBuilder.append(step) per step, commit_episodes(buffer, [episode]) (one write, dumps())
  ray N coll.          N collector actors, each RemoteEpisodeBuilder.append(step) per step; episodes go to the
                       service `episodes_per_call` per call (one call each by default), up to 1 call in flight;
                       transport "auto": on the actor's node that is "shared_memory" (the actor copies each episode
                       from the collector's shared-memory slab into the files)
  ray 2 coll. direct   the same with transport="direct" (each collector reserves rows, writes them into the buffer's
                       files itself and commits; the actor only keeps the books)
  ray 2 coll. object store   the same with transport="object_store" (what collectors on other nodes do)
  ray 2 coll. shards   each collector writes shards of 8 episodes locally (write_shard) and the service adopts them
Sample: batches of 256 uniformly drawn rows.
  in-process           StepSampler(buffer, 256).sample() over the service's files, opened in this process
  local sampler        BufferClient.local_sampler(256): the same files read in this process, with the view check
  remote               BufferClient.sampler(256): prefetch 2, many batches per call for W1 (8 MiB blocks)

Ratios are throughput(ray) / throughput(in-process): above 1 means the service is faster. Targets (issue #8):
W2 2 collectors >= 1.2x, W1 2 collectors >= 0.5x, sampling >= 0.5x (W1 and W2; met by the local sampler, the remote
one is printed for learners on other nodes), each against the in-process (lib) path; the in-process (batch) column
shows the ratio against the fastest in-process path this library has. Every Ray commit is durable before it is
acknowledged, like every in-process episode; commits that reach the actor together share one dump (group commit).

Ray starts its worker processes (the collectors and the buffer actor) at niceness 15 unless RAY_worker_niceness says
otherwise, while the in-process baseline runs in this process at niceness 0: on a machine other jobs load, that
alone starves the Ray side. The bench therefore starts its cluster with the workers at --worker-niceness (default 0,
the baseline's); pass 15 to see Ray's default.

Usage:  .venv/bin/python bench/bench_ray.py [--quick] [--repeats N] [--rounds N] [--worker-niceness N]
"""
from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from typing import Any, Callable, Dict, List, Tuple  # noqa: E402

import numpy as np  # noqa: E402

from unienv_data.integrations.ray import init_local_cluster  # noqa: E402  (before anything imports ray)

sys.path.insert(0, "/work/shared/bench")
from workloads import generate  # type: ignore  # noqa: E402

from unienv_interface.backends import NumpyComputeBackend as B  # noqa: E402
from unienv_interface.space import BinarySpace, BoxSpace, DictSpace  # noqa: E402
from unienv_data.replay_buffer import ReplayBuffer  # noqa: E402
from unienv_data.samplers import StepSampler  # noqa: E402
from unienv_data.storages.dict_storage import DictStorage  # noqa: E402
from unienv_data.storages.native_layout import native_layout_kwargs  # noqa: E402


def make_space(image: bool) -> DictSpace:
    sp = {"obs": BoxSpace(B, -np.inf, np.inf, np.float32, shape=(64,)),
          "action": BoxSpace(B, -1.0, 1.0, np.float32, shape=(8,)),
          "reward": BoxSpace(B, -np.inf, np.inf, np.float32, shape=()),
          "terminated": BinarySpace(B, ())}
    if image:
        sp["image"] = BoxSpace(B, 0, 255, np.uint8, shape=(128, 128, 3))
    return DictSpace(B, sp)


def new_buffer(path: str, space: DictSpace, capacity: int) -> ReplayBuffer:
    return ReplayBuffer.create(DictStorage, space, cache_path=path, capacity=capacity, **native_layout_kwargs(space))


def episodes_of(n_episodes: int, steps: int, rounds: int) -> List[int]:
    return [e % n_episodes for e in range(n_episodes * rounds)]


# ---------------------------------------------------------------------- in-process
def inprocess_lib(root: str, space: DictSpace, data: Dict[str, np.ndarray], eps: List[int], steps: int) -> float:
    rb = new_buffer(os.path.join(root, "lib"), space, len(eps) * steps)
    t0 = time.perf_counter()
    for e in eps:
        w = rb.open_segment_writer()
        for t in range(e * steps, (e + 1) * steps):
            w.append({k: v[t] for k, v in data.items()})
        rb.commit_segment(w)
        rb.dumps()
    dt = time.perf_counter() - t0
    rb.close()
    shutil.rmtree(os.path.join(root, "lib"))
    return dt


def inprocess_batch(root: str, space: DictSpace, data: Dict[str, np.ndarray], eps: List[int], steps: int) -> float:
    from unienv_data.integrations.ray import EpisodeBuilder, EpisodeLayout, commit_episodes

    rb = new_buffer(os.path.join(root, "batch"), space, len(eps) * steps)
    t0 = time.perf_counter()
    builder = EpisodeBuilder(EpisodeLayout(rb.single_space))
    for e in eps:
        for t in range(e * steps, (e + 1) * steps):
            builder.append({k: v[t] for k, v in data.items()})
        commit_episodes(rb, [builder.finish()], durable=True)
    dt = time.perf_counter() - t0
    rb.close()
    shutil.rmtree(os.path.join(root, "batch"))
    return dt


# ---------------------------------------------------------------------- ray
def collector_class(ray: Any) -> Any:
    @ray.remote(num_cpus=0)
    class Collector:
        def __init__(self, data: Dict[str, np.ndarray]) -> None:
            self.data = data                       # zero-copy views into the object store

        def ready(self) -> bool:
            return True

        def run(self, client: Any, eps: List[int], steps: int, per_call: int, in_flight: int,
                transport: str = "auto") -> int:
            builder = client.episode_builder(episodes_per_call=per_call, max_in_flight=in_flight,
                                             transport=transport)
            data = self.data
            for e in eps:
                for t in range(e * steps, (e + 1) * steps):
                    builder.append({k: v[t] for k, v in data.items()})
                builder.end_episode()
            builder.close()
            return builder.committed_rows

        def run_shards(self, client: Any, eps: List[int], steps: int, per_shard: int, root: str) -> int:
            from unienv_data.integrations.ray import EpisodeBuilder, write_shard

            builder = EpisodeBuilder(client.layout)
            data, rows, shard, pending = self.data, 0, 0, []
            for i, e in enumerate(eps):
                for t in range(e * steps, (e + 1) * steps):
                    builder.append({k: v[t] for k, v in data.items()})
                pending.append(builder.finish())
                if len(pending) == per_shard or i == len(eps) - 1:
                    path = os.path.join(root, f"shard-{os.getpid()}-{shard}")
                    shard += 1
                    write_shard(path, client.space, pending)
                    rows += client.adopt(path, remove=True)[1]
                    pending = []
            return rows
    return Collector


def ray_collect(ray: Any, root: str, space: DictSpace, collectors: List[Any], eps: List[int], steps: int,
                per_call: int, shards: bool, transport: str = "auto") -> float:
    from unienv_data.integrations.ray import start_buffer_service

    path = os.path.join(root, "svc")
    client = start_buffer_service(path, space, capacity=len(eps) * steps, timeout_s=300)
    shares = [eps[i::len(collectors)] for i in range(len(collectors))]
    t0 = time.perf_counter()
    if shards:
        refs = [c.run_shards.remote(client, s, steps, per_call, root) for c, s in zip(collectors, shares)]
    else:
        refs = [c.run.remote(client, s, steps, per_call, 1, transport) for c, s in zip(collectors, shares)]
    rows = sum(ray.get(refs, timeout=600))
    dt = time.perf_counter() - t0
    if rows != len(eps) * steps or len(client) != rows:
        raise RuntimeError(f"ray collect wrote {rows} rows, buffer holds {len(client)}, expected {len(eps) * steps}")
    client.shutdown()
    shutil.rmtree(path)
    return dt


# ---------------------------------------------------------------------- sampling
def sampling(ray: Any, root: str, space: DictSpace, data: Dict[str, np.ndarray], steps: int, n_episodes: int,
             calls: int, repeats: int) -> Dict[str, float]:
    """Median seconds per batch of 256 for the in-process sampler, the local sampler and the remote sampler, over
    the same files (interleaved repeats)."""
    from unienv_data.integrations.ray import EpisodeLayout, episode_from_batch, start_buffer_service

    path = os.path.join(root, "sample-svc")
    client = start_buffer_service(path, space, capacity=n_episodes * steps, timeout_s=300)
    layout = EpisodeLayout(client.space)
    for e in range(n_episodes):
        client.commit(episode_from_batch(layout, {k: v[e * steps:(e + 1) * steps] for k, v in data.items()}))
    rb = ReplayBuffer.load_from(path, backend=B)       # the same files, read in this process
    inproc = StepSampler(rb, 256, seed=0)
    local = client.local_sampler(256, seed=0)
    for _ in range(3):
        inproc.sample()
        local.sample()
    times: Dict[str, List[float]] = {"in-process": [], "local": [], "remote": []}
    order = list(times)
    for r in range(repeats):
        for which in (order if r % 2 == 0 else order[::-1]):
            # a fresh remote sampler each time: its pipeline starts empty, so nothing prefetched before the clock
            # started is counted (pessimistic by one round trip)
            remote = client.sampler(256, prefetch=2, seed=r) if which == "remote" else None
            fn: Callable[[], Any] = {"in-process": inproc.sample, "local": local.sample,
                                     "remote": remote.sample if remote is not None else inproc.sample}[which]
            t0 = time.perf_counter()
            for _ in range(calls):
                batch = fn()
                if batch["obs"].shape != (256, 64):
                    raise RuntimeError(f"{which}: batch of shape {batch['obs'].shape}")
            times[which].append((time.perf_counter() - t0) / calls)
            if remote is not None:
                remote.close()
    local.close()
    rb.close()
    client.shutdown()
    shutil.rmtree(path)
    return {k: statistics.median(v) for k, v in times.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer rounds and calls")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workloads", default="W1,W2", help="comma-separated: W1, W2")
    ap.add_argument("--parts", default="collect,sample", help="comma-separated: collect, sample")
    ap.add_argument("--rounds", type=int, default=0,
                    help="times each workload's episodes are collected per measurement (0: W1 1, W2 4; --quick: 1)")
    ap.add_argument("--worker-niceness", type=int, default=0,
                    help="niceness of Ray's worker processes (Ray's own default is 15: below the in-process "
                         "baseline, which runs in this nice-0 process)")
    args = ap.parse_args()
    # Ray starts its workers (collectors, the buffer actor) at niceness 15 unless told otherwise; on a machine
    # that other jobs load, that alone starves them against the nice-0 in-process baseline.
    os.environ["RAY_worker_niceness"] = str(args.worker_niceness)
    parts = set(args.parts.split(","))
    root = tempfile.mkdtemp(prefix="unienv-bench-ray-")
    init_local_cluster(num_cpus=2, object_store_bytes=1 << 30)
    import ray

    Collector = collector_class(ray)
    rows: List[Tuple[str, str, float, float, float, str]] = []
    load = [os.getloadavg()[0]]
    try:
        for name in args.workloads.split(","):
            wl = generate(name)
            steps, n_eps = wl.spec.steps_per_episode, wl.spec.episodes
            image = name == "W2"
            space = make_space(image)
            data = wl.data
            if "collect" in parts:
                rows += collect_rows(ray, Collector, root, name, space, data, steps, n_eps, image, args)
                load.append(os.getloadavg()[0])
            if "sample" in parts:
                calls = (60 if image else 3000) // (3 if args.quick else 1)
                t = sampling(ray, root, space, data, steps, n_eps, calls, args.repeats)
                lim = t["in-process"]
                rows.append((name, "sample(256) in-process", lim * 1e6, 1.0, 1.0, ""))
                rows.append((name, "sample(256) local sampler", t["local"] * 1e6, lim / t["local"], lim / t["local"],
                             ">= 0.5x"))
                rows.append((name, "sample(256) remote, prefetch 2", t["remote"] * 1e6, lim / t["remote"],
                             lim / t["remote"], "(other nodes)"))
                load.append(os.getloadavg()[0])
    finally:
        ray.shutdown()
        shutil.rmtree(root, ignore_errors=True)
    print(f"{'wl':3s} {'what':36s} {'us/step|batch':>14s} {'vs lib':>8s} {'vs batch':>9s}  target")
    for wl_name, what, us, vs_lib, vs_batch, target in rows:
        print(f"{wl_name:3s} {what:36s} {us:14.2f} {vs_lib:7.2f}x {vs_batch:8.2f}x  {target}")
    print("vs lib / vs batch = throughput of the row / throughput of the in-process (lib) / (batch) path, medians of "
          f"{args.repeats} interleaved repeats in this run; collect rows are us per step, sample rows us per batch.")
    print("1-min load average during the run: " + ", ".join(f"{x:.1f}" for x in load)
          + f"; Ray workers at niceness {args.worker_niceness}")
    return 0


def collect_rows(ray: Any, Collector: Any, root: str, name: str, space: DictSpace, data: Dict[str, np.ndarray],
                 steps: int, n_eps: int, image: bool, args: Any) -> List[Tuple[str, str, float, float, float, str]]:
    """The collect rows of one workload: in-process (lib, batch) and the Ray configurations, interleaved."""
    rounds = args.rounds or (1 if not image or args.quick else 4)
    eps = episodes_of(n_eps, steps, rounds)
    ref = ray.put(data)
    collectors = [Collector.remote(ref) for _ in range(2)]
    ray.get([c.ready.remote() for c in collectors], timeout=120)
    configs: List[Tuple[str, int, int, bool, str]] = [
        ("ray 1 coll.", 1, 1, False, "auto"), ("ray 2 coll.", 2, 1, False, "auto"),
        ("ray 2 coll. direct", 2, 1, False, "direct"),
        ("ray 2 coll. object store", 2, 1, False, "object_store")]
    if not image:
        configs += [("ray 2 coll. 8 eps/call", 2, 8, False, "auto"), ("ray 2 coll. shards of 8", 2, 8, True, "auto")]
    times: Dict[str, List[float]] = {k: [] for k in ["lib", "batch"] + [c[0] for c in configs]}
    for r in range(args.repeats):
        times["lib"].append(inprocess_lib(root, space, data, eps, steps))
        times["batch"].append(inprocess_batch(root, space, data, eps, steps))
        for label, n_coll, per_call, shards, transport in configs:
            times[label].append(ray_collect(ray, root, space, collectors[:n_coll], eps, steps, per_call, shards,
                                            transport))
    for c in collectors:
        ray.kill(c)
    del ref
    lib, batch = statistics.median(times["lib"]), statistics.median(times["batch"])
    n_steps = len(eps) * steps
    rows = [(name, "collect in-process (lib)", lib / n_steps * 1e6, 1.0, batch / lib, ""),
            (name, "collect in-process (batch)", batch / n_steps * 1e6, lib / batch, 1.0, "")]
    for label, _n, _per_call, _shards, _transport in configs:
        t = statistics.median(times[label])
        target = ""
        if label == "ray 2 coll.":
            target = ">= 1.2x" if image else ">= 0.5x"
        if label == "ray 2 coll. 8 eps/call":
            target = ">= 0.5x"
        rows.append((name, f"collect {label}", t / n_steps * 1e6, lib / t, batch / t, target))
    return rows


if __name__ == "__main__":
    raise SystemExit(main())
