"""hvdtrain.torch.loop (your own torch loop, Horovod underneath).

The distributed test runs torch_examples/own_loop.py under `mpirun -np 2` twice: the first run gets
SIGUSR1 on rank 0 alone in its second epoch, and every rank stops at the same batch with a
checkpoint of it; the second run resumes at that batch, steps exactly the batches left (its last
checkpoint is at 4 epochs x 21 batches), reaches >= 0.9 validation accuracy, ranks' weights equal.
The fast tests drive a `Run` on one rank without Horovod (a stand-in backend): the position kept
in checkpoints, the stop vote, and the one-line errors.
"""
from __future__ import annotations

import os
import re
import signal
import time

import numpy as np
import pytest
import torch

from conftest import PYTHON, REPO, finish_launch, launch, rank_pids, start_launch, step_of, usr1_to_rank0_once
from hvdtrain import errors
from hvdtrain.checkpoint import latest_checkpoint, list_checkpoints
from hvdtrain.config import TrainConfig
from hvdtrain.torch import loop
from hvdtrain.torch.backend import TorchBackend
from hvdtrain.torch.data import ArrayDataset
from hvdtrain.watchdog import Watchdog

EXAMPLE = os.path.join(REPO, "torch_examples", "own_loop.py")
BATCHES_PER_EPOCH = 21  # 1400 digits / 2 ranks / 32 per batch, the last partial batch dropped


@pytest.mark.slow  # real ranks: the distributed tier (the tests below it are fast)
def test_own_loop_stops_on_a_signal_resumes_and_trains(tmp_path):
    ckpt_dir = str(tmp_path / "ckpt")
    argv = [PYTHON, EXAMPLE, "--checkpoint-dir", ckpt_dir, "--epochs", "4"]
    log = tmp_path / "first.log"
    first = usr1_to_rank0_once(argv, log, ckpt_dir, "epoch 1: train loss")
    epoch, batches = map(int, re.search(r"stopped by SIGUSR1 in epoch (\d+) after (\d+) batch", first).groups())
    assert "epoch 4: train loss" not in first, first[-3000:]
    # Where the next run starts: the rest of the stopped epoch (or the next, if it was complete).
    start = (epoch - 1, batches) if batches < BATCHES_PER_EPOCH else (epoch, 0)
    saved = re.findall(r"checkpoint (\S+)", first)[-1]
    assert os.path.basename(saved) == f"ckpt-e{start[0]:04d}-s{(epoch - 1) * BATCHES_PER_EPOCH + batches:08d}.pt"

    second = launch("mpirun", 2, argv, timeout=120).output
    assert f"resumed from {saved} at epoch {start[0] + 1} after {start[1]} batch(es)" in second, second[-3000:]
    done = [int(n) for n in re.findall(r"epoch (\d+): train loss", second)]
    assert done == list(range(start[0] + 1, 5)), second[-3000:]
    # Exactly the batches left were stepped: the last checkpoint is at 4 x 21 steps.
    assert re.findall(r"checkpoint (\S+)", second)[-1].endswith(f"ckpt-e0004-s{4 * BATCHES_PER_EPOCH:08d}.pt")
    acc = float(re.search(r"final val accuracy: ([0-9.]+) over 397 samples", second).group(1))
    assert acc >= 0.9, second[-3000:]
    sums = dict(re.findall(r"rank (\d): weights checksum (\w+)", second))
    assert len(sums) == 2 and sums["0"] == sums["1"], second[-3000:]


@pytest.mark.slow
def test_own_loop_killed_without_a_signal_resumes_at_its_interval_checkpoint(tmp_path):
    """start(checkpoint_every=5): should_stop() writes a checkpoint every 5 steps, mid-epoch too. Rank 1
    SIGKILLed in epoch 2 (nothing to catch), the next run goes on from the newest and ends with the
    weights of a run never interrupted."""
    whole = launch("mpirun", 2, [PYTHON, EXAMPLE, "--checkpoint-dir", str(tmp_path / "whole"), "--epochs", "3",
                                 "--checkpoint-every", "5"], timeout=120).output
    reference = dict(re.findall(r"rank (\d): weights checksum (\w+)", whole))
    written = [int(s) for s in re.findall(r"checkpoint \S+-s(\d+)\.pt", whole)]
    assert written[:5] == [5, 10, 15, 20, 21] and 25 in written, written  # mid-epoch ones, and the epoch's end

    part = str(tmp_path / "part")
    argv = [PYTHON, EXAMPLE, "--checkpoint-dir", part, "--epochs", "3", "--checkpoint-every", "5"]
    proc = start_launch("mpirun", 2, argv)
    deadline = time.monotonic() + 120
    # A mid-epoch checkpoint of epoch 2 or a later one: retention (3 kept) deletes step 25's and
    # 30's by step 42, and a test process kept off the CPU that long (a loaded machine) waited for
    # them until the run had ended.
    while not any(step_of(path) >= 25 for path in list_checkpoints(part)):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0][-3000:]
        time.sleep(0.01)
    os.kill(rank_pids(part, 1)[0], signal.SIGKILL)
    killed, _ = finish_launch(proc, timeout=60)
    assert killed.returncode != 0 and "final val accuracy" not in killed.output, killed.output[-3000:]
    newest = latest_checkpoint(part)
    second = launch("mpirun", 2, argv, timeout=120).output
    assert f"resumed from {newest} at epoch" in second, second[-3000:]
    assert dict(re.findall(r"rank (\d): weights checksum (\w+)", second)) == reference, second[-3000:]


class OneRank(TorchBackend):
    """Horovod's part on a single rank: nothing to reduce or broadcast."""
    name, rank, local_rank, world_size, local_world_size = "one", 0, 0, 1, 1

    def wrap_model(self, model, device):
        return model

    def wrap_optimizer(self, optimizer, model, cfg):
        return optimizer

    def broadcast_state(self, model, optimizer, optimizer_state):
        pass

    def average_buffers(self, model):
        pass

    def allreduce_sum(self, values, name):
        return np.asarray(values, dtype=np.float64)

    def broadcast_object(self, obj, name):
        return obj

    def allgather_object(self, obj, name):
        return [obj]

    def barrier(self):
        pass

    def describe(self):
        return {}

    def shutdown(self):
        pass


@pytest.fixture
def new_run(monkeypatch):
    """Runs on one rank; the stop signals' handlers put back afterwards; a one-line error raises
    SystemExit with its line instead of ending pytest."""
    kept = {sig: signal.getsignal(sig) for sig in (signal.SIGUSR1, signal.SIGTERM)}

    def exit_with_line(err, prog):
        raise SystemExit(f"{prog}: error: {err}")

    monkeypatch.setattr(errors, "report_and_exit", exit_with_line)
    yield lambda: loop.Run(OneRank(), TrainConfig(seed=0), torch.device("cpu"), Watchdog(0, "test", 0, 1))
    for sig, handler in kept.items():
        signal.signal(sig, handler)


def model_and_optimizer(run, lr=0.1):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    return run.prepare(model, torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9))


DATA = ArrayDataset(np.random.default_rng(0).random((40, 4), dtype=np.float32), np.arange(40) % 2)


def train(run, model, optimizer, epoch, batches=None):
    """Step `batches` batches of `epoch` (all: None); the batches' first indices' inputs."""
    seen = []
    for i, (x, y) in enumerate(run.loader(DATA, 4, epoch)):
        if i == batches:
            break
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        run.step_done()
        seen.append(x[0].tolist())
    return seen


def test_a_checkpoint_mid_epoch_resumes_its_remaining_batches(new_run, tmp_path):
    run = new_run()
    model, optimizer = model_and_optimizer(run)
    whole_epoch = [x[0].tolist() for x, _ in run.loader(DATA, 4, 0)]
    assert train(run, model, optimizer, 0, batches=3) == whole_epoch[:3]
    run.save(str(tmp_path), model, optimizer)
    assert "ckpt-e0000-s00000003.pt" in os.listdir(tmp_path)

    again = new_run()
    other, other_optimizer = model_and_optimizer(again, lr=0.5)  # this run's LR wins over the checkpoint's
    assert again.resume(str(tmp_path), other, other_optimizer) == 0
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), other.state_dict().values()))
    assert other_optimizer.param_groups[0]["lr"] == 0.5 and other_optimizer.state  # momentum kept
    assert train(again, other, other_optimizer, 0) == whole_epoch[3:]
    again.save(str(tmp_path), other, other_optimizer)  # the epoch is complete: the next one is where to start
    assert "ckpt-e0001-s00000010.pt" in os.listdir(tmp_path)
    last = new_run()
    assert last.resume(str(tmp_path), *model_and_optimizer(last)) == 1


def test_other_shards_start_the_resumed_epoch_again(new_run, tmp_path):
    run = new_run()
    model, optimizer = model_and_optimizer(run)
    train(run, model, optimizer, 0, batches=3)
    run.save(str(tmp_path), model, optimizer)
    again = new_run()
    again.resume(str(tmp_path), *model_and_optimizer(again))
    assert len(again.loader(DATA, 5, 0)) == 8  # batch 5, not the checkpoint's 4: all 8 batches, none skipped


def test_the_loaders_say_their_dataset_and_batch_as_a_dataloader_does(new_run):
    """Course code divides by `len(loader.dataset)` and reads `loader.batch_size`: the loop's
    loaders answer with the dataset given (not a wrapper of it) and the per-rank batch."""
    run = new_run()
    train_batches, val_batches = run.loader(DATA, 4, 0), run.eval_loader(DATA, 8)
    assert train_batches.dataset is DATA and val_batches.dataset is DATA and len(val_batches.dataset) == 40
    assert train_batches.batch_size == 4 and val_batches.batch_size == 8


def test_the_stop_vote(new_run, monkeypatch):
    run = new_run()
    assert not run.should_stop() and run.stopped_by is None
    run.stop.signal_name = "SIGUSR1"
    assert run.should_stop() and run.stopped_by == "SIGUSR1"
    # Another rank had SIGTERM: scancel wins over the time-limit warning (no requeue).
    # (The vote: SIGUSR1, SIGTERM, a timed checkpoint, rank 0's background write running, failed.)
    monkeypatch.setattr(run.backend, "allreduce_sum", lambda values, name: np.array([1.0, 1.0, 0.0, 0.0, 0.0]))
    assert run.should_stop() and run.stopped_by == "SIGTERM"


def test_a_failed_background_interval_write_ends_the_loop_at_the_next_vote(new_run, tmp_path, monkeypatch):
    """start(checkpoint_every=2): the interval checkpoint is written in the background; when that
    write fails (a full disk), the next should_stop() ends every rank with its one line, naming
    the checkpoint that is still whole; the write before it succeeded."""
    import errno

    from hvdtrain import checkpoint as ckpt

    run = loop.Run(OneRank(), TrainConfig(seed=0, checkpoint_every="2", checkpoint_dir=str(tmp_path)),
                   torch.device("cpu"), Watchdog(0, "test", 0, 1))
    # The lifecycle's part, with the write in this process where the disk can be made full; the
    # writer process's failures: test_checkpoint_every.py.
    run.writer.background.close()  # the writer process start() began
    run.writer.background = ckpt.ThreadWrites()
    model, optimizer = model_and_optimizer(run)
    run.resume(str(tmp_path), model, optimizer)
    batches = iter(run.loader(DATA, 4, 0))
    for _ in range(2):
        next(batches)
        run.step_done()
    assert not run.should_stop()  # step 2: the first interval checkpoint, in the background
    run.writer.wait()
    first = ckpt.latest_checkpoint(str(tmp_path))
    assert first.endswith("ckpt-e0000-s00000002.pt")

    def full(path, write, signed):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(ckpt.files, "atomic_write", full)  # what the writer calls
    for _ in range(2):
        next(batches)
        run.step_done()
    assert not run.should_stop()  # step 4: its write fails on the writer's thread
    run.writer.wait()
    with pytest.raises(SystemExit) as ended:
        run.should_stop()
    assert f"could not write a checkpoint in {tmp_path} (No space left on device" in str(ended.value)
    assert str(ended.value).endswith(f"the newest checkpoint is still {first}")


def test_bad_input_is_one_line(new_run, tmp_path):
    run = new_run()
    model, optimizer = model_and_optimizer(run)
    with pytest.raises(SystemExit, match=r"takes the optimizer run.prepare\(\) returned"):
        run.resume(str(tmp_path), model, torch.optim.SGD(model.parameters(), lr=0.1))
    train(run, model, optimizer, 0)
    run.save(str(tmp_path), model, optimizer)
    bigger = torch.nn.Linear(4, 3)
    again = new_run()
    with pytest.raises(SystemExit) as refused:
        again.resume(str(tmp_path), *again.prepare(bigger, torch.optim.SGD(bigger.parameters(), lr=0.1)))
    assert "does not fit this model or optimizer (RuntimeError: " in str(refused.value)
    assert "\n" not in str(refused.value)
    (tmp_path / "ckpt-e0002-s00000020.pt").write_bytes(b"not a checkpoint")  # newer, unreadable
    third = new_run()
    assert third.resume(str(tmp_path), *model_and_optimizer(third)) == 1  # the one before it
    assert (tmp_path / "ckpt-e0002-s00000020.pt.damaged").exists()  # moved aside, as the trainer does
    with pytest.raises(SystemExit, match="batch-size must be >= 1"):
        third.loader(DATA, 0, 0)
