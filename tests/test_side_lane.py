"""tests/side_lane.py (fast tier): a selection holding distributed tests of its side files and others
runs the former in a second pytest beside the first, whose failure fails the run and whose test
cases land in the run's JUnit report; HVDTRAIN_SIDE_LANE=0 keeps one session. Run on a small
project of its own (two test files, one of them named as a side file)."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET

from conftest import REPO

CONFTEST = f"""
import sys
sys.path.insert(0, {os.path.join(REPO, "tests")!r})
from side_lane import SideLane


def pytest_configure(config):
    config.pluginmanager.register(SideLane(config), "side-lane")
"""

TEST = """
import os
import pytest


@pytest.mark.slow
def test_{name}():
    with open(os.path.join(os.environ["OUT"], "{name}"), "w") as f:
        f.write(f"{{os.getpid()}} {{os.environ.get('HVDTRAIN_SIDE_LANE')}}")
    assert {ok}


def test_{name}_fast():
    with open(os.path.join(os.environ["OUT"], "{name}_fast"), "w") as f:
        f.write(str(os.getpid()))
"""


BUILDS_KEPT = """

def builds_kept():
    return os.environ["KEPT"] == "1"
"""


def run_project(tmp_path, lane: str | None, side_ok: bool = True, kept: bool = True):
    project, out = tmp_path / "project", tmp_path / "out"
    (project / "tests").mkdir(parents=True, exist_ok=True)
    out.mkdir(exist_ok=True)
    (project / "pytest.ini").write_text("[pytest]\nmarkers = slow: slow\n")
    (project / "tests" / "conftest.py").write_text(CONFTEST)
    # test_setup.py is one of SIDE_FILES; test_main.py is not.
    (project / "tests" / "test_setup.py").write_text(TEST.format(name="side", ok=side_ok) + BUILDS_KEPT)
    (project / "tests" / "test_main.py").write_text(TEST.format(name="main", ok=True))
    # test_own_loop.py is one of WARM_SIDE_FILES: beside the rest only when set-up builds nothing.
    (project / "tests" / "test_own_loop.py").write_text(TEST.format(name="warm", ok=True))
    env = {k: v for k, v in os.environ.items() if k != "HVDTRAIN_SIDE_LANE"}
    env.update(OUT=str(out), KEPT="1" if kept else "0", **({"HVDTRAIN_SIDE_LANE": lane} if lane is not None else {}))
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--junitxml",
                           str(tmp_path / "report.xml"), "tests"], cwd=project, env=env, capture_output=True,
                          text=True, timeout=120)
    seen = {p.name: p.read_text().split() for p in out.iterdir()}
    cases = {c.get("name"): c for c in ET.parse(tmp_path / "report.xml").getroot().iter("testcase")}
    return done, seen, cases


def test_side_files_run_beside_the_rest_and_their_results_count(tmp_path):
    done, seen, cases = run_project(tmp_path, None)
    assert done.returncode == 0, done.stdout[-3000:]
    main_pid = seen["main"][0]
    assert seen["side"] == [seen["side"][0], "1"] and seen["side"][0] != main_pid, seen  # another pytest
    assert seen["side_fast"] == [main_pid], seen  # a fast test of a side file stays (cheaper than a start)
    assert seen["warm"] == seen["side"], seen  # set-up's tests build nothing: the warm side file joins
    assert set(cases) == {"test_main", "test_main_fast", "test_side", "test_side_fast", "test_warm",
                          "test_warm_fast"}, cases
    assert "side lane: 2 tests, exit 0" in done.stdout, done.stdout[-3000:]


def test_while_set_up_builds_the_warm_side_files_stay_in_the_main_lane(tmp_path):
    done, seen, cases = run_project(tmp_path, None, kept=False)
    assert done.returncode == 0, done.stdout[-3000:]
    assert seen["warm"] == [seen["main"][0], "None"] and seen["side"][1] == "1", seen
    assert "side lane: 1 tests, exit 0" in done.stdout, done.stdout[-3000:]


def test_a_failure_in_the_side_lane_fails_the_run(tmp_path):
    done, seen, cases = run_project(tmp_path, None, side_ok=False)
    assert done.returncode == 1, done.stdout[-3000:]
    assert cases["test_side"].find("failure") is not None, ET.tostring(cases["test_side"])
    assert "side lane: 2 tests, exit 1" in done.stdout and "FAILED tests/test_setup.py::test_side" in done.stdout
    # Its files are kept for a look (their folder named in that line); this test's are removed.
    kept = re.search(r"side lane: 2 tests, exit 1 \((\S+)/side-lane\.log\)", done.stdout).group(1)
    assert os.path.isdir(kept)
    shutil.rmtree(kept)


def test_one_session_when_asked(tmp_path):
    done, seen, _ = run_project(tmp_path, "0")
    assert done.returncode == 0 and "side lane" not in done.stdout, done.stdout[-3000:]
    assert seen["side"] == [seen["main"][0], "0"], seen
