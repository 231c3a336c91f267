"""strata.torch.schedulers gives DeepSpeed's learning rates: for WarmupLR, WarmupDecayLR, WarmupCosineLR and
OneCycle, the lr of the optimizer's step k (from 0) is DeepSpeed's formula at last_batch_iteration = k - 1 (its
value at construction for k = 0), checked against the formulas written out here and against values worked by
hand; a resumed scheduler (state_dict) goes on identically; a wrong section raises ConfigError naming the type or
parameter and what is allowed; and through strata.torch.initialize, a step the schedule gives lr 0 (DeepSpeed's
warmups start there) leaves the weights where they were."""
import math
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "helpers"))
import strata_test as T  # noqa: E402

torch = T.require_torch()

import strata  # noqa: E402
from strata.torch import schedulers  # noqa: E402


def optimizer(lr=0.1, groups=1, cls=None):
    params = [{"params": [torch.nn.Parameter(torch.zeros(2))]} for _ in range(groups)]
    return (cls or torch.optim.SGD)(params, lr=lr)


def lrs_by_step(section, steps, opt=None):
    """The lr of each optimizer step, driven as the engine drives it (optimizer.step(), then scheduler.step())."""
    opt = opt or optimizer()
    sched = schedulers.build(section, opt)
    out = []
    for _ in range(steps):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out, sched, opt


# DeepSpeed's formulas (deepspeed/runtime/lr_schedules.py), as functions of last_batch_iteration `it`.

def warmup_gamma(it, warmup, kind):
    warmup = max(2, warmup)
    return math.log(it + 1) / math.log(warmup) if kind == "log" else it / warmup


def ds_warmup_lr(it, low=0.0, high=0.001, warmup=1000, kind="log"):
    if it < 0:
        return low
    gamma = warmup_gamma(it, warmup, kind) if it < max(2, warmup) else 1.0
    return low + (high - low) * gamma


def ds_warmup_decay_lr(it, total, low=0.0, high=0.001, warmup=1000, kind="log"):
    if it < 0:
        return low
    w = max(2, warmup)
    gamma = warmup_gamma(it, warmup, kind) if it < w else max(0.0, (total - it) / max(1.0, total - w))
    return low + (high - low) * gamma


def ds_warmup_cosine_lr(it, base, total, min_ratio=0.0, warmup=1000, cos_min=0.0001, kind="log"):
    if it < 0:
        return 0.0
    w = max(2, warmup)
    if it < w:
        return base * (min_ratio + warmup_gamma(it, warmup, kind) * (1 - min_ratio))
    ratio = (1 + math.cos(math.pi * (it - w + 1) / (total - w))) / 2
    return base * max(0.0, cos_min + (1 - cos_min) * ratio)


def ds_one_cycle_lr(it, low, high, first=2000, second=None, decay_rate=0.0, decay_step=0):
    total = first + (second if second is not None else first)
    if it < total:
        b = it + 1
        x = 1.0 + b / total - math.floor(1 + b / total)
        ratio = first / total
        scale = x / ratio if x <= ratio else (x - 1) / (ratio - 1)
        return low + (high - low) * scale
    if decay_step == 0 or decay_rate == 0:
        return low
    return low / (1 + decay_rate * (it - total + 1) / decay_step)


def close(a, b):
    return abs(a - b) <= 1e-12 + 1e-9 * abs(b)


def check_sequence(name, section, steps, formula, opt=None):
    got, sched, opt = lrs_by_step(section, steps, opt)
    want = [formula(k - 1) for k in range(steps)]
    bad = [(k, g, w) for k, (g, w) in enumerate(zip(got, want)) if not close(g, w)]
    T.check(not bad, "%s: the lr of each of %d steps is DeepSpeed's (first wrong: step, got, want)" % (name, steps),
            bad[:1], "none wrong")
    return got, sched, opt


def check_formulas():
    # WarmupLR: DeepSpeed's defaults (log warmup over 1000 steps to 0.001), then a linear one worked by hand.
    check_sequence("WarmupLR defaults", {"type": "WarmupLR"}, 1200, ds_warmup_lr)
    got, _, _ = check_sequence("WarmupLR linear", {"type": "WarmupLR", "params": {
        "warmup_min_lr": 0.01, "warmup_max_lr": 0.05, "warmup_num_steps": 4, "warmup_type": "linear"}}, 8,
        lambda it: ds_warmup_lr(it, 0.01, 0.05, 4, "linear"))
    hand = [0.01, 0.01, 0.02, 0.03, 0.04, 0.05, 0.05, 0.05]
    T.check(all(close(g, h) for g, h in zip(got, hand)), "WarmupLR linear: the values worked by hand", got, hand)

    check_sequence("WarmupDecayLR", {"type": "WarmupDecayLR", "params": {
        "total_num_steps": 50, "warmup_max_lr": 0.02, "warmup_num_steps": 10}}, 60,
        lambda it: ds_warmup_decay_lr(it, 50, 0.0, 0.02, 10, "log"))
    got, _, _ = check_sequence("WarmupDecayLR linear", {"type": "WarmupDecayLR", "params": {
        "total_num_steps": 6, "warmup_max_lr": 0.1, "warmup_num_steps": 2, "warmup_type": "linear"}}, 9,
        lambda it: ds_warmup_decay_lr(it, 6, 0.0, 0.1, 2, "linear"))
    hand = [0.0, 0.0, 0.05, 0.1, 0.075, 0.05, 0.025, 0.0, 0.0]
    T.check(all(close(g, h) for g, h in zip(got, hand)), "WarmupDecayLR linear: the values worked by hand", got, hand)

    # WarmupCosineLR scales the optimizer's own lr (0.1 here).
    check_sequence("WarmupCosineLR", {"type": "WarmupCosineLR", "params": {
        "total_num_steps": 40, "warmup_num_steps": 8, "warmup_min_ratio": 0.1, "cos_min_ratio": 0.05}}, 45,
        lambda it: ds_warmup_cosine_lr(it, 0.1, 40, 0.1, 8, 0.05, "log"))
    got, _, _ = check_sequence("WarmupCosineLR linear", {"type": "WarmupCosineLR", "params": {
        "total_num_steps": 6, "warmup_num_steps": 2, "cos_min_ratio": 0.0, "warmup_type": "linear"}}, 8,
        lambda it: ds_warmup_cosine_lr(it, 0.1, 6, 0.0, 2, 0.0, "linear"))
    hand = [0.0, 0.0, 0.05, 0.1 * (1 + math.cos(math.pi / 4)) / 2, 0.05, 0.1 * (1 + math.cos(3 * math.pi / 4)) / 2,
            0.0, 0.1 * (1 + math.cos(5 * math.pi / 4)) / 2]
    T.check(all(close(g, h) for g, h in zip(got, hand)), "WarmupCosineLR linear: the values worked by hand", got, hand)

    check_sequence("OneCycle", {"type": "OneCycle", "params": {
        "cycle_min_lr": 0.01, "cycle_max_lr": 0.1, "cycle_first_step_size": 5, "cycle_second_step_size": 3,
        "decay_lr_rate": 0.5, "decay_step_size": 2, "cycle_momentum": False}}, 20,
        lambda it: ds_one_cycle_lr(it, 0.01, 0.1, 5, 3, 0.5, 2))
    got, _, _ = check_sequence("OneCycle by hand", {"type": "OneCycle", "params": {
        "cycle_min_lr": 0.0, "cycle_max_lr": 0.4, "cycle_first_step_size": 2, "cycle_momentum": False}}, 7,
        lambda it: ds_one_cycle_lr(it, 0.0, 0.4, 2))
    hand = [0.0, 0.2, 0.4, 0.2, 0.0, 0.0, 0.0]
    T.check(all(close(g, h) for g, h in zip(got, hand)), "OneCycle: the values worked by hand", got, hand)

    # OneCycle's momentum, as DeepSpeed cycles it: beta1 from cycle_min_mom at construction, then inversely to the
    # lr between cycle_max_mom and cycle_min_mom; beta2 becomes 0.99.
    opt = optimizer(cls=torch.optim.AdamW)
    sched = schedulers.build({"type": "OneCycle", "params": {"cycle_min_lr": 0.0, "cycle_max_lr": 0.4,
                                                             "cycle_first_step_size": 2}}, opt)
    betas = []
    for _ in range(5):
        betas.append(opt.param_groups[0]["betas"])
        opt.step()
        sched.step()
    want = [(0.8, 0.99), (0.85, 0.99), (0.8, 0.99), (0.85, 0.99), (0.9, 0.99)]
    T.check(all(close(g[0], w[0]) and g[1] == w[1] for g, w in zip(betas, want)), "OneCycle: DeepSpeed's betas",
            betas, want)

    # Per-group lists, as DeepSpeed's _format_param takes them.
    opt = optimizer(groups=2)
    schedulers.build({"type": "WarmupLR", "params": {"warmup_min_lr": [0.1, 0.2], "warmup_max_lr": [0.3, 0.4],
                                                     "warmup_num_steps": 2, "warmup_type": "linear"}}, opt)
    got = [g["lr"] for g in opt.param_groups]
    T.check(got == [0.1, 0.2], "per-group warmup_min_lr sets each group", got, [0.1, 0.2])


def check_resume():
    section = {"type": "WarmupCosineLR", "params": {"total_num_steps": 30, "warmup_num_steps": 5}}
    straight, _, _ = lrs_by_step(section, 20)
    first, sched, _ = lrs_by_step(section, 12)
    state = sched.state_dict()
    opt = optimizer()
    resumed = schedulers.build(section, opt)
    resumed.load_state_dict(state)
    for _ in range(7):  # steps 12..18 done: the optimizer's next step is 19
        resumed.step()
    T.check(close(opt.param_groups[0]["lr"], straight[19]) and resumed.last_batch_iteration == 18,
            "a scheduler loaded from state_dict goes on as if never stopped (lr of step 19, iteration)",
            (opt.param_groups[0]["lr"], resumed.last_batch_iteration), (straight[19], 18))


def check_errors():
    opt = optimizer()

    def build(section):
        return lambda: schedulers.build(section, opt)

    T.check_raises(strata.ConfigError, "WarmupCosine", build({"type": "WarmupCosine"}), "an unknown type")
    T.check_raises(strata.ConfigError, "WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle",
                   build({"type": "WarmupCosine"}), "an unknown type lists the allowed ones")
    T.check_raises(strata.ConfigError, "did you mean WarmupCosineLR", build({"type": "WarmupCosine"}),
                   "an unknown type's suggestion")
    T.check_raises(strata.ConfigError, "warmup_steps", build({"type": "WarmupLR", "params": {"warmup_steps": 10}}),
                   "an unknown param")
    T.check_raises(strata.ConfigError, "did you mean warmup_num_steps",
                   build({"type": "WarmupLR", "params": {"warmup_steps": 10}}), "an unknown param's suggestion")
    T.check_raises(strata.ConfigError, "allowed: warmup_min_lr, warmup_max_lr, warmup_num_steps, warmup_type",
                   build({"type": "WarmupLR", "params": {"warmup_steps": 10}}), "an unknown param lists the allowed")
    T.check_raises(strata.ConfigError, "total_num_steps is required by WarmupDecayLR",
                   build({"type": "WarmupDecayLR"}), "a missing required param")
    T.check_raises(strata.ConfigError, "warmup_type = 'cosine'",
                   build({"type": "WarmupLR", "params": {"warmup_type": "cosine"}}), "an unknown warmup_type")
    T.check_raises(strata.ConfigError, "warmup_num_steps = -1",
                   build({"type": "WarmupLR", "params": {"warmup_num_steps": -1}}), "a negative step count")
    T.check_raises(strata.ConfigError, "warmup_max_lr = 'big'",
                   build({"type": "WarmupLR", "params": {"warmup_max_lr": "big"}}), "an lr that is not a number")
    T.check_raises(strata.ConfigError, "total_num_steps = 10 must exceed warmup_num_steps",
                   build({"type": "WarmupCosineLR", "params": {"total_num_steps": 10, "warmup_num_steps": 10}}),
                   "a cosine with no steps to run over")
    T.check_raises(strata.ConfigError, "cycle_first_stair_count = 4 is not implemented",
                   build({"type": "OneCycle", "params": {"cycle_min_lr": 0.1, "cycle_max_lr": 1,
                                                         "cycle_first_stair_count": 4}}), "a stair count")
    T.check_raises(strata.ConfigError, "3 values but the optimizer has 1 param groups",
                   build({"type": "WarmupLR", "params": {"warmup_max_lr": [1, 2, 3]}}), "a per-group list too long")
    T.check_raises(strata.ConfigError, "scheduler.typ ", build({"type": "WarmupLR", "typ": 1}), "an unknown key")
    # The section as strata.Config checks it and hands it over.
    cfg = strata.Config({"scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 3}}})
    sched = schedulers.build(cfg, opt)
    T.check(isinstance(sched, schedulers.WarmupLR) and sched.warmup_num_steps == 3,
            "build takes a strata.Config's scheduler section", type(sched).__name__, "WarmupLR")
    T.check(schedulers.build(strata.Config({}), opt) is None, "a config without a scheduler builds none")


def check_engine_lr_zero():
    """The config's scheduler drives strata's steps: WarmupLR (linear, from 0 over 2 steps) gives steps 0 and 1
    lr 0, so AdamW without weight decay must leave every weight as it was, and step 2 (lr 0.05) moves them."""
    import strata.torch
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1))
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    cfg = {"train_micro_batch_size_per_gpu": 1,
           "optimizer": {"type": "AdamW", "params": {"lr": 0.1, "weight_decay": 0.0}},
           "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0.0, "warmup_max_lr": 0.1,
                                                        "warmup_num_steps": 2, "warmup_type": "linear"}},
           "strata": {"backend": "host"}}
    engine = strata.torch.initialize(model=model, config=cfg)[0]
    lrs, moved = [], []
    for _ in range(3):
        lrs.append(engine.get_lr()[0])
        engine.backward(engine(torch.randn(2, 4)).pow(2).sum())
        engine.step()
        after = engine.fp32_state_dict()
        moved.append(max(float((after[k] - before[k]).abs().max()) for k in before))
    engine.close()
    T.check(lrs == [0.0, 0.0, 0.05], "strata.torch: the scheduler from the config sets the steps' lr", lrs,
            [0.0, 0.0, 0.05])
    T.check(moved[0] == 0.0 and moved[1] == 0.0 and moved[2] > 0.0,
            "strata.torch: steps at lr 0 leave the weights as they were; the step at lr 0.05 moves them (max |change| "
            "after each step)", moved, "[0, 0, > 0]")


T.seed()
check_formulas()
check_resume()
check_errors()
check_engine_lr_zero()
T.done()
