"""SLURM integration, on the session's local Slurm 22.05 cluster (one node, 2 CPUs, partition debug).

    python -m pytest -p no:cacheprovider tests/test_slurm.py

- Every template in slurm/ is what `python -m hvdtrain.slurm` writes from its header, is valid
  bash, and passes `sbatch --test-only`, as does the generator's output for each preset.
- The CPU templates, submitted as they are, train 2 ranks (mnist_cnn on digits) to COMPLETED.
- The same job, sent USR1 while training, checkpoints, requeues itself, resumes when Slurm
  restarts it, and ends with the same weights as the uninterrupted job.
- `scancel` (SIGTERM) makes the ranks checkpoint but does not requeue the job.
- `#SBATCH --signal=USR1@T` reaches the srun tasks and not the batch shell; `B:` the reverse.
- 2 nodes x 1 task (a second slurmd in its own network namespace) train like 1 node x 2 tasks.
- The generator refuses inconsistent options with one line and exit status 2.
- ClusterEnv reads SLURM's task variables, hostlists and tasks-per-node strings.

Every wait has a hard timeout; a job still running at a timeout is cancelled.
"""
from __future__ import annotations

import glob
import json
import os
import re
import socket
import subprocess
import sys
import time

import pytest

from conftest import PYTHON, REPO, base_env, free_port
from hvdtrain import slurm as gen
from hvdtrain.cluster import ClusterEnv, expand_hostlist
from hvdtrain.errors import UsageError

TEMPLATES = sorted(glob.glob(os.path.join(REPO, "slurm", "*.sbatch")))
CPU_TEMPLATE = os.path.join(REPO, "slurm", "torch-cpu.sbatch")
CPU_STEPS = 3 * 43   # torch-cpu.sbatch: 3 epochs of 1400 digits / 2 ranks / batch 16


# ------------------------------------------------------------------------------ helpers
@pytest.fixture(scope="module", autouse=True)
def own_pmix_dir(tmp_path_factory):
    """Slurm's PMIx plugin makes `spmix_appdir_<uid>_<job>.<step>` under TmpFS (/tmp) for every
    step. Two local clusters on one machine (test sessions side by side) both number jobs from 1,
    and the second step of that name fails to launch ("File exists"). SLURM_PMIX_TMPDIR, passed
    from sbatch's environment to the steps, gives this module's steps a directory of their own."""
    old = os.environ.get("SLURM_PMIX_TMPDIR")
    os.environ["SLURM_PMIX_TMPDIR"] = str(tmp_path_factory.mktemp("pmix"))
    yield
    if old is None:
        os.environ.pop("SLURM_PMIX_TMPDIR")
    else:
        os.environ["SLURM_PMIX_TMPDIR"] = old


def run(cmd: list[str], timeout: float = 60, env: dict | None = None, cwd: str | None = None,
        check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env or base_env(),
                          cwd=cwd or REPO)
    if check and done.returncode != 0:
        pytest.fail(f"{' '.join(cmd)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
    return done


def job_info(job_id: str, env: dict | None = None) -> dict:
    """`scontrol show job -o` as a dict (accounting is off here: no sacct)."""
    out = run(["scontrol", "show", "job", "-o", job_id], env=env, check=False).stdout
    return dict(f.split("=", 1) for f in out.split() if "=" in f)


def tail(path: str, n: int = 6000) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()[-n:]
    except OSError:
        return f"({path} not written)"


def wait_until(what: str, ready, timeout: float, job_id: str, log: str, every: float = 1.0,
               env: dict | None = None):
    """Poll ready() until it returns something true; at the timeout cancel the job and fail."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = ready()
        if value:
            return value
        time.sleep(every)
    run(["scancel", job_id], env=env, check=False)
    pytest.fail(f"job {job_id}: {what} not seen within {timeout:.0f} s; job: {job_info(job_id, env)}\n"
                f"log {log}:\n{tail(log)}")


def wait_for_end(job_id: str, log: str, timeout: float, restarts: int = 0, env: dict | None = None) -> dict:
    """The job's final record, once it ended (after `restarts` requeues)."""
    final = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL")

    seen_final = []

    def ended():
        info = job_info(job_id, env)
        if info.get("JobState") not in final:
            return None
        seen_final.append(info)
        # Fewer restarts than expected: give a requeue in flight a few polls, then report it.
        return info if int(info.get("Restarts", 0)) >= restarts or len(seen_final) > 3 else None
    return wait_until(f"the end (after {restarts} restart(s))", ended, timeout, job_id, log, every=2.0, env=env)


def submit(script: str, cwd: str, *options: str) -> tuple[str, str]:
    """(job id, log path): sbatch from `cwd`, so SLURM_SUBMIT_DIR (and runs/) is there."""
    job_id = run(["sbatch", "--parsable", *options, script], cwd=cwd).stdout.strip().split(";")[0]
    assert job_id.isdigit(), job_id
    name = job_info(job_id).get("JobName", "")
    return job_id, os.path.join(cwd, f"{name}-{job_id}.out")


def result_of(cwd: str, job_id: str) -> dict:
    [path] = glob.glob(os.path.join(cwd, "runs", f"*-{job_id}", "result.json"))
    with open(path) as f:
        return json.load(f)


# ------------------------------------------------------------------------------ (d) the generator
def generator(*argv: str) -> subprocess.CompletedProcess:
    return run([PYTHON, "-m", "hvdtrain.slurm", *argv], check=False, timeout=60)


@pytest.mark.parametrize("argv, says", [
    (["--preset", "jean-zay", "--tasks-per-node", "2"], "--tasks-per-node 2 differs from --gpus-per-node 4"),
    (["--gpus-per-node", "4", "--tasks-per-node", "8", "--cpus-per-task", "1"], "differs from --gpus-per-node 4"),
    (["--preset", "jean-zay", "--cpus-per-task", "20"], "4 tasks per node x 20 cpus per task = 80 cores, but a node has 40"),
    (["--cpu-only", "--tasks-per-node", "4", "--cpus-per-task", "2", "--cores-per-node", "6"], "= 8 cores, but a node has 6"),
    (["--preset", "jean-zay-gpu_p2", "--gpus-per-node", "16"], "a jean-zay-gpu_p2 node has 8 GPUs"),
    (["--cpu-only", "--cpus-per-task", "1", "--time", "10", "--signal-lead", "600"], "not shorter than the time limit"),
    (["--cpu-only", "--cpus-per-task", "1", "--time", "00:05:00", "--signal-lead", "300"], "not shorter than the time limit"),
    (["--cpu-only", "--cpus-per-task", "1", "--time", "0"], "--time 0 means no time limit"),
    (["--cpu-only", "--cpus-per-task", "1", "--time", "1h"], "is not a Slurm time limit"),
    (["--cpu-only", "--cpus-per-task", "1", "--time", "1:75:00"], "75 minutes is out of range"),
    (["--cpu-only", "--gpus-per-node", "2", "--cpus-per-task", "1"], "--cpu-only asks for no GPUs"),
    (["--gpus-per-node", "2"], "give --cpus-per-task"),
    (["--preset", "jean-zay", "--", "--epohcs", "3"], "trainer option: unrecognized arguments: --epohcs 3"),
    (["--preset", "jean-zay", "--framework", "tf", "--", "--amp"], "trainer option: unrecognized arguments: --amp"),
    (["--preset", "jean-zay", "--partition", "gpu;rm -rf /"], "has characters Slurm names do not"),
    (["--preset", "nowhere"], "invalid choice: 'nowhere'"),
])
def test_generator_refuses_inconsistent_options(argv, says):
    done = generator(*argv)
    assert done.returncode == 2, done
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("hvdtrain.slurm: error: "), done.stderr
    assert says in lines[0], lines[0]


@pytest.mark.parametrize("text, seconds", [
    ("30", 1800), ("5:30", 330), ("20:00:00", 72000), ("1-0", 86400), ("2-12:30", 217800),
    ("1-00:00:01", 86401), ("0", 0),
])
def test_time_limit_formats(text, seconds):
    assert gen.parse_time_limit(text) == seconds


def test_generator_writes_file_and_keeps_trainer_arguments(tmp_path):
    out = tmp_path / "job.sbatch"
    done = generator("--preset", "juwels-booster", "--nodes", "3", "--account", "proj1", "-o", str(out), "--",
                     "--model", "resnet18", "--data-dir", "$SCRATCH/my data", "--dataset", "imagefolder",
                     "--checkpoint-dir", "/ckpt/here")
    assert done.returncode == 0, done.stderr
    script = out.read_text()
    for line in ("#SBATCH --nodes=3", "#SBATCH --ntasks-per-node=4", "#SBATCH --gres=gpu:4",
                 "#SBATCH --cpus-per-task=24", "#SBATCH --partition=booster", "#SBATCH --account=proj1",
                 "#SBATCH --signal=USR1@300", "#SBATCH --requeue"):
        assert line in script
    assert "B:USR1" not in script            # B: would signal the batch shell only, not the ranks
    assert '--data-dir "$SCRATCH/my data"' in script      # $ expanded by the job's shell, space kept
    assert "--checkpoint-dir /ckpt/here" in script and "$RUN_DIR/checkpoints" not in script
    assert "-o" not in gen.credited_argv(script)             # the header says how, not where
    assert gen.generate(gen.credited_argv(script))[0] == script


# ------------------------------------------------------------------------------ (a) templates
def test_there_are_templates():
    names = {os.path.basename(t) for t in TEMPLATES}
    assert {"torch-1gpu.sbatch", "torch-1node-4gpu.sbatch", "torch-nnodes-4gpu.sbatch", "torch-jeanzay-gpu_p2.sbatch",
            "torch-juwels-booster.sbatch", "torch-cpu.sbatch", "tf-1node-4gpu.sbatch", "tf-cpu.sbatch"} <= names


@pytest.mark.parametrize("path", TEMPLATES, ids=os.path.basename)
def test_template_is_the_generators_output(path):
    """Edit a template by changing its header command and running
    `python -m hvdtrain.slurm regenerate slurm/*.sbatch`, never by hand."""
    with open(path) as f:
        assert f.read() == gen.regenerate(path), f"{path} differs from its header's command: regenerate it"
    run(["bash", "-n", path])


@pytest.fixture(scope="module")
def site_shaped_controller(slurm_cluster, tmp_path_factory):
    """A second slurmctld, for `sbatch --test-only` only, whose nodes have the sites' shapes:
    Jean Zay gpu_p13 (default; 4 GPUs, 2x20 cores x 2 threads), gpu_p2 (8 GPUs, 2x12 cores x 2
    threads), JUWELS booster (4 GPUs, 2x24 cores x 2 threads) and reservation RESERVATION.

    Its nodes are CLOUD nodes that are never powered up: no slurmd, nothing runs. The scheduler
    still answers --test-only against their declared CPUs, sockets, threads and GRES, so a
    template asking for more than such a node has (cpus x tasks, GPUs, nodes) is refused, as on
    the real site. Not checked: the sites' real QoS, accounts, limits and software."""
    d = tmp_path_factory.mktemp("site-shaped")
    for sub in ("state", "run", "log"):
        (d / sub).mkdir()
    host = socket.gethostname().split(".")[0]
    conf = d / "slurm.conf"
    conf.write_text(f"""\
ClusterName=sitesshaped
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
SlurmUser=root
AuthType=auth/munge
AuthInfo=socket={slurm_cluster}/munge/munge.socket
CredType=cred/munge
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/run/slurmctld.pid
SlurmctldLogFile={d}/log/slurmctld.log
ProctrackType=proctrack/linuxproc
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=pmix
JobRequeue=1
GresTypes=gpu
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SuspendProgram=/bin/true
ResumeProgram=/bin/true
SuspendTime=600
NodeName=jz[1-4] NodeAddr=127.0.0.1 Sockets=2 CoresPerSocket=20 ThreadsPerCore=2 RealMemory=160000 Gres=gpu:4 State=CLOUD
NodeName=jzp2-[1-2] NodeAddr=127.0.0.1 Sockets=2 CoresPerSocket=12 ThreadsPerCore=2 RealMemory=360000 Gres=gpu:8 State=CLOUD
NodeName=jwb[1-2] NodeAddr=127.0.0.1 Sockets=2 CoresPerSocket=24 ThreadsPerCore=2 RealMemory=500000 Gres=gpu:4 State=CLOUD
PartitionName=gpu_p13 Nodes=jz[1-4] Default=YES MaxTime=INFINITE State=UP
PartitionName=gpu_p2 Nodes=jzp2-[1-2] MaxTime=INFINITE State=UP
PartitionName=booster Nodes=jwb[1-2] MaxTime=INFINITE State=UP
""")
    env = base_env()
    env["SLURM_CONF"] = str(conf)
    run(["slurmctld", "-f", str(conf)], env=env, timeout=60)
    pid_file = d / "run" / "slurmctld.pid"
    try:
        deadline = time.monotonic() + 60
        while run(["sinfo", "-h"], env=env, check=False, timeout=30).returncode != 0:
            if time.monotonic() > deadline:
                pytest.fail(f"site-shaped slurmctld did not answer:\n{tail(str(d / 'log' / 'slurmctld.log'))}")
            time.sleep(1)
        run(["scontrol", "create", "reservation", "ReservationName=RESERVATION", "Users=root",
             "Nodes=jwb[1-2]", "StartTime=now", "Duration=UNLIMITED"], env=env)
        yield env
    finally:
        if pid_file.exists():
            pid = int(pid_file.read_text())
            os.kill(pid, 15)
            for _ in range(40):
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    break
                time.sleep(0.25)


def _test_only(script_path: str, env: dict) -> str:
    done = run(["sbatch", "--test-only", script_path], env=env, check=False, timeout=60)
    assert done.returncode == 0 and "to start at" in done.stderr, \
        f"sbatch --test-only {script_path}:\n{done.stdout}\n{done.stderr}"
    return done.stderr


@pytest.mark.parametrize("path", TEMPLATES, ids=os.path.basename)
def test_template_passes_test_only_on_site_shaped_nodes(site_shaped_controller, path):
    said = _test_only(path, site_shaped_controller)
    with open(path) as f:
        wanted = re.search(r"--partition=(\S+)", f.read())
    assert f"in partition {wanted.group(1) if wanted else 'gpu_p13'}" in said, said


@pytest.mark.parametrize("argv", [
    ["--preset", "jean-zay", "--nodes", "4", "--qos", "qos_gpu-t3"],
    ["--preset", "jean-zay", "--gpus-per-node", "2", "--framework", "tf"],
    ["--preset", "jean-zay-gpu_p2", "--nodes", "2", "--time", "1-00:00:00"],
    ["--preset", "juwels-booster", "--account", "proj", "--reservation", "RESERVATION", "--time", "30"],
    ["--cpu-only", "--nodes", "2", "--tasks-per-node", "4", "--cpus-per-task", "10", "--hint", "nomultithread"],
], ids=lambda a: " ".join(a))
def test_generator_output_passes_test_only_on_site_shaped_nodes(site_shaped_controller, tmp_path, argv):
    script = tmp_path / "job.sbatch"
    assert generator(*argv, "-o", str(script)).returncode == 0
    _test_only(str(script), site_shaped_controller)


def test_site_shaped_nodes_refuse_what_the_sites_would(site_shaped_controller, tmp_path):
    """The check has teeth: 5 Jean Zay nodes (it has 4 here), and 4 x 20 physical cores
    (--cores-per-node lies to get past the generator's own check)."""
    for argv in (["--preset", "jean-zay", "--nodes", "5"],
                 ["--preset", "jean-zay", "--cpus-per-task", "20", "--cores-per-node", "80"]):
        script = tmp_path / "job.sbatch"
        assert generator(*argv, "-o", str(script)).returncode == 0
        done = run(["sbatch", "--test-only", str(script)], env=site_shaped_controller, check=False)
        assert done.returncode != 0 and "not available" in done.stderr, done.stderr


@pytest.mark.parametrize("path", [t for t in TEMPLATES if "cpu" in os.path.basename(t)], ids=os.path.basename)
def test_cpu_template_passes_test_only_on_the_local_cluster(slurm_cluster, path):
    _test_only(path, base_env())


# ------------------------------------------------------------------------------ (b) a 2-task job
@pytest.fixture(scope="module")
def uninterrupted(slurm_cluster, tmp_path_factory):
    """The CPU template submitted as is: 2 tasks on the local node, 3 epochs of mnist_cnn."""
    cwd = str(tmp_path_factory.mktemp("uninterrupted"))
    job_id, log = submit(CPU_TEMPLATE, cwd)
    info = wait_for_end(job_id, log, timeout=420)
    if info["JobState"] != "COMPLETED":
        pytest.fail(f"the CPU template's job ended {info['JobState']}:\n{tail(log)}")
    return {"job_id": job_id, "log": log, "info": info, "cwd": cwd}


def test_two_task_job_trains_to_completion(uninterrupted):
    info, log = uninterrupted["info"], uninterrupted["log"]
    assert info["JobState"] == "COMPLETED" and info["Restarts"] == "0", (info, tail(log))
    result = result_of(uninterrupted["cwd"], uninterrupted["job_id"])
    assert result["launcher"] == "slurm" and result["world_size"] == 2
    assert result["global_step"] == CPU_STEPS and result["stopped_by"] is None
    assert result["final"]["val_acc"] > 0.5, result["final"]
    assert len({r["param_checksum"] for r in result["ranks"]}) == 1  # the ranks agree
    checkpoints = glob.glob(os.path.join(uninterrupted["cwd"], "runs", "*", "checkpoints", "ckpt-*"))
    assert max(map(os.path.basename, checkpoints)) == f"ckpt-e0003-s{CPU_STEPS:08d}.pt"


def test_tf_cpu_template_trains_to_completion(slurm_cluster, tmp_path):
    job_id, log = submit(os.path.join(REPO, "slurm", "tf-cpu.sbatch"), str(tmp_path))
    info = wait_for_end(job_id, log, timeout=420)
    assert info["JobState"] == "COMPLETED", tail(log)
    result = result_of(str(tmp_path), job_id)
    assert result["framework"] == "tf" and result["world_size"] == 2 and result["global_step"] == CPU_STEPS


# ------------------------------------------------------------------------------ (c) USR1 -> requeue -> resume
def test_usr1_checkpoints_requeues_and_resumes_to_the_same_weights(uninterrupted, tmp_path):
    """`scancel -s USR1 JOB` (no -b, no --full) signals every task of the job's steps and not the
    batch shell: what `#SBATCH --signal=USR1@T` does at T seconds before the limit (see
    test_signal_option_reaches_tasks_not_batch_shell). Slurm holds a requeued job for
    cred_expire (120 s by default) before it may start again, hence the long timeout."""
    cwd = str(tmp_path)
    job_id, log = submit(CPU_TEMPLATE, cwd)
    # "config:" is logged after every rank installed its handler (an allgather comes between).
    wait_until("training start", lambda: "hvdtrain.torch: config:" in tail(log, 10**6), 300, job_id, log, 0.2)
    run(["scancel", "--signal=USR1", job_id])
    info = wait_for_end(job_id, log, timeout=600, restarts=1)
    text = tail(log, 10**6)
    assert info["JobState"] == "COMPLETED" and info["Restarts"] == "1", (info, text[-4000:])
    stopped = re.search(r"stopped by SIGUSR1 at step (\d+); checkpoint written", text)
    assert stopped, f"the signal did not stop training (did it end first?):\n{text[-4000:]}"
    assert f"job {job_id} requeued" in text, text[-4000:]
    resumed = re.search(r"resumed from \S+ckpt-e\d+-s(\d+)\.pt at epoch \d+, step (\d+)", text)
    assert resumed and resumed.group(1).lstrip("0") == stopped.group(1) == resumed.group(2), text[-4000:]
    assert 0 < int(stopped.group(1)) < CPU_STEPS

    result = result_of(cwd, job_id)
    reference = result_of(uninterrupted["cwd"], uninterrupted["job_id"])
    assert result["global_step"] == CPU_STEPS and result["stopped_by"] is None
    assert [r["param_checksum"] for r in result["ranks"]] == [r["param_checksum"] for r in reference["ranks"]]
    assert result["final"] == reference["final"]


def test_scancel_checkpoints_and_does_not_requeue(slurm_cluster, tmp_path):
    """`scancel JOB` sends SIGTERM: the ranks still checkpoint together, but the job stays
    cancelled (a requeue here would undo the user's cancel)."""
    cwd = str(tmp_path)
    job_id, log = submit(CPU_TEMPLATE, cwd)
    wait_until("training start", lambda: "hvdtrain.torch: config:" in tail(log, 10**6), 300, job_id, log, 0.2)
    run(["scancel", job_id])
    wait_for_end(job_id, log, timeout=120)
    time.sleep(3)      # a requeue, were there one, would show by now
    info = job_info(job_id)
    assert info["JobState"] == "CANCELLED" and info["Restarts"] == "0", (info, tail(log))
    steps = [int(m) for m in re.findall(r"ckpt-e\d+-s(\d+)\.pt", " ".join(os.listdir(
        glob.glob(os.path.join(cwd, "runs", f"*-{job_id}", "checkpoints"))[0])))]
    assert steps and 0 < max(steps) < CPU_STEPS, (steps, tail(log))
    assert "requeued" not in tail(log, 10**6)


# ------------------------------------------------------------------------------ what --signal reaches
_CATCHER = """\
import os, signal, sys, time
got = []
for s in (signal.SIGUSR1, signal.SIGTERM):
    signal.signal(s, lambda n, f: got.append(signal.Signals(n).name))
print("task started", flush=True)
deadline = time.time() + 100
while not got and time.time() < deadline:
    time.sleep(0.2)
print("task got", got[0] if got else "nothing", flush=True)
"""


def test_signal_option_reaches_tasks_not_batch_shell(slurm_cluster, tmp_path):
    """Slurm 22.05, `--signal=USR1@60` with a 2-minute limit: the srun task gets USR1 and the
    batch shell does not; with `B:USR1@60` only the batch shell does. The templates use the
    former, so every rank hears it without the script forwarding anything."""
    catcher = tmp_path / "catcher.py"
    catcher.write_text(_CATCHER)
    body = ("#!/bin/bash\n"
            f"srun -n 1 {PYTHON} {catcher} & step=$!\n"
            # `wait` returns early for a trapped signal, so the shell can stop the step at once.
            "trap 'echo \"batch shell got USR1\"; kill $step' USR1\n"
            "wait $step || wait $step\n")
    script = tmp_path / "sig.sbatch"
    script.write_text(body)
    jobs = {}
    for signal_spec in ("USR1@60", "B:USR1@60"):
        jobs[signal_spec] = submit(str(script), str(tmp_path), "-n", "1", "--time=2", f"--signal={signal_spec}",
                                   f"--job-name=sig-{signal_spec.replace(':', '').replace('@', '-')}",
                                   "--output=%x-%j.out")
    for signal_spec, (job_id, log) in jobs.items():
        wait_for_end(job_id, log, timeout=240)
        text = tail(log)
        if signal_spec == "USR1@60":
            assert "task got SIGUSR1" in text and "batch shell got USR1" not in text, text
        else:
            assert "batch shell got USR1" in text and "task got SIGUSR1" not in text, text


# ------------------------------------------------------------------------------ (e) ClusterEnv
def _srun_environ(**extra) -> dict:
    env = {"SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0", "SLURM_PROCID": "9", "SLURM_LOCALID": "1",
           "SLURM_NODEID": "2", "SLURM_NTASKS": "11", "SLURM_NNODES": "4",
           "SLURM_JOB_NODELIST": "node[01-03],gpu7", "SLURM_TASKS_PER_NODE": "4(x2),3"}
    env.update(extra)
    return env


@pytest.mark.parametrize("nodelist, hosts", [
    ("node[01-03],gpu7", ["node01", "node02", "node03", "gpu7"]),
    ("gpu7", ["gpu7"]),
    ("r[1-2]n[08-09]", ["r1n08", "r1n09", "r2n08", "r2n09"]),
    ("jean-zay-iam[01,05-06]", ["jean-zay-iam01", "jean-zay-iam05", "jean-zay-iam06"]),
    ("", []),
])
def test_expand_hostlist(nodelist, hosts):
    assert expand_hostlist(nodelist) == hosts


def test_expand_hostlist_falls_back_to_scontrol(slurm_cluster, monkeypatch):
    monkeypatch.setitem(sys.modules, "hostlist", None)      # `import hostlist` now fails
    assert expand_hostlist("node[01-03],gpu7") == ["node01", "node02", "node03", "gpu7"]


def test_cluster_env_reads_an_srun_task():
    env = ClusterEnv.from_environ(_srun_environ())
    assert (env.launcher, env.rank, env.local_rank, env.world_size, env.num_nodes) == ("slurm", 9, 1, 11, 4)
    assert env.local_world_size == 3                         # node 2 of "4(x2),3"
    assert env.hosts == ["node01", "node02", "node03", "gpu7"] and env.master_addr == "node01"
    assert env.job_id == "4242" and not env.is_rank0


@pytest.mark.parametrize("tasks_per_node, node_id, local", [
    ("4(x2),3", "0", 4), ("4(x2),3", "1", 4), ("4(x2),3", "2", 3), ("2", "0", 2), ("1,2(x3)", "3", 2),
])
def test_cluster_env_tasks_per_node(tasks_per_node, node_id, local):
    env = ClusterEnv.from_environ(_srun_environ(SLURM_TASKS_PER_NODE=tasks_per_node, SLURM_NODEID=node_id))
    assert env.local_world_size == local


def test_cluster_env_prefers_the_steps_own_variables():
    """A step smaller than its job (srun -n 2 inside a 4-node allocation) has its own size and nodes."""
    env = ClusterEnv.from_environ(_srun_environ(
        SLURM_PROCID="1", SLURM_NODEID="0", SLURM_STEP_NUM_TASKS="2", SLURM_STEP_NUM_NODES="1",
        SLURM_STEP_NODELIST="node02", SLURM_STEP_TASKS_PER_NODE="2"))
    assert (env.world_size, env.num_nodes, env.local_world_size, env.hosts) == (2, 1, 2, ["node02"])


def test_cluster_env_outside_a_step_is_not_slurm():
    """The batch shell has the job's variables but no step: one process, not rank 0 of N."""
    environ = _srun_environ()
    del environ["SLURM_STEP_ID"]
    env = ClusterEnv.from_environ(environ)
    assert env.launcher == "single" and env.world_size == 1 and env.job_id == "4242"


def test_generator_output_reads_back():
    """credited_argv() gives back what was asked, so `regenerate` is a fixed point."""
    script, _ = gen.generate(["--cpu-only", "--cpus-per-task", "2", "--", "--model", "mnist_cnn"])
    assert gen.credited_argv(script) == ["--cpu-only", "--cpus-per-task", "2", "--", "--model", "mnist_cnn"]
    with pytest.raises(UsageError):
        gen.credited_argv("#!/bin/bash\necho hi\n")


# ------------------------------------------------------------------------------ 2 nodes on one machine
@pytest.fixture(scope="module")
def two_node_cluster(slurm_cluster, tmp_path_factory):
    """A second Slurm cluster with two nodes on this machine: n1 is this host; n2 is a slurmd in
    its own network namespace (own IP on a veth pair), hostname (UTS namespace) and TmpFS (mount
    namespace: Slurm's PMIx plugin makes same-named directories there for each step, which two
    nodes may not share). Both use the session cluster's munged. Needs root with CAP_NET_ADMIN
    and CAP_SYS_ADMIN (as in CI); otherwise the 2-node test is skipped, saying why."""
    tag = f"hvd{os.getpid() % 100000}"
    subnet = f"10.213.{os.getpid() % 250 + 1}"
    d = tmp_path_factory.mktemp("two-nodes")
    for sub in ("state", "run", "log", "tmpfs", "tmpfs-n2"):
        (d / sub).mkdir()
    ns, host_if, ns_if = tag, f"{tag}h", f"{tag}c"
    setup = [["ip", "netns", "add", ns],
             ["ip", "link", "add", host_if, "type", "veth", "peer", "name", ns_if],
             ["ip", "link", "set", ns_if, "netns", ns],
             ["ip", "addr", "add", f"{subnet}.1/24", "dev", host_if],
             ["ip", "link", "set", host_if, "up"],
             ["ip", "netns", "exec", ns, "ip", "addr", "add", f"{subnet}.2/24", "dev", ns_if],
             ["ip", "netns", "exec", ns, "ip", "link", "set", ns_if, "up"],
             ["ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up"]]
    conf = d / "slurm.conf"
    env = base_env()
    env["SLURM_CONF"] = str(conf)
    env.pop("SLURM_PMIX_TMPDIR", None)   # one path for n1 and n2 would collide; their TmpFS differ
    try:
        for cmd in setup:
            try:
                done = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
            except OSError as err:  # no `ip` here
                pytest.skip(f"no second node: `{' '.join(cmd)}` could not run: {err}")
            if done.returncode != 0:
                pytest.skip(f"no second node: `{' '.join(cmd)}` failed: {done.stderr.strip()}")
        conf.write_text(f"""\
ClusterName=twonodes
SlurmctldHost={socket.gethostname().split('.')[0]}({subnet}.1)
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={slurm_cluster}/munge/munge.socket
CredType=cred/munge
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool-%n
SlurmctldPidFile={d}/run/slurmctld.pid
SlurmdPidFile={d}/run/slurmd-%n.pid
SlurmctldLogFile={d}/log/slurmctld.log
SlurmdLogFile={d}/log/slurmd-%n.log
TmpFS={d}/tmpfs
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=pmix
ReturnToService=2
JobRequeue=1
KillWait=10
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
NodeName=n1 NodeAddr={subnet}.1 CPUs=1 RealMemory=2000 State=UNKNOWN
NodeName=n2 NodeAddr={subnet}.2 CPUs=1 RealMemory=2000 State=UNKNOWN
PartitionName=two Nodes=n1,n2 Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
""")
        run(["slurmctld", "-f", str(conf)], env=env)
        run(["slurmd", "-f", str(conf), "-N", "n1"], env=env)
        n2 = (f"hostname n2 && mount --bind {d}/tmpfs-n2 {d}/tmpfs && mount -t tmpfs tmpfs /dev/shm && "
              f"exec nsenter --net=/var/run/netns/{ns} slurmd -f {conf} -N n2")
        run(["unshare", "--mount", "--uts", "--propagation", "private", "bash", "-c", n2], env=env)
        deadline = time.monotonic() + 90
        while run(["sinfo", "-h", "-N", "-o", "%T"], env=env, check=False).stdout.split() != ["idle", "idle"]:
            if time.monotonic() > deadline:
                pytest.fail(f"two-node cluster not idle after 90 s: {run(['sinfo', '-N'], env=env, check=False)}\n"
                            f"{tail(str(d / 'log' / 'slurmctld.log'))}")
            time.sleep(1)
        yield {"env": env, "dir": str(d)}
    finally:
        for name in ("slurmd-n2", "slurmd-n1", "slurmctld"):
            pid_file = d / "run" / f"{name}.pid"
            if pid_file.exists():
                try:
                    os.kill(int(pid_file.read_text()), 15)
                except (ProcessLookupError, ValueError):
                    pass
        time.sleep(2)
        subprocess.run(["ip", "link", "del", host_if], capture_output=True, timeout=30)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)


def test_two_nodes_one_task_each_train_like_one_node_two_tasks(two_node_cluster, uninterrupted, tmp_path):
    """The CPU template's training as 2 nodes x 1 task: it completes, the ranks run on different
    nodes, and the weights equal those of 1 node x 2 tasks (same ranks, same data, same seed)."""
    env = two_node_cluster["env"]
    with open(CPU_TEMPLATE) as f:
        argv = gen.credited_argv(f.read())
    trainer = argv[argv.index("--") + 1:]
    script = tmp_path / "two.sbatch"
    assert generator("--cpu-only", "--nodes", "2", "--tasks-per-node", "1", "--cpus-per-task", "1",
                     "--time", "10", "--signal-lead", "120", "-o", str(script), "--", *trainer).returncode == 0
    job_id = run(["sbatch", "--parsable", str(script)], env=env, cwd=str(tmp_path)).stdout.strip()
    log = str(tmp_path / f"hvdtrain-torch-{job_id}.out")
    info = wait_for_end(job_id, log, timeout=300, env=env)
    assert info["JobState"] == "COMPLETED" and info["NodeList"] == "n[1-2]", (info, tail(log))
    result = result_of(str(tmp_path), job_id)
    reference = result_of(uninterrupted["cwd"], uninterrupted["job_id"])
    assert result["world_size"] == 2 and len({r["host"] for r in result["ranks"]}) == 2, result["ranks"]
    assert [r["param_checksum"] for r in result["ranks"]] == [r["param_checksum"] for r in reference["ranks"]]


# ------------------------------------------------------------------------------ the doctor as a job
def test_doctor_template_job_is_ready(slurm_cluster, tmp_path):
    """slurm/doctor-cpu.sbatch submitted as is: 2 tasks check the stack and the job COMPLETES."""
    job_id, log = submit(os.path.join(REPO, "slurm", "doctor-cpu.sbatch"), str(tmp_path))
    info = wait_for_end(job_id, log, timeout=240)
    text = tail(log)
    assert info["JobState"] == "COMPLETED", f"{info}\n{text}"
    assert "hvdtrain doctor: 2 rank(s) via slurm" in text, text
    assert "hvdtrain.doctor: READY: 2 rank(s) on 1 host(s)" in text, text
