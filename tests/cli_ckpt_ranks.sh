#!/usr/bin/env bash
# Sharded checkpoints through the tool: `mpirun -np 2 strata train --save --save-every 3` writes checkpoints of two
# ranks (model.rank<r> and optimizer.rank<r> files, one manifest) that `strata ckpt inspect` lists with the world
# size, one row per piece (a piece cut out of a tensor shows its element range), all ok, and `strata ckpt verify`
# checks; resuming at 2 ranks is bit-identical to the uninterrupted 2-rank run (--dump-weights), and 1 and 3 ranks
# resume it at its step. A flipped byte in rank 1's file fails verify naming that file and tensor, and the resume
# naming rank 1's file on every rank; a missing rank file fails verify naming it, and so do pieces of a tensor that
# leave a gap or overlap (naming the tensor and elements). A checkpoint of format version 1 (one rank, written by an
# older strata) still verifies and resumes bit-identically. Exit 77 without mpirun.
set -u
bin=${STRATA_BIN:?STRATA_BIN must name the strata binary}
src=${STRATA_SOURCE_DIR:-$(dirname "$0")/..}
source "$src/tests/helpers/cli.sh"
cli_mpi_scratch cli_ckpt_ranks
common=(train --model tiny --batch 4 --seed 7 --threads 1 --quiet --warmup 2)

mpi_run 2 "$bin" "${common[@]}" --steps 6 --dump-weights "$scratch/straight.bin" >"$scratch/a.out" 2>&1 ||
    { fail "2 ranks straight"; cat "$scratch/a.out"; }
mpi_run 2 "$bin" "${common[@]}" --steps 6 --save "$scratch/ck" --save-every 3 >"$scratch/b.out" 2>&1 ||
    { fail "2 ranks with --save"; cat "$scratch/b.out"; }
ck=$scratch/ck/step-3
lines=$(grep -c "^checkpoint: " "$scratch/b.out")
[ "$lines" -eq 2 ] && ok || { fail "rank 0 alone reports each checkpoint: $lines lines"; cat "$scratch/b.out"; }
have=$(cd "$ck" 2>/dev/null && ls | tr '\n' ' ')
want="manifest.json model.rank0.safetensors model.rank1.safetensors optimizer.rank0.safetensors optimizer.rank1.safetensors "
[ "$have" = "$want" ] && ok || fail "files of a 2-rank checkpoint: \"$have\", expected \"$want\""

check "verify" 0 "pieces from 2 ranks, " -- "$bin" ckpt verify "$ck"
out=$("$bin" ckpt inspect "$ck" 2>&1); rc=$?
rows=$(grep -c "safetensors .* ok$" <<<"$out")
pieces=$(python3 -c 'import json, sys; print(len(json.load(open(sys.argv[1]))["tensors"]))' "$ck/manifest.json")
cut=$(grep -cE "\] [0-9]+:[0-9]+ " <<<"$out")
[ $rc -eq 0 ] && [ "$rows" -eq "$pieces" ] && [ "$cut" -gt 0 ] && grep -q "^world        written by 2 ranks" <<<"$out" &&
    ok ||
    { fail "inspect: exit $rc, $rows ok rows for $pieces pieces, $cut cut tensors"; echo "$out" | head -20; }

# Resuming at 2 ranks continues exactly; at 1 and 3 ranks from the same step.
mpi_run 2 "$bin" "${common[@]}" --steps 6 --resume "$ck" --dump-weights "$scratch/resumed.bin" >"$scratch/c.out" 2>&1 ||
    { fail "resume at 2 ranks"; cat "$scratch/c.out"; }
cmp -s "$scratch/straight.bin" "$scratch/resumed.bin" && ok ||
    fail "resumed at 2 ranks from step 3: the weights differ from the uninterrupted 2-rank run"
check "resume at 1 rank" 0 "resumed from $ck at step 3" -- "$bin" "${common[@]}" --steps 4 --resume "$ck"
check "resume at 3 ranks" 0 "resumed from $ck at step 3" -- mpi_run 3 "$bin" "${common[@]}" --steps 4 --resume "$ck"

# Damage in rank 1's file: verify and every rank's resume name it.
cp -r "$ck" "$scratch/bad"
size=$(stat -c %s "$scratch/bad/model.rank1.safetensors")
byte=$(od -An -tu1 -j $((size - 1)) -N1 "$scratch/bad/model.rank1.safetensors" | tr -d ' ')
printf "$(printf '\\%03o' $((byte ^ 0x20)))" |
    dd of="$scratch/bad/model.rank1.safetensors" bs=1 seek=$((size - 1)) conv=notrunc status=none
check "verify of a flipped byte" 1 "$scratch/bad/model.rank1.safetensors\": tensor" -- "$bin" ckpt verify "$scratch/bad"
out=$(mpi_run 2 "$bin" "${common[@]}" --steps 4 --resume "$scratch/bad" 2>&1); rc=$?
n=$(grep -c "model.rank1.safetensors.*crc32c" <<<"$out")
[ $rc -ne 0 ] && [ "$n" -ge 2 ] && ok ||
    { fail "resume of a damaged checkpoint: exit $rc, $n ranks named the file"; echo "$out"; }
cp -r "$ck" "$scratch/missing"
rm "$scratch/missing/optimizer.rank1.safetensors"
check "verify of a missing rank file" 1 "$scratch/missing/optimizer.rank1.safetensors\": cannot open it" -- \
    "$bin" ckpt verify "$scratch/missing"

# The pieces of each tensor must cover it exactly once: a manifest whose pieces leave a gap (a piece dropped) or
# overlap (a piece listed twice) is refused, naming the tensor and the elements.
for how in gap overlap; do
    cp -r "$ck" "$scratch/$how"
    name=$(python3 - "$scratch/$how/manifest.json" $how <<'PY'
import json, sys
path, how = sys.argv[1], sys.argv[2]
m = json.load(open(path))
t = m["tensors"]
i = next(i for i, p in enumerate(t) if p["elements"][0] > 0)
print(t[i]["name"])
if how == "gap":
    del t[i]
else:
    t.insert(i, dict(t[i]))
json.dump(m, open(path, "w"), indent=1)
PY
)
    want="a gap: no piece holds elements"
    [ $how = overlap ] && want="two pieces overlap: both hold elements"
    check "verify of a manifest whose pieces $how" 1 "tensor \"$name\" (model files): $want" -- "$bin" ckpt verify "$scratch/$how"
done

# Format version 1: what one rank wrote before checkpoints were sharded (no world_size, whole tensors).
"$bin" "${common[@]}" --steps 6 --dump-weights "$scratch/one.bin" >/dev/null 2>&1 || fail "1 rank straight"
"$bin" "${common[@]}" --steps 6 --save "$scratch/v1" --save-every 3 --keep 3 >/dev/null 2>&1 || fail "1 rank with --save"
rm -r "$scratch/v1/step-6"
python3 - "$scratch/v1/step-3/manifest.json" <<'EOF'
import json, sys
path = sys.argv[1]
m = json.load(open(path))
m["version"] = 1
del m["world_size"]
for t in m["tensors"]:
    del t["elements"]
json.dump(m, open(path, "w"), indent=1)
EOF
check "verify of version 1" 0 "every checksum matches" -- "$bin" ckpt verify "$scratch/v1/step-3"
check "inspect of version 1" 0 "strata-checkpoint v1" -- "$bin" ckpt inspect "$scratch/v1/step-3"
"$bin" "${common[@]}" --steps 6 --resume "$scratch/v1" --dump-weights "$scratch/one-resumed.bin" >/dev/null 2>&1 ||
    fail "resume of version 1"
cmp -s "$scratch/one.bin" "$scratch/one-resumed.bin" && ok ||
    fail "resumed from a version-1 checkpoint: the weights differ from the uninterrupted run"

cli_done cli_ckpt_ranks
