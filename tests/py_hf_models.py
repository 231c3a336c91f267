"""Hugging Face transformers models trained through strata.torch, against torch.optim.AdamW in memory.

Tiny random configs of GPT-2, Llama, Mistral, Mixtral, BERT and T5 (tests/helpers/hf_models.py) train at ZeRO
stage 3 with parameters and optimizer state on NVMe, accumulation 2, padded attention masks, dropout where the
config has it, driven every way a fine-tuning script drives a model:
  engine(**batch)                              the DeepSpeed way
  engine.module(**batch) + engine.backward     the model called directly
  HF gradient_checkpointing_enable()           reentrant (transformers 4.x's default) and non-reentrant
and each must end with losses and fp32 weights bit-identical to plain PyTorch (AdamW, the same accumulation, and the
same checkpointing: HF's recompute restores the RNG, so dropout masks match; AdamW's sqrt correctly rounded where
torch's is not: adam_oracle.oracle). Also: save_checkpoint -> a fresh
engine on other weights -> load_checkpoint -> the remaining steps, bit-identical, and `strata ckpt export` of that
checkpoint gives each tensor in its model shape (read by the safetensors package); engine.module.state_dict() and
save_pretrained() -> from_pretrained() give the trained weights (eval logits identical to the engine's, and greedy
generate() the same tokens); misuse that
used to give wrong gradients silently now raises.
Run with the venv's python (tools/run makes STRATA_BUILD_DIR/venv); under Debian's python the test re-runs itself
there, or skips when the venv is missing.
"""
import os
import subprocess
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
WAYS = ("engine", "module", "reentrant", "non-reentrant")


def config(nvme, model):
    # A device budget below the model's size: blocks come back at other addresses, which is what a stale view of
    # a parameter would read wrongly.
    model_bytes = sum(p.numel() * 4 for p in model.parameters())
    layer = max(sum(p.numel() * 4 for p in layer.parameters()) for m in model.modules()
                if isinstance(m, torch.nn.ModuleList) for layer in m)
    return {
        "zero_optimization": {"stage": 3, "offload_param": {"device": "nvme", "nvme_path": nvme},
                              "offload_optimizer": {"device": "nvme", "nvme_path": nvme},
                              "stage3_param_persistence_threshold": 0},
        "optimizer": H.optimizer_section(),
        "gradient_accumulation_steps": GAS,
        "strata": {"device_budget_bytes": max(model_bytes * 6 // 10, layer * 8, 256 << 10),
                   "prefetch_bytes": 64 << 10},
    }


def checkpointing(model, way):
    if way in ("reentrant", "non-reentrant"):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": way == "reentrant"})


def train_torch(name, seed, way):
    model = H.build(transformers, name, seed)
    checkpointing(model, way)
    opt = adam_oracle.oracle(torch.optim.AdamW(model.parameters(), **H.HP))
    losses = []
    for step in range(STEPS):
        torch.manual_seed(seed + step)  # dropout's masks, the same after a resume
        for micro in range(GAS):
            loss = model(**H.batch(transformers, name, seed, step, micro)).loss
            (loss / GAS).backward()
            losses.append(loss.item())
        opt.step()
        opt.zero_grad(set_to_none=True)
    return losses, {n: p.detach().clone() for n, p in model.named_parameters()}


def new_engine(name, seed, way, nvme):
    model = H.build(transformers, name, seed)
    checkpointing(model, way)
    engine, _, _, _ = strata.torch.initialize(model=model, config=config(nvme, model), device="cpu")
    return model, engine


def train_strata(engine, model, name, seed, way, first, last):
    losses = []
    for step in range(first, last):
        torch.manual_seed(seed + step)
        for micro in range(GAS):
            b = H.batch(transformers, name, seed, step, micro)
            out = engine(**b) if way == "engine" else model(**b)
            engine.backward(out.loss)
            engine.step()
            losses.append(out.loss.item())
    return losses


def same_losses(got, want):
    return len(got) == len(want) and all(a == b for a, b in zip(got, want))


def check_way(name, seed, way, want):
    nvme = T.scratch("py_hf_models-%s-%s" % (name, way))
    model, engine = new_engine(name, seed, way, nvme)
    losses = train_strata(engine, model, name, seed, way, 0, STEPS)
    got = engine.fp32_state_dict()
    diff = adam_oracle.first_difference(got, want[1])
    T.check(same_losses(losses, want[0]), "%s %s: losses bit-identical to torch" % (name, way), losses, want[0])
    T.check(diff is None, "%s %s: weights bit-identical to torch" % (name, way), diff, "no difference")
    print("%-8s %-14s loss %.6f -> %.6f  %s" % (name, way, losses[0], losses[-1],
                                                   "exact" if diff is None and same_losses(losses, want[0])
                                                   else "DIFFERS"))
    return model, engine


def check_resume(name, seed, want):
    """Save after one step, a fresh engine on other weights loads it, the rest is bit-identical."""
    root = T.scratch("py_hf_models-%s-ckpt" % name)
    model, engine = new_engine(name, seed, "engine", T.scratch("py_hf_models-%s-a" % name))
    train_strata(engine, model, name, seed, "engine", 0, 1)
    engine.save_checkpoint(root, tag="last")
    check_export(name, os.path.join(root, "last"), engine.fp32_state_dict())
    engine.close()
    model, engine = new_engine(name, seed + 1, "engine", T.scratch("py_hf_models-%s-b" % name))
    engine.load_checkpoint(root)
    losses = train_strata(engine, model, name, seed, "engine", 1, STEPS)
    diff = adam_oracle.first_difference(engine.fp32_state_dict(), want[1])
    T.check(same_losses(losses, want[0][GAS:]), "%s: save -> fresh engine -> resume: losses" % name, losses,
            want[0][GAS:])
    T.check(diff is None, "%s: save -> fresh engine -> resume: weights bit-identical" % name, diff, "no difference")
    engine.close()


def check_export(name, ckpt, masters):
    """`strata ckpt export` writes one safetensors file (read here by the safetensors package, not by strata) with
    every trained tensor under the model's name, in the model's shape, equal to the fp32 master weights."""
    out = os.path.join(T.scratch("py_hf_models-%s-export" % name), "model.safetensors")
    strata_bin = os.environ.get("STRATA_BIN") or os.path.join(T.BUILD_DIR, "strata")
    p = subprocess.run([strata_bin, "ckpt", "export", ckpt, "--to", out], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True)
    if not T.check(p.returncode == 0, "%s: strata ckpt export exits 0" % name, p.stdout.strip()[-300:], 0):
        return
    from safetensors.torch import load_file
    got = load_file(out)
    wrong = [k for k, v in masters.items() if k not in got or got[k].shape != v.shape or not torch.equal(got[k], v)]
    T.check(not wrong and len(got) == len(masters), "%s: the exported file holds every tensor in its model shape, "
            "bit-identical to the master weights" % name, (wrong[:3], sorted(set(got) - set(masters))[:3]),
            ([], []))


def check_pretrained(name, seed, model, engine):
    """state_dict() and save_pretrained() give the trained weights; from_pretrained() computes the same logits."""
    masters = engine.fp32_state_dict()
    sd = model.state_dict()
    wrong = [k for k, v in masters.items() if not torch.equal(sd[k], v)]
    T.check(not wrong, "%s: engine.module.state_dict() holds the trained weights" % name, wrong[:3], "none wrong")
    d = T.scratch("py_hf_models-%s-pretrained" % name)
    model.save_pretrained(d)
    loaded = type(model).from_pretrained(d)
    loaded.eval()
    engine.eval()
    b = H.batch(transformers, name, seed, 99, 0)
    with torch.no_grad():
        want = engine(**b).logits
        got = loaded(**b).logits
    T.check(torch.equal(got, want), "%s: save_pretrained -> from_pretrained: logits identical" % name,
            (got - want).abs().max().item(), 0.0)
    if name != "bert":  # greedy generation, with its cache, through strata and through the loaded copy
        prompt = b["input_ids"][:1, :6]
        a = model.generate(prompt, max_new_tokens=5, do_sample=False, pad_token_id=0)
        c = loaded.generate(prompt, max_new_tokens=5, do_sample=False, pad_token_id=0)
        T.check(torch.equal(a, c), "%s: generate() through strata gives the loaded model's tokens" % name,
                a.tolist(), c.tolist())
    T.check(all(p.data.numel() == 0 for p in model.parameters()), "%s: the parameters hold no storage between uses"
            % name)
    engine.train()


class Wrapper(torch.nn.Module):
    """A model inside a module of the user's (a trainer's wrapper): strata finds the units under it."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, **batch):
        return self.inner(**batch)


def check_wrapped(name, seed, want):
    model = Wrapper(H.build(transformers, name, seed))
    engine, _, _, _ = strata.torch.initialize(model=model, config=config(T.scratch("py_hf_models-wrapped"), model),
                                              device="cpu")
    losses = train_strata(engine, model, name, seed, "module", 0, STEPS)
    inner = {k[len("inner."):]: v for k, v in engine.fp32_state_dict().items()}
    diff = adam_oracle.first_difference(inner, want[1])
    T.check(same_losses(losses, want[0]) and diff is None, "%s inside a wrapper module: bit-identical to torch" %
            name, (losses, diff), (want[0], None))
    engine.close()


def misuse(seed):
    """Other ways to call a module compute what torch computes; what used to give wrong gradients without a word
    now raises, naming what to do."""
    name = "llama"
    plain = H.build(transformers, name, seed)
    model, engine = new_engine(name, seed, "module", T.scratch("py_hf_models-misuse"))
    b = H.batch(transformers, name, seed, 0, 0)
    h = torch.randn(H.BATCH, H.SEQ, 32)
    with torch.no_grad():
        for what, call in (("a child module called on its own", lambda m: m.model.layers[1].mlp(h)),
                           ("a child's .forward called directly", lambda m: m.model.layers[1].mlp.forward(h)),
                           ("a parameter-owning leaf called directly", lambda m: m.lm_head.forward(h))):
            got, want = call(model), call(plain)
            T.check(torch.equal(got, want), "%s under torch.no_grad(): the same output as torch" % what,
                    (got - want).abs().max().item(), 0.0)
    # A plain loss.backward() with accumulation 2 would accumulate unscaled gradients.
    T.check_raises(strata.StateError, "engine.backward(loss)", lambda: model(**b).loss.backward(),
                   "loss.backward() that bypasses engine.backward's scaling")
    # A view of a parameter kept past its module's forward would read memory strata reuses.
    kept = []
    layer = model.model.layers[0].mlp
    handle = layer.register_forward_hook(lambda m, i, o: kept.append(m.up_proj.weight.t()))
    T.check_raises(strata.StateError, "still refers to the memory", lambda: model(**b),
                   "a parameter view kept after the module's forward")
    handle.remove()
    kept.clear()
    T.check_raises(strata.StateError, "load_state_dict", lambda: model.load_state_dict(model.state_dict()),
                   "load_state_dict on a managed model")
    engine.close()


def main():
    seed = T.seed()
    only = os.environ.get("STRATA_HF_MODELS")
    names = only.split(",") if only else H.NAMES
    print("transformers %s, torch %s" % (transformers.__version__, torch.__version__))
    for name in names:
        plain = train_torch(name, seed, "engine")
        for way in WAYS:
            want = plain if way in ("engine", "module") else train_torch(name, seed, way)
            if way not in ("engine", "module") and not same_losses(want[0], plain[0]):
                print("%-8s %-14s (torch itself: losses differ from no checkpointing; strata is compared with torch "
                      "checkpointing the same way)" % (name, way))
            model, engine = check_way(name, seed, way, want)
            if way == "engine":
                check_pretrained(name, seed, model, engine)
            engine.close()
        check_resume(name, seed, plain)
        if name == "llama":
            check_wrapped(name, seed, plain)
    misuse(seed)
    T.done()


if __name__ == "__main__":
    main()
