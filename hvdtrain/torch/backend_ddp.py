"""torch DistributedDataParallel for the torch trainer, beside Horovod for comparison
(hvdtrain.compare). Started by mpirun, srun or torchrun alike: without torchrun the rendezvous
comes from the launcher's environment. Options DDP cannot honour are refused in hvdtrain/backends.py.
"""
from __future__ import annotations

import contextlib

import torch

from hvdtrain.torch.torch_distributed import TorchDistributedCollectives, export_torch_distributed_env


class DDPBackend(TorchDistributedCollectives):
    name = "ddp"

    def __init__(self, cfg, cores_per_rank: int):
        import torch.distributed as dist

        self.dist = dist
        env = export_torch_distributed_env()
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

    def describe(self) -> dict:
        return {"backend": self.name, "process_group": self.dist.get_backend()}
