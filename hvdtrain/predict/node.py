"""`python -m hvdtrain.predict --measure`: what the prediction needs, measured on one node through
hvdtrain's own commands, in a couple of minutes. Run it once, not under a launcher: in a Slurm
allocation (a batch script, salloc's shell) every run starts with srun on the allocated node,
elsewhere with mpirun on this one:

1. one rank's step: `python -m hvdtrain.torch <your options> --steps S --result-json one.json`
   (data, forward+backward, optimizer; the gradient bytes), with the threads a rank has among N;
2. the node's allreduce: `<launcher> -n N python -m hvdtrain.doctor --json`: the bus bandwidth
   of its large message, and a ring step's latency from its small one;
3. the same training on N ranks under Horovod and under DDP: what each left of its exchange after
   the backward (the trainer's `sync`), hence the share of the exchange each hid behind it.

The N-rank runs are the model's check on this node (hvdtrain/predict/check.py): predicted from 1
and 2, against 3."""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys

from hvdtrain.errors import UsageError
from hvdtrain.launch import launch_command, launch_env, run_to_end
from hvdtrain.predict import model

RUN_TIMEOUT_S = 600


def launcher_here() -> str:
    """srun inside a Slurm allocation (its runs on the allocated node, where a batch script or
    salloc's shell started it), else mpirun."""
    return "srun" if os.environ.get("SLURM_JOB_ID") and shutil.which("srun") else "mpirun"


def gpus_here(launcher: str) -> int:
    """The node's GPUs: the allocated node's in an allocation (SLURM_GPUS_ON_NODE; salloc's shell
    may be on a login node without any), else those this process sees."""
    if launcher == "srun" and os.environ.get("SLURM_GPUS_ON_NODE", "").isdigit():
        return int(os.environ["SLURM_GPUS_ON_NODE"])
    import torch

    return torch.cuda.device_count()


def refuse_under_launcher() -> None:
    """--measure starts its own runs of 1 and N ranks: started by a launcher itself (even as one
    rank), it would nest launchers. A Slurm batch step is no launcher's rank."""
    from hvdtrain.cluster.env import ClusterEnv

    env = ClusterEnv.from_environ()
    if env.launcher != "single":
        raise UsageError(f"--measure: run it once, not as rank(s) of {env.launcher}: it starts its own runs of one "
                         "and --ranks ranks (with srun inside an allocation, else mpirun)")


def _run(what: str, cmd: list[str], out_file: str, log: str, launcher: str, complains: bool = False) -> None:
    """One measuring run into out_file (a file of an earlier run removed first); its failure is
    one line with the run's own last line. `complains`: exit 1 with its file written is a finding
    (the doctor's NOT READY), not a failure."""
    if os.path.exists(out_file):
        os.remove(out_file)
    print(f"measuring {what}: {' '.join(cmd)}", flush=True)
    rc = run_to_end(cmd, launcher, log, RUN_TIMEOUT_S, launch_env(PYTHONUNBUFFERED="1"))
    if rc == "timeout":
        raise UsageError(f"--measure: {what} did not end within {RUN_TIMEOUT_S} s (its log: {log}); on a node "
                         "without GPUs give fewer --steps, a smaller --image-size or model")
    if rc not in ((0, 1) if complains else (0,)) or not os.path.exists(out_file):
        with open(log) as f:
            lines = [line.strip() for line in f if line.strip()]
        raise UsageError(f"--measure: {what} failed (exit {rc}): {lines[-1] if lines else 'no output'} (its log: {log})")


def measure(train_args: list[str], ranks: int, steps: int, out: str, launcher: str) -> dict:
    """Runs 1-3 above into `out`; their result files' paths."""
    refuse_under_launcher()
    os.makedirs(out, exist_ok=True)
    # One rank's cores as a rank of N has them (on GPUs the GPU computes either way; on CPUs the N
    # ranks share the node's cores, and the one-rank run must not have them all): the allocated
    # node's in an allocation (salloc's shell may be on a login node), else this one's.
    cores = (int(os.environ.get("SLURM_CPUS_ON_NODE", "0") or 0) if launcher == "srun" else 0) \
        or len(os.sched_getaffinity(0))
    per_rank = max(1, cores // ranks)
    if "--threads-per-rank" not in train_args:
        train_args = [*train_args, "--threads-per-rank", str(per_rank)]
    trainer = [sys.executable, "-m", "hvdtrain.torch", *train_args, "--steps", str(steps)]
    files = {"one": os.path.join(out, "one.json"), "doctor": os.path.join(out, f"doctor-{ranks}.json"),
             "horovod": os.path.join(out, f"horovod-{ranks}.json"), "ddp": os.path.join(out, f"ddp-{ranks}.json")}

    def ranks_of(name: str, n: int = ranks) -> list[str]:  # on one node (srun: -N1), named for a cancel
        return (launch_command(launcher, n, tasks_per_node=n, job_name=f"hvdtrain-predict-{os.getpid()}-{name}")
                + ([f"--cpus-per-task={per_rank}"] if launcher == "srun" else []))

    # In an allocation the one rank runs through srun too: under salloc this shell may be on the
    # login node, without the compute node's GPU.
    one = ranks_of("one", 1) if launcher == "srun" else []
    _run("one rank's step", [*one, *trainer, "--result-json", files["one"]], files["one"],
         os.path.join(out, "one.log"), launcher if one else "single")
    _run(f"the node's allreduce ({ranks} ranks)",
         [*ranks_of("doctor"), sys.executable, "-m", "hvdtrain.doctor", "--framework", "torch", "--json",
          files["doctor"]], files["doctor"], os.path.join(out, "doctor.log"), launcher, complains=True)
    for backend in ("horovod", "ddp"):
        _run(f"{ranks} ranks under {backend}",
             [*ranks_of(backend), *trainer, "--backend", backend, "--result-json", files[backend]],
             files[backend], os.path.join(out, f"{backend}.log"), launcher)
    return files


def measured_cluster(profile: model.Cluster, doctor: dict) -> model.Cluster:
    """The profile with the doctor's measured figures (its --json): on one node, the bandwidth and
    latency within a node, and the node as a cluster of its ranks (the check of --measure); over
    several nodes, the network's. Bandwidth: the large message's busbw; a ring step's latency: the
    small message's time less its wire time and half of Horovod's cycle, over the ring's steps
    (2(n-1), 2(nodes-1) of them across nodes). Overlap only where the ranks had GPUs."""
    sizes = sorted(doctor["allreduce"], key=lambda a: a["bytes"])
    small, large = sizes[0], sizes[-1]
    n, hosts = doctor["ranks"], len(doctor["hosts"])
    if n < 2 or len(sizes) < 2:
        raise UsageError(f"the doctor's figures: {n} rank(s) and {len(sizes)} allreduce size(s); 2 or more of each "
                         "are needed to measure an exchange")
    busbw = large["busbw_gbs"]
    wire = 2 * (n - 1) / n * small["bytes"] / (busbw * 1e9)
    left = small["seconds"] - model.horovod_cycle_s(doctor["env"]) / 2 - wire  # the cycle it ran with
    if hosts == 1:
        latency = max(0.0, left / (2 * (n - 1)))
    else:  # the ring's steps within a node at the profile's latency, the rest across nodes
        latency = max(0.0, (left - (2 * (n - 1) - 2 * (hosts - 1)) * profile.intra_latency_s) / (2 * (hosts - 1)))
    source = (f"measured: the doctor's allreduce over {n} ranks on {hosts} node(s), {large['bytes']} bytes at busbw "
              f"{busbw:.2f} GB/s, {small['bytes']} bytes in {small['seconds'] * 1e3:.3f} ms")
    on_gpus = all(d != "cpu" for d in doctor["devices"])
    if hosts == 1:
        return dataclasses.replace(profile, name=f"this node ({n} ranks)", gpus_per_node=n, intra_busbw_gbs=busbw,
                                   intra_latency_s=latency, overlap=on_gpus, sources=(*profile.sources, source))
    return dataclasses.replace(profile, inter_busbw_gbs=busbw, inter_latency_s=latency,
                               overlap=profile.overlap and on_gpus, sources=(*profile.sources, source))


def load_json(path: str) -> dict:
    with open(path) as f:
        return json.load(f)
