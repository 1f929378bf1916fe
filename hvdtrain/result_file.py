"""Result files and the environment fingerprint written into them.

A result file is JSON: the config, world size, per-rank and total throughput, final metrics,
per-rank checksums of the final weights, library versions and Horovod's build flags.
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import platform
import socket
import statistics
import sys

from hvdtrain.checkpoint import atomic_write

_LIBRARIES = ("torch", "torchvision", "tensorflow-cpu", "tensorflow", "tf-keras", "horovod",
              "mpi4py", "numpy", "accelerate", "lightning")


def library_versions() -> dict:
    versions = {"python": platform.python_version()}
    for name in _LIBRARIES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    return versions


def horovod_build_flags(hvd) -> dict:
    """Horovod's own answers on how it was built (works for horovod.torch and .tensorflow)."""
    flags = {}
    for name in ("mpi_built", "gloo_built", "nccl_built", "ddl_built", "ccl_built", "cuda_built",
                 "rocm_built", "mpi_enabled", "gloo_enabled", "mpi_threads_supported"):
        fn = getattr(hvd, name, None)
        if fn is not None:
            try:
                flags[name] = bool(fn())
            except (ValueError, RuntimeError):  # *_enabled needs init
                flags[name] = None
    return flags


def environment_fingerprint() -> dict:
    keys = [k for k in os.environ if k.startswith(("HOROVOD_", "OMPI_MCA_", "OMP_NUM_THREADS",
                                                   "SLURM_JOB_ID", "SLURM_NTASKS", "SLURM_CPUS_PER_TASK"))]
    return {"host": socket.gethostname(), "cpu_count": os.cpu_count(), "argv": sys.argv,
            "env": {k: os.environ[k] for k in sorted(keys)}}


def checksum_arrays(arrays) -> str:
    """sha256 over the bytes of the given numpy arrays, in order: equal weights, equal checksum."""
    h = hashlib.sha256()
    for a in arrays:
        h.update(a.tobytes())
    return h.hexdigest()


def sample_unit(sample_shape) -> str:
    """What a rate counts: 'img' where one sample has three dimensions (channels and two sides, in
    either order), else 'samples' (vectors, sequences): a user's own regression is not images."""
    return "img" if len(tuple(sample_shape)) == 3 else "samples"


def throughput_summary(per_rank_images_per_sec: list[float], unit: str = "img") -> dict:
    """The rates of every rank (samples per second; their key names say images, as result files
    have since format 1: `unit` says what they count)."""
    return {"unit": unit, "per_rank_images_per_sec": per_rank_images_per_sec,
            "total_images_per_sec": sum(per_rank_images_per_sec),
            "min_rank_images_per_sec": min(per_rank_images_per_sec),
            "median_rank_images_per_sec": statistics.median(per_rank_images_per_sec)}


def write_json(path: str, payload: dict) -> None:
    data = json.dumps(payload, indent=2, sort_keys=True, default=str).encode()
    atomic_write(path, lambda f: f.write(data))
