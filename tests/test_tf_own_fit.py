"""hvdtrain.tf.callbacks (your own Keras model.fit, Horovod underneath): tf_examples/keras_own_fit.py
under `mpirun -np 2`, twice. The first run gets SIGUSR1 on rank 0 alone after its first epoch:
every rank stops at the same batch (the vote) and rank 0 writes a checkpoint there. The second
run resumes at the right epoch (the stopped one again if it was stopped mid-epoch), steps exactly
the batches left, reaches >= 0.9 validation accuracy, and both ranks end with equal weights.

    python -m pytest -q tests/test_tf_own_fit.py
"""
from __future__ import annotations

import os
import re
import subprocess

import pytest

from conftest import PYTHON, REPO, base_env, launch, usr1_to_rank0_once

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
    # A stop mid-epoch resumes that epoch from its first batch; at its end, the next epoch.
    start = epoch if batches == BATCHES_PER_EPOCH else epoch - 1
    saved = re.findall(r"hvdtrain.tf: checkpoint (\S+)", first)[-1]
    assert os.path.basename(saved) == f"ckpt-e{start:04d}-s{steps:08d}.npz", first[-3000:]

    second = launch("mpirun", 2, argv, timeout=120).output
    assert f"resumed from {saved} at epoch {start + 1}" in second, second[-3000:]
    ran = [int(n) for n in re.findall(rf"<stdout>:Epoch (\d+)/{EPOCHS}", second)]
    assert ran == list(range(start + 1, EPOCHS + 1)), second[-3000:]
    # Exactly the batches left (and the interrupted epoch's again): steps of the last checkpoint.
    last = steps + (EPOCHS - start) * BATCHES_PER_EPOCH
    newest = re.findall(r"hvdtrain.tf: checkpoint (\S+)", second)[-1]
    assert os.path.basename(newest) == f"ckpt-e{EPOCHS:04d}-s{last:08d}.npz", second[-3000:]
    accuracy = float(re.search(r"\[1,0\]<stdout>:val_accuracy=([0-9.]+) \(397 samples, 2 ranks\)", second).group(1))
    assert accuracy >= 0.9, second[-3000:]
    sums = dict(re.findall(r"<stdout>:rank (\d): weights checksum (\w+)", second))
    assert len(sums) == 2 and sums["0"] == sums["1"], second[-3000:]
    assert "Traceback" not in first + second
