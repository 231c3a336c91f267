#!/usr/bin/env python3
"""strata.torch.OffloadAdam is torch's Adam/AdamW with the state in strata, bit for bit.

On a small GPT with two param groups (own lr and weight decay) and a CosineAnnealingLR driving the lr:
  1. host tier == torch.optim.AdamW (losses and final weights identical), the schedule reaching lr 0 on the way;
  2. NVMe tier == torch.optim.AdamW, the state really on the drive;
  3. adamw_mode=False == torch.optim.Adam (L2 decay), with a param group added after three steps;
  4. bf16 parameters == AdamW on fp32 master weights, the parameters rounded to bf16;
  5. the delayed update == a torch reference of its semantics (strata.delayed_update, delayed_warmup_steps);
  6. state_dict() -> a new process -> load_state_dict() -> continue == the uninterrupted run, with a delayed
     update pending at the save; save_checkpoint()/load_checkpoint() the same, in this process;
  7. misuse raises, naming the problem;
  8. DeepSpeedCPUAdam's signature and defaults, bias_correction=False against its torch reference
     (adam_oracle.adamw_reference), and the flags strata cannot honour refused with the reason.
CPU parameters exchange with strata's stores without the device: checks 1 and 2 also demand 0 bytes through it.

Why exact equality can be demanded: strata's CPU Adam is torch 1.13's formula with torch's fused multiply-adds
(cpu_adam/adam_ref.c), and it derives 1 - beta, the bias corrections and 1 - lr * weight_decay from doubles (the
config's exact values, strata_config.lr_exact and the rest; the lr of each step is passed as a double), as torch
does from Python floats. So the usual hyperparameters (betas 0.9 / 0.999) are compared bit for bit, on every machine:
where torch's CPU sqrt is not IEEE's (strata's is), the torch optimizers here take theirs correctly rounded
(adam_oracle.oracle, tests/helpers/adam_oracle.py).

Run as `py_offload_adam.py --continue DIR` it is the second process of check 6.
"""
import copy
import json
import os
import pickle
import subprocess
import sys
import time
import warnings

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "helpers"))
import strata_test as T  # noqa: E402
import adam_oracle  # noqa: E402

torch = T.require_torch()
import strata  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402
from strata.torch.offload_adam import OffloadAdam  # noqa: E402

BETAS = (0.9, 0.999)
EPS = 1e-8
GROUPS = ({"lr": 2e-3, "weight_decay": 0.1}, {"lr": 4e-3, "weight_decay": 0.01})
STEPS = 10
T_MAX = 8            # CosineAnnealingLR reaches lr 0 exactly at epoch 8: step 9 runs at lr 0
BUCKET = 32 << 10    # small buckets: several strata modules, the embedding cut into chunks
BATCH, BLOCK, VOCAB = 4, 32, 256


def make_model(seed):
    torch.manual_seed(seed)
    return GPT(GPTConfig(vocab_size=VOCAB, block_size=BLOCK, n_layer=2, n_head=4, n_embd=64))


def make_batches(seed, n=STEPS):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randint(0, VOCAB, (BATCH, BLOCK), generator=g), torch.randint(0, VOCAB, (BATCH, BLOCK),
                                                                                 generator=g)) for _ in range(n)]


def param_groups(model):
    """Matrices with one lr and weight decay, vectors (biases, LayerNorms) with another."""
    matrices = [p for p in model.parameters() if p.dim() >= 2]
    vectors = [p for p in model.parameters() if p.dim() < 2]
    return [dict(GROUPS[0], params=matrices), dict(GROUPS[1], params=vectors)]


def offload(model, **kw):
    kw.setdefault("bucket_bytes", BUCKET)
    return OffloadAdam(param_groups(model), betas=BETAS, eps=EPS, **kw)


def cosine(opt):
    return torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=T_MAX)


def train(model, opt, sched, batches, after_step=None):
    """The loop a user writes; returns the losses."""
    losses = []
    for i, (x, y) in enumerate(batches, 1):
        loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        if sched is not None:
            sched.step()
        losses.append(loss.item())
        if after_step is not None:
            after_step(i)
    return losses


def same_run(what, got_losses, want_losses, got_model, want_model, against_torch=True):
    """Two checks: every loss, and every final weight, bit-identical (against torch: as adam_oracle says)."""
    same_float = adam_oracle.same_float if against_torch else (lambda a, b: a == b)
    same_tensor = adam_oracle.same_tensor if against_torch else torch.equal
    how = adam_oracle.HOW if against_torch else "bit-identical"
    diff = [(i + 1, a, b) for i, (a, b) in enumerate(zip(got_losses, want_losses)) if not same_float(a, b)]
    T.check(len(got_losses) == len(want_losses) and not diff, "%s: losses %s" % (what, how),
            diff[:1] or got_losses, want_losses if not diff else "the same")
    bad = [(name, (a.float() - b.float()).abs().max().item())
           for (name, a), b in zip(got_model.named_parameters(), want_model.parameters()) if not same_tensor(a, b)]
    T.check(not bad, "%s: final weights %s" % (what, how), "%d tensors differ, first %s (max |diff| %g)" %
            (len(bad), bad[0][0], bad[0][1]) if bad else None, "all equal")


# ------------------------------------------------------------------ 1, 2: host and NVMe tiers against AdamW

def check_tier(seed, what, config, nvme):
    model = make_model(seed)
    ref = copy.deepcopy(model)
    batches = make_batches(seed + 1)
    opt = offload(model, config=config)
    losses = train(model, opt, cosine(opt), batches)
    ref_opt = adam_oracle.oracle(torch.optim.AdamW(param_groups(ref), betas=BETAS, eps=EPS))
    want = train(ref, ref_opt, cosine(ref_opt), batches)
    same_run("%s == torch.optim.AdamW (2 groups, cosine lr through 0)" % what, losses, want, model, ref)
    to_nvme = sum(s["host_to_nvme_bytes"] for s in opt.stats())
    # CPU parameters exchange with strata's stores directly: nothing goes through the device window.
    via_device = [(s["host_to_device_bytes"], s["device_to_host_bytes"], s["device_peak_bytes"]) for s in opt.stats()]
    T.check(all(v == (0, 0, 0) for v in via_device), "%s: no byte through the device (host->device, device->host, "
            "device peak per group)" % what, via_device, "all 0")
    T.check((to_nvme > 0) == nvme, "%s: the optimizer state %s on NVMe" % (what, "is" if nvme else "is not"),
            "%d bytes written to NVMe" % to_nvme, "> 0" if nvme else "0")
    opt.close()


# ------------------------------------------------------------------ 3: Adam (L2), a group added later

def check_adam_l2(seed):
    model = make_model(seed)
    ref = copy.deepcopy(model)
    batches = make_batches(seed + 2, 6)

    def run(m, make_opt, **kw):
        groups = param_groups(m)
        opt = make_opt([groups[0]], betas=BETAS, eps=EPS, **kw)
        return train(m, opt, None, batches, lambda i: i == 3 and opt.add_param_group(groups[1]))

    losses = run(model, OffloadAdam, adamw_mode=False, bucket_bytes=BUCKET)
    want = run(ref, lambda *a, **kw: adam_oracle.oracle(torch.optim.Adam(*a, **kw)))
    same_run("adamw_mode=False == torch.optim.Adam, a param group added after step 3", losses, want, model, ref)


# ------------------------------------------------------------------ 4: bf16 parameters

def check_bf16(seed):
    model = make_model(seed).bfloat16()
    ref = copy.deepcopy(model)
    master = copy.deepcopy(model).float()  # what strata keeps: fp32 master weights, exact copies of the bf16 ones
    batches = make_batches(seed + 3, 6)
    opt = offload(model)
    losses = train(model, opt, cosine(opt), batches)
    ref_opt = adam_oracle.oracle(torch.optim.AdamW(param_groups(master), betas=BETAS, eps=EPS))
    ref_sched = cosine(ref_opt)
    want = []
    for x, y in batches:
        loss = ref(x, y)
        loss.backward()
        for m, p in zip(master.parameters(), ref.parameters()):
            m.grad = p.grad.float()
            p.grad = None
        ref_opt.step()
        ref_sched.step()
        with torch.no_grad():
            for m, p in zip(master.parameters(), ref.parameters()):
                p.copy_(m)  # round to nearest even, as strata's bf16 copy
        want.append(loss.item())
    same_run("bf16 parameters == AdamW on fp32 masters rounded to bf16", losses, want, model, ref)


# ------------------------------------------------------------------ 5: the delayed update

def torch_delayed(model, batches, warmup):
    """The delayed update's semantics in torch (engine/step/train_step.c, opt_thread.h): strata_step call i runs update
    i with the gradient of call i and the lr of call i. For i <= warmup it runs at once and its result is visible
    when step() returns. After the warm-up, call i first joins update i-1 and makes it visible, then starts update i
    in the background and returns: the trainer computes the next gradient with the weights before update i.
    Returns the losses and the optimizer's own (master) weights."""
    master = copy.deepcopy(model)
    opt = adam_oracle.oracle(torch.optim.AdamW(param_groups(master), betas=BETAS, eps=EPS))
    sched = cosine(opt)
    losses = []
    for i, (x, y) in enumerate(batches, 1):
        loss = model(x, y)
        loss.backward()
        for m, p in zip(master.parameters(), model.parameters()):
            m.grad, p.grad = p.grad, None
        before = [m.detach().clone() for m in master.parameters()]
        opt.step()
        sched.step()
        visible = [m.detach() for m in master.parameters()] if i <= warmup else before
        with torch.no_grad():
            for p, w in zip(model.parameters(), visible):
                p.copy_(w)
        losses.append(loss.item())
    return losses, master


def delayed_config(warmup):
    return {"strata": {"delayed_update": True, "delayed_warmup_steps": warmup}}


def check_delayed(seed):
    warmup = 3
    model = make_model(seed)
    ref = copy.deepcopy(model)
    batches = make_batches(seed + 4)
    opt = offload(model, config=delayed_config(warmup))
    losses = train(model, opt, cosine(opt), batches)
    want, master = torch_delayed(ref, batches, warmup)
    same_run("delayed update (warm-up %d) == its torch reference" % warmup, losses, want, model, ref)
    # The last update is still in flight; sync() makes it visible: the reference's master weights.
    opt.sync()
    same_run("delayed update: sync() publishes the update in flight", [], [], model, master)


# ------------------------------------------------------------------ 6: resume in a new process

RESUME_AT, RESUME_WARMUP = 5, 2  # the save at step 5 > warm-up 2: a delayed update is pending in it


def check_resume(seed, scratch):
    model = make_model(seed)
    ref = copy.deepcopy(model)
    batches = make_batches(seed + 5)
    opt = offload(model, config=delayed_config(RESUME_WARMUP))
    sched = cosine(opt)
    ckpt_dir = os.path.join(scratch, "checkpoint")
    saved = {}

    def save(i):
        if i != RESUME_AT:
            return
        sd = opt.state_dict()
        saved["model"] = copy.deepcopy(model.state_dict())
        saved["sched"] = sched.state_dict()
        saved["opt"] = sd
        torch.save({"model": saved["model"], "opt": sd, "sched": saved["sched"], "batches": batches[RESUME_AT:]},
                   os.path.join(scratch, "resume.pt"))
        opt.save_checkpoint(ckpt_dir)

    losses = train(model, opt, sched, batches, save)
    want, _ = torch_delayed(ref, batches, RESUME_WARMUP)
    same_run("a delayed run saving mid-way (state_dict, save_checkpoint) == its torch reference", losses, want, model,
             ref)
    manifest = json.loads(saved["opt"]["strata"]["groups"][0]["files"]["manifest.json"])
    T.check(manifest.get("pending_update") is not None, "resume: the state_dict holds a pending delayed update",
            manifest.get("pending_update"), "an entry")

    # The second process: a model built from another seed, so only the loaded state can make it match.
    out = os.path.join(scratch, "continued.pt")
    t0 = time.time()
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--continue", scratch], capture_output=True,
                          text=True, timeout=120)
    T.check(proc.returncode == 0, "resume: the second process passed its checks (%.1f s)" % (time.time() - t0),
            "exit %d: %s" % (proc.returncode, (proc.stdout + proc.stderr)[-2000:]), 0)
    if proc.returncode == 0:
        got = torch.load(out)
        other = make_model(seed + 99)
        other.load_state_dict(got["model"])
        same_run("state_dict -> new process -> load_state_dict -> %d more steps == uninterrupted" %
                 (STEPS - RESUME_AT), got["losses"], losses[RESUME_AT:], other, model, against_torch=False)

    # The same through a directory, in this process.
    other = make_model(seed + 98)
    other.load_state_dict(saved["model"])
    opt2 = offload(other, config=delayed_config(RESUME_WARMUP))
    opt2.load_checkpoint(ckpt_dir)
    sched2 = cosine(opt2)
    sched2.load_state_dict(saved["sched"])
    more = train(other, opt2, sched2, batches[RESUME_AT:])
    same_run("save_checkpoint -> load_checkpoint -> continue == uninterrupted", more, losses[RESUME_AT:], other, model,
             against_torch=False)
    return saved["opt"]


def continue_run(scratch):
    """check_resume's second process: loads what the first saved, trains on, writes its losses and weights."""
    state = torch.load(os.path.join(scratch, "resume.pt"))
    model = make_model(12345)
    model.load_state_dict(state["model"])
    opt = offload(model, config=delayed_config(RESUME_WARMUP))
    opt.load_state_dict(state["opt"])
    # Loading sets the parameters to the weights strata had made visible at the save: the model's own.
    T.check(all(torch.equal(p, state["model"][name]) for name, p in model.named_parameters()),
            "resume, second process: load_state_dict sets the parameters to the saved visible weights")
    T.check([g["lr"] for g in opt.param_groups] == [g["lr"] for g in state["opt"]["param_groups"]],
            "resume, second process: the groups' lr come from the state_dict",
            [g["lr"] for g in opt.param_groups], [g["lr"] for g in state["opt"]["param_groups"]])
    sched = cosine(opt)
    sched.load_state_dict(state["sched"])
    losses = train(model, opt, sched, state["batches"])
    torch.save({"losses": losses, "model": model.state_dict()}, os.path.join(scratch, "continued.pt"))
    T.done()


def check_load_adopts(seed):
    """load_state_dict takes the groups' hyperparameters from the state_dict, as torch does, rebuilding an engine
    whose fixed ones (betas, eps, weight decay, bucket size) differ: the run then continues exactly."""
    model = make_model(seed)
    batches = make_batches(seed + 6, 4)
    opt = offload(model)
    losses = train(model, opt, None, batches[:2])
    sd = opt.state_dict()
    other = make_model(seed + 97)
    other.load_state_dict(model.state_dict())
    groups = param_groups(other)
    groups[0]["weight_decay"] = 0.5
    opt2 = OffloadAdam(groups, betas=(0.5, 0.5), eps=1e-6, bucket_bytes=BUCKET * 2)
    opt2.load_state_dict(sd)
    T.check([(g["betas"], g["weight_decay"], g["eps"]) for g in opt2.param_groups] ==
            [(g["betas"], g["weight_decay"], g["eps"]) for g in opt.param_groups],
            "load_state_dict adopts the saved hyperparameters", opt2.param_groups, opt.param_groups)
    losses += train(model, opt, None, batches[2:])
    more = train(other, opt2, None, batches[2:])
    same_run("load_state_dict into an optimizer built with other betas, eps, weight decay and bucket size", more,
             losses[2:], other, model, against_torch=False)


# ------------------------------------------------------------------ 8: DeepSpeedCPUAdam's signature

# DeepSpeedCPUAdam.__init__'s parameters and defaults (deepspeed/ops/adam/cpu_adam.py, 0.18 and 0.19).
DEEPSPEED_SIGNATURE = [("model_params", None), ("lr", 1e-3), ("bias_correction", True), ("betas", (0.9, 0.999)),
                       ("eps", 1e-8), ("weight_decay", 0), ("amsgrad", False), ("adamw_mode", True),
                       ("fp32_optimizer_states", True)]


def check_deepspeed_signature():
    import inspect
    got = [(name, None if p.default is inspect.Parameter.empty else p.default)
           for name, p in list(inspect.signature(OffloadAdam).parameters.items())[:len(DEEPSPEED_SIGNATURE)]]
    T.check(got == DEEPSPEED_SIGNATURE, "OffloadAdam takes DeepSpeedCPUAdam's arguments, in order, with its defaults",
            got, DEEPSPEED_SIGNATURE)
    g = torch.Generator().manual_seed(7)
    init = [torch.randn(300, generator=g), torch.randn(17, 5, generator=g)]
    grads = [[torch.randn(p.shape, generator=g) * 1e-2 for p in init] for _ in range(4)]
    for bias_correction in (True, False):
        want = [p.clone() for p in init]
        adam_oracle.adamw_reference(want, grads, 1e-2, BETAS, EPS, 0.0, bias_correction)
        params = [torch.nn.Parameter(p.clone()) for p in init]
        opt = OffloadAdam(params, 1e-2, bias_correction, bucket_bytes=BUCKET)  # positional, as DeepSpeedCPUAdam's
        for gs in grads:
            for p, gr in zip(params, gs):
                p.grad = gr.clone()
            opt.step()
        worst = max((a.detach() - b).abs().max().item() for a, b in zip(params, want))
        T.check(all(adam_oracle.same_tensor(a.detach(), b) for a, b in zip(params, want)),
                "bias_correction=%s, default weight_decay (0): 4 steps == torch's AdamW with%s bias correction" %
                (bias_correction, "" if bias_correction else "out"), "max |diff| %g" % worst, adam_oracle.HOW)
        opt.close()
    a = torch.nn.Parameter(torch.zeros(8))
    raises = T.check_raises
    raises(ValueError, "amsgrad = True; strata's CPU Adam keeps no running maximum",
           lambda: OffloadAdam([a], amsgrad=True), "DeepSpeedCPUAdam's amsgrad=True")
    raises(ValueError, "fp32_optimizer_states = False; strata keeps the master weights and both moments in fp32",
           lambda: OffloadAdam([a], fp32_optimizer_states=False), "DeepSpeedCPUAdam's fp32_optimizer_states=False")
    raises(ValueError, "bias_correction = 'yes'", lambda: OffloadAdam([a], bias_correction="yes"),
           "a bias_correction that is not a bool")
    raises(strata.ConfigError, "optimizer.params.bias_correction = false", lambda: OffloadAdam(
        [a], config={"optimizer": {"params": {"bias_correction": False}}}), "a config contradicting bias_correction")


# ------------------------------------------------------------------ 7: misuse

def check_misuse(seed, scratch, delayed_sd):
    model = make_model(seed)
    a = torch.nn.Parameter(torch.zeros(8))
    raises = T.check_raises

    raises(ValueError, "more than one parameter group", lambda: OffloadAdam([{"params": [a]}, {"params": [a]}]),
           "a parameter in two groups")
    raises(ValueError, "same tensor twice", lambda: OffloadAdam([a, a]), "a parameter twice in one group")
    raises(TypeError, "separate param groups",
           lambda: OffloadAdam([a, torch.nn.Parameter(torch.zeros(4, dtype=torch.bfloat16))]),
           "fp32 and bf16 parameters in one group")
    raises(TypeError, "torch.float16", lambda: OffloadAdam([torch.nn.Parameter(torch.zeros(4).half())]),
           "fp16 parameters")
    raises(TypeError, "torch.float64", lambda: OffloadAdam([torch.nn.Parameter(torch.zeros(4).double())]),
           "fp64 parameters")
    raises(ValueError, "lr = -0.001", lambda: OffloadAdam([a], lr=-1e-3), "a negative lr")
    raises(ValueError, "betas = (0.9, 1.0)", lambda: OffloadAdam([a], betas=(0.9, 1.0)), "beta2 = 1")
    raises(ValueError, "bucket_bytes = 100", lambda: OffloadAdam([a], bucket_bytes=100), "a tiny bucket_bytes")
    raises(ValueError, "amsgrad = True", lambda: OffloadAdam([{"params": [a], "amsgrad": True}]), "amsgrad")
    raises(strata.ConfigError, "scheduler", lambda: OffloadAdam([a], config={"scheduler": {"type": "WarmupLR"}}),
           "a DeepSpeed scheduler in the config")
    raises(strata.ConfigError, "clip_grad_norm_", lambda: OffloadAdam([a], config={"gradient_clipping": 1.0}),
           "gradient_clipping in the config")
    raises(strata.ConfigError, "bf16.enabled", lambda: OffloadAdam([a], config={"bf16": {"enabled": True}}),
           "bf16.enabled with fp32 parameters")
    raises(strata.ConfigError, "nvme_path", lambda: OffloadAdam(
        [a], config={"zero_optimization": {"offload_optimizer": {"device": "nvme"}}}), "the NVMe tier without a path")

    opt = OffloadAdam([a], lr=1e-3, weight_decay=1e-2)  # explicit: the default is DeepSpeedCPUAdam's 0
    raises(TypeError, "torch.float16", lambda: opt.add_param_group({"params": [torch.nn.Parameter(
        torch.zeros(2).half())]}), "add_param_group with fp16")
    T.check(len(opt.param_groups) == 1 and len(opt.stats()) == 1, "a refused add_param_group leaves no group",
            len(opt.param_groups), 1)
    a.grad = torch.ones(8)
    opt.param_groups[0]["weight_decay"] = 0.5
    raises(ValueError, "weight_decay changed from 0.01 to 0.5", opt.step, "weight_decay changed after construction")
    opt.param_groups[0]["weight_decay"] = 0.01
    opt.param_groups[0]["lr"] = float("nan")
    raises(ValueError, "lr = nan", opt.step, "a NaN lr from a schedule")
    opt.param_groups[0]["lr"] = 1e-3
    raises(TypeError, "cannot be pickled", lambda: pickle.dumps(opt), "pickling")
    opt.param_groups[0]["params"].append(torch.nn.Parameter(torch.zeros(2)))
    raises(ValueError, "the parameters of param group 0 changed", opt.step, "a tensor appended to a group's list")
    opt.param_groups[0]["params"].pop()
    b = torch.nn.Parameter(torch.zeros(3))
    opt.add_param_group({"params": [b]})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        opt.step()
    T.check(any("has no .grad" in str(w.message) for w in caught), "a parameter without .grad: a warning says how "
            "strata treats it", [str(w.message) for w in caught], "'... has no .grad ...'")

    emb = torch.nn.Embedding(10, 4, sparse=True)
    sparse_opt = OffloadAdam(emb.parameters())
    emb(torch.tensor([1, 2])).sum().backward()
    raises(RuntimeError, "sparse gradients", sparse_opt.step, "a sparse gradient")

    # load_state_dict: what differs is named.
    sd = offload(model).state_dict()
    raises(ValueError, "no 'strata' entry", lambda: offload(model).load_state_dict(
        torch.optim.AdamW(model.parameters()).state_dict()), "a torch.optim.AdamW state_dict")
    raises(ValueError, "2 param groups, this one has 1", lambda: OffloadAdam(model.parameters()).load_state_dict(sd),
           "a state_dict with another number of groups")
    smaller = make_model(seed)
    groups = param_groups(smaller)
    groups[1]["params"] = groups[1]["params"][1:]
    raises(ValueError, "param group 1 has %d parameters in the saved optimizer, %d here" %
           (len(sd["param_groups"][1]["params"]), len(groups[1]["params"])),
           lambda: OffloadAdam(groups, betas=BETAS, eps=EPS, bucket_bytes=BUCKET).load_state_dict(sd),
           "a state_dict with another number of parameters")
    wider = GPT(GPTConfig(vocab_size=VOCAB + 8, block_size=BLOCK, n_layer=2, n_head=4, n_embd=64))
    raises(ValueError, "parameter 0 of param group 0 has shape [256, 64] in the saved optimizer, [264, 64] here",
           lambda: offload(wider).load_state_dict(sd), "a state_dict with another parameter shape")
    raises(ValueError, "saved with fp32 parameters, these are bf16",
           lambda: offload(make_model(seed).bfloat16()).load_state_dict(sd), "a state_dict of another precision")
    raises(strata.ConfigError, "strata.delayed_update = true in the config",
           lambda: offload(model).load_state_dict(delayed_sd), "a pending delayed update into an optimizer without it")
    empty = os.path.join(scratch, "empty")
    os.makedirs(empty)
    raises(FileNotFoundError, "holds no OffloadAdam checkpoint", lambda: offload(model).load_checkpoint(empty),
           "load_checkpoint of an empty directory")


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--continue":
        continue_run(sys.argv[2])
        return
    t0 = time.time()
    seed = T.seed()
    scratch = T.scratch("py_offload_adam")
    print("libstrata %s (%s); torch %s, %d threads" % (strata.version(), strata.library_path()[0], torch.__version__,
                                                        torch.get_num_threads()))
    check_tier(seed, "host tier", None, nvme=False)
    nvme_dir = os.path.join(scratch, "nvme")
    os.makedirs(nvme_dir)
    nvme = {"zero_optimization": {"offload_optimizer": {"device": "nvme", "nvme_path": nvme_dir}}}
    check_tier(seed, "NVMe tier", nvme, nvme=True)
    check_adam_l2(seed)
    check_bf16(seed)
    check_delayed(seed)
    delayed_sd = check_resume(seed, scratch)
    check_load_adopts(seed)
    check_misuse(seed, scratch, delayed_sd)
    check_deepspeed_signature()
    print("%.1f s" % (time.time() - t0))
    T.done()


if __name__ == "__main__":
    main()
