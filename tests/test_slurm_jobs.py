"""Jobs on the session's local Slurm 22.05 cluster (one node, 2 CPUs, partition debug): the CPU
templates train 2 ranks to COMPLETED; USR1 checkpoints, requeues and resumes to the same weights as
the uninterrupted job, with DataLoader workers in every rank; scancel checkpoints without a
requeue; `--signal=USR1@T` reaches the tasks, not the batch shell (its jobs run beside the
others: every job submitted here may share cores); the doctor template job is READY; a rank that
fails ends the job within 30 s under the cluster's KillWait of 60 s; a rank frozen after the
others ended does not hold the job (srun --wait). Every wait has a hard timeout;
a job still running at a timeout is cancelled."""
import glob
import os
import re
import time

import pytest

from conftest import PYTHON, REPO, base_env
from slurm_helpers import (CPU_STEPS, generator, job_info, result_of, run, submit, tail, wait_for_end,
                           wait_until)


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


@pytest.fixture(scope="module", autouse=True)
def signal_jobs(slurm_cluster, tmp_path_factory):
    """The two jobs of test_signal_option_reaches_tasks_not_batch_shell, submitted as this module
    starts: they wait 10-40 s for slurmctld's time-limit check and use no CPU meanwhile, so the
    module's other jobs run beside them (every job here shares cores: submit's --oversubscribe)
    and the test, near the module's end, only reads their logs. Cancelled at the end if still there."""
    cwd = tmp_path_factory.mktemp("signal-jobs")
    catcher = cwd / "catcher.py"
    catcher.write_text(_CATCHER)
    body = ("#!/bin/bash\n"
            f"srun -n 1 {PYTHON} {catcher} & step=$!\n"
            # `wait` returns early for a trapped signal, so the shell can stop the step at once.
            "trap 'echo \"batch shell got USR1\"; kill $step' USR1\n"
            "wait $step || wait $step\n")
    script = cwd / "sig.sbatch"
    script.write_text(body)
    jobs = {}
    for signal_spec in ("USR1@20", "B:USR1@20"):
        jobs[signal_spec] = submit(str(script), str(cwd), "-n", "1", "--time=1", f"--signal={signal_spec}",
                                   f"--job-name=sig-{signal_spec.replace(':', '').replace('@', '-')}",
                                   "--output=%x-%j.out")
    yield jobs
    run(["scancel", *(job_id for job_id, _ in jobs.values())], check=False)


# ------------------------------------------------------------------------------ (b) a 2-task job
def test_two_task_job_trains_to_completion(uninterrupted):
    info, log = uninterrupted["info"], uninterrupted["log"]
    assert info["JobState"] == "COMPLETED" and info["Restarts"] == "0", (info, tail(log))
    result = result_of(uninterrupted["cwd"], uninterrupted["job_id"])
    assert result["launcher"] == "slurm" and result["world_size"] == 2
    assert result["global_step"] == CPU_STEPS and result["stopped_by"] is None
    assert result["final"]["val_acc"] > 0.5, result["final"]
    assert len({r["param_checksum"] for r in result["ranks"]}) == 1  # the ranks agree
    checkpoints = glob.glob(os.path.join(uninterrupted["cwd"], "runs", "*", "checkpoints", "ckpt-*.pt"))
    assert max(map(os.path.basename, checkpoints)) == f"ckpt-e0003-s{CPU_STEPS:08d}.pt"


def test_tf_cpu_template_trains_to_completion(slurm_cluster, tmp_path):
    job_id, log = submit(os.path.join(REPO, "slurm", "tf-cpu.sbatch"), str(tmp_path))
    info = wait_for_end(job_id, log, timeout=420)
    assert info["JobState"] == "COMPLETED", tail(log)
    result = result_of(str(tmp_path), job_id)
    assert result["framework"] == "tf" and result["world_size"] == 2 and result["global_step"] == CPU_STEPS


# ------------------------------------------------------------------------------ the doctor as a job
def test_doctor_template_job_is_ready(slurm_cluster, tmp_path):
    """slurm/doctor-cpu.sbatch submitted as is, but for a lenient evenness threshold (the suite's
    other lane shares the cores: test_doctor.py's LENIENT): 2 tasks check the stack and the job
    COMPLETES."""
    with open(os.path.join(REPO, "slurm", "doctor-cpu.sbatch")) as f:
        text = f.read()
    assert text.count("python -m hvdtrain.doctor\n") == 1, text
    script = tmp_path / "doctor-cpu.sbatch"
    script.write_text(text.replace("python -m hvdtrain.doctor\n", "python -m hvdtrain.doctor --slow-fraction 0.9\n"))
    job_id, log = submit(str(script), str(tmp_path))
    info = wait_for_end(job_id, log, timeout=240)
    text = tail(log)
    assert info["JobState"] == "COMPLETED", f"{info}\n{text}"
    assert "hvdtrain doctor: 2 rank(s) via slurm" in text, text
    assert "hvdtrain.doctor: READY: 2 rank(s) on 1 host(s)" in text, text


# ------------------------------------------------------------------------------ stop signals with DataLoader workers
@pytest.fixture(scope="module")
def imagefolder_job(slurm_cluster, tmp_path_factory):
    """An sbatch script training on an imagefolder with 2 DataLoader workers per rank (the
    ImageNet case), and its uninterrupted run as the reference."""
    from hvdtrain.data.datasets import write_digits_imagefolder

    d = tmp_path_factory.mktemp("imagefolder-job")
    write_digits_imagefolder(str(d / "data"))
    script = str(d / "job.sbatch")
    assert generator("--cpu-only", "--nodes", "1", "--tasks-per-node", "2", "--cpus-per-task", "1", "--time", "15",
                     "--signal-lead", "120", "-o", script, "--", "--model", "mnist_cnn", "--dataset", "imagefolder",
                     "--data-dir", str(d / "data"), "--image-size", "32", "--epochs", "6", "--batch-size", "8",
                     "--num-workers", "2", "--log-interval", "4").returncode == 0
    cwd = str(d / "reference")
    os.makedirs(cwd)
    job_id, log = submit(script, cwd)
    info = wait_for_end(job_id, log, timeout=420)
    assert info["JobState"] == "COMPLETED", tail(log)
    return {"script": script, "reference": result_of(cwd, job_id)}


@pytest.mark.parametrize("how", ["usr1", "scancel"])
def test_stop_signal_with_dataloader_workers_checkpoints(imagefolder_job, tmp_path, how):
    """`scancel -s USR1 JOB` (no -b, no --full) signals every task of the job's steps and not the
    batch shell, as `#SBATCH --signal=USR1@T` does T seconds before the limit (see
    test_signal_option_reaches_tasks_not_batch_shell); every process of the step, DataLoader
    workers included: the workers ignore it, the ranks stop together and checkpoint; after USR1
    the job requeues (Slurm holds a requeued job 10 s before it may start again), resumes at the
    step it stopped at and ends with the reference's weights and validation figures; after
    `scancel JOB` (SIGTERM) it stays cancelled with its checkpoint (a requeue would undo the
    user's cancel). The job script is the generator's, as the templates are (test_slurm_generator.py)."""
    cwd = str(tmp_path)
    job_id, log = submit(imagefolder_job["script"], cwd)
    # Signalled once steps are being made (the progress bar counts one or more), not at the config
    # line: on a slower machine the first step (the workers' start) can outlast a short KillWait,
    # and scancel's SIGKILL would come before the step boundary where the ranks stop.
    stepping = re.compile(r"epoch [1-3]/\d+: .*\| *[1-9]\d*/\d+ \[")
    wait_until("training steps", lambda: stepping.search(tail(log, 10**6)), 300, job_id, log, 0.2)
    run(["scancel", "--signal=USR1", job_id] if how == "usr1" else ["scancel", job_id])
    info = wait_for_end(job_id, log, timeout=600 if how == "usr1" else 120, restarts=1 if how == "usr1" else 0)
    text = tail(log, 10**6)
    stopped = re.search(r"stopped by (SIGUSR1|SIGTERM) at step (\d+); checkpoint written", text)
    assert stopped, f"no checkpoint at the stop (did it end first?):\n{text[-4000:]}"
    assert "DataLoader worker" not in text and "Traceback" not in text, text[-4000:]
    reference = imagefolder_job["reference"]
    assert 0 < int(stopped.group(2)) < reference["global_step"], text[-4000:]
    if how == "usr1":
        assert info["JobState"] == "COMPLETED" and info["Restarts"] == "1", (info, text[-4000:])
        assert f"job {job_id} requeued" in text, text[-4000:]
        resumed = re.search(r"resumed from \S+ckpt-e\d+-s(\d+)(?:-n\d+)?\.pt at epoch \d+, step (\d+)", text)
        assert resumed and resumed.group(1).lstrip("0") == stopped.group(2) == resumed.group(2), text[-4000:]
        result = result_of(cwd, job_id)
        assert result["global_step"] == reference["global_step"] and result["stopped_by"] is None
        assert [r["param_checksum"] for r in result["ranks"]] == [r["param_checksum"] for r in reference["ranks"]]
        # Validation of the same final weights: the same figures. (The training loss and accuracy
        # of the epoch the stop fell in cover only the steps after the resume.)
        val = ("epoch", "global_step", "val_loss", "val_acc", "val_count")
        assert {k: result["final"][k] for k in val} == {k: reference["final"][k] for k in val}
    else:
        time.sleep(3)  # a requeue, were there one, would show by now
        info = job_info(job_id)
        assert info["JobState"] == "CANCELLED" and info["Restarts"] == "0", (info, text[-4000:])
        assert "requeued" not in tail(log, 10**6)
        [ckpt_dir] = glob.glob(os.path.join(cwd, "runs", f"*-{job_id}", "checkpoints"))
        steps = [int(m) for m in re.findall(r"ckpt-e\d+-s(\d+)(?:-n\d+)?\.pt", " ".join(os.listdir(ckpt_dir)))]
        assert int(stopped.group(2)) in steps, (steps, text[-4000:])


# ------------------------------------------------------------------------------ a failure ends the job, whatever KillWait
def test_a_failing_rank_ends_the_job_within_30_s_whatever_slurms_killwait(slurm_cluster, tmp_path):
    """The cluster's KillWait is 60 s, as at sites (30-60). A user's dataset fails in rank 1's
    decode worker, in two jobs side by side: under the generator's `srun --kill-on-bad-exit=1`
    the worker is killed (the out-of-memory killer's SIGKILL); under a plain srun (a user's own
    line) the read raises OSError. Slurm's SIGTERM, then SIGKILL a KillWait later, or nothing at
    all: either way every rank ends within 30 s of the failure, the first failure's one line
    names it (the killed worker as killed, never as a broken pipe), and nothing follows it but the
    launcher's words (no resource tracker warning)."""
    kill_wait = re.search(r"^KillWait\s*=\s*(\d+)", run(["scontrol", "show", "config"]).stdout, re.M)
    assert kill_wait and int(kill_wait.group(1)) > 30, "the suite's cluster must have a site's KillWait"
    users = os.path.join(REPO, "tests", "scripts", "failing_dataset.py")
    jobs = {}
    for how, srun in (("killed", "srun --kill-on-bad-exit=1 "), ("raising", "srun ")):
        script = tmp_path / f"{how}.sbatch"
        assert generator("--cpu-only", "--tasks-per-node", "2", "--cpus-per-task", "1", "--time", "10",
                         "--signal-lead", "60", "--job-name", f"hvdtrain-{how}", "-o", str(script), "--", "--model", f"{users}:build_model",
                         "--dataset", f"{users}:{how}", "--num-workers", "1", "--batch-size", "8", "--epochs", "20",
                         "--threads-per-rank", "1", "--watchdog-seconds", "300").returncode == 0
        text = script.read_text()
        assert "srun --kill-on-bad-exit=1 " in text
        script.write_text(text.replace("srun --kill-on-bad-exit=1 ", srun))
        jobs[how] = submit(str(script), str(tmp_path))
    ended = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")
    for how, (job_id, log) in jobs.items():
        failed_at = wait_until("the failure", lambda: re.search(r"^failing at (\d+\.\d+)$", tail(log, 10**6), re.M),
                               300, job_id, log, every=0.2)
        wait_until("the job's end", lambda: job_info(job_id).get("JobState") in ended, 90, job_id, log, every=0.2)
        took = time.time() - float(failed_at.group(1))
        text = tail(log, 10**6)
        errors = re.findall(r"hvdtrain\.torch: error \[rank (\d)/2\]: (.*)", text)
        assert errors and errors[0][0] == "1", text[-4000:]
        if how == "killed":
            assert re.match(r"reading the data: (a DataLoader worker of this rank ended|DataLoader worker \(pid).*killed "
                            r"from outside, most often for memory", errors[0][1]), text[-4000:]
        else:
            assert errors[0][1].startswith("reading the data, in DataLoader worker 0: OSError: [Errno 5] Input/output "
                                           "error: '/gpfs/data/train/sample-"), text[-4000:]
        assert "resource_tracker" not in text and "Traceback" not in text and "Connection reset" not in text, text[-4000:]
        assert took < 30, f"{how}: the job ended {took:.1f} s after the failure (KillWait {kill_wait.group(1)} s):\n{text[-4000:]}"
        print(f"{how} ({'--kill-on-bad-exit=1' if how == 'killed' else 'plain srun'}): the job ended {took:.1f} s "
              f"after the failure; rank lines: {errors}")


# ------------------------------------------------------------------------------ srun --wait: a rank frozen at the end
def test_a_rank_frozen_after_the_others_ended_does_not_hold_the_job(slurm_cluster, tmp_path):
    """The generator's script with `--srun-wait 4`, whose rank 1 task freezes itself (SIGSTOP)
    right after its trainer ended, as a rank stuck at the end of its run (a driver, a file
    system) would: Slurm ends the step about 4 s after rank 0 exited, instead of letting the
    frozen rank hold the node until the time limit (10 minutes here)."""
    wait = 4
    script = tmp_path / "frozen.sbatch"
    assert generator("--cpu-only", "--tasks-per-node", "2", "--cpus-per-task", "1", "--time", "10",
                     "--signal-lead", "60", "--srun-wait", str(wait), "--job-name", "hvdtrain-frozen",
                     "-o", str(script), "--", "--model", "mnist_cnn", "--dataset", "digits", "--epochs", "1", "--steps", "5",
                     "--threads-per-rank", "1").returncode == 0
    text = script.read_text()
    trainer = "python -m hvdtrain.torch \\\n"
    assert f"srun --kill-on-bad-exit=1 --wait={wait} {trainer}" in text
    # Each task runs the trainer and says when it ended; rank 1's task then stops itself.
    freeze = ("bash -c '\"$@\"; echo \"rank $SLURM_PROCID ended $(date +%s.%N)\"; "
              "[ \"$SLURM_PROCID\" != 1 ] || kill -STOP $$' task ")
    script.write_text(text.replace(trainer, freeze + trainer))
    job_id, log = submit(str(script), str(tmp_path))

    def rank0_ended():
        m = re.search(r"^rank 0 ended (\d+\.\d+)$", tail(log, 10**6), re.M)
        return m and float(m.group(1))
    rank0_end = wait_until("rank 0's end", rank0_ended, 240, job_id, log, every=0.2)
    ended = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")
    info = wait_until("the job's end", lambda: (i := job_info(job_id)).get("JobState") in ended and i, wait + 60,
                      job_id, log, every=0.2)
    took = time.time() - rank0_end
    text = tail(log, 10**6)
    assert re.search(r"^rank 1 ended ", text, re.M), text[-4000:]          # rank 1 trained to the end, then froze
    assert result_of(str(tmp_path), job_id)["global_step"] == 5
    assert wait - 1 <= took <= wait + 20, f"the job ended {took:.1f} s after rank 0 (--wait={wait}):\n{text[-4000:]}"
    assert info["JobState"] == "FAILED", (info, text[-4000:])     # srun reports the rank it ended
    # The frozen task went with the step (this session's cluster: other clusters number jobs alike).
    mine = {f"SLURM_JOB_ID={job_id}".encode(), f"SLURM_CONF={os.environ['SLURM_CONF']}".encode()}

    def job_processes():
        pids = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    if mine <= set(f.read().split(b"\0")):
                        pids.append(pid)
            except OSError:
                continue
        return pids
    deadline = time.monotonic() + 10
    while job_processes() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not job_processes(), f"left behind: {job_processes()}"
    print(f"rank 1 frozen at the end: the job ended {took:.1f} s after rank 0 exited (--wait={wait}), "
          f"{info['JobState']}")


# ------------------------------------------------------------------------------ what --signal reaches (its jobs: signal_jobs)
def test_signal_option_reaches_tasks_not_batch_shell(signal_jobs):
    """Slurm 22.05, `--signal=USR1@20` with a 1-minute limit: the srun task gets USR1 and the
    batch shell does not; with `B:USR1@20` only the batch shell does. The templates use the
    former, so every rank hears it without the script forwarding anything. (slurmctld sends the
    signal at its first time-limit check, every 30 s, that is within 30 s of the due time: here
    10-40 s after the start, once the task runs.)"""
    for signal_spec, (job_id, log) in signal_jobs.items():
        wait_for_end(job_id, log, timeout=240)
        text = tail(log)
        if signal_spec == "USR1@20":
            assert "task got SIGUSR1" in text and "batch shell got USR1" not in text, text
        else:
            assert "batch shell got USR1" in text and "task got SIGUSR1" not in text, text


def test_a_study_of_a_users_own_model_file_runs_its_jobs(slurm_cluster, tmp_path):
    """`hvdtrain.compare --nodes 1 --model my_net.py:build ...` started where the user's file is,
    as a user does: the jobs are submitted from the study's jobs/ folder, so the references are
    made absolute in the job scripts (a relative one named a file that is not there: the job
    failed). The job trains the user's model on the user's data and the report counts samples/s."""
    import json
    import shutil
    import subprocess

    shutil.copy(os.path.join(REPO, "tests", "scripts", "user_regression.py"), tmp_path / "my_regression.py")
    refs = ["--model", "my_regression.py:build_model", "--dataset", "my_regression.py:datasets",
            "--loss", "my_regression.py:mse"]
    done = subprocess.run([PYTHON, "-m", "hvdtrain.compare", "--nodes", "1", "--backends", "horovod-torch", *refs,
                           "--train-args", "--epochs 1 --batch-size 32", "--out", "study", "--wait", "--poll", "1",
                           "--wait-limit", "300", "--", "--cpu-only", "--cpus-per-task", "1", "--time", "10",
                           "--signal-lead", "60"], capture_output=True, text=True, cwd=tmp_path, timeout=400,
                          env=base_env())
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-3000:]
    [job] = (tmp_path / "study" / "jobs").glob("*.sbatch")
    assert f"--model {tmp_path}/my_regression.py:build_model" in job.read_text()
    report = json.loads((tmp_path / "study" / "scaling.json").read_text())
    [row] = report["summary"]
    assert row["state"] == "ok" and row["total_images_per_sec"] > 0, row
    assert report["unit"] == "samples/s" and "total samples/s" in (tmp_path / "study" / "scaling.md").read_text()
    # --wait returned once the job had left Slurm's queue, not when its result file appeared (the
    # job's srun then still waited on its tasks' end, and was orphaned when the cluster stopped).
    queued = subprocess.run(["squeue", "-h", "-o", "%i %T %j"], capture_output=True, text=True, env=base_env())
    assert "hvdtrain-horovod-torch-n1-r0" not in queued.stdout, queued.stdout


def test_the_prediction_measures_inside_an_allocation_through_srun(slurm_cluster, tmp_path):
    """`python -m hvdtrain.predict --measure` in salloc's shell (which may be on a login node):
    every run, the one rank's too, is a step of the allocation (srun, on its node), and the
    prediction and its check come out of them."""
    import json
    import subprocess

    out = tmp_path / "m"
    done = subprocess.run(["salloc", "-N", "1", "-n", "2", "-t", "10", PYTHON, "-m", "hvdtrain.predict", "--cluster",
                           "jean-zay-a100", "--measure", "--model mnist_cnn --dataset digits --batch-size 16",
                           "--steps", "30", "--out", str(out), "--gpus", "8", "--json", str(tmp_path / "p.json")],
                          capture_output=True, text=True, cwd=REPO, timeout=400, env=base_env())
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-3000:]
    launched = re.findall(r"^measuring (.+?): (\S+)", done.stdout, re.M)
    assert [what for what, _ in launched] == ["one rank's step", "the node's allreduce (2 ranks)",
                                              "2 ranks under horovod", "2 ranks under ddp"], done.stdout
    assert {launcher for _, launcher in launched} == {"srun"}, done.stdout
    for name, ranks in (("one", 1), ("horovod-2", 2), ("ddp-2", 2)):
        result = json.loads((out / f"{name}.json").read_text())
        # A step of its own (salloc's shell has SLURM_NTASKS=2), with a rank's share of the cores.
        assert result["world_size"] == ranks and result["environment"]["env"]["SLURM_NTASKS"] == str(ranks)
        assert result["environment"]["env"]["SLURM_CPUS_PER_TASK"] == "1"
    assert [r["backend"] for r in json.loads((tmp_path / "p.json").read_text())["measured_here"]["check"]] == \
        ["horovod", "ddp"]
