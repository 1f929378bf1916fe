"""The scaling model's pieces (hvdtrain/predict): each a known input with its known answer."""
import json
import math
import re
import subprocess

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
           "--dataset synthetic --batch-size 32 --image-size 224' --out study -- --preset juwels-booster" in run.stdout
    def refused(changes: dict, *more) -> str:
        (tmp_path / "bad.json").write_text(json.dumps({**result, **changes}))
        run = subprocess.run([PYTHON, "-m", "hvdtrain.predict", "--cluster", "juwels-booster", "--from-result",
                              str(tmp_path / "bad.json"), *more], capture_output=True, text=True, cwd=REPO, timeout=60)
        assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr
        return run.stderr + run.stdout
    assert "a run of 2 ranks; the prediction starts from one GPU's run" in refused({"world_size": 2})
    assert "does not say its gradient bytes" in refused({})  # TensorFlow's, or an older hvdtrain's
    assert "not a readable hvdtrain result file" in refused({"ranks": []}, "--parameters", "10")
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
