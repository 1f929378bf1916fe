"""The step-phase arithmetic (hvdtrain/phases.py), fast tier: the per-step split, the slowest-rank
line and the test-only slow rank. Real ranks made slow on purpose: tests/test_phases_ranks.py."""
import time

import pytest

from hvdtrain.test_hooks import injected_delay
from hvdtrain.phases import (PHASES, PhaseClock, phases_enabled, phases_summary, slowest_rank_line,
                             tf_split_requested)


def ranks_with(own_compute: list[float], sync: list[float]) -> list[dict]:
    return [{"rank": r, "host": f"node{r}", "phases_ms": {"data": 1.0, "compute": c, "sync": s,
                                                            "optimizer": 2.0, "other": 0.5}}
            for r, (c, s) in enumerate(zip(own_compute, sync))]


def test_marks_split_the_time_between_them_and_add_up():
    clock = PhaseClock(enabled=True)
    clock.start()
    started = time.perf_counter()
    for phase, seconds in (("data", 0.01), ("compute", 0.03), ("sync", 0.02)):
        time.sleep(seconds)
        clock.mark(phase)
    elapsed = time.perf_counter() - started
    assert clock.seconds["compute"] > clock.seconds["sync"] > clock.seconds["data"] >= 0.01
    assert sum(clock.seconds.values()) == pytest.approx(elapsed, abs=2e-3)
    per_step = clock.per_step_ms(steps=2)
    assert set(per_step) == set(PHASES) and per_step["compute"] == pytest.approx(clock.seconds["compute"] * 500)


def test_a_disabled_clock_reports_nothing():
    clock = PhaseClock(enabled=False)
    clock.start()
    clock.mark("compute")
    assert not clock.running and clock.per_step_ms(10) is None
    assert PhaseClock(enabled=True).per_step_ms(0) is None


def test_slowest_rank_is_named_with_its_host_phase_and_the_others_wait():
    line = slowest_rank_line(ranks_with(own_compute=[50.0, 50.0, 80.0, 51.0], sync=[35.0, 36.0, 5.0, 34.0]))
    assert line == ("slowest rank 2 (node2): compute 80.0 ms/step, 60 % above the other ranks' median (50.0); "
                    "the other ranks wait 30.0 ms/step for it in sync")


def test_even_ranks_say_so():
    line = slowest_rank_line(ranks_with(own_compute=[50.0, 51.0], sync=[5.0, 4.0]))
    assert line.startswith("ranks even: own work (data + compute + optimizer) 53.0-54.0 ms/step"), line
    assert slowest_rank_line(ranks_with([50.0], [1.0])) == "one rank timed: nothing to compare"


def test_summary_adds_the_phases():
    assert phases_summary({"data": 1, "compute": 2, "sync": 3, "optimizer": 4, "other": 5}) == \
        "data 1.0 + compute 2.0 + sync 3.0 + optimizer 4.0 + other 5.0 = 15.0 ms/step"


def test_injected_delay_only_on_the_named_rank():
    env = {"HVDTRAIN_TEST_SLOW_RANK": "1:0.25"}
    assert injected_delay(1, env) == 0.25 and injected_delay(0, env) == 0.0 and injected_delay(1, {}) == 0.0


def test_the_tf_split_is_asked_for_and_phases_0_turns_everything_off():
    assert phases_enabled({}) and not tf_split_requested({})  # torch marks on, TF step in one function
    assert tf_split_requested({"HVDTRAIN_TF_PHASES": "1"})
    assert not tf_split_requested({"HVDTRAIN_TF_PHASES": "1", "HVDTRAIN_PHASES": "0"})
    assert not phases_enabled({"HVDTRAIN_PHASES": "0"})
