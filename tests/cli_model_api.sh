#!/usr/bin/env bash
# model/ is a trainer like anyone's: it may reach strata through include/strata.h only. Fails when a file
# under model/ includes an internal header (engine/, offload/, nvme/, gpu/, cpu_adam/, base/, tools/) or any
# quoted header that is neither strata.h nor model/'s own. The checker is first shown to catch a planted file.
set -u
src=${STRATA_SOURCE_DIR:?STRATA_SOURCE_DIR must name the source root}
source "$src/tests/helpers/cli.sh"
cli_scratch cli_model_api

# forbidden_includes DIR: prints every forbidden include as FILE:LINE: TEXT; exit 1 when there is one.
forbidden_includes() {
    local dir=$1 bad=0 f line n inc
    while IFS= read -r f; do
        n=0
        while IFS= read -r line; do
            n=$((n + 1))
            [[ $line =~ ^[[:space:]]*#[[:space:]]*include[[:space:]]*\"([^\"]+)\" ]] || continue
            inc=${BASH_REMATCH[1]}
            case $inc in
            strata.h) ;;
            model/*) [ -e "$dir/${inc#model/}" ] || { echo "$f:$n: $line (no such model/ file)"; bad=1; } ;;
            *) if [ -e "$(dirname "$f")/$inc" ] && [[ $inc != */* ]]; then :; else echo "$f:$n: $line"; bad=1; fi ;;
            esac
        done <"$f"
    done < <(find "$dir" -type f \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \))
    return $bad
}

mkdir -p "$scratch/model"
printf '#include "strata.h"\n#include "model/ok.h"\n' >"$scratch/model/ok.h"
printf '#include "model/ok.h"\n#include <cblas.h>\n  #  include "engine/engine.h"\n' >"$scratch/model/bad.c"
out=$(forbidden_includes "$scratch/model")
if [ $? -eq 0 ] || ! grep -q 'bad.c:3' <<<"$out"; then
    echo "FAIL: the checker missed a planted internal include; it printed:"; echo "$out"; exit 1
fi

out=$(forbidden_includes "$src/model")
if [ $? -ne 0 ]; then
    echo "FAIL: model/ includes headers other than include/strata.h and its own:"; echo "$out"; exit 1
fi
count=$(find "$src/model" -type f \( -name '*.c' -o -name '*.h' -o -name '*.cu' \) | wc -l)
[ "$count" -gt 0 ] || { echo "FAIL: no files under $src/model"; exit 1; }
echo "ok: $count files under model/ include strata through include/strata.h only"
