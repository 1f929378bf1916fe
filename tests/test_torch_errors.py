"""Bad input to `python -m hvdtrain.torch` on 2 real ranks: one clear line naming the problem,
a non-zero exit, and no hang (every launch has a hard timeout). One launch per launcher and per
way a job can fail (every rank, one rank, rank 0 alone reading a checkpoint, Horovod without its
torch ops); what each check says is tested without ranks (test_launch_config.py, test_guards.py,
test_trainer_start.py).

The promise tested (hvdtrain/errors.py): every rank that finds the problem prints its own line and
exits 2; launchers end the job at the first failing rank, so a job's output always holds the
first failing rank's line and the others' only if they got there first. Tests of "every rank"
therefore let each rank run to its end (`launch_each_rank_to_its_end`): no race, no flake."""
import os
import shutil

import pytest

from conftest import (PYTHON, assert_each_rank_failed_with, assert_job_failed_with, base_env, copy_checkpoints, launch,
                      launch_each_rank_to_its_end, launcher_prefix)

pytestmark = pytest.mark.slow  # real ranks: the distributed tier

TRAINER = [PYTHON, "-m", "hvdtrain.torch"]
SMALL = ["--dataset", "digits", "--model", "mnist_cnn", "--epochs", "1", "--threads-per-rank", "1"]


def fails_with(extra, message, env=None, np=2, launcher="mpirun"):
    out = launch(launcher, np, TRAINER + extra, timeout=120, env=env, check=False)
    assert_job_failed_with(out, message, np)
    return out


UNKNOWN_MODEL = "unknown model 'vgg99'; valid: resnet50, resnet18, mnist_cnn"


def test_unknown_model_lists_valid_ones():
    fails_with(["--model", "vgg99"], UNKNOWN_MODEL)


def test_unknown_model_reported_by_each_rank():
    run = launch_each_rank_to_its_end(2, TRAINER + ["--model", "vgg99"], timeout=120)
    assert_each_rank_failed_with(run, "hvdtrain.torch", UNKNOWN_MODEL, 2)


def test_only_one_rank_fails_and_is_named():
    """MPMD: rank 1 alone gets a bad option; rank 0 goes on into hvd.init and waits for it. The
    job still ends (mpirun aborts at rank 1's exit) and the line names rank 1."""
    cmd = launcher_prefix("mpirun", 1) + TRAINER + SMALL + [":", "-np", "1", *TRAINER, *SMALL, "--model", "vgg99"]
    out = launch("single", 1, cmd, timeout=120, check=False)  # "single": cmd is the whole command
    lines = assert_job_failed_with(out, UNKNOWN_MODEL, 2)
    assert {m["rank"] for m in lines} == {"1"}, out.output[-3000:]


@pytest.mark.parametrize("launcher", ["srun", "horovodrun"])
def test_bad_input_under_other_launchers(launcher, request):
    if launcher == "srun":
        request.getfixturevalue("slurm_cluster")
    fails_with(SMALL + ["--model", "vgg99"], UNKNOWN_MODEL, launcher=launcher)


def test_incompatible_checkpoint_lists_differences(tmp_path, digits_checkpoints):
    ckpt = copy_checkpoints(digits_checkpoints, str(tmp_path / "ckpt"))  # mnist_cnn's
    argv = ["--dataset", "digits", "--model", "resnet18", "--epochs", "3", "--checkpoint-dir", ckpt]
    message = "does not match this run: model: checkpoint 'mnist_cnn', this run 'resnet18'"
    fails_with(argv, message)
    # Rank 0 alone reads the checkpoint; rank 1 must fail too instead of waiting in a collective.
    run = launch_each_rank_to_its_end(2, TRAINER + argv, timeout=120)
    for rank in (0, 1):
        assert f"[1,{rank}]<stdout>:rank {rank} exited 2" in run.output, run.output[-3000:]
        assert f"[1,{rank}]<stderr>:hvdtrain.torch: error [rank {rank}/2]: checkpoint " in run.output
    assert run.output.count(message) == 2 and "Traceback" not in run.output, run.output[-3000:]


@pytest.mark.side_lane  # one rank, or mostly waiting: beside the others (tests/side_lane.py)
def test_horovod_without_torch_ops(tmp_path):
    """A real Horovod install whose PyTorch extension is missing, as a build without
    HOROVOD_WITH_PYTORCH=1 leaves it."""
    import horovod

    src = os.path.dirname(horovod.__file__)
    dst = tmp_path / "site" / "horovod"
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("mpi_lib_v2*.so"))
    assert not list((dst / "torch").glob("mpi_lib_v2*.so"))
    env = base_env()
    env["PYTHONPATH"] = str(tmp_path / "site") + os.pathsep + env["PYTHONPATH"]
    fails_with(SMALL, "Horovod is installed without its PyTorch ops", env=env)
