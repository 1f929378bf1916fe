"""Checkpoint policy shared by the trainers: names, atomic writes, retention, compatibility.

Only rank 0 writes. A checkpoint is written to a temporary file in the same directory, flushed,
then renamed over its final name, so a crash mid-write never leaves a truncated checkpoint under
a name that resume would pick. The framework-specific code only supplies `write(fileobj)`.
"""
from __future__ import annotations

import glob
import os
import re
import tempfile

from hvdtrain.errors import UsageError

FORMAT_VERSION = 1
# Config fields that must match to resume: they change the shape or meaning of saved state.
COMPATIBLE_KEYS = ("framework", "model", "dataset", "image_size", "optimizer", "num_classes")
_NAME = re.compile(r"^ckpt-e(\d+)-s(\d+)\.(pt|npz)$")


def checkpoint_name(global_step: int, epoch: int, ext: str) -> str:
    return f"ckpt-e{epoch:04d}-s{global_step:08d}.{ext}"


def list_checkpoints(directory: str) -> list[str]:
    """Checkpoints in `directory`, oldest first (ordered by global step)."""
    if not directory or not os.path.isdir(directory):
        return []
    found = []
    for path in glob.glob(os.path.join(directory, "ckpt-*")):
        m = _NAME.match(os.path.basename(path))
        if m:
            found.append((int(m.group(2)), path))
    return [p for _, p in sorted(found)]


def latest_checkpoint(directory: str) -> str | None:
    ckpts = list_checkpoints(directory)
    return ckpts[-1] if ckpts else None


def atomic_write(path: str, write) -> None:
    """Call write(fileobj) on a temporary file beside `path`, fsync, then rename onto `path`."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def prune(directory: str, keep: int) -> None:
    for old in list_checkpoints(directory)[:-keep] if keep > 0 else []:
        os.unlink(old)


def incompatibilities(saved: dict, current: dict, extra_keys: tuple[str, ...] = ()) -> list[str]:
    """What differs between a checkpoint's config and this run's, in COMPATIBLE_KEYS (+ extra_keys)."""
    diffs = []
    if saved.get("format_version") != FORMAT_VERSION:
        diffs.append(f"format_version: checkpoint {saved.get('format_version')!r}, this hvdtrain {FORMAT_VERSION}")
    for key in COMPATIBLE_KEYS + extra_keys:
        if saved.get(key) != current.get(key):
            diffs.append(f"{key}: checkpoint {saved.get(key)!r}, this run {current.get(key)!r}")
    return diffs


def check_compatible(path: str, saved: dict, current: dict, extra_keys: tuple[str, ...] = ()) -> None:
    diffs = incompatibilities(saved, current, extra_keys)
    if diffs:
        # The options that would make this run match it (a model's recipe may have changed its
        # default optimizer since the checkpoint was written).
        hint = [f"--{key.replace('_', '-')} {saved[key]}" for key in ("model", "dataset", "image_size", "optimizer", *extra_keys)
                if saved.get(key) is not None and saved.get(key) != current.get(key)]
        advice = f" (to resume it, pass {' '.join(hint)}; or use another --checkpoint-dir)" if hint else \
            " (use another --checkpoint-dir)"
        raise UsageError(f"checkpoint {path} does not match this run: " + "; ".join(diffs) + advice)
