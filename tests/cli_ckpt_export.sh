#!/usr/bin/env bash
# `strata ckpt export CKPT --to FILE`: the checkpoint of a `strata train --save` run (1 rank, and 2 ranks through
# mpirun when it is installed) becomes one safetensors file holding every tensor whole, in the shape the built-in
# GPT declares, equal bit for bit to the final master weights the trainer dumps (--dump-weights), checked in
# PyTorch against an independent statement of the model's layout (tests/helpers/ckpt_export_check.py); --dtype bf16
# and fp16 equal torch's own rounding of them. A checkpoint of an Engine that declares no shapes exports flat
# tensors equal to what read_master reports, with a note. A second export replaces the file; a damaged checkpoint
# exports nothing and names the file and tensor; bad usage names the option and the allowed values.
# Exit 77 without torch in /usr/bin/python3.
set -u
bin=${STRATA_BIN:?STRATA_BIN must name the strata binary}
src=${STRATA_SOURCE_DIR:-$(dirname "$0")/..}
source "$src/tests/helpers/cli.sh"
py=/usr/bin/python3
"$py" -c "import torch" 2>/dev/null || { echo "SKIP: $py cannot import torch (install python3-torch)"; exit 77; }
checker="$src/tests/helpers/ckpt_export_check.py"
export PYTHONPATH="$src/python${PYTHONPATH:+:$PYTHONPATH}"
cli_scratch cli_ckpt_export
seed=$((RANDOM * 32768 + RANDOM))
echo "seed $seed"
# The tiny preset: 2 layers, hidden 64, vocab 256, context 64 (what `strata train --model tiny` prints).
common=(train --model tiny --batch 4 --seed "$seed" --threads 1 --quiet --steps 4 --save-every 4)
layout=(2 64 256 64)

# export_and_compare NAME CKPT ORACLE: fp32, bf16 and fp16 exports of CKPT, each compared with ORACLE.
export_and_compare() {
    local name=$1 ck=$2 oracle=$3 dt
    for dt in fp32 bf16 fp16; do
        local file="$scratch/$name.$dt.safetensors" want
        want=$(tr a-z A-Z <<<"$dt" | sed "s/^FP/F/")  # the safetensors names: F32, BF16, F16
        check "$name: export --dtype $dt" 0 "to $file as $want" -- "$bin" ckpt export "$ck" --to "$file" --dtype $dt
        check "$name: $dt against the oracle" 0 "compared with" -- "$py" "$checker" compare "$file" "$oracle" "$want"
    done
}

# ---- one rank
"$bin" "${common[@]}" --save "$scratch/ck1" --dump-weights "$scratch/w1.bin" >"$scratch/t1.out" 2>&1 ||
    { echo "strata train --save failed; nothing to export"; cat "$scratch/t1.out"; exit 1; }
check "1 rank: oracle from --dump-weights" 0 "" -- "$py" "$checker" gpt-oracle "$scratch/w1.bin" "${layout[@]}" \
    "$scratch/w1.pt"
out=$("$bin" ckpt export "$scratch/ck1" --to "$scratch/latest.safetensors" 2>&1); rc=$?
[ $rc -eq 0 ] && grep -qF "latest checkpoint: $scratch/ck1/step-4" <<<"$out" && ! grep -q "^note:" <<<"$out" &&
    ok ||
    { fail "export of the --save directory takes its latest checkpoint, every tensor shaped: exit $rc"; echo "$out"; }
export_and_compare "1 rank" "$scratch/ck1/step-4" "$scratch/w1.pt"

# Exporting again over an existing file replaces it (fp32 over the bf16 file): no temporary is left.
file="$scratch/1 rank.bf16.safetensors"
check "export over an existing file" 0 "as F32" -- "$bin" ckpt export "$scratch/ck1/step-4" --to "$file"
check "the replaced file holds the new export" 0 "compared with" -- "$py" "$checker" compare "$file" \
    "$scratch/w1.pt" F32
left=$(ls -A "$scratch" | grep -c '\.tmp$')
[ "$left" -eq 0 ] && ok || fail "temporary files left beside the exports: $(ls -A "$scratch")"

# ---- two ranks (each rank's files hold pieces of the tensors)
if command -v mpirun >/dev/null; then
    mpi_run 2 "$bin" "${common[@]}" --save "$scratch/ck2" --dump-weights "$scratch/w2.bin" >"$scratch/t2.out" 2>&1 ||
        { fail "2 ranks: strata train --save"; cat "$scratch/t2.out"; }
    check "2 ranks: the checkpoint is sharded" 0 "" -- test -f "$scratch/ck2/step-4/model.rank1.safetensors"
    check "2 ranks: oracle from --dump-weights" 0 "" -- "$py" "$checker" gpt-oracle "$scratch/w2.bin" \
        "${layout[@]}" "$scratch/w2.pt"
    check "2 ranks: export says it gathered" 0 "(gathered from 2 ranks)" -- "$bin" ckpt export "$scratch/ck2/step-4" \
        --to "$scratch/two.safetensors"
    export_and_compare "2 ranks" "$scratch/ck2/step-4" "$scratch/w2.pt"
else
    echo "note: mpirun not found (openmpi-bin): the 2-rank export is not tested"
fi

# ---- a checkpoint without shapes: flat tensors, and a note that names one
# This one loads libstrata.so into Python: a sanitized build's runtimes go first (STRATA_PY_PRELOAD, from CMake).
preload=()
[ -n "${STRATA_PY_PRELOAD:-}" ] && preload=(env "LD_PRELOAD=$STRATA_PY_PRELOAD" "ASAN_OPTIONS=detect_leaks=0")
check "flat: a checkpoint of an Engine without shapes" 0 "" -- "${preload[@]}" "$py" "$checker" flat-ckpt \
    "$scratch/flat" "$scratch/flat.pt" "$seed"
check "flat: export notes the missing shapes" 0 "note: 6 of 6 tensors (\"layer0.bias\" and others) have no recorded shape" \
    -- "$bin" ckpt export "$scratch/flat" --to "$scratch/flat.safetensors"
check "flat: tensors equal read_master's, 1-D" 0 "compared with" -- "$py" "$checker" compare \
    "$scratch/flat.safetensors" "$scratch/flat.pt" F32

# ---- damage and usage
cp -r "$scratch/ck1/step-4" "$scratch/bad"
size=$(stat -c %s "$scratch/bad/model.safetensors")
byte=$(od -An -tu1 -j $((size - 1)) -N1 "$scratch/bad/model.safetensors" | tr -d ' ')
printf "$(printf '\\%03o' $((byte ^ 0x20)))" | dd of="$scratch/bad/model.safetensors" bs=1 seek=$((size - 1)) \
    conv=notrunc status=none
last=$("$py" -c 'import json,sys; print([t["name"] for t in json.load(open(sys.argv[1]))["tensors"]
                  if t["file"] == "model.safetensors"][-1])' "$scratch/bad/manifest.json")
check "a flipped byte: nothing exported" 1 "$scratch/bad/model.safetensors\": tensor \"$last\", elements" -- \
    "$bin" ckpt export "$scratch/bad" --to "$scratch/bad.safetensors"
[ ! -e "$scratch/bad.safetensors" ] && [ ! -e "$scratch/.bad.safetensors.tmp" ] && ok ||
    fail "a failed export left a file: $(ls -A "$scratch" | grep bad)"
check "no --to" 2 "--to FILE.safetensors is required" -- "$bin" ckpt export "$scratch/ck1"
check "a bad --dtype" 2 "--dtype \"fp8\": allowed: fp32, bf16, fp16" -- \
    "$bin" ckpt export "$scratch/ck1" --to "$scratch/x.safetensors" --dtype fp8
check "an unknown option" 2 "unknown option --out; allowed: --to FILE" -- \
    "$bin" ckpt export "$scratch/ck1" --out "$scratch/x.safetensors"
check "--to without a value" 2 "--to needs a value" -- "$bin" ckpt export "$scratch/ck1" --to
check "a directory that does not exist" 1 "$scratch/nowhere/.x.safetensors.tmp" -- \
    "$bin" ckpt export "$scratch/ck1" --to "$scratch/nowhere/x.safetensors"
check "help lists export" 0 "strata ckpt export DIR --to FILE.safetensors [--dtype fp32|bf16|fp16]" -- \
    "$bin" ckpt --help
cli_done cli_ckpt_export
