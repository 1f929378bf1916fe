"""--compile against eager, side by side in one run: `python -m hvdtrain.torch` under
`mpirun -np 2` (Horovod), each way alternated in every repeat so that a noisy spell of this
shared machine hits them alike; medians printed.

    python benchmarks/compile_speed.py                          # ResNet-18, 32x32, about 10 minutes on 2 cores
    python benchmarks/compile_speed.py --ways off regions model --steps 200 --repeats 3

Two figures a way: img/s over the timed steps (the trainer's meter, after its warm-up steps,
which are where the compiler runs), and the start's extra seconds against eager (the run's
wall time less its timed seconds, less eager's): what compiling cost. The compiler is
--compile-backend's (inductor: the real one; on a CPU it generates C++ and needs a compiler)."""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(way: str, args, work: str) -> tuple[float, float]:
    """(img/s in all, seconds not timed) of one run."""
    sys.path.insert(0, ROOT)
    from hvdtrain.launch import launch_command, launch_env

    result = os.path.join(work, f"{way}.json")
    argv = [*launch_command("mpirun", args.ranks), sys.executable, "-m", "hvdtrain.torch", "--model", args.model,
            "--dataset", "synthetic", "--image-size", str(args.image_size), "--batch-size", str(args.batch_size),
            "--synthetic-size", str(args.steps * args.batch_size * args.ranks), "--epochs", "1",
            "--validation", "off", "--threads-per-rank", str(args.threads), "--result-json", result,
            "--compile", way, "--compile-backend", args.backend]
    started = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, env=launch_env(dict(os.environ)))
    wall = time.monotonic() - started
    if done.returncode != 0:
        sys.exit(f"{way}: {' '.join(argv)} failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    out = json.load(open(result))
    timed = max(r["timed_seconds"] for r in out["ranks"])
    return out["throughput"]["total_images_per_sec"], wall - timed


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="resnet18")
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--steps", type=int, default=120)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--backend", default="inductor", help="--compile-backend")
    p.add_argument("--ways", nargs="+", default=["off", "regions"], choices=("off", "model", "regions"))
    p.add_argument("--repeats", type=int, default=2)
    args = p.parse_args()
    work = tempfile.mkdtemp(prefix="hvdtrain-compile-bench-")
    seen = {way: [] for way in args.ways}
    for repeat in range(args.repeats):
        for way in (args.ways if repeat % 2 == 0 else args.ways[::-1]):
            seen[way].append(run(way, args, work))
            ips, untimed = seen[way][-1]
            print(f"repeat {repeat + 1}: --compile {way:8s} {ips:7.1f} img/s, {untimed:5.1f} s not timed", flush=True)
    median = {way: (statistics.median(r[0] for r in seen[way]), statistics.median(r[1] for r in seen[way]))
              for way in args.ways}
    base_ips, base_untimed = median[args.ways[0]]
    print(f"\n{args.model}, {args.image_size}px, batch {args.batch_size} a rank, {args.steps} steps, {args.ranks} "
          f"rank(s) x {args.threads} thread(s), {args.backend} (medians of {args.repeats}):")
    for way, (ips, untimed) in median.items():
        print(f"  --compile {way:8s} {ips:7.1f} img/s, x{ips / base_ips:.3f} of --compile {args.ways[0]}; "
              f"start {untimed - base_untimed:+6.1f} s against it")


if __name__ == "__main__":
    main()
