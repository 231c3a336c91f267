"""DeepSpeed configs written for transformers' Trainer run unchanged on strata, and their scheduler owns the lr.

Stock configs: the ZeRO-2 and ZeRO-3 offload configs of transformers' DeepSpeed guide (huggingface.co/docs/
transformers/deepspeed), "auto" values and all, train 3 steps through StrataTrainer(strata_config=that) with the same
losses and weights as StrataTrainer given only their scheduler section: every other key is either filled from
TrainingArguments and the model as transformers fills it (the bucket sizes from the hidden size), or names what
strata always does (overlap_comm true, ...), or is a tuning hint strata plans itself, which is accepted with one
warning line per key for the whole process. The same through strata.torch.initialize: the raw file is refused with a
message that says who fills "auto" (DeepSpeed itself refuses "auto" outside transformers), and the file filled by
strata.torch.hf.fill_auto trains like a minimal config. `strata config check` (the C tool) prints the same lines and
refuses the same value (overlap_comm false) with the same message as the Python package.

The scheduler: a config "scheduler" section (WarmupDecayLR, all "auto") drives the learning rate of every strata step
exactly as DeepSpeed's formula gives it (stepped once per optimizer step: the engine has none of its own), and the
run is bit-identical to Trainer + torch AdamW driven by the same schedule; resumed from a checkpoint, the schedule
goes on where it was. TrainingArguments that choose another
schedule (lr_scheduler_type, a warmup the section has no place for, a total_num_steps that disagrees) are refused.
"""
import json
import math
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "helpers"))
import strata_test as T  # noqa: E402
import hf_models as H  # noqa: E402
import adam_oracle  # noqa: E402

torch = T.require_torch()
transformers = H.require_transformers()
import strata  # noqa: E402
import strata.torch  # noqa: E402
from strata.torch import schedulers  # noqa: E402
from strata.torch.hf import StrataTrainer, fill_auto  # noqa: E402

LR, GAS = 3e-3, 2

_FP16 = {"enabled": "auto", "loss_scale": 0, "loss_scale_window": 1000, "initial_scale_power": 16, "hysteresis": 2,
         "min_loss_scale": 1}
_OPTIMIZER = {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}}
_TRAINER_KEYS = {"gradient_accumulation_steps": "auto", "gradient_clipping": "auto", "steps_per_print": 2000,
                 "train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "wall_clock_breakdown": False}
ZERO2 = dict({
    "fp16": _FP16, "bf16": {"enabled": "auto"}, "optimizer": _OPTIMIZER,
    "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                                                 "warmup_num_steps": "auto"}},
    "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": True},
                          "allgather_partitions": True, "allgather_bucket_size": 2e8, "overlap_comm": True,
                          "reduce_scatter": True, "reduce_bucket_size": 5e8, "contiguous_gradients": True,
                          "round_robin_gradients": True},
}, **_TRAINER_KEYS)
ZERO3 = dict({
    "fp16": _FP16, "bf16": {"enabled": "auto"}, "optimizer": _OPTIMIZER,
    "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                                                      "warmup_num_steps": "auto", "total_num_steps": "auto"}},
    "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "pin_memory": True},
                          "offload_param": {"device": "cpu", "pin_memory": True}, "overlap_comm": True,
                          "contiguous_gradients": True, "sub_group_size": 1e9, "reduce_bucket_size": "auto",
                          "stage3_prefetch_bucket_size": "auto", "stage3_param_persistence_threshold": "auto",
                          "stage3_max_live_parameters": 1e9, "stage3_max_reuse_distance": 1e9,
                          "stage3_gather_16bit_weights_on_model_save": True},
}, **_TRAINER_KEYS)
# The tuning hints of the two files: one warning line each, for the whole process.
PLANNED = ("zero_optimization.allgather_bucket_size", "zero_optimization.reduce_bucket_size",
           "zero_optimization.round_robin_gradients", "zero_optimization.stage3_max_reuse_distance")
NOTICE = "is a DeepSpeed tuning hint that strata plans itself"


class Data(torch.utils.data.Dataset):
    def __init__(self, seed, n):
        self.items = [H.batch(transformers, "llama", seed, i, 0) for i in range(n)]

    def __len__(self):
        return len(self.items) * H.BATCH

    def __getitem__(self, i):
        b = self.items[i // H.BATCH]
        return {k: v[i % H.BATCH] for k, v in b.items()}


def args(out, steps, **extra):
    return H.trainer_args(transformers, out, **dict(dict(gradient_accumulation_steps=GAS, max_steps=steps,
                                                         learning_rate=LR), **extra))


def model(seed):
    return H.build(transformers, "llama", seed)


def losses_of(trainer):
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]


class Stderr:
    """Captures file descriptor 2 (the C library's log lines go there), echoing it when done."""

    def __enter__(self):
        sys.stderr.flush()
        self.file = tempfile.TemporaryFile()
        self.saved = os.dup(2)
        os.dup2(self.file.fileno(), 2)
        return self

    def __exit__(self, *exc):
        sys.stderr.flush()
        os.dup2(self.saved, 2)
        os.close(self.saved)
        self.file.seek(0)
        self.text = self.file.read().decode(errors="replace")
        sys.stdout.write(self.text)
        return False


# ---------------------------------------------------------------- stock configs


def train_initialize(seed, data, config, steps):
    """strata.torch.initialize and DeepSpeed's loop; (micro-batch losses, weights)."""
    engine, _, _, _ = strata.torch.initialize(model=model(seed), config=config)
    losses = []
    for i in range(steps * GAS):
        loss = engine(**data.items[i]).loss
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    w = engine.fp32_state_dict()
    engine.close()
    return losses, w


def check_stock(seed, name, stock, steps=3):
    data = Data(seed, steps * GAS)
    a = args(T.scratch("hf-ds-stock"), steps, warmup_steps=1)
    st = StrataTrainer(model=model(seed), args=a, train_dataset=data, strata_config=stock)
    st.train()
    got, w = losses_of(st), st.engine.fp32_state_dict()
    hidden = st.model.config.hidden_size
    resolved = (st.engine.config.get("zero_optimization.stage3_prefetch_bucket_size"),
                st.engine.config.get("zero_optimization.stage3_param_persistence_threshold"),
                st.engine.config.get("train_batch_size"), type(st.lr_scheduler).__name__)
    st.engine.close()
    minimal = StrataTrainer(model=model(seed), args=a, train_dataset=data,
                            strata_config={"scheduler": stock["scheduler"]})
    minimal.train()
    want = losses_of(minimal)
    print("%s through StrataTrainer: %s\n  minimal config:           %s" % (name, got, want))
    T.check(len(got) == steps and got == want, "%s trains through StrataTrainer as its scheduler alone does" % name,
            got, want)
    diff = adam_oracle.first_difference(w, minimal.engine.fp32_state_dict())
    T.check(diff is None, "%s through StrataTrainer: the weights of the minimal config" % name, diff, "no difference")
    default = strata.Config(None)
    want_resolved = ((int(0.9 * hidden * hidden), 10 * hidden) if stock["zero_optimization"]["stage"] == 3 else
                     (default.get("zero_optimization.stage3_prefetch_bucket_size"),
                      default.get("zero_optimization.stage3_param_persistence_threshold"))) + (
        H.BATCH * GAS, stock["scheduler"]["type"])
    T.check(resolved == want_resolved, "%s: \"auto\" filled as transformers fills it (stage 3 buckets from the "
            "hidden size %d, the batch, the scheduler)" % (name, hidden), resolved, want_resolved)
    minimal.engine.close()

    T.check_raises(strata.ConfigError, "fill_auto", lambda: strata.torch.initialize(model=model(seed), config=stock),
                   "%s with its \"auto\" values through strata.torch.initialize" % name)
    filled = fill_auto(stock, a, model(seed), num_training_steps=steps)
    got, w = train_initialize(seed, data, filled, steps)
    lean = {"optimizer": {"type": "AdamW", "params": {"lr": LR, "betas": [0.9, 0.999], "eps": 1e-8,
                                                      "weight_decay": 0.0}},
            "scheduler": filled["scheduler"], "gradient_accumulation_steps": GAS, "gradient_clipping": 1.0}
    want, w2 = train_initialize(seed, data, lean, steps)
    print("%s through strata.torch.initialize (fill_auto): %s\n  minimal config: %s" % (name, got, want))
    diff = adam_oracle.first_difference(w, w2)
    T.check(got == want and diff is None, "%s filled by fill_auto trains through strata.torch.initialize as a "
            "minimal config does" % name, (got, diff), (want, "no difference"))
    return filled


def check_cli(filled, python_lines):
    """`strata config check` on the engine's part of the filled files: the same notices; overlap_comm false: the
    same refusal as the Python package."""
    binary = os.environ.get("STRATA_BIN") or os.path.join(os.path.dirname(os.environ.get("STRATA_LIB") or
                                                                            os.path.join(T.BUILD_DIR, "x")), "strata")
    if not os.access(binary, os.X_OK):
        print("skip the CLI's view: no strata binary at %s (set STRATA_BIN)" % binary)
        return
    d = T.scratch("hf-ds-cli")
    lines = []
    for i, doc in enumerate(filled):
        hints = ["zero_optimization.%s" % k for k in doc["zero_optimization"] if "zero_optimization." + k in PLANNED]
        engine_part = {k: v for k, v in doc.items() if k not in strata.config.TRAINER_KEYS}
        path = os.path.join(d, "stock%d.json" % i)
        with open(path, "w") as f:
            json.dump(engine_part, f)
        p = subprocess.run([binary, "config", "check", path], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
        T.check(p.returncode == 0, "strata config check accepts the engine's part of stock config %d" % i,
                (p.returncode, p.stderr), 0)
        said = [line for line in p.stderr.splitlines() if NOTICE in line]
        T.check(sorted(line.split(" = ")[0].split()[-1] for line in said) == sorted(hints),
                "strata config check prints one notice per tuning hint of stock config %d" % i, said, hints)
        lines += said
    # Each process notices a key once: the CLI, a process per file, says what the package said and (the second
    # file's reduce_bucket_size, filled from the hidden size) more.
    T.check(set(python_lines) <= set(lines), "strata config check prints the notices the Python package printed, "
            "word for word", lines, python_lines)
    path = os.path.join(d, "overlap.json")
    with open(path, "w") as f:
        json.dump({"zero_optimization": {"overlap_comm": False}}, f)
    p = subprocess.run([binary, "config", "check", path], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        strata.Config({"zero_optimization": {"overlap_comm": False}})
        python_says = "accepted"
    except strata.ConfigError as e:
        python_says = str(e)
    T.check(p.returncode == 2 and p.stderr.strip() == python_says and "write true (what strata does)" in python_says,
            "overlap_comm = false: the CLI and the package refuse it with the same reason", (p.returncode, p.stderr),
            (2, python_says))


# ---------------------------------------------------------------- the scheduler


def deepspeed_warmup_decay(k, total, warmup, low, high):
    """The lr of optimizer step k (from 0): DeepSpeed's WarmupDecayLR (log warmup) at last_batch_iteration k - 1."""
    it = k - 1
    if it < 0:
        return low
    warmup = max(2, warmup)
    if it < warmup:
        gamma = 1.0 / math.log(warmup) * math.log(it + 1)
    else:
        gamma = max(0.0, float(total - it) / float(max(1.0, total - warmup)))
    return low + (high - low) * gamma


def check_schedule(seed, steps=7, warmup=3):
    data = Data(seed, steps * GAS)
    section = {"type": "WarmupDecayLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                                                   "warmup_num_steps": "auto", "total_num_steps": "auto"}}
    st = StrataTrainer(model=model(seed), args=args(T.scratch("hf-ds-sched"), steps, warmup_steps=warmup,
                                                    max_grad_norm=1e9),
                       train_dataset=data, strata_config={"scheduler": section})
    used = []
    step = st.engine.engine.step

    def recording(*a, **kw):
        used.append(kw["lr"])
        return step(*a, **kw)
    st.engine.engine.step = recording
    st.train()
    schedule = [deepspeed_warmup_decay(k, steps, warmup, 0.0, LR) for k in range(steps)]
    print("lr of each strata step: %s\nDeepSpeed's WarmupDecayLR:  %s" % (used, schedule))
    T.check(used == schedule, "the config's scheduler gives every strata step DeepSpeed's lr", used, schedule)
    once = (st.lr_scheduler.last_epoch, st.engine.lr_scheduler)
    T.check(once == (steps, None), "the schedule is stepped once per step, by Trainer alone (the engine has none)",
            once, (steps, None))

    class ScheduledTrainer(transformers.Trainer):
        """Trainer with its own optimizer (as it makes it for these arguments) under DeepSpeed's schedule."""

        def create_scheduler(self, num_training_steps, optimizer=None):
            if self.lr_scheduler is None:
                self.lr_scheduler = schedulers.WarmupDecayLR(optimizer or self.optimizer, total_num_steps=steps,
                                                             warmup_min_lr=0.0, warmup_max_lr=LR,
                                                             warmup_num_steps=warmup)
            return self.lr_scheduler
    ref = ScheduledTrainer(model=model(seed), args=args(T.scratch("hf-ds-sched-ref"), steps, max_grad_norm=1e9),
                           train_dataset=data)
    ref.train()
    got, want = (losses_of(st), [h["learning_rate"] for h in st.state.log_history if "loss" in h]), (
        losses_of(ref), [h["learning_rate"] for h in ref.state.log_history if "loss" in h])
    T.check(got == want, "losses and logged lrs of Trainer + torch AdamW under the same schedule", got, want)
    diff = adam_oracle.first_difference(st.engine.fp32_state_dict(), {n: p.detach() for n, p in
                                                                     ref.model.named_parameters()})
    T.check(diff is None, "weights bit-identical to Trainer + torch AdamW under the same schedule", diff,
            "no difference")
    st.engine.close()

    # Saved at step 3 and resumed in a new trainer: the schedule goes on where it was.
    run = T.scratch("hf-ds-sched-resume")
    first = StrataTrainer(model=model(seed), args=args(run, steps, warmup_steps=warmup, max_grad_norm=1e9,
                                                       save_strategy="steps", save_steps=3),
                          train_dataset=data, strata_config={"scheduler": section})
    first.train()
    end = first.engine.fp32_state_dict()
    first.engine.close()
    second = StrataTrainer(model=model(seed + 1), args=args(run, steps, warmup_steps=warmup, max_grad_norm=1e9),
                           train_dataset=data, strata_config={"scheduler": section})
    resumed = []
    step2 = second.engine.engine.step
    second.engine.engine.step = lambda *a, **kw: (resumed.append(kw["lr"]), step2(*a, **kw))[1]
    second.train(resume_from_checkpoint=os.path.join(run, "checkpoint-3"))
    diff = adam_oracle.first_difference(second.engine.fp32_state_dict(), end)
    T.check(resumed == schedule[3:] and diff is None, "resumed at step 3, the config's schedule and the weights go on "
            "as in the uninterrupted run", (resumed, diff), (schedule[3:], "no difference"))
    second.engine.close()

    a = T.scratch("hf-ds-sched-refused")
    T.check_raises(strata.ConfigError, "lr_scheduler_type = 'cosine' would be ignored", lambda: StrataTrainer(
        model=model(seed), args=args(a, steps, lr_scheduler_type="cosine"), train_dataset=data,
        strata_config={"scheduler": section}), "lr_scheduler_type beside the config's scheduler")
    T.check_raises(strata.ConfigError, "warmup_steps = 2 would be ignored", lambda: StrataTrainer(
        model=model(seed), args=args(a, steps, warmup_steps=2), train_dataset=data,
        strata_config={"scheduler": {"type": "WarmupLR", "params": {"warmup_max_lr": "auto"}}}),
        "a warmup the config's scheduler has no place for")
    fixed = {"type": "WarmupDecayLR", "params": {"warmup_max_lr": "auto", "total_num_steps": 100,
                                                 "warmup_num_steps": "auto"}}
    late = StrataTrainer(model=model(seed), args=args(a, steps), train_dataset=data, strata_config={"scheduler": fixed})
    T.check_raises(strata.ConfigError, "total_num_steps = 100 but TrainingArguments say max_steps", late.train,
                   "a total_num_steps that disagrees with the run's steps")
    late.engine.close()


def main():
    seed = T.seed()
    with Stderr() as err:
        filled = [check_stock(seed, "ZeRO-2 offload", ZERO2), check_stock(seed, "ZeRO-3 offload", ZERO3)]
    notices = [line for line in err.text.splitlines() if NOTICE in line]
    counts = {key: sum(key + " = " in line for line in notices) for key in PLANNED}
    T.check(all(n == 1 for n in counts.values()) and len(notices) == len(PLANNED),
            "each tuning hint of the stock configs printed one line for the whole run", counts,
            dict.fromkeys(PLANNED, 1))
    T.check("not implement" not in err.text, "no key of the stock configs is refused or ignored as not implemented",
            [line for line in err.text.splitlines() if "not implement" in line], [])
    check_cli(filled, notices)
    check_schedule(seed)
    T.done()


if __name__ == "__main__":
    main()
