"""`python -m hvdtrain.predict`: img/s, E(N), the bounding phase and GPU-hours at the GPU counts
asked, from one GPU's step measured by the trainer itself (its result file), for a cluster's
profile, under Horovod and DDP.

    python -m hvdtrain.torch --model resnet50 --dataset synthetic --steps 200 --result-json one.json
    python -m hvdtrain.predict --cluster juwels-booster --from-result one.json --gpus 4 16 64 256
    python -m hvdtrain.predict --cluster juwels-booster --measure "--model resnet50 --dataset synthetic"
    python -m hvdtrain.predict --cluster juwels-booster --from-result one.json --check study/
    python -m hvdtrain.predict --anchors        # the published figures the model reproduces

--measure runs, on the node it is started on (alone: it starts its own ranks), one rank's step,
the doctor's allreduce and the same training on --ranks ranks under Horovod and DDP; it predicts
from the first two and checks the model against the third on this node. --check sets the
prediction beside a scaling study's measured jobs (hvdtrain.compare's directory) on the cluster.

The gradient bytes are the trainer's count in its result file (or --parameters x 4); the input pipeline and the file system enter where given (--input-ms, a GPU's
batch through its decode workers; --sample-kb with the profile's file-system rates)."""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

from hvdtrain.errors import UsageError, report_and_exit
from hvdtrain.predict import anchors, check, model, profiles

IMAGENET_TRAIN = 1_281_167


def load_result(path: str) -> dict:
    """A trainer's result file, or one line saying why it is none."""
    try:
        with open(path) as f:
            result = json.load(f)
        if not isinstance(result, dict) or not isinstance(result.get("config"), dict):
            raise ValueError("no config in it")
        return result
    except (OSError, ValueError) as err:
        raise UsageError(f"--from-result {path}: not a readable hvdtrain result file ({type(err).__name__}: {err})") \
            from None


def workload_from_result(result: dict, path: str, parameters: int | None, input_ms: float,
                         sample_kb: float) -> model.Workload:
    """One GPU's step from a trainer's result file: rank 0's phases (compute: forward and backward;
    the rest of the step but the exchange: the optimizer, the wait for data, the bookkeeping), its
    batch, and the model's gradient bytes."""
    try:
        rank = result["ranks"][0]
        phases, cfg = rank["phases_ms"], result["config"]
        # A step's samples: a rank's batch, times the backward passes it accumulates.
        batch = cfg["per_rank_batch_size"] * cfg.get("batches_per_allreduce", 1)
        ranks = result.get("world_size", len(result["ranks"]))
    except (KeyError, IndexError, TypeError) as err:
        raise UsageError(f"--from-result {path}: not a readable hvdtrain result file ({type(err).__name__}: {err})") \
            from None
    if ranks != 1:
        raise UsageError(f"--from-result {path}: a run of {ranks} ranks; the prediction starts from one GPU's run "
                         "(its exchange and contention are what the model adds)")
    if not phases or not phases.get("compute"):
        raise UsageError(f"--from-result {path}: no step phases in it (a run with timed steps is needed)")
    if parameters is not None:
        gradient_bytes = 4 * parameters
    elif result.get("gradient_bytes"):  # the trainer's own count of what it allreduces
        gradient_bytes = int(result["gradient_bytes"])
    else:
        raise UsageError(f"--from-result {path}: it does not say its gradient bytes (an older hvdtrain, or "
                         "TensorFlow's trainer): give --parameters")
    if cfg.get("fp16_allreduce"):
        gradient_bytes //= 2  # compressed to fp16 for the allreduce
    serial = sum(phases.get(k, 0.0) for k in ("optimizer", "other")) / 1e3
    data = phases.get("data", 0.0) / 1e3
    compute = phases["compute"] / 1e3
    input_s = input_ms / 1e3
    if data > 0.2 * (compute + serial + data):  # the run waited on its input: that path took the step
        input_s = max(input_s, compute + serial + data)
    else:  # short waits, in series with the step
        serial += data
    return model.Workload(batch=batch, compute_s=compute, optimizer_s=serial, gradient_bytes=gradient_bytes,
                          input_s=input_s, sample_bytes=sample_kb * 1024)


def trainer_args(cfg: dict) -> list[str]:
    """The measured run's model and data as trainer options (the study trains the same): the
    model, the dataset, the batch, and each other that differs from the trainer's default."""
    from hvdtrain.config import TrainConfig

    defaults = {f.name: f.default for f in dataclasses.fields(TrainConfig)}
    args = []
    for key in ("model", "dataset", "data_dir", "batch_size", "image_size", "batches_per_allreduce", "amp",
                "channels_last", "compile", "fp16_allreduce"):
        value = cfg.get(key, defaults.get(key))
        if value in (None, False) or (value == defaults.get(key) and key not in ("model", "dataset", "batch_size")):
            continue
        args += ["--" + key.replace("_", "-")] + ([] if value is True else [str(value)])
    return args


def measured_input(saved: dict, work: model.Workload, cluster: model.Cluster) -> tuple[model.Workload, model.Cluster]:
    """The workload's input time and bytes a sample, and the profile's node read rate (unless it
    gives one), measured on the result's training data (hvdtrain/predict/measure.py)."""
    import os

    from hvdtrain.config import TrainConfig
    from hvdtrain.predict import measure

    cfg = TrainConfig.from_dict(saved)
    if cfg.dataset not in ("imagefolder", "shards"):
        raise UsageError(f"--measure-input reads image files: the result's --dataset is {cfg.dataset}")
    workers_per_gpu = max(1, cluster.cores_per_gpu - 1)  # the trainer's default: the cores less one
    here = max(1, min(len(os.sched_getaffinity(0)) - 1, workers_per_gpu))  # the cores this job may use
    files = measure.data_files(cfg)
    if not files:
        raise UsageError(f"--measure-input: no training files under {cfg.data_dir}")
    # The read first, before the decoding has the files in a cache; as many readers as a node's workers.
    node_gbs = measure.read_rate(files, min(32, workers_per_gpu * cluster.gpus_per_node))
    per_worker, samples = measure.decode_rate(cfg, here)
    sample_bytes = sum(os.path.getsize(p) for p in files) / max(1, samples)
    print(f"measured here: {per_worker:.0f} images/s a decode worker ({here} worker(s)), {workers_per_gpu} a GPU on "
          f"{cluster.name}; {sample_bytes / 1024:.0f} KiB a sample; the file system read at {node_gbs:.2f} GB/s")
    work = dataclasses.replace(work, input_s=work.batch / (per_worker * workers_per_gpu), sample_bytes=sample_bytes)
    if cluster.fs_node_gbs == float("inf") and node_gbs > 0:
        cluster = dataclasses.replace(cluster, fs_node_gbs=node_gbs)
    return work, cluster


def exchanges_of(env: dict, where: str, backends: list[str]) -> dict[str, model.Exchange]:
    """The backends' exchanges as `where` (a measured run, or this environment for --measure's
    runs) has them (model.exchanges_in); Horovod's said when not its defaults."""
    try:
        exchanges = model.exchanges_in(env)
    except ValueError as err:
        if "horovod" not in backends:
            return {**model.EXCHANGES}
        raise UsageError(f"{where}: {err}") from None
    horovod = exchanges["horovod"]
    if "horovod" in backends and horovod != model.HOROVOD:
        print(f"(Horovod as {where} has it: fusion threshold {horovod.bucket_bytes / 2**20:g} MiB, "
              f"cycle {horovod.cycle_s * 1e3:g} ms)")
    return exchanges


def predict(work: model.Workload, cluster: model.Cluster, gpus: list[int], backends: list[str], samples: int,
            epochs: int, exchanges: dict[str, model.Exchange] = model.EXCHANGES) -> dict:
    rows = []
    for backend in backends:
        for n in gpus:
            s = model.step(work, n, cluster, exchanges[backend])
            hours = model.gpu_hours_per_epoch(samples, s)
            rows.append({"backend": backend, "gpus": n, "images_per_s": s.images_per_s, "efficiency": s.efficiency,
                         "bound": s.bound, "exposed_exchange_ms": 1e3 * s.exposed_s, "gpu_hours_per_epoch": hours,
                         "hours_to_train": hours * epochs / n})
    return {"cluster": cluster.name, "cluster_sources": list(cluster.sources), "workload": dataclasses.asdict(work),
            "exchanges": {b: dataclasses.asdict(exchanges[b]) for b in backends},
            "samples_per_epoch": samples, "epochs": epochs, "rows": rows, "blind": model.BLIND}


def table(prediction: dict) -> str:
    lines = [f"{prediction['cluster']}: {prediction['epochs']} epoch(s) of {prediction['samples_per_epoch']:,} samples",
             f"{'backend':8s} {'GPUs':>5s} {'img/s':>10s} {'E(N)':>6s} {'bound by':>12s} {'exposed ms':>10s} "
             f"{'GPU-h/epoch':>11s} {'hours':>8s}"]
    for r in prediction["rows"]:
        lines.append(f"{r['backend']:8s} {r['gpus']:5d} {r['images_per_s']:10.0f} {r['efficiency']:6.2f} "
                     f"{r['bound']:>12s} {r['exposed_exchange_ms']:10.1f} {r['gpu_hours_per_epoch']:11.2f} "
                     f"{r['hours_to_train']:8.2f}")
    lines.append(f"(the model is {prediction['blind']})")
    return "\n".join(lines)


def check_command(prediction: dict, cluster: model.Cluster, trainer_args: list[str]) -> str:
    """The scaling study that checks the prediction on the cluster (hvdtrain.compare's, on Slurm)."""
    import shlex

    nodes = sorted({-(-r["gpus"] // cluster.gpus_per_node) for r in prediction["rows"]})  # whole nodes
    backends = ",".join({"horovod": "horovod-torch", "ddp": "ddp"}[b] for b in dict.fromkeys(
        r["backend"] for r in prediction["rows"]))
    preset = f" --preset {cluster.slurm_preset}" if cluster.slurm_preset else ""
    return (f"check it on the cluster: python -m hvdtrain.compare --nodes {','.join(map(str, nodes)) or '1'} "
            f"--backends {backends} --train-args {shlex.quote(' '.join(trainer_args))} --out study --{preset} "
            "--account ... --time 30")


def plot(prediction: dict, path: str) -> None:
    """img/s against the ideal, and E(N), for each backend: a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (rate, eff) = plt.subplots(1, 2, figsize=(10, 4))
    for backend in dict.fromkeys(r["backend"] for r in prediction["rows"]):
        rows = [r for r in prediction["rows"] if r["backend"] == backend]
        gpus = [r["gpus"] for r in rows]
        rate.plot(gpus, [r["images_per_s"] for r in rows], "o-", label=backend)
        eff.plot(gpus, [r["efficiency"] for r in rows], "o-", label=backend)
    first = prediction["rows"][0]
    one_gpu = first["images_per_s"] / first["efficiency"] / first["gpus"]  # E(N) is against one GPU
    ideal = [one_gpu * n for n in sorted({r["gpus"] for r in prediction["rows"]})]
    rate.plot(sorted({r["gpus"] for r in prediction["rows"]}), ideal, "k:", label="ideal")
    for ax, label in ((rate, "img/s"), (eff, "E(N)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("GPUs")
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
        ax.legend()
    rate.set_yscale("log")
    eff.set_ylim(0, 1.05)
    fig.suptitle(f"predicted on {prediction['cluster']} (hvdtrain.predict)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def measure_here(args, cluster: model.Cluster) -> dict:
    """--measure's runs on this node (hvdtrain/predict/node.py): their files, the doctor's
    findings, the node as a cluster of its ranks, and the N-rank results by backend."""
    import shlex

    from hvdtrain.predict import node

    launcher = node.launcher_here()
    ranks = args.ranks if args.ranks is not None else max(2, node.gpus_here(launcher))
    if ranks < 2:
        raise UsageError("--ranks: 2 or more (the exchange is what the runs of several ranks measure)")
    runs = node.measure(shlex.split(args.measure), ranks, args.steps, args.out, launcher)
    doctor = read_doctor(runs["doctor"], "this node's doctor")
    return {"runs": runs, "doctor": doctor, "node": node.measured_cluster(cluster, doctor),
            "results": [(backend, node.load_json(runs[backend])) for backend in ("horovod", "ddp")]}


def read_doctor(path: str, what: str) -> dict:
    """A doctor's --json, its problems said; one line where it is none."""
    from hvdtrain.predict import node

    try:
        doctor = node.load_json(path)
        problems = doctor["problems"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise UsageError(f"{what}: {path} is not a file of python -m hvdtrain.doctor --json "
                         f"({type(err).__name__}: {err})") from None
    if problems:
        print(f"({what} found {'; '.join(problems)})")
    return doctor


def doctor_figures(cluster: model.Cluster, doctor: dict, what: str) -> model.Cluster:
    """The profile with a doctor's measured figures (--doctor, or --measure's), said in one line."""
    from hvdtrain.predict import node

    try:
        measured = node.measured_cluster(cluster, doctor)
    except (ValueError, KeyError, TypeError) as err:
        raise UsageError(f"{what}: not the figures of python -m hvdtrain.doctor --json "
                         f"({type(err).__name__}: {err})") from None
    if cluster.overlap and not measured.overlap:
        print(f"({what}: measured on CPU ranks, so the prediction lets nothing overlap; for a GPU cluster run the "
              "doctor on its GPU nodes)")
    hosts = len(doctor["hosts"])
    if hosts == 1:  # within a node: the figures only, the profile's node kept
        print(f"({what}: within a node {measured.intra_busbw_gbs:.2f} GB/s busbw, "
              f"{measured.intra_latency_s * 1e6:.0f} us a ring step, measured)")
        return dataclasses.replace(cluster, intra_busbw_gbs=measured.intra_busbw_gbs,
                                   intra_latency_s=measured.intra_latency_s, overlap=cluster.overlap and measured.overlap,
                                   sources=measured.sources)
    print(f"({what}: across {hosts} nodes {measured.inter_busbw_gbs:.2f} GB/s busbw, "
          f"{measured.inter_latency_s * 1e6:.0f} us a ring step, measured)")
    return measured


def finite(value):
    """JSON without Infinity (an unset file-system rate): None in its place."""
    if isinstance(value, float) and value == float("inf"):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def anchor_table() -> str:
    lines = ["Horovod's published scaling (tf_cnn_benchmarks, 4 Pascal GPUs a server, 25 Gbit/s RoCE), reproduced:",
             f"{'model':14s} {'GPUs':>5s} {'published':>9s} {'predicted':>9s} {'points':>7s}"]
    for a in anchors.horovod_benchmark():
        lines.append(f"{a.model:14s} {a.gpus:5d} {a.published:9.2f} {a.predicted:9.3f} {a.distance_points:+7.1f}")
    return "\n".join(lines)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m hvdtrain.predict", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cluster", help=f"a profile ({', '.join(profiles.names())}) or your own .toml")
    p.add_argument("--from-result", help="a result file of python -m hvdtrain.torch on one GPU (--result-json)")
    p.add_argument("--parameters", type=int, help="the model's trainable parameters, float32 gradients (default: "
                                                  "the result file's gradient bytes)")
    p.add_argument("--gpus", type=int, nargs="+", default=[4, 8, 16, 32, 64, 128, 256, 512])
    p.add_argument("--backends", nargs="+", default=["horovod", "ddp"], choices=sorted(model.EXCHANGES))
    p.add_argument("--samples", type=int, default=IMAGENET_TRAIN, help="samples an epoch (default: ImageNet's)")
    p.add_argument("--epochs", type=int, default=90)
    p.add_argument("--input-ms", type=float, default=0.0, help="one GPU's batch through its decode workers, ms")
    p.add_argument("--sample-kb", type=float, default=0.0, help="KiB read from the file system per sample")
    p.add_argument("--measure-input", action="store_true",
                   help="measure the result's training data here, through the trainer's loader: images/sec a decode "
                        "worker and the file system's read rate (run it on a compute node of the cluster)")
    p.add_argument("--measure", metavar="TRAIN_ARGS",
                   help="measure here first, with these options of python -m hvdtrain.torch (e.g. \"--model resnet50 "
                        "--dataset synthetic --batch-size 64\"): one rank's step, the doctor's allreduce and --ranks "
                        "ranks under Horovod and DDP (the model's check on this node); instead of --from-result")
    p.add_argument("--doctor", nargs="+", default=[], metavar="JSON",
                   help="the doctor's measurements on the cluster (python -m hvdtrain.doctor --json) replace the "
                        "profile's estimates: run on one node, the bandwidth within a node; on two, the network's")
    p.add_argument("--ranks", type=int, help="ranks of --measure's runs (default: this node's GPUs, else 2)")
    p.add_argument("--steps", type=int, default=100, help="optimizer steps of each --measure run")
    p.add_argument("--out", default="predict", help="--measure's result files and logs go here")
    p.add_argument("--check", metavar="STUDY_DIR",
                   help="set the prediction beside a scaling study's measured jobs (python -m hvdtrain.compare's "
                        "--out on the cluster): img/s, the exchange left exposed, the error")
    p.add_argument("--json", help="the prediction as JSON here")
    p.add_argument("--png", help="img/s and E(N) against GPUs, plotted here")
    p.add_argument("--anchors", action="store_true", help="the published figures the model reproduces")
    args = p.parse_args(argv)
    try:
        if args.anchors:
            print(anchor_table())
            return
        if not args.cluster or bool(args.from_result) == bool(args.measure):
            raise UsageError("give --cluster and one of --from-result or --measure (or --anchors)")
        if any(n < 1 for n in args.gpus):
            raise UsageError("--gpus: counts of at least 1")
        cluster = profiles.load(args.cluster)
        for path in args.doctor:
            cluster = doctor_figures(cluster, read_doctor(path, f"--doctor {path}"), f"--doctor {path}")
        measured = None
        if args.measure:  # its runs inherit this environment: said or refused now, not after them
            exchanges = exchanges_of(dict(os.environ), "this environment", args.backends)
            measured = measure_here(args, cluster)
        from_result = measured["runs"]["one"] if measured else args.from_result
        result = load_result(from_result)
        work = workload_from_result(result, from_result, args.parameters, args.input_ms, args.sample_kb)
        if not measured:
            exchanges = exchanges_of((result.get("environment") or {}).get("env") or {},
                                     f"the run of --from-result {from_result}", args.backends)
        if measured:
            if measured["node"].overlap:  # GPU ranks: their figures are the cluster's node's
                cluster = doctor_figures(cluster, measured["doctor"], "this node's doctor")
            else:
                print(f"(measured on CPU ranks: {cluster.name}'s own figures within a node are kept; this node's "
                      f"{measured['node'].intra_busbw_gbs:.2f} GB/s serves the check here only)")
            measured["check"] = check.check_rows(work, measured["node"], measured["results"], exchanges)
        if args.measure_input:
            work, cluster = measured_input(result["config"], work, cluster)
        if work.sample_bytes and cluster.fs_node_gbs == float("inf") and cluster.fs_aggregate_gbs == float("inf"):
            print(f"(--sample-kb: {cluster.name} gives no file-system rate, so the file system is not modelled; "
                  "--measure-input measures this node's, or set fs_node_gbs and fs_aggregate_gbs in a profile)")
        prediction = predict(work, cluster, sorted(set(args.gpus)), args.backends, args.samples, args.epochs,
                             exchanges)
        if measured:
            print(check.check_table(measured["check"], f"the model on {measured['node'].name}, against its runs "
                                                       f"({args.out}):"))
            prediction["measured_here"] = {"runs": measured["runs"], "node": dataclasses.asdict(measured["node"]),
                                           "check": measured["check"]}
        print(table(prediction))
        if args.check:
            rows = check.check_rows(work, cluster, check.study_results(args.check, work.batch))
            print(check.check_table(rows, f"the prediction against the study in {args.check}:") if rows else
                  f"(--check {args.check}: no finished Horovod (torch) or DDP job of 2 or more ranks there yet)")
            prediction["study_check"] = rows
        print(check_command(prediction, cluster, trainer_args(result["config"])))
        if args.png:
            plot(prediction, args.png)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(finite(prediction), f, indent=2)
    except UsageError as err:
        report_and_exit(err, "hvdtrain.predict")


if __name__ == "__main__":
    main(sys.argv[1:])
