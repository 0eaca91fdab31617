#!/bin/sh
# The Llama family end to end: llama-tiny (grouped-query attention, RMSNorm,
# SwiGLU, RoPE, an untied head) at tp 2 starts at a loss within 0.05 of
# ln V (the vocab of 256 bytes: 5.545) and learns the addition task on the
# main job's 16-token windows: a held-out loss under 1.0 after the default
# 2000 steps. Whether it then escapes the task's last plateau (the carry, at
# a held-out loss near 0.92) by step 2000 is chaotic: of the sweep's 16 runs
# (seeds 1-8, either GEMM library; docs/training.md) 15 reached 100% exact
# match at a loss of 0.003 or less, and seed 8 with OpenBLAS stayed on the
# plateau (10.9%, loss 0.87); at seq 64 a Xeon with AMX ended at 15.6%. So
# the exact match is reported, and the loss, which every run brought from
# 5.5 to under 0.9, is what is held. The sanitized pass
# (LOOM_TEST_SANITIZED=1), which checks memory, not learning, runs 20 steps.
# Usage: tests/llama.sh MPIEXEC LOOM WORKDIR
set -u
MPIEXEC=$1 LOOM=$2 WORK=$3
. "$(dirname "$0")/lib.sh"
rm -rf "$WORK" && mkdir -p "$WORK"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
STEPS=2000 # learning: the full tier's part (llama_more)
[ "${LOOM_TEST_SANITIZED:-0}" = 1 ] || ! part more && STEPS=20
"$MPIEXEC" --oversubscribe --bind-to none -np 2 -x OMP_NUM_THREADS=1 "$LOOM" train --model llama-tiny --tp 2 \
  --seq 16 --micro-batch 16 --micro-batches 4 --steps $STEPS --log-every 500 > "$WORK/run.txt" 2>&1 || fail "llama-tiny at tp 2: $(tail -3 "$WORK/run.txt")"
grep -q "^architecture: grouped-query attention, 2 kv heads (1 per tp rank), rmsnorm, swiglu, rope theta 10000, no biases, untied head$" \
  "$WORK/run.txt" || fail "no architecture line: $(head -3 "$WORK/run.txt")"
first=$(sed -n 's/^eval  step     0 | held-out loss \([0-9.]*\) .*/\1/p' "$WORK/run.txt")
[ -n "$first" ] || fail "no evaluation at step 0: $(head -5 "$WORK/run.txt")"
awk -v l="$first" 'BEGIN { d = l - log(256); exit !(d < 0.05 && d > -0.05) }' ||
  fail "initial held-out loss $first is not within 0.05 of ln 256 = 5.545"
echo "llama-tiny: initial loss $first (ln 256 = 5.545)"
if [ "$STEPS" != 2000 ] && ! part more; then echo "ok: llama-tiny starts at ln V (learning is llama_more's, in the full tier)"; exit 0; fi
if [ "$STEPS" != 2000 ]; then skip "learning to 2000 steps, left to the unsanitized pass (the checks above passed)"; fi
last=$(grep "^eval  step  2000" "$WORK/run.txt") || fail "no evaluation at step 2000: $(tail -3 "$WORK/run.txt")"
echo "llama-tiny: $last"
loss=$(echo "$last" | sed -n 's/.*held-out loss \([0-9.]*\) .*/\1/p')
[ -n "$loss" ] && awk -v l="$loss" 'BEGIN { exit !(l < 1.0) }' || fail "llama-tiny held-out loss ${loss:-(none)} at step 2000 is not under 1.0"
echo "ok: llama-tiny starts at ln V and learns the addition task"
