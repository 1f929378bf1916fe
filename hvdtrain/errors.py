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
import os
import sys

EXIT_USAGE = 2


class UsageError(Exception):
    """Bad input: reported as one clear line, never as a traceback."""


def rank_label() -> str:
    from hvdtrain.cluster import ClusterEnv

    try:
        env = ClusterEnv.from_environ()
    except UsageError:  # the launcher's variables are the problem being reported
        return f"rank {os.environ.get('SLURM_PROCID', '?')}/{os.environ.get('SLURM_NTASKS', '?')}"
    return f"rank {env.rank}/{env.world_size}"


def report_and_exit(err: BaseException, prog: str) -> None:
    from hvdtrain.report import say

    say(f"{prog}: error [{rank_label()}]: {err}", sys.stderr)
    sys.stdout.flush()
    # os._exit: do not run Horovod's/MPI's atexit shutdown, which waits for the other ranks.
    os._exit(EXIT_USAGE)
