"""A second pytest beside the main one, for the distributed tests that mostly wait or use one core.

Most distributed tests keep both cores of the reference machine busy (two ranks importing torch
or TensorFlow, then training); some do not: set-up runs as another user (one process at a time,
pip, a probe; the Horovod builds when their inputs changed), the GPU check's CPU mode (one rank
at a time), Slurm jobs (waiting for slurmctld's time-limit check, a requeue's 10 s hold), the
DataLoader workers' tests (one rank), and single tests of that kind elsewhere (marked
`side_lane`). Run one after the other they left a core idle for minutes; run beside the rest they
use it. A few files of short launches join them so that the two lanes end about together, and
a few more when set-up's tests have nothing to build (WARM_SIDE_FILES).
Nothing is weakened: every test runs, in the same process layout, and the main run fails when
the side run fails.

How: after collection and `-k`/`-m` selection, when the selection holds distributed-tier tests
of SIDE_FILES (or marked `side_lane`: single tests of that kind in other files) *and* others,
the former are taken out of this session and started at once as a second pytest
(same interpreter, same rootdir, HVDTRAIN_SIDE_LANE=1 so it does not split again, its own
--basetemp), whose output goes to a log. At the end this session waits for it, prints its output,
adds its test cases to this session's --junitxml report, and fails when it failed. Each session
starts its own local Slurm cluster when its tests need one (conftest.py's slurm_cluster: free
ports, its own directory and PMIx directory), so the two never share a cluster.

HVDTRAIN_SIDE_LANE=0 runs everything in one session (as before); a selection of side files only
(`bash scripts/test.sh -k pypi_gpu -rP`) runs in this session, with its options.
"""
from __future__ import annotations

import ctypes
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

import pytest

SIDE_FILES = ("test_setup.py", "test_gpu_check.py", "test_slurm_jobs.py", "test_slurm_nodes.py", "test_slurm_sites.py",
              "test_torch_workers.py",
              # Not waiting, but short launches: they even out the two lanes (measured: the side
              # lane ended 12 minutes before the main one without them).
              "test_doctor.py", "test_torch_errors.py", "test_collectives.py", "test_horovod_keras.py", "test_tf_fit.py")
# Join the side lane when set-up's tests will build nothing (a warm machine): then the side lane
# is the shorter by about four minutes (measured: main 1,537 s, side 1,056 s), these files take
# about 220 s; test_shards_training.py (71 s) joined them when the lanes ended 128 s apart
# (2026-11-27: main 1,509 s, side 1,381 s). On a cold machine set-up's two Horovod builds fill the
# side lane and they stay.
WARM_SIDE_FILES = ("test_interval_checkpoints.py", "test_own_loop.py", "test_tf_own_fit.py", "test_tf_tape_loop.py",
                   "test_shards_training.py")
LANE_VARIABLE = "HVDTRAIN_SIDE_LANE"


def builds_due(items) -> bool:
    """Whether set-up's tests among `items` will build Horovod (test_setup.builds_kept)."""
    setup = [item for item in items if os.path.basename(str(item.fspath)) == "test_setup.py"]
    kept = getattr(setup[0].module, "builds_kept", None) if setup else None
    return kept is not None and not kept()


def _die_with_parent() -> None:
    """In the side pytest, before exec: SIGTERM when the main pytest dies (a CI runner killing it
    leaves no side run going on for minutes)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class SideLane:
    def __init__(self, config):
        self.config = config
        self.proc: subprocess.Popen | None = None
        self.count = 0
        self.returncode: int | None = None  # the side run's, once it ended

    @pytest.hookimpl(trylast=True)  # after -k/-m selection (the mark plugin's hook)
    def pytest_collection_modifyitems(self, config, items):
        if os.environ.get(LANE_VARIABLE) in ("0", "1") or config.option.collectonly:
            return
        # Only distributed-tier tests: a fast one costs less than the second pytest's start.
        files = SIDE_FILES + (() if builds_due(items) else WARM_SIDE_FILES)
        side = [item for item in items if item.get_closest_marker("slow")
                and (os.path.basename(str(item.fspath)) in files or item.get_closest_marker("side_lane"))]
        if not side or len(side) == len(items):
            return
        items[:] = [item for item in items if item not in side]
        # Set-up's tests first: where their two Horovod builds must be redone (a cold machine, a
        # changed set-up input) they are the side lane's longest part (8 minutes of both cores),
        # best spread under the main lane from its start. (Measured cold, set-up's tests last
        # among the side files: the side lane became the longer one.)
        side.sort(key=lambda item: os.path.basename(str(item.fspath)) != "test_setup.py")
        base = pathlib.Path(tempfile.mkdtemp(prefix="hvdtrain-side-lane-"))
        self.log = base / "side-lane.log"
        self.xml = base / "side-lane.xml"
        argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", f"-r{config.option.reportchars or 'fE'}",
                "--basetemp", str(base / "side"), "--junitxml", str(self.xml)]
        argv += [f"--durations={config.option.durations}"] if config.option.durations is not None else []
        argv += [f"--maxfail={config.option.maxfail}"] if config.option.maxfail else []
        argv += ["-v"] * max(0, config.option.verbose)
        argv += [item.nodeid for item in side]
        env = {**os.environ, LANE_VARIABLE: "1"}
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=str(config.rootpath),
                                         env=env, preexec_fn=_die_with_parent)
        self.count = len(side)
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        if reporter:
            reporter.write_line(f"side lane: {len(side)} tests ({', '.join(files)}, and those marked side_lane) "
                                f"run in a second pytest "
                                f"beside this one (pid {self.proc.pid}; its output at the end)")

    @pytest.hookimpl(trylast=True)  # after the junitxml plugin has written this session's report
    def pytest_sessionfinish(self, session, exitstatus):
        if self.proc is None:
            return
        if self.config.option.maxfail and session.testsfailed >= self.config.option.maxfail \
                and self.proc.poll() is None:
            self.proc.terminate()  # -x / --maxfail: this session stopped at a failure
        self.returncode = self.proc.wait()
        if self.returncode not in (0, 5):  # 5: nothing collected (cannot be: it was given node ids)
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
        xml_path = getattr(self.config.option, "xmlpath", None)
        if xml_path and os.path.exists(xml_path) and self.xml.exists():
            merge_junit(xml_path, str(self.xml))

    def pytest_terminal_summary(self, terminalreporter):
        if self.proc is None:
            return
        terminalreporter.write_sep("=", f"side lane: {self.count} tests, exit {self.returncode}"
                                        + ("" if self.returncode == 0 else f" ({self.log})"))
        with open(self.log, errors="replace") as f:
            for line in f:
                terminalreporter.write(line)

    def pytest_unconfigure(self, config):
        if self.proc is not None and self.returncode == 0:
            shutil.rmtree(self.log.parent, ignore_errors=True)  # kept when it failed: its log, its tmp files


def merge_junit(main_path: str, side_path: str) -> None:
    """The side run's test cases appended to the main report's test suite, its counts added."""
    main, side = ET.parse(main_path), ET.parse(side_path)
    suite = main.getroot().find("testsuite") if main.getroot().tag == "testsuites" else main.getroot()
    side_suite = side.getroot().find("testsuite") if side.getroot().tag == "testsuites" else side.getroot()
    for key in ("tests", "errors", "failures", "skipped"):
        suite.set(key, str(int(suite.get(key, 0)) + int(side_suite.get(key, 0))))
    for case in side_suite.iter("testcase"):
        suite.append(case)
    main.write(main_path, encoding="utf-8", xml_declaration=True)
