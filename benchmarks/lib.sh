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

# bench_run NAME extra-args...: "$bin" "${common[@]}" with --log-jsonl $out/NAME.jsonl, --dump-weights $out/NAME.bin and
# its output in $out/NAME.out (printed, and the script ended, when it fails); $dir/nvme-NAME is made for its swap.
bench_run() {
    local name=$1; shift
    mkdir -p "$dir/nvme-$name"
    "$bin" "${common[@]}" --quiet --log-jsonl "$out/$name.jsonl" --dump-weights "$out/$name.bin" "$@" \
        >"$out/$name.out" 2>&1 || { echo "run $name failed:"; cat "$out/$name.out"; exit 1; }
}

# median: the median of the numbers on stdin (separated by spaces or newlines).
median() { tr ' ' '\n' | sort -g | awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }
