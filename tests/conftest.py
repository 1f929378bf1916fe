"""Shared test machinery: launching real ranks under mpirun, srun and horovodrun with hard
timeouts, and the session's local Slurm cluster.

Every distributed launch goes through `launch()`: it runs the ranks in their own process
group, kills the whole group at the timeout, and fails naming the launcher, the command and the
ranks' last output (each line is tagged with its rank by the launcher).
"""
from __future__ import annotations

import contextlib
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass

import pytest
# Before any test loads TensorFlow into this process: torch._dynamo loads triton, whose library
# crashes the process (SIGSEGV) when loaded after TensorFlow's (torch 2.14, TF 2.21). Tests that
# build torch models or optimizers in-process after a TF test need it loaded already.
import torch._dynamo  # noqa: F401

from hvdtrain.cluster.env import free_port  # noqa: F401 - the tests' one free_port, re-exported
from hvdtrain.launch import launch_command, root_variables

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYTHON = sys.executable


def base_env() -> dict:
    env = dict(os.environ)
    env.update(root_variables())
    env.update(PYTHONUNBUFFERED="1",
               PYTHONPATH=REPO + os.pathsep + env.get("PYTHONPATH", ""),
               TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
    env["PATH"] = os.path.dirname(PYTHON) + os.pathsep + env["PATH"]
    return env


def launcher_prefix(launcher: str, np: int, tasks_per_node: int | None = None) -> list[str]:
    # Output lines tagged with their rank; srun steps limited to 10 minutes.
    return launch_command(launcher, np, tag_output=True, time_limit_min=10, tasks_per_node=tasks_per_node)


@dataclass
class Launch:
    returncode: int
    output: str
    command: list[str]


def launch(launcher: str, np: int, argv: list[str], timeout: float, env: dict | None = None,
           cwd: str | None = None, check: bool = True, tasks_per_node: int | None = None) -> Launch:
    cmd = launcher_prefix(launcher, np, tasks_per_node) + argv
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env or base_env(), cwd=cwd or REPO, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"{launcher} -np {np} timed out after {timeout:.0f} s (a rank hung?)\n"
                    f"command: {' '.join(cmd)}\nlast output:\n{out[-6000:]}")
    result = Launch(proc.returncode, out, cmd)
    if check and proc.returncode != 0:
        pytest.fail(f"{launcher} -np {np} exited {proc.returncode}\ncommand: {' '.join(cmd)}\n"
                    f"output:\n{out[-8000:]}")
    return result


# What hvdtrain promises for bad input (hvdtrain/errors.py): every rank that finds it prints one
# line naming itself and exits 2; the launcher then ends the job, so under mpirun/srun/horovodrun
# the line of the *first* rank to fail is always there, the others' only if they got that far.
ERROR_LINE = re.compile(r"(?P<prog>hvdtrain\.\w+): error \[rank (?P<rank>\d+)/(?P<size>\d+)\]: (?P<message>.*)")


# An error line at the start of a line, after mpirun's, horovodrun's or srun's tag if any.
LINE_START = re.compile(r"^(\[[\d,]+\]<std(out|err)>:|\d+: )?hvdtrain\.\w+: error \[rank \d+/\d+\]: ")


def error_lines(output: str) -> list[re.Match]:
    """The one-line errors in a launch's output (launcher tags such as `[1,0]<stderr>:` or `0: `
    before them are allowed)."""
    return [m for m in map(ERROR_LINE.search, output.splitlines()) if m]


def assert_job_failed_with(run: "Launch", message: str, np: int) -> list[re.Match]:
    """The launcher-level promise: non-zero exit, at least one error line naming a real rank and
    carrying `message`, every error line well formed, no traceback."""
    assert run.returncode != 0, f"expected a failure, got exit 0:\n{run.output[-3000:]}"
    lines = error_lines(run.output)
    assert lines, f"no 'error [rank R/{np}]' line in the output:\n{run.output[-3000:]}"
    for m in lines:
        assert int(m["size"]) == np and 0 <= int(m["rank"]) < np, m.group(0)
        assert message in m["message"], f"'{message}' not in: {m.group(0)}\n{run.output[-3000:]}"
    # The one line a user must read starts a line (after the launcher's tag), never glued to the
    # end of a progress bar's line ("...loss=1.2e+30]hvdtrain.torch: error ...").
    assert any(LINE_START.match(line) for line in run.output.splitlines()), \
        f"no error line starts a line of its own:\n{run.output[-3000:]}"
    # horovodrun reports a failed rank with a traceback of its own (RuntimeError in
    # horovod/runner): only the ranks' output (tagged "[rank]<stderr>:") must have none.
    launcher_traceback = "horovodrun" in run.command[0] and "horovod/runner/gloo_run.py" in run.output
    ranks_output = re.sub(r"(?ms)^Traceback.*?^RuntimeError: Horovod detected.*?$", "", run.output) \
        if launcher_traceback else run.output
    assert "Traceback" not in ranks_output, run.output[-3000:]
    return lines


def launch_each_rank_to_its_end(np: int, argv: list[str], timeout: float, env: dict | None = None) -> Launch:
    """mpirun with its abort-at-first-failure turned off, each rank printing its exit status:
    the per-rank promise (each rank prints its own line and exits 2) can then be checked without
    a race, and a rank that hung instead of failing hits the timeout."""
    env = dict(env or base_env())
    env["OMPI_MCA_orte_abort_on_non_zero_status"] = "0"
    report_status = ["sh", "-c", '"$@"; status=$?; echo "rank $OMPI_COMM_WORLD_RANK exited $status"', "sh"]
    return launch("mpirun", np, report_status + argv, timeout=timeout, env=env, check=False)


def assert_each_rank_failed_with(run: Launch, prog: str, message: str, np: int) -> None:
    # (Not line by line: mpirun --tag-output can join two ranks' lines.)
    for rank in range(np):
        assert f"[1,{rank}]<stdout>:rank {rank} exited 2" in run.output, run.output[-3000:]
        assert run.output.count(f"error [rank {rank}/{np}]") == 1, run.output[-3000:]
        assert f"[1,{rank}]<stderr>:{prog}: error [rank {rank}/{np}]: {message}" in run.output, run.output[-3000:]
    assert "Traceback" not in run.output, run.output[-3000:]


@pytest.fixture(scope="session")
def slurm_cluster():
    """The local Slurm cluster, started for this session in its own directory and stopped after."""
    if shutil.which("slurmctld") is None:
        pytest.fail("Slurm is not installed: run bash scripts/setup.sh")
    slurm_dir = tempfile.mkdtemp(prefix="hvdtrain-slurm-")
    env = base_env()
    # Free ports: a cluster a developer started by hand (default ports) may be running too.
    env.update(HVDTRAIN_SLURM_DIR=slurm_dir, HVDTRAIN_SLURMCTLD_PORT=str(free_port()),
               HVDTRAIN_SLURMD_PORT=str(free_port()))
    script = os.path.join(REPO, "scripts", "slurm-cluster.sh")
    started = subprocess.run(["bash", script, "start"], env=env, capture_output=True, text=True, timeout=240)
    if started.returncode != 0:
        subprocess.run(["bash", script, "stop"], env=env, timeout=60)
        pytest.fail(f"local Slurm cluster did not start:\n{started.stdout}\n{started.stderr}")
    os.environ["SLURM_CONF"] = os.path.join(slurm_dir, "slurm.conf")
    # Slurm's PMIx plugin makes `spmix_appdir_<uid>_<job>.<step>` under TmpFS for every step. Two
    # local clusters on one machine (test sessions side by side) both number jobs from 1, and the
    # second step of that name fails to launch ("File exists"). SLURM_PMIX_TMPDIR, passed from
    # sbatch's and srun's environment to the steps, gives this session's steps a directory of their own.
    os.environ["SLURM_PMIX_TMPDIR"] = tempfile.mkdtemp(prefix="pmix-", dir=slurm_dir)
    yield slurm_dir
    subprocess.run(["bash", script, "stop"], env=env, timeout=60)
    os.environ.pop("SLURM_CONF", None)
    os.environ.pop("SLURM_PMIX_TMPDIR", None)


@pytest.fixture(scope="session")
def uninterrupted(slurm_cluster, tmp_path_factory):
    """slurm/torch-cpu.sbatch submitted as is: 2 tasks on the local node, 3 epochs of mnist_cnn
    (the reference of the requeue and two-node tests)."""
    from slurm_helpers import CPU_TEMPLATE, submit, tail, wait_for_end

    cwd = str(tmp_path_factory.mktemp("uninterrupted"))
    job_id, log = submit(CPU_TEMPLATE, cwd)
    info = wait_for_end(job_id, log, timeout=420)
    if info["JobState"] != "COMPLETED":
        pytest.fail(f"the CPU template's job ended {info['JobState']}:\n{tail(log)}")
    return {"job_id": job_id, "log": log, "info": info, "cwd": cwd}


@pytest.fixture(scope="session")
def digits_checkpoints(tmp_path_factory) -> str:
    """A directory holding the two epoch-end checkpoints of 2 epochs of mnist_cnn on the digits at
    2 ranks (DIGITS_CHECKPOINT_ARGV), trained once for the tests that need a real checkpoint to
    damage, resume, or measure. Tests copy it (copy_checkpoints) and never write into it."""
    ckpt_dir = str(tmp_path_factory.mktemp("digits-checkpoints") / "ckpt")
    launch("mpirun", 2, [PYTHON, "-m", "hvdtrain.torch", *DIGITS_CHECKPOINT_ARGV, "--epochs", "2",
                         "--checkpoint-dir", ckpt_dir], timeout=180)
    return ckpt_dir


# The options digits_checkpoints trained with: a resume from a copy must repeat them (with its own
# --epochs and --checkpoint-dir), or the checkpoint is refused as written by another run.
DIGITS_CHECKPOINT_ARGV = ["--model", "mnist_cnn", "--dataset", "digits", "--threads-per-rank", "1"]


def newest_weights(ckpt_dir) -> dict:
    """The model state of the newest checkpoint in `ckpt_dir` (torch)."""
    import torch

    from hvdtrain.checkpoint import latest_checkpoint

    return torch.load(latest_checkpoint(str(ckpt_dir)), weights_only=True)["model"]


def step_of(path: str) -> int:
    """The global step in a checkpoint's name (ckpt-eEEEE-sSSSSSSSS[-nNNNNNNNNNNNN].pt or .npz)."""
    return int(re.search(r"-s(\d+)(?:-n\d+)?\.(?:pt|npz)$", str(path)).group(1))


def checksums(output: str) -> dict:
    """{rank: checksum} from the `rank R: weights checksum C` lines the examples print under mpirun."""
    return dict(re.findall(r"<stdout>:rank (\d): weights checksum (\w+)", output))


def assert_weights_equal(ckpt_dir_a, ckpt_dir_b, atol: float = 1e-6) -> dict:
    """Both directories' newest checkpoints hold the same weights and buffers (a resumed run
    against an uninterrupted one); returns the first's state."""
    a, b = newest_weights(ckpt_dir_a), newest_weights(ckpt_dir_b)
    assert a.keys() == b.keys()
    for key in a:
        diff = (a[key].double() - b[key].double()).abs().max().item()
        assert diff <= atol, f"{key} differs by {diff} after the resume"
    return a


def digits_shards(root) -> str:
    """Digit JPEGs (24 px) written as tar shards under `root`: 200 training images in several
    shards and 49 validation ones (odd: the ranks' exact validation shards differ in size)."""
    from hvdtrain.data import shards
    from hvdtrain.data.datasets import write_digits_imagefolder

    folder = write_digits_imagefolder(os.path.join(root, "folder"), per_class_train=20, per_class_val=5, size=24,
                                      fmt="jpg")
    os.unlink(os.path.join(folder, "val", "9", "0004.jpg"))
    shards.write(os.path.join(root, "shards"), *shards.imagefolder_sources(folder), shard_mb=0.02, progress=False)
    return os.path.join(root, "shards")


@contextlib.contextmanager
def small_filesystem(path, size: int):
    """A tmpfs of `size` bytes mounted at `path` (made) while the block runs: a disk that fills up
    (root only: the test is skipped where it cannot be mounted)."""
    os.makedirs(path, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {mounted.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], capture_output=True)


def copy_checkpoints(source: str, destination: str) -> str:
    shutil.copytree(source, destination)
    return destination


# Fixtures that start real daemons or set-ups, or launch ranks: a test that uses one is in the
# distributed tier.
SLOW_FIXTURES = {"slurm_cluster", "uninterrupted", "three_node_cluster", "site_shaped_controller", "cluster_user",
                 "cluster_root", "digits_checkpoints"}


# Seconds per test file in this run, set beside tests/durations.json's record at the end (budget.py).
_file_seconds: dict = {}


def pytest_runtest_logreport(report):
    path = report.nodeid.split("::")[0]
    _file_seconds[path] = _file_seconds.get(path, 0.0) + report.duration


def _busy_seconds() -> float:
    """CPU seconds the whole machine has spent busy since boot (/proc/stat): with nothing else
    running, a test's share includes its ranks, their launchers and the Slurm daemons, which
    RUSAGE_CHILDREN would miss."""
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _children_seconds() -> float:
    """CPU seconds of this pytest's children that have ended (ranks under mpirun, their
    launchers, set-up's builds; not Slurm's tasks, which slurmd starts): the test's own share,
    which the other lane's tests running meanwhile do not inflate as they do `busy_cpu_s`."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    item._busy_start = _busy_seconds()
    item._children_start = _children_seconds()
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Each test's machine-wide busy CPU seconds (set-up to teardown), next to its wall time in
    the JUnit XML (property `busy_cpu_s`): a test whose CPU is far below its wall time on 2 cores
    is waiting (a poll, a timeout, Slurm), which the budget can cut without weakening it."""
    if call.when == "teardown" and hasattr(item, "_busy_start"):
        item.user_properties.append(("busy_cpu_s", round(_busy_seconds() - item._busy_start, 1)))
        item.user_properties.append(("children_cpu_s", round(_children_seconds() - item._children_start, 1)))
    yield


def pytest_terminal_summary(terminalreporter):
    import budget

    try:
        recorded = budget.load()["files"]
    except (OSError, ValueError, KeyError):
        return
    over = [f"{path}: {seconds:.0f} s, on record {recorded[path]:.0f} s" for path, seconds in _file_seconds.items()
            if path in recorded and seconds > budget.OVER_FACTOR * recorded[path] + budget.OVER_SLACK]
    if over:
        terminalreporter.write_sep("-", "test files over their recorded time (tests/budget.py)")
        for line in over:
            terminalreporter.write_line(line)


def pytest_configure(config):
    from side_lane import SideLane

    config.pluginmanager.register(SideLane(config), "side-lane")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if SLOW_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
    # Tests that need the Slurm cluster run together, so it is started once.
    items.sort(key=lambda item: "slurm_cluster" in getattr(item, "fixturenames", ()))


def rank_pids(unique: str, rank: int) -> list[int]:
    """The pids of Open MPI rank `rank` among the python processes whose command line holds
    `unique` (a path only this test uses): the launcher's child, never a process the rank
    started itself with its own command line and environment (a DataLoader worker, a fork)."""
    matches = {}  # pid -> parent pid
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            with open(f"/proc/{pid}/environ", "rb") as f:
                environ = f.read().split(b"\0")
            with open(f"/proc/{pid}/stat", "rb") as f:
                ppid = int(f.read().rsplit(b")", 1)[1].split()[1])  # the name may hold spaces
        except (OSError, IndexError, ValueError):
            continue
        if argv and argv[0].endswith(b"python") and unique.encode() in argv \
                and f"OMPI_COMM_WORLD_RANK={rank}".encode() in environ:
            matches[int(pid)] = ppid
    return [pid for pid, ppid in matches.items() if ppid not in matches]


JOB_MARK = "HVDTRAIN_TEST_JOB"  # an environment variable every process of a test's job inherits


def marked_env(mark: str) -> dict:
    """base_env() with JOB_MARK=mark: the job's ranks, and whatever they start, carry it."""
    return {**base_env(), JOB_MARK: mark}


def marked_pids(mark: str) -> list[int]:
    """The processes that carry JOB_MARK=mark (zombies included)."""
    needle = f"{JOB_MARK}={mark}".encode()
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    pids.append(int(pid))
        except OSError:
            continue
    return pids


def processes_left(mark: str, grace: float = 5.0) -> list[str]:
    """The processes (command lines) still running `grace` seconds from now that carry
    JOB_MARK=mark; zombies, which only wait for their reaper, do not count."""
    import time

    deadline = time.monotonic() + grace
    while True:
        left = []
        for pid in marked_pids(mark):
            try:
                with open(f"/proc/{pid}/stat", "rb") as f:
                    if f.read().rsplit(b")", 1)[1].split()[0] == b"Z":
                        continue
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    argv = f.read().replace(b"\0", b" ").decode(errors="replace")
                left.append(f"{pid}: {argv[:200]}")
            except (OSError, IndexError):
                continue
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def start_launch(launcher: str, np: int, argv: list[str], env: dict | None = None) -> subprocess.Popen:
    """A launch that runs in the background (its own process group), for tests that act on the
    ranks while they train; finish it with `finish_launch`."""
    return subprocess.Popen(launcher_prefix(launcher, np) + argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=env or base_env(), cwd=REPO, start_new_session=True)


def finish_launch(proc: subprocess.Popen, timeout: float) -> tuple[Launch, float]:
    """(the launch's result, seconds it took from now to end); at the timeout the whole process
    group is killed (SIGCONT first: a stopped rank holds its SIGTERM) and the test fails."""
    import time

    started = time.monotonic()
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGCONT)
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"the job did not end within {timeout:.0f} s (a rank hung?)\nlast output:\n{out[-6000:]}")
    return Launch(proc.returncode, out, proc.args), time.monotonic() - started


def kill_rank0_while_writing(proc: subprocess.Popen, ckpt_dir, written, timeout: float) -> Launch:
    """SIGKILL rank 0 of the background launch `proc` (a node crash: no signal to catch) once
    `written()` holds and a checkpoint write is in flight in `ckpt_dir` (its temporary file is
    there; the test slows the writes: HVDTRAIN_TEST_SLOW_CHECKPOINT_WRITE). The ended launch,
    which must have failed."""
    import time

    def writing() -> bool:
        names = os.listdir(ckpt_dir) if os.path.isdir(ckpt_dir) else []
        return any(n.startswith(".tmp-hvdtrain-") and not n.endswith(".sig") for n in names) and written()

    deadline = time.monotonic() + timeout
    while not writing():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0][-3000:]
        time.sleep(0.02)
    [rank0] = rank_pids(str(ckpt_dir), 0)
    os.kill(rank0, signal.SIGKILL)
    killed, _ = finish_launch(proc, timeout=60)
    assert killed.returncode != 0
    return killed


def usr1_to_rank0_once(argv: list[str], log, unique: str, ready: str, timeout: float = 120) -> str:
    """Launch `argv` on 2 ranks (mpirun), output to the file `log`; once `ready` appears in it,
    SIGUSR1 to rank 0 only (rank 1 must learn it from the ranks' vote); the job must end with
    exit 0 within `timeout`. Returns the output. `unique`: a path in rank 0's command line only
    this test uses (rank_pids)."""
    import time

    with open(log, "w") as out:
        proc = subprocess.Popen(launcher_prefix("mpirun", 2) + argv, stdout=out, stderr=subprocess.STDOUT,
                                text=True, env=base_env(), cwd=REPO, start_new_session=True)
    try:
        deadline = time.monotonic() + timeout
        while ready not in log.read_text(errors="replace"):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text(errors="replace")[-3000:]
            time.sleep(0.05)
        [pid] = rank_pids(unique, 0)
        os.kill(pid, signal.SIGUSR1)
        assert proc.wait(timeout=timeout) == 0, log.read_text(errors="replace")[-3000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return log.read_text(errors="replace")
