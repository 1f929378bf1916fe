"""Where hvdtrain.tf's time goes at 1 and 2 ranks, against the smallest TF loop that does the same.

    python benchmarks/tf_overhead.py --repeats 2 --out runs/tf-overhead

Runs, side by side in one invocation and alternated within each repeat, the same ResNet-18
workload (batch 16 per rank, 224x224, one thread per rank for everything a rank runs, synthetic
data), under `mpirun --bind-to none`:

  minimal-hvd-np1/np2     benchmarks/tf_minimal_loop.py: constant batch, DistributedGradientTape
  minimal-hvd-np2-tuned   the same with hvdtrain's Open MPI settings (mpi_yield_when_idle)
  minimal-hvd-np2-tfdata  the same, its batch fed through tf.data (repeat + prefetch)
  minimal-hvd-np2-tfkeras the same on tf_keras (TF_USE_LEGACY_KERAS=1) instead of Keras 3
  hvdtrain-hvd-np1/np2    python -m hvdtrain.tf --backend horovod (auto settings)
  hvdtrain-hvd-np2-untuned  the same with --horovod-tuning off (Open MPI's busy polling kept)
  minimal-mwms-np1/np2    the minimal loop under MultiWorkerMirroredStrategy
  hvdtrain-mwms-np1/np2   python -m hvdtrain.tf --backend mwms

and prints img/s (median over repeats), the ratio hvdtrain / minimal loop at np 2 and each
one's E(2) = img/s(np 2) / (2 x img/s(np 1)). Numbers are benchmark output, never test
assertions: shared machines are noisy. `--only a,b` runs some configs.
"""
from __future__ import annotations

import json
import os
import re
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
from hvdtrain.launch import launch_env  # noqa: E402
from hvdtrain.cluster.tuning import horovod_settings  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from alternate import medians, mpirun, parse_args, run_alternated  # noqa: E402

PY = sys.executable
TUNED = horovod_settings("auto", on_cpu=True)  # what hvdtrain exports on such a rank


def configs(a):
    minimal = [PY, os.path.join(REPO, "benchmarks", "tf_minimal_loop.py"), "--model", "resnet18", "--steps",
               str(a.steps), "--batch-size", str(a.batch_size), "--image-size", str(a.image_size), "--threads", "1"]
    trainer = [PY, "-m", "hvdtrain.tf", "--model", "resnet18", "--dataset", "synthetic", "--loop", "custom",
               "--steps", str(a.steps + 2), "--warmup-steps", "2", "--batch-size", str(a.batch_size),
               "--image-size", str(a.image_size), "--synthetic-size", "1024", "--threads-per-rank", "1",
               "--log-interval", "1000", "--validation", "off"]

    def result(name):  # every rank's throughput, from the trainer's result file
        return ["--result-json", os.path.join(a.out, f"{name}.json")]

    table = {}
    for backend, short in (("horovod", "hvd"), ("mwms", "mwms")):
        for np in (1, 2):
            table[f"minimal-{short}-np{np}"] = (mpirun(np) + minimal + ["--backend", backend], "minimal")
            name = f"hvdtrain-{short}-np{np}"
            table[name] = (mpirun(np) + trainer + ["--backend", backend] + result(name), "trainer")
    table["minimal-hvd-np2-tuned"] = (mpirun(2, TUNED) + minimal, "minimal")
    table["minimal-hvd-np2-tfdata"] = (mpirun(2) + minimal + ["--input", "dataset"], "minimal")
    table["minimal-hvd-np2-tfkeras"] = (mpirun(2, {"TF_USE_LEGACY_KERAS": "1"}) + minimal, "minimal")
    table["hvdtrain-hvd-np2-untuned"] = (mpirun(2) + trainer + ["--horovod-tuning", "off"]
                                         + result("hvdtrain-hvd-np2-untuned"), "trainer")
    return table


def parse(kind, out, result_path):
    if kind == "minimal":
        rates = [float(r) for r in re.findall(r"MINIMAL rank=\d+ img/s=([0-9.]+)", out)]
        if not rates:
            raise ValueError("no MINIMAL line in the output")
        return sum(rates), None
    with open(result_path) as f:
        result = json.load(f)
    return result["throughput"]["total_images_per_sec"], result.get("tf_threads")


def main():
    a = parse_args(__doc__, steps=8, out="runs/tf-overhead")
    env = launch_env(TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=REPO)
    env.pop("TF_USE_LEGACY_KERAS", None)
    table = configs(a)
    names = a.only.split(",") if a.only else list(table)
    results, threads = run_alternated(table, names, a.repeats, env, parse, a.out, REPO)
    pools = {n: v[-1] for n, v in threads.items() if v}
    med = medians(results)

    def ratio(x, y, scale=1.0):
        return med[x] / (scale * med[y]) if x in med and y in med else None

    ratios = {
        "hvdtrain / minimal, Horovod, np 2 (target >= 0.98)": ratio("hvdtrain-hvd-np2", "minimal-hvd-np2"),
        "hvdtrain / minimal with hvdtrain's Open MPI settings, Horovod, np 2": ratio("hvdtrain-hvd-np2",
                                                                                   "minimal-hvd-np2-tuned"),
        "hvdtrain / minimal, Horovod, np 1": ratio("hvdtrain-hvd-np1", "minimal-hvd-np1"),
        "E(2) minimal Horovod": ratio("minimal-hvd-np2", "minimal-hvd-np1", 2),
        "E(2) minimal Horovod, hvdtrain's Open MPI settings at np 2": ratio("minimal-hvd-np2-tuned",
                                                                           "minimal-hvd-np1", 2),
        "E(2) hvdtrain Horovod (target >= 0.90)": ratio("hvdtrain-hvd-np2", "hvdtrain-hvd-np1", 2),
        "hvdtrain / minimal, MWMS, np 2": ratio("hvdtrain-mwms-np2", "minimal-mwms-np2"),
        "hvdtrain / minimal, MWMS, np 1": ratio("hvdtrain-mwms-np1", "minimal-mwms-np1"),
        "E(2) minimal MWMS": ratio("minimal-mwms-np2", "minimal-mwms-np1", 2),
        "E(2) hvdtrain MWMS": ratio("hvdtrain-mwms-np2", "hvdtrain-mwms-np1", 2),
        "tf.data feed / constant batch, minimal Horovod np 2": ratio("minimal-hvd-np2-tfdata", "minimal-hvd-np2"),
        "tf_keras / Keras 3, minimal Horovod np 2": ratio("minimal-hvd-np2-tfkeras", "minimal-hvd-np2"),
        "hvdtrain tuning on / off, np 2": ratio("hvdtrain-hvd-np2", "hvdtrain-hvd-np2-untuned"),
    }
    lines = [f"ResNet-18, batch {a.batch_size}, {a.image_size}x{a.image_size}, 1 thread per rank, {a.steps} timed "
             f"steps, median of {a.repeats}, mpirun --bind-to none", "",
             "| config | total img/s (median) | runs |", "|---|---|---|"]
    lines += [f"| {n} | {med[n]:.2f} | {' '.join(f'{v:.2f}' for v in results[n])} |" for n in names if n in med]
    lines += ["", "| ratio | value |", "|---|---|"]
    lines += [f"| {k} | {v:.3f} |" for k, v in ratios.items() if v is not None]
    if pools:
        lines += ["", f"TF pools in the trainer (result file `tf_threads`): {next(iter(pools.values()))}"]
    report = "\n".join(lines)
    print("\n" + report)
    with open(os.path.join(a.out, "tf-overhead.md"), "w") as f:
        f.write(report + "\n")
    with open(os.path.join(a.out, "tf-overhead.json"), "w") as f:
        json.dump({"runs": results, "median": med, "ratios": ratios, "tf_threads": pools, "args": vars(a)}, f,
                  indent=2)


if __name__ == "__main__":
    main()
