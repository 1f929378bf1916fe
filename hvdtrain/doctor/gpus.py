"""The doctor's GPU arithmetic: GPUs the scheduler gave a node, each rank's GPU, the problems of a node's
GPUs against its ranks, and the srun hint for an MPI library."""
from __future__ import annotations

import os

from hvdtrain.cluster.env import gpu_for_rank
from hvdtrain.errors import UsageError


def scheduler_gpus(environ=None) -> int | None:
    """GPUs the scheduler gave this node, from the environment: SLURM_GPUS_ON_NODE, else
    CUDA_VISIBLE_DEVICES when it lists devices; None when nothing says."""
    e = os.environ if environ is None else environ
    if e.get("SLURM_GPUS_ON_NODE", "").isdigit():
        return int(e["SLURM_GPUS_ON_NODE"])
    visible = e.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        devices = [d for d in visible.split(",") if d.strip() and d.strip() != "NoDevFiles"]
        return len(devices) if not any(d.strip().startswith("-") for d in devices) else 0
    return None


def gpu_problems(host: str, framework_gpus: int, sched_gpus: int | None, refusals=()) -> list[str]:
    """What is wrong with the GPUs of one host: GPUs the framework does not see, and the ranks'
    refusals of their device (`rank_gpu`: the trainer's decision, which refuses ranks sharing a
    GPU), each said once for the host."""
    problems = []
    if sched_gpus and framework_gpus == 0:
        problems.append(f"{host}: the job was given {sched_gpus} GPU(s) but the framework sees none "
                        "(a CPU build of torch/TF, or no driver on this node)")
    problems += [f"{host}: {refusal}" for refusal in sorted(set(filter(None, refusals)))]
    return problems


def rank_gpu(local_rank: int, local_size: int, visible: int, environ=None) -> tuple[int | None, str | None]:
    """(the GPU index this rank trains on, None for the CPU; None, or why it would refuse to
    train): hvdtrain.cluster.env.gpu_for_rank, which the trainers call, so that the doctor checks
    the device the trainer will use (under per-task binding each task's own GPU 0, not
    cuda:local_rank, which does not exist there) and names the refusal the trainer would make.
    Where the framework sees no GPU but the scheduler gave some (reported apart, by
    gpu_problems), the refusal is the one the trainer would make once it sees them."""
    try:
        gpu = gpu_for_rank(local_rank, local_size, visible, environ)
        if visible == 0 and scheduler_gpus(environ):
            gpu_for_rank(local_rank, local_size, scheduler_gpus(environ), environ)
        return gpu, None
    except UsageError as err:
        return None, str(err)


def srun_mpi_hint(mpi_library: str) -> str | None:
    """What `srun` needs for this MPI to join its tasks into one job (Slurm's --mpi plugin), or
    None when the library is not one whose need is known. Open MPI 5 (PyPI's wheel among them)
    has no PMI-2 support left: PMIx only."""
    if mpi_library.startswith("Open MPI v5"):
        return "Open MPI 5 under srun needs --mpi=pmix (srun --mpi=list shows what this Slurm has)"
    if mpi_library.startswith("Open MPI"):
        return "Open MPI under srun needs --mpi=pmix (or pmi2 where it was built with it)"
    if mpi_library.startswith(("MPICH", "Intel")):
        return "MPICH under srun needs --mpi=pmi2 (or pmix where it was built with it)"
    return None


def _visible_gpus(fw: str) -> int:
    """The GPUs this process sees through framework `fw`, counted as its trainer counts them
    (hvdtrain/torch/devices.py, hvdtrain/tf/devices.py); its Horovod module is imported already."""
    if fw == "torch":
        from hvdtrain.torch.devices import visible_gpus
        return visible_gpus()
    import tensorflow as tf
    return len(tf.config.list_physical_devices("GPU"))
