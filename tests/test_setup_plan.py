"""Set-up's decisions that are made in Python (scripts/stack.py), as fast tests: which GPU ops
Horovod is built with, for the nodes the jobs run on rather than the node set-up runs on."""
import os
import sys

import pytest

from conftest import REPO

sys.path.insert(0, os.path.join(REPO, "scripts"))
import stack  # noqa: E402


def test_login_node_with_cuda_torch_and_toolkit_builds_nccl():
    # JUWELS/Jean Zay login node: CUDA PyTorch and CUDA modules loaded, no GPU, no nvidia-smi.
    ops, why = stack.decide_gpu("auto", cuda="13.0", toolkit="/opt/cuda/13.0", gpus=False)
    assert ops == "nccl" and "CUDA 13.0 build" in why and "/opt/cuda/13.0" in why and "no GPU on this node" in why


def test_cpu_torch_builds_cpu_ops():
    assert stack.decide_gpu("auto", cuda=None, toolkit="/opt/cuda/13.0", gpus=False)[0] == "cpu"
    assert stack.decide_gpu("auto", cuda=None, toolkit=None, gpus=True)[0] == "cpu"


def test_cpu_flag_wins():
    assert stack.decide_gpu("cpu", cuda="13.0", toolkit="/opt/cuda", gpus=True) == ("cpu", "asked for (--cpu)")


def test_cuda_torch_without_toolkit():
    # No CUDA module on a login node: CPU ops, and the line says what to load.
    ops, why = stack.decide_gpu("auto", cuda="13.0", toolkit=None, gpus=False)
    assert ops == "cpu" and "load the CUDA module" in why and "--gpu" in why
    # On a GPU node (nvidia-smi answers) or with --gpu: NCCL, with NVIDIA's toolkit from PyPI.
    assert stack.decide_gpu("auto", cuda="13.0", toolkit=None, gpus=True)[0] == "nccl"
    assert stack.decide_gpu("gpu", cuda="13.0", toolkit=None, gpus=False)[0] == "nccl"


def test_gpu_flag_with_a_cpu_torch_is_refused():
    with pytest.raises(SystemExit, match="CPU-only build"):
        stack.decide_gpu("gpu", cuda=None, toolkit=None, gpus=False)
    with pytest.raises(SystemExit, match="not auto, gpu or cpu"):
        stack.decide_gpu("nvidia", cuda="13.0", toolkit=None, gpus=False)


def test_pypi_toolkit_matches_torchs_cuda():
    assert stack.cuda_pypi_packages("13.0") == ["nvidia-cuda-nvcc==13.0.*", "nvidia-nvvm==13.0.*",
                                                 "nvidia-cuda-crt==13.0.*", "nvidia-cuda-cccl==13.0.*"]
    assert stack.cuda_pypi_packages("12.8") == ["nvidia-cuda-nvcc-cu12==12.8.*", "nvidia-cuda-cccl-cu12==12.8.*"]


def test_a_lone_nvcc_is_not_a_toolkit(tmp_path, monkeypatch):
    # This image's /usr/local/bin/nvcc is a wrapper script: its folder has no CUDA headers.
    wrapper = tmp_path / "wrap"
    (wrapper / "bin").mkdir(parents=True)
    (wrapper / "bin" / "nvcc").write_text("#!/bin/sh\n")
    (wrapper / "bin" / "nvcc").chmod(0o755)
    assert not stack._is_toolkit(str(wrapper))
    (wrapper / "targets" / "x86_64-linux" / "include").mkdir(parents=True)
    (wrapper / "targets" / "x86_64-linux" / "include" / "cuda_runtime.h").write_text("")
    assert stack._is_toolkit(str(wrapper))
    monkeypatch.setenv("CUDA_HOME", str(wrapper))
    assert stack.site_toolkit() == str(wrapper)   # a module's CUDA_HOME comes first
