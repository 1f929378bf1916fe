"""Process-level setup shared by the trainers: CPU threads per rank, stop signals, requeue.

Slurm sends SIGUSR1 (`#SBATCH --signal=USR1@600`) ahead of the time limit and SIGTERM when it
cancels or preempts a job, or at the limit. Handlers only set a flag; the trainer reduces that
flag over ranks at its next step boundary so that every rank stops at the same step and rank 0
checkpoints. After SIGUSR1 rank 0 also requeues the job, which then resumes from that checkpoint;
after SIGTERM it does not, so that `scancel` still ends a job.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess


def threads_per_rank(requested: int | None, local_world_size: int) -> int:
    """CPU compute threads for this rank: the request, else Slurm's cpus-per-task, else the cores
    this process may run on shared among the ranks of this node."""
    return requested or rank_cores(local_world_size)


def rank_cores(local_world_size: int) -> int:
    """The cores this rank may count as its own: Slurm's cpus-per-task, else the cores this
    process may run on shared among the ranks of this node."""
    if os.environ.get("SLURM_CPUS_PER_TASK"):
        return int(os.environ["SLURM_CPUS_PER_TASK"])
    allowed = len(os.sched_getaffinity(0))
    # A launcher may have bound this rank to some cores (Open MPI: a core for 2 ranks, a socket
    # beyond), which other ranks can share: never more than this rank's share of the node.
    share = (os.cpu_count() or allowed) // max(1, local_world_size)
    return max(1, min(allowed, share))


def feeder_thread_pays(on_gpu: bool, cores: int, compute_threads: int, decode_workers: int) -> bool:
    """Whether the device feeder's thread (hvdtrain/torch/feeder.py) is worth running: on a GPU
    it overlaps the copy and the normalisation with the step; on a CPU it only competes with the
    step and the decode workers for the rank's cores, unless one is left over for it (measured
    with 2 ranks x 1 worker on 2 cores: benchmarks/cpu_node.py)."""
    return on_gpu or cores > compute_threads + decode_workers


def decode_workers(threads: int) -> int:
    """DataLoader workers for a rank with `threads` cores (threads_per_rank): all but the one its
    main process runs on. Decoding JPEGs costs a core per ~500 images/s, and a GPU trains
    ResNet-50 at 2,500-3,200: a fixed two workers would feed it a third of that (docs/data.md)."""
    return max(1, threads - 1)


class StopRequest:
    """Remembers that SIGUSR1 or SIGTERM arrived; `signal_name` says which."""

    SIGNALS = (signal.SIGUSR1, signal.SIGTERM)

    def __init__(self):
        self.signal_name: str | None = None
        for sig in self.SIGNALS:
            signal.signal(sig, self._handler)

    def _handler(self, signum, frame):
        self.signal_name = signal.Signals(signum).name


_JOB_ID = re.compile(r"^\d+(_\d+)?$")


def requeue_after_stop(stopped_by: str | None, job_id: str | None, is_rank0: bool) -> str | None:
    """Rank 0 requeues the Slurm job after SIGUSR1 (the time-limit warning), every API alike;
    the outcome in words, or None when nothing is to be done. SIGTERM never requeues: it is
    scancel (requeueing would undo the user's cancel), a preemption (Slurm requeues by itself) or
    the limit itself. HVDTRAIN_REQUEUE=0 checkpoints and stops without requeueing."""
    if stopped_by != "SIGUSR1" or not is_rank0 or not job_id or os.environ.get("HVDTRAIN_REQUEUE", "1") == "0":
        return None
    return requeue_slurm_job(job_id)


def requeue_slurm_job(job_id: str | None) -> str:
    """`scontrol requeue JOB`: returns what happened, in words. The id must look like a Slurm
    job id, and goes as one argument: never through a shell."""
    if not job_id or not _JOB_ID.match(job_id):
        return f"not requeued: '{job_id}' is not a Slurm job id"
    try:
        done = subprocess.run(["scontrol", "requeue", job_id], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as err:  # rank 0 only: never raise past here
        return f"scontrol requeue {job_id} failed: {err}"
    if done.returncode != 0:
        return f"scontrol requeue {job_id} failed: {done.stderr.strip() or done.stdout.strip()}"
    return f"job {job_id} requeued"
