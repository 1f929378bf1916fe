"""Ranks that the launcher started as one job but MPI does not join (srun without PMIx: each
rank an MPI singleton) stop with one line and the --mpi=pmix hint, before any rendezvous over
MPI: the same check, and the same words, for Horovod, DDP's store and MWMS's cluster.

    python -m pytest -q tests/test_launcher_agreement.py
"""
import subprocess

import pytest

from conftest import PYTHON, REPO, base_env
from hvdtrain.cluster.env import ClusterEnv
from hvdtrain.errors import UsageError
from hvdtrain.cluster.horovod_ops import check_launcher_agrees

# Task 1 of `srun -n 2 --mpi=none` on one node, as srun sets it.
SRUN_TASK_1 = {"SLURM_PROCID": "1", "SLURM_STEP_ID": "0", "SLURM_LOCALID": "1", "SLURM_NTASKS": "2",
               "SLURM_STEP_NUM_TASKS": "2", "SLURM_TASKS_PER_NODE": "2", "SLURM_NNODES": "1", "SLURM_NODEID": "0"}
HINT = ("slurm started 2 ranks, but MPI sees 1: the ranks are not one job (under srun, use --mpi=pmix with an "
        "Open MPI built for it; python -m hvdtrain.doctor checks)")


def test_an_mpi_world_of_another_size_is_refused():
    env = ClusterEnv.from_environ(SRUN_TASK_1)
    with pytest.raises(UsageError) as err:
        check_launcher_agrees(1, "MPI", env)
    assert str(err.value) == HINT
    check_launcher_agrees(2, "MPI", env)                       # one job: nothing to say
    check_launcher_agrees(1, "MPI", ClusterEnv.from_environ({}))  # a single process


def test_ddp_store_under_srun_without_pmix_says_use_pmix():
    """A real MPI singleton (one process, mpi4py's MPI_Init without a launcher) in the environment
    of srun's task 1: DDP's rendezvous ends with the hint, not `cannot unpack NoneType`."""
    env = {k: v for k, v in base_env().items()
           if not k.startswith(("SLURM_", "OMPI_COMM_WORLD", "PMIX_", "PMI_", "MASTER_", "HOROVOD_"))}
    env.update(SRUN_TASK_1)
    code = ("from hvdtrain.cluster.env import ClusterEnv\n"
            "from hvdtrain.errors import UsageError\n"
            "from hvdtrain.torch.torch_distributed import _store_for\n"
            "try:\n"
            "    _store_for(ClusterEnv.from_environ())\n"
            "except UsageError as err:\n"
            "    print('refused:', err)\n")
    out = subprocess.run([PYTHON, "-c", code], env=env, cwd=REPO, capture_output=True, text=True, timeout=120)
    refused = [line for line in out.stdout.splitlines() if line.startswith("refused:")]
    assert refused == [f"refused: {HINT}"], out.stdout + out.stderr

