#!/bin/sh
# Installs the Debian packages loom needs (only those missing), then
# configures and builds loom into build/, and installs the reference
# tokenizers the tests compare with. One line per phase; each phase's own
# output goes to build/setup.log, shown (its end) only when the phase fails.
# Safe to run any number of times.
# Usage: scripts/setup.sh [extra cmake -D options]
set -eu
cd "$(dirname "$0")/.."
mkdir -p build
LOOM_SETUP_LOG="$PWD/build/setup.log"
export LOOM_SETUP_LOG
: > "$LOOM_SETUP_LOG"

# phase NAME COMMAND...: runs COMMAND into the log; on failure shows the log's end and stops.
phase() {
  name=$1
  shift
  if ! "$@" >> "$LOOM_SETUP_LOG" 2>&1; then
    tail -n 40 "$LOOM_SETUP_LOG"
    echo "setup: $name failed (last lines above; all of it in $LOOM_SETUP_LOG)"
    exit 1
  fi
}

PACKAGES="build-essential cmake pkg-config libopenblas-dev libopenblas-openmp-dev libopenmpi-dev openmpi-bin \
libprotobuf-c-dev protobuf-c-compiler protobuf-compiler check iproute2 libdnnl-dev libpcre2-dev"

scripts/packages.sh $PACKAGES
phase configure cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DLOOM_WERROR=ON "$@"
echo "setup: configured build/"
phase build cmake --build build -j "$(nproc)"
echo "setup: built build/loom"
scripts/npm_references.sh build/npm # the reference tokenizers the tests compare with
