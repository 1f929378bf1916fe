"""Bad input to `python -m hvdtrain.torch` on 2 real ranks: one clear line naming the problem,
a non-zero exit, and no hang (every launch has a hard timeout).

The promise tested (hvdtrain/errors.py): every rank that finds the problem prints its own line and
exits 2; launchers end the job at the first failing rank, so a job's output always holds the
first failing rank's line and the others' only if they got there first. Tests of "every rank"
therefore let each rank run to its end (`launch_each_rank_to_its_end`): no race, no flake."""
import os
import shutil

import pytest
import torch

from conftest import (PYTHON, assert_each_rank_failed_with, assert_job_failed_with, base_env, launch,
                      launcher_prefix,                       launch_each_rank_to_its_end)

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


def test_unknown_dataset():
    fails_with(["--dataset", "cifar"], "unknown dataset 'cifar'; valid: synthetic, imagefolder, digits")


def test_missing_data_dir(tmp_path):
    fails_with(["--dataset", "imagefolder", "--data-dir", str(tmp_path / "nowhere")],
               f"data dir '{tmp_path / 'nowhere'}' does not exist")


def test_empty_data_dir(tmp_path):
    (tmp_path / "train" / "cat").mkdir(parents=True)
    (tmp_path / "val" / "cat").mkdir(parents=True)
    fails_with(["--dataset", "imagefolder", "--data-dir", str(tmp_path)], "holds no images")


def test_batch_size_below_one():
    fails_with(SMALL + ["--batch-size", "0"], "--batch-size must be >= 1 (got 0)")


def test_more_ranks_than_samples(tmp_path):
    from hvdtrain.datasets import write_digits_imagefolder

    root = write_digits_imagefolder(str(tmp_path / "tiny"), per_class_train=1, per_class_val=1, size=8)
    # 10 validation images on 2 ranks are fine, so ask for a batch no rank's share can fill.
    fails_with(["--dataset", "imagefolder", "--data-dir", root, "--model", "mnist_cnn", "--image-size", "8",
                "--batch-size", "8", "--num-workers", "0"], "fewer than one step's 8")


def test_more_ranks_than_validation_samples(tmp_path):
    from PIL import Image

    for split, count in (("train", 8), ("val", 1)):
        folder = tmp_path / "tree" / split / "only"
        folder.mkdir(parents=True)
        for i in range(count):
            Image.new("RGB", (8, 8), (i * 20, 0, 0)).save(folder / f"{i}.png")
    fails_with(["--dataset", "imagefolder", "--data-dir", str(tmp_path / "tree"), "--model", "mnist_cnn",
                "--image-size", "8", "--batch-size", "1", "--num-workers", "0"],
               "the validation set has 1 samples, fewer than the 2 ranks")


def test_unreadable_checkpoint_is_named(tmp_path):
    bad = tmp_path / "ckpt" / "ckpt-e0001-s00000010.pt"
    bad.parent.mkdir()
    bad.write_bytes(b"this is not a checkpoint")
    fails_with(SMALL + ["--checkpoint-dir", str(bad.parent)], f"checkpoint {bad} is unreadable or corrupt")


def test_incompatible_checkpoint_lists_differences(tmp_path):
    ckpt = tmp_path / "ckpt"
    launch("mpirun", 2, TRAINER + SMALL + ["--steps", "2", "--checkpoint-dir", str(ckpt)], timeout=120)
    argv = ["--dataset", "digits", "--model", "resnet18", "--epochs", "1", "--checkpoint-dir", str(ckpt)]
    message = "does not match this run: model: checkpoint 'mnist_cnn', this run 'resnet18'"
    fails_with(argv, message)
    # Rank 0 alone reads the checkpoint; rank 1 must fail too instead of waiting in a collective.
    run = launch_each_rank_to_its_end(2, TRAINER + argv, timeout=120)
    for rank in (0, 1):
        assert f"[1,{rank}]<stdout>:rank {rank} exited 2" in run.output, run.output[-3000:]
        assert f"[1,{rank}]<stderr>:hvdtrain.torch: error [rank {rank}/2]: checkpoint " in run.output
    assert run.output.count(message) == 2 and "Traceback" not in run.output, run.output[-3000:]


def test_resume_without_checkpoint_dir():
    fails_with(SMALL + ["--resume"], "--resume needs --checkpoint-dir")


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


def test_amp_without_gpu():
    if torch.cuda.is_available():
        pytest.skip("this check is for CPU-only machines")
    fails_with(SMALL + ["--amp"], "--amp needs a CUDA GPU")
