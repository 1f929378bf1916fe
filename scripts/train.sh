#!/usr/bin/env bash
# Set everything up (idempotent, cached) and run the main job: Horovod data-parallel training
# of ResNet-50 on 2 ranks (mpirun), synthetic 64x64 images, a short run sized for a small CPU.
#   bash scripts/train.sh [extra hvdtrain.torch options]
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$REPO/scripts/setup.sh"
source "$REPO/scripts/env.sh"
export PATH=$HVDTRAIN_VENV/bin:$PATH
cd "$REPO"
NP=${NP:-2}
RUN=runs/resnet50-$(date +%Y%m%d-%H%M%S)   # a fresh directory: no silent auto-resume
mkdir -p "$RUN"
set -x
# The launcher prefix comes from hvdtrain.launch, as for the comparison, benchmarks and tests.
$(python -m hvdtrain.launch mpirun "$NP") python -m hvdtrain.torch --model resnet50 --dataset synthetic \
    --image-size 64 --batch-size 8 --steps 12 --epochs 1 --checkpoint-dir "$RUN/checkpoints" \
    --log-dir "$RUN/tb" --result-json "$RUN/result.json" "$@"
