"""The resume, one policy for every entry point: rank 0 finds the newest checkpoint that loads,
every rank learns the outcome."""
from __future__ import annotations


from hvdtrain.errors import UsageError, in_one_line
from hvdtrain.checkpoint.files import check_writable, list_checkpoints, move_aside, remove_stale_temporaries


def resume_on_rank0(backend, is_rank0: bool, checkpoint_dir: str, load, say, name: str) -> dict:
    """Every rank: rank 0 walks checkpoint_dir's checkpoints newest first and `load(path)` puts one
    into the model and optimizer, returning what every rank needs (a dict with "path" and
    "position"); every rank gets that dict ({} for none) and fails together with rank 0's line, or
    none does: an error on rank 0 alone would leave the others waiting in their next collective.

    `load` raising a UsageError means the checkpoint reads but is not for this run (another model,
    a refused resize): no older one is either, so the walk ends there. Any other exception means
    it is damaged (a crash, a full disk, a bad copy): it gives way to the one before, and once one
    loads the damaged ones are moved aside, each with a line, or a requeued job would fail on them
    at every requeue until a person came. When none loads, starting afresh would silently lose the
    run: an error naming the newest."""
    status = None
    if is_rank0:
        try:
            status = _newest_that_loads(checkpoint_dir, load, say)
        except UsageError as err:
            status = {"error": str(err)}
    status = backend.broadcast_object(status, name)
    if status.get("error"):
        raise UsageError(status["error"])
    return status


def _newest_that_loads(checkpoint_dir: str, load, say) -> dict:
    problem = check_writable(checkpoint_dir, None, None)  # found now, not after an epoch's work
    if problem:
        raise UsageError(problem)
    for path in remove_stale_temporaries(checkpoint_dir):
        say(f"removed {path}, left by an interrupted checkpoint write")
    damaged = []  # (path, reason), newest first
    for path in reversed(list_checkpoints(checkpoint_dir)):
        try:
            status = load(path)
        except UsageError:
            raise
        except Exception as err:  # noqa: BLE001 - any failure to read is reported by path
            damaged.append((path, in_one_line(err)))
            continue
        for bad, reason in damaged:
            try:
                moved = f"moved to {move_aside(bad)}"
            except OSError as err:  # a read-only directory: resume all the same
                moved = f"left in place ({err.strerror or err})"
            say(f"checkpoint {bad} is unreadable or corrupt ({reason}): {moved}; resuming from {path}")
        return status
    if damaged:
        path, reason = damaged[0]
        others = f"; so are the {len(damaged) - 1} older ones" if len(damaged) > 1 else ""
        raise UsageError(f"checkpoint {path} is unreadable or corrupt ({reason}){others}")
    return {}
