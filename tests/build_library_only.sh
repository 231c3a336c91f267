#!/usr/bin/env bash
# The library builds and installs alone: a fresh build tree configured with the model, CLI, tests and benchmarks off
# (and no CUDA, to keep it short) never looks OpenBLAS up, libstrata.so does not link it, the install holds the
# header, the libraries and both package files, and a C program built against the installed prefix alone runs.
# Also proves that asking for the CLI without the model stops the configure with a message that says what to do.
set -u
src=${STRATA_SOURCE_DIR:?STRATA_SOURCE_DIR must name the source root}
command -v cmake >/dev/null || { echo "SKIP: no cmake on PATH"; exit 77; }
command -v pkg-config >/dev/null || { echo "SKIP: no pkg-config on PATH (the build needs it)"; exit 77; }
. "$src/tests/helpers/cli.sh"
mkdir -p "${STRATA_SCRATCH:-/tmp}"
cli_scratch build_library_only
ok() { passed=$((passed + 1)); }
started=$SECONDS

# An impossible combination is refused at configure time, naming the options to change.
if cmake -S "$src" -B "$scratch/refused" -DSTRATA_BUILD_MODEL=OFF -DSTRATA_BUILD_CLI=ON -DSTRATA_CUDA=OFF \
    >"$scratch/refused.log" 2>&1; then
    fail "configure with STRATA_BUILD_MODEL=OFF STRATA_BUILD_CLI=ON succeeded"
elif msg=$(tr -s ' \n' ' ' <"$scratch/refused.log") &&   # CMake wraps the message; unwrap it
    grep -q 'STRATA_BUILD_CLI=ON needs STRATA_BUILD_MODEL=ON' <<<"$msg" &&
    grep -q -- '-DSTRATA_BUILD_MODEL=OFF -DSTRATA_BUILD_CLI=OFF -DSTRATA_TESTS=OFF' <<<"$msg"; then
    ok
else
    cat "$scratch/refused.log"; fail "the refused configure did not say which options to change"
fi

# The library alone: -DSTRATA_BUILD_MODEL=OFF is enough (the CLI and the tests default to the model's setting).
build=$scratch/build
prefix=$scratch/prefix
# Build type None (no -O): this proves what is built and installed, not how fast it runs, and compiles ~3x faster.
if ! cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=None -DSTRATA_BUILD_MODEL=OFF -DSTRATA_CUDA=OFF \
    -DSTRATA_BUILD_BENCHMARKS=OFF >"$scratch/configure.log" 2>&1; then
    cat "$scratch/configure.log"; echo "FAIL configure of the library alone"; exit 1
fi
for opt in STRATA_BUILD_CLI STRATA_TESTS; do
    grep -q "^$opt:BOOL=OFF" "$build/CMakeCache.txt" && ok || fail "$opt did not follow STRATA_BUILD_MODEL=OFF"
done
openblas=$(grep -v '^//' "$build/CMakeCache.txt" | grep -i 'openblas')   # entries, not the options' help text
[ -z "$openblas" ] && ok || fail "OpenBLAS was looked up: $(echo "$openblas" | head -3)"
if ! cmake --build "$build" -j2 >"$scratch/build.log" 2>&1; then
    tail -40 "$scratch/build.log"; echo "FAIL build of the library alone"; exit 1
fi
[ ! -e "$build/strata" ] && ok || fail "the CLI was built with STRATA_BUILD_CLI=OFF"
[ -z "$(ls "$build"/libstrata_model* 2>/dev/null)" ] && ok || fail "the model was built with STRATA_BUILD_MODEL=OFF"
cmake --install "$build" --prefix "$prefix" >"$scratch/install.log" 2>&1 || { cat "$scratch/install.log"; fail "install"; }

libdir=$(ls -d "$prefix"/lib* | head -1)
so=$(ls "$libdir"/libstrata.so.* 2>/dev/null | head -1)
for f in "$prefix/include/strata.h" "$so" "$libdir/libstrata.a" "$libdir/cmake/strata/strataConfig.cmake" \
    "$libdir/pkgconfig/strata.pc"; do
    [ -n "$f" ] && [ -f "$f" ] && ok || fail "not installed: ${f:-libstrata.so.*}"
done
[ ! -e "$prefix/bin/strata" ] && ok || fail "the CLI was installed with STRATA_BUILD_CLI=OFF"
needed=$(readelf -d "$so" | grep NEEDED)
! grep -qi blas <<<"$needed" && ok || fail "libstrata.so needs a BLAS: $(grep -i blas <<<"$needed")"
! ldd "$so" | grep -qi openblas && ok || fail "libstrata.so loads OpenBLAS: $(ldd "$so" | grep -i openblas)"

cat >"$scratch/main.c" <<'C'
#include <stdio.h>
#include <strata.h>
int main(void)
{
    printf("strata %s\n", strata_version());
    return 0;
}
C
want="strata $(sed -n 's/^project(strata VERSION \([0-9.]*\).*/\1/p' "$src/CMakeLists.txt")"
if PKG_CONFIG_PATH="$libdir/pkgconfig" cc "$scratch/main.c" -o "$scratch/consumer" \
    $(PKG_CONFIG_PATH="$libdir/pkgconfig" pkg-config --cflags --libs strata) 2>"$scratch/cc.log"; then
    out=$(LD_LIBRARY_PATH="$libdir" "$scratch/consumer")
    [ "$out" = "$want" ] && ok || fail "the consumer printed \"$out\", expected \"$want\""
else
    cat "$scratch/cc.log"; fail "a C program did not build against the installed prefix"
fi

echo "built, installed and checked in $((SECONDS - started)) s"
cli_done build_library_only
