"""hvdtrain/data/open_files.py: a process reading samples of more shards than its open-file limit holds
keeps at most that many open, closes the least recently read, never one a thread is reading, and
reads the right bytes throughout; the soft limit is raised to the hard one; over many epochs the
files of earlier ones close; the readers of one process share its budget; most reads reopening a
file is said once. In a child process with its own, low limit (`ulimit -n` as a cluster's
default), so that this one's is untouched."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conftest import REPO, base_env

from hvdtrain.data import open_files
from hvdtrain.errors import UsageError

CHILD = r"""
import os, random, resource, sys, threading
from hvdtrain.data import open_files

folder, count = sys.argv[1], int(sys.argv[2])
paths = [os.path.join(folder, f"shard-{i:03d}") for i in range(count)]
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
files = open_files.OpenFiles(paths)            # raises the soft limit, keeps what fits
raised = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
rng = random.Random(0)
most = 0
for _ in range(3000):                          # every shard read, many times, in random order
    i = rng.randrange(count)
    offset = rng.randrange(0, 4000)
    assert files.pread(i, 16, offset) == bytes((i + offset + k) % 251 for k in range(16)), i
    most = max(most, len(os.listdir("/proc/self/fd")))
errors = []
def reader(seed):                              # threads, as tf.data's parallel reads
    r = random.Random(seed)
    try:
        for _ in range(500):
            i, offset = r.randrange(count), r.randrange(0, 4000)
            assert files.pread(i, 16, offset) == bytes((i + offset + k) % 251 for k in range(16))
    except BaseException as err:
        errors.append(repr(err))
threads = [threading.Thread(target=reader, args=(s,)) for s in range(8)]
[t.start() for t in threads]; [t.join() for t in threads]
print(soft, hard, raised, files.keep, files.opened, most, len(errors), errors[:1])
"""


@pytest.fixture(scope="module")
def shard_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("open-files")
    for i in range(300):  # more files than the child's limit below holds at once
        (folder / f"shard-{i:03d}").write_bytes(bytes((i + k) % 251 for k in range(4096)))
    return str(folder)


def run_child(folder, count, soft, hard):
    # prlimit: the child starts with (soft, hard), like a job under a cluster's defaults.
    cmd = ["prlimit", f"--nofile={soft}:{hard}", sys.executable, "-c", CHILD, folder, str(count)]
    run = subprocess.run(cmd, env=base_env(), cwd=REPO, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout.split(maxsplit=7)


def test_more_shards_than_the_limit_holds_are_read_within_it(shard_files):
    soft, hard, raised, keep, opened, most, errors, first = run_child(shard_files, 300, 360, 400)
    assert (int(soft), int(hard), int(raised)) == (360, 400, 400)   # the soft limit raised to the hard
    assert int(keep) == 400 - open_files.RESERVE                    # what fits beside the reserve
    assert int(most) <= 400 and int(errors) == 0, (most, errors, first)
    assert int(opened) > 300                                         # files closed and opened again


def test_shards_that_fit_are_each_opened_once(shard_files):
    _, _, raised, keep, opened, most, errors, first = run_child(shard_files, 60, 256, 1024)
    assert int(raised) == 1024 and int(keep) == 60 and int(opened) == 60 and int(errors) == 0, (opened, first)


def test_a_limit_too_low_for_any_reading_is_one_line():
    with pytest.raises(UsageError, match=r"^the open-file limit is 64 \(hard 100\): too low to read 9 shards in /d, "
                                         r"which needs at least 264 \(raise it: ulimit -n"):
        open_files.check_limit("9 shards in /d", 64, 100)
    open_files.check_limit("9 shards in /d", 64, 1024)   # raised to 1024 at the reader's start: enough
    assert open_files.files_to_keep(1100, 1024) == 1024 - open_files.RESERVE
    assert open_files.files_to_keep(1100, 65536) == 1100 and open_files.files_to_keep(3, 1024) == 3


def test_a_worker_gets_no_descriptor_of_its_parent(shard_files):
    import pickle

    files = open_files.OpenFiles([os.path.join(shard_files, "shard-000")], keep=4)
    files.pread(0, 4, 0)
    copy = pickle.loads(pickle.dumps(files))
    assert copy.keep == 4 and copy.opened == 0 and not copy._open and files.opened == 1
    assert copy.pread(0, 4, 1) == bytes([1, 2, 3, 4])
    files.close()
    copy.close()


EPOCHS = r"""
import os, random, sys
from hvdtrain.data import open_files

folder, count, per_epoch, epochs, reads_each = sys.argv[1], *map(int, sys.argv[2:6])
files = open_files.OpenFiles([os.path.join(folder, f"shard-{i:03d}") for i in range(count)])
rng = random.Random(0)
at_ends = []
for epoch in range(epochs):   # each epoch a rank's few shards (datasets.shard_blocked_order), read in random order
    shards = rng.sample(range(count), per_epoch)
    for _ in range(reads_each * per_epoch):
        i = rng.choice(shards)
        assert files.pread(i, 4, 7) == bytes((i + 7 + k) % 251 for k in range(4))
    at_ends.append(len(files._open))
print(files.keep, files.opened, files.most_open, max(at_ends), len(os.listdir("/proc/self/fd")))
"""


@pytest.mark.parametrize("reads_each", [200, 30])
def test_the_files_of_earlier_epochs_close_over_a_long_run(shard_files, reads_each):
    """10 epochs of 20 shards each (a rank's share), under a limit that would hold 768: the files
    open stay near one epoch's 20, not the 200 the epochs read in all (kept until the limit, a
    worker at 8 ranks reaches it by the 12th of 90 epochs); within an epoch each shard is opened
    once (no reopening). With 30 reads of each shard an epoch (small shards, many workers: 600
    reads an epoch), a threshold counted from the files open lets earlier epochs linger (3 epochs'
    files); measured from the gap between a file's reads, it does not."""
    cmd = ["prlimit", "--nofile=1024:1024", sys.executable, "-c", EPOCHS, shard_files, "300", "20", "10", str(reads_each)]
    run = subprocess.run(cmd, env=base_env(), cwd=REPO, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    keep, opened, most, at_epoch_ends, descriptors = map(int, run.stdout.split())
    assert keep == 300 and most <= 2 * 20 and at_epoch_ends <= 2 * 20, run.stdout
    assert opened <= 10 * 20 + 5, run.stdout   # each (epoch, shard) about once
    assert descriptors < 64, run.stdout


BUDGET = r"""
import os, random, sys
from hvdtrain.data import open_files

folder = sys.argv[1]
paths = [os.path.join(folder, f"shard-{i:03d}") for i in range(300)]
train, val = open_files.OpenFiles(paths), open_files.OpenFiles(paths)   # a TensorFlow rank's two readers
rng = random.Random(0)
most = 0
for _ in range(4000):
    for files in (train, val):
        i = rng.randrange(300)
        assert files.pread(i, 4, 3) == bytes((i + 3 + k) % 251 for k in range(4))
    most = max(most, len(os.listdir("/proc/self/fd")))
print(train.keep, val.keep, train.most_open + val.most_open, most)
"""


def test_the_readers_of_one_process_share_its_budget_and_most_reads_reopening_is_said_once(shard_files):
    cmd = ["prlimit", "--nofile=400:400", sys.executable, "-c", BUDGET, shard_files]
    run = subprocess.run(cmd, env=base_env(), cwd=REPO, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    train_keep, val_keep, held, most = map(int, run.stdout.split())
    share = (400 - open_files.RESERVE) // 2
    assert train_keep == val_keep == share and held <= 2 * share + 2 and most <= 400 - open_files.RESERVE + 32, \
        run.stdout
    said = [line for line in run.stderr.splitlines() if "open-file limit" in line]
    assert len(said) == 1 and f"keeps {share} of the files read here open at once" in said[0], run.stderr[-2000:]


def test_many_reads_overlap_on_threads_in_order_and_the_first_failure_is_raised():
    """hvdtrain/data/parallel_reads.py (TensorFlow's chunks and --loader dali): the reads of a chunk wait
    on the file system side by side, not one after another, and come back in the indices' order;
    a failing read raises as the loop would, the first in order."""
    import threading
    import time

    from hvdtrain.data.parallel_reads import read_many

    lock, now, most = threading.Lock(), [0], [0]

    def slow_read(i):  # a parallel file system's latency, as a wait that releases the GIL
        with lock:
            now[0] += 1
            most[0] = max(most[0], now[0])
        time.sleep(0.02)
        with lock:
            now[0] -= 1
        if i in (5, 9):
            raise OSError(f"cannot read sample {i}")
        return bytes([i])

    assert read_many(slow_read, range(5)) == [bytes([i]) for i in range(5)]
    assert most[0] > 1  # reads in flight together
    with pytest.raises(OSError, match="cannot read sample 5"):
        read_many(slow_read, range(12))
    assert read_many(slow_read, [3]) == [b"\x03"] and read_many(slow_read, []) == []
