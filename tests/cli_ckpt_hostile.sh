#!/usr/bin/env bash
# Checkpoints that are not what they claim, refused by name and never blocking: one with tensors the model lacks
# (3 layers resumed as 2: refused naming how many and the first, for 1 rank and for the model.rank<r> files of 2);
# a FIFO, a socket-like special file or a symbolic link in place of the manifest or a tensor file (verify and
# --resume answer at once, and a link to /etc/passwd is never read or quoted); an edited manifest field ("step" 2
# -> 7) refused alike by verify, inspect and --resume, naming the field; a manifest of format version 2 (no field
# checksums) still read, with a warning.
set -u
bin=${STRATA_BIN:?STRATA_BIN must name the strata binary}
here=$(dirname "${BASH_SOURCE[0]}")
source "$here/helpers/cli.sh"
cli_scratch cli_ckpt_hostile
common=(train --model tiny --batch 2 --seq 16 --threads 1 --seed 4 --quiet)
py=$(command -v python3)

"$bin" "${common[@]}" --layers 3 --steps 2 --save "$scratch/l3" >"$scratch/l3.out" 2>&1 || { fail "3-layer save"; cat "$scratch/l3.out"; }
# 12 tensors per block in the model file (ln1, attn qkv/proj, ln2, mlp fc/proj: a weight and a bias each).
check "3-layer checkpoint resumed with 2 layers" 1 \
    "the checkpoint holds 12 tensors the model lacks in its model.safetensors files (\"block2.attn.proj.bias\"" -- \
    "$bin" "${common[@]}" --layers 2 --steps 3 --resume "$scratch/l3"
"$bin" "${common[@]}" --layers 2 --steps 2 --save "$scratch/l2" >/dev/null 2>&1 || fail "2-layer save"
check "2-layer checkpoint resumed with 3 layers" 1 \
    "the checkpoint has no tensor \"block2.ln1.weight\" in its model.safetensors files" -- \
    "$bin" "${common[@]}" --layers 3 --steps 3 --resume "$scratch/l2"
if cli_mpi_strata "${common[@]}" --steps 1; then
    timeout 120 bash "$here/helpers/mpi.sh" 2 "$bin" "${common[@]}" --layers 3 --steps 2 --save "$scratch/l3r" \
        >"$scratch/l3r.out" 2>&1 || { fail "3-layer save with 2 ranks"; cat "$scratch/l3r.out"; }
    check "3-layer checkpoint of 2 ranks resumed with 2 layers" 1 \
        "12 tensors the model lacks in its model.rank{0..1}.safetensors files (\"block2.attn.proj.bias\"" -- \
        "$bin" "${common[@]}" --layers 2 --steps 3 --resume "$scratch/l3r"
    check "a tensor of a 2-rank checkpoint of another size names its rank's file" 1 \
        "strata_load: model.rank0.safetensors: tensor \"embeddings.wte\" is F32 x 16384, the engine's parameter is F32 x 32768" -- \
        "$bin" "${common[@]}" --layers 3 --hidden 128 --heads 2 --steps 3 --resume "$scratch/l3r"
else
    echo "skipped the 2-rank part: mpirun missing or strata built without MPI"
fi

# Special files in place of a checkpoint's files: refused at once, by name (timeout: a FIFO used to block forever).
ck="$scratch/l3/step-2"
for victim in manifest.json model.safetensors; do
    for what in fifo link; do
        cp -r "$ck" "$scratch/$what"
        rm "$scratch/$what/$victim"
        if [ $what = fifo ]; then mkfifo "$scratch/$what/$victim"; want="is a FIFO, not a regular file"
        else ln -s /etc/passwd "$scratch/$what/$victim"; want="is a symbolic link, not a regular file"; fi
        check "verify with a $what as $victim" 1 "$scratch/$what/$victim\" $want" -- \
            timeout 10 "$bin" ckpt verify "$scratch/$what"
        check "--resume with a $what as $victim" 1 "$scratch/$what/$victim\" $want" -- \
            timeout 30 "$bin" "${common[@]}" --layers 3 --steps 3 --resume "$scratch/$what"
        out=$(timeout 10 "$bin" ckpt inspect "$scratch/$what" 2>&1)
        grep -q "root:" <<<"$out" && fail "inspect with a $what as $victim quoted /etc/passwd: $out" || ok
        rm -rf "${scratch:?}/$what"
    done
done

# An edited manifest field: verify, inspect and --resume all refuse, naming the field.
cp -r "$ck" "$scratch/edited"
sed -i 's/"step": 2,/"step": 7,/' "$scratch/edited/manifest.json"
grep -q '"step": 7,' "$scratch/edited/manifest.json" || fail "the test could not edit \"step\" in the manifest"
want="manifest.json: field \"step\" does not match its checksum"
check "verify of an edited step" 1 "$want" -- "$bin" ckpt verify "$scratch/edited"
check "inspect of an edited step" 1 "$want" -- "$bin" ckpt inspect "$scratch/edited"
check "--resume of an edited step" 1 "$want" -- "$bin" "${common[@]}" --layers 3 --steps 3 --resume "$scratch/edited"
# A field added (or removed) after the save is named too.
"$py" - "$scratch/edited/manifest.json" "$ck/manifest.json" <<'PY'
import json, sys
m = json.load(open(sys.argv[2]))
m["note"] = "added by hand"
json.dump(m, open(sys.argv[1], "w"), indent=1)
PY
check "verify of an added field" 1 "field \"note\" has no checksum" -- "$bin" ckpt verify "$scratch/edited"

# Format version 2 (no field checksums, written before them): read, with a warning; its step is what resume uses.
cp -r "$ck" "$scratch/v2"
"$py" - "$scratch/v2/manifest.json" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
assert m["version"] == 3, m["version"]
m["version"] = 2
del m["field_crc32c"]
json.dump(m, open(sys.argv[1], "w"), indent=1)
PY
check "verify of version 2" 0 "has no checksums over its own fields" -- "$bin" ckpt verify "$scratch/v2"
check "resume of version 2" 0 "resumed from $scratch/v2 at step 2" -- \
    "$bin" "${common[@]}" --layers 3 --steps 3 --resume "$scratch/v2"

cli_done cli_ckpt_hostile
