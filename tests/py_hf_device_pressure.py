"""No device-budget failure from prefetches in flight: the shape that failed, repeated under load.

A Hugging Face T5 with non-reentrant gradient checkpointing at ZeRO stage 3 under a 256 KiB device budget (1.5x the
model) keeps its tied embedding unit in backward from the head to the encoder's input while blocks come and go. When
the machine is busy, a block's gradient buffer is asked for while prefetches are still in flight; their room was not
given back (only resident modules were evicted) and in a fragmented arena the step failed: "strata_grad_data: device
budget exceeded: asked 64.00 KiB, free 96.00 KiB of 256.00 KiB (largest free block 48.00 KiB)" — 7 of 225 runs before
the fix (3 processes at once on 2 cores), 0 of 225 after: strata now drops an unheld prefetch in flight as a last
resort (engine/residency/residency.c: evict_one). This test runs 3 processes at once, 25 short trainings each, and fails on any
budget error; each training's loss must stay finite.
Run: tests/py_hf_device_pressure.py [--child FIRST_SEED COUNT]  (the second form is the test's own child process).
"""
import math
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "helpers"))
import strata_test as T  # noqa: E402
import hf_models as H  # noqa: E402

torch = T.require_torch()
transformers = H.require_transformers()
import strata  # noqa: E402
import strata.torch  # noqa: E402

PROCESSES, RUNS, STEPS, GAS = 3, 25, 3, 2


def child(first_seed, count):
    T.child_process()
    failures = 0
    for seed in range(first_seed, first_seed + count):
        model = H.build(transformers, "t5", seed)
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        nvme = T.scratch("py_hf_device_pressure-%d" % first_seed)
        config = {"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme", "nvme_path": nvme},
                                        "offload_optimizer": {"device": "nvme", "nvme_path": nvme},
                                        "stage3_param_persistence_threshold": 0},
                  "gradient_accumulation_steps": GAS,
                  "strata": {"device_budget_bytes": 256 << 10, "prefetch_bytes": 64 << 10}}
        engine = strata.torch.initialize(model=model, config=config, device="cpu")[0]
        try:
            for step in range(STEPS):
                for micro in range(GAS):
                    loss = model(**H.batch(transformers, "t5", seed, step, micro)).loss
                    engine.backward(loss)
                    engine.step()
                    if not math.isfinite(loss.item()):
                        raise ValueError("loss %r" % loss.item())
        except (strata.StrataError, ValueError) as e:
            failures += 1
            print("seed %d: %s" % (seed, e))
        engine.close()
    print("failures %d of %d" % (failures, count))
    sys.stdout.flush()
    os._exit(1 if failures else 0)


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        child(int(sys.argv[2]), int(sys.argv[3]))
    seed = T.seed()
    procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "--child", str(seed + i * RUNS),
                               str(RUNS)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for i in range(PROCESSES)]
    for i, p in enumerate(procs):
        out, _ = p.communicate(timeout=250)
        lines = [line for line in out.splitlines() if "seed " in line or "failures" in line]
        print("process %d: %s" % (i, "; ".join(lines)))
        T.check(p.returncode == 0, "process %d: %d trainings under a 256 KiB budget, none failing" % (i, RUNS),
                p.returncode, 0)
    T.done()


if __name__ == "__main__":
    main()
