"""Where this process sits in the job: read once from the launcher's environment.

Every part of hvdtrain that needs rank, node list or job id asks `ClusterEnv.from_environ()`:
SLURM (`srun`), OpenMPI (`mpirun`), Horovod's launcher (`horovodrun`) and torchrun are known.
One exception: the rank that an error line names is read by hvdtrain/errors.py's `rank_label`
in the same launcher order, as this module raises its `UsageError`.

    python -c "from hvdtrain.cluster.env import ClusterEnv; print(ClusterEnv.from_environ())"
"""
from __future__ import annotations

import os
import random
import socket
import subprocess
from dataclasses import dataclass, field

from hvdtrain.errors import UsageError


def expand_hostlist(nodelist: str) -> list[str]:
    """`node[01-03],gpu7` -> ['node01', 'node02', 'node03', 'gpu7']."""
    if not nodelist:
        return []
    try:
        import hostlist  # python-hostlist

        return hostlist.expand_hostlist(nodelist)
    except ImportError:
        out = subprocess.run(["scontrol", "show", "hostnames", nodelist], check=True,
                             capture_output=True, text=True).stdout
        return out.split()


def _int(environ, *names: str, default: int | None = None) -> int | None:
    for name in names:
        if environ.get(name, "") != "":
            return int(environ[name])
    return default


@dataclass(frozen=True)
class ClusterEnv:
    launcher: str            # slurm | openmpi | horovodrun | torchrun | single
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    num_nodes: int
    hosts: list[str] = field(default_factory=list)
    job_id: str | None = None

    @property
    def is_rank0(self) -> bool:
        return self.rank == 0

    @property
    def master_addr(self) -> str:
        return self.hosts[0] if self.hosts else "127.0.0.1"

    @classmethod
    def from_environ(cls, environ=None) -> "ClusterEnv":
        e = os.environ if environ is None else environ
        job_id = e.get("SLURM_JOB_ID")
        # Under srun the SLURM_* task variables are per task; under mpirun inside an
        # allocation only the job-level ones exist, so check the launcher's own first.
        # errors.rank_label reads rank and size in this same order: change both together.
        if "OMPI_COMM_WORLD_RANK" in e:
            world = int(e["OMPI_COMM_WORLD_SIZE"])
            local_world = _int(e, "OMPI_COMM_WORLD_LOCAL_SIZE", default=world)
            return cls("openmpi", int(e["OMPI_COMM_WORLD_RANK"]),
                       _int(e, "OMPI_COMM_WORLD_LOCAL_RANK", default=0), world, local_world,
                       max(1, world // max(1, local_world)), _slurm_hosts(e), job_id)
        if "HOROVOD_RANK" in e:
            return cls("horovodrun", int(e["HOROVOD_RANK"]), _int(e, "HOROVOD_LOCAL_RANK", default=0),
                       int(e["HOROVOD_SIZE"]), _int(e, "HOROVOD_LOCAL_SIZE", default=1),
                       _int(e, "HOROVOD_CROSS_SIZE", default=1), _slurm_hosts(e), job_id)
        if "SLURM_PROCID" in e and "SLURM_STEP_ID" in e:
            world = _int(e, "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", default=1)
            nodes = _int(e, "SLURM_STEP_NUM_NODES", "SLURM_NNODES", default=1)
            local_world = _local_tasks(e.get("SLURM_STEP_TASKS_PER_NODE")
                                       or e.get("SLURM_TASKS_PER_NODE", ""),
                                       e.get("SLURM_NODEID", "0"), world // max(1, nodes))
            return cls("slurm", int(e["SLURM_PROCID"]), _int(e, "SLURM_LOCALID", default=0),
                       world, local_world, nodes,
                       expand_hostlist(e.get("SLURM_STEP_NODELIST") or e.get("SLURM_JOB_NODELIST", "")),
                       job_id)
        if "RANK" in e and "WORLD_SIZE" in e:
            world = int(e["WORLD_SIZE"])
            return cls("torchrun", int(e["RANK"]), _int(e, "LOCAL_RANK", default=0), world,
                       _int(e, "LOCAL_WORLD_SIZE", default=world), max(1, _int(e, "GROUP_WORLD_SIZE", default=1)),
                       [e.get("MASTER_ADDR", "127.0.0.1")], job_id)
        return cls("single", 0, 0, 1, 1, 1, [socket.gethostname()], job_id)


def gpu_for_rank(local_rank: int, local_world_size: int, gpus: int, environ=None) -> int | None:
    """Which of the `gpus` GPUs this process sees its rank computes on (an index: cuda:N, TF's
    N-th GPU), or None for the CPU (none visible). hvdtrain's one device decision: the torch
    trainer (hvdtrain/torch/devices.py), the TF backends (hvdtrain/tf/devices.py), Lightning and
    the doctor all take it from here, so the doctor shows what the trainer does.

    Each task sees the node's GPUs (no binding): the ranks of a node take GPUs 0..local size-1.
    The launcher bound each task its own GPU(s) (`bound_per_task`): every rank takes the first
    one it sees, index 0. Otherwise more ranks on the node than visible GPUs is refused: they
    would share GPUs, which NCCL refuses ("Duplicate GPU") or which halves each rank's speed unseen,
    unless HVDTRAIN_SHARE_GPU=1 asks for it (a test mode: `shares_gpu`, below).
    """
    if gpus <= 0:
        return None
    e = os.environ if environ is None else environ
    if bound_per_task(gpus, local_world_size, e):
        return 0
    if local_world_size > gpus and sharing_gpus(e):
        return local_rank % gpus  # a test mode (SHARE_GPU_VARIABLE): ranks take turns on the GPUs
    if local_world_size > gpus:
        node = node_gpus(local_world_size, e)
        shared = (f" (Slurm bound each task to {gpus} of this node's {node} GPUs, shared with other tasks: "
                  "srun --gpus-per-task=1 or --gpu-bind=single:1 gives each task its own)"
                  if node is not None and node >= local_world_size else "")
        raise UsageError(f"{local_world_size} ranks on this node but {gpus} visible GPU(s): hvdtrain runs one rank "
                         f"per GPU; start {gpus} task(s) per node (srun --ntasks-per-node={gpus}, mpirun -npernode "
                         f"{gpus}) or make the node's other GPUs visible (CUDA_VISIBLE_DEVICES){shared}")
    return local_rank


# A test mode, not a way to train: several local ranks on one GPU. On a real node that is a
# misconfiguration (each rank at a fraction of the GPU's speed, unseen), refused above; on a
# machine with one GPU it is the only way to run the multi-rank GPU paths (NCCL between ranks,
# the broadcast from a GPU, a feeder per rank). NCCL >= 2.30 allows it when told so
# (NCCL_MULTI_RANK_GPU_ENABLE=1); older ones refuse it ("Duplicate GPU detected").
SHARE_GPU_VARIABLE = "HVDTRAIN_SHARE_GPU"
NCCL_SHARED_GPU_MIN = (2, 30, 0)


def sharing_gpus(environ=None) -> bool:
    """Whether HVDTRAIN_SHARE_GPU=1 asks to let the local ranks share the visible GPUs."""
    e = os.environ if environ is None else environ
    return e.get(SHARE_GPU_VARIABLE, "").strip().lower() in ("1", "yes", "true", "on")


def shares_gpu(local_world_size: int, gpus: int, environ=None) -> bool:
    """Whether gpu_for_rank puts several local ranks on one GPU (asked for, and more ranks than GPUs)."""
    return 0 < gpus < local_world_size and sharing_gpus(environ) and not bound_per_task(gpus, local_world_size,
                                                                                         environ)


def shared_gpu_nccl_problem(nccl_version: tuple | None) -> str | None:
    """One line when ranks sharing a GPU would meet an NCCL that refuses them (older than 2.30)."""
    if nccl_version is not None and tuple(nccl_version) >= NCCL_SHARED_GPU_MIN:
        return None
    have = ".".join(map(str, nccl_version)) if nccl_version else "none"
    need = ".".join(map(str, NCCL_SHARED_GPU_MIN[:2]))
    return (f"{SHARE_GPU_VARIABLE}=1 puts several ranks on one GPU, which needs NCCL >= {need} "
            f"(NCCL_MULTI_RANK_GPU_ENABLE); this process loads NCCL {have}: load a newer libnccl.so.2 "
            "(LD_PRELOAD), or reduce through host memory (Horovod built without GPU ops; DDP uses Gloo then)")


def node_gpus(local_world_size: int, environ=None) -> int | None:
    """The GPUs the scheduler gave this node's tasks together, or None where it does not say.
    SLURM_GPUS_ON_NODE (Slurm >= 21.08) counts the step's GPUs on the node and is the same in
    every task, also when each task sees only its own; before 21.08, SLURM_GPUS_PER_TASK
    ("[type:]N", comma-separated per type) times the node's tasks."""
    e = os.environ if environ is None else environ
    if e.get("SLURM_GPUS_ON_NODE", "").strip().isdigit():
        return int(e["SLURM_GPUS_ON_NODE"])
    per_task = [part.rsplit(":", 1)[-1].strip() for part in e.get("SLURM_GPUS_PER_TASK", "").split(",") if part]
    if per_task and all(n.isdigit() for n in per_task):
        return sum(map(int, per_task)) * local_world_size
    return None


def bound_per_task(gpus: int, local_world_size: int, environ=None) -> bool:
    """Whether each task of the node sees only GPUs of its own: srun --gpus-per-task=N (which
    implies --gpu-bind=per_task:N), --gpu-bind=single:1 or map_gpu, or a site's default binding
    (a task prolog or wrapper that sets CUDA_VISIBLE_DEVICES per task). Slurm then narrows
    CUDA_VISIBLE_DEVICES (and SLURM_STEP_GPUS) to the task's own GPUs, but SLURM_GPUS_ON_NODE
    keeps the step's count on the node: a task that sees fewer GPUs than the node holds, where the
    node holds enough for every task to have as many as this one (gpus x tasks <= node's), has
    its own. Ranks really sharing GPUs fail the second test: 2 tasks and 1 GPU on the node
    (SLURM_GPUS_ON_NODE=1), or --gpu-bind=single:2 (2 GPUs for 4 tasks, each seeing one), or
    --gpu-bind=closest handing a socket's 2 GPUs to its 2 tasks. Where nothing says how many GPUs
    the node holds (mpirun outside Slurm), nothing shows binding: sharing is assumed, and refused."""
    node = node_gpus(local_world_size, environ)
    return node is not None and gpus < node and gpus * local_world_size <= node


def free_port() -> int:
    """A TCP port free on this host now, for a rendezvous whose port is chosen before its listener
    starts (shared first: MASTER_PORT, TF_CONFIG, a Slurm daemon's configuration). Taken below the
    kernel's ephemeral range, whose ports the kernel hands to any process's connection or bind to
    port 0: an ephemeral port found free can be taken so before the listener binds it (seen:
    EADDRINUSE, with the test suite's two lanes side by side); below the range only a program that
    asks for that number gets it. An ephemeral one where the range leaves no room below it."""
    low = ephemeral_ports()[0]
    draw = random.SystemRandom()
    for _ in range(64) if low > 2048 else ():
        port = draw.randrange(max(1024, low // 2), low)
        with socket.socket() as s:
            try:
                s.bind(("", port))
            except OSError:  # taken, or lingering after a close
                continue
            return port
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def ephemeral_ports(path: str = "/proc/sys/net/ipv4/ip_local_port_range") -> tuple[int, int]:
    """The kernel's range of ports for connections and bind to 0 (Linux's default 32768-60999)."""
    try:
        with open(path) as f:
            low, high = (int(v) for v in f.read().split()[:2])
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


def _slurm_hosts(e) -> list[str]:
    return expand_hostlist(e.get("SLURM_JOB_NODELIST", "")) if "SLURM_JOB_NODELIST" in e else []


def _local_tasks(tasks_per_node: str, node_id: str, default: int) -> int:
    """SLURM_TASKS_PER_NODE is like '4(x2),3': the count for node `node_id`."""
    counts: list[int] = []
    for part in filter(None, tasks_per_node.split(",")):
        if "(x" in part:
            n, rep = part.rstrip(")").split("(x")
            counts += [int(n)] * int(rep)
        else:
            counts.append(int(part))
    idx = int(node_id or 0)
    if not counts:
        return max(1, default)  # not given: the even share
    if idx >= len(counts):
        # A fallback here would give this node's ranks another local size than Slurm's, and
        # with it another share of the cores and GPUs.
        raise UsageError(f"Slurm says this is node {idx} (SLURM_NODEID) of a step whose tasks per node "
                         f"'{tasks_per_node}' list {len(counts)} node(s): the step's variables disagree")
    return counts[idx]
