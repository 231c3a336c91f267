"""A rank of `mpirun -np 2 ... strata.torch` that dies of a Python exception fails the world at once: the other rank's
next strata call raises strata.CommError naming the rank and its exception, well before the 120 s collective
timeout, and the job ends instead of hanging (no rank waits in MPI_Finalize for a rank that is gone).
The test launches the world itself (tests/helpers/mpi.sh) and reads what each rank printed.
Run: tests/py_torch_rank_fault.py [--rank-child]
"""
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "helpers"))
import strata_test as T  # noqa: E402

torch = T.require_torch()
import strata  # noqa: E402
import strata.torch  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402

FAILING_RANK, FAIL_AT = 1, 2


def child():
    """One rank: train; rank 1 raises at step 2 (uncaught); rank 0 reports what its next call raised."""
    T.child_process()
    torch.manual_seed(5)
    engine = strata.torch.initialize(
        model=GPT(GPTConfig(vocab_size=32, block_size=8, n_layer=2, n_head=2, n_embd=16)),
        config={"zero_optimization": {"stage": 3}}, device="cpu")[0]
    x = torch.randint(0, 32, (2, 8))
    for step in range(6):
        if engine.rank == FAILING_RANK and step == FAIL_AT:
            raise RuntimeError("deliberate failure of the trainer's data loader")
        t0 = time.monotonic()
        try:
            engine.backward(engine(x, x))
            engine.step()
        except strata.CommError as e:
            print("rank %d: CommError after %.1f s: %s" % (engine.rank, time.monotonic() - t0, e), flush=True)
            sys.exit(3)
    print("rank %d: finished all steps (the failure was not seen)" % engine.rank, flush=True)


def main():
    helper = os.path.join(T.SOURCE_DIR, "tests", "helpers", "mpi.sh")
    if subprocess.run(["bash", "-c", "command -v mpirun"], capture_output=True).returncode != 0:
        T.skip("mpirun not found (install openmpi-bin)")
    t0 = time.monotonic()
    run = subprocess.run(["bash", helper, "2", sys.executable, os.path.abspath(__file__), "--rank-child"],
                         capture_output=True, text=True, timeout=240)
    took = time.monotonic() - t0
    out = run.stdout + run.stderr
    print(out[-2500:])
    T.check(run.returncode != 0, "the job fails", run.returncode, "non-zero")
    T.check("deliberate failure" in out and "Traceback" in out, "rank 1's exception is reported")
    T.check("rank 0: CommError" in out and "rank 1 failed" in out and "deliberate failure" in out,
            "rank 0's next call raises CommError naming rank 1 and its exception")
    T.check(took < 60, "the world ended well before the 120 s timeout (seconds)", round(took, 1), "< 60")
    T.done()


if __name__ == "__main__":
    if sys.argv[1:] == ["--rank-child"]:
        child()
    else:
        main()
