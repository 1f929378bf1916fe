"""The one exception type for bad input, and the one way it is reported.

A `UsageError` is a problem the user can fix (unknown model, missing data dir, bad checkpoint).
`report_and_exit` prints it as one line naming the rank and exits with code 2.

What a user can rely on (and the tests check, tests/test_torch_errors.py):
- every rank that finds the problem prints its own line, flushed, *before* it exits;
- problems in the options or the data are found alike on every rank before any collective, and
  problems only rank 0 can see (a checkpoint) are broadcast first, so every rank reaches its line;
- but launchers end a job when its first rank fails (mpirun by default, `srun
  --kill-on-bad-exit`, horovodrun), and may stop the other ranks before they print. So a job's
  output always holds the line of the first rank to fail, naming it, and the others' lines only
  if they got there in time; the job's exit status is non-zero. Waiting for the other ranks
  instead would turn a rank that never gets there (one given other options) into a hang.
"""
import functools
import os
import sys

EXIT_USAGE = 2


class UsageError(Exception):
    """Bad input: reported as one clear line, never as a traceback."""


def rank_label(environ=None) -> str:
    """'rank R/N' from the launcher's variables, found in ClusterEnv.from_environ's order
    (hvdtrain/cluster/env.py): read here, not through ClusterEnv, because env.py raises
    UsageError (an import cycle), and because reporting an error must not fail on the variables
    that may be the error (ClusterEnv also parses Slurm's task and node lists)."""
    e = os.environ if environ is None else environ
    if "OMPI_COMM_WORLD_RANK" in e:
        rank, size = e["OMPI_COMM_WORLD_RANK"], e.get("OMPI_COMM_WORLD_SIZE")
    elif "HOROVOD_RANK" in e:
        rank, size = e["HOROVOD_RANK"], e.get("HOROVOD_SIZE")
    elif "SLURM_PROCID" in e and "SLURM_STEP_ID" in e:
        rank, size = e["SLURM_PROCID"], e.get("SLURM_STEP_NUM_TASKS") or e.get("SLURM_NTASKS") or "1"
    elif "RANK" in e and "WORLD_SIZE" in e:
        rank, size = e["RANK"], e["WORLD_SIZE"]
    else:
        rank, size = "0", "1"
    return f"rank {rank or '?'}/{size or '?'}"


def report_and_exit(err: BaseException, prog: str) -> None:
    from hvdtrain.report import say

    label = rank_label()
    # Another rank's progress bar may hold the shared terminal's line open (mpirun and srun merge
    # the ranks' output): a rank that draws none starts with a line break of its own, or its line
    # would be glued to the bar's ("...loss=2.3]hvdtrain.torch: error [rank 1/2]: ...").
    lead = "" if label.startswith("rank 0/") or label.endswith("/1") else "\n"
    say(f"{lead}{prog}: error [{label}]: {err}", sys.stderr)
    sys.stdout.flush()
    # os._exit: do not run Horovod's/MPI's atexit shutdown, which waits for the other ranks.
    os._exit(EXIT_USAGE)


def exit_at_once_on_uncaught_exception() -> None:
    """An exception nothing caught ends this rank with its traceback and exit status 1, without the
    interpreter's usual shutdown: its atexit handlers (Horovod's, MPI_Finalize) wait for the
    other ranks, which may be waiting for this one (seen: both ranks alive minutes after their
    tracebacks, until an outside timeout). The launcher then ends the job."""
    shown = sys.excepthook
    if getattr(shown, "hvdtrain", False):
        return

    def excepthook(kind, value, traceback):
        shown(kind, value, traceback)
        sys.stderr.flush()
        sys.stdout.flush()
        os._exit(1)

    excepthook.hvdtrain = True
    sys.excepthook = excepthook


def exits_on_usage_error(prog: str):
    """Decorator: a UsageError raised by the function ends this rank with report_and_exit's one
    line and exit 2, as on the command line (for the calls of hvdtrain's APIs in users' scripts)."""
    def decorate(function):
        @functools.wraps(function)
        def wrapper(*args, **kwargs):
            try:
                return function(*args, **kwargs)
            except UsageError as err:
                report_and_exit(err, prog)
        return wrapper
    return decorate


def in_one_line(err: BaseException) -> str:
    """An exception as 'Type: its first line', for a message of one line."""
    return f"{type(err).__name__}: {(str(err).strip() or '?').splitlines()[0]}"
