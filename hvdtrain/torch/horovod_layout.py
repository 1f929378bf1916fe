"""Horovod's torch ops take contiguous tensors only ("Tensor is required to be contiguous"), and a
model in channels-last memory format has non-contiguous 4-d weights, gradients and optimizer state
(17 of ResNet-18's 122 state tensors). These helpers give Horovod contiguous tensors and put the
results back, so that a channels-last model trains under Horovod as it does under DDP:

    hvd.DistributedOptimizer(opt, compression=ContiguousCompression(hvd.Compression.none), ...)
    broadcast_tensors(hvd, model.state_dict().items()); contiguous_optimizer_state(opt)

The copies are of the 4-d weights only, which are small beside the activations channels-last is for.
"""
from __future__ import annotations

import torch


class ContiguousCompression:
    """A Horovod compressor that hands the allreduce a contiguous copy of a non-contiguous gradient
    (and the gradient itself otherwise); Horovod then sets the parameter's .grad to the result,
    whose layout differs from the parameter's, which the optimizer's arithmetic accepts."""

    def __init__(self, inner):
        self.inner = inner

    def compress(self, tensor):
        return self.inner.compress(tensor.contiguous())

    def decompress(self, tensor, ctx):
        return self.inner.decompress(tensor, ctx)


def broadcast_tensors(hvd, named_tensors, root_rank: int = 0) -> None:
    """hvd.broadcast_parameters for any layout: non-contiguous tensors travel as contiguous copies,
    copied back into the originals afterwards."""
    pairs = list(named_tensors)
    staged = [(name, t if t.is_contiguous() else t.contiguous()) for name, t in pairs]
    hvd.broadcast_parameters(staged, root_rank=root_rank)
    for (_, original), (_, copy) in zip(pairs, staged):
        if copy is not original:
            original.copy_(copy)


def contiguous_optimizer_state(optimizer) -> None:
    """Replace non-contiguous optimizer state (momentum buffers copied from channels-last
    gradients) by contiguous copies, which hvd.broadcast_optimizer_state can broadcast."""
    for state in optimizer.state.values():
        for key, value in state.items():
            if torch.is_tensor(value) and not value.is_contiguous():
                state[key] = value.contiguous()
