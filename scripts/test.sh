#!/bin/sh
# Sets up and builds loom (scripts/setup.sh), then runs the whole test suite.
set -eu
cd "$(dirname "$0")/.."
scripts/setup.sh "$@"
ctest --test-dir build --output-on-failure -j "$(nproc)"
# The plan decoder's bounded fuzz run and the loader's and checkpoint
# writer's allocation-failure runs, under AddressSanitizer and UBSan.
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DLOOM_SANITIZE=ON -DLOOM_WERROR=ON -DLOOM_CUDA=OFF >/dev/null
cmake --build build-asan --target test_plan test_ckpt -j "$(nproc)" > build-asan/build.log 2>&1 || { cat build-asan/build.log; exit 1; }
ctest --test-dir build-asan --output-on-failure -R '^test_(plan|ckpt)$'
