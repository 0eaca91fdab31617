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
#   out and compares 40 GPL steps, not 300.
# Usage: tests/bf16.sh MPIEXEC LOOM WORKDIR
set -u
MPIEXEC=$1 LOOM=$2 WORK=$3
. "$(dirname "$0")/lib.sh"
rm -rf "$WORK" && mkdir -p "$WORK"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
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

if [ "${LOOM_TEST_SANITIZED:-0}" = 1 ]; then echo "ok (the addition run left to the unsanitized pass)"; exit 0; fi
LOOM_NO_SETUP=1 LOOM="$LOOM" "$(dirname "$0")/../scripts/train.sh" --precision bf16 --log-every 500 > "$WORK/addition.txt" 2>&1 ||
  fail "the bf16 addition run: $(tail -3 "$WORK/addition.txt")"
last=$(grep "^eval  step  2000" "$WORK/addition.txt") || fail "no evaluation at step 2000: $(tail -3 "$WORK/addition.txt")"
echo "bf16 addition: $last"
pct=$(echo "$last" | sed -n 's/.*exact match *\([0-9.]*\)%.*/\1/p')
awk -v p="$pct" 'BEGIN { exit !(p >= 90) }' || fail "bf16 exact match $pct% is under 90%"
echo "ok: bf16 tracks fp32 on the GPL and learns the addition task"
