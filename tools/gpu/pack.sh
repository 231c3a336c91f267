#!/usr/bin/env bash
# Packs a CUDA build for a GPU machine that has the NVIDIA driver, CUDA 13's cuBLAS and NCCL and a python3 with
# torch, but none of strata's Debian libraries (the lent machines: see README "Checking on a GPU").
#   tools/gpu/pack.sh BUILD PACK
# BUILD is a CUDA build tree (tools/run gpu-pack makes one). PACK (made afresh) gets one file, strata-gpu.tar.xz
# (about 32 MB: a carried path may take 64 MiB with the source tree; OpenBLAS is 37 MB unpacked, fio with its
# libraries about 70), that check.sh unpacks on the GPU machine. It holds:
#   bin/           the CLI, the test programs and host benchmarks tools/gpu/check.sh runs (tools/gpu/items.sh names
#                  them), and fio
#   lib/           libstrata.so and the Debian libraries they load that such a machine lacks (liburing, hwloc,
#                  jansson, OpenBLAS, Open MPI, ...); glibc, libstdc++ and the CUDA libraries come from the machine
#   lib-fallback/  libraries most machines have (zlib, libudev): check.sh adds them only where the machine has none
#   ompi/usr/      Open MPI's mpirun with its plugins and help files, relocated through OPAL_PREFIX
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${1:?usage: tools/gpu/pack.sh BUILD PACK}
out=${2:?usage: tools/gpu/pack.sh BUILD PACK}
. "$ROOT/tools/gpu/items.sh"

[ -x "$build/strata" ] || { echo "pack.sh: no strata in $build; build it first (tools/run gpu-pack)" >&2; exit 2; }
"$build/strata" info | grep -q '^  cuda backend  *built for' ||
    { echo "pack.sh: $build was built without CUDA (needs nvcc on PATH; -DSTRATA_CUDA=ON)" >&2; exit 2; }
pack=$(mktemp -d)
trap 'rm -rf "$pack"' EXIT
mkdir -p "$pack/bin" "$pack/lib" "$pack/lib-fallback" "$pack/ompi/usr/bin" "$pack/ompi/usr/share" \
    "$pack/ompi/usr/lib/x86_64-linux-gnu"

# Which source the programs were built from, printed by check.sh at the head of its table.
commit=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)
git -C "$ROOT" diff --quiet HEAD 2>/dev/null || commit+=+changes
echo "$commit, packed $(date -u +%Y-%m-%dT%H:%MZ) from $build" >"$pack/BUILD"
cp "$build/strata" "$pack/bin/"
for t in "${GPU_C_TESTS[@]}" "${GPU_MPI_TESTS[@]}" "${GPU_BENCHMARKS[@]}"; do
    cp "$build/$t" "$pack/bin/"
done
# fio, the I/O engine's peer in benchmarks/io_peers.sh, with the libraries it loads (Ceph's and ICU's among them:
# Debian links them in; about 8 MB of the packed file).
command -v fio >/dev/null && cp "$(command -v fio)" "$pack/bin/" ||
    echo "pack.sh: no fio here (apt-get install fio); io_peers will skip on the GPU machine" >&2
cp -a "$build"/libstrata.so* "$pack/lib/"

# Open MPI as Debian lays it out under /usr; OPAL_PREFIX and PMIX_INSTALL_PREFIX point it at the copy. The Java,
# Fortran and static parts are left out.
ompi=/usr/lib/x86_64-linux-gnu/openmpi
if [ -d "$ompi" ] && command -v orterun >/dev/null; then
    cp "$(command -v orterun)" "$pack/ompi/usr/bin/orterun"
    ln -s orterun "$pack/ompi/usr/bin/mpirun"
    mkdir -p "$pack/ompi$ompi/lib"
    cp -a "$ompi/lib/openmpi3" "$pack/ompi$ompi/lib/"
    for f in "$ompi"/lib/lib{mpi,open-rte,open-pal,mca_common_sm,mca_common_ompio,mca_common_monitoring}.so*; do
        cp -a "$f" "$pack/ompi$ompi/lib/"
    done
    cp -a /usr/lib/x86_64-linux-gnu/pmix2 "$pack/ompi/usr/lib/x86_64-linux-gnu/"
    rm -f "$pack/ompi/usr/lib/x86_64-linux-gnu/pmix2/lib/"*.a
    cp -a /usr/share/openmpi "$pack/ompi/usr/share/"
    [ -d /usr/share/pmix ] && cp -a /usr/share/pmix "$pack/ompi/usr/share/"
else
    echo "pack.sh: no Open MPI here (apt-get install openmpi-bin); the 2-rank checks will skip" >&2
fi

# Every library the programs, libstrata and mpirun load, resolved here, minus what the machine brings and what the
# pack holds already. Open MPI's plugins are not followed: those for other networks (UCX, libfabric, verbs, PSM)
# need 30 MB of libraries, and check.sh's runs use shared memory alone (a plugin that cannot load is passed over).
needs() {
    ldd "$pack"/bin/* "$pack"/lib/libstrata.so "$pack"/ompi/usr/bin/orterun "$pack/ompi$ompi"/lib/*.so* 2>/dev/null |
        awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u
}
for lib in $(needs); do
    name=$(basename "$lib")
    case $name in
    libc.so* | libm.so* | libpthread.so* | libdl.so* | librt.so* | ld-linux* | libstdc++.so* | libgcc_s.so* | \
        libcublas* | libcudart* | libnccl* | libcuda.so* | libnvidia*) ;;
    libz.so* | libudev.so*) cp -L "$lib" "$pack/lib-fallback/$name" ;;
    libstrata.so* | libmpi.so* | libopen-rte.so* | libopen-pal.so* | libmca_common_*) ;; # packed above
    *) cp -L "$lib" "$pack/lib/$name" ;;
    esac
done
rm -rf "$out"
mkdir -p "$out"
tar -C "$pack" -cf - . | xz -T0 -6 >"$out/strata-gpu.tar.xz"
echo "pack.sh: $out/strata-gpu.tar.xz: $(du -sh "$out/strata-gpu.tar.xz" | cut -f1), $(du -sh "$pack" | cut -f1) and" \
    "$(find "$pack" -type f | wc -l) files unpacked"
