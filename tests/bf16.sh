#!/bin/sh
# bf16 mixed precision against fp32 on real tasks:
# - on a GPL text (the GPL-3 as byte tokens), 300 steps of the default model:
#   the bf16 loss curve, as means over windows of 10 steps, stays within 2%
#   of the fp32 curve, and every single step within 5% (at lr 1e-3). Windows,
#   because both runs can spike at the same step, and a spike's height in a
#   chaotic trajectory moves with any rounding: at lr 3e-3 this small model
#   spikes near step 53 in both precisions; at 1e-3, once -fno-trapping-math
#   vectorised GELU (fp32's own rounding moved), both spiked at step 161-162,
#   fp32 to 4.10 and bf16 to 3.99 (2.8% apart), with every other step within
#   0.3% and the worst 10-step window 0.8%;
# - the README's main job itself (scripts/train.sh: tp 2 x pp 2, the
#   addition task) in bf16 reaches at least 90% held-out exact match at
#   step 2000. The sweep of seeds 1-8 with either GEMM library
#   (bench/main_job_sweep.sh, docs/training.md) ended at 97% or more in
#   every run, so 90% is a margin, not a coin toss. The sanitized pass
#   (LOOM_TEST_SANITIZED=1), which checks memory, not numerics, leaves it
#   out and compares 40 GPL steps, not 300;
# - partial (block), uniform in groups of 2 and full recompute give bf16's
#   losses bit for bit, at tp 2 x pp 2 and under ZB-V, with memory as
#   modelled.
# Usage: tests/bf16.sh MPIEXEC LOOM WORKDIR
set -u
MPIEXEC=$1 LOOM=$2 WORK=$3
. "$(dirname "$0")/lib.sh"
rm -rf "$WORK" && mkdir -p "$WORK"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# The addition task learned in bf16: the full tier's part (bf16_more).
if part more; then
  if [ "${LOOM_TEST_SANITIZED:-0}" = 1 ]; then skip "the bf16 addition run, left to the unsanitized pass"; fi
  LOOM_NO_SETUP=1 LOOM="$LOOM" "$(dirname "$0")/../scripts/train.sh" --precision bf16 --log-every 500 > "$WORK/addition.txt" 2>&1 ||
    fail "the bf16 addition run: $(tail -3 "$WORK/addition.txt")"
  last=$(grep "^eval  step  2000" "$WORK/addition.txt") || fail "no evaluation at step 2000: $(tail -3 "$WORK/addition.txt")"
  echo "bf16 addition: $last"
  pct=$(echo "$last" | sed -n 's/.*exact match *\([0-9.]*\)%.*/\1/p')
  awk -v p="$pct" 'BEGIN { exit !(p >= 90) }' || fail "bf16 exact match $pct% is under 90%"
  part quick || { echo "ok: bf16 learns the addition task"; exit 0; }
fi
TEXT=/usr/share/common-licenses/GPL-3
[ -f "$TEXT" ] || fail "no $TEXT to train on"
STEPS=300
[ "${LOOM_TEST_SANITIZED:-0}" = 1 ] && STEPS=40
"$LOOM" data prepare "$TEXT" -o "$WORK/gpl.bin" > "$WORK/prepare.txt" 2>&1 || fail "data prepare: $(cat "$WORK/prepare.txt")"
for p in fp32 bf16; do
  OMP_NUM_THREADS=2 "$LOOM" train --data "$WORK/gpl.bin" --precision $p --steps $STEPS --lr 1e-3 --eval-every 0 --log-every 100 \
    --metrics "$WORK/gpl.$p.jsonl" > "$WORK/gpl.$p.txt" 2>&1 || fail "$p on the GPL: $(tail -3 "$WORK/gpl.$p.txt")"
done
losses() { grep -o '"loss": [0-9.e+-]*' "$1" | cut -d' ' -f2; }
losses "$WORK/gpl.fp32.jsonl" > "$WORK/fp32.losses"
losses "$WORK/gpl.bf16.jsonl" > "$WORK/bf16.losses"
paste "$WORK/fp32.losses" "$WORK/bf16.losses" > "$WORK/both"
awk -v steps=$STEPS 'BEGIN { n = 0; worst = 0; window = 0 }
     function off(x, y) { return x > y ? (x - y) / y : (y - x) / y }
     { n++; if (off($2, $1) > worst) { worst = off($2, $1); at = n }
       a += $1; b += $2; if (n % 10 == 0) { if (off(b, a) > window) { window = off(b, a); wat = n } a = b = 0 } }
     END { printf "%d steps compared; worst bf16/fp32 loss difference %.2f%% at step %d, over 10 steps %.2f%% (steps %d-%d)\n",
                  n, 100 * worst, at, 100 * window, wat - 9, wat;
           exit !(n == steps && window <= 0.02 && worst <= 0.05) }' "$WORK/both" ||
  fail "the bf16 curve leaves fp32's on the GPL (2% over 10 steps, 5% at any step): $(tail -1 "$WORK/gpl.bf16.txt")"
awk -v steps=$STEPS 'NR == steps { if ($1 > 0.8 * first) exit 1 } NR == 1 { first = $1 }' "$WORK/both" || fail "the GPL losses did not fall"

# Recompute in bf16, partial (Megatron's block method: each stage's first layer) and full, at tp 2 x pp 2 and
# under ZB-V: the losses of the run without it, bit for bit, each run's tensor memory as its plan modelled it,
# and partial between none and full.
rc_run() { # rc_run NAME RANKS FLAGS...: losses into $WORK/NAME.losses, the log in $WORK/NAME.txt
  run=$1 ranks=$2
  shift 2
  "$MPIEXEC" --oversubscribe --bind-to none -np "$ranks" -x OMP_NUM_THREADS=1 "$LOOM" train --precision bf16 --dropout 0.1 \
    --steps 3 --eval-every 0 --micro-batches 4 --metrics "$WORK/$run.jsonl" "$@" > "$WORK/$run.txt" 2>&1 ||
    fail "recompute run $run: $(tail -3 "$WORK/$run.txt")"
  losses "$WORK/$run.jsonl" > "$WORK/$run.losses"
  [ "$(wc -l < "$WORK/$run.losses")" = 3 ] || fail "$run: $(wc -l < "$WORK/$run.losses") losses"
  grep -q "loom estimated .* MiB, +0.00% off" "$WORK/$run.txt" || fail "$run: memory not as modelled: $(grep '^memory' "$WORK/$run.txt")"
}
BLOCK="--recompute full --recompute-method block --recompute-num-layers 1"
# shellcheck disable=SC2086 # one word per flag
for grid in "tp2pp2 4 --tp 2 --pp 2 --layers 6" "zbv 2 --pp 2 --layers 8 --schedule zb_v"; do
  set -- $grid
  name=$1 np=$2
  shift 2
  rc_run "${name}_none" "$np" "$@"
  rc_run "${name}_block" "$np" "$@" $BLOCK
  rc_run "${name}_full" "$np" "$@" --recompute full
  rc_run "${name}_uniform" "$np" "$@" --recompute full --recompute-method uniform --recompute-num-layers 2
  for rc in block full uniform; do
    cmp -s "$WORK/${name}_none.losses" "$WORK/${name}_$rc.losses" || fail "$name: recompute $rc changed the bf16 losses"
  done
done
grep -q "activations on rank 0: .* MiB with recompute of 1 of 3 layers (block), .* MiB without" "$WORK/tp2pp2_block.txt" ||
  fail "the block run's activations line: $(grep activations "$WORK/tp2pp2_block.txt")"
acts() { sed -n 's/.*activations on rank 0: \([0-9.]*\) MiB.*/\1/p' "$WORK/$1.txt"; }
awk -v n="$(acts tp2pp2_none)" -v b="$(acts tp2pp2_block)" -v f="$(acts tp2pp2_full)" 'BEGIN { exit !(f < b && b < n) }' ||
  fail "activations none $(acts tp2pp2_none), block $(acts tp2pp2_block), full $(acts tp2pp2_full) MiB are not in order"

echo "ok: bf16 tracks fp32 on the GPL"
