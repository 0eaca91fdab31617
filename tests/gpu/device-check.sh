#!/bin/sh
# Every GPU check in one run, for a machine with an NVIDIA GPU (one H200 is
# enough; it fits in 8 minutes there), ending with a summary table:
#   - backend parity of every op against the reference backend, in fp32 and
#     with bf16 GEMMs, both attention implementations (test_backend_cuda),
#     and the model on the GPU against the CPU (test_model_cuda);
#   - the NCCL backend: collectives, host values, grouped send/receive;
#   - 50 steps of the default tiny model on the GPU against the CPU, fp32 and bf16;
#   - two ranks sharing the GPU over MPI at tp 2 against the serial run;
#   - the fused attention kernels' speed and memory against cuBLAS attention;
#   - a GPT of 1.3B parameters (24 layers, hidden 2048, seq 2048) in bf16 on
#     one GPU: its MFU (Megatron's FLOPs formula against the dense bf16 peak,
#     989 TFLOP/s on H100/H200) and its memory peak against the plan's estimate.
# Everything goes to the log (default $OUT/device-check.log, else
# build-gpu/device-check.log); the table is printed at the end of the log and
# on stdout. The exit code is non-zero if any check fails.
#   tests/gpu/device-check.sh [LOG]
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$root/build-gpu
log=${1:-${OUT:-$build}/device-check.log}
mkdir -p "$(dirname "$log")" "$build"
table=$build/summary.txt
: > "$table"
exec 3>&1 > "$log" 2>&1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
echo "== $(date -u) on $(hostname)"
nvidia-smi || echo "nvidia-smi failed"
nvcc --version | tail -1
status=0
start_all=$(date +%s)

# record NAME RESULT MEASURED BOUND: one row of the summary.
record() {
  printf '%-34s %-6s %-44s %s\n' "$1" "$2" "$3" "$4" >> "$table"
  [ "$2" = ok ] || status=1
}

# step NAME BOUND CMD...: runs CMD; the row says its exit code and time.
step() {
  name=$1 bound=$2
  shift 2
  echo "== $name"
  t0=$(date +%s)
  "$@"
  code=$?
  echo "== $name: exit $code in $(($(date +%s) - t0)) s"
  record "$name" "$([ $code = 0 ] && echo ok || echo FAIL)" "exit $code, $(($(date +%s) - t0)) s" "$bound"
  return $code
}

# worst relative difference of two metrics files' losses, over their common steps
worst() {
  paste "$1" "$2" | sed 's/.*"loss": \([0-9.e+-]*\).*"loss": \([0-9.e+-]*\).*/\1 \2/' |
    awk 'NF == 2 { d = ($1 - $2) / $1; if (d < 0) d = -d; if (d > w) w = d; n++ } END { if (n == 0) print "none"; else printf "%.2e %d\n", w, n }'
}

# compare NAME A B BOUND: the loss curves of two runs, within BOUND relative at every step.
compare() {
  got=$(worst "$2" "$3")
  echo "$1: worst relative loss difference and steps: $got"
  set -- "$1" "$4" $got
  if [ "$3" = none ] || [ -z "${4:-}" ]; then record "$1" FAIL "no steps to compare" "rel $2"; return; fi
  ok=$(awk -v w="$3" -v b="$2" 'BEGIN { print (w <= b) ? "ok" : "FAIL" }')
  record "$1" "$ok" "worst rel diff $3 over $4 steps" "rel $2"
}

step configure "-" cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DLOOM_CUDA=ON -DLOOM_WERROR=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90 || exit 1
step build "-" cmake --build "$build" -j "$(nproc)" --target loom test_backend_cuda test_model_cuda test_comm_nccl \
  loom_cuda_gemm_bench loom_cuda_attention_bench loom_comm_bench || exit 1
loom=$build/loom

step "op parity (fp32, bf16, both attns)" "NMSE 1e-9 / 1e-4" "$build/tests/test_backend_cuda"
step "model parity (GPU vs CPU)" "see test" "$build/tests/test_model_cuda"
step "NCCL backend" "exact" mpirun --oversubscribe --bind-to none -np 1 "$build/tests/test_comm_nccl"

m=$build/metrics
mkdir -p "$m"
train() { out=$1; shift; "$loom" train --steps 50 --eval-every 0 --metrics "$m/$out.jsonl" "$@"; }
step "tiny fp32, GPU" "-" train cuda32 --device cuda &&
  step "tiny fp32, CPU" "-" train cpu32 --device cpu &&
  compare "tiny fp32: GPU vs CPU, 50 steps" "$m/cpu32.jsonl" "$m/cuda32.jsonl" 1e-3
# bf16 keeps 8 mantissa bits: one value rounded the other way moves by 2^-8
# (0.4%), and a different summation order flips some of them every step.
step "tiny bf16, GPU" "-" train cuda16 --device cuda --precision bf16 &&
  step "tiny bf16, CPU" "-" train cpu16 --device cpu --precision bf16 &&
  compare "tiny bf16: GPU vs CPU, 50 steps" "$m/cpu16.jsonl" "$m/cuda16.jsonl" 2e-2

serial() { "$loom" train --device cuda --steps 20 --eval-every 0 --metrics "$m/serial.jsonl"; }
tp2() {
  mpirun --oversubscribe --bind-to none -np 2 "$loom" train --device cuda --tp 2 --steps 20 --eval-every 0 \
    --metrics "$m/tp2.jsonl"
}
step "serial run, GPU" "-" serial && step "tp 2, two ranks on one GPU (MPI)" "-" tp2 &&
  compare "tp 2 vs serial, 20 steps" "$m/serial.jsonl" "$m/tp2.jsonl" 1e-5

step "fused vs cuBLAS attention" "-" sh -c "'$build/bench/loom_cuda_attention_bench' | tee '$m/attention.txt'"
ratio=$(sed -n 's/^RESULT fused_over_cublas_time=//p' "$m/attention.txt")
record "fused attention time / cuBLAS's" "$(awk -v r="${ratio:-9}" 'BEGIN { print (r <= 1.0) ? "ok" : "FAIL" }')" \
  "${ratio:-none} (T 2048, batch 4, 16 heads of 128)" "<= 1"

step "cuBLAS bf16 GEMM" "-" "$build/bench/loom_cuda_gemm_bench" 8192
step "1.3B bf16 step" "-" sh -c "timeout 300 '$loom' bench step --device cuda --model gpt-1.3b --precision bf16 \
  --seq 2048 --micro-batch 4 --steps 3 | tee '$m/gpt13b.txt'"
mfu=$(sed -n 's/^RESULT seq2048_mfu=\([0-9.]*\).*/\1/p' "$m/gpt13b.txt")
mem=$(sed -n 's/.*seq2048_memory_estimate_over_peak=\([0-9.]*\).*/\1/p' "$m/gpt13b.txt")
record "1.3B MFU (bf16 peak 989)" "$(awk -v x="${mfu:-0}" 'BEGIN { print (x >= 0.5) ? "ok" : "FAIL" }')" \
  "${mfu:-none}" ">= 0.50"
record "1.3B memory: estimate / peak" \
  "$(awk -v x="${mem:-0}" 'BEGIN { print (x >= 0.9 && x <= 1.1) ? "ok" : "FAIL" }')" "${mem:-none}" "0.9 .. 1.1"

gpus=$(nvidia-smi -L 2> /dev/null | grep -c '^GPU')
step "NCCL bus bandwidth" "-" mpirun --oversubscribe --bind-to none -np "${gpus:-1}" "$build/bench/loom_comm_bench" \
  --backend nccl --iters 20

{
  echo
  echo "device check: $(($(date +%s) - start_all)) s, $([ $status = 0 ] && echo ok || echo FAILED)"
  printf '%-34s %-6s %-44s %s\n' check result measured bound
  cat "$table"
} | tee /dev/fd/3
exit $status
