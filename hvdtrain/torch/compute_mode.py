"""How a rank's device runs the model: mixed precision, memory format and CUDA's math switches.

Each is a choice of the configuration that runs on a CPU as well as on a GPU (torch autocasts to
fp16 and bf16 on CPUs, and GradScaler works there), so that the CPU test suite runs the options of
the GPU job scripts: a branch taken only `if cuda` is a branch no test runs. What has no CPU twin
is `cuda_math` alone (docs/gpu.md lists every GPU-only line).

    autocast(cfg.amp, device); grad_scaler(cfg.amp, device); channels_last(cfg, device)
"""
from __future__ import annotations

import os

import torch

from hvdtrain.torch.models import CHANNELS_LAST_MODELS

AUTOCAST_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


def autocast(amp: str, device: torch.device):
    """The forward pass's context: autocast to --amp's type, or nothing (--amp off)."""
    return torch.autocast(device.type, dtype=AUTOCAST_DTYPES.get(amp, torch.float32), enabled=amp != "off")


def grad_scaler(amp: str, device: torch.device) -> torch.amp.GradScaler | None:
    """fp16's loss scaling (fp16 underflows small gradients); bf16 has float32's range and needs none."""
    return torch.amp.GradScaler(device.type) if amp == "fp16" else None


def channels_last(choice: str, model: str, device: torch.device, use_adasum: bool = False) -> bool:
    """--channels-last: on, off, or auto, which is on for the ResNets on a CUDA GPU (cuDNN's
    convolutions are faster on NHWC tensors with AMP) and off on CPUs and under Adasum (whose
    optimizer reduces the parameters' own storage, which Horovod needs contiguous)."""
    if choice != "auto":
        return choice == "on"
    return device.type == "cuda" and model in CHANNELS_LAST_MODELS and not use_adasum


def cuda_math(device: torch.device, deterministic: bool = False) -> dict:
    """GPU only: cuDNN picks the fastest convolution algorithms for the input shapes it sees (the
    trainer's batches have one shape), and fp32 matmuls and convolutions use TF32 tensor cores
    (Ampere and later; what torch's defaults leave off for matmuls). `deterministic` (--deterministic):
    no autotuning (two runs, or two ranks' processes, may pick different algorithms), cuDNN's
    deterministic ones. Returned for the log."""
    if device.type != "cuda":
        return {}
    torch.backends.cudnn.benchmark = not deterministic
    torch.backends.cudnn.deterministic = deterministic
    torch.backends.cuda.matmul.allow_tf32 = True  # TF32 rounds, but the same way every time
    torch.backends.cudnn.allow_tf32 = True
    return {"cudnn_benchmark": not deterministic, "tf32": True, "deterministic": deterministic}


def deterministic_kernels(on: bool) -> None:
    """--deterministic, on every device: torch's deterministic implementations, a warning where an
    op has none (ResNet's adaptive pooling backward on CUDA); cuBLAS needs a fixed workspace for
    it, set before its first call (the trainer's device set-up comes first)."""
    if not on:
        return
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=True)
