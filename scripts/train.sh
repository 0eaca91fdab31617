#!/bin/sh
# Sets up and builds loom (scripts/setup.sh), then trains the default small
# GPT across 2 local ranks with tensor parallelism (tp 2, one thread each).
# Extra arguments go to `loom train`, e.g. scripts/train.sh --steps 500.
set -eu
cd "$(dirname "$0")/.."
scripts/setup.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 # harmless when not root
exec mpirun --oversubscribe --bind-to none -np 2 -x OMP_NUM_THREADS=1 build/loom train --tp 2 "$@"
