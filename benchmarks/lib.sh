# Shared by the shell benchmarks (sourced): where the strata binary is, the options every one takes, and the
# machine line each prints first. Before bench_args, a script sets its defaults: steps, dir, and rounds when it
# takes --rounds.
here=$(cd "$(dirname "$0")/.." && pwd)
bin=${STRATA_BIN:-$here/build/strata}
json=0

# bench_args "$@": --json, --steps N, --dir DIR (and --rounds R where the script has rounds); checks the binary.
bench_args() {
    local usage="usage: $0 [--json] [--steps N]${rounds:+ [--rounds R]} [--dir DIR]"
    while [ $# -gt 0 ]; do
        case $1 in
        --json) json=1 ;;
        --steps) steps=$2; shift ;;
        --rounds) [ -n "${rounds:-}" ] || { echo "$usage" >&2; exit 2; }; rounds=$2; shift ;;
        --dir) dir=$2; shift ;;
        *) echo "$usage" >&2; exit 2 ;;
        esac
        shift
    done
    [ -x "$bin" ] || { echo "strata binary not found at $bin (set STRATA_BIN)" >&2; exit 2; }
}

bench_machine() {
    echo "machine: $(uname -n), Linux $(uname -r), $(nproc) cores," \
        "$(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo) RAM; strata $("$bin" --version)"
}
