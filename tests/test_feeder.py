"""The device feeder (hvdtrain/torch/feeder.py) on the CPU: the next batch is fetched while the
current one is used, errors reach the caller at their batch, a loop that breaks early ends the
thread, and loaders that would run dataset code on the main process are fed there."""
import re
import threading

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset

from hvdtrain.config import TrainConfig
from hvdtrain.data.datasets import BadSample
import loaders
from hvdtrain.torch import loader
from hvdtrain.torch.feeder import DeviceFeeder


class Batches:
    """Batches made on demand, each fetch recorded: which thread, and whether the caller still
    held the previous batch."""

    def __init__(self, n, fail_at=None):
        self.n, self.fail_at = n, fail_at
        self.fetching = [threading.Event() for _ in range(n)]
        self.threads = []

    def __len__(self):
        return self.n

    def __iter__(self):
        for i in range(self.n):
            self.fetching[i].set()
            self.threads.append(threading.current_thread().name)
            if i == self.fail_at:
                raise BadSample(f"cannot read image sample-{i}.jpg (broken)")
            yield torch.full((2, 3), i, dtype=torch.uint8), torch.tensor([i, i])


def test_the_next_batch_is_fetched_while_the_caller_holds_this_one():
    batches = Batches(4)
    seen = []
    for i, (x, y) in enumerate(DeviceFeeder(batches, "cpu", prepare=lambda x: x.float() / 255)):
        # Fed in series, batch i+1 would only be fetched after this body: the wait would time out.
        if i + 1 < batches.n:
            assert batches.fetching[i + 1].wait(timeout=30), f"batch {i + 1} not fetched while batch {i} was in use"
        seen.append((x, y))
    assert [int(y[0]) for _, y in seen] == [0, 1, 2, 3]
    assert all(x.dtype == torch.float32 and torch.allclose(x, torch.full((2, 3), i / 255)) for i, (x, _) in
               enumerate(seen))
    assert set(batches.threads) == {"hvdtrain-feeder"}


def test_an_error_reaches_the_caller_at_its_batch():
    got = []
    with pytest.raises(BadSample, match="sample-2.jpg"):
        for x, y in DeviceFeeder(Batches(5, fail_at=2), "cpu"):
            got.append(int(y[0]))
    assert got == [0, 1]


def test_breaking_out_ends_the_thread():
    batches = Batches(50)
    for i, _ in enumerate(DeviceFeeder(batches, "cpu")):
        if i == 3:
            break
    assert not any(t.name == "hvdtrain-feeder" for t in threading.enumerate())
    assert len(batches.threads) <= 3 + 1 + 2 + 1  # what was used, what the queue held, one in hand


class RandomDataset(Dataset):
    """A per-sample dataset drawing from torch's global generator (a user's random transform)."""

    def __len__(self):
        return 8

    def __getitem__(self, i):
        return torch.rand(2), 0


def test_only_loaders_that_draw_no_random_numbers_on_the_main_process_are_threaded():
    cfg, alone = TrainConfig(batch_size=2, num_workers=2), TrainConfig(batch_size=2, num_workers=0)
    in_memory = loader.plan_loader(cfg, TensorDataset(torch.zeros(8, 2), torch.zeros(8)), "train")
    with_workers = loader.plan_loader(cfg, RandomDataset(), "train")
    per_sample = loader.plan_loader(alone, RandomDataset(), "train")
    assert in_memory.feeder_thread and in_memory.gathered and with_workers.feeder_thread
    assert not per_sample.feeder_thread
    assert not loader.plan_loader(cfg, RandomDataset(), "train", feeder=False).feeder_thread  # the caller's no
    # Fed on the main thread, the dataset's draws follow the caller's seed as without a feeder.
    batches = loaders.train_loader(RandomDataset(), alone, 0, 1, 0, 0)
    torch.manual_seed(0)
    plain = [x for x, _ in batches]
    torch.manual_seed(0)
    fed = [x for x, _ in DeviceFeeder(batches, "cpu", threaded=per_sample.feeder_thread)]
    assert all(torch.equal(a, b) for a, b in zip(plain, fed))


class FailsAt(Dataset):
    """Sample 5 raises, or kills the worker reading it (as the out-of-memory killer would)."""

    def __init__(self, how):
        self.how = how

    def __len__(self):
        return 16

    def __getitem__(self, i):
        if i == 5:
            if self.how == "kill":
                import os
                import signal
                os.kill(os.getpid(), signal.SIGKILL)
            raise ValueError("sample 5 has no label")
        return torch.zeros(2), i


@pytest.mark.parametrize("how, workers, line", [
    ("raise", 1, r"^reading the data, in DataLoader worker 0: ValueError: sample 5 has no label \(.*test_feeder\.py, "
                 r"line \d+, in __getitem__\)$"),
    ("raise", 0, r"^reading the data: ValueError: sample 5 has no label \(.*test_feeder\.py, line \d+, in "
                 r"__getitem__\)$"),
    ("kill", 1, r"^reading the data: DataLoader worker \(pid.*\) (exited unexpectedly|is killed by signal).*: killed "
                r"from outside, most often for memory .*--num-workers"),
])
def test_an_error_reading_the_data_is_one_line_naming_where(how, workers, line):
    from hvdtrain.errors import UsageError

    loader = DataLoader(FailsAt(how), batch_size=4, num_workers=workers)
    for threaded in (True, False):
        with pytest.raises(UsageError) as err:
            list(DeviceFeeder(loader, "cpu", threaded=threaded))
        assert "\n" not in str(err.value)
        assert re.match(line, str(err.value)), str(err.value)


def test_a_worker_lost_while_sending_a_batch_is_said_as_a_killed_worker_not_a_broken_connection():
    """A decode worker killed (the OOM killer) while the rank reads its batch: torch's own check
    says "DataLoader worker ... killed by signal" when it gets there first; otherwise the rank's
    pipe to the worker breaks inside multiprocessing (ConnectionResetError, EOFError) and the line
    said `Connection reset by peer (.../multiprocessing/connection.py ...)`, no word of a worker
    (3 of 7 kills). Both now say a worker of this rank ended, with the memory advice."""
    import multiprocessing
    import os

    from hvdtrain.torch.feeder import reading_error

    here, there = multiprocessing.Pipe()
    there.close()
    with pytest.raises(EOFError) as ended:
        here.recv()  # the other end gone: raised from multiprocessing/connection.py
    # A reset connection, as raised in the same module (its frames are what is looked at).
    code = compile("def receive():\n    raise ConnectionResetError(104, 'Connection reset by peer')\n",
                   os.path.join(os.path.dirname(multiprocessing.__file__), "connection.py"), "exec")
    scope = {}
    exec(code, scope)
    with pytest.raises(ConnectionResetError) as reset:
        scope["receive"]()
    for err in (ended.value, reset.value):
        line = reading_error(err)
        assert line.startswith("reading the data: a DataLoader worker of this rank ended while it was sending a batch"), line
        assert "out-of-memory killer" in line and "Connection reset" not in line, line
    # The same errors raised elsewhere (a user's dataset talking to a server) stay as they are.
    try:
        raise ConnectionResetError(104, "Connection reset by peer")
    except ConnectionResetError as err:
        assert reading_error(err).startswith("reading the data: ConnectionResetError: [Errno 104]")


def test_a_rank_that_ends_at_once_leaves_no_resource_tracker_warning_after_its_line():
    """A failing rank ends with os._exit (no atexit may wait for a gone peer): its loaders' queues
    never release their semaphores, and multiprocessing's resource tracker, unlinking them after,
    warned "There appear to be 14 leaked semaphore objects" below the rank's one line. The
    tracker hvdtrain starts (workers.start_quiet_resource_tracker) does the cleanup without it;
    the tracker started as Python does still warns, so the scene does leak what it should."""
    import subprocess
    import sys

    def leaking_rank(start: str) -> str:
        code = ("import multiprocessing, os\nfrom multiprocessing import resource_tracker\n"
                f"from hvdtrain.torch import workers\n{start}\n"
                "queue = multiprocessing.get_context('forkserver').Queue()\nos._exit(3)\n")
        # The tracker holds stderr's pipe until it has cleaned up: communicate() waits for its words.
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
        assert done.returncode == 3, done.stderr
        return done.stderr

    assert "leaked semaphore objects" in leaking_rank("resource_tracker.ensure_running()")
    assert leaking_rank("workers.start_quiet_resource_tracker()") == ""
