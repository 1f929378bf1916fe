"""What interval checkpoints cost a training step, written inline or in the background, side by
side in one run: ResNet-50 on the CPU with 32x32 images, whose state (weights and
momentum, 205 MB) is large relative to its step, as a big model's is to its GPU step.

    python benchmarks/checkpoint_write.py                   # about 4 minutes on 2 cores
    python benchmarks/checkpoint_write.py --steps 300 --every 50 --repeats 3
    python benchmarks/checkpoint_write.py --model resnet18 --ranks 2 --every 5 --baseline 9c59f8c

--ranks N runs each under `mpirun -np N` (rank 0 writes, every rank waits for it at the next
vote); --baseline REV adds the background way of an earlier commit (a git worktree of it),
alternated with today's: the before and after of a change to the writer, side by side.

Each run is `python -m hvdtrain.torch` (one rank, --threads-per-rank compute threads, the rest of
the machine free for the writer's thread, as on a GPU node); the three ways are alternated in each
repeat so that a noisy spell of this shared machine hits them alike, and the median is printed.
Two figures: the step time against the run without interval checkpoints (the trainer's meter
times the steps, checkpoints in between included; on a shared machine this moves by a few per
cent from run to run), and what the training loop itself waited for checkpoints, per step: the
checkpoint is taken between two steps, where the meter's `data` phase runs, so that phase's
growth over the run without checkpoints is the wait (inline: the whole write; background: the
copy of the state to host memory), which load moves much less.
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
BASELINE = "background@baseline"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(way: str, args, work: str) -> tuple[float, float, float]:
    """(img/s, ms per step, ms of the `data` phase per step) of one run (rank 0's)."""
    ckpt, result = os.path.join(work, f"ckpt-{way}"), os.path.join(work, f"{way}.json")
    every = [] if way == "none" else ["--checkpoint-every", str(args.every)]
    code = args.baseline_tree if way == BASELINE else None
    launch = []
    if args.ranks > 1:
        from hvdtrain.launch import launch_command
        launch = launch_command("mpirun", args.ranks)
    argv = [*launch, sys.executable, "-m", "hvdtrain.torch", "--model", args.model, "--dataset", "synthetic",
            "--image-size", str(args.image_size), "--batch-size", str(args.batch_size),
            "--synthetic-size", str(args.steps * args.batch_size), "--epochs", "1", "--validation", "off",
            "--threads-per-rank", str(args.threads), "--checkpoint-dir", ckpt, "--keep-checkpoints", "1",
            "--result-json", result, *every, *WAYS[way]]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([code or ROOT, *filter(None, [os.environ.get("PYTHONPATH")])]))
    if args.ranks > 1:
        from hvdtrain.launch import launch_env
        env = launch_env(env)
    done = subprocess.run(argv, capture_output=True, text=True, cwd=code or ROOT, env=env)
    if done.returncode != 0:
        sys.exit(f"{way}: {' '.join(argv)} failed:\n{done.stderr[-3000:]}")
    rank = json.load(open(result))["ranks"][0]
    subprocess.run(["rm", "-rf", ckpt], check=True)
    return rank["images_per_sec"], sum(rank["phases_ms"].values()), rank["phases_ms"]["data"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="resnet50")
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--every", type=int, default=50, help="--checkpoint-every, in steps")
    p.add_argument("--threads", type=int, default=1, help="compute threads of the rank")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--work", default=None, help="where checkpoints are written (default: a temporary directory)")
    p.add_argument("--ranks", type=int, default=1, help="ranks, under mpirun when more than 1")
    p.add_argument("--baseline", default=None, help="a commit whose background way runs beside today's")
    args = p.parse_args()
    work = args.work or tempfile.mkdtemp(prefix="hvdtrain-ckpt-bench-")
    sys.path.insert(0, ROOT)
    if args.baseline:
        WAYS[BASELINE] = WAYS["background"]
        args.baseline_tree = os.path.join(work, "baseline")
        subprocess.run(["git", "-C", ROOT, "worktree", "add", "--detach", "-f", args.baseline_tree, args.baseline],
                       check=True, capture_output=True)
    seen = {way: [] for way in WAYS}
    try:
        for repeat in range(args.repeats):
            order = list(WAYS) if repeat % 2 == 0 else list(WAYS)[::-1]
            for way in order:
                seen[way].append(run(way, args, work))
                ips, step_ms, data_ms = seen[way][-1]
                print(f"repeat {repeat + 1}: {way:19s} {ips:7.1f} img/s, {step_ms:6.1f} ms/step, data phase "
                      f"{data_ms:5.1f} ms", flush=True)
    finally:
        if args.baseline:
            subprocess.run(["git", "-C", ROOT, "worktree", "remove", "--force", args.baseline_tree], capture_output=True)
    median = {way: [statistics.median(r[i] for r in seen[way]) for i in range(3)] for way in WAYS}
    base_ips, base_step, base_data = median["none"]
    print(f"\n{args.model}, {args.image_size}px, batch {args.batch_size}, {args.steps} steps, a checkpoint every "
          f"{args.every} steps, {args.ranks} rank(s) x {args.threads} compute thread(s), written to {work} "
          f"(medians of {args.repeats}{'; ' + BASELINE + ': ' + args.baseline if args.baseline else ''}):")
    for way in WAYS:
        ips, _, data_ms = median[way]
        wait = data_ms - base_data
        print(f"  {way:19s} {ips:7.1f} img/s, step time x{base_ips / ips:.3f}; the loop waited {wait:5.1f} ms a step "
              f"for checkpoints: {100 * wait / base_step:4.1f} % of the {base_step:.0f} ms step")


if __name__ == "__main__":
    main()
