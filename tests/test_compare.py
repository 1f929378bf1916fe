"""`python -m hvdtrain.compare` on this CPU: all six backends at 2 ranks, the three report
files, and the parity checks (same losses within a pair); torchrun as a launcher at 1 and 2 ranks
with the scaling efficiency; a missing optional backend."""
import importlib.metadata
import json
import os
import subprocess

import pytest

from conftest import PYTHON, REPO, base_env, error_lines

pytestmark = pytest.mark.slow  # real ranks: the distributed tier

BACKENDS = ["horovod-torch", "ddp", "accelerate", "lightning", "horovod-tf", "tf-mwms"]


@pytest.mark.timeout(1800)
def test_compare_digits_all_backends(tmp_path):
    """The short parity workload (2 epochs of the digits; the 20-epoch accuracy run, digits-cnn,
    regenerates docs/comparison.md): every backend at 2 ranks, its figures in the report, and each
    pair's losses equal over the first 10 steps. (One rank and E(2): the torchrun test below and
    the scaling study's test; E(N)'s arithmetic: test_compare_summary.py.)"""
    out = tmp_path / "cmp"
    done = subprocess.run([PYTHON, "-m", "hvdtrain.compare", "--workload", "digits-cnn-quick", "--np", "2",
                           "--timeout", "300", "--out", str(out)],
                          capture_output=True, text=True, env=base_env(), cwd=REPO, timeout=1800)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    report = json.loads((out / "compare.json").read_text())
    assert (out / "compare.png").stat().st_size > 10_000
    table = (out / "compare.md").read_text()
    for backend in BACKENDS:
        assert f"| {backend} | 2 |" in table, table

    rows = {(r["backend"], r["np"]): r for r in report["summary"]}
    for backend in BACKENDS:
        # The table's figures are the trainers' own (each run's result file).
        row = rows[(backend, 2)]
        assert row["total_images_per_sec"] > 0 and row["weights_equal_across_ranks"], row
        [m] = [m for m in report["measurements"] if m["backend"] == backend]
        trainer = json.loads(open(m["result_json"]).read())
        assert row["total_images_per_sec"] == trainer["throughput"]["total_images_per_sec"]
        assert len(trainer["ranks"]) == 2 and trainer["final"]["val_acc"] > 0.5, trainer["final"]
    # Parity: each pair's losses agree over the first steps (not accuracies: a parity workload).
    pairs = [c for c in report["parity"]["checks"] if "pair" in c]
    assert {tuple(c["pair"]) for c in pairs} == {("horovod-torch", "ddp"), ("ddp", "accelerate"), ("ddp", "lightning"),
                                                 ("horovod-tf", "tf-mwms")}
    assert all(c["ok"] and c["steps_compared"] == 10 for c in pairs) and len(pairs) == 4, pairs
    assert not [c for c in report["parity"]["checks"] if "accuracy" in c]
    # Every measurement records the environment it ran in.
    assert report["versions"]["horovod"] == importlib.metadata.version("horovod") and report["threads_per_rank"] == 1
    assert all(m["threads"] == [1] * m["np"] for m in report["measurements"])
    # Lightning chose its own cluster environment (2 ranks under mpirun: MPIEnvironment), and the
    # report sets the Jean Zay page's stated Lightning overhead beside the measured one.
    [lightning] = [json.loads(open(m["result_json"]).read()) for m in report["measurements"]
                   if m["backend"] == "lightning"]
    assert lightning["cluster_environment"] == "MPIEnvironment", lightning
    # Lightning's launcher resets torch's threads (cores / processes): the trainer's count held in its loop.
    assert lightning["threads_in_loop"] == 1
    assert "lightning: measured overhead vs ddp" in table and "Jean Zay page" in table


def test_compare_rejects_unknown_workload(tmp_path):
    done = subprocess.run([PYTHON, "-m", "hvdtrain.compare", "--workload", "gpt5", "--out", str(tmp_path)],
                          capture_output=True, text=True, env=base_env(), cwd=REPO, timeout=60)
    assert done.returncode == 2
    assert "unknown workload 'gpt5'; valid: resnet50-synthetic" in done.stderr


@pytest.mark.side_lane  # one rank, or mostly waiting: beside the others (tests/side_lane.py)
def test_compare_ddp_and_lightning_under_torchrun(tmp_path):
    """`--launcher torchrun` (one node, the seeds' talk) runs DDP and Lightning at 1 and 2 ranks;
    Lightning recognises torchrun itself (TorchElasticEnvironment) at 2; E(2) is in the table as
    reported (its arithmetic is checked with known numbers in test_compare_summary.py)."""
    out = tmp_path / "cmp"
    done = subprocess.run([PYTHON, "-m", "hvdtrain.compare", "--workload", "resnet18-synthetic-small", "--np", "1,2",
                           "--backends", "ddp,lightning", "--launcher", "torchrun", "--timeout", "300",
                           "--out", str(out)],
                          capture_output=True, text=True, env=base_env(), cwd=REPO, timeout=900)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    report = json.loads((out / "compare.json").read_text())
    assert report["launcher"] == "torchrun" and len(report["measurements"]) == 4
    for m in report["measurements"]:
        assert m["launcher"] == "torchrun" and m["command"][0] == "torchrun" and len(m["param_checksums"]) == m["np"]
        assert len(set(m["param_checksums"])) == 1 and m["total_images_per_sec"] > 0
    [lightning2] = [json.loads(open(m["result_json"]).read()) for m in report["measurements"]
                    if m["backend"] == "lightning" and m["np"] == 2]
    assert lightning2["cluster_environment"] == "TorchElasticEnvironment", lightning2
    assert all(c["ok"] for c in report["parity"]["checks"]), report["parity"]
    table = (out / "compare.md").read_text()
    for row in report["summary"]:
        if row["np"] == 2:
            e2 = row["scaling_efficiency"]
            line = table.split(f"| {row['backend']} | 2 |")[1].split("\n")[0]
            assert 0 < e2 < 1.5 and f"{e2:.3f}" in line, (row, line)


def test_horovod_under_torchrun_is_refused_in_one_line():
    done = subprocess.run(["torchrun", "--standalone", "--nproc-per-node", "2", "--no-python", PYTHON, "-m",
                           "hvdtrain.torch", "--model", "mnist_cnn", "--dataset", "digits", "--steps", "3"],
                          capture_output=True, text=True, env=base_env(), cwd=REPO, timeout=300)
    assert done.returncode != 0
    # torchrun ends the other rank when the first fails: the line of one rank or both.
    lines = [m for m in error_lines(done.stdout + done.stderr)
             if m["message"].startswith("torchrun started 2 ranks, but Horovod sees 1: the ranks are not one job "
                                        "(torchrun starts no MPI job")]
    assert lines and all(m["prog"] == "hvdtrain.torch" and m["size"] == "2" for m in lines), done.stderr[-3000:]


@pytest.mark.side_lane  # one rank, or mostly waiting: beside the others (tests/side_lane.py)
def test_missing_optional_backends_fail_alone_in_one_line(tmp_path):
    """Accelerate and Lightning hidden (packages on PYTHONPATH that fail to import, as uninstalled
    ones would): their runs fail with one line each, ddp's is measured, the comparison exits non-zero."""
    env = base_env()
    for package in ("accelerate", "lightning"):
        shadow = tmp_path / "shadow" / package
        shadow.mkdir(parents=True)
        (shadow / "__init__.py").write_text(f"raise ImportError(\"No module named '{package}'\")\n")
    env["PYTHONPATH"] = str(tmp_path / "shadow") + os.pathsep + env["PYTHONPATH"]
    out = tmp_path / "cmp"
    done = subprocess.run([PYTHON, "-m", "hvdtrain.compare", "--workload", "resnet18-synthetic-small", "--np", "1",
                           "--backends", "ddp,accelerate,lightning", "--timeout", "300", "--out", str(out)],
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=900)
    assert done.returncode != 0
    report = json.loads((out / "compare.json").read_text())
    ddp, accel, lightning = report["measurements"]
    assert "error" not in ddp and ddp["total_images_per_sec"] > 0
    for run, line in ((accel, "--backend accelerate needs Hugging Face Accelerate, which is not importable"),
                      (lightning, "--backend lightning needs PyTorch Lightning, which is not importable")):
        assert "error" in run
        log = open(run["log"]).read()
        assert f"hvdtrain.torch: error [rank 0/1]: {line}" in log and "Traceback" not in log, log[-3000:]


@pytest.mark.parametrize("launcher, how", [("mpirun", "SIGINT"), ("mpirun", "SIGTERM"), ("srun", "SIGTERM")])
def test_an_interrupted_comparison_leaves_no_process(tmp_path, request, launcher, how):
    """Ctrl-C (SIGINT) or SIGTERM to the comparison while a launch trains: the launch runs in a
    session of its own, so the signal does not reach it; the comparison ends it (its process
    group: the launcher, the ranks, their workers; under srun also the step), exits 130 and
    leaves nothing behind."""
    import signal
    import time

    from conftest import marked_env, marked_pids, processes_left

    if launcher == "srun":
        request.getfixturevalue("slurm_cluster")
    mark = str(tmp_path)
    # A workload that cannot end before the signal lands: digits-cnn trained its 20 epochs in 8 s,
    # and under the full suite's load it once finished between "epoch 1/" and the signal (exit 0).
    proc = subprocess.Popen([PYTHON, "-m", "hvdtrain.compare", "--workload", "resnet18-synthetic", "--np", "2",
                             "--backends", "horovod-torch", "--launcher", launcher, "--out", str(tmp_path / "cmp")],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=marked_env(mark),
                            cwd=REPO, start_new_session=True)

    def ranks():  # the launch's trainer processes (the run's log, forwarded by the launcher, can lag)
        found = []
        for pid in marked_pids(mark):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    found += [pid] if b"hvdtrain.torch" in f.read() else []
            except OSError:
                continue
        return found

    try:
        deadline = time.monotonic() + 180
        while len(ranks()) < 2:
            assert time.monotonic() < deadline and proc.poll() is None, "the launch did not start its ranks"
            time.sleep(0.5)
        time.sleep(3)  # into set-up or training: the run itself takes 25 s or more
        assert proc.poll() is None, "the comparison ended before the signal"
        proc.send_signal(getattr(signal, how))
        out, _ = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130 and "[compare] interrupted" in out, out[-3000:]
    assert not processes_left(mark, grace=30), processes_left(mark, grace=0)
    if launcher == "srun":
        # Slurm itself takes a moment to release the ended step's allocation (COMPLETING): seconds
        # on a loaded machine. Gone within a minute, or left behind.
        deadline = time.monotonic() + 60
        while True:
            queued = subprocess.run(["squeue", "--noheader", "--format=%i %j %T"], capture_output=True,
                                    text=True).stdout
            if "hvdtrain-compare" not in queued or time.monotonic() > deadline:
                break
            time.sleep(1)
        assert "hvdtrain-compare" not in queued, queued


def test_nodes_without_slurm_run_on_this_host_under_strong_scaling(tmp_path):
    """`--nodes 1,2` where no Slurm cluster answers runs 1 and 2 ranks on this host with mpirun, as
    --np does; strong scaling halves the per-rank batch at 2 ranks and keeps the LR."""
    env = base_env()
    env.pop("SLURM_CONF", None)  # sbatch is installed, but no cluster is configured for it
    out = tmp_path / "cmp"
    done = subprocess.run([PYTHON, "-m", "hvdtrain.compare", "--workload", "resnet18-synthetic-small", "--nodes", "1,2",
                           "--backends", "horovod-torch", "--scaling", "strong", "--timeout", "300", "--out", str(out)],
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=900)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "no Slurm cluster answers here (sinfo:" in done.stdout and "run as [1, 2] rank(s) on this host" in done.stdout
    report = json.loads((out / "compare.json").read_text())
    configs = {m["np"]: json.loads(open(m["result_json"]).read())["config"] for m in report["measurements"]}
    assert configs[1]["per_rank_batch_size"] == 8 and configs[2]["per_rank_batch_size"] == 4
    assert configs[1]["lr"] == pytest.approx(configs[2]["lr"]) and configs[1]["global_batch_size"] == 8
    assert "Strong scaling: global batch 8 at every size" in (out / "compare.md").read_text()
