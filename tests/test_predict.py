"""The scaling model's pieces (hvdtrain/predict): each a known input with its known answer."""
import json
import math
import os
import re
import subprocess
import time

import pytest

from conftest import PYTHON, REPO
from hvdtrain.errors import UsageError
from hvdtrain.predict import anchors, model, profiles

NODE = model.Cluster("test", gpus_per_node=4, cores_per_gpu=8, intra_busbw_gbs=100.0, inter_busbw_gbs=10.0,
                     intra_latency_s=0.0, inter_latency_s=0.0)


def test_a_ring_allreduce_takes_the_bus_bandwidth_formulas_time():
    assert model.ring_allreduce_s(1e9, 1, NODE) == 0.0
    assert model.ring_allreduce_s(1e9, 4, NODE) == pytest.approx(2 * 3 / 4 * 1e9 / 100e9)  # within a node
    assert model.ring_allreduce_s(1e9, 8, NODE) == pytest.approx(2 * 7 / 8 * 1e9 / 10e9)   # across two nodes
    slow = model.Cluster("l", 4, 8, 100.0, 10.0, intra_latency_s=1e-5, inter_latency_s=1e-4)
    # 2(n-1) = 14 ring steps, 2 of them across the two nodes (NCCL's ring model).
    assert model.ring_allreduce_s(8, 8, slow) == pytest.approx(2 * 7 / 8 * 8 / 10e9 + 12 * 1e-5 + 2 * 1e-4)


def test_the_exchange_hides_behind_the_backward_but_its_last_bucket():
    # 1 GB of gradients in 64 MiB buckets over 8 GPUs at 10 GB/s: 175 ms of exchange.
    work = model.Workload(batch=32, compute_s=0.3, optimizer_s=0.0, gradient_bytes=10**9)
    total = model.ring_allreduce_s(10**9, 8, NODE)
    one_bucket = model.Exchange("one", 2 * 10**9)
    assert model.exposed_exchange_s(work, 8, NODE, one_bucket) == pytest.approx(total)  # after the backward
    many = model.exposed_exchange_s(work, 8, NODE, model.Exchange("many", 64 * 2**20))
    assert many < 0.3 * total  # overlapped: what remains is about the last bucket's
    assert many == pytest.approx(model.ring_allreduce_s(10**9 - 14 * 64 * 2**20, 8, NODE), rel=0.5)
    assert model.exposed_exchange_s(work, 1, NODE, model.HOROVOD) == 0.0
    # Horovod fuses what is ready each cycle: a backward longer than the exchange hides all of it
    # but the last cycle's allreduce; ranks whose cores do the exchange (overlap = false) hide none.
    long = model.Workload(batch=32, compute_s=0.6, optimizer_s=0.0, gradient_bytes=10**9)
    hidden = model.exposed_exchange_s(long, 8, NODE, model.HOROVOD)
    assert 0 < hidden < 0.05 * total
    cpu = model.Cluster("cpu", 4, 8, 100.0, 10.0, intra_latency_s=0.0, inter_latency_s=0.0, overlap=False)
    assert model.exposed_exchange_s(long, 8, cpu, model.DDP) == pytest.approx(total, rel=1e-6)
    # A cycle sends all that is ready, in buffers of the threshold one after the other (not one
    # buffer a cycle): 1 GB ready at once in 100 MB buffers is the next cycle's wait and ten rings.
    slow = model.Cluster("l", 4, 8, 100.0, 10.0, intra_latency_s=1e-5, inter_latency_s=1e-4, overlap=False)
    small = model.Exchange("small", 10**8, 0.001)
    rings = 10 * model.ring_allreduce_s(10**8, 8, slow)
    wait = 0.001 * (math.floor(0.6 / 0.001) + 1) - 0.6
    assert model.exposed_exchange_s(long, 8, slow, small) == pytest.approx(wait + rings, rel=1e-6)


def test_the_bound_is_the_longest_path_and_efficiency_is_against_one_gpu():
    compute = model.Workload(batch=64, compute_s=0.1, optimizer_s=0.01, gradient_bytes=10**8)
    s = model.step(compute, 4, NODE, model.DDP)
    assert s.bound == "compute" and 0.95 < s.efficiency <= 1.0
    data = model.Workload(batch=64, compute_s=0.1, optimizer_s=0.01, gradient_bytes=10**8, input_s=0.5)
    s = model.step(data, 64, NODE, model.DDP)
    assert s.bound == "input" and s.images_per_s == pytest.approx(64 * 64 / 0.5) and s.efficiency == pytest.approx(1.0)
    chatty = model.Workload(batch=8, compute_s=0.01, optimizer_s=0.0, gradient_bytes=10**9)
    assert model.step(chatty, 64, NODE, model.HOROVOD).bound == "exchange"
    shared_fs = model.Cluster("fs", 4, 8, 100.0, 10.0, fs_node_gbs=100.0, fs_aggregate_gbs=20.0)
    files = model.Workload(batch=256, compute_s=0.2, optimizer_s=0.0, gradient_bytes=10**6, sample_bytes=110_000)
    assert model.step(files, 8, shared_fs, model.DDP).bound == "compute"
    big = model.step(files, 512, shared_fs, model.DDP)  # 512 x 256 x 110 kB a step from 20 GB/s: 0.72 s
    assert big.bound == "file system" and big.seconds == pytest.approx(512 * 256 * 110_000 / 20e9)
    assert model.gpu_hours_per_epoch(1_281_167, big) == pytest.approx(1_281_167 / big.images_per_s * 512 / 3600)


def test_horovods_published_scaling_is_reproduced_within_10_points():
    found = anchors.horovod_benchmark()
    assert len(found) == 6
    assert all(abs(a.distance_points) <= 10 for a in found), [(a.model, a.gpus, a.predicted) for a in found]
    vgg = {a.gpus: a.predicted for a in found if a.model == "vgg16"}
    assert vgg[512] < 0.75 < min(a.predicted for a in found if a.model != "vgg16")  # the network-bound one


def test_every_built_in_profile_loads_with_its_sources_and_a_bad_one_is_one_line(tmp_path):
    assert {"juwels-booster", "jean-zay-v100", "jean-zay-a100"} <= set(profiles.names())
    for name in profiles.names():
        cluster = profiles.load(name)
        assert cluster.gpus_per_node >= 1 and cluster.sources and math.isfinite(cluster.inter_busbw_gbs)
    with pytest.raises(UsageError, match="no such profile"):
        profiles.load("nowhere")
    bad = tmp_path / "mine.toml"
    bad.write_text('name = "mine"\ngpus_per_node = 4\nnics = 2\n')
    with pytest.raises(UsageError, match=r"unknown keys nics; missing cores_per_gpu, inter_busbw_gbs, intra_busbw_gbs"):
        profiles.load(str(bad))


def test_the_command_predicts_from_a_trainers_result_file(tmp_path):
    result = {"config": {"model": "resnet18", "dataset": "synthetic", "batch_size": 32, "per_rank_batch_size": 32,
                         "image_size": 224},
              "ranks": [{"phases_ms": {"compute": 90.0, "optimizer": 5.0, "other": 1.0, "data": 0.5, "sync": 0.0}}]}
    (tmp_path / "one.json").write_text(json.dumps(result))
    run = subprocess.run([PYTHON, "-m", "hvdtrain.predict", "--cluster", "juwels-booster", "--from-result",
                          str(tmp_path / "one.json"), "--parameters", "11689512", "--gpus", "4", "64",
                          "--json", str(tmp_path / "p.json"), "--png", str(tmp_path / "p.png")],
                         capture_output=True, text=True, cwd=REPO, timeout=60)
    assert run.returncode == 0, run.stderr
    rows = json.loads((tmp_path / "p.json").read_text())["rows"]
    assert [(r["backend"], r["gpus"]) for r in rows] == [("horovod", 4), ("horovod", 64), ("ddp", 4), ("ddp", 64)]
    assert rows[0]["images_per_s"] == pytest.approx(4 * 32 / 0.096, rel=0.05) and "blind to stragglers" in run.stdout
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"
    # The study that would check it: node counts of whole nodes, the measured run's model and data.
    assert "python -m hvdtrain.compare --nodes 1,16 --backends horovod-torch,ddp --train-args '--model resnet18 " \
           "--dataset synthetic --batch-size 32' --out study -- --preset juwels-booster" in run.stdout
    # Horovod as the run had it (its environment): 1 MiB buffers every 5 ms, each allreduce paying
    # its ring's latency across 16 nodes, leave more after the backward than 128 MiB every 1 ms.
    tuned = {**result, "environment": {"env": {"HOROVOD_FUSION_THRESHOLD": str(2**20), "HOROVOD_CYCLE_TIME": "5"}}}
    (tmp_path / "tuned.json").write_text(json.dumps(tuned))
    run = subprocess.run([PYTHON, "-m", "hvdtrain.predict", "--cluster", "juwels-booster", "--from-result",
                          str(tmp_path / "tuned.json"), "--parameters", "11689512", "--gpus", "4", "64",
                          "--json", str(tmp_path / "t.json")], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert "fusion threshold 1 MiB, cycle 5 ms)" in run.stdout, run.stdout + run.stderr
    tuned_prediction = json.loads((tmp_path / "t.json").read_text())
    assert tuned_prediction["exchanges"]["horovod"] == {"name": "horovod", "bucket_bytes": 2**20, "cycle_s": 0.005}
    assert tuned_prediction["rows"][1]["exposed_exchange_ms"] > 2 * rows[1]["exposed_exchange_ms"] + 1, \
        (tuned_prediction["rows"][1], rows[1])

    def refused(changes: dict, *more) -> str:
        (tmp_path / "bad.json").write_text(json.dumps({**result, **changes}))
        run = subprocess.run([PYTHON, "-m", "hvdtrain.predict", "--cluster", "juwels-booster", "--from-result",
                              str(tmp_path / "bad.json"), *more], capture_output=True, text=True, cwd=REPO, timeout=60)
        assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr
        return run.stderr + run.stdout
    assert "a run of 2 ranks; the prediction starts from one GPU's run" in refused({"world_size": 2})
    assert "does not say its gradient bytes" in refused({})  # TensorFlow's, or an older hvdtrain's
    assert "not a readable hvdtrain result file" in refused({"ranks": []}, "--parameters", "10")
    for bad in ("0", "nan", "inf"):
        assert "knows no tensor sizes for an exchange without fusion" in refused(
            {"environment": {"env": {"HOROVOD_FUSION_THRESHOLD": bad}}}, "--parameters", "10")
    assert "do not read as numbers" in refused({"environment": {"env": {"HOROVOD_CYCLE_TIME": "1ms"}}}, "--parameters", "10")
    # A doctor's figures from one GPU node replace the profile's within a node, overlap kept.
    (tmp_path / "gpu-doctor.json").write_text(json.dumps(_doctor(4, 1, "GPU 0")))
    run = subprocess.run([PYTHON, "-m", "hvdtrain.predict", "--cluster", "juwels-booster", "--from-result",
                          str(tmp_path / "one.json"), "--parameters", "11689512", "--gpus", "4", "--doctor",
                          str(tmp_path / "gpu-doctor.json"), "--json", str(tmp_path / "g.json")],
                         capture_output=True, text=True, cwd=REPO, timeout=60)
    assert "within a node 2.52 GB/s busbw" in run.stdout and "lets nothing overlap" not in run.stdout, run.stdout
    [gpu_row] = [r for r in json.loads((tmp_path / "g.json").read_text())["rows"] if r["backend"] == "horovod"]
    assert gpu_row["images_per_s"] < rows[0]["images_per_s"]  # 2.5 GB/s within a node, not the profile's 200
    (tmp_path / "doctor.json").write_text("not json")
    assert "--doctor {0}: {0} is not a file of python -m hvdtrain.doctor --json".format(tmp_path / "doctor.json") in \
        refused({"gradient_bytes": 10}, "--doctor", str(tmp_path / "doctor.json"))
    # DDP alone does not care how Horovod would fuse.
    (tmp_path / "nofusion.json").write_text(json.dumps({**result, "environment": {"env": {"HOROVOD_FUSION_THRESHOLD": "0"}}}))
    assert subprocess.run([PYTHON, "-m", "hvdtrain.predict", "--cluster", "juwels-booster", "--from-result",
                           str(tmp_path / "nofusion.json"), "--parameters", "10", "--backends", "ddp"],
                          capture_output=True, text=True, cwd=REPO, timeout=60).returncode == 0
    warned = subprocess.run([PYTHON, "-m", "hvdtrain.predict", "--cluster", "juwels-booster", "--from-result",
                             str(tmp_path / "one.json"), "--parameters", "10", "--sample-kb", "110"],
                            capture_output=True, text=True, cwd=REPO, timeout=60)
    assert "gives no file-system rate, so the file system is not modelled" in warned.stdout, warned.stdout


def test_the_input_measured_through_the_trainers_loader_can_bound_the_prediction(tmp_path):
    """--measure-input: images/sec a decode worker on the result's own data (the trainer's loader),
    the bytes a sample, the file system's read rate; a model whose step is shorter than its input
    is called data-bound."""
    folder = tmp_path / "digits"
    subprocess.run([PYTHON, "-m", "hvdtrain.data.datasets", "make-digits-folder", str(folder), "--per-class-train",
                    "12", "--per-class-val", "2", "--format", "jpg"], check=True, cwd=REPO, capture_output=True)
    result = {"config": {"model": "mnist_cnn", "dataset": "imagefolder", "data_dir": str(folder), "image_size": 32,
                         "batch_size": 8, "per_rank_batch_size": 8},
              "gradient_bytes": 200_000,
              "ranks": [{"phases_ms": {"compute": 0.05, "optimizer": 0.01, "other": 0.0, "data": 0.0, "sync": 0.0}}]}
    (tmp_path / "one.json").write_text(json.dumps(result))
    run = subprocess.run([PYTHON, "-m", "hvdtrain.predict", "--cluster", "jean-zay-v100", "--from-result",
                          str(tmp_path / "one.json"), "--measure-input", "--gpus", "4", "--backends", "ddp",
                          "--json", str(tmp_path / "p.json")], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    seen = re.search(r"measured here: (\d+) images/s a decode worker \(\d+ worker\(s\)\), 9 a GPU on jean-zay-v100; "
                     r"\d+ KiB a sample; the file system read at [\d.]+ GB/s", run.stdout)
    assert seen, run.stdout
    prediction = json.loads((tmp_path / "p.json").read_text())
    # A GPU's batch of 8 through its 9 workers at the measured rate each.
    assert prediction["workload"]["input_s"] == pytest.approx(8 / (int(seen[1]) * 9), rel=0.01)
    # Small files: their decoding or their reading bounds a step of 0.06 ms, not its compute.
    assert prediction["rows"][0]["bound"] in ("input", "file system")
    assert prediction["workload"]["sample_bytes"] > 100


def _doctor(ranks: int, hosts: int, devices: str = "cpu") -> dict:
    """A doctor's --json: 64 KiB in 1.5 ms, 16 MiB in 10 ms."""
    small, large = 65536, 16 * 2**20
    return {"ranks": ranks, "hosts": [f"n{i}" for i in range(hosts)], "devices": [devices] * ranks, "problems": [],
            "env": {},
            "allreduce": [{"bytes": b, "seconds": t, "busbw_gbs": b / t / 1e9 * 2 * (ranks - 1) / ranks}
                          for b, t in ((large, 0.010), (small, 0.0015))]}


def test_the_doctors_figures_replace_a_profiles_estimates():
    """One node: the bandwidth within a node and a ring step's latency (the small message less its
    wire time and half of Horovod's 1 ms cycle, over 2(n-1) steps); two nodes: the network's (over
    the 2(nodes-1) steps across them); overlap only where the ranks had GPUs."""
    from hvdtrain.predict import node

    here = node.measured_cluster(NODE, _doctor(4, 1, "GPU 0"))
    busbw = 16 * 2**20 / 0.010 / 1e9 * 1.5
    assert here.gpus_per_node == 4 and here.intra_busbw_gbs == pytest.approx(busbw) and here.overlap
    assert here.intra_latency_s == pytest.approx((0.0015 - 0.0005 - 1.5 * 65536 / (busbw * 1e9)) / 6)
    assert not node.measured_cluster(NODE, _doctor(4, 1)).overlap  # CPU ranks
    # The doctor ran with a 0.3 ms cycle: a half of that, not of the default 1 ms, is its wait.
    short = node.measured_cluster(NODE, {**_doctor(4, 1), "env": {"HOROVOD_CYCLE_TIME": "0.3"}})
    assert short.intra_latency_s == pytest.approx((0.0015 - 0.00015 - 1.5 * 65536 / (busbw * 1e9)) / 6)
    net = node.measured_cluster(NODE, _doctor(2, 2))
    assert net.gpus_per_node == 4 and net.intra_busbw_gbs == 100.0 and not net.overlap
    assert net.inter_busbw_gbs == pytest.approx(16 * 2**20 / 0.010 / 1e9)
    assert net.inter_latency_s == pytest.approx((0.0015 - 0.0005 - 65536 / (net.inter_busbw_gbs * 1e9)) / 2)
    # 4 ranks on 2 nodes: of the ring's 6 steps, the 4 within a node take the profile's latency.
    slow_within = model.Cluster("w", 2, 8, 100.0, 10.0, intra_latency_s=5e-5)
    four = node.measured_cluster(slow_within, _doctor(4, 2))
    wire = 1.5 * 65536 / (four.inter_busbw_gbs * 1e9)
    assert four.inter_latency_s == pytest.approx((0.0015 - 0.0005 - wire - 4 * 5e-5) / 2)
    assert "measured: the doctor's allreduce over 2 ranks on 2 node(s)" in net.sources[-1]
    with pytest.raises(UsageError, match="2 or more of each"):
        node.measured_cluster(NODE, _doctor(1, 1))


def _result(world: int, images_per_s: float, sync_ms, batch: int = 32, nodes: int = 1) -> dict:
    syncs = sync_ms if isinstance(sync_ms, list) else [sync_ms] * world
    return {"world_size": world, "throughput": {"total_images_per_sec": images_per_s},
            "config": {"per_rank_batch_size": batch},
            "ranks": [{"host": f"n{k % nodes}", "phases_ms": {"compute": 90.0, "sync": syncs[k]}} for k in range(world)]}


def test_the_check_states_the_error_and_the_share_of_the_exchange_hidden():
    """Predicted against measured img/s; the exchange left after the backward (the trainer's
    sync, the ranks' mean) against the exchange alone gives the share the backward hid."""
    from hvdtrain.predict import check

    work = model.Workload(batch=32, compute_s=0.09, optimizer_s=0.01, gradient_bytes=10**9)
    cpu = model.Cluster("cpu", 2, 1, 10.0, 10.0, intra_latency_s=0.0, overlap=False)
    # The slowest rank's sync (25 ms) is the exchange; the other's 40 ms also holds its wait for it.
    [row] = check.check_rows(work, cpu, [("ddp", _result(2, 400.0, [40.0, 25.0]))])
    alone = 2 * 1 / 2 * 10**9 / 10e9  # 0.1 s: nothing hidden on CPU ranks, so the step is 0.2 s
    assert row["exchange_alone_ms"] == pytest.approx(1e3 * alone, rel=1e-3)
    assert row["predicted_images_per_s"] == pytest.approx(2 * 32 / 0.2, rel=1e-3)
    assert row["error"] == pytest.approx(320 / 400 - 1, rel=1e-3)
    assert row["predicted_hidden"] == pytest.approx(0.0, abs=1e-6) and row["measured_hidden"] == pytest.approx(0.75)
    assert row["measured_compute_ms"] == 90.0 and row["predicted_compute_ms"] == pytest.approx(90.0)
    assert "ddp          2     1            320.0    400.0  -20.0%                 90.0   90.0" in \
        check.check_table([row], "t")
    # Repeats are their median; a run without step phases has no measured exposure (n/a, not 100 %).
    no_phases = {**_result(2, 300.0, 0.0), "ranks": [{"host": "n0"}, {"host": "n0"}]}
    [row] = check.check_rows(work, cpu, [("ddp", _result(2, 400.0, 25.0)), ("ddp", _result(2, 500.0, 35.0)),
                                         ("ddp", no_phases)])
    assert (row["runs"], row["measured_images_per_s"]) == (3, 400.0) and row["measured_exposed_ms"] == pytest.approx(30.0)
    [row] = check.check_rows(work, cpu, [("ddp", no_phases)])
    assert row["measured_hidden"] is None and check.check_table([row], "t").splitlines()[2].count("n/a") == 3
    # The ranks per node are the run's own: 2 ranks on 2 hosts exchange over the network.
    net = model.Cluster("net", 2, 1, 100.0, 1.0, intra_latency_s=0.0, inter_latency_s=0.0, overlap=False)
    [apart] = check.check_rows(work, net, [("ddp", _result(2, 400.0, 25.0, nodes=2))])
    [together] = check.check_rows(work, net, [("ddp", _result(2, 400.0, 25.0))])
    assert (apart["nodes"], together["nodes"]) == (2, 1)
    assert apart["exchange_alone_ms"] == pytest.approx(100 * together["exchange_alone_ms"], rel=1e-3)


def test_a_studys_jobs_are_what_the_prediction_is_checked_against(tmp_path):
    from hvdtrain.predict import check

    jobs = []
    for tag, backend, np, result in (("a", "horovod-torch", 1, _result(1, 100.0, 0.0)),
                                     ("b", "horovod-torch", 4, _result(4, 380.0, 5.0)),
                                     ("c", "horovod-tf", 4, _result(4, 300.0, 5.0)),
                                     ("d", "ddp", 4, None)):  # not finished: no result file
        path = tmp_path / f"{tag}.json"
        if result:
            path.write_text(json.dumps(result))
        jobs.append({"tag": tag, "backend": backend, "np": np, "result_json": str(path)})
    (tmp_path / "study.json").write_text(json.dumps({"jobs": jobs}))
    [(backend, result)] = check.study_results(str(tmp_path), 32)
    assert backend == "horovod" and result["throughput"]["total_images_per_sec"] == 380.0
    with pytest.raises(UsageError, match="job b trained 32 samples a rank a step, the prediction's run 64"):
        check.study_results(str(tmp_path), 64)
    with pytest.raises(UsageError, match="not a scaling study's directory"):
        check.study_results(str(tmp_path / "nowhere"), 32)


def test_measure_runs_once_outside_a_launcher_and_never_reads_an_earlier_runs_file(monkeypatch, tmp_path):
    """Refused as a launcher's rank (even one: it would nest launchers), not in a Slurm batch step;
    a run's file from an earlier --measure is removed first, so a failed run is one line, never
    the old figures."""
    from hvdtrain.predict import node

    for name in [k for k in os.environ if k.startswith(("OMPI_", "PMIX_", "SLURM_", "HOROVOD_"))] + ["RANK"]:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SLURM_JOB_ID", "42")  # the batch step of an allocation
    node.refuse_under_launcher()
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "0")
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "1")
    with pytest.raises(UsageError, match=r"run it once, not as rank\(s\) of openmpi"):
        node.refuse_under_launcher()
    old = tmp_path / "ddp-2.json"
    old.write_text("{}")
    with pytest.raises(UsageError, match=r"--measure: 2 ranks under ddp failed \(exit 3\): it broke \(its log: "):
        node._run("2 ranks under ddp", [PYTHON, "-c", "print('it broke'); raise SystemExit(3)"], str(old),
                  str(tmp_path / "ddp.log"), "single")
    assert not old.exists()
    # Past its time limit a run ends, whatever it started with it, and says so in one line.
    monkeypatch.setattr(node, "RUN_TIMEOUT_S", 1)
    child = tmp_path / "child.pid"
    sleeper = f"import os, subprocess, time; open({str(child)!r}, 'w').write(str(subprocess.Popen(['sleep', '60']).pid)); time.sleep(60)"
    with pytest.raises(UsageError, match="one rank's step did not end within 1 s .*fewer --steps"):
        node._run("one rank's step", [PYTHON, "-c", sleeper], str(tmp_path / "one.json"), str(tmp_path / "one.log"),
                  "single")
    pid = int(child.read_text())
    deadline = time.monotonic() + 10
    while os.path.exists(f"/proc/{pid}") and open(f"/proc/{pid}/stat").read().split()[2] != "Z" and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z"


@pytest.mark.slow
def test_measure_runs_one_rank_the_doctor_and_two_ranks_of_each_backend_under_mpirun(tmp_path):
    """--measure on this machine: one rank's step, the doctor's allreduce and 2 ranks under
    Horovod and DDP (mpirun); the prediction starts from the first, the check holds the last
    two's own figures, and the node is the doctor's (2 CPU ranks: no overlap)."""
    out = tmp_path / "m"
    run = subprocess.run([PYTHON, "-m", "hvdtrain.predict", "--cluster", "jean-zay-a100", "--measure",
                          "--model mnist_cnn --dataset digits --batch-size 16", "--steps", "40", "--out", str(out),
                          "--gpus", "8", "--json", str(tmp_path / "p.json")],
                         capture_output=True, text=True, cwd=REPO, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    prediction = json.loads((tmp_path / "p.json").read_text())
    here = prediction["measured_here"]
    doctor = json.loads((out / "doctor-2.json").read_text())
    assert doctor["ranks"] == 2 and here["node"]["intra_busbw_gbs"] == doctor["allreduce"][-1]["busbw_gbs"] > 0
    assert here["node"]["gpus_per_node"] == 2 and here["node"]["overlap"] is False
    one = json.loads((out / "one.json").read_text())
    assert one["world_size"] == 1 and prediction["workload"]["gradient_bytes"] == one["gradient_bytes"] > 0
    for row in here["check"]:
        result = json.loads((out / f"{row['backend']}-2.json").read_text())
        assert result["world_size"] == 2 and result["config"]["backend"] == row["backend"]
        assert row["measured_images_per_s"] == result["throughput"]["total_images_per_sec"]
    assert [r["backend"] for r in here["check"]] == ["horovod", "ddp"]
    assert "the model on this node (2 ranks), against its runs" in run.stdout
    assert "jean-zay-a100's own figures within a node are kept" in run.stdout
