#!/usr/bin/env python3
"""strata.torch.OffloadAdam's CUDA path with parameter groups, against torch.optim.AdamW on the same GPU.

A small GPT on the GPU with two param groups (matrices: lr 2e-3, weight decay 0.1; vectors: lr 4e-3, 0.01) and a
CosineAnnealingLR driving both: OffloadAdam keeps the fp32 master weights and moments in strata's host tier, takes
the GPU gradients over, runs the CPU Adam and writes the parameters back to the GPU; torch's AdamW (foreach=False)
updates the same model on the GPU. The two differ by the GPU's arithmetic (CUDA's kernels for each op of torch's
step against strata's CPU kernel of the same formula), a rounding per operation: the check holds every weight within
1e-6 relative of torch's after the run and every loss within 1e-5, and prints the largest differences. On the same
GPU, two OffloadAdam runs are bit-identical (the CPU Adam and its copies are deterministic), and each group's lr and
weight decay are the ones its group got (a run with the groups' values swapped ends elsewhere). Skips (77) without a
GPU; it is one of the GPU call's Python items (tools/gpu/items.sh).
"""
import copy
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "helpers"))
import strata_test as T  # noqa: E402

torch = T.require_torch()
if not torch.cuda.is_available():
    T.skip("no CUDA device: OffloadAdam's CUDA path needs a GPU (it runs in the GPU call, tools/run gpu)")
from model import GPT, GPTConfig  # noqa: E402
from strata.torch.offload_adam import OffloadAdam  # noqa: E402

BETAS, EPS, STEPS, T_MAX = (0.9, 0.999), 1e-8, 8, 6
GROUPS = ({"lr": 2e-3, "weight_decay": 0.1}, {"lr": 4e-3, "weight_decay": 0.01})
BATCH, BLOCK, VOCAB = 4, 32, 256


def groups_of(model, values=GROUPS):
    matrices = [p for p in model.parameters() if p.dim() >= 2]
    vectors = [p for p in model.parameters() if p.dim() < 2]
    return [dict(values[0], params=matrices), dict(values[1], params=vectors)]


def run(model, opt, batches):
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=T_MAX)
    losses = []
    for x, y in batches:
        loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        sched.step()
        losses.append(loss.item())
    return losses


def main():
    seed = T.seed()
    print("%s, torch %s" % (torch.cuda.get_device_name(0), torch.__version__))
    torch.manual_seed(seed)
    base = GPT(GPTConfig(vocab_size=VOCAB, block_size=BLOCK, n_layer=2, n_head=4, n_embd=64)).cuda()
    g = torch.Generator().manual_seed(seed + 1)
    batches = [(torch.randint(0, VOCAB, (BATCH, BLOCK), generator=g).cuda(),
                torch.randint(0, VOCAB, (BATCH, BLOCK), generator=g).cuda()) for _ in range(STEPS)]

    ref = copy.deepcopy(base)
    want = run(ref, torch.optim.AdamW(groups_of(ref), betas=BETAS, eps=EPS, foreach=False), batches)
    runs = []
    for _ in range(2):
        m = copy.deepcopy(base)
        opt = OffloadAdam(groups_of(m), betas=BETAS, eps=EPS)
        runs.append((m, run(m, opt, batches), opt.stats()))
        opt.close()
    (got, losses, stats), (again, losses2, _) = runs

    loss_diff = max(abs(a - b) for a, b in zip(losses, want))
    T.check(loss_diff <= 1e-5, "losses within 1e-5 of torch AdamW on the GPU (2 groups, cosine)", losses, want)
    rel = max(((a - b).abs().max() / b.abs().max().clamp(min=1e-12)).item()
              for a, b in zip(got.parameters(), ref.parameters()))
    print("largest loss difference %.3g, largest relative weight difference %.3g" % (loss_diff, rel))
    T.check(rel <= 1e-6, "every weight within 1e-6 relative of torch AdamW on the GPU", rel, "<= 1e-6")
    T.check(losses == losses2 and all(torch.equal(a, b) for a, b in zip(got.parameters(), again.parameters())),
            "two OffloadAdam runs on the GPU are bit-identical", losses2, losses)
    T.check(all(s["host_to_device_bytes"] > 0 for s in stats), "each group's parameters went back to the GPU",
            [s["host_to_device_bytes"] for s in stats], "> 0 each")

    swapped = copy.deepcopy(base)
    opt = OffloadAdam(groups_of(swapped, GROUPS[::-1]), betas=BETAS, eps=EPS)
    run(swapped, opt, batches)
    opt.close()
    moved = max((a - b).abs().max().item() for a, b in zip(swapped.parameters(), got.parameters()))
    T.check(moved > 1e-4, "the groups' values matter: swapping them ends elsewhere", moved, "> 1e-4")
    T.done()


if __name__ == "__main__":
    main()
