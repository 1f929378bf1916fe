"""Where Horovod's cycles go on a busy CPU node, and what hvdtrain's settings win back.

    python benchmarks/horovod_overhead.py --repeats 2 --out runs/overhead

Runs, side by side in one invocation and alternated within each repeat, the same ResNet-18
workload (batch 16 per rank, 224x224, one compute thread per rank, synthetic data):

  compute-np1        one process, no Horovod                  (the unit)
  compute-x2         two independent processes, no Horovod    (the ceiling for 2 ranks)
  hvd-idle-x2        two processes after hvd.init(), no collective, Horovod defaults
  hvd-idle-x2-tuned  the same with hvdtrain's settings         (the idle loop's cost)
  hvd-idle-x2-tuned-cycle10  the same with a 10 ms cycle        (is it the wake-ups?)
  allreduce-only-np2-tuned  only the step's gradient allreduce, no compute (its img/s: batch / allreduce time)
  sequential-np2-tuned  backward, then one grouped allreduce: compute and communication not overlapped
  raw-hvd-np2        Horovod's synthetic-benchmark loop (torch_examples/synthetic_benchmark.py), defaults
  raw-hvd-np2-tuned  the same loop with hvdtrain's settings
  hvdtrain-np1/np2   python -m hvdtrain.torch (auto settings)
  hvdtrain-np2-untuned  python -m hvdtrain.torch --horovod-tuning off
  ddp-np2            python -m hvdtrain.torch --backend ddp

and prints img/s (median over repeats) and the ratios the targets are stated in. Numbers are
benchmark output, never test assertions: shared machines are noisy.
"""
from __future__ import annotations

import json
import os
import re
import statistics
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
from hvdtrain.launch import launch_env  # noqa: E402
from hvdtrain.cluster.tuning import horovod_settings  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from alternate import medians, mpirun, parse_args, run_alternated  # noqa: E402

PY = sys.executable
TUNED = horovod_settings("auto", on_cpu=True)


def configs(a):
    probe = [PY, os.path.join(REPO, "benchmarks", "overhead_probe.py"), "--steps", str(a.steps),
             "--batch-size", str(a.batch_size), "--image-size", str(a.image_size)]
    raw = [PY, os.path.join(REPO, "torch_examples", "synthetic_benchmark.py"), "--model", "resnet18",
           "--steps", str(a.steps), "--batch-size", str(a.batch_size), "--image-size", str(a.image_size),
           "--threads", "1"]
    trainer = [PY, "-m", "hvdtrain.torch", "--model", "resnet18", "--dataset", "synthetic", "--steps",
               str(a.steps + 2), "--warmup-steps", "2", "--batch-size", str(a.batch_size), "--image-size",
               str(a.image_size), "--synthetic-size", "256", "--threads-per-rank", "1", "--log-interval", "1000"]
    def result(name):  # every rank's throughput, from the trainer's result file
        return ["--result-json", os.path.join(a.out, f"{name}.json")]

    return {
        "compute-np1": (mpirun(1) + probe + ["--mode", "compute"], "probe"),
        "compute-x2": (mpirun(2) + probe + ["--mode", "compute"], "probe"),
        "hvd-idle-x2": (mpirun(2) + probe + ["--mode", "idle"], "probe"),
        "hvd-idle-x2-tuned": (mpirun(2, TUNED) + probe + ["--mode", "idle"], "probe"),
        "hvd-idle-x2-tuned-cycle10": (mpirun(2, {**TUNED, "HOROVOD_CYCLE_TIME": "10"}) + probe + ["--mode", "idle"],
                                      "probe"),
        "allreduce-only-np2-tuned": (mpirun(2, TUNED) + probe + ["--mode", "allreduce"], "probe"),
        "sequential-np2-tuned": (mpirun(2, TUNED) + probe + ["--mode", "sequential"], "probe"),
        "raw-hvd-np2": (mpirun(2) + raw, "raw"),
        "raw-hvd-np2-tuned": (mpirun(2, TUNED) + raw, "raw"),
        "hvdtrain-np1": (mpirun(1) + trainer + result("hvdtrain-np1"), "trainer"),
        "hvdtrain-np2": (mpirun(2) + trainer + result("hvdtrain-np2"), "trainer"),
        "hvdtrain-np2-untuned": (mpirun(2) + trainer + ["--horovod-tuning", "off"] + result("hvdtrain-np2-untuned"),
                                 "trainer"),
        "ddp-np2": (mpirun(2) + trainer + ["--backend", "ddp"] + result("ddp-np2"), "trainer"),
    }


def parse(kind, out, result_path=None):
    """(total img/s, other-threads CPU in cores per rank or None) from a run's output."""
    if kind == "probe":
        rows = re.findall(r"PROBE rank=\d+ img/s=([0-9.]+) other_threads_cpu=([0-9.]+)", out)
        return sum(float(r[0]) for r in rows), statistics.mean(float(r[1]) for r in rows)
    if kind == "raw":
        return float(re.search(r"total: ([0-9.]+) img/s", out).group(1)), None
    with open(result_path) as f:
        return json.load(f)["throughput"]["total_images_per_sec"], None


def main():
    a = parse_args(__doc__, steps=6, out="runs/overhead")
    env = launch_env(TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=REPO)
    for key in TUNED:  # the untuned runs must not inherit a setting from this shell
        env.pop(key, None)
    table = configs(a)
    names = a.only.split(",") if a.only else list(table)
    results, cpu = run_alternated(table, names, a.repeats, env, parse, a.out, REPO,
                                  describe=lambda other: f", other threads {other:.2f} core/rank")
    med = medians(results)

    def ratio(x, y, scale=1.0):
        return med[x] / (scale * med[y]) if x in med and y in med else None

    ratios = {
        "ceiling: compute-x2 / (2 x compute-np1)": ratio("compute-x2", "compute-np1", 2),
        "idle cost: hvd-idle-x2 / compute-x2": ratio("hvd-idle-x2", "compute-x2"),
        "idle cost tuned: hvd-idle-x2-tuned / compute-x2": ratio("hvd-idle-x2-tuned", "compute-x2"),
        "raw Horovod efficiency: raw-hvd-np2 / (2 x compute-np1)": ratio("raw-hvd-np2", "compute-np1", 2),
        "hvdtrain vs DDP: hvdtrain-np2 / ddp-np2 (target >= 1)": ratio("hvdtrain-np2", "ddp-np2"),
        "hvdtrain efficiency: hvdtrain-np2 / (2 x hvdtrain-np1) (target >= 0.90)": ratio("hvdtrain-np2", "hvdtrain-np1", 2),
        "wrapper cost: hvdtrain-np2 / raw-hvd-np2-tuned (target >= 0.98)": ratio("hvdtrain-np2", "raw-hvd-np2-tuned"),
        "tuning gain: hvdtrain-np2 / hvdtrain-np2-untuned": ratio("hvdtrain-np2", "hvdtrain-np2-untuned"),
        "tuning gain raw: raw-hvd-np2-tuned / raw-hvd-np2": ratio("raw-hvd-np2-tuned", "raw-hvd-np2"),
        # Rates are batch / time per step, so a rate ratio is the inverse time ratio.
        "allreduce time / step time: hvdtrain-np2 / allreduce-only-np2-tuned": ratio("hvdtrain-np2",
                                                                                       "allreduce-only-np2-tuned"),
        "overlap gain: hvdtrain-np2 / sequential-np2-tuned": ratio("hvdtrain-np2", "sequential-np2-tuned"),
    }
    lines = [f"ResNet-18, batch {a.batch_size}, {a.image_size}x{a.image_size}, 1 thread per rank, "
             f"{a.steps} timed steps, median of {a.repeats}; hvdtrain settings: {TUNED}", "",
             "| config | total img/s (median) | runs | other threads, cores per rank |", "|---|---|---|---|"]
    for n in names:
        if n in med:
            c = f"{statistics.mean(cpu[n]):.2f}" if cpu[n] else ""
            lines.append(f"| {n} | {med[n]:.2f} | {' '.join(f'{v:.1f}' for v in results[n])} | {c} |")
    lines += ["", "| ratio | value |", "|---|---|"]
    lines += [f"| {k} | {v:.3f} |" for k, v in ratios.items() if v is not None]
    report = "\n".join(lines)
    print("\n" + report)
    with open(os.path.join(a.out, "overhead.md"), "w") as f:
        f.write(report + "\n")
    with open(os.path.join(a.out, "overhead.json"), "w") as f:
        json.dump({"runs": results, "other_threads_cpu": cpu, "median": med, "ratios": ratios,
                   "settings": TUNED, "args": vars(a)}, f, indent=2)


if __name__ == "__main__":
    main()
