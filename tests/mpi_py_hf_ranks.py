"""A Hugging Face Llama under mpirun: 2 ranks train it data-parallel through strata.torch at ZeRO stage 3 with
parameters and optimizer on NVMe, HF's reentrant gradient checkpointing, the model called directly
(engine.module(**batch) + engine.backward), and each rank's own micro-batches; the weights must end bit-identical to
one PyTorch process over all ranks' micro-batches (adam_oracle.stage3_steps, as tests/mpi_py_torch_ranks.py: each
micro-batch's gradients summed over the ranks, then over the accumulation, the loss scaled by 1 / (accumulation x
ranks)).
Also: state_dict() (a collective: every rank calls it) gives every rank the trained weights.
Run: bash tests/helpers/mpi.sh 2 /usr/bin/python3 tests/mpi_py_hf_ranks.py
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "helpers"))
import strata_test as T  # noqa: E402
import hf_models as H  # noqa: E402
import adam_oracle  # noqa: E402

torch = T.require_torch()
transformers = H.require_transformers()
import strata  # noqa: E402
import strata.torch  # noqa: E402

STEPS, GAS = 3, 2
NAME = "llama"


def micro_batch(seed, step, micro, rank):
    return H.batch(transformers, NAME, seed * 7 + rank, step, micro)


def oracle(seed, world):
    model = H.build(transformers, NAME, seed)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    opt = adam_oracle.oracle(torch.optim.AdamW(model.parameters(), **H.HP))
    adam_oracle.stage3_steps(list(model.parameters()), opt, STEPS, GAS, world,
                             lambda step, micro, r: model(**micro_batch(seed, step, micro, r)).loss)
    return {n: p.detach() for n, p in model.named_parameters()}


def main():
    comm = strata.world()
    rank, world = comm.rank, comm.size
    seed = int(comm.allreduce_sum([float(T.seed() if rank == 0 else 0)])[0])
    nvme = T.scratch("mpi_py_hf_ranks-%d" % rank)
    model = H.build(transformers, NAME, seed)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    config = {
        "zero_optimization": {"stage": 3, "offload_param": {"device": "nvme", "nvme_path": nvme},
                              "offload_optimizer": {"device": "nvme", "nvme_path": nvme}},
        "optimizer": H.optimizer_section(),
        "train_micro_batch_size_per_gpu": H.BATCH,
        "gradient_accumulation_steps": GAS,
    }
    engine, _, _, _ = strata.torch.initialize(model=model, config=config, device="cpu")
    for step in range(STEPS):
        for micro in range(GAS):
            out = model(**micro_batch(seed, step, micro, rank))
            engine.backward(out.loss)
            engine.step()
    got = model.state_dict()
    want = oracle(seed, world)
    off = [n for n, w in want.items() if not torch.equal(got[n], w)]
    worst = max((got[n] - w).abs().max().item() for n, w in want.items())
    print("rank %d: %d of %d tensors differ from one PyTorch process (max diff %.3g)" % (rank, len(off), len(want),
                                                                                        worst))
    T.check(not off, "rank %d: state_dict() bit-identical to one PyTorch process over both ranks' batches" % rank,
            (off[:3], worst), ([], 0.0))
    engine.close()
    comm.close()
    T.done()


if __name__ == "__main__":
    main()
