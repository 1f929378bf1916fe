"""`python -m hvdtrain.tf` on 2 real ranks (mpirun, srun): accuracy of both loops, equal weights
on every rank, resume after an interruption, and one clear line on every rank for bad input.

    python -m pytest -q tests/test_tf_trainer.py
"""
from __future__ import annotations

import importlib.metadata
import json
import os
import re
import signal
import subprocess
import threading
import time

import numpy as np
import pytest

from conftest import (PYTHON, assert_each_rank_failed_with, assert_job_failed_with, base_env, kill_rank0_while_writing,
                      launch, launch_each_rank_to_its_end, rank_pids, start_launch)
from hvdtrain.checkpoint import checkpoint_name, latest_checkpoint

pytestmark = pytest.mark.slow  # real ranks: the distributed tier

TRAIN = [PYTHON, "-m", "hvdtrain.tf"]
# Digits on 2 ranks: 21 steps of 2 x 32 per epoch, a few seconds an epoch on 2 shared cores.
# SGD with warm-up (mnist_cnn's own recipe is Adam: see test_documented_digits_commands_reach_95_percent).
DIGITS = ["--model", "mnist_cnn", "--dataset", "digits", "--optimizer", "sgd", "--base-lr", "0.05",
          "--warmup-epochs", "1", "--threads-per-rank", "1"]


def run_tf(argv, timeout=180, launcher="mpirun", env=None, check=True):
    return launch(launcher, 2, TRAIN + argv, timeout=timeout, env=env, check=check)


def load(path) -> dict:
    with open(path) as f:
        return json.load(f)


def assert_same_weights_everywhere(result):
    checksums = [r["param_checksum"] for r in result["ranks"]]
    assert [r["rank"] for r in result["ranks"]] == [0, 1]
    assert len(checksums[0]) == 64 and checksums[0] == checksums[1], checksums


@pytest.mark.parametrize("loop,keras", [("fit", "tf_keras 2."), ("custom", "keras 3.")])
def test_documented_digits_commands_reach_95_percent(tmp_path, loop, keras):
    """The commands of hvdtrain/tf/train.py's docstring, as written (plus the test's threads,
    result file and TensorBoard folder): mnist_cnn's recipe must make both loops reach 95 %, with
    equal weights on every rank, every validation sample counted once, and the result file's
    figures. (One launch per loop: the documented command and the loop's accuracy were two.)"""
    from test_torch_trainer import documented_commands

    [cmd] = [c for c in documented_commands("hvdtrain/tf/train.py") if c[c.index("--loop") + 1] == loop]
    assert cmd[:6] == ["mpirun", "-np", "2", "python", "-m", "hvdtrain.tf"], cmd
    out, tb = tmp_path / "result.json", tmp_path / "tb"
    started = time.monotonic()
    run = run_tf(cmd[6:] + ["--threads-per-rank", "1", "--result-json", str(out), "--log-dir", str(tb)], timeout=240)
    result = load(out)
    assert result["framework"] == "tf" and result["backend"] == "horovod"
    assert result["keras"].startswith(keras), result["keras"]
    # --threads-per-rank 1 bounds every pool of the rank's TensorFlow, its input pipeline's too.
    assert result["tf_threads"] == {"intra_op": 1, "inter_op": 1, "tf_data_private_pool": 1,
                                    "tf_data_max_intra_op": 1}, result["tf_threads"]
    assert result["world_size"] == 2 and result["launcher"] == "openmpi"
    cfg = result["config"]
    assert cfg["recipe"] == "small-cnn" and cfg["loop"] == loop
    assert cfg["lr"] == pytest.approx(cfg["base_lr"] * 2)  # the linear scaling rule, at 2 ranks
    epochs = int(cmd[cmd.index("--epochs") + 1])
    assert result["global_step"] == epochs * 21 and [h["epoch"] for h in result["history"]] == list(range(1, epochs + 1))
    final = result["final"]
    assert final["val_count"] == 397, "every validation sample counted exactly once"
    assert final["val_acc"] >= 0.95, result["history"]
    assert final["train_loss"] < result["history"][0]["train_loss"]
    assert_same_weights_everywhere(result)
    rates = [r["images_per_sec"] for r in result["ranks"]]
    assert all(rate > 0 for rate in rates) and result["throughput"]["total_images_per_sec"] == pytest.approx(sum(rates))
    assert result["versions"]["tensorflow"] == importlib.metadata.version("tensorflow")
    assert result["horovod_build_flags"]["mpi_built"]
    assert "hvdtrain.tf: error" not in run.output and "Traceback" not in run.output
    events = [n for n in os.listdir(tb) if n.startswith("events.out.tfevents.")]
    assert len(events) == 1 and os.path.getsize(tb / events[0]) > 1000, "TensorBoard scalars, from rank 0 only"
    print(f"--loop {loop}: val acc {final['val_acc']:.4f} in {time.monotonic() - started:.0f} s")


def _signal_rank1_when(ckpt_dir, checkpoint_prefix, fired):
    """Send SIGUSR1 to rank 1 once a checkpoint named checkpoint_prefix* is in ckpt_dir. Rank 1 is
    the process of this test (ckpt_dir, unique, in its command line) with OpenMPI rank 1."""
    deadline = time.monotonic() + 150
    while time.monotonic() < deadline:
        if any(n.startswith(checkpoint_prefix) for n in os.listdir(ckpt_dir)):
            for pid in rank_pids(str(ckpt_dir), 1):
                os.kill(pid, signal.SIGUSR1)
                fired.append(pid)
            return
        time.sleep(0.1)


def test_resume_after_interruption_continues_from_saved_epoch(tmp_path):
    ckpt_dir = tmp_path / "ckpt"
    ckpt_dir.mkdir()
    argv = DIGITS + ["--loop", "fit", "--epochs", "12", "--checkpoint-dir", str(ckpt_dir)]

    # 1. Interrupted: SIGUSR1 (Slurm's warning before the time limit) reaches rank 1 only; the
    #    stop vote makes both ranks stop at the same step, rank 0 checkpoints there.
    fired: list[int] = []
    watcher = threading.Thread(target=_signal_rank1_when, args=(ckpt_dir, "ckpt-e0002", fired))
    watcher.start()
    first = run_tf(argv + ["--result-json", str(tmp_path / "first.json")])
    watcher.join()
    assert fired, "rank 1 was never signalled"
    r1 = load(tmp_path / "first.json")
    # Rank 0 never got the signal, yet knows which one stopped the run: the votes are reduced.
    assert r1["stopped_by"] == "SIGUSR1", r1["stopped_by"]
    stop_step, stop_epoch = r1["global_step"], r1["epoch"]
    # Ranks vote at each reduction: every 10 steps and at the end of an epoch (21 steps).
    assert 2 * 21 <= stop_step < 12 * 21 and (stop_step % 10 == 0 or stop_step % 21 == 0), stop_step
    assert f"stopped by SIGUSR1 at step {stop_step}" in first.output
    saved = os.path.basename(latest_checkpoint(str(ckpt_dir)))
    # The samples seen of the epoch under way name a stop in its middle (none at an epoch's end).
    assert saved == checkpoint_name(stop_step, stop_epoch, "npz", (stop_step - 21 * stop_epoch) * 64), saved

    # 2. Restarted with --steps at the stop: nothing to train, so the final weights are the
    #    restored ones, on both ranks: rank 0 loaded them, rank 1 got them by broadcast.
    second = run_tf(argv + ["--steps", str(stop_step), "--result-json", str(tmp_path / "second.json")])
    r2 = load(tmp_path / "second.json")
    assert f"resumed from {ckpt_dir}/{saved} at epoch {stop_epoch}, step {stop_step}" in second.output
    assert r2["global_step"] == stop_step and r2["loss_log"] == []
    assert {r["param_checksum"] for r in r2["ranks"]} == {r1["ranks"][0]["param_checksum"]}

    # 3. Restarted to the end: continues from the saved step, not from the start.
    third = run_tf(argv + ["--result-json", str(tmp_path / "third.json")])
    r3 = load(tmp_path / "third.json")
    assert f"resumed from {ckpt_dir}/{saved}" in third.output
    assert r3["stopped_by"] is None and r3["global_step"] == 12 * 21 and r3["epoch"] == 12
    assert stop_step < r3["loss_log"][0][0] <= stop_step + 10, r3["loss_log"][:2]
    assert r3["history"][:len(r1["history"])] == r1["history"], "the history before the stop is kept"
    assert r3["history"][-1]["epoch"] == 12 and r3["final"]["val_acc"] >= 0.95
    assert_same_weights_everywhere(r3)


def _fake_checkpoint(path, model):
    """A well-formed checkpoint of another model: the compatibility check must name the field."""
    meta = {"format_version": 1, "config": {"framework": "tf", "model": model, "dataset": "digits",
                                            "image_size": 224, "optimizer": "sgd", "num_classes": 10,
                                            "loop": "custom"},
            "epoch": 1, "step_in_epoch": 0, "global_step": 21, "history": [], "num_model": 0, "num_optimizer": 0}
    np.savez(path, meta=np.array(json.dumps(meta)))


# The data checks are shared with torch and tested without ranks (test_launch_config.py).
@pytest.mark.parametrize("case", ["unknown-model", "unreadable-checkpoint", "other-model-checkpoint"])
@pytest.mark.side_lane  # one rank, or mostly waiting: beside the others (tests/side_lane.py)
def test_bad_input_one_line_on_every_rank(tmp_path, case):
    argv = ["--model", "mnist_cnn", "--dataset", "digits", "--loop", "custom", "--epochs", "1"]
    if case == "unknown-model":
        argv[1], expected = "vgg99", "unknown model 'vgg99'; valid: resnet50, resnet18, mnist_cnn"
    else:
        ckpt = tmp_path / "ckpt-e0001-s00000021.npz"
        if case == "unreadable-checkpoint":
            ckpt.write_bytes(b"\x00 this is not a checkpoint")
            expected = f"checkpoint {ckpt} is unreadable or corrupt"
        else:
            _fake_checkpoint(ckpt, "resnet50")
            expected = f"checkpoint {ckpt} does not match this run: model: checkpoint 'resnet50', this run 'mnist_cnn'"
        argv += ["--checkpoint-dir", str(tmp_path)]
    run = launch_each_rank_to_its_end(2, TRAIN + argv, timeout=120)
    assert_each_rank_failed_with(run, "hvdtrain.tf", expected, 2)


@pytest.mark.parametrize("case", ["keras3-already-bound", "tf-keras-missing"])
@pytest.mark.side_lane  # one rank, or mostly waiting: beside the others (tests/side_lane.py)
def test_fit_without_keras2_says_why(tmp_path, case):
    env = base_env()
    env.pop("TF_USE_LEGACY_KERAS", None)
    if case == "keras3-already-bound":
        # Code that touched tf.keras (Keras 3) before hvdtrain could choose Keras 2.
        argv = [PYTHON, "-c", "import tensorflow as tf; tf.keras.Model; from hvdtrain.tf.cli import main; "
                "main(['--model', 'mnist_cnn', '--dataset', 'digits', '--loop', 'fit'])"]
        expected = "but tf.keras was already bound to Keras 3 in this process; set TF_USE_LEGACY_KERAS=1"
    else:
        hidden = tmp_path / "tf_keras"
        hidden.mkdir()
        (hidden / "__init__.py").write_text("raise ImportError('No module named tf_keras')\n")
        env["PYTHONPATH"] = f"{tmp_path}{os.pathsep}{env['PYTHONPATH']}"
        argv = TRAIN + ["--model", "mnist_cnn", "--dataset", "digits", "--loop", "fit"]
        expected = "TensorFlow's Keras 2 package tf-keras is not importable"
    run = launch("single", 1, argv, timeout=120, env=env, check=False)
    assert run.returncode == 2, run.output[-3000:]
    errors = [line for line in run.output.splitlines() if line.startswith("hvdtrain.tf: error [rank 0/1]: ")]
    assert len(errors) == 1 and "--loop fit needs Keras 2 because Horovod 0.28.1's Keras layer" in errors[0]
    assert expected in errors[0], errors[0]
    assert "AttributeError" not in run.output and "Traceback" not in run.output


@pytest.mark.side_lane  # one rank, or mostly waiting: beside the others (tests/side_lane.py)
def test_keras_is_imported_without_its_optional_packages_which_stay_importable():
    """Keras 3 would import scikit-learn, matplotlib and SciPy for what the trainer never uses (1.4
    CPU-s per rank): keras_compat hides them during Keras' import only; the process can import
    them afterwards."""
    code = ("import sys; from hvdtrain.tf import keras_compat; keras = keras_compat.select('custom'); "
            "import tensorflow; print('AFTER', [m for m in ('sklearn', 'matplotlib', 'scipy') if m in sys.modules], "
            "'keras' in sys.modules); "
            "import sklearn.datasets; print('THEN', sklearn.datasets.load_digits().target.shape); "
            "import matplotlib; matplotlib.use('Agg'); import matplotlib.pyplot, scipy.sparse; print('AND', 'ok')")
    run = launch("single", 1, [PYTHON, "-c", code], timeout=120)
    assert "AFTER [] True" in run.output and "THEN (1797,)" in run.output and "AND ok" in run.output, run.output[-3000:]


def test_resnet18_on_synthetic_images_two_ranks(tmp_path):
    """The comparison's resnet18-synthetic workload under hvdtrain.tf, small: Keras 3's ResNet-18,
    generated images, the custom loop averaging the tape's gradients with Horovod, one thread per rank."""
    out = tmp_path / "resnet18.json"
    run_tf(["--model", "resnet18", "--dataset", "synthetic", "--image-size", "32", "--batch-size", "8",
            "--steps", "6", "--log-interval", "3", "--threads-per-rank", "1", "--result-json", str(out)],
           timeout=300)
    result = load(out)
    assert result["config"]["model"] == "resnet18" and result["config"]["dataset"] == "synthetic"
    assert result["global_step"] == 6 and [step for step, _ in result["loss_log"]] == [3, 6]
    assert all(loss == loss and loss > 0 for _, loss in result["loss_log"]), result["loss_log"]
    assert_same_weights_everywhere(result)
    assert result["tf_threads"]["intra_op"] == 1 and result["tf_threads"]["tf_data_private_pool"] == 1
    assert all(r["images_per_sec"] > 0 for r in result["ranks"])


def test_mwms_under_srun(slurm_cluster, tmp_path):
    """tf.distribute's workers find each other under srun as under mpirun: TF_CONFIG gathered over
    MPI, each worker on a port free on its node (not one derived from the job id)."""
    out = tmp_path / "mwms-srun.json"
    run_tf(["--backend", "mwms", "--model", "mnist_cnn", "--dataset", "digits", "--steps", "6",
            "--log-interval", "3", "--threads-per-rank", "1", "--result-json", str(out)], launcher="srun", timeout=240)
    result = load(out)
    assert result["backend"] == "mwms" and result["launcher"] == "slurm" and result["world_size"] == 2
    workers = json.loads(result["tf_config"])["cluster"]["worker"]
    assert len(set(workers)) == 2, workers
    assert result["global_step"] == 6
    assert_same_weights_everywhere(result)


def test_srun_two_tasks_runs_the_tf_trainer(slurm_cluster, tmp_path):
    out = tmp_path / "srun.json"
    run = run_tf(["--model", "mnist_cnn", "--dataset", "digits", "--loop", "fit", "--steps", "12",
                  "--log-interval", "4", "--result-json", str(out)], launcher="srun", timeout=240)
    result = load(out)
    assert result["launcher"] == "slurm" and result["world_size"] == 2
    assert result["environment"]["env"].get("SLURM_JOB_ID"), "ran inside a Slurm job"
    assert result["global_step"] == 12 and [step for step, _ in result["loss_log"]] == [4, 8, 12]
    assert_same_weights_everywhere(result)
    assert all(r["images_per_sec"] > 0 for r in result["ranks"])
    assert "0: [" in run.output and "hvdtrain.tf: horovod on 2 rank(s) via slurm" in run.output


@pytest.mark.parametrize("dataset", ["imagefolder", "shards"])
def test_image_augmentations_are_drawn_per_sample_not_from_a_stream(tmp_path, dataset):
    """The TF pipeline's random crops and flips are a function of (seed, epoch, sample): an epoch
    started at step 3 (a resume) gets the batches the whole epoch had from step 3 on, and another
    epoch other crops; from a folder and from shards. (A TF run resumed mid-epoch on a model with
    dropout still differs from an uninterrupted one: dropout draws from a stream.)"""
    import numpy as np

    from hvdtrain.data import shards
    from hvdtrain.config import TrainConfig
    from hvdtrain.data.datasets import write_digits_imagefolder
    from hvdtrain.tf.data import build_data

    root = write_digits_imagefolder(str(tmp_path / "png"), per_class_train=4, per_class_val=1, size=16)
    if dataset == "shards":
        shards.write(str(tmp_path / "shards"), *shards.imagefolder_sources(root), progress=False)
        root = str(tmp_path / "shards")
    data = build_data(TrainConfig(framework="tf", model="mnist_cnn", dataset=dataset, data_dir=root,
                                  image_size=12, seed=3))

    def batches(epoch, skip):
        return [x.numpy() for x, _ in data.train(epoch, skip, rank=0, world_size=2, steps=5, batch_size=4, seed=3)]

    # The crops the comparison reports (PNG files: TensorFlow decodes them for their shapes): the torch trainer's.
    from hvdtrain.torch import images as torch_images
    torch_data = (torch_images.ShardImages(root, "train", None) if dataset == "shards"
                  else torch_images.image_folder(f"{root}/train", None))
    assert data.crops_check(3) == torch_images.crops_check(torch_data, 3) and data.crops_check(3)["samples"] == 16

    whole, resumed = batches(0, 0), batches(0, 3)
    assert len(whole) == 5 and len(resumed) == 2
    for a, b in zip(whole[3:], resumed):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(batches(0, 0)[0], batches(1, 0)[0])

    # A user's own model.fit (hvd.image_data): the trainer's batches of each epoch, in one dataset
    # over the epochs, from the epoch a resume starts at; each validation image on exactly one rank.
    from hvdtrain.errors import UsageError
    from hvdtrain.tf.data import FitImages

    def fit_images(rank, **kw):
        return FitImages(root, image_size=12, batch_size=4, rank=rank, world_size=2, seed=3, epochs=2, threads=1, **kw)
    images = fit_images(0)
    steps = images.steps_per_epoch
    assert steps == len(data.train_order(0, 0, 2, 3)) // 4 and images.classes == [str(c) for c in range(10)]
    trainer = [(x.numpy(), y.numpy()) for epoch in (0, 1)
               for x, y in data.train(epoch, 0, rank=0, world_size=2, steps=steps, batch_size=4, seed=3)]
    for first in (0, 1):
        given = [(x.numpy(), y.numpy()) for x, y in images.train(first)]
        assert len(given) == (2 - first) * steps
        for (x, y), (tx, ty) in zip(given, trainer[first * steps:]):
            np.testing.assert_array_equal(x, tx)
            np.testing.assert_array_equal(y, ty)
    val = [np.concatenate([y.numpy() for _, y in fit_images(rank).val]) for rank in (0, 1)]
    assert sum(map(len, val)) == data.val_size == images.val_samples + fit_images(1).val_samples
    assert sorted(np.concatenate(val).tolist()) == sorted(int(data.load_val(i)[1]) for i in range(data.val_size))
    with pytest.raises(UsageError, match="image_data\\(\\): data dir '/nonexistent' is not a directory"):
        FitImages("/nonexistent", image_size=12, batch_size=4, rank=0, world_size=2, seed=3, epochs=2, threads=1)
    with pytest.raises(UsageError, match="make no full batch of 1000"):
        FitImages(root, image_size=12, batch_size=1000, rank=0, world_size=2, seed=3, epochs=2, threads=1)


def test_the_gpus_uint8_batches_normalised_in_the_step_are_the_maps_floats(tmp_path):
    """A GPU's custom loop takes uint8 image batches (a quarter of the bytes through tf.data and
    onto the device) and normalises them in the step (model_input): the same images as the CPU's
    floats, normalised in the map, but for the rounding to uint8 after the resize. Which path runs
    where: hvdtrain/tf/devices.py's uint8_input, a function a CPU runs."""
    import tensorflow as tf

    from hvdtrain.config import TrainConfig
    from hvdtrain.data.datasets import IMAGENET_STD, write_digits_imagefolder
    from hvdtrain.tf import devices
    from hvdtrain.tf.data import build_data, model_input

    root = write_digits_imagefolder(str(tmp_path / "jpeg"), per_class_train=2, per_class_val=1, size=40, fmt="jpeg")
    cfg = TrainConfig(framework="tf", model="mnist_cnn", dataset="imagefolder", data_dir=root, image_size=24)
    floats, uint8 = build_data(cfg), build_data(cfg, uint8=True)
    assert floats.input_normalization is None and uint8.input_normalization is not None
    for split in ("train", "val"):
        batches = [[(x, y) for x, y in (d.train(0, 0, 0, 1, 5, 4, 1) if split == "train" else d.val(0, 1, 4))]
                   for d in (floats, uint8)]
        for (xf, yf), (xu, yu) in zip(*batches):
            assert xf.dtype == tf.float32 and xu.dtype == tf.uint8 and xu.shape == xf.shape
            np.testing.assert_array_equal(yf.numpy(), yu.numpy())
            # Within half a uint8 step of the resize's float value, in normalised units.
            gap = np.abs(model_input(xu, uint8.input_normalization).numpy() - xf.numpy()).max()
            assert gap <= 0.5 / 255 / min(IMAGENET_STD) + 1e-5, (split, gap)
    assert np.array_equal(model_input(xf, uint8.input_normalization), xf)  # floats pass as they are
    from hvdtrain.torch import images as torch_images  # JPEGs: TensorFlow reads their shapes from the header
    assert floats.crops_check(3) == torch_images.crops_check(torch_images.image_folder(f"{root}/train", None), 3)
    np.testing.assert_allclose(uint8.samples(2)[0], floats.samples(2)[0], atol=0.5 / 255 / min(IMAGENET_STD) + 1e-5)
    gpu = "/physical_device:GPU:0"
    assert devices.uint8_input(gpu, "custom") and not devices.uint8_input(gpu, "fit")
    assert not devices.uint8_input("cpu", "custom") and devices.input_device(gpu) == "/gpu:0"


def test_tensorflow_computes_the_windows_of_the_one_rule():
    """hvdtrain/data/augment.py's windows computed in TensorFlow's ops (what its pipeline's map runs,
    with no call into Python per image) are Python's, to the pixel: on ImageNet-like shapes and on
    extreme ones, where the centre-crop fallback is taken."""
    import tensorflow as tf

    from hvdtrain.data import augment
    from hvdtrain.tf.data import _window_from_draws

    shapes = [(375, 500), (500, 375), (10, 1000), (1000, 10), (1, 1), (2, 3), (333, 500), (4000, 3000)]
    window = tf.function(_window_from_draws)
    draws = augment.sample_draws(5, 2, range(300))
    fallbacks = 0
    for i, row in enumerate(draws):
        height, width = shapes[i % len(shapes)]
        expected = augment.window_from_draws(row, height, width)
        found = window(tf.constant(row), tf.constant(height), tf.constant(width)).numpy().tolist()
        assert found == [*expected[:4], int(expected.flip)], (height, width, found, expected)
        fallbacks += expected.height == height or expected.width == width
    assert fallbacks >= 40  # the extreme shapes took the centre crop


@pytest.mark.side_lane  # one rank, or mostly waiting: beside the others (tests/side_lane.py)
def test_a_bad_image_file_is_named_in_one_line(tmp_path):
    """tf.data's error names an op, not a file: the rank that read a bad image ends the job with one
    line naming it: a file that is no image in training (a folder, Keras fit, 2 ranks), a shard
    member whose bytes differ from the manifest's CRC-32 in validation (the custom loop; a flipped
    byte often still decodes). The data's own search finds nothing in good files."""
    from hvdtrain.data import shards
    from hvdtrain.config import TrainConfig
    from hvdtrain.data.datasets import write_digits_imagefolder
    from hvdtrain.tf.data import build_data

    root = write_digits_imagefolder(str(tmp_path / "png"), per_class_train=6, per_class_val=2, size=12)
    out = str(tmp_path / "shards")
    shards.write(out, *shards.imagefolder_sources(root), progress=False)
    for dataset, data_dir in (("imagefolder", root), ("shards", out)):
        data = build_data(TrainConfig(framework="tf", model="mnist_cnn", dataset=dataset, data_dir=data_dir,
                                      image_size=12))
        assert data.bad_sample("train", range(data.train_size)) is None
        assert data.bad_sample("val", data.val_order(0, 1)) is None
    argv = ["--model", "mnist_cnn", "--image-size", "12", "--batch-size", "4", "--epochs", "1",
            "--threads-per-rank", "1"]
    bad = os.path.join(root, "train", "3", "zz-bad.png")
    with open(bad, "wb") as f:
        f.write(b"not an image")
    run = launch("mpirun", 2, TRAIN + argv + ["--dataset", "imagefolder", "--data-dir", root, "--loop", "fit"],
                 timeout=180, check=False)
    assert_job_failed_with(run, f"cannot read image {bad} (Unknown image file format.", 2)
    reader = shards.ShardReader(out, "val")
    shard, offset = reader.shards[reader.index["shard"][3]], int(reader.index["offset"][3])
    with open(shard, "r+b") as f:
        f.seek(offset + 40)
        f.write(b"\x00\x01\x02")
    run = launch("single", 1, TRAIN + argv + ["--dataset", "shards", "--data-dir", out, "--loop", "custom"],
                 timeout=180, check=False)
    assert_job_failed_with(run, f"shard {shard}, member 00000003.png is damaged (checksum differs", 1)


def _newest_weights(ckpt_dir) -> dict:
    newest = sorted(n for n in os.listdir(ckpt_dir) if n.endswith(".npz"))[-1]
    with np.load(os.path.join(ckpt_dir, newest)) as f:
        return {k: f[k] for k in f.files if k.startswith("model/")}


SMALL_BN_MODEL = """
def build_model():
    import keras
    return keras.Sequential([keras.Input((32, 32, 3)), keras.layers.Conv2D(8, 3, strides=2),
                             keras.layers.BatchNormalization(), keras.layers.ReLU(),
                             keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(10)])
"""


def test_mid_epoch_resume_on_image_shards_ends_with_the_same_weights(tmp_path):
    """Killed in the middle of an epoch on image shards (random crops and flips drawn per sample
    and epoch, stateless: from a folder too, test_image_augmentations_are_drawn_per_sample...)
    while rank 0 writes a checkpoint, resumed from the interval checkpoint before it, the run
    ends with the weights of an uninterrupted one. On the GPU's input path, forced on the CPU
    (uint8 batches copied ahead to the device and normalised in the step; the CPU's own path, the
    map's floats, is test_image_augmentations_are_drawn_per_sample...'s).
    A small convolutional model with BatchNorm (its moving statistics restored too) and no
    dropout, whose TF draws come from a stream a checkpoint does not hold: ResNet-18 did the same
    at 6 s more a launch."""
    from hvdtrain.data import shards
    from hvdtrain.data.datasets import write_digits_imagefolder

    folder = write_digits_imagefolder(str(tmp_path / "folder"), per_class_train=4, per_class_val=1, size=32)
    data = str(tmp_path / "shards")
    shards.write(data, *shards.imagefolder_sources(folder), shard_mb=0.02, progress=False)
    model = tmp_path / "small_bn.py"
    model.write_text(SMALL_BN_MODEL)
    # 40 images, batch 4 on 2 ranks: 5 steps per epoch, 10 in all.
    common = ["--model", f"{model}:build_model", "--dataset", "shards", "--data-dir", data, "--image-size", "32",
              "--batch-size", "4", "--epochs", "2", "--optimizer", "sgd", "--base-lr", "0.01", "--warmup-epochs", "0",
              "--threads-per-rank", "1", "--seed", "5", "--loop", "custom"]
    # Interval checkpoints every 3 steps, written in the background, and the epochs' ends.
    every = ["--checkpoint-every", "3", "--keep-checkpoints", "9"]
    gpu_input = {**base_env(), "HVDTRAIN_TEST_TF_UINT8_INPUT": "1"}  # hvdtrain/test_hooks.py's TF_UINT8_INPUT
    result = str(tmp_path / "full.json")
    full = run_tf(common + ["--checkpoint-dir", str(tmp_path / "full"), *every, "--result-json", result], timeout=300,
                  env=gpu_input)
    assert load(result)["images_normalised_in"] == "the step, on the device"
    # The start says how the batches are made (as the torch trainer's loader plan does).
    assert ("train input: image files (shards), decoded by tf.data's map (1 thread(s)), shard blocks order (per rank), "
            "crops keyed (seed, epoch, sample), normalised on the device, 4 a batch") in full.output, full.output[-3000:]
    # The windows TensorFlow's ops took from the first training images are the torch trainer's.
    from hvdtrain.torch import images
    torch_crops = images.crops_check(images.ShardImages(data, "train", None), 5)
    assert load(result)["crops"] == torch_crops and torch_crops["samples"] == 16
    saved = sorted(os.listdir(tmp_path / "full"))
    assert saved == ["ckpt-e0000-s00000003-n000000000024.npz", "ckpt-e0001-s00000005.npz",  # every 3 steps (the
                     "ckpt-e0001-s00000006-n000000000008.npz", "ckpt-e0001-s00000009-n000000000032.npz",  # samples of
                     "ckpt-e0002-s00000010.npz"], saved  # the epoch under way: 2 x 4 a step), and epoch ends
    # The same run, each write slowed to 0.6 s (a slow parallel file system), rank 0 SIGKILLed (a
    # node crash: no signal) while it writes a checkpoint after step 6's: its temporary file is
    # there. The previous checkpoint, in the middle of epoch 2, is whole and the rerun starts there.
    split = tmp_path / "split"
    env = {**gpu_input, "HVDTRAIN_TEST_SLOW_CHECKPOINT_WRITE": "0.6"}
    proc = start_launch("mpirun", 2, TRAIN + common + ["--checkpoint-dir", str(split), *every], env=env)
    kill_rank0_while_writing(proc, split, lambda: (split / "ckpt-e0001-s00000006-n000000000008.npz").exists(), 240)
    newest = os.path.basename(latest_checkpoint(str(split)))
    assert newest in ("ckpt-e0001-s00000006-n000000000008.npz", "ckpt-e0001-s00000009-n000000000032.npz"), \
        os.listdir(split)  # mid-epoch 2
    second = run_tf(common + ["--checkpoint-dir", str(split)], timeout=300, env=gpu_input)
    assert "left by an interrupted checkpoint write" in second.output, second.output[-2000:]
    assert f"resumed from {split / newest}" in second.output, second.output[-2000:]
    full, split = _newest_weights(tmp_path / "full"), _newest_weights(tmp_path / "split")
    assert sorted(full) == sorted(split) and len(full) == 8, sorted(full)  # conv 2, BatchNorm 4, dense 2
    for name, value in full.items():
        # BatchNorm's moving variances (~1e4 in the first layer): equal up to float32 rounding;
        # every trained weight is equal.
        diff = float(np.abs(value.astype(np.float64) - split[name].astype(np.float64)).max())
        assert diff <= 1e-6 * max(1.0, float(np.abs(value).max())), f"{name} differs by {diff} after a mid-epoch resume"


def test_a_checkpoint_file_system_gone_read_only_mid_run_ends_every_rank_at_the_next_step(tmp_path):
    """The TF trainer's background interval writes (the npz copied at the step, written on rank 0's
    thread): the file system turns read-only after the first (as Lustre does on errors); the next
    write fails in the thread, and every rank ends with its one line at the step after, long before
    the epoch's end (step 21), exit 2; the first checkpoint is still there."""
    from conftest import small_filesystem

    with small_filesystem(tmp_path / "fs", 64 * 2**20) as fs:
        ckpt_dir = fs / "ckpt"

        def read_only_after_the_first():
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                if ckpt_dir.is_dir() and any(n.endswith(".npz") for n in os.listdir(ckpt_dir)):
                    subprocess.run(["mount", "-o", "remount,ro", str(fs)], check=True)
                    return
                time.sleep(0.01)

        watcher = threading.Thread(target=read_only_after_the_first)
        watcher.start()
        env = {**base_env(), "HVDTRAIN_TEST_SLOW_RANK": "1:0.1"}  # time for the remount between two writes
        run = launch_each_rank_to_its_end(2, TRAIN + DIGITS + ["--loop", "custom", "--epochs", "1",
                                                               "--checkpoint-dir", str(ckpt_dir),
                                                               "--checkpoint-every", "2", "--log-interval", "1"],
                                          timeout=180, env=env)
        watcher.join()
        [first] = sorted(os.listdir(ckpt_dir))
        assert first == "ckpt-e0000-s00000002-n000000000128.npz"  # 2 steps of 2 x 32 samples
        assert_each_rank_failed_with(run, "hvdtrain.tf", f"could not write a checkpoint in {ckpt_dir} "
                                                         "(Read-only file system", 2)
        assert f"the newest checkpoint is still {ckpt_dir / first}" in run.output, run.output[-3000:]
        steps = [int(m) for m in re.findall(r"\| (\d+)/21 \[", run.output)]
        assert steps and max(steps) < 10, f"not ended at the next step: {sorted(set(steps))}\n{run.output[-3000:]}"
