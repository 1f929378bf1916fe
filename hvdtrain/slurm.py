"""Write an sbatch script for hvdtrain from a few options, refusing inconsistent ones.

    python -m hvdtrain.slurm --preset jean-zay --nodes 2 --time 20:00:00 -- --model resnet50 \\
        --dataset imagefolder --data-dir '$DATA_DIR' --epochs 90 > train.sbatch
    python -m hvdtrain.slurm --cpu-only --tasks-per-node 2 --cpus-per-task 1 --time 30 -o cpu.sbatch \\
        -- --model mnist_cnn --dataset digits
    sbatch train.sbatch

Everything after `--` goes to `python -m hvdtrain.torch` (or `hvdtrain.tf`) and is checked against
that trainer's options; with `--script FILE.py` (your own script, e.g. a Lightning one) to that
script, unchecked. `$NAME` and `${NAME}` in an argument are left for the job's shell to expand
(`'$DATA_DIR'` above); everything else is quoted literally, `$(...)` included. Control characters
(a newline) are refused in every value.

Every script checkpoints into its run directory and asks Slurm for SIGUSR1 `--signal-lead`
seconds (600 by default) before the time limit: the trainer then checkpoints, requeues the job and
exits, and the requeued job resumes from that checkpoint (its log appended to the same file).
Its srun ends the whole step when a rank fails (`--kill-on-bad-exit=1`) and `--srun-wait`
seconds (120 by default) after the first rank has exited (`--wait`), so that a rank frozen
after the others ended does not hold the nodes until the time limit. A `module purge` among the
`--setup` lines must be followed by a `module load`. The templates in slurm/ are written by this
module; the second line of each is the command that writes it, and

    python -m hvdtrain.slurm regenerate slurm/*.sbatch

rewrites them from those lines.
"""
from __future__ import annotations

import argparse
import os
import re
import shlex
import sys
import textwrap
from dataclasses import dataclass

from hvdtrain.config import build_parser
from hvdtrain.errors import UsageError

PROG = "hvdtrain.slurm"
CREDIT = f"# Written by: python -m {PROG} "

# The job-script convention (README, slurm/, docs/): SIGUSR1 this long before the time limit
# covers the rest of a log interval, a validation pass and a checkpoint of ResNet-50 on a busy
# file system, with Slurm's up to 60 s of earliness on top.
SIGNAL_LEAD = 600
# srun --wait: the ranks leave training together (a barrier after the result file and the last
# checkpoint), so once one has exited the others only shut down, seconds; 120 s never cuts a
# healthy rank short, and a rank frozen after the others ended frees the nodes 2 minutes later.
SRUN_WAIT = 120


@dataclass(frozen=True)
class Preset:
    """What one kind of node has, and what its site asks of every job (from the sites' docs)."""
    gpus_per_node: int          # GPUs a node has: the default request is the whole node
    cores_per_node: int         # CPUs Slurm may hand out on a node (after --hint, if any)
    cpus_per_gpu: int           # the site's rule: --cpus-per-task = cores / GPUs of the node
    partition: str | None = None
    hint: str | None = None
    note: str = ""


PRESETS = {
    # Jean Zay default GPU partition: 4 V100 and 40 physical cores per node.
    "jean-zay": Preset(4, 40, 10, None, "nomultithread", "Jean Zay, default GPU partition (4 GPUs, 40 cores per node)"),
    # Jean Zay gpu_p2: 8 V100 and 24 physical cores per node.
    "jean-zay-gpu_p2": Preset(8, 24, 3, "gpu_p2", "nomultithread", "Jean Zay gpu_p2 (8 GPUs, 24 cores per node)"),
    # JUWELS Booster: 4 A100 and 96 CPUs (48 cores x 2 threads) per node; jobs name an account.
    "juwels-booster": Preset(4, 96, 24, "booster", None, "JUWELS Booster (4 GPUs, 96 CPUs per node)"),
}


# ---------------------------------------------------------------------------------- time limits
_TIME = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")


def parse_time_limit(text: str) -> int:
    """Slurm's --time formats -> seconds: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S."""
    m = _TIME.match(text.strip())
    if not m:
        raise UsageError(f"--time '{text}' is not a Slurm time limit "
                         "(minutes, minutes:seconds, hours:minutes:seconds, days-hours[:minutes[:seconds]])")
    days, a, b, c = m.groups()
    if days is not None:   # D-H, D-H:M, D-H:M:S
        h, mi, s = int(a), int(b or 0), int(c or 0)
        seconds = ((int(days) * 24 + h) * 60 + mi) * 60 + s
        parts = [(h, 24, "hours"), (mi, 60, "minutes"), (s, 60, "seconds")]
    elif c is not None:    # H:M:S
        h, mi, s = int(a), int(b), int(c)
        seconds, parts = (h * 60 + mi) * 60 + s, [(mi, 60, "minutes"), (s, 60, "seconds")]
    elif b is not None:    # M:S
        seconds, parts = int(a) * 60 + int(b), [(int(b), 60, "seconds")]
    else:                  # M
        seconds, parts = int(a) * 60, []
    for value, bound, name in parts:
        if value >= bound:
            raise UsageError(f"--time '{text}': {value} {name} is out of range (< {bound})")
    return seconds


# ---------------------------------------------------------------------------------- options
class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, like every other refusal, instead of usage + message
        raise UsageError(message)


def build_arg_parser() -> argparse.ArgumentParser:
    p = _Parser(prog=f"python -m {PROG}", description="Write an sbatch script that trains with hvdtrain.",
                allow_abbrev=False,
                epilog="Trainer options go after `--`. Presets: " + "; ".join(
                    f"{name}: {pr.note}" for name, pr in PRESETS.items()))
    p.add_argument("--preset", choices=sorted(PRESETS), help="a site's node shape and rules")
    p.add_argument("--framework", choices=("torch", "tf"), default="torch",
                   help="the trainer the job runs: python -m hvdtrain.torch or hvdtrain.tf (default: torch)")
    p.add_argument("--script", metavar="FILE.py",
                   help="your own training script (a Lightning one with strategy=\"horovod\", say) instead of "
                        "hvdtrain's trainer: the options after `--` go to it unchecked; it finds the run directory "
                        "in $HVDTRAIN_RUN_DIR (Lightning's default_root_dir, for its resume after a requeue)")
    p.add_argument("--doctor", action="store_true",
                   help="a short job that checks the stack on these nodes (python -m hvdtrain.doctor) "
                        "instead of training; options after `--` go to the doctor")
    p.add_argument("--nodes", type=int, default=1, help="nodes of the job (default: 1)")
    p.add_argument("--gpus-per-node", type=int, help="GPUs to use per node (default: the preset's node, else 1)")
    p.add_argument("--tasks-per-node", type=int, help="ranks per node (default: one per GPU; 1 with --cpu-only)")
    p.add_argument("--cpus-per-task", type=int, help="cores per rank (default: the preset's cores per GPU)")
    p.add_argument("--cores-per-node", type=int, help="cores a node has, to check tasks x cpus-per-task against")
    p.add_argument("--cpu-only", action="store_true", help="no GPUs: ranks compute on their cores")
    p.add_argument("--hint", help="sbatch --hint, e.g. nomultithread (physical cores only)")
    p.add_argument("--time", default="01:00:00", help="time limit, in a Slurm --time format")
    p.add_argument("--signal-lead", type=int, default=SIGNAL_LEAD,
                   help="seconds before the time limit at which every task gets SIGUSR1 (checkpoint + requeue; "
                        f"default {SIGNAL_LEAD})")
    p.add_argument("--srun-wait", type=int, default=SRUN_WAIT,
                   help="srun --wait: seconds after the first rank exits at which Slurm ends the others "
                        f"(default {SRUN_WAIT})")
    p.add_argument("--partition", help="sbatch --partition (default: the preset's, else the site's default)")
    p.add_argument("--account", help="sbatch --account: the project the hours are charged to")
    p.add_argument("--reservation", help="sbatch --reservation, e.g. a course's")
    p.add_argument("--qos", help="sbatch --qos, e.g. a site's development or long queue")
    p.add_argument("--job-name", help="default: hvdtrain-<framework>")
    p.add_argument("--sbatch-option", action="append", default=[], metavar="OPT",
                   help="an extra #SBATCH line, e.g. --constraint=v100-32g (repeatable)")
    p.add_argument("--srun-option", action="append", default=[], metavar="OPT",
                   help="an extra srun option, e.g. --mpi=pmix (repeatable)")
    p.add_argument("--setup", action="append", default=[], metavar="LINE",
                   help="a shell line run before srun, e.g. 'module load pytorch-gpu' (repeatable)")
    p.add_argument("-o", "--output", help="write the script here (default: standard output)")
    return p


@dataclass(frozen=True)
class Job:
    """The checked request: every field is what goes into the script."""
    framework: str
    nodes: int
    tasks_per_node: int
    gpus_per_node: int
    cpus_per_task: int
    time: str
    signal_lead: int
    hint: str | None
    partition: str | None
    account: str | None
    reservation: str | None
    qos: str | None
    job_name: str
    sbatch_options: tuple
    srun_options: tuple
    srun_wait: int
    setup: tuple
    trainer_args: tuple
    note: str
    doctor: bool = False
    script: str | None = None  # the user's own script, run instead of the trainer

    @property
    def module(self) -> str:
        return "hvdtrain.doctor" if self.doctor else f"hvdtrain.{self.framework}"

    @property
    def program(self) -> list[str]:
        """What srun starts after `python`."""
        return [shlex.quote(self.script)] if self.script else ["-m", self.module]


def check_options(args: argparse.Namespace, trainer_args: list[str]) -> Job:
    """The request with defaults filled in, or UsageError naming the first inconsistency."""
    preset = PRESETS[args.preset] if args.preset else None
    if args.nodes < 1:
        raise UsageError(f"--nodes must be >= 1 (got {args.nodes})")
    if args.cpu_only:
        if args.gpus_per_node:
            raise UsageError(f"--cpu-only asks for no GPUs, but --gpus-per-node is {args.gpus_per_node}")
        if preset:
            raise UsageError(f"--preset {args.preset} describes GPU nodes; drop it for --cpu-only")
        gpus, tasks = 0, args.tasks_per_node or 1
    else:
        gpus = args.gpus_per_node if args.gpus_per_node is not None else (preset.gpus_per_node if preset else 1)
        if gpus < 1:
            raise UsageError(f"--gpus-per-node must be >= 1 (got {gpus}); use --cpu-only for a job without GPUs")
        if preset and gpus > preset.gpus_per_node:
            raise UsageError(f"--gpus-per-node {gpus}, but a {args.preset} node has {preset.gpus_per_node} GPUs")
        tasks = args.tasks_per_node if args.tasks_per_node is not None else gpus
        if tasks != gpus:
            # Horovod runs one rank per GPU: more ranks would share a GPU, fewer would leave one idle.
            raise UsageError(f"--tasks-per-node {tasks} differs from --gpus-per-node {gpus}: "
                             "hvdtrain runs one task (rank) per GPU")
    if tasks < 1:
        raise UsageError(f"--tasks-per-node must be >= 1 (got {tasks})")

    cores = args.cores_per_node or (preset.cores_per_node if preset else None)
    cpus = args.cpus_per_task or (preset.cpus_per_gpu if preset else None)
    if cpus is None:
        if cores is None:
            raise UsageError("give --cpus-per-task (cores per node / tasks per node) or --cores-per-node")
        cpus = cores // tasks
    if cpus < 1:
        raise UsageError(f"--cpus-per-task must be >= 1 (got {cpus})")
    if cores is not None and cpus * tasks > cores:
        raise UsageError(f"{tasks} tasks per node x {cpus} cpus per task = {cpus * tasks} cores, "
                         f"but a node has {cores}")

    limit = parse_time_limit(args.time)
    # The doctor is a check of a few seconds: no stop signal, no requeue.
    if limit == 0 and not args.doctor:
        raise UsageError("--time 0 means no time limit: there is no end for --signal-lead to count back from")
    if not 0 < args.signal_lead <= 65535:
        raise UsageError(f"--signal-lead must be 1..65535 seconds (got {args.signal_lead})")
    if args.signal_lead >= limit and not args.doctor:
        raise UsageError(f"--signal-lead {args.signal_lead} s is not shorter than the time limit "
                         f"--time {args.time} ({limit} s): the job would be told to stop before it starts")

    if not 0 < args.srun_wait <= 65535:
        raise UsageError(f"--srun-wait must be 1..65535 seconds (got {args.srun_wait}); 0 would be srun's "
                         "'wait for every rank', the hang it is there to end")
    for option in args.srun_option:
        for own, instead in (("--wait", "--srun-wait"), ("--kill-on-bad-exit", "(always on)"), ("-W", "--srun-wait"),
                             ("-K", "(always on)")):
            if option == own or option.startswith(own + "=") or (len(own) == 2 and option.startswith(own)):
                raise UsageError(f"--srun-option '{option}': the script's srun has --kill-on-bad-exit=1 and "
                                 f"--wait=<--srun-wait>; use {instead}")
    _check_setup(args.setup)
    trainer_args = list(trainer_args)
    if args.script:
        if args.doctor:
            raise UsageError("--script and --doctor: a job runs one of them")
        if not args.script.endswith(".py") or not os.path.isfile(args.script):
            raise UsageError(f"--script {args.script}: no such Python file (a path from the directory you will "
                             f"submit the job from)")
    elif args.doctor:
        _check_doctor_args(trainer_args)
    else:
        _check_trainer_args(args.framework, trainer_args)
    hint = args.hint if args.hint is not None else (preset.hint if preset else None)
    if hint is not None and hint not in HINTS:
        raise UsageError(f"--hint '{hint}' is not one of sbatch's: {', '.join(HINTS)}")
    for option in args.sbatch_option:
        if not _SBATCH_OPTION.match(option):
            raise UsageError(f"--sbatch-option '{option}' is not one sbatch option of the form --name or "
                             "--name=value (no space, quote, $ or other shell character in the value)")
    partition = args.partition if args.partition is not None else (preset.partition if preset else None)
    for name in ("partition", "account", "reservation", "qos", "job_name"):
        value = getattr(args, name)
        if value is not None and not re.match(r"^[A-Za-z0-9_.,:+@-]+$", value):
            raise UsageError(f"--{name.replace('_', '-')} '{value}' has characters Slurm names do not")
    note = preset.note if preset else ("CPU-only" if args.cpu_only else "generic GPU nodes")
    return Job(args.framework, args.nodes, tasks, gpus, cpus, args.time, args.signal_lead, hint, partition,
               args.account, args.reservation, args.qos,
               args.job_name or ("hvdtrain-doctor" if args.doctor else
                                 f"hvdtrain-{os.path.basename(args.script)[:-3]}" if args.script else
                                 f"hvdtrain-{args.framework}"),
               tuple(args.sbatch_option), tuple(args.srun_option), args.srun_wait, tuple(args.setup),
               tuple(trainer_args), note, args.doctor, args.script)


def _check_setup(lines: list[str]) -> None:
    """`module purge` unloads what the job needs (python, MPI, CUDA, the site's torch): a module
    must be loaded again after it, before the venv over those modules is activated."""
    purged = False
    for line in lines:
        words = line.split()
        if words[:2] == ["module", "purge"]:
            purged = True
        elif words[:2] in (["module", "load"], ["module", "add"]) or (words[:1] == ["ml"] and len(words) > 1):
            purged = False
        elif purged and "activate" in line:
            raise UsageError(f"--setup '{line}' comes after 'module purge' with no 'module load' between: the venv "
                             "would run without the modules it was made over")
    if purged:
        raise UsageError("--setup 'module purge' is not followed by a 'module load': the job would run "
                         "without the site's python, MPI and CUDA")


def _check_trainer_args(framework: str, trainer_args: list[str]) -> None:
    """Parse them as the trainer will, so a typo fails now rather than after hours in the queue."""
    def refuse(message):
        raise UsageError(f"trainer option: {message}")

    parser = build_parser(framework, [], f"python -m hvdtrain.{framework}")
    parser.error = refuse
    parser.parse_args(trainer_args)


def _check_doctor_args(doctor_args: list[str]) -> None:
    from hvdtrain.doctor.cli import build_parser as doctor_parser

    def refuse(message):
        raise UsageError(f"doctor option: {message}")

    parser = doctor_parser()
    parser.error = refuse
    parser.parse_args(doctor_args)


# ---------------------------------------------------------------------------------- the script
_VARIABLE = re.compile(r"\$(?:[A-Za-z_][A-Za-z0-9_]*|\{[A-Za-z_][A-Za-z0-9_]*\})")


def _shell_word(arg: str) -> str:
    """`arg` as one shell word: `$NAME` and `${NAME}` in it are meant for the job's shell and
    expand there (in double quotes); everything else is literal, `$(...)` and backquotes too."""
    if "$" not in arg:
        return shlex.quote(arg)
    if "$" not in _VARIABLE.sub("", arg) and not any(c in arg for c in '"`\\'):
        return f'"{arg}"'  # nothing else special inside double quotes: the readable form
    words, start = [], 0
    for m in _VARIABLE.finditer(arg):
        if m.start() > start:
            words.append(shlex.quote(arg[start:m.start()]))
        words.append(f'"{m.group(0)}"')
        start = m.end()
    if start < len(arg) or not words:
        words.append(shlex.quote(arg[start:]))
    return "".join(words)


def _has_option(args: tuple, name: str) -> bool:
    return any(a == name or a.startswith(name + "=") for a in args)


def render(job: Job, command: str) -> str:
    """The sbatch script for `job`; `command` (the generator's options) goes into its header."""
    total = job.nodes * job.tasks_per_node
    sb = [("job-name", job.job_name, None),
          ("nodes", job.nodes, None),
          ("ntasks-per-node", job.tasks_per_node,
           "one task (Horovod rank) per GPU" if job.gpus_per_node else "ranks per node")]
    if job.gpus_per_node:
        sb.append(("gres", f"gpu:{job.gpus_per_node}", "GPUs per node"))
    sb.append(("cpus-per-task", job.cpus_per_task,
               f"cores per rank: {job.tasks_per_node} x {job.cpus_per_task} = "
               f"{job.tasks_per_node * job.cpus_per_task} per node"))
    if job.hint:
        sb.append(("hint", job.hint, "physical cores only" if job.hint == "nomultithread" else None))
    sb.append(("time", job.time, "time limit"))
    if not job.doctor:
        # No "B:": Slurm signals every task of every step (the ranks), not the batch shell.
        sb += [("signal", f"USR1@{job.signal_lead}",
                "each rank: checkpoint, requeue, exit (Slurm may send it up to 60 s early)"),
               ("requeue", None, "the trainer requeues the job; it then resumes from its checkpoint"),
               ("open-mode", "append", "a requeued run appends to the same log")]
    sb.append(("output", "%x-%j.out", "log: job name and id"))
    for name in ("partition", "account", "reservation", "qos"):
        if getattr(job, name):
            sb.append((name, getattr(job, name), None))
    lines = ["#!/bin/bash", CREDIT + command,
             f"# {job.note}: {job.nodes} node(s) x {job.tasks_per_node} rank(s) = {total} rank(s), "
             f"python {' '.join(job.program)}."]
    for name, value, why in sb:
        directive = f"#SBATCH --{name}" + ("" if value is None else f"={value}")
        lines.append(f"{directive:<37} # {why}" if why else directive)
    lines += [f"#SBATCH {opt}" for opt in job.sbatch_options]
    lines += [
        "",
        "set -euo pipefail",
        "# Slurm >= 22.05: srun no longer inherits --cpus-per-task from sbatch.",
        'export SRUN_CPUS_PER_TASK="${SLURM_CPUS_PER_TASK:-1}"',
    ]
    if job.doctor:
        return "\n".join(lines + [
            "# The job inherits the environment sbatch was run from (python with hvdtrain and Horovod);",
            "# or load it here, e.g. `module load ...` or `source venv/bin/activate` (--setup).",
            *job.setup,
            "# Versions, Horovod's ops, ranks/GPUs/cores per node, a correctness check and the allreduce",
            "# bandwidth; the last line is the verdict and the exit code 0 means ready.",
            *_srun_comment(job),
            " ".join([*_srun(job), *map(_shell_word, job.trainer_args)]),
        ]) + "\n"
    lines += [
        "# `scancel --full -s USR1` also signals this shell, whose default would be to die: the ranks act on it.",
        "trap 'echo \"batch shell: USR1 left to the ranks\"' USR1",
        "# Checkpoints and the result file. The job id survives a requeue, so a requeued job finds its",
        "# checkpoint here and resumes; set HVDTRAIN_RUN_DIR to continue another job's run.",
        'RUN_DIR="${HVDTRAIN_RUN_DIR:-$SLURM_SUBMIT_DIR/runs/$SLURM_JOB_NAME-$SLURM_JOB_ID}"',
        'mkdir -p "$RUN_DIR"',
        'echo "job $SLURM_JOB_ID (restart ${SLURM_RESTART_COUNT:-0}) on $SLURM_JOB_NODELIST; run dir $RUN_DIR"',
    ]
    lines.append("# The job inherits the environment sbatch was run from (python with hvdtrain and Horovod);")
    lines.append("# or load it here, e.g. `module load ...` or `source venv/bin/activate` (--setup).")
    lines += job.setup
    trainer = [_shell_word(a) for a in job.trainer_args]
    if job.script:
        lines.append('export HVDTRAIN_RUN_DIR="$RUN_DIR"   # your script\'s checkpoints (Lightning: default_root_dir)')
    else:
        if not _has_option(job.trainer_args, "--checkpoint-dir"):
            trainer.append('--checkpoint-dir "$RUN_DIR/checkpoints"')
        if not _has_option(job.trainer_args, "--result-json"):
            trainer.append('--result-json "$RUN_DIR/result.json"')
    lines += _srun_comment(job)
    lines.append(" ".join(_srun(job)) + " \\")
    lines += _wrap(trainer, "    ")
    return "\n".join(lines) + "\n"


def _srun(job: Job) -> list[str]:
    return ["srun", "--kill-on-bad-exit=1", f"--wait={job.srun_wait}", *map(shlex.quote, job.srun_options),
            "python", *job.program]


def _srun_comment(job: Job) -> list[str]:
    together = ("the ranks leave training together (a barrier after the result file and the last checkpoint)"
                if not job.doctor else "the ranks end together, after the verdict")
    text = ("--kill-on-bad-exit=1: a rank that fails ends the step, instead of leaving the others waiting in a "
            f"collective until the time limit. --wait={job.srun_wait}: once the first rank has exited, Slurm ends "
            f"the others {job.srun_wait} s later, so a rank frozen after the others ended (a stuck driver, a "
            "stalled file system) does not hold the nodes until the time limit. A healthy rank needs seconds "
            f"then: {together}, and only their shut-down is left.")
    return ["# " + line for line in textwrap.wrap(text, 94)]


def _wrap(words: list[str], indent: str, width: int = 96) -> list[str]:
    """Trainer arguments a few per line, each option with its value."""
    groups, cur = [], []
    for w in words:
        if w.startswith("-") and cur:
            groups.append(" ".join(cur))
            cur = []
        cur.append(w)
    if cur:
        groups.append(" ".join(cur))
    lines, line = [], ""
    for g in groups:
        if line and len(indent + line + " " + g) > width:
            lines.append(line)
            line = g
        else:
            line = f"{line} {g}".strip()
    lines.append(line)
    return [indent + ln + (" \\" if i < len(lines) - 1 else "") for i, ln in enumerate(lines)]


# ---------------------------------------------------------------------------------- entry points
def split_argv(argv: list[str]) -> tuple[list[str], list[str]]:
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1:]
    return argv, []


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
HINTS = ("compute_bound", "memory_bound", "multithread", "nomultithread")  # sbatch --hint's values
_SBATCH_OPTION = re.compile(r"^--[A-Za-z][A-Za-z0-9-]*(=[^\s'\"`$\\;|&<>()#]+)?$")


def check_values(argv: list[str]) -> None:
    """Every value goes into a script that a shell runs: a newline in one would end its comment
    or its line there, and what follows would run as a command of its own."""
    for arg in argv:
        bad = _CONTROL.search(arg)
        if bad:
            raise UsageError(f"argument {arg!r} holds a control character ({bad.group(0)!r}); a job script "
                             "cannot carry it safely")


def generate(argv: list[str]) -> tuple[str, str | None]:
    """(script, output path or None) for the generator's command line `argv`."""
    check_values(argv)
    ours, trainer_args = split_argv(argv)
    args = build_arg_parser().parse_args(ours)
    job = check_options(args, trainer_args)
    return render(job, _credit_command(argv)), args.output


def _credit_command(argv: list[str]) -> str:
    """argv without -o/--output: the header names how to write the script, not where it went."""
    ours, trainer_args = split_argv(argv)
    kept, skip = [], False
    for a in ours:
        if skip:
            skip = False
        elif a in ("-o", "--output"):
            skip = True
        elif a.startswith("--output=") or (a.startswith("-o") and not a.startswith("--")):
            continue                      # --output=FILE, -oFILE
        else:
            kept.append(a)
    return shlex.join(kept + (["--", *trainer_args] if "--" in argv else []))


def credited_argv(script: str) -> list[str]:
    """The generator options recorded in a script's header (to regenerate or compare it)."""
    for line in script.splitlines()[:3]:
        if line.startswith(CREDIT):
            return shlex.split(line[len(CREDIT):])
    raise UsageError(f"no '{CREDIT.strip()}' line in the script's header")


def regenerate(path: str) -> str:
    """The script that the command in `path`'s header writes now."""
    with open(path) as f:
        return generate(credited_argv(f.read()))[0]


def main(argv: list[str] | None = None) -> None:
    """`python -m hvdtrain.slurm [options] [-- trainer options]`, or
    `python -m hvdtrain.slurm regenerate slurm/*.sbatch` to rewrite scripts from their headers."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        if argv[:1] == ["regenerate"]:
            for path in argv[1:]:
                script = regenerate(path)
                with open(path, "w") as f:
                    f.write(script)
            return
        script, output = generate(argv)
    except (UsageError, OSError) as err:
        print(f"{PROG}: error: {err}", file=sys.stderr)
        sys.exit(2)
    if output:
        with open(output, "w") as f:
            f.write(script)
    else:
        sys.stdout.write(script)


if __name__ == "__main__":
    main()
