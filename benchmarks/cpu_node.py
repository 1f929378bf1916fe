"""CPU nodes: hvdtrain's image input against the pipeline of Horovod's ImageNet example, side by
side in one run, on the set-up of docs/data.md's CPU-node figures: 2 ranks x 1 decode worker on 2 cores, ImageNet-sized
JPEGs (500x375) cropped to 224 px, one epoch, a model too small to matter (the input is what is
measured), from a folder and from shards.

    python benchmarks/cpu_node.py --out /tmp/cpu-node            # about 5 minutes on 2 cores
    python benchmarks/cpu_node.py --images 3072 --repeats 2

Each repeat runs every pipeline once, in turn (a noisy spell hits all alike); the median img/s
of the repeats and its ratio to Horovod's example are printed. Horovod's example runs under the
Open MPI setting hvdtrain gives a CPU rank (yield when idle), and once more as it comes. hvdtrain
runs with its defaults for a CPU device (the decode workers normalise; no feeder thread on a rank with no core to spare).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, REPO)
sys.path.insert(0, HERE)

from hvdtrain.launch import launch_command, launch_env  # noqa: E402
from hvdtrain.cluster.tuning import horovod_settings  # noqa: E402


def tiny_model():
    """Pooled to 8x8, one linear layer: microseconds a batch, whatever the pipeline."""
    import torch.nn as nn

    return nn.Sequential(nn.AdaptiveAvgPool2d(8), nn.Flatten(), nn.Linear(3 * 8 * 8, 10))


def run(command: list[str], result: str, **env: str) -> float:
    done = subprocess.run(command, capture_output=True, text=True, timeout=1800, cwd=REPO,
                          env=launch_env(PYTHONPATH=REPO, CUDA_VISIBLE_DEVICES="", PYTHONUNBUFFERED="1", **env))
    if done.returncode:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    with open(result) as f:
        report = json.load(f)
    return report["throughput"]["total_images_per_sec"] if "throughput" in report else report["total_images_per_sec"]


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="/tmp/hvdtrain-cpu-node")
    p.add_argument("--images", type=int, default=3072)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--workers", type=int, default=1, help="decode workers per rank")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--json", help="also write the figures here")
    args = p.parse_args(argv)

    from data_pipeline import jpeg_folder_and_shards

    folder, shard_dir, kb = jpeg_folder_and_shards(args.out, args.images)
    model = f"{os.path.abspath(__file__)}:tiny_model"
    mpirun = launch_command("mpirun", args.ranks)
    result = os.path.join(args.out, "result.json")
    horovod = [*mpirun, sys.executable, os.path.join(HERE, "horovod_example_pipeline.py"), os.path.join(folder, "train"),
               "--model", model, "--batch-size", str(args.batch_size), "--workers", str(args.workers), "--out", result]

    def hvdtrain(dataset, data_dir):
        return [*mpirun, sys.executable, "-m", "hvdtrain.torch", "--model", model, "--dataset", dataset,
                "--data-dir", data_dir, "--image-size", "224", "--batch-size", str(args.batch_size), "--epochs", "1",
                "--threads-per-rank", "1", "--num-workers", str(args.workers), "--validation", "off",
                "--untimed-steps", "3", "--base-lr", "0.01", "--result-json", result]

    # The example under the Horovod settings hvdtrain gives a CPU rank (hvdtrain/cluster/tuning.py: Open
    # MPI yields its core when idle), so that the input pipelines alone differ; and as it comes.
    tuned = horovod_settings("auto", on_cpu=True)
    pipelines = {"horovod_example_folder": (horovod, tuned), "horovod_example_folder_untuned": (horovod, {}),
                 "hvdtrain_folder": (hvdtrain("imagefolder", folder), {}),
                 "hvdtrain_shards": (hvdtrain("shards", shard_dir), {})}
    rates = {name: [] for name in pipelines}
    for repeat in range(args.repeats):
        for name, (command, env) in pipelines.items():
            rates[name].append(run(command, result, **env))
            print(f"cpu_node: repeat {repeat + 1}: {name} {rates[name][-1]:.1f} img/s", flush=True)
    median = {name: statistics.median(r) for name, r in rates.items()}
    base = median["horovod_example_folder"]
    figures = {"images": args.images, "jpeg_kb": round(kb, 1), "ranks": args.ranks, "workers": args.workers,
               "img_per_s": {k: round(v, 1) for k, v in median.items()},
               "ratio_to_horovod_example": {k: round(v / base, 2) for k, v in median.items()}, "runs": rates}
    print(json.dumps(figures, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=1)


if __name__ == "__main__":
    main()
