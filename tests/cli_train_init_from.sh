#!/usr/bin/env bash
# `strata train --init-from` of strata's own `strata ckpt export`: a run that starts from the exported weights of a
# checkpoint has the same first loss (to the 6 decimals the log prints) as a --resume of that checkpoint (the data is one window of
# --seq + 1 bytes, so every step sees the same batch); the exported file named directly and as a directory holding
# model.safetensors; narrowed to bf16 it loads too (the loss within bf16's rounding). A model of another shape is
# refused naming the tensor, both sizes and the flag to change; so are --init-from with --resume, a path with nothing
# there, and a file that is not GPT-2 weights. (Hugging Face GPT-2 weights: tests/py_init_from_hf.py.)
set -u
bin=${STRATA_BIN:?STRATA_BIN must name the strata binary}
src=${STRATA_SOURCE_DIR:-$(dirname "$0")/..}
source "$src/tests/helpers/cli.sh"
cli_scratch cli_train_init_from
seed=$((RANDOM * 32768 + RANDOM))
echo "seed $seed"
shape=(--layers 2 --heads 2 --hidden 32 --vocab 256 --context 16)
head -c 17 /dev/urandom >"$scratch/data.bin"
common=(train "${shape[@]}" --seq 16 --batch 2 --data "$scratch/data.bin" --device host --threads 1 --quiet
        --seed "$seed")

# first_loss LOG: the loss of the first step in a --log-jsonl file.
first_loss() { sed -n '1s/.*"loss":\([^,]*\),.*/\1/p' "$1"; }

"$bin" "${common[@]}" --steps 2 --save "$scratch/ck" >"$scratch/save.out" 2>&1 ||
    { echo "strata train --save failed"; cat "$scratch/save.out"; exit 1; }
mkdir "$scratch/export"
check "export the checkpoint" 0 "" -- "$bin" ckpt export "$scratch/ck" --to "$scratch/export/model.safetensors"
check "export it in bf16" 0 "" -- "$bin" ckpt export "$scratch/ck" --to "$scratch/bf16.safetensors" --dtype bf16
check "resume the checkpoint" 0 "" -- "$bin" "${common[@]}" --steps 3 --resume "$scratch/ck" \
    --log-jsonl "$scratch/resume.jsonl"
want=$(first_loss "$scratch/resume.jsonl")
for from in "$scratch/export/model.safetensors" "$scratch/export"; do
    check "--init-from $from" 0 "weights from $from: strata export layout, 28 parameters" -- "$bin" "${common[@]}" \
        --steps 1 --init-from "$from" --log-jsonl "$scratch/init.jsonl"
    got=$(first_loss "$scratch/init.jsonl")
    echo "first loss: --init-from $got, --resume $want"
    if [ -n "$got" ] && [ "$got" = "$want" ]; then ok; else fail "--init-from $from: first loss $got, --resume's $want"; fi
done
check "--init-from a bf16 export" 0 "" -- "$bin" "${common[@]}" --steps 1 --init-from "$scratch/bf16.safetensors" \
    --log-jsonl "$scratch/bf16.jsonl"
got=$(first_loss "$scratch/bf16.jsonl")
echo "first loss: --init-from bf16 $got, fp32 $want"
if awk -v a="$got" -v b="$want" 'BEGIN { d = a - b; exit !(a != "" && d < 0.05 && d > -0.05) }'; then ok
else fail "bf16 export: first loss $got, fp32's $want"; fi

# Refusals, each naming what to change.
small=(train --layers 2 --heads 2 --hidden 16 --vocab 256 --context 16 --seq 16 --batch 2 --data "$scratch/data.bin"
       --device host --steps 1 --quiet)
check "another hidden size" 1 "hidden size 32 (tensor \"embeddings.wte\" is [256, 32]), the model 16; set --hidden 32" -- "$bin" "${small[@]}" \
    --init-from "$scratch/export"
check "another layer count" 1 "the weights have layers 2 (blocks 0..1), the model 3; set --layers 2" -- "$bin" \
    "${common[@]}" --layers 3 --steps 1 --init-from "$scratch/export"
check "another context" 1 "set --context 16" -- "$bin" "${common[@]}" --context 32 --steps 1 \
    --init-from "$scratch/export"
check "with --resume" 2 "--init-from \"$scratch/export\": and --resume both give the weights" -- "$bin" \
    "${common[@]}" --steps 3 --resume "$scratch/ck" --init-from "$scratch/export"
check "nothing there" 2 "$scratch/none" -- "$bin" "${common[@]}" --steps 1 --init-from "$scratch/none"
check "not GPT-2 weights" 1 "holds no GPT-2 token embedding" -- "$bin" "${common[@]}" --steps 1 \
    --init-from "$(ls -d "$scratch"/ck/step-*)/optimizer.safetensors"
cli_done cli_train_init_from
