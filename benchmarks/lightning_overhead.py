"""A user's LightningModule under hvdtrain's `strategy="horovod"`, against the same module under
Lightning's `ddp` and against `python -m hvdtrain.torch` on the same model and data, side by side.

    python benchmarks/lightning_overhead.py --repeats 3 --out runs/lightning-overhead

The module is torch_examples/lightning_imagenet.py's (the courses' shape: torchvision's ResNet,
SGD, cosine schedule, torchmetrics) on in-memory synthetic images of --image-size, --batch-size per
rank, one compute thread per rank, 2 ranks under mpirun: the step dominates. Each Lightning rank is
timed between barriers after the warm-up steps (hvdtrain/lightning/compare.py's probe), the
trainer as its result file says (the same rule). Runs alternate within each repeat; medians and
the ratios the goals are stated in are printed (goals: horovod >= 1.0 x ddp, >= 0.97 x
hvdtrain.torch). Benchmark output, never a test assertion.
"""
from __future__ import annotations

import glob
import json
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
from hvdtrain.launch import launch_env  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from alternate import medians, mpirun, parse_args, run_alternated  # noqa: E402

PY = sys.executable
HERE = os.path.abspath(__file__)
SETTINGS = {"image_size": 64, "classes": 1000}


def module():
    """--module for hvdtrain.lightning.compare: the example's LightningModule."""
    sys.path.insert(0, os.path.join(REPO, "torch_examples"))
    from lightning_imagenet import ImageNetModule

    return ImageNetModule("resnet18", SETTINGS["classes"], lr=0.01, epochs=1)


def datamodule():
    """--datamodule: synthetic float images in memory (the loader costs nothing beside the step)."""
    import lightning.pytorch as pl
    import torch
    from torch.utils.data import TensorDataset

    size, batch = int(os.environ["BENCH_IMAGE_SIZE"]), int(os.environ["BENCH_BATCH_SIZE"])
    n = int(os.environ["BENCH_SAMPLES"])
    g = torch.Generator().manual_seed(0)
    images = TensorDataset(torch.randn(n, 3, size, size, generator=g), torch.randint(0, SETTINGS["classes"], (n,),
                                                                                      generator=g))
    return pl.LightningDataModule.from_datasets(train_dataset=images, batch_size=batch, num_workers=0)


def configs(a, steps_total: int):
    lightning = ["-m", "hvdtrain.lightning.compare", "--module", f"{HERE}:module", "--datamodule", f"{HERE}:datamodule",
                 "--max-steps", str(steps_total), "--warmup-steps", "5", "--threads", "1", "--max-epochs", "100"]
    trainer = [PY, "-m", "hvdtrain.torch", "--model", "resnet18", "--dataset", "synthetic", "--steps",
               str(steps_total), "--warmup-steps", "5", "--batch-size", str(a.batch_size), "--image-size",
               str(a.image_size), "--synthetic-size", str(2 * a.batch_size * steps_total), "--threads-per-rank", "1",
               "--log-interval", "1000", "--base-lr", "0.01", "--validation", "off"]

    def out(name):
        return os.path.join(a.out, name)

    return {
        "lightning-horovod-np2": (mpirun(2) + [PY, *lightning, "--run", "horovod", "--out", out("horovod")], "probe"),
        "lightning-ddp-np2": (mpirun(2) + [PY, *lightning, "--run", "ddp", "--out", out("ddp")], "probe"),
        "hvdtrain-np2": (mpirun(2) + trainer + ["--result-json", out("hvdtrain-np2.json")], "trainer"),
    }


def parse(kind, output, result_path):
    if kind == "trainer":
        with open(result_path) as f:
            return json.load(f)["throughput"]["total_images_per_sec"], None
    name = os.path.basename(result_path)[:-len(".json")]
    folder = os.path.join(os.path.dirname(result_path), {"lightning-horovod-np2": "horovod",
                                                         "lightning-ddp-np2": "ddp"}[name])
    ranks = [json.load(open(p)) for p in sorted(glob.glob(os.path.join(folder, "rank*.json")))]
    return sum(r["samples_per_sec"] for r in ranks), None


def main():
    a = parse_args(__doc__, steps=30, out="runs/lightning-overhead")
    steps_total = a.steps + 5
    env = launch_env(PYTHONPATH=REPO, BENCH_IMAGE_SIZE=str(a.image_size), BENCH_BATCH_SIZE=str(a.batch_size),
                     BENCH_SAMPLES=str(2 * a.batch_size * steps_total))
    table = configs(a, steps_total)
    names = a.only.split(",") if a.only else list(table)
    results, _ = run_alternated(table, names, a.repeats, env, parse, a.out, REPO)
    med = medians(results)

    def ratio(x, y):
        return med[x] / med[y] if x in med and y in med else None

    lines = [f"ResNet-18 ({a.image_size} px synthetic, batch {a.batch_size} per rank), 2 ranks x 1 thread, "
             f"{a.steps} timed steps after 5, median of {a.repeats} alternated repeats", "",
             "| config | total img/s (median) | runs |", "|---|---|---|"]
    lines += [f"| {n} | {med[n]:.2f} | {' '.join(f'{v:.1f}' for v in results[n])} |" for n in names if n in med]
    ratios = {"strategy=horovod / ddp (goal >= 1.0)": ratio("lightning-horovod-np2", "lightning-ddp-np2"),
              "strategy=horovod / hvdtrain.torch (goal >= 0.97)": ratio("lightning-horovod-np2", "hvdtrain-np2")}
    lines += ["", "| ratio | value |", "|---|---|"] + [f"| {k} | {v:.3f} |" for k, v in ratios.items() if v]
    report = "\n".join(lines)
    print("\n" + report)
    with open(os.path.join(a.out, "lightning-overhead.md"), "w") as f:
        f.write(report + "\n")
    with open(os.path.join(a.out, "lightning-overhead.json"), "w") as f:
        json.dump({"runs": results, "median": med, "ratios": ratios, "args": vars(a)}, f, indent=2)


if __name__ == "__main__":
    main()
