"""Checkpoint files: their names and order, atomic writes (a crash never leaves a truncated file
under a name a resume would pick) and their signatures, retention, temporaries a crash left, and
the outputs' writability."""
from __future__ import annotations

import glob
import hashlib
import hmac
import os
import re
import secrets
import shutil
import socket
import tempfile
import time


FORMAT_VERSION = 1
# ckpt-e<epochs completed>-s<global step>[-n<samples seen in the epoch under way>].<ext>. The n
# field orders checkpoints across a resize: another global batch recomputes the global step from
# the samples seen, so the steps of a run moved to more ranks are smaller than the steps of the
# checkpoints before the move (a name without it is an older checkpoint's, still read).
_NAME = re.compile(r"^ckpt-e(\d+)-s(\d+)(?:-n(\d+))?\.(pt|npz)$")
TMP_PREFIX = ".tmp-hvdtrain-"  # atomic_write's temporary files: + host-pid-random
_TMP_NAME = re.compile(r"^\.tmp-hvdtrain-(?P<host>.+)-(?P<pid>\d+)-[A-Za-z0-9_]+$")
STALE_AFTER_SECONDS = 24 * 3600  # a temporary of another host: its save ended long ago


def write_failure(directory: str, err: BaseException) -> str:
    """One line for a checkpoint that could not be written in `directory`, with the free space there
    and the newest checkpoint, which is still whole."""
    newest = latest_checkpoint(directory)
    cause = err if isinstance(err, OSError) else err.__cause__ or err.__context__
    # torch.save reports a full disk as "[enforce fail ...] unexpected pos": say how full it is.
    reason = cause.strerror if isinstance(cause, OSError) and cause.strerror else \
        (str(err).splitlines()[0] if str(err) else type(err).__name__)
    try:
        free = f"; {shutil.disk_usage(directory).free / 2**20:.1f} MiB free there"
    except OSError:
        free = ""
    return f"could not write a checkpoint in {directory} ({reason}{free}); the newest checkpoint is still {newest or 'none'}"


def current_umask() -> int:
    mask = os.umask(0o022)  # reading the umask means setting it: set it back at once
    os.umask(mask)
    return mask


def temporary_prefix() -> str:
    """The name start of this process's temporary files: whose they are, for the clean-up."""
    return f"{TMP_PREFIX}{socket.gethostname()}-{os.getpid()}-"


def _pid_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


def remove_stale_temporaries(directory: str) -> list[str]:
    """Temporary files an interrupted save of hvdtrain left in `directory` (rank 0 at start-up,
    before it writes any): only this project's own (named by atomic_write), only plain files,
    only when their writer is gone (a process of this host that no longer runs, or a day old).
    A concurrent run's save in flight, and anything else, is left alone."""
    if not directory or not os.path.isdir(directory):
        return []
    removed, host, now = [], socket.gethostname(), time.time()
    for entry in os.scandir(directory):
        m = _TMP_NAME.match(entry.name)
        try:
            if not m or not entry.is_file(follow_symlinks=False):
                continue
            if m["host"] == host and _pid_running(int(m["pid"])):
                continue
            if m["host"] != host and now - entry.stat(follow_symlinks=False).st_mtime < STALE_AFTER_SECONDS:
                continue
            os.unlink(entry.path)
        except OSError:
            continue  # gone meanwhile, or not ours to remove: never a reason to stop a run
        removed.append(entry.path)
    return sorted(removed)


def check_writable(checkpoint_dir: str | None, log_dir: str | None, result_json: str | None) -> str | None:
    """Rank 0, before the first step: every output can be written (directories made, a file
    written and removed in each). The problem, in one line, or None."""
    dirs = [("--checkpoint-dir", checkpoint_dir), ("--log-dir", log_dir)]
    if result_json:
        if os.path.isdir(result_json):
            return f"--result-json {result_json} is a directory; give a file name"
        dirs.append(("--result-json", os.path.dirname(os.path.abspath(result_json))))
    for option, directory in dirs:
        if not directory:
            continue
        if os.path.exists(directory) and not os.path.isdir(directory):
            return f"{option} {directory} is a file, not a directory"
        try:
            os.makedirs(directory, exist_ok=True)
            fd, probe = tempfile.mkstemp(prefix=temporary_prefix(), dir=directory)
            os.close(fd)
            os.unlink(probe)
        except OSError as err:
            return f"{option} {directory} is not writable ({err.strerror or err})"
    return None


def checkpoint_name(global_step: int, epoch: int, ext: str, samples_in_epoch: int | None = None) -> str:
    """The name of a checkpoint at `epoch` epochs completed and `global_step`; with the samples seen
    of the epoch under way (step in epoch x global batch), which orders it after a resize."""
    seen = f"-n{samples_in_epoch:012d}" if samples_in_epoch else ""  # at an epoch's end: none, 0
    return f"ckpt-e{epoch:04d}-s{global_step:08d}{seen}.{ext}"


def order_key(name: str) -> tuple | None:
    """How checkpoint names sort, oldest first; None for a name that is not a checkpoint's. By
    epochs completed, which a resize keeps, then by the samples seen of the epoch under way, which
    it keeps too (the global step it recomputes: smaller after a move to more ranks), then by the
    global step. A name without samples is an epoch's end (0 seen of the next), or was written
    before samples were named: then it is older than every name with them in its epoch, and
    among its kind the global step orders it, as it did."""
    m = _NAME.match(name)
    if not m:
        return None
    return int(m.group(1)), int(m.group(3) or 0), int(m.group(2))


def list_checkpoints(directory: str) -> list[str]:
    """Checkpoints in `directory`, oldest first (order_key)."""
    if not directory or not os.path.isdir(directory):
        return []
    found = []
    for path in glob.glob(os.path.join(directory, "ckpt-*")):
        key = order_key(os.path.basename(path))
        if key is not None:
            found.append((key, path))
    return [p for _, p in sorted(found)]


def latest_checkpoint(directory: str) -> str | None:
    ckpts = list_checkpoints(directory)
    return ckpts[-1] if ckpts else None


def move_aside(path: str) -> str:
    """Rename a damaged checkpoint out of the way of every later resume (the name no longer
    matches a checkpoint's), keeping it for a person to look at. Returns the new path."""
    aside = f"{path}.damaged"
    n = 1
    while os.path.exists(aside):
        n += 1
        aside = f"{path}.damaged-{n}"
    os.replace(path, aside)
    if os.path.exists(path + SIGNATURE):
        os.replace(path + SIGNATURE, aside + SIGNATURE)
    return aside


def atomic_write(path: str, write, signed: bool = False) -> None:
    """Call write(fileobj) on a temporary file beside `path`, fsync, then rename onto `path`.
    signed: its signature (below) is written beside `path` before the rename, so a file under
    its final name is never without one (a job killed in between left unsigned checkpoints)."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=temporary_prefix(), dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            # Signed: the bytes are hashed as they are written, not read back afterwards (a
            # checkpoint of hundreds of MB: that second pass was half the write's time).
            hashing = _Hashing(f) if signed else None
            write(hashing or f)
            f.flush()
            os.fsync(f.fileno())
        # mkstemp makes 0600 files: give the file an ordinary file's mode under the user's umask,
        # so that a project group can read checkpoints and results.
        os.chmod(tmp, 0o666 & ~current_umask())
        if signed:
            digest = hashing.mac.hexdigest()
            atomic_write(path + SIGNATURE, lambda f: f.write(digest.encode()))
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def prune(directory: str, keep: int) -> None:
    for old in list_checkpoints(directory)[:-keep] if keep > 0 else []:
        os.unlink(old)
        if os.path.exists(old + SIGNATURE):
            os.unlink(old + SIGNATURE)


# ---------------------------------------------------------------------------------- signatures
# torch < 2.6 can run code from a crafted file even with torch.load(weights_only=True)
# (CVE-2025-32434), and resume loads whatever newest ckpt-*.pt a shared run directory holds. So
# every torch checkpoint gets a signature beside it (TF's are arrays, read without pickle) (HMAC-SHA256 of its bytes under a key only its
# user can read), and on such a torch only signed ones are loaded unless the user says otherwise.
SIGNATURE = ".sig"
SAFE_TORCH = (2, 6)


def key_path() -> str:
    return os.environ.get("HVDTRAIN_CHECKPOINT_KEY") or os.path.expanduser("~/.config/hvdtrain/checkpoint.key")


def _key() -> bytes:
    """This user's key, made on first use (mode 0600; the first of two racing jobs wins)."""
    path = key_path()
    if not os.path.exists(path):
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=temporary_prefix(), dir=os.path.dirname(path))  # 0600
        with os.fdopen(fd, "wb") as f:
            f.write(secrets.token_bytes(32))
        try:
            os.link(tmp, path)  # never over a key another job made meanwhile
        except FileExistsError:
            pass
        finally:
            os.unlink(tmp)
    with open(path, "rb") as f:
        return f.read()


def _digest(path: str) -> str:
    mac = hmac.new(_key(), digestmod=hashlib.sha256)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            mac.update(block)
    return mac.hexdigest()


class _Hashing:
    """A file being written, its bytes also fed to this user's HMAC (what _digest computes)."""

    def __init__(self, f):
        self.f, self.mac = f, hmac.new(_key(), digestmod=hashlib.sha256)

    def write(self, data) -> int:
        self.mac.update(data)
        return self.f.write(data)

    def flush(self) -> None:
        self.f.flush()


def sign(path: str, contents: str | None = None) -> None:
    """Write the signature of `path` beside it; contents: the file that holds its bytes now (the
    temporary file it is about to be renamed from), if not `path` itself."""
    digest = _digest(contents or path)
    atomic_write(path + SIGNATURE, lambda f: f.write(digest.encode()))


def signature_matches(path: str) -> bool | None:
    """True: signed by this user's key as it is now; False: signed, but the file changed since
    (truncated, damaged or altered); None: no signature beside it."""
    try:
        with open(path + SIGNATURE, "rb") as f:
            saved = f.read().decode(errors="replace").strip()
    except OSError:
        return None
    return hmac.compare_digest(saved, _digest(path))


def torch_is_safe(version: str) -> bool:
    """Whether this torch's weights_only load is safe from crafted files (>= 2.6)."""
    numbers = re.match(r"^(\d+)\.(\d+)", version)
    return bool(numbers) and (int(numbers[1]), int(numbers[2])) >= SAFE_TORCH


def trust_problem(path: str, torch_version: str, trusted: bool) -> str | None:
    """Why `path` must not be loaded by this torch, or None. A file whose signature no longer
    matches raises ValueError: it is damaged (a truncated write, a bad copy) or altered, and
    resume moves it aside for the one before it, as it does any checkpoint that fails to read."""
    if trusted or torch_is_safe(torch_version):
        return None
    matches = signature_matches(path)
    if matches:
        return None
    if matches is False:
        raise ValueError(f"its contents no longer match its signature {os.path.basename(path)}{SIGNATURE} "
                         "(damaged or altered since it was written)")
    return (f"checkpoint {path} carries no signature of this user's hvdtrain ({os.path.basename(path)}{SIGNATURE}, "
            f"key {key_path()}), and torch {torch_version} < 2.6 can run code from a crafted checkpoint even with "
            "weights_only=True (CVE-2025-32434): upgrade torch to 2.6 or later, or pass --trust-checkpoints if "
            "whoever can write this directory is trusted")
