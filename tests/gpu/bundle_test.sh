#!/bin/sh
# The GPU bundle (tests/gpu/bundle.sh) runs from a clean folder with only its
# own libraries: in a mount namespace where this machine's copies of every
# library it carries, Open MPI's tree and its launcher are hidden, the
# bundle's loom trains on the CPU backend, alone and as two pipeline ranks
# under the bundle's mpirun, and its GPU programs load (they skip, with no
# GPU). It bundles the build under test (BUILD), never another. Skips (77)
# where that build has no CUDA backend, nvcc is missing, or namespaces are refused.
#   tests/gpu/bundle_test.sh WORKDIR BUILD
set -u
work=$1 build=$(cd "$2" && pwd)
root=$(cd "$(dirname "$0")/../.." && pwd)
fail() { echo "FAIL: $*"; exit 1; }
grep -q '^LOOM_CUDA:BOOL=ON' "$build/CMakeCache.txt" || { echo "skip: $build has no CUDA backend"; exit 77; }
command -v nvcc > /dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ] || { echo "skip: no nvcc to build the bundle's GPU programs"; exit 77; }
unshare -m true 2> /dev/null || { echo "skip: no mount namespaces here"; exit 77; }
rm -rf "$work" && mkdir -p "$work"
LOOM_BUILD=$build LOOM_BUNDLE_XZ_LEVEL=0 "$root/tests/gpu/bundle.sh" "$work" > "$work/bundle.txt" 2>&1 || fail "bundle: $(cat "$work/bundle.txt")"
cat "$work/bundle.txt"
clean=$(mktemp -d)
trap 'rm -rf "$clean"' EXIT
tar -C "$clean" -xJf "$work/loom-gpu-bundle.tar.xz" || fail "unpack"
b=$clean/loom-gpu-bundle
[ "$(ls "$b/lib" | wc -l)" -gt 5 ] || fail "the bundle carries almost no libraries: $(ls "$b/lib")"

# What the bundle must not lean on: the system's copies of what it carries.
# mount itself needs one of them (PCRE2): it runs on copies of its own.
arch=$(gcc -dumpmachine)
mkdir -p "$work/mount-libs"
ldd "$(command -v mount)" | awk '$2 == "=>" { print $3 }' | xargs -I{} cp -L {} "$work/mount-libs/"
cat > "$work/inside.sh" << EOF
set -u
export LD_LIBRARY_PATH=$work/mount-libs
for f in "$b"/lib/*; do
  for dir in /usr/lib/$arch /usr/lib/$arch/openblas-openmp /usr/lib/$arch/openblas-pthread /usr/lib/$arch/pmix2/lib; do
    [ -e "\$dir/\$(basename "\$f")" ] && mount --bind /dev/null "\$dir/\$(basename "\$f")"
  done
done
for d in /usr/lib/$arch/openmpi /usr/share/openmpi /usr/lib/$arch/pmix2; do mount -t tmpfs none "\$d"; done
for f in /usr/bin/orterun /usr/bin/orted /usr/bin/mpirun; do [ -e "\$f" ] && mount --bind /dev/null "\$f"; done
unset LD_LIBRARY_PATH
cd "$b"
BUNDLE_ENV=$b/env.sh . ./env.sh
ldd bin/loom | grep -v libnccl | grep 'not found' && exit 3
command -v mpirun
bin/loom train --device cpu --steps 3 --eval-every 0 || exit 4
mpirun --oversubscribe --bind-to none -np 2 -x OMP_NUM_THREADS=1 bin/loom train --device cpu --pp 2 --steps 3 \
  --eval-every 0 || exit 5
bin/test_backend_cuda; [ \$? = 77 ] || exit 6
EOF
unshare -m sh "$work/inside.sh" > "$work/inside.txt" 2>&1
code=$?
cat "$work/inside.txt"
[ $code = 0 ] || fail "from the bundle alone (exit $code): see above"
[ "$(grep -c '^step  *3/3 |' "$work/inside.txt")" = 2 ] || fail "both runs should reach step 3"
grep -q "^$b/ompi/bin/mpirun$" "$work/inside.txt" || fail "mpirun is not the bundle's"
! grep -q "couldn't open the help file\|not found" "$work/inside.txt" || fail "a file the bundle lacks (above)"
echo ok
