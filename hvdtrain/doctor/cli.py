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
allgather on every rank, a health check of every rank, and the allreduce bandwidth for a small
and a large message (nccl-tests' algbw and busbw), through Horovod and, beside it, through the
MPI library directly (mpi4py), so that Horovod's own cost per allreduce shows.

The health check times a short compute kernel on each rank (a float32 matrix product: 4096x4096
on the rank's GPU, else 512x512 on its CPU threads, torch's or numpy's; the median of a few
repetitions) and, on GPUs, a 64 MiB copy from pinned host memory to the GPU, and names every
rank more than --slow-fraction (25 %) below the median of the ranks, with its host: a
synchronous job runs at the speed of its slowest rank, so a slow rank is a problem for the
verdict. While some rank looks slow all of them measure again (up to 3 rounds, each keeping its
best figures), so that only a rank slow every time is named. When none is, one line gives the
min/median/max.

The last line is the verdict; the exit code is 0 when ready and 1 with the reasons otherwise. A
stage that does not finish within --timeout ends the process with a line naming the rank and the
stage, so the doctor itself never hangs a job.
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

from hvdtrain.cluster.env import ClusterEnv, shared_gpu_nccl_problem
from hvdtrain.cluster.horovod_ops import gpu_ops_problem
from hvdtrain.runtime import threads_per_rank
from hvdtrain import checkpoint, test_hooks
from hvdtrain.cluster import netsockets, tuning
from hvdtrain.report import say
from hvdtrain.doctor.collectives import (TFOps, TorchOps, _mpi_library, _one_line, bus_bandwidth,
                                         mpi4py_for_comparison, time_mpi_allreduce)
from hvdtrain.doctor.gpus import _visible_gpus, gpu_problems, rank_gpu, scheduler_gpus, srun_mpi_hint
from hvdtrain.doctor.health import HEALTH_FIGURES, HEALTH_ROUNDS, _fmt_rate, best_figures, health_findings

PROG = "hvdtrain.doctor"
# Variables mpirun sets for its own bookkeeping: not settings anyone chose.
LAUNCHER_INTERNAL = tuple(f"OMPI_MCA_{p}" for p in (
    "orte_", "ess", "pmix", "initial_wdir", "shmem_", "hwloc_base_binding", "rmaps_", "mpi_oversubscribe"))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"python -m {PROG}", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--framework", choices=("auto", "torch", "tf"), default="auto",
                   help="whose Horovod ops run the checks (auto: torch if its ops load, else tf)")
    p.add_argument("--small-kib", type=int, default=64, help="small allreduce message (KiB)")
    p.add_argument("--large-mib", type=int, default=None,
                   help="large allreduce message (MiB; default 256 on GPUs, 16 on CPUs)")
    p.add_argument("--iters", type=int, default=5, help="timed allreduces per message size")
    p.add_argument("--timeout", type=float, default=120.0,
                   help="seconds any one stage may take before the doctor ends this rank (0: never)")
    p.add_argument("--slow-fraction", type=_fraction, default=0.25,
                   help="a rank whose compute (or GPU copy) figure is more than this fraction below the "
                        "median of the ranks is a problem (0.25: 25 %% below)")
    p.add_argument("--json", metavar="PATH",
                   help="rank 0 also writes its findings here: ranks, hosts, the verdict's problems and each "
                        "allreduce's size, seconds, algbw and busbw (hvdtrain.predict --measure reads it)")
    return p


def _fraction(text: str) -> float:
    value = float(text)
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not a fraction between 0 and 1 (0.25 = 25 %)")
    return value


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
        return None, _one_line(err)


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

    # The GPUs the framework sees, as the trainer counts them (not the scheduler's guess): the
    # trainer's Horovod settings depend on whether its rank computes on a GPU.
    visible = _visible_gpus(fw)
    cores = len(os.sched_getaffinity(0))
    threads = threads_per_rank(None, env.local_world_size)
    settings = tuning.horovod_settings("auto", on_cpu=visible == 0)
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
    # The device the trainer would take, by its own decision; where it would refuse (ranks
    # sharing a GPU), the checks run on the CPU and the refusal is reported once per host.
    gpu, device_refusal = rank_gpu(local_rank, local_size, visible)
    gpu_problem = None
    if fw == "torch":
        gpu_problem = gpu_ops_problem(visible, hvd.cuda_built(), hvd.nccl_built(), versions["horovod"])
        if gpu_problem:
            # Checks on host tensors, so that the rest of the report still comes (a CUDA tensor
            # handed to this Horovod would end the rank with a traceback).
            problems.append(gpu_problem)
            gpu = None
        elif gpu is not None and hvd.nccl_built():
            from hvdtrain.torch.devices import nccl_version, shared_gpu

            # Ranks sharing a GPU (HVDTRAIN_SHARE_GPU=1, a test mode) as the trainer allows them.
            shared_problem = shared_gpu(local_size) and shared_gpu_nccl_problem(nccl_version())
            if shared_problem:
                problems.append(shared_problem)
                gpu = None
    backend = TorchOps(hvd, gpu) if fw == "torch" else TFOps(hvd, gpu)
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

    # Right after the checks' collectives, so the ranks time their kernels side by side.
    stage("health: compute kernel")
    health = _measure_health(backend, threads, problems, args.slow_fraction)

    stage("bandwidth")
    large = (args.large_mib if args.large_mib else (256 if gpus else 16)) * 2**20
    sizes = (args.small_kib * 2**10, large)
    bandwidth = []
    for nbytes in sizes:
        bandwidth.append((nbytes, backend.time_allreduce(nbytes, args.iters)))

    stage("bandwidth through MPI (mpi4py)")
    mpi_bandwidth, mpi_skipped = _mpi_comparison(hvd, backend, size, sizes, args.iters)

    stage("gather the ranks' reports")
    mine = {"rank": rank, "size": size, "local_rank": local_rank, "local_size": local_size, "host": host,
            "launcher": env.launcher, "launcher_view": (env.rank, env.world_size, env.local_rank),
            "gpus": gpus, "sched_gpus": sched, "device": "cpu" if gpu is None else f"GPU {gpu}",
            "device_refusal": device_refusal, "cores": cores, "threads": threads, "reduce_ok": reduce_ok,
            "bcast_ok": bcast_ok, "bandwidth": bandwidth, "mpi_bandwidth": mpi_bandwidth,
            "mpi_skipped": mpi_skipped, "health": health, "problems": problems, "versions": versions,
            "listening": netsockets.listening(),
            "env": {k: os.environ[k] for k in sorted(os.environ) if k.startswith(("HOROVOD_", "OMPI_MCA_", "NCCL_"))
                    and not k.startswith(LAUNCHER_INTERNAL)}}
    reports = backend.allgather_object(mine)

    if rank == 0:
        all_problems = _cross_checks(reports, args.slow_fraction)
        _print_report(reports, versions, built, controller, ops, errors, mpi_lib, applied, already, fw, all_problems,
                      args.slow_fraction)
        if args.json:
            _write_json(args.json, reports, all_problems)
        stage("done")
        verdict = 0 if not all_problems else 1
    else:
        verdict = 0 if not _cross_checks(reports, args.slow_fraction) else 1
    stage("shutdown")
    hvd.shutdown()
    return verdict


def _measure_health(backend, threads: int, problems: list[str], slow_fraction: float) -> dict:
    """This rank's best health figures over up to HEALTH_ROUNDS rounds. After each round the ranks
    gather their best figures so far, and all of them measure again while any rank still looks
    slow: every rank reads the same gathered figures, so all take the same decision and no
    collective is left waiting. A rank is then named only if it was slow in every round: lasting
    causes (a throttled GPU, a node slower than its peers, threads sharing cores with another
    rank's) stay, a burst of another process on a shared node does not."""
    best = None
    for round_ in range(HEALTH_ROUNDS):
        # A kernel that fails is reported from the first round; later rounds only improve figures.
        best = best_figures(best, _rank_health(backend, threads, problems if round_ == 0 else []))
        gathered = backend.allgather_object(best, name=f"doctor.health.{round_}")
        ranks = [{"rank": r, "host": "", "health": figures} for r, figures in enumerate(gathered)]
        if not health_findings(ranks, slow_fraction)[1]:
            break
    if round_:
        best["kernel"] += f", best of {round_ + 1} rounds"
    return best


def _rank_health(backend, threads: int, problems: list[str]) -> dict:
    """This rank's health figures; a kernel that fails is this rank's problem, not the doctor's end."""
    slowdown = test_hooks.doctor_slowdown()
    try:
        return backend.health(threads, slowdown)
    except Exception as err:  # noqa: BLE001 - the reason is the report
        problems.append(f"the compute check failed ({_one_line(err)})")
        return {"kernel": "failed", "gflops": None, "h2d_gbps": None, "slowdown": slowdown}


def _mpi_comparison(hvd, backend, size: int, sizes, iters: int) -> tuple[list, str | None]:
    """([(bytes, seconds per MPI_Allreduce)], None), or ([], why it was skipped). Every rank must
    take the same way (one rank in MPI_Barrier alone would hang), so the ranks first tell each
    other, through Horovod, whether they can; any rank's reason skips it on all of them."""
    MPI, why_not = mpi4py_for_comparison(hvd, size)
    reasons = backend.allgather_object(why_not, name="doctor.mpi4py")
    refused = [(r, why) for r, why in enumerate(reasons) if why]
    if refused:
        r, why = refused[0]
        return [], why if len(refused) == size and len(set(reasons)) == 1 else f"rank {r}: {why}"
    return [(nbytes, time_mpi_allreduce(MPI, nbytes, iters)) for nbytes in sizes], None


def _cross_checks(reports: list[dict], slow_fraction: float) -> list[str]:
    """Problems seen from all ranks together, each naming its rank or host."""
    problems = [f"rank {r['rank']}: {p}" for r in reports for p in r["problems"]]
    problems += health_findings(reports, slow_fraction)[1]
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
        problems += gpu_problems(host, max(r["gpus"] for r in rs),
                                 max((r["sched_gpus"] for r in rs if r["sched_gpus"] is not None), default=None),
                                 [r.get("device_refusal") for r in rs])
        busy = sum(r["threads"] for r in rs)
        cores = max(r["cores"] for r in rs)
        if busy > (os.cpu_count() or cores) and all(r["cores"] >= cores for r in rs):
            problems.append(f"{host}: {len(rs)} ranks x threads = {busy} compute threads for {os.cpu_count()} cores")
    return problems


def _print_report(reports, versions, built, controller, ops, errors, mpi_lib, applied, already, fw, problems,
                  slow_fraction):
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
            f"rank {r['rank']}: {r['host']} local {r['local_rank']}/{r['local_size']}, trains on {r['device']}, "
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
    _print_health(out, reports, slow_fraction)
    mpi = _slowest(reports, "mpi_bandwidth") if reports[0]["mpi_bandwidth"] else []
    for i, (nbytes, seconds) in enumerate(_slowest(reports, "bandwidth")):
        out("bandwidth" if i == 0 else "", _allreduce_line(nbytes, "Horovod", seconds, size))
        if mpi:
            mpi_seconds = mpi[i][1]
            out("", _allreduce_line(nbytes, "MPI (mpi4py)", mpi_seconds, size)
                + f"; Horovod - MPI: {(seconds - mpi_seconds) * 1e3:+.3f} ms per allreduce")
    if reports[0]["mpi_skipped"]:
        out("", f"MPI comparison (mpi4py) skipped: {reports[0]['mpi_skipped']}")
    if problems:
        for p in problems:
            out("problem", p)
        say(f"{PROG}: NOT READY ({len(problems)} problem(s)): " + "; ".join(problems))
    else:
        fws = ", ".join(sorted("hvdtrain.torch" if f == "torch" else "hvdtrain.tf" for f in ops))
        say(f"{PROG}: READY: {size} rank(s) on {len(hosts)} host(s) can train with {fws}")


def _write_json(path: str, reports: list[dict], problems: list[str]) -> None:
    """Rank 0's findings for programs (hvdtrain.predict): what the report says in its lines."""
    import json

    size = reports[0]["size"]
    figures = [{"bytes": nbytes, "seconds": seconds, "through": "horovod",
                **dict(zip(("algbw_gbs", "busbw_gbs"), bus_bandwidth(nbytes, seconds, size)))}
               for nbytes, seconds in _slowest(reports, "bandwidth")]
    with open(path, "w") as f:
        # env: the Horovod, MPI and NCCL settings the figures were measured under (the cycle among them).
        json.dump({"ranks": size, "hosts": sorted({r["host"] for r in reports}), "env": reports[0]["env"],
                   "devices": [r["device"] for r in reports], "ready": not problems, "problems": problems,
                   "allreduce": figures}, f, indent=2)


def _slowest(reports: list[dict], key: str) -> list[tuple[int, float]]:
    """(bytes, seconds) of each allreduce timed under `key`, as its slowest rank took it: an
    allreduce ends when the last rank's does."""
    return [(nbytes, max(r[key][i][1] for r in reports)) for i, (nbytes, _) in enumerate(reports[0][key])]


def _allreduce_line(nbytes: int, through: str, seconds: float, size: int) -> str:
    algbw, busbw = bus_bandwidth(nbytes, seconds, size)
    return (f"allreduce {_fmt_bytes(nbytes):>8} {through:<12} {seconds * 1e3:9.3f} ms, "
            f"algbw {algbw:7.3f} GB/s, busbw {busbw:7.3f} GB/s")


def _print_health(out, reports, slow_fraction: float) -> None:
    """Each rank's figures, then per figure the ranks that are slow or one line saying they are even."""
    for r in sorted(reports, key=lambda r: r["rank"]):
        h = r["health"]
        figures = ", ".join(f"{what} {_fmt_rate(h[key])} {unit}" for key, what, unit in HEALTH_FIGURES
                            if h.get(key) is not None) or "no figure"
        slowed = (f"; slowed x{h['slowdown']} by {test_hooks.DOCTOR_SLOWDOWN}, a test setting" if h["slowdown"] > 1 else "")
        out("health" if r["rank"] == 0 else "",
            f"rank {r['rank']} (host {r['host']}): {figures} ({h['kernel']}{slowed})")
    summaries, slow = health_findings(reports, slow_fraction)
    for line in summaries + slow:
        out("", line)


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
