"""What the per-rank step breakdown (hvdtrain/phases.py) costs: the same runs with it on and off.

    python benchmarks/phases_overhead.py --repeats 3 --out runs/phases-overhead

Runs, side by side in one invocation and alternated within each repeat, 2 ranks under
`mpirun --bind-to none`, one thread per rank, each with the breakdown on (torch: the default;
TF: HVDTRAIN_TF_PHASES=1, the step split into three tf.functions) and off (HVDTRAIN_PHASES=0:
torch: no marks, no autograd callback; TF: the step in one tf.function, the default, whose
gradient allreduce overlaps backward):

  torch-digits-on/off   hvdtrain.torch, Horovod, mnist_cnn on the digits (steps of a few ms: the
                        marks' fixed cost weighs most here)
  torch-resnet-on/off   hvdtrain.torch, Horovod, ResNet-18 on synthetic 64x64 images
  tf-digits-on/off      hvdtrain.tf --loop custom, Horovod, mnist_cnn on the digits
  tf-resnet-on/off      hvdtrain.tf --loop custom, Horovod, ResNet-18 on synthetic 64x64 images

and prints img/s (median over repeats) and each ratio on / off. Numbers are benchmark output,
never test assertions: shared machines are noisy.
"""
from __future__ import annotations

import json
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
from hvdtrain.launch import launch_env  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from alternate import medians, mpirun, parse_args, run_alternated  # noqa: E402

PY = sys.executable


def configs(a):
    common = ["--threads-per-rank", "1", "--log-interval", "1000", "--validation", "off", "--warmup-steps", "2"]
    resnet = ["--model", "resnet18", "--dataset", "synthetic", "--image-size", str(a.image_size),
              "--batch-size", str(a.batch_size), "--synthetic-size", "1024", "--steps", str(a.steps + 2)]
    digits = ["--model", "mnist_cnn", "--dataset", "digits", "--epochs", "3"]
    workloads = {
        "torch-digits": ["hvdtrain.torch", *digits],
        "torch-resnet": ["hvdtrain.torch", *resnet],
        "tf-digits": ["hvdtrain.tf", *digits],
        "tf-resnet": ["hvdtrain.tf", *resnet],
    }
    table = {}
    for workload, argv in workloads.items():
        for state, value in (("on", "1"), ("off", "0")):
            name = f"{workload}-{state}"
            env = {"HVDTRAIN_PHASES": value, "HVDTRAIN_TF_PHASES": value}
            table[name] = (mpirun(2, env) + [PY, "-m", *argv, *common,
                           "--result-json", os.path.join(a.out, f"{name}.json")], name)
    return table


def parse(kind, out, result_path):
    with open(result_path) as f:
        result = json.load(f)
    phases = result["ranks"][0].get("phases_ms")
    return result["throughput"]["total_images_per_sec"], phases


def main():
    a = parse_args(__doc__, steps=20, out="runs/phases-overhead")
    if a.image_size == 224:  # parse_args' default is the comparison's; a smaller image keeps this short
        a.image_size = 64
    env = launch_env(TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=REPO)
    table = configs(a)
    names = a.only.split(",") if a.only else list(table)
    results, phases = run_alternated(table, names, a.repeats, env, parse, a.out, REPO)
    med = medians(results)
    lines = [f"2 ranks, 1 thread each, median of {a.repeats} alternated repeats; ResNet-18 at "
             f"{a.image_size}x{a.image_size}, batch {a.batch_size}, {a.steps} timed steps", "",
             "| config | total img/s (median) | runs | rank 0 phases (ms/step) |", "|---|---|---|---|"]
    for n in names:
        if n in med:
            last = phases[n][-1] if phases[n] else None
            shown = ", ".join(f"{k} {v:.1f}" for k, v in last.items()) if last else "off"
            lines.append(f"| {n} | {med[n]:.2f} | {' '.join(f'{v:.2f}' for v in results[n])} | {shown} |")
    workloads = dict.fromkeys(n.rsplit("-", 1)[0] for n in names)
    ratios = {w: med[f"{w}-on"] / med[f"{w}-off"] for w in workloads if f"{w}-on" in med and f"{w}-off" in med}
    lines += ["", "| breakdown on / off | ratio |", "|---|---|"]
    lines += [f"| {w} | {r:.3f} |" for w, r in ratios.items()]
    report = "\n".join(lines)
    print("\n" + report)
    with open(os.path.join(a.out, "phases-overhead.md"), "w") as f:
        f.write(report + "\n")
    with open(os.path.join(a.out, "phases-overhead.json"), "w") as f:
        json.dump({"runs": results, "median": med, "ratios": ratios, "args": vars(a)}, f, indent=2)


if __name__ == "__main__":
    main()
