"""`import hvdtrain.lightning` + `pl.Trainer(strategy="horovod")` on a user's LightningModule
(tests/scripts/lightning_user.py, shaped as the courses write one: a LightningDataModule over a
plain DataLoader, configure_optimizers with an LR schedule, self.log(sync_dist=True)), under real
`mpirun -np 2` and `srun` on the suite's Slurm cluster, against the same script under `ddp`."""
from __future__ import annotations

import json
import os
import re
import subprocess
import time

import pytest
import torch

from conftest import PYTHON, REPO, base_env, launch
from slurm_helpers import job_info, run, submit, tail, wait_for_end, wait_until

pytestmark = pytest.mark.slow  # real ranks: the distributed tier

SCRIPT = os.path.join(REPO, "tests", "scripts", "lightning_user.py")
STEPS_PER_EPOCH = 8  # 256 samples, 2 ranks, 16 a batch


def fit(tmp_path, name: str, *args: str, check: bool = True, timeout: float = 180):
    """mpirun -np 2 of the user's script; (each rank's record, the launch)."""
    out = tmp_path / name
    done = launch("mpirun", 2, [PYTHON, SCRIPT, "--out", str(out), "--root", str(tmp_path / f"{name}-root"), *args],
                  timeout=timeout, check=check)
    ranks = [json.loads(p.read_text()) for p in sorted(tmp_path.glob(f"{name}.rank*.json"))]
    return ranks, done


def params(record) -> dict:
    return {k: torch.tensor(v) for k, v in record["state"].items()}


def relative_distance(a: dict, b: dict) -> float:
    return max(float((a[k] - b[k]).norm() / b[k].norm()) for k in b)


def records(tmp, name: str) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(tmp.glob(f"{name}.rank*.json"))]


# The Horovod runs, one after the other in one launch (the script's "+"), and DDP's: 3 epochs of
# the user's module, its ModelCheckpoint keeping every epoch's checkpoint.
VARIANTS = {
    "horovod": ["--epochs", "3"],
    "acc": ["--epochs", "3", "--batch-size", "8", "--accumulate", "2"],
    "bf16": ["--epochs", "2", "--precision", "bf16-mixed", "--clip", "1.0", "--checkpoint-every", "4"],
    "fp16": ["--epochs", "3", "--fp16-scaler"],
    "resumed": ["--epochs", "3", "--ckpt-path", "{tmp}/horovod-root/ckpt/epoch=1-step=16.ckpt"],
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("lightning")
    argv = []
    for name, args in VARIANTS.items():
        argv += ["+"] * bool(argv) + ["--out", str(tmp / name), "--root", str(tmp / f"{name}-root"),
                                      *(a.format(tmp=tmp) for a in args)]
    done = launch("mpirun", 2, [PYTHON, SCRIPT, *argv], timeout=300)
    fit(tmp, "ddp", "--strategy", "ddp", "--epochs", "3")
    return tmp, {name: records(tmp, name) for name in [*VARIANTS, "ddp"]}, done.output


def test_horovod_strategy_trains_as_ddp_does(runs):
    _, run, _ = runs
    horovod, ddp = run["horovod"], run["ddp"]
    # Horovod's ranks, as Lightning reports them; Horovod's optimizer, the LR as under ddp.
    assert [(r["rank"], r["world_size"], r["local_rank"], r["node_rank"]) for r in horovod] == [(0, 2, 0, 0), (1, 2, 1, 0)]
    assert {r["strategy"] for r in horovod} == {"HorovodStrategy"} and {r["strategy"] for r in ddp} == {"DDPStrategy"}
    assert {r["optimizer"] for r in horovod} == {"horovod.torch.optimizer"}
    assert [r["lr"] for r in horovod] == [r["lr"] for r in ddp]
    # Each rank its half of each epoch (the sampler injected, its epoch set), the same as ddp's.
    for records_ in (horovod, ddp):
        assert [r["batches"] for r in records_] == [3 * STEPS_PER_EPOCH] * 2
        for epoch in range(3):
            halves = [set(r["seen"][epoch * 128:(epoch + 1) * 128]) for r in records_]
            assert not halves[0] & halves[1] and len(halves[0] | halves[1]) == 256
    assert [r["seen"] for r in horovod] == [r["seen"] for r in ddp]
    assert horovod[0]["seen"][:128] != horovod[0]["seen"][128:256]  # set_epoch: another order each epoch
    # Ranks end with equal weights; the same first losses as ddp (the same start, rank 0's weights),
    # and the same final weights within float rounding of the two allreduces (2 ranks: equal here).
    assert horovod[0]["state"] == horovod[1]["state"]
    assert [r["losses"][0] for r in horovod] == [r["losses"][0] for r in ddp]
    assert relative_distance(params(horovod[0]), params(ddp[0])) < 1e-5
    assert horovod[0]["losses"][-1] < horovod[0]["losses"][0]
    # The module's collectives and a torchmetrics metric: Horovod's give what DDP's process group gives.
    assert [r["collectives"] for r in horovod] == [r["collectives"] for r in ddp]
    assert horovod[1]["collectives"] == {"all_gather": [[0, 10], [1, 11]], "reduce_sum": 3.0, "reduce_mean": 1.5,
                                         "reduce_max": 2.0, "broadcast": {"from": 0}, "any": True,
                                         "samples_seen": 768.0}


def test_accumulated_batches_match_the_doubled_batch(runs):
    """accumulate_grad_batches=2 at 8 a batch: Horovod reduces once per step (backward passes per
    step 2), over the same 16 samples a rank as one batch of 16: the same weights."""
    _, run, _ = runs
    accumulated = run["acc"]
    assert [r["global_step"] for r in accumulated] == [3 * STEPS_PER_EPOCH] * 2
    assert [r["batches"] for r in accumulated] == [6 * STEPS_PER_EPOCH] * 2
    assert accumulated[0]["state"] == accumulated[1]["state"]
    assert relative_distance(params(accumulated[0]), params(run["horovod"][0])) < 1e-5


def test_bf16_mixed_trains_with_clipping_and_interval_checkpoints(runs):
    """bf16-mixed with gradient clipping; HorovodStrategy(checkpoint_every="4"): the guards write
    hpc_ckpt_N.ckpt every 4 optimizer steps on rank 0, the newest 3 kept."""
    tmp, run, output = runs
    bf16 = run["bf16"]
    assert bf16[0]["state"] == bf16[1]["state"]
    assert bf16[0]["losses"][-1] < bf16[0]["losses"][0]
    assert len(re.findall(r"hvdtrain\.lightning: checkpoint at step (4|8|12|16) \(every 4 steps\)", output)) == 4
    kept = sorted((tmp / "bf16-root").glob("hpc_ckpt_*.ckpt"))
    assert [p.name for p in kept] == ["hpc_ckpt_2.ckpt", "hpc_ckpt_3.ckpt", "hpc_ckpt_4.ckpt"], kept
    assert torch.load(kept[-1], weights_only=False)["global_step"] == 2 * STEPS_PER_EPOCH
    assert not list((tmp / "horovod-root").glob("hpc_ckpt_*.ckpt"))  # none without checkpoint_every


def test_fp16_with_a_grad_scaler_unscales_averaged_gradients_once(runs):
    """16-mixed's path (a GradScaler: scaled loss, unscale, step) on the CPU, whose torch has fp16
    autocast and a GradScaler (Lightning's "16-mixed" string itself means bf16 there). The strategy
    waits for the allreduce before the scaler unscales (unscaling the local gradients while Horovod
    writes the averaged, still scaled, ones into them would step with 65536 x the gradient) and the
    step does not reduce again (Horovod warns when it would: in none of the launch's runs)."""
    _, run, output = runs
    fp16 = run["fp16"]
    assert fp16[0]["state"] == fp16[1]["state"]
    assert relative_distance(params(fp16[0]), params(run["horovod"][0])) < 2e-2  # fp16 rounding, not 65536 x
    assert "skip_synchronize" not in output, output[-3000:]


def test_ckpt_path_resume_continues_from_the_saved_epoch_and_step(runs):
    """Every rank loads `ckpt_path` (the 3-epoch run's checkpoint after epoch 2); the third epoch
    then ends where the uninterrupted run's did."""
    _, run, _ = runs
    resumed = run["resumed"]
    assert [r["started_at"] for r in resumed] == [{"epoch": 2, "global_step": 2 * STEPS_PER_EPOCH}] * 2
    assert [r["global_step"] for r in resumed] == [3 * STEPS_PER_EPOCH] * 2
    assert [r["batches"] for r in resumed] == [STEPS_PER_EPOCH] * 2
    assert resumed[0]["state"] == resumed[1]["state"]
    assert relative_distance(params(resumed[0]), params(run["horovod"][0])) < 1e-6


def test_an_exception_on_rank_1_ends_both_ranks_with_one_line(tmp_path):
    start = time.monotonic()
    _, done = fit(tmp_path, "fail", "--fail-at", "1:5", check=False, timeout=60)
    assert done.returncode != 0 and time.monotonic() - start < 60, done.output[-3000:]
    lines = re.findall(r"hvdtrain\.lightning: error \[rank (\d)/2\] at step (\d+) \(epoch 0\): (.*)", done.output)
    assert lines == [("1", "5", "ValueError: a bad sample on rank 1; ending this rank (the launcher ends the others)")], \
        done.output[-3000:]
    assert "Traceback" in done.output  # the failing rank's own, above its line


def test_a_nan_loss_stops_every_rank_without_a_checkpoint(tmp_path):
    _, done = fit(tmp_path, "nan", "--diverge-at", "5", check=False, timeout=60)
    assert done.returncode != 0, done.output[-3000:]
    assert re.search(r"hvdtrain\.lightning: error \[rank \d/2\]: the training loss is nan at step 6: training "
                     r"diverged .*the newest checkpoint is none", done.output), done.output[-3000:]
    assert not list((tmp_path / "nan-root").glob("hpc_ckpt_*.ckpt"))


def test_what_the_strategy_cannot_do_is_refused_in_one_line(tmp_path):
    _, done = fit(tmp_path, "syncbn", "--sync-batchnorm", check=False, timeout=60)
    assert done.returncode != 0 and re.search(r"hvdtrain\.lightning: error \[rank \d/2\]: HorovodStrategy: "
                                              r"Trainer\(sync_batchnorm=True\) is not supported", done.output), \
        done.output[-3000:]


LIGHTNING_JOB = """#!/bin/bash
#SBATCH --job-name=hvdtrain-lightning
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=2
#SBATCH --cpus-per-task=1
#SBATCH --time=10
#SBATCH --output=%x-%j.out
#SBATCH --requeue
#SBATCH --open-mode=append
srun --mpi=pmix {extra} {python} {script} --out {out} --root {root} --epochs 3 --step-sleep 0.2 {args}
"""


def lightning_job(tmp_path, args: str = "", extra: str = "") -> str:
    script = tmp_path / "job.sbatch"
    script.write_text(LIGHTNING_JOB.format(python=PYTHON, script=SCRIPT, out=tmp_path / "job", root=tmp_path / "root",
                                           args=args, extra=extra))
    return str(script)


def test_usr1_under_slurm_checkpoints_requeues_and_resumes(slurm_cluster, tmp_path):
    """`scancel --signal=USR1` (as `#SBATCH --signal=USR1@T` before the limit): the ranks stop at one
    step with a checkpoint, rank 0 requeues the job, and the requeued job's `fit` (no ckpt_path)
    resumes from it as Lightning does under Slurm, then completes."""
    job_id, log = submit(lightning_job(tmp_path), str(tmp_path))
    wait_until("training steps", lambda: "step time:" in tail(log, 10**6), 240, job_id, log, 0.5)
    run(["scancel", "--signal=USR1", job_id])
    info = wait_for_end(job_id, log, timeout=300, restarts=1)
    text = tail(log, 10**6)
    stopped = re.search(r"stopped by SIGUSR1 at step (\d+) \(epoch \d\); checkpoint written", text)
    assert stopped and f"job {job_id} requeued" in text, text[-4000:]
    assert info["JobState"] == "COMPLETED" and info["Restarts"] == "1", (info, text[-4000:])
    records = [json.loads((tmp_path / f"job.rank{r}.json").read_text()) for r in (0, 1)]
    assert [(r["rank"], r["world_size"], r["local_rank"], r["node_rank"]) for r in records] == [(0, 2, 0, 0), (1, 2, 1, 0)]
    assert [r["started_at"]["global_step"] for r in records] == [int(stopped.group(1))] * 2
    assert [r["global_step"] for r in records] == [3 * STEPS_PER_EPOCH] * 2


def test_an_exception_under_srun_ends_the_job(slurm_cluster, tmp_path):
    job_id, log = submit(lightning_job(tmp_path, "--fail-at 1:3", "--kill-on-bad-exit=1"), str(tmp_path))
    info = wait_for_end(job_id, log, timeout=120)
    text = tail(log, 10**6)
    assert info["JobState"] == "FAILED", (info, text[-4000:])
    assert "hvdtrain.lightning: error [rank 1/2] at step 3 (epoch 0): ValueError: a bad sample on rank 1" in text, \
        text[-4000:]
    assert job_info(job_id)["JobState"] == "FAILED"


def test_the_comparison_runs_a_users_module_under_ddp_and_horovod(tmp_path):
    """python -m hvdtrain.lightning.compare on the user's module and data module: both strategies
    run, with img/s each and the parity checks passed (the same batches, first losses, weights)."""
    out = tmp_path / "cmp"
    done = subprocess.run([PYTHON, "-m", "hvdtrain.lightning.compare", "--module", f"{SCRIPT}:module",
                           "--datamodule", f"{SCRIPT}:datamodule", "--np", "2", "--max-epochs", "1",
                           "--out", str(out)], env=base_env(), capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads((out / "compare.json").read_text())
    parity = summary["parity"]
    assert parity["passed"] and parity["samples_equal"] and parity["first_losses_equal"], parity
    assert parity["weights_relative_distance"] is not None and parity["weights_relative_distance"] < 1e-5
    rates = {name: summary["samples_per_sec"][name]["median"] for name in ("ddp", "horovod")}
    assert all(rate > 0 for rate in rates.values()) and summary["horovod_over_ddp"] == rates["horovod"] / rates["ddp"]
    for name in ("ddp", "horovod"):
        ranks = summary["runs"][name][0]
        assert sorted(r["rank"] for r in ranks) == [0, 1] and {r["world_size"] for r in ranks} == {2}
    assert {r["strategy"] for r in summary["runs"]["horovod"][0]} == {"HorovodStrategy"}
    assert "| horovod |" in (out / "compare.md").read_text() and "PASSED" in done.stdout


def test_the_course_shaped_example_trains_on_hvdtrains_shards(tmp_path):
    """torch_examples/lightning_imagenet.py (torchvision ResNet, hvdtrain.lightning.ImageDataModule,
    torchmetrics, strategy="horovod") on digit images in hvdtrain's shards, 2 ranks."""
    from hvdtrain.data.datasets import write_digits_imagefolder

    folder = write_digits_imagefolder(str(tmp_path / "digits"), size=32)
    run([PYTHON, "-m", "hvdtrain.shards", "write", "--imagefolder", folder, "--out", str(tmp_path / "shards"),
         "--shard-mb", "0.05"], timeout=120)
    done = launch("mpirun", 2, [PYTHON, os.path.join(REPO, "torch_examples", "lightning_imagenet.py"), "--data-dir",
                                str(tmp_path / "shards"), "--arch", "resnet18", "--image-size", "32", "--epochs", "1",
                                "--batch-size", "16", "--lr", "0.02", "--root", str(tmp_path / "root")], timeout=240)
    # 200 training images, 2 ranks x 16 a step: 6 steps an epoch; validation's accuracy from torchmetrics.
    assert re.search(r"epoch 1, step 6: \{.*'val_acc': '0\.\d+'", done.output), done.output[-3000:]
