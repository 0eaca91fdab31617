#!/bin/sh
# Installs the Debian packages loom needs (only those missing), then
# configures and builds loom into build/. Safe to run any number of times.
# Usage: scripts/setup.sh [extra cmake -D options]
set -eu
cd "$(dirname "$0")/.."

PACKAGES="build-essential cmake pkg-config libopenblas-dev libopenblas-openmp-dev libopenmpi-dev openmpi-bin \
libprotobuf-c-dev protobuf-c-compiler protobuf-compiler check iproute2 libdnnl-dev libpcre2-dev"

scripts/packages.sh $PACKAGES

cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DLOOM_WERROR=ON "$@" >/dev/null
if ! cmake --build build -j "$(nproc)" > build/build.log 2>&1; then
  cat build/build.log
  echo "setup: build failed (log above, also in build/build.log)"
  exit 1
fi
echo "setup: built build/loom"
scripts/npm_references.sh build/npm # the reference tokenizers the tests compare with
