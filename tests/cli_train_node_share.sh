#!/usr/bin/env bash
# `strata train`'s header says what the rank got of its host: "budgets host H, device D; Adam N threads on cores C".
# Alone, the default host budget is 3/4 of RAM and the cores are every core this process may run on; as one of 2 ranks
# on this host (mpirun -np 2) rank 0 says it is its share and gets half the host budget, at most half the cores
# (one on a 2-core machine) and as many threads; a --config host budget is kept as given.
set -u
bin=${STRATA_BIN:?STRATA_BIN must name the strata binary}
here=$(dirname "${BASH_SOURCE[0]}")
source "$here/helpers/cli.sh"
cli_scratch cli_train_node_share
common=(train --model tiny --steps 1 --batch 2 --seq 32 --quiet)

# "budgets ... host 8.83 GiB, device 1.00 GiB; Adam 1 thread on cores 0" -> "8.83 GiB|1|0"
parse() {
    python3 -c '
import re, sys
m = re.search(r"^  budgets.* host ([0-9.]+ [KMGT]?i?B), device [^;]+; Adam ([0-9]+) threads? on cores (\S+)$", sys.stdin.read(), re.M)
print("|".join(m.groups()) if m else "")'
}
bytes() { python3 -c 'import sys; v, u = sys.argv[1].split(); print(float(v) * 1024 ** ["B", "KiB", "MiB", "GiB", "TiB"].index(u))' "$1"; }
ncores() { python3 -c 'import sys; print(sum(int(b) - int(a) + 1 if "-" in p else 1 for p in sys.argv[1].split(",") for a, _, b in [p.partition("-")] if p))' "$1"; }

one=$("$bin" "${common[@]}" 2>&1)
IFS='|' read -r host1 threads1 cores1 <<<"$(parse <<<"$one")"
if [ -z "${host1:-}" ]; then
    fail "world 1: no budgets line in the header:"; echo "$one"
else
    [ "$threads1" = "$(ncores "$cores1")" ] && ok ||
        fail "world 1: $threads1 Adam threads on cores $cores1: one per core expected"
fi

if command -v mpirun >/dev/null && [ -n "${host1:-}" ]; then
    two=$(timeout 60 bash "$here/helpers/mpi.sh" 2 "$bin" "${common[@]}" 2>&1)
    if grep -q "built without MPI" <<<"$two"; then
        echo "SKIP (2 ranks): strata was built without MPI"
    else
        IFS='|' read -r host2 threads2 cores2 <<<"$(parse <<<"$two")"
        if [ -z "${host2:-}" ] || ! grep -qF "budgets (rank 0's; each rank has its own share of its host)" <<<"$two"; then
            fail "2 ranks: no budgets line for rank 0's share:"; echo "$two"
        else
            python3 -c 'import sys; a, b = map(float, sys.argv[1:]); sys.exit(abs(2 * b - a) > 0.01 * a)' \
                "$(bytes "$host1")" "$(bytes "$host2")" && ok ||
                fail "2 ranks: rank 0's host budget $host2 is not half of world 1's $host1"
            n1=$(ncores "$cores1") n2=$(ncores "$cores2")
            [ "$n2" -eq $((n1 >= 2 ? n1 / 2 : 1)) ] && [ "$threads2" -eq "$n2" ] && ok ||
                fail "2 ranks: rank 0 has $threads2 threads on cores $cores2 ($n2) of world 1's $cores1 ($n1)"
        fi
    fi
fi

printf '{"strata": {"host_budget_bytes": "3 GiB"}}' >"$scratch/budget.json"
given=$("$bin" "${common[@]}" --config "$scratch/budget.json" 2>&1)
IFS='|' read -r host3 _ _ <<<"$(parse <<<"$given")"
[ "${host3:-}" = "3.00 GiB" ] && ok || { fail "a given host budget: the header says '${host3:-}'"; echo "$given"; }

cli_done cli_train_node_share
