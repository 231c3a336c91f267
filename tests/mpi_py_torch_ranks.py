"""strata.torch.initialize under mpirun: N ranks train one model data-parallel with ZeRO stage 3, each rank feeding its
own micro-batches, and end with weights bit-identical to a plain PyTorch run over all the ranks' micro-batches.

The oracle runs on every rank (torch.optim.AdamW over the same initial weights). It sums the gradients in the order
stage 3 does: each micro-batch's gradients are reduce-scattered across the ranks as they are handed over (rank 0's
plus rank 1's: with two ranks one fp32 addition, exact in either order), and the micro-batch sums accumulate into
the fp32 gradient store; the loss of each rank is scaled by 1 / (accumulation x ranks), as DeepSpeed averages. With
more than two ranks the reduction's order is MPI's own and the weights are compared within a tolerance instead.
Run: bash tests/helpers/mpi.sh 2 /usr/bin/python3 tests/mpi_py_torch_ranks.py
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

STEPS, GAS, BATCH = 6, 2, 2
MODEL = GPTConfig(vocab_size=64, block_size=16, n_layer=3, n_head=2, n_embd=32)
HP = dict(lr=2e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1)


def batch(seed, step, micro, rank):
    g = torch.Generator().manual_seed(seed * 1000003 + step * 101 + micro * 7 + rank)
    x = torch.randint(0, MODEL.vocab_size, (BATCH, MODEL.block_size), generator=g)
    return x, torch.roll(x, -1, dims=1)


def oracle(model, seed, world):
    """Plain PyTorch over every rank's micro-batches, summed in stage 3's order. Returns (losses by rank, weights)."""
    opt = adam_oracle.oracle(torch.optim.AdamW(model.parameters(), **HP))
    losses = {r: [] for r in range(world)}

    def micro_loss(step, micro, r):
        loss = model(*batch(seed, step, micro, r))
        losses[r].append(loss.item())
        return loss
    adam_oracle.stage3_steps(list(model.parameters()), opt, STEPS, GAS, world, micro_loss)
    return losses, {n: p.detach() for n, p in model.named_parameters()}


def disagreements(comm, seed, config):
    """Ranks that disagree fail together at initialize, naming what differs: the last rank's accumulation, then its
    model's initial weights (another torch seed)."""
    last = comm.size - 1
    cases = [("gradient_accumulation_steps", dict(config, gradient_accumulation_steps=GAS + (comm.rank == last)),
              seed, "the ranks were given different gradient_accumulation_steps: %d on rank 0 but %d on rank %d" % (
                  GAS, GAS + 1, last)),
             ("initial weights", config, seed + (comm.rank == last),
              "the initial weights differ between ranks: module")]
    for what, cfg, model_seed, needle in cases:
        torch.manual_seed(model_seed)
        try:
            strata.torch.initialize(model=GPT(MODEL), config=cfg)[0].close()
            T.check(False, "rank %d: ranks with other %s are refused" % (comm.rank, what), "initialized", needle)
        except strata.errors.ConfigError as e:
            T.check(needle in str(e), "rank %d: ranks with other %s are refused, naming it" % (comm.rank, what),
                    str(e), needle)


def main():
    comm = strata.world()
    rank, world = comm.rank, comm.size
    # Every rank needs the same seed: rank 0's, summed over the world (the others add 0).
    seed = int(comm.allreduce_sum([float(T.seed() if rank == 0 else 0)])[0])
    print("rank %d of %d, seed %d" % (rank, world, seed))
    torch.manual_seed(seed)
    ref = GPT(MODEL)
    torch.manual_seed(seed)
    model = GPT(MODEL)
    config = {
        "zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}, "offload_optimizer": {"device": "cpu"},
                              "stage3_param_persistence_threshold": 0},
        "optimizer": {"type": "AdamW", "params": {"lr": HP["lr"], "betas": list(HP["betas"]), "eps": HP["eps"],
                                                   "weight_decay": HP["weight_decay"]}},
        "train_micro_batch_size_per_gpu": BATCH,
        "gradient_accumulation_steps": GAS,
    }
    engine = strata.torch.initialize(model=model, config=config)[0]
    T.check(engine.world_size == world and engine.rank == rank, "the engine is one rank of the world",
            (engine.rank, engine.world_size), (rank, world))
    got_losses = []
    for step in range(STEPS):
        for micro in range(GAS):
            x, y = batch(seed, step, micro, rank)
            loss = engine(x, y)
            engine.backward(loss)
            engine.step()
            got_losses.append(loss.item())
    got = engine.fp32_state_dict()
    stats = engine.stats()
    T.check(world == 1 or stats["comm_bytes"] > 0, "gradients and parameters crossed the ranks", stats["comm_bytes"],
            "> 0")
    # The ranks of this host share its cores: each rank's Adam threads are bound to cores no other rank has.
    cores = set()
    listed = stats["adam_cores"] if "..." not in stats["adam_cores"] else ""  # "" = unbound; "..." = cut short
    for part in filter(None, listed.split(",")):
        lo, _, hi = part.partition("-")
        cores.update(range(int(lo), int(hi or lo) + 1))
    if cores and max(cores) < 52:
        mask = float(sum(1 << c for c in cores))
        total, count = comm.allreduce_sum([mask, float(len(cores))])
        T.check(bin(int(total)).count("1") == count, "rank %d: the ranks' Adam cores are disjoint (%s here)" % (
            rank, stats["adam_cores"]), bin(int(total)).count("1"), count)

    want_losses, want = oracle(ref, seed, world)
    T.check(len(got_losses) == len(want_losses[rank]) and all(
        adam_oracle.same_float(a, b) for a, b in zip(got_losses, want_losses[rank])),
        "rank %d: its losses %s to the oracle's" % (rank, adam_oracle.HOW),
            got_losses[:3], want_losses[rank][:3])
    worst, where = 0.0, None
    for name, w in want.items():
        d = (got[name] - w).abs().max().item()
        worst = max(worst, d)
        if where is None and not adam_oracle.same_tensor(got[name], w):
            where = name
    if world <= 2:
        T.check(where is None, "rank %d: weights %s to one PyTorch process (first tensor off, max diff)" % (
            rank, adam_oracle.HOW), (where, worst), (None, 0.0))
    else:
        T.check(worst < 1e-5, "rank %d: weights within 1e-5 of one PyTorch process" % rank, (where, worst), "< 1e-5")
    # Every rank holds the same model.
    sums = comm.allreduce_sum([float(sum(t.double().sum() for t in got.values()))])[0]
    mine = float(sum(t.double().sum() for t in got.values()))
    T.check(sums == mine * world or abs(sums - mine * world) <= 1e-9 * abs(sums),
            "every rank has the same weights (world sum vs %d x mine)" % world, sums, mine * world)
    engine.close()
    if world > 1:
        disagreements(comm, seed, config)
    comm.close()  # MPI_Finalize now: done() leaves through os._exit, past atexit
    T.done()


if __name__ == "__main__":
    main()
