"""Horovod's collectives on 2 real ranks, under each launcher, for torch and TF tensors."""
import os

import pytest

from conftest import PYTHON, REPO, launch

pytestmark = pytest.mark.slow  # real ranks: the distributed tier

SCRIPTS = os.path.join(REPO, "tests", "scripts")
FRAMEWORKS = ["torch", "tf"]


def _check(result, framework):
    for rank in (0, 1):
        assert f"COLLECTIVES-OK {framework} rank {rank}/2 sum=[3.0, 10.0]" in result.output, result.output[-3000:]


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize("launcher", ["mpirun", "horovodrun"])
def test_collectives(launcher, framework):
    result = launch(launcher, 2, [PYTHON, os.path.join(SCRIPTS, f"collectives_{framework}.py")], timeout=180)
    _check(result, framework)


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_collectives_srun(slurm_cluster, framework):
    result = launch("srun", 2, [PYTHON, os.path.join(SCRIPTS, f"collectives_{framework}.py")], timeout=180)
    _check(result, framework)
