"""A Hugging Face transformers Trainer script moved onto strata by changing Trainer to StrataTrainer.

The same tiny Llama, data and TrainingArguments (accumulation 3, a linear schedule with warmup, dropout off by the
config) train twice: with transformers.Trainer and torch AdamW in memory, and with strata.torch.hf.StrataTrainer,
parameters and optimizer state on NVMe. The logged losses and the final weights must be bit-identical while the
clipping threshold is not reached (Trainer's torch clipping then multiplies by exactly 1, strata's does not touch
the gradients); with clipping that triggers, strata clips (Trainer could not: strata holds the gradients) and the
weights agree with Trainer's within float rounding of the norm. Then: trainer.save_model() writes weights that
from_pretrained loads to the same logits; a checkpoint saved mid-run resumes to the same end; what strata cannot do
as asked (weight decay with Trainer's groups, another optimizer, a config that disagrees, several processes) is
refused with the reason.
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
from strata.torch.hf import StrataTrainer  # noqa: E402

STEPS, GAS = 4, 3


class Data(torch.utils.data.Dataset):
    def __init__(self, seed, n):
        self.items = [H.batch(transformers, "llama", seed, i, 0) for i in range(n)]

    def __len__(self):
        return len(self.items) * H.BATCH

    def __getitem__(self, i):
        b = self.items[i // H.BATCH]
        return {k: v[i % H.BATCH] for k, v in b.items()}


def args(out, **extra):
    base = dict(output_dir=out, per_device_train_batch_size=H.BATCH, gradient_accumulation_steps=GAS,
                max_steps=STEPS, learning_rate=3e-3, lr_scheduler_type="linear", warmup_steps=1, logging_steps=1,
                save_strategy="no", report_to=[], use_cpu=True, seed=0, data_seed=0, max_grad_norm=1e9,
                dataloader_num_workers=0, disable_tqdm=True)
    base.update(extra)
    return transformers.TrainingArguments(**base)


def nvme_config(nvme):
    return {"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme", "nvme_path": nvme},
                                  "offload_optimizer": {"device": "nvme", "nvme_path": nvme}}}


def losses_of(trainer):
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]


def weights(model_or_engine):
    if hasattr(model_or_engine, "fp32_state_dict"):
        return model_or_engine.fp32_state_dict()
    return {n: p.detach().clone() for n, p in model_or_engine.named_parameters()}


def model(seed):
    m = H.build(transformers, "llama", seed)
    return m


def run_pair(seed, data, clip, tag):
    ref = transformers.Trainer(model=model(seed), args=args(T.scratch("hf-trainer-ref-" + tag), max_grad_norm=clip),
                               train_dataset=data)
    ref.train()
    st = StrataTrainer(model=model(seed), args=args(T.scratch("hf-trainer-strata-" + tag), max_grad_norm=clip),
                       train_dataset=data, strata_config=nvme_config(T.scratch("hf-trainer-nvme-" + tag)))
    st.train()
    return ref, st


def main():
    seed = T.seed()
    data = Data(seed, STEPS * GAS)

    ref, st = run_pair(seed, data, 1e9, "exact")
    want, got = losses_of(ref), losses_of(st)
    diff = adam_oracle.first_difference(weights(st.engine), weights(ref.model))
    print("Trainer losses %s\nStrataTrainer  %s" % (want, got))
    T.check(len(got) == STEPS and got == want, "StrataTrainer logs Trainer's losses", got, want)
    T.check(diff is None, "StrataTrainer's weights bit-identical to Trainer + torch AdamW", diff, "no difference")

    out = T.scratch("hf-trainer-saved")
    st.save_model(out)
    loaded = transformers.LlamaForCausalLM.from_pretrained(out).eval()
    st.engine.eval()
    b = H.batch(transformers, "llama", seed, 99, 0)
    with torch.no_grad():
        a, c = st.model(**b).logits, loaded(**b).logits
    T.check(torch.equal(a, c), "save_model -> from_pretrained gives the same logits", (a - c).abs().max().item(), 0.0)
    st.engine.close()

    ref, st = run_pair(seed, data, 0.05, "clip")
    worst = max((st.engine.fp32_state_dict()[n] - w).abs().max().item() for n, w in weights(ref.model).items())
    moved = max((w - v).abs().max().item() for (n, w), v in zip(weights(ref.model).items(),
                                                                 model(seed).state_dict().values()))
    print("clipping at 0.05: max weight diff %.3g (training moved the weights by up to %.3g)" % (worst, moved))
    T.check(worst <= 1e-6, "with clipping that triggers, StrataTrainer agrees with Trainer", worst, "<= 1e-6")
    st.engine.close()

    # A checkpoint at step 2 resumes to the uninterrupted run's end.
    run = T.scratch("hf-trainer-resume")
    first = StrataTrainer(model=model(seed), args=args(run, save_strategy="steps", save_steps=2),
                          train_dataset=data, strata_config=nvme_config(T.scratch("hf-trainer-nvme-r1")))
    first.train()
    end = weights(first.engine)
    first.engine.close()
    second = StrataTrainer(model=model(seed + 1), args=args(run, save_strategy="no"), train_dataset=data,
                           strata_config=nvme_config(T.scratch("hf-trainer-nvme-r2")))
    second.train(resume_from_checkpoint=os.path.join(run, "checkpoint-2"))
    diff = adam_oracle.first_difference(weights(second.engine), end)
    T.check(diff is None, "resume_from_checkpoint: the weights end bit-identical to the uninterrupted run", diff,
            "no difference")
    second.engine.close()

    T.check_raises(strata.InvalidArgument, "weight_decay", lambda: StrataTrainer(
        model=model(seed), args=args(T.scratch("hf-trainer-wd"), weight_decay=0.1), train_dataset=data,
        strata_config={}), "weight decay with Trainer's no-decay groups")
    T.check_raises(strata.InvalidArgument, "optim", lambda: StrataTrainer(
        model=model(seed), args=args(T.scratch("hf-trainer-sgd"), optim="sgd"), train_dataset=data,
        strata_config={}), "another optimizer")
    # Trainer over several processes (torch.distributed): its sharding and DDP are not strata's ranks. Refused.
    from unittest import mock
    with mock.patch.object(transformers.TrainingArguments, "world_size", property(lambda self: 2)):
        T.check_raises(strata.InvalidArgument, "one process", lambda: StrataTrainer(
            model=model(seed), args=args(T.scratch("hf-trainer-ranks")), train_dataset=data,
            strata_config=nvme_config(T.scratch("hf-trainer-nvme-ranks"))), "Trainer with 2 processes")
    T.check_raises(strata.ConfigError, "gradient_accumulation_steps", lambda: StrataTrainer(
        model=model(seed), args=args(T.scratch("hf-trainer-gas")), train_dataset=data,
        strata_config={"gradient_accumulation_steps": 2}), "a config that disagrees with TrainingArguments")
    T.done()


if __name__ == "__main__":
    main()
