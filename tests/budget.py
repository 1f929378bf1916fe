"""The suite's time budget, kept visible: `tests/durations.json` records what each test
file took in the last full run measured on the reference machine (2 cores, a fresh clone, warm),
test_budget.py (fast) fails when a test file is missing from it, when the recorded total is over
the budget, or when a file whose tests are all in the fast tier took long; and every run prints,
at its end, the files that took much longer than recorded (conftest.py).

    bash scripts/test.sh --junitxml=/tmp/suite.xml     # a full run
    python tests/budget.py /tmp/suite.xml              # tests/durations.json from it

The measured run's wall time (set-up included) is given with --wall MINUTES.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import xml.etree.ElementTree as ET

HERE = os.path.dirname(os.path.abspath(__file__))
RECORD = os.path.join(HERE, "durations.json")
GOAL_MINUTES = 25.0      # `.ci/run` in a fresh clone on a warm 2-core machine, set-up included
# The ratchet: the recorded suite may not grow past this. Lowered as the suite gets cheaper, never
# raised: a new test is paid for by making old ones cheaper (DEVELOPERS.md), until GOAL_MINUTES.
CEILING_MINUTES = 25.0  # at the goal since 2026-11-26; 2026-11-27: 24.2 min (618 tests; 23.5 the run before)
SETUP_WARM_MINUTES = 0.5  # set-up's share of a warm run (every step cached): 23 s measured
FAST_FILE_SECONDS = 20.0    # a file with no distributed test (no `slow` mark) takes at most this
OVER_FACTOR, OVER_SLACK = 1.5, 15.0  # said at a run's end: over 1.5 x its record + 15 s


def per_file(junit_xml: str) -> dict[str, float]:
    """Seconds per test file of a pytest --junitxml report."""
    seconds: dict[str, float] = collections.defaultdict(float)
    for case in ET.parse(junit_xml).getroot().iter("testcase"):
        # classname: tests.test_x, or tests.test_x.TestClass
        module = next(part for part in case.get("classname", "").split(".") if part.startswith("test_"))
        seconds[f"tests/{module}.py"] += float(case.get("time", 0))
    return dict(seconds)


def load() -> dict:
    with open(RECORD) as f:
        return json.load(f)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("junit_xml")
    p.add_argument("--wall", type=float, default=None, help="the run's wall time in minutes, set-up included")
    p.add_argument("--tests", type=int, default=None, help="how many tests passed")
    p.add_argument("--note", default="", help="what was measured where")
    args = p.parse_args()
    files = per_file(args.junit_xml)
    record = {"note": args.note, "wall_minutes": args.wall, "tests": args.tests,
              "files": {k: round(v, 1) for k, v in sorted(files.items(), key=lambda kv: -kv[1])}}
    with open(RECORD, "w") as f:
        json.dump(record, f, indent=1)
        f.write("\n")
    print(f"{RECORD}: {len(files)} files, {sum(files.values()) / 60:.1f} minutes of tests")


if __name__ == "__main__":
    main()
