"""`pip install .` at the repository root as a user with PyPI meets it: from a fresh clone with no build tree, pip
brings scikit-build-core, which builds libstrata with CMake into the wheel; the installed package loads that copy
with STRATA_LIB unset and trains 3 steps of a small model through strata.torch.initialize exactly as torch's AdamW
(bit for bit on torch 1.x, Debian's; within a tolerance on torch 2, which rounds Adam differently). Also: the wheel
holds the package and the one library, nothing else; a missing Debian package stops the build naming it; the root's
and python/'s descriptions of the package agree. Skipped (77), with the reason, when pip cannot reach PyPI.

The clone is of this repository's HEAD with the working tree's uncommitted changes laid over it, so a developer
tests what they are about to commit; in CI, a clean clone, the two are the same. The venv sees Debian's torch
(--system-site-packages), so nothing but scikit-build-core and its few dependencies is downloaded (pip's cache
keeps them). The build is a real one, in Release as a user gets it, but without the CUDA backend (the wheel builds
it wherever nvcc is, as any build does): the main build compiles those kernels already, and here they would add
about 40 s on two cores."""
import json
import os
import re
import shutil
import subprocess
import sys
import time
import zipfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "helpers"))
import strata_test as T  # noqa: E402  (puts <source>/python on the path)
import _root_build  # noqa: E402  (python/_root_build.py: the root's build backend, importable without its backend)

STRATA_VARS = ("PYTHONPATH", "STRATA_LIB", "STRATA_BUILD_DIR", "STRATA_SOURCE_DIR")
STEPS = 3


def user_env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in STRATA_VARS}
    env.update(extra)
    return env


def run(cmd, cwd, env=None, timeout=600):
    p = subprocess.run(cmd, cwd=cwd, env=env or user_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=timeout)
    return p.returncode, p.stdout


def tail(text, lines=25):
    return "\n    " + "\n    ".join(text.strip().splitlines()[-lines:])


def cmake_version():
    with open(os.path.join(T.SOURCE_DIR, "CMakeLists.txt")) as f:
        m = re.search(r"project\(strata VERSION ([0-9.]+)", f.read())
    return m.group(1) if m else None


# ---------------------------------------------------------------- what holds without a network


def check_descriptions():
    """The root's pyproject.toml (the build from source) and python/'s (the offline recipe) describe one package."""
    try:
        import tomllib
    except ImportError:
        print("note: not checked: the two pyproject.toml agree (%s has no tomllib)" % sys.executable)
        return
    with open(os.path.join(T.SOURCE_DIR, "pyproject.toml"), "rb") as f:
        root = tomllib.load(f)["project"]
    with open(os.path.join(T.SOURCE_DIR, "python", "pyproject.toml"), "rb") as f:
        package = tomllib.load(f)["project"]
    keys = ("name", "description", "requires-python", "dependencies", "optional-dependencies")
    differ = {k: (root.get(k), package.get(k)) for k in keys if root.get(k) != package.get(k)}
    T.check(not differ, "pyproject.toml and python/pyproject.toml describe the same package", differ, "no difference")
    T.check(package.get("version") == cmake_version() and root.get("dynamic") == ["version"],
            "python/ writes CMakeLists' version; the root reads it from there",
            (package.get("version"), root.get("dynamic")), (cmake_version(), ["version"]))
    extras = package.get("optional-dependencies", {})
    T.check("torch" in extras.get("torch", []) and {"transformers", "accelerate"} <= set(extras.get("hf", [])),
            "extras: strata[torch] brings torch, strata[hf] transformers and accelerate", extras, "torch, hf")


def check_package_table():
    """The build backend's table of Debian packages covers what CMakeLists.txt requires of pkg-config for the library
    (OpenBLAS is the model's, which the wheel does not build)."""
    with open(os.path.join(T.SOURCE_DIR, "CMakeLists.txt")) as f:
        required = set(re.findall(r"pkg_check_modules\(\s*\w+\s+REQUIRED\s+IMPORTED_TARGET\s+([\w.+-]+)\s*\)",
                                  f.read()))
    want = required - {"openblas"}
    got = {module for module, _ in _root_build.PKG_CONFIG_MODULES}
    T.check(got == want and "openblas" in required, "python/_root_build.py checks each pkg-config module the library "
            "needs (CMakeLists.txt's, less the model's OpenBLAS)", sorted(got), sorted(want))


# ---------------------------------------------------------------- the tree a user clones


def fresh_clone(dest):
    """A clone of HEAD with the working tree's uncommitted changes (tracked and untracked-not-ignored) laid over it;
    returns a reason when it could not be made."""
    rc, out = run(["git", "-C", T.SOURCE_DIR, "rev-parse", "--show-toplevel"], T.SOURCE_DIR)
    if rc != 0:
        return "%s is not a git checkout (git rev-parse: %s)" % (T.SOURCE_DIR, out.strip())
    top = out.strip()
    rc, out = run(["git", "clone", "-q", top, dest], T.SOURCE_DIR, timeout=120)
    if rc != 0:
        return "git clone %s failed:%s" % (top, tail(out, 5))
    changed = []
    for cmd in (["diff", "--name-only", "-z", "HEAD"], ["ls-files", "-z", "--others", "--exclude-standard"]):
        p = subprocess.run(["git", "-C", top] + cmd, stdout=subprocess.PIPE, check=True)
        changed += [name for name in p.stdout.decode().split("\0") if name]
    for name in changed:
        src, dst = os.path.join(top, name), os.path.join(dest, name)
        if os.path.lexists(dst) and not os.path.isdir(dst):
            os.remove(dst)
        if os.path.lexists(src):
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            shutil.copy2(src, dst, follow_symlinks=False)
    print("clone of %s with %d uncommitted change(s) laid over it" % (top, len(changed)))
    return None


# ---------------------------------------------------------------- the installed package at work

CHILD = r"""
import json, sys
import strata
out = {"library": strata.library_path(), "version": strata.version(), "file": strata.__file__}
try:
    import torch
    import strata.torch
except ImportError as e:
    out["torch"] = None
    out["why"] = str(e)
    print(json.dumps(out))
    sys.exit(0)
SEED, STEPS = int(sys.argv[1]), int(sys.argv[2])
HP = dict(lr=3e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)

def model():
    torch.manual_seed(SEED)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 8))

g = torch.Generator().manual_seed(SEED + 1)
batches = [(torch.randn(4, 8, generator=g), torch.randn(4, 8, generator=g)) for _ in range(STEPS)]
config = {"optimizer": {"type": "AdamW", "params": {"lr": HP["lr"], "betas": list(HP["betas"]), "eps": HP["eps"],
                                                    "weight_decay": HP["weight_decay"]}}}
engine = strata.torch.initialize(model=model(), config=config, device="cpu")[0]
got = []
for x, y in batches:
    loss = torch.nn.functional.mse_loss(engine(x), y)
    got.append(loss.item())
    engine.backward(loss)
    engine.step()
weights = engine.fp32_state_dict()
engine.close()
ref = model()
opt = torch.optim.AdamW(ref.parameters(), **HP)
want = []
for x, y in batches:
    loss = torch.nn.functional.mse_loss(ref(x), y)
    want.append(loss.item())
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
params = dict(ref.named_parameters())
out.update(torch=torch.__version__, losses=got, torch_losses=want,
           bitwise=all(torch.equal(weights[n], p.detach()) for n, p in params.items()),
           close=all(torch.allclose(weights[n], p.detach(), rtol=1e-3, atol=2e-4) for n, p in params.items()),
           max_diff=max((weights[n] - p.detach()).abs().max().item() for n, p in params.items()))
print(json.dumps(out))
"""


def check_training(py, venv, outside, seed):
    rc, out = run([py, "-c", CHILD, str(seed), str(STEPS)], outside, timeout=300)
    last = out.strip().splitlines()[-1] if out.strip() else ""
    try:
        got = json.loads(last)
    except ValueError:
        T.check(False, "the installed package runs outside the checkout", "rc %d:%s" % (rc, tail(out)), "a result")
        return
    path, reason = got["library"]
    T.check(path.startswith(venv + os.sep) and path.endswith(os.path.join("strata", "_native", "libstrata.so")) and
            reason == "the copy bundled with the installed package" and got["file"].startswith(venv + os.sep),
            "with STRATA_LIB unset the installed package loads the library its wheel built", (path, reason),
            "<venv>/.../strata/_native/libstrata.so, the copy bundled with the installed package")
    T.check(got["version"] == cmake_version(), "the wheel's library is this version", got["version"], cmake_version())
    if got.get("torch") is None:
        print("note: not checked: training through strata.torch (the venv cannot import torch: %s)" % got.get("why"))
        return
    exact = int(got["torch"].split(".")[0]) < 2
    if exact:
        T.check(got["losses"] == got["torch_losses"] and got["bitwise"],
                "%d steps of strata.torch.initialize: losses and weights bit-identical to torch %s's AdamW (max "
                "|diff| %.3g)" % (STEPS, got["torch"], got["max_diff"]), got["losses"], got["torch_losses"])
    else:
        T.check(all(abs(a - b) <= 2e-4 + 1e-3 * abs(b) for a, b in zip(got["losses"], got["torch_losses"])) and
                got["close"], "%d steps of strata.torch.initialize: losses and weights within rtol 1e-3, atol 2e-4 "
                "of torch %s's AdamW (max |diff| %.3g)" % (STEPS, got["torch"], got["max_diff"]), got["losses"],
                got["torch_losses"])
    print("losses %s, torch AdamW %s (torch %s)" % (got["losses"], got["torch_losses"], got["torch"]))


def check_wheel(wheel, clone):
    version = cmake_version()
    name = os.path.basename(wheel)
    T.check(re.fullmatch(r"strata-%s-py3-none-linux_\w+\.whl" % re.escape(version), name) is not None,
            "the wheel is named for this version, any Python 3, this platform", name,
            "strata-%s-py3-none-linux_<arch>.whl" % version)
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        so = z.getinfo("strata/_native/libstrata.so") if "strata/_native/libstrata.so" in names else None
        metadata = z.read("strata-%s.dist-info/METADATA" % version).decode() if (
            "strata-%s.dist-info/METADATA" % version) in names else ""
    T.check(so is not None and so.file_size > 0, "the wheel holds strata/_native/libstrata.so", sorted(names)[:8],
            "strata/_native/libstrata.so")
    package = os.path.join(clone, "python")
    sources = set()
    for d, dirs, files in os.walk(os.path.join(package, "strata")):
        dirs[:] = [x for x in dirs if x != "__pycache__"]
        sources |= {os.path.relpath(os.path.join(d, f), package).replace(os.sep, "/") for f in files}
    others = sorted(n for n in names if not n.startswith("strata-%s.dist-info/" % version))
    want = sorted(sources | {"strata/_native/libstrata.so"})
    T.check(others == want, "the wheel holds the package's files and the library, nothing else (no header, static "
            "library, CMake or pkg-config files)", sorted(set(others) ^ set(want)), "no difference")
    extras = set(re.findall(r"^Provides-Extra: (\S+)$", metadata, re.M))
    T.check({"torch", "hf"} <= extras and "Requires-Dist: transformers; extra == \"hf\"" in metadata,
            "the wheel's metadata offers strata[torch] and strata[hf]", sorted(extras), ["hf", "torch"])
    print("wheel %s: %d bytes, %d files; libstrata.so %d bytes (%d compressed)" % (
        name, os.path.getsize(wheel), len(names), so.file_size if so else 0, so.compress_size if so else 0))


def check_missing_package(pip, clone, outside, scratch):
    """pkg-config that finds nothing (PKG_CONFIG_LIBDIR at an empty directory) stands for a system without the
    -dev packages: the build stops naming each one."""
    empty = os.path.join(scratch, "no-pkgconfig")
    os.makedirs(empty)
    rc, out = run(pip + ["wheel", "--no-deps", "-w", os.path.join(scratch, "never"), clone], outside,
                  user_env(PKG_CONFIG_LIBDIR=empty))
    named = [deb for _, deb in _root_build.PKG_CONFIG_MODULES if "install Debian's %s" % deb in out]
    T.check(rc != 0 and "strata: cannot build libstrata; missing:" in out and
            len(named) == len(_root_build.PKG_CONFIG_MODULES),
            "a build without the -dev packages stops, naming each Debian package", "rc %d:%s" % (rc, tail(out, 8)),
            "rc != 0 naming %s" % ", ".join(deb for _, deb in _root_build.PKG_CONFIG_MODULES))


def main():
    started = time.time()
    preload = os.environ.get("LD_PRELOAD", "")
    if any("san" in os.path.basename(lib) for lib in preload.split(":")):
        T.skip("the sanitized suite (LD_PRELOAD=%s): this test builds and checks its own library, unsanitized, and "
               "the plain suite runs it" % preload)
    seed = T.seed()
    check_descriptions()
    check_package_table()
    scratch = T.scratch("py_package_wheel")
    outside = os.path.join(scratch, "elsewhere")
    os.makedirs(outside)

    venv = os.path.join(scratch, "venv")
    rc, out = run([sys.executable, "-m", "venv", "--system-site-packages", venv], scratch)
    if rc != 0:
        skip_or_done("%s -m venv failed (install python3-venv; tools/run does):%s" % (sys.executable, tail(out, 5)))
    py, pip = os.path.join(venv, "bin", "python"), [os.path.join(venv, "bin", "python"), "-m", "pip"]

    # PyPI, through pip itself: scikit-build-core is what the build needs first (and pip's cache keeps it).
    rc, out = run(pip + ["download", "--no-deps", "--retries", "0", "--timeout", "20", "-d",
                         os.path.join(scratch, "probe"), "scikit-build-core>=0.10"], outside, timeout=120)
    if rc != 0:
        skip_or_done("pip cannot reach PyPI to get scikit-build-core:%s" % tail(out, 4))

    clone = os.path.join(scratch, "strata")
    reason = fresh_clone(clone)
    if reason:
        skip_or_done(reason)
    T.check(not os.path.exists(os.path.join(clone, "build")), "the clone has no build tree",
            os.listdir(clone), "no build/")

    t = time.time()
    wheels = os.path.join(scratch, "wheels")
    rc, out = run(pip + ["wheel", "-v", "--no-deps", "-w", wheels, "--config-settings=cmake.define.STRATA_CUDA=OFF",
                         clone], outside)
    built = sorted(os.listdir(wheels)) if os.path.isdir(wheels) else []
    T.check(rc == 0 and len(built) == 1, "pip wheel builds libstrata from the fresh clone with scikit-build-core",
            "rc %d, %s:%s" % (rc, built, tail(out, 40)), "rc 0 and one wheel")
    print("pip wheel (CMake configure + build + pack) took %.0f s" % (time.time() - t))
    if rc != 0 or len(built) != 1:
        T.done()
    wheel = os.path.join(wheels, built[0])
    check_wheel(wheel, clone)

    rc, out = run(pip + ["install", "--no-deps", "--no-index", wheel], outside)
    T.check(rc == 0, "the wheel installs into a fresh venv", "rc %d:%s" % (rc, tail(out)), "rc 0")
    if rc == 0:
        check_training(py, venv, outside, seed)

    check_missing_package(pip, clone, outside, scratch)
    print("py_package_wheel took %.0f s" % (time.time() - started))
    T.done()


def skip_or_done(reason):
    """Skip with the reason, unless a check that needed no network failed: that failure is the verdict."""
    if T._state["failed"] == 0:
        T.skip(reason)
    print("note: the install checks could not run: " + reason)
    T.done()


main()
