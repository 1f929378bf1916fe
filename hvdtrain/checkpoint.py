"""Checkpoint policy shared by the trainers: names, atomic writes, retention, compatibility.

Only rank 0 writes. A checkpoint is written to a temporary file in the same directory, flushed,
then renamed over its final name, so a crash mid-write never leaves a truncated checkpoint under
a name that resume would pick. The framework-specific code only supplies `write(fileobj)`.
"""
from __future__ import annotations

import dataclasses
import glob
import hashlib
import hmac
import os
import re
import secrets
import shutil
import socket
import tempfile
import threading
import time

from hvdtrain import options, test_hooks
from hvdtrain.config import TrainConfig
from hvdtrain.errors import UsageError, in_one_line
from hvdtrain.watchdog import WRITING

FORMAT_VERSION = 1
# ckpt-e<epochs completed>-s<global step>[-n<samples seen in the epoch under way>].<ext>. The n
# field orders checkpoints across a resize: another global batch recomputes the global step from
# the samples seen, so the steps of a run moved to more ranks are smaller than the steps of the
# checkpoints before the move (a name without it is an older checkpoint's, still read).
_NAME = re.compile(r"^ckpt-e(\d+)-s(\d+)(?:-n(\d+))?\.(pt|npz)$")
TMP_PREFIX = ".tmp-hvdtrain-"  # atomic_write's temporary files: + host-pid-random
_TMP_NAME = re.compile(r"^\.tmp-hvdtrain-(?P<host>.+)-(?P<pid>\d+)-[A-Za-z0-9_]+$")
STALE_AFTER_SECONDS = 24 * 3600  # a temporary of another host: its save ended long ago


@dataclasses.dataclass(frozen=True)
class Position:
    """Where a run is. A checkpoint stores it as keys at its top level (torch's state dict, TF's
    JSON meta): the first four unchanged since format 1, the last two only after a resize in the
    middle of an epoch (older checkpoints, without them, read as none). to_checkpoint and
    from_checkpoint convert."""
    epoch: int = 0            # epochs completed
    step_in_epoch: int = 0    # optimizer steps done in the current epoch
    global_step: int = 0      # optimizer steps done in all
    history: tuple = ()       # one record (a dict) per epoch ended
    # The current epoch's samples trained at other world sizes, ((world size, samples per rank),
    # ...), and the step at which this world size's order of the rest begins (datasets.rest_of_epoch).
    seen_before: tuple = ()
    order_start: int = 0

    @classmethod
    def from_checkpoint(cls, saved) -> "Position":
        return cls(saved["epoch"], saved["step_in_epoch"], saved["global_step"], tuple(saved["history"]),
                   tuple(tuple(run) for run in saved.get("seen_before", ())), saved.get("order_start", 0))

    def to_checkpoint(self) -> dict:
        resized = {"seen_before": [list(run) for run in self.seen_before], "order_start": self.order_start} \
            if self.seen_before else {}
        return {"epoch": self.epoch, "step_in_epoch": self.step_in_epoch, "global_step": self.global_step,
                "history": list(self.history), **resized}

    @property
    def steps_into_order(self) -> int:
        """The batches of this epoch's order (the data path's) already trained."""
        return self.step_in_epoch - self.order_start

    def after_step(self) -> "Position":
        return dataclasses.replace(self, step_in_epoch=self.step_in_epoch + 1, global_step=self.global_step + 1)

    def recorded(self, record: dict) -> "Position":
        return dataclasses.replace(self, history=(*self.history, record))

    def next_epoch(self) -> "Position":
        return dataclasses.replace(self, epoch=self.epoch + 1, step_in_epoch=0, seen_before=(), order_start=0)


class Interval:
    """--checkpoint-every's decision, taken alike on every rank: every N steps (the same step
    everywhere by construction), or every so many seconds of rank 0's clock, which alone votes
    (`vote()`, in a reduction every rank joins at the same step; `voted`: its outcome). Only in
    the middle of an epoch: the epoch's end has its own checkpoint."""

    def __init__(self, interval: tuple[int | None, float | None], is_rank0: bool):
        (self.steps, self.seconds), self.is_rank0 = interval, is_rank0
        self.written()

    def written(self) -> None:
        """A checkpoint was written now: the clock starts again."""
        self.last = time.monotonic()

    def vote(self) -> bool:
        return bool(self.seconds) and self.is_rank0 and time.monotonic() - self.last >= self.seconds

    def due(self, global_step: int, mid_epoch: bool, voted: bool) -> bool:
        if not mid_epoch:
            return False
        return global_step % self.steps == 0 if self.steps else bool(self.seconds) and voted


class Writer:
    """Rank 0's checkpoint writes, one at a time: inline, or (`background`) on a thread of their
    own while the next steps run. The caller hands over a state already copied to host memory;
    the thread serialises it, signs it and renames it into place (atomic_write), then prunes. A
    second write waits for the first to end, never overlaps it. A failed write is kept, with the
    newest checkpoint at that moment, for the caller to say on every rank (`error`): never lost in
    the thread."""

    # Seconds each write sleeps after its first bytes: a slow parallel file system, for the test
    # that kills rank 0 in the middle of a background write.
    SLOW_WRITE = test_hooks.slow_checkpoint_write()

    def __init__(self, say=None):
        # Told while rank 0 writes (its own bytes, on a slow file system, may take long) and when
        # it is done: the watchdog holds its SIGTERM grace off then, never while a collective waits.
        self.watchdog = None
        self.thread: threading.Thread | None = None
        self.failed: str | None = None  # the failed write's one line
        self.written: str | None = None  # the last path written, until say_written says it
        self.say = say or (lambda line: None)  # rank 0's log: "checkpoint PATH" once written

    def save(self, directory: str, capture, *, keep: int, background: bool = False) -> str | None:
        """Rank 0, every API's checkpoint: the write before this one ends first (its failure, or
        its path, said before anything else is written), then `capture()` -> (path, write(fileobj),
        signed) copies the state to host memory and write() writes it. The failure's one line, for
        the caller to broadcast to every rank, or None."""
        self._beat(WRITING)
        try:
            error = self.finish()
            if error:
                return error
            try:
                path, write, signed = capture()
                self.write(path, write, signed=signed, keep=keep, background=background)
            except Exception as err:  # noqa: BLE001 - said on every rank by the caller
                return write_failure(directory, err)
            self.say_written()
            return None
        finally:
            self._beat("after writing a checkpoint")

    def _beat(self, where: str) -> None:
        if self.watchdog is not None:
            self.watchdog.beat(where=where)

    def state(self) -> list[bool]:
        """[writing now, failed]: what a rank adds to the step's vote (never either off rank 0)."""
        return [self.busy(), self.failed is not None]

    def finish(self) -> str | None:
        """The write in flight ended: its failure's line, or None (its path said)."""
        self.wait()
        error = self.error()
        self.say_written()
        return error

    def say_written(self) -> None:
        if self.written and not self.busy():
            self.say(f"checkpoint {self.written}")
            self.written = None

    def write(self, path: str, write, *, signed: bool, keep: int, background: bool = False) -> None:
        """Write `path` (write(fileobj) serialises the state), then keep the newest `keep`.
        Inline, a failure raises OSError or the serialiser's error; in the background it is kept
        for `error()`."""
        self.wait()
        if self.SLOW_WRITE:
            write = self._slowed(write)
        if not background:
            self._write(path, write, signed, keep)
            return
        self.thread = threading.Thread(target=self._write_kept, args=(path, write, signed, keep),
                                       name="hvdtrain-checkpoint-writer", daemon=True)
        self.thread.start()

    def busy(self) -> bool:
        return self.thread is not None and self.thread.is_alive()

    def wait(self) -> None:
        if self.thread is not None:
            self.thread.join()
            self.thread = None

    def error(self) -> str | None:
        """The failed write's line (once), or None."""
        failed, self.failed = self.failed, None
        return failed

    def _write(self, path, write, signed, keep):
        atomic_write(path, write, signed=signed)
        prune(os.path.dirname(path), keep)
        self.written = path

    def _write_kept(self, path, write, signed, keep):
        try:
            self._write(path, write, signed, keep)
        except BaseException as err:  # noqa: BLE001 - said by the caller on every rank
            self.failed = write_failure(os.path.dirname(path), err)

    def _slowed(self, write):
        def slowed(f):  # the temporary file exists: a kill meanwhile is a kill mid-write
            time.sleep(self.SLOW_WRITE)
            write(f)
        return slowed


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
