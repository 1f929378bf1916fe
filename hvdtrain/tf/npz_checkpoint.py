"""TensorFlow's checkpoint file, one layout for every writer (the trainer, the Keras callbacks, the
GradientTape loop): an .npz archive of plain arrays, read without pickle.

    meta            JSON: format_version, position (epoch, step_in_epoch, global_step, history),
                    num_model, num_optimizer, and what its writer adds (config, written_by, ...)
    model/<i>       the model's variables, in the order the writer listed them
    optimizer/<i>   the optimizer's

The arrays are copies taken when the state is captured (`capture`): a background write
(hvdtrain/checkpoint/writer.py) reads them while the next steps update the variables.
"""
from __future__ import annotations

import json
import os
import zipfile

import numpy as np

from hvdtrain import checkpoint as ckpt

PARTS = ("model", "optimizer")


def capture(directory: str, at: ckpt.Position, variables: dict, meta: dict) -> tuple[str, object]:
    """(path, write(fileobj)) of a checkpoint at position `at` holding `variables` ({part: [tf
    variables]}, PARTS in order) and `meta`, the values copied now."""
    values = {part: [np.array(v.numpy(), copy=True) for v in variables[part]] for part in PARTS}
    meta = {"format_version": ckpt.FORMAT_VERSION, **meta, **at.to_checkpoint(),
            **{f"num_{part}": len(values[part]) for part in PARTS}}
    arrays = {"meta": np.array(json.dumps(meta)),
              **{f"{part}/{i}": a for part in PARTS for i, a in enumerate(values[part])}}
    batch = (meta.get("config") or {}).get("global_batch_size")  # the trainer's; Keras fit's callback has none
    path = os.path.join(directory, ckpt.checkpoint_name(at.global_step, at.epoch, "npz",
                                                        samples_in_epoch=at.step_in_epoch * batch if batch else None))
    return path, lambda f: np.savez(f, **arrays)


def read(path: str) -> tuple[dict, dict]:
    """(meta, {part: [arrays]}) of a checkpoint; ValueError (or an archive's own error) when it
    is not one."""
    if not zipfile.is_zipfile(path):
        raise ValueError("not an .npz archive")
    with np.load(path, allow_pickle=False) as saved:
        meta = json.loads(str(saved["meta"]))
        return meta, {part: [saved[f"{part}/{i}"] for i in range(meta[f"num_{part}"])] for part in PARTS}


def mismatch(variables: dict, arrays: dict) -> str | None:
    """Why `arrays` (read's) do not fit `variables` ({part: [variables]}), or None."""
    for part in PARTS:
        saved, live = arrays[part], variables[part]
        if len(saved) != len(live):
            return f"{part}: {len(saved)} arrays saved for {len(live)} variables"
        for var, value in zip(live, saved):
            if tuple(var.shape) != value.shape:
                return f"{part} variable {var.name}: shape {tuple(var.shape)}, saved {value.shape}"
    return None


def assign(variables: dict, arrays: dict) -> None:
    """Every variable takes its saved value (mismatch() first)."""
    for part in PARTS:
        for var, value in zip(variables[part], arrays[part]):
            var.assign(value)
