"""torch DistributedDataParallel for the torch trainer, beside Horovod for comparison
(hvdtrain.compare). Started by mpirun, srun or torchrun alike: without torchrun the rendezvous
comes from the launcher's environment. Options DDP cannot honour are refused in hvdtrain/backends.py.
"""
from __future__ import annotations

import contextlib

from hvdtrain.torch.torch_distributed import TorchDistributedBackend


class DDPBackend(TorchDistributedBackend):
    name = "ddp"

    def __init__(self, cfg):
        self._start_process_group()

    def wrap_model(self, model, device):
        from torch.nn.parallel import DistributedDataParallel

        ids = [device.index] if device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=ids)

    def wrap_optimizer(self, optimizer, model, cfg):
        if cfg.fp16_allreduce:
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

            model.register_comm_hook(None, default_hooks.fp16_compress_hook)
        return optimizer

    def no_sync(self, model, optimizer, last_micro_batch: bool):
        return contextlib.nullcontext() if last_micro_batch else model.no_sync()

    def describe(self) -> dict:
        return {"backend": self.name, "process_group": self.dist.get_backend()}
