"""Hugging Face Accelerate for the torch trainer, beside Horovod and DDP for comparison
(`python -m hvdtrain.compare --backends ddp,accelerate`), written as the IDRIS/JSC course material's tutorial does:
an `Accelerator`, `prepare` of the model, the optimizer and the data loaders,
`accelerator.backward(loss)`, `gather_for_metrics` for evaluation.

Two things differ from a stand-alone script, both for a fair comparison: the rendezvous comes from
the launcher (mpirun, srun or torchrun) as for DDP, instead of `accelerate launch`; and the
training loader handed to `prepare` lists every rank's batches interleaved (hvdtrain/torch/loader.py,
`loader_sharding = "interleaved"`), so that Accelerate's sharding (batch k to rank k mod N) gives each
rank exactly the batches DDP and Horovod see, and the report's parity check applies. --amp is the
trainer's autocast and GradScaler around Accelerate's model and optimizer, as for DDP (Accelerate's
own `mixed_precision` does the same on a GPU, and refuses fp16 on a CPU). An optional dependency
(`pip install 'hvdtrain[compare]'`).
"""
from __future__ import annotations

import contextlib

import torch

from hvdtrain.errors import UsageError
from hvdtrain.torch import loader as loader_module
from hvdtrain.torch.torch_distributed import TorchDistributedBackend, import_optional


class AccelerateBackend(TorchDistributedBackend):
    name = "accelerate"
    # Its loader marks the end of the data in Accelerate's GradientState as it yields the last
    # batch, and gather_for_metrics then drops the padding: read ahead, the end would be marked
    # a batch or two early (seen: 19 validation samples counted of 20).
    loaders_read_ahead = False
    loader_sharding = "interleaved"

    def __init__(self, cfg):
        accelerate = import_optional("accelerate", "accelerate", "Hugging Face Accelerate")
        # Started before Accelerate, which adopts a started group (its PartialState), as
        # Lightning does: the rendezvous is then hvdtrain's (loopback on one host, no port race).
        self._start_process_group()
        threads = torch.get_num_threads()
        self.accelerator = accelerate.Accelerator(cpu=not torch.cuda.is_available())
        # On CPUs Accelerate sets its own thread count (all cores for one process): keep the
        # trainer's, fixed and recorded for every backend alike (2 threads on a shared core made
        # one rank 10x slower and its losses differ from DDP's).
        torch.set_num_threads(threads)
        self.version = accelerate.__version__
        if (self.accelerator.process_index, self.accelerator.num_processes) != (self.rank, self.world_size):
            raise UsageError(f"Accelerate sees rank {self.accelerator.process_index} of "
                             f"{self.accelerator.num_processes}, the launcher started rank {self.rank} of "
                             f"{self.world_size}")

    def wrap_model(self, model, device):
        return self.accelerator.prepare_model(model)  # DistributedDataParallel when there are ranks

    def wrap_optimizer(self, optimizer, model, cfg):
        return self.accelerator.prepare_optimizer(optimizer)

    def adopt_loader(self, loader):
        # Training: every rank's batches interleaved, which Accelerate shards back. Validation:
        # the whole set, sharded by Accelerate; it pads the last batches so that every rank has
        # as many, and gather_for_metrics drops the padding again. A copy of a loader whose
        # workers are kept keeps them too, ended with hvdtrain's.
        return loader_module.close_with_kept(self.accelerator.prepare_data_loader(loader))

    def gather_for_metrics(self, tensors):
        return self.accelerator.gather_for_metrics(tensors)

    def validation_totals(self, sums):
        return sums  # every rank summed every sample's figures (gather_for_metrics): nothing to reduce

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
