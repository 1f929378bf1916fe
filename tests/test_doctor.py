"""`python -m hvdtrain.doctor` on real ranks: ready alone, under mpirun, srun and horovodrun, and
NOT READY with the reason for a Horovod without torch ops, more ranks per node than GPUs, and
ranks that disagree with the launcher on the world size."""
import os
import re
import shutil

import pytest

from conftest import PYTHON, base_env, launch

DOCTOR = [PYTHON, "-m", "hvdtrain.doctor", "--large-mib", "4", "--timeout", "60"]


def verdict(output: str) -> list[str]:
    """The verdict lines (mpirun --tag-output may glue the next line's tag to a line's end)."""
    return [m.group(0).strip() for m in re.finditer(r"hvdtrain\.doctor: (NOT READY|READY)[^\n\[]*", output)]


@pytest.mark.slow
@pytest.mark.parametrize("launcher,np", [("single", 1), ("mpirun", 2), ("horovodrun", 2)])
def test_ready(launcher, np):
    run = launch(launcher, np, DOCTOR, timeout=120)
    out = run.output
    assert f"hvdtrain doctor: {np} rank(s) via" in out, out[-3000:]
    assert f"allreduce (sum, average) and broadcast correct on {np}/{np} rank(s)" in out, out[-3000:]
    assert "rank/size/local rank agree with Horovod on every rank" in out, out[-3000:]
    assert "framework ops: torch: ok; tensorflow: ok" in out, out[-3000:]
    assert "64 KiB" in out and "4 MiB" in out and "busbw" in out, out[-3000:]
    assert "\0" not in out and re.search(r"MPI: Open MPI v\d[^\n]*\d\n", out), out[-3000:]  # no trailing NUL
    assert [line.split("hvdtrain.doctor: ", 1)[1] for line in verdict(out)] == [
        f"READY: {np} rank(s) on 1 host(s) can train with hvdtrain.tf, hvdtrain.torch"], out[-3000:]


@pytest.mark.slow
def test_ready_under_srun(slurm_cluster):
    run = launch("srun", 2, DOCTOR, timeout=180)
    assert "hvdtrain doctor: 2 rank(s) via slurm" in run.output, run.output[-3000:]
    assert "correct on 2/2 rank(s)" in run.output and len(verdict(run.output)) == 1
    assert "READY: 2 rank(s)" in verdict(run.output)[0]


@pytest.mark.slow
def test_horovod_without_torch_ops(tmp_path):
    """A real Horovod install whose PyTorch extension is missing (a build without
    HOROVOD_WITH_PYTORCH=1): the checks still run on TensorFlow's ops, and the verdict says why."""
    import horovod

    dst = tmp_path / "site" / "horovod"
    shutil.copytree(os.path.dirname(horovod.__file__), dst, ignore=shutil.ignore_patterns("mpi_lib_v2*.so"))
    env = base_env()
    env["PYTHONPATH"] = f"{tmp_path / 'site'}{os.pathsep}{env['PYTHONPATH']}"
    run = launch("mpirun", 2, DOCTOR, timeout=120, env=env, check=False)
    assert run.returncode == 1, run.output[-3000:]
    [line] = verdict(run.output)
    assert "NOT READY" in line and "is installed without its PyTorch ops" in line, line
    assert "hvdtrain.torch cannot run; rebuild it with HOROVOD_WITH_PYTORCH=1" in line, line
    assert "correct on 2/2 rank(s)" in run.output, run.output[-3000:]  # TF's ops did the checks


@pytest.mark.slow
def test_more_ranks_than_gpus():
    """The scheduler's GPU count is what the doctor reads (as Slurm sets it for --gres=gpu:1)."""
    env = base_env()
    env["SLURM_GPUS_ON_NODE"] = "1"
    run = launch("mpirun", 2, DOCTOR + ["--framework", "torch"], timeout=120, env=env, check=False)
    assert run.returncode == 1, run.output[-3000:]
    [line] = verdict(run.output)
    assert "2 ranks but 1 GPU(s): ranks would share GPUs" in line, line
    assert "the job was given 1 GPU(s) but the framework sees none" in line, line


@pytest.mark.slow
def test_ranks_disagree_on_world_size(tmp_path):
    """Two processes a launcher meant as ranks 0 and 1 of 2, whose MPI never joined them (as
    `srun --mpi=none` does with Open MPI): each is a world of one, and each says so."""
    procs = []
    for rank in (0, 1):
        env = base_env()
        env.update(HOROVOD_RANK=str(rank), HOROVOD_SIZE="2", HOROVOD_LOCAL_RANK=str(rank), HOROVOD_LOCAL_SIZE="2",
                   HOROVOD_CROSS_SIZE="1")
        procs.append(launch("single", 1, DOCTOR + ["--framework", "torch"], timeout=120, env=env, check=False))
    for rank, run in enumerate(procs):
        assert run.returncode == 1, run.output[-3000:]
        [line] = verdict(run.output)
        assert "the launcher (horovodrun) and Horovod disagree: size 2 (launcher) vs 1 (Horovod)" in line, line
        if rank == 1:
            assert "rank 1 (launcher) vs 0 (Horovod)" in line, line


# ------------------------------------------------------------------------------ pure logic (fast)
def test_scheduler_gpus_from_the_environment():
    from hvdtrain.doctor import scheduler_gpus

    assert scheduler_gpus({}) is None
    assert scheduler_gpus({"SLURM_GPUS_ON_NODE": "4", "CUDA_VISIBLE_DEVICES": "0"}) == 4
    assert scheduler_gpus({"CUDA_VISIBLE_DEVICES": "0,1,2,3"}) == 4
    assert scheduler_gpus({"CUDA_VISIBLE_DEVICES": ""}) == 0
    assert scheduler_gpus({"CUDA_VISIBLE_DEVICES": "NoDevFiles"}) == 0


def test_gpu_problems():
    from hvdtrain.doctor import gpu_problems

    assert gpu_problems("n1", 4, 4, 4) == []
    assert gpu_problems("n1", 2, 0, None) == []          # a CPU run
    [share] = gpu_problems("n1", 8, 4, 4)
    assert share.startswith("n1: 8 ranks but 4 GPU(s)")
    unseen = gpu_problems("n1", 1, 0, 1)
    assert len(unseen) == 1 and "the framework sees none" in unseen[0]


def test_bus_bandwidth_is_nccl_tests_definition():
    from hvdtrain.doctor import bus_bandwidth

    # 1 GB in 1 s: algbw 1 GB/s; busbw x 2(n-1)/n: 1 at 2 ranks, 1.5 at 4, 1.75 at 8.
    assert bus_bandwidth(10**9, 1.0, 2) == (1.0, 1.0)
    assert bus_bandwidth(10**9, 1.0, 4) == (1.0, 1.5)
    assert bus_bandwidth(10**9, 0.5, 8) == (2.0, 3.5)


def test_gpu_node_with_a_horovod_built_without_gpu_ops():
    """A Horovod built on a login node without the CUDA module, run on a GPU node: one line that
    says so and what to do (the doctor reports it, hvdtrain.torch refuses with it)."""
    from hvdtrain.horovod_ops import gpu_ops_problem

    line = gpu_ops_problem(4, cuda_built=False, nccl_built=False, horovod_version="0.28.1")
    assert line.startswith("4 GPU(s) here, but Horovod 0.28.1 is built without CUDA and NCCL ops"), line
    assert "bash scripts/setup.sh --gpu" in line and "CUDA module is loaded" in line
    assert "without NCCL" in gpu_ops_problem(1, cuda_built=True, nccl_built=False)
    assert gpu_ops_problem(4, cuda_built=True, nccl_built=True) is None     # the NCCL build
    assert gpu_ops_problem(0, cuda_built=False, nccl_built=False) is None   # a CPU node: nothing to say
    assert gpu_ops_problem(0, cuda_built=True, nccl_built=True) is None     # the NCCL build on a CPU node


def test_srun_needs_of_each_mpi():
    from hvdtrain.doctor import srun_mpi_hint

    assert "--mpi=pmix" in srun_mpi_hint("Open MPI v5.0.11, package: Open MPI ... Distribution")
    assert "Open MPI 5" in srun_mpi_hint("Open MPI v5.0.11")
    assert "--mpi=pmix" in srun_mpi_hint("Open MPI v4.1.4, package: Debian OpenMPI")
    assert "--mpi=pmi2" in srun_mpi_hint("MPICH Version: 4.2.0")
    assert srun_mpi_hint("unknown (ImportError)") is None
