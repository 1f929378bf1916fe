"""Horovod and Open MPI settings chosen from the resources a rank really has.

Why: Horovod's background thread runs a coordination collective every cycle (1 ms by default),
and Open MPI busy-polls while it waits. On a rank that computes on the CPU that polling takes a
core from the compute threads: on 2 cores, ResNet-18 at 2 ranks ran at ~12 img/s in total
instead of ~19 (see docs/horovod-overhead.md). Letting MPI yield the core when idle gives it
back. A GPU rank is the other way round: its compute runs on the GPU, and an MPI wait that
yields its core only wakes up later, which adds latency to every allreduce it waits on; so
GPU ranks keep Open MPI's busy polling, however few cores they have.

Only public knobs are set (environment variables read at `hvd.init()`/`MPI_Init`), and a value
the user already exported always wins. `python -m hvdtrain.cluster.tuning --cpu` shows what would be set.
"""
from __future__ import annotations

import argparse
import os


def horovod_settings(mode: str, on_cpu: bool, cycle_time_ms: float | None = None,
                     mpi_yield: str = "auto") -> dict[str, str]:
    """Environment variables to set before hvd.init(). mode: auto | off. mpi_yield auto: yield on
    ranks that compute on the CPU, never on GPU ranks, whatever their cores."""
    if mode == "off":
        return {}
    settings = {}
    if mpi_yield == "on" or (mpi_yield == "auto" and on_cpu):
        settings["OMPI_MCA_mpi_yield_when_idle"] = "1"
    if cycle_time_ms is not None:
        # Not changed by default: a longer cycle saves little once MPI yields, and every
        # allreduce waits for the next cycle. Measured on digits (steps of a few ms), 5 ms
        # instead of 1 cut Horovod-TF from ~5700 to ~860 img/s at 2 ranks.
        settings["HOROVOD_CYCLE_TIME"] = f"{cycle_time_ms:g}"
    return settings


def apply(settings: dict[str, str]) -> dict[str, str]:
    """Export the settings the user has not set; return what is in force for those names."""
    for key, value in settings.items():
        os.environ.setdefault(key, value)
    return {key: os.environ[key] for key in settings}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m hvdtrain.cluster.tuning")
    p.add_argument("--cpu", action="store_true", help="ranks compute on the CPU (default: on GPUs)")
    p.add_argument("--mode", default="auto", choices=("auto", "off"))
    args = p.parse_args(argv)
    for key, value in horovod_settings(args.mode, args.cpu).items():
        print(f"export {key}={value}")


if __name__ == "__main__":
    main()
