"""torchrun, accelerate launch and the deepspeed launcher are refused at once, naming mpirun.

Those launchers start N processes with WORLD_SIZE=N, RANK, LOCAL_RANK and MASTER_ADDR / MASTER_PORT for
torch.distributed; strata takes its ranks from MPI, so each process used to train alone as rank 0 of 1, silently.
Now strata.torch.initialize, StrataEngine and strata's world() refuse with Unsupported naming `mpirun -np N` and
torch.distributed:
  - a child process with the environment torchrun gives (WORLD_SIZE=2, RANK=0, LOCAL_RANK=0, MASTER_ADDR=127.0.0.1,
    MASTER_PORT) gets the error from all three, before any model moves into strata;
  - a real `torchrun --nproc_per_node 2` (python -m torch.distributed.run, on 127.0.0.1 and a free port): both
    processes fail fast with that message (bounded by a timeout);
  - WORLD_SIZE=1 is a world of one, as strata's: no refusal;
  - under mpirun with WORLD_SIZE=2 as well (a launcher that sets both), strata's world of 2 agrees: no refusal.
Run: tests/py_torch_launchers.py [--child]  (--child is the test's own child process).
"""
import os
import socket
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "helpers"))
import strata_test as T  # noqa: E402

torch = T.require_torch()

HERE = os.path.abspath(__file__)
TIMEOUT_S = 180
REFUSED = "REFUSED"


def child():
    """Tries world(), StrataEngine and initialize; writes one line for each into $LAUNCHER_REPORT/<pid>.txt (output
    forwarded by a launcher interleaves): REFUSED <rank> <what>: <message>, or ACCEPTED <rank> <what> <world size>;
    then UNTOUCHED <rank> <whether the model kept its weights>."""
    T.child_process()
    import strata
    import strata.torch
    from strata.engine import world
    from strata.torch.engine import StrataEngine
    rank = os.environ.get("RANK", "-")
    report = []

    def model():
        torch.manual_seed(0)  # the same on every rank: finalize compares the initial weights
        return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))

    m = model()
    tries = [("world()", lambda: world()),
             ("StrataEngine", lambda: StrataEngine(model(), {"strata": {"backend": "host"}})),
             ("initialize", lambda: strata.torch.initialize(model=m, config={}, device="cpu")[0])]
    for what, fn in tries:
        try:
            out = fn()
        except strata.Unsupported as e:
            report.append("%s %s %s: %s" % (REFUSED, rank, what, " ".join(str(e).split())))
            continue
        report.append("ACCEPTED %s %s %s" % (rank, what, getattr(out, "size", getattr(out, "world_size", "?"))))
        if what != "world()":
            out.close()
    report.append("UNTOUCHED %s %s" % (rank, all(p.numel() > 0 for p in m.parameters())))
    with open(os.path.join(os.environ["LAUNCHER_REPORT"], "%d.txt" % os.getpid()), "w") as f:
        f.write("\n".join(report) + "\n")
    sys.exit(0)  # not os._exit: under mpirun the world is closed at exit (MPI_Finalize)


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def environment(**extra):
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR",
                                                            "MASTER_PORT", "LOCAL_WORLD_SIZE")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.path.join(T.SOURCE_DIR, "python"),
                                                      env.get("PYTHONPATH")]))
    env.update({k: str(v) for k, v in extra.items()})
    return env


def run(cmd, env, name):
    """(exit status or None after the timeout, the children's reports joined, the launcher's output)."""
    report = T.scratch("py_torch_launchers_" + name)
    env["LAUNCHER_REPORT"] = report
    try:
        p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=TIMEOUT_S)
        rc, out = p.returncode, p.stdout.decode(errors="replace")
    except subprocess.TimeoutExpired as e:
        rc, out = None, (e.stdout or b"").decode(errors="replace")
    texts = []
    for name in sorted(os.listdir(report)):
        with open(os.path.join(report, name)) as f:
            texts.append(f.read())
    return rc, "".join(texts), out


def lines(out, kind, rank):
    return [line for line in out.splitlines() if line.startswith("%s %s " % (kind, rank))]


def check_refused(out, rank, where):
    refused = lines(out, REFUSED, rank)
    whats = [line.split(":")[0].split(" ", 2)[2] for line in refused]
    T.check(whats == ["world()", "StrataEngine", "initialize"],
            "%s, rank %s: world(), StrataEngine and initialize are refused" % (where, rank), whats,
            ["world()", "StrataEngine", "initialize"])
    for line in refused:
        T.check("WORLD_SIZE=2" in line and "mpirun -np 2" in line and "torch.distributed" in line,
                "%s, rank %s: the message names WORLD_SIZE=2, mpirun -np 2 and torch.distributed" % (where, rank),
                line, "... WORLD_SIZE=2 ... torch.distributed ... mpirun -np 2 ...")
    T.check(lines(out, "UNTOUCHED", rank) == ["UNTOUCHED %s True" % rank],
            "%s, rank %s: refused before the model moved into strata" % (where, rank), lines(out, "UNTOUCHED", rank),
            ["UNTOUCHED %s True" % rank])


def torchrun_environment():
    rc, report, out = run([sys.executable, HERE, "--child"], environment(
        WORLD_SIZE=2, RANK=0, LOCAL_RANK=0, LOCAL_WORLD_SIZE=2, MASTER_ADDR="127.0.0.1", MASTER_PORT=free_port()),
        "env")
    T.check(rc == 0, "the child with torchrun's environment ran to its end", rc, 0) or print(out)
    check_refused(report, "0", "torchrun's environment")


def real_torchrun():
    # --redirects 1 --tee 1: torch 1.13's torchrun cannot parse its default "0" under Python 3.11 (Std(0) is not
    # among a Flag's members there); 1 (stdout to its log and to the console) parses on every torch.
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", "2",
           "--master_addr", "127.0.0.1", "--master_port", str(free_port()), "--redirects", "1", "--tee", "1",
           HERE, "--child"]
    rc, report, out = run(cmd, environment(OMP_NUM_THREADS=1), "torchrun")
    T.check(rc is not None, "torchrun --nproc_per_node 2 ends within %d s" % TIMEOUT_S, rc, "an exit status")
    if report.count("UNTOUCHED") != 2:
        print(out)
    for rank in ("0", "1"):
        check_refused(report, rank, "torchrun --nproc_per_node 2")


def world_of_one():
    rc, report, out = run([sys.executable, HERE, "--child"], environment(WORLD_SIZE=1, RANK=0, LOCAL_RANK=0), "one")
    accepted = [line.split()[2] for line in lines(report, "ACCEPTED", "0")]
    T.check(rc == 0 and accepted == ["world()", "StrataEngine", "initialize"],
            "WORLD_SIZE=1: world(), StrataEngine and initialize run", (rc, accepted),
            (0, ["world()", "StrataEngine", "initialize"])) or print(out)


def under_mpirun():
    """mpirun with WORLD_SIZE=2 exported too: strata's world of 2 agrees with it."""
    import shutil
    if not shutil.which("mpirun"):
        print("note: mpirun not found: the check under mpirun is left out")
        return
    mpi = os.path.join(T.SOURCE_DIR, "tests", "helpers", "mpi.sh")
    rc, report, out = run(["bash", mpi, "2", "-x", "WORLD_SIZE", "-x", "LAUNCHER_REPORT", sys.executable, HERE,
                           "--child"], environment(WORLD_SIZE=2), "mpirun")
    accepted = sorted(" ".join(line.split()[2:]) for line in report.splitlines() if line.startswith("ACCEPTED"))
    want = sorted(["world() 2", "StrataEngine 2", "initialize 2"] * 2)
    T.check(rc == 0 and accepted == want, "mpirun -np 2 with WORLD_SIZE=2: strata's world of 2 agrees, nothing "
            "refused", (rc, accepted), (0, want)) or print(out)


if "--child" in sys.argv:
    child()
T.seed()
torchrun_environment()
world_of_one()
real_torchrun()
under_mpirun()
T.done()
