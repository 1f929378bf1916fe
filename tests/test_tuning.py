import pytest
"""hvdtrain's Horovod settings: chosen from the resources, never overriding the user's, and
really in force in a launched trainer."""
import json

from conftest import PYTHON, base_env, launch
from hvdtrain.cluster.tuning import apply, horovod_settings


def test_cpu_ranks_yield():
    assert horovod_settings("auto", on_cpu=True) == {"OMPI_MCA_mpi_yield_when_idle": "1"}


def test_gpu_ranks_with_many_cores_keep_horovod_defaults():
    assert horovod_settings("auto", on_cpu=False) == {}


def test_gpu_ranks_never_yield():
    # A GPU rank that yields its core while waiting adds latency to every allreduce, whatever
    # its cores: the settings do not take them.
    assert horovod_settings("auto", on_cpu=False) == {}
    assert horovod_settings("auto", on_cpu=True) == {"OMPI_MCA_mpi_yield_when_idle": "1"}
    assert horovod_settings("auto", on_cpu=False, mpi_yield="on") == {"OMPI_MCA_mpi_yield_when_idle": "1"}


def test_off_and_explicit_values():
    assert horovod_settings("off", on_cpu=True) == {}
    s = horovod_settings("auto", on_cpu=False, cycle_time_ms=2.5, mpi_yield="on")
    assert s == {"OMPI_MCA_mpi_yield_when_idle": "1", "HOROVOD_CYCLE_TIME": "2.5"}


def test_user_export_wins(monkeypatch):
    monkeypatch.setenv("HOROVOD_CYCLE_TIME", "20")
    monkeypatch.delenv("OMPI_MCA_mpi_yield_when_idle", raising=False)
    applied = apply({"HOROVOD_CYCLE_TIME": "5", "OMPI_MCA_mpi_yield_when_idle": "1"})
    assert applied == {"HOROVOD_CYCLE_TIME": "20", "OMPI_MCA_mpi_yield_when_idle": "1"}


@pytest.mark.slow
def test_trainer_records_settings_in_force(tmp_path):
    result = tmp_path / "r.json"
    env = base_env()
    for key in ("HOROVOD_CYCLE_TIME", "OMPI_MCA_mpi_yield_when_idle", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"):
        env.pop(key, None)
    launch("mpirun", 2, [PYTHON, "-m", "hvdtrain.torch", "--model", "mnist_cnn", "--dataset", "digits",
                         "--steps", "3", "--threads-per-rank", "1", "--cycle-time-ms", "7",
                         "--result-json", str(result)], timeout=120, env=env)
    data = json.loads(result.read_text())
    assert data["horovod_tuning"] == {"OMPI_MCA_mpi_yield_when_idle": "1", "HOROVOD_CYCLE_TIME": "7",
                                      "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "900"}  # the watchdog's backstop
    assert data["environment"]["env"]["HOROVOD_CYCLE_TIME"] == "7"
