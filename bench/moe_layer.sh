#!/bin/sh
# A Mixture-of-Experts model against the dense model of equal active FLOPs,
# measured in one run of this script on the same cores: each trains STEPS
# steps at dp 2 (one rank per core, as mpirun binds them), the MoE model
# with every expert on each rank (ep 1) and split over the two (ep 2). The
# dense model's MLP is as wide as the MoE's top-k experts together (ffn =
# k x fe), so both do the same GEMM FLOPs per token; what the MoE model
# adds is its router (a GEMM to E scores and the host's top-k), the rows'
# gather and weighted combine, its GEMMs split per expert over uneven row
# counts, and at ep 2 the all-to-alls that carry the rows there and back.
# Prints the CPU and GEMM library, then one row per run (the median step
# after the first) and the shares: (MoE ep 1 - dense) / MoE ep 1 for the
# router and permutation, (MoE ep 2 - MoE ep 1) / MoE ep 2 for the
# all-to-alls.
# Usage: bench/moe_layer.sh LOOM [train flags that shape both models...]
#   e.g. bench/moe_layer.sh build/loom
set -u
. "$(dirname "$0")/lib.sh"
LOOM=$1
shift
STEPS=${STEPS:-8}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT INT TERM
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
E=8 K=2 FE=256
SHAPE="--layers 2 --hidden 256 --heads 4 --kv-heads 2 --seq 256 --micro-batch 8 --global-batch 32 --vocab 256
  --norm rmsnorm --mlp swiglu --position rope --no-bias --untied"
run() { # run NAME FLAGS...: STEPS steps at dp 2; prints the median step in ms
  name=$1
  shift
  mpirun -np 2 -x OMP_NUM_THREADS=1 "$LOOM" train $SHAPE --dp 2 --steps "$STEPS" --eval-every 0 --metrics "$WORK/$name.jsonl" \
    "$@" > "$WORK/$name.log" 2>&1 || { echo "$name failed:" >&2; cat "$WORK/$name.log" >&2; exit 1; }
  median_step_ms "$WORK/$name.jsonl"
}
dense=$(run dense --ffn $((K * FE)) "$@")
sed -n 's/^device: /device: /p' "$WORK/dense.log" | head -1
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //')"
moe1=$(run moe1 --ffn $((K * FE)) --num-experts $E --moe-router-topk $K --moe-ffn-hidden-size $FE "$@")
moe2=$(run moe2 --ffn $((K * FE)) --num-experts $E --moe-router-topk $K --moe-ffn-hidden-size $FE --ep 2 "$@")
echo "| model (dp 2) | step (ms) |"
echo "|---|---|"
echo "| dense, ffn $((K * FE)) | $dense |"
echo "| MoE, $E experts of $FE, top $K, ep 1 | $moe1 |"
echo "| the same at ep 2 | $moe2 |"
awk -v d="$dense" -v a="$moe1" -v b="$moe2" 'BEGIN {
  printf "router, permutation and per-expert GEMMs: %.0f%% of the MoE step at ep 1 (%.2fx the dense step)\n", 100 * (a - d) / a, a / d
  printf "all-to-alls at ep 2: %.0f%% of its step (%.2fx ep 1)\n", 100 * (b - a) / b, b / a }'
