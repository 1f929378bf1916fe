"""What interval checkpoints cost a training step, written inline or in the background, side by
side in one run (issue 38): ResNet-50 on the CPU with 32x32 images, whose state (weights and
momentum, 205 MB) is large relative to its step, as a big model's is to its GPU step.

    python benchmarks/checkpoint_write.py                   # about 4 minutes on 2 cores
    python benchmarks/checkpoint_write.py --steps 300 --every 50 --repeats 3

Each run is `python -m hvdtrain.torch` (one rank, --threads-per-rank compute threads, the rest of
the machine free for the writer's thread, as on a GPU node); the three ways are alternated in each
repeat so that a noisy spell of this shared machine hits them alike, and the median is printed.
The cost is the step time against the run without interval checkpoints: the steps are timed by
the trainer's meter, checkpoints in between included.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

WAYS = {"none": [], "inline": ["--checkpoint-write", "inline"], "background": ["--checkpoint-write", "background"]}


def run(way: str, args, work: str) -> float:
    """img/s of one run."""
    ckpt, result = os.path.join(work, f"ckpt-{way}"), os.path.join(work, f"{way}.json")
    every = [] if way == "none" else ["--checkpoint-every", str(args.every)]
    argv = [sys.executable, "-m", "hvdtrain.torch", "--model", args.model, "--dataset", "synthetic",
            "--image-size", str(args.image_size), "--batch-size", str(args.batch_size),
            "--synthetic-size", str(args.steps * args.batch_size), "--epochs", "1", "--validation", "off",
            "--threads-per-rank", str(args.threads), "--checkpoint-dir", ckpt, "--keep-checkpoints", "1",
            "--result-json", result, *every, *WAYS[way]]
    subprocess.run(argv, check=True, capture_output=True, text=True)
    rank = json.load(open(result))["ranks"][0]
    subprocess.run(["rm", "-rf", ckpt], check=True)
    return rank["images_per_sec"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="resnet50")
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--every", type=int, default=50, help="--checkpoint-every, in steps")
    p.add_argument("--threads", type=int, default=1, help="compute threads of the rank")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--work", default=None, help="where checkpoints are written (default: a temporary directory)")
    args = p.parse_args()
    work = args.work or tempfile.mkdtemp(prefix="hvdtrain-ckpt-bench-")
    seen = {way: [] for way in WAYS}
    for repeat in range(args.repeats):
        order = list(WAYS) if repeat % 2 == 0 else list(WAYS)[::-1]
        for way in order:
            seen[way].append(run(way, args, work))
            print(f"repeat {repeat + 1}: {way:10s} {seen[way][-1]:7.1f} img/s", flush=True)
    base = statistics.median(seen["none"])
    print(f"\n{args.model}, {args.image_size}px, batch {args.batch_size}, {args.steps} steps, a checkpoint every "
          f"{args.every} steps, {args.threads} compute thread(s), written to {work}:")
    for way in WAYS:
        ips = statistics.median(seen[way])
        print(f"  {way:10s} {ips:7.1f} img/s  step time x{base / ips:.3f} of no interval checkpoints")


if __name__ == "__main__":
    main()
