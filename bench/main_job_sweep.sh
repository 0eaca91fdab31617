#!/bin/sh
# The main job (scripts/train.sh itself: 4 ranks, tp 2 x pp 2, the addition
# task) over seeds 1-8, in fp32 and bf16, with each CPU GEMM library forced
# (LOOM_CPU_GEMM): its final held-out exact match and the first evaluation
# at 97% or more. The README and docs/training.md quote the worst row.
# Usage: bench/main_job_sweep.sh LOOM [extra loom train flags...]
set -eu
LOOM=$1
shift
log=$(mktemp "${TMPDIR:-/tmp}/loom_sweep.XXXXXX")
trap 'rm -f "$log"' EXIT
trap 'exit 143' TERM INT HUP # through the EXIT trap
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //') ($(grep -m1 '^flags' /proc/cpuinfo | grep -o 'avx2\|avx512f\|avx512_bf16\|amx_bf16' | sort -u | tr '\n' ' ')), $(nproc) cores"
printf '%-9s %-9s %4s %8s %14s %8s\n' precision gemm seed final first_at_97 seconds
worst=100
for precision in fp32 bf16; do
  for gemm in openblas onednn; do
    for seed in 1 2 3 4 5 6 7 8; do
      t0=$(date +%s)
      LOOM_NO_SETUP=1 LOOM="$LOOM" LOOM_CPU_GEMM=$gemm "$(dirname "$0")/../scripts/train.sh" --precision $precision \
        --seed $seed "$@" > "$log" 2>&1 ||
        { tail -20 "$log"; exit 1; }
      final=$(sed -n 's/^eval  step *[0-9]* | .* exact match *\([0-9.]*\)%.*/\1/p' "$log" | tail -1)
      first=$(awk '/^eval  step/ { p = $0; sub(/.*exact match */, "", p); sub(/%.*/, "", p); if (p + 0 >= 97) { print $3; exit } }' "$log")
      printf '%-9s %-9s %4s %7s%% %14s %8s\n' $precision $gemm $seed "$final" "${first:-never}" $(($(date +%s) - t0))
      worst=$(awk -v a="$worst" -v b="$final" 'BEGIN { print (b + 0 < a + 0) ? b : a }')
    done
  done
done
echo "worst final exact match: $worst%"
