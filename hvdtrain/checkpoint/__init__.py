"""Checkpoint policy shared by the trainers and the APIs around users' own loops.

Only rank 0 writes. A checkpoint is written to a temporary file in the same directory, flushed,
then renamed over its final name, so a crash mid-write never leaves a truncated checkpoint under
a name that resume would pick. The framework-specific code only supplies `write(fileobj)`.

- files.py: names and their order, atomic writes and signatures, retention, stale temporaries
- position.py: where a run is (Position), when the next interval checkpoint is due (Interval)
- writer.py: rank 0's writes, inline or in the background (Writer)
- compatibility.py: what must match to resume, and a resize's position
- resume.py: the newest checkpoint that reads, for every rank

`from hvdtrain import checkpoint as ckpt` gives all of them under one name.
"""
from hvdtrain.checkpoint.compatibility import (RESIZE_KEYS, check_compatible, compatible_keys, incompatibilities,
                                              refuse_resize, rescale_position, resize_changes)
from hvdtrain.checkpoint.files import (FORMAT_VERSION, SAFE_TORCH, SIGNATURE, STALE_AFTER_SECONDS, TMP_PREFIX,
                                       atomic_write, check_writable, checkpoint_name, current_umask, key_path,
                                       latest_checkpoint, list_checkpoints, move_aside, order_key, prune,
                                       remove_stale_temporaries, sign, signature_matches, temporary_prefix,
                                       torch_is_safe, trust_problem, write_failure)
from hvdtrain.checkpoint.position import Interval, Position
from hvdtrain.checkpoint.resume import resume_on_rank0
from hvdtrain.checkpoint.writer import ThreadWrites, Writer

__all__ = ["RESIZE_KEYS", "check_compatible", "compatible_keys", "incompatibilities", "refuse_resize",
           "rescale_position", "resize_changes", "FORMAT_VERSION", "SAFE_TORCH", "SIGNATURE", "STALE_AFTER_SECONDS",
           "TMP_PREFIX", "atomic_write", "check_writable", "checkpoint_name", "current_umask", "key_path",
           "latest_checkpoint", "list_checkpoints", "move_aside", "order_key", "prune", "remove_stale_temporaries",
           "sign", "signature_matches", "temporary_prefix", "torch_is_safe", "trust_problem", "write_failure",
           "Interval", "Position", "resume_on_rank0", "ThreadWrites", "Writer"]
