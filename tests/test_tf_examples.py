"""Every script in tf_examples/ runs on 2 ranks under mpirun and reaches its stated result
(see tf_examples/README.md).

    python -m pytest -q tests/test_tf_examples.py
"""
from __future__ import annotations

import os
import re

import pytest

from conftest import PYTHON, REPO, launch

pytestmark = pytest.mark.slow  # real ranks: the distributed tier

EXAMPLES = os.path.join(REPO, "tf_examples")


def example(name: str, *args: str, timeout: float = 240):
    return launch("mpirun", 2, [PYTHON, os.path.join(EXAMPLES, name), *args], timeout=timeout)


def val_accuracy(output: str) -> float:
    found = re.findall(r"\[1,0\]<stdout>:val_accuracy=([0-9.]+) \((\d+) samples, 2 ranks\)", output)
    assert len(found) == 1, f"expected one val_accuracy line from rank 0:\n{output[-3000:]}"
    accuracy, samples = found[0]
    assert samples == "397", "every validation digit counted exactly once"
    return float(accuracy)


def test_keras_fit_digits(tmp_path):
    run = example("keras_fit_digits.py", "--checkpoint-dir", str(tmp_path))
    assert val_accuracy(run.output) >= 0.95, run.output[-3000:]
    # Horovod's warm-up callback reached the scaled LR (2 x 0.05), and only rank 0 logged epochs.
    assert "finished gradual learning rate warmup to 0.1" in run.output
    assert run.output.count("Epoch 10/10") == 1 and "[1,1]<stdout>:Epoch" not in run.output
    assert os.path.exists(tmp_path / "weights-10.index"), "rank 0 saved the last epoch's weights"


def test_custom_loop_digits():
    run = example("custom_loop_digits.py")
    assert val_accuracy(run.output) >= 0.95, run.output[-3000:]
    losses = [float(x) for x in re.findall(r"<stdout>:step \d+: loss ([0-9.]+)", run.output)]
    # One batch's loss is noisy (0.05-0.4 late in training), so compare the last one with the
    # loss after the first step, from random weights (about ln 10 = 2.3), not with step 50's.
    assert len(losses) == 7 and losses[-1] < 0.5 * losses[0], losses


def test_synthetic_benchmark_reports_every_rank():
    # MobileNet, not the default ResNet-50: the same code path (keras.applications by --model, as
    # in Horovod's example), 35 CPU-seconds here against 56-69, most of them building and tracing.
    run = example("resnet50_synthetic_benchmark.py", "--model", "MobileNet", "--image-size", "32", "--batch-size", "8",
                  "--num-warmup-batches", "2", "--num-batches-per-iter", "3", "--num-iters", "3", timeout=420)
    assert "<stdout>:Model: MobileNet, batch size 8 per rank" in run.output, run.output[-3000:]
    rates = {int(r): float(x) for r, x in re.findall(r"<stdout>:rank (\d+): ([0-9.]+) img/sec", run.output)}
    assert sorted(rates) == [0, 1] and all(rate > 0 for rate in rates.values()), run.output[-3000:]
    total = re.findall(r"<stdout>:total: ([0-9.]+) img/sec on 2 ranks", run.output)
    assert len(total) == 1 and float(total[0]) == pytest.approx(sum(rates.values()), abs=0.11)
    assert len(re.findall(r"<stdout>:Iter #\d+: [0-9.]+ img/sec on rank 0", run.output)) == 3
