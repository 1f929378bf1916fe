"""`python -m hvdtrain.torch` launched for real: accuracy, parity between 1 and 2 ranks, equal
weights on every rank, exact resume, exact validation counts, launchers and datasets."""
import ast
import json
import os
import shlex

import pytest
import torch

from conftest import PYTHON, REPO, assert_job_failed_with, launch

pytestmark = pytest.mark.slow  # real ranks: the distributed tier

TRAINER = [PYTHON, "-m", "hvdtrain.torch"]
# Adam on digits: 15 short epochs reach ~98% on one CPU core. base-lr is per 32-sample rank batch.
DIGITS = ["--model", "mnist_cnn", "--dataset", "digits", "--optimizer", "adam", "--epochs", "15",
          "--threads-per-rank", "1"]


def run_trainer(tmp_path, name, launcher, np, extra, timeout=300, check=True, tasks_per_node=None):
    result_path = tmp_path / f"{name}.json"
    out = launch(launcher, np, TRAINER + extra + ["--result-json", str(result_path)], timeout=timeout, check=check,
                 tasks_per_node=tasks_per_node)
    return (json.loads(result_path.read_text()) if result_path.exists() else None), out


def documented_commands(path: str) -> list[list[str]]:
    """The `mpirun -np 2 python -m ... --dataset digits ...` lines of a module's docstring."""
    with open(os.path.join(REPO, path)) as f:
        doc = ast.get_docstring(ast.parse(f.read()))
    return [shlex.split(line.strip()) for line in doc.splitlines()
            if line.strip().startswith("mpirun -np 2 python -m hvdtrain.") and "--dataset digits" in line]


def test_documented_digits_command_reaches_95_percent_as_one_rank_does(tmp_path):
    """The command of hvdtrain/torch/train.py's docstring (and the README), as written: the model's
    recipe must make it reach 95 %, with equal weights on both ranks and every validation sample
    counted once; one rank with the same global batch and so the same LR ends within a point of
    it (data parallelism changes nothing but the speed). One launch serves both claims."""
    [cmd] = documented_commands("hvdtrain/torch/train.py")
    assert cmd[:6] == ["mpirun", "-np", "2", "python", "-m", "hvdtrain.torch"], cmd
    two, _ = run_trainer(tmp_path, "doc", "mpirun", 2, cmd[6:], timeout=300)
    assert two["config"]["recipe"] == "small-cnn" and two["config"]["recipe_overrides"] == []
    batch, base_lr = two["config"]["batch_size"], two["config"]["base_lr"]
    # One rank as a user first runs it: `python -m hvdtrain.torch`, an MPI singleton.
    one, _ = run_trainer(tmp_path, "np1", "single", 1, cmd[6:] + ["--batch-size", str(2 * batch),
                                                                   "--base-lr", str(2 * base_lr)])
    assert two["world_size"] == 2 and one["world_size"] == 1
    assert two["config"]["global_batch_size"] == one["config"]["global_batch_size"] == 2 * batch
    assert two["config"]["lr"] == pytest.approx(one["config"]["lr"])
    acc2, acc1 = two["final"]["val_acc"], one["final"]["val_acc"]
    assert acc2 >= 0.95, f"2 ranks reached only {acc2:.4f}: {two['history']}"
    assert abs(acc2 - acc1) <= 0.01, f"1 rank {acc1:.4f} vs 2 ranks {acc2:.4f}"
    # Every validation sample counted exactly once: the digits val set has 397 (prime) samples.
    assert two["final"]["val_count"] == 397 and one["final"]["val_count"] == 397
    checksums = {r["param_checksum"] for r in two["ranks"]}
    assert len(two["ranks"]) == 2 and len(checksums) == 1, two["ranks"]
    assert all(r["images_per_sec"] > 0 for r in two["ranks"])
    # Alone on its host, the singleton keeps Open MPI's TCP transport off the network too.
    assert one["launcher"] == "single" and one["listening_beyond_loopback"] == {"0": []}, one


def _final_weights(ckpt_dir):
    from hvdtrain.checkpoint import latest_checkpoint

    path = latest_checkpoint(str(ckpt_dir))
    return torch.load(path, weights_only=True)


RESUME = ["--model", "mnist_cnn", "--dataset", "digits", "--optimizer", "sgd", "--base-lr", "0.02",
          "--epochs", "4", "--batch-size", "32", "--threads-per-rank", "1", "--seed", "7"]


@pytest.fixture(scope="module")
def horovod_then_ddp_under_srun(tmp_path_factory, slurm_cluster) -> dict:
    """The resume test's first legs: 4 epochs under Horovod (mpirun), its checkpoint after epoch 2
    copied twice, and one copy resumed under DDP to step 52, launched with srun: that launch is
    also test_comparison_backends_under_srun[ddp]'s (DDP's rendezvous under srun)."""
    from hvdtrain.result_file import checksum_arrays

    tmp_path = tmp_path_factory.mktemp("resume")
    run_trainer(tmp_path, "full", "mpirun", 2, RESUME + ["--checkpoint-dir", str(tmp_path / "full")])
    stopped = tmp_path / "full" / "ckpt-e0002-s00000042.pt"
    for name in ("split", "moved"):
        (tmp_path / name).mkdir()
        for f in (tmp_path / "full").glob(stopped.name + "*"):  # with its signature
            (tmp_path / name / f.name).write_bytes(f.read_bytes())
    # The trainer's checksum of those weights (mnist_cnn has parameters only, in state_dict order).
    at_stop = checksum_arrays([t.double().numpy() for t in torch.load(stopped, weights_only=True)["model"].values()])
    ddp, out = run_trainer(tmp_path, "ddp", "srun", 2, RESUME + ["--checkpoint-dir", str(tmp_path / "moved"),
                                                               "--backend", "ddp", "--steps", "52"], timeout=240)
    return {"tmp_path": tmp_path, "at_stop": at_stop, "ddp": ddp, "ddp_output": out.output}


def test_resume_after_interruption_matches_uninterrupted(horovod_then_ddp_under_srun):
    # Stopped after epoch 2 (21 steps per epoch on 2 ranks): the uninterrupted run's checkpoint
    # there is what a stop leaves; run again, it resumes by itself. A user leaving Horovod mid-run:
    # the same checkpoint (the format holds no backend's wrapping) goes on under DDP, stopped in the
    # middle of epoch 3 (--steps 52: its checkpoint holds the position in the epoch), then back
    # under Horovod from that step, and ends where the Horovod-only runs end, so each backend
    # started from the other's weights (each rank's `start_checksum` in the result file).
    # (The Horovod run and the DDP leg, under srun: the fixture's.)
    tmp_path, at_stop, common = horovod_then_ddp_under_srun["tmp_path"], horovod_then_ddp_under_srun["at_stop"], RESUME
    second, out = run_trainer(tmp_path, "part2", "mpirun", 2, common + ["--checkpoint-dir", str(tmp_path / "split")])
    assert "resumed from" in out.output and "ckpt-e0002-s00000042.pt" in out.output
    assert second["global_step"] == 84 and second["epoch"] == 4
    assert {r["start_checksum"] for r in second["ranks"]} == {at_stop}
    full, split = _final_weights(tmp_path / "full"), _final_weights(tmp_path / "split")
    assert full["global_step"] == split["global_step"] == 84
    for name, tensor in full["model"].items():
        diff = (tensor.double() - split["model"][name].double()).abs().max().item()
        assert diff <= 1e-6, f"{name} differs by {diff} after resume"
    assert not any(k.startswith("module.") for k in full["model"])

    moved_dir = ["--checkpoint-dir", str(tmp_path / "moved")]
    ddp, output = horovod_then_ddp_under_srun["ddp"], horovod_then_ddp_under_srun["ddp_output"]
    assert "ckpt-e0002-s00000042.pt" in output and ddp["global_step"] == 52, output[-2000:]
    assert {r["start_checksum"] for r in ddp["ranks"]} == {at_stop}, "DDP did not start from the Horovod run's weights"
    back, out = run_trainer(tmp_path, "back", "mpirun", 2, common + moved_dir)
    # 10 steps into epoch 3: the name holds the 640 samples seen of it (2 ranks x 32 a step).
    assert "ckpt-e0002-s00000052-n000000000640.pt" in out.output and back["global_step"] == 84, out.output[-2000:]
    assert {r["start_checksum"] for r in back["ranks"]} == {ddp["ranks"][0]["param_checksum"]}, \
        "Horovod did not start from the DDP run's weights"
    moved = _final_weights(tmp_path / "moved")
    for name, tensor in full["model"].items():
        # DDP sums then divides where Horovod averages: equal up to float rounding.
        diff = (tensor.double() - moved["model"][name].double()).abs().max().item()
        assert diff <= 1e-5, f"{name} differs by {diff} after Horovod -> DDP (stopped mid-epoch) -> Horovod"


@pytest.mark.parametrize("backend", ["ddp", "accelerate"])
def test_comparison_backends_under_srun(tmp_path, slurm_cluster, request, backend):
    """DDP's and Accelerate's rendezvous under srun: rank 0 binds a port it holds and shares it over
    MPI (a port derived from the job id failed when another program held it). DDP's launch is the
    resume test's DDP leg (a checkpoint resumed to step 52 under srun)."""
    if backend == "ddp":
        result = request.getfixturevalue("horovod_then_ddp_under_srun")["ddp"]
    else:
        result, run = run_trainer(tmp_path, f"{backend}-srun", "srun", 2, ["--backend", backend] + DIGITS[:4] +
                                  ["--steps", "5", "--threads-per-rank", "1"], timeout=240)
    assert result["backend"] == backend and result["launcher"] == "slurm" and result["world_size"] == 2
    assert len({r["param_checksum"] for r in result["ranks"]}) == 1


def test_lightning_under_srun_uses_its_slurm_detection(tmp_path, slurm_cluster):
    """As the seeds' users launch it: srun with --ntasks-per-node, Lightning's SLURMEnvironment
    supplying the ranks. `srun -n 2` alone is refused by Lightning, in one line per rank."""
    args = ["--backend", "lightning"] + DIGITS[:4] + ["--steps", "5", "--threads-per-rank", "1"]
    refused, run = run_trainer(tmp_path, "lightning-n", "srun", 2, args, timeout=240, check=False)
    assert_job_failed_with(run, "PyTorch Lightning refuses this launch: You set `--ntasks=2` in your SLURM bash "
                                "script, but this variable is not supported. HINT: Use `--ntasks-per-node=2`", 2)
    assert refused is None
    result, run = run_trainer(tmp_path, "lightning-srun", "srun", 2, args, timeout=240, tasks_per_node=2)
    assert "--ntasks-per-node=2" in run.command
    assert result["backend"] == "lightning" and result["cluster_environment"] == "SLURMEnvironment"
    assert result["launcher"] == "slurm" and result["world_size"] == 2 and result["global_step"] == 5
    assert len({r["param_checksum"] for r in result["ranks"]}) == 1


@pytest.fixture(scope="module")
def resnet50_horovodrun(tmp_path_factory):
    """ResNet-50 on synthetic images under horovodrun (Gloo), 4 steps, with a checkpoint at the end:
    one launch for the horovodrun test and the BatchNorm statistics test."""
    tmp_path = tmp_path_factory.mktemp("resnet50-horovodrun")
    ckpt_dir = tmp_path / "ckpt"
    result, _ = run_trainer(tmp_path, "hvdrun", "horovodrun", 2,
                            ["--model", "resnet50", "--dataset", "synthetic", "--image-size", "64",
                             "--batch-size", "4", "--steps", "4", "--synthetic-size", "64",
                             "--threads-per-rank", "1", "--checkpoint-dir", str(ckpt_dir)], timeout=400)
    return result, ckpt_dir


def test_batchnorm_statistics_of_every_rank_in_checkpoint_and_result(resnet50_horovodrun):
    """Horovod reduces gradients only: each rank's BatchNorm running statistics are of its own
    batches. They are averaged over ranks before every checkpoint and at the end, and the result's
    per-rank checksum covers them: the checkpoint rank 0 wrote is the model every rank ends with.
    (ResNet-50's 4 steps under horovodrun: test_resnet50_synthetic_under_horovodrun_gloo's launch.)"""
    from hvdtrain.checkpoint import latest_checkpoint
    from hvdtrain.result_file import checksum_arrays
    from hvdtrain.torch.models import build_model

    result, ckpt_dir = resnet50_horovodrun
    checksums = {r["param_checksum"] for r in result["ranks"]}
    assert len(checksums) == 1, "the ranks end with different weights or BatchNorm statistics"
    state = torch.load(latest_checkpoint(str(ckpt_dir)), map_location="cpu", weights_only=True)
    model = build_model("resnet50", 3, state["config"]["num_classes"], 64)
    model.load_state_dict(state["model"])
    saved = [t.detach().double().numpy() for t in (*model.parameters(), *model.buffers())]
    assert checksum_arrays(saved) in checksums, "the checkpoint holds rank 0's statistics, not the average"


def test_resnet50_synthetic_under_srun(tmp_path, slurm_cluster):
    result, _ = run_trainer(tmp_path, "srun", "srun", 2,
                            ["--model", "resnet50", "--dataset", "synthetic", "--image-size", "64",
                             "--batch-size", "4", "--steps", "4", "--synthetic-size", "64",
                             "--threads-per-rank", "1"], timeout=400)
    assert result["launcher"] == "slurm" and result["world_size"] == 2
    assert result["global_step"] == 4
    assert result["throughput"]["total_images_per_sec"] > 0
    assert len({r["param_checksum"] for r in result["ranks"]}) == 1


def test_resnet50_synthetic_under_horovodrun_gloo(resnet50_horovodrun):
    result, _ = resnet50_horovodrun
    assert result["launcher"] == "horovodrun" and result["world_size"] == 2
    assert result["horovod_build_flags"]["gloo_built"] is True
    assert result["global_step"] == 4 and result["throughput"]["total_images_per_sec"] > 0


def test_imagefolder_of_real_images_trains(tmp_path):
    from hvdtrain.data.datasets import write_digits_imagefolder

    root = write_digits_imagefolder(str(tmp_path / "digits-png"), per_class_train=16, per_class_val=5, size=16)
    result, _ = run_trainer(tmp_path, "folder", "mpirun", 2,
                            ["--model", "mnist_cnn", "--dataset", "imagefolder", "--data-dir", root,
                             "--image-size", "16", "--epochs", "8", "--batch-size", "8", "--num-workers", "0",
                             "--threads-per-rank", "1", "--optimizer", "adam", "--base-lr", "0.001"])
    assert result["final"]["val_count"] == 50          # 10 classes x 5 images, each counted once
    assert result["global_step"] == 8 * (160 // 2 // 8)
    # It learned from the files: well above the 10 % of chance on the held-out images. (160 images
    # are few: at base LR 0.003 x 2 ranks one augmentation stream left the net dead at chance.)
    assert result["final"]["val_acc"] >= 0.3, result["history"]


# SGD, as these tests' learning rates assume (mnist_cnn's own recipe is Adam).
ONE_EPOCH = ["--model", "mnist_cnn", "--dataset", "digits", "--epochs", "1", "--threads-per-rank", "1",
             "--log-interval", "3", "--optimizer", "sgd", "--weight-decay", "5e-5"]


def losses(result) -> list[float]:
    return [loss for _, loss in result["loss_log"]]


RECIPE_LR = 0.005  # mnist_cnn's recipe's base LR (hvdtrain/recipes.py), ONE_EPOCH's


@pytest.fixture(scope="module")
def one_epoch_averaged(tmp_path_factory) -> dict:
    """ONE_EPOCH at 2 ranks, 32 a step, gradients averaged in full precision at the recipe's LR x 2:
    the reference of --fp16-allreduce with --batches-per-allreduce and of --use-adasum (one launch)."""
    result, _ = run_trainer(tmp_path_factory.mktemp("one-epoch"), "plain", "mpirun", 2, ONE_EPOCH + ["--batch-size", "32"])
    assert result["config"]["base_lr"] == pytest.approx(RECIPE_LR) and result["config"]["lr"] == pytest.approx(2 * RECIPE_LR)
    return result


def test_fp16_allreduce_and_batches_per_allreduce(tmp_path, one_epoch_averaged):
    result, _ = run_trainer(tmp_path, "opts", "mpirun", 2,
                            ONE_EPOCH + ["--batch-size", "16", "--batches-per-allreduce", "2", "--fp16-allreduce",
                                         "--log-dir", str(tmp_path / "tb")])
    # 1400 samples / 2 ranks / (16 x 2) per step: ignoring --batches-per-allreduce would give 43
    assert result["global_step"] == 21
    assert result["config"]["global_batch_size"] == 64
    assert len({r["param_checksum"] for r in result["ranks"]}) == 1
    # The same run with one 32-sample pass per step and full-precision gradients: accumulating two
    # halves gives (nearly) the same steps, and fp16 rounding makes them differ a little, not a lot.
    plain = one_epoch_averaged
    assert plain["global_step"] == 21
    assert losses(result) == pytest.approx(losses(plain), rel=0.02)
    assert result["ranks"][0]["param_checksum"] != plain["ranks"][0]["param_checksum"], \
        "--fp16-allreduce computed exactly what full precision does: was it applied?"
    # TensorBoard: one event file, written by rank 0, with the training and validation scalars.
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    files = list((tmp_path / "tb").iterdir())
    assert len(files) == 1, files
    events = EventAccumulator(str(tmp_path / "tb")).Reload()
    assert {"train/loss", "train/lr", "val/acc", "val/loss"} <= set(events.Tags()["scalars"])
    assert events.Scalars("val/acc")[-1].value == pytest.approx(result["final"]["val_acc"])


def test_adasum(tmp_path, one_epoch_averaged):
    result, _ = run_trainer(tmp_path, "adasum", "mpirun", 2,
                            ONE_EPOCH + ["--batch-size", "32", "--use-adasum", "--base-lr", str(2 * RECIPE_LR)])
    assert result["config"]["lr"] == pytest.approx(result["config"]["base_lr"])  # no world-size scaling
    assert len({r["param_checksum"] for r in result["ranks"]}) == 1
    # Averaging at the same LR (the recipe's base x 2 ranks) from the same start: Adasum must have
    # combined the gradients otherwise, and trained.
    averaged = one_epoch_averaged
    assert averaged["config"]["lr"] == pytest.approx(result["config"]["lr"])
    assert result["ranks"][0]["param_checksum"] != averaged["ranks"][0]["param_checksum"], \
        "--use-adasum computed exactly what averaging does: was it applied?"
    assert losses(result)[0] == pytest.approx(losses(averaged)[0], rel=0.05)  # the same first steps
    assert losses(result)[-1] < losses(result)[0], losses(result)
