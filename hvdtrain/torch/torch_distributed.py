"""What the torch backends built on torch.distributed share (DDP, Accelerate, Lightning): the
env:// rendezvous from whichever launcher started the ranks, and the collectives hvdtrain's
trainer needs (hvdtrain.collectives), over the default process group (Gloo for CPU tensors)."""
from __future__ import annotations

import importlib
import os
import socket

import numpy as np
import torch

from hvdtrain.cluster.env import ClusterEnv, shared_gpu_nccl_problem
from hvdtrain.errors import UsageError
from hvdtrain.cluster.horovod_ops import check_launcher_agrees
from hvdtrain.cluster.netsockets import single_host
from hvdtrain.torch.backend import TorchBackend
from hvdtrain.torch.devices import nccl_version, shared_gpu


def _store_for(env: ClusterEnv):
    """The TCPStore the ranks meet at, when hvdtrain starts it (None: torch's env:// does): rank 0
    listens on a socket it bound itself and still holds, so no other program can take the port
    between its choice and the store's start (a port found free, released, then bound could be),
    and on the loopback interface when every rank is on this host; the others learn its address
    over MPI (srun and mpirun alike). Never a fixed port or one derived from the job id: two jobs
    on one node must not collide ("srun: Force Terminated")."""
    if "MASTER_ADDR" in os.environ and "MASTER_PORT" in os.environ:
        return None  # the user's rendezvous (and torchrun's) wins
    if env.launcher == "horovodrun":
        raise UsageError("--backend ddp under horovodrun needs MASTER_ADDR and MASTER_PORT exported "
                         "(or launch with mpirun, srun or torchrun)")
    if env.launcher not in ("openmpi", "slurm", "single"):
        return None
    local = single_host(env)
    address = None
    listener = None
    if env.rank == 0:
        listener = socket.create_server(("127.0.0.1" if local else "", 0), family=socket.AF_INET, backlog=128)
        address = ("127.0.0.1" if local else socket.gethostname(), listener.getsockname()[1])
    if env.world_size > 1:
        from mpi4py import MPI

        # Under srun without PMIx each rank is an MPI singleton: its bcast would return its own None.
        check_launcher_agrees(MPI.COMM_WORLD.Get_size(), "MPI", env)
        address = MPI.COMM_WORLD.bcast(address, root=0)
    host, port = address
    # For libraries that read them (Lightning's and Accelerate's environments).
    os.environ.update(MASTER_ADDR=host, MASTER_PORT=str(port))
    store = torch.distributed.TCPStore(host, port, env.world_size, is_master=env.rank == 0,
                                       master_listen_fd=listener.fileno() if listener else None,
                                       wait_for_workers=False)
    if listener:
        listener.detach()  # the store owns the socket now
    return store


def process_group_backend(cuda: bool, shared_gpu: bool, nccl: tuple | None) -> str:
    """torch.distributed's backends: NCCL for GPU tensors, Gloo for the CPU's. Ranks sharing a
    GPU (HVDTRAIN_SHARE_GPU=1, a test mode) with an NCCL that refuses that (older than 2.30)
    reduce GPU tensors with Gloo, through host memory: every path but NCCL itself still runs."""
    if not cuda:
        return "gloo"
    if shared_gpu and shared_gpu_nccl_problem(nccl):
        return "gloo"
    return "cpu:gloo,cuda:nccl"


def start_process_group() -> ClusterEnv:
    """torch.distributed's default group over whichever launcher started this rank, with the
    env:// variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT) exported for libraries
    that read them; torchrun has set them already. On GPUs, NCCL for the gradients and Gloo for
    what stays on the CPU (the metric sums and the stop vote, objects): NCCL alone fails on a
    CPU tensor ("No backend type associated with device type cpu"), as the first GPU run of the
    DDP backend showed."""
    env = ClusterEnv.from_environ()
    if env.launcher != "torchrun":
        os.environ.update(RANK=str(env.rank), WORLD_SIZE=str(env.world_size), LOCAL_RANK=str(env.local_rank),
                          LOCAL_WORLD_SIZE=str(env.local_world_size))
    store = _store_for(env)
    cuda = torch.cuda.is_available()
    backend = process_group_backend(cuda, cuda and shared_gpu(env.local_world_size), nccl_version() if cuda else None)
    if store is None:
        torch.distributed.init_process_group(backend, init_method="env://")
    else:
        torch.distributed.init_process_group(backend, store=store, rank=env.rank, world_size=env.world_size)
    # Every rank's group is whole before any goes on: one that fails right after (a refusal) and
    # exits would otherwise break a peer still in the Gloo handshake, whose traceback ("Connection
    # reset by peer") then hides that peer's own line. A CPU tensor: Gloo's half (barrier() would
    # pick NCCL on GPUs, on GPU 0 of every rank before the trainer sets each rank's device).
    torch.distributed.all_reduce(torch.zeros(1))
    return env


def import_optional(module: str, backend: str, library: str):
    """The optional library a comparison backend needs (extra [compare]); missing, one line."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise UsageError(f"--backend {backend} needs {library}, which is not importable ({err}); "
                         "pip install 'hvdtrain[compare]' (bash scripts/setup.sh installs it)") from None


def state_on_cpu(state):
    """A copy of an optimizer's state_dict whose tensors are all on the CPU."""
    if torch.is_tensor(state):
        return state.cpu()
    if isinstance(state, dict):
        return {key: state_on_cpu(value) for key, value in state.items()}
    if isinstance(state, (list, tuple)):
        return type(state)(state_on_cpu(value) for value in state)
    return state


class TorchDistributedBackend(TorchBackend):
    """A TorchBackend over torch.distributed's default group, which `_start_process_group` starts."""

    def _start_process_group(self) -> ClusterEnv:
        """start_process_group(); sets self.dist, rank, world_size, local_rank, local_world_size."""
        env = start_process_group()
        self.dist = torch.distributed
        self.rank, self.world_size = self.dist.get_rank(), self.dist.get_world_size()
        self.local_rank, self.local_world_size = env.local_rank, env.local_world_size
        return env

    def broadcast_state(self, model, optimizer, optimizer_state: bool):
        # DDP broadcast parameters and buffers when it wrapped the model; the optimizer state
        # (only after a resume) goes as an object, from the CPU: an object broadcast unpickles
        # CUDA tensors onto the device they were saved from (rank 0's GPU) on every rank, and
        # load_state_dict moves each state tensor to its parameter's device, this rank's own.
        if optimizer_state:
            state = state_on_cpu(optimizer.state_dict()) if self.rank == 0 else None
            optimizer.load_state_dict(self.broadcast_object(state, "optimizer_state"))

    def average_buffers(self, model):
        # DDP broadcasts rank 0's buffers before every forward (broadcast_buffers), and each rank's
        # forward then updates its running statistics with its own batch: after a step they
        # differ. DDP's own statistics are rank 0's: every rank takes them, which is what DDP's
        # next forward would do anyway, so a checkpoint in the middle of an epoch leaves the run
        # as it was and a resumed run ends where an uninterrupted one does (an average instead
        # would change rank 0's statistics, and with them the rest of the run).
        if self.world_size == 1:
            return
        for t in model.buffers():
            if t.is_floating_point():
                self.dist.broadcast(t, src=0)

    def allreduce_sum(self, values: np.ndarray, name: str) -> np.ndarray:
        out = torch.tensor(np.asarray(values, dtype=np.float64))  # a copy, on the CPU (Gloo)
        self.dist.all_reduce(out, op=self.dist.ReduceOp.SUM)
        return out.numpy()

    def broadcast_object(self, obj, name: str):
        box = [obj]
        self.dist.broadcast_object_list(box, src=0)
        return box[0]

    def allgather_object(self, obj, name: str) -> list:
        out = [None] * self.world_size
        self.dist.all_gather_object(out, obj)
        return out

    def barrier(self):
        self.dist.barrier()

    def shutdown(self):
        self.dist.destroy_process_group()
