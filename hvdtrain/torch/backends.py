"""Data-parallel backends for the torch trainer: Horovod (the product) and DDP (for comparison).

Each answers the same questions: who am I (rank, local_rank, world_size), wrap the model and
the optimizer, broadcast state from rank 0, reduce a metric, agree on an object, barrier, shut
down. Nothing outside this module branches on the backend's name.
"""
from __future__ import annotations

import contextlib
import os
import socket

import numpy as np
import torch

from hvdtrain import tuning
from hvdtrain.cluster import ClusterEnv, free_port
from hvdtrain.errors import UsageError


def make_backend(cfg, cores_per_rank: int):
    if cfg.backend == "horovod":
        on_cpu = not torch.cuda.is_available()
        return HorovodBackend(tuning.horovod_settings(cfg.horovod_tuning, on_cpu, cores_per_rank,
                                                      cfg.cycle_time_ms, cfg.mpi_yield))
    if cfg.backend == "ddp":
        return DDPBackend()
    raise UsageError(f"unknown backend '{cfg.backend}'; valid: horovod, ddp")


def import_horovod_torch():
    try:
        import horovod.torch as hvd
    except ImportError as err:
        if "has not been built" in str(err) or "mpi_lib" in str(err):
            raise UsageError("Horovod is installed without its PyTorch ops (rebuild with "
                             "HOROVOD_WITH_PYTORCH=1: bash scripts/setup.sh); import said: "
                             f"{str(err).splitlines()[0]}") from None
        raise UsageError(f"Horovod is not importable ({err}); run bash scripts/setup.sh") from None
    if not getattr(hvd, "_MPI_LIB_AVAILABLE", True):
        # horovod.torch imports without its compiled ops (it only prints a warning) and then
        # lacks init(): say what is wrong instead of an AttributeError.
        raise UsageError("Horovod is installed without its PyTorch ops (horovod/torch/mpi_lib_v2 is "
                         "missing; rebuild with HOROVOD_WITH_PYTORCH=1: bash scripts/setup.sh)")
    return hvd


class HorovodBackend:
    name = "horovod"

    def __init__(self, settings: dict[str, str]):
        self.hvd = hvd = import_horovod_torch()
        # Knobs read by hvd.init() and MPI_Init: exported first (a user's own export wins).
        self.tuning = tuning.apply(settings)
        hvd.init()  # Horovod: start the background thread and the MPI/Gloo controller.
        self.rank, self.local_rank = hvd.rank(), hvd.local_rank()
        self.world_size, self.local_world_size = hvd.size(), hvd.local_size()

    def wrap_model(self, model, device):
        return model  # Horovod: the optimizer does the communication, the model stays as is.

    def unwrap(self, model):
        return model

    def wrap_optimizer(self, optimizer, model, cfg):
        hvd = self.hvd
        # Horovod: average gradients over ranks, hooked into backward so that allreduce overlaps
        # with the rest of the backward pass.
        return hvd.DistributedOptimizer(
            optimizer, named_parameters=model.named_parameters(),
            compression=hvd.Compression.fp16 if cfg.fp16_allreduce else hvd.Compression.none,
            backward_passes_per_step=cfg.batches_per_allreduce,
            op=hvd.Adasum if cfg.use_adasum else hvd.Average)

    def no_sync(self, model, optimizer, last_micro_batch: bool):
        # Horovod's optimizer counts backward passes itself (backward_passes_per_step).
        return contextlib.nullcontext()

    def step(self, optimizer, scaler):
        if scaler is None:
            optimizer.step()
            return
        # Horovod + AMP: finish the allreduce before unscaling, then step without a second sync.
        optimizer.synchronize()
        scaler.unscale_(optimizer)
        with optimizer.skip_synchronize():
            scaler.step(optimizer)
        scaler.update()

    def broadcast_state(self, model, optimizer, optimizer_state: bool):
        # Horovod: every rank starts from rank 0's optimizer state and weights.
        if optimizer_state:
            # Only after a resume, and before the weights: on ranks whose optimizer is still empty
            # Horovod creates the state with a zero-gradient step, which weight decay turns into a
            # small real update of those ranks' weights. Broadcasting the weights after it undoes that.
            self.hvd.broadcast_optimizer_state(optimizer, root_rank=0)
        self.hvd.broadcast_parameters(model.state_dict(), root_rank=0)

    def average_buffers(self, model):
        """BatchNorm running statistics are per rank under Horovod, which reduces gradients only:
        average them before evaluation and checkpoints."""
        bufs = [(n, t) for n, t in model.named_buffers() if t.is_floating_point()]
        if bufs:
            averaged = self.hvd.grouped_allreduce([t for _, t in bufs], op=self.hvd.Average, name="buffers")
            for (_, t), avg in zip(bufs, averaged):
                t.copy_(avg)

    def allreduce_sum(self, values: np.ndarray, name: str) -> np.ndarray:
        tensor = torch.as_tensor(np.asarray(values, dtype=np.float64))
        return self.hvd.allreduce(tensor, op=self.hvd.Sum, name=f"hvdtrain.{name}").numpy()

    def broadcast_object(self, obj, name: str | None = None):
        return self.hvd.broadcast_object(obj, root_rank=0, name=name)

    def allgather_object(self, obj, name: str | None = None) -> list:
        return self.hvd.allgather_object(obj, name=name)

    def barrier(self):
        self.hvd.barrier()

    def describe(self) -> dict:
        from hvdtrain.results import horovod_build_flags

        return {"backend": self.name, "horovod_build_flags": horovod_build_flags(self.hvd),
                "horovod_tuning": self.tuning}

    def shutdown(self):
        self.hvd.shutdown()


def ddp_rendezvous(env: ClusterEnv) -> tuple[str, int]:
    """Master address and port for DDP without torchrun: the first host of the allocation, and a
    port derived from the SLURM job id (step id too) or, under mpirun, picked free by rank 0 and
    shared over MPI. Never a fixed constant: two jobs on one node must not collide."""
    if "MASTER_ADDR" in os.environ and "MASTER_PORT" in os.environ:
        return os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    if env.launcher == "slurm" and env.job_id:
        step = int(os.environ.get("SLURM_STEP_ID", "0") or 0)
        return env.master_addr, 20000 + (int(env.job_id) * 16 + step) % 20000
    if env.launcher == "horovodrun":
        raise UsageError("--backend ddp under horovodrun needs MASTER_ADDR and MASTER_PORT exported "
                         "(or launch with mpirun, srun or torchrun)")
    if env.launcher in ("openmpi", "slurm"):
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
        addr_port = comm.bcast((socket.gethostname(), free_port()) if comm.rank == 0 else None, root=0)
        return addr_port
    return "127.0.0.1", free_port()


class DDPBackend:
    name = "ddp"

    def __init__(self):
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
        if cfg.use_adasum:
            raise UsageError("--use-adasum is a Horovod feature; DDP has no Adasum")
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
