"""The torch checkpoint file, one format for the trainer and the API around users' own loops.

    path, write, signed = capture(directory, position, model, optimizer, batching=[2, 32])
    writer.save(directory, lambda: (path, write, signed), keep=3)

A dict saved by torch.save: format_version, model and optimizer state dicts, the position's keys
at the top level (checkpoint.Position.to_checkpoint), and what the caller adds (the trainer: its
config, scheduler, GradScaler and RNG states; the loop API: its batching). Its tensors are copied
to host memory when captured, so that the next steps may run while a thread writes it."""
from __future__ import annotations

import os

import torch

from hvdtrain import checkpoint as ckpt
from hvdtrain.torch.devices import copy_to_host


def capture(directory: str, at: ckpt.Position, model, optimizer, samples_in_epoch: int | None = None,
            **extra) -> tuple[str, object, bool]:
    """(path, write(fileobj), signed) of a checkpoint of `at`, its state in host memory now."""
    state = copy_to_host({"format_version": ckpt.FORMAT_VERSION, **extra, "model": model.state_dict(),
                          "optimizer": optimizer.state_dict(), **at.to_checkpoint()})
    path = os.path.join(directory, ckpt.checkpoint_name(at.global_step, at.epoch, "pt",
                                                        samples_in_epoch=samples_in_epoch))
    return path, lambda f: torch.save(state, f), True
