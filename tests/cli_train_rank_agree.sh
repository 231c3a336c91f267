#!/usr/bin/env bash
# Ranks that disagree never train on silently, and a rank that is gone is named (mpirun with one argument set per
# rank, MPMD `-np 1 A : -np 1 B`):
#   - another --lr (the config's lr: a config key), --seed, --grad-accum or --steps, or a config with another
#     optimizer lr: every rank fails within seconds with strata's message naming the flag or key, both values and the
#     ranks (before this, the first three
#     ran to the end with exit 0, --grad-accum ended in raw Open MPI errors and --steps waited out 120 s);
#   - rank 1 killed by SIGKILL while mpirun leaves rank 0 running: rank 0 names rank 1's process as gone, in seconds;
#   - rank 1 stopped (SIGSTOP): rank 0 fails at the deadline the config's strata.comm_timeout_s sets, and says so.
set -u
bin=${STRATA_BIN:?STRATA_BIN must name the strata binary}
here=$(dirname "${BASH_SOURCE[0]}")
source "$here/helpers/cli.sh"
cli_mpi_scratch cli_train_rank_agree

common=(train --model tiny --batch 2 --seq 32 --threads 1 --quiet)
cli_mpi_strata "${common[@]}" --steps 1 || { echo "SKIP: strata was built without MPI"; exit 77; }

# disagree NAME TEXT -- RANK0_ARGS... -- RANK1_ARGS...: the run must fail (not time out) with TEXT in its output.
disagree() {
    local name=$1 text=$2; shift 3
    local a=() b=()
    while [ "$1" != "--" ]; do a+=("$1"); shift; done
    shift
    b=("$@")
    local t0=$SECONDS out rc
    out=$(timeout 90 bash "$here/helpers/mpi.sh" 1 "$bin" "${common[@]}" "${a[@]}" : -np 1 "$bin" "${common[@]}" \
        "${b[@]}" 2>&1)
    rc=$?
    local took=$((SECONDS - t0))
    if [ $rc -eq 0 ] || [ $rc -eq 124 ]; then
        fail "$name: exit $rc after $took s (expected a failure in seconds); output:"; echo "$out"
    elif ! grep -qF -- "$text" <<<"$out"; then
        fail "$name: output lacks \"$text\"; got:"; echo "$out"
    elif [ $took -gt 30 ]; then
        fail "$name: took $took s to fail"
    else
        ok
    fi
}

disagree "--lr" "the ranks' configs differ: optimizer.params.lr is 0.001 on rank 0 but 0.002 on rank 1" -- \
    --steps 3 --lr 1e-3 -- --steps 3 --lr 2e-3
disagree "--seed" "the ranks were given different --seed: 1 on rank 0 but 2 on rank 1" -- \
    --steps 3 --seed 1 -- --steps 3 --seed 2
disagree "--grad-accum" "the ranks were given different --grad-accum: 2 on rank 0 but 3 on rank 1" -- \
    --steps 3 --grad-accum 2 -- --steps 3 --grad-accum 3
disagree "--steps" "the ranks were given different --steps: 5 on rank 0 but 8 on rank 1" -- \
    --steps 5 -- --steps 8
printf '{"optimizer": {"type": "AdamW", "params": {"lr": 0.001}}}' >"$scratch/a.json"
printf '{"optimizer": {"type": "AdamW", "params": {"lr": 0.002}}}' >"$scratch/b.json"
disagree "config lr" "the ranks' configs differ: optimizer.params.lr is 0.001 on rank 0 but 0.002 on rank 1" -- \
    --steps 3 --config "$scratch/a.json" -- --steps 3 --config "$scratch/b.json"

# A rank that is killed (or stopped) while its launcher keeps the others running. Rank 1 runs under a shell that
# signals it after 3 s; rank 0's output must name what happened within seconds of it.
gone() {
    local name=$1 signal=$2 text=$3 limit=$4 config=$5
    local t0=$SECONDS out rc
    out=$(timeout 120 bash "$here/helpers/mpi.sh" 1 --mca orte_abort_on_non_zero_status 0 \
        "$bin" "${common[@]}" --steps 100000 --config "$config" : -np 1 \
        bash -c '"$@" & p=$!; sleep 3; kill -'"$signal"' $p; sleep '"$limit"'; kill -KILL $p 2>/dev/null; wait $p' \
        rank1 "$bin" "${common[@]}" --steps 100000 --config "$config" 2>&1)
    rc=$?
    local took=$((SECONDS - t0))
    # mpirun's own status is 0 when told to leave the ranks running: rank 0's failure line is the verdict.
    if [ $rc -eq 124 ] || ! grep -q "^rank 0: strata train: .* failed" <<<"$out"; then
        fail "$name: exit $rc after $took s, rank 0 did not fail; output:"; echo "$out"
    elif ! grep -qE -- "$text" <<<"$out"; then
        fail "$name: output lacks /$text/; got:"; echo "$out"
    elif [ $took -gt $((limit + 20)) ]; then
        fail "$name: took $took s"
    else
        ok
    fi
}
printf '{"strata": {"comm_timeout_s": 600}}' >"$scratch/long.json"
gone "killed rank" KILL "rank 1 \\(pid [0-9]+ on this host\\) is gone" 15 "$scratch/long.json"
printf '{"strata": {"comm_timeout_s": 4}}' >"$scratch/short.json"
gone "stopped rank" STOP "timed out after 4000 ms .*strata.comm_timeout_s" 15 "$scratch/short.json"

cli_done cli_train_rank_agree
