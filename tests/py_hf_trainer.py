"""A Hugging Face transformers Trainer script moved onto strata by changing Trainer to StrataTrainer.

The same tiny Llama, data and TrainingArguments (accumulation 2 and 3, a linear schedule with warmup, dropout off by
the config) train twice: with transformers.Trainer and torch AdamW in memory, and with strata.torch.hf.StrataTrainer,
parameters and optimizer state on NVMe. The labels of each micro-batch are masked differently, so on transformers 5,
where Trainer passes num_items_in_batch and the model divides by the tokens of the whole accumulated batch, a loss
normalised any other way would show. The logged losses and the final weights must be bit-identical while the
clipping threshold is not reached (Trainer's torch clipping then multiplies by exactly 1, strata's does not touch the
gradients), and each logged grad_norm is Trainer's within fp32 rounding (Trainer sums in fp32, strata in double);
with clipping that triggers, strata clips (Trainer could not: strata holds the gradients) and the weights agree with
Trainer's within float rounding of the norm. Then: trainer.save_model() writes the trained weights, which
AutoModelForCausalLM.from_pretrained loads bit for bit; a checkpoint saved mid-run resumes to the same end. bf16 on
the CPU, against Trainer's own bf16 run (autocast over fp32 weights): with the config's bf16 off strata keeps fp32
weights under Trainer's autocast and is bit-identical; by default (the config's bf16 filled from the arguments, as
transformers does) strata's weights are bf16 and the losses agree within bf16's rounding (2^-8 relative). With
weight_decay above 0 (the accumulation-3 run, on a Llama with attention biases) StrataTrainer makes Trainer's own two
param groups (Trainer.get_decay_parameter_names: on transformers 4.40 all but biases decay, on 5 the norms are
exempt too) as strata's parameter groups: the same names in each group, and the weights bit-identical. What strata
cannot do as asked (another optimizer, a config that disagrees, several processes) is refused with the reason.
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
import strata  # noqa: E402
from strata.torch.hf import StrataTrainer  # noqa: E402

STEPS = 4
BF16_LOSS_RTOL = 2.0 ** -8  # bf16's unit roundoff
NORM_RTOL = 1e-6            # a few fp32 ulps


class Data(torch.utils.data.Dataset):
    """n micro-batches of the tiny Llama's batches, each with a different number of labels masked (-100)."""

    def __init__(self, seed, n):
        self.items = []
        g = torch.Generator().manual_seed(seed)
        for i in range(n):
            b = H.batch(transformers, "llama", seed, i, 0)
            drop = torch.rand(b["labels"].shape, generator=g) < 0.1 * (i % 4)
            b["labels"] = b["labels"].masked_fill(drop, -100)
            self.items.append(b)

    def __len__(self):
        return len(self.items) * H.BATCH

    def __getitem__(self, i):
        b = self.items[i // H.BATCH]
        return {k: v[i % H.BATCH] for k, v in b.items()}


def args(out, gas, **extra):
    return H.trainer_args(transformers, out, **dict(dict(
        gradient_accumulation_steps=gas, max_steps=STEPS, learning_rate=3e-3, lr_scheduler_type="linear",
        warmup_steps=1, max_grad_norm=1e9), **extra))


def nvme_config(nvme):
    return {"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme", "nvme_path": nvme},
                                  "offload_optimizer": {"device": "nvme", "nvme_path": nvme}}}


def logged(trainer, key):
    return [h.get(key) for h in trainer.state.log_history if "loss" in h]


def weights(model_or_engine):
    if hasattr(model_or_engine, "fp32_state_dict"):
        return model_or_engine.fp32_state_dict()
    return {n: p.detach().clone() for n, p in model_or_engine.named_parameters()}


def model(seed):
    return H.build(transformers, "llama", seed)


def biased_model(seed):
    """The tiny Llama with biases in its attention, which Trainer does not decay on any transformers."""
    config = copy.deepcopy(H._configs(transformers)["llama"][0])
    config.attention_bias = True
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(config).train()


def run_pair(seed, data, gas, tag, clip=1e9, make=model, **extra):
    ref = transformers.Trainer(model=make(seed), args=args(T.scratch("hf-trainer-ref-" + tag), gas,
                                                            max_grad_norm=clip, **extra), train_dataset=data)
    ref.train()
    st = StrataTrainer(model=make(seed), args=args(T.scratch("hf-trainer-strata-" + tag), gas, max_grad_norm=clip,
                                                   **extra),
                       train_dataset=data, strata_config=nvme_config(T.scratch("hf-nvme-" + tag)))
    st.train()
    return ref, st


def group_names(optimizer, model):
    """[(weight_decay, [parameter names])] of each param group."""
    names = {id(p): n for n, p in model.named_parameters()}
    return [(g["weight_decay"], sorted(names[id(p)] for p in g["params"])) for g in optimizer.param_groups]


def check_decay_groups(ref, st):
    want, got = group_names(ref.optimizer, ref.model), group_names(st.engine.optimizer, st.model)
    print("weight decay %g: Trainer's groups (decay, no decay) hold %s parameters; Trainer's optim %s" % (
        st.args.weight_decay, [len(n) for _, n in want], ref.args.optim))
    T.check(got == want and len(want) == 2 and want[1][1],
            "weight_decay: StrataTrainer's param groups are Trainer's (the same names, the same decay)", got, want)
    held = [st.engine.engine.group(i)["weight_decay"] for i in range(st.engine.engine.group_count())]
    T.check(held == [wd for wd, _ in want], "weight_decay: strata's groups run Trainer's decay", held,
            [wd for wd, _ in want])


def check_exact(seed, gas, weight_decay=0.0):
    """Losses, weights and grad_norm against Trainer; returns the StrataTrainer (open) for save_model."""
    data = Data(seed, STEPS * gas)
    if weight_decay:
        ref, st = run_pair(seed, data, gas, "exact%d" % gas, make=biased_model, weight_decay=weight_decay)
        check_decay_groups(ref, st)
    else:
        ref, st = run_pair(seed, data, gas, "exact%d" % gas)
    want, got = logged(ref, "loss"), logged(st, "loss")
    print("accumulation %d (num_items_in_batch normalises the loss: %s)\nTrainer losses %s\nStrataTrainer  %s" % (
        gas, getattr(st, "model_accepts_loss_kwargs", "no such argument"), want, got))
    T.check(len(got) == STEPS and got == want, "accumulation %d: StrataTrainer logs Trainer's losses" % gas, got, want)
    diff = adam_oracle.first_difference(weights(st.engine), weights(ref.model))
    T.check(diff is None, "accumulation %d, weight_decay %g: StrataTrainer's weights bit-identical to Trainer + torch "
            "AdamW" % (gas, weight_decay), diff, "no difference")
    norms, ref_norms = logged(st, "grad_norm"), logged(ref, "grad_norm")
    print("grad_norm  Trainer %s\n           strata  %s" % (ref_norms, norms))
    T.check(None not in norms and all(abs(a - b) <= NORM_RTOL * b for a, b in zip(norms, ref_norms)),
            "accumulation %d: grad_norm in the logs is Trainer's (relative %g)" % (gas, NORM_RTOL), norms, ref_norms)
    return st


def check_save_model(seed, st):
    out = T.scratch("hf-trainer-saved")
    st.save_model(out)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    have, want = loaded.state_dict(), st.engine.fp32_state_dict()
    wrong = [n for n, w in want.items() if n not in have or not torch.equal(have[n], w)]
    T.check(not wrong, "save_model -> AutoModelForCausalLM.from_pretrained gives the trained weights", wrong[:3],
            "every tensor equal")
    st.engine.eval()
    b = H.batch(transformers, "llama", seed, 99, 0)
    with torch.no_grad():
        a, c = st.model(**b).logits, loaded(**b).logits
    T.check(torch.equal(a, c), "save_model -> from_pretrained gives the same logits", (a - c).abs().max().item(), 0.0)


def autocast_on():
    """Whether CPU autocast is on (torch 2.4 renamed the query)."""
    if hasattr(torch, "get_autocast_dtype"):
        return torch.is_autocast_enabled("cpu")
    return torch.is_autocast_cpu_enabled()


def check_bf16(seed):
    """TrainingArguments(bf16=True) on the CPU: Trainer autocasts to bf16 over its fp32 weights."""
    data = Data(seed, STEPS * 2)
    ref = transformers.Trainer(model=model(seed), args=args(T.scratch("hf-trainer-bf16-ref"), 2, bf16=True),
                               train_dataset=data)
    ref.train()
    want = logged(ref, "loss")

    st = StrataTrainer(model=model(seed), args=args(T.scratch("hf-trainer-bf16-autocast"), 2, bf16=True),
                       train_dataset=data, strata_config={"bf16": {"enabled": False}})
    seen = []
    st.model.model.layers[0].register_forward_pre_hook(lambda module, inputs: seen.append(autocast_on()))
    st.train()
    got = logged(st, "loss")
    print("bf16, strata's weights fp32 under Trainer's autocast\nTrainer losses %s\nStrataTrainer  %s" % (want, got))
    T.check(got == want, "bf16 with the config's bf16 off: Trainer's bf16 losses", got, want)
    diff = adam_oracle.first_difference(weights(st.engine), weights(ref.model))
    T.check(diff is None, "bf16 with the config's bf16 off: weights bit-identical to Trainer's bf16 run", diff,
            "no difference")
    T.check(len(seen) == STEPS * 2 and all(seen) and st.engine.dtype == torch.float32,
            "Trainer's autocast runs inside strata's forward over its fp32 weights", (seen, st.engine.dtype),
            ([True] * STEPS * 2, torch.float32))
    st.engine.close()

    st = StrataTrainer(model=model(seed), args=args(T.scratch("hf-trainer-bf16"), 2, bf16=True),
                       train_dataset=data, strata_config={})
    st.train()
    got = logged(st, "loss")
    worst = max(abs(a - b) / abs(b) for a, b in zip(got, want))
    print("bf16 by default: strata's weights %s\nTrainer losses %s\nStrataTrainer  %s (worst relative %.3g)" % (
        st.engine.dtype, want, got, worst))
    T.check(st.engine.dtype == torch.bfloat16 and len(got) == STEPS and worst <= BF16_LOSS_RTOL,
            "bf16 by default: strata trains bf16 weights, losses within bf16 rounding of Trainer's bf16 run",
            (st.engine.dtype, worst), (torch.bfloat16, "<= %g" % BF16_LOSS_RTOL))
    st.engine.close()


def check_skip_with_strata(seed, data):
    """Trainer steps its scheduler unless accelerate saw the step skipped, and accelerate knows only its own
    GradScaler's overflows: after a step strata skipped (an fp16 overflow; planted here, since fp16 needs a GPU)
    the scheduler must not move, as DeepSpeed's engine leaves it; after a step that ran it moves as torch's does."""
    st = StrataTrainer(model=model(seed), args=args(T.scratch("hf-trainer-skip"), 1, max_steps=4), train_dataset=data,
                       strata_config={})
    sched = st.create_scheduler(4)
    ref = transformers.get_scheduler(st.args.lr_scheduler_type, torch.optim.AdamW(
        model(seed).parameters(), lr=st.args.learning_rate), num_warmup_steps=st.args.get_warmup_steps(4),
        num_training_steps=4)
    lrs, want = [], []
    for skipped in (False, True, False):
        st.engine.last_step = {"skipped": skipped}
        sched.step()
        if not skipped:
            ref.step()
        lrs.append(st.engine.optimizer.param_groups[0]["lr"])
        want.append(ref.get_last_lr()[0])
    T.check(lrs == want, "Trainer's linear schedule stays put after a step strata skipped", lrs, want)
    st.engine.close()


def main():
    seed = T.seed()
    check_exact(seed, 3, weight_decay=0.1).engine.close()
    st = check_exact(seed, 2)
    check_save_model(seed, st)
    st.engine.close()

    data = Data(seed, STEPS * 3)
    ref, st = run_pair(seed, data, 3, "clip", clip=0.05)
    worst = max((st.engine.fp32_state_dict()[n] - w).abs().max().item() for n, w in weights(ref.model).items())
    moved = max((w - v).abs().max().item() for (n, w), v in zip(weights(ref.model).items(),
                                                                 model(seed).state_dict().values()))
    print("clipping at 0.05: max weight diff %.3g (training moved the weights by up to %.3g)" % (worst, moved))
    T.check(worst <= 1e-6, "with clipping that triggers, StrataTrainer agrees with Trainer", worst, "<= 1e-6")
    st.engine.close()

    # A checkpoint at step 2 resumes to the uninterrupted run's end.
    run = T.scratch("hf-trainer-resume")
    first = StrataTrainer(model=model(seed), args=args(run, 3, save_strategy="steps", save_steps=2),
                          train_dataset=data, strata_config=nvme_config(T.scratch("hf-trainer-nvme-r1")))
    first.train()
    end = weights(first.engine)
    first.engine.close()
    second = StrataTrainer(model=model(seed + 1), args=args(run, 3, save_strategy="no"), train_dataset=data,
                           strata_config=nvme_config(T.scratch("hf-trainer-nvme-r2")))
    second.train(resume_from_checkpoint=os.path.join(run, "checkpoint-2"))
    diff = adam_oracle.first_difference(weights(second.engine), end)
    T.check(diff is None, "resume_from_checkpoint: the weights end bit-identical to the uninterrupted run", diff,
            "no difference")
    second.engine.close()

    check_bf16(seed)

    T.check_raises(strata.InvalidArgument, "optim", lambda: StrataTrainer(
        model=model(seed), args=args(T.scratch("hf-trainer-sgd"), 3, optim="sgd"), train_dataset=data,
        strata_config={}), "another optimizer")
    # Trainer over several processes (torch.distributed): its sharding and DDP are not strata's ranks. Refused.
    from unittest import mock
    with mock.patch.object(transformers.TrainingArguments, "world_size", property(lambda self: 2)):
        T.check_raises(strata.InvalidArgument, "one process", lambda: StrataTrainer(
            model=model(seed), args=args(T.scratch("hf-trainer-ranks"), 3), train_dataset=data,
            strata_config=nvme_config(T.scratch("hf-trainer-nvme-ranks"))), "Trainer with 2 processes")
    T.check_raises(strata.ConfigError, "gradient_accumulation_steps = 2 but TrainingArguments say "
                   "gradient_accumulation_steps = 3", lambda: StrataTrainer(
                       model=model(seed), args=args(T.scratch("hf-trainer-gas"), 3), train_dataset=data,
                       strata_config={"gradient_accumulation_steps": 2}),
                   "a config that disagrees with TrainingArguments")
    # A scheduler passed to Trainer was built on another optimizer than the engine's: it would set no lr. Refused.
    other = torch.optim.AdamW(model(seed).parameters())
    T.check_raises(strata.InvalidArgument, "would set no lr", lambda: StrataTrainer(
        model=model(seed), args=args(T.scratch("hf-trainer-sched"), 3), train_dataset=data, strata_config={},
        optimizers=(None, torch.optim.lr_scheduler.LambdaLR(other, lambda s: 0.5))), "optimizers=(None, scheduler)")
    check_skip_with_strata(seed, data)
    T.check_raises(strata.ConfigError, "bf16.enabled = True but TrainingArguments say bf16 = False", lambda:
                   StrataTrainer(model=model(seed), args=args(T.scratch("hf-trainer-bf16-off"), 3),
                                 train_dataset=data, strata_config={"bf16": {"enabled": True}}),
                   "the config's bf16 without TrainingArguments' bf16")
    T.done()


if __name__ == "__main__":
    main()
