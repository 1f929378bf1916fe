"""`python -m hvdtrain.doctor` on real ranks: ready alone, under mpirun, srun and horovodrun, and
NOT READY with the reason for a Horovod without torch ops, more ranks per node than GPUs, ranks
that disagree with the launcher on the world size, and a rank really slower than the others;
the allreduce timed through Horovod and through MPI (mpi4py) side by side."""
import os
import re
import shutil
import socket

import pytest

from conftest import PYTHON, base_env, launch

DOCTOR = [PYTHON, "-m", "hvdtrain.doctor", "--large-mib", "4", "--timeout", "60"]
# Where the ranks' evenness is not the subject: a rank that shares its core with another process
# (the suite's side lane runs beside these tests: tests/side_lane.py) is rightly named slow by the
# default threshold. The verdict's threshold is test_a_slow_rank_is_named_and_fails_the_verdict's.
LENIENT = ["--slow-fraction", "0.9"]


def verdict(output: str) -> list[str]:
    """The verdict lines (mpirun --tag-output may glue the next line's tag to a line's end)."""
    return [m.group(0).strip() for m in re.finditer(r"hvdtrain\.doctor: (NOT READY|READY)[^\n\[]*", output)]


def compute_figures(output: str) -> dict[int, float]:
    """{rank: GFLOP/s} from the health section's per-rank lines."""
    return {int(m["rank"]): float(m["gflops"]) for m in re.finditer(
        r"rank (?P<rank>\d+) \(host [^)]*\): compute (?P<gflops>[\d.]+) GFLOP/s \(", output)}


def mpi4py_allreduce_ms(output: str) -> dict[str, float]:
    """{message size: ms} of the allreduce timed through MPI directly (mpi4py)."""
    return {m["size"]: float(m["ms"]) for m in re.finditer(
        r"allreduce\s+(?P<size>\d+ [KM]iB) MPI \(mpi4py\)\s+(?P<ms>[\d.]+) ms, algbw", output)}


@pytest.mark.slow
@pytest.mark.parametrize("launcher,np", [("single", 1), ("mpirun", 2), ("horovodrun", 2)])
def test_ready(launcher, np):
    run = launch(launcher, np, DOCTOR + LENIENT, timeout=120)
    out = run.output
    assert f"hvdtrain doctor: {np} rank(s) via" in out, out[-3000:]
    assert f"allreduce (sum, average) and broadcast correct on {np}/{np} rank(s)" in out, out[-3000:]
    assert "rank/size/local rank agree with Horovod on every rank" in out, out[-3000:]
    assert "framework ops: torch: ok; tensorflow: ok" in out, out[-3000:]
    assert "64 KiB" in out and "4 MiB" in out and "busbw" in out, out[-3000:]
    assert "\0" not in out and re.search(r"MPI: Open MPI v\d[^\n]*\d\n", out), out[-3000:]  # no trailing NUL
    assert [line.split("hvdtrain.doctor: ", 1)[1] for line in verdict(out)] == [
        f"READY: {np} rank(s) on 1 host(s) can train with hvdtrain.tf, hvdtrain.torch"], out[-3000:]
    assert sorted(compute_figures(out)) == list(range(np)), out[-3000:]
    assert all(value > 0 for value in compute_figures(out).values()), out[-3000:]
    if np == 1:
        assert "on the only rank (nothing to compare it with)" in out, out[-3000:]
    if launcher != "horovodrun":  # one host: Open MPI's TCP transport off, a lone MPI singleton's too
        assert all(f"rank {r} listens on: nothing" in out for r in range(np)), out[-3000:]
    else:
        assert f"compute: the {np} ranks are even (none more than 90 % below the median): min " in out, out[-3000:]
    if launcher == "horovodrun":  # --gloo: no MPI to compare with, and a line that says so
        assert "MPI comparison (mpi4py) skipped: Horovod runs with Gloo" in out, out[-3000:]
        assert not mpi4py_allreduce_ms(out), out[-3000:]
    if launcher == "mpirun":
        assert sorted(mpi4py_allreduce_ms(out)) == ["4 MiB", "64 KiB"], out[-3000:]
        assert all(ms > 0 for ms in mpi4py_allreduce_ms(out).values()), out[-3000:]


@pytest.mark.slow
def test_ready_under_srun(slurm_cluster):
    run = launch("srun", 2, DOCTOR + LENIENT, timeout=180)
    assert "hvdtrain doctor: 2 rank(s) via slurm" in run.output, run.output[-3000:]
    assert "correct on 2/2 rank(s)" in run.output and len(verdict(run.output)) == 1
    assert "READY: 2 rank(s)" in verdict(run.output)[0]


@pytest.mark.slow
@pytest.mark.side_lane  # one rank, or mostly waiting: beside the others (tests/side_lane.py)
def test_horovod_without_torch_ops(tmp_path):
    """A real Horovod install whose PyTorch extension is missing (a build without
    HOROVOD_WITH_PYTORCH=1): the checks still run on TensorFlow's ops, and the verdict says why."""
    import horovod

    dst = tmp_path / "site" / "horovod"
    shutil.copytree(os.path.dirname(horovod.__file__), dst, ignore=shutil.ignore_patterns("mpi_lib_v2*.so"))
    env = base_env()
    env["PYTHONPATH"] = f"{tmp_path / 'site'}{os.pathsep}{env['PYTHONPATH']}"
    run = launch("mpirun", 2, DOCTOR, timeout=120, env=env, check=False)
    assert run.returncode == 1, run.output[-3000:]
    [line] = verdict(run.output)
    assert "NOT READY" in line and "is installed without its PyTorch ops" in line, line
    assert "hvdtrain.torch cannot run; rebuild it with HOROVOD_WITH_PYTORCH=1" in line, line
    assert "correct on 2/2 rank(s)" in run.output, run.output[-3000:]  # TF's ops did the checks


@pytest.mark.slow
def test_more_ranks_than_gpus():
    """The scheduler's GPU count is what the doctor reads (as Slurm sets it for --gres=gpu:1)."""
    env = base_env()
    env["SLURM_GPUS_ON_NODE"] = "1"
    run = launch("mpirun", 2, DOCTOR + ["--framework", "torch"], timeout=120, env=env, check=False)
    assert run.returncode == 1, run.output[-3000:]
    [line] = verdict(run.output)
    assert "2 ranks on this node but 1 visible GPU(s): hvdtrain runs one rank per GPU" in line, line  # the trainer's
    assert "the job was given 1 GPU(s) but the framework sees none" in line, line


@pytest.mark.slow
def test_ranks_disagree_on_world_size(tmp_path):
    """Two processes a launcher meant as ranks 0 and 1 of 2, whose MPI never joined them (as
    `srun --mpi=none` does with Open MPI): each is a world of one, and each says so."""
    procs = []
    for rank in (0, 1):
        env = base_env()
        env.update(HOROVOD_RANK=str(rank), HOROVOD_SIZE="2", HOROVOD_LOCAL_RANK=str(rank), HOROVOD_LOCAL_SIZE="2",
                   HOROVOD_CROSS_SIZE="1")
        procs.append(launch("single", 1, DOCTOR + ["--framework", "torch"], timeout=120, env=env, check=False))
    for rank, run in enumerate(procs):
        assert run.returncode == 1, run.output[-3000:]
        [line] = verdict(run.output)
        assert "the launcher (horovodrun) and Horovod disagree: size 2 (launcher) vs 1 (Horovod)" in line, line
        if rank == 1:
            assert "rank 1 (launcher) vs 0 (Horovod)" in line, line


# Rank 1 alone gets HVDTRAIN_DOCTOR_SLOWDOWN (test only: its kernel does N times the work it
# reports), set by a shell in front of that rank's Python, so the rank is slow for real.
SLOW_RANK_1 = ["sh", "-c", 'if [ "$OMPI_COMM_WORLD_RANK" = 1 ]; then export HVDTRAIN_DOCTOR_SLOWDOWN=8; fi; '
               'exec "$@"', "sh"]


@pytest.mark.slow
def test_a_slow_rank_is_named_and_fails_the_verdict():
    run = launch("mpirun", 2, SLOW_RANK_1 + DOCTOR + ["--framework", "torch"], timeout=120, check=False)
    out = run.output
    assert run.returncode == 1, out[-3000:]
    [line] = verdict(out)
    assert "NOT READY (1 problem(s))" in line, line
    slow = re.search(rf"rank 1 \(host {re.escape(socket.gethostname())}\): compute (?P<gflops>[\d.]+) GFLOP/s, "
                     r"(?P<below>\d+) % below the median of the ranks \((?P<median>[\d.]+) GFLOP/s\): "
                     r"a synchronous job runs at the speed of its slowest rank", line)
    assert slow, line
    assert "rank 0 (host" not in line, line
    assert 25 < int(slow["below"]) <= 100 and 0 < float(slow["gflops"]) < float(slow["median"]), line
    figures = compute_figures(out)
    assert sorted(figures) == [0, 1] and 0 < figures[1] < figures[0], out[-3000:]
    assert "slowed x8 by HVDTRAIN_DOCTOR_SLOWDOWN, a test setting" in out, out[-3000:]
    assert "ranks are even" not in out, out[-3000:]
    # The rest of the report still comes: Horovod's allreduce and MPI's beside it, both sizes.
    assert sorted(mpi4py_allreduce_ms(out)) == ["4 MiB", "64 KiB"], out[-3000:]
    assert all(ms > 0 for ms in mpi4py_allreduce_ms(out).values()), out[-3000:]
    assert re.search(r"allreduce\s+64 KiB Horovod\s+[\d.]+ ms", out), out[-3000:]

    # The threshold is the user's: 8 times the work is well under 99 % below the median.
    run = launch("mpirun", 2, SLOW_RANK_1 + DOCTOR + ["--framework", "torch", "--slow-fraction", "0.99"],
                 timeout=120, check=False)
    assert run.returncode == 0, run.output[-3000:]
    assert "READY: 2 rank(s)" in verdict(run.output)[0], run.output[-3000:]
    assert "compute: the 2 ranks are even (none more than 99 % below the median)" in run.output, run.output[-3000:]


# ------------------------------------------------------------------------------ pure logic (fast)
def test_a_rank_below_the_threshold_is_named_with_its_host_and_fraction():
    from hvdtrain.doctor.health import rank_spread

    problems, summary = rank_spread([(0, "node1", 3.7), (1, "node2", 1.9), (2, "node1", 3.8)],
                                    "compute", "GFLOP/s", 0.25)
    assert summary is None
    assert problems == ["rank 1 (host node2): compute 1.9 GFLOP/s, 49 % below the median of the ranks "
                        "(3.7 GFLOP/s): a synchronous job runs at the speed of its slowest rank"]
    # Two slow ranks of four: both named, in rank order; the fast ones never are.
    problems, _ = rank_spread([(3, "c", 1.0), (0, "a", 10.0), (1, "b", 2.0), (2, "a", 9.0)], "compute", "GFLOP/s", 0.25)
    assert [p.split(":")[0] for p in problems] == ["rank 1 (host b)", "rank 3 (host c)"], problems


def test_even_ranks_give_one_line_with_min_median_max():
    from hvdtrain.doctor.health import rank_spread

    problems, summary = rank_spread([(0, "n1", 3.7), (1, "n1", 3.5), (2, "n2", 3.9)], "compute", "GFLOP/s", 0.25)
    assert problems == []
    assert summary == ("compute: the 3 ranks are even (none more than 25 % below the median): "
                       "min 3.5, median 3.7, max 3.9 GFLOP/s")


def test_the_threshold_is_more_than_the_fraction_below_the_median():
    from hvdtrain.doctor.health import rank_spread

    exactly = [(0, "a", 4.0), (1, "a", 4.0), (2, "b", 3.0)]       # rank 2 exactly 25 % below
    assert rank_spread(exactly, "compute", "GFLOP/s", 0.25)[0] == []
    [problem] = rank_spread(exactly, "compute", "GFLOP/s", 0.2)[0]
    assert problem.startswith("rank 2 (host b): compute 3.0 GFLOP/s, 25 % below"), problem
    # Faster than the others is never a problem.
    assert rank_spread([(0, "a", 1.0), (1, "a", 1.0), (2, "a", 50.0)], "compute", "GFLOP/s", 0.25)[0] == []


def test_one_rank_has_nothing_to_compare_with():
    from hvdtrain.doctor.health import rank_spread

    assert rank_spread([(0, "n1", 41.23)], "compute", "GFLOP/s", 0.25) == (
        [], "compute: 41.2 GFLOP/s on the only rank (nothing to compare it with)")
    assert rank_spread([], "host-to-GPU copy", "GB/s", 0.25) == ([], None)   # a CPU run: no copy figure


def test_a_zero_figure_is_a_problem():
    from hvdtrain.doctor.health import rank_spread

    [zero] = rank_spread([(0, "a", 5.0), (1, "b", 0.0)], "compute", "GFLOP/s", 0.25)[0]
    assert zero.startswith("rank 1 (host b): compute 0.000 GFLOP/s, 100 % below the median"), zero
    # Most ranks at zero: the median is zero, the zeros are still named (their kernel did not run).
    problems, summary = rank_spread([(0, "a", 0.0), (1, "b", 0.0), (2, "c", 4.0)], "compute", "GFLOP/s", 0.25)
    assert summary is None and [p.split(":")[0] for p in problems] == ["rank 0 (host a)", "rank 1 (host b)"]
    assert all("the check did not run properly" in p for p in problems)
    assert rank_spread([(0, "a", 0.0)], "compute", "GFLOP/s", 0.25)[1] is None


def _report(rank, host, gflops, h2d=None):
    """A rank's report with what _cross_checks reads: one CPU rank per core, nothing else wrong."""
    return {"rank": rank, "size": 2, "host": host, "local_rank": 0, "local_size": 1, "gpus": 0, "sched_gpus": None,
            "threads": 1, "cores": 1, "problems": [],
            "health": {"gflops": gflops, "h2d_gbps": h2d, "kernel": "test", "slowdown": 1}}


def test_a_slow_rank_is_a_problem_for_the_verdict():
    from hvdtrain.doctor.cli import _cross_checks
    from hvdtrain.doctor.health import health_findings

    even = [_report(0, "n1", 40.0), _report(1, "n2", 38.0)]
    assert _cross_checks(even, 0.25) == []
    slow = [_report(0, "n1", 40.0), _report(1, "n2", 10.0)]
    [problem] = _cross_checks(slow, 0.25)
    assert problem.startswith("rank 1 (host n2): compute 10.0 GFLOP/s, 60 % below the median"), problem
    assert _cross_checks(slow, 0.7) == []        # --slow-fraction 0.7
    # GPU ranks: the copy is compared too, on its own.
    gpus = [_report(0, "g1", 9000.0, h2d=24.0), _report(1, "g2", 9100.0, h2d=3.0)]
    summaries, problems = health_findings(gpus, 0.25)
    assert len(problems) == 1 and problems[0].startswith("rank 1 (host g2): host-to-GPU copy 3.0 GB/s"), problems
    assert summaries == ["compute: the 2 ranks are even (none more than 25 % below the median): "
                         "min 9000, median 9050, max 9100 GFLOP/s"]


def test_slow_fraction_option():
    from hvdtrain.doctor.cli import build_parser

    assert build_parser().parse_args([]).slow_fraction == 0.25
    assert build_parser().parse_args(["--slow-fraction", "0.1"]).slow_fraction == 0.1
    for bad in ("0", "1", "1.5", "-0.2"):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["--slow-fraction", bad])


def test_slowdown_is_read_from_its_test_only_variable():
    from hvdtrain.test_hooks import doctor_slowdown as slowdown_factor

    assert slowdown_factor({}) == 1
    assert slowdown_factor({"HVDTRAIN_DOCTOR_SLOWDOWN": "8"}) == 8
    for ignored in ("", "0", "1", "-3", "2.5", "x"):
        assert slowdown_factor({"HVDTRAIN_DOCTOR_SLOWDOWN": ignored}) == 1


def test_median_of_a_few_timed_repetitions_after_a_warm_up():
    from hvdtrain.doctor import health as doctor

    calls = []
    seconds, reps = doctor.median_seconds(lambda: calls.append(1))
    assert doctor.MIN_REPS <= reps <= doctor.MAX_REPS and len(calls) == reps + 1   # + the warm-up
    assert 0 <= seconds < 0.01
    assert doctor.matmul_gflops(1000, 1.0) == 2.0 and doctor.matmul_gflops(1000, 0.0) == 0.0


def test_cpu_kernels_are_quick_and_give_positive_figures():
    import time

    import torch

    from hvdtrain.doctor.health import numpy_health, torch_health

    threads = torch.get_num_threads()
    started = time.monotonic()
    plain = torch_health(torch, torch.device("cpu"), threads=1)
    slowed = torch_health(torch, torch.device("cpu"), threads=1, slowdown=2)
    figures = numpy_health()
    assert time.monotonic() - started < 6, "the health check must stay well under 2 s per rank"
    assert torch.get_num_threads() == threads        # the rank's own setting is left as it was
    assert plain["gflops"] > 0 and slowed["gflops"] > 0 and figures["gflops"] > 0
    assert plain["h2d_gbps"] is None                  # no GPU: no copy figure
    assert plain["kernel"].startswith("torch matmul 512x512 float32 on CPU, 1 thread(s), median of ")
    assert slowed["slowdown"] == 2 and figures["kernel"].startswith("numpy matmul 512x512 float32 on CPU")


def test_the_mpi_comparison_is_skipped_with_its_reason():
    from hvdtrain.doctor.collectives import mpi4py_for_comparison

    class Horovod:
        def __init__(self, built, enabled):
            self.mpi_built = lambda: built
            self.mpi_enabled = lambda: enabled

    assert mpi4py_for_comparison(Horovod(False, False), 2) == (None, "this Horovod is built without MPI")
    MPI, why = mpi4py_for_comparison(Horovod(True, False), 2)
    assert MPI is None and why.startswith("Horovod runs with Gloo (horovodrun --gloo"), why


def test_scheduler_gpus_from_the_environment():
    from hvdtrain.doctor.gpus import scheduler_gpus

    assert scheduler_gpus({}) is None
    assert scheduler_gpus({"SLURM_GPUS_ON_NODE": "4", "CUDA_VISIBLE_DEVICES": "0"}) == 4
    assert scheduler_gpus({"CUDA_VISIBLE_DEVICES": "0,1,2,3"}) == 4
    assert scheduler_gpus({"CUDA_VISIBLE_DEVICES": ""}) == 0
    assert scheduler_gpus({"CUDA_VISIBLE_DEVICES": "NoDevFiles"}) == 0


def test_gpu_problems():
    from hvdtrain.doctor.gpus import gpu_problems

    assert gpu_problems("n1", 4, 4) == []
    assert gpu_problems("n1", 0, None) == []             # a CPU run
    assert gpu_problems("n1", 1, 4, [None] * 4) == []    # per-task binding: each rank sees its own GPU
    # Ranks sharing GPUs: the trainer's refusal (tests/test_devices.py), said once for the host.
    [share] = gpu_problems("n1", 4, 4, ["8 ranks on this node but 4 visible GPU(s): ..."] * 8)
    assert share.startswith("n1: 8 ranks on this node but 4 visible GPU(s)")
    unseen = gpu_problems("n1", 0, 1)
    assert len(unseen) == 1 and "the framework sees none" in unseen[0]


def test_bus_bandwidth_is_nccl_tests_definition():
    from hvdtrain.doctor.collectives import bus_bandwidth

    # 1 GB in 1 s: algbw 1 GB/s; busbw x 2(n-1)/n: 1 at 2 ranks, 1.5 at 4, 1.75 at 8.
    assert bus_bandwidth(10**9, 1.0, 2) == (1.0, 1.0)
    assert bus_bandwidth(10**9, 1.0, 4) == (1.0, 1.5)
    assert bus_bandwidth(10**9, 0.5, 8) == (2.0, 3.5)


def test_gpu_node_with_a_horovod_built_without_gpu_ops():
    """A Horovod built on a login node without the CUDA module, run on a GPU node: one line that
    says so and what to do (the doctor reports it, hvdtrain.torch refuses with it)."""
    from hvdtrain.cluster.horovod_ops import gpu_ops_problem

    line = gpu_ops_problem(4, cuda_built=False, nccl_built=False, horovod_version="0.28.1")
    assert line.startswith("4 GPU(s) here, but Horovod 0.28.1 is built without CUDA and NCCL ops"), line
    assert "bash scripts/setup.sh --gpu" in line and "CUDA module is loaded" in line
    assert "without NCCL" in gpu_ops_problem(1, cuda_built=True, nccl_built=False)
    assert gpu_ops_problem(4, cuda_built=True, nccl_built=True) is None     # the NCCL build
    assert gpu_ops_problem(0, cuda_built=False, nccl_built=False) is None   # a CPU node: nothing to say
    assert gpu_ops_problem(0, cuda_built=True, nccl_built=True) is None     # the NCCL build on a CPU node


def test_srun_needs_of_each_mpi():
    from hvdtrain.doctor.gpus import srun_mpi_hint

    assert "--mpi=pmix" in srun_mpi_hint("Open MPI v5.0.11, package: Open MPI ... Distribution")
    assert "Open MPI 5" in srun_mpi_hint("Open MPI v5.0.11")
    assert "--mpi=pmix" in srun_mpi_hint("Open MPI v4.1.4, package: Debian OpenMPI")
    assert "--mpi=pmi2" in srun_mpi_hint("MPICH Version: 4.2.0")
    assert srun_mpi_hint("unknown (ImportError)") is None
def test_one_rank_that_cannot_compare_skips_it_on_every_rank():
    """A rank whose mpi4py does not import: every rank skips the MPI timing (one rank alone in
    MPI_Barrier would hang), and the line names the rank that could not."""
    from hvdtrain.doctor.cli import _mpi_comparison

    class Gloo:
        mpi_built = staticmethod(lambda: True)
        mpi_enabled = staticmethod(lambda: False)

    class Gathered:
        def __init__(self, reasons):
            self.reasons = reasons

        def allgather_object(self, obj, name):
            return self.reasons

    why = "mpi4py does not import (ImportError: libmpi.so.40)"
    assert _mpi_comparison(Gloo(), Gathered([None, why]), 2, (65536,), 5) == ([], f"rank 1: {why}")
    gloo = "Horovod runs with Gloo (horovodrun --gloo, or HOROVOD_CONTROLLER=gloo), so MPI is not initialised"
    assert _mpi_comparison(Gloo(), Gathered([gloo, gloo]), 2, (65536,), 5) == ([], gloo)


class _TwoRanks:
    """Rank 0's backend in a world of two: rank 0 measures `mine` round by round; rank 1's best
    figures so far arrive as `peer` in each round's gather."""

    def __init__(self, mine, peer):
        self.mine, self.peer, self.gathers = list(mine), list(peer), []

    def health(self, threads, slowdown):
        return {"kernel": "k", "gflops": self.mine.pop(0), "h2d_gbps": None, "slowdown": slowdown}

    def allgather_object(self, obj, name):
        self.gathers.append(name)
        return [obj, {"gflops": self.peer.pop(0), "h2d_gbps": None}]


def test_a_rank_is_named_only_if_slow_in_every_round():
    from hvdtrain.doctor.cli import _measure_health
    from hvdtrain.doctor.health import health_findings

    even = _TwoRanks(mine=[40.0], peer=[41.0])               # even at once: one round
    assert _measure_health(even, 1, [], 0.25) == {"kernel": "k", "gflops": 40.0, "h2d_gbps": None, "slowdown": 1}
    assert even.gathers == ["doctor.health.0"]

    burst = _TwoRanks(mine=[10.0, 39.0], peer=[40.0, 40.0])  # disturbed once: measured again, best kept
    figures = _measure_health(burst, 1, [], 0.25)
    assert figures["gflops"] == 39.0 and figures["kernel"] == "k, best of 2 rounds" and len(burst.gathers) == 2

    slow = _TwoRanks(mine=[10.0, 12.0, 11.0], peer=[40.0, 40.0, 40.0])   # slow every time: 3 rounds, then named
    figures = _measure_health(slow, 1, [], 0.25)
    assert figures["gflops"] == 12.0 and figures["kernel"] == "k, best of 3 rounds"
    reports = [{"rank": 0, "host": "n1", "health": figures}, {"rank": 1, "host": "n2", "health": {"gflops": 40.0}}]
    [problem] = health_findings(reports, 0.25)[1]
    assert problem.startswith("rank 0 (host n1): compute 12.0 GFLOP/s, 54 % below the median"), problem


def test_best_figures_keep_the_highest_of_each():
    from hvdtrain.doctor.health import best_figures

    first = {"kernel": "k", "gflops": 5.0, "h2d_gbps": 20.0, "slowdown": 1}
    assert best_figures(None, first) == first
    assert best_figures(first, {"kernel": "k", "gflops": 7.0, "h2d_gbps": 10.0, "slowdown": 1}) == {
        "kernel": "k", "gflops": 7.0, "h2d_gbps": 20.0, "slowdown": 1}
    failed = {"kernel": "failed", "gflops": None, "h2d_gbps": None, "slowdown": 1}
    assert best_figures(failed, first)["kernel"] == "k" and best_figures(first, failed)["gflops"] == 5.0
