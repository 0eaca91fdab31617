#!/bin/sh
# `loom sim calibrate --device cuda` on the emulated GPU (a -DLOOM_CUDA_EMU=ON
# build): two ranks, one GPU each, measure GEMMs (fp32 on TF32, bf16, and
# fp8, as on an sm_90 device), the device's memory and NCCL's collectives
# into a profile of measurements; `loom sim profile` reads it back with its
# fitted curves, and `loom sim` predicts on it. The calibration's numbers are
# the emulator's, not a GPU's: what is checked is the path, not the speed.
# Usage: tests/calibrate_gpu.sh MPIEXEC LOOM WORKDIR
set -u
MPIEXEC=$1 LOOM=$2 WORK=$3
. "$(dirname "$0")/lib.sh"
rm -rf "$WORK" && mkdir -p "$WORK"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
prof="$WORK/gpu.txtpb"
"$MPIEXEC" --oversubscribe --bind-to none -np 2 -x OMP_NUM_THREADS=1 "$LOOM" sim calibrate --device cuda -o "$prof" \
  --gemm-dims 16,32 --seconds 0.01 --mem-mb 4 --max-mb 1 > "$WORK/cal.txt" 2>&1 || fail "calibrate: $(tail -5 "$WORK/cal.txt")"
grep -q "one device each: loom emulated GPU" "$WORK/cal.txt" || fail "no GPU named: $(head -3 "$WORK/cal.txt")"
grep -q "# fitted: PRECISION_FP8 GEMMs" "$WORK/cal.txt" || fail "no fp8 curve on an sm_90 device"
grep -q "# fitted: COLLECTIVE_ALL_GATHER" "$WORK/cal.txt" || fail "no all-gather curve"
"$LOOM" sim profile --cluster "$prof" > "$WORK/profile.txt" 2>&1 || fail "profile: $(cat "$WORK/profile.txt")"
for want in "gemm PRECISION_BF16: .* fitted to 9 measurements" "gemm PRECISION_FP8: .* fitted to 9 measurements" \
  "fp32 GEMMs on TF32" "COLLECTIVE_ALL_REDUCE: .* fitted to 3 measurements" "COLLECTIVE_SEND_RECV: .* fitted to 3 measurements"; do
  grep -q "$want" "$WORK/profile.txt" || fail "the profile lacks '$want': $(cat "$WORK/profile.txt")"
done
"$LOOM" sim --cluster "$prof" --tp 2 --precision bf16 --fp8-format hybrid > "$WORK/sim.txt" 2>&1 || fail "sim: $(cat "$WORK/sim.txt")"
grep -q "step time" "$WORK/sim.txt" || fail "no prediction: $(cat "$WORK/sim.txt")"
rm -rf "$WORK"
echo "ok: calibrated the emulated GPU into a profile that loom sim reads"
