"""Import Horovod's framework module (horovod.torch, horovod.tensorflow) or say in one line why it
cannot be used: not installed, or built without that framework's ops (HOROVOD_WITH_PYTORCH /
HOROVOD_WITH_TENSORFLOW was off, or the framework changed since the build)."""
from __future__ import annotations

import faulthandler
import importlib

from hvdtrain.errors import UsageError

# module -> (the framework as users name it, the build flag, the compiled ops library)
FRAMEWORKS = {
    "horovod.torch": ("PyTorch", "HOROVOD_WITH_PYTORCH", "horovod/torch/mpi_lib_v2"),
    "horovod.tensorflow": ("TensorFlow", "HOROVOD_WITH_TENSORFLOW", "horovod/tensorflow/mpi_lib"),
}


def import_horovod(module: str):
    framework, flag, lib = FRAMEWORKS[module]
    rebuild = f"rebuild with {flag}=1: bash scripts/setup.sh"
    try:
        hvd = importlib.import_module(module)
    except ImportError as err:
        if "has not been built" in str(err) or "mpi_lib" in str(err):
            raise UsageError(f"Horovod is installed without its {framework} ops ({rebuild}); import said: "
                             f"{str(err).splitlines()[0]}") from None
        raise UsageError(f"Horovod is not importable ({err}); run bash scripts/setup.sh") from None
    if not getattr(hvd, "_MPI_LIB_AVAILABLE", True):
        # The module imports without its compiled ops (Horovod only prints a warning) and then
        # lacks init(): say what is wrong instead of an AttributeError.
        raise UsageError(f"Horovod is installed without its {framework} ops ({lib} is missing; {rebuild})")
    return hvd


def gpu_ops_problem(gpus_seen: int, cuda_built: bool, nccl_built: bool, horovod_version: str = "") -> str | None:
    """One line when this node's GPUs would meet a Horovod that cannot reduce GPU tensors: a build
    made where no CUDA toolkit was loaded (a login node), now run on a GPU node. None otherwise."""
    if not gpus_seen or nccl_built:
        return None
    what = "with CUDA but without NCCL" if cuda_built else "without CUDA and NCCL ops (a CPU build)"
    horovod = f"Horovod {horovod_version}".strip()
    return (f"{gpus_seen} GPU(s) here, but {horovod} is built {what}: torch's CUDA tensors cannot be reduced "
            "with it; rebuild it for the GPU nodes where the CUDA module is loaded: bash scripts/setup.sh --gpu "
            "(python -m hvdtrain.doctor checks)")


def check_launcher_agrees(size: int, who: str = "Horovod", env=None) -> None:
    """The launcher started N ranks, but `who` (Horovod, or MPI.COMM_WORLD before a rendezvous
    over it) sees a world of another size: ranks that would train alone, each on its own, and
    exit 0, or wait on a broadcast that never comes (torchrun, or srun without PMIx, where each
    rank is an MPI singleton)."""
    from hvdtrain.cluster.env import ClusterEnv

    env = ClusterEnv.from_environ() if env is None else env
    if env.launcher != "single" and env.world_size != size:
        hint = (" (torchrun starts no MPI job: run --backend ddp under torchrun, Horovod under mpirun, srun "
                "--mpi=pmix or horovodrun)" if env.launcher == "torchrun"
                else " (under srun, use --mpi=pmix with an Open MPI built for it; python -m hvdtrain.doctor checks)")
        raise UsageError(f"{env.launcher} started {env.world_size} ranks, but {who} sees {size}: the ranks "
                         f"are not one job{hint}")


def start_horovod(hvd, cfg, on_cpu: bool) -> dict[str, str]:
    """hvd.init() with hvdtrain's settings exported first (a user's own export wins): the
    tuning of hvdtrain/cluster/tuning.py and the stall shutdown behind the watchdog. Checks that the
    launcher's ranks are one Horovod job; returns the settings in force."""
    from hvdtrain.cluster import tuning
    from hvdtrain.watchdog import horovod_stall_settings

    # MPI yields only where the rank computes on the CPU (hvdtrain/cluster/tuning.py).
    settings = tuning.horovod_settings(cfg.horovod_tuning, on_cpu, cycle_time_ms=cfg.cycle_time_ms,
                                       mpi_yield=cfg.mpi_yield)
    applied = tuning.apply({**settings, **horovod_stall_settings(cfg.watchdog_seconds)})
    hvd.init()  # Horovod: start the background thread and the MPI/Gloo controller.
    # A rank that crashes (SIGSEGV, SIGBUS...) says where in Python, every thread: enabled after
    # MPI_Init, which installs Open MPI's own handlers (a native backtrace, often a single libc
    # frame), so that Python's runs first and then hands the signal on to Open MPI's.
    if not faulthandler.is_enabled():
        faulthandler.enable(all_threads=True)
    check_launcher_agrees(hvd.size())
    return applied
