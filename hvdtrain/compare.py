"""The same workload under every backend of hvdtrain/backends.py (Horovod-torch, torch DDP,
PyTorch Lightning, Hugging Face Accelerate, Horovod-TF and tf.distribute's
MultiWorkerMirroredStrategy), measured fairly, with a report.

    python -m hvdtrain.compare --workload digits-cnn --np 1,2 --out runs/compare
    python -m hvdtrain.compare --workload resnet18-synthetic --np 1,2 --repeats 3 --out runs/r18
    # inside an sbatch allocation the ranks are started with srun, else with mpirun

Fairness: one workload definition (hvdtrain/workloads.py) for every backend; threads per rank
fixed and recorded; warm-up steps excluded; every rank timed between barriers; backends
alternated within each repeat (A B C D A B C D ...) and the median over repeats reported.
Writes compare.json (every measurement + environment), compare.md (the table) and compare.png.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time

from hvdtrain import backends
from hvdtrain.errors import UsageError, report_and_exit
from hvdtrain.launch import launch_command, launch_env
from hvdtrain.results import environment_fingerprint, library_versions, write_json
from hvdtrain.workloads import WORKLOADS, get_workload

# Every backend of hvdtrain/backends.py, by its report label (horovod-torch, ddp, lightning,
# accelerate, horovod-tf, tf-mwms).
BACKENDS = {b.label: b for b in backends.BACKENDS}
# torchrun starts torch.distributed's own rendezvous only: the torch backends other than Horovod.
TORCHRUN_BACKENDS = tuple(b.label for b in backends.BACKENDS if b.framework == "torch" and b.name != "horovod")
# Pairs that start from the same weights and see the same batches: their losses must agree.
PARITY_PAIRS = tuple((b.parity_with, b.label) for b in backends.BACKENDS if b.parity_with)


def pick_launcher(requested: str) -> str:
    if requested != "auto":
        return requested
    return "srun" if os.environ.get("SLURM_JOB_ID") else "mpirun"


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


def _interrupt(signum, frame):
    raise KeyboardInterrupt(signal.Signals(signum).name)


def run_one(backend: str, np: int, args, workload, out_dir: str, tag: str) -> dict:
    result_path = os.path.join(out_dir, "runs", f"{tag}.json")
    log_path = os.path.join(out_dir, "runs", f"{tag}.log")
    # One node: every backend gets the same launch line, with the tasks per node Lightning wants under srun.
    cmd = (launch_command(args.launcher, np, tasks_per_node=np) + [sys.executable]
           + BACKENDS[backend].trainer_args() + workload.trainer_args()
           + ["--threads-per-rank", str(args.threads_per_rank), "--log-interval", "1", "--result-json", result_path])
    step_name = f"hvdtrain-compare-{os.getpid()}-{tag}"
    if args.launcher == "srun":
        cmd.insert(1, f"--job-name={step_name}")  # to find the step if it must be cancelled
    env = launch_env(TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
    started = time.time()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            rc = proc.wait(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            # The whole job: ranks left behind would skew every later measurement.
            end_launch(proc, args.launcher, step_name)
            rc = "timeout"
        except BaseException:  # Ctrl-C, SIGTERM (see main): the job goes with us
            end_launch(proc, args.launcher, step_name)
            raise
    record = {"backend": backend, "np": np, "tag": tag, "command": cmd, "returncode": rc,
              "wall_seconds": time.time() - started, "log": log_path}
    if rc != 0 or not os.path.exists(result_path):
        with open(log_path) as f:
            record["error"] = f"{backend} np={np} failed ({rc}); last output:\n" + f.read()[-3000:]
        return record
    with open(result_path) as f:
        result = json.load(f)
    tp = result.get("throughput") or {}
    final = result.get("final") or {}
    record.update(total_images_per_sec=tp.get("total_images_per_sec"),
                  per_rank_images_per_sec=tp.get("per_rank_images_per_sec"),
                  val_acc=final.get("val_acc"), val_count=final.get("val_count"),
                  loss_log=result.get("loss_log"), param_checksums=[r["param_checksum"] for r in result["ranks"]],
                  threads=[r["threads"] for r in result["ranks"]], launcher=result.get("launcher"),
                  result_json=result_path)
    return record


def summarize(measurements: list[dict], backends: list[str], nps: list[int], with_accuracy: bool) -> list[dict]:
    rows = []
    for backend in backends:
        base = None
        for np in nps:
            ok = [m for m in measurements if m["backend"] == backend and m["np"] == np and "error" not in m]
            rates = [m["total_images_per_sec"] for m in ok if m.get("total_images_per_sec")]
            total = statistics.median(rates) if rates else None
            if np == 1:
                base = total
            # The slowest rank of each run: a rank that lags shows here before it shows in the total.
            slowest = [min(m["per_rank_images_per_sec"]) for m in ok if m.get("per_rank_images_per_sec")]
            # Random labels carry no accuracy: report it for accuracy workloads only.
            accs = [m["val_acc"] for m in ok if m.get("val_acc") is not None] if with_accuracy else []
            rows.append({"backend": backend, "np": np, "repeats": len(ok),
                         "total_images_per_sec": total,
                         "min_total_images_per_sec": min(rates) if rates else None,
                         "max_total_images_per_sec": max(rates) if rates else None,
                         "images_per_sec_per_rank": total / np if total else None,
                         "slowest_rank_images_per_sec": statistics.median(slowest) if slowest else None,
                         "scaling_efficiency": total / (np * base) if total and base else None,
                         "val_acc": statistics.median(accs) if accs else None,
                         "weights_equal_across_ranks": all(len(set(m["param_checksums"])) == 1 for m in ok)})
    # Overhead against plain DDP on the same workload and rank count: the extra time per sample.
    ddp = {r["np"]: r["total_images_per_sec"] for r in rows if r["backend"] == "ddp"}
    for r in rows:
        r["overhead_vs_ddp"] = (ddp[r["np"]] / r["total_images_per_sec"] - 1
                                if ddp.get(r["np"]) and r["total_images_per_sec"] else None)
    return rows


# Overheads against plain DDP that the seeds state, shown beside the measured ones.
STATED_OVERHEADS = {
    "lightning": (0.05, "the Jean Zay page (IDRIS): Lightning over DDP costs \"of the order of 5 %\" of time in the "
                        "best case (their GPU runs)"),
}


def stated_overhead_lines(report: dict) -> list[str]:
    """For each backend with a stated overhead: the statement, the measured figures, and whether
    the statement held here (measured overhead at every N no more than the stated one)."""
    lines = []
    for backend, (stated, source) in STATED_OVERHEADS.items():
        rows = [r for r in report["summary"] if r["backend"] == backend and r.get("overhead_vs_ddp") is not None]
        if not rows:
            continue
        measured = ", ".join(f"{r['overhead_vs_ddp']:+.1%} at np {r['np']}" for r in rows)
        held = all(r["overhead_vs_ddp"] <= stated for r in rows)
        lines.append(f"{backend}: measured overhead vs ddp {measured}; {source}: "
                     f"{'held here' if held else 'not held here (more overhead than stated)'}.")
    return lines


def reading(report: dict) -> list[str]:
    """A few generated sentences for the top of compare.md: the fastest backend at each rank
    count and by how much, the scaling, and whether parity held."""
    lines = []
    for np in report["nps"]:
        rows = sorted((r for r in report["summary"] if r["np"] == np and r["total_images_per_sec"]),
                      key=lambda r: -r["total_images_per_sec"])
        if not rows:
            continue
        best = rows[0]
        text = f"At {np} rank(s) {best['backend']} is fastest ({best['total_images_per_sec']:.1f} img/s"
        if len(rows) > 1:
            text += f", {best['total_images_per_sec'] / rows[1]['total_images_per_sec'] - 1:.1%} ahead of {rows[1]['backend']}"
        text += ")"
        eff = [r for r in rows if r["scaling_efficiency"] is not None and np > 1]
        if eff:
            top = max(eff, key=lambda r: r["scaling_efficiency"])
            text += f"; the best scaling is {top['backend']}'s, E({np}) = {top['scaling_efficiency']:.2f}"
        lines.append(text + ".")
    checks = report["parity"]["checks"]
    if checks:
        failed = [c for c in checks if not c["ok"]]
        lines.append("Parity held: each pair's losses agree and the accuracies lie within the tolerance."
                     if not failed else f"Parity FAILED in {len(failed)} of {len(checks)} check(s): see below.")
    return lines + stated_overhead_lines(report)


def parity(measurements: list[dict], nps: list[int], steps: int, loss_tol: float, acc_tol: float,
           check_accuracy: bool) -> dict:
    def first(backend, np):
        return next((m for m in measurements if m["backend"] == backend and m["np"] == np and "error" not in m), None)

    checks = []
    for a, b in PARITY_PAIRS:
        for np in nps:
            ma, mb = first(a, np), first(b, np)
            if not ma or not mb:
                continue
            la, lb = [x[1] for x in ma["loss_log"][:steps]], [x[1] for x in mb["loss_log"][:steps]]
            n = min(len(la), len(lb))
            diff = max(abs(x - y) for x, y in zip(la[:n], lb[:n])) if n else None
            checks.append({"pair": [a, b], "np": np, "steps_compared": n, "max_abs_loss_diff": diff,
                           "tolerance": loss_tol, "ok": diff is not None and n == min(steps, len(la), len(lb))
                           and diff <= loss_tol})
    if check_accuracy:
        for np in nps:
            accs = {m["backend"]: m["val_acc"] for m in measurements
                    if m["np"] == np and "error" not in m and m.get("val_acc") is not None}
            if len(accs) > 1:
                spread = max(accs.values()) - min(accs.values())
                checks.append({"accuracy": accs, "np": np, "spread": spread, "tolerance": acc_tol,
                               "ok": spread <= acc_tol})
    return {"checks": checks, "ok": all(c["ok"] for c in checks)}


def _fmt(value, spec):
    return "n/a" if value is None else format(value, spec)


def write_markdown(path: str, report: dict) -> None:
    lines = [f"# Comparison: workload `{report['workload']['name']}`", "", *reading(report), "",
             f"{report['launcher']} launcher, {report['threads_per_rank']} thread(s) per rank, "
             f"median of {report['repeats']} repeat(s); host {report['environment']['host']} "
             f"({report['environment']['cpu_count']} CPUs).", "",
             "| backend | np | total img/s | min-max over repeats | img/s per rank | slowest rank img/s | "
             "scaling efficiency E(N) | overhead vs ddp | final val acc |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in report["summary"]:
        spread = (f"{r['min_total_images_per_sec']:.2f}-{r['max_total_images_per_sec']:.2f}"
                  if r.get("min_total_images_per_sec") is not None else "n/a")
        lines.append(f"| {r['backend']} | {r['np']} | {_fmt(r['total_images_per_sec'], '.2f')} | {spread} | "
                     f"{_fmt(r['images_per_sec_per_rank'], '.2f')} | {_fmt(r.get('slowest_rank_images_per_sec'), '.2f')} | "
                     f"{_fmt(r['scaling_efficiency'], '.3f')} | {_fmt(r.get('overhead_vs_ddp'), '+.1%')} | "
                     f"{_fmt(r['val_acc'], '.4f')} |")
    lines += ["", "E(N) = img/s(N) / (N x img/s(1)), per backend. Overhead vs ddp = img/s of ddp / img/s of the "
                  "backend - 1 at the same N: the extra time per sample (negative: faster than ddp).", "",
              "## Parity", ""]
    for c in report["parity"]["checks"]:
        if "pair" in c:
            lines.append(f"- {c['pair'][0]} vs {c['pair'][1]}, np {c['np']}: max |loss difference| over the first "
                         f"{c['steps_compared']} steps = {_fmt(c['max_abs_loss_diff'], '.2e')} "
                         f"(tolerance {c['tolerance']:g}): {'ok' if c['ok'] else 'FAILED'}")
        else:
            lines.append(f"- final accuracy at np {c['np']}: spread {c['spread']:.4f} (tolerance {c['tolerance']:g}) "
                         f"over {c['accuracy']}: {'ok' if c['ok'] else 'FAILED'}")
    failures = [m for m in report["measurements"] if "error" in m]
    if failures:
        lines += ["", "## Failed runs", ""] + [f"- {m['backend']} np {m['np']}: see {m['log']}" for m in failures]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def write_plot(path: str, report: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_tp, ax_eff) = plt.subplots(1, 2, figsize=(10, 4))
    for backend in report["backends"]:
        rows = [r for r in report["summary"] if r["backend"] == backend and r["total_images_per_sec"]]
        nps = [r["np"] for r in rows]
        totals = [r["total_images_per_sec"] for r in rows]
        spread = [[t - r.get("min_total_images_per_sec", t) for t, r in zip(totals, rows)],
                  [r.get("max_total_images_per_sec", t) - t for t, r in zip(totals, rows)]]
        line = ax_tp.errorbar(nps, totals, yerr=spread, marker="o", capsize=3, label=backend)[0]
        one = next((r["total_images_per_sec"] for r in rows if r["np"] == 1), None)
        if one:  # ideal linear scaling from this backend's one-rank figure
            ax_tp.plot(nps, [one * n for n in nps], linestyle=":", color=line.get_color(), alpha=0.6)
        eff = [r for r in rows if r["scaling_efficiency"]]
        ax_eff.plot([r["np"] for r in eff], [r["scaling_efficiency"] for r in eff], marker="o", label=backend)
    ax_tp.set(xlabel="ranks", ylabel="total img/s (bars: min-max over repeats)",
              title=f"throughput: {report['workload']['name']} (dotted: linear scaling)")
    ax_eff.set(xlabel="ranks", ylabel="E(N)", title="scaling efficiency", ylim=(0, 1.1))
    for ax in (ax_tp, ax_eff):
        ax.set_xticks(report["nps"])
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m hvdtrain.compare", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--workload", required=True, help=f"one of: {', '.join(WORKLOADS)}")
    p.add_argument("--np", default="1,2", help="comma-separated rank counts")
    p.add_argument("--backends", default=",".join(BACKENDS), help="comma-separated, from: " + ", ".join(BACKENDS))
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--threads-per-rank", type=int, default=1, help="fixed for every backend and rank count")
    p.add_argument("--launcher", default="auto", choices=("auto", "mpirun", "srun", "torchrun"),
                   help="auto: srun inside a Slurm allocation, else mpirun; torchrun (one node) runs the "
                        f"torch-only backends: {', '.join(TORCHRUN_BACKENDS)}")
    p.add_argument("--timeout", type=float, default=900, help="seconds per run before it is killed")
    p.add_argument("--parity-steps", type=int, default=10, help="steps whose losses must agree within a pair")
    p.add_argument("--loss-tolerance", type=float, default=1e-3)
    p.add_argument("--accuracy-tolerance", type=float, default=0.01)
    p.add_argument("--out", required=True)
    return p.parse_args(argv)


def measure(args, workload, backends: list[str], nps: list[int]) -> list[dict]:
    measurements = []
    for repeat in range(args.repeats):
        for np in nps:
            for backend in backends:  # alternated: A B C D, then A B C D again
                tag = f"{backend}-np{np}-r{repeat}"
                m = run_one(backend, np, args, workload, args.out, tag)
                m["repeat"] = repeat
                measurements.append(m)
                status = m.get("error", "").split("\n")[0] or (
                    f"{_fmt(m['total_images_per_sec'], '.2f')} img/s, val acc {_fmt(m['val_acc'], '.4f')}")
                print(f"[compare] {tag}: {status} ({m['wall_seconds']:.0f} s)", flush=True)
    return measurements


def main(argv=None) -> None:
    args = parse_args(argv)
    try:
        workload = get_workload(args.workload)
        backends = [b.strip() for b in args.backends.split(",") if b.strip()]
        unknown = [b for b in backends if b not in BACKENDS]
        if unknown:
            raise UsageError(f"unknown backend(s) {', '.join(unknown)}; valid: {', '.join(BACKENDS)}")
        try:
            nps = sorted({int(n) for n in args.np.split(",")})
        except ValueError:
            raise UsageError(f"--np must be comma-separated integers (got '{args.np}')") from None
        if args.repeats < 1 or min(nps) < 1:
            raise UsageError("--repeats and every --np must be >= 1")
        if args.launcher == "torchrun" and set(backends) - set(TORCHRUN_BACKENDS):
            raise UsageError(f"--launcher torchrun runs {', '.join(TORCHRUN_BACKENDS)} only (Horovod and "
                             "tf.distribute need mpirun or srun); not: "
                             + ", ".join(b for b in backends if b not in TORCHRUN_BACKENDS))
    except UsageError as err:
        report_and_exit(err, "hvdtrain.compare")
    args.launcher = pick_launcher(args.launcher)
    os.makedirs(os.path.join(args.out, "runs"), exist_ok=True)
    # SIGTERM (scancel of the job, a kill) ends the comparison as Ctrl-C does: through run_one's
    # clean-up of the launch in flight.
    signal.signal(signal.SIGTERM, _interrupt)

    try:
        measurements = measure(args, workload, backends, nps)
    except KeyboardInterrupt:
        print("[compare] interrupted: the launch in flight and its ranks were ended", file=sys.stderr, flush=True)
        sys.exit(130)

    report = {"workload": vars(workload), "backends": backends, "nps": nps, "repeats": args.repeats,
              "threads_per_rank": args.threads_per_rank, "launcher": args.launcher,
              "measurements": measurements, "summary": summarize(measurements, backends, nps, workload.purpose == "accuracy"),
              "parity": parity(measurements, nps, args.parity_steps, args.loss_tolerance,
                               args.accuracy_tolerance, workload.purpose == "accuracy"),
              "versions": library_versions(), "environment": environment_fingerprint()}
    write_json(os.path.join(args.out, "compare.json"), report)
    write_markdown(os.path.join(args.out, "compare.md"), report)
    write_plot(os.path.join(args.out, "compare.png"), report)
    with open(os.path.join(args.out, "compare.md")) as f:
        print(f.read())
    failed = [m for m in measurements if "error" in m]
    for m in failed:
        print(f"[compare] FAILED {m['error']}", file=sys.stderr)
    if failed or not report["parity"]["ok"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
