"""--checkpoint-every's values (hvdtrain/config.py): steps or a time with its unit; a bad value is
one line; the option needs a checkpoint directory. Training with it: tests/test_interval_checkpoints.py."""
import pytest

from hvdtrain.config import TrainConfig
from hvdtrain.errors import UsageError


@pytest.mark.parametrize("text, interval", [("2000", (2000, None)), ("90s", (None, 90.0)), ("30m", (None, 1800.0)),
                                            ("2h", (None, 7200.0)), ("0.5s", (None, 0.5)), (" 15M ", (None, 900.0)),
                                            (None, (None, None))])
def test_steps_or_a_time(text, interval):
    assert TrainConfig(checkpoint_dir="ckpt", checkpoint_every=text).checkpoint_interval == interval


@pytest.mark.parametrize("text", ["0", "-5", "1.5", "30x", "m", "0m", "nan s", "inf"])
def test_a_bad_value_is_one_line(text):
    with pytest.raises(UsageError, match=r"--checkpoint-every takes a number of steps \(2000\) or of seconds, "
                                         rf"minutes or hours \(90s, 30m, 2h\), above 0; got '{text}'"):
        TrainConfig(checkpoint_dir="ckpt", checkpoint_every=text)


def test_it_needs_a_checkpoint_directory():
    with pytest.raises(UsageError, match="--checkpoint-every needs --checkpoint-dir"):
        TrainConfig(checkpoint_every="100")


@pytest.mark.parametrize("every, directory, line", [
    ("5x", "ckpt", "checkpoint_every takes a number of steps (2000) or of seconds, minutes or hours (90s, 30m, 2h), "
                   "above 0; got '5x'"),
    (0, "ckpt", "checkpoint_every takes a number of steps (2000) or of seconds, minutes or hours (90s, 30m, 2h), "
                "above 0; got '0'"),
    (2.5, "ckpt", "checkpoint_every takes a number of steps (2000) or a time ('30m', '90s', '2h'); got 2.5"),
    (100, None, "checkpoint_every needs checkpoint_dir"),
])
def test_the_keras_callbacks_say_a_bad_interval_in_their_own_terms(every, directory, line):
    """hvdtrain.tf.callbacks(checkpoint_every=...): the option's check, in the API's names."""
    from types import SimpleNamespace

    from hvdtrain.tf.keras_callbacks import Job

    job = SimpleNamespace(cfg=TrainConfig(framework="tf", loop="fit"), is_rank0=True)
    with pytest.raises(UsageError) as raised:
        Job._interval(job, every, directory)
    assert str(raised.value) == f"hvdtrain.tf.callbacks(): {line}"
    assert Job._interval(job, "30m", "ckpt").seconds == 1800 and Job._interval(job, 7, "ckpt").steps == 7


# ------------------------------------------------------------------ the background writer
import errno  # noqa: E402
import os  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402

from hvdtrain import checkpoint as ckpt  # noqa: E402
import signal  # noqa: E402

from hvdtrain.torch import checkpoint_file  # noqa: E402
from hvdtrain.torch.checkpoint_writer import ProcessWrites  # noqa: E402


def test_a_background_write_runs_while_the_caller_goes_on_and_the_next_waits_for_it(tmp_path):
    """write() returns while the file is being written; the next write starts only once the first
    is renamed into place (never two at once); retention counts both."""
    release, order = threading.Event(), []

    def slow(f):
        order.append("first starts")
        assert release.wait(10)
        f.write(b"one")
        order.append("first ends")

    def fast(f):
        order.append("second starts")
        f.write(b"two")

    writer = ckpt.Writer()
    first, second = tmp_path / "ckpt-e0000-s00000005.pt", tmp_path / "ckpt-e0000-s00000010.pt"
    writer.write(str(first), slow, signed=False, keep=1, background=True)
    assert writer.busy() and not first.exists()  # the caller goes on meanwhile
    threading.Timer(0.3, release.set).start()
    writer.write(str(second), fast, signed=False, keep=1, background=True)  # waits for the first
    writer.wait()
    assert order == ["first starts", "first ends", "second starts"]
    assert sorted(os.listdir(tmp_path)) == [second.name] and writer.error() is None  # keep=1 pruned the first


def test_a_failed_background_write_is_kept_for_every_rank_and_the_previous_checkpoint_stays(tmp_path):
    writer = ckpt.Writer()
    good = tmp_path / "ckpt-e0000-s00000005.pt"
    writer.write(str(good), lambda f: f.write(b"whole"), signed=False, keep=3)

    def full(f):
        f.write(b"half")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    writer.write(str(tmp_path / "ckpt-e0000-s00000010.pt"), full, signed=False, keep=3, background=True)
    writer.wait()
    line = writer.error()
    assert line.startswith(f"could not write a checkpoint in {tmp_path} (No space left on device; ")
    assert line.endswith(f"the newest checkpoint is still {good}") and "\n" not in line
    assert writer.error() is None  # said once
    assert os.listdir(tmp_path) == [good.name] and good.read_bytes() == b"whole"  # no temporary left


def test_save_says_the_previous_writes_end_before_it_writes_and_a_failure_stops_the_next(tmp_path):
    """Writer.save, every API's checkpoint: the write in flight ends first (its path said once, when
    it is whole), a background failure is returned by the next save instead of writing over it,
    and a capture that fails (host memory) is one line like a failed write."""
    said = []
    writer = ckpt.Writer(say=said.append)
    first, second = tmp_path / "ckpt-e0000-s00000005.pt", tmp_path / "ckpt-e0000-s00000010.pt"
    release = threading.Event()

    def slow(f):
        assert release.wait(10)
        f.write(b"one")

    assert writer.save(str(tmp_path), lambda: (str(first), slow, False), keep=3, background=True) is None
    writer.say_written()
    assert said == [] and writer.state() == [True, False]  # not said while it is being written
    release.set()
    assert writer.save(str(tmp_path), lambda: (str(second), lambda f: f.write(b"two"), False), keep=3) is None
    assert said == [f"checkpoint {first}", f"checkpoint {second}"]  # in order, each once
    writer.say_written()
    assert len(said) == 2

    def full(f):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    third = tmp_path / "ckpt-e0000-s00000015.pt"
    assert writer.save(str(tmp_path), lambda: (str(third), full, False), keep=3, background=True) is None
    writer.wait()
    assert writer.state() == [False, True]
    never = []
    line = writer.save(str(tmp_path), lambda: never.append(1), keep=3)
    assert line.startswith(f"could not write a checkpoint in {tmp_path} (No space left") and never == []
    assert line.endswith(f"the newest checkpoint is still {second}")

    def no_memory():
        raise MemoryError("cannot copy the state to host memory")

    line = writer.save(str(tmp_path), no_memory, keep=3)
    assert line.startswith(f"could not write a checkpoint in {tmp_path} (cannot copy the state to host memory")
    assert writer.finish() is None and sorted(os.listdir(tmp_path)) == [first.name, second.name]


def _trained(width: int = 4):
    model = torch.nn.Sequential(torch.nn.Linear(width, 3), torch.nn.BatchNorm1d(3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(8, width)).sum().backward()
    optimizer.step()
    return model, optimizer


def _shared_files() -> list[str]:
    where = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
    return [n for n in os.listdir(where) if n.startswith(f"hvdtrain-checkpoint-{os.getpid()}-")]


def test_torchs_background_write_stages_the_state_in_reused_buffers_and_a_process_writes_it(tmp_path):
    """torch's background write (hvdtrain/torch/checkpoint_writer.py): the live state (float
    weights, int64 BatchNorm count, uint8 RNG state) is copied into shared host buffers before
    the next step may change it, and a long-lived process, not a thread of this one, writes
    what was staged; the buffers and the process serve every later checkpoint of that layout;
    the optimizer's next step passes the pre-hook that waits for the copy; the process ignores
    SIGTERM (Slurm signals every process of the job: the write in flight completes); its death
    is one line; nothing is left in shared memory."""
    model, optimizer = _trained()
    writes = ProcessWrites()
    writer = ckpt.Writer(background=writes)
    first = str(tmp_path / "ckpt-e0000-s00000005.pt")

    def capture(step):
        return checkpoint_file.capture(str(tmp_path), ckpt.Position(global_step=step), model, optimizer,
                                       rng=torch.get_rng_state())
    try:
        before = {k: v.clone() for k, v in model.state_dict().items()}
        momentum = optimizer.state_dict()["state"][0]["momentum_buffer"].clone()
        rng = torch.get_rng_state()
        assert writer.save(str(tmp_path), lambda: capture(5), keep=5, background=True) is None
        assert writes.staging.awaiting_step
        with torch.no_grad():  # the next step, in place, while the process writes
            for p in model.parameters():
                p.add_(100)
        optimizer.step()
        assert not writes.staging.awaiting_step  # the step passed the hook that waits for the copy
        assert writer.finish() is None
        saved = torch.load(first, weights_only=True)
        assert saved["global_step"] == 5 and saved["format_version"] == ckpt.FORMAT_VERSION
        assert all(torch.equal(saved["model"][k], v) for k, v in before.items()) and len(saved["model"]) == 7
        assert saved["model"]["1.num_batches_tracked"].dtype == torch.int64
        assert torch.equal(saved["optimizer"]["state"][0]["momentum_buffer"], momentum)
        assert torch.equal(saved["rng"], rng)
        assert ckpt.signature_matches(first)
        # Each tensor its own bytes, as an inline write's: not a view of one staging buffer.
        weight = saved["model"]["0.weight"]
        assert weight.untyped_storage().nbytes() == weight.numel() * weight.element_size()

        buffers, pid = [b.data_ptr() for b in writes.staging.flat.values()], writes.process.pid
        assert len(buffers) == 3  # float32, int64, uint8: one each, whatever the number of tensors
        os.kill(pid, signal.SIGTERM)  # ignored
        assert writer.save(str(tmp_path), lambda: capture(10), keep=5, background=True) is None
        assert writer.finish() is None
        assert [b.data_ptr() for b in writes.staging.flat.values()] == buffers and writes.process.pid == pid
        assert torch.equal(torch.load(str(tmp_path / "ckpt-e0000-s00000010.pt"), weights_only=True)["model"]["0.weight"],
                           model[0].weight)

        model, optimizer = _trained(width=6)  # another layout: new buffers, the same process
        assert writer.save(str(tmp_path), lambda: capture(15), keep=5, background=True) is None
        assert writer.finish() is None and writes.process.pid == pid
        assert torch.load(str(tmp_path / "ckpt-e0000-s00000015.pt"), weights_only=True)["model"]["0.weight"].shape == (3, 6)

        unpicklable = capture(18)
        unpicklable[1].state["extra"] = lambda: None  # refused at the save, in one line, nothing sent
        line = writer.save(str(tmp_path), lambda: unpicklable, keep=5, background=True)
        assert line.startswith(f"could not write a checkpoint in {tmp_path} (") and "lambda" in line, line
        (tmp_path / "a-file").write_bytes(b"")  # a write that fails in the process: one line
        assert writer.save(str(tmp_path / "a-file"), lambda: (str(tmp_path / "a-file" / "ckpt-e0000-s00000020.pt"),
                                                               capture(20)[1], True), keep=5, background=True) is None
        assert writer.state() in ([True, False], [False, True])
        writer.wait()
        assert writer.error().startswith(f"could not write a checkpoint in {tmp_path / 'a-file'} (")

        path, state, _ = capture(20)
        writes.start(path, state, True, 5, slow=60)  # killed in the middle of its write
        deadline = time.monotonic() + 30
        while not any(n.startswith(ckpt.TMP_PREFIX) for n in os.listdir(tmp_path)):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        os.kill(pid, signal.SIGKILL)
        assert str(writes.wait()) == "the checkpoint writer process ended (signal 9)"
        assert writer.save(str(tmp_path), lambda: capture(25), keep=5, background=True) is None  # a new one
        assert writer.finish() is None and writes.process.pid != pid
    finally:
        writer.close()
    assert writes.process is None and _shared_files() == []
    # The killed write's temporary file stays, its writer gone: the next start removes it.
    removed = ckpt.remove_stale_temporaries(str(tmp_path))
    assert len(removed) == 1 and os.path.basename(removed[0]).startswith(ckpt.TMP_PREFIX), removed
    assert sorted(n for n in os.listdir(tmp_path) if not n.endswith(".sig")) == ["a-file",
        "ckpt-e0000-s00000005.pt", "ckpt-e0000-s00000010.pt", "ckpt-e0000-s00000015.pt", "ckpt-e0000-s00000025.pt"]
