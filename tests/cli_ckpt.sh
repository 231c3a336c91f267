#!/usr/bin/env bash
# `strata ckpt inspect|verify`: a checkpoint written by `strata train --save` verifies and its table lists
# every tensor as ok; a flipped byte (last tensor of model.safetensors) and a truncated file make both exit 1
# naming the file and tensor; a missing directory and bad usage give their messages and exit codes.
set -u
bin=${STRATA_BIN:?STRATA_BIN must name the strata binary}
scratch=$(mktemp -d "${STRATA_SCRATCH:-/tmp}/cli_ckpt.XXXXXX" 2>/dev/null || mktemp -d)
trap 'rm -rf "$scratch"' EXIT
passed=0 failed=0
fail() { echo "FAIL $*"; failed=$((failed + 1)); }
ok() { passed=$((passed + 1)); }

"$bin" train --model tiny --batch 4 --seed 5 --threads 2 --quiet --steps 3 --save "$scratch/ck" >"$scratch/train.out" 2>&1 ||
    { echo "strata train --save failed; cannot make a checkpoint to inspect"; cat "$scratch/train.out"; exit 1; }
ck=$(ls -d "$scratch"/ck/step-* | head -1)

out=$("$bin" ckpt verify "$ck" 2>&1); rc=$?
[ $rc -eq 0 ] && grep -q "every checksum matches" <<<"$out" && ok || { fail "verify of a good checkpoint: exit $rc"; echo "$out"; }
out=$("$bin" ckpt inspect "$ck" 2>&1); rc=$?
rows=$(grep -c "safetensors .* ok$" <<<"$out")
tensors=$(grep -o '"name"' "$ck/manifest.json" | wc -l)
[ $rc -eq 0 ] && [ "$rows" -eq "$tensors" ] && grep -q "^step         3" <<<"$out" && ok ||
    { fail "inspect: exit $rc, $rows ok rows for $tensors tensors"; echo "$out" | head -20; }

# Flip the last byte of model.safetensors: the data of its last tensor.
last=$(python3 -c 'import json,sys; m=json.load(open(sys.argv[1])); print([t["name"] for t in m["tensors"] if t["file"]=="model.safetensors"][-1])' "$ck/manifest.json")
size=$(stat -c %s "$ck/model.safetensors")
byte=$(od -An -tu1 -j $((size - 1)) -N1 "$ck/model.safetensors" | tr -d ' ')
printf "$(printf '\\%03o' $((byte ^ 0x20)))" | dd of="$ck/model.safetensors" bs=1 seek=$((size - 1)) conv=notrunc status=none
out=$("$bin" ckpt verify "$ck" 2>&1); rc=$?
[ $rc -eq 1 ] && grep -qF "$ck/model.safetensors" <<<"$out" && grep -qF "tensor \"$last\": crc32c" <<<"$out" && ok ||
    { fail "verify of a flipped byte in $last: exit $rc"; echo "$out"; }
out=$("$bin" ckpt inspect "$ck" 2>&1); rc=$?
[ $rc -eq 1 ] && grep -q "^$last .*BAD (crc" <<<"$out" && ok || { fail "inspect of a flipped byte: exit $rc"; echo "$out" | tail -5; }

truncate -s $((size / 2)) "$ck/model.safetensors"
out=$("$bin" ckpt verify "$ck" 2>&1); rc=$?
[ $rc -eq 1 ] && grep -q "truncated" <<<"$out" && ok || { fail "verify of a truncated file: exit $rc"; echo "$out"; }

out=$("$bin" ckpt verify "$scratch/none" 2>&1); rc=$?
[ $rc -eq 1 ] && grep -q "cannot open its manifest" <<<"$out" && ok || { fail "verify of nothing: exit $rc"; echo "$out"; }
out=$("$bin" ckpt frobnicate 2>&1); rc=$?
[ $rc -eq 2 ] && grep -q "usage: strata ckpt inspect DIR" <<<"$out" && ok || { fail "bad usage: exit $rc"; echo "$out"; }

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
