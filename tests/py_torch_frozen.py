"""Frozen parameters (requires_grad=False) are strata's like any other: partitioned, tiered, fetched around their
use, checkpointed, with no gradient and no optimizer state.

A small GPT (examples/gpt/model.py, 8 blocks, tied embedding) has its embeddings (so the tied head: a frozen unit whose
input needs its gradient), every block's attention (units that mix frozen and trained parameters) and block 2 whole
(a frozen unit between trained ones, through which the gradient must pass) frozen, and trains at ZeRO stage 3 with
parameters and optimizer state on NVMe under a device budget of 6/10 of the model, against torch.optim.AdamW over the
trained parameters in memory (its sqrt correctly rounded where this torch's CPU sqrt is not: adam_oracle.oracle).
Checked:
  - the losses and trained weights are torch's, bit for bit;
  - the frozen weights stay the model's bit for bit (fp32_state_dict, module.state_dict()), get no .grad, live in
    frozen strata modules (strata_module_frozen), hold no storage between steps like every other parameter, and
    have no optimizer state (engine.optimizer holds the trained parameters only);
  - backward releases each unit as soon as it is through with it, frozen units included (at most two units held);
  - save_checkpoint -> a fresh engine on other weights (frozen ones too) -> load_checkpoint -> the remaining steps:
    bit-identical to the uninterrupted run, frozen weights restored; the checkpoint lists the frozen tensors under
    the model's names;
  - bf16: the frozen weights are held rounded to bf16 (as DeepSpeed's module.bfloat16()), state_dict() gives them;
  - DeepSpeed's model_parameters: a listed parameter that does not require grad is frozen, not trained;
  - requires_grad changed after initialize, either way, is refused at the next forward (and at the step), naming
    the parameter; a no_grad forward is not refused;
  - close(restore_weights=True) gives the model its weights back: it runs and trains with plain torch.
"""
import copy
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "helpers"))
import strata_test as T  # noqa: E402
import adam_oracle  # noqa: E402

torch = T.require_torch()
import strata  # noqa: E402
import strata.torch  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402
import gpt_batches  # noqa: E402

STEPS, GAS, BATCH = 4, 2, 4
MODEL = GPTConfig(vocab_size=96, block_size=32, n_layer=8, n_head=4, n_embd=64)
HP = dict(lr=3e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1)


def is_frozen(name):
    return ".attn." in name or ".wte." in name or ".wpe." in name or ".h.2." in name


def build(seed):
    torch.manual_seed(seed)
    model = GPT(MODEL)
    for n, p in model.named_parameters():
        if is_frozen(n):
            p.requires_grad_(False)
    return model


def batch(seed, step, micro):
    return gpt_batches.tokens(MODEL, BATCH, seed, step, micro)


def config(nvme, model, **extra):
    size = sum(p.numel() * 4 for p in model.parameters())
    out = {"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme", "nvme_path": nvme},
                                 "offload_optimizer": {"device": "nvme", "nvme_path": nvme},
                                 "stage3_param_persistence_threshold": 0},
           "optimizer": {"type": "AdamW", "params": {"lr": HP["lr"], "betas": list(HP["betas"]), "eps": HP["eps"],
                                                      "weight_decay": HP["weight_decay"]}},
           "gradient_accumulation_steps": GAS,
           "strata": {"device_budget_bytes": size * 6 // 10, "prefetch_bytes": 64 << 10}}
    out.update(extra)
    return out


def train_torch(model, seed, steps):
    """The oracle: AdamW over the trained parameters (adam_oracle.oracle); the losses."""
    trained = [p for p in model.parameters() if p.requires_grad]
    losses = []

    def micro_loss(step, micro, rank):
        loss = model(*batch(seed, step, micro))
        losses.append(loss.item())
        return loss
    adam_oracle.stage3_steps(trained, adam_oracle.oracle(torch.optim.AdamW(trained, **HP)), steps, GAS, 1, micro_loss)
    return losses


def engine_of(model, tag, **extra):
    """model through strata.torch.initialize on the CPU (config(scratch tag, model, **extra))."""
    return strata.torch.initialize(model=model, config=config(T.scratch("py_torch_frozen-" + tag), model, **extra),
                                   device="cpu")[0]


def watch_holds(engine):
    """A list that records, at each fetch during backward, how many units are held (fetched for forward or in
    backward) once it is done."""
    seen = []
    fetch = engine._fetch

    def counted(unit):
        fetch(unit)
        if engine._backward_active:
            seen.append(sum(1 for u in engine.units if u.fwd_holds or u.in_backward) + (0 if unit.in_backward else 1))
    engine._fetch = counted
    return seen


def exact(seed):
    ref = build(seed)
    initial = {n: p.detach().clone() for n, p in ref.named_parameters()}
    frozen = sorted(n for n in initial if is_frozen(n))
    want_losses = train_torch(ref, seed, STEPS)
    want = {n: p.detach() for n, p in ref.named_parameters()}
    print("against torch.optim.AdamW over the trained parameters: %s; frozen: %d of %d tensors" % (
        adam_oracle.HOW, len(frozen), len(initial)))

    model = build(seed)
    engine = engine_of(model, "exact")
    e = engine.engine
    frozen_mids = sorted(m for u in engine.units for m in u.mids if m not in u.trained_mids)
    T.check(frozen_mids and all(e.module_frozen(m) for m in frozen_mids) and
            not any(e.module_frozen(m) for u in engine.units for m in u.trained_mids),
            "the frozen parameters are in frozen strata modules, the trained ones in trained modules",
            [(u.name, u.mids, u.trained_mids) for u in engine.units], "frozen modules apart")
    T.check(any(u.has_frozen and u.trained_mids for u in engine.units) and
            any(u.has_frozen and not u.trained_mids for u in engine.units),
            "units that mix frozen and trained parameters, and units of frozen parameters only",
            [(u.name, sum(u.trained), len(u.trained)) for u in engine.units])
    held = {id(p) for g in engine.optimizer.param_groups for p in g["params"]}
    names = {id(p): n for n, p in model.named_parameters()}
    T.check(sorted(names[i] for i in held) == sorted(n for n in initial if not is_frozen(n)),
            "engine.optimizer holds the trained parameters only (the frozen ones have no optimizer state)",
            len(held), len(initial) - len(frozen))
    holds = watch_holds(engine)
    empty, grads = [], []

    def between(step):
        empty.append(all(p.numel() == 0 for p in model.parameters()))
        grads.append(any(p.grad is not None for p in model.parameters()))
    losses = gpt_batches.train_steps(engine, batch, seed, 0, STEPS, GAS, between)
    T.check(losses == want_losses, "losses bit-identical to torch's", losses, want_losses)
    got = engine.fp32_state_dict()
    T.check(sorted(got) == sorted(initial), "fp32_state_dict() holds every parameter, frozen ones too",
            len(got), len(initial))
    trained = [n for n in want if not is_frozen(n)]
    diff = adam_oracle.first_difference({n: got[n] for n in trained}, {n: want[n] for n in trained})
    T.check(diff is None, "the trained weights bit-identical to torch's", diff, "no difference")
    diff = adam_oracle.first_difference({n: got[n] for n in frozen}, {n: initial[n] for n in frozen})
    T.check(diff is None, "the frozen weights stay the model's, bit for bit (fp32_state_dict)", diff, "unchanged")
    sd = model.state_dict()
    diff = adam_oracle.first_difference({n: sd[n] for n in frozen}, {n: initial[n] for n in frozen})
    T.check(diff is None, "module.state_dict() gives the frozen weights", diff, "unchanged")
    T.check(all(empty) and not any(grads), "between steps every parameter, frozen ones too, holds no storage and no "
            ".grad (strata holds them)", (empty, grads), "all empty, no .grad")
    T.check(holds and max(holds) <= 2, "backward releases each unit once through with it, frozen ones too (units "
            "held at each fetch in backward)", sorted(set(holds)), "at most 2")
    stats = engine.stats()
    T.check(stats["device_peak_bytes"] <= stats["device_budget_bytes"], "the device budget held",
            stats["device_peak_bytes"], "<= %d" % stats["device_budget_bytes"])
    print("frozen: losses %.5f .. %.5f; device peak %d of budget %d; units held at each of %d fetches in backward: "
          "at most %d" % (losses[0], losses[-1], stats["device_peak_bytes"], stats["device_budget_bytes"], len(holds),
                          max(holds)))
    engine.close()


def resume(seed):
    """save at step 2 -> a fresh engine on other weights -> load -> 2 more steps, as the uninterrupted run."""
    model = build(seed)
    engine = engine_of(model, "a")
    gpt_batches.train_steps(engine, batch, seed, 0, 2, GAS)
    path = engine.save_checkpoint(T.scratch("py_torch_frozen-ckpt"))
    want_losses = gpt_batches.train_steps(engine, batch, seed, 2, STEPS, GAS)
    want = engine.fp32_state_dict()
    engine.close()
    with open(os.path.join(path, "manifest.json")) as f:
        manifest = json.load(f)
    listed = json.dumps(manifest)
    missing = [n for n in want if is_frozen(n) and '"%s"' % n not in listed]
    T.check(not missing, "the checkpoint lists the frozen tensors under the model's names", missing[:3], "none missing")

    other = build(seed + 1)  # other weights everywhere: the load replaces the frozen ones too
    engine = engine_of(other, "b")
    engine.load_checkpoint(os.path.dirname(path))
    losses = gpt_batches.train_steps(engine, batch, seed, 2, STEPS, GAS)
    T.check(losses == want_losses, "resumed: the losses of the uninterrupted run", losses, want_losses)
    diff = adam_oracle.first_difference(engine.fp32_state_dict(), want)
    T.check(diff is None, "resumed: every weight, frozen ones included, bit-identical to the uninterrupted run", diff,
            "no difference")
    engine.close()


def bf16(seed):
    model = build(seed)
    initial = {n: p.detach().clone() for n, p in model.named_parameters()}
    frozen = [n for n in initial if is_frozen(n)]
    engine = engine_of(model, "bf16", bf16={"enabled": True})
    losses = gpt_batches.train_steps(engine, batch, seed, 0, 2, GAS)
    sd, got = model.state_dict(), engine.fp32_state_dict()
    wrong = [n for n in frozen if sd[n].dtype != torch.bfloat16 or not torch.equal(sd[n], initial[n].bfloat16())]
    T.check(not wrong, "bf16: state_dict() gives each frozen weight rounded to bf16 (as module.bfloat16())",
            wrong[:3], "none differ")
    wrong = [n for n in frozen if not torch.equal(got[n], initial[n].bfloat16().float())]
    T.check(not wrong, "bf16: fp32_state_dict() gives the frozen weights as strata holds them (bf16, widened)",
            wrong[:3], "none differ")
    T.check(all(l == l for l in losses), "bf16: trains", losses)
    engine.close()


def model_parameters(seed):
    """DeepSpeed's meaning: a parameter in model_parameters that does not require grad is frozen."""
    model = build(seed)
    engine = strata.torch.initialize(model=model, model_parameters=list(model.parameters()),
                                     config=config(T.scratch("py_torch_frozen-mp"), model), device="cpu")[0]
    trained = {id(p) for g in engine.optimizer.param_groups for p in g["params"]}
    T.check(trained == {id(p) for p in model.parameters() if p.requires_grad},
            "model_parameters listing frozen parameters: they are frozen (as DeepSpeed's ZeRO drops them from the "
            "optimizer's groups)", len(trained), sum(1 for p in model.parameters() if p.requires_grad))
    engine.close()


def changed_requires_grad(seed):
    model = build(seed)
    engine = engine_of(model, "rg")
    x, y = batch(seed, 0, 0)
    trained = model.transformer.h[0].mlp.c_fc.weight
    frozen = model.transformer.h[1].attn.c_attn.weight
    trained.requires_grad_(False)
    T.check_raises(strata.StateError, "transformer.h.0.mlp.c_fc.weight.requires_grad is False, but it was True",
                   lambda: engine(x, y), "freezing a trained parameter after initialize, then a forward")
    with torch.no_grad():
        T.check(engine(x, y).item() > 0, "a no_grad forward is not refused (requires_grad changes nothing there)")
    trained.requires_grad_(True)
    frozen.requires_grad_(True)
    T.check_raises(strata.StateError, "transformer.h.1.attn.c_attn.weight.requires_grad is True, but it was False",
                   lambda: engine(x, y), "unfreezing a frozen parameter after initialize, then a forward")
    frozen.requires_grad_(False)
    engine.backward(engine(x, y))
    trained.requires_grad_(False)
    T.check_raises(strata.StateError, "strata.torch.initialize the model again", engine.step,
                   "freezing a trained parameter between backward and engine.step()")
    trained.requires_grad_(True)
    engine.step()
    engine.backward(engine(x, y))
    engine.step()
    T.check((engine.micro_steps, engine.global_steps) == (GAS, 1), "with requires_grad as at initialize again, the "
            "refused step counts once and the optimizer steps", (engine.micro_steps, engine.global_steps), (GAS, 1))
    engine.close()


def restore(seed):
    model = build(seed)
    engine = engine_of(model, "restore")
    gpt_batches.train_steps(engine, batch, seed, 0, 1, GAS)
    x, y = batch(seed, 9, 0)
    with torch.no_grad():
        want = engine(x, y).item()
    sd = {k: v.clone() for k, v in model.state_dict().items()}
    engine.close(restore_weights=True)
    now = model.state_dict()
    T.check(all(torch.equal(now[k], v) for k, v in sd.items()),
            "close(restore_weights=True): every parameter holds its weights again")
    with torch.no_grad():
        T.check(model(x, y).item() == want, "the model runs without strata, as it ran with it",
                model(x, y).item(), want)
    plain = copy.deepcopy(model)
    model(x, y).backward()
    plain(x, y).backward()
    T.check(all(torch.equal(a.grad, b.grad) for a, b in zip(model.parameters(), plain.parameters())
                if a.requires_grad), "and trains with plain torch (strata's gradient hooks are gone)")


def main():
    seed = T.seed()
    exact(seed)
    resume(seed)
    bf16(seed)
    model_parameters(seed)
    changed_requires_grad(seed)
    restore(seed)
    T.done()


if __name__ == "__main__":
    main()
