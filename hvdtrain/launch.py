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
import signal
import subprocess

LAUNCHERS = ("mpirun", "srun", "horovodrun", "torchrun", "single")


def launch_command(launcher: str, np: int, tag_output: bool = False, time_limit_min: int | None = None,
                   tasks_per_node: int | None = None, job_name: str | None = None) -> list[str]:
    """The command prefix that starts `np` ranks with `launcher` (empty for "single"). srun gets
    `--ntasks-per-node` when `tasks_per_node` is given (Lightning refuses `-n` without it; the
    ranks on as few nodes as that makes) and `--job-name` when `job_name` is, by which
    run_to_end finds its step to cancel."""
    if launcher == "mpirun":
        return ["mpirun", "-np", str(np), *(["--tag-output"] if tag_output else []), "--bind-to", "none",
                "--oversubscribe"]
    if launcher == "srun":
        return ["srun", *([f"--job-name={job_name}"] if job_name else []), "--mpi=pmix", "-n", str(np),
                *([f"-N{-(-np // tasks_per_node)}", f"--ntasks-per-node={tasks_per_node}"] if tasks_per_node else []),
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


def run_to_end(cmd: list[str], launcher: str, log_path: str, timeout: float, env: dict) -> int | str:
    """Run a launch with its output in log_path: its exit status, or "timeout" once it ran past
    `timeout` seconds. Then, or when this process is interrupted (Ctrl-C, SIGTERM), the whole
    launch ends, its ranks too: ranks left behind would skew every later measurement."""
    name = next((a.split("=", 1)[1] for a in cmd if a.startswith("--job-name=")), "")
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            end_launch(proc, launcher, name)
            return "timeout"
        except BaseException:
            end_launch(proc, launcher, name)
            raise


def end_launch(proc: subprocess.Popen, launcher: str, step_name: str, grace: float = 10.0) -> None:
    """End a launch and everything it started: SIGTERM to its process group (mpirun and srun
    forward it to the ranks, which stop at their next step), SIGKILL after `grace` seconds;
    under srun the step itself is then cancelled, as a killed srun cannot end it."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 30.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=wait)
            break
        except subprocess.TimeoutExpired:
            continue
    if launcher == "srun":
        cancel_slurm_step(step_name)


def cancel_slurm_step(name: str) -> None:
    """scancel of what srun started under `name` and left: a step of this allocation (the
    comparison inside sbatch), or the job srun made for itself (outside one)."""
    user = ["--user", str(os.getuid())]
    try:
        listed = subprocess.run(["squeue", "--steps", "--noheader", *user, "--format=%i %j"], capture_output=True,
                                text=True, timeout=30).stdout
        steps = [line.split()[0] for line in listed.splitlines() if line.split()[1:] == [name]]
        if steps:
            subprocess.run(["scancel", "--signal=KILL", *steps], capture_output=True, timeout=30)
        subprocess.run(["scancel", *user, f"--name={name}"], capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        pass  # Slurm's own clean-up ends a step whose srun is gone, at the latest with the job


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m hvdtrain.launch", description="print a launcher prefix")
    p.add_argument("launcher", choices=LAUNCHERS)
    p.add_argument("np", type=int)
    p.add_argument("--tag-output", action="store_true")
    args = p.parse_args(argv)
    print(shlex.join(launch_command(args.launcher, args.np, args.tag_output)))


if __name__ == "__main__":
    main()
