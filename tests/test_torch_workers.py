"""DataLoader workers without ranks (fast tier): data in memory starts no worker; workers are
forked by a forkserver, never by the rank (a fork from a rank's threads can deadlock), are born
with the stop signals blocked and then ignore them, and end with the process that started them.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from multiprocessing import forkserver

import pytest
import torch
from torch.utils.data import Dataset

import loaders
from hvdtrain.config import TrainConfig
from hvdtrain.torch import data, loader

STOP_BITS = (1 << (signal.SIGTERM - 1)) | (1 << (signal.SIGUSR1 - 1))


def config(workers: int = 2) -> TrainConfig:
    return TrainConfig(framework="torch", model="mnist_cnn", dataset="digits", batch_size=2, num_workers=workers,
                       seed=1)


class ProcessProbe(Dataset):
    """Each sample: the pid and parent pid of the process that loaded it."""

    def __len__(self):
        return 8

    def __getitem__(self, i):
        return torch.tensor([os.getpid(), os.getppid()])


def signal_masks(pid: int) -> dict[str, int]:
    """SigBlk and SigIgn of a process, as bit masks."""
    with open(f"/proc/{pid}/status") as f:
        return {k: int(v, 16) for k, v in (line.split(":\t") for line in f) if k in ("SigBlk", "SigIgn")}


@pytest.fixture(autouse=True)
def no_kept_workers():
    """Each test's kept loaders (hvdtrain/torch/loader.py) end with it."""
    yield
    loader.close_loaders()


class SeededNoise(Dataset):
    """Sample i: a draw from torch's generator (as a random augmentation), and the loading pid."""

    def __len__(self):
        return 8

    def __getitem__(self, i):
        return torch.tensor([torch.rand(()).item(), os.getpid()], dtype=torch.float64), i


def test_workers_are_kept_across_epochs_and_augment_each_epoch_as_fresh_workers_would():
    """One loader and its workers for the whole run, in training and validation; SeededSamples
    still draws epoch 1's augmentation in workers that started in epoch 0 (they hold epoch 0's
    copy of the dataset): the same draws as the main process without workers."""
    def epochs(workers):
        dataset, cfg = data.SeededSamples(SeededNoise(), seed=3), config(workers)
        made, seen = [], []
        for epoch in (0, 1):
            made.append(loaders.train_loader(dataset, cfg, 0, 1, epoch=epoch, skip_batches=1 if epoch else 0))
            seen.append(torch.cat([x for x, _ in made[-1]]))
        return made, seen

    made, kept = epochs(workers=2)
    _, plain = epochs(workers=0)
    assert made[0] is made[1] and made[0].persistent_workers
    assert {float(p) for p in kept[0][:, 1]} == {float(p) for p in kept[1][:, 1]}, "workers were started again"
    assert len({float(p) for p in kept[1][:, 1]}) == 2 and os.getpid() not in set(kept[1][:, 1].tolist())
    assert len(kept[1]) == 6  # epoch 1 resumed after its first batch (skip_batches=1)
    for epoch in (0, 1):
        assert torch.equal(kept[epoch][:, 0], plain[epoch][:, 0]), epoch
    assert not torch.equal(kept[0][2:, 0], kept[1][:, 0])  # and epoch 1 is not epoch 0 again

    val = [loaders.val_loader(ProcessProbe(), config(workers=2), 0, 1)] * 2
    probe = ProcessProbe()
    passes = [loaders.val_loader(probe, config(workers=2), 0, 1) for _ in range(2)]
    assert passes[0] is passes[1] and val[0] is not passes[0]
    pids = [{int(p) for p in torch.cat(list(loader))[:, 0]} for loader in passes]
    assert pids[0] == pids[1] and len(pids[0]) == 2


class SlowSample(Dataset):
    served = 0  # in each worker

    def __len__(self):
        return 64

    def __getitem__(self, i):
        SlowSample.served += 1
        if SlowSample.served > 2:
            time.sleep(60)  # a decode that has not finished when the rank exits
        return torch.tensor([os.getpid()])


@pytest.mark.slow  # three processes that start workers: 7 s each
@pytest.mark.timeout(120)
@pytest.mark.parametrize("end", ["exit", "close", "another loader"])
def test_kept_workers_end_with_the_rank_even_mid_epoch_and_busy(end):
    """A rank that stops in the middle of an epoch while its kept workers are decoding (a stop
    signal's checkpoint, --steps) ends at once: at the interpreter's exit, or by close_loaders.
    Workers ignore SIGTERM, which is how torch and multiprocessing end live workers at exit:
    before, the exit's join waited forever for them (seen under Accelerate, whose prepare copies
    a loader). So do the workers of another loader on our forkserver, still alive at exit."""
    script = textwrap.dedent(f"""
        import os, sys, time, torch
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        import loaders
        from hvdtrain.torch import loader
        from test_torch_workers import SlowSample, config
        it = iter(loaders.train_loader(SlowSample(), config(workers=2), 0, 1, epoch=0, skip_batches=0))
        next(it)
        print(*[w.pid for w in it._workers], flush=True)
        time.sleep(0.5)
        if {end!r} == "close":
            loader.close_loaders()
            print("closed", flush=True)
        if {end!r} == "another loader":
            from torch.utils.data import DataLoader
            from hvdtrain.torch import workers
            other = iter(DataLoader(SlowSample(), batch_size=2, num_workers=2, worker_init_fn=workers.init_worker,
                                    multiprocessing_context=workers.worker_context()))
            next(other)
    """)
    rank = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        workers = [int(p) for p in rank.stdout.readline().split()]
        assert len(workers) == 2
        started = time.monotonic()
        rank.wait(timeout=60)
        took = time.monotonic() - started
        assert rank.returncode == 0 and took < 15, (rank.returncode, took)  # torch alone: 20 s or more
        assert not any(map(alive, workers)), "a kept worker outlived its rank"
        if end == "close":
            assert "closed" in rank.stdout.read()
    finally:
        if rank.poll() is None:
            os.killpg(rank.pid, signal.SIGKILL)


def test_in_memory_data_starts_no_worker_in_training_or_validation():
    digits = data.ArrayDataset(torch.zeros(20, 1).numpy(), torch.zeros(20, dtype=torch.int64).numpy())
    cfg = config(workers=2)
    assert loaders.train_loader(digits, cfg, 0, 2, epoch=0, skip_batches=0).num_workers == 0
    assert loaders.val_loader(digits, cfg, 1, 2).num_workers == 0  # a Subset of the arrays
    assert loaders.val_loader(ProcessProbe(), cfg, 1, 2).num_workers == 2  # files: workers as asked
    # A user's validation split of their arrays (random_split's Subset) is read through a Subset
    # of that Subset, as one dataset of theirs: workers as asked, and no gather.
    split = torch.utils.data.Subset(digits, list(range(10)))
    assert loaders.train_loader(split, cfg, 0, 2, epoch=0, skip_batches=0).num_workers == 0
    assert loaders.val_loader(split, cfg, 1, 2).num_workers == 2


def test_workers_are_forked_by_the_forkserver_with_stop_signals_blocked_then_ignored():
    seen = torch.cat(list(loaders.val_loader(ProcessProbe(), config(workers=2), 0, 1)))
    server = forkserver._forkserver._forkserver_pid
    worker_pids = {int(p) for p in seen[:, 0]}
    assert os.getpid() not in worker_pids and len(worker_pids) == 2, worker_pids
    # Their parent is the forkserver, a process the test's threads never forked.
    assert {int(p) for p in seen[:, 1]} == {server}, (seen[:, 1], server)
    # The forkserver holds SIGTERM and SIGUSR1 blocked: workers are born with them blocked.
    assert signal_masks(server)["SigBlk"] & STOP_BITS == STOP_BITS
    assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == set()  # and this process is as it was


@pytest.mark.timeout(120)  # the stand-in's readline below would wait forever for a hung child
def test_workers_ignore_stop_signals_and_end_with_the_process_that_started_them(tmp_path):
    """A stand-in for a rank: it iterates a loader with 2 workers and waits; SIGTERM to every
    process (as Slurm sends it) ends none of the workers; SIGKILL of the 'rank' ends them all
    and the forkserver within seconds (torch's own check would take 5 s or more)."""
    script = textwrap.dedent(f"""
        import os, sys, time, torch
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        from multiprocessing import forkserver
        import loaders
        from test_torch_workers import ProcessProbe, config
        it = iter(loaders.val_loader(ProcessProbe(), config(workers=2), 0, 1))
        first, second = next(it), next(it)  # one batch from each worker: both have started
        print(forkserver._forkserver._forkserver_pid, *[w.pid for w in it._workers], flush=True)
        time.sleep(120)
    """)
    rank = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        server, *workers = map(int, rank.stdout.readline().split())
        assert len(workers) == 2, workers
        for pid in workers:
            assert signal_masks(pid)["SigIgn"] & STOP_BITS == STOP_BITS, pid
        for pid in workers:
            os.kill(pid, signal.SIGTERM)
        time.sleep(0.5)
        assert all(alive(pid) for pid in workers), "a worker died of SIGTERM"
        rank.kill()
        rank.wait(timeout=30)
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline and any(map(alive, [server] + workers)):
            time.sleep(0.05)
        assert not any(map(alive, [server] + workers)), \
            f"left behind after the rank's end: {[p for p in [server] + workers if alive(p)]}"
    finally:
        if rank.poll() is None:
            os.killpg(rank.pid, signal.SIGKILL)


def alive(pid: int) -> bool:
    """Running, not a zombie waiting to be reaped (a container's init may never reap it)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


def test_rank_pids_takes_the_rank_never_a_child_with_its_command_line(tmp_path):
    """The tests' rank_pids (a watchdog test freezes a rank, never a DataLoader worker in its
    place): a rank, and a child it started with the same command line and environment, are both
    matched by command line and rank; only the one whose parent is not matched is the rank."""
    from conftest import rank_pids

    unique = str(tmp_path / "marker")
    child = [sys.executable, "-c", "import time; time.sleep(60)", unique]
    rank = [sys.executable, "-c", "import subprocess, sys, time; "
            f"subprocess.Popen({child!r}); time.sleep(60)", unique]
    env = {**os.environ, "OMPI_COMM_WORLD_RANK": "1"}
    proc, children = subprocess.Popen(rank, env=env), []
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            children = [int(p) for p in open(f"/proc/{proc.pid}/task/{proc.pid}/children").read().split()]
            if children:
                break
            time.sleep(0.05)
        assert children, "the stand-in rank started no child"
        assert rank_pids(unique, 1) == [proc.pid]
        assert rank_pids(unique, 0) == []
    finally:
        for pid in children:
            os.kill(pid, signal.SIGKILL)
        proc.kill()
        proc.wait()
