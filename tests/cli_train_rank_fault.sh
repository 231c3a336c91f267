#!/usr/bin/env bash
# A rank that fails in the middle of `mpirun -np 2 strata train` takes the world down, fast and with its name: rank
# 1 gets an injected NVMe read error; rank 1 reports it, rank 0 reports "rank 1 failed" with the same cause, the
# job exits non-zero, and nothing hangs (the whole run is bounded by `timeout`, and must end well before it).
set -u
bin=${STRATA_BIN:?STRATA_BIN must name the strata binary}
here=$(dirname "${BASH_SOURCE[0]}")
source "$here/helpers/cli.sh"
cli_mpi_scratch cli_train_rank_fault

cat >"$scratch/nvme.json" <<JSON
{"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme", "nvme_path": "$scratch"},
                       "offload_optimizer": {"device": "nvme", "nvme_path": "$scratch"}},
 "strata": {"host_cache": false}}
JSON
# (No host cache: the reads must reach the drive, where the fault is.) Only rank 1 arms the fault (mpirun gives each rank its OMPI_COMM_WORLD_RANK).
cat >"$scratch/rank1_fails.sh" <<'SH'
#!/bin/bash
[ "$OMPI_COMM_WORLD_RANK" = 1 ] && export STRATA_NVME_FAULT=eio@200
exec "$@"
SH
chmod +x "$scratch/rank1_fails.sh"

start=$(date +%s)
out=$(timeout 120 bash -c "source '$here/helpers/mpi.sh'; mpi_run 2 '$scratch/rank1_fails.sh' '$bin' train --steps 30 \
    --config '$scratch/nvme.json'" 2>&1)
rc=$?
took=$(($(date +%s) - start))
if [ "$rc" -eq 0 ] || [ "$rc" -eq 124 ]; then fail "the job exited $rc (0: the fault never hit; 124: it hung)"; echo "$out"
else ok; fi
[ "$took" -lt 60 ] && ok || fail "the failed world took ${took}s to end"
grep -q '^rank 1: strata train: .*Input/output error (EIO)' <<<"$out" && ok ||
    { fail "rank 1 did not report its I/O error"; echo "$out"; }
grep -q '^rank 0: strata train: .*rank 1 failed: .*Input/output error (EIO)' <<<"$out" && ok ||
    { fail "rank 0 did not name rank 1 and its cause"; echo "$out"; }
cli_done cli_train_rank_fault
