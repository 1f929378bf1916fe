"""Guards against silent failure that need no ranks (fast tier): option values, output checks,
checkpoint permissions and stale temporaries, the resize arithmetic, the watchdog's limit, and
the one-line report of a corrupt sample."""
import dataclasses
import math
import os
import socket
import stat
import subprocess
import sys
import time

import pytest

from hvdtrain import checkpoint as ckpt
from hvdtrain.config import TrainConfig
from hvdtrain.data.datasets import BadSample
from hvdtrain.errors import UsageError
from hvdtrain.watchdog import FLOOR_SECONDS, Watchdog, horovod_stall_settings

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("options, message", [
    (dict(base_lr=math.nan), "--base-lr must be a finite number > 0 (got nan)"),
    (dict(base_lr=math.inf), "--base-lr must be a finite number > 0 (got inf)"),
    (dict(base_lr=-0.1), "--base-lr must be a finite number > 0 (got -0.1)"),
    (dict(momentum=-1.0), "--momentum must be a finite number >= 0 (got -1)"),
    (dict(weight_decay=-1e-4), "--weight-decay must be a finite number >= 0 (got -0.0001)"),
    (dict(warmup_epochs=-1.0), "--warmup-epochs must be a finite number >= 0 (got -1)"),
    (dict(synthetic_size=-5), "--synthetic-size must be >= 1 (got -5)"),
    (dict(keep_checkpoints=-1), "--keep-checkpoints must be >= 1 (got -1)"),
    (dict(cycle_time_ms=-2.0), "--cycle-time-ms must be a finite number > 0 (got -2)"),
    (dict(watchdog_seconds=-1.0), "--watchdog-seconds must be >= 0 (0: off; got -1)"),
])
def test_bad_option_values_are_refused(options, message):
    with pytest.raises(UsageError) as err:
        TrainConfig(**options)
    assert message in str(err.value)


@pytest.mark.parametrize("argv, message", [
    (["--base-lr", "nan"], "--base-lr must be a finite number > 0 (got nan)"),
])
def test_bad_input_is_one_line_with_exit_2(argv, message):
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    run = subprocess.run([sys.executable, "-m", "hvdtrain.torch", *argv], capture_output=True,
                         text=True, env=env, cwd=REPO, timeout=120)
    assert run.returncode == 2 and run.stderr.strip().splitlines() == [
        f"hvdtrain.torch: error [rank 0/1]: {message}"], run.stderr


def test_outputs_checked(tmp_path):
    a_file = tmp_path / "f"
    a_file.write_text("")
    assert ckpt.check_writable(str(tmp_path / "new" / "ckpt"), str(tmp_path / "tb"), str(tmp_path / "r.json")) is None
    assert os.path.isdir(tmp_path / "new" / "ckpt") and os.listdir(tmp_path / "new" / "ckpt") == []
    assert ckpt.check_writable(str(a_file), None, None) == f"--checkpoint-dir {a_file} is a file, not a directory"
    assert ckpt.check_writable(None, None, str(tmp_path)) == f"--result-json {tmp_path} is a directory; give a file name"
    assert ckpt.check_writable(None, str(a_file / "sub"), None).startswith(f"--log-dir {a_file / 'sub'} is not writable (")


def test_read_only_checkpoint_dir_is_refused(tmp_path):
    ro = tmp_path / "read-only"
    ro.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(ro)], capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a read-only tmpfs here: {mounted.stderr.strip()}")
    try:
        assert ckpt.check_writable(str(ro / "ckpt"), None, None) == \
            f"--checkpoint-dir {ro / 'ckpt'} is not writable (Read-only file system)"
    finally:
        subprocess.run(["umount", str(ro)], capture_output=True)


def test_checkpoints_get_the_umask_mode_and_stale_temporaries_go(tmp_path):
    old = os.umask(0o027)
    try:
        path = tmp_path / "ckpt-e0001-s00000010.pt"
        ckpt.atomic_write(str(path), lambda f: f.write(b"x"))
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o640  # not mkstemp's 0600
    finally:
        os.umask(old)
    assert sorted(os.listdir(tmp_path)) == ["ckpt-e0001-s00000010.pt"]  # no temporary left


def test_start_up_removes_only_its_own_temporaries_whose_writer_is_gone(tmp_path):
    host, gone = socket.gethostname(), subprocess.Popen(["true"])
    gone.wait()  # a pid that no longer runs
    day = 24 * 3600
    files = {
        f".tmp-hvdtrain-{host}-{gone.pid}-abcd1234": (0, True),             # its writer died: stale
        f".tmp-hvdtrain-other-node-7-abcd1234": (2 * day, True),            # another host, 2 days old
        f".tmp-hvdtrain-{host}-{os.getpid()}-abcd1234": (2 * day, False),   # a save in flight here
        ".tmp-hvdtrain-other-node-7-efgh5678": (60, False),                 # one on another host
        ".tmp-notes": (2 * day, False),                                     # a user's file
        ".tmp-abc123": (2 * day, False),                                    # not hvdtrain's name
    }
    for name, (age, _) in files.items():
        (tmp_path / name).write_bytes(b"half a checkpoint")
        os.utime(tmp_path / name, (time.time() - age, time.time() - age))
    (tmp_path / f".tmp-hvdtrain-{host}-{gone.pid}-dir12345").mkdir()  # a directory of that name
    removed = ckpt.remove_stale_temporaries(str(tmp_path))
    assert removed == sorted(str(tmp_path / name) for name, (_, stale) in files.items() if stale)
    assert sorted(os.listdir(tmp_path)) == sorted([n for n, (_, stale) in files.items() if not stale]
                                                  + [f".tmp-hvdtrain-{host}-{gone.pid}-dir12345"])
    # atomic_write's own temporaries carry that name.
    assert ckpt.temporary_prefix() == f".tmp-hvdtrain-{host}-{os.getpid()}-"


def test_resize_is_named_and_the_position_follows_the_samples_seen():
    saved = {"world_size": 2, "batch_size": 32, "batches_per_allreduce": 1, "lr": 0.01}
    now = TrainConfig(base_lr=0.005, world_size=1, batch_size=48)
    assert ckpt.resize_changes(saved, now) == ["world size 2 -> 1", "batch size 32 -> 48"]
    assert ckpt.resize_changes(saved, TrainConfig(world_size=2, batch_size=32)) == []
    # Epoch 3 (index 2) of 1,400 samples, 10 steps of 2 x 32 = 640 samples seen; the other 760 at
    # 1 x 48 a step fill 15 steps (40 left out, less than a step), so this run is at step 29 - 15.
    history = ({"epoch": 1},)
    position, note = ckpt.rescale_position(ckpt.Position(2, 10, 52, history), saved, now, steps_per_epoch=29,
                                           train_size=1400)
    assert position == ckpt.Position(2, 14, 2 * 29 + 14, history, seen_before=((2, 320),), order_start=14)
    assert "640 samples of epoch 3 seen: step 10 (global 52) -> step 14 (global 72); the epoch's other 760 " \
           "samples follow, each once" in note
    # Saved with the epoch (an interval checkpoint), read back alike; a checkpoint without it reads as none.
    assert ckpt.Position.from_checkpoint(position.to_checkpoint()) == position
    assert ckpt.Position.from_checkpoint(ckpt.Position(2, 10, 52, history).to_checkpoint()).seen_before == ()
    # 5 steps later, back to 2 x 32: what the 48s trained counts as seen too; the next epoch is whole.
    later = dataclasses.replace(position, step_in_epoch=19, global_step=77)
    again, note = ckpt.rescale_position(later, {"world_size": 1, "batch_size": 48, "batches_per_allreduce": 1},
                                        TrainConfig(world_size=2, batch_size=32), steps_per_epoch=21, train_size=1400)
    assert again.seen_before == ((2, 320), (1, 240)) and again.step_in_epoch == again.order_start == 21 - 520 // 64
    assert again.next_epoch().seen_before == () and again.next_epoch().order_start == 0


def test_watchdog_limit():
    dog = Watchdog(0, "p", 0, 1)  # off: no thread; the limit arithmetic still answers
    assert not dog.enabled and dog._thread is None
    dog.fixed = None
    assert dog.limit() == FLOOR_SECONDS
    dog.beat(1)
    dog.last_beat -= 30.0     # a 30 s step
    dog.beat(2)
    assert dog.slowest_step >= 30.0 and dog.limit() >= 600.0
    dog.beat(where="validating")
    dog.last_beat -= 1000.0   # validation is not a step: not timed as one
    dog.beat(3)
    assert dog.slowest_step < 100.0
    fixed = Watchdog(0, "p", 0, 1)
    fixed.fixed = 20.0
    assert fixed.limit() == FLOOR_SECONDS   # until the first step: start-up may be slow
    fixed.beat(1)
    assert fixed.limit() == 20.0
    assert horovod_stall_settings(None) == {"HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "900"}
    assert horovod_stall_settings(3600.0) == {"HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "7200"}


def test_bad_sample_from_a_worker_keeps_its_own_line():
    worker_text = ("Caught BadSample in DataLoader worker process 0.\nOriginal Traceback (most recent call last):\n"
                   '  File "x.py", line 1, in f\nhvdtrain.data.datasets.BadSample: cannot read image /d/a.png '
                   "(UnidentifiedImageError: cannot identify image file)\n")
    assert str(BadSample(worker_text)) == "cannot read image /d/a.png (UnidentifiedImageError: cannot identify image file)"
    assert str(BadSample("cannot read image /d/b.png")) == "cannot read image /d/b.png"


def test_an_empty_class_folder_is_named_in_one_line(tmp_path):
    from hvdtrain.data.datasets import check_imagefolder, write_digits_imagefolder

    root = write_digits_imagefolder(str(tmp_path / "data"), per_class_train=1, per_class_val=1, size=8)
    assert check_imagefolder(root) == [str(c) for c in range(10)]
    for f in (tmp_path / "data" / "val" / "7").iterdir():
        f.unlink()
    with pytest.raises(UsageError, match=r"/val' has class folders without images: 7 \("):
        check_imagefolder(root)


def test_only_sigusr1_requeues_and_only_from_rank_0(monkeypatch):
    """The requeue rule every API shares (runtime.requeue_after_stop): the time-limit warning
    requeues; scancel's SIGTERM, another rank, no Slurm job or HVDTRAIN_REQUEUE=0 do not."""
    from hvdtrain.runtime import requeue_after_stop

    monkeypatch.delenv("HVDTRAIN_REQUEUE", raising=False)
    assert requeue_after_stop("SIGTERM", "123", True) is None
    assert requeue_after_stop("SIGUSR1", "123", False) is None
    assert requeue_after_stop("SIGUSR1", None, True) is None
    assert requeue_after_stop(None, "123", True) is None
    assert requeue_after_stop("SIGUSR1", "12;rm", True) == "not requeued: '12;rm' is not a Slurm job id"
    monkeypatch.setenv("HVDTRAIN_REQUEUE", "0")
    assert requeue_after_stop("SIGUSR1", "123", True) is None
