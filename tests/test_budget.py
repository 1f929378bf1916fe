"""The suite's budget, kept by a check (tests/budget.py): every test file's time is on record from
a full run, the recorded total fits the warm budget, and a file whose tests are all in the fast
tier is fast. A new test file, or a full run that grew past the budget, fails here until the
record is measured again (`python tests/budget.py suite.xml`) and the suite made to fit."""
from __future__ import annotations

import ast
import glob
import os

import budget

TESTS = os.path.dirname(os.path.abspath(__file__))


def all_test_files() -> list[str]:
    return sorted(os.path.join("tests", os.path.basename(p)) for p in glob.glob(os.path.join(TESTS, "test_*.py")))


def has_slow_tests(path: str) -> bool:
    """Whether a test file puts any test in the distributed tier: a `slow` mark, or a fixture
    that conftest.py's SLOW_FIXTURES marks so."""
    import conftest

    with open(os.path.join(TESTS, os.path.basename(path))) as f:
        source = f.read()
    tree = ast.parse(source)
    names = {n.attr if isinstance(n, ast.Attribute) else n.id for n in ast.walk(tree)
             if isinstance(n, (ast.Attribute, ast.Name))}
    args = {a.arg for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) for a in n.args.args}
    return "slow" in names or bool(conftest.SLOW_FIXTURES & args)


def test_every_test_file_is_on_record():
    recorded = budget.load()["files"]
    missing = [f for f in all_test_files() if f not in recorded]
    assert not missing, (f"not in tests/durations.json: {missing}. Measure a full run "
                         "(bash scripts/test.sh --junitxml=/tmp/suite.xml; python tests/budget.py /tmp/suite.xml)")


def test_the_recorded_suite_stays_under_its_ceiling():
    """The ratchet: the measured suite may not grow past CEILING_MINUTES (which only goes down,
    towards GOAL_MINUTES)."""
    recorded = budget.load()
    # The run's measured wall time where recorded (the side lane's files run beside the rest, so
    # the files' seconds add up to more than the run took); their sum and set-up's share otherwise.
    minutes = recorded.get("wall_minutes") or sum(recorded["files"].values()) / 60 + budget.SETUP_WARM_MINUTES
    assert budget.CEILING_MINUTES >= budget.GOAL_MINUTES
    assert minutes <= budget.CEILING_MINUTES, (
        f"the suite takes {minutes:.1f} minutes on record, over its {budget.CEILING_MINUTES:.1f}-minute ceiling "
        f"(goal {budget.GOAL_MINUTES:.0f}): make the slowest files cheaper "
        f"({sorted(recorded['files'].items(), key=lambda kv: -kv[1])[:5]})")


def test_a_file_without_distributed_tests_is_fast():
    recorded = budget.load()["files"]
    slow_but_fast_tier = {f: s for f, s in recorded.items()
                          if os.path.exists(os.path.join(TESTS, os.path.basename(f)))
                          and s > budget.FAST_FILE_SECONDS and not has_slow_tests(f)}
    assert not slow_but_fast_tier, (f"these files run only fast-tier tests but took over {budget.FAST_FILE_SECONDS:.0f} s: "
                                    f"{slow_but_fast_tier}; mark their long tests slow, or make them fast")
