"""The one exception type for bad input, and the one way it is reported.

A `UsageError` is a problem the user can fix (unknown model, missing data dir, bad checkpoint).
`report_and_exit` prints it as one line naming the rank and exits non-zero, on every rank.
"""
import os
import sys

EXIT_USAGE = 2


class UsageError(Exception):
    """Bad input: reported as one clear line, never as a traceback."""


def rank_label() -> str:
    from hvdtrain.cluster import ClusterEnv

    env = ClusterEnv.from_environ()
    return f"rank {env.rank}/{env.world_size}"


def report_and_exit(err: BaseException, prog: str) -> None:
    print(f"{prog}: error [{rank_label()}]: {err}", file=sys.stderr, flush=True)
    sys.stdout.flush()
    # os._exit: do not run Horovod's/MPI's atexit shutdown, which waits for the other ranks.
    os._exit(EXIT_USAGE)
