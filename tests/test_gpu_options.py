"""The options of the GPU job scripts (slurm/*gpu*.sbatch: channels-last and AMP on) run on the CPU
under every torch backend, with a checkpoint and a resume: a branch that runs only on a GPU is a
branch no test runs. What only a GPU has (NCCL, CUDA events, pinned memory,
cuDNN/TF32 switches) is listed in docs/gpu.md."""
import glob
import json
import os
import re
import shlex
import shutil

import pytest
import torch

from conftest import PYTHON, REPO, launch

pytestmark = pytest.mark.slow  # real ranks: the distributed tier

# A ResNet (the models channels-last is for) small enough for two CPU ranks: 32 px synthetic
# images, 8 steps an epoch. Random labels: the losses are what is compared, not an accuracy.
RESNET = ["--model", "resnet18", "--dataset", "synthetic", "--image-size", "32", "--synthetic-size", "128",
          "--batch-size", "8", "--threads-per-rank", "1", "--log-interval", "1", "--num-workers", "0",
          "--base-lr", "0.01", "--warmup-epochs", "0"]


def train(tmp_path, name, backend, extra, np=2):
    result = tmp_path / f"{name}.json"
    launch("mpirun", np, [PYTHON, "-m", "hvdtrain.torch", "--backend", backend, *RESNET, *extra,
                          "--result-json", str(result)], timeout=240)
    return json.loads(result.read_text())


def losses(result):
    return [loss for _, loss in result["loss_log"]]


def assert_ranks_equal(result):
    assert len({r["param_checksum"] for r in result["ranks"]}) == 1, result["ranks"]


def test_channels_last_under_horovod_trains_as_the_default_layout_does(tmp_path):
    """Horovod takes contiguous tensors only: a channels-last ResNet's initial broadcast failed
    ("Tensor is required to be contiguous"), and its gradients' allreduce would have."""
    # Three steps at a small LR: a ResNet on batches of 8 random images amplifies rounding
    # differences within a few more (a plain single-process loop does the same, no Horovod).
    steps = ["--steps", "3", "--base-lr", "0.001"]
    default = train(tmp_path, "nchw", "horovod", ["--channels-last", "off", *steps])
    nhwc = train(tmp_path, "nhwc", "horovod", ["--channels-last", "on", *steps])
    assert [r["channels_last"] for r in nhwc["ranks"]] == [True, True]
    assert [r["channels_last"] for r in default["ranks"]] == [False, False]
    assert_ranks_equal(nhwc)
    assert len(losses(nhwc)) == 3
    # Same maths in another memory layout: equal up to the kernels' rounding, which depends on the
    # CPU: oneDNN picks other convolution kernels per layout and per instruction set (1e-5 apart on
    # one machine of this kind, 2e-3 on another). A layout bug (weights taken in the wrong order,
    # a rank's gradients missing) moves the losses by more, and splits the ranks' weights.
    assert losses(nhwc) == pytest.approx(losses(default), rel=1e-2)


def _set_loss_scale(ckpt_dir, scale: float, growth_tracker: int) -> float:
    """Give the newest checkpoint another loss scale than a fresh GradScaler's (65536), as a long
    fp16 run has after overflows; returns the scale it had."""
    from hvdtrain.checkpoint import latest_checkpoint

    path = latest_checkpoint(str(ckpt_dir))
    state = torch.load(path, weights_only=True)
    before = state["scaler"]["scale"]
    state["scaler"].update(scale=scale, _growth_tracker=growth_tracker)
    torch.save(state, path)
    return before


def gpu_template_options() -> list[str]:
    """The trainer options of slurm/'s torch GPU job scripts (all alike but for --num-workers),
    without the paths each job fills in."""
    found = {}
    for path in sorted(glob.glob(os.path.join(REPO, "slurm", "torch-*.sbatch"))):
        text = open(path).read()
        if "--gres=gpu" not in text:
            continue
        command = re.search(r"python -m hvdtrain\.torch \\\n(.*?)(?<!\\)\n", text, re.S).group(1)
        argv = shlex.split(command.replace("\\\n", " "))
        for path_option in ("--data-dir", "--checkpoint-dir", "--result-json"):
            del argv[argv.index(path_option):argv.index(path_option) + 2]
        found[os.path.basename(path)] = argv[:argv.index("--num-workers")] + argv[argv.index("--num-workers") + 2:]
    assert len(found) >= 4 and len({tuple(argv) for argv in found.values()}) == 1, found
    return next(iter(found.values()))


def test_gpu_template_options_checkpoint_and_resume_under_every_torch_backend(tmp_path):
    """The GPU job scripts' options (ResNet, image files, AMP fp16 autocast + GradScaler, and
    channels-last, which auto turns on only on CUDA: on here) under Horovod write a checkpoint;
    Horovod, DDP and Accelerate each resume it with every rank at the checkpoint's loss scale
    (before: rank 0 alone loaded it, the others restarted at 65536 and the ranks drifted apart
    silently), and write their own checkpoint. Lightning runs the options with bf16: it refuses
    fp16 AMP on a CPU, and hvdtrain's checkpoints with it."""
    from hvdtrain.data.datasets import write_digits_imagefolder

    template = gpu_template_options()
    assert template[:2] == ["--model", "resnet50"] and "--amp" in template, template
    # Sized for two CPU ranks: ResNet-18 on 16 px digit files (4 steps an epoch), 2 workers each.
    # (fp16 on a CPU is slow: 0.6 s a step for this ResNet at 32 px channels-last, 2.5 s without.)
    data = write_digits_imagefolder(str(tmp_path / "data"), per_class_train=7, per_class_val=2, size=16)
    gpu_options = ["--model", "resnet18", *template[2:], "--dataset", "imagefolder", "--data-dir", data,
                   "--image-size", "16", "--channels-last", "on", "--num-workers", "0", "--warmup-epochs", "1"]
    first = train(tmp_path, "first", "horovod", gpu_options + ["--epochs", "1", "--checkpoint-dir",
                                                                str(tmp_path / "ckpt")])
    assert_ranks_equal(first)
    assert all(r["grad_scale"] > 0 for r in first["ranks"])
    _set_loss_scale(tmp_path / "ckpt", 1024.0, 7)
    for backend in ("horovod", "ddp", "accelerate"):
        ckpt = tmp_path / f"ckpt-{backend}"
        shutil.copytree(tmp_path / "ckpt", ckpt)
        resumed = train(tmp_path, backend, backend, gpu_options + ["--epochs", "2", "--checkpoint-dir", str(ckpt)])
        assert resumed["config"]["amp"] == "fp16" and resumed["final"]["val_count"] == 20
        assert resumed["history"][0]["epoch"] == 1 and resumed["epoch"] == 2, resumed["history"]
        scales = [r["grad_scale"] for r in resumed["ranks"]]
        # 4 steps from 1024 with a growth interval of 2000: 1024 unless a step overflowed (halved).
        assert len(set(scales)) == 1 and scales[0] <= 1024.0, (backend, scales)
        assert_ranks_equal(resumed)
        assert all(r["channels_last"] for r in resumed["ranks"])
        assert len(list(ckpt.glob("*.pt"))) == 2, sorted(ckpt.iterdir())
    bf16 = [o for o in gpu_options if o != "--amp"] + ["--amp", "bf16"]
    lightning = train(tmp_path, "lightning", "lightning", bf16 + ["--epochs", "1"])
    assert lightning["global_step"] == 4
    assert all(r["channels_last"] for r in lightning["ranks"])
    assert_ranks_equal(lightning)
