#!/usr/bin/env bash
# Set up everything hvdtrain needs on a Debian 12 machine, as root:
#   bash scripts/setup.sh
# Steps (each logged to $HVDTRAIN_CACHE/logs/<step>.log, each skipped when already done):
#   apt      OpenMPI, compilers, Slurm + munge
#   venv     the virtual environment with the pinned packages of pyproject.toml
#   horovod  Horovod 0.28.1 from its PyPI sdist, patched for torch 2.14 / TF 2.21, built once
#            and cached by (Horovod, torch, TF, Python, CPU|NCCL), then installed in the venv
#   check    `horovodrun --check-build`: TensorFlow, PyTorch, MPI and Gloo must all be marked
# Idempotent: a second run only checks and finishes in well under a minute.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$REPO/scripts/env.sh"

HOROVOD_VERSION=0.28.1
PYTHON=${PYTHON:-python3.11}
LOG_DIR=$HVDTRAIN_CACHE/logs
mkdir -p "$LOG_DIR" "$HVDTRAIN_CACHE/wheels"

say() { printf '[setup] %s\n' "$*"; }

# Run one step with its output in its own log; on failure name the step and the log.
run_step() {
    local name=$1; shift
    local log=$LOG_DIR/$name.log
    local start=$SECONDS
    if ! "$@" >"$log" 2>&1; then
        say "step '$name' FAILED after $((SECONDS - start)) s; last lines of $log:"
        tail -n 40 "$log" | sed 's/^/    /'
        say "step '$name' failed: see $log"
        exit 1
    fi
    say "step '$name' done in $((SECONDS - start)) s (log: $log)"
}

# ---------------------------------------------------------------- apt
APT_PACKAGES=(build-essential git openmpi-bin libopenmpi-dev slurm-wlm munge libpmix-dev
              libpmix-bin procps curl iproute2 python3.11-venv python3.11-dev)
step_apt() (  # a subshell: its EXIT trap and exports stay inside
    export DEBIAN_FRONTEND=noninteractive
    # Debian's package scripts try to start the daemons; there is no init system here and the
    # project starts its own cluster (scripts/slurm-cluster.sh), so forbid that.
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
        trap 'rm -f /usr/sbin/policy-rc.d' EXIT
    fi
    apt-get update
    apt-get install -y --no-install-recommends "${APT_PACKAGES[@]}"
)
apt_missing() {
    local p
    for p in "${APT_PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || return 0
    done
    return 1
}
if [ "$(id -u)" != 0 ] && apt_missing; then
    say "system packages missing and not root: install as root: apt-get install ${APT_PACKAGES[*]}"
    exit 1
fi
if apt_missing; then run_step apt step_apt; else say "step 'apt': all system packages present"; fi

# ---------------------------------------------------------------- venv
command -v "$PYTHON" >/dev/null || { say "need $PYTHON (Python 3.11) on PATH"; exit 1; }
VENV_STAMP=$HVDTRAIN_VENV/.hvdtrain-deps
deps_hash=$(sha256sum "$REPO/pyproject.toml" | cut -c1-16)
step_venv() {
    # A venv whose pip does not run (an interrupted creation) is made again.
    "$HVDTRAIN_VENV/bin/python" -m pip --version >/dev/null 2>&1 || "$PYTHON" -m venv --clear "$HVDTRAIN_VENV"
    "$HVDTRAIN_VENV/bin/python" -m pip install --upgrade "pip>=24" "setuptools>=70" wheel
    "$HVDTRAIN_VENV/bin/python" -m pip install -e "$REPO[test]" "cmake<4"
    echo "$deps_hash" >"$VENV_STAMP"
}
if [ "$(cat "$VENV_STAMP" 2>/dev/null)" != "$deps_hash" ]; then
    # The stamp is written last: a venv without it is never taken for a good one.
    rm -f "$VENV_STAMP"
    run_step venv step_venv
else
    say "step 'venv': $HVDTRAIN_VENV up to date"
fi
# The venv lives in the cache so that clones share it; point its editable install at this clone.
here=$("$HVDTRAIN_VENV/bin/python" -c 'import hvdtrain, os; print(os.path.dirname(os.path.dirname(hvdtrain.__file__)))' 2>/dev/null || true)
if [ "$here" != "$REPO" ]; then
    run_step editable "$HVDTRAIN_VENV/bin/python" -m pip install --no-deps --no-build-isolation -e "$REPO"
fi
ln -sfn "$HVDTRAIN_VENV" "$REPO/.venv"

# ---------------------------------------------------------------- horovod
PY=$HVDTRAIN_VENV/bin/python
GPU_OPS=cpu
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then GPU_OPS=nccl; fi
PYTAG=$($PY -c 'import sys; print(f"py{sys.version_info[0]}{sys.version_info[1]}")')
# The wheel is keyed by the versions really installed (the pins live in pyproject.toml).
TORCH_VERSION=$($PY -c 'import importlib.metadata as m; print(m.version("torch").split("+")[0])')
TF_VERSION=$($PY -c 'import importlib.metadata as m; print(m.version("tensorflow-cpu"))')
HVD_KEY=horovod-$HOROVOD_VERSION-torch$TORCH_VERSION-tf$TF_VERSION-$PYTAG-$GPU_OPS
WHEEL_DIR=$HVDTRAIN_CACHE/wheels/$HVD_KEY

# The newest CUDA toolkit on the machine: torch is a CUDA build, so Horovod's CMake looks for one
# even for a CPU-only build (see docs/horovod-build.md).
find_cuda() {
    local d
    for d in $(ls -d /usr/local/cuda-* 2>/dev/null | sort -V -r) /usr/local/cuda; do
        [ -x "$d/bin/nvcc" ] && { echo "$d"; return; }
    done
}

step_horovod_build() (  # a subshell: its EXIT trap, cd and exports stay inside
    work=$(mktemp -d "$HVDTRAIN_CACHE/build.XXXXXX")
    trap 'rm -rf "$work"' EXIT
    cd "$work"
    $PY -m pip download --no-deps --no-binary :all: "horovod==$HOROVOD_VERSION" -d .
    tar xzf "horovod-$HOROVOD_VERSION.tar.gz"
    cd "horovod-$HOROVOD_VERSION"
    bash "$REPO/scripts/patch-horovod.sh" .
    cuda=$(find_cuda)
    if [ -n "$cuda" ]; then
        export CUDA_HOME=$cuda CUDAToolkit_ROOT=$cuda PATH=$cuda/bin:$PATH
        echo "CUDA toolkit: $cuda"
    elif $PY -c 'import sys, torch; sys.exit(torch.version.cuda is None)'; then
        echo "torch is a CUDA build, so Horovod's CMake needs a CUDA toolkit, and none was found" \
             "under /usr/local/cuda-*: install one (e.g. Debian's nvidia-cuda-toolkit) or a CPU build of torch"
        exit 1
    fi
    tfi=$($PY -c 'import tensorflow as tf; print(tf.sysconfig.get_include())' 2>/dev/null)
    export CXXFLAGS="-I$tfi/external/highwayhash -I$tfi/external/farmhash_archive/src ${CXXFLAGS:-}"
    export HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_MPI=1 \
           HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MXNET=1 MAKEFLAGS=-j$(nproc)
    if [ "$GPU_OPS" = nccl ]; then
        # The NCCL that torch's CUDA packages bring (nvidia-nccl-cu*), not a system one.
        nccl=$($PY -c 'import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__) if nvidia.nccl.__file__ else list(nvidia.nccl.__path__)[0])')
        [ -e "$nccl/lib/libnccl.so" ] || ln -sf libnccl.so.2 "$nccl/lib/libnccl.so"
        export HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_NCCL_HOME=$nccl HOROVOD_NCCL_LINK=SHARED
    fi
    env | grep -E '^(HOROVOD|CUDA|CXXFLAGS|MAKEFLAGS)' | sort
    PATH=$HVDTRAIN_VENV/bin:$PATH $PY -m pip wheel --no-build-isolation --no-deps -v -w dist .
    mkdir -p "$WHEEL_DIR.tmp"
    cp dist/horovod-*.whl "$WHEEL_DIR.tmp/"
    rm -rf "$WHEEL_DIR"
    mv "$WHEEL_DIR.tmp" "$WHEEL_DIR"     # atomic: the cache holds a whole wheel or none
)
step_horovod_install() {
    $PY -m pip install --no-deps --force-reinstall "$WHEEL_DIR"/horovod-*.whl
    echo "$HVD_KEY" >"$HVDTRAIN_VENV/.hvdtrain-horovod"
}
if ! ls "$WHEEL_DIR"/horovod-*.whl >/dev/null 2>&1; then
    say "step 'horovod-build': building $HVD_KEY (about 6-15 minutes on 2 cores)"
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

# ---------------------------------------------------------------- check
say "horovodrun --check-build:"
check=$(cd /tmp && "$HVDTRAIN_VENV/bin/horovodrun" --check-build 2>&1) || true
echo "$check" | sed 's/^/    /'
for fw in TensorFlow PyTorch MPI Gloo; do
    if ! echo "$check" | grep -Eq "\[X\] $fw\b"; then
        say "check FAILED: Horovod was built without $fw (not marked [X] above)."
        say "rebuild: rm -rf $WHEEL_DIR && bash scripts/setup.sh (build log: $LOG_DIR/horovod-build.log)"
        exit 1
    fi
done
if [ "$GPU_OPS" = nccl ] && ! echo "$check" | grep -Eq "\[X\] NCCL"; then
    say "check FAILED: GPUs present but Horovod has no NCCL support"; exit 1
fi
say "ready: venv $HVDTRAIN_VENV (linked as .venv), Horovod $HVD_KEY"
