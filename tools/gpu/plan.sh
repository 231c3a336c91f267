#!/usr/bin/env bash
# Checks, with `strata estimate` and no GPU, that every flagship run of tools/gpu/check.sh (tools/gpu/items.sh) fits
# the machines it is meant for: one H100 (80 GB: 78 GiB usable), 128 GiB of host memory (the run's --host-budget,
# which must leave the system some), 64 GiB of disk. Prints a table; exits 1 when a run does not fit.
#   tools/gpu/plan.sh            (STRATA_BIN: the strata binary, default build/strata)
#   tools/gpu/plan.sh NAME ARGS  checks one run given as strata train arguments instead
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
bin=${STRATA_BIN:-$ROOT/build/strata}
. "$ROOT/tools/gpu/items.sh"
DEVICE_GIB=78 HOST_GIB=128 DISK_GIB=64
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# check NAME CONFIG_JSON TRAIN_ARGS...: the run's plan from strata estimate (train's flags turned into estimate's and
# a DeepSpeed-style config), one row; returns 1 when it does not fit.
check() {
    local name=$1 config=$2
    shift 2
    local args=() placement=device dtype="" device="" host_budget="" key
    while [ $# -gt 0 ]; do
        case $1 in
        --context) args+=(--seq "$2"); shift ;;
        --seq) args+=(--seq-len "$2"); shift ;;
        --offload) placement=$2; shift ;;
        --dtype) dtype=$2; shift ;;
        --device) device=$2; args+=("$1" "$2"); shift ;;
        --host-budget) host_budget=$2; args+=("$1" "$2"); shift ;;
        --nvme-dir | --steps | --warmup | --lr | --seed) shift ;;
        --delayed-update | --step-in-backward)
            key=${1#--} key=${key//-/_}
            config=$(python3 -c 'import json, sys; c = json.loads(sys.argv[1] or "{}")
c.setdefault("strata", {})[sys.argv[2]] = True; print(json.dumps(c))' "$config" "$key") || return 1 ;;
        *) args+=("$1") ;;
        esac
        shift
    done
    # strata train's dtype: --dtype, else bf16 on cuda (its default there), else the config's.
    [ -z "$dtype" ] && [ "$device" = cuda ] && dtype=bf16
    [ -n "$dtype" ] && args+=(--dtype "$dtype")
    # strata train's placements on CUDA: device keeps the parameters there and the optimizer in host memory.
    python3 - "$config" "$placement" "$work/nvme" >"$work/$name.json" <<'PY'
import json, sys
config, placement, nvme = json.loads(sys.argv[1] or "{}"), sys.argv[2], sys.argv[3]
z = config.setdefault("zero_optimization", {})
z.setdefault("stage", 3)
where = {"device": ("none", "cpu"), "host": ("cpu", "cpu"), "nvme": ("nvme", "nvme")}[placement]
for key, device in zip(("offload_param", "offload_optimizer"), where):
    z.setdefault(key, {})["device"] = device
    if device == "nvme":
        z[key]["nvme_path"] = nvme
print(json.dumps(config))
PY
    [ $? -eq 0 ] || return 1
    mkdir -p "$work/nvme"
    local out
    out=$("$bin" estimate --json "${args[@]}" --device-budget "${DEVICE_GIB}GiB" --config "$work/$name.json" 2>&1) ||
        { echo "$name: strata estimate failed:"; echo "$out"; return 1; }
    python3 - "$name" "$out" "$DEVICE_GIB" "${host_budget:-${HOST_GIB}GiB}" "$HOST_GIB" "$DISK_GIB" <<'PY'
import json, re, sys
name, est, dev_gib, budget, host_gib, disk_gib = sys.argv[1], json.loads(sys.argv[2]), *sys.argv[3:]
units = {"": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}
num, unit = re.fullmatch(r"([0-9.]+)\s*([KMGT]iB|)", budget).groups()
host_limit = min(float(num) * units[unit], float(host_gib) * 2**30)
t = est["tier_bytes"]
limits = {"device": float(dev_gib) * 2**30, "host": host_limit, "nvme": float(disk_gib) * 2**30}
fits = all(t[k] <= limits[k] for k in limits)
print("%-26s %9.1f / %-6.0f %9.1f / %-6.0f %9.1f / %-6.0f %s" % (
    name, *(x for k in ("device", "host", "nvme") for x in (t[k] / 2**30, limits[k] / 2**30)), "yes" if fits else "NO"))
sys.exit(0 if fits else 1)
PY
}

printf '%-26s %18s %18s %18s %s\n' run "device GiB / limit" "host GiB / limit" "disk GiB / limit" fits
if [ $# -gt 0 ]; then
    name=$1
    shift
    check "$name" "" "$@"
    exit
fi
fail=0
check zero_offload_6.7B "" "${RUN_ZERO_OFFLOAD_7B[@]}" || fail=1
check zero_offload_6.7B_sib "" "${RUN_ZERO_OFFLOAD_7B_SIB[@]}" || fail=1
check zero_offload_6.7B_sib_b16 "" "${RUN_ZERO_OFFLOAD_7B_SIB_B16[@]}" || fail=1
check zero_offload_6.7B_twin "$RUN_ZERO_OFFLOAD_7B_TWIN_CONFIG" "${RUN_ZERO_OFFLOAD_7B[@]}" || fail=1
check zero_infinity_3B "$RUN_ZERO_INFINITY_3B_CONFIG" "${RUN_ZERO_INFINITY_3B[@]}" || fail=1
check zero_infinity_3B_sib "$RUN_ZERO_INFINITY_3B_SIB_CONFIG" "${RUN_ZERO_INFINITY_3B[@]}" || fail=1
check 124M "" "${RUN_124M[@]}" || fail=1
exit $fail
