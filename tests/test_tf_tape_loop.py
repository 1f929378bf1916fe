"""hvdtrain.tf.start_tape_loop (your own GradientTape loop, Horovod underneath): tf_examples/tape_loop_digits.py.

The distributed tests run the example under `mpirun -np 2` three times: once to its end (>= 0.9
validation accuracy over all 397 digits, both ranks' weights equal), once with SIGUSR1 to rank 0
alone after its first epoch (every rank stops at the same step, rank 0 checkpoints it), and that
run again: it resumes at the stopped step, steps exactly the steps left, and ends with the very
weights of the unstopped run (same checksum: data order, Dropout's random state and the optimizer's
are all in the checkpoint or derived from the position). The fast test drives a TapeJob without
Horovod: bad input is one line.

    python -m pytest -q tests/test_tf_tape_loop.py
"""
from __future__ import annotations

import os
import re
import signal
import time

import numpy as np
import pytest

from conftest import (PYTHON, REPO, base_env, checksums, finish_launch, launch, rank_pids, start_launch, step_of,
                      usr1_to_rank0_once)
from hvdtrain.checkpoint import latest_checkpoint, list_checkpoints
from hvdtrain import errors
from hvdtrain.config import TrainConfig

EXAMPLE = os.path.join(REPO, "tf_examples", "tape_loop_digits.py")
BATCHES_PER_EPOCH = 21  # 1400 digits / 2 ranks / 32 per batch, the last partial batch dropped
EPOCHS = 8  # the signal, sent after epoch 1, lands long before the end (an epoch: ~0.3 s)


@pytest.fixture(scope="module")
def tape_uninterrupted(tmp_path_factory) -> str:
    ckpt_dir = str(tmp_path_factory.mktemp("uninterrupted") / "ckpt")
    return launch("mpirun", 2, [PYTHON, EXAMPLE, "--checkpoint-dir", ckpt_dir, "--epochs", str(EPOCHS)],
                  timeout=120).output


@pytest.mark.slow  # real ranks: the distributed tier (the last test is fast)
def test_tape_loop_trains_on_two_ranks(tape_uninterrupted):
    out = tape_uninterrupted
    assert [int(n) for n in re.findall(r"epoch (\d+): train loss", out)] == list(range(1, EPOCHS + 1)), out[-3000:]
    accuracy = float(re.search(r"\[1,0\]<stdout>:val_accuracy=([0-9.]+) \(397 samples, 2 ranks\)", out).group(1))
    assert accuracy >= 0.9, out[-3000:]
    sums = checksums(out)
    assert len(sums) == 2 and sums["0"] == sums["1"], out[-3000:]
    assert "Traceback" not in out


@pytest.mark.slow
def test_tape_loop_stops_on_sigusr1_and_resumes_to_the_same_weights(tape_uninterrupted, tmp_path):
    ckpt_dir = str(tmp_path / "ckpt")
    argv = [PYTHON, EXAMPLE, "--checkpoint-dir", ckpt_dir, "--epochs", str(EPOCHS)]
    first = usr1_to_rank0_once(argv, tmp_path / "first.log", ckpt_dir, "epoch 1: train loss")
    epoch, batches = map(int, re.search(r"stopped by SIGUSR1 in epoch (\d+) after (\d+) batch", first).groups())
    assert 2 <= epoch < EPOCHS and "val_accuracy" not in first and not checksums(first), first[-3000:]
    # Where the next run starts: the rest of the stopped epoch (or the next, if it was complete).
    start = (epoch - 1, batches) if batches < BATCHES_PER_EPOCH else (epoch, 0)
    saved = re.findall(r"hvdtrain.tf: checkpoint (\S+)", first)[-1]
    steps = (epoch - 1) * BATCHES_PER_EPOCH + batches
    assert os.path.basename(saved) == f"ckpt-e{start[0]:04d}-s{steps:08d}.npz", first[-3000:]

    second = launch("mpirun", 2, argv, timeout=120).output
    assert f"resumed from {saved} at epoch {start[0] + 1} after {start[1]} batch(es)" in second, second[-3000:]
    done = [int(n) for n in re.findall(r"epoch (\d+): train loss", second)]
    assert done == list(range(start[0] + 1, EPOCHS + 1)), second[-3000:]
    # Exactly the steps left: the last checkpoint is at EPOCHS x 21 steps.
    last = re.findall(r"hvdtrain.tf: checkpoint (\S+)", second)[-1]
    assert os.path.basename(last) == f"ckpt-e{EPOCHS:04d}-s{EPOCHS * BATCHES_PER_EPOCH:08d}.npz", second[-3000:]
    # The weights of the run that was never stopped, bit for bit, on both ranks.
    sums, unstopped = checksums(second), checksums(tape_uninterrupted)
    assert len(sums) == 2 and sums == unstopped, (sums, unstopped, second[-3000:])
    assert "Traceback" not in first + second


@pytest.mark.slow
def test_tape_loop_killed_without_a_signal_resumes_at_its_interval_checkpoint(tape_uninterrupted, tmp_path):
    """start_tape_loop(checkpoint_every=5): rank 1 SIGKILLed (no signal to catch) in epoch 3; the
    rerun resumes at the newest interval checkpoint (written in the background), not at the
    epoch's start, and ends with the weights of the run that was never stopped."""
    ckpt_dir = str(tmp_path / "ckpt")
    argv = [PYTHON, EXAMPLE, "--checkpoint-dir", ckpt_dir, "--epochs", str(EPOCHS), "--checkpoint-every", "5"]
    env = {**base_env(), "HVDTRAIN_TEST_SLOW_RANK": "1:0.05"}  # (read by hvdtrain's rank 1 at each step)
    proc = start_launch("mpirun", 2, argv, env=env)
    deadline = time.monotonic() + 120
    while not any(step_of(p) >= 50 for p in list_checkpoints(ckpt_dir)):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0][-3000:]
        time.sleep(0.05)
    [rank1] = rank_pids(ckpt_dir, 1)
    os.kill(rank1, signal.SIGKILL)
    killed, _ = finish_launch(proc, timeout=60)
    assert killed.returncode != 0
    resumed_from = latest_checkpoint(ckpt_dir)
    newest = step_of(resumed_from)
    assert newest >= 50 and newest % BATCHES_PER_EPOCH and newest % 5 == 0, newest  # mid-epoch, on the interval
    second = launch("mpirun", 2, argv, timeout=120).output
    epoch, batches = divmod(newest, BATCHES_PER_EPOCH)
    assert f"resumed from {resumed_from} at epoch {epoch + 1} after {batches} batch(es)" in second, second[-3000:]
    sums, unstopped = checksums(second), checksums(tape_uninterrupted)
    assert len(sums) == 2 and sums == unstopped, (sums, unstopped, second[-3000:])


class OneRank:
    """Horovod's part on a single rank, for the checks made before any collective."""
    rank, local_rank, world_size, local_world_size, device = 0, 0, 1, 1, "cpu"

    def broadcast_object(self, value, name):
        return value

    def broadcast_variables(self, variables):
        pass

    def average_variables(self, variables):
        pass

    def allreduce_sum(self, values, name):
        return values


@pytest.mark.parametrize("flavour", ["keras 3", "tf_keras", "tf_keras legacy"])
def test_a_resume_keeps_this_runs_learning_rate(flavour, tmp_path):
    """A checkpoint holds the LR of its run (it is among the optimizer's variables); a resume at
    another world size has another LR (x ranks), which must win, with each Keras's optimizers
    (the tf_keras path restored the checkpoint's before)."""
    import importlib

    keras = importlib.import_module("keras" if flavour == "keras 3" else "tf_keras")
    make = keras.optimizers.legacy.SGD if flavour.endswith("legacy") else keras.optimizers.SGD
    from hvdtrain.tf.tape_loop import TapeJob

    kept = {sig: signal.getsignal(sig) for sig in (signal.SIGUSR1, signal.SIGTERM)}
    try:
        cfg = TrainConfig(framework="tf", seed=0, watchdog_seconds=0)
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        first = TapeJob(keras, OneRank(), cfg, None)
        written = make(learning_rate=0.1, momentum=0.9)
        first.resume(str(tmp_path), model, written)
        first.dataset((np.zeros((8, 3), np.float32), np.zeros(8, np.int64)), 4, 0)
        first.save(str(tmp_path), model, written)
        resumed = make(learning_rate=0.4, momentum=0.9)  # 4 ranks now: 4 x the LR
        TapeJob(keras, OneRank(), cfg, None).resume(str(tmp_path), model, resumed)
        assert float(np.asarray(resumed.learning_rate)) == pytest.approx(0.4)
        momentum = resumed._get_hyper("momentum") if flavour.endswith("legacy") else resumed.momentum
        assert float(np.asarray(momentum)) == pytest.approx(0.9)  # the rest of the optimizer as it was
    finally:
        for sig, handler in kept.items():
            signal.signal(sig, handler)


def test_bad_input_is_one_line(monkeypatch):
    from hvdtrain.tf.tape_loop import TapeJob

    kept = {sig: signal.getsignal(sig) for sig in (signal.SIGUSR1, signal.SIGTERM)}

    def exit_with_line(err, prog):
        raise SystemExit(f"{prog}: error: {err}")

    monkeypatch.setattr(errors, "report_and_exit", exit_with_line)
    try:
        job = TapeJob(None, OneRank(), TrainConfig(framework="tf", seed=0, watchdog_seconds=0), None)
        x, y = np.zeros((40, 8, 8, 1), np.float32), np.zeros(39, np.int64)
        with pytest.raises(SystemExit, match=r"^hvdtrain.tf: error: job.dataset\(\): the arrays hold different "
                                             r"numbers of samples \(\[39, 40\]\)$"):
            job.dataset((x, y), 8, 0)
        with pytest.raises(SystemExit, match="40 samples on 1 rank.s. make 40 per rank, less than one batch of 64"):
            job.dataset(x, 64, 0)
        with pytest.raises(SystemExit, match=r"takes in-memory arrays, .* got builtins.object"):
            job.dataset(object(), 8, 0)
    finally:
        for sig, handler in kept.items():
            signal.signal(sig, handler)
