#!/usr/bin/env bash
# A GPT model of at least 3 billion parameters trained for a few steps by `strata train` on this machine with
# the host budget <= 8 GiB and the device budget <= 2 GiB: bf16 parameters, fp32 master weights, Adam moments
# and gradient store on NVMe (about 51 GiB). Reports peak RSS of the process, NVMe bytes per step and seconds
# per step. The swap extents are checksummed (strata.swap_checksum), so data that came back wrong from NVMe
# fails the run instead of training on it; #wrong counts steps whose loss is not finite. Runs each variant of
# the config below in turn (the host cache off, the defaults, then the optimizer step in backward).
#
# usage: benchmarks/scale.sh [--json] [--steps N] [--dir DIR]   (needs ~52 GiB free in DIR; removed at the end)
#   SCALE_VARIANTS: the variants, one "name|strata section members|top-level members" per line (the third optional:
#                   e.g. "gradient_clipping": 1.0)
#   SCALE_LAYERS:   transformer layers (default 32: 3.05 billion parameters; 16: 1.55 billion, for a disk that cannot
#                   hold the 3B model's state twice, which step in backward with clipping keeps)
#   SCALE_HOST_BUDGET: the host budget (default 8GiB); at 16 layers 5GiB leaves the host cache what 8GiB leaves it at
#                   32: room for every parameter, none for the kept gradients of clipping in backward
#   STRATA_BIN: the strata binary (default build/strata)
set -euo pipefail

. "$(dirname "$0")/lib.sh"
steps=3 dir=$here/build/scratch/scale
bench_args "$@"
[ -x /usr/bin/time ] || { echo "/usr/bin/time not found (Debian: apt-get install time)" >&2; exit 2; }
mkdir -p "$dir"
out=$(mktemp -d)
trap 'rm -rf "$out" "$dir"' EXIT INT TERM
free_gib=$(df -B1G --output=avail "$dir" | tail -1 | tr -d ' ')
need_gib=$(((53 * ${SCALE_LAYERS:-32} + 31) / 32)) # strata itself refuses a variant that needs more (clipping in backward)
[ "$free_gib" -ge "$need_gib" ] || { echo "scale.sh: $dir has $free_gib GiB free; the run needs about $need_gib GiB" >&2; exit 2; }

# Each variant is "name|strata section members": the same run under each, one after the other, so every figure has
# the engine without its newer features beside it (the host cache off reads every fetch and step from NVMe, as
# strata did before it had one). SCALE_VARIANTS overrides the list (one variant per line).
variants=${SCALE_VARIANTS:-'host cache off|"host_cache": false
default config|
step in backward|"step_in_backward": true'}
model=(--layers "${SCALE_LAYERS:-32}" --hidden 2816 --heads 32 --vocab 256 --context 64 --seq 32 --batch 1)
budgets=(--device-budget 2GiB --host-budget "${SCALE_HOST_BUDGET:-8GiB}")

bench_machine
echo "build:   $bin"
echo "run:     $bin train ${model[*]} --dtype bf16 --offload nvme --nvme-dir $dir ${budgets[*]} --steps $steps" \
    "--warmup $steps --lr 3e-5 --seed 5 --threads $(nproc) --config CONFIG"
echo "config:  {\"zero_optimization\": {\"stage\": 3, \"sub_group_size\": 50000000}, \"strata\": {\"swap_checksum\": true, VARIANT}}"
echo "nvme:    $dir ($(df -T "$dir" | awk 'NR==2{print $2}'), $free_gib GiB free)"

fail=0
while IFS='|' read -r name members top; do
    [ -n "$name" ] || continue
    rm -rf "${dir:?}"/* 2>/dev/null || true
    cat >"$out/config.json" <<JSON
{"zero_optimization": {"stage": 3, "sub_group_size": 50000000},${top:+ $top,}
 "strata": {"swap_checksum": true${members:+, $members}}}
JSON
    cmd=("$bin" train "${model[@]}" --dtype bf16 --offload nvme --nvme-dir "$dir" "${budgets[@]}" --config "$out/config.json"
        --steps "$steps" --warmup "$steps" --lr 3e-5 --seed 5 --threads "$(nproc)" --log-jsonl "$out/log.jsonl")
    echo
    echo "== variant: $name (strata: {\"swap_checksum\": true${members:+, $members}}${top:+; $top})"
    t0=$(date +%s.%N)
    rc=0
    /usr/bin/time -v -o "$out/time.txt" "${cmd[@]}" >"$out/train.out" 2>&1 || rc=$?
    t1=$(date +%s.%N)
    sed -n '/^step /q;p' "$out/train.out" | head -30 # the header: the model, the plan, the tiers, the host cache
    [ "$rc" -eq 0 ] || { echo "scale.sh: strata train failed (exit $rc):"; tail -20 "$out/train.out"; fail=1; continue; }
    sed -n '/^summary/,$p' "$out/train.out" # time, bytes moved per link, the host cache, peaks
    rss_kib=$(awk -F: '/Maximum resident set size/ {gsub(/ /, "", $2); print $2}' "$out/time.txt")
    params=$(sed -n 's/.* = \([0-9.]*\)M parameters.*/\1/p' "$out/train.out")
    python3 - "$out/log.jsonl" "$rss_kib" "$params" "$t0" "$t1" "$json" "$name" "${SCALE_HOST_BUDGET:-8GiB}" <<'PY' || fail=1
import json, math, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
rss = int(sys.argv[2]) * 1024
params_m, t0, t1, want_json, name = float(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5]), sys.argv[6] == "1", sys.argv[7]
host_budget = sys.argv[8]
wrong = sum(not math.isfinite(r["loss"]) for r in rows)
print(f"{'step':>4} {'loss':>8} {'seconds':>9} {'stall s':>8} {'optimizer s':>11} {'NVMe read GB':>12} {'NVMe write GB':>13} {'cache read GB':>13} {'cache held GB':>13} {'redone':>6} {'#wrong':>6}")
for r in rows:
    print(f"{r['step']:>4} {r['loss']:8.4f} {r['step_s']:9.1f} {r['stall_s']:8.1f} {r['optimizer_s']:11.1f} "
          f"{r['nvme_to_host_bytes'] / 1e9:12.2f} {r['host_to_nvme_bytes'] / 1e9:13.2f} "
          f"{r.get('host_cache_read_bytes', 0) / 1e9:13.2f} {r.get('host_cache_held_bytes', 0) / 1e9:13.2f} {'yes' if r.get('redone') else 'no':>6} "
          f"{int(not math.isfinite(r['loss'])):>6}")
per_step = sum(r["step_s"] for r in rows) / len(rows)
io = sum(r["nvme_to_host_bytes"] + r["host_to_nvme_bytes"] for r in rows) / len(rows)
print(f"{name}: parameters {params_m / 1000:.2f} billion; peak RSS {rss / 2**30:.2f} GiB (host budget {host_budget} + device "
      f"budget 2 GiB, which the host backend keeps in RAM); {per_step:.1f} s/step; NVMe {io / 1e9:.1f} GB/step; "
      f"wall {t1 - t0:.0f} s including start-up (initialising the model on NVMe)")
if want_json:
    print(json.dumps({"variant": name, "params": params_m * 1e6, "peak_rss_bytes": rss, "seconds_per_step": per_step,
                      "nvme_bytes_per_step": io, "steps": len(rows), "wall_s": t1 - t0, "wrong": wrong}))
sys.exit(1 if wrong else 0)
PY
done <<<"$variants"
exit $fail
