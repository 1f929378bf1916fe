"""Your LightningModule under Lightning's `ddp` and under `horovod`, side by side, with parity checks.

    python -m hvdtrain.lightning.compare --module my_module.py:build --datamodule my_data.py:build \
        --np 2 --max-steps 200 --out runs/lightning-cmp
    # inside an sbatch allocation the ranks are started with srun, else with mpirun

`--module` and `--datamodule` name functions of no arguments returning your LightningModule and
LightningDataModule (or the module alone, when it has its own dataloaders). Each strategy runs
the same code from the same seed with the same threads per rank, alternating (ddp, horovod, ddp,
horovod, ... for --repeats); each rank is timed between barriers after --warmup-steps. The report
(compare.json, compare.md) gives img/s (median over repeats) and checks, between the strategies:
every rank's first batches (a digest of their tensors), every rank's first loss, and rank 0's final
weights (relative distance within --tolerance). Exit status 1 when a parity check fails.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time

from hvdtrain import plugins
from hvdtrain.errors import UsageError, report_and_exit
from hvdtrain.launch import launch_command, launch_env
from hvdtrain.result_file import write_json

PROG = "hvdtrain.lightning.compare"
STRATEGIES = ("ddp", "horovod")
DIGESTED_BATCHES = 4  # per rank: enough to see another order or another shard, cheap beside a step


# ---------------------------------------------------------------------------------------- one run (a rank)
def batch_digest(batch) -> str:
    """sha1 over the tensors of a batch (nested lists, tuples, dicts), as this rank received them."""
    import torch

    digest = hashlib.sha1()

    def visit(value):
        if isinstance(value, torch.Tensor):
            digest.update(value.detach().cpu().contiguous().numpy().tobytes())
        elif isinstance(value, dict):
            for key in sorted(value):
                visit(value[key])
        elif isinstance(value, (list, tuple)):
            for item in value:
                visit(item)

    visit(batch)
    return digest.hexdigest()


def batch_size_of(batch) -> int:
    import torch

    while isinstance(batch, (list, tuple, dict)):
        batch = next(iter(batch.values())) if isinstance(batch, dict) else batch[0]
    return len(batch) if isinstance(batch, torch.Tensor) else 1


def make_probe(out_dir: str, warmup_steps: int, threads: int):
    import lightning.pytorch as pl
    import torch

    class Probe(pl.Callback):
        """What the comparison reads of each rank: batch digests, the first loss, samples per second."""

        def __init__(self):
            self.digests, self.first_loss, self.samples, self.steps, self.t0 = [], None, 0, 0, None

        def on_fit_start(self, trainer, pl_module):
            torch.set_num_threads(threads)  # the same for every strategy (Lightning's DDP sets its own)

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if len(self.digests) < DIGESTED_BATCHES:
                self.digests.append(batch_digest(batch))
            if self.steps == warmup_steps and self.t0 is None:
                trainer.strategy.barrier()
                self.t0 = time.perf_counter()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
            if self.first_loss is None and isinstance(loss, torch.Tensor):
                self.first_loss = float(loss)
            self.steps += 1
            if self.t0 is not None:
                self.samples += batch_size_of(batch)

        def on_train_end(self, trainer, pl_module):
            trainer.strategy.barrier()
            seconds = time.perf_counter() - self.t0 if self.t0 is not None else 0.0
            record = {"rank": trainer.global_rank, "world_size": trainer.world_size, "digests": self.digests,
                      "first_loss": self.first_loss, "timed_samples": self.samples, "timed_seconds": seconds,
                      "samples_per_sec": self.samples / seconds if seconds else None, "steps": self.steps,
                      "threads": torch.get_num_threads(), "strategy": type(trainer.strategy).__name__}
            write_json(os.path.join(out_dir, f"rank{trainer.global_rank}.json"), record)
            if trainer.is_global_zero:
                state = {k: v.detach().cpu().float() for k, v in pl_module.state_dict().items()
                         if v.is_floating_point()}
                torch.save(state, os.path.join(out_dir, "weights.pt"))

    return Probe()


def run_one(args) -> None:
    """Inside the launcher, every rank: fit the user's module under args.run."""
    import lightning.pytorch as pl
    import torch

    import hvdtrain.lightning  # noqa: F401  - registers "horovod"
    from hvdtrain.cluster.env import ClusterEnv
    from hvdtrain.runtime import threads_per_rank

    build_module = plugins.load(args.module, "--module")
    build_data = plugins.load(args.datamodule, "--datamodule") if args.datamodule else None
    pl.seed_everything(args.seed, verbose=False)
    module = plugins.call(build_module, args.module, "--module")
    data = plugins.call(build_data, args.datamodule, "--datamodule") if build_data else None
    env = ClusterEnv.from_environ()  # the launcher's ranks, as the trainers read them
    per_node, world = env.local_world_size, env.world_size
    gpu = torch.cuda.is_available()
    trainer = pl.Trainer(strategy=args.run, accelerator="gpu" if gpu else "cpu", devices=per_node,
                         num_nodes=max(1, world // per_node), max_epochs=args.max_epochs, max_steps=args.max_steps,
                         precision=args.precision, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                         limit_val_batches=0, deterministic=args.deterministic,
                         callbacks=[make_probe(args.out, args.warmup_steps, threads_per_rank(args.threads, per_node))])
    trainer.fit(module, datamodule=data)
    if torch.distributed.is_initialized():
        # DDP's process group ended here, not by the interpreter's exit, where its Gloo threads can
        # still be joinable and a rank then aborts ("terminate called without an active exception").
        torch.distributed.destroy_process_group()


# ---------------------------------------------------------------------------------------- the comparison
def compare_records(runs: dict[str, list[dict]], weights: dict[str, dict], tolerance: float) -> dict:
    """Parity between the strategies' first repeats ({strategy: [rank records]}, {strategy: rank 0's
    float tensors}): the same batches on every rank, the same first losses, final weights within
    `tolerance` (the largest relative distance of one tensor)."""
    a, b = STRATEGIES
    problems = []
    ranks_a, ranks_b = sorted(runs[a], key=lambda r: r["rank"]), sorted(runs[b], key=lambda r: r["rank"])
    if [r["rank"] for r in ranks_a] != [r["rank"] for r in ranks_b]:
        problems.append(f"the runs have other ranks: {a} {len(ranks_a)}, {b} {len(ranks_b)}")
    samples_equal = all(x["digests"] == y["digests"] for x, y in zip(ranks_a, ranks_b))
    if not samples_equal:
        differ = [x["rank"] for x, y in zip(ranks_a, ranks_b) if x["digests"] != y["digests"]]
        problems.append(f"rank(s) {differ} received other batches under {b} than under {a}")
    first = [(x["first_loss"], y["first_loss"]) for x, y in zip(ranks_a, ranks_b)]
    first_equal = all(x is not None and y is not None and abs(x - y) <= 1e-6 * max(1.0, abs(x)) for x, y in first)
    if not first_equal:
        problems.append(f"first losses differ: {a} {[x for x, _ in first]}, {b} {[y for _, y in first]}")
    distance = None
    if weights.get(a) and weights.get(b):
        wa, wb = weights[a], weights[b]
        if set(wa) != set(wb):
            problems.append("rank 0's final weights have other names under the two strategies")
        else:
            distance = max((float((wb[k] - wa[k]).norm() / max(float(wa[k].norm()), 1e-12)) for k in wa), default=0.0)
            if distance > tolerance:
                problems.append(f"final weights {distance:.3g} apart (relative), over the tolerance {tolerance:g}")
    return {"samples_equal": samples_equal, "first_losses": first, "first_losses_equal": first_equal,
            "weights_relative_distance": distance, "tolerance": tolerance, "problems": problems,
            "passed": not problems}


def throughput(records: list[dict]) -> float | None:
    rates = [r["samples_per_sec"] for r in records]
    return sum(rates) if rates and all(rates) else None


def write_markdown(path: str, summary: dict) -> None:
    rates = summary["samples_per_sec"]
    lines = [f"# {summary['module']} under Lightning's ddp and hvdtrain's horovod", "",
             f"{summary['np']} rank(s) via {summary['launcher']}, {summary['repeats']} repeat(s) alternating, "
             f"{summary['warmup_steps']} warm-up step(s) untimed; samples/s summed over ranks, median of repeats.", "",
             "| strategy | samples/s | repeats | vs ddp |", "| --- | --- | --- | --- |"]
    for name in STRATEGIES:
        median, ratio = rates[name]["median"], summary["horovod_over_ddp"]
        lines.append(f"| {name} | {median:.1f} | {', '.join(f'{v:.1f}' for v in rates[name]['repeats'])} | "
                     f"{'1.000' if name == 'ddp' else (f'{ratio:.3f}' if ratio else '-')} |"
                     if median else f"| {name} | - | - | - |")
    p = summary["parity"]
    distance = p["weights_relative_distance"]
    lines += ["", "## Parity (first repeat)", "",
              f"- each rank's first {DIGESTED_BATCHES} batches: {'the same' if p['samples_equal'] else 'DIFFER'}",
              f"- first losses: {'the same' if p['first_losses_equal'] else 'DIFFER'} ({p['first_losses']})",
              f"- rank 0's final weights: {'-' if distance is None else f'{distance:.3g}'} apart (tolerance "
              f"{p['tolerance']:g})", "", "PASSED" if p["passed"] else "FAILED: " + "; ".join(p["problems"])]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def drive(args) -> int:
    import torch

    launcher = args.launcher if args.launcher != "auto" else ("srun" if os.environ.get("SLURM_JOB_ID") else "mpirun")
    os.makedirs(args.out, exist_ok=True)
    per_node = args.np if launcher != "srun" else None
    records: dict[str, list[list[dict]]] = {name: [] for name in STRATEGIES}
    weights = {}
    passthrough = ["--module", args.module, *(["--datamodule", args.datamodule] if args.datamodule else []),
                   "--max-epochs", str(args.max_epochs), "--max-steps", str(args.max_steps),
                   "--precision", args.precision, "--warmup-steps", str(args.warmup_steps), "--seed", str(args.seed),
                   *(["--threads", str(args.threads)] if args.threads else []),
                   *(["--deterministic"] if args.deterministic else [])]
    for repeat in range(args.repeats):
        for name in STRATEGIES:
            out = os.path.join(args.out, f"{name}-{repeat}")
            os.makedirs(out, exist_ok=True)
            cmd = [*launch_command(launcher, args.np, tasks_per_node=per_node), sys.executable, "-m",
                   "hvdtrain.lightning.compare", "--run", name, "--out", out, *passthrough]
            print(f"[{PROG}] {name}, repeat {repeat + 1}/{args.repeats}: {' '.join(cmd)}", flush=True)
            with open(os.path.join(out, "log.txt"), "w") as log:
                done = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=launch_env(),
                                      timeout=args.timeout)
            if done.returncode != 0:
                with open(os.path.join(out, "log.txt")) as f:
                    tail = f.read()[-3000:]
                raise UsageError(f"the {name} run failed (exit {done.returncode}); its log {out}/log.txt ends:\n{tail}")
            ranks = [json.load(open(os.path.join(out, f))) for f in sorted(os.listdir(out)) if f.startswith("rank")]
            records[name].append(ranks)
            if repeat == 0:
                weights[name] = torch.load(os.path.join(out, "weights.pt"), weights_only=True)
    rates = {name: [throughput(r) for r in records[name]] for name in STRATEGIES}
    medians = {name: statistics.median(v) if all(v) else None for name, v in rates.items()}
    summary = {"module": args.module, "datamodule": args.datamodule, "np": args.np, "launcher": launcher,
               "repeats": args.repeats, "warmup_steps": args.warmup_steps,
               "samples_per_sec": {name: {"median": medians[name], "repeats": rates[name]} for name in STRATEGIES},
               "horovod_over_ddp": medians["horovod"] / medians["ddp"] if medians["horovod"] and medians["ddp"] else None,
               "parity": compare_records({name: records[name][0] for name in STRATEGIES}, weights, args.tolerance),
               "runs": records}
    write_json(os.path.join(args.out, "compare.json"), summary)
    write_markdown(os.path.join(args.out, "compare.md"), summary)
    with open(os.path.join(args.out, "compare.md")) as f:
        print(f.read(), end="")
    return 0 if summary["parity"]["passed"] else 1


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog=f"python -m {PROG}", description=__doc__.split("\n\n")[0])
    p.add_argument("--module", required=True, help="FILE.py:FUNCTION (or package.module:FUNCTION) returning your "
                                                   "LightningModule")
    p.add_argument("--datamodule", help="FILE.py:FUNCTION returning your LightningDataModule (default: the module's "
                                        "own dataloaders)")
    p.add_argument("--np", type=int, default=2, help="ranks (default 2)")
    p.add_argument("--launcher", default="auto", choices=("auto", "mpirun", "srun"))
    p.add_argument("--max-epochs", type=int, default=1)
    p.add_argument("--max-steps", type=int, default=-1)
    p.add_argument("--precision", default="32-true")
    p.add_argument("--warmup-steps", type=int, default=5, help="untimed steps at the start (default 5)")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--threads", type=int, help="torch threads per rank (default: the rank's cores)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--deterministic", action="store_true", help="Trainer(deterministic=True) in both")
    p.add_argument("--tolerance", type=float, default=1e-3, help="largest relative distance of rank 0's final "
                                                                 "weights between the strategies (default 1e-3)")
    p.add_argument("--timeout", type=float, default=3600, help="seconds a run may take (default 3600)")
    p.add_argument("--out", default="runs/lightning-compare")
    p.add_argument("--run", choices=STRATEGIES, help=argparse.SUPPRESS)  # a rank of one run
    args = p.parse_args(argv)
    try:
        if args.run:
            run_one(args)
        else:
            sys.exit(drive(args))
    except UsageError as err:
        report_and_exit(err, PROG)


if __name__ == "__main__":
    main()
