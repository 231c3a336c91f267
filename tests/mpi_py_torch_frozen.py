"""Frozen parameters across ranks: a GPT whose embeddings (and tied head) and attention are frozen trains under
mpirun at ZeRO stage 3, parameters and optimizer on the host tier, each rank feeding its own micro-batches. The frozen
parameters are strata's on every rank (stage 3 partitions them as the rest), and every rank ends with the trained
weights of plain PyTorch over all the ranks' micro-batches (adam_oracle.stage3_steps: bit-identical at two ranks) and
the frozen weights as they were, bit for bit; a save -> load of strata's checkpoint at the same world gives them back
too.
Run: bash tests/helpers/mpi.sh 2 /usr/bin/python3 tests/mpi_py_torch_frozen.py
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "helpers"))
import strata_test as T  # noqa: E402
import adam_oracle  # noqa: E402

torch = T.require_torch()
import strata  # noqa: E402
import strata.torch  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402

STEPS, GAS, BATCH = 3, 2, 2
MODEL = GPTConfig(vocab_size=64, block_size=16, n_layer=3, n_head=2, n_embd=32)
HP = dict(lr=2e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1)


def build(seed):
    torch.manual_seed(seed)
    model = GPT(MODEL)
    for n, p in model.named_parameters():
        if ".attn." in n or ".wte." in n or ".wpe." in n:
            p.requires_grad_(False)
    return model


def batch(seed, step, micro, rank):
    g = torch.Generator().manual_seed(seed * 1000003 + step * 101 + micro * 7 + rank)
    x = torch.randint(0, MODEL.vocab_size, (BATCH, MODEL.block_size), generator=g)
    return x, torch.roll(x, -1, dims=1)


def main():
    comm = strata.world()
    rank, world = comm.rank, comm.size
    seed = int(comm.allreduce_sum([float(T.seed() if rank == 0 else 0)])[0])
    ref = build(seed)
    initial = {n: p.detach().clone() for n, p in ref.named_parameters()}
    frozen = [n for n, p in ref.named_parameters() if not p.requires_grad]
    trained = [p for p in ref.parameters() if p.requires_grad]
    adam_oracle.stage3_steps(trained, adam_oracle.oracle(torch.optim.AdamW(trained, **HP)), STEPS, GAS, world,
                             lambda step, micro, r: ref(*batch(seed, step, micro, r)))
    want = {n: p.detach() for n, p in ref.named_parameters()}

    config = {"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"},
                                    "offload_optimizer": {"device": "cpu"}, "stage3_param_persistence_threshold": 0},
              "optimizer": {"type": "AdamW", "params": {"lr": HP["lr"], "betas": list(HP["betas"]), "eps": HP["eps"],
                                                         "weight_decay": HP["weight_decay"]}},
              "train_micro_batch_size_per_gpu": BATCH, "gradient_accumulation_steps": GAS}
    model = build(seed)
    engine = strata.torch.initialize(model=model, config=config)[0]
    for step in range(STEPS):
        for micro in range(GAS):
            engine.backward(engine(*batch(seed, step, micro, rank)))
            engine.step()
    got = engine.fp32_state_dict()
    diff = adam_oracle.first_difference({n: got[n] for n in want if n not in frozen},
                                        {n: w for n, w in want.items() if n not in frozen})
    if world <= 2:
        T.check(diff is None, "rank %d: the trained weights %s to one PyTorch process" % (rank, adam_oracle.HOW),
                diff, "no difference")
    diff = adam_oracle.first_difference({n: got[n] for n in frozen}, {n: initial[n] for n in frozen})
    T.check(diff is None, "rank %d: the frozen weights unchanged, bit for bit" % rank, diff, "unchanged")
    # One directory for every rank (not T.scratch, which each rank would empty), the save's tag replaced each run.
    scratch = os.environ.get("STRATA_SCRATCH") or os.path.join(T.BUILD_DIR, "scratch")
    path = engine.save_checkpoint(os.path.join(scratch, "mpi_py_torch_frozen-%d" % world), tag="ckpt")
    other = build(seed + 1)
    again = strata.torch.initialize(model=other, config=config)[0]
    again.load_checkpoint(path)
    diff = adam_oracle.first_difference(again.fp32_state_dict(), got)
    T.check(diff is None, "rank %d: save -> load at %d ranks gives every weight back, frozen ones too" % (rank, world),
            diff, "no difference")
    again.close()
    engine.close()
    comm.close()
    T.done()


if __name__ == "__main__":
    main()
