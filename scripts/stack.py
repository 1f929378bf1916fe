"""What the Python environment of set-up already holds, asked by scripts/setup.sh.

Runs under the venv's python before hvdtrain is installed, so it imports nothing of hvdtrain:

    python scripts/stack.py frameworks      # "torch tf": the frameworks that import here
    python scripts/stack.py keep-pins       # pip constraints that keep what the site installed
    python scripts/stack.py version DIST    # a distribution's version, or "none"
    python scripts/stack.py horovod torch tf  # where Horovod comes from and whether its ops load
    python scripts/stack.py gpu auto|gpu|cpu  # "nccl|cpu<TAB>toolkit or -<TAB>why": Horovod's GPU ops
    python scripts/stack.py cuda-archs        # "75,80,...": the GPU architectures torch was built for
    python scripts/stack.py cuda-pypi-packages  # NVIDIA's PyPI compiler packages matching torch's CUDA
    python scripts/stack.py cuda-pypi-assemble DIR  # one toolkit tree from those packages, for CMake

Why a site's packages are pinned rather than left alone: pip resolves every requirement again
and would happily "upgrade" a site's CUDA torch to PyPI's build to satisfy some range; a
constraint `torch==<installed>` makes that impossible, and a real conflict an error.
"""
from __future__ import annotations

import importlib
import importlib.metadata as md
import os
import re
import shutil
import subprocess
import sys

# What a site provides and a user venv must never replace.
SITE_STACK = re.compile(r"^(torch|torchvision|torchaudio|tensorflow|tensorflow-cpu|tf-keras|keras|numpy|"
                        r"horovod|mpi4py|triton|jax|jaxlib|nvidia-.*|cuda-.*)$")


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _imports(module: str) -> bool:
    try:
        importlib.import_module(module)
        return True
    except Exception:  # noqa: BLE001 - any failure means "not usable here"
        return False


def frameworks() -> list[str]:
    found = []
    if _imports("torch") and _imports("torchvision"):
        found.append("torch")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    if _imports("tensorflow"):
        found.append("tf")
    return found


def keep_pins() -> list[str]:
    """`name==version` for every site-stack distribution visible to this interpreter (the venv's
    own site-packages, --system-site-packages and PYTHONPATH alike), first one found wins."""
    pins: dict[str, str] = {}
    for dist in md.distributions():
        name = dist.metadata.get("Name")
        if name and dist.version and SITE_STACK.match(_canonical(name)):
            pins.setdefault(_canonical(name), dist.version)
    return [f"{name}=={version}" for name, version in sorted(pins.items())]


def version(dist: str) -> str:
    try:
        return md.version(dist).split("+")[0]
    except md.PackageNotFoundError:
        return "none"


def horovod(wanted: list[str]) -> str:
    """One line: `none`, or `<venv|pythonpath|site> <version> <path> ok|missing:<what>` where <what> lists
    the framework ops or controllers that do not load."""
    try:
        import horovod as hvd_pkg
    except Exception:  # noqa: BLE001
        return "none"
    path = os.path.dirname(os.path.abspath(hvd_pkg.__file__))
    pythonpath = [os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if path.startswith((sys.prefix + os.sep, os.path.realpath(sys.prefix) + os.sep)):
        where = "venv"
    elif any(path.startswith(p + os.sep) for p in pythonpath):
        where = "pythonpath"  # a module's: it comes before the venv's own site-packages
    else:
        where = "site"
    missing = []
    modules = {"torch": "horovod.torch", "tf": "horovod.tensorflow"}
    for fw in wanted:
        try:
            mod = importlib.import_module(modules[fw])
            # The extension is loaded lazily by some versions: touch a function that needs it.
            mod.mpi_built()
        except Exception:  # noqa: BLE001
            missing.append(f"{fw}-ops")
    if not missing:
        mod = importlib.import_module(modules[wanted[0]]) if wanted else None
        if mod is not None and not (mod.mpi_built() or mod.gloo_built()):
            missing.append("controller")
    version_ = getattr(hvd_pkg, "__version__", "?")
    return f"{where} {version_} {path} {'ok' if not missing else 'missing:' + ','.join(missing)}"


def site_toolkit() -> str | None:
    """A CUDA toolkit the site provides: the one a module set (CUDA_HOME/CUDA_PATH), the nvcc on
    PATH, else the newest /usr/local/cuda-*. None when there is no nvcc anywhere."""
    candidates = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")]
    nvcc = shutil.which("nvcc")
    if nvcc:
        candidates.append(os.path.dirname(os.path.dirname(os.path.realpath(nvcc))))
    local = [os.path.join("/usr/local", d) for d in os.listdir("/usr/local") if d.startswith("cuda-")] \
        if os.path.isdir("/usr/local") else []
    candidates += sorted(local, key=_version_key, reverse=True) + ["/usr/local/cuda"]
    for d in candidates:
        if d and _is_toolkit(d):
            return d
    return None


def _is_toolkit(d: str) -> bool:
    # nvcc beside the runtime headers: a lone nvcc wrapper (this image's /usr/local/bin) is not one.
    headers = [os.path.join(d, "include", "cuda_runtime.h")]
    headers += [os.path.join(d, "targets", t, "include", "cuda_runtime.h")
                for t in (os.listdir(os.path.join(d, "targets")) if os.path.isdir(os.path.join(d, "targets")) else [])]
    return os.access(os.path.join(d, "bin", "nvcc"), os.X_OK) and any(map(os.path.exists, headers))


def _version_key(path: str) -> tuple:
    return tuple(int(x) for x in re.findall(r"\d+", os.path.basename(path)))


def torch_cuda() -> str | None:
    """The CUDA version torch was built for ("13.0"), None for a CPU-only torch or none."""
    try:
        import torch
    except Exception:  # noqa: BLE001
        return None
    return torch.version.cuda


def gpu_present() -> bool:
    smi = shutil.which("nvidia-smi")
    if not smi:
        return False
    try:
        return subprocess.run([smi, "-L"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def decide_gpu(want: str, cuda: str | None, toolkit: str | None, gpus: bool) -> tuple[str, str]:
    """Horovod's GPU operations for the nodes the jobs run on, not the node set-up runs on: a
    login node has no GPU but the same CUDA torch and CUDA module as the GPU nodes.

    want: "gpu" (--gpu), "cpu" (--cpu) or "auto". cuda: torch's CUDA version or None. toolkit: a
    site CUDA toolkit or None. gpus: whether nvidia-smi answers here. Returns (ops, why), ops
    "nccl" or "cpu"; with "nccl" and no toolkit set-up takes NVIDIA's from PyPI.
    """
    if want == "cpu":
        return "cpu", "asked for (--cpu)"
    if want == "gpu":
        if not cuda:
            raise SystemExit("--gpu: the torch here is a CPU-only build, so Horovod's NCCL ops could not take its "
                             "CUDA tensors; load the site's CUDA PyTorch module (or install a CUDA torch), "
                             "or use --cpu")
        return "nccl", f"asked for (--gpu); torch is a CUDA {cuda} build"
    if want != "auto":
        raise SystemExit(f"GPU choice '{want}' is not auto, gpu or cpu")
    if not cuda:
        return "cpu", "torch is a CPU-only build (or absent): no GPU tensors to reduce"
    if toolkit:
        return "nccl", (f"torch is a CUDA {cuda} build and a CUDA toolkit is at {toolkit}"
                        + ("" if gpus else " (no GPU on this node: built for the GPU nodes)"))
    if gpus:
        return "nccl", f"GPUs here, torch is a CUDA {cuda} build; no site CUDA toolkit, NVIDIA's from PyPI"
    return "cpu", (f"torch is a CUDA {cuda} build but no CUDA toolkit is loaded and no GPU is here: load the "
                   "CUDA module (or pass --gpu) on this login node for a build the GPU nodes can use")


def cuda_archs() -> str:
    """The compute capabilities torch was built for, as Horovod's HOROVOD_BUILD_CUDA_CC_LIST."""
    import torch

    return ",".join(a.split("_")[1] for a in torch.cuda.get_arch_list() if a.startswith("sm_"))


def cuda_pypi_packages(cuda: str) -> list[str]:
    """NVIDIA's compiler wheels for torch's CUDA version. From CUDA 13 the packages are named without
    a suffix and all install into nvidia/cu13; CUDA 12's carry -cu12."""
    major, minor = cuda.split(".")[:2]
    if int(major) >= 13:
        # nvcc's own dependencies (cicc, the crt headers) are unversioned: pin them to its release;
        # CCCL (nv/target, cuda/std) is what cuda_fp16.h includes.
        return [f"{name}=={major}.{minor}.*" for name in ("nvidia-cuda-nvcc", "nvidia-nvvm", "nvidia-cuda-crt",
                                                                "nvidia-cuda-cccl")]
    return [f"{name}-cu{major}=={major}.{minor}.*" for name in ("nvidia-cuda-nvcc", "nvidia-cuda-cccl")]


def cuda_pypi_assemble(dest: str) -> None:
    """Merge the bin/, nvvm/, include/ and lib/ folders of NVIDIA's packages (the venv's and a
    module's, wherever the `nvidia` namespace spreads) into one tree that CMake's FindCUDAToolkit
    and nvcc accept as CUDA_HOME. Programs are copied (nvcc finds its tools relative to its own
    file); headers and libraries are linked. Written beside dest and renamed: whole or absent."""
    import nvidia

    tmp = f"{dest}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    for root in nvidia.__path__:
        for package in sorted(os.listdir(root)):
            for part in ("bin", "nvvm", "include", "lib"):
                src = os.path.join(root, package, part)
                if os.path.isdir(src):
                    _merge(src, os.path.join(tmp, part), copy=part in ("bin", "nvvm"))
    lib = os.path.join(tmp, "lib")
    for name in os.listdir(lib) if os.path.isdir(lib) else []:
        m = re.match(r"^(libcudart|libnccl)\.so\.\d+$", name)
        if m and not os.path.lexists(os.path.join(lib, m.group(1) + ".so")):
            os.symlink(name, os.path.join(lib, m.group(1) + ".so"))
    os.symlink("lib", os.path.join(tmp, "lib64"))
    if not os.access(os.path.join(tmp, "bin", "nvcc"), os.X_OK) or not _is_toolkit(tmp):
        raise SystemExit(f"NVIDIA's PyPI packages gave no nvcc with the runtime headers (in {nvidia.__path__})")
    shutil.rmtree(dest, ignore_errors=True)
    os.rename(tmp, dest)


def _merge(src: str, dst: str, copy: bool) -> None:
    for dirpath, _, files in os.walk(src):
        out = os.path.join(dst, os.path.relpath(dirpath, src))
        os.makedirs(out, exist_ok=True)
        for name in files:
            target = os.path.join(out, name)
            if os.path.lexists(target):
                continue  # the first package holding a file wins
            if copy:
                shutil.copy2(os.path.join(dirpath, name), target)
            else:
                os.symlink(os.path.join(dirpath, name), target)


def main(argv: list[str]) -> None:
    cmd, args = argv[0], argv[1:]
    if cmd == "frameworks":
        print(" ".join(frameworks()))
    elif cmd == "keep-pins":
        print("\n".join(keep_pins()))
    elif cmd == "version":
        print(version(args[0]))
    elif cmd == "horovod":
        print(horovod(args))
    elif cmd == "gpu":
        toolkit = site_toolkit()
        ops, why = decide_gpu(args[0] if args else "auto", torch_cuda(), toolkit, gpu_present())
        print(f"{ops}\t{toolkit or '-'}\t{why}")
    elif cmd == "cuda-archs":
        print(cuda_archs())
    elif cmd == "cuda-pypi-packages":
        print(" ".join(cuda_pypi_packages(torch_cuda() or "")))
    elif cmd == "cuda-pypi-assemble":
        cuda_pypi_assemble(args[0])
    else:
        sys.exit(f"unknown command {cmd}")


if __name__ == "__main__":
    main(sys.argv[1:])
