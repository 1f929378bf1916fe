"""Check that this machine (or allocation) can run hvdtrain, in seconds: the first thing to run on
a new cluster, alone or under the launcher the jobs will use.

    python -m hvdtrain.doctor
    srun -n 2 python -m hvdtrain.doctor            # inside an allocation (--mpi=pmix if needed)
    mpirun -np 2 python -m hvdtrain.doctor
    horovodrun -np 2 -H localhost:2 python -m hvdtrain.doctor

It reports the versions (Python, torch, TensorFlow, Horovod, MPI), Horovod's build flags and
which framework ops really load, the launcher and whether every rank agrees with Horovod on its
rank, size and local rank, GPUs per node against ranks per node, cores and threads per rank, the
Horovod/MPI settings hvdtrain would apply, a correctness check of allreduce, broadcast and
allgather on every rank, and the allreduce bandwidth for a small and a large message
(nccl-tests' algbw and busbw). The last line is the verdict; the exit code is 0 when ready and
1 with the reasons otherwise. A stage that does not finish within --timeout ends the process
with a line naming the rank and the stage, so the doctor itself never hangs a job.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.metadata as md
import os
import platform
import socket
import sys
import threading
import time

from hvdtrain.cluster import ClusterEnv
from hvdtrain.horovod_ops import gpu_ops_problem
from hvdtrain.runtime import threads_per_rank
from hvdtrain import checkpoint, netsockets, tuning
from hvdtrain.report import say

PROG = "hvdtrain.doctor"
# Variables mpirun sets for its own bookkeeping: not settings anyone chose.
LAUNCHER_INTERNAL = tuple(f"OMPI_MCA_{p}" for p in (
    "orte_", "ess", "pmix", "initial_wdir", "shmem_", "hwloc_base_binding", "rmaps_", "mpi_oversubscribe"))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"python -m {PROG}", description=__doc__.split("\n\n")[0])
    p.add_argument("--framework", choices=("auto", "torch", "tf"), default="auto",
                   help="whose Horovod ops run the checks (auto: torch if its ops load, else tf)")
    p.add_argument("--small-kib", type=int, default=64, help="small allreduce message (KiB)")
    p.add_argument("--large-mib", type=int, default=None,
                   help="large allreduce message (MiB; default 256 on GPUs, 16 on CPUs)")
    p.add_argument("--iters", type=int, default=5, help="timed allreduces per message size")
    p.add_argument("--timeout", type=float, default=120.0,
                   help="seconds any one stage may take before the doctor ends this rank (0: never)")
    return p


class Stage:
    """Names what the rank is doing now; a watchdog ends the process if a stage outlives the
    timeout (a collective whose peer never comes), with one line instead of a silent hang."""

    def __init__(self, timeout: float, label):
        self.name, self.started, self.timeout, self.label = "start", time.monotonic(), timeout, label
        if timeout > 0:
            threading.Thread(target=self._watch, daemon=True).start()

    def __call__(self, name: str) -> None:
        self.name, self.started = name, time.monotonic()

    def _watch(self):
        while True:
            time.sleep(0.5)
            waited = time.monotonic() - self.started
            if waited > self.timeout:
                say(f"{PROG}: [{self.label()}] NOT READY: stuck in '{self.name}' for {waited:.0f} s "
                      "(a rank that never joined, or a network the ranks cannot use)", sys.stderr)
                os._exit(1)


def _version(dist: str) -> str | None:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def _imports(module: str):
    try:
        return importlib.import_module(module), None
    except Exception as err:  # noqa: BLE001 - the reason is the report
        return None, f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"


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


def gpu_problems(host: str, ranks_on_host: int, framework_gpus: int, sched_gpus: int | None) -> list[str]:
    """What is wrong with the GPUs of one host for this many ranks (hvdtrain runs one rank per GPU)."""
    problems = []
    if sched_gpus and framework_gpus == 0:
        problems.append(f"{host}: the job was given {sched_gpus} GPU(s) but the framework sees none "
                        "(a CPU build of torch/TF, or no driver on this node)")
    gpus = max(framework_gpus, sched_gpus or 0)
    if gpus and ranks_on_host > gpus:
        problems.append(f"{host}: {ranks_on_host} ranks but {gpus} GPU(s): ranks would share GPUs "
                        "(hvdtrain runs one rank per GPU: --ntasks-per-node = --gres=gpu:N)")
    return problems


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


def bus_bandwidth(nbytes: int, seconds: float, world_size: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s for an allreduce, as nccl-tests define them: busbw = algbw x 2(n-1)/n,
    the traffic each link carries, comparable across rank counts."""
    algbw = nbytes / seconds / 1e9 if seconds > 0 else float("inf")
    return algbw, algbw * (2 * (world_size - 1) / world_size if world_size > 1 else 1.0)


class TorchOps:
    def __init__(self, hvd, use_gpu: bool):
        import torch
        self.torch, self.hvd = torch, hvd
        self.device = torch.device("cuda", hvd.local_rank()) if use_gpu else torch.device("cpu")
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)

    def gpus(self) -> int:
        return self.torch.cuda.device_count() if self.torch.cuda.is_available() else 0

    def allreduce_check(self, size: int) -> bool:
        t = self.torch.full((1000,), float(self.hvd.rank() + 1), device=self.device)
        total = self.hvd.allreduce(t, op=self.hvd.Sum, name="doctor.sum")
        avg = self.hvd.allreduce(t, name="doctor.avg")
        return bool((total == size * (size + 1) / 2).all()) and bool((avg == (size + 1) / 2).all())

    def broadcast_check(self) -> bool:
        t = self.torch.arange(1000, dtype=self.torch.float32, device=self.device) * (self.hvd.rank() + 1)
        got = self.hvd.broadcast(t, root_rank=0, name="doctor.bcast")
        return bool((got == self.torch.arange(1000, dtype=self.torch.float32, device=self.device)).all())

    def allgather_object(self, obj):
        return self.hvd.allgather_object(obj, name="doctor.gather")

    def time_allreduce(self, nbytes: int, iters: int) -> float:
        t = self.torch.ones(max(1, nbytes // 4), dtype=self.torch.float32, device=self.device)
        for i in range(2):
            self.hvd.allreduce(t, name=f"doctor.warm.{nbytes}")
        self._sync()
        start = time.perf_counter()
        for i in range(iters):
            self.hvd.allreduce(t, name=f"doctor.bw.{nbytes}")
        self._sync()
        return (time.perf_counter() - start) / iters

    def _sync(self):
        if self.device.type == "cuda":
            self.torch.cuda.synchronize()


class TFOps:
    def __init__(self, hvd):
        import tensorflow as tf
        self.tf, self.hvd = tf, hvd

    def gpus(self) -> int:
        return len(self.tf.config.list_physical_devices("GPU"))

    def allreduce_check(self, size: int) -> bool:
        t = self.tf.fill([1000], float(self.hvd.rank() + 1))
        total = self.hvd.allreduce(t, op=self.hvd.Sum, name="doctor.sum")
        avg = self.hvd.allreduce(t, name="doctor.avg")
        return bool(self.tf.reduce_all(total == size * (size + 1) / 2)) and bool(self.tf.reduce_all(avg == (size + 1) / 2))

    def broadcast_check(self) -> bool:
        base = self.tf.range(1000, dtype=self.tf.float32)
        got = self.hvd.broadcast(base * float(self.hvd.rank() + 1), root_rank=0, name="doctor.bcast")
        return bool(self.tf.reduce_all(got == base))

    def allgather_object(self, obj):
        return self.hvd.allgather_object(obj, name="doctor.gather")

    def time_allreduce(self, nbytes: int, iters: int) -> float:
        t = self.tf.ones([max(1, nbytes // 4)], dtype=self.tf.float32)
        for _ in range(2):
            self.hvd.allreduce(t, name=f"doctor.warm.{nbytes}").numpy()
        start = time.perf_counter()
        for _ in range(iters):
            self.hvd.allreduce(t, name=f"doctor.bw.{nbytes}").numpy()
        return (time.perf_counter() - start) / iters


def _mpi_library() -> str:
    try:
        from mpi4py import MPI  # after hvd.init: MPI is initialised already, mpi4py only attaches

        # The C string comes with its terminating NUL (Open MPI 4).
        return " ".join(MPI.Get_library_version().replace("\0", "").split("\n")[0].split())
    except Exception as err:  # noqa: BLE001
        return f"unknown ({type(err).__name__})"


def _fmt_bytes(n: int) -> str:
    return f"{n // 2**20} MiB" if n >= 2**20 else f"{n // 2**10} KiB"


def run(args) -> int:
    env = ClusterEnv.from_environ()
    label = lambda: f"rank {env.rank}/{env.world_size}"  # noqa: E731 - the launcher's view until Horovod's
    stage = Stage(args.timeout, label)
    problems: list[str] = []      # this rank's; gathered to rank 0

    stage("imports")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    versions = {"python": platform.python_version()}
    for dist in ("torch", "torchvision", "tensorflow", "tf-keras", "horovod", "mpi4py", "numpy"):
        versions[dist] = _version(dist)
    if versions["tensorflow"] is None:
        versions["tensorflow"] = _version("tensorflow-cpu")
    have = {"torch": versions["torch"] is not None, "tf": versions["tensorflow"] is not None}
    if versions["horovod"] is None:
        say(f"{PROG}: [{label()}] NOT READY: Horovod is not installed in this Python ({sys.executable}): "
              "run scripts/setup.sh, or load the site's Horovod module")
        return 1

    # Which framework ops load: hvdtrain.torch needs horovod.torch, hvdtrain.tf horovod.tensorflow.
    ops, errors = {}, {}
    wanted = [fw for fw in ("torch", "tf") if have[fw] and args.framework in ("auto", fw)]
    if args.framework != "auto" and not have[args.framework]:
        problems.append(f"--framework {args.framework}: {args.framework} is not installed")
    for fw in wanted:
        stage(f"import horovod ops for {fw}")
        mod, err = _imports("horovod.torch" if fw == "torch" else "horovod.tensorflow")
        if mod is not None and not hasattr(mod, "init"):
            # horovod.torch imports without its compiled ops (it only warns) and then lacks init().
            mod, err = None, "its compiled extension is missing"
        if mod is not None:
            ops[fw] = mod
        else:
            errors[fw] = err
            name = "PyTorch" if fw == "torch" else "TensorFlow"
            flag = "HOROVOD_WITH_PYTORCH" if fw == "torch" else "HOROVOD_WITH_TENSORFLOW"
            problems.append(f"Horovod {versions['horovod']} is installed without its {name} ops ({err}): "
                            f"hvdtrain.{fw} cannot run; rebuild it with {flag}=1 (scripts/setup.sh does)")
    if not ops:
        say(f"{PROG}: [{label()}] NOT READY: " + "; ".join(problems or ["no framework installed (torch or tensorflow)"]))
        return 1
    fw = "torch" if "torch" in ops else "tf"
    hvd = ops[fw]

    on_cpu_guess = scheduler_gpus() in (None, 0)
    cores = len(os.sched_getaffinity(0))
    threads = threads_per_rank(None, env.local_world_size)
    settings = tuning.horovod_settings("auto", on_cpu_guess, threads)
    already = {k: os.environ[k] for k in settings if k in os.environ}
    applied = tuning.apply(settings)
    loopback = netsockets.loopback_settings(env)  # all ranks on this host: loopback only
    already.update({k: os.environ[k] for k in loopback if k in os.environ})
    applied.update(tuning.apply(loopback))

    stage(f"hvd.init ({fw})")
    hvd.init()
    rank, size, local_rank, local_size = hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size()
    label = lambda: f"rank {rank}/{size}"  # noqa: E731
    stage.label = label
    gpu_problem = None
    if fw == "torch":
        import torch

        seen = torch.cuda.device_count() if torch.cuda.is_available() else 0
        gpu_problem = gpu_ops_problem(seen, hvd.cuda_built(), hvd.nccl_built(), versions["horovod"])
        if gpu_problem:
            # Checks on host tensors, so that the rest of the report still comes (a CUDA tensor
            # handed to this Horovod would end the rank with a traceback).
            problems.append(gpu_problem)
    backend = TorchOps(hvd, use_gpu=fw == "torch" and seen > 0 and not gpu_problem) if fw == "torch" else TFOps(hvd)
    controller = "MPI" if hvd.mpi_enabled() else "Gloo" if hvd.gloo_enabled() else "?"
    built = {"MPI": hvd.mpi_built(), "Gloo": hvd.gloo_built(), "NCCL": hvd.nccl_built(),
             "CUDA": hvd.cuda_built()}
    mpi_lib = _mpi_library() if hvd.mpi_built() else "not built with MPI"

    # The launcher's view against Horovod's, on this rank.
    mismatch = [f"{what} {mine} (launcher) vs {hvds} (Horovod)" for what, mine, hvds in (
        ("size", env.world_size, size), ("rank", env.rank, rank), ("local rank", env.local_rank, local_rank),
        ("local size", env.local_world_size, local_size)) if mine != hvds]
    if env.launcher != "single" and mismatch:
        problems.append(f"the launcher ({env.launcher}) and Horovod disagree: {', '.join(mismatch)} -- MPI did not "
                        "join the ranks into one job (under srun try --mpi=pmix; do not nest mpirun in srun)")

    host = socket.gethostname()
    gpus = backend.gpus()
    sched = scheduler_gpus()

    stage("correctness: allreduce, broadcast")
    reduce_ok = backend.allreduce_check(size)
    bcast_ok = backend.broadcast_check()
    if not reduce_ok:
        problems.append("allreduce gave wrong sums")
    if not bcast_ok:
        problems.append("broadcast from rank 0 gave other values")

    stage("bandwidth")
    large = (args.large_mib if args.large_mib else (256 if gpus else 16)) * 2**20
    bandwidth = []
    for nbytes in (args.small_kib * 2**10, large):
        bandwidth.append((nbytes, backend.time_allreduce(nbytes, args.iters)))

    stage("gather the ranks' reports")
    mine = {"rank": rank, "size": size, "local_rank": local_rank, "local_size": local_size, "host": host,
            "launcher": env.launcher, "launcher_view": (env.rank, env.world_size, env.local_rank),
            "gpus": gpus, "sched_gpus": sched, "cores": cores, "threads": threads, "reduce_ok": reduce_ok,
            "bcast_ok": bcast_ok, "bandwidth": bandwidth, "problems": problems, "versions": versions,
            "listening": netsockets.listening(),
            "env": {k: os.environ[k] for k in sorted(os.environ) if k.startswith(("HOROVOD_", "OMPI_MCA_", "NCCL_"))
                    and not k.startswith(LAUNCHER_INTERNAL)}}
    reports = backend.allgather_object(mine)

    if rank == 0:
        all_problems = _cross_checks(reports)
        _print_report(reports, versions, built, controller, ops, errors, mpi_lib, applied, already, fw, all_problems)
        stage("done")
        verdict = 0 if not all_problems else 1
    else:
        verdict = 0 if not any(r["problems"] for r in reports) and not _cross_checks(reports) else 1
    stage("shutdown")
    hvd.shutdown()
    return verdict


def _cross_checks(reports: list[dict]) -> list[str]:
    """Problems seen from all ranks together, each naming its rank or host."""
    problems = [f"rank {r['rank']}: {p}" for r in reports for p in r["problems"]]
    size = reports[0]["size"]
    ranks = sorted(r["rank"] for r in reports)
    if ranks != list(range(size)):
        problems.append(f"ranks {ranks} are not 0..{size - 1}")
    by_host: dict[str, list[dict]] = {}
    for r in reports:
        by_host.setdefault(r["host"], []).append(r)
    for host, rs in sorted(by_host.items()):
        local = sorted(r["local_rank"] for r in rs)
        if local != list(range(len(rs))) or any(r["local_size"] != len(rs) for r in rs):
            problems.append(f"{host}: local ranks {local} and local sizes {sorted({r['local_size'] for r in rs})} "
                            f"do not match its {len(rs)} ranks")
        problems += gpu_problems(host, len(rs), max(r["gpus"] for r in rs),
                                 max((r["sched_gpus"] for r in rs if r["sched_gpus"] is not None), default=None))
        busy = sum(r["threads"] for r in rs)
        cores = max(r["cores"] for r in rs)
        if busy > (os.cpu_count() or cores) and all(r["cores"] >= cores for r in rs):
            problems.append(f"{host}: {len(rs)} ranks x threads = {busy} compute threads for {os.cpu_count()} cores")
    return problems


def _print_report(reports, versions, built, controller, ops, errors, mpi_lib, applied, already, fw, problems):
    size = reports[0]["size"]
    hosts = sorted({r["host"] for r in reports})
    out = lambda head, text="": say(f"{head:<11}{text}")  # noqa: E731
    say(f"hvdtrain doctor: {size} rank(s) via {reports[0]['launcher']} on {len(hosts)} host(s)")
    v = versions
    out("versions", f"Python {v['python']} | torch {v['torch'] or '-'} | torchvision {v['torchvision'] or '-'} | "
                    f"TensorFlow {v['tensorflow'] or '-'} | tf-keras {v['tf-keras'] or '-'} | "
                    f"Horovod {v['horovod']} | mpi4py {v['mpi4py'] or '-'}")
    out("", f"MPI: {mpi_lib}")
    hint = srun_mpi_hint(mpi_lib)
    if hint and reports[0]["launcher"] == "slurm":
        out("", hint)
    if v["torch"] and not checkpoint.torch_is_safe(v["torch"]):
        out("notice", f"torch {v['torch']} < 2.6 can run code from a crafted checkpoint even with weights_only=True "
                      "(CVE-2025-32434): hvdtrain.torch resumes only checkpoints it signed for this user "
                      "(--trust-checkpoints overrides); upgrade torch where the site allows")
    out("horovod", "built: " + ", ".join(f"{k} {'yes' if b else 'no'}" for k, b in built.items())
        + f" | controller in use: {controller} | checks run with {fw}'s ops")
    op_state = [f"{'torch' if f == 'torch' else 'tensorflow'}: {'ok' if f in ops else 'MISSING (' + errors[f] + ')'}"
                for f in ("torch", "tf") if f in ops or f in errors]
    out("", "framework ops: " + "; ".join(op_state))
    agree = all(r["launcher_view"] == (r["rank"], r["size"], r["local_rank"]) for r in reports)
    out("launcher", f"{reports[0]['launcher']}: rank/size/local rank "
                    f"{'agree with Horovod on every rank' if agree else 'DISAGREE with Horovod (see below)'}")
    for r in sorted(reports, key=lambda r: r["rank"]):
        out("placement" if r["rank"] == 0 else "",
            f"rank {r['rank']}: {r['host']} local {r['local_rank']}/{r['local_size']}, "
            f"{r['gpus']} GPU(s) seen (scheduler: {r['sched_gpus'] if r['sched_gpus'] is not None else '-'}), "
            f"{r['cores']} core(s) allowed, {r['threads']} compute thread(s)")
    for host in hosts:
        rs = [r for r in reports if r["host"] == host]
        gpus = max(max(r["gpus"] for r in rs), max((r["sched_gpus"] or 0) for r in rs))
        out("gpus" if host == hosts[0] else "", f"{host}: {gpus} GPU(s) for {len(rs)} rank(s)"
            + ("" if gpus else " (CPU run)"))
    shown = ", ".join(f"{k}={val}" for k, val in applied.items()) or "none"
    out("settings", f"hvdtrain applies: {shown}" + (f" (yours, kept: {already})" if already else ""))
    exported = reports[0]["env"]
    if exported:
        out("", "in the environment: " + ", ".join(f"{k}={val}" for k, val in exported.items()))
    for r in sorted(reports, key=lambda r: r["rank"]):
        outside = netsockets.exposed(r["listening"])
        out("sockets" if r["rank"] == 0 else "",
            f"rank {r['rank']} listens on: {', '.join(r['listening']) or 'nothing'}"
            + (f" ({len(outside)} reachable from other hosts)" if outside else ""))
    ok = sum(r["reduce_ok"] and r["bcast_ok"] for r in reports)
    out("check", f"allreduce (sum, average) and broadcast correct on {ok}/{size} rank(s)")
    for i, (nbytes, _) in enumerate(reports[0]["bandwidth"]):
        seconds = max(r["bandwidth"][i][1] for r in reports)  # the slowest rank sets the pace
        algbw, busbw = bus_bandwidth(nbytes, seconds, size)
        out("bandwidth" if i == 0 else "", f"allreduce {_fmt_bytes(nbytes):>8}: {seconds * 1e3:9.3f} ms, "
                                           f"algbw {algbw:7.3f} GB/s, busbw {busbw:7.3f} GB/s")
    if problems:
        for p in problems:
            out("problem", p)
        say(f"{PROG}: NOT READY ({len(problems)} problem(s)): " + "; ".join(problems))
    else:
        fws = ", ".join(sorted("hvdtrain.torch" if f == "torch" else "hvdtrain.tf" for f in ops))
        say(f"{PROG}: READY: {size} rank(s) on {len(hosts)} host(s) can train with {fws}")


def main(argv=None) -> None:
    args = build_parser().parse_args(argv)
    sys.stdout.flush()
    code = run(args)
    sys.stdout.flush()
    sys.stderr.flush()
    # os._exit: Horovod's atexit hooks would wait for ranks that may already be gone.
    os._exit(code)


if __name__ == "__main__":
    main()
