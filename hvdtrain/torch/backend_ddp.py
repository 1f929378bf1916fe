"""torch DistributedDataParallel for the torch trainer, beside Horovod for comparison
(hvdtrain.compare). Started by mpirun, srun or torchrun alike: without torchrun the rendezvous
comes from the launcher's environment. Options DDP cannot honour are refused in hvdtrain/backends.py.
"""
from __future__ import annotations

import contextlib
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


class DDPBackend:
    name = "ddp"

    def __init__(self, cfg, cores_per_rank: int):
        import torch.distributed as dist

        self.dist = dist
        env = ClusterEnv.from_environ()
        if env.launcher not in ("torchrun", "single"):
            addr, port = ddp_rendezvous(env)
            os.environ.update(MASTER_ADDR=str(addr), MASTER_PORT=str(port), RANK=str(env.rank),
                              WORLD_SIZE=str(env.world_size), LOCAL_RANK=str(env.local_rank))
        elif env.launcher == "single":
            os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
            os.environ.setdefault("MASTER_PORT", str(free_port()))
            os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
        # On GPUs, NCCL for the gradients and Gloo for what stays on the CPU (the metric sums and
        # the stop vote, objects): NCCL alone fails on a CPU tensor ("No backend type associated
        # with device type cpu"), as the first GPU run of this backend showed.
        dist.init_process_group("cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo", init_method="env://")
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.local_rank, self.local_world_size = env.local_rank, env.local_world_size

    def wrap_model(self, model, device):
        from torch.nn.parallel import DistributedDataParallel

        ids = [device.index] if device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=ids)

    def unwrap(self, model):
        return model.module

    def wrap_optimizer(self, optimizer, model, cfg):
        if cfg.fp16_allreduce:
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

            model.register_comm_hook(None, default_hooks.fp16_compress_hook)
        return optimizer

    def no_sync(self, model, optimizer, last_micro_batch: bool):
        return contextlib.nullcontext() if last_micro_batch else model.no_sync()

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

    def describe(self) -> dict:
        return {"backend": self.name, "process_group": self.dist.get_backend()}

    def shutdown(self):
        self.dist.destroy_process_group()
