"""The one place that builds launcher command lines and their environment, for the comparison,
the benchmarks, the main job and the tests:

    launch_command("mpirun", 2) + [sys.executable, "-m", "hvdtrain.torch", ...]
    python -m hvdtrain.launch mpirun 2      # the same prefix, for shell scripts

mpirun gets `--bind-to none` (the per-rank thread count decides where threads run, as under
srun here) and `--oversubscribe` (more ranks than Open MPI counts slots, e.g. on 2 cores);
srun gets `--mpi=pmix` (Debian's Open MPI joins ranks only through PMIx) and
`--kill-on-bad-exit=1` (a rank that dies takes the step down instead of leaving the others in
a collective). Open MPI refuses to run as root unless told twice: `launch_env` says so only
when this process is root.
"""
from __future__ import annotations

import argparse
import os
import shlex

LAUNCHERS = ("mpirun", "srun", "horovodrun", "torchrun", "single")


def launch_command(launcher: str, np: int, tag_output: bool = False, time_limit_min: int | None = None,
                   tasks_per_node: int | None = None) -> list[str]:
    """The command prefix that starts `np` ranks with `launcher` (empty for "single"). srun gets
    `--ntasks-per-node` when `tasks_per_node` is given: Lightning refuses `-n` without it."""
    if launcher == "mpirun":
        return ["mpirun", "-np", str(np), *(["--tag-output"] if tag_output else []), "--bind-to", "none",
                "--oversubscribe"]
    if launcher == "srun":
        return ["srun", "--mpi=pmix", "-n", str(np),
                *([f"--ntasks-per-node={tasks_per_node}"] if tasks_per_node else []),
                *(["--label"] if tag_output else []), "--kill-on-bad-exit=1",
                *(["-t", str(time_limit_min)] if time_limit_min else [])]
    if launcher == "horovodrun":
        return ["horovodrun", "-np", str(np), "-H", f"localhost:{np}", "--gloo"]
    if launcher == "torchrun":
        # One node, as the IDRIS/JSC course material's torchrun example does; --no-python: the command that follows names
        # its interpreter, as after every other launcher here.
        return ["torchrun", "--standalone", "--nproc-per-node", str(np), "--no-python"]
    if launcher == "single":
        if np != 1:
            raise ValueError("the single launcher runs one process")
        return []
    raise ValueError(f"unknown launcher {launcher!r}; known: {', '.join(LAUNCHERS)}")


def root_variables() -> dict[str, str]:
    """What Open MPI needs to run as root; nothing for anyone else."""
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        return {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    return {}


def launch_env(base: dict | None = None, **extra: str) -> dict:
    """`base` (default: this process's environment) plus root's Open MPI variables and `extra`."""
    env = dict(os.environ if base is None else base)
    env.update(root_variables())
    env.update(extra)
    return env


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m hvdtrain.launch", description="print a launcher prefix")
    p.add_argument("launcher", choices=LAUNCHERS)
    p.add_argument("np", type=int)
    p.add_argument("--tag-output", action="store_true")
    args = p.parse_args(argv)
    print(shlex.join(launch_command(args.launcher, args.np, args.tag_output)))


if __name__ == "__main__":
    main()
