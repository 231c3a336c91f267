"""PEFT adapters trained through strata with the frozen base model offloaded, against torch + peft in memory.

Three adapters on tiny Hugging Face models (peft's get_peft_model, as a fine-tuning script makes them):
  LoRA r=4 on a Llama's q_proj / v_proj; LoRA r=4 on GPT-2's c_attn (a Conv1D: fan_in_fan_out=True, and the tied
  embedding and head frozen); IA3 on a Llama's k_proj / v_proj / down_proj.
Each trains STEPS steps of GAS micro-batches through strata.torch.initialize at ZeRO stage 3, parameters (the frozen
base too) and optimizer state on NVMe under a temporary nvme_path, with a device budget of half the base model's
size; and the same model (a copy made before) with torch.optim.AdamW over its trainable parameters, the oracle
(where this torch's CPU sqrt is not IEEE's, its step computes the sqrt correctly rounded: adam_oracle.oracle; Adam
amplifies that one rounding through near-zero moments, a LoRA B starting at zero, to ~2e-5 in three steps, so no
tolerance would tell it from a wrong update). Checked:
  - losses and adapter weights bit-identical to the oracle's;
  - the base weights stay bit for bit, and they live in strata: their tensors hold no storage between steps, the
    parameters' tier is NVMe and each step reads them from it, the device peak stays under the budget;
  - model.save_pretrained(dir) writes the adapter (adapter_model.safetensors) equal to torch + peft's;
  - engine.close(restore_weights=True) then merge_and_unload() gives torch + peft's merged weights and logits.
Then the LoRA Llama through strata.torch.hf.StrataTrainer against transformers.Trainer + peft: logged losses,
adapter weights, and trainer.save_model()'s adapter.
peft is part of the current stack (tools/run pins it); where it cannot be imported the test skips, saying so.
"""
import copy
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "helpers"))
import strata_test as T  # noqa: E402
import hf_models as H  # noqa: E402
import adam_oracle  # noqa: E402

torch = T.require_torch()
transformers = H.require_transformers()
try:
    import peft
except ImportError:
    T.skip("%s cannot import peft (transformers %s, torch %s); the current stack has it: tools/run makes "
           "build/venv-current with peft pinned" % (sys.executable, transformers.__version__, torch.__version__))
from safetensors.torch import load_file  # noqa: E402  # transformers requires safetensors
import strata  # noqa: E402
import strata.torch  # noqa: E402
from strata.torch.hf import StrataTrainer  # noqa: E402

STEPS, GAS = 3, 2
ADAPTER = "adapter_model.safetensors"


def llama(seed):
    """A Llama larger than hf_models' (8 layers of 64), so that the device budget can be half of its base."""
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(vocab_size=128, hidden_size=64, num_hidden_layers=8, num_attention_heads=4,
                                      num_key_value_heads=2, intermediate_size=128, max_position_embeddings=64)
    return transformers.LlamaForCausalLM(config).train()


def gpt2(seed):
    torch.manual_seed(seed)
    config = transformers.GPT2Config(vocab_size=128, n_embd=64, n_layer=8, n_head=4, n_positions=64, resid_pdrop=0.0,
                                     embd_pdrop=0.0, attn_pdrop=0.0)
    return transformers.GPT2LMHeadModel(config).train()


ADAPTERS = {
    "LoRA on Llama q_proj, v_proj": (llama, lambda: peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0,
                                                                     target_modules=["q_proj", "v_proj"])),
    "LoRA on GPT-2 c_attn (Conv1D)": (gpt2, lambda: peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0,
                                                                     target_modules=["c_attn"], fan_in_fan_out=True)),
    "IA3 on Llama k_proj, v_proj, down_proj": (llama, lambda: peft.IA3Config(
        target_modules=["k_proj", "v_proj", "down_proj"], feedforward_modules=["down_proj"])),
}


def peft_model(what, seed):
    build, adapter = ADAPTERS[what]
    return peft.get_peft_model(build(seed), adapter())


def config(nvme, budget, trainer=False):
    """ZeRO-3, everything on NVMe, the device budget; AdamW(**hf_models.HP) and the accumulation unless trainer (the
    TrainingArguments fill them)."""
    out = {"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme", "nvme_path": nvme},
                                 "offload_optimizer": {"device": "nvme", "nvme_path": nvme},
                                 "stage3_param_persistence_threshold": 0},
           "strata": {"device_budget_bytes": budget, "prefetch_bytes": 32 << 10}}
    if not trainer:
        out.update(optimizer=H.optimizer_section(), gradient_accumulation_steps=GAS)
    return out


def batch(seed, step, micro):
    return H.batch(transformers, "llama", seed, step, micro)  # ids below hf_models.VOCAB, labels, a padded mask


def same(got, want, what):
    """{name: tensor} got bit-identical to want."""
    if sorted(got) != sorted(want):
        return T.check(False, "%s: the same tensors" % what, sorted(got)[:4], sorted(want)[:4])
    diff = adam_oracle.first_difference(got, want)
    return T.check(diff is None, "%s bit-identical to torch + peft's" % what, diff, "no difference")


def train_torch(model, seed):
    """The oracle: AdamW over the trainable parameters (adam_oracle.oracle); its losses."""
    opt = adam_oracle.oracle(torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], **H.HP))
    losses = []
    for step in range(STEPS):
        for micro in range(GAS):
            loss = model(**batch(seed, step, micro)).loss
            (loss / GAS).backward()
            losses.append(loss.item())
        opt.step()
        opt.zero_grad(set_to_none=True)
    return losses


def adapter_file(model, tag):
    out = T.scratch("py_peft-" + tag)
    model.save_pretrained(out)
    return load_file(os.path.join(out, ADAPTER))


def adapter(what, seed):
    model = peft_model(what, seed)
    ref = copy.deepcopy(model)
    names = {id(p): n for n, p in model.named_parameters()}
    base = sorted(n for n, p in model.named_parameters() if not p.requires_grad)
    trained = sorted(n for n, p in model.named_parameters() if p.requires_grad)
    initial = {n: p.detach().clone() for n, p in model.named_parameters()}
    base_bytes = sum(initial[n].numel() * 4 for n in base)
    budget = base_bytes // 2
    want_losses = train_torch(ref, seed)

    tag = "".join(c for c in what.split(" (")[0] if c.isalnum())
    engine = strata.torch.initialize(model=model, config=config(T.scratch("py_peft-nvme-" + tag), budget),
                                     device="cpu")[0]
    empty = []
    losses = []
    for step in range(STEPS):
        for micro in range(GAS):
            loss = engine(**batch(seed, step, micro)).loss
            engine.backward(loss)
            engine.step()
            losses.append(loss.item())
        empty.append([names[id(p)] for p in model.parameters() if p.numel()])
    stats = engine.stats()
    print("%s: %d trained tensors (%d elements), a base of %d tensors (%d bytes) on %s (%d bytes there), device "
          "budget %d, peak %d, host -> device %d bytes; losses %s" % (
              what, len(trained), sum(initial[n].numel() for n in trained), len(base), base_bytes,
              engine.engine.placement()["param"], stats["nvme_peak_bytes"], budget, stats["device_peak_bytes"],
              stats["host_to_device_bytes"], ["%.5f" % x for x in losses]))
    T.check(losses == want_losses, "%s: losses bit-identical to torch + peft's" % what, losses, want_losses)
    got = engine.fp32_state_dict()
    want = {n: p.detach() for n, p in ref.named_parameters()}
    same({n: got[n] for n in trained}, {n: want[n] for n in trained}, "%s: the adapter weights" % what)
    diff = adam_oracle.first_difference({n: got[n] for n in base}, {n: initial[n] for n in base})
    T.check(diff is None, "%s: the base weights unchanged, bit for bit" % what, diff, "unchanged")
    T.check(not any(empty), "%s: between steps no parameter holds storage (the base is strata's)" % what,
            [e[:2] for e in empty], "none")
    T.check(engine.engine.placement()["param"] == "nvme" and stats["nvme_peak_bytes"] >= base_bytes and
            stats["host_to_device_bytes"] >= STEPS * base_bytes and stats["device_peak_bytes"] <= budget < base_bytes,
            "%s: the base lives on NVMe, is fetched every step, and is never whole on the device" % what,
            (engine.engine.placement()["param"], stats["nvme_peak_bytes"], stats["host_to_device_bytes"],
             stats["device_peak_bytes"]),
            ("nvme", ">= %d" % base_bytes, ">= %d" % (STEPS * base_bytes), "<= %d < %d" % (budget, base_bytes)))

    same(adapter_file(model, tag + "-strata"), adapter_file(ref, tag + "-torch"),
         "%s: save_pretrained's %s" % (what, ADAPTER))

    probe = batch(seed, 99, 0)
    engine.close(restore_weights=True)
    merged, ref_merged = model.merge_and_unload(), ref.merge_and_unload()
    same({n: p.detach() for n, p in merged.named_parameters()},
         {n: p.detach() for n, p in ref_merged.named_parameters()}, "%s: merge_and_unload()'s merged weights" % what)
    merged.eval()
    ref_merged.eval()
    with torch.no_grad():
        a, b = merged(**probe).logits, ref_merged(**probe).logits
    T.check(torch.equal(a, b), "%s: the merged model's logits bit-identical to torch + peft's" % what,
            (a - b).abs().max().item(), 0.0)


class IeeeTrainer(transformers.Trainer):
    """transformers.Trainer whose AdamW is adam_oracle's (its sqrt correctly rounded where torch's is not)."""

    def create_optimizer(self, *args, **kwargs):
        return adam_oracle.oracle(super().create_optimizer(*args, **kwargs))


class Data(torch.utils.data.Dataset):
    def __init__(self, seed, n):
        self.items = [batch(seed, i, 0) for i in range(n)]

    def __len__(self):
        return len(self.items) * H.BATCH

    def __getitem__(self, i):
        b = self.items[i // H.BATCH]
        return {k: v[i % H.BATCH] for k, v in b.items()}


def trainer(seed):
    what = "LoRA on Llama q_proj, v_proj"
    data = Data(seed, STEPS * GAS)

    def args(tag):
        return H.trainer_args(transformers, T.scratch("py_peft-trainer-" + tag), gradient_accumulation_steps=GAS,
                              max_steps=STEPS, learning_rate=3e-3, max_grad_norm=1e9)
    ref = IeeeTrainer(model=peft_model(what, seed), args=args("torch"), train_dataset=data)
    ref.train()
    model = peft_model(what, seed)
    base_bytes = sum(p.numel() * 4 for p in model.parameters() if not p.requires_grad)
    st = StrataTrainer(model=model, args=args("strata"), train_dataset=data,
                       strata_config=config(T.scratch("py_peft-trainer-nvme"), base_bytes // 2, trainer=True))
    st.train()
    want = [h["loss"] for h in ref.state.log_history if "loss" in h]
    got = [h["loss"] for h in st.state.log_history if "loss" in h]
    print("StrataTrainer + peft, %s: losses %s, Trainer's %s" % (what, got, want))
    T.check(got == want, "StrataTrainer + peft: Trainer + peft's losses", got, want)
    trained = [n for n, p in ref.model.named_parameters() if p.requires_grad]
    sd = st.engine.fp32_state_dict()
    same({n: sd[n] for n in trained}, {n: p.detach() for n, p in ref.model.named_parameters() if p.requires_grad},
         "StrataTrainer + peft: the adapter weights")
    out_ref, out_st = T.scratch("py_peft-trainer-saved-torch"), T.scratch("py_peft-trainer-saved-strata")
    ref.save_model(out_ref)
    st.save_model(out_st)
    same(load_file(os.path.join(out_st, ADAPTER)), load_file(os.path.join(out_ref, ADAPTER)),
         "StrataTrainer + peft: save_model's %s" % ADAPTER)
    st.engine.close()


def main():
    seed = T.seed()
    print("peft %s, transformers %s, torch %s; against torch + peft: %s" % (
        peft.__version__, transformers.__version__, torch.__version__, adam_oracle.HOW))
    for what in ADAPTERS:
        adapter(what, seed)
    trainer(seed)
    T.done()


if __name__ == "__main__":
    main()
