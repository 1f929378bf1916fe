"""`python -m hvdtrain.predict`: img/s, E(N), the bounding phase and GPU-hours at the GPU counts
asked, from one GPU's step measured by the trainer itself (its result file), for a cluster's
profile, under Horovod and DDP.

    python -m hvdtrain.torch --model resnet50 --dataset synthetic --steps 200 --result-json one.json
    python -m hvdtrain.predict --cluster juwels-booster --from-result one.json --gpus 4 16 64 256
    python -m hvdtrain.predict --anchors        # the published figures the model reproduces

The gradient bytes come from the model's parameters (built from the result's config, or
--parameters); the input pipeline and the file system enter where given (--input-ms, a GPU's
batch through its decode workers; --sample-kb with the profile's file-system rates)."""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from hvdtrain.errors import UsageError, report_and_exit
from hvdtrain.predict import anchors, model, profiles

EXCHANGES = {"horovod": model.HOROVOD, "ddp": model.DDP}
IMAGENET_TRAIN = 1_281_167


def workload_from_result(path: str, parameters: int | None, input_ms: float, sample_kb: float) -> model.Workload:
    """One GPU's step from a trainer's result file: rank 0's phases (compute: forward and backward;
    optimizer), its batch, and the model's gradient bytes."""
    try:
        with open(path) as f:
            result = json.load(f)
        rank = result["ranks"][0]
        phases, cfg = rank["phases_ms"], result["config"]
        batch = cfg["per_rank_batch_size"]
    except (OSError, ValueError, KeyError, IndexError, TypeError) as err:
        raise UsageError(f"--from-result {path}: not a readable hvdtrain result file ({type(err).__name__}: {err})") \
            from None
    if not phases or not phases.get("compute"):
        raise UsageError(f"--from-result {path}: no step phases in it (a run with timed steps is needed)")
    if parameters is None:
        parameters = count_parameters(cfg)
    return model.Workload(batch=batch, compute_s=phases["compute"] / 1e3,
                          optimizer_s=(phases.get("optimizer", 0.0) + phases.get("other", 0.0)) / 1e3,
                          gradient_bytes=4 * parameters, input_s=input_ms / 1e3, sample_bytes=sample_kb * 1024)


def count_parameters(cfg: dict) -> int:
    from hvdtrain.torch.models import build_model

    try:
        built = build_model(cfg["model"], 3, cfg.get("num_classes") or 1000, cfg["image_size"])
    except Exception as err:  # noqa: BLE001 - one line: give --parameters
        raise UsageError(f"cannot build model {cfg.get('model')!r} to count its parameters ({type(err).__name__}: "
                         f"{err}): give --parameters") from None
    return sum(p.numel() for p in built.parameters() if p.requires_grad)


def predict(work: model.Workload, cluster: model.Cluster, gpus: list[int], backends: list[str], samples: int,
            epochs: int) -> dict:
    rows = []
    for backend in backends:
        for n in gpus:
            s = model.step(work, n, cluster, EXCHANGES[backend])
            hours = model.gpu_hours_per_epoch(samples, s)
            rows.append({"backend": backend, "gpus": n, "images_per_s": s.images_per_s, "efficiency": s.efficiency,
                         "bound": s.bound, "exposed_exchange_ms": 1e3 * s.exposed_s, "gpu_hours_per_epoch": hours,
                         "hours_to_train": hours * epochs / n})
    return {"cluster": cluster.name, "cluster_sources": list(cluster.sources), "workload": dataclasses.asdict(work),
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
    p.add_argument("--parameters", type=int, help="the model's trainable parameters (default: counted from the "
                                                  "result's model)")
    p.add_argument("--gpus", type=int, nargs="+", default=[4, 8, 16, 32, 64, 128, 256, 512])
    p.add_argument("--backends", nargs="+", default=["horovod", "ddp"], choices=sorted(EXCHANGES))
    p.add_argument("--samples", type=int, default=IMAGENET_TRAIN, help="samples an epoch (default: ImageNet's)")
    p.add_argument("--epochs", type=int, default=90)
    p.add_argument("--input-ms", type=float, default=0.0, help="one GPU's batch through its decode workers, ms")
    p.add_argument("--sample-kb", type=float, default=0.0, help="KiB read from the file system per sample")
    p.add_argument("--json", help="the prediction as JSON here")
    p.add_argument("--anchors", action="store_true", help="the published figures the model reproduces")
    args = p.parse_args(argv)
    try:
        if args.anchors:
            print(anchor_table())
            return
        if not (args.cluster and args.from_result):
            raise UsageError("give --cluster and --from-result (or --anchors)")
        if any(n < 1 for n in args.gpus):
            raise UsageError("--gpus: counts of at least 1")
        cluster = profiles.load(args.cluster)
        work = workload_from_result(args.from_result, args.parameters, args.input_ms, args.sample_kb)
        prediction = predict(work, cluster, sorted(set(args.gpus)), args.backends, args.samples, args.epochs)
        print(table(prediction))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(prediction, f, indent=2)
    except UsageError as err:
        report_and_exit(err, "hvdtrain.predict")


if __name__ == "__main__":
    main(sys.argv[1:])
