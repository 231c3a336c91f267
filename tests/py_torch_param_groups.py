"""strata's parameter groups from PyTorch: a torch.optim.AdamW or Adam of several param groups, each with its own lr,
weight_decay, betas and eps, trains through strata.torch.initialize as torch.optim trains it, bit for bit.

The oracle is torch.optim with the same groups, on fresh weights and data each run: bit for bit where this torch's
CPU sqrt is IEEE's, else (PyPI's MKL on AVX-512: python/strata/torch/_torch_formula.py) within WEIGHT_TOL, and the
test says which. (torch's fused CPU Adam, whose sqrt is IEEE's, is no exact oracle there either: its kernel rounds
a few elements otherwise than torch's other paths, in about half the runs of this test.)
1. Two groups (the weights, and the biases: a group boundary inside every module) and three (one per layer, each
   with its own lr, weight_decay, betas and eps), AdamW and Adam, with the parameters and the optimizer state in
   device memory, host memory and on NVMe: the weights are torch's; engine.optimizer.param_groups are torch's groups
   in order; strata's groups hold their values and their parameters. An empty group trains too, and torch 2's
   Adam(decoupled_weight_decay=True) is AdamW.
2. A LambdaLR with one lambda per group, built on the user's optimizer, drives each group from its own base lr: the
   lr each strata group steps with is torch's, step by step, and so are the weights.
3. A script writing param_groups[1]["weight_decay"] and param_groups[0]["lr"] between steps drives those groups from
   the next step on, as in torch.
4. save_checkpoint, then load_checkpoint into a new engine and go on, ends where the uninterrupted run ends, bit for
   bit, with the scheduler's lrs and a weight_decay written before the save restored; a checkpoint of other groups is
   refused naming them.
5. DeepSpeed's way: the config's "optimizer" section alone is one group, as before; model_parameters dicts are groups
   whose keys override the config's values.
6. Refused before the model moves into strata, naming the group and the key or the parameter: a key torch's Adam does
   not have, lr, betas, eps or weight_decay out of range, a parameter in two groups, groups that differ in
   decoupled_weight_decay, a list mixing dicts and tensors; and writes of a group's other keys after initialize.
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "helpers"))
import strata_test as T  # noqa: E402
import adam_oracle  # noqa: E402

torch = T.require_torch()
import strata  # noqa: E402
import strata.torch  # noqa: E402
from strata.torch._torch_formula import torch_sqrt_differs  # noqa: E402

STEPS = 4
WEIGHT_TOL = 1e-7  # a unit of MKL's sqrt, through 4 steps (tests/adam_vs_torch holds strata to it too)
LRS = torch.optim.lr_scheduler
HP = dict(lr=3e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
DECOUPLED_KEY = "decoupled_weight_decay" in torch.optim.Adam([torch.nn.Parameter(torch.zeros(1))]).defaults


EXACT = torch_sqrt_differs() == 0
WORST = []  # without EXACT: each comparison's largest weight difference


def model(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 16), torch.nn.Tanh(),
                               torch.nn.Linear(16, 4))


def two(m):
    """The weights and the biases: every module holds parameters of both groups."""
    return [{"params": [layer.weight for layer in m[::2]], "lr": 3e-3, "weight_decay": 0.1},
            {"params": [layer.bias for layer in m[::2]], "lr": 1e-2, "weight_decay": 0.0}]


def three(m):
    """One group per layer, each with its own lr, weight_decay, betas and eps."""
    return [{"params": list(m[0].parameters()), "lr": 3e-3, "weight_decay": 0.1, "betas": (0.9, 0.999), "eps": 1e-8},
            {"params": list(m[2].parameters()), "lr": 1e-2, "weight_decay": 0.0, "betas": (0.8, 0.95), "eps": 1e-6},
            {"params": list(m[4].parameters()), "lr": 5e-4, "weight_decay": 0.3, "betas": (0.95, 0.98),
             "eps": 1e-7}]


def with_empty(m):
    return [{"params": list(m.parameters()), "lr": 4e-3}, {"params": [], "lr": 0.5, "weight_decay": 0.2}]


LAYOUTS = {"two groups": two, "three groups": three}


def batches(seed):
    g = torch.Generator().manual_seed(seed + 1)
    return [(torch.randn(8, 6, generator=g), torch.randn(8, 4, generator=g)) for _ in range(STEPS)]


def config(where):
    if where == "device":
        tier = {"device": "none"}
    elif where == "host":
        tier = {"device": "cpu"}
    else:
        tier = {"device": "nvme", "nvme_path": T.scratch("py_torch_param_groups-nvme")}
    return {"zero_optimization": {"stage": 3, "offload_param": dict(tier), "offload_optimizer": dict(tier)}}


def run_torch(seed, cls, groups_of, between=None, sched_of=None, **kw):
    """(weights, lrs of each step per group) of torch.optim."""
    m = model(seed)
    opt = cls(groups_of(m), **kw)
    sched = sched_of(opt) if sched_of else None
    lrs = []
    for step, (x, y) in enumerate(batches(seed)):
        if between:
            between(step, opt)
        torch.nn.functional.mse_loss(m(x), y).backward()
        lrs.append([g["lr"] for g in opt.param_groups])
        opt.step()
        opt.zero_grad(set_to_none=True)
        if sched:
            sched.step()
    return {n: p.detach().clone() for n, p in m.named_parameters()}, lrs


def train(engine, seed, between=None, steps=range(STEPS)):
    """Trains engine on the steps' batches; the lrs strata's groups stepped with, per step."""
    lrs = []
    data = batches(seed)
    for step in steps:
        if between:
            between(step, engine.optimizer)
        x, y = data[step]
        engine.backward(torch.nn.functional.mse_loss(engine(x), y))
        engine.step()
        lrs.append([engine.engine.group(i)["lr"] for i in range(engine.engine.group_count())])
    return lrs


def same_weights(got, want, what):
    if EXACT:
        diff = adam_oracle.first_difference(got, want)
        return T.check(diff is None, "%s: weights bit-identical to torch.optim's (torch %s)" % (
            what, torch.__version__), diff, "no difference")
    worst = max(float((got[n] - w).abs().max()) for n, w in want.items())
    WORST.append(worst)
    return T.check(worst <= WEIGHT_TOL, "%s: weights within %g of torch.optim's (this torch's CPU sqrt is not IEEE's)"
                   % (what, WEIGHT_TOL), worst, "<= %g" % WEIGHT_TOL)


def check_groups(engine, m, groups, what):
    """engine.optimizer.param_groups and strata's groups hold torch's groups, in order."""
    keys = ("lr", "weight_decay", "betas", "eps")
    want = [{k: (tuple(g[k]) if k == "betas" else g[k]) for k in keys} for g in groups]
    shown = [{k: (tuple(g[k]) if k == "betas" else g[k]) for k in keys} for g in engine.optimizer.param_groups]
    T.check(shown == want, "%s: engine.optimizer.param_groups are torch's groups in order" % what, shown, want)
    held = [engine.engine.group(i) for i in range(engine.engine.group_count())]
    held = [{"lr": h["lr"], "weight_decay": h["weight_decay"], "betas": (h["beta1"], h["beta2"]), "eps": h["eps"]}
            for h in held]
    T.check(held == want, "%s: strata's groups hold each torch group's values" % what, held, want)
    names = {id(p): n for n, p in m.named_parameters()}
    got = {names[id(p)]: engine.engine.param_group(engine._pids[id(p)]) for p in m.parameters()}
    members = {names[id(p)]: i for i, g in enumerate(groups) for p in g["params"]}
    T.check(got == members, "%s: every parameter is in its torch group's strata group" % what, got, members)


def groups_exact(seed):
    print("oracle: torch.optim, %s" % ("bit-identical" if EXACT else "within %g (torch's CPU sqrt is not IEEE's "
                                                                     "here)" % WEIGHT_TOL))
    for where in ("device", "host", "nvme"):
        for layout, groups_of in LAYOUTS.items():
            for cls in (torch.optim.AdamW, torch.optim.Adam):
                what = "%s, %s, %s" % (cls.__name__, layout, where)
                m = model(seed)
                opt = cls(groups_of(m), **HP)
                engine = strata.torch.initialize(model=m, optimizer=opt, config=config(where), device="cpu")[0]
                check_groups(engine, m, opt.param_groups, what)
                train(engine, seed)
                same_weights(engine.fp32_state_dict(), run_torch(seed, cls, groups_of, **HP)[0], what)
                engine.close()
    variants = [("an empty group", torch.optim.AdamW, with_empty, HP)]
    if DECOUPLED_KEY:
        variants.append(("Adam(decoupled_weight_decay=True) is AdamW", torch.optim.Adam, three,
                         dict(HP, decoupled_weight_decay=True)))
    for what, cls, groups_of, kw in variants:
        m = model(seed)
        engine = strata.torch.initialize(model=m, optimizer=cls(groups_of(m), **kw), config={}, device="cpu")[0]
        train(engine, seed)
        same_weights(engine.fp32_state_dict(), run_torch(seed, cls, groups_of, **kw)[0], what)
        engine.close()


LAMBDAS = [lambda s: 0.5 ** s, lambda s: 1.0 / (s + 1), lambda s: 1.0 - 0.2 * s]


def scheduler_drives_groups(seed):
    want_w, want_lrs = run_torch(seed, torch.optim.AdamW, three, sched_of=lambda o: LRS.LambdaLR(o, LAMBDAS), **HP)
    m = model(seed)
    opt = torch.optim.AdamW(three(m), **HP)
    sched = LRS.LambdaLR(opt, LAMBDAS)
    engine, optimizer, _, returned = strata.torch.initialize(model=m, optimizer=opt, lr_scheduler=sched, config={},
                                                             device="cpu")
    got_lrs = train(engine, seed)
    T.check(got_lrs == want_lrs, "LambdaLR with a lambda per group: each strata group steps with torch's lr, step by "
            "step", got_lrs, want_lrs)
    T.check(len({tuple(lr) for lr in want_lrs}) == STEPS and len(set(want_lrs[1])) == 3,
            "the lrs change at every step and differ between groups (the check means something)", want_lrs)
    T.check(returned is sched and sched.optimizer is optimizer, "initialize returns the user's LambdaLR, now driving "
            "engine.optimizer", type(sched.optimizer).__name__, "engine.optimizer")
    same_weights(engine.fp32_state_dict(), want_w, "LambdaLR with a lambda per group")
    engine.close()


def writes(step, opt):
    """Between steps 1 and 2 a script changes group 1's weight decay and group 0's lr."""
    if step == 2:
        opt.param_groups[1]["weight_decay"] = 0.5
        opt.param_groups[0]["lr"] = 7e-4


def script_writes(seed):
    want_w, want_lrs = run_torch(seed, torch.optim.AdamW, three, between=writes, **HP)
    m = model(seed)
    engine = strata.torch.initialize(model=m, optimizer=torch.optim.AdamW(three(m), **HP), config={},
                                     device="cpu")[0]
    got_lrs = train(engine, seed, between=writes)
    decay = [engine.engine.group(i)["weight_decay"] for i in range(3)]
    T.check(decay == [0.1, 0.5, 0.3] and got_lrs == want_lrs,
            "param_groups[1]['weight_decay'] and [0]['lr'] written: strata's groups step with them",
            (decay, got_lrs), ([0.1, 0.5, 0.3], want_lrs))
    same_weights(engine.fp32_state_dict(), want_w, "param_groups[1]['weight_decay'] written between steps")
    # engine.optimizer.load_state_dict writes each saved group's keys into its group
    saved = engine.optimizer.state_dict()
    saved["param_groups"][2]["weight_decay"] = 0.125
    engine.optimizer.load_state_dict(saved)
    T.check(engine.optimizer.param_groups[2]["weight_decay"] == 0.125, "engine.optimizer.load_state_dict: group 2's "
            "weight_decay is the state's", engine.optimizer.param_groups[2]["weight_decay"], 0.125)
    saved["param_groups"] = saved["param_groups"][:2]
    T.check_raises(strata.InvalidArgument, "holds 2 param groups; strata's optimizer has 3", lambda:
                   engine.optimizer.load_state_dict(saved), "engine.optimizer.load_state_dict with 2 of 3 groups")
    engine.close()


def resume(seed):
    lambdas = lambda opt: LRS.LambdaLR(opt, LAMBDAS[:len(opt.param_groups)])  # noqa: E731
    directory = T.scratch("py_torch_param_groups-ckpt")

    def make(s, groups_of=three):
        m = model(s)
        return strata.torch.initialize(model=m, optimizer=torch.optim.AdamW(groups_of(m), **HP), config=config("host"),
                                       lr_scheduler=lambdas, device="cpu")[0]

    def decay(step, opt):
        if step == 1:
            opt.param_groups[2]["weight_decay"] = 0.05

    first = make(seed)
    train(first, seed, decay, steps=range(2))
    saved_lrs = [g["lr"] for g in first.optimizer.param_groups]
    path = first.save_checkpoint(directory)
    train(first, seed, steps=range(2, STEPS))
    want = first.fp32_state_dict()
    first.close()

    second = make(seed + 1)
    second.load_checkpoint(directory)
    shown = ([g["lr"] for g in second.optimizer.param_groups], second.optimizer.param_groups[2]["weight_decay"])
    T.check(shown == (saved_lrs, 0.05), "load_checkpoint restores each group's lr and weight_decay", shown,
            (saved_lrs, 0.05))
    train(second, seed, steps=range(2, STEPS))
    diff = adam_oracle.first_difference(second.fp32_state_dict(), want)
    T.check(diff is None, "save -> load into a new engine -> continue: bit-identical to the uninterrupted run, with "
            "three groups", diff, "no difference")
    second.close()

    other = make(seed, two)
    T.check_raises(strata.StrataError, "3 parameter groups, this engine 2", lambda: other.load_checkpoint(path),
                   "loading a checkpoint of three groups into an engine of two")
    other.close()


def deepspeed_way(seed):
    section = {"type": "AdamW", "params": {"lr": HP["lr"], "betas": list(HP["betas"]), "eps": HP["eps"],
                                           "weight_decay": HP["weight_decay"]}}
    m = model(seed)
    engine = strata.torch.initialize(model=m, config={"optimizer": section}, device="cpu")[0]
    T.check((len(engine.optimizer.param_groups), engine.engine.group_count()) == (1, 1),
            "the config's optimizer section alone: one group", (len(engine.optimizer.param_groups),
                                                                engine.engine.group_count()), (1, 1))
    train(engine, seed)
    same_weights(engine.fp32_state_dict(), run_torch(seed, torch.optim.AdamW, lambda m: m.parameters(), **HP)[0],
                 "the config's optimizer section alone")
    engine.close()

    def dicts(m):  # the first group's params a generator, as model.parameters() is
        return [{"params": (layer.weight for layer in m[::2]), "weight_decay": 0.2},
                {"params": [layer.bias for layer in m[::2]], "lr": 1e-2, "betas": (0.85, 0.99)}]
    m = model(seed)
    engine = strata.torch.initialize(model=m, model_parameters=dicts(m), config={"optimizer": section},
                                     device="cpu")[0]
    check_groups(engine, m, [dict(HP, **dict(g, params=list(g["params"]))) for g in dicts(m)],
                 "model_parameters dicts over the config's section")
    train(engine, seed)
    same_weights(engine.fp32_state_dict(), run_torch(seed, torch.optim.AdamW, dicts, **HP)[0],
                 "model_parameters dicts over the config's optimizer section")
    engine.close()


def refused(seed):
    def optimizer_case(what, fragment, make, cls=torch.optim.AdamW):
        m = model(seed)
        opt = cls(make(m), **HP)
        T.check_raises(strata.InvalidArgument, fragment, lambda: strata.torch.initialize(
            model=m, optimizer=opt, config={}, device="cpu"), what)
        T.check(all(p.numel() for p in m.parameters()), "%s: refused before the model moved into strata" % what)

    def second(**keys):
        return lambda m: [{"params": list(m[0].parameters())}, dict({"params": list(m[2].parameters())}, **keys),
                          {"params": list(m[4].parameters())}]
    where = "the optimizer's param_groups[1]"
    optimizer_case("a key torch's Adam does not have", "%s has the key 'nesterov'" % where, second(nesterov=True))
    for key, value, fragment in (("lr", -1.0, "['lr'] = -1.0 is out of range [0, 1e+06]"),
                                 ("lr", 2e6, "['lr'] = 2000000.0 is out of range"),
                                 ("lr", float("nan"), "['lr'] = nan is out of range"),
                                 ("weight_decay", -0.1, "['weight_decay'] = -0.1 is out of range"),
                                 ("eps", 0.0, "['eps'] = 0.0 is out of range (0, 1]"),
                                 ("betas", (1.0, 0.999), "['betas'][0] = 1.0 is out of range [0, 1)"),
                                 ("betas", (0.9,), "['betas'] = (0.9,): betas are two numbers")):
        optimizer_case("%s = %r in group 1" % (key, value), where + fragment, second(**{key: value}))
    optimizer_case("decoupled_weight_decay in one group only", "decoupled_weight_decay",
                   second(decoupled_weight_decay=True), torch.optim.Adam)

    m = model(seed)
    opt = torch.optim.AdamW([{"params": list(m[0].parameters())}, {"params": list(m[2].parameters())}], **HP)
    opt.param_groups[1]["params"].append(m[0].weight)  # torch checked its groups when they were made, not since
    T.check_raises(strata.InvalidArgument, "param_groups[1] holds 0.weight, which the optimizer's param_groups[0] "
                   "holds too", lambda: strata.torch.initialize(model=m, optimizer=opt, config={}, device="cpu"),
                   "a parameter in two of the optimizer's groups")
    m = model(seed)
    T.check_raises(strata.InvalidArgument, "model_parameters[1] holds 4.bias, which model_parameters[0] holds too",
                   lambda: strata.torch.initialize(model=m, config={}, device="cpu", model_parameters=[
                       {"params": list(m.parameters())}, {"params": [m[4].bias], "lr": 0.1}]),
                   "a parameter in two model_parameters groups")
    T.check_raises(strata.InvalidArgument, "mixes param group dicts and tensors", lambda: strata.torch.initialize(
        model=m, config={}, device="cpu", model_parameters=[{"params": list(m[0].parameters())}] +
        list(m[2].parameters()) + list(m[4].parameters())), "model_parameters mixing dicts and tensors")
    T.check(all(p.numel() for p in m.parameters()), "refused model_parameters leave the model as it was")

    m = model(seed)
    engine = strata.torch.initialize(model=m, optimizer=torch.optim.AdamW(three(m), **HP), config={}, device="cpu")[0]
    group = engine.optimizer.param_groups[1]
    for key, value, fragment in (("eps", 1e-3, "param_groups[1]['eps'] = 0.001 is not honoured"),
                                 ("betas", (0.9, 0.9), "param_groups[1]['betas'] = (0.9, 0.9) is not honoured"),
                                 ("weight_decay", float("inf"), "param_groups[1]['weight_decay'] = inf is not allowed"),
                                 ("lr", -0.5, "param_groups[1]['lr'] = -0.5 is not allowed")):
        def write(key=key, value=value):
            group[key] = value
        T.check_raises(strata.InvalidArgument, fragment, write, "engine.optimizer.param_groups[1][%r] = %r" % (
            key, value))
    T.check((group["eps"], group["weight_decay"], group["lr"]) == (1e-6, 0.0, 1e-2),
            "a refused write leaves the group as it was", (group["eps"], group["weight_decay"], group["lr"]),
            (1e-6, 0.0, 1e-2))
    engine.close()


def main():
    seed = T.seed()
    groups_exact(seed)
    scheduler_drives_groups(seed)
    script_writes(seed)
    resume(seed)
    deepspeed_way(seed)
    refused(seed)
    if WORST:
        print("largest weight difference from torch.optim: %.3g (allowed %g)" % (max(WORST), WEIGHT_TOL))
    T.done()


if __name__ == "__main__":
    main()
