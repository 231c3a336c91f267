"""strata.torch.initialize against plain PyTorch.

A small GPT (examples/gpt/model.py: 8 blocks, tied embedding) is trained for 20 steps with gradient accumulation 2
and a cosine lr schedule, twice from the same initial weights and batches: through strata, with the parameters and
the optimizer state on NVMe and a device budget smaller than the model, and with torch.optim.AdamW in memory.

The losses and the final weights must be bit-identical. They can be: strata's CPU Adam performs torch 1.13's AdamW
arithmetic operation for operation (cpu_adam/adam_ref.c), with a correctly rounded sqrt (torch.optim.AdamW takes one
too here: adam_oracle.oracle); autograd accumulates into strata's gradient buffer in
place (0 + g, then + g: the sums torch makes in param.grad); strata's fp32 gradient store adds the micro-batches in
the same order; strata derives Adam's constants from the config's hyperparameters as doubles (strata_config.lr_exact
and the rest) and takes each step's lr as a double, as torch does from Python floats.

Also: between steps the model's parameters hold no storage; save -> a new process -> load -> continue is
bit-identical to the uninterrupted run; eval() + no_grad inference matches; misuse raises with a message that
names the problem and leaves the engine usable.
Run: tests/py_torch_engine.py [--resume-from DIR OUT SEED]  (the second form is the test's own child process).
"""
import json
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "helpers"))
import strata_test as T  # noqa: E402
import adam_oracle  # noqa: E402

torch = T.require_torch()
import strata  # noqa: E402
import strata.torch  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402
import gpt_batches  # noqa: E402

STEPS, GAS, BATCH = 20, 2, 4
MODEL = GPTConfig(vocab_size=96, block_size=32, n_layer=8, n_head=4, n_embd=64)
HP = dict(lr=3e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1)


def batch(seed, step, micro):
    return gpt_batches.tokens(MODEL, BATCH, seed, step, micro)


def model_bytes(model):
    return sum(p.numel() * 4 for p in model.parameters())


def strata_config(nvme_dir, model):
    return {
        "zero_optimization": {
            "stage": 3,
            "offload_param": {"device": "nvme", "nvme_path": nvme_dir},
            "offload_optimizer": {"device": "nvme", "nvme_path": nvme_dir},
            "stage3_param_persistence_threshold": 0,
        },
        "optimizer": {"type": "AdamW", "params": {"lr": HP["lr"], "betas": list(HP["betas"]), "eps": HP["eps"],
                                                   "weight_decay": HP["weight_decay"]}},
        "gradient_accumulation_steps": GAS,
        "strata": {"device_budget_bytes": model_bytes(model) * 6 // 10, "prefetch_bytes": 64 << 10},
    }


def cosine(optimizer):
    return torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=STEPS, eta_min=HP["lr"] / 10)


def train_torch(model, seed, steps):
    opt = adam_oracle.oracle(torch.optim.AdamW(model.parameters(), **HP))
    sched = cosine(opt)
    losses = []
    for step in range(steps):
        for micro in range(GAS):
            x, y = batch(seed, step, micro)
            loss = model(x, y)
            (loss / GAS).backward()
            losses.append(loss.item())
        opt.step()
        opt.zero_grad(set_to_none=True)
        sched.step()
    return losses


def train_strata(engine, seed, first, last, on_step=None):
    return gpt_batches.train_steps(engine, batch, seed, first, last, GAS, on_step)


def first_difference(got, want, same=None):
    """(name, index, got, want) of the first element that differs bitwise (or is not `same`), or None."""
    for name in want:
        a, b = got[name].reshape(-1), want[name].reshape(-1)
        if same is not None and same(a, b):
            continue
        diff = (a.view(torch.int32) != b.view(torch.int32)).nonzero()
        if len(diff):
            i = diff[0].item()
            return name, i, a[i].item(), b[i].item()
    return None


def new_engine(seed, nvme_dir):
    torch.manual_seed(seed)
    model = GPT(MODEL)
    engine = strata.torch.initialize(
        model=model, config=strata_config(nvme_dir, model), lr_scheduler=cosine, device="cpu")[0]
    return model, engine


def resume_child(ckpt_dir, out_file, seed):
    """The child process: a fresh engine, load, train the remaining steps, save the weights."""
    _, engine = new_engine(seed + 1, T.scratch("py_torch_engine-child"))  # other initial weights: load replaces
    path, client = engine.load_checkpoint(ckpt_dir)
    losses = train_strata(engine, seed, client["next_step"], STEPS)
    torch.save({"weights": engine.fp32_state_dict(), "losses": losses, "client": client}, out_file)
    T.check(True, "child ran")
    T.done()


def main():
    seed = T.seed()
    torch.manual_seed(seed)
    ref = GPT(MODEL)
    initial = {k: v.clone() for k, v in ref.state_dict().items()}
    want_losses = train_torch(ref, seed, STEPS)
    want = {n: p.detach() for n, p in ref.named_parameters()}

    # ---- 20 steps through strata, state on NVMe under a device budget of 6/10 of the model
    nvme = T.scratch("py_torch_engine")
    torch.manual_seed(seed)
    model = GPT(MODEL)
    T.check(all(torch.equal(model.state_dict()[k], v) for k, v in initial.items()), "same initial weights")
    size = model_bytes(model)
    budget = size * 6 // 10
    engine = strata.torch.initialize(
        model=model, config=strata_config(nvme, model), lr_scheduler=cosine, device="cpu")[0]
    print("units: %s; against torch: %s" % (", ".join(u.name for u in engine.units), adam_oracle.HOW))
    empty_between = []

    def between_steps(step):
        empty_between.append(all(p.data.numel() == 0 and p.data.storage().size() == 0 and p.grad is None
                                 for p in model.parameters()))
        if step == STEPS // 2 - 1:
            engine.save_checkpoint(os.path.join(nvme, "ckpt"), client_state={"next_step": step + 1})
    got_losses = train_strata(engine, seed, 0, STEPS, between_steps)
    got = engine.fp32_state_dict()
    stats = engine.stats()
    print("strata: device peak %d of budget %d (model %d bytes), NVMe read %d written %d" % (
        stats["device_peak_bytes"], stats["device_budget_bytes"], size,
        stats["nvme_to_host_bytes"], stats["host_to_nvme_bytes"]))
    T.check(0 < stats["device_peak_bytes"] <= stats["device_budget_bytes"] <= budget < size,
            "the device budget is below the model and holds", (stats["device_peak_bytes"],
                                                                stats["device_budget_bytes"], budget),
            "peak <= budget <= %d < %d" % (budget, size))
    read_back = stats["nvme_to_host_bytes"] + stats["host_cache_read_bytes"]  # the drive's or its host mirror's
    written = stats["host_to_nvme_bytes"] + stats["host_cache_held_bytes"]  # to the drive, or held by its mirror
    T.check(read_back > 0 and written > 0, "state moved through NVMe or its host mirror (read back, written)",
            (read_back, written), "both > 0")
    bad = [i for i, (a, b) in enumerate(zip(got_losses, want_losses)) if not adam_oracle.same_float(a, b)]
    T.check(not bad and len(got_losses) == len(want_losses), "losses %s to torch.optim.AdamW" % adam_oracle.HOW,
            bad and (bad[0], got_losses[bad[0]]), bad and want_losses[bad[0]])
    diff = first_difference(got, want, adam_oracle.same_tensor)
    T.check(diff is None, "final weights %s to torch.optim.AdamW (name, index, strata, torch)" % adam_oracle.HOW,
            diff)
    moved = sum((got[n] != initial[n]).sum().item() for n in want) / sum(initial[n].numel() for n in want)
    T.check(moved > 0.99, "training moved the weights (share of elements changed)", moved, "> 0.99")
    T.check(all(empty_between), "between steps the parameters hold no storage and no gradient",
            empty_between.count(False), 0)
    print("losses: first %.6f last %.6f (torch: %.6f %.6f)" % (got_losses[0], got_losses[-1], want_losses[0],
                                                             want_losses[-1]))

    # ---- eval + no_grad inference matches the torch model's
    engine.eval()
    ref.eval()
    x, _ = batch(seed, STEPS, 0)
    with torch.no_grad():
        a, b = engine(x), ref(x)
    T.check(adam_oracle.same_tensor(a, b), "eval() + no_grad logits " + adam_oracle.HOW, (a - b).abs().max().item(),
            0.0)
    T.check(all(p.data.numel() == 0 for p in model.parameters()), "inference leaves the parameters empty")
    engine.train()

    # ---- save at step 10 -> new process -> load -> continue == uninterrupted
    out = os.path.join(nvme, "resumed.pt")
    child = subprocess.run([sys.executable, os.path.abspath(__file__), "--resume-from",
                            os.path.join(nvme, "ckpt"), out, str(seed)], capture_output=True, text=True)
    if not T.check(child.returncode == 0, "the resumed process ran", child.returncode, 0):
        print(child.stdout[-3000:], child.stderr[-3000:])
    else:
        resumed = torch.load(out)
        diff = first_difference(resumed["weights"], got)
        T.check(diff is None, "save -> new process -> load -> continue: weights bit-identical", diff)
        T.check(resumed["losses"] == got_losses[GAS * (STEPS // 2):], "resumed losses bit-identical",
                resumed["losses"][:2], got_losses[GAS * (STEPS // 2):][:2])
        with open(os.path.join(nvme, "ckpt", "global_step%d" % (STEPS // 2), "manifest.json")) as f:
            manifest = json.load(f)
        saved = {t["name"] for t in manifest["tensors"] if t["file"].startswith("model")}
        T.check(saved == set(want), "the checkpoint names the weights as the model does (model.safetensors "
                "loads into model.load_state_dict)", sorted(saved ^ set(want))[:4], "no difference")
        T.check(resumed["client"] == {"next_step": STEPS // 2}, "client_state comes back", resumed["client"],
                {"next_step": STEPS // 2})

    misuse(engine, model, seed)
    engine.close()
    on_cuda(seed)
    T.done()


def on_cuda(seed):
    """The same training on a GPU (the CUDA backend; device pointers lent to torch without copies), against
    torch computing on the same GPU with the optimizer step of a CPU AdamW over fp32 masters, which is what
    strata does. Skipped, saying so, without a GPU or a CUDA build."""
    if not torch.cuda.is_available():
        print("cuda: skipped (torch sees no GPU)")
        return
    steps = 5
    torch.manual_seed(seed)
    ref = GPT(MODEL)
    torch.manual_seed(seed)
    model = GPT(MODEL)  # built on the CPU: strata puts it on the GPU
    masters = [p.detach().clone() for p in ref.parameters()]
    ref.cuda()
    opt = adam_oracle.oracle(torch.optim.AdamW(masters, **HP))
    want_losses = []
    for step in range(steps):
        for micro in range(GAS):
            x, y = (t.cuda() for t in batch(seed, step, micro))
            loss = ref(x, y)
            (loss / GAS).backward()
            want_losses.append(loss.item())
        for m, p in zip(masters, ref.parameters()):
            m.grad = p.grad.cpu()
            p.grad = None
        opt.step()
        with torch.no_grad():
            for m, p in zip(masters, ref.parameters()):
                p.copy_(m)
    config = strata_config(T.scratch("py_torch_engine-cuda"), model)
    config["zero_optimization"]["offload_param"] = {"device": "cpu"}
    config["zero_optimization"]["offload_optimizer"] = {"device": "cpu"}
    try:
        engine = strata.torch.initialize(model=model, config=config, device="cuda")[0]
    except strata.Unsupported as e:
        print("cuda: skipped (%s)" % e)
        return
    got_losses = []
    for step in range(steps):
        for micro in range(GAS):
            x, y = (t.cuda() for t in batch(seed, step, micro))
            loss = engine(x, y)
            engine.backward(loss)
            engine.step()
            got_losses.append(loss.item())
    got = engine.fp32_state_dict()
    want = {n: m for (n, _), m in zip(ref.named_parameters(), masters)}
    worst = max((got[n] - w).abs().max().item() for n, w in want.items())
    print("cuda: losses %s vs torch %s; weights max diff %.3g, bit-identical: %s" % (
        got_losses[:2], want_losses[:2], worst, first_difference(got, want) is None))
    T.check(got_losses[0] == want_losses[0], "cuda: first loss bit-identical", got_losses[0], want_losses[0])
    T.check(worst <= 1e-5, "cuda: weights within 1e-5 of torch on the same GPU", worst, "<= 1e-5")
    T.check(all(p.data.numel() == 0 for p in model.parameters()), "cuda: the parameters hold no storage")
    engine.close()


def misuse(engine, model, seed):
    T.check_raises(strata.ConfigError, "zero_optimization.stag", lambda: strata.torch.initialize(
        model=GPT(MODEL), config={"zero_optimization": {"stag": 3}}), "a misspelt config key")
    T.check_raises(strata.ConfigError, "gradient_accumulation_steps", lambda: strata.torch.initialize(
        model=GPT(MODEL), config={"gradient_accumulation_steps": 0}), "gradient_accumulation_steps = 0")

    fresh = GPT(MODEL)
    T.check_raises(strata.InvalidArgument, "strata runs its own Adam", lambda: strata.torch.initialize(
        model=fresh, config={}, optimizer=torch.optim.SGD(fresh.parameters(), lr=0.1)), "a torch optimizer passed in")
    T.check_raises(strata.InvalidArgument, "model_parameters[0] has the key 'momentum'",
                   lambda: strata.torch.initialize(model=fresh, config={}, model_parameters=[
                       {"params": list(fresh.parameters()), "momentum": 0.9}]),
                   "a param group with a key torch's Adam does not have")
    T.check_raises(strata.InvalidArgument, "not in model_parameters", lambda: strata.torch.initialize(
        model=fresh, config={}, model_parameters=list(fresh.transformer.h.parameters())), "trainable parameters left out")
    frozen(seed)
    no_gradient(seed)

    # engine.step() from inside forward (a hook on a block)
    block = model.transformer.h[1]
    handle = block.register_forward_hook(lambda m, i, o: engine.step())
    x, y = batch(seed, 99, 0)
    T.check_raises(strata.StateError, "inside forward", lambda: engine(x, y), "engine.step() inside forward")
    handle.remove()
    T.check(all(u.fwd_holds == 0 for u in engine.units), "a failed forward gives back what it held")

    # a step in the middle of backward (a hook on a gradient)
    loss = engine(x, y)
    h = model.transformer.h[0].attn.c_attn.weight.register_hook(lambda g: engine.step())
    T.check_raises(strata.StateError, "in use", lambda: engine.backward(loss), "engine.step() inside backward")
    h.remove()
    # the engine is still usable: a whole accumulation cycle runs and changes the weights
    before = engine.fp32_state_dict()
    for micro in range(GAS):
        x, y = batch(seed, 100, micro)
        engine.backward(engine(x, y))
        engine.step()
    after = engine.fp32_state_dict()
    T.check(first_difference(after, before) is not None, "after misuse the engine still trains")
    T.check_raises(strata.StateError, "while a forward is still running", lambda: _backward_in_forward(engine, model),
                   "engine.backward inside forward")


class _Branches(torch.nn.Module):
    """Two linears of which forward uses one: the other gets no gradient."""

    def __init__(self):
        super().__init__()
        self.used, self.unused = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.used(x).sum()


def no_gradient(seed):
    """A parameter no gradient reaches is stepped with a zero gradient: said once, naming it."""
    import warnings
    torch.manual_seed(seed)
    engine = strata.torch.initialize(model=_Branches(), config={}, device="cpu")[0]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            engine.backward(engine(torch.randn(2, 4)))
            engine.step()
    said = [str(w.message) for w in caught if "got no gradient" in str(w.message)]
    T.check(len(said) == 1 and "unused.weight" in said[0] and not re.search(r"\bused\.", said[0]),
            "a parameter without a gradient is named once, the used one not", said, "one warning naming unused.*")
    engine.close()


def frozen(seed):
    """A frozen parameter is strata's, in a frozen strata module: unchanged, no gradient, no storage between steps;
    the rest trains (tests/py_torch_frozen.py tests frozen parameters at length)."""
    torch.manual_seed(seed)
    model = GPT(MODEL)
    model.transformer.wpe.weight.requires_grad_(False)
    wpe = model.transformer.wpe.weight.detach().clone()
    engine = strata.torch.initialize(model=model, config={"gradient_accumulation_steps": GAS}, device="cpu")[0]
    unit = next(u for u in engine.units if u.name == "transformer.wpe")
    T.check(unit.mids and not unit.trained_mids and all(engine.engine.module_frozen(m) for m in unit.mids),
            "a frozen parameter is in a frozen strata module", (unit.mids, unit.trained_mids), "frozen only")
    before = engine.fp32_state_dict()
    for micro in range(GAS):
        x, y = batch(seed, 0, micro)
        engine.backward(engine(x, y))
        engine.step()
    after = engine.fp32_state_dict()
    p = model.transformer.wpe.weight
    T.check(torch.equal(after["transformer.wpe.weight"], wpe) and p.grad is None and p.numel() == 0,
            "the frozen parameter kept its values (strata holds them), got no gradient and holds no storage")
    T.check(first_difference(after, before) is not None, "the rest trained")
    engine.close()


def _backward_in_forward(engine, model):
    x, y = batch(0, 0, 0)
    loss = engine(x, y)
    handle = model.transformer.h[0].register_forward_hook(lambda m, i, o: engine.backward(loss))
    try:
        engine(x, y)
    finally:
        handle.remove()


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--resume-from":
        resume_child(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    else:
        main()
