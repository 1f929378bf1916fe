"""Launch commands, root-only variables and the config's derived values (fast tier)."""
import os

import pytest

from hvdtrain.config import TrainConfig
from hvdtrain.errors import UsageError
from hvdtrain.launch import launch_command, launch_env, root_variables


def test_launch_commands():
    assert launch_command("mpirun", 2) == ["mpirun", "-np", "2", "--bind-to", "none", "--oversubscribe"]
    assert launch_command("srun", 4, tag_output=True, time_limit_min=10) == [
        "srun", "--mpi=pmix", "-n", "4", "--label", "--kill-on-bad-exit=1", "-t", "10"]
    # On as few nodes as the tasks per node make; a name by which a step left behind is cancelled.
    assert launch_command("srun", 4, tasks_per_node=2, job_name="j")[:7] == [
        "srun", "--job-name=j", "--mpi=pmix", "-n", "4", "-N2", "--ntasks-per-node=2"]
    assert launch_command("horovodrun", 2)[:3] == ["horovodrun", "-np", "2"]
    assert launch_command("single", 1) == []
    with pytest.raises(ValueError):
        launch_command("pdsh", 2)


def test_root_variables_only_for_root(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert root_variables() == {}
    assert "OMPI_ALLOW_RUN_AS_ROOT" not in launch_env({"PATH": "/bin"})
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert launch_env({"PATH": "/bin"}, X="1") == {"PATH": "/bin", "OMPI_ALLOW_RUN_AS_ROOT": "1",
                                                    "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "X": "1"}


def test_derived_values_are_properties():
    cfg = TrainConfig(batch_size=32, world_size=4, batches_per_allreduce=2, base_lr=0.01)
    assert cfg.global_batch_size == 32 * 4 * 2 and cfg.lr == pytest.approx(0.01 * 4 * 2)


def test_validation_defaults_to_off_on_synthetic_data_only():
    assert not TrainConfig(dataset="synthetic").validates
    assert TrainConfig(dataset="synthetic", validation="on").validates
    assert TrainConfig(dataset="digits").validates
    assert not TrainConfig(dataset="digits", validation="off").validates


@pytest.mark.parametrize("field, value, says", [
    ("batch_size", 0, "--batch-size must be >= 1 (got 0)"),
    ("dataset", "cifar", "unknown dataset 'cifar'"),
    ("log_interval", 0, "--log-interval must be >= 1"),
    ("resume", True, "--resume needs --checkpoint-dir"),
])
def test_config_refuses_bad_values(field, value, says):
    with pytest.raises(UsageError, match=says.replace("(", r"\(").replace(")", r"\)")):
        TrainConfig(**{field: value})


def test_image_folders_are_checked_before_training(tmp_path):
    from hvdtrain.data.datasets import check_enough_samples, check_imagefolder

    with pytest.raises(UsageError, match=f"data dir '{tmp_path / 'nowhere'}' does not exist"):
        check_imagefolder(str(tmp_path / "nowhere"))
    (tmp_path / "train" / "cat").mkdir(parents=True)
    (tmp_path / "val" / "cat").mkdir(parents=True)
    with pytest.raises(UsageError, match="holds no images"):
        check_imagefolder(str(tmp_path))
    with pytest.raises(UsageError, match="the validation set has 1 samples, fewer than the 2 ranks"):
        check_enough_samples(1, 2, "the validation set")
