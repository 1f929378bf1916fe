"""The scaling model: a data-parallel step's time at N GPUs from one GPU's measured step, the
gradient exchange's alpha-beta cost, the input pipeline's and the file system's rates.

Weak scaling (the batch per GPU fixed, as hvdtrain's --batch-size is): a step at N GPUs is

    max(compute + exposed exchange + optimizer,  input,  file system)

- compute: forward and backward on one GPU (measured); optimizer: the step after the exchange.
- exchange: the gradients in buckets (Horovod's fusion buffers, DDP's buckets) allreduced one
  after the other on one channel, each as soon as the backward has produced it (gradients
  appear through the backward, the last layers' first) and the channel is free: a ring
  allreduce of S bytes over n GPUs takes 2(n-1)/n x S / busbw + its latency (nccl-tests'
  bus-bandwidth definition; intra-node bandwidth within a node, the network's across nodes);
  Horovod sends, each cycle, all that is ready in fused buffers of up to its threshold, one
  after the other (its tensor fusion), so a buffer may wait up to a cycle (its coordination
  round) before it goes. What ends after the backward is exposed; the step is
  called exchange-bound when that is over a fifth of it.
- input: a GPU's decode workers at their measured rate each; file system: the node's share of
  the read rate and the file system's aggregate, at the bytes a sample takes.

E(N) = step(1) / step(N); img/s(N) = N x batch / step(N). What it is blind to (stragglers, a
congested or shared network, a changed global batch's effect on accuracy) is said in BLIND."""
from __future__ import annotations

import math
from dataclasses import dataclass

BLIND = ("blind to stragglers (one slow GPU or node sets every step), to a network shared with other jobs "
         "or congested by the topology, to the file system's load from other jobs, to ranks sharing a node's "
         "cores (CPU ranks), and to what a larger global batch does to accuracy and to the epochs needed")


@dataclass(frozen=True)
class Cluster:
    """A cluster partition's figures (hvdtrain/predict/clusters/*.toml)."""
    name: str
    gpus_per_node: int
    cores_per_gpu: int
    intra_busbw_gbs: float      # allreduce bus bandwidth within a node, GB/s (nccl-tests' busbw)
    inter_busbw_gbs: float      # across nodes, GB/s (the network: what one ring gets per GPU)
    intra_latency_s: float = 5e-6
    inter_latency_s: float = 10e-6
    fs_node_gbs: float = math.inf       # the file system's read rate one node gets, GB/s
    fs_aggregate_gbs: float = math.inf  # all nodes together, GB/s
    slurm_preset: str = ""      # hvdtrain.slurm's --preset for its nodes ("": none)
    # Whether the exchange runs beside the backward: on GPUs (NCCL) it does; ranks on CPUs do its
    # work on the cores the backward uses, and nothing overlaps.
    overlap: bool = True
    sources: tuple[str, ...] = ()


@dataclass(frozen=True)
class Exchange:
    """How a backend exchanges gradients. DDP: fixed buckets, each allreduced once its gradients
    are all there. Horovod (`cycle_s`): every cycle its background thread fuses all that is ready
    and not yet sent into allreduces of up to the threshold, one after the other on the channel."""
    name: str
    bucket_bytes: int           # Horovod: the fusion threshold; DDP: bucket_cap_mb (25 MiB)
    cycle_s: float = 0.0        # Horovod's cycle (0: fixed buckets)


# Horovod 0.28's 128 MiB fusion threshold and its 1 ms cycle (hvdtrain/cluster/tuning.py keeps both).
HOROVOD = Exchange("horovod", 128 * 2**20, 0.001)
DDP = Exchange("ddp", 25 * 2**20, 0.0)
EXCHANGES = {"horovod": HOROVOD, "ddp": DDP}


def exchanges_in(env: dict) -> dict[str, Exchange]:
    """The exchanges as an environment has them: Horovod's fusion threshold (bytes) and cycle time
    (ms) from HOROVOD_FUSION_THRESHOLD and HOROVOD_CYCLE_TIME, else its defaults; DDP's buckets.
    A value that is not a finite number above 0 is a ValueError (fusion off, threshold 0, needs
    the tensors' sizes, which the model does not have)."""
    threshold = _setting(env, "HOROVOD_FUSION_THRESHOLD", HOROVOD.bucket_bytes)
    cycle_s = horovod_cycle_s(env)
    if not (math.isfinite(threshold) and threshold >= 1):
        raise ValueError(f"HOROVOD_FUSION_THRESHOLD={threshold:g} and HOROVOD_CYCLE_TIME={cycle_s * 1e3:g} ms: the "
                         "model fuses into buffers of at least a byte every cycle, and knows no tensor sizes for an "
                         "exchange without fusion")
    return {"horovod": Exchange("horovod", int(threshold), cycle_s), "ddp": DDP}


def horovod_cycle_s(env: dict) -> float:
    """Horovod's cycle in seconds as an environment has it (HOROVOD_CYCLE_TIME, ms; else 1 ms);
    a value that is not a finite number above 0 is a ValueError."""
    cycle_ms = _setting(env, "HOROVOD_CYCLE_TIME", HOROVOD.cycle_s * 1e3)
    if not (math.isfinite(cycle_ms) and cycle_ms > 0):
        raise ValueError(f"HOROVOD_CYCLE_TIME={cycle_ms:g} ms: the model needs Horovod's cycle, a time above 0")
    return cycle_ms / 1e3


def _setting(env: dict, name: str, default: float) -> float:
    try:
        return float(env.get(name, default))
    except (TypeError, ValueError) as err:
        raise ValueError(f"Horovod's settings do not read as numbers ({err})") from None


@dataclass(frozen=True)
class Workload:
    """One GPU's measured step and what the data costs."""
    batch: int                    # samples per GPU per step
    compute_s: float              # forward + backward, one GPU
    optimizer_s: float            # the rest of the step but the exchange: the optimizer, data waits, bookkeeping
    gradient_bytes: int           # what is allreduced a step (parameters x bytes per gradient)
    backward_fraction: float = 2 / 3  # the backward's share of compute: when gradients appear
    input_s: float = 0.0          # one GPU's batch through its decode workers (0: in memory)
    sample_bytes: float = 0.0     # bytes read from the file system per sample (0: none)


def ring_allreduce_s(nbytes: float, gpus: int, cluster: Cluster) -> float:
    """A ring allreduce of nbytes over `gpus` GPUs packed gpus_per_node to a node."""
    if gpus <= 1 or nbytes <= 0:
        return 0.0
    nodes = math.ceil(gpus / cluster.gpus_per_node)
    busbw = cluster.intra_busbw_gbs if nodes == 1 else min(cluster.intra_busbw_gbs, cluster.inter_busbw_gbs)
    # A ring's 2(n-1) steps, 2(nodes-1) of them across nodes (NCCL's own ring model counts so).
    latency = (2 * (gpus - 1) - 2 * (nodes - 1)) * cluster.intra_latency_s + 2 * (nodes - 1) * cluster.inter_latency_s
    return 2 * (gpus - 1) / gpus * nbytes / (busbw * 1e9) + latency


def exposed_exchange_s(work: Workload, gpus: int, cluster: Cluster, exchange: Exchange) -> float:
    """The exchange's time after the backward ends: gradients appear evenly through the backward
    (the last layers' first) and are allreduced in order on one channel, in DDP's fixed buckets
    or as Horovod fuses them each cycle."""
    if gpus <= 1 or work.gradient_bytes <= 0:
        return 0.0
    backward = work.compute_s * work.backward_fraction if cluster.overlap else 0.0
    begin = work.compute_s - backward

    def ready(t: float) -> float:  # bytes of gradients the backward has produced by time t
        return work.gradient_bytes * min(1.0, max(0.0, (t - begin) / backward)) if backward > 0 else work.gradient_bytes

    sent, t = 0.0, begin
    if not exchange.cycle_s:  # fixed buckets: each when its last gradient is there
        while sent < work.gradient_bytes:
            size = min(exchange.bucket_bytes, work.gradient_bytes - sent)
            t = max(t, begin + backward * (sent + size) / work.gradient_bytes) + ring_allreduce_s(size, gpus, cluster)
            sent += size
        return max(0.0, t - work.compute_s)
    # Horovod: each cycle, what is ready and not yet sent goes out in fused buffers of up to the
    # threshold, one after the other until none is left ("until there are no more tensors to
    # reduce in this cycle", Horovod's tensor-fusion docs), on a free channel.
    while sent < work.gradient_bytes - 1:
        t = exchange.cycle_s * (math.floor(t / exchange.cycle_s) + 1)  # the next cycle
        ready_now = ready(t) - sent
        if ready_now <= 0:
            continue
        full, rest = divmod(ready_now, exchange.bucket_bytes)
        t += full * ring_allreduce_s(exchange.bucket_bytes, gpus, cluster) + ring_allreduce_s(rest, gpus, cluster)
        sent += ready_now
    return max(0.0, t - work.compute_s)


@dataclass(frozen=True)
class Step:
    gpus: int
    seconds: float
    images_per_s: float
    efficiency: float
    bound: str             # compute | exchange | input | file system
    exposed_s: float


def _paths(work: Workload, gpus: int, cluster: Cluster, exchange: Exchange) -> tuple[dict, float]:
    """Each path's seconds a step (the step is the longest), and the exposed exchange."""
    exposed = exposed_exchange_s(work, gpus, cluster, exchange)
    paths = {"compute": work.compute_s + work.optimizer_s + exposed, "input": work.input_s}
    if work.sample_bytes:
        per_step = work.batch * work.sample_bytes / 1e9  # GB a GPU reads a step
        paths["file system"] = max(min(gpus, cluster.gpus_per_node) * per_step / cluster.fs_node_gbs,
                                   gpus * per_step / cluster.fs_aggregate_gbs)
    return paths, exposed


def step(work: Workload, gpus: int, cluster: Cluster, exchange: Exchange) -> Step:
    """The step at `gpus` GPUs, its rate, E(N) against one GPU and the phase that bounds it."""
    paths, exposed = _paths(work, gpus, cluster, exchange)
    bound = max(paths, key=paths.get)
    seconds = paths[bound]
    if bound == "compute" and exposed > 0.2 * seconds:
        bound = "exchange"
    one = max(_paths(work, 1, cluster, exchange)[0].values())
    return Step(gpus, seconds, gpus * work.batch / seconds, one / seconds, bound, exposed)


def gpu_hours_per_epoch(samples: int, result: Step) -> float:
    return samples / result.images_per_s * result.gpus / 3600
