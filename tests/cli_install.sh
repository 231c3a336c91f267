#!/usr/bin/env bash
# `cmake --install` gives a package that a consumer finds both ways (find_package and pkg-config),
# and the shared library exports the public API and nothing else.
set -u
build=${STRATA_BUILD_DIR:?STRATA_BUILD_DIR must name the build directory}
if grep -qE '^STRATA_SANITIZE:STRING=.+' "$build/CMakeCache.txt"; then
    echo "SKIP: this build is sanitized; an installed sanitized libstrata only loads into sanitized programs"
    exit 77
fi
source "$(dirname "${BASH_SOURCE[0]}")/helpers/cli.sh"
cli_scratch cli_install

prefix=$scratch/prefix
cmake --install "$build" --prefix "$prefix" >"$scratch/install.log" 2>&1 || { cat "$scratch/install.log"; fail "install"; }
libdir=$(ls -d "$prefix"/lib* | head -1)
[ -f "$prefix/include/strata.h" ] && ok || fail "strata.h not installed"
[ -f "$libdir/cmake/strata/strataConfig.cmake" ] && ok || fail "CMake package not installed"
[ -f "$libdir/pkgconfig/strata.pc" ] && ok || fail "pkg-config file not installed"

# Only strata_* symbols leave the shared library (STRATA_API + -fvisibility=hidden).
so=$(ls "$libdir"/libstrata.so.* 2>/dev/null | head -1)
leaked=$(nm -D --defined-only "$so" | awk '{print $3}' | grep -v '^strata_' | grep -v '^_' || true)
[ -z "$leaked" ] && ok || fail "internal symbols exported from $so: $(echo $leaked | head -c 400)"
nm -D --defined-only "$so" | grep -q ' strata_config_load_json$' && ok || fail "strata_config_load_json not exported"

mkdir -p "$scratch/consumer"
cat >"$scratch/consumer/main.c" <<'C'
#include <stdio.h>
#include <strata.h>
int main(void)
{
    strata_config cfg;
    if (strata_config_init(&cfg) != STRATA_OK) return 1;
    cfg.backend = STRATA_BACKEND_HOST;
    cfg.device_budget_bytes = 16u << 20;
    strata_engine *e = NULL;
    strata_status st = strata_engine_create(&cfg, &e);
    printf("strata %s: %s\n", strata_version(), strata_status_str(st));
    strata_engine_destroy(e);
    return st == STRATA_OK ? 0 : 1;
}
C
cat >"$scratch/consumer/CMakeLists.txt" <<'CM'
cmake_minimum_required(VERSION 3.25)
project(consumer C)
find_package(strata 0.1 REQUIRED)
add_executable(consumer main.c)
target_link_libraries(consumer strata::strata)
CM
if cmake -S "$scratch/consumer" -B "$scratch/consumer/build" -DCMAKE_PREFIX_PATH="$prefix" >"$scratch/c.log" 2>&1 &&
    cmake --build "$scratch/consumer/build" >>"$scratch/c.log" 2>&1; then
    out=$(LD_LIBRARY_PATH="$libdir" "$scratch/consumer/build/consumer") && [ "$out" = "strata 0.1.0: success" ] && ok ||
        fail "find_package consumer printed \"$out\""
else
    cat "$scratch/c.log"; fail "find_package consumer did not build"
fi

if PKG_CONFIG_PATH="$libdir/pkgconfig" cc "$scratch/consumer/main.c" -o "$scratch/pc_consumer" \
    $(PKG_CONFIG_PATH="$libdir/pkgconfig" pkg-config --cflags --libs strata) 2>"$scratch/pc.log"; then
    out=$(LD_LIBRARY_PATH="$libdir" "$scratch/pc_consumer") && [ "$out" = "strata 0.1.0: success" ] && ok ||
        fail "pkg-config consumer printed \"$out\""
else
    cat "$scratch/pc.log"; fail "pkg-config consumer did not build"
fi

cli_done cli_install
