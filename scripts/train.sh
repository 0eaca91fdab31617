#!/bin/sh
# Sets up and builds loom (scripts/setup.sh), then trains the default small
# GPT across 4 local ranks: tensor parallelism 2 x pipeline stages 2 (1F1B,
# 4 micro-batches of 4 sequences: the same global batch as one rank's 16).
# Extra arguments go to `loom train`, e.g. scripts/train.sh --steps 500.
set -eu
cd "$(dirname "$0")/.."
scripts/setup.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 # harmless when not root
exec mpirun --oversubscribe --bind-to none -np 4 -x OMP_NUM_THREADS=1 \
  build/loom train --tp 2 --pp 2 --micro-batch 4 --micro-batches 4 "$@"
