"""Horovod for the torch trainer: the product's backend (hvdtrain/backends.py lists them all).

The optimizer does the communication (`hvd.DistributedOptimizer`, allreduce hooked into backward),
rank 0's weights and optimizer state are broadcast at the start, and BatchNorm statistics are
averaged before evaluation and checkpoints.
"""
from __future__ import annotations

import contextlib

import numpy as np
import torch

from hvdtrain.cluster.env import shared_gpu_nccl_problem
from hvdtrain.errors import UsageError
from hvdtrain.cluster.horovod_ops import gpu_ops_problem, import_horovod, start_horovod
from hvdtrain.torch.backend import TorchBackend
from hvdtrain.torch.devices import nccl_version, shared_gpu
from hvdtrain.torch.horovod_layout import ContiguousCompression, broadcast_tensors, contiguous_optimizer_state


class HorovodBackend(TorchBackend):
    name = "horovod"

    def __init__(self, cfg):
        self.hvd = hvd = import_horovod("horovod.torch")
        problem = gpu_ops_problem(torch.cuda.device_count() if torch.cuda.is_available() else 0,
                                  hvd.cuda_built(), hvd.nccl_built(), getattr(hvd, "__version__", ""))
        if problem:
            raise UsageError(problem)
        self.tuning = start_horovod(hvd, cfg, not torch.cuda.is_available())
        self.rank, self.local_rank = hvd.rank(), hvd.local_rank()
        self.world_size, self.local_world_size = hvd.size(), hvd.local_size()
        # Ranks sharing a GPU (HVDTRAIN_SHARE_GPU=1, a test mode): Horovod's NCCL ops need an NCCL
        # that allows it. Horovod links the libnccl.so.2 torch loads (set-up builds it so), so
        # torch's version is Horovod's; refused here in one line, not by NCCL at the first step.
        if hvd.nccl_built() and shared_gpu(self.local_world_size):
            problem = shared_gpu_nccl_problem(nccl_version())
            if problem:
                raise UsageError(problem)
        # Adasum's optimizer combines the ranks' updates inside step() and cannot skip that sync.
        self.adasum = cfg.use_adasum

    def wrap_model(self, model, device):
        return model  # Horovod: the optimizer does the communication, the model stays as is.

    def wrap_optimizer(self, optimizer, model, cfg):
        hvd = self.hvd
        # Horovod: average gradients over ranks, hooked into backward so that allreduce overlaps
        # with the rest of the backward pass. Contiguous copies of channels-last gradients.
        compression = hvd.Compression.fp16 if cfg.fp16_allreduce else hvd.Compression.none
        return hvd.DistributedOptimizer(
            optimizer, named_parameters=model.named_parameters(), compression=ContiguousCompression(compression),
            backward_passes_per_step=cfg.batches_per_allreduce,
            op=hvd.Adasum if cfg.use_adasum else hvd.Average)

    # no_sync and backward: the defaults. Horovod's optimizer counts backward passes itself
    # (backward_passes_per_step), and its hooks start each gradient's allreduce as it is ready.

    def finish_gradients(self, optimizer):
        # Wait for the allreduces backward started here, not inside step(): the trainer times the
        # wait apart from the update (hvdtrain/phases.py), and AMP must unscale averaged gradients.
        optimizer.synchronize()

    def step(self, optimizer, scaler):
        synchronized = contextlib.nullcontext() if self.adasum else optimizer.skip_synchronize()
        with synchronized:  # finish_gradients synchronized (Adasum: its step does)
            if scaler is None:
                optimizer.step()
                return
            scaler.unscale_(optimizer)
            scaler.step(optimizer)
        scaler.update()

    def broadcast_state(self, model, optimizer, optimizer_state: bool):
        # Horovod: every rank starts from rank 0's optimizer state and weights.
        if optimizer_state:
            # Only after a resume, and before the weights: on ranks whose optimizer is still empty
            # Horovod creates the state with a zero-gradient step, which weight decay turns into a
            # small real update of those ranks' weights. Broadcasting the weights after it undoes that.
            contiguous_optimizer_state(optimizer)  # channels-last momentum buffers
            self.hvd.broadcast_optimizer_state(optimizer, root_rank=0)
        broadcast_tensors(self.hvd, model.state_dict().items(), root_rank=0)  # any memory format

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

    def broadcast_object(self, obj, name: str):
        return self.hvd.broadcast_object(obj, root_rank=0, name=name)

    def allgather_object(self, obj, name: str) -> list:
        return self.hvd.allgather_object(obj, name=name)

    def barrier(self):
        self.hvd.barrier()

    def describe(self) -> dict:
        from hvdtrain.result_file import horovod_build_flags

        return {"backend": self.name, "horovod_build_flags": horovod_build_flags(self.hvd),
                "horovod_tuning": self.tuning}

    def shutdown(self):
        self.hvd.shutdown()
