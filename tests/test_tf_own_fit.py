"""hvdtrain.tf.callbacks (your own Keras model.fit, Horovod underneath) under `mpirun -np 2`.

tf_examples/keras_own_fit.py twice: the first run gets SIGUSR1 on rank 0 alone after its first
epoch: every rank stops at the same batch (the vote) and rank 0 writes a checkpoint there. The
second run resumes at that batch of that epoch, steps exactly the batches left, reaches >= 0.9
validation accuracy, and both ranks end with equal weights. tf_examples/keras_own_fit_images.py
once: the same callbacks on JPEG files read by hvd.image_data.

checkpoint_every= (tests/scripts/keras_own_fit_ordered.py, a user's fit whose data order and
layers let a resume end with an uninterrupted run's very weights): a time interval agreed by the
ranks, rank 0 SIGKILLed while its background writer writes and the rerun resuming at the last
interval with the uninterrupted weights, a write that fails in the writer's thread ending every
rank with one line before the epoch's end.

    python -m pytest -q tests/test_tf_own_fit.py
"""
from __future__ import annotations

import os
import re
import subprocess

import pytest

from conftest import (PYTHON, REPO, assert_each_rank_failed_with, base_env, checksums, kill_rank0_while_writing,
                      launch, launch_each_rank_to_its_end, small_filesystem, start_launch, step_of, usr1_to_rank0_once)
from hvdtrain.checkpoint import latest_checkpoint, list_checkpoints

pytestmark = pytest.mark.slow  # real ranks: the distributed tier

EXAMPLE = os.path.join(REPO, "tf_examples", "keras_own_fit.py")
BATCHES_PER_EPOCH = 22  # 700 digits per rank at 2 ranks, 32 per batch: 21 full and one of 28
EPOCHS = 12  # long enough that the signal, sent after epoch 1, lands while fit runs (an epoch: ~0.2 s)


def test_importing_hvdtrain_tf_imports_no_framework_and_callbacks_is_callable():
    code = ("import sys, hvdtrain.tf as t; cb, st = t.callbacks, t.start; import hvdtrain.tf.keras_callbacks; "
            "assert callable(t.callbacks) and callable(st) and 'tensorflow' not in sys.modules, sys.modules.keys()")
    subprocess.run([PYTHON, "-c", code], check=True, env=base_env(), cwd=REPO, timeout=60)


def test_own_keras_fit_stops_on_sigusr1_resumes_and_trains(tmp_path):
    ckpt_dir = str(tmp_path / "ckpt")
    argv = [PYTHON, EXAMPLE, "--checkpoint-dir", ckpt_dir, "--epochs", str(EPOCHS)]
    log = tmp_path / "first.log"
    first = usr1_to_rank0_once(argv, log, ckpt_dir, "checkpoint " + os.path.join(ckpt_dir, "ckpt-e0001-"))
    epoch, batches = map(int, re.search(r"stopped by SIGUSR1 in epoch (\d+) after (\d+) batch", first).groups())
    assert epoch < EPOCHS and f"Epoch {EPOCHS}/{EPOCHS}" not in first, first[-3000:]
    # Every 10 batches and at the epoch's end: the vote's only places.
    assert batches % 10 == 0 or batches == BATCHES_PER_EPOCH, first[-3000:]
    steps = (epoch - 1) * BATCHES_PER_EPOCH + batches
    # A stop mid-epoch resumes at that batch of that epoch; at its end, at the next epoch.
    start, done = (epoch, 0) if batches == BATCHES_PER_EPOCH else (epoch - 1, batches)
    saved = re.findall(r"hvdtrain.tf: checkpoint (\S+)", first)[-1]
    assert os.path.basename(saved) == f"ckpt-e{start:04d}-s{steps:08d}.npz", first[-3000:]

    second = launch("mpirun", 2, argv, timeout=120).output
    assert f"resumed from {saved} at epoch {start + 1} after {done} batch(es)" in second, second[-3000:]
    ran = [int(n) for n in re.findall(rf"<stdout>:Epoch (\d+)/{EPOCHS}", second)]
    assert ran == list(range(start + 1, EPOCHS + 1)), second[-3000:]
    # Exactly the batches left (the stopped epoch's first ones read again, not trained): the
    # steps of the last checkpoint are those of a run never stopped.
    last = EPOCHS * BATCHES_PER_EPOCH
    newest = re.findall(r"hvdtrain.tf: checkpoint (\S+)", second)[-1]
    assert os.path.basename(newest) == f"ckpt-e{EPOCHS:04d}-s{last:08d}.npz", second[-3000:]
    accuracy = float(re.search(r"\[1,0\]<stdout>:val_accuracy=([0-9.]+) \(397 samples, 2 ranks\)", second).group(1))
    assert accuracy >= 0.9, second[-3000:]
    sums = checksums(second)
    assert len(sums) == 2 and sums["0"] == sums["1"], second[-3000:]
    assert "Traceback" not in first + second


def test_own_keras_fit_on_image_files_read_by_hvdtrain(tmp_path):
    """tf_examples/keras_own_fit_images.py under mpirun -np 2: a user's Keras model.fit on JPEG
    files through hvd.image_data (the trainer's order and crops: tests/test_tf_trainer.py compares
    the batches), rank 0's checkpoint each epoch, every validation image scored once (25 of the 50
    on rank 0), the same weights on both ranks."""
    from hvdtrain.data.datasets import write_digits_imagefolder

    root = write_digits_imagefolder(str(tmp_path / "jpeg"), per_class_train=20, per_class_val=5, fmt="jpeg")
    ckpt_dir = str(tmp_path / "ckpt")
    run = launch("mpirun", 2, [PYTHON, os.path.join(REPO, "tf_examples", "keras_own_fit_images.py"), "--data-dir", root,
                               "--checkpoint-dir", ckpt_dir, "--epochs", "2"], timeout=180)
    # 200 training images, 2 ranks x 16: 6 steps an epoch.
    assert [os.path.basename(p) for p in list_checkpoints(ckpt_dir)][-1] == "ckpt-e0002-s00000012.npz", run.output[-3000:]
    assert re.search(r"val_accuracy=[0-9.]+ \(25 samples on rank 0 of 2\)", run.output), run.output[-3000:]
    sums = checksums(run.output)
    assert len(sums) == 2 and sums["0"] == sums["1"] and "Traceback" not in run.output, run.output[-3000:]


ORDERED = os.path.join(REPO, "tests", "scripts", "keras_own_fit_ordered.py")
ORDERED_STEPS = 3 * BATCHES_PER_EPOCH  # its 3 epochs


@pytest.fixture(scope="module")
def ordered_uninterrupted(tmp_path_factory):
    """The ordered fit to its end with checkpoint_every='0.3s' and rank 1 slower (its own clock
    would say 'due' at other steps): only rank 0's clock counts, through the vote every rank
    joins, so every rank checkpoints at the same step, else the checkpoint's collectives would
    be mismatched (a hang, a crash). (The checkpoints do not change the weights: no BatchNorm.)"""
    ckpt_dir = tmp_path_factory.mktemp("ordered") / "ckpt"
    env = {**base_env(), "HVDTRAIN_TEST_SLOW_RANK": "1:0.03"}
    run = launch("mpirun", 2, [PYTHON, ORDERED, "--checkpoint-dir", str(ckpt_dir), "--checkpoint-every", "0.3s"],
                 timeout=120, env=env)
    return run.output, str(ckpt_dir)


def test_keras_fit_time_interval_is_agreed_by_every_rank(ordered_uninterrupted):
    output, ckpt_dir = ordered_uninterrupted
    steps = [step_of(p) for p in list_checkpoints(ckpt_dir)]
    middle = [s for s in steps if s % BATCHES_PER_EPOCH]
    assert len(middle) >= 2 and steps[-1] == ORDERED_STEPS, (steps, output[-3000:])
    sums = checksums(output)
    assert len(sums) == 2 and sums["0"] == sums["1"], output[-3000:]


def test_keras_fit_killed_while_writing_resumes_at_its_interval_with_the_uninterrupted_weights(
        ordered_uninterrupted, tmp_path):
    """checkpoint_every=5, rank 1 slowed, each write slowed to 0.6 s (several steps: written in the
    background); rank 0 SIGKILLed (no signal to catch) in epoch 2 while a write is in flight. The
    rerun resumes at the newest interval checkpoint, not at the epoch's start, reads that epoch's
    first batches again without training on them, and ends with the unstopped run's weights."""
    ckpt_dir = tmp_path / "ckpt"
    argv = [PYTHON, ORDERED, "--checkpoint-dir", str(ckpt_dir), "--checkpoint-every", "5"]
    env = {**base_env(), "HVDTRAIN_TEST_SLOW_RANK": "1:0.1", "HVDTRAIN_TEST_SLOW_CHECKPOINT_WRITE": "0.6"}
    proc = start_launch("mpirun", 2, argv, env=env)
    kill_rank0_while_writing(proc, ckpt_dir, lambda: any(step_of(p) >= 25 for p in list_checkpoints(str(ckpt_dir))),
                             120)
    resumed_from = latest_checkpoint(str(ckpt_dir))
    newest = step_of(resumed_from)
    assert 25 <= newest < ORDERED_STEPS and newest % BATCHES_PER_EPOCH and newest % 5 == 0, newest

    rest = launch("mpirun", 2, argv, timeout=120).output
    epoch, batches = divmod(newest, BATCHES_PER_EPOCH)
    assert f"resumed from {resumed_from} at epoch {epoch + 1} after {batches} batch(es)" in rest, rest[-3000:]
    assert step_of(latest_checkpoint(str(ckpt_dir))) == ORDERED_STEPS, rest[-3000:]
    sums, unstopped = checksums(rest), checksums(ordered_uninterrupted[0])
    assert len(sums) == 2 and sums == unstopped, (sums, unstopped, rest[-3000:])


def test_keras_fit_background_write_failure_ends_every_rank_before_the_epochs_end(ordered_uninterrupted, tmp_path):
    """A file system with room for one checkpoint and a half: the interval checkpoint of step 8
    is written, step 16's fails in the writer's thread; every rank ends with rank 0's one line at
    the next step, exit 2, before the epoch's end (step 22: rank 0's progress line for epoch 1
    never printed), whose inline checkpoint would otherwise be the first to find out."""
    size = os.path.getsize(latest_checkpoint(ordered_uninterrupted[1]))
    with small_filesystem(tmp_path / "small-fs", int(size * 1.5)) as full:
        run = launch_each_rank_to_its_end(2, [PYTHON, ORDERED, "--checkpoint-dir", str(full),
                                              "--checkpoint-every", "8", "--keep", "1"], timeout=120)
        [first] = list_checkpoints(str(full))
        assert step_of(first) == 8, first
        assert_each_rank_failed_with(run, "hvdtrain.tf", f"could not write a checkpoint in {full} (", 2)
        assert f"the newest checkpoint is still {first}" in run.output, run.output[-3000:]
        assert f"{BATCHES_PER_EPOCH}/{BATCHES_PER_EPOCH} - " not in run.output, run.output[-3000:]


STEPS_PER_EXECUTION = """
import hashlib, sys, numpy as np, hvdtrain.tf
hvd = hvdtrain.tf.start(seed=0)
import tf_keras as keras
x = np.random.default_rng(hvd.rank).normal(size=(256, 4)).astype("float32") * (1 + hvd.rank)  # BatchNorm: ranks differ
model = keras.Sequential([keras.Input((4,)), keras.layers.BatchNormalization(), keras.layers.Dense(1)])
model.compile(optimizer=hvd.optimizer(keras.optimizers.legacy.SGD(0.01)), loss="mse", steps_per_execution=4)
for directory, every, epochs in ((sys.argv[1], None, 2), (None, None, 3), (sys.argv[1], 5, 3)):
    callbacks = hvdtrain.tf.callbacks(model, checkpoint_dir=directory, checkpoint_every=every)
    model.fit(x, x.sum(1), batch_size=16, epochs=epochs, initial_epoch=callbacks.initial_epoch, callbacks=callbacks,
              verbose=0)
    checksum = hashlib.sha256(b"".join(w.tobytes() for w in model.get_weights())).hexdigest()[:16]
    print(f"rank {hvd.rank}: weights checksum {checksum}", flush=True)
"""


def test_keras_fit_counts_steps_per_execution_and_refuses_an_interval_with_them(tmp_path):
    """model.compile(steps_per_execution=4) under mpirun -np 2: the callbacks' step count is the
    optimizer's (16 an epoch, not one per call of 4); a fit without a checkpoint directory still
    ends with one set of BatchNorm statistics on every rank (the ranks' data differ); and
    checkpoint_every, which may fall inside a call, is refused in one line on every rank, exit 2."""
    ckpt_dir = tmp_path / "ckpt"
    run = launch_each_rank_to_its_end(2, [PYTHON, "-c", STEPS_PER_EXECUTION, str(ckpt_dir)], timeout=120)
    assert sorted(os.listdir(ckpt_dir)) == ["ckpt-e0001-s00000016.npz", "ckpt-e0002-s00000032.npz"]
    sums = re.findall(r"<stdout>:rank (\d): weights checksum (\w+)", run.output)
    by_rank = {rank: [s for r, s in sums if r == rank] for rank in "01"}  # each rank's, fit by fit
    assert len(by_rank["0"]) == len(by_rank["1"]) == 2 and by_rank["0"] == by_rank["1"], run.output[-3000:]
    assert_each_rank_failed_with(run, "hvdtrain.tf", "checkpoint_every needs model.compile(steps_per_execution=1) "
                                                     "(got 4): an interval checkpoint may fall after any batch", 2)
