"""Helpers of the Slurm tests: commands with hard timeouts, job records, waits that cancel the
job and fail with its log, and the configuration of the tests' extra clusters, written by the
project's own scripts/slurm-cluster.sh (so every cluster the tests start is configured alike)."""
from __future__ import annotations

import glob
import json
import os
import subprocess
import time

import pytest

from conftest import PYTHON, REPO, base_env, free_port

TEMPLATES = sorted(glob.glob(os.path.join(REPO, "slurm", "*.sbatch")))
CPU_TEMPLATE = os.path.join(REPO, "slurm", "torch-cpu.sbatch")
CPU_STEPS = 3 * 43   # torch-cpu.sbatch: 3 epochs of 1400 digits / 2 ranks / batch 16


def run(cmd: list[str], timeout: float = 60, env: dict | None = None, cwd: str | None = None,
        check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env or base_env(),
                          cwd=cwd or REPO)
    if check and done.returncode != 0:
        pytest.fail(f"{' '.join(cmd)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
    return done


def job_info(job_id: str, env: dict | None = None) -> dict:
    """`scontrol show job -o` as a dict (accounting is off here: no sacct)."""
    out = run(["scontrol", "show", "job", "-o", job_id], env=env, check=False).stdout
    return dict(f.split("=", 1) for f in out.split() if "=" in f)


def tail(path: str, n: int = 6000) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()[-n:]
    except OSError:
        return f"({path} not written)"


def wait_until(what: str, ready, timeout: float, job_id: str, log: str, every: float = 1.0,
               env: dict | None = None):
    """Poll ready() until it returns something true; at the timeout cancel the job and fail."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = ready()
        if value:
            return value
        time.sleep(every)
    run(["scancel", job_id], env=env, check=False)
    pytest.fail(f"job {job_id}: {what} not seen within {timeout:.0f} s; job: {job_info(job_id, env)}\n"
                f"log {log}:\n{tail(log)}")


def wait_for_end(job_id: str, log: str, timeout: float, restarts: int = 0, env: dict | None = None) -> dict:
    """The job's final record, once it ended (after `restarts` requeues)."""
    final = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL")

    first_final = []  # when a final state was first seen

    def ended():
        info = job_info(job_id, env)
        if info.get("JobState") not in final:
            return None
        first_final[:] = first_final or [time.monotonic()]
        # Fewer restarts than expected: give a requeue in flight 6 s, then report it.
        return info if int(info.get("Restarts", 0)) >= restarts or time.monotonic() - first_final[0] > 6 else None
    return wait_until(f"the end (after {restarts} restart(s))", ended, timeout, job_id, log, every=0.5, env=env)


def submit(script: str, cwd: str, *options: str) -> tuple[str, str]:
    """(job id, log path): sbatch from `cwd`, so SLURM_SUBMIT_DIR (and runs/) is there. Every job
    the tests submit may share cores with the others (`--oversubscribe`; the partitions allow it):
    jobs that mostly wait (test_slurm_jobs.py's signal_jobs) then hold up no other."""
    job_id = run(["sbatch", "--parsable", "--oversubscribe", *options, script], cwd=cwd).stdout.strip().split(";")[0]
    assert job_id.isdigit(), job_id
    name = job_info(job_id).get("JobName", "")
    return job_id, os.path.join(cwd, f"{name}-{job_id}.out")


def result_of(cwd: str, job_id: str) -> dict:
    [path] = glob.glob(os.path.join(cwd, "runs", f"*-{job_id}", "result.json"))
    with open(path) as f:
        return json.load(f)


def generator(*argv: str) -> subprocess.CompletedProcess:
    return run([PYTHON, "-m", "hvdtrain.slurm", *argv], check=False, timeout=60)


def write_cluster_config(directory: str, name: str, nodes: str, munge_socket: str, ctld_addr: str = "127.0.0.1",
                         extra: str = "", ctld_port: int | None = None, slurmd_port: int | None = None) -> str:
    """scripts/slurm-cluster.sh's configuration for another cluster on this machine (its daemons
    are started by the caller); returns the path of its slurm.conf."""
    env = base_env()
    env.update(HVDTRAIN_SLURM_DIR=directory, HVDTRAIN_SLURM_CLUSTER_NAME=name, HVDTRAIN_SLURM_NODES=nodes,
               HVDTRAIN_SLURM_EXTRA=extra, HVDTRAIN_SLURMCTLD_ADDR=ctld_addr, HVDTRAIN_MUNGE_SOCKET=munge_socket,
               HVDTRAIN_SLURMCTLD_PORT=str(ctld_port or free_port()),
               HVDTRAIN_SLURMD_PORT=str(slurmd_port or free_port()))
    run(["bash", os.path.join(REPO, "scripts", "slurm-cluster.sh"), "config"], env=env)
    return os.path.join(directory, "slurm.conf")


def stop_daemons(pid_files: list[str]) -> None:
    """SIGTERM to every daemon at once, then up to 10 s in all for them to go (each saves its state)."""
    pids = []
    for pid_file in pid_files:
        try:
            pid = int(open(pid_file).read())
            os.kill(pid, 15)
            pids.append(pid)
        except (OSError, ValueError):
            continue
    deadline = time.monotonic() + 10
    for pid in pids:
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.05)
