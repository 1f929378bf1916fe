"""scripts/gpu-check.sh, run here in its CPU mode (--cpu) between GPU loans: the same stages,
files and report as on the lent GPU machine, at tiny sizes, with the project venv's Horovod
(no build). What a lent machine hands back is checked: at most 8 files of at most 16 MiB."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tarfile
import zipfile

import pytest

from conftest import PYTHON, REPO, base_env

pytestmark = pytest.mark.slow  # real training runs (Horovod, DDP): the distributed tier

MiB = 1024 * 1024
# In their order: what has never run on a GPU first (two ranks sharing it), then one rank's figures.
# profile-horovod and profile-ddp come after ckpt-every where py-spy is installed. The CPU mode here
# runs every stage function and every kind of run once (GPU_CHECK_STAGES): left out are the runs
# that only repeat one of them with another option (shared-ref-2 and shared-ref-big: shared-ref's;
# feeder-off and horovod-2: horovod's; jpeg-feeder-off: jpeg's; plain-2: plain's), 55 s of the suite's
# time. The report's arithmetic on two alternated pairs: tests/test_gpu_check_report.py.
STAGES = ["env", "check", "shared-nccl", "shared-ref", "shared-hvd", "shared-ddp", "shared-weights", "shared-resume",
          "shared-doctor", "horovod", "plain", "ceiling", "ddp", "jpeg-data", "jpeg", "ckpt-every", "compile", "resume",
          "lightning",
          "doctor"]
SELECTED = "|".join(s for s in STAGES if s not in ("env", "check")) + "|profile-.*"


def tiny_wheel(folder) -> str:
    """A pure-Python wheel, written by hand: FILES' wheels must install into the check's venv."""
    path = os.path.join(folder, "gpucheckprobe-1.0-py3-none-any.whl")
    info = "gpucheckprobe-1.0.dist-info"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("gpucheckprobe.py", "VALUE = 1\n")
        z.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: gpucheckprobe\nVersion: 1.0\n")
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: hand\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", f"gpucheckprobe.py,,\n{info}/METADATA,,\n{info}/WHEEL,,\n{info}/RECORD,,\n")
    return path


@pytest.mark.timeout(1000)
def test_gpu_check_cpu_mode(tmp_path):
    files, out, work = tmp_path / "files", tmp_path / "out", tmp_path / "work"
    files.mkdir()
    tiny_wheel(str(files))
    # python3 is the project venv's, found on PATH, as the lent GPU machine's python3 is its venv's
    # (/opt/torch/.venv) and no PYTHON is set: the script must keep using that one once its own
    # venv, which has a python3 too, comes first on PATH (it did not: its .pth file then added
    # itself until Python's recursion limit, on the first GPU run).
    env = {k: v for k, v in base_env().items() if k != "PYTHON"}
    env.update(GPU_CHECK_WORK=str(work), GPU_CHECK_STAGES=SELECTED, PATH=os.path.dirname(PYTHON) + os.pathsep + env.get("PATH", os.defpath))
    run = subprocess.run(["bash", os.path.join(REPO, "scripts", "gpu-check.sh"), "--cpu", str(files), str(out)],
                         env=env, cwd=REPO, capture_output=True, text=True, timeout=960)
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-6000:]

    # What comes back from a lent machine: at most 8 files of at most 16 MiB; no checkpoint.
    names = sorted(os.listdir(out))
    assert names == ["gpu-check-logs.tar.gz", "gpu-check.json", "gpu-check.md"], names
    assert all(os.path.getsize(out / n) <= 16 * MiB for n in names)
    assert list((work / "ckpt").glob("*.pt")), "the checkpoints belong in the work dir"
    with tarfile.open(out / "gpu-check-logs.tar.gz") as tar:
        archived = tar.getnames()
    for log in STAGES:
        assert f"logs/{log}.log" in archived, archived
    assert not [n for n in archived if n.endswith(".pt")], archived

    # The venv made from a venv sees that venv's torch (not its base interpreter's packages),
    # and FILES' wheels are installed into it.
    figures = json.loads((out / "gpu-check.json").read_text())
    torch_file = figures["environment"]["torch_file"]
    assert torch_file.startswith(os.path.realpath(sys.prefix)) or torch_file.startswith(sys.prefix), torch_file
    check = subprocess.run([str(work / "venv" / "bin" / "python"), "-c", "import gpucheckprobe, torch"],
                           capture_output=True, text=True)
    assert check.returncode == 0, check.stderr

    # Every stage ran and passed; the runs had the same settings; the resume went on.
    assert [s["stage"] for s in figures["stages"] if not s["stage"].startswith("profile-")] == STAGES, figures["stages"]
    assert figures["failed_stages"] == [], figures["stages"]
    assert figures["settings_differ"] == [], figures["settings"]
    resume = figures["resume"]
    assert resume["ran"] and resume["to_step"] == resume["from_step"] + figures["check"]["steps_per_epoch"], resume

    # The report: each run's img/s and ratio to the plain loop, as numbers.
    report = (out / "gpu-check.md").read_text()
    rows = {m[1]: (float(m[2]), float(m[3])) for m in
            re.finditer(r"^\| (plain torch loop|hvdtrain, Horovod|hvdtrain, DDP) \| ([0-9.]+) \| ([0-9.]+) \|$",
                        report, re.M)}
    assert set(rows) == {"plain torch loop", "hvdtrain, Horovod", "hvdtrain, DDP"}, report
    assert all(rate > 0 and ratio > 0 for rate, ratio in rows.values()), report
    for name, key in (("hvdtrain, Horovod", "horovod"), ("hvdtrain, DDP", "ddp")):
        assert figures["ratios"][key] == pytest.approx(figures["images_per_sec"][key] / figures["images_per_sec"]["plain"])
        assert rows[name][1] == pytest.approx(figures["ratios"][key], abs=0.0006)
    assert "Resume: ran" in report and "the same in every run" in report, report
    # hvdtrain and the plain loop by turns (one pair here: horovod-2 and plain-2 left out); no verdict on a CPU.
    alternated = figures["alternated"]
    assert alternated["ratios"] == [pytest.approx(figures["ratios"]["horovod"])] and alternated["verdict"] == "no goal"
    assert re.search(r"^\| horovod / plain \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \|$", report, re.M), report
    # The ceiling: one batch on the device for every step of an epoch.
    ceiling = json.loads(tarfile.open(out / "gpu-check-logs.tar.gz").extractfile("logs/ceiling.json").read())
    assert ceiling["feed"] == "ceiling" and ceiling["batches_fetched"] == figures["check"]["alternated_epochs"]
    assert figures["ceiling_images_per_sec"] == ceiling["images_per_sec"] > 0
    # The feeder's effect and real JPEGs: the runs happened, on the data they name.
    assert figures["images_per_sec"]["jpeg"] > 0, figures
    assert figures["jpeg_over_synthetic"] == pytest.approx(figures["images_per_sec"]["jpeg"]
                                                           / figures["images_per_sec"]["horovod"])
    jpeg = json.loads(tarfile.open(out / "gpu-check-logs.tar.gz").extractfile("logs/jpeg.json").read())
    assert jpeg["config"]["dataset"] == "shards" and jpeg["config"]["num_workers"] >= 1, jpeg["config"]
    assert re.search(r"JPEG shards \(24 JPEGs, \d+ decode workers\) \| [0-9.]+ \| / synthetic [0-9.]+", report), report

    # Two ranks (on the CPU here; sharing the GPU there): equal weights on both ranks under Horovod
    # and DDP, near the one-rank run of the same global batch, a resume that went on, the doctor.
    shared = figures["shared_gpu"]
    runs = shared["runs"]
    assert shared["horovod_over_ddp"] == pytest.approx(runs["shared-hvd"]["images_per_sec"]
                                                       / runs["shared-ddp"]["images_per_sec"])
    assert f"Horovod / DDP at two ranks: {shared['horovod_over_ddp']:.3f}" in report, report
    assert runs["shared-ref"]["world_size"] == 1 and runs["shared-ref"]["global_step"] == 3, runs
    for name in ("shared-hvd", "shared-ddp", "shared-resume"):
        assert runs[name]["world_size"] == 2 and runs[name]["ranks_equal"], runs
    assert runs["shared-hvd"]["global_step"] == runs["shared-ddp"]["global_step"] == 3, runs
    assert shared["resume_ran"] and runs["shared-resume"]["global_step"] == 6, shared
    weights = shared["weights"]
    assert weights["reference_moved"] > 0, weights
    assert set(weights["runs"]) == {"shared-hvd", "shared-ddp"}, weights   # the runs that ran (no ref-2, ref-big)
    assert all(weights["runs"][n]["relative_distance"] > 0 for n in ("shared-hvd", "shared-ddp")), \
        weights   # BatchNorm over other groups of samples
    # Horovod and DDP reduce the same per-rank batches: on a CPU, the same weights.
    assert weights["between"]["runs"] == ["shared-hvd", "shared-ddp"], weights
    assert weights["between"]["relative_distance"] < 1e-3, weights
    assert shared["weights_within_tolerance"] is True and shared["doctor_verdict"].startswith("READY"), shared
    assert "## Two ranks sharing the GPU" in report, report
    assert re.search(r"\*\*Horovod to DDP 0\.0000\*\* \(.*tolerance 0\.05: within\)", report), report
    # Interval checkpoints: written in the middle of epochs (3 steps an epoch, one every 2 steps).
    assert figures["images_per_sec"]["ckpt-every"] > 0 and figures["checkpoint_every_cost"] is not None, figures
    steps = sorted(int(re.search(r"-s(\d+)", p.name)[1]) for p in (work / "ckpt-every").glob("*.pt"))
    assert any(step % 3 for step in steps), steps
    # --compile regions ran, said so, and is in the report beside eager.
    assert figures["images_per_sec"]["compile"] > 0 and figures["compile_speedup"] is not None, figures
    assert "`--compile regions` (aot_eager)" in report, report
