#!/usr/bin/env bash
# Set everything up (idempotent, cached) and run the test suite:
#   bash scripts/test.sh [pytest args]
# The tests start their own local Slurm cluster and launch real ranks with mpirun, srun and
# horovodrun; each launch has a hard timeout.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$REPO/scripts/setup.sh"
source "$REPO/scripts/env.sh"
export PATH=$HVDTRAIN_VENV/bin:$PATH
cd "$REPO"
echo "[test] $(date -u +%H:%M:%S) running the test suite"
exec python -m pytest -ra --durations=25 -p no:cacheprovider "$@" tests
