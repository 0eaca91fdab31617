#!/bin/sh
# Every parallel layout under NCCL's rules for point-to-point transfers (a
# send completes only once its receive is posted; sends meet receives in
# issue order per peer, tags ignored), each training the same tiny model for
# 3 steps and giving the serial CPU run's losses to relative 1e-5 (fp32 on
# both: summation order only). MODE cuda runs them with --device cuda on the
# emulated GPU (a -DLOOM_CUDA_EMU=ON build), its ranks talking through the
# emulated NCCL; MODE rendezvous runs them on the CPU under
# LOOM_P2P=rendezvous, MPI with NCCL's rules. In cuda mode FP8 runs on the
# emulated GPU against the CPU too (below).
# Usage: tests/nccl_layouts.sh MPIEXEC LOOM WORKDIR MODE
set -u
MPIEXEC=$1 LOOM=$2 WORK=$3 MODE=$4
rm -rf "$WORK" && mkdir -p "$WORK"
case $MODE in
cuda) device=cuda ;;
rendezvous) device=cpu LOOM_P2P=rendezvous && export LOOM_P2P ;;
*) fail "MODE is cuda or rendezvous, not '$MODE'" ;;
esac
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
. "$(dirname "$0")/lib.sh"

GPT="--layers 4 --hidden 16 --heads 2 --seq 16 --micro-batch 2 --global-batch 8 --steps 3 --eval-every 0 --log-every 1"
GPT32="--layers 2 --hidden 16 --heads 2 --seq 32 --micro-batch 2 --global-batch 4 --steps 3 --eval-every 0 --log-every 1"
GPT24="--layers 2 --hidden 16 --heads 2 --seq 24 --micro-batch 2 --global-batch 4 --steps 3 --eval-every 0 --log-every 1"
# Messages past every eager limit (pipeline activations and cp blocks of 64 KiB): sent only once matched.
WIDE="--layers 2 --hidden 128 --heads 4 --seq 64 --micro-batch 2 --global-batch 4 --steps 3 --eval-every 0 --log-every 1"
MAIN="--seq 16 --micro-batch 16 --micro-batches 4 --steps 3 --eval-every 0 --log-every 1" # scripts/train.sh's job
MOE="--model moe-tiny --seq 16 --micro-batch 2 --global-batch 4 --steps 3 --eval-every 0 --log-every 1"

# serial NAME MODEL: the one-rank CPU run.
serial() {
  "$LOOM" train $2 --device cpu --metrics "$WORK/$1.jsonl" > "$WORK/$1.txt" 2>&1 || fail "serial $1: $(tail -3 "$WORK/$1.txt")"
}

# layout NAME RANKS SERIAL MODEL FLAGS...: the run on the emulated GPU against the serial one.
layout() {
  name=$1 np=$2 base=$3 model=$4
  shift 4
  "$MPIEXEC" --oversubscribe --bind-to none -np "$np" -x OMP_NUM_THREADS=1 ${LOOM_P2P:+-x LOOM_P2P} "$LOOM" train $model --device $device "$@" \
    --metrics "$WORK/$name.jsonl" > "$WORK/$name.txt" 2>&1 || fail "$name: $(tail -5 "$WORK/$name.txt")"
  [ $MODE = rendezvous ] || grep -q "loom emulated GPU" "$WORK/$name.txt" || fail "$name: the device line does not name the emulated GPU"
  [ $MODE = cuda ] || grep -q "LOOM_P2P=rendezvous" "$WORK/$name.txt" || fail "$name: not under LOOM_P2P=rendezvous"
  for i in 1 2 3; do
    a=$(grep "\"step\": $i," "$WORK/$base.jsonl" | sed 's/.*"loss": \([0-9.e+-]*\).*/\1/')
    b=$(grep "\"step\": $i," "$WORK/$name.jsonl" | sed 's/.*"loss": \([0-9.e+-]*\).*/\1/')
    awk -v a="$a" -v b="$b" -v bound="${BOUND:-1e-5}" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a > 0 && b > 0 && d <= bound * a) }' ||
      fail "$name step $i: $MODE '$b', serial CPU '$a'"
  done
  echo "ok: $name ($np ranks, $MODE) equals the serial run"
}

serial gpt "$GPT"
serial gpt24 "$GPT24"
serial gpt32 "$GPT32"
serial moe "$MOE"
serial main "$MAIN"
serial wide "$WIDE"
layout tp2_sp 2 gpt "$GPT" --tp 2 --sequence-parallel
layout pp2_interleaved 2 gpt "$GPT" --pp 2 --vpp 2 --schedule interleaved --micro-batches 4
layout pp2_zb_h1 2 gpt "$GPT" --pp 2 --schedule zb_h1 --micro-batches 4
layout pp2_zb_v 2 gpt "$GPT" --pp 2 --schedule zb_v --micro-batches 4
layout dp2_zero1 2 gpt "$GPT" --dp 2 --zero 1
layout dp2_zero3 2 gpt "$GPT" --dp 2 --zero 3
layout cp2 2 gpt "$GPT" --cp 2
layout cp3 3 gpt24 "$GPT24" --cp 3
layout cp4 4 gpt32 "$GPT32" --cp 4
layout cp2_all_gather 2 gpt "$GPT" --cp 2 --cp-comm-type all_gather
layout ep2 2 moe "$MOE" --dp 2 --ep 2
layout pp2_wide 2 wide "$WIDE" --pp 2 --micro-batches 2
layout cp2_wide 2 wide "$WIDE" --cp 2
layout main_job 4 main "$MAIN" --tp 2 --pp 2
# FP8 on the emulated GPU (its casts and its GEMM kernel) against the CPU's: the bf16 run's GEMM sums in another
# order, now and then moving a value across an FP8 rounding boundary, so tests/fp8.sh's bound for tp 2 against
# serial (1.5e-4) rather than 1e-5. MXFP8 is refused on the emulated sm_90, as on an H100.
if [ $MODE = cuda ]; then
  for recipe in delayed blockwise; do # cuBLASLt's FP8 matmul, and the definition's kernel
    FP8="$GPT --precision bf16 --fp8-format hybrid --fp8-recipe $recipe"
    serial "fp8_$recipe" "$FP8"
    BOUND=1.5e-4 layout "fp8_${recipe}_gpu" 1 "fp8_$recipe" "$FP8"
  done
  "$LOOM" train $GPT --device cuda --precision bf16 --fp8-format hybrid --fp8-recipe mxfp8 > "$WORK/mxfp8.txt" 2>&1
  rc=$?
  [ $rc = 2 ] && grep -q "mxfp8 needs MXFP8 tensor cores (Blackwell, sm_100 on).* is sm_90" "$WORK/mxfp8.txt" ||
    fail "MXFP8 on the emulated sm_90: exit $rc, $(cat "$WORK/mxfp8.txt")"
  echo "ok: FP8 on the emulated GPU equals the CPU's, MXFP8 refused on sm_90"
fi
echo "nccl_layouts ($MODE): ok"
