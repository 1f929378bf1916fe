"""The GPU check's own arithmetic, on files of known content (fast tier): where a rank's host
time goes, read from a py-spy profile, and the weights' distance between two runs' checkpoints.
The script itself runs in tests/test_gpu_check.py (CPU mode)."""
from __future__ import annotations

import json
import os
import sys

import pytest

from conftest import REPO

sys.path.insert(0, os.path.join(REPO, "benchmarks"))
import gpu_check  # noqa: E402


def test_profile_summary_counts_the_main_thread_while_it_trains(tmp_path):
    raw = tmp_path / "profile.txt"
    raw.write_text(
        # py-spy record --threads --idle --native --format raw: root first, then the sample count.
        "thread (1): MainThread;0x1 (libc.so.6);main (x.py:1);_train_epoch (hvdtrain/torch/train.py:210);"
        "synchronize (horovod/torch/optimizer.py:300);cudaStreamSynchronize (libcudart.so.13) 30\n"
        "thread (1): MainThread;main (x.py:1);_train_epoch (hvdtrain/torch/train.py:220);backward (torch/_tensor.py:5) 60\n"
        "thread (1): MainThread;main (x.py:1);_train_epoch (hvdtrain/torch/train.py:221);backward (torch/_tensor.py:9) 10\n"
        "thread (1): MainThread;main (x.py:1);_build_model (hvdtrain/torch/train.py:3) 400\n"  # start-up: left out
        "thread (2): feeder;run (hvdtrain/torch/feeder.py:3);_train_epoch (elsewhere.py:1) 50\n")  # not the main thread
    summary = gpu_check.profile_summary(str(raw))
    assert summary["samples_training"] == 100
    assert summary["samples_by_thread"] == {"MainThread": 500, "feeder": 50}
    # The innermost Python function (not the native leaf), lines of one function counted together.
    assert summary["innermost"] == [["backward (torch/_tensor.py)", 0.7], ["synchronize (horovod/torch/optimizer.py)", 0.3]]
    # Functions on every training stack (main, _train_epoch) say nothing and are left out.
    assert summary["inclusive"] == [["backward (torch/_tensor.py)", 0.7], ["synchronize (horovod/torch/optimizer.py)", 0.3]]
    assert gpu_check.profile_summary(str(tmp_path / "missing.txt")) is None


def test_compare_weights_is_relative_to_how_far_the_reference_moved(tmp_path):
    torch = pytest.importorskip("torch")
    from hvdtrain.torch import models

    config = {"seed": 5, "model": "mnist_cnn", "num_classes": 10, "image_size": 28}
    torch.manual_seed(config["seed"])
    start = models.build_model("mnist_cnn", 3, 10, 28).state_dict()
    names = [n for n in start if "running" not in n and "num_batches" not in n]
    step = {n: torch.full_like(start[n], 0.01) for n in names}

    def save(name, scale_of_difference):
        folder = tmp_path / name
        folder.mkdir()
        state = {n: t.clone() for n, t in start.items()}
        for i, n in enumerate(names):  # the reference moved by `step`; the others differ by a share of it
            state[n] += step[n] * (1 + scale_of_difference) if i == 0 else step[n]
        torch.save({"model": state, "config": config, "global_step": 30}, folder / "ckpt-e0001-s00000030.pt")
        return f"{name}={folder}"

    ref, same, off = save("ref", 0.0), save("same", 0.0), save("off", 1.0)
    result = gpu_check.compare_weights(str(tmp_path / "w.json"), ref, [same, off])
    moved = float(torch.cat([step[n].flatten() for n in names]).double().norm())
    first = float(step[names[0]].double().norm())
    assert result["reference_moved"] == pytest.approx(moved)
    assert result["runs"]["same"]["relative_distance"] == pytest.approx(0.0)
    assert result["runs"]["off"]["relative_distance"] == pytest.approx(first / moved)
    assert result["between"]["relative_distance"] == pytest.approx(first / moved)
    assert json.loads((tmp_path / "w.json").read_text())["runs"]["off"]["global_step"] == 30
