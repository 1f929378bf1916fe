"""The scaling study's decisions and report on known numbers (fast tier, no Slurm): the strong-
scaling rule, E(N) against the smallest size measured, failed and pending rows, the time to an
accuracy, the options the study keeps for itself, and a collection from result files alone."""
import argparse
import json
import os

import pytest

from hvdtrain.compare import study
from hvdtrain.compare.report import summarize, time_to_accuracy
from hvdtrain.errors import UsageError
from hvdtrain.compare.workloads import custom_workload, get_workload

JOBS = ["--cpu-only", "--cpus-per-task", "1", "--tasks-per-node", "2", "--time", "10", "--signal-lead", "60"]


def _option(args: list[str], name: str) -> str:
    return args[len(args) - 1 - args[::-1].index(name) + 1]  # the last one: the trainer's parser keeps it


def test_strong_scaling_keeps_the_global_batch_and_the_lr():
    digits = get_workload("digits-cnn")  # per-rank batch 32, base LR 0.003
    assert digits.scaled_args(4, 2, "weak") == digits.trainer_args()
    strong = digits.scaled_args(4, 2, "strong")
    assert _option(strong, "--batch-size") == "16"                             # 32 x 2 ranks / 4 ranks
    assert float(_option(strong, "--base-lr")) * 4 == pytest.approx(0.003 * 2)  # LR the trainer computes
    with pytest.raises(UsageError, match="global batch 64 .* does not divide over 3 ranks"):
        digits.scaled_args(3, 2, "strong")
    mine = custom_workload(["--model", "mnist_cnn", "--dataset", "digits", "--batch-size", "12"])
    assert mine.purpose == "accuracy" and mine.batch_size == 12
    assert _option(mine.scaled_args(2, 1, "strong"), "--batch-size") == "6"
    with pytest.raises(UsageError, match="--train-args: "):
        custom_workload(["--no-such-option"])


def m(backend, nodes, rate=None, state="ok", ranks_per_node=1, **extra):
    np = nodes * ranks_per_node
    base = {"backend": backend, "nodes": nodes, "np": np, "state": state}
    if state == "ok":
        base.update(total_images_per_sec=rate, per_rank_images_per_sec=[rate / np] * np, param_checksums=["a"] * np,
                    loss_log=[[1, 2.0]], val_acc=None)
    return {**base, **extra}


def test_summary_by_nodes_with_failed_and_pending_rows():
    runs = [m("ddp", 1, state="failed", error="job 7 ended FAILED without writing its result file"),
            m("ddp", 2, 200.0), m("ddp", 3, 240.0), m("ddp", 4, state="pending")]
    one, two, three, four = summarize(runs, ["ddp"], [1, 2, 3, 4], with_accuracy=False, size_key="nodes")
    assert one["state"] == "failed" and "ended FAILED" in one["error"] and one["total_images_per_sec"] is None
    # E(N) against the smallest size that has a figure (2 nodes): 80 per rank at 3 against 100 at 2.
    assert two["scaling_efficiency"] == 1.0 and three["scaling_efficiency"] == pytest.approx(0.8)
    assert four["state"] == "pending" and four["scaling_efficiency"] is None and four["np"] == 4


def test_time_to_accuracy_is_the_first_epoch_at_the_target():
    history = [{"epoch": 1, "elapsed_s": 10.0, "val_acc": 0.5}, {"epoch": 2, "elapsed_s": 19.0, "val_acc": 0.91},
               {"epoch": 3, "elapsed_s": 28.0, "val_acc": 0.95}]
    assert time_to_accuracy(history, 0.9) == 19.0 and time_to_accuracy(history, 0.99) is None
    reached = m("ddp", 1, 100.0, history=history)
    late = m("ddp", 1, 100.0, history=history[:1])
    [row] = summarize([reached], ["ddp"], [1], with_accuracy=True, size_key="nodes", target_accuracy=0.9)
    assert row["time_to_accuracy_s"] == 19.0
    # One repeat that never reached it: no time, rather than the median of those that did.
    [row] = summarize([reached, late], ["ddp"], [1], with_accuracy=True, size_key="nodes", target_accuracy=0.9)
    assert row["time_to_accuracy_s"] is None


def test_the_study_sets_nodes_framework_job_name_and_output_itself():
    for owned in ("--nodes", "--framework", "--job-name=x", "-o"):
        with pytest.raises(UsageError, match=f"{owned.split('=')[0]} after `--` is set by the study itself"):
            study.generator_job([*JOBS, owned, "2"])
    assert study.generator_job(JOBS).tasks_per_node == 2


def _args(out, **kw):
    values = dict(out=str(out), repeats=1, scaling="weak", target_accuracy=None, parity_steps=10,
                  loss_tolerance=1e-3, accuracy_tolerance=0.01, dry_run=True, wait=False)
    values.update(kw)
    return argparse.Namespace(**values)


def _result(rate: float, ranks: int) -> dict:
    phases = {"data": 1.0, "compute": 10.0, "sync": 2.0, "optimizer": 1.0, "other": 0.5}
    return {"throughput": {"total_images_per_sec": rate, "per_rank_images_per_sec": [rate / ranks] * ranks},
            "ranks": [{"rank": r, "host": f"n{r}", "threads": 1, "param_checksum": "c", "phases_ms": phases}
                      for r in range(ranks)],
            "history": [{"epoch": 1, "elapsed_s": 5.0, "val_acc": 0.9}], "final": {"val_acc": 0.9},
            "loss_log": [[1, 2.3]], "versions": {"horovod": "0.28.1"},
            "horovod_build_flags": {"mpi_built": True, "gloo_built": False}}


def test_a_collection_needs_only_the_result_files(tmp_path):
    from hvdtrain.compare.cli import BACKENDS

    digits = get_workload("digits-cnn")
    plan = study.plan(_args(tmp_path), {"horovod-torch": BACKENDS["horovod-torch"]}, digits, [1, 2], JOBS)
    study.save(str(tmp_path), plan)
    one, two = plan["jobs"]
    assert (one["np"], two["np"]) == (2, 4) and "#SBATCH --nodes=2" in open(two["script"]).read()
    assert "--result-json " + one["result_json"] in open(one["script"]).read().replace(" \\\n    ", " ")
    os.makedirs(os.path.dirname(one["result_json"]))
    with open(one["result_json"], "w") as f:
        json.dump(_result(100.0, 2), f)
    report, status = study.collect(str(tmp_path))
    assert status == study.EXIT_NOT_DONE  # the 2-node job was never submitted
    rows = {r["nodes"]: r for r in report["summary"]}
    assert rows[1]["state"] == "ok" and rows[1]["total_images_per_sec"] == 100.0 and rows[1]["epoch_seconds"] == 5.0
    assert rows[1]["phases_ms"]["compute"] == 10.0 and rows[1]["slowest_rank"].startswith("ranks even")
    assert rows[2]["state"] == "not submitted"
    table = (tmp_path / "scaling.md").read_text()
    assert "| horovod-torch | 1 | 2 | ok | 100.00 |" in table and "| horovod-torch | 2 | 4 | not submitted |" in table
    assert "Horovod built with: mpi_built." in table and "Weak scaling: per-rank batch 32" in table
    with pytest.raises(UsageError, match="already holds a study"):
        study.start(_args(tmp_path), {"horovod-torch": BACKENDS["horovod-torch"]}, digits, [1, 2], JOBS)


def test_the_jobs_name_the_users_files_by_absolute_paths():
    """Jobs are submitted from <out>/jobs: a relative --model my_net.py:build or --data-dir would
    name files there. Module references, built-in names and absolute paths stay as they are."""
    args = ["--model", "net.py:build", "--dataset=pkg.data:datasets", "--loss", "/abs/loss.py:mse",
            "--data-dir", "data", "--log-dir=/logs", "--epochs", "1", "--model-args", "x.py:y"]
    assert study.anchored(args, "/home/u") == [
        "--model", "/home/u/net.py:build", "--dataset=pkg.data:datasets", "--loss", "/abs/loss.py:mse",
        "--data-dir", "/home/u/data", "--log-dir=/logs", "--epochs", "1", "--model-args", "x.py:y"]
