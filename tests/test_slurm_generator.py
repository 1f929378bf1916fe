"""`python -m hvdtrain.slurm` and the templates it wrote (fast tier: no cluster): inconsistent
options refused with one line, time limits, trainer arguments kept, every template in slurm/ is
the generator's output for its header and valid bash, and one job-script convention everywhere
(templates, the sbatch scripts and generator commands of README.md and docs/)."""
import glob
import os
import re
import shlex

import pytest

from conftest import REPO
from hvdtrain import slurm as gen
from hvdtrain.errors import UsageError
from slurm_helpers import TEMPLATES, generator, run


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
    (["--cpu-only", "--cpus-per-task", "1", "--srun-wait", "0"], "--srun-wait must be 1..65535 seconds"),
    (["--cpu-only", "--cpus-per-task", "1", "--srun-option=--wait=30"], "use --srun-wait"),
    (["--cpu-only", "--cpus-per-task", "1", "--setup", "module purge",
      "--setup", "source $WORK/hvdtrain/.venv/bin/activate"], "comes after 'module purge' with no 'module load' between"),
    (["--cpu-only", "--cpus-per-task", "1", "--setup", "module load a", "--setup", "module purge"],
     "'module purge' is not followed by a 'module load'"),
    (["--preset", "jean-zay", "--script", "no_such_train.py"], "--script no_such_train.py: no such Python file"),
    (["--preset", "jean-zay", "--doctor", "--script", "torch_examples/lightning_imagenet.py"],
     "--script and --doctor: a job runs one of them"),
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


def test_a_script_of_yours_runs_instead_of_the_trainer():
    """--script: srun runs the user's file with the options after `--` as given (not the trainer's,
    so not checked against them), and the script learns the run directory, where Lightning's
    default_root_dir must be for its resume after a requeue."""
    script, _ = gen.generate(["--preset", "jean-zay", "--script", "torch_examples/lightning_imagenet.py", "--",
                              "--data-dir", "$SCRATCH/shards", "--epochs", "3"])
    srun = next(line for line in script.splitlines() if line.startswith("srun "))
    assert srun.endswith("python torch_examples/lightning_imagenet.py \\"), srun
    assert '--data-dir "$SCRATCH/shards" --epochs 3' in script and "--checkpoint-dir" not in script
    assert 0 < script.find('export HVDTRAIN_RUN_DIR="$RUN_DIR"') < script.index("\nsrun ")
    assert "#SBATCH --job-name=hvdtrain-lightning_imagenet" in script and "#SBATCH --requeue" in script


def test_generator_writes_file_and_keeps_trainer_arguments(tmp_path):
    out = tmp_path / "job.sbatch"
    done = generator("--preset", "juwels-booster", "--nodes", "3", "--account", "proj1", "-o", str(out), "--",
                     "--model", "resnet18", "--data-dir", "$SCRATCH/my data", "--dataset", "imagefolder",
                     "--checkpoint-dir", "/ckpt/here")
    assert done.returncode == 0, done.stderr
    script = out.read_text()
    for line in ("#SBATCH --nodes=3", "#SBATCH --ntasks-per-node=4", "#SBATCH --gres=gpu:4",
                 "#SBATCH --cpus-per-task=24", "#SBATCH --partition=booster", "#SBATCH --account=proj1",
                 "#SBATCH --signal=USR1@600", "#SBATCH --requeue",
                 "#SBATCH --open-mode=append", "srun --kill-on-bad-exit=1 --wait=120 python -m hvdtrain.torch"):
        assert line in script
    assert "B:USR1" not in script            # B: would signal the batch shell only, not the ranks
    assert '--data-dir "$SCRATCH/my data"' in script      # $ expanded by the job's shell, space kept
    assert "--checkpoint-dir /ckpt/here" in script and "$RUN_DIR/checkpoints" not in script
    assert "-o" not in gen.credited_argv(script)             # the header says how, not where
    assert gen.generate(gen.credited_argv(script))[0] == script


@pytest.mark.parametrize("argv, says", [
    (["--", "--model", "mnist_cnn", "--data-dir", "/x\ntouch injected #"], "holds a control character ('\\n')"),
    (["--job-name", "a\rb", "--"], "holds a control character ('\\r')"),
    (["--setup", "module load x\nrm -rf ~", "--"], "holds a control character"),
    (["--hint", "nomultithread\necho", "--"], "holds a control character"),
    (["--hint", "nomultithread; rm -rf ~", "--"], "--hint 'nomultithread; rm -rf ~' is not one of sbatch's"),
    (["--sbatch-option=--constraint=v100 --wrap=id", "--"], "is not one sbatch option"),
    (["--sbatch-option=--comment=$(id)", "--"], "is not one sbatch option"),
])
def test_generator_refuses_values_a_shell_would_run(argv, says):
    done = generator("--cpu-only", "--cpus-per-task", "1", "--time", "30", *argv)
    assert done.returncode == 2 and done.stdout == "", done
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and says in lines[0], done.stderr


def test_only_variables_expand_in_the_job_shell(tmp_path):
    """`$NAME`/`${NAME}` expand on the node; `$(...)`, backquotes, quotes and a lone `$` stay
    literal: bash itself, given the script's trainer line, must pass these exact arguments."""
    tricky = ["$(touch pwned)", "`touch pwned`", "${HOME}/a b", 'say "hi" $', "cost$5", "$HOME$(id)", "it's"]
    argv = ["--cpu-only", "--cpus-per-task", "1", "--time", "30", "--hint", "nomultithread",
            "--sbatch-option=--constraint=v100-32g", "--", "--model", "mnist_cnn", "--data-dir", tricky[0]]
    script, _ = gen.generate(argv)
    assert "--data-dir '$(touch pwned)'" in script
    assert "#SBATCH --constraint=v100-32g" in script and "#SBATCH --hint=nomultithread" in script
    words = [gen._shell_word(v) for v in tricky]
    echo = run(["bash", "-c", "printf '%s\\n' " + " ".join(words)], env={"HOME": "/home/u", "PATH": os.environ["PATH"]},
               cwd=str(tmp_path))
    assert echo.stdout.splitlines() == ["$(touch pwned)", "`touch pwned`", "/home/u/a b", 'say "hi" $', "cost$5",
                                        "/home/u$(id)", "it's"]
    assert not (tmp_path / "pwned").exists()


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


def test_generator_output_reads_back():
    """credited_argv() gives back what was asked, so `regenerate` is a fixed point."""
    script, _ = gen.generate(["--cpu-only", "--cpus-per-task", "2", "--", "--model", "mnist_cnn"])
    assert gen.credited_argv(script) == ["--cpu-only", "--cpus-per-task", "2", "--", "--model", "mnist_cnn"]
    with pytest.raises(UsageError):
        gen.credited_argv("#!/bin/bash\necho hi\n")


# ------------------------------------------------------------------------------ one convention everywhere
DOCS = [os.path.join(REPO, "README.md"), *sorted(glob.glob(os.path.join(REPO, "docs", "*.md")))]
# The venv set-up makes in the clone (.venv), the clone where the README's cluster set-up puts it.
VENVS = {"$WORK/hvdtrain/.venv": "cd $WORK/hvdtrain ",                             # Jean Zay
         "$PROJECT/$USER/hvdtrain/.venv": "cd $PROJECT/$USER/hvdtrain"}          # JUWELS


def code_blocks(path: str) -> list[tuple[str, str]]:
    """(where, text) of each ``` block and each indented block of a markdown file."""
    lines, blocks, i = open(path).read().splitlines(), [], 0
    name = os.path.relpath(path, REPO)
    while i < len(lines):
        if lines[i].startswith("```"):
            j = next(k for k in range(i + 1, len(lines)) if lines[k].startswith("```"))
            blocks.append((f"{name}:{i + 2}", "\n".join(lines[i + 1:j])))
            i = j + 1
        elif lines[i].startswith("    ") and (i == 0 or not lines[i - 1].strip()):
            j = i
            while j < len(lines) and (lines[j].startswith("    ") or not lines[j].strip()):
                j += 1
            blocks.append((f"{name}:{i + 1}", "\n".join(ln[4:] for ln in lines[i:j])))
            i = j
        else:
            i += 1
    return blocks


def sbatch_blocks() -> list[tuple[str, str]]:
    """The sbatch scripts in README.md and docs/*.md: blocks with #SBATCH lines."""
    return [(where, text) for path in DOCS for where, text in code_blocks(path)
            if re.search(r"^#SBATCH ", text, re.M)]


def generator_commands() -> list[tuple[str, list[str]]]:
    """(where, generator argv) of each `python -m hvdtrain.slurm ...` and of each scaling study's
    `python -m hvdtrain.compare ... -- <generator options>` in README.md, slurm/README.md, docs/."""
    found = []
    for path in [*DOCS, os.path.join(REPO, "slurm", "README.md")]:
        for where, text in code_blocks(path):
            for command in text.replace("\\\n", " ").splitlines():
                if not command.startswith(("python -m hvdtrain.slurm ", "python -m hvdtrain.compare ")):
                    continue
                words = shlex.split(command, comments=True)
                if words[:3] == ["python", "-m", "hvdtrain.slurm"] and words[3:4] not in (["--help"], ["regenerate"]):
                    argv = words[3:words.index(">")] if ">" in words else words[3:]
                    found.append((where, argv))
                elif words[:3] == ["python", "-m", "hvdtrain.compare"] and "--" in words:
                    found.append((where, [*words[words.index("--") + 1:], "--"]))
    return found


def convention_problems(script: str) -> list[str]:
    """What a job script does against the convention: the venv set-up made, modules loaded again
    after `module purge`, SIGUSR1 gen.SIGNAL_LEAD s before the limit with --requeue and
    --open-mode=append (training), srun --kill-on-bad-exit=1 --wait=N."""
    problems = []
    directives = [ln.split(" #")[0].split()[1] for ln in script.splitlines() if ln.startswith("#SBATCH ")]
    body = [ln.split(" #")[0].strip() for ln in script.replace("\\\n", " ").splitlines()
            if ln.strip() and not ln.lstrip().startswith("#")]
    for line in body:
        m = re.search(r"(?:source|\.) +(\S+)/bin/activate", line)
        if m and m.group(1) not in VENVS:
            problems.append(f"activates {m.group(1)}, not the venv set-up made ({' or '.join(VENVS)})")
    try:
        gen._check_setup([ln for ln in body if not ln.startswith("srun ")])
    except UsageError as err:
        problems.append(str(err))
    sruns = [ln for ln in body if ln.startswith("srun ")]
    if not sruns:
        problems.append("no srun line")
    for line in sruns:
        words = line.split()
        if "--kill-on-bad-exit=1" not in words or not any(re.fullmatch(r"--wait=[1-9]\d*", w) for w in words):
            problems.append(f"srun without --kill-on-bad-exit=1 --wait=N: {line[:80]}")
    if any(re.search(r"-m hvdtrain\.(torch|tf)\b", ln) for ln in sruns):   # training: a time limit to survive
        for wanted in (f"--signal=USR1@{gen.SIGNAL_LEAD}", "--requeue", "--open-mode=append"):
            if wanted not in directives:
                problems.append(f"no #SBATCH {wanted}")
    return problems


def test_the_conventions_venvs_are_where_the_readmes_set_up_makes_them():
    readme = open(os.path.join(REPO, "README.md")).read()
    for venv, set_up in VENVS.items():
        assert set_up in readme, f"{venv}: the README's set-up no longer says '{set_up}'"


def test_the_convention_check_has_teeth():
    """The README's sbatch script as it was before the convention: every rule is broken once."""
    old = ("#!/bin/bash\n#SBATCH --time=20:00:00\n#SBATCH --signal=USR1@120\n#SBATCH --requeue\n"
           "module purge\nsource $WORK/venvs/hvdtrain/bin/activate\n"
           "srun --kill-on-bad-exit=1 python -m hvdtrain.torch --model resnet50\n")
    said = "\n".join(convention_problems(old))
    for problem in ("activates $WORK/venvs/hvdtrain", "no 'module load' between", "without --kill-on-bad-exit=1 --wait",
                    "no #SBATCH --signal=USR1@600", "no #SBATCH --open-mode=append"):
        assert problem in said, said


def test_there_are_sbatch_scripts_in_the_docs():
    assert any(where.startswith("docs/trainer.md:") for where, _ in sbatch_blocks())  # the README's, moved
    assert len(generator_commands()) >= 6


@pytest.mark.parametrize("where, script", sbatch_blocks(), ids=[w for w, _ in sbatch_blocks()])
def test_docs_sbatch_script_is_the_generators_output_or_follows_the_convention(where, script):
    """Each sbatch script of README.md and docs/*.md: the generator's output for its header
    (then it follows the convention by construction), or a hand-written script that follows it
    (and passes sbatch --test-only: tests/test_slurm_sites.py)."""
    if gen.CREDIT.strip() in script:
        assert script + "\n" == gen.generate(gen.credited_argv(script))[0], f"{where}: regenerate it"
    assert convention_problems(script) == [], where


@pytest.mark.parametrize("path", TEMPLATES, ids=os.path.basename)
def test_template_follows_the_convention(path):
    assert convention_problems(open(path).read()) == [], path


@pytest.mark.parametrize("where, argv", generator_commands(), ids=[w for w, _ in generator_commands()])
def test_docs_generator_command_writes_a_script_that_follows_the_convention(where, argv):
    """The generator commands of the docs (and a scaling study's generator options) write a
    script with the docs' venv and modules; their signal lead may differ (a short test job)."""
    script, _ = gen.generate([a for a in argv if a not in ("-o", "my.sbatch")])
    problems = convention_problems(script)
    assert [p for p in problems if not p.startswith("no #SBATCH --signal=")] == [], (where, problems)
