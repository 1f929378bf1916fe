"""The learning-rate schedule as a plain function of the optimizer step, for every trainer.

    >>> from hvdtrain.config import TrainConfig
    >>> f = lr_factor(TrainConfig(world_size=2, warmup_epochs=1, lr_schedule="constant"), 10, 100)
    >>> [round(f(s), 2) for s in (0, 5, 10, 50)]
    [0.5, 0.75, 1.0, 1.0]

The result multiplies `cfg.lr`; both trainers use it (torch through LambdaLR).
"""
from __future__ import annotations

import math


def lr_factor(cfg, steps_per_epoch: int, total_steps: int):
    """Multiplier of cfg.lr at an optimizer step: linear warm-up from the one-rank LR
    (Goyal et al.) over cfg.warmup_epochs, then cfg.lr_schedule over the remaining steps."""
    warmup = int(cfg.warmup_epochs * steps_per_epoch)
    start = cfg.base_lr / cfg.lr if cfg.lr else 1.0

    def factor(step: int) -> float:
        if step < warmup:
            return start + (1 - start) * step / warmup
        return decay_factor(cfg.lr_schedule, (step - warmup) / max(1, total_steps - warmup))
    return factor


def decay_factor(schedule: str, progress: float) -> float:
    """The schedule after warm-up, at `progress` in [0, 1] of the post-warm-up steps."""
    if schedule == "constant":
        return 1.0
    if schedule == "cosine":
        return 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
    return 0.1 ** sum(progress >= m for m in (0.3, 0.6, 0.8))  # step
