"""strata.torch.initialize as deepspeed.initialize: its arguments, each honoured or refused with the reason, and its
4-tuple (engine, optimizer, training data loader, lr scheduler).

Honoured, each against an oracle: a torch.optim.AdamW / Adam passed as optimizer= trains bit-identically to the same
hyperparameters in the config's "optimizer" section (and to torch itself); args.deepspeed_config is read as the
config; training_data + collate_fn give a DataLoader of train_micro_batch_size_per_gpu samples over a
DistributedSampler, the same batches as torch's own loader built that way; lr_scheduler is returned. Refused with a
message: a model as the first positional argument (DeepSpeed's is args), mpu, mesh_param, a non-default
distributed_port, a config both in args and config=, an optimizer both as optimizer= and in the config, optimizers
strata does not run, amsgrad (in any param group), collate_fn without data, args.local_rank that is not MPI's.
Param groups that differ are honoured: tests/py_torch_param_groups.py.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "helpers"))
import strata_test as T  # noqa: E402
import adam_oracle  # noqa: E402

torch = T.require_torch()
import strata  # noqa: E402
import strata.torch  # noqa: E402

HP = dict(lr=3e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)


def model(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 8))


def train(engine, seed, steps=4):
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x, y = torch.randn(4, 8, generator=g), torch.randn(4, 8, generator=g)
        engine.backward(torch.nn.functional.mse_loss(engine(x), y))
        engine.step()
    return engine.fp32_state_dict()


def train_torch(m, opt, seed, steps=4):
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x, y = torch.randn(4, 8, generator=g), torch.randn(4, 8, generator=g)
        torch.nn.functional.mse_loss(m(x), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return {n: p.detach().clone() for n, p in m.named_parameters()}


def optimizer_section(kind):
    params = {"lr": HP["lr"], "betas": list(HP["betas"]), "eps": HP["eps"], "weight_decay": HP["weight_decay"]}
    if kind == "Adam":
        params["adam_w_mode"] = False
    return {"type": kind, "params": params}


def honoured(seed):
    for cls in (torch.optim.AdamW, torch.optim.Adam):
        m = model(seed)
        out = strata.torch.initialize(model=m, config={}, optimizer=cls(m.parameters(), **HP), device="cpu")
        T.check(isinstance(out, tuple) and len(out) == 4, "a 4-tuple, as DeepSpeed's", type(out).__name__, "tuple")
        engine, opt, loader, sched = out
        T.check(opt is engine.optimizer and loader is None and sched is None,
                "the tuple holds engine.optimizer, no loader and no scheduler when none was given")
        got = train(engine, seed)
        engine.close()
        via_config = strata.torch.initialize(model=model(seed), config={"optimizer": optimizer_section(cls.__name__)},
                                             device="cpu")[0]
        want = train(via_config, seed)
        via_config.close()
        ref = model(seed)
        plain = train_torch(ref, adam_oracle.oracle(cls(ref.parameters(), **HP)), seed)
        T.check(adam_oracle.first_difference(got, want) is None, "optimizer=%s trains as the same config section" %
                cls.__name__, adam_oracle.first_difference(got, want), None)
        diff = adam_oracle.first_difference(got, plain)
        T.check(diff is None, "optimizer=%s: weights %s to torch's %s" % (cls.__name__, adam_oracle.HOW,
                                                                          cls.__name__), diff, "no difference")

    # args.deepspeed_config, as DeepSpeed's command line gives it
    path = os.path.join(T.scratch("py_torch_initialize"), "ds.json")
    with open(path, "w") as f:
        json.dump({"optimizer": optimizer_section("AdamW"), "gradient_accumulation_steps": 2}, f)
    args = argparse.Namespace(deepspeed_config=path, local_rank=-1)
    engine = strata.torch.initialize(args, model(seed), device="cpu")[0]
    T.check(engine.gradient_accumulation_steps() == 2, "args.deepspeed_config is read",
            engine.gradient_accumulation_steps(), 2)
    engine.close()

    # training_data + collate_fn: DeepSpeed's loader (a DistributedSampler over the world of 1)
    data = torch.utils.data.TensorDataset(torch.arange(20.0).view(10, 2))
    collate = (lambda items: torch.stack([i[0] for i in items]) * 2)
    m = model(seed)
    sched_of = (lambda opt: torch.optim.lr_scheduler.StepLR(opt, 1))
    engine, _, loader, sched = strata.torch.initialize(
        model=m, config={"train_micro_batch_size_per_gpu": 3, "dataloader_drop_last": True}, training_data=data,
        collate_fn=collate, lr_scheduler=sched_of, device="cpu")
    want_loader = torch.utils.data.DataLoader(data, batch_size=3, drop_last=True, collate_fn=collate,
                                              sampler=torch.utils.data.DistributedSampler(data, 1, 0))
    got_batches, want_batches = [b.tolist() for b in loader], [b.tolist() for b in want_loader]
    T.check(got_batches == want_batches and len(got_batches) == 3,
            "training_data: batches of train_micro_batch_size_per_gpu, collate_fn, drop_last, DistributedSampler",
            got_batches, want_batches)
    T.check(isinstance(sched, torch.optim.lr_scheduler.StepLR) and sched is engine.lr_scheduler,
            "lr_scheduler (a callable) is made from engine.optimizer and returned", type(sched).__name__, "StepLR")
    engine.close()


def refused(seed):
    m = model(seed)
    cases = [
        ("the model as the first argument", "first argument is DeepSpeed's args",
         lambda: strata.torch.initialize(m, {})),
        ("mpu", "data-parallel only", lambda: strata.torch.initialize(model=m, config={}, mpu=object())),
        ("mesh_param", "data-parallel only", lambda: strata.torch.initialize(model=m, config={}, mesh_param=(2, 1))),
        ("distributed_port", "MPI", lambda: strata.torch.initialize(model=m, config={}, distributed_port=1234)),
        ("a config in args and config=", "give one", lambda: strata.torch.initialize(
            argparse.Namespace(deepspeed_config="x.json"), model=m, config={})),
        ("an optimizer in both places", "give one", lambda: strata.torch.initialize(
            model=m, config={"optimizer": optimizer_section("AdamW")}, optimizer=torch.optim.AdamW(m.parameters()))),
        ("SGD", "strata runs its own Adam", lambda: strata.torch.initialize(
            model=m, config={}, optimizer=torch.optim.SGD(m.parameters(), lr=0.1))),
        ("amsgrad", "amsgrad", lambda: strata.torch.initialize(
            model=m, config={}, optimizer=torch.optim.AdamW(m.parameters(), amsgrad=True))),
        ("a param group with amsgrad", "param_groups[1] sets amsgrad = True", lambda: strata.torch.initialize(
            model=m, config={}, optimizer=torch.optim.AdamW([{"params": m[0].parameters()},
                                                             {"params": m[2].parameters(), "amsgrad": True}]))),
        ("collate_fn without data", "collate_fn without training_data", lambda: strata.torch.initialize(
            model=m, config={}, collate_fn=list)),
        ("args.local_rank that is not MPI's", "local_rank", lambda: strata.torch.initialize(
            argparse.Namespace(local_rank=3), model=m, config={})),
    ]
    for what, fragment, call in cases:
        T.check_raises(strata.StrataError, fragment, call, what)


def main():
    seed = T.seed()
    honoured(seed)
    refused(seed)
    T.done()


if __name__ == "__main__":
    main()
