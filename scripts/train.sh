#!/bin/sh
# Sets up and builds loom (scripts/setup.sh), then trains the default small
# GPT across 4 local ranks: tensor parallelism 2 x pipeline stages 2 (1F1B,
# 4 micro-batches of 16 sequences of 16 tokens: 1024 tokens a step) on the
# addition task. Windows of 16 tokens, so each position holds the same place
# of a sum in every window; with seq 64 the learned positions must each learn
# the task's layout apart, and whether a run escaped its plateau by step
# 2000 depended on the seed and the GEMM kernels (docs/training.md).
# Extra arguments go to `loom train`, e.g. scripts/train.sh --steps 500.
# LOOM_NO_SETUP=1 skips the setup and LOOM=PATH runs another build
# (bench/main_job_sweep.sh does both).
set -eu
cd "$(dirname "$0")/.."
[ -n "${LOOM_NO_SETUP:-}" ] || scripts/setup.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 # harmless when not root
exec mpirun --oversubscribe --bind-to none -np 4 -x OMP_NUM_THREADS=1 ${LOOM_CPU_GEMM:+-x LOOM_CPU_GEMM} \
  "${LOOM:-build/loom}" train --tp 2 --pp 2 --seq 16 --micro-batch 16 --micro-batches 4 "$@"
