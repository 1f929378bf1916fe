"""torch_examples/ run for real on 2 ranks and reach what their docstrings promise."""
import json
import os
import re

import pytest

from conftest import PYTHON, REPO, launch

pytestmark = pytest.mark.slow  # real ranks: the distributed tier

EXAMPLES = os.path.join(REPO, "torch_examples")


def test_digits_cnn_reaches_95_percent():
    out = launch("mpirun", 2, [PYTHON, os.path.join(EXAMPLES, "digits_cnn.py")], timeout=240).output
    acc = float(re.search(r"final val accuracy: ([0-9.]+) over 397 samples", out).group(1))
    assert acc >= 0.95, out[-2000:]


def test_accumulate_checkpoint_resumes(tmp_path):
    ckpt = str(tmp_path / "digits.pt")
    script = [PYTHON, os.path.join(EXAMPLES, "digits_accumulate_checkpoint.py"), "--checkpoint", ckpt]
    first = launch("mpirun", 2, script + ["--stop-after", "4"], timeout=240).output
    assert "epoch 4: loss" in first and "epoch 5:" not in first
    second = launch("mpirun", 2, script, timeout=240).output
    assert "resumed from" in second and "at epoch 4" in second
    assert "epoch 5: loss" in second and "epoch 1: loss" not in second and "epoch 12: loss" in second
    acc = float(re.search(r"final val accuracy: ([0-9.]+)", second).group(1))
    assert acc >= 0.9, second[-2000:]


def test_synthetic_benchmark_reports_every_rank():
    out = launch("mpirun", 2, [PYTHON, os.path.join(EXAMPLES, "synthetic_benchmark.py"), "--image-size", "64",
                               "--batch-size", "4", "--steps", "2", "--warmup-steps", "1"], timeout=300).output
    rates = [float(r) for r in re.findall(r"rank [01]: ([0-9.]+) img/s", out)]
    assert len(rates) == 2 and all(r > 0 for r in rates), out[-2000:]
    total = float(re.search(r"total: ([0-9.]+) img/s on 2 rank", out).group(1))
    assert abs(total - sum(rates)) < 0.2


def test_mnist_fit_reaches_95_percent_with_equal_ranks(tmp_path):
    result = tmp_path / "r.json"
    out = launch("mpirun", 2, [PYTHON, os.path.join(EXAMPLES, "mnist_fit.py"),
                               json.dumps({"result_json": str(result)})], timeout=240).output
    final = json.loads(result.read_text())
    assert final["final"]["val_acc"] >= 0.95 and final["final"]["val_count"] == 397, final["history"]
    assert len({r["param_checksum"] for r in final["ranks"]}) == 1
    assert f"final val accuracy: {final['final']['val_acc']:.4f} over 397 samples" in out
