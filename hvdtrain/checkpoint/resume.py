"""Rank 0 finds the newest checkpoint that reads; every rank learns the outcome (the APIs around
users' own loops)."""
from __future__ import annotations


from hvdtrain.errors import UsageError, in_one_line
from hvdtrain.checkpoint.files import check_writable, list_checkpoints, remove_stale_temporaries


def load_newest(checkpoint_dir: str, read, say) -> tuple[str | None, object]:
    """Rank 0, for the APIs around users' own loops: (path, read(path)) of the newest checkpoint of
    checkpoint_dir that reads, or (None, None) when it holds none. The directory must be writable
    (found now, not after an epoch's work); a crash's temporaries are removed; an unreadable
    checkpoint (a crash, a bad copy) is said and gives way to the one before; when none reads,
    starting afresh would silently lose the run: a UsageError, as is any `read` raises."""
    problem = check_writable(checkpoint_dir, None, None)
    if problem:
        raise UsageError(problem)
    remove_stale_temporaries(checkpoint_dir)
    unreadable = None
    for path in reversed(list_checkpoints(checkpoint_dir)):
        try:
            return path, read(path)
        except UsageError:
            raise
        except Exception as err:  # noqa: BLE001 - reported by path
            unreadable = f"checkpoint {path} is unreadable ({in_one_line(err)})"
            say(f"{unreadable}: trying the one before")
    if unreadable:
        raise UsageError(f"{unreadable}, and no older one reads")
    return None, None


def resume_on_rank0(backend, is_rank0: bool, checkpoint_dir: str, read, take, say, name: str) -> dict:
    """Every rank, for the APIs around users' own loops: rank 0 finds the newest checkpoint that
    reads (load_newest) and `take(path, found)` puts it into the model and optimizer, returning
    what every rank needs ({"path": ..., "position": ...}) or raising a UsageError (it reads but
    does not fit: no older one will); every rank learns the outcome ({} for none) and fails
    together with rank 0's line, or none does."""
    status = None
    if is_rank0:
        try:
            path, found = load_newest(checkpoint_dir, read, say)
            status = {} if path is None else take(path, found)
        except UsageError as err:
            status = {"error": str(err)}
    status = backend.broadcast_object(status, name)
    if status.get("error"):
        raise UsageError(status["error"])
    return status
