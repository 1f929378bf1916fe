"""What set-up finds on this machine, for scripts/setup.sh; its decisions are in setup_plan.py.

Runs before hvdtrain is installed, so it imports nothing of hvdtrain:

    python scripts/stack.py plan [--shell] [setup.sh's options]  # set-up's plan (setup_plan.py) from
                                            # the facts gathered here; --shell: for setup.sh's eval
    python scripts/stack.py keep-pins       # pip constraints that keep what the site installed
    python scripts/stack.py cuda-pypi-assemble DIR  # one toolkit tree from NVIDIA's PyPI compiler, for CMake
    python scripts/stack.py check-build     # Horovod's `horovodrun --check-build` table, in seconds

Why a site's packages are pinned rather than left alone: pip resolves every requirement again
and would happily "upgrade" a site's CUDA torch to PyPI's build to satisfy some range; a
constraint `torch==<installed>` makes that impossible, and a real conflict an error.
"""
from __future__ import annotations

import contextlib
import glob
import importlib
import importlib.metadata as md
import importlib.util
import os
import re
import shutil
import subprocess
import sys

import setup_plan as sp

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


def _horovod_ops(module: str):
    """A Horovod framework extension (horovod.torch, ...) whose ops library loads, or None."""
    try:
        ext = importlib.import_module(module)
        ext.mpi_built()  # the ops library is loaded lazily by some versions: touch a function that needs it
        return ext
    except Exception:  # noqa: BLE001 - any failure means "not usable here"
        return None


@contextlib.contextmanager
def _output_to(fd_target: int, fds=(1,)):
    """fds (stdout by default) written to fd_target meanwhile: what frameworks print while they
    load must not reach set-up's eval or the table."""
    sys.stdout.flush()
    saved = [os.dup(fd) for fd in fds]
    for fd in fds:
        os.dup2(fd_target, fd)
    try:
        yield
    finally:
        sys.stdout.flush()
        for fd, copy in zip(fds, saved):
            os.dup2(copy, fd)
            os.close(copy)


def horovod(wanted: tuple, cache_dir: str | None = None) -> sp.HorovodProbe | None:
    """The Horovod this Python imports (None: none), where from, and which of the wanted framework
    ops or controllers do not load."""
    try:
        import horovod as hvd_pkg
    except Exception:  # noqa: BLE001
        return None
    path = os.path.dirname(os.path.abspath(hvd_pkg.__file__))
    pythonpath = [os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if path.startswith((sys.prefix + os.sep, os.path.realpath(sys.prefix) + os.sep)):
        where = "venv"
    elif any(path.startswith(p + os.sep) for p in pythonpath):
        where = "pythonpath"  # a module's: it comes before the venv's own site-packages
    else:
        where = "site"
    modules = {"torch": "horovod.torch", "tf": "horovod.tensorflow"}
    missing = [f"{fw}-ops" for fw in wanted if _horovod_ops(modules[fw]) is None]
    if not missing:
        mod = importlib.import_module(modules[wanted[0]]) if wanted else None
        if mod is not None and not (mod.mpi_built() or mod.gloo_built()):
            missing.append("controller")
    failure = ""
    if not missing and where != "venv" and wanted:
        # Ops that load are not yet ops that work: a site's Horovod 0.28.1 under TF >= 2.16
        # loads and then fails users' first GradientTape step on Keras 3 variables.
        failed, failure = use_check(wanted, cache_dir)
        missing += failed
    return sp.HorovodProbe(where, getattr(hvd_pkg, "__version__", "?"), path, tuple(missing), failure)


USE_CHECK_SECONDS = 180


def use_check(wanted: tuple, cache_dir: str | None = None) -> tuple[list[str], str]:
    """Horovod used as users use it, in a process of its own (hvd.init starts MPI, alone as one
    rank): (what failed, the failures in one line). A check that cannot finish (an MPI that
    cannot start alone on this node, a crash at exit) fails nothing and says so. Answers are
    kept in cache_dir by what they depend on: set-up plans several times, each would redo it."""
    import hashlib
    import json

    hvd_dir = os.path.dirname(importlib.util.find_spec("horovod").origin)
    stamps = [(f, os.path.getmtime(os.path.join(hvd_dir, f))) for f in ("__init__.py", "tensorflow/__init__.py",
                                                                        "torch/__init__.py")
              if os.path.exists(os.path.join(hvd_dir, f))]
    key = hashlib.sha256(json.dumps([sys.executable, hvd_dir, stamps, sorted(wanted),
                                     os.environ.get("TF_USE_LEGACY_KERAS", "")]).encode()).hexdigest()[:16]
    kept = os.path.join(cache_dir, "use-check", f"{key}.json") if cache_dir else None
    if kept and os.path.exists(kept):
        with open(kept) as f:
            answer = json.load(f)
        return answer["failed"], answer["failure"]
    try:
        run = subprocess.run([sys.executable, os.path.abspath(__file__), "use-check", *wanted],
                             capture_output=True, text=True, timeout=USE_CHECK_SECONDS,
                             env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "KERAS_BACKEND": "tensorflow"})
    except subprocess.TimeoutExpired:
        return [], f"not checked in use: one rank's hvd.init() and first ops did not finish in {USE_CHECK_SECONDS} s"
    lines = run.stdout.splitlines()
    failed = [line.split(" ", 2)[1:] for line in lines if line.startswith("FAILED ")]
    if "DONE" not in lines and not failed:
        tail = (run.stderr.strip().splitlines() or ["no output"])[-1]
        return [], f"not checked in use: Horovod did not start alone as one rank here (exit {run.returncode}: {tail[:160]})"
    answer = {"failed": [name for name, _ in failed], "failure": "; ".join(why for _, why in failed)}
    if kept:
        os.makedirs(os.path.dirname(kept), exist_ok=True)
        with open(kept + ".tmp", "w") as f:
            json.dump(answer, f)
        os.replace(kept + ".tmp", kept)
    return answer["failed"], answer["failure"]


def _use_checks(wanted: list[str]) -> None:
    """`use-check torch tf`: one line `FAILED <what> <why>` per use that fails, then `DONE`."""
    def failure(fn) -> str | None:
        try:
            fn()
            return None
        except Exception as err:  # noqa: BLE001 - any failure is the answer
            return f"{type(err).__name__}: {err}".splitlines()[0][:200]

    def torch_ops():
        import torch
        import horovod.torch as hvd
        hvd.init()
        total = hvd.allreduce(torch.ones(2), op=hvd.Sum, name="hvdtrain.setup.use_check")
        assert total.tolist() == [float(hvd.size())] * 2, f"allreduce gave {total.tolist()}"

    def tf_ops():
        import tensorflow as tf
        import horovod.tensorflow as hvd
        hvd.init()
        total = hvd.allreduce(tf.ones(2), op=hvd.Sum, name="hvdtrain.setup.use_check")
        assert total.numpy().tolist() == [float(hvd.size())] * 2, f"allreduce gave {total.numpy().tolist()}"

    def tf_keras3():
        import tensorflow as tf
        import horovod.tensorflow as hvd
        import keras
        if int(keras.__version__.split(".")[0]) < 3 or os.environ.get("TF_USE_LEGACY_KERAS", "") in ("1", "true", "True"):
            return  # Keras 2: Horovod 0.28.1's own ground
        import horovod.tensorflow.keras  # noqa: F401 - Horovod's Keras layer must import
        weight = keras.Variable(1.0)
        with tf.GradientTape() as tape:
            loss = weight * weight
        grad = hvd.DistributedGradientTape(tape).gradient(loss, [weight])[0]
        assert float(grad) == 2.0, f"gradient {float(grad)}, not 2"

    checks = {"torch": [("torch-use", torch_ops)], "tf": [("tf-use", tf_ops), ("tf-keras3", tf_keras3)]}
    failures = []
    with _output_to(2):   # what the frameworks print is not an answer
        for fw in sorted(wanted, key=lambda f: f != "torch"):   # torch first, as everywhere here
            for what, fn in checks[fw]:
                why = failure(fn)
                if why:
                    failures.append((what, why))
                    break   # the Keras check means nothing once the ops fail
    for what, why in failures:
        print(f"FAILED {what} {why}", flush=True)
    print("DONE", flush=True)
    sys.stdout.flush()
    os._exit(0)   # no framework teardown: a crash there is no answer about Horovod


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
    # nvcc beside the runtime headers: a lone nvcc wrapper (some images put one in /usr/local/bin) is not one.
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


def cuda_archs() -> str:
    """torch's arch flags as it lists them ("sm_75,sm_80,sm_90a,compute_90"): setup_plan.cuda_archs
    makes Horovod's HOROVOD_BUILD_CUDA_CC_LIST of them. Asked of the library itself: an older
    torch.cuda.get_arch_list() answers [] wherever no GPU is seen (a login node)."""
    import torch

    flags = getattr(torch._C, "_cuda_getArchFlags", lambda: None)()
    return ",".join(flags.split() if flags else torch.cuda.get_arch_list())


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


# ---------------------------------------------------------------- the facts set-up decides on

def _run(cmd: list[str]) -> subprocess.CompletedProcess | None:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None


def _which(*names: str) -> str | None:
    """`command -v a || command -v b || ...`"""
    return next((path for path in map(shutil.which, names) if path), None)


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().rstrip("\n")
    except OSError:
        return None


def debs_installed() -> frozenset:
    """Of the packages the bare set-up installs, those dpkg says are installed (one dpkg-query)."""
    r = _run(["dpkg-query", "-W", "-f=${Package} ${Status}\n", *sp.APT_PACKAGES])
    return frozenset(line.split()[0] for line in (r.stdout.splitlines() if r else [])
                     if line.endswith(" install ok installed"))


# Runs under the interpreter the venv is made from, whatever its age: so plain enough for any Python.
_PYTHON_PROBE = ("import os, sys, sysconfig\nprint(sys.version.split()[0])\n"
                 "try:\n    import venv, ensurepip\n    print(1)\nexcept Exception:\n    print(0)\n"
                 "print(int(os.path.exists(os.path.join(sysconfig.get_paths()['include'], 'Python.h'))))\n")


def probe_python(name: str) -> sp.PythonProbe:
    path = shutil.which(name)
    r = _run([path, "-c", _PYTHON_PROBE]) if path else None
    out = r.stdout.split() if r and r.returncode == 0 else []
    if len(out) != 3:
        return sp.PythonProbe(name, path)
    return sp.PythonProbe(name, path, out[0], out[1] == "1", out[2] == "1")


def probe_mpi(bin_dir: str | None = None) -> sp.MpiProbe:
    """`(mpirun --version || mpiexec --version)` and `mpicc -show`, from PATH or from bin_dir."""
    def command(name: str) -> str:
        return os.path.join(bin_dir, name) if bin_dir else name

    text = ""
    for launcher in ("mpirun", "mpiexec"):
        r = _run([command(launcher), "--version"])
        text += r.stdout if r else ""
        if r and r.returncode == 0:
            break
    r = _run([command("mpicc"), "-show"])
    return sp.MpiProbe(text, r.stdout if r else "")


def nccl_home() -> str | None:
    """The NCCL that torch's CUDA packages bring (nvidia-nccl-cu*)."""
    try:
        import nvidia.nccl

        home = list(nvidia.nccl.__path__)[0]
    except Exception:  # noqa: BLE001
        return None
    return home if os.path.isdir(os.path.join(home, "lib")) else None


def tf_include() -> str | None:
    try:
        import tensorflow as tf

        return tf.sysconfig.get_include()
    except Exception:  # noqa: BLE001
        return None


def hvdtrain_root() -> str | None:
    """The clone this Python's hvdtrain comes from (found, not imported)."""
    import importlib.util

    spec = importlib.util.find_spec("hvdtrain")
    return os.path.dirname(os.path.dirname(spec.origin)) if spec and spec.origin else None


# horovodrun --check-build's frameworks, in its order; torch is loaded first here (importing
# TensorFlow before torch's compiler stack crashes this stack's processes).
CHECK_BUILD_EXTENSIONS = (("TensorFlow", "horovod.tensorflow"), ("PyTorch", "horovod.torch"), ("MXNet", "horovod.mxnet"))


def check_build() -> str:
    """The table `horovodrun --check-build` prints, with the same questions asked of the same
    extensions. Horovod's own starts a new process for every question (about ten imports of
    TensorFlow and torch, 21 s on a 2-core node); here each framework's ops are loaded once (6 s)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        with _output_to(devnull, (1, 2)):  # Horovod's tool mutes the frameworks' loading too
            exts = {name: _horovod_ops(module)
                    for name, module in sorted(CHECK_BUILD_EXTENSIONS, key=lambda e: e[1] != "horovod.torch")}
    finally:
        os.close(devnull)
    loaded = {name: ext for name, ext in exts.items() if ext is not None}
    # Like Horovod's helpers: a controller or ops question is answered by the first framework
    # (in its order) whose extension loads.
    first = next((loaded[name] for name, _ in CHECK_BUILD_EXTENSIONS if name in loaded), None)

    def mark(ok) -> str:
        return "X" if ok else " "

    def built(flag: str) -> str:
        return mark(first is not None and getattr(first, flag)())

    import horovod
    return "\n".join([
        f"Horovod v{horovod.__version__}:", "",
        "Available Frameworks:", *(f"    [{mark(name in loaded)}] {name}" for name, _ in CHECK_BUILD_EXTENSIONS), "",
        "Available Controllers:", f"    [{built('mpi_built')}] MPI", f"    [{built('gloo_built')}] Gloo", "",
        "Available Tensor Operations:", f"    [{built('nccl_built')}] NCCL", f"    [{built('ddl_built')}] DDL",
        f"    [{built('ccl_built')}] CCL", f"    [{built('mpi_built')}] MPI", f"    [{built('gloo_built')}] Gloo"])


def python_facts(options: sp.Options, mode: str) -> dict:
    """What the Python running this sees: setup.sh runs it under the venv's python once that runs."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    importable = tuple(frameworks()) if sp.frameworks_from_site(options, mode) else None
    wanted, _ = sp.decide_frameworks(options.frameworks, mode, importable)
    hvd = horovod(wanted, options.cache)   # first: it imports the frameworks in the order set-up always did
    cuda = torch_cuda()
    return dict(planner=sys.executable, in_venv=os.path.realpath(sys.prefix) == os.path.realpath(options.venv),
                pytag=f"py{sys.version_info[0]}{sys.version_info[1]}", importable=importable,
                torch_version=version("torch"), tf_version=version("tensorflow"), torch_cuda=cuda,
                torch_archs=cuda_archs() if cuda else "", nccl_home=nccl_home() if cuda else None,
                tf_include=tf_include() if "tf" in wanted else None, horovod=hvd, hvdtrain_root=hvdtrain_root())


def cache_facts(options: sp.Options) -> dict:
    """What earlier runs left: stamps, cached wheels, PyPI's CUDA toolkits, PyPI's MPI in the venv."""
    def holds(folder: str, pattern: str) -> bool:
        return bool(glob.glob(os.path.join(glob.escape(folder), pattern)))

    wheels = os.listdir(options.wheel_cache) if os.path.isdir(options.wheel_cache) else []
    cudas = [d for d in (os.listdir(options.cache) if os.path.isdir(options.cache) else []) if d.startswith("cuda-pypi-")]
    venv_bin = os.path.join(options.venv, "bin")
    venv_mpi = all(os.access(os.path.join(venv_bin, name), os.X_OK) for name in ("mpicc", "mpirun"))
    return dict(venv_python=os.access(os.path.join(venv_bin, "python"), os.X_OK),
                venv_stamp=_read(os.path.join(options.venv, ".hvdtrain-deps")),
                horovod_stamp=_read(os.path.join(options.venv, ".hvdtrain-horovod")),
                cached_wheels=frozenset(w for w in wheels if holds(os.path.join(options.wheel_cache, w), "horovod-*.whl")),
                cuda_pypi_ready=frozenset(d for d in cudas if os.access(os.path.join(options.cache, d, "bin", "nvcc"), os.X_OK)),
                mpi_in_venv=probe_mpi(venv_bin) if venv_mpi else None)


def input_facts(options: sp.Options) -> dict:
    """Set-up's own files that its keys hash."""
    def content(*paths: str) -> bytes:
        data = b""
        for path in paths:
            with open(os.path.join(options.repo, path), "rb") as f:
                data += f.read()
        return data

    return dict(pyproject=content("pyproject.toml"), lock=content(sp.LOCK),
                patch=content("scripts/patch-horovod.sh", "scripts/horovod-keras3.patch"),
                cxxflags=os.environ.get("CXXFLAGS", ""))


def gather_facts(options: sp.Options) -> sp.Facts:
    """Observe this machine for setup_plan.plan. The first decisions (mode, frameworks) say which
    Python to probe and which Horovod ops to load: probing more would import TensorFlow for a
    torch-only set-up."""
    uid = os.geteuid()
    apt = bool(shutil.which("apt-get") and shutil.which("dpkg-query"))
    mode, _ = sp.decide_mode(options.mode, uid, apt)
    host = dict(uid=uid, apt=apt, debs_installed=debs_installed() if mode == "bare" else frozenset(),
                mpicc=_which("mpicc", "mpicxx"), launcher=_which("srun", "mpirun", "mpiexec"),
                cxx=_which(os.environ.get("CXX") or "g++", "c++"), python=probe_python(sp.base_python(options, mode)),
                gpus_here=gpu_present(), toolkit=site_toolkit(), mpi_on_path=probe_mpi())
    return sp.Facts(options=options, **host, **python_facts(options, mode), **cache_facts(options),
                    **input_facts(options))


def plan_command(args: list[str]) -> None:
    """`plan [--shell] [setup.sh's options]`: the plan, for people or (--shell) for setup.sh's eval."""
    as_shell = "--shell" in args
    options = sp.parse_options([a for a in args if a != "--shell"], dict(os.environ))
    # Whatever the frameworks print while they are probed (TensorFlow's and absl's log lines) is
    # neither the plan nor an answer for setup.sh's eval: stdout and stderr both go to
    # $HVDTRAIN_CACHE/logs/plan-probe.log meanwhile, not shown; its tail is printed if probing fails.
    log = os.path.join(options.cache, "logs", "plan-probe.log")
    os.makedirs(os.path.dirname(log), exist_ok=True)
    out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        with _output_to(out, (1, 2)):
            facts = gather_facts(options)
    except Exception:
        with open(log, errors="replace") as f:
            sys.stderr.write("".join(f.readlines()[-20:]))
        raise
    finally:
        os.close(out)
    p = sp.plan(facts)
    print(sp.shell(p, options) if as_shell else "\n".join(sp.describe(p)))


def main(argv: list[str]) -> None:
    cmd, args = argv[0], argv[1:]
    try:
        if cmd == "plan":
            plan_command(args)
        elif cmd == "keep-pins":
            print("\n".join(keep_pins()))
        elif cmd == "cuda-pypi-assemble":
            cuda_pypi_assemble(args[0])
        elif cmd == "check-build":
            print(check_build())
        elif cmd == "use-check":
            _use_checks(args)
        else:
            sys.exit(f"unknown command {cmd}")
    except sp.PlanError as e:
        sys.exit(f"[setup] {e}")


if __name__ == "__main__":
    main(sys.argv[1:])
