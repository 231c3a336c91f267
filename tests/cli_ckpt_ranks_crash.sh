#!/usr/bin/env bash
# A sharded save killed at a random point never costs the previous checkpoint: 2 ranks train and save every step
# (`mpirun -np 2 strata train --save DIR --save-every 1`, resuming DIR after the first round); after a random delay
# (every other round: once a save's temporary directory holds rank files) both ranks are SIGKILLed at once (a node
# lost mid-save), several times. After every kill the latest checkpoint in
# DIR must verify (every piece of both ranks' files), hold a step no older than the last one seen, and the next
# round resumes from it at 2 ranks. Kills that land inside a save (its temporary directory is left behind) are
# counted: at least one must, or the test proved nothing. Exit 77 without mpirun.
set -u
bin=${STRATA_BIN:?STRATA_BIN must name the strata binary}
src=${STRATA_SOURCE_DIR:-$(dirname "$0")/..}
source "$src/tests/helpers/cli.sh"
cli_mpi_scratch cli_ckpt_ranks_crash # its own trap below also kills the world
mp=
# Every process under the background job: its shell, mpirun, and the ranks, which mpirun puts in process groups of
# their own (so no group kill reaches them) and which outlive a killed mpirun for a while.
tree() {
    local p
    for p in $(ps -o pid= --ppid "$1" 2>/dev/null); do
        echo "$p"
        tree "$p"
    done
}
# Kills the whole world at once (a node lost), and returns only when none of it runs: a rank left alive would go on
# saving into the directory this test is about to check.
kill_world() { # kill_world [PIDS]: PIDS collected beforehand, so that the kill itself is immediate
    [ -n "$mp" ] || return 0
    local procs=${1:-"$mp $(tree "$mp")"} p
    kill -KILL $procs 2>/dev/null
    wait "$mp" 2>/dev/null
    for p in $procs; do
        while kill -0 "$p" 2>/dev/null; do sleep 0.01; done
    done
    mp=
}
trap 'kill_world; rm -rf "$scratch"' EXIT
ck=$scratch/ck
args=(train --model tiny --batch 1 --seq 8 --seed 11 --threads 1 --quiet --steps 100000 --save "$ck" --save-every 1 --keep 2)

rounds=8 mid_save=0 last=0
for ((r = 0; r < rounds; r++)); do
    resume=()
    [ $r -gt 0 ] && resume=(--resume "$ck")
    mpi_run 2 "$bin" "${args[@]}" "${resume[@]}" >"$scratch/round$r.out" 2>&1 &
    mp=$!
    # The ranks start, resume and save a step newer than the last one seen (polled, up to 60 s: on a loaded machine
    # that takes a while), then the kill lands anywhere in the steps and saves that follow; every other round, as
    # soon as a save has started writing the ranks' files (a save is a small part of a step and a save).
    for ((i = 0; i < 600; i++)); do
        newest=$(ls -d "$ck"/step-* 2>/dev/null | sed 's/.*step-//' | sort -n | tail -1)
        [ -n "$newest" ] && [ "$((10#$newest))" -gt "$last" ] && break
        sleep 0.1
    done
    sleep "$(awk -v s=$RANDOM 'BEGIN { srand(s); printf "%.2f", rand() * 0.8 }')"
    procs="$mp $(tree "$mp")"
    if [ $((r % 2)) -eq 1 ]; then
        shopt -s nullglob
        for ((i = 0; i < 200000; i++)); do
            started=("$ck"/.step-*.tmp/*.rank*)
            [ ${#started[@]} -gt 0 ] && break
        done
        shopt -u nullglob
    fi
    kill_world "$procs"
    ls -a "$ck" | grep -q '^\.step-[0-9]*\.tmp$' && mid_save=$((mid_save + 1))
    latest=$(ls -d "$ck"/step-* 2>/dev/null | sed 's/.*step-//' | sort -n | tail -1)
    if [ -z "$latest" ]; then
        fail "round $r: no checkpoint in $ck yet"; cat "$scratch/round$r.out"; continue
    fi
    out=$("$bin" ckpt verify "$ck" 2>&1); rc=$?
    step=$(grep -o "ok — step [0-9]*" <<<"$out" | grep -o "[0-9]*$")
    if [ $rc -ne 0 ] || [ -z "$step" ] || [ "$step" -lt "$last" ]; then
        fail "round $r: the latest checkpoint after the kill: exit $rc, step ${step:-none} (last seen $last)"
        echo "$out"; ls -la "$ck"
    else
        ok
        last=$step
    fi
done
echo "$mid_save of $rounds kills landed inside a save; the last checkpoint holds step $last"
[ "$mid_save" -gt 0 ] && ok || fail "no kill landed inside a save: nothing was tested"
[ "$last" -gt 0 ] && ok || fail "no round saved a step"
cli_done cli_ckpt_ranks_crash
