"""The per-rank step breakdown on 2 real ranks (hvdtrain/phases.py): the phases add up to the
step time on every rank, and a rank made slow on purpose (HVDTRAIN_TEST_SLOW_RANK: 40 ms more
compute per step on rank 1) is named by rank 0, with the other rank's wait in sync: torch
(Horovod, DDP) and the TF custom loop (Horovod, MWMS), whose step is split into compute, sync and
optimizer functions on a CPU when HVDTRAIN_TF_PHASES=1 asks for it. Without it, and under Keras
fit (which runs the step itself), a TF result has no phases.

    python -m pytest -q tests/test_phases_ranks.py
"""
from __future__ import annotations

import json
import re

import pytest

from conftest import PYTHON, base_env, launch

pytestmark = pytest.mark.slow  # real ranks: the distributed tier

SLOW_MS = 40.0
CASES = {
    "torch-horovod": ["hvdtrain.torch", "--backend", "horovod"],
    "torch-ddp": ["hvdtrain.torch", "--backend", "ddp"],
    "tf-horovod": ["hvdtrain.tf", "--backend", "horovod"],
    "tf-mwms": ["hvdtrain.tf", "--backend", "mwms"],
}


@pytest.mark.parametrize("case", CASES)
def test_breakdown_adds_up_and_names_the_slowed_rank(tmp_path, case):
    module, *backend = CASES[case]
    out = tmp_path / "result.json"
    env = {**base_env(), "HVDTRAIN_TEST_SLOW_RANK": f"1:{SLOW_MS / 1000}", "HVDTRAIN_TF_PHASES": "1"}
    run = launch("mpirun", 2, [PYTHON, "-m", module, *backend, "--model", "mnist_cnn", "--dataset", "digits",
                               "--epochs", "1", "--threads-per-rank", "1", "--result-json", str(out)],
                 timeout=240, env=env)
    ranks = {r["rank"]: r for r in json.load(open(out))["ranks"]}
    for r in ranks.values():
        step_ms = 1000 * r["timed_seconds"] / r["timed_steps"]
        assert sum(r["phases_ms"].values()) == pytest.approx(step_ms, rel=0.02), (r["rank"], r["phases_ms"], step_ms)
    fast, slow = ranks[0]["phases_ms"], ranks[1]["phases_ms"]
    assert slow["compute"] - fast["compute"] > 0.75 * SLOW_MS, (fast, slow)
    # Synchronous training: the fast rank spends the slow rank's extra time waiting.
    assert fast["sync"] - slow["sync"] > 0.6 * SLOW_MS, (fast, slow)
    lines = re.findall(r"step time: (.*) on rank 0; (.*)", run.output)
    assert len(lines) == 1, run.output[-3000:]
    breakdown, verdict = lines[0]
    assert re.fullmatch(r"data [0-9.]+ \+ compute [0-9.]+ \+ sync [0-9.]+ \+ optimizer [0-9.]+ \+ other [0-9.]+ "
                        r"= [0-9.]+ ms/step", breakdown), breakdown
    found = re.fullmatch(r"slowest rank 1 \(\S+\): compute ([0-9.]+) ms/step, \d+ % above the other ranks' median "
                         r"\(([0-9.]+)\); the other ranks wait ([0-9.]+) ms/step for it in sync", verdict)
    assert found, verdict
    assert float(found.group(3)) > 0.6 * SLOW_MS, verdict


@pytest.mark.parametrize("loop, split", [("custom", "0"), ("fit", "1")])
@pytest.mark.side_lane  # one rank, or mostly waiting: beside the others (tests/side_lane.py)
def test_tf_without_the_split_says_it_has_no_breakdown(tmp_path, loop, split):
    """The custom loop's step stays in one function unless HVDTRAIN_TF_PHASES=1; fit's always."""
    out = tmp_path / "tf.json"
    run = launch("mpirun", 1, [PYTHON, "-m", "hvdtrain.tf", "--loop", loop, "--model", "mnist_cnn", "--dataset",
                               "digits", "--steps", "4", "--threads-per-rank", "1", "--result-json", str(out)],
                 timeout=240, env={**base_env(), "HVDTRAIN_TF_PHASES": split})
    assert [r["phases_ms"] for r in json.load(open(out))["ranks"]] == [None]
    assert "step time:" not in run.output
