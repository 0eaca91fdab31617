#!/bin/sh
# Packs what tests/gpu/device-check.sh runs into one self-contained archive
# for a GPU machine whose image has CUDA, cuBLAS, cuDNN and NCCL (as system
# libraries or Python wheels) but none of loom's other dependencies, and
# where nothing can be built or installed:
#   OUT/loom-gpu-bundle.tar.xz, unpacking to loom-gpu-bundle/:
#     bin/       loom, the GPU test programs and benchmarks (built here by nvcc, sm_80 and sm_90)
#     lib/       every shared library they and Open MPI need beyond the C and C++ runtimes
#                (Open MPI, PMIx, hwloc, libevent, protobuf-c, PCRE2, OpenBLAS, oneDNN, OpenMP)
#     ompi/      Open MPI's launcher, plugins and help files, relocated (OPAL_PREFIX)
#     pmix2/     PMIx's plugins and help files, relocated (PMIX_PREFIX)
#     env.sh     sets the paths: the bundle's, and the image's CUDA libraries wherever they are
#     device-check.sh
# It builds build/ first if needed (scripts/setup.sh), and refuses an archive
# of 60 MiB or more, or a build without the CUDA backend.
#   tests/gpu/bundle.sh OUT
# LOOM_BUNDLE_XZ_LEVEL (default 6) sets xz's preset: bundle_test.sh takes 0,
# a larger archive in a tenth of the time, as it only unpacks it again.
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:?usage: tests/gpu/bundle.sh OUT}
build=${LOOM_BUILD:-$root/build} # the build to bundle (bundle_test.sh names the one under test)
[ -x "$build/loom" ] || "$root/scripts/setup.sh" > /dev/null
grep -q '^LOOM_CUDA:BOOL=ON' "$build/CMakeCache.txt" && [ -f "$build/tests/test_backend_cuda" ] ||
  { echo "bundle: build/ has no CUDA backend (nvcc missing?)" >&2; exit 1; }
cmake --build "$build" -j "$(nproc)" --target loom test_backend_cuda test_model_cuda test_comm_nccl \
  loom_cuda_gemm_bench loom_cuda_attention_bench loom_comm_bench > /dev/null

mkdir -p "$out"
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
b=$stage/loom-gpu-bundle
ompi_lib=/usr/lib/$(gcc -dumpmachine)/openmpi/lib
mkdir -p "$b/bin" "$b/lib" "$b/ompi/bin" "$b/ompi/share"
for p in loom tests/test_backend_cuda tests/test_model_cuda tests/test_comm_nccl \
  bench/loom_cuda_gemm_bench bench/loom_cuda_attention_bench bench/loom_comm_bench; do
  cp "$build/$p" "$b/bin/"
done
cp "$root/tests/gpu/device-check.sh" "$b/"

# Open MPI, relocatable under OPAL_PREFIX: its tree mirrors the installed
# one under /usr. Plugins for networks this machine has no use for (UCX,
# PSM, libfabric, verbs) stay behind, with their libraries.
rel=${ompi_lib#/usr/}
mkdir -p "$b/ompi/$rel/openmpi3"
cp /usr/bin/orterun /usr/bin/orted "$b/ompi/bin/"
ln -s orterun "$b/ompi/bin/mpirun"
cp -r /usr/share/openmpi "$b/ompi/share/"
skip='libucp|libuct|libucs|libucm|libpsm|libfabric|libibverbs|librdmacm|libefa|libinfinipath|libnl-'
for so in "$ompi_lib"/openmpi3/*.so; do
  ldd "$so" | grep -Eq "$skip|not found" || cp "$so" "$b/ompi/$rel/openmpi3/"
done

# PMIx, which Open MPI's launcher runs on, relocatable under PMIX_PREFIX (Debian's names its data and plugin folders
# outright: PMIX_PKGDATADIR and PMIX_PKGLIBDIR move those).
pmix=/usr/lib/$(gcc -dumpmachine)/pmix2
mkdir -p "$b/pmix2/lib"
cp -r "$pmix/share" "$b/pmix2/"
cp -r "$pmix/lib/pmix" "$b/pmix2/lib/"

# The shared libraries of all of it, less what every Linux image has (the C
# and C++ runtimes) and what the GPU image provides (the driver, NCCL).
image='linux-vdso|ld-linux|/libc\.so|/libm\.so|/libpthread|/libdl\.so|/librt\.so|libstdc\+\+|libgcc_s|libnccl|libcuda\.so'
for f in "$b"/bin/* "$b"/ompi/bin/orterun "$b"/ompi/bin/orted "$b"/ompi/"$rel"/openmpi3/*.so "$b"/pmix2/lib/pmix/*.so; do
  ldd "$f" | awk '$2 == "=>" && $3 ~ /^\// { print $3 }'
done | sort -u | grep -Ev "$image" | while read -r lib; do cp -L "$lib" "$b/lib/"; done

cat > "$b/env.sh" << 'EOF'
# . env.sh: the bundle's programs, libraries and Open MPI, and the image's
# CUDA libraries (NCCL, cuBLAS, cuDNN) from its system paths or Python wheels.
here=$(cd "$(dirname "${BUNDLE_ENV:-.}")" && pwd)
[ -x "$here/bin/loom" ] || here=$(pwd)
cuda_dirs=$(find /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/lib/x86_64-linux-gnu /opt /usr/local/lib /usr/lib/python3* \
  \( -name 'libnccl.so*' -o -name 'libcublas.so*' -o -name 'libcudnn.so*' -o -name 'libcublasLt.so*' \) \
  -printf '%h\n' 2> /dev/null | sort -u | tr '\n' ':')
export LD_LIBRARY_PATH="$here/lib:${cuda_dirs}${LD_LIBRARY_PATH:-}"
export OPAL_PREFIX="$here/ompi" PATH="$here/ompi/bin:$here/bin:$PATH"
export PMIX_PREFIX="$here/pmix2" PMIX_PKGDATADIR="$here/pmix2/share/pmix" PMIX_PKGLIBDIR="$here/pmix2/lib/pmix"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl=self,vader,tcp OMPI_MCA_pml=ob1 OMPI_MCA_mca_base_component_show_load_errors=0
EOF

tar -C "$stage" -cf - loom-gpu-bundle | xz -T "$(nproc)" "-${LOOM_BUNDLE_XZ_LEVEL:-6}" > "$out/loom-gpu-bundle.tar.xz"
size=$(stat -c %s "$out/loom-gpu-bundle.tar.xz")
unpacked=$(du -sb "$b" | cut -f1)
echo "bundle: $out/loom-gpu-bundle.tar.xz, $((size / 1048576)) MiB ($((unpacked / 1048576)) MiB unpacked), $(ls "$b/lib" | wc -l) libraries"
[ "$size" -lt $((60 * 1048576)) ] || { echo "bundle: over 60 MiB" >&2; exit 1; }
