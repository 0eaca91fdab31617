#!/bin/sh
# The gpt50b grid, scaled down to one CPU machine: plan_tiny.txtpb keeps the
# 50B plan's pipeline depth (8 stages of 8 layers), its tensor-parallel
# pattern (tp 2 here, 8 there, with sequence parallelism), ZeRO-1, full
# recompute and the 1F1B schedule, on 16 ranks, with hidden 32 instead of
# 8192. It trains a few steps under launch/loom-run, then the same model
# serially, and checks every loss against the serial run (relative 1e-5).
#   examples/gpt50b/run_tiny.sh [STEPS] [OUT_DIR]
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
steps=${1:-3}
out=${2:-$root/build/gpt50b_tiny}
LOOM=${LOOM:-$root/build/loom}
[ -x "$LOOM" ] || { echo "run_tiny.sh: no $LOOM; run scripts/setup.sh first" >&2; exit 2; }
export LOOM
mkdir -p "$out"
rm -f "$out/parallel.jsonl" "$out/serial.jsonl" # this script's own outputs, from a run before (loom replaces no output it did not make)
# The plan's model, trained by one rank: the serial reference.
MODEL="--layers 64 --hidden 32 --heads 4 --vocab 256 --seq 32 --dropout 0.1 --micro-batch 1 --global-batch 16"

"$LOOM" plan check "$here/plan_tiny.txtpb" --world 16
echo "== gpt50b-tiny on 16 ranks (tp 2 x pp 8, sequence parallel, ZeRO-1, full recompute, 1F1B)"
"$root/launch/loom-run" train --plan "$here/plan_tiny.txtpb" --steps "$steps" --eval-every 0 --log-every 1 \
  --metrics "$out/parallel.jsonl"
echo "== the same model on 1 rank"
# shellcheck disable=SC2086 # MODEL is split into flags on purpose
"$LOOM" train $MODEL --steps "$steps" --eval-every 0 --metrics "$out/serial.jsonl" > "$out/serial.txt"

losses() { grep -o '"loss": [0-9.e+-]*' "$1" | sed 's/.*: //'; }
losses "$out/serial.jsonl" > "$out/serial.losses"
losses "$out/parallel.jsonl" > "$out/parallel.losses"
[ "$(wc -l < "$out/parallel.losses")" = "$steps" ] || { echo "run_tiny.sh: expected $steps parallel losses" >&2; exit 1; }
echo "== losses: serial, 16 ranks, relative difference"
paste "$out/serial.losses" "$out/parallel.losses" | awk '
  { d = ($1 - $2) / $1; if (d < 0) d = -d; printf "step %d: %s %s %.1e\n", NR, $1, $2, d; if (d > 1e-5) bad = 1 }
  END { if (bad) { print "run_tiny.sh: the 16-rank run differs from the serial run"; exit 1 }
        print "ok: the 16-rank gpt50b grid equals the serial run" }'
