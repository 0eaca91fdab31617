#!/bin/sh
# Plain data parallelism and ZeRO-1, 2 and 3 side by side: for each stage it
# trains STEPS steps at dp 2 (one rank per core, as mpirun binds them) and
# prints one table row from the run's own log: what rank 0 holds (weights,
# grads, Adam state, buffers in transit, by the memory model), the busiest
# rank's tensor memory as its allocator counted it against the model's
# estimate, and the median step time of the steps after the first.
# Usage: bench/zero_stages.sh LOOM [train flags...]
#   e.g. bench/zero_stages.sh build/loom --model gpt2-small --seq 64 --micro-batch 4 --global-batch 8
set -u
. "$(dirname "$0")/lib.sh"
LOOM=$1
shift
STEPS=${STEPS:-4}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT INT TERM
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
echo "| ZeRO | weights (MiB) | grads (MiB) | Adam (MiB) | in transit (MiB) | counted peak (MiB) | estimated (MiB) | step (ms) |"
echo "|---|---|---|---|---|---|---|---|"
for z in 0 1 2 3; do
  rm -f "$WORK/m.jsonl" # loom train keeps an existing metrics file
  mpirun -np 2 -x OMP_NUM_THREADS=1 "$LOOM" train "$@" --dp 2 --zero $z --steps "$STEPS" --eval-every 0 \
    --metrics "$WORK/m.jsonl" > "$WORK/log" 2>&1 || { echo "ZeRO-$z run failed:" >&2; cat "$WORK/log" >&2; exit 1; }
  state=$(sed -n 's/.*weights \([0-9.]*\) MiB, grads \([0-9.]*\) MiB, Adam \([0-9.]*\) MiB, in transit \([0-9.]*\) MiB.*/\1 | \2 | \3 | \4/p' "$WORK/log")
  memory=$(sed -n "s/.*tensor memory peaked at \([0-9.]*\) MiB .*; loom estimated \([0-9.]*\) MiB.*/\1 | \2/p" "$WORK/log")
  step=$(median_step_ms "$WORK/m.jsonl" %.0f)
  echo "| $([ $z = 0 ] && echo none || echo $z) | $state | $memory | $step |"
done
