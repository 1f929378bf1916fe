"""The GPU path decided on the CPU: which device a rank trains on, under each way a
launcher hands out GPUs, and what the backends are told of it. Pure decisions, given the
environment Slurm (or a site) sets for one task and the GPU count the framework would see.

    python -m pytest -q tests/test_devices.py
"""
import os

import pytest

from hvdtrain.cluster.env import bound_per_task, gpu_for_rank, node_gpus
from hvdtrain.errors import UsageError

# One task of a 4-task step on a 4-GPU node, as srun sets it (SLURM_LOCALID 2).
SRUN_TASK = {"SLURM_PROCID": "2", "SLURM_STEP_ID": "0", "SLURM_LOCALID": "2", "SLURM_NTASKS": "4",
             "SLURM_STEP_NUM_TASKS": "4", "SLURM_TASKS_PER_NODE": "4", "SLURM_NNODES": "1"}
BINDINGS = {
    # srun -n 4 --gres=gpu:4: every task sees the node's 4 GPUs.
    "none": ({**SRUN_TASK, "SLURM_GPUS_ON_NODE": "4", "CUDA_VISIBLE_DEVICES": "0,1,2,3",
              "SLURM_STEP_GPUS": "0,1,2,3"}, 4),
    # srun -n 4 --gpus-per-task=1 (implies --gpu-bind=per_task:1): Slurm narrows CUDA_VISIBLE_DEVICES
    # and SLURM_STEP_GPUS to the task's GPU; SLURM_GPUS_ON_NODE keeps the step's count.
    "gpus-per-task=1": ({**SRUN_TASK, "SLURM_GPUS_PER_TASK": "1", "SLURM_GPUS_ON_NODE": "4",
                         "CUDA_VISIBLE_DEVICES": "2", "SLURM_STEP_GPUS": "2"}, 1),
    # srun -n 4 --gres=gpu:4 --gpu-bind=single:1 (SLURM_TRES_BIND as srun exports it).
    "gpu-bind=single:1": ({**SRUN_TASK, "SLURM_TRES_BIND": "gres/gpu:single:1", "SLURM_GPUS_ON_NODE": "4",
                           "CUDA_VISIBLE_DEVICES": "2", "SLURM_STEP_GPUS": "2"}, 1),
    # A site's default binding (task prolog): CUDA_VISIBLE_DEVICES per task, Slurm's step list untouched.
    "CUDA_VISIBLE_DEVICES per task": ({**SRUN_TASK, "SLURM_GPUS_ON_NODE": "4", "CUDA_VISIBLE_DEVICES": "2",
                                       "SLURM_STEP_GPUS": "0,1,2,3"}, 1),
    # Slurm before 21.08 (no SLURM_GPUS_ON_NODE): --gpus-per-task=1 says it.
    "gpus-per-task=1, Slurm 20.11": ({**SRUN_TASK, "SLURM_GPUS_PER_TASK": "1", "CUDA_VISIBLE_DEVICES": "2"}, 1),
}


@pytest.mark.parametrize("binding", BINDINGS)
def test_each_rank_gets_a_gpu_of_its_own(binding):
    environ, visible = BINDINGS[binding]
    want = 2 if binding == "none" else 0   # local rank 2 takes GPU 2 of 4, or the one it sees
    assert gpu_for_rank(2, 4, visible, environ) == want
    assert [gpu_for_rank(r, 4, visible, environ) for r in range(4)] == ([0, 1, 2, 3] if binding == "none" else [0] * 4)


def test_ranks_really_sharing_a_gpu_are_refused_with_the_one_line_message():
    shared = {**SRUN_TASK, "SLURM_NTASKS": "2", "SLURM_TASKS_PER_NODE": "2", "SLURM_GPUS_ON_NODE": "1",
              "CUDA_VISIBLE_DEVICES": "0"}
    with pytest.raises(UsageError) as err:
        gpu_for_rank(1, 2, 1, shared)
    message = str(err.value)
    assert message == ("2 ranks on this node but 1 visible GPU(s): hvdtrain runs one rank per GPU; start 1 task(s) "
                       "per node (srun --ntasks-per-node=1, mpirun -npernode 1) or make the node's other GPUs "
                       "visible (CUDA_VISIBLE_DEVICES)")
    # Nothing says how many GPUs the node holds (mpirun, no Slurm): sharing is assumed.
    with pytest.raises(UsageError, match="^4 ranks on this node but 1 visible GPU"):
        gpu_for_rank(0, 4, 1, {})
    # --gpu-bind=single:2: 2 GPUs for 4 tasks, each task sees one, two tasks per GPU.
    with pytest.raises(UsageError):
        gpu_for_rank(0, 4, 1, {**SRUN_TASK, "SLURM_GPUS_ON_NODE": "2", "CUDA_VISIBLE_DEVICES": "0"})


def test_tasks_bound_to_a_shared_subset_are_refused_with_the_binding_named():
    # --gpu-bind=closest on a 4-GPU node: each socket's 2 GPUs for its 2 tasks.
    closest = {**SRUN_TASK, "SLURM_GPUS_ON_NODE": "4", "CUDA_VISIBLE_DEVICES": "2,3"}
    with pytest.raises(UsageError) as err:
        gpu_for_rank(2, 4, 2, closest)
    assert "Slurm bound each task to 2 of this node's 4 GPUs" in str(err.value)
    assert "\n" not in str(err.value)


def test_cpu_and_plain_cases():
    assert gpu_for_rank(3, 4, 0, {}) is None                  # no GPU visible: the CPU
    assert gpu_for_rank(0, 1, 8, {}) == 0
    assert gpu_for_rank(1, 2, 8, {"SLURM_GPUS_ON_NODE": "8"}) == 1   # sees all 8: no binding


def test_node_gpus_and_binding_evidence():
    assert node_gpus(4, {}) is None
    assert node_gpus(4, {"SLURM_GPUS_ON_NODE": "4", "SLURM_GPUS_PER_TASK": "2"}) == 4   # the step's count wins
    assert node_gpus(4, {"SLURM_GPUS_PER_TASK": "volta:1"}) == 4
    assert node_gpus(2, {"SLURM_GPUS_PER_TASK": "volta:3,kepler:1"}) == 8
    assert bound_per_task(2, 2, {"SLURM_GPUS_ON_NODE": "4"})        # --gpus-per-task=2
    assert not bound_per_task(4, 4, {"SLURM_GPUS_ON_NODE": "4"})    # sees the whole node
    assert not bound_per_task(1, 1, {"SLURM_GPUS_ON_NODE": "1"})


def test_the_doctor_decides_as_the_trainer():
    """The doctor's device is gpu_for_rank's: GPU 0 under per-task binding, where cuda:local_rank
    does not exist ("invalid device ordinal"); a refusal is the trainer's own message, once per host."""
    from hvdtrain.doctor.cli import _cross_checks
    from hvdtrain.doctor.gpus import rank_gpu

    environ, visible = BINDINGS["gpus-per-task=1"]
    assert rank_gpu(3, 4, visible, environ) == (0, None)
    gpu, refusal = rank_gpu(1, 2, 1, {"SLURM_GPUS_ON_NODE": "1"})
    assert gpu is None and refusal.startswith("2 ranks on this node but 1 visible GPU(s)")
    # A framework that sees no GPU (a CPU build): the CPU, and the refusal to come once it sees them.
    assert rank_gpu(1, 2, 0, {"SLURM_GPUS_ON_NODE": "1"}) == (None, refusal)
    assert rank_gpu(3, 4, 0, environ) == (None, None)

    def report(rank, refusal):
        return {"rank": rank, "size": 2, "host": "g1", "local_rank": rank, "local_size": 2, "gpus": 1,
                "sched_gpus": 1, "device": "cpu", "device_refusal": refusal, "threads": 1, "cores": 64, "problems": [],
                "health": {"gflops": 10.0, "h2d_gbps": None, "kernel": "test", "slowdown": 1}}
    problems = _cross_checks([report(0, refusal), report(1, refusal)], 0.25)
    assert problems == [f"g1: {refusal}"]


def test_lightning_is_told_what_each_task_sees():
    """Lightning accepts per-task binding when told hvdtrain's devices: Trainer(devices=<GPUs in
    use of those this process sees>) and DDPStrategy(parallel_devices=<every local rank's>). Built
    on CPU devices (no GPU here), through the same accelerator connector and SLURM checks
    (--ntasks-per-node=2 against 2 parallel devices) as on GPUs; no process group is started."""
    pl = pytest.importorskip("lightning.pytorch")
    import torch
    from lightning.pytorch.strategies import DDPStrategy

    from hvdtrain.torch.backend_lightning import visible_to_lightning

    per_task = [torch.device("cuda", 0)] * 4
    assert visible_to_lightning(per_task) == {"accelerator": "gpu", "devices": 1}
    assert visible_to_lightning([torch.device("cuda", i) for i in range(4)]) == {"accelerator": "gpu", "devices": 4}

    devices = [torch.device("cpu")] * 2
    env = {"SLURM_NTASKS": "2", "SLURM_NTASKS_PER_NODE": "2", "SLURM_NNODES": "1", "SLURM_PROCID": "1",
           "SLURM_LOCALID": "1", "SLURM_NODEID": "0", "SLURM_JOB_NAME": "test", "SLURM_JOB_ID": "1",
           "SLURM_NODELIST": "localhost"}
    with pytest.MonkeyPatch.context() as mp:  # the environment of srun's task 1
        for key, value in env.items():
            mp.setenv(key, value)
        trainer = pl.Trainer(**visible_to_lightning(devices), num_nodes=1,
                             strategy=DDPStrategy(parallel_devices=devices, process_group_backend="gloo"),
                             logger=False, enable_checkpointing=False, enable_progress_bar=False,
                             enable_model_summary=False)
        assert type(trainer.strategy.cluster_environment).__name__ == "SLURMEnvironment"
        assert trainer.strategy.num_processes == 2 and trainer.strategy.local_rank == 1
        assert trainer.strategy.root_device == torch.device("cpu")


def test_mwms_reduces_with_nccl_on_gpus():
    pytest.importorskip("tensorflow")
    import tensorflow as tf

    from hvdtrain.tf.backend_mwms import collective_implementation

    assert collective_implementation(on_gpu=True) == "NCCL"
    assert collective_implementation(on_gpu=False) == "AUTO"   # TF's ring on CPUs, as before
    names = tf.distribute.experimental.CommunicationImplementation
    assert getattr(names, collective_implementation(True)) is names.NCCL


def test_ranks_share_a_gpu_only_when_asked_in_the_test_mode():
    """HVDTRAIN_SHARE_GPU=1: on a machine with one GPU, several ranks take turns on it,
    which is how the multi-rank GPU paths run at all there; without it, the refusal above."""
    from hvdtrain.cluster.env import SHARE_GPU_VARIABLE, shares_gpu

    one_gpu = {**SRUN_TASK, "SLURM_NTASKS": "2", "SLURM_TASKS_PER_NODE": "2", "SLURM_GPUS_ON_NODE": "1",
               "CUDA_VISIBLE_DEVICES": "0"}
    asked = {**one_gpu, SHARE_GPU_VARIABLE: "1"}
    assert [gpu_for_rank(r, 2, 1, asked) for r in range(2)] == [0, 0]
    assert [gpu_for_rank(r, 4, 2, {SHARE_GPU_VARIABLE: "1"}) for r in range(4)] == [0, 1, 0, 1]
    assert shares_gpu(2, 1, asked) and shares_gpu(4, 2, {SHARE_GPU_VARIABLE: "yes"})
    # Not asked, asked with 0, or nothing to share (as many GPUs as ranks, bound per task, the CPU):
    for environ in (one_gpu, {**one_gpu, SHARE_GPU_VARIABLE: "0"}, {**one_gpu, SHARE_GPU_VARIABLE: ""}):
        assert not shares_gpu(2, 1, environ)
        with pytest.raises(UsageError, match="^2 ranks on this node but 1 visible GPU"):
            gpu_for_rank(1, 2, 1, environ)
    assert not shares_gpu(2, 2, {SHARE_GPU_VARIABLE: "1"})
    assert gpu_for_rank(1, 2, 2, {SHARE_GPU_VARIABLE: "1"}) == 1
    bound = {**BINDINGS["gpus-per-task=1"][0], SHARE_GPU_VARIABLE: "1"}
    assert not shares_gpu(4, 1, bound) and gpu_for_rank(2, 4, 1, bound) == 0
    assert not shares_gpu(2, 0, {SHARE_GPU_VARIABLE: "1"}) and gpu_for_rank(1, 2, 0, {SHARE_GPU_VARIABLE: "1"}) is None


def test_shared_gpu_needs_nccl_2_30_and_ddp_falls_back_to_gloo_below():
    from hvdtrain.cluster.env import shared_gpu_nccl_problem
    from hvdtrain.torch.torch_distributed import process_group_backend

    assert shared_gpu_nccl_problem((2, 30, 7)) is None and shared_gpu_nccl_problem((2, 31, 0)) is None
    old = shared_gpu_nccl_problem((2, 28, 9))
    assert old.startswith("HVDTRAIN_SHARE_GPU=1 puts several ranks on one GPU, which needs NCCL >= 2.30")
    assert "loads NCCL 2.28.9" in old and "\n" not in old
    assert "loads NCCL none" in shared_gpu_nccl_problem(None)
    assert process_group_backend(False, False, None) == "gloo"
    assert process_group_backend(True, False, (2, 28, 9)) == "cpu:gloo,cuda:nccl"   # one GPU per rank
    assert process_group_backend(True, True, (2, 30, 7)) == "cpu:gloo,cuda:nccl"    # shared, NCCL allows it
    assert process_group_backend(True, True, (2, 28, 9)) == "gloo"                  # shared, through host memory


def test_shared_gpu_tells_nccl_before_any_communicator(monkeypatch):
    """The torch side of the decision: NCCL_MULTI_RANK_GPU_ENABLE=1 is exported where ranks share
    a GPU (a user's own setting wins), and nowhere else. The GPU count is the only stand-in."""
    from hvdtrain.torch import devices

    monkeypatch.delenv("NCCL_MULTI_RANK_GPU_ENABLE", raising=False)
    monkeypatch.setenv("HVDTRAIN_SHARE_GPU", "1")
    monkeypatch.setattr(devices, "visible_gpus", lambda: 1)
    assert not devices.shared_gpu(1) and "NCCL_MULTI_RANK_GPU_ENABLE" not in os.environ
    assert devices.shared_gpu(2) and os.environ["NCCL_MULTI_RANK_GPU_ENABLE"] == "1"
    monkeypatch.setenv("NCCL_MULTI_RANK_GPU_ENABLE", "0")
    assert devices.shared_gpu(2) and os.environ["NCCL_MULTI_RANK_GPU_ENABLE"] == "0"
    monkeypatch.delenv("HVDTRAIN_SHARE_GPU")
    monkeypatch.delenv("NCCL_MULTI_RANK_GPU_ENABLE")
    with pytest.raises(UsageError):
        devices.rank_device(1, 2)
    assert "NCCL_MULTI_RANK_GPU_ENABLE" not in os.environ
    version = devices.nccl_version()   # torch's NCCL on this CUDA build (none on a CPU-only build)
    assert version is None or (len(version) == 3 and version >= (2, 0, 0))


def test_nccl_version_is_the_loaded_librarys_not_torchs_build(monkeypatch):
    """torch.cuda.nccl.version() is the NCCL torch was compiled against: with a newer libnccl.so.2
    put first (LD_PRELOAD), it still said 2.28.9 on the GPU machine and the shared mode was
    refused. The version comes from the loaded library's ncclGetVersion; torch's only without one."""
    import ctypes

    from hvdtrain.torch import devices

    class Loaded:  # the libnccl.so.2 a process has loaded: ncclGetVersion(int *) -> ncclSuccess
        def ncclGetVersion(self, out):
            ctypes.cast(out, ctypes.POINTER(ctypes.c_int)).contents.value = 23007
            return 0

    opened = []
    monkeypatch.setattr(devices.ctypes, "CDLL", lambda name: opened.append(name) or Loaded())
    monkeypatch.setattr(devices.torch.cuda.nccl, "version", lambda: (2, 28, 9))
    assert devices.nccl_version() == (2, 30, 7) and opened == ["libnccl.so.2"]

    def missing(name):
        raise OSError(f"{name}: cannot open shared object file")
    monkeypatch.setattr(devices.ctypes, "CDLL", missing)
    assert devices.nccl_version() == (2, 28, 9)
