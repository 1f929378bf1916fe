"""The same workload under every backend of hvdtrain/backends.py (Horovod-torch, torch DDP,
PyTorch Lightning, Hugging Face Accelerate, Horovod-TF and tf.distribute's
MultiWorkerMirroredStrategy), measured fairly, with a report.

    python -m hvdtrain.compare --workload digits-cnn --np 1,2 --out runs/compare
    python -m hvdtrain.compare --workload resnet18-synthetic --np 1,2 --repeats 3 --out runs/r18
    # inside an sbatch allocation the ranks are started with srun, else with mpirun

Fairness: one workload definition (hvdtrain/compare/workloads.py) for every backend; threads per rank
fixed and recorded; warm-up steps excluded; every rank timed between barriers; backends
alternated within each repeat (A B C D A B C D ...) and the median over repeats reported.
Writes compare.json (every measurement + environment), compare.md (the table) and compare.png.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import shlex
import sys
import time

from hvdtrain import backends
from hvdtrain.compare import study
from hvdtrain.errors import UsageError, report_and_exit
from hvdtrain.compare.report import (fmt, parity, rate_unit, record_from_result, summarize, write_markdown,
                                     write_plot)
from hvdtrain.launch import launch_command, launch_env, run_to_end
from hvdtrain.result_file import environment_fingerprint, library_versions, write_json
from hvdtrain.compare.workloads import WORKLOADS, custom_workload, get_workload

# Every backend of hvdtrain/backends.py, by its report label (horovod-torch, ddp, lightning,
# accelerate, horovod-tf, tf-mwms).
BACKENDS = {b.label: b for b in backends.BACKENDS}
# torchrun starts torch.distributed's own rendezvous only: the torch backends other than Horovod.
TORCHRUN_BACKENDS = tuple(b.label for b in backends.BACKENDS if b.framework == "torch" and b.name != "horovod")


def pick_launcher(requested: str) -> str:
    if requested != "auto":
        return requested
    return "srun" if os.environ.get("SLURM_JOB_ID") else "mpirun"


def _interrupt(signum, frame):
    raise KeyboardInterrupt(signal.Signals(signum).name)


def run_one(backend: str, np: int, args, workload, out_dir: str, tag: str) -> dict:
    result_path = os.path.join(out_dir, "runs", f"{tag}.json")
    log_path = os.path.join(out_dir, "runs", f"{tag}.log")
    # One node: every backend gets the same launch line, with the tasks per node Lightning wants under srun.
    cmd = (launch_command(args.launcher, np, tasks_per_node=np, job_name=f"hvdtrain-compare-{os.getpid()}-{tag}")
           + [sys.executable] + BACKENDS[backend].trainer_args() + workload.scaled_args(np, args.smallest_np, args.scaling)
           + ["--threads-per-rank", str(args.threads_per_rank), "--log-interval", "1", "--result-json", result_path])
    env = launch_env(TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
    started = time.time()
    rc = run_to_end(cmd, args.launcher, log_path, args.timeout, env)
    record = {"backend": backend, "np": np, "tag": tag, "command": cmd, "returncode": rc,
              "wall_seconds": time.time() - started, "log": log_path}
    if rc != 0 or not os.path.exists(result_path):
        with open(log_path) as f:
            record["error"] = f"{backend} np={np} failed ({rc}); last output:\n" + f.read()[-3000:]
        return record
    with open(result_path) as f:
        record.update(record_from_result(json.load(f), result_path))
    return record


def parse_args(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    ours, generator_args = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    p = argparse.ArgumentParser(prog="python -m hvdtrain.compare", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter,
                                epilog="A scaling study (--nodes) writes one job per backend and size with "
                                       "hvdtrain.slurm: its options (--preset, --account, --time, --setup, ...) go "
                                       "after `--`.")
    what = p.add_mutually_exclusive_group()
    what.add_argument("--workload", help=f"one of: {', '.join(WORKLOADS)}")
    what.add_argument("--train-args", metavar="'OPTIONS'",
                      help="your own trainer options instead of a workload, in one quoted string")
    what.add_argument("--collect", metavar="DIR", help="write a study's report from its jobs' result files (again)")
    own = p.add_argument_group("your own model (a torch model: the torch backends, the default; a Keras model: "
                               "--backends horovod-tf,tf-mwms, with a built-in --dataset, an image folder or shards; "
                               "--train-args adds the other trainer options)")
    for part, example in (("model", "my_net.py:build"), ("dataset", "my_data.py:datasets"), ("loss", "my_loss.py:loss")):
        own.add_argument(f"--{part}", metavar="REF", help=f"as the trainer's --{part}, e.g. {example}")
    p.add_argument("--np", default="1,2", help="comma-separated rank counts (on this host, or in this allocation)")
    p.add_argument("--nodes", help="comma-separated node counts: a scaling study, one Slurm job per backend and "
                                   "size (without sbatch here: that many ranks per node on this host)")
    p.add_argument("--scaling", choices=("weak", "strong"), default="weak",
                   help="weak: per-rank batch fixed; strong: the smallest size's global batch and LR at every size")
    p.add_argument("--backends", help="comma-separated, from: " + ", ".join(BACKENDS) + " (default: all; the torch "
                                      "ones for your own --model)")
    p.add_argument("--repeats", type=int, default=1,
                   help="runs of each backend and size; the report gives their median and spread")
    p.add_argument("--threads-per-rank", type=int, default=1,
                   help="fixed for every backend and rank count (on this host; a Slurm job uses its cpus per task)")
    p.add_argument("--launcher", default="auto", choices=("auto", "mpirun", "srun", "torchrun"),
                   help="auto: srun inside a Slurm allocation, else mpirun; torchrun (one node) runs the "
                        f"torch-only backends: {', '.join(TORCHRUN_BACKENDS)}")
    p.add_argument("--timeout", type=float, default=900, help="seconds per run on this host before it is killed")
    p.add_argument("--target-accuracy", type=float, help="report the time to this validation accuracy")
    p.add_argument("--dry-run", action="store_true", help="a study: write its job scripts, submit nothing")
    p.add_argument("--wait", action="store_true", help="a study: wait for its jobs, then write the report")
    p.add_argument("--poll", type=float, default=30, help="seconds between two looks at the queue (--wait)")
    p.add_argument("--wait-limit", type=float, default=24 * 3600, help="seconds --wait waits at most")
    p.add_argument("--parity-steps", type=int, default=10, help="steps whose losses must agree within a pair")
    p.add_argument("--loss-tolerance", type=float, default=1e-3,
                   help="largest relative difference of a pair's losses over --parity-steps (parity)")
    p.add_argument("--accuracy-tolerance", type=float, default=0.01,
                   help="largest difference of final validation accuracy between the backends (accuracy workloads)")
    p.add_argument("--out", help="the directory of the runs and the report (required unless --collect)")
    args = p.parse_args(ours)
    if generator_args and not args.nodes:
        p.error("options after `--` are hvdtrain.slurm's, for a scaling study (--nodes)")
    if not args.collect and not args.out:
        p.error("--out is required")
    args.own = [arg for part in ("model", "dataset", "loss") if getattr(args, part)
                for arg in (f"--{part}", getattr(args, part))]
    if args.own and (args.workload or args.collect):
        p.error("--model, --dataset and --loss are a workload of your own: not with --workload or --collect")
    if not (args.collect or args.workload or args.train_args or args.own):
        p.error("one of --workload, --train-args, --model or --collect is required")
    if args.backends is None:
        args.backends = ",".join(label for label, b in BACKENDS.items() if not args.own or b.framework == "torch")
    args.generator_args = generator_args
    return args


def _sizes(text: str, option: str) -> list[int]:
    try:
        sizes = sorted({int(n) for n in text.split(",")})
    except ValueError:
        raise UsageError(f"{option} must be comma-separated integers (got '{text}')") from None
    if min(sizes) < 1:
        raise UsageError(f"every {option} must be >= 1")
    return sizes


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
                    f"{fmt(m['total_images_per_sec'], '.2f')} {rate_unit([m])}, val acc {fmt(m['val_acc'], '.4f')}")
                print(f"[compare] {tag}: {status} ({m['wall_seconds']:.0f} s)", flush=True)
    return measurements


def main(argv=None) -> None:
    args = parse_args(argv)
    try:
        if args.collect:
            report, status = study.collect(args.collect)
            sys.exit(study.print_report(args.collect, status))
        workload = get_workload(args.workload) if args.workload else \
            custom_workload(args.own + shlex.split(args.train_args or ""))
        backends = [b.strip() for b in args.backends.split(",") if b.strip()]
        unknown = [b for b in backends if b not in BACKENDS]
        if unknown:
            raise UsageError(f"unknown backend(s) {', '.join(unknown)}; valid: {', '.join(BACKENDS)}")
        if args.repeats < 1:
            raise UsageError("--repeats must be >= 1")
        if args.nodes:
            sizes = _sizes(args.nodes, "--nodes")
            no_slurm = study.slurm_unreachable()
            if not no_slurm:
                sys.exit(study.start(args, {b: BACKENDS[b] for b in backends}, workload, sizes, args.generator_args))
            per_node = study.generator_job(args.generator_args).tasks_per_node if args.generator_args else 1
            nps = [n * per_node for n in sizes]
            print(f"[compare] {no_slurm}: {args.nodes} node(s) run as {nps} rank(s) on this host with mpirun",
                  flush=True)
            args.launcher = "mpirun" if args.launcher == "auto" else args.launcher
        else:
            nps = _sizes(args.np, "--np")
        if args.launcher == "torchrun" and set(backends) - set(TORCHRUN_BACKENDS):
            raise UsageError(f"--launcher torchrun runs {', '.join(TORCHRUN_BACKENDS)} only (Horovod and "
                             "tf.distribute need mpirun or srun); not: "
                             + ", ".join(b for b in backends if b not in TORCHRUN_BACKENDS))
        for np in nps:  # a strong-scaling size that cannot split the batch, before anything runs
            workload.scaled_args(np, nps[0], args.scaling)
    except UsageError as err:
        report_and_exit(err, "hvdtrain.compare")
    args.launcher = pick_launcher(args.launcher)
    args.smallest_np = nps[0]
    os.makedirs(os.path.join(args.out, "runs"), exist_ok=True)
    # SIGTERM (scancel of the job, a kill) ends the comparison as Ctrl-C does: through run_one's
    # clean-up of the launch in flight. SIGINT too, explicitly: a process started in the background
    # of a script inherits SIGINT ignored, and Python then installs no handler of its own (seen:
    # a suite run with `&` made `kill -INT` end nothing, and the comparison ran to its end).
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)

    try:
        measurements = measure(args, workload, backends, nps)
    except KeyboardInterrupt:
        print("[compare] interrupted: the launch in flight and its ranks were ended", file=sys.stderr, flush=True)
        sys.exit(130)

    with_accuracy = workload.purpose == "accuracy"
    report = {"workload": vars(workload), "backends": backends, "nps": nps, "repeats": args.repeats,
              "threads_per_rank": args.threads_per_rank, "launcher": args.launcher, "scaling": args.scaling,
              "scaling_rule": [workload.scaling_rule(nps[0], args.scaling)], "target_accuracy": args.target_accuracy,
              "measurements": measurements, "unit": rate_unit(measurements),
              "summary": summarize(measurements, backends, nps, with_accuracy, target_accuracy=args.target_accuracy),
              "parity": parity(measurements, nps, args.parity_steps, args.loss_tolerance,
                               args.accuracy_tolerance, with_accuracy),
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
