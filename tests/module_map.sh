#!/bin/sh
# The build enforces DESIGN.md's module map: each folder of src/ compiles
# against build/modules/<folder>/, which holds only itself and the folders
# above it. For every folder this compiles one header of its own and one of
# the first folder (both must build) and one header of the folder listed
# next (which must not).
# Usage: module_map.sh CC MODULE_DIR PROTO_DIR SRC_DIR MODULE...
set -eu
cc=$1 modules=$2 proto=$3 src=$4
shift 4
fail() { echo "FAIL: $*"; exit 1; }
header_of() { (cd "$src" && ls "$1"/*.h | head -n 1); }
compiles() { # folder header
  printf '#include "%s"\n' "$2" | "$cc" -fsyntax-only -D_POSIX_C_SOURCE=200809L -I"$modules/$1" -I"$proto" -x c - 2>/dev/null
}
first=$(header_of "$1")
checked=0
while [ $# -gt 0 ]; do
  module=$1
  shift
  own=$(header_of "$module")
  compiles "$module" "$own" || fail "src/$module cannot include its own $own"
  compiles "$module" "$first" || fail "src/$module cannot include $first, from the top of the map"
  if [ $# -gt 0 ]; then
    below=$(header_of "$1")
    ! compiles "$module" "$below" || fail "src/$module includes $below, from src/$1 below it, and the build lets it"
  fi
  checked=$((checked + 1))
done
[ "$checked" -ge 10 ] || fail "only $checked folders checked"
echo "module map: $checked folders, each sees only itself and the folders above it"
