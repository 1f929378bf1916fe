"""The torch checkpoint file, one format for the trainer and the API around users' own loops.

    path, write, signed = capture(directory, position, model, optimizer, batching=[2, 32])
    writer.save(directory, lambda: (path, write, signed), keep=3)

A dict saved by torch.save: format_version, model and optimizer state dicts, the position's keys
at the top level (checkpoint.Position.to_checkpoint), and what the caller adds (the trainer: its
config, scheduler, GradScaler and RNG states; the loop API: its batching). Captured, it holds the
live tensors: an inline write serialises them at once, a background one stages them to host
memory before the next step (hvdtrain/torch/checkpoint_writer.py)."""
from __future__ import annotations

import os

from hvdtrain import checkpoint as ckpt
from hvdtrain.torch.checkpoint_writer import TorchState


def capture(directory: str, at: ckpt.Position, model, optimizer, samples_in_epoch: int | None = None,
            **extra) -> tuple[str, object, bool]:
    """(path, write, signed) of a checkpoint of `at`: write (a TorchState) holds the live state."""
    state = {"format_version": ckpt.FORMAT_VERSION, **extra, "model": model.state_dict(),
             "optimizer": optimizer.state_dict(), **at.to_checkpoint()}
    path = os.path.join(directory, ckpt.checkpoint_name(at.global_step, at.epoch, "pt",
                                                        samples_in_epoch=samples_in_epoch))
    return path, TorchState(state, model, optimizer), True
