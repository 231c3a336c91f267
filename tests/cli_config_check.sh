#!/usr/bin/env bash
# `strata config check` looks at every nvme_path on this machine the way `strata train` would: a missing path,
# a file, a read-only directory, a full filesystem and O_DIRECT refused under aio.direct = true are errors (exit 2,
# the swap space's own message, the one train refuses the path with); a good path and a tmpfs path (O_DIRECT or
# the buffered fallback) pass with their free space.
set -u
bin=${STRATA_BIN:?STRATA_BIN must name the strata binary}
source "$(dirname "${BASH_SOURCE[0]}")/helpers/cli.sh"
cli_scratch cli_config_check # its own trap below also unmounts
shm=""
ro_mounted=""
full_mounted=""
cleanup() {
    [ -n "$ro_mounted" ] && umount "$ro_mounted"
    [ -n "$full_mounted" ] && umount "$full_mounted"
    [ -n "$shm" ] && rm -rf "$shm"
    rm -rf "$scratch"
}
trap cleanup EXIT

# A config with the optimizer state on NVMe at $1 (and "extra" JSON members in the strata section).
config() { # config NAME PATH [STRATA_SECTION_MEMBERS]
    printf '{"zero_optimization": {"offload_optimizer": {"device": "nvme", "nvme_path": "%s"}},\n "strata": {%s}}\n' \
        "$2" "${3:-}" >"$scratch/$1.json"
    echo "$scratch/$1.json"
}

free_re='[0-9.]+ (B|KiB|MiB|GiB|TiB) free$'

# A good path: ok, with what it offers and its free space.
mkdir "$scratch/good"
cfg=$(config good "$scratch/good")
check "good path" 0 "good.json: ok" -- "$bin" config check "$cfg"
out=$("$bin" config check "$cfg" 2>/dev/null)
grep -qE "^nvme_path \"$scratch/good\": directory, writable, (O_DIRECT|O_DIRECT refused, so buffered I/O .*), $free_re" \
    <<<"$out" && ok || { fail "good path line; got:"; echo "$out"; }

# A path that does not exist, and a file where a directory is expected.
cfg=$(config missing "$scratch/missing")
check "missing path" 2 "missing.json: nvme_path \"$scratch/missing\": No such file or directory (ENOENT); it must be an existing directory" -- \
    "$bin" config check "$cfg"
out=$("$bin" config check "$cfg" 2>/dev/null)
[ -z "$out" ] && ok || { fail "missing path printed \"ok\" output:"; echo "$out"; }
touch "$scratch/afile"
cfg=$(config afile "$scratch/afile")
check "file as path" 2 "nvme_path \"$scratch/afile\" is not a directory; name a directory on the NVMe drive" -- \
    "$bin" config check "$cfg"

# A read-only directory. Root writes through permission bits, so as root the directory is a read-only tmpfs mount.
mkdir "$scratch/ro"
if [ "$(id -u)" -ne 0 ]; then
    chmod 555 "$scratch/ro"
    cfg=$(config ro "$scratch/ro")
    check "read-only dir" 2 "nvme_path \"$scratch/ro\": cannot create a swap file there: open \"$scratch/ro/.strata-swap-" -- \
        "$bin" config check "$cfg"
    check "read-only dir errno" 2 "Permission denied (EACCES)" -- "$bin" config check "$cfg"
elif mount -t tmpfs -o ro,size=8m strata-ro "$scratch/ro" 2>/dev/null; then
    ro_mounted="$scratch/ro"
    cfg=$(config ro "$scratch/ro")
    check "read-only dir" 2 "nvme_path \"$scratch/ro\": cannot create a swap file there: open \"$scratch/ro/.strata-swap-" -- \
        "$bin" config check "$cfg"
    check "read-only dir errno" 2 "Read-only file system (EROFS)" -- "$bin" config check "$cfg"
else
    echo "skip read-only dir: running as root and mount -t tmpfs -o ro was refused (no CAP_SYS_ADMIN here)"
fi

# tmpfs: Linux refused O_DIRECT there before 6.6 and accepts it since. Whatever this kernel does passes;
# STRATA_NVME_FAULT=nodirect (the NVMe layer's test hook) then makes the open refuse O_DIRECT as old tmpfs did,
# to see the fallback of aio.direct = auto and the error of aio.direct = true.
if [ -d /dev/shm ] && shm=$(mktemp -d /dev/shm/cli_config_check.XXXXXX 2>/dev/null); then
    cfg=$(config tmpfs "$shm")
    check "tmpfs path" 0 "tmpfs.json: ok" -- "$bin" config check "$cfg"
    out=$("$bin" config check "$cfg" 2>/dev/null)
    grep -qE "^nvme_path \"$shm\": directory, writable, .*, $free_re" <<<"$out" && ok ||
        { fail "tmpfs line; got:"; echo "$out"; }
    check "tmpfs without O_DIRECT falls back" 0 \
        "nvme_path \"$shm\": directory, writable, O_DIRECT refused, so buffered I/O (strata.aio.direct = auto falls back; true would make this an error)" -- \
        env STRATA_NVME_FAULT=nodirect "$bin" config check "$cfg"
    check "tmpfs fallback said as training says it" 0 "\"$shm\": the filesystem refuses O_DIRECT (Invalid argument (EINVAL)); using buffered I/O" -- \
        env STRATA_NVME_FAULT=nodirect "$bin" config check "$cfg"
    cfg=$(config tmpfs_direct "$shm" '"aio": {"direct": true}')
    check "tmpfs without O_DIRECT, direct demanded" 2 \
        "with O_DIRECT failed: Invalid argument (EINVAL); the filesystem may not support O_DIRECT (aio.direct is on) — set aio.direct to auto or false to use buffered I/O" -- \
        env STRATA_NVME_FAULT=nodirect "$bin" config check "$cfg"
    cfg=$(config tmpfs_buffered "$shm" '"aio": {"direct": false}')
    check "buffered by choice" 0 "nvme_path \"$shm\": directory, writable, buffered I/O (strata.aio.direct = false)" -- \
        "$bin" config check "$cfg"
else
    echo "skip tmpfs: no writable /dev/shm"
fi

# config check and train agree on every path: what one refuses the other refuses with the same message (train at
# strata_engine_finalize, exit 1), and a good path passes both. A full filesystem (0 B free) is a tmpfs filled up.
agree() { # agree NAME CONFIG EXPECTED_TEXT
    check "$1: config check refuses" 2 "$3" -- "$bin" config check "$2"
    check "$1: train refuses alike" 1 "$3" -- "$bin" train --config "$2" --steps 1 --batch 1 --seq 8 --quiet
}
agree "missing" "$scratch/missing.json" "nvme_path \"$scratch/missing\": No such file or directory (ENOENT)"
agree "a file" "$scratch/afile.json" "nvme_path \"$scratch/afile\" is not a directory"
[ -n "$ro_mounted" ] && agree "read-only" "$scratch/ro.json" "nvme_path \"$scratch/ro\": cannot create a swap file there"
check "good path: train runs" 0 "summary: 1 steps" -- \
    "$bin" train --config "$scratch/good.json" --steps 1 --batch 1 --seq 8 --quiet
mkdir "$scratch/full"
if [ "$(id -u)" -eq 0 ] && mount -t tmpfs -o size=64k strata-full "$scratch/full" 2>/dev/null; then
    full_mounted="$scratch/full"
    dd if=/dev/zero of="$scratch/full/fill" bs=4k 2>/dev/null
    cfg=$(config full "$scratch/full")
    agree "0 B free" "$cfg" "nvme_path \"$scratch/full\": swap needs"
    check "0 B free: says so" 2 "but the filesystem has only 0 B (0 bytes) free" -- "$bin" config check "$cfg"
else
    echo "skip full path: mounting a 64 KiB tmpfs needs root with CAP_SYS_ADMIN"
fi

# A path of a block that stays off NVMe is not training's business, so it is not checked.
printf '{"zero_optimization": {"offload_param": {"device": "cpu", "nvme_path": "%s"}}}\n' "$scratch/missing" \
    >"$scratch/unused.json"
check "unused path" 0 "unused.json: ok" -- "$bin" config check "$scratch/unused.json"

cli_done cli_config_check
