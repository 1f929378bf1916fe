"""Whether a checkpoint fits this run: the options that must match, and a resize's position (the
samples not yet seen of the epoch under way)."""
from __future__ import annotations

import dataclasses

from hvdtrain import options
from hvdtrain.config import TrainConfig
from hvdtrain.errors import UsageError
from hvdtrain.checkpoint.files import FORMAT_VERSION
from hvdtrain.checkpoint.position import Position


def compatible_keys(framework: str) -> tuple[str, ...]:
    """What must match to resume under `framework`'s trainer: the options declared resume=MATCH
    (they change the shape or meaning of the saved state; hvdtrain/config.py), and the classes."""
    return options.resume_keys(TrainConfig, framework, options.MATCH) + ("num_classes",)


def incompatibilities(saved: dict, current: dict) -> list[str]:
    """What differs between a checkpoint's config and this run's (`current`, the trainer's config
    and num_classes), in compatible_keys."""
    diffs = []
    if saved.get("format_version") != FORMAT_VERSION:
        diffs.append(f"format_version: checkpoint {saved.get('format_version')!r}, this hvdtrain {FORMAT_VERSION}")
    for key in compatible_keys(current["framework"]):
        if saved.get(key) != current.get(key):
            diffs.append(f"{key}: checkpoint {saved.get(key)!r}, this run {current.get(key)!r}")
    return diffs


def check_compatible(path: str, saved: dict, current: dict) -> None:
    diffs = incompatibilities(saved, current)
    if diffs:
        # The options that would make this run match it (a model's recipe may have changed its
        # default optimizer since the checkpoint was written).
        given = options.flags(TrainConfig, current["framework"])
        hint = [f"{options.flag(key)} {saved[key]}" for key in compatible_keys(current["framework"])
                if key in given and saved.get(key) is not None and saved.get(key) != current.get(key)]
        advice = f" (to resume it, pass {' '.join(hint)}; or use another --checkpoint-dir)" if hint else \
            " (use another --checkpoint-dir)"
        raise UsageError(f"checkpoint {path} does not match this run: " + "; ".join(diffs) + advice)


# What a resume may change only with --allow-resize (the options declared resume=RESIZE): the
# global batch, hence the LR and the data position (a step of the checkpoint is not a step of
# this run). The world size first: what a resize usually changes.
RESIZE_KEYS = tuple(sorted(options.resume_keys(TrainConfig, "torch", options.RESIZE), key=lambda k: k != "world_size"))


def resize_changes(saved: dict, cfg) -> list[str]:
    return [f"{key.replace('_', ' ')} {saved.get(key)} -> {getattr(cfg, key)}" for key in RESIZE_KEYS
            if saved.get(key) is not None and saved.get(key) != getattr(cfg, key)]


def refuse_resize(path: str, changes: list[str]) -> UsageError:
    return UsageError(f"checkpoint {path} was written with another global batch ({'; '.join(changes)}): resuming "
                      "as is would run at another LR from another data position; --allow-resize resumes it with "
                      "the LR of this run and the position recomputed from the samples seen (or use another "
                      "--checkpoint-dir)")


def rescale_position(position: Position, saved: dict, cfg, steps_per_epoch: int,
                     train_size: int) -> tuple[Position, str]:
    """The position of this run in the checkpoint's epoch, and what changed, in words. The rest
    of that epoch is exactly its samples not yet seen (datasets.rest_of_epoch: the position keeps
    what each earlier world size trained of it), so this run does the steps they fill: with the
    same samples per epoch, as many fewer as the steps before the resize trained samples; fewer
    than one global batch of the epoch is left out, as every epoch leaves out its remainder. The
    epochs after it are whole."""
    epoch, global_step = position.epoch, position.global_step
    per_rank = saved["batch_size"] * saved["batches_per_allreduce"]
    old_batch = per_rank * saved["world_size"]
    trained = position.steps_into_order * per_rank
    seen_before = position.seen_before + (((saved["world_size"], trained),) if trained else ())
    seen = sum(size * samples for size, samples in seen_before)
    rest_steps = (train_size - seen) // cfg.world_size // (cfg.batch_size * cfg.batches_per_allreduce)
    new_step_in_epoch = max(0, steps_per_epoch - rest_steps)
    new_global_step = epoch * steps_per_epoch + new_step_in_epoch
    note = (f"resumed with another global batch: {saved['world_size']} rank(s) x {saved['batch_size']} x "
            f"{saved['batches_per_allreduce']} = {old_batch} at LR {saved.get('lr')} -> {cfg.world_size} x "
            f"{cfg.batch_size} x {cfg.batches_per_allreduce} = {cfg.global_batch_size} at LR {cfg.lr:g}; "
            f"{seen} samples of epoch {epoch + 1} seen: step {position.step_in_epoch} (global {global_step}) -> "
            f"step {new_step_in_epoch} (global {new_global_step}); the epoch's other {train_size - seen} samples "
            f"follow, each once")
    return dataclasses.replace(position, step_in_epoch=new_step_in_epoch, global_step=new_global_step,
                               seen_before=seen_before, order_start=new_step_in_epoch), note
