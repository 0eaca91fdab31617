#!/bin/sh
# Sets up and builds loom (scripts/setup.sh), then runs the whole test suite:
# once as built, then again built by clang under AddressSanitizer and UBSan
# with the libFuzzer harnesses (tests/fuzz), each fuzzing for a bounded time.
set -eu
cd "$(dirname "$0")/.."
scripts/setup.sh "$@"
scripts/packages.sh python3 python3-torch # tests/sc21_table1.py; PyTorch's bf16 conversion, the reference for tests/export_bf16.py
ctest --test-dir build --output-on-failure -j "$(nproc)"

scripts/packages.sh clang libclang-rt-14-dev libomp-dev
CC=clang cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLOOM_FUZZ=ON -DLOOM_WERROR=ON -DLOOM_CUDA=OFF \
  -DLOOM_NPM_DIR="$PWD/build/npm" >/dev/null
cmake --build build-fuzz -j "$(nproc)" > build-fuzz/build.log 2>&1 || { cat build-fuzz/build.log; exit 1; }
ctest --test-dir build-fuzz --output-on-failure -j "$(nproc)"
