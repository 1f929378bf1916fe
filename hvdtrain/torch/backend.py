"""What the torch trainer (hvdtrain/torch/train.py) asks of its backend, declared once: every
backend of hvdtrain/backends.py for torch subclasses `TorchBackend`.

Abstract methods are how a backend communicates and must be written by each; the others are
optional capabilities whose default, here, is what Horovod and DDP do. A backend that differs
overrides them (Accelerate: its sharding of the loaders, backward and metric gathering; Lightning:
its own loop, `owns_loop = True`). The trainer never asks whether a backend has a method.

    b.wrap_model(model, device); b.wrap_optimizer(optimizer, model, cfg); b.broadcast_state(...)
    for each step: with b.no_sync(...): b.backward(loss); b.finish_gradients(opt); b.step(opt, scaler)
"""
from __future__ import annotations

import abc
import contextlib
from typing import ClassVar

import numpy as np

from hvdtrain.collectives import Collectives


class TorchBackend(Collectives):
    local_world_size: int  # ranks on this host: which GPU is this rank's
    # True: the backend runs the epochs itself (`fit`), driving the trainer through its loop API
    # (hvdtrain/trainer.py); the trainer's own loop and phase marks are then not used.
    owns_loop: ClassVar[bool] = False
    # True: the loaders' batches may be fetched ahead on the device feeder's thread
    # (hvdtrain/torch/feeder.py). False where the backend reads its loader's progress while the
    # loop runs (Accelerate: gather_for_metrics drops the padding once its loader says it ended).
    loaders_read_ahead: ClassVar[bool] = True
    # How the loaders share the batches among the ranks (hvdtrain/torch/loader.py): "per rank",
    # each rank its own; "interleaved", every rank's batches in one loader that adopt_loader
    # hands to a library sharding by batches.
    loader_sharding: ClassVar[str] = "per rank"

    # ------------------------------------------------------------------ set-up
    @abc.abstractmethod
    def wrap_model(self, model, device):
        """The model the loop calls (DistributedDataParallel, ...; the model itself if the backend
        communicates elsewhere). Checkpoints keep the unwrapped model's state."""

    @abc.abstractmethod
    def wrap_optimizer(self, optimizer, model, cfg):
        """The optimizer the loop steps (Horovod's DistributedOptimizer, ...), given the wrapped model."""

    @abc.abstractmethod
    def broadcast_state(self, model, optimizer, optimizer_state: bool) -> None:
        """Every rank takes rank 0's weights, and its optimizer state when `optimizer_state` (a resume)."""

    @abc.abstractmethod
    def average_buffers(self, model) -> None:
        """Every rank: one set of BatchNorm running statistics on every rank, the backend's own
        (Horovod's: their mean over ranks; DDP's: rank 0's, which it broadcasts every forward)."""

    # ------------------------------------------------------------------ one step
    def no_sync(self, model, optimizer, last_micro_batch: bool):
        """The context of one micro-batch's forward and backward: where the backend can, gradients
        are reduced only on the last one (--batches-per-allreduce)."""
        return contextlib.nullcontext()

    def backward(self, loss) -> None:
        loss.backward()

    def finish_gradients(self, optimizer) -> None:
        """Wait for the gradients' reduction that backward started (none left by default: DDP's
        finishes inside backward)."""

    def step(self, optimizer, scaler) -> None:
        """The optimizer step, through the AMP scaler when there is one."""
        if scaler is None:
            optimizer.step()
        else:
            scaler.step(optimizer)
            scaler.update()

    # ------------------------------------------------------------------ data and metrics
    def adopt_loader(self, loader):
        """The loader the loop iterates, from hvdtrain's (hvdtrain/torch/loader.py): itself by default."""
        return loader

    def gather_for_metrics(self, tensors):
        """The per-sample validation figures this rank sums: its own batch's, by default."""
        return tensors

    def validation_totals(self, sums: np.ndarray) -> np.ndarray:
        """The validation sums over the whole set, from this rank's sums of what
        gather_for_metrics returned: reduced over ranks, by default."""
        return self.allreduce_sum(sums, "val_sums")

    # ------------------------------------------------------------------ a loop of its own
    def fit(self, trainer) -> dict:
        """Run `trainer`'s epochs in the backend's own loop; the result of `trainer.finish`.
        Called only when `owns_loop`."""
        raise NotImplementedError(f"--backend {self.name} runs the trainer's loop (owns_loop is False)")
