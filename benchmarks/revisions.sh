#!/usr/bin/env bash
# Two builds of strata, trained alike: are the weights bit for bit the same, and is the speed? For a change that
# must not change behaviour (issue 24's refactor): STRATA_OLD_BIN is the strata binary of the revision before,
# STRATA_BIN (default build/strata) the one after. Each scenario trains a small GPT with a fixed seed once per
# build and compares the dumped weights with cmp (#same: 1 when identical); the speed scenarios (the larger
# model, marked with tokens/s) run the two builds interleaved for --rounds rounds, and the ratio is the median of
# the per-round ratios of tokens/s (the machine is shared). Multi-rank scenarios run through tests/helpers/mpi.sh
# and are left out when mpirun is missing.
#
# usage: STRATA_OLD_BIN=OLD/strata benchmarks/revisions.sh [--json] [--rounds R] [--dir DIR]
set -euo pipefail

. "$(dirname "$0")/lib.sh"
steps=6 rounds=3 dir=$here/build/scratch/revisions
bench_args "$@"
old=${STRATA_OLD_BIN:?STRATA_OLD_BIN must name the strata binary of the revision to compare with}
[ -x "$old" ] || { echo "STRATA_OLD_BIN=$old is not an executable" >&2; exit 2; }
mkdir -p "$dir/nvme"
out=$(mktemp -d)
trap 'rm -rf "$out" "$dir/nvme"' EXIT INT TERM
echo '{"zero_optimization": {"stage": 2}}' >"$out/stage2.json"
echo '{"zero_optimization": {"stage": 1}}' >"$out/stage1.json"
echo '{"gradient_clipping": 0.05}' >"$out/clip.json"
mpi=(bash "$here/tests/helpers/mpi.sh" 2)
small=(--steps "$steps" --batch 2 --seq 32 --seed 7 --threads 1)
large=(--layers 4 --hidden 256 --heads 4 --context 128 --steps 12 --batch 4 --seq 128 --threads "$(nproc)" --seed 3)
nvme=(--nvme-dir "$dir/nvme")

# NAME|LAUNCH|ARGS: LAUNCH is "" or "mpi"; ARGS are split on spaces ($out and $dir expanded).
scenarios=(
    "device||"
    "host||--offload host"
    "nvme||--offload nvme ${nvme[*]}"
    "nvme_delayed||--offload nvme ${nvme[*]} --delayed-update --delayed-warmup 2"
    "in_backward||--offload host --step-in-backward"
    "bf16_accum2||--offload host --dtype bf16 --grad-accum 2"
    "fp16||--offload host --dtype fp16"
    "clip||--offload host --config $out/clip.json"
    "acts_nvme||--offload host --activation-checkpointing --offload-activations nvme ${nvme[*]}"
    "layerwise||--offload host --grad-accum 2 --schedule layerwise"
    "r2_stage3|mpi|--offload host --grad-accum 2"
    "r2_stage2|mpi|--config $out/stage2.json"
    "r2_stage1|mpi|--config $out/stage1.json --grad-accum 2"
    "r2_nvme_clip|mpi|--offload nvme ${nvme[*]} --config $out/clip.json"
)
speed=(
    "speed_nvme|--offload nvme ${nvme[*]}"
    "speed_in_backward|--offload host --step-in-backward"
    "speed_accum2|--offload host --grad-accum 2"
)

bench_machine
echo "old:     $old ($("$old" --version))"
echo "new:     $bin"
echo "weights: ${small[*]}; speed: ${large[*]}, $rounds rounds; NVMe dir $dir"
echo

train() { # train BIN LAUNCH OUTFILE ARGS...: one run; its output in OUTFILE.out
    local b=$1 launch=$2 file=$3; shift 3
    rm -rf "$dir/nvme"/*
    local pre=(); [ "$launch" = mpi ] && pre=("${mpi[@]}")
    "${pre[@]}" "$b" train "$@" --quiet >"$file.out" 2>&1 || { echo "run $file failed:"; tail -5 "$file.out"; exit 1; }
}
tokens_per_s() { "$@" 2>/dev/null | awk '/throughput/ {print $2}'; }

rows=()
printf '%-18s %6s %12s %12s %8s\n' scenario '#same' 'old tok/s' 'new tok/s' 'new/old'
for s in "${scenarios[@]}"; do
    IFS='|' read -r name launch args <<<"$s"
    if [ "$launch" = mpi ] && ! command -v mpirun >/dev/null; then continue; fi
    read -ra extra <<<"$args"
    train "$old" "$launch" "$out/$name.old" "${small[@]}" "${extra[@]}" --dump-weights "$out/$name.old.bin"
    train "$bin" "$launch" "$out/$name.new" "${small[@]}" "${extra[@]}" --dump-weights "$out/$name.new.bin"
    same=0; cmp -s "$out/$name.old.bin" "$out/$name.new.bin" && same=1
    printf '%-18s %6d %12s %12s %8s\n' "$name" "$same" - - -
    rows+=("{\"scenario\": \"$name\", \"same\": $same}")
done
for s in "${speed[@]}"; do
    IFS='|' read -r name args <<<"$s"
    read -ra extra <<<"$args"
    o=() n=() r=()
    for ((i = 0; i < rounds; i++)); do
        rm -rf "$dir/nvme"/*; a=$(tokens_per_s "$old" train "${large[@]}" "${extra[@]}")
        rm -rf "$dir/nvme"/*; b=$(tokens_per_s "$bin" train "${large[@]}" "${extra[@]}")
        o+=("$a") n+=("$b") r+=("$(awk -v a="$a" -v b="$b" 'BEGIN {printf "%.3f", b / a}')")
    done
    mo=$(echo "${o[*]}" | median) mn=$(echo "${n[*]}" | median) mr=$(echo "${r[*]}" | median)
    printf '%-18s %6s %12s %12s %8.2f\n' "$name" - "$mo" "$mn" "$mr"
    rows+=("{\"scenario\": \"$name\", \"old_tokens_per_s\": $mo, \"new_tokens_per_s\": $mn, \"ratio\": $mr}")
done
if [ "$json" = 1 ]; then
    (IFS=,; echo "{\"revisions\": [${rows[*]}]}")
fi
