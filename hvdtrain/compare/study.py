"""A scaling study on Slurm, driven by `python -m hvdtrain.compare --nodes ...`: one sbatch job per
(backend, node count, repeat), written by hvdtrain.slurm, submitted with sbatch, and collected from
the jobs' own result files into compare's report (hvdtrain/compare/report.py).

    python -m hvdtrain.compare --nodes 1,2,4,8 --backends horovod-torch,ddp --workload resnet50-synthetic \\
        --out $SCRATCH/study-r50 -- --preset jean-zay --account xyz@v100 --time 30 \\
        --setup 'module load pytorch-gpu/py3/2.3.1'
    python -m hvdtrain.compare --collect $SCRATCH/study-r50    # later, as often as wanted

Options after `--` go to hvdtrain.slurm (site preset, account, time limit, set-up lines); the
study sets --nodes, --framework, --job-name and the output path itself. The study's directory:

    study.json              what was asked, and each job: its script, Slurm id and result file
    jobs/<tag>.sbatch       one script per job (tag: <backend>-n<nodes>-r<repeat>)
    jobs/<tag>/result.json  the trainer's result file; jobs/hvdtrain-<tag>-<id>.out its log
    scaling.json, scaling.md, scaling.png   the report, written again by every collection

A collection reads only study.json and the result files, asking Slurm (squeue, scontrol) only
about jobs without a result file, so it is idempotent and works where Slurm is not reachable.
"""
from __future__ import annotations

import glob
import json
import os
import shlex
import shutil
import subprocess
import sys
import time

from hvdtrain import slurm
from hvdtrain.compare.report import parity, rate_unit, record_from_result, summarize, write_markdown, write_plot
from hvdtrain.errors import UsageError
from hvdtrain.result_file import environment_fingerprint, write_json

STUDY_FILE = "study.json"
REPORT = "scaling"           # scaling.json, scaling.md, scaling.png
ACTIVE = ("pending", "configuring", "running", "completing", "requeued", "resizing", "suspended")
# The collection's exit status: 0 every job has its result; 1 some job failed; 3 some are not done.
EXIT_FAILED, EXIT_NOT_DONE = 1, 3
_OWNED = ("--nodes", "--framework", "--job-name", "-o", "--output", "--doctor")


def slurm_unreachable() -> str | None:
    """Why no job can be submitted from here (no sbatch, or no cluster answers), or None."""
    if shutil.which("sbatch") is None:
        return "no Slurm here (sbatch not found)"
    try:
        asked = subprocess.run(["sinfo", "-h", "-o", "%P"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as err:
        return f"no Slurm cluster answers here (sinfo: {err})"
    if asked.returncode != 0:
        last = (asked.stderr.strip().splitlines() or [f"exit {asked.returncode}"])[-1]
        return f"no Slurm cluster answers here (sinfo: {last})"
    return None


def generator_job(generator_args: list[str]) -> slurm.Job:
    """The generator's options, checked once, without trainer options: refuses what the study
    sets itself, and tells the ranks per node."""
    for arg in generator_args:
        if arg.split("=", 1)[0] in _OWNED:
            raise UsageError(f"{arg.split('=', 1)[0]} after `--` is set by the study itself (per job); "
                             "give the node counts with --nodes")
    slurm.check_values(generator_args)
    return slurm.check_options(slurm.build_arg_parser().parse_args(generator_args), [])


# Trainer options that name files: the jobs are submitted from <out>/jobs, so a path relative to
# where the study was started would name another file there.
PATH_OPTIONS = ("--data-dir", "--log-dir")
REFERENCE_OPTIONS = ("--model", "--dataset", "--loss")  # FILE.py:FUNCTION (hvdtrain/plugins.py)


def anchored(trainer_args: list[str], cwd: str) -> list[str]:
    """trainer_args with relative paths (--data-dir DIR, --model my_net.py:build, ...) made
    absolute from `cwd`; module references (my_pkg.nets:build) and built-in names as they are."""
    out, i = [], 0
    while i < len(trainer_args):
        arg = trainer_args[i]
        option, eq, value = arg.partition("=")
        if option in PATH_OPTIONS + REFERENCE_OPTIONS and (eq or i + 1 < len(trainer_args)):
            if not eq:
                value, i = trainer_args[i + 1], i + 1
            where, colon, name = value.rpartition(":")
            if option in PATH_OPTIONS:
                value = os.path.join(cwd, value)
            elif colon and where.endswith(".py"):
                value = f"{os.path.join(cwd, where)}:{name}"
            out += [f"{option}={value}"] if eq else [option, value]
        else:
            out.append(arg)
        i += 1
    return out


def plan(args, backends: dict, workload, sizes: list[int], generator_args: list[str]) -> dict:
    """study.json's content, with every job's script written into <out>/jobs."""
    out = os.path.abspath(args.out)
    shape = generator_job(generator_args)
    smallest_ranks = min(sizes) * shape.tasks_per_node
    jobs_dir = os.path.join(out, "jobs")
    os.makedirs(jobs_dir, exist_ok=True)
    jobs = []
    for repeat in range(args.repeats):
        for nodes in sizes:
            for label in backends:  # alternated, as in a local comparison
                backend, ranks = backends[label], nodes * shape.tasks_per_node
                tag = f"{label}-n{nodes}-r{repeat}"
                run_dir = os.path.join(jobs_dir, tag)
                trainer = ["--backend", backend.name, *backend.compare_args,
                           *anchored(workload.scaled_args(ranks, smallest_ranks, args.scaling), os.getcwd()),
                           "--checkpoint-dir", os.path.join(run_dir, "checkpoints"),
                           "--result-json", os.path.join(run_dir, "result.json")]
                argv = [*generator_args, "--framework", backend.framework, "--nodes", str(nodes),
                        "--job-name", f"hvdtrain-{tag}", "--", *trainer]
                script, _ = slurm.generate(argv)
                path = os.path.join(jobs_dir, f"{tag}.sbatch")
                with open(path, "w") as f:
                    f.write(script)
                jobs.append({"tag": tag, "backend": label, "nodes": nodes, "np": ranks, "repeat": repeat,
                             "script": path, "result_json": os.path.join(run_dir, "result.json"),
                             "job_id": None, "submit_error": None})
    return {"kind": "hvdtrain scaling study", "created": time.strftime("%Y-%m-%d %H:%M:%S"),
            "argv": sys.argv, "workload": vars(workload), "backends": list(backends), "sizes": sizes,
            "tasks_per_node": shape.tasks_per_node, "scaling": args.scaling,
            "scaling_rule": [workload.scaling_rule(smallest_ranks, args.scaling)],
            "target_accuracy": args.target_accuracy, "generator_args": generator_args, "jobs": jobs,
            "parity": {"steps": args.parity_steps, "loss_tolerance": args.loss_tolerance,
                       "accuracy_tolerance": args.accuracy_tolerance}}


def save(out: str, study: dict) -> None:
    write_json(os.path.join(out, STUDY_FILE), study)


def load(out: str) -> dict:
    path = os.path.join(out, STUDY_FILE)
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        raise UsageError(f"no study in {out} ({STUDY_FILE} not found): start one with --nodes") from None


def submit(out: str, study: dict) -> None:
    """sbatch every job not yet submitted, from jobs/ (the logs land there), recording its id at once."""
    jobs_dir = os.path.join(out, "jobs")
    for job in study["jobs"]:
        if job["job_id"]:
            continue
        env = dict(os.environ, HVDTRAIN_RUN_DIR=os.path.dirname(job["result_json"]))
        try:
            done = subprocess.run(["sbatch", "--parsable", job["script"]], cwd=jobs_dir, env=env,
                                  capture_output=True, text=True, timeout=120)
            answer = done.stdout.strip().split(";")[0]
            if done.returncode == 0 and answer.isdigit():
                job["job_id"], job["submit_error"] = answer, None
            else:
                job["submit_error"] = (done.stderr or done.stdout).strip() or f"sbatch exited {done.returncode}"
        except (OSError, subprocess.SubprocessError) as err:
            job["submit_error"] = f"sbatch could not run: {err}"
        save(out, study)
        print(f"[study] {job['tag']}: " + (f"job {job['job_id']}" if job["job_id"] else
                                           f"NOT submitted: {job['submit_error']}"), flush=True)


def slurm_state(job_id: str) -> tuple[str | None, str]:
    """(state, detail) of a job: squeue while it is queued or running, scontrol once it ended
    ("failed" when it ended: asked about jobs without a result file, or still running);
    (None, why) when Slurm cannot be asked."""
    try:
        queued = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True,
                                timeout=60)
        if queued.returncode == 0 and queued.stdout.strip():
            return queued.stdout.split()[0].lower(), ""
        shown = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as err:
        return None, f"Slurm not reachable ({err})"
    fields = dict(f.split("=", 1) for f in shown.stdout.split() if "=" in f)
    state = fields.get("JobState")
    if state is None:
        return "failed", "ended without writing its result file (Slurm no longer knows the job)"
    if state.lower() in ACTIVE:
        return state.lower(), ""
    reason = f", exit code {fields['ExitCode']}" if fields.get("ExitCode", "0:0") != "0:0" else ""
    return "failed", f"ended {state}{reason} without writing its result file"


def _log_of(out: str, job: dict) -> str | None:
    if not job["job_id"]:
        return None
    found = glob.glob(os.path.join(out, "jobs", f"*-{job['job_id']}.out"))
    return found[0] if found else None


def _error_line(log: str | None) -> str:
    """The trainer's own error line in a job's log (`hvdtrain.torch: error [rank 0/2]: ...`), else its last line."""
    if not log:
        return ""
    with open(log, errors="replace") as f:
        lines = [ln.strip() for ln in f.read().splitlines() if ln.strip()]
    errors = [ln for ln in lines if ": error" in ln and "hvdtrain" in ln]
    return (errors or lines or [""])[0 if errors else -1]


def measurement(out: str, job: dict) -> dict:
    m = {k: job[k] for k in ("tag", "backend", "nodes", "np", "repeat", "job_id")}
    m["log"] = _log_of(out, job)
    if os.path.exists(job["result_json"]):
        with open(job["result_json"]) as f:
            result = json.load(f)
        state = "ok"
        if result.get("stopped_by") and job["job_id"]:
            # Stopped before its time limit and requeued: the result is not the job's last word yet.
            active, _ = slurm_state(job["job_id"])
            state = active if active in ACTIVE else "ok"
        m.update(record_from_result(result, job["result_json"]), state=state)
        return m
    if not job["job_id"]:
        m["state"] = "failed" if job.get("submit_error") else "not submitted"
        if job.get("submit_error"):
            m["error"] = f"sbatch refused it: {job['submit_error']}"
        return m
    state, detail = slurm_state(job["job_id"])
    m["state"] = state or "unknown"
    if state == "failed":
        m["error"] = f"job {job['job_id']} {detail}" + (f": {_error_line(m['log'])}" if m["log"] else "")
    elif state is None:
        m["note"] = detail
    return m


def collect(out: str) -> tuple[dict, int]:
    """Write the report from study.json and the result files; (report, exit status)."""
    study = load(out)
    measurements = [measurement(out, job) for job in study["jobs"]]
    with_accuracy = study["workload"]["purpose"] == "accuracy"
    nps = sorted({m["np"] for m in measurements})
    tol = study["parity"]
    report = {"size_key": "nodes", "workload": study["workload"], "backends": study["backends"],
              "sizes": study["sizes"], "nps": nps, "scaling": study["scaling"],
              "scaling_rule": study["scaling_rule"], "target_accuracy": study["target_accuracy"],
              "collected_at": time.strftime("%Y-%m-%d %H:%M:%S"), "measurements": measurements,
              "unit": rate_unit(measurements),
              "summary": summarize(measurements, study["backends"], study["sizes"], with_accuracy, size_key="nodes",
                                   target_accuracy=study["target_accuracy"]),
              # Losses of the pairs that must agree; not accuracies across frameworks, which a short
              # study's epochs do not bring together (compare's accuracy workloads do).
              "parity": parity(measurements, nps, tol["steps"], tol["loss_tolerance"], tol["accuracy_tolerance"],
                               check_accuracy=False),
              "environment": environment_fingerprint()}
    write_json(os.path.join(out, f"{REPORT}.json"), report)
    write_markdown(os.path.join(out, f"{REPORT}.md"), report)
    write_plot(os.path.join(out, f"{REPORT}.png"), report)
    states = [m["state"] for m in measurements]
    status = (EXIT_FAILED if "failed" in states or not report["parity"]["ok"]
              else EXIT_NOT_DONE if any(s != "ok" for s in states) else 0)
    return report, status


def wait_and_collect(out: str, poll: float, limit: float) -> tuple[dict, int]:
    """Collect every `poll` seconds until no job is queued or running, or `limit` seconds passed."""
    deadline = time.monotonic() + limit
    while True:
        report, status = collect(out)
        # A result file is written before its job has ended (the ranks' shutdown, srun's wait on
        # the other tasks): wait for that too, so that nothing of the study still runs.
        waiting = [m["tag"] for m in report["measurements"] if m["state"] in ACTIVE or
                   (m["state"] == "ok" and m["job_id"] and slurm_state(m["job_id"])[0] in ACTIVE)]
        if not waiting or time.monotonic() > deadline:
            return report, status
        print(f"[study] waiting for {len(waiting)} job(s): {', '.join(waiting)}", flush=True)
        time.sleep(poll)


def start(args, backends: dict, workload, sizes: list[int], generator_args: list[str]) -> int:
    """Write the jobs; unless --dry-run, submit them (and with --wait, collect when they end)."""
    out = os.path.abspath(args.out)
    if os.path.exists(os.path.join(out, STUDY_FILE)):
        raise UsageError(f"{out} already holds a study: collect it with --collect {args.out}, or choose another --out")
    study = plan(args, backends, workload, sizes, generator_args)
    save(out, study)
    if args.dry_run:
        jobs_dir = os.path.join(out, "jobs")
        print(f"[study] {len(study['jobs'])} job script(s) written, none submitted. To submit them:")
        for job in study["jobs"]:
            print(f"  (cd {shlex.quote(jobs_dir)} && sbatch {shlex.quote(os.path.basename(job['script']))})")
        print(f"[study] then: python -m hvdtrain.compare --collect {shlex.quote(args.out)}")
        return 0
    submit(out, study)
    if args.wait:
        report, status = wait_and_collect(out, args.poll, args.wait_limit)
    else:
        report, status = collect(out)
        print(f"[study] submitted; collect the results with: python -m hvdtrain.compare --collect {shlex.quote(args.out)}")
    return print_report(out, status)


def print_report(out: str, status: int) -> int:
    with open(os.path.join(out, f"{REPORT}.md")) as f:
        print(f.read())
    print({0: "[study] every job has its result",
           EXIT_FAILED: "[study] FAILED: some job(s) failed (rows marked failed), or parity did not hold",
           EXIT_NOT_DONE: "[study] not done: some job(s) have no result yet; collect again later"}[status], flush=True)
    return status
