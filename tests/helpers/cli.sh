# What the CLI tests (tests/cli_*.sh) share: pass/fail counters, `check` of a command's exit code and
# output, and the closing line. Source it after `set -u`; end the test with `cli_done NAME`.
passed=0 failed=0

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
    passed=$((passed + 1))
}

cli_scratch() { # cli_scratch NAME: $scratch, a fresh directory under $STRATA_SCRATCH, removed when the test exits
    scratch=$(mktemp -d "${STRATA_SCRATCH:-/tmp}/$1.XXXXXX" 2>/dev/null || mktemp -d)
    trap 'rm -rf "$scratch"' EXIT
}

cli_done() { # cli_done NAME: the summary line; the exit status is the verdict
    echo "$1: $passed passed, $failed failed"
    [ "$failed" -eq 0 ]
}
