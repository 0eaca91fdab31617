#!/bin/sh
# Sets up and builds loom (scripts/setup.sh), then runs the whole test suite.
set -eu
cd "$(dirname "$0")/.."
scripts/setup.sh "$@"
ctest --test-dir build --output-on-failure -j "$(nproc)"
