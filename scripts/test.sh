#!/bin/sh
# Sets up and builds loom (scripts/setup.sh), then runs the test suite in
# tiers (ctest labels, tests/CMakeLists.txt): the quick and gpu tiers as
# built, then a second build by clang under AddressSanitizer and UBSan
# running the sanitized tier and every libFuzzer harness (tests/fuzz) for a
# bounded time. What .ci/run runs; under 25 minutes on 2 cores.
# --full runs every tier in both builds: the whole multi-rank matrix, the
# long runs, and all of it again under the sanitizers.
# Usage: scripts/test.sh [--full] [extra cmake -D options]
set -eu
cd "$(dirname "$0")/.."
full=0
if [ "${1:-}" = --full ]; then
  full=1
  shift
fi
start=$(date +%s)
# The interop references (PyTorch, the npm tokenizers) are required here: a missing one fails its test, never skips it.
export LOOM_REQUIRE_REFERENCES=1
elapsed() { echo "$(($(date +%s) - start)) s"; }
scripts/setup.sh "$@"
scripts/packages.sh python3 python3-torch # tests/sim_tables.py; PyTorch's bf16 conversion, the reference for tests/export_bf16.py
plain='quick|gpu' sanitized='sanitized|fuzz'
[ $full = 0 ] || plain='quick|full|gpu' sanitized='quick|full|fuzz'
echo "test: tiers $plain, as built ($(elapsed) so far)"
ctest --test-dir build --output-on-failure -j "$(nproc)" -L "$plain"

# The emulated GPU (src/backend/cuda/emu): the CUDA backend and NCCL built
# by the host compiler, and the emu tier run on them.
echo "test: building the CUDA backend on the emulated GPU into build-emu/ ($(elapsed) so far)"
mkdir -p build-emu
cmake -S . -B build-emu -DCMAKE_BUILD_TYPE=Release -DLOOM_WERROR=ON -DLOOM_CUDA_EMU=ON > build-emu/build.log 2>&1 &&
  cmake --build build-emu -j "$(nproc)" --target loom test_backend_cuda test_model_cuda test_comm_nccl >> build-emu/build.log 2>&1 ||
  { tail -n 40 build-emu/build.log; echo "test: the emulated GPU's build failed (all of it in build-emu/build.log)"; exit 1; }
echo "test: tier emu, on the emulated GPU ($(elapsed) so far)"
ctest --test-dir build-emu --output-on-failure -j "$(nproc)" -L emu

scripts/packages.sh clang libclang-rt-14-dev libomp-dev
echo "test: building under ASan and UBSan into build-fuzz/ ($(elapsed) so far)"
mkdir -p build-fuzz
CC=clang CXX=clang++ cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLOOM_FUZZ=ON -DLOOM_WERROR=ON -DLOOM_CUDA_EMU=ON \
  -DLOOM_NPM_DIR="$PWD/build/npm" > build-fuzz/build.log 2>&1 &&
  cmake --build build-fuzz -j "$(nproc)" >> build-fuzz/build.log 2>&1 ||
  { tail -n 40 build-fuzz/build.log; echo "test: the sanitized build failed (all of it in build-fuzz/build.log)"; exit 1; }
echo "test: tiers $sanitized, under the sanitizers ($(elapsed) so far)"
ctest --test-dir build-fuzz --output-on-failure -j "$(nproc)" -L "$sanitized"
echo "test: passed in $(elapsed)"
