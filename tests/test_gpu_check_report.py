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


@pytest.mark.parametrize("hvd,plain,verdict", [
    ((3000, 3010), (3000, 3000), "met"),           # 1.000 and 1.003: spread 0.003 < 0.03 from the goal
    ((2850, 2860), (3000, 3000), "NOT met"),       # 0.950 and 0.953: below, surely
    ((2900, 3000), (3000, 2950), "undecided"),     # 0.967 and 1.017: the spread straddles the goal
    ((3000, None), (3000, 3000), "undecided"),     # one pair decides nothing
])
def test_the_alternated_ratio_is_called_met_only_where_its_spread_allows(tmp_path, hvd, plain, verdict):
    """hvdtrain and the plain loop run by turns (horovod, plain, horovod-2, plain-2): each pair's
    ratio and their spread in the report, and the goal met or not only where the spread is
    smaller than the median's distance from it."""
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "check.json").write_text(json.dumps({"device": "cuda", "model": "resnet50"}))
    for name, rate in zip(("horovod", "horovod-2"), hvd):
        if rate:
            (logs / f"{name}.json").write_text(json.dumps({"throughput": {"total_images_per_sec": rate}}))
    for name, rate in zip(("plain", "plain-2"), plain):
        (logs / f"{name}.json").write_text(json.dumps({"images_per_sec": rate}))
    (logs / "ceiling.json").write_text(json.dumps({"images_per_sec": 4000.0}))
    report, figures = gpu_check.build_report(str(tmp_path), str(tmp_path))
    pairs = [h / p for h, p in zip(hvd, plain) if h]
    assert figures["alternated"]["ratios"] == pytest.approx(pairs)
    assert figures["alternated"]["verdict"] == verdict
    assert figures["goal_met"] == {"met": True, "NOT met": False}.get(verdict)
    assert f"goal >= {gpu_check.GOAL}: **{verdict}**" in report
    assert f"| horovod / plain | {hvd[0]:.1f} | {plain[0]:.1f} | {hvd[0] / plain[0]:.3f} |" in report
    assert "ceiling" in report and f"{hvd[0] / 4000:.3f} of it" in report


def test_the_plain_loops_feeds_train_on_the_same_batches_but_the_ceiling(tmp_path):
    """benchmarks/plain_torch_loop.py --feed: prefetch (a side stream's copy ahead of the step)
    trains on exactly inline's batches, in order; ceiling takes one batch an epoch and reuses it."""
    import plain_torch_loop

    def run(feed):
        out = tmp_path / f"{feed}.json"
        plain_torch_loop.main(["--model", "resnet18", "--batch-size", "4", "--image-size", "16", "--synthetic-size", "16",
                               "--epochs", "2", "--warmup-steps", "1", "--num-workers", "0", "--threads", "1",
                               "--device", "cpu", "--feed", feed, "--result-json", str(out)])
        return json.loads(out.read_text())

    inline, prefetch, ceiling = run("inline"), run("prefetch"), run("ceiling")
    assert inline["steps"] == prefetch["steps"] == ceiling["steps"] == 8
    assert inline["batches_fetched"] == prefetch["batches_fetched"] == 8 and ceiling["batches_fetched"] == 2
    assert prefetch["last_loss"] == inline["last_loss"] != ceiling["last_loss"]
