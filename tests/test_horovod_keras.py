"""Users' own Horovod TF code (not hvdtrain's trainer) on the Horovod set-up builds, under
TensorFlow 2.21's Keras 3 and under Keras 2 (TF_USE_LEGACY_KERAS=1): the changes of
scripts/horovod-keras3.patch, each shown by what a user's script gets on 2 real ranks.

    python -m pytest -q tests/test_horovod_keras.py
"""
from __future__ import annotations

import os
import re

import pytest

from conftest import PYTHON, REPO, base_env, launch

pytestmark = pytest.mark.slow  # real ranks: the distributed tier

SCRIPT = os.path.join(REPO, "tests", "scripts", "horovod_keras_user.py")


def user_script(legacy: bool) -> dict[str, list[str]]:
    """Every case's line from both ranks: {case: [rank 0's result, rank 1's result]}."""
    env = {**base_env(), "TF_USE_LEGACY_KERAS": "1" if legacy else "0"}
    run = launch("mpirun", 2, [PYTHON, SCRIPT], timeout=300, env=env)
    assert run.returncode == 0, run.output[-4000:]
    results: dict[str, list[str]] = {}
    for case, rank, result in re.findall(r"CASE (\w+) rank (\d): (.*?)(?=\[\d+,\d+\]<std|$)", run.output, re.M):
        results.setdefault(case, [None, None])[int(rank)] = result.strip()
    assert len(re.findall(r"DONE rank \d keras " + ("2" if legacy else "3"), run.output)) == 2, run.output[-4000:]
    return results


def figure(result: str, name: str) -> float:
    found = re.search(rf"\b{name} ([-0-9.e+]+)", result)
    assert found, f"no {name} in {result!r}"
    return float(found.group(1))


@pytest.fixture(scope="module", params=[False, True], ids=["keras3", "tf_keras"])
def cases(request):
    return request.param, user_script(legacy=request.param)


def test_distributed_gradient_tape_trains_keras_variables(cases):
    """hvd.DistributedGradientTape given model.trainable_variables (Keras 3 variables, which have
    no ref(): AttributeError before the patch), and broadcast_variables given model.variables."""
    _, results = cases
    for result in results["tape"]:
        assert figure(result, "accuracy") >= 0.93, result
        assert figure(result, "shared_spread") == 0.0, f"ranks' weights differ: {result}"


def test_partial_tape_keeps_the_local_layer_per_rank(cases):
    _, results = cases
    for result in results["partial"]:
        assert figure(result, "accuracy") >= 0.9, result
        assert figure(result, "shared_spread") == 0.0, f"shared layers differ between ranks: {result}"
        assert figure(result, "local_spread") > 0.01, f"the local layer was averaged: {result}"


def test_keras_fit_with_horovod_keras(cases):
    """horovod.tensorflow.keras: DistributedOptimizer, BroadcastGlobalVariablesCallback,
    MetricAverageCallback and LearningRateWarmupCallback (to 0.05 x 2 ranks) in model.fit."""
    _, results = cases
    for result in results["fit"]:
        assert figure(result, "accuracy") >= 0.9, result
        assert figure(result, "shared_spread") == 0.0, f"ranks' weights differ: {result}"
        assert figure(result, "lr") == pytest.approx(0.1), result
        assert figure(result, "loss_spread") == 0.0, f"logged loss not averaged over ranks: {result}"


def test_what_keras_cannot_do_is_refused_in_one_line(cases):
    legacy, results = cases
    for result in results["fit_momentum_correction"]:
        # A non-legacy optimizer's momentum is a constant of its compiled step: correcting it would
        # be silently ignored (Keras 3), or fail inside Keras 2's set_value.
        assert result.startswith("error ValueError: horovod.tensorflow.keras: momentum_correction cannot"), result
        assert "momentum_correction=False" in result
        assert ("TF_USE_LEGACY_KERAS=1" in result) == (not legacy), result
    for result in results["fit_xla"]:
        if legacy:  # tf_keras compiles with XLA only when asked; its error is XLA's own
            assert result.startswith("error InvalidArgumentError"), result
            continue
        assert result == ("error ValueError: horovod.tensorflow.keras: Horovod's allreduce cannot run in "
                          "an XLA-compiled step (Keras 3 compiles model.fit's step with XLA on GPUs by "
                          "default): pass jit_compile=False to model.compile"), result


def test_sync_batch_norm_uses_every_rank_s_batch(cases):
    """The moving statistics equal those of both ranks' batches together (ranks' data differ)."""
    _, results = cases
    rank_means = [figure(result, "rank_mean") for result in results["sync_batch_norm"]]
    assert abs(rank_means[0] - rank_means[1]) > 1, "the ranks' data must differ for this to test anything"
    for result in results["sync_batch_norm"]:
        assert figure(result, "stats_error") < 1e-4, result
