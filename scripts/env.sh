# Sourced by the project's scripts: where the shared cache and the virtual environment live.
# The venv and the Horovod wheel are kept outside the clone so that clones (and CI) reuse them.
export HVDTRAIN_CACHE=${HVDTRAIN_CACHE:-$HOME/.cache/hvdtrain}
export HVDTRAIN_VENV=${HVDTRAIN_VENV:-$HVDTRAIN_CACHE/venv-py311}
# OpenMPI refuses root without these; containers and CI machines often run as root.
if [ "$(id -u)" = 0 ]; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
