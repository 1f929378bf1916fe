"""`python -m hvdtrain.slurm` and the templates it wrote (fast tier: no cluster): inconsistent
options refused with one line, time limits, trainer arguments kept, every template in slurm/ is
the generator's output for its header and valid bash."""
import os

import pytest

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
