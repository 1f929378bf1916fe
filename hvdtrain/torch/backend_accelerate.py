"""Hugging Face Accelerate for the torch trainer, beside Horovod and DDP for comparison
(`python -m hvdtrain.compare --backends ddp,accelerate`), written as the seeds' tutorial does:
an `Accelerator`, `prepare` of the model and the optimizer, `accelerator.backward(loss)`.

Two differences, both for a fair comparison: the rendezvous comes from the launcher (mpirun, srun
or torchrun) as for DDP, instead of `accelerate launch`; and the data loader is hvdtrain's own
(each rank its DistributedSampler shard), not `prepare`d, so that Accelerate sees exactly the
batches DDP and Horovod see and the report's parity check applies. Evaluation reduces (sum,
count) over ranks like every backend. An optional dependency (`pip install 'hvdtrain[compare]'`).
"""
from __future__ import annotations

import contextlib

import torch

from hvdtrain.errors import UsageError
from hvdtrain.torch.torch_distributed import TorchDistributedCollectives, export_torch_distributed_env


def import_accelerate():
    try:
        import accelerate
    except ImportError as err:
        raise UsageError(f"--backend accelerate needs Hugging Face Accelerate, which is not importable ({err}); "
                         "pip install 'hvdtrain[compare]' (bash scripts/setup.sh installs it)") from None
    return accelerate


class AccelerateBackend(TorchDistributedCollectives):
    name = "accelerate"

    def __init__(self, cfg, cores_per_rank: int):
        accelerate = import_accelerate()
        env = export_torch_distributed_env()
        threads = torch.get_num_threads()
        # Accelerate starts the process group itself (Gloo on CPUs, NCCL on GPUs).
        self.accelerator = accelerate.Accelerator(cpu=not torch.cuda.is_available())
        # On CPUs Accelerate sets its own thread count (all cores for one process): keep the
        # trainer's, fixed and recorded for every backend alike (2 threads on a shared core made
        # one rank 10x slower and its losses differ from DDP's).
        torch.set_num_threads(threads)
        self.version = accelerate.__version__
        self.dist = torch.distributed
        if not self.dist.is_initialized():
            # One process: Accelerate starts no process group, hvdtrain's collectives need one.
            self.dist.init_process_group("cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo",
                                         init_method="env://")
        self.rank, self.world_size = self.accelerator.process_index, self.accelerator.num_processes
        self.local_rank, self.local_world_size = env.local_rank, env.local_world_size

    def wrap_model(self, model, device):
        return self.accelerator.prepare_model(model)  # DistributedDataParallel when there are ranks

    def unwrap(self, model):
        return self.accelerator.unwrap_model(model)

    def wrap_optimizer(self, optimizer, model, cfg):
        return self.accelerator.prepare_optimizer(optimizer)

    def no_sync(self, model, optimizer, last_micro_batch: bool):
        return contextlib.nullcontext() if last_micro_batch else self.accelerator.no_sync(model)

    def backward(self, loss):
        self.accelerator.backward(loss)

    def describe(self) -> dict:
        return {"backend": self.name, "accelerate": self.version,
                "distributed_type": str(self.accelerator.distributed_type),
                "process_group": self.dist.get_backend() if self.dist.is_initialized() else None}

    def shutdown(self):
        if self.dist.is_initialized():
            self.dist.destroy_process_group()
