#!/usr/bin/env bash
# `strata bench step` times the configuration it names: the engine's step runs with the host cache off (its header
# and --json say so), reads and writes on NVMe exactly the bytes the I/O-alone peers move, and is served nothing
# from RAM. The overlap it prints is not asserted (a timing on a shared machine); the configuration behind it is.
set -u
bin=${STRATA_BIN:?STRATA_BIN must name the strata binary}
source "$(dirname "${BASH_SOURCE[0]}")/helpers/cli.sh"
cli_scratch cli_bench_step

run=(bench step --path "$scratch" --numel 4M --sub-group 1M --reps 2)
check "header names the host cache" 0 "host cache off (strata.host_cache = false)" -- "$bin" "${run[@]}"

if ! out=$("$bin" "${run[@]}" --json 2>"$scratch/err"); then
    fail "bench step --json failed:"; cat "$scratch/err"
else
    python3 - "$out" <<'EOF' && ok || fail "bench step --json: the step's configuration"
import json, sys
d = json.loads(sys.argv[1])
print(f"host_cache {d.get('host_cache')}, step read {d.get('step_nvme_read_bytes')} / peers {d.get('io_nvme_read_bytes')}, "
      f"step wrote {d.get('step_nvme_write_bytes')} / peers {d.get('io_nvme_write_bytes')}, "
      f"host-cache hits {d.get('step_host_cache_hits')}, overlap {d['overlap_efficiency']} (not asserted)")
assert d.get("host_cache") is False, "the bench must say it ran with the host cache off"
assert d["step_host_cache_hits"] == 0, d
assert d["step_nvme_read_bytes"] == d["io_nvme_read_bytes"] == 4 * 4 * 4 * 2**20, d
assert d["step_nvme_write_bytes"] == d["io_nvme_write_bytes"] == 3 * 4 * 4 * 2**20, d
assert d["reps_traffic_mismatch"] == 0 and d["wrong"] == 0, d
EOF
fi

cli_done cli_bench_step
