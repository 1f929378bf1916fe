"""scripts/setup.sh as the users run it on clusters: no root, no apt, modules on PATH and
PYTHONPATH, a personal venv layered on top; and a failing step that must stop set-up.

The "cluster" is imitated on this machine (see ../shared/notes/environment.md): an ordinary user
made with useradd, a PATH of links to /usr/bin and /usr/sbin without apt*/dpkg* (and without
/usr/local, where this image keeps a CUDA toolkit), Debian's python3.11 as the module's Python,
and a "site module" directory holding torch, TensorFlow (and for one test Horovod) that reaches
Python through PYTHONPATH, as `module load` does. Nothing is mocked: set-up runs for real.
"""
from __future__ import annotations

import hashlib
import os
import pwd
import re
import shutil
import subprocess
import sys
import tempfile

import pytest

from conftest import REPO

pytestmark = pytest.mark.slow

USER = "hvdtrain-ci"
SITE_PACKAGES = os.path.join(sys.prefix, "lib", f"python{sys.version_info[0]}.{sys.version_info[1]}",
                             "site-packages")
CACHE = os.environ.get("HVDTRAIN_CACHE", os.path.expanduser("~/.cache/hvdtrain"))
MODULE_PYTHON = "/usr/bin/python3.11"


def sh(cmd, timeout=120, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)


@pytest.fixture(scope="module")
def cluster_user():
    if os.geteuid() != 0:
        pytest.skip("needs root to create the unprivileged user")
    try:
        pwd.getpwnam(USER)
    except KeyError:
        sh(["useradd", "-m", USER]).check_returncode()
    return USER


@pytest.fixture(scope="module")
def cluster_root(cluster_user):
    """A world-readable tree: bin/ (the PATH), a copy of the repository the user owns, and the
    site modules (hard links into this venv's site-packages: instant, and shared read-only)."""
    root = tempfile.mkdtemp(prefix="hvdtrain-cluster-", dir="/tmp")
    os.chmod(root, 0o755)
    # bin/: the system's commands without apt/dpkg; bin-nompi/: also without any MPI.
    for bin_name, hidden in (("bin", ("apt", "dpkg")), ("bin-nompi", ("apt", "dpkg", "mpi", "ompi", "orte", "oshmem"))):
        bin_dir = os.path.join(root, bin_name)
        os.mkdir(bin_dir)
        for d in ("/usr/bin", "/usr/sbin"):
            for name in os.listdir(d):
                if name.startswith(hidden) or os.path.lexists(os.path.join(bin_dir, name)):
                    continue
                os.symlink(os.path.join(d, name), os.path.join(bin_dir, name))
    files = sh(["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO).stdout.split()
    repo = os.path.join(root, "repo")
    for f in files:
        if os.path.isfile(os.path.join(REPO, f)):
            os.makedirs(os.path.dirname(os.path.join(repo, f)), exist_ok=True)
            shutil.copy2(os.path.join(REPO, f), os.path.join(repo, f))
    # module-horovod-unpatched: Horovod 0.28.1 as a site builds it, without hvdtrain's Keras 3 patch
    # (the patch is Python only: taken back out of a copy of ours, its compiled ops kept).
    for flavour, with_horovod in (("module-frameworks", False), ("module-horovod", True),
                                  ("module-horovod-unpatched", True)):
        site = os.path.join(root, flavour, "site-packages")
        os.makedirs(site)
        for name in os.listdir(SITE_PACKAGES):
            low = name.lower()
            if low.startswith(("hvdtrain", "__editable__", "_hvdtrain")) or low.endswith(".pth"):
                continue
            if low.startswith("horovod") and not with_horovod:
                continue
            src, dst = os.path.join(SITE_PACKAGES, name), os.path.join(site, name)
            copy = "-a" if flavour.endswith("unpatched") and name == "horovod" else "-al"  # the patched files change
            sh(["cp", copy, src, dst]).check_returncode()
        if flavour.endswith("unpatched"):
            with open(os.path.join(REPO, "scripts", "horovod-keras3.patch")) as patch:
                subprocess.run(["patch", "-R", "-p1", "--batch", "--quiet", "-d", site], stdin=patch,
                               check=True, timeout=60)
        if with_horovod:
            # A Horovod module also puts horovodrun on PATH.
            mbin = os.path.join(root, flavour, "bin")
            os.mkdir(mbin)
            with open(os.path.join(mbin, "horovodrun"), "w") as f:
                f.write(f"#!{MODULE_PYTHON}\nfrom horovod.runner.launch import run_commandline\nrun_commandline()\n")
            os.chmod(os.path.join(mbin, "horovodrun"), 0o755)
    sh(["chown", "-R", f"{cluster_user}:", repo]).check_returncode()
    yield root
    # Removed in the background: some 100,000 links, 6 s the next tests need not wait for.
    subprocess.Popen(["rm", "-rf", root], start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def as_user(user: str, root: str, module: str, command: str, extra_env: dict | None = None,
            timeout: float = 600, hide_cuda: bool = False, no_mpi: bool = False) -> subprocess.CompletedProcess:
    """Run `command` (bash) as `user` with the module environment of `module`. hide_cuda: no CUDA
    toolkit anywhere; no_mpi: no MPI command on PATH and Debian's Open MPI components hidden."""
    home = pwd.getpwnam(user).pw_dir
    path = [os.path.join(root, module, "bin"), os.path.join(root, "bin-nompi" if no_mpi else "bin")]
    # As a module file does, LD_LIBRARY_PATH names the module's libraries: the copied Horovod's
    # NCCL ops were linked with a run path into root's venv, which this user cannot read.
    env = {"HOME": home, "USER": user, "LANG": "C.UTF-8", "PATH": os.pathsep.join(path),
           "PYTHONPATH": os.path.join(root, module, "site-packages"), "PYTHON": MODULE_PYTHON,
           "LD_LIBRARY_PATH": os.path.join(root, module, "site-packages", "nvidia", "nccl", "lib"),
           "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": "", **(extra_env or {})}
    env.update({k: v for k, v in os.environ.items() if k.startswith("PIP_")})
    env_args = [f"{k}={v}" for k, v in env.items()]
    inner = ["runuser", "-u", user, "--", "env", "-i", *env_args, "bash", "-c", command]
    if hide_cuda or no_mpi:
        # This image ships a CUDA toolkit and Open MPI that a CPU cluster node (or a laptop, a
        # container) lacks: hide them in a private mount namespace for this command only.
        dirs = []
        if hide_cuda:
            # CMake also looks in /usr/local/bin, whatever PATH says: hide that folder too.
            dirs += ["/usr/local/cuda-*", "/usr/local/bin"]
        if no_mpi:
            dirs += ["/usr/lib/x86_64-linux-gnu/openmpi", "/usr/include/x86_64-linux-gnu/openmpi"]
        hide = ("set -e; mount --make-rprivate /; e=$(mktemp -d); chmod 755 \"$e\"; "
                f"for d in {' '.join(dirs)}; do [ -d \"$d\" ] && mount --bind \"$e\" \"$d\"; done; "
                "exec \"$@\"")
        inner = ["unshare", "--mount", "--", "bash", "-c", hide, "hide", *inner]
    return subprocess.run(inner, capture_output=True, text=True, timeout=timeout, cwd=root)


def check_build_marks(output: str, marks=("TensorFlow", "PyTorch", "MPI", "Gloo")) -> None:
    for fw in marks:
        assert f"[X] {fw}" in output, f"{fw} not marked:\n{output[-4000:]}"


# What makes set-up build another Horovod (or venv): a cache made by an earlier run of a test is
# reused only while these are unchanged, and always made afresh on a cold machine. Unchanged as
# the build sees them (build_input): a comment, a docstring or an extra the tests do not install
# is no reason for two Horovod builds (about 9 minutes).
BUILD_INPUTS = ["scripts/setup.sh", "scripts/stack.py", "scripts/setup_plan.py", "scripts/patch-horovod.sh",
                "scripts/horovod-keras3.patch", "scripts/env.sh", "constraints/debian12-py311.txt",
                "pyproject.toml"]
TESTED_EXTRAS = "test,tf,tf-gpu,torch,compare"  # what setup_plan.extras_for gives the tests' set-ups


def build_input(path: str, data: bytes) -> bytes:
    """`path`'s contents as set-up uses them: Python without comments and docstrings (its syntax
    tree), shell without its comment lines, pyproject.toml's install inputs, the lock's pins."""
    import ast

    sys.path.insert(0, os.path.join(REPO, "scripts"))
    import setup_plan

    if path.endswith(".py"):
        tree = ast.parse(data)
        for node in ast.walk(tree):
            body = getattr(node, "body", None)
            if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                    and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
                node.body = body[1:] or [ast.Pass()]
        return ast.dump(tree).encode()
    if path.endswith(".sh"):
        return b"\n".join(line for line in data.splitlines() if line.strip() and not line.lstrip().startswith(b"#"))
    if path == "pyproject.toml":
        return setup_plan.install_inputs(data, TESTED_EXTRAS)
    if path.endswith(".txt"):
        return setup_plan.without_comments(data)
    return data


def test_a_comment_in_a_set_up_input_keeps_the_cached_builds():
    """The set-up tests' build key (fast tier): a comment, a docstring or an untested extra leaves
    it as it is; code, a pin or a dependency changes it."""
    code = b'"""Doc."""\nimport os\n\n\ndef f():\n    """What f does."""\n    return 1  # one\n'
    shell = b"#!/usr/bin/env bash\n# Set up.\nset -e\necho hi\n"
    same = [("scripts/stack.py", code, code.replace(b"# one", b"# uno").replace(b"What f does", b"What it does")),
            ("scripts/setup.sh", shell, shell.replace(b"# Set up.", b"# Set everything up.")),
            ("constraints/debian12-py311.txt", b"torch==2.14.1\n", b"# the pins\ntorch==2.14.1\n"),
            ("pyproject.toml", b"[project.optional-dependencies]\ntorch = [\"torch\"]\n",
             b"[project.optional-dependencies]\ntorch = [\"torch\"]\ndali = [\"nvidia-dali-cuda130\"]\n")]
    for path, before, after in same:
        assert build_input(path, before) == build_input(path, after), path
    changed = [("scripts/stack.py", code, code.replace(b"return 1", b"return 2")),
               ("scripts/setup.sh", shell, shell.replace(b"echo hi", b"echo ho")),
               ("constraints/debian12-py311.txt", b"torch==2.14.1\n", b"torch==2.15.0\n"),
               ("pyproject.toml", b"[project.optional-dependencies]\ntorch = [\"torch\"]\n",
                b"[project.optional-dependencies]\ntorch = [\"torch>=2.4\"]\n")]
    for path, before, after in changed:
        assert build_input(path, before) != build_input(path, after), path


CACHE_NAMES = ("build", "pypi-gpu", "site", "unpatched")  # each BuildCache of the tests below


def build_key() -> str:
    digest = hashlib.sha256()
    for f in BUILD_INPUTS:
        with open(os.path.join(REPO, f), "rb") as fh:
            digest.update(f.encode() + b"\0" + build_input(f, fh.read()) + b"\0")
    return digest.hexdigest()


def _cache_paths(home: str, name: str) -> tuple[str, str]:
    """A BuildCache's directory and the stamp of the inputs it was built from."""
    return f"{home}/cache-{name}", f"{home}/cache-{name}.inputs"


def _kept(home: str, name: str, key: str) -> bool:
    path, stamp = _cache_paths(home, name)
    return os.path.isdir(path) and os.path.exists(stamp) and open(stamp).read() == key


def builds_kept() -> bool:
    """Whether this file's tests will find every cache kept (nothing to build: a warm machine
    whose set-up inputs did not change); read only, for tests/side_lane.py's balance."""
    try:
        home = pwd.getpwnam(USER).pw_dir
    except KeyError:  # no test user yet: a cold machine
        return False
    key = build_key()
    return all(_kept(home, name, key) for name in CACHE_NAMES)


class BuildCache:
    """A test's set-up cache ($HVDTRAIN_CACHE), emptied unless the last run that filled it passed
    with the same build inputs. `fresh` says whether set-up builds from nothing this time."""

    def __init__(self, user: str, name: str):
        assert name in CACHE_NAMES, name
        self.key = build_key()
        home = pwd.getpwnam(user).pw_dir
        self.path, self.stamp = _cache_paths(home, name)
        self.fresh = not _kept(home, name, self.key)
        if self.fresh:
            shutil.rmtree(self.path, ignore_errors=True)
            if os.path.exists(self.stamp):
                os.remove(self.stamp)

    def passed(self) -> None:
        with open(self.stamp, "w") as f:
            f.write(self.key)


# A cold cache builds Horovod (and downloads) inside: longer than the suite's 600 s default.
@pytest.mark.timeout(1800)
def test_no_apt_and_no_cuda_toolkit_builds_horovod(cluster_user, cluster_root):
    """Non-root, no apt/dpkg on PATH, Open MPI on PATH, no CUDA toolkit anywhere, torch (a CUDA
    build) and TF from a module: set-up decides on CPU ops and says why, builds Horovod itself
    and check-build's table marks TensorFlow, PyTorch, MPI and Gloo (not NCCL). The build is redone
    whenever set-up's inputs changed (BUILD_INPUTS), and always on a cold machine."""
    probe = as_user(cluster_user, cluster_root, "module-frameworks",
                    "id -u; command -v apt-get dpkg apt dpkg-query || echo no-apt; command -v nvcc || echo no-nvcc; "
                    "ls /usr/local/cuda/bin/nvcc 2>&1 || true; command -v mpicc mpirun", hide_cuda=True)
    assert probe.stdout.split()[0] != "0" and "no-apt" in probe.stdout and "no-nvcc" in probe.stdout, probe
    assert "No such file" in probe.stdout and "/mpicc" in probe.stdout, probe.stdout
    cache = BuildCache(cluster_user, "build")
    run = as_user(cluster_user, cluster_root, "module-frameworks",
                  f"HVDTRAIN_CACHE={cache.path} bash repo/scripts/setup.sh", timeout=1500, hide_cuda=True)
    out = run.stdout + run.stderr
    print(out)  # shown by pytest -rP: what a user of such a machine sees
    assert run.returncode == 0, out[-6000:]
    assert "cluster mode: nothing is installed system-wide" in out
    assert ("GPU ops: cpu -- torch is a CUDA 13.0 build but no CUDA toolkit is loaded and no GPU is here: "
            "load the CUDA module") in out, out[-3000:]
    built = "step 'horovod-build': building horovod-0.28.1-torch" if cache.fresh else "step 'horovod-build': cached wheel"
    assert built in out and "-cpu-p" in out, out[-3000:]
    check_build_marks(out)
    assert "[X] NCCL" not in out, out[-3000:]
    assert not re.search(r"\b(apt|apt-get|dpkg|dpkg-query)\b", out), "set-up mentioned apt/dpkg on a machine without them:\n" + out
    cache.passed()


# A cold cache builds Horovod (and downloads) inside: longer than the suite's 600 s default.
@pytest.mark.timeout(1800)
def test_pypi_gpu_build_without_mpi_or_cuda_toolkit(cluster_user, cluster_root):
    """A GPU box without modules (or a container): no MPI and no CUDA toolkit anywhere, torch (a
    CUDA build) from a module. `setup.sh --gpu` installs Open MPI 5 from PyPI into the venv and
    NVIDIA's compiler from PyPI, builds Horovod with NCCL against both; check-build marks NCCL,
    horovod.torch imports on this GPU-less machine with nccl_built() true, the doctor reports the
    build and that MPI, and digits trains under that MPI's mpirun and horovodrun at np 2."""
    probe = as_user(cluster_user, cluster_root, "module-frameworks",
                    "command -v mpicc mpirun mpiexec nvcc || echo none; ls /usr/lib/x86_64-linux-gnu/openmpi | wc -l",
                    hide_cuda=True, no_mpi=True)
    assert probe.stdout.split() == ["none", "0"], probe
    cache = BuildCache(cluster_user, "pypi-gpu")
    venv = f"{cache.path}/venv-py311"
    run = as_user(cluster_user, cluster_root, "module-frameworks",
                  f"HVDTRAIN_CACHE={cache.path} bash repo/scripts/setup.sh --frameworks torch --gpu",
                  timeout=1500, hide_cuda=True, no_mpi=True)
    out = run.stdout + run.stderr
    print(out)
    assert run.returncode == 0, out[-6000:]
    assert "MPI: Open MPI from PyPI into the venv (no mpicc on PATH)" in out, out[-3000:]
    assert "GPU ops: nccl -- asked for (--gpu); torch is a CUDA 13.0 build" in out, out[-3000:]
    assert f"CUDA toolkit from PyPI at {cache.path}/cuda-pypi-13.0" in out or "step 'cuda-pypi' done" in out, out[-3000:]
    assert re.search(r"horovod-0\.28\.1-torch[\d.]+-tfnone-py311-openmpi5[\d.]+-nccl-cu13\.0-p", out), out[-3000:]
    check_build_marks(out, ("PyTorch", "MPI", "Gloo", "NCCL"))
    # The CUDA kernels were compiled for torch's own architectures: the build log (kept in the cache
    # with the wheel) holds Horovod's nvcc flags with one -gencode per compute capability of the
    # list the plan gave, the highest also as PTX -- not an empty flag line.
    with open(f"{cache.path}/logs/horovod-build.log") as f:
        log = f.read()
    cc_list = re.search(r"^HOROVOD_BUILD_CUDA_CC_LIST=([0-9,]+)$", log, re.M).group(1).split(",")
    flags = re.search(r"HVD_NVCC_COMPILE_FLAGS = (.*)", log).group(1)
    assert flags.startswith("-O3 -Xcompiler -fPIC -gencode "), flags
    gencode = re.findall(r"-gencode arch=compute_(\d+),code=", flags)
    assert gencode == cc_list and len(cc_list) >= 3, (cc_list, flags)
    assert f'code=\\"sm_{cc_list[-1]},compute_{cc_list[-1]}\\"' in flags, flags
    assert re.search(r"/nvcc .*-gencode arch=compute_\d+,code=sm_\d+ .*cuda_kernels\.cu", log), "nvcc ran without -gencode"

    code = "import horovod.torch as hvd; print('BUILT', *(bool(f()) for f in (hvd.nccl_built, hvd.cuda_built, hvd.mpi_built)))"
    built = as_user(cluster_user, cluster_root, "module-frameworks", f"{venv}/bin/python -c \"{code}\"",
                    hide_cuda=True, no_mpi=True, timeout=120)
    assert "BUILT True True True" in built.stdout, built.stdout + built.stderr
    mpirun = f"{venv}/bin/mpirun -np 2 --oversubscribe"
    doctor = as_user(cluster_user, cluster_root, "module-frameworks",
                     f"cd repo && timeout 120 {mpirun} {venv}/bin/python -m hvdtrain.doctor --framework torch "
                     "--slow-fraction 0.9",  # its evenness is not the subject (test_doctor.py's LENIENT)
                     hide_cuda=True, no_mpi=True, timeout=180)
    dout = doctor.stdout + doctor.stderr
    assert doctor.returncode == 0, dout[-4000:]
    assert "built: MPI yes, Gloo yes, NCCL yes, CUDA yes" in dout and "MPI: Open MPI v5" in dout, dout[-4000:]
    assert "hvdtrain.doctor: READY: 2 rank(s)" in dout, dout[-4000:]
    for launch in (mpirun, f"{venv}/bin/horovodrun -np 2 -H localhost:2"):
        train = as_user(cluster_user, cluster_root, "module-frameworks",
                        f"cd repo && PATH={venv}/bin:$PATH timeout 300 {launch} {venv}/bin/python -m hvdtrain.torch "
                        f"--model mnist_cnn --dataset digits --optimizer adam --base-lr 0.003 --epochs 4 "
                        f"--threads-per-rank 1 --result-json {cache.path}/digits.json "
                        f"&& {venv}/bin/python -c \"import json; r = json.load(open('{cache.path}/digits.json')); "
                        "print('ACC', r['final']['val_acc'], r['world_size'])\"",
                        hide_cuda=True, no_mpi=True, timeout=360)
        assert train.returncode == 0, (launch, (train.stdout + train.stderr)[-4000:])
        acc, world = train.stdout.split("ACC")[-1].split()
        assert world == "2" and float(acc) > 0.85, (launch, train.stdout[-2000:])
    cache.passed()


def _stack(user, root, module, venv) -> str:
    """Where each framework would be imported from, and its version: found as `import` finds it,
    without importing (torch and TensorFlow cost seconds each; set-up's check-build and the
    training below import them for real)."""
    code = ("import importlib.util as u, importlib.metadata as m; "
            "print(*[f'{n} {u.find_spec(n).origin} {m.version(d)}' for n, d in (('torch', 'torch'), "
            "('torchvision', 'torchvision'), ('tensorflow', 'tensorflow'), ('horovod', 'horovod'))])")
    return as_user(user, root, module, f"{venv}/bin/python -c \"{code}\"" if venv else f"{MODULE_PYTHON} -c \"{code}\"",
                   timeout=120).stdout.strip()


def test_site_module_is_kept_and_trains(cluster_user, cluster_root):
    """torch, TF and a working Horovod from a module; set-up layers a venv on them, installs
    hvdtrain without reinstalling any of them, and a 2-rank digits run under mpirun passes. The
    venv is made afresh whenever set-up's inputs changed (BUILD_INPUTS) and on a cold machine;
    otherwise the last passing run's is kept, as a user's second set-up keeps it (30 s less)."""
    home = pwd.getpwnam(cluster_user).pw_dir
    cache = BuildCache(cluster_user, "site")
    before = _stack(cluster_user, cluster_root, "module-horovod", None)
    assert "module-horovod/site-packages/torch" in before and "module-horovod/site-packages/horovod" in before, before
    run = as_user(cluster_user, cluster_root, "module-horovod", f"HVDTRAIN_CACHE={cache.path} bash repo/scripts/setup.sh")
    out = run.stdout + run.stderr
    print(out)  # shown by pytest -rP: what a user of such a machine sees
    assert run.returncode == 0, out[-6000:]
    made = "step 'venv-create' done" if cache.fresh else f"step 'venv': {cache.path}/venv-py311 up to date (cluster"
    assert made in out, out[-3000:]
    assert "step 'horovod': using the site's Horovod as it is: pythonpath 0.28.1" in out, out[-3000:]
    assert "horovod-build" not in out and "horovod-install" not in out, out[-3000:]
    check_build_marks(out)
    venv = f"{cache.path}/venv-py311"
    assert _stack(cluster_user, cluster_root, "module-horovod", venv) == before  # same files, same versions
    listed = as_user(cluster_user, cluster_root, "module-horovod",
                     f"ls {venv}/lib/python3.11/site-packages").stdout.split()
    assert not [p for p in listed if p.lower().startswith(("torch", "tensorflow", "horovod"))], listed

    train = as_user(cluster_user, cluster_root, "module-horovod",
                    f"cd repo && timeout 300 mpirun -np 2 --bind-to none --oversubscribe {venv}/bin/python -m hvdtrain.torch "
                    f"--model mnist_cnn --dataset digits --optimizer adam --base-lr 0.003 --epochs 4 --threads-per-rank 1 "
                    f"--result-json {home}/site.json "
                    f"&& {venv}/bin/python -c \"import json; r = json.load(open('{home}/site.json')); "
                    "print('ACC', r['final']['val_acc'], r['world_size'])\"", timeout=360)
    assert train.returncode == 0, (train.stdout + train.stderr)[-4000:]
    acc, world = train.stdout.split("ACC")[-1].split()
    assert world == "2" and float(acc) > 0.85, train.stdout[-2000:]
    cache.passed()


def test_site_horovod_failing_keras3_is_not_kept_silently(cluster_user, cluster_root):
    """A TensorFlow module whose Horovod 0.28.1 lacks the Keras 3 fixes (as IDRIS reported on
    Horovod's tracker, issue 4290): set-up checks it as users use it. `--plan` prints the plan
    alone (no framework log lines) and stops there in one line naming the failure and both ways
    out; `--horovod site` keeps it, saying what will fail, and hvdtrain's own TF trainer runs on it."""
    cache = BuildCache(cluster_user, "unpatched")  # its venv kept as the site module test's is
    plan = as_user(cluster_user, cluster_root, "module-horovod-unpatched",
                   f"HVDTRAIN_CACHE={cache.path} bash repo/scripts/setup.sh --plan", timeout=300)
    out = plan.stdout + plan.stderr
    assert plan.returncode == 0, out[-4000:]
    assert out.startswith("[setup] plan (nothing was changed)"), out[:2000]   # no TF/absl lines before it
    stop = [line for line in out.splitlines() if line.startswith("  horovod       STOP: ")]
    assert len(stop) == 1 and ("fails in use (AttributeError: 'Variable' object has no attribute 'ref')" in stop[0]
                               and stop[0].endswith("or keep it with --horovod site")), out[-3000:]

    run = as_user(cluster_user, cluster_root, "module-horovod-unpatched",
                  f"HVDTRAIN_CACHE={cache.path} bash repo/scripts/setup.sh --horovod site", timeout=900)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-6000:]
    assert ("using the site's Horovod as asked (--horovod site) although it fails in use (AttributeError: "
            "'Variable' object has no attribute 'ref')") in out, out[-3000:]
    assert "horovod-build" not in out, out[-3000:]
    home = pwd.getpwnam(cluster_user).pw_dir
    train = as_user(cluster_user, cluster_root, "module-horovod-unpatched",
                    f"cd repo && timeout 300 mpirun -np 2 --bind-to none --oversubscribe "
                    f"{cache.path}/venv-py311/bin/python -m hvdtrain.tf --model mnist_cnn --dataset digits "
                    f"--epochs 1 --steps 12 --threads-per-rank 1 --result-json {home}/unpatched.json", timeout=360)
    assert train.returncode == 0, (train.stdout + train.stderr)[-4000:]
    # A user's GradientTape loop through hvdtrain.tf.start_tape_loop runs on it too (job.tape hands
    # Horovod the tf.Variables); Horovod's own DistributedGradientTape on Keras 3 variables would not.
    tape = as_user(cluster_user, cluster_root, "module-horovod-unpatched",
                   f"rm -rf {home}/unpatched-tape && cd repo && timeout 300 mpirun -np 2 --bind-to none --oversubscribe "
                   f"{cache.path}/venv-py311/bin/python tf_examples/tape_loop_digits.py --epochs 1 "
                   f"--checkpoint-dir {home}/unpatched-tape", timeout=360)
    assert tape.returncode == 0 and "val_accuracy=" in tape.stdout, (tape.stdout + tape.stderr)[-4000:]
    cache.passed()


def test_failing_step_stops_setup_and_leaves_no_stamp(tmp_path):
    """A command failing in the middle of a step (pip cannot reach its index) stops set-up
    naming the step, writes no stamp, and the next run does the step again."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(HVDTRAIN_CACHE=str(tmp_path / "cache"), HVDTRAIN_VENV=str(tmp_path / "venv"),
               PIP_CONFIG_FILE=os.devnull, PIP_INDEX_URL="http://127.0.0.1:9/simple", PIP_RETRIES="0",
               PIP_TIMEOUT="2", PIP_NO_CACHE_DIR="1")
    for attempt in (1, 2):
        run = subprocess.run(["bash", os.path.join(REPO, "scripts", "setup.sh"), "--cluster"], env=env,
                             capture_output=True, text=True, timeout=300)
        out = run.stdout + run.stderr
        assert run.returncode != 0, out
        assert "step 'venv' FAILED" in out and "step 'venv' failed: see" in out, (attempt, out[-3000:])
        assert "up to date" not in out, (attempt, out)
        assert not (tmp_path / "venv" / ".hvdtrain-deps").exists(), attempt


def test_check_build_table_is_horovodruns():
    """Set-up prints `horovodrun --check-build`'s table from scripts/stack.py (each framework
    loaded once instead of once per question): the same table, line for line, as Horovod's."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    # Both at once: each is one process at a time (Horovod's asks its questions in turn), and
    # two cores are here.
    theirs = subprocess.Popen([os.path.join(sys.prefix, "bin", "horovodrun"), "--check-build"], env=env, cwd="/tmp",
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        ours = sh([sys.executable, os.path.join(REPO, "scripts", "stack.py"), "check-build"], timeout=300, env=env,
                  cwd="/tmp")
        out, err = theirs.communicate(timeout=300)
    finally:
        theirs.kill()
    horovods = subprocess.CompletedProcess(theirs.args, theirs.returncode, out, err)
    assert horovods.returncode == 0 and ours.returncode == 0, (horovods, ours)

    def table(text: str) -> list[str]:
        return [line.strip() for line in text[text.index("Horovod v"):].splitlines() if line.strip()]

    assert table(ours.stdout) == table(horovods.stdout), (ours.stdout, horovods.stdout)
    assert "[X] PyTorch" in ours.stdout and "[X] TensorFlow" in ours.stdout and "[X] MPI" in ours.stdout
