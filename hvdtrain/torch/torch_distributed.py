"""What the torch backends built on torch.distributed share (DDP, Accelerate): the env://
rendezvous from whichever launcher started the ranks, and the collectives hvdtrain's trainer
needs (hvdtrain.collectives), over the default process group (Gloo for CPU tensors)."""
from __future__ import annotations

import importlib
import os
import socket

import numpy as np
import torch

from hvdtrain.cluster import ClusterEnv, free_port
from hvdtrain.errors import UsageError
from hvdtrain.netsockets import single_host


def ddp_rendezvous(env: ClusterEnv) -> tuple[str, int]:
    """Master address and port for DDP without torchrun: rank 0's host, and a
    port picked free by rank 0 and shared over MPI (srun and mpirun alike). Never a fixed constant
    or one derived from the job id: two jobs on one node must not collide, and a port some other
    program holds must not end the job ("srun: Force Terminated")."""
    if "MASTER_ADDR" in os.environ and "MASTER_PORT" in os.environ:
        return os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    if env.launcher == "horovodrun":
        raise UsageError("--backend ddp under horovodrun needs MASTER_ADDR and MASTER_PORT exported "
                         "(or launch with mpirun, srun or torchrun)")
    if env.launcher in ("openmpi", "slurm"):
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
        host = "127.0.0.1" if single_host(env) else socket.gethostname()  # all ranks here: loopback
        addr_port = comm.bcast((host, free_port()) if comm.rank == 0 else None, root=0)
        return addr_port
    return "127.0.0.1", free_port()


def export_torch_distributed_env() -> ClusterEnv:
    """torch.distributed's env:// variables (MASTER_ADDR/PORT, RANK, WORLD_SIZE, LOCAL_RANK) from
    whichever launcher started this rank; torchrun has set them already."""
    env = ClusterEnv.from_environ()
    if env.launcher not in ("torchrun", "single"):
        addr, port = ddp_rendezvous(env)
        os.environ.update(MASTER_ADDR=str(addr), MASTER_PORT=str(port), RANK=str(env.rank),
                          WORLD_SIZE=str(env.world_size), LOCAL_RANK=str(env.local_rank),
                          LOCAL_WORLD_SIZE=str(env.local_world_size))
    elif env.launcher == "single":
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(free_port()))
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")
    return env


def import_optional(module: str, backend: str, library: str):
    """The optional library a comparison backend needs (extra [compare]); missing, one line."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise UsageError(f"--backend {backend} needs {library}, which is not importable ({err}); "
                         "pip install 'hvdtrain[compare]' (bash scripts/setup.sh installs it)") from None


class TorchDistributedCollectives:
    """Needs self.dist (torch.distributed, initialised) and self.world_size."""

    def _start_process_group(self) -> ClusterEnv:
        """init_process_group over env:// from whichever launcher started this rank; sets
        self.dist, rank, world_size, local_rank, local_world_size. On GPUs, NCCL for the gradients
        and Gloo for what stays on the CPU (the metric sums and the stop vote, objects): NCCL alone
        fails on a CPU tensor ("No backend type associated with device type cpu"), as the first
        GPU run of the DDP backend showed."""
        env = export_torch_distributed_env()
        self.dist = torch.distributed
        self.dist.init_process_group("cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo",
                                     init_method="env://")
        self.rank, self.world_size = self.dist.get_rank(), self.dist.get_world_size()
        self.local_rank, self.local_world_size = env.local_rank, env.local_world_size
        return env

    def backward(self, loss):
        loss.backward()

    def step(self, optimizer, scaler):
        if scaler is None:
            optimizer.step()
        else:
            scaler.step(optimizer)
            scaler.update()

    def broadcast_state(self, model, optimizer, optimizer_state: bool):
        # DDP broadcast parameters and buffers when it wrapped the model; the optimizer state
        # (only after a resume) goes as an object.
        if optimizer_state:
            optimizer.load_state_dict(self.broadcast_object(optimizer.state_dict()))

    def average_buffers(self, model):
        pass  # DDP broadcasts rank 0's buffers at every forward: they are equal already.

    def allreduce_sum(self, values: np.ndarray, name: str) -> np.ndarray:
        out = torch.tensor(np.asarray(values, dtype=np.float64))  # a copy, on the CPU (Gloo)
        self.dist.all_reduce(out, op=self.dist.ReduceOp.SUM)
        return out.numpy()

    def broadcast_object(self, obj, name: str | None = None):
        box = [obj]
        self.dist.broadcast_object_list(box, src=0)
        return box[0]

    def allgather_object(self, obj, name: str | None = None) -> list:
        out = [None] * self.world_size
        self.dist.all_gather_object(out, obj)
        return out

    def barrier(self):
        self.dist.barrier()

    def shutdown(self):
        self.dist.destroy_process_group()
