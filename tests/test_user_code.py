"""A user's own model, data and loss (tests/scripts/user_regression.py: a regression with its own
Dataset class, BatchNorm buffers, dropout and an MSE loss, none of the built-in workloads),
through hvdtrain.torch.fit and through the command line's FILE.py:FUNCTION references, launched
for real."""
import json

import pytest

from conftest import PYTHON, REPO, assert_weights_equal, launch

pytestmark = pytest.mark.slow  # real ranks: the distributed tier

SCRIPT = f"{REPO}/tests/scripts/user_regression.py"
PLUGINS = ["--model", f"{SCRIPT}:build_model", "--dataset", f"{SCRIPT}:datasets", "--loss", f"{SCRIPT}:mse",
           "--batch-size", "16", "--base-lr", "0.005", "--threads-per-rank", "1", "--num-workers", "1", "--log-interval", "4"]


def fit(tmp_path, name, launcher="mpirun", **options):
    result = tmp_path / f"{name}.json"
    launch(launcher, 2, [PYTHON, SCRIPT, json.dumps({**options, "result_json": str(result)})], timeout=180)
    return json.loads(result.read_text())


def assert_learned(result):
    first, last = result["history"][0], result["history"][-1]
    # The target's variance is about 1: a model that learned nothing stays near it.
    assert last["val_loss"] < 0.1 < first["train_loss"], result["history"]
    assert last["train_acc"] is None and last["val_acc"] is None and last["val_count"] == 128
    assert len({r["param_checksum"] for r in result["ranks"]}) == 1, result["ranks"]
    assert result["throughput"]["unit"] == "samples"  # vectors, not images: the rates say so


FIT = dict(epochs=3, batch_size=16, base_lr=0.005, threads_per_rank=1, num_workers=0)


def assert_named(result):
    assert result["config"]["model"] == "torch.nn.modules.container:Sequential"
    assert result["config"]["dataset"] == "__main__:Regression" and result["config"]["loss"] == "__main__:mse"
    assert result["config"]["recipe"] == "your-model" and result["config"]["optimizer"] == "adamw"


def test_fit_trains_a_users_model_data_and_loss_under_ddp(tmp_path):
    # torchrun: the launcher of the torch.distributed backends.
    result = fit(tmp_path, "ddp", launcher="torchrun", backend="ddp", **FIT)
    assert_learned(result)
    assert_named(result)
    assert result["backend"] == "ddp" and result["world_size"] == 2 and result["launcher"] == "torchrun"


def assert_same_weights(uninterrupted_dir, resumed_dir):
    # The BatchNorm statistics are averaged over the ranks at each checkpoint, the extra one
    # too: equal up to float rounding (an average is linear in what it averages).
    state = assert_weights_equal(uninterrupted_dir, resumed_dir)
    assert any("running_mean" in k for k in state)


def test_fit_under_horovod_interrupted_and_resumed_ends_with_the_uninterrupted_weights(tmp_path, slurm_cluster):
    # Each run under another of Horovod's launchers: srun (PMIx, the local Slurm cluster),
    # horovodrun (Gloo), mpirun.
    whole = fit(tmp_path, "whole", launcher="srun", checkpoint_dir=str(tmp_path / "whole"), **FIT)
    assert_learned(whole)
    assert_named(whole)
    assert whole["backend"] == "horovod" and whole["launcher"] == "slurm"
    # Stopped in the middle of epoch 2 (16 steps an epoch), then the same script again.
    part = fit(tmp_path, "part", launcher="horovodrun", checkpoint_dir=str(tmp_path / "part"), steps=21, **FIT)
    assert part["launcher"] == "horovodrun" and part["global_step"] == 21
    resumed = fit(tmp_path, "rest", checkpoint_dir=str(tmp_path / "part"), **FIT)
    assert resumed["history"][-1]["epoch"] == 3 and len({r["param_checksum"] for r in resumed["ranks"]}) == 1
    assert_same_weights(tmp_path / "whole", tmp_path / "part")


def test_references_on_the_command_line_under_ddp_resume_to_the_uninterrupted_weights(tmp_path):
    """(Under Horovod, the comparison's test below runs them.)"""
    def run(name, *extra):
        result = tmp_path / f"{name}.json"
        launch("mpirun", 2, [PYTHON, "-m", "hvdtrain.torch", "--backend", "ddp", *PLUGINS, "--epochs", "3", *extra,
                             "--result-json", str(result)], timeout=180)
        return json.loads(result.read_text())

    whole = run("whole", "--checkpoint-dir", str(tmp_path / "whole"))
    assert_learned(whole)
    run("part", "--checkpoint-dir", str(tmp_path / "part"), "--steps", "21")
    resumed = run("rest", "--checkpoint-dir", str(tmp_path / "part"))
    assert resumed["history"][-1]["epoch"] == 3 and resumed["config"]["loss"] == f"{SCRIPT}:mse"
    assert len({r["param_checksum"] for r in resumed["ranks"]}) == 1
    assert_same_weights(tmp_path / "whole", tmp_path / "part")


def test_the_comparison_runs_a_users_model_under_the_torch_backends(tmp_path):
    out = tmp_path / "compare"
    run = launch("single", 1, [PYTHON, "-m", "hvdtrain.compare", "--model", f"{SCRIPT}:build_model",
                               "--dataset", f"{SCRIPT}:datasets", "--loss", f"{SCRIPT}:mse", "--train-args",
                               "--epochs 1 --batch-size 16 --log-interval 1", "--backends", "horovod-torch,ddp",
                               "--np", "2", "--out", str(out)], timeout=240)
    report = json.loads((out / "compare.json").read_text())
    assert report["workload"]["given_args"][:2] == ["--model", f"{SCRIPT}:build_model"], report["workload"]
    [check] = report["parity"]["checks"]
    assert check["pair"] == ["horovod-torch", "ddp"] and check["ok"] and check["steps_compared"] == 10, check
    assert all(m["total_images_per_sec"] > 0 for m in report["measurements"]), run.output[-2000:]
    assert report["unit"] == "samples/s" and "samples/s" in run.output and "img/s" not in run.output
