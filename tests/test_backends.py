"""The backend table (hvdtrain/backends.py): CLI choices, compare's list, option refusals, and one
module per backend with no import between backends (fast tier: nothing here imports torch, TF or
Horovod)."""
import ast
import importlib.util
import os
import subprocess
import sys

import pytest

from hvdtrain import backends
from hvdtrain.compare import cli as compare, report as compare_report
from hvdtrain.config import TrainConfig, build_parser
from hvdtrain.errors import UsageError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def module_source(module: str) -> ast.Module:
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin, f"{module} not found"
    with open(spec.origin) as f:
        return ast.parse(f.read())


@pytest.mark.parametrize("framework", ["torch", "tf"])
def test_cli_choices_come_from_the_table(framework):
    parser = build_parser(framework, ["m"], "prog")
    action = next(a for a in parser._actions if a.dest == "backend")
    assert list(action.choices) == backends.names(framework)
    assert backends.names(framework)[0] == "horovod"  # the product is the default and listed first
    with pytest.raises(SystemExit):
        parser.parse_args(["--backend", "nccl"])


@pytest.mark.parametrize("backend", backends.BACKENDS, ids=lambda b: b.label)
def test_each_backend_has_its_own_module_importing_no_other_backend(backend):
    tree = module_source(backend.module)
    assert backend.cls in {n.name for n in tree.body if isinstance(n, ast.ClassDef)}
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    others = {b.module for b in backends.BACKENDS} - {backend.module}
    assert not imported & others, f"{backend.module} imports {imported & others}"


def test_compare_runs_every_backend_and_pairs_each_with_its_reference():
    assert set(compare.BACKENDS) == {"horovod-torch", "ddp", "accelerate", "lightning", "horovod-tf", "tf-mwms"}
    assert set(compare_report.PARITY_PAIRS) == {("horovod-torch", "ddp"), ("ddp", "accelerate"), ("ddp", "lightning"),
                                         ("horovod-tf", "tf-mwms")}
    assert compare.TORCHRUN_BACKENDS == ("ddp", "accelerate", "lightning")
    assert compare.BACKENDS["tf-mwms"].trainer_args() == ["-m", "hvdtrain.tf", "--backend", "mwms", "--loop", "custom"]


@pytest.mark.parametrize("options, message", [
    (dict(framework="torch", backend="ddp", use_adasum=True), "--use-adasum is a Horovod option"),
    (dict(framework="torch", backend="ddp", cycle_time_ms=5.0), "--cycle-time-ms is a Horovod option"),
    (dict(framework="tf", backend="mwms", fp16_allreduce=True), "--fp16-allreduce is a Horovod option"),
    (dict(framework="tf", backend="mwms", use_adasum=True), "--use-adasum is a Horovod option"),
    (dict(framework="tf", backend="mwms", loop="fit"), "use --loop custom"),
    (dict(framework="tf", backend="horovod", batches_per_allreduce=2), "--batches-per-allreduce > 1"),
    (dict(framework="tf", backend="mwms", batches_per_allreduce=2), "--batches-per-allreduce > 1"),
    (dict(framework="tf", backend="horovod", use_adasum=True, fp16_allreduce=True), "not supported by Horovod-TF"),
    (dict(framework="tf", backend="ddp"), "unknown backend 'ddp'; valid: horovod, mwms"),
    (dict(framework="torch", backend="accelerate", fp16_allreduce=True), "--fp16-allreduce is honoured by --backend "
                                                                         "horovod and ddp and lightning only, not by "
                                                                         "--backend accelerate"),
    (dict(framework="torch", backend="lightning", loader="dali"), "--loader is honoured by --backend horovod and ddp "
                                                                  "only, not by --backend lightning"),
    (dict(framework="torch", backend="horovod", amp="fp16", use_adasum=True), "--amp fp16 with --use-adasum"),
    (dict(framework="torch", backend="horovod", compile="regions", use_adasum=True), "--compile with --use-adasum "
                                                                                    "is not supported"),
    (dict(framework="torch", backend="horovod", compile="model", fp16_allreduce=True), "--compile with "
                                                                                      "--fp16-allreduce is not"),
    (dict(framework="torch", backend="accelerate", compile="regions"), "--compile is honoured by --backend horovod "
                                                                       "and ddp only"),
    (dict(framework="torch", backend="lightning", batches_per_allreduce=2), "--batches-per-allreduce > 1 with "
                                                                           "--backend lightning is not supported"),
    (dict(framework="torch", backend="lightning", checkpoint_dir="/tmp/c"), "--checkpoint-dir with --backend "
                                                                           "lightning"),
])
def test_options_a_backend_cannot_honour_are_refused(options, message):
    with pytest.raises(UsageError, match=message.replace("-", r"\-").replace("(", r"\(")):
        TrainConfig(**options)


@pytest.mark.parametrize("options", [
    dict(framework="torch", backend="horovod", use_adasum=True, fp16_allreduce=True, batches_per_allreduce=2),
    dict(framework="torch", backend="ddp", fp16_allreduce=True, batches_per_allreduce=2),
    dict(framework="tf", backend="horovod", use_adasum=True, loop="fit", cycle_time_ms=2.0),
    dict(framework="tf", backend="mwms", loop="custom"),
])
def test_options_a_backend_honours_are_accepted(options):
    TrainConfig(**options)


def test_refusal_reaches_the_user_as_one_line_before_tensorflow_starts():
    # Single process, no launcher: the check runs before TensorFlow is imported, so this is quick.
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    run = subprocess.run([sys.executable, "-m", "hvdtrain.tf", "--backend", "mwms", "--fp16-allreduce"],
                         capture_output=True, text=True, env=env, cwd=REPO, timeout=120)
    assert run.returncode == 2, run.stderr
    assert "hvdtrain.tf: error [rank 0/1]: --fp16-allreduce is a Horovod option, which --backend mwms does not have" \
        in run.stderr, run.stderr
    assert "Traceback" not in run.stderr
