#!/bin/sh
# The GPU checks, as one script for a machine with an NVIDIA GPU (sized to
# finish in a few minutes): a Release build with the CUDA backend, the
# backend-parity test, the NCCL communicator test and benchmark (one rank per
# GPU), and cuBLAS's bf16 GEMM throughput against the device peak. Everything goes to the log (default $OUT/device-check.log, else
# build-gpu/device-check.log); the exit code is non-zero if any check fails.
#   tests/gpu/device-check.sh [LOG]
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
log=${1:-${OUT:-$root/build-gpu}/device-check.log}
mkdir -p "$(dirname "$log")"
exec > "$log" 2>&1
echo "== $(date -u) on $(hostname)"
nvidia-smi || echo "nvidia-smi failed"
nvcc --version | tail -1
status=0
step() { name=$1; shift; echo "== $name"; start=$(date +%s); "$@"; code=$?; echo "== $name: exit $code in $(( $(date +%s) - start )) s"; [ $code = 0 ] || status=1; }
step configure cmake -S "$root" -B "$root/build-gpu" -DCMAKE_BUILD_TYPE=Release -DLOOM_CUDA=ON -DLOOM_WERROR=ON
step build cmake --build "$root/build-gpu" -j "$(nproc)" --target test_backend_cuda test_model_cuda test_comm_nccl loom_cuda_gemm_bench loom_comm_bench loom
step backend-parity "$root/build-gpu/tests/test_backend_cuda"
step model-parity "$root/build-gpu/tests/test_model_cuda"
# 50 steps of the default tiny model on the GPU and on the CPU: the loss curves must agree.
step train-cuda "$root/build-gpu/loom" train --device cuda --steps 50 --eval-every 0 --metrics "$root/build-gpu/cuda.jsonl"
step train-cpu "$root/build-gpu/loom" train --device cpu --steps 50 --eval-every 0 --metrics "$root/build-gpu/cpu.jsonl"
curves() {
  paste "$root/build-gpu/cpu.jsonl" "$root/build-gpu/cuda.jsonl" | sed 's/.*"loss": \([0-9.e+-]*\).*"loss": \([0-9.e+-]*\).*/\1 \2/' |
    awk '{ d = ($1 - $2) / $1; if (d < 0) d = -d; if (d > w) w = d } END { printf "worst relative loss difference over %d steps: %.2e\n", NR, w; exit w > 1e-3 }'
}
step loss-curves curves
gpus=$(nvidia-smi -L 2> /dev/null | grep -c '^GPU' || echo 1)
step nccl-backend env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
  mpirun --oversubscribe --bind-to none -np "${gpus:-1}" "$root/build-gpu/tests/test_comm_nccl"
step nccl-bench env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
  mpirun --oversubscribe --bind-to none -np "${gpus:-1}" "$root/build-gpu/bench/loom_comm_bench" --backend nccl --iters 20
step bf16-gemm "$root/build-gpu/bench/loom_cuda_gemm_bench" 4096 8192 16384
step bench-gpt2-small timeout 240 "$root/build-gpu/loom" bench step --device cuda --model gpt2-small --micro-batch 8 --steps 3
step bench-gpt-1.3b timeout 300 "$root/build-gpu/loom" bench step --device cuda --model gpt-1.3b --micro-batch 4 --seq 1024 --steps 2
echo "== device-check: $([ $status = 0 ] && echo ok || echo FAILED)"
exit $status
