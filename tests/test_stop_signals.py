"""A stop signal at any moment keeps its checkpoint (real ranks under mpirun and srun, each trial
with a hard timeout): an imagefolder run with 2 DataLoader workers per rank (kept across epochs)
and one-step epochs, so that epoch ends and validation passes come every few hundred
milliseconds, gets SIGTERM at a random moment, sent as Slurm sends it: to every process of the job, workers included. Every
trial must end with "stopped by SIGTERM at step S; checkpoint written", that checkpoint on disk,
no traceback, and no process of the job left behind.

HVDTRAIN_STOP_TRIALS (default 3: 6 trials over the two launchers) sets the trials per launcher;
HVDTRAIN_STOP_TRIALS=50 for a longer hunt after a change to signals, workers or checkpoints.
"""
from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import time

import pytest

from conftest import PYTHON, REPO, launcher_prefix, marked_env, marked_pids, processes_left
from hvdtrain.checkpoint import list_checkpoints

pytestmark = pytest.mark.slow  # real ranks: the distributed tier

TRIALS = int(os.environ.get("HVDTRAIN_STOP_TRIALS", "3"))


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    from hvdtrain.data.datasets import write_digits_imagefolder

    # 20 training images: one step of 8 per rank and epoch at 2 ranks; 10 for validation.
    return write_digits_imagefolder(str(tmp_path_factory.mktemp("tiny") / "data"), per_class_train=2,
                                    per_class_val=1, size=8)


def signal_every_process(mark: str, launcher_pid: int) -> None:
    """SIGTERM to every process of the job but the launcher, as Slurm signals a step."""
    for pid in marked_pids(mark):
        if pid != launcher_pid:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass


def trial(launcher: str, folder: str, tmp_path, seed: int) -> str:
    """One run stopped at a random moment; returns what it did, for the summary."""
    rng = random.Random(seed)
    mark = str(tmp_path / f"trial-{seed}")
    ckpt_dir = os.path.join(mark, "ckpt")
    name = f"hvdtrain-stop-{os.getpid()}-{seed}"
    prefix = launcher_prefix(launcher, 2)
    if launcher == "srun":
        prefix.insert(1, f"--job-name={name}")
    cmd = prefix + [PYTHON, "-m", "hvdtrain.torch", "--model", "mnist_cnn", "--dataset", "imagefolder",
                    "--data-dir", folder, "--image-size", "8", "--batch-size", "8", "--threads-per-rank", "1",
                    "--epochs", "500", "--num-workers", "2", "--checkpoint-dir", ckpt_dir,
                    "--watchdog-seconds", "60"]
    out_path = os.path.join(str(tmp_path), f"trial-{seed}.log")
    os.makedirs(mark, exist_ok=True)
    with open(out_path, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, text=True, env=marked_env(mark),
                                cwd=REPO, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while "hvdtrain.torch: epoch 1.00:" not in open(out_path, errors="replace").read():  # the forkserver is up
            assert proc.poll() is None and time.monotonic() < deadline, open(out_path, errors="replace").read()[-3000:]
            time.sleep(0.05)
        # A moment within the next few epochs: each is one step, then a validation pass (the
        # workers, kept, switch between them), so the draws land at epoch boundaries often.
        time.sleep(rng.uniform(0.0, 2.0))
        if launcher == "srun":
            subprocess.run(["scancel", "--signal=TERM", "--name", name], check=True, timeout=30)
        else:
            signal_every_process(mark, proc.pid)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    text = open(out_path, errors="replace").read()
    stopped = re.search(r"stopped by SIGTERM at step (\d+); checkpoint written", text)
    assert stopped, f"trial {seed}: no checkpoint at the stop:\n{text[-4000:]}"
    assert "Traceback" not in text and "DataLoader worker" not in text, f"trial {seed}:\n{text[-4000:]}"
    steps = [int(re.search(r"-s(\d+)\.pt$", p).group(1)) for p in list_checkpoints(ckpt_dir)]
    assert int(stopped.group(1)) in steps, (seed, steps)
    left = processes_left(mark)
    assert not left, f"trial {seed}: left behind: {left}"
    return f"step {stopped.group(1)}"


def run_trials(launcher: str, folder: str, tmp_path) -> None:
    done = [trial(launcher, folder, tmp_path, seed) for seed in range(TRIALS)]
    print(f"{launcher}: {len(done)} stops, each with its checkpoint: {', '.join(done)}")


def test_stop_signal_at_random_moments_under_mpirun(tiny_folder, tmp_path):
    run_trials("mpirun", tiny_folder, tmp_path)


def test_stop_signal_at_random_moments_under_srun(slurm_cluster, tiny_folder, tmp_path):
    run_trials("srun", tiny_folder, tmp_path)
