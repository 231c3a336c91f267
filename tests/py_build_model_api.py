"""The compiler holds model/ to the public API: compiled with the very command the build uses for a model source
(compile_commands.json), a file that includes strata.h and model/'s own headers compiles, and a file that includes a
header of any internal layer (base/, engine/, offload/, nvme/, cpu_adam/, gpu/, comm/, tools/) or the build tree's
build_info.h does not. What no include path can stop, a "../" path beside a model source, is tests/cli_model_api.sh's
to catch."""
import glob
import json
import os
import shlex
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "helpers"))
import strata_test as T  # noqa: E402

INTERNAL_LAYERS = ("base", "engine", "offload", "nvme", "cpu_adam", "gpu", "comm", "tools")
# Flags that name the object or dependency file of the one real compile; the planted files write neither.
DROP_WITH_VALUE = ("-o", "-MT", "-MF", "-MQ")
DROP_ALONE = ("-c", "-MD", "-MMD")


def model_compile_command():
    """The build's argument list for one model/*.c source, minus its input and outputs, and the directory it runs in."""
    path = os.path.join(T.BUILD_DIR, "compile_commands.json")
    if not os.path.exists(path):
        T.skip("%s does not exist (this CMake generator does not export compile commands)" % path)
    with open(path) as f:
        entries = json.load(f)
    model_dir = os.path.join(T.SOURCE_DIR, "model") + os.sep
    entry = next((e for e in entries if e["file"].startswith(model_dir) and e["file"].endswith(".c")), None)
    if entry is None:
        T.skip("no model/*.c source in %s (is STRATA_BUILD_MODEL off?)" % path)
    args = shlex.split(entry["command"]) if "command" in entry else list(entry["arguments"])
    kept, skip_next = [], False
    for a in args:
        if skip_next:
            skip_next = False
        elif a in DROP_WITH_VALUE:
            skip_next = True
        elif a not in DROP_ALONE and a != entry["file"]:
            kept.append(a)
    return kept, entry["directory"], entry["file"]


def compiles(args, cwd, scratch, name, text):
    """Compiles a planted file (syntax only) with the model's flags: (returned 0, compiler output)."""
    src = os.path.join(scratch, name)
    with open(src, "w") as f:
        f.write(text)
    # A sanitized build preloads its runtimes into this interpreter; the compiler must not inherit them.
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    p = subprocess.run(args + ["-fsyntax-only", src], cwd=cwd, env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=120)
    return p.returncode == 0, p.stdout


def main():
    args, cwd, real = model_compile_command()
    print("the model's compile command (from %s): %s" % (os.path.relpath(real, T.SOURCE_DIR), " ".join(args)))
    scratch = T.scratch("py_build_model_api")

    ok, out = compiles(args, cwd, scratch, "public.c",
                       '#include "strata.h"\n#include "model/gpt.h"\n#include "model/gpt_ops.h"\n'
                       "int planted_public;\n")
    T.check(ok, "a model file that includes strata.h and model/ headers compiles", out.strip(), "no error")

    planted = ["build_info.h"]
    for layer in INTERNAL_LAYERS:
        headers = sorted(glob.glob(os.path.join(T.SOURCE_DIR, layer, "*.h")))
        T.check(bool(headers), "%s/ has a header to plant" % layer, "none", "at least one")
        planted += [os.path.relpath(h, T.SOURCE_DIR) for h in headers[:1]]
    for header in planted:
        ok, out = compiles(args, cwd, scratch, "internal.c", '#include "%s"\nint planted_internal;\n' % header)
        T.check(not ok and header in out, 'the compiler rejects #include "%s" in model code' % header,
                "compiled" if ok else out.strip()[:300], "a missing-header error")
    print("ok: %d internal headers rejected, the public ones accepted" % len(planted))
    T.done()


main()
