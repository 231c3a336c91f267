#!/usr/bin/env bash
# DeepSpeed for the GPU machine, which reaches no package registry: everything benchmarks/flagship_peers.py's
# deepspeed peers import that the machine's image lacks, as wheels for its Python (CPython 3.12, x86-64 Linux).
#
#   tools/gpu/ds_carry.sh [DIR]                    here: fill DIR (default .gpu/deepspeed, git-ignored) with the wheels
#   tools/gpu/ds_carry.sh --install DIR [TARGET]   there: install DIR's wheels into TARGET (default /tmp/site),
#                                                  check what DeepSpeed's CPU Adam needs and build it (unless
#                                                  DS_CARRY_NO_OP=1); then export PYTHONPATH=TARGET:$PYTHONPATH
#
# DeepSpeed is an sdist on PyPI; built with DS_BUILD_OPS=0 it is a pure-Python wheel that compiles its ops at first
# use. The one op the peers use, the CPU Adam (csrc/adam/cpu_adam.cpp, cpu_adam_impl.cpp), is then JIT-built by
# torch.utils.cpp_extension with ninja and the host C++ compiler against the machine's own torch (2.11) and Python
# (3.12) headers. It is not prebuilt here: that needs torch 2.11's own headers and libraries, and
# DeepSpeed compiles it with -march=native and the SIMD width py-cpuinfo reads, which must be the GPU host's CPU,
# not this one's. --install checks for the compiler, ninja and Python.h there, says which is missing, and builds it.
# The image holds the rest of DeepSpeed's requirements (einops, msgpack, ninja, numpy, packaging, psutil,
# py-cpuinfo, torch, tqdm, nvidia-ml-py: /work/.library/device/KINDS.md); hjson and pydantic with its own
# requirements are carried, and typing-extensions too, since this pydantic needs 4.16 and the image's version is
# not recorded. The build fails when a carried wheel's requirement is neither carried (at a version that satisfies
# it) nor in that list, and when DIR outgrows MAX_MIB.
set -euo pipefail

DS_VERSION=${DS_VERSION:-0.19.8}
# name==version of every wheel carried beside DeepSpeed's; pydantic-core is the version pydantic pins.
CARRIED=(hjson==3.1.0 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.7.0 typing-inspection==0.4.5
    typing-extensions==4.16.0)
# What the GPU machine's image already holds, of what these wheels require.
ON_MACHINE="einops msgpack ninja numpy packaging psutil py-cpuinfo torch tqdm nvidia-ml-py"
MAX_MIB=${MAX_MIB:-20}
PY=${PYTHON:-python3}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)

die() { echo "ds_carry: $*" >&2; exit 1; }

install_there() {
    local dir=$1 target=${2:-/tmp/site}
    [ -f "$dir/MANIFEST" ] || die "$dir/MANIFEST is missing: build the carry here first (tools/gpu/ds_carry.sh $dir)"
    "$PY" -c 'import torch' 2>/dev/null || die "$PY cannot import torch: DeepSpeed needs the machine's own torch"
    PIP_ROOT_USER_ACTION=ignore "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$target" "$dir"/*.whl || die "pip could not install $dir/*.whl into $target"
    # torch's extension builder runs $CXX, else c++; its cache keys on that name, so the op built here is found by
    # the peers only when they run with the same CXX.
    local missing=() cxx="" cxx_env=()
    if cxx=$(command -v "${CXX:-c++}"); then
        :
    elif cxx=$(command -v g++); then
        cxx_env=(CXX="$cxx")
        echo "ds_carry: no ${CXX:-c++} on PATH: building with $cxx; export CXX=$cxx for the peers too"
    else
        missing+=("a C++ compiler (${CXX:-c++} or g++ on PATH)")
    fi
    "$PY" -c 'from torch.utils.cpp_extension import verify_ninja_availability as v; v()' 2>/dev/null ||
        missing+=("ninja (torch.utils.cpp_extension.verify_ninja_availability failed)")
    local inc
    inc=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
    [ -f "$inc/Python.h" ] || missing+=("Python.h (not in $inc)")
    if [ ${#missing[@]} -gt 0 ]; then
        printf 'ds_carry: DeepSpeed is installed in %s, but its CPU Adam op (cpu_adam.cpp, JIT-built at first use ' \
            "$target" >&2
        printf 'against this torch) cannot be built here: missing %s\n' "$(IFS=';'; echo "${missing[*]}")" >&2
        exit 2
    fi
    PYTHONPATH=$target${PYTHONPATH:+:$PYTHONPATH} "$PY" - "$cxx" <<'EOF' || die "deepspeed does not import from $target"
import sys, torch, deepspeed, pydantic
print("ds_carry: deepspeed %s, pydantic %s, torch %s (cuda %s), python %s; C++ %s" % (deepspeed.__version__,
      pydantic.VERSION, torch.__version__, torch.version.cuda, sys.version.split()[0], sys.argv[1]))
EOF
    [ -n "${DS_CARRY_NO_OP:-}" ] && return 0
    # The op is built now, into torch's extension cache (TORCH_EXTENSIONS_DIR, else ~/.cache/torch_extensions),
    # where the peers' processes find it: their start-up then holds its load, not its compile.
    env ${cxx_env[@]+"${cxx_env[@]}"} PYTHONPATH=$target${PYTHONPATH:+:$PYTHONPATH} "$PY" - <<'EOF' ||
import time
from deepspeed.ops.op_builder import CPUAdamBuilder
t0 = time.perf_counter()
CPUAdamBuilder().load(verbose=False)
print("ds_carry: DeepSpeed's CPU Adam op built (or found in torch's extension cache) in %.1f s; ready" % (
    time.perf_counter() - t0))
EOF
        die "building DeepSpeed's CPU Adam op failed (its compiler output is above)"
}

if [ "${1:-}" = "--install" ]; then
    [ $# -ge 2 ] || die "usage: $0 --install DIR [TARGET]"
    install_there "$2" "${3:-}"
    exit 0
fi

DIR=${1:-$REPO/.gpu/deepspeed}
mkdir -p "$DIR"
DIR=$(cd "$DIR" && pwd)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
rm -f "$DIR"/*.whl "$DIR/MANIFEST"

# DeepSpeed: the sdist built into a pure-Python wheel in a throwaway venv (setuptools and wheel, no torch: its
# setup.py then records torch 0.0, which only matters for prebuilt ops, and there are none). DS_ACCELERATOR=cuda
# names the accelerator the wheel is for, as a build on the GPU machine would detect it.
echo "ds_carry: building deepspeed $DS_VERSION (pure Python, DS_BUILD_OPS=0)"
"$PY" -m venv "$WORK/venv"
"$WORK/venv/bin/pip" install -q setuptools wheel
"$WORK/venv/bin/pip" download -q --no-deps --no-binary=:all: -d "$WORK/src" "deepspeed==$DS_VERSION"
DS_BUILD_OPS=0 DS_ACCELERATOR=cuda "$WORK/venv/bin/pip" wheel -q --no-deps --no-build-isolation -w "$DIR" \
    "$WORK/src/deepspeed-$DS_VERSION.tar.gz" >"$WORK/build.log" 2>&1 ||
    { tail -20 "$WORK/build.log" >&2; die "building the deepspeed $DS_VERSION wheel failed (log above)"; }

# The GPU machine's wheels: CPython 3.12, manylinux x86-64 (pip matches each manylinux_2_N tag exactly).
echo "ds_carry: downloading ${CARRIED[*]}"
PLATFORMS=()
for tag in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 \
    manylinux2014_x86_64 manylinux1_x86_64; do
    PLATFORMS+=(--platform "$tag")
done
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${PLATFORMS[@]}" \
    -d "$DIR" "${CARRIED[@]}" || die "pip download of ${CARRIED[*]} for cp312 manylinux x86-64 failed"

# Every requirement of every carried wheel (markers evaluated for CPython 3.12 on Linux): carried at a version
# that satisfies it, or among the machine's packages.
"$PY" - "$DIR" "$ON_MACHINE" <<'EOF'
import email.parser, glob, os, sys, zipfile
from pip._vendor.packaging.requirements import Requirement
from pip._vendor.packaging.utils import canonicalize_name
from pip._vendor.packaging.version import Version

folder, machine = sys.argv[1], {canonicalize_name(n) for n in sys.argv[2].split()}
env = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux", "platform_system": "Linux",
       "platform_machine": "x86_64", "implementation_name": "cpython", "platform_python_implementation": "CPython",
       "os_name": "posix", "extra": ""}
meta = {}
for path in sorted(glob.glob(os.path.join(folder, "*.whl"))):
    with zipfile.ZipFile(path) as z:
        name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        m = email.parser.Parser().parsestr(z.read(name).decode())
    requires = m.get_all("Requires-Dist") or []
    meta[canonicalize_name(m["Name"])] = (Version(m["Version"]), requires, os.path.basename(path))
bad = []
for name, (version, requires, wheel) in sorted(meta.items()):
    for line in requires:
        r = Requirement(line)
        if r.marker is not None and not r.marker.evaluate(env):
            continue
        dep = canonicalize_name(r.name)
        if dep in meta:
            if not r.specifier.contains(meta[dep][0], prereleases=True):
                bad.append("%s needs %s, carried %s" % (wheel, line, meta[dep][0]))
        elif dep not in machine:
            bad.append("%s needs %s: neither carried nor on the GPU machine" % (wheel, line))
for line in bad:
    print("ds_carry: " + line, file=sys.stderr)
sys.exit(1 if bad else 0)
EOF

{
    echo "# For benchmarks/flagship_peers.py's deepspeed peers on the GPU machine (CPython 3.12, x86-64)."
    echo "# Built by tools/gpu/ds_carry.sh on $(date -u +%Y-%m-%d) with $("$PY" --version 2>&1)."
    echo "# Install there: tools/gpu/ds_carry.sh --install DIR [TARGET]."
    echo "# deepspeed $DS_VERSION is built with DS_BUILD_OPS=0: its CPU Adam op is JIT-built there at first use."
    echo "# Assumed on the machine: $ON_MACHINE"
    echo "# name version bytes sha256 wheel"
    for w in "$DIR"/*.whl; do
        f=$(basename "$w")
        echo "${f%%-*} $(echo "$f" | cut -d- -f2) $(stat -c %s "$w") $(sha256sum "$w" | cut -d' ' -f1) $f"
    done
} >"$DIR/MANIFEST"
cat "$DIR/MANIFEST"
bytes=$(du -sb "$DIR" | cut -f1)
mib=$(awk -v b="$bytes" 'BEGIN { printf "%.2f", b / 1048576 }')
echo "ds_carry: $DIR holds $(ls "$DIR"/*.whl | wc -l) wheels, $bytes bytes ($mib MiB; limit $MAX_MIB MiB)"
[ "$bytes" -le $((MAX_MIB * 1048576)) ] || die "$DIR is $mib MiB, over the $MAX_MIB MiB the carry may take"
