# What the CLI tests (tests/cli_*.sh) share: pass/fail counters, `check` of a command's exit code and
# output, a scratch directory, the multi-rank preamble (mpi_run from mpi.sh) and the closing line. Source it
# after `set -u`; end the test with `cli_done NAME`.
source "$(dirname "${BASH_SOURCE[0]}")/mpi.sh"
passed=0 failed=0

ok() { passed=$((passed + 1)); }

fail() { echo "FAIL $*"; failed=$((failed + 1)); }

check() { # check NAME EXPECTED_EXIT EXPECTED_TEXT_IN_OUTPUT -- command...
    local name=$1 want=$2 text=$3; shift 4
    local out rc
    out=$("$@" 2>&1); rc=$?
    if [ "$rc" -ne "$want" ]; then
        fail "$name: exit $rc, expected $want; output:"; echo "$out"; return
    fi
    if [ -n "$text" ] && ! grep -qF -- "$text" <<<"$out"; then
        fail "$name: output lacks \"$text\"; got:"; echo "$out"; return
    fi
    ok
}

cli_scratch() { # cli_scratch NAME: $scratch, a fresh directory under $STRATA_SCRATCH, removed when the test exits
    mkdir -p "${STRATA_SCRATCH:-/tmp}" 2>/dev/null
    scratch=$(mktemp -d "${STRATA_SCRATCH:-/tmp}/$1.XXXXXX" 2>/dev/null || mktemp -d)
    trap 'rm -rf "$scratch"' EXIT
}

cli_mpi_scratch() { # cli_mpi_scratch NAME: a test of `mpirun strata ...`: skipped (77) without mpirun, else cli_scratch
    command -v mpirun >/dev/null || { echo "SKIP: mpirun not found (install openmpi-bin)"; exit 77; }
    cli_scratch "$1"
}

cli_mpi_strata() { # cli_mpi_strata ARGS...: true when `strata ARGS` runs on 2 ranks here (mpirun, strata built with MPI)
    command -v mpirun >/dev/null || return 1
    ! timeout 60 bash "$(dirname "${BASH_SOURCE[0]}")/mpi.sh" 2 "$bin" "$@" 2>&1 | grep -q "built without MPI"
}

cli_done() { # cli_done NAME: the summary line; the exit status is the verdict
    echo "$1: $passed passed, $failed failed"
    [ "$failed" -eq 0 ]
}
