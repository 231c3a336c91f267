"""strata.step_in_backward through strata.torch: each module's update runs during backward, and the result is the
ordinary step's bit for bit.

A small model of torch's own modules (an embedding, blocks of LayerNorm + Linear, a head) trains 4 steps at ZeRO
stage 3, parameters and optimizer on the host tier and on NVMe, with a torch LambdaLR moving the lr every step,
plainly and with gradient clipping that triggers on some steps (the updates speculate and are redone): losses and
fp32 weights equal to the same runs with the step after backward; the engine says the updates ran in backward
(no gradient store: the host tier's peak is lower by its 4 bytes a parameter). Refused before anything is made, naming the
key: gradient accumulation > 1 and strata.norm_pass; an lr changed between backward and step (the updates already
ran with the old one) is refused at the step.
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "helpers"))
import strata_test as T  # noqa: E402

torch = T.require_torch()
import torch.nn as nn  # noqa: E402
import strata  # noqa: E402
import strata.torch  # noqa: E402

SEED = T.seed()
SCRATCH = T.scratch("py_torch_step_in_backward")
VOCAB, WIDTH, STEPS = 300, 48, 4


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.blocks = nn.ModuleList(nn.Sequential(nn.LayerNorm(WIDTH), nn.Linear(WIDTH, 2 * WIDTH), nn.GELU(),
                                                  nn.Linear(2 * WIDTH, WIDTH)) for _ in range(3))
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, ids):
        x = self.embed(ids)
        for b in self.blocks:
            x = x + b(x)
        logits = self.head(x)
        return nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())


def config(tier, sib, clip, gas=1, **strata_extra):
    off = {"device": tier}
    if tier == "nvme":
        off["nvme_path"] = os.path.join(SCRATCH, "nvme")
        os.makedirs(off["nvme_path"], exist_ok=True)
    section = {"step_in_backward": sib, "device_budget_bytes": 1 << 20}
    section.update(strata_extra)
    return {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": gas, "gradient_clipping": clip,
            "optimizer": {"type": "AdamW", "params": {"lr": 3e-2, "weight_decay": 0.01}},
            "zero_optimization": {"stage": 3, "offload_param": dict(off), "offload_optimizer": dict(off)},
            "strata": section}


def run(tier, sib, clip):
    torch.manual_seed(SEED)
    model = Net()
    engine, opt, _, _ = strata.torch.initialize(model=model, config=config(tier, sib, clip))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
    g = torch.Generator().manual_seed(SEED + 1)
    losses = []
    for _ in range(STEPS):
        loss = engine(torch.randint(0, VOCAB, (2, 12), generator=g))
        engine.backward(loss)
        engine.step()
        sched.step()
        losses.append(loss.item())
    stats = engine.stats()
    weights = {k: v.clone() for k, v in engine.fp32_state_dict().items()}
    engine.close()
    return losses, weights, stats


for tier in ("cpu", "nvme"):
    for clip in (0.0, 0.5):
        want, want_w, want_st = run(tier, False, clip)
        got, got_w, got_st = run(tier, True, clip)
        what = "%s, clipping %g" % (tier, clip)
        T.check(got == want, "%s: the step in backward's losses are the ordinary step's" % what, got, want)
        diff = [k for k in want_w if not torch.equal(got_w[k], want_w[k])]
        T.check(not diff, "%s: the same fp32 weights" % what,
                diff[:3] and "%s max |diff| %g" % (diff[0], (got_w[diff[0]] - want_w[diff[0]]).abs().max()), "none")
        if tier == "cpu" and not clip:  # no fp32 gradient store (clipping keeps a second optimizer state instead)
            store = 4 * sum(w.numel() for w in want_w.values())
            T.check(want_st["host_peak_bytes"] - got_st["host_peak_bytes"] >= store,
                    "%s: no gradient store with the step in backward (host peak lower by >= %d bytes)" % (what, store),
                    got_st["host_peak_bytes"], "<= %d" % (want_st["host_peak_bytes"] - store))
        if clip:
            print("%s: steps redone %s of %d" % (what, got_st.get("steps_redone"), STEPS))

torch.manual_seed(SEED)
T.check_raises(strata.errors.ConfigError, "gradient_accumulation_steps = 2",
               lambda: strata.torch.initialize(model=Net(), config=config("cpu", True, 0.0, gas=2)),
               "step in backward with accumulation")
T.check_raises(strata.errors.ConfigError, "norm_pass",
               lambda: strata.torch.initialize(model=Net(), config=config("cpu", True, 1.0, norm_pass=True)),
               "the norm pass")
torch.manual_seed(SEED)
engine, opt, _, _ = strata.torch.initialize(model=Net(), config=config("cpu", True, 0.0))
engine.backward(engine(torch.randint(0, VOCAB, (2, 12))))
opt.param_groups[0]["lr"] = 1e-3
T.check_raises(strata.errors.StateError, "changed between backward and step", engine.step,
               "an lr set between backward and step (the updates already ran)")
engine.close()
T.done()
