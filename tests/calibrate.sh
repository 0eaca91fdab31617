#!/bin/sh
# `loom sim calibrate` end to end: two ranks measure their devices into a
# profile of measurements (GEMMs over a small grid, the memory, and the
# collectives at three sizes), `loom sim profile` reads it back with its
# fitted curves, and `loom sim` predicts on it. DEVICE cuda runs it on the
# emulated GPU (a -DLOOM_CUDA_EMU=ON build): fp32 on TF32, bf16 and fp8 (an
# sm_90 device), NCCL's collectives; cpu on this machine's ranks: fp32 and
# bf16, MPI's. The figures are whatever the device gives; what is checked is
# the path, not the speed.
# Usage: tests/calibrate.sh MPIEXEC LOOM WORKDIR DEVICE
set -u
MPIEXEC=$1 LOOM=$2 WORK=$3 DEVICE=$4
. "$(dirname "$0")/lib.sh"
rm -rf "$WORK" && mkdir -p "$WORK"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
case $DEVICE in
cuda) named="loom emulated GPU" kinds="PRECISION_FP32 PRECISION_BF16 PRECISION_FP8" extra="fp32 GEMMs on TF32" ;;
cpu) named="this machine's rank" kinds="PRECISION_FP32 PRECISION_BF16" extra="peaks (TFLOP/s, dense)" ;;
*) fail "DEVICE is cuda or cpu, not '$DEVICE'" ;;
esac
prof="$WORK/profile.txtpb"
"$MPIEXEC" --oversubscribe --bind-to none -np 2 -x OMP_NUM_THREADS=1 "$LOOM" sim calibrate --device "$DEVICE" -o "$prof" \
  --gemm-dims 16,32 --seconds 0.01 --mem-mb 4 --max-mb 1 > "$WORK/cal.txt" 2>&1 || fail "calibrate: $(tail -5 "$WORK/cal.txt")"
grep -q "one device each: $named" "$WORK/cal.txt" || fail "no device named: $(head -3 "$WORK/cal.txt")"
grep -q "# fitted: COLLECTIVE_ALL_GATHER" "$WORK/cal.txt" || fail "no all-gather curve"
"$LOOM" sim profile --cluster "$prof" > "$WORK/profile.txt" 2>&1 || fail "profile: $(cat "$WORK/profile.txt")"
for kind in $kinds; do
  grep -q "gemm $kind: .* fitted to 9 measurements" "$WORK/profile.txt" || fail "no $kind curve: $(cat "$WORK/profile.txt")"
done
[ "$DEVICE" = cuda ] || ! grep -q "gemm PRECISION_FP8" "$WORK/profile.txt" || fail "an fp8 curve on a device without fp8"
for want in "$extra" "COLLECTIVE_ALL_REDUCE: .* fitted to 3 measurements" "COLLECTIVE_SEND_RECV: .* fitted to 3 measurements"; do
  grep -q "$want" "$WORK/profile.txt" || fail "the profile lacks '$want': $(cat "$WORK/profile.txt")"
done
precision="--precision bf16"
[ "$DEVICE" = cpu ] || precision="$precision --fp8-format hybrid"
"$LOOM" sim --cluster "$prof" --tp 2 $precision > "$WORK/sim.txt" 2>&1 || fail "sim: $(cat "$WORK/sim.txt")"
grep -q "step time" "$WORK/sim.txt" || fail "no prediction: $(cat "$WORK/sim.txt")"
rm -rf "$WORK"
echo "ok: calibrated $DEVICE into a profile that loom sim reads"
