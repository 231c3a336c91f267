#!/usr/bin/env bash
# `strata ckpt inspect|verify`: a checkpoint written by `strata train --save` verifies and its table lists
# every tensor as ok; given the --save directory itself, both take its latest checkpoint (by step, not by name;
# a step-N directory without a manifest is no checkpoint) and say so, and an empty one exits 1 saying what was
# expected; a flipped byte (last tensor of model.safetensors) and a truncated file make both exit 1 naming the
# file and tensor; a missing directory and bad usage give their messages and exit codes.
set -u
bin=${STRATA_BIN:?STRATA_BIN must name the strata binary}
source "$(dirname "${BASH_SOURCE[0]}")/helpers/cli.sh"
cli_scratch cli_ckpt

# Checkpoints at steps 3, 6, 9 and 10, the last 3 kept: step-10 is the latest though it sorts first by name.
"$bin" train --model tiny --batch 4 --seed 5 --threads 2 --quiet --steps 10 --save "$scratch/ck" --save-every 3 \
    --keep 3 >"$scratch/train.out" 2>&1 ||
    { echo "strata train --save failed; cannot make a checkpoint to inspect"; cat "$scratch/train.out"; exit 1; }
ck=$scratch/ck/step-10
mkdir "$scratch/ck/step-999"

# The --save directory: the same output as for its latest checkpoint, after a line that names it.
chose="$scratch/ck: latest checkpoint: $ck"
for cmd in inspect verify; do
    out=$("$bin" ckpt $cmd "$scratch/ck" 2>&1); rc=$?
    explicit=$("$bin" ckpt $cmd "$ck" 2>&1)
    first=$(head -1 <<<"$out")
    [ $rc -eq 0 ] && [ "$first" = "$chose" ] && [ "$(tail -n +2 <<<"$out")" = "$explicit" ] && ok ||
        { fail "$cmd of the --save directory: exit $rc, first line \"$first\", expected \"$chose\" and then the" \
              "output of $cmd $ck"; diff <(tail -n +2 <<<"$out") <(echo "$explicit") | head -5; }
done
mkdir "$scratch/empty"
for cmd in inspect verify; do
    out=$("$bin" ckpt $cmd "$scratch/empty" 2>&1); rc=$?
    want="strata ckpt $cmd: checkpoint root \"$scratch/empty\" holds no checkpoint (no subdirectory with a manifest.json)"
    [ $rc -eq 1 ] && grep -qF "$want" <<<"$out" && grep -qF "expected a checkpoint directory" <<<"$out" && ok ||
        { fail "$cmd of an empty directory: exit $rc (expected 1), wanted \"$want\" and what was expected; got:"
          echo "$out"; }
done

out=$("$bin" ckpt verify "$ck" 2>&1); rc=$?
[ $rc -eq 0 ] && grep -q "every checksum matches" <<<"$out" && ok || { fail "verify of a good checkpoint: exit $rc"; echo "$out"; }
out=$("$bin" ckpt inspect "$ck" 2>&1); rc=$?
rows=$(grep -c "safetensors .* ok$" <<<"$out")
tensors=$(python3 -c 'import json, sys; print(len(json.load(open(sys.argv[1]))["tensors"]))' "$ck/manifest.json")
[ $rc -eq 0 ] && [ "$rows" -eq "$tensors" ] && grep -q "^step         10 " <<<"$out" && ok ||
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
[ $rc -eq 1 ] && grep -qF "checkpoint root \"$scratch/none\": cannot open it" <<<"$out" && ok ||
    { fail "verify of nothing: exit $rc"; echo "$out"; }
out=$("$bin" ckpt frobnicate 2>&1); rc=$?
[ $rc -eq 2 ] && grep -q "usage: strata ckpt inspect DIR" <<<"$out" && ok || { fail "bad usage: exit $rc"; echo "$out"; }

cli_done cli_ckpt
