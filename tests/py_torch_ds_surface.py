"""The rest of DeepSpeed's engine surface on strata.torch's engine, each part against an oracle:

  - get_global_grad_norm(): None before the first step; after each step the global norm of that step's gradients,
    torch's clip_grad_norm_ on the same model and batch (with gradient_clipping, which makes strata measure it);
  - load_checkpoint's flags: (None, None) with a warning when load_dir holds nothing (no 'latest', no checkpoint)
    and no tag, also for a directory that does not exist; load_lr_scheduler_states=False keeps the scheduler's state
    and lr while the weights and counters load; the default restores them; load_module_strict=False loads the same
    model; load_module_only=True, load_optimizer_states=False and custom_load_fn are refused with the reason;
  - save_16bit_model(dir, name): returns True; the file (torch.save'd) holds the model's state_dict in its compute
    dtype (bf16 here), buffers and frozen parameters included (exclude_frozen_parameters=True drops those); loaded
    into a fresh model it gives engine.fp32_state_dict() rounded to bf16, bit for bit;
  - local_rank, fp16_enabled(), bfloat16_enabled();
  - attributes the engine lacks fall through to the model (engine.generate(...), engine.vocab), engine.config stays
    the engine's strata.Config, underscore names do not fall through, a missing name raises AttributeError naming
    both, and nothing recurses before __init__ or after close().
(Before: none of these existed: get_global_grad_norm, save_16bit_model, local_rank, fp16_enabled and the
fall-through raised AttributeError, load_checkpoint took no flags and raised for an empty directory.)
"""
import os
import sys
import warnings

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "helpers"))
import strata_test as T  # noqa: E402
import adam_oracle  # noqa: E402

torch = T.require_torch()
import strata  # noqa: E402
import strata.torch  # noqa: E402
from strata.torch.engine import StrataEngine  # noqa: E402

HP = dict(lr=1e-2, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.01)
LRS = torch.optim.lr_scheduler


class Net(torch.nn.Module):
    """A small model with a buffer, a frozen layer, a method and attributes of its own (as an HF model has)."""

    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.Tanh(), torch.nn.Linear(12, 3))
        self.frozen = torch.nn.Linear(3, 3)
        self.frozen.requires_grad_(False)
        self.register_buffer("shift", torch.randn(3))
        self.vocab = 7
        self.config = "the model's own config"
        self._private = "the model's"

    def forward(self, x):
        return self.frozen(self.body(x)) + self.shift

    def generate(self, x):
        return self(x).argmax(-1)


def net(seed):
    torch.manual_seed(seed)
    return Net()


def batches(seed, n):
    g = torch.Generator().manual_seed(seed + 1)
    return [(torch.randn(4, 6, generator=g), torch.randn(4, 3, generator=g)) for _ in range(n)]


def engine_of(seed, config=None, scheduler=None, dtype=torch.float32):
    m = net(seed).to(dtype)
    opt = torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], **HP)
    return strata.torch.initialize(model=m, optimizer=opt, config=config or {}, lr_scheduler=scheduler,
                                   device="cpu")[0]


def train(engine, data):
    for x, y in data:
        engine.backward(torch.nn.functional.mse_loss(engine(x), y))
        engine.step()


def grad_norm(seed):
    steps = 3
    m = net(seed)
    opt = adam_oracle.oracle(torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], **HP))
    want = []
    for x, y in batches(seed, steps):
        torch.nn.functional.mse_loss(m(x), y).backward()
        want.append(float(torch.nn.utils.clip_grad_norm_(m.parameters(), 1e9)))
        opt.step()
        opt.zero_grad(set_to_none=True)
    engine = engine_of(seed, {"gradient_clipping": 1e9})
    T.check(engine.get_global_grad_norm() is None, "get_global_grad_norm() before the first step is None",
            engine.get_global_grad_norm(), None)
    got = []
    for batch in batches(seed, steps):
        train(engine, [batch])
        got.append(engine.get_global_grad_norm())
    engine.close()
    # strata sums the squares in doubles, torch in fp32: the same norm to fp32 precision
    T.check(all(isinstance(g, float) and abs(g - w) <= 1e-5 * w for g, w in zip(got, want)),
            "get_global_grad_norm() after each step is that step's global gradient norm (torch's clip_grad_norm_)",
            got, want)


def load_flags(seed):
    root = T.scratch("py_torch_ds_surface")
    empty = os.path.join(root, "empty")
    os.makedirs(empty)
    engine = engine_of(seed)
    for what, where in (("an empty directory", empty), ("a directory that does not exist",
                                                         os.path.join(root, "missing"))):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = engine.load_checkpoint(where)
        T.check(out == (None, None), "load_checkpoint(%s) returns (None, None), as DeepSpeed" % what, out,
                (None, None))
        T.check(any("nothing loaded" in str(w.message) for w in caught), "load_checkpoint(%s) warns" % what,
                [str(w.message) for w in caught], "a warning")
    for flag, kwargs, fragment in (("load_module_only=True", {"load_module_only": True}, "load_module_only"),
                                   ("load_optimizer_states=False", {"load_optimizer_states": False},
                                    "load_optimizer_states"),
                                   ("custom_load_fn", {"custom_load_fn": lambda *a: None}, "custom_load_fn")):
        T.check_raises(strata.InvalidArgument, fragment, lambda: engine.load_checkpoint(empty, **kwargs),
                       "load_checkpoint(%s)" % flag)
    T.check_raises(strata.InvalidArgument, "Adam moments", lambda: engine.load_checkpoint(empty, load_module_only=True),
                   "load_checkpoint(load_module_only=True) says why")
    engine.close()

    # A: 3 steps of a LambdaLR schedule, saved. B: 1 step of the same schedule, other weights.
    def schedule(opt):
        return LRS.LambdaLR(opt, lambda s: 0.5 ** s)
    data = batches(seed, 4)
    a = engine_of(seed, scheduler=schedule)
    train(a, data[:3])
    saved = os.path.join(root, "ckpt")
    a.save_checkpoint(saved)
    a_weights, a_lr, a_epoch = a.fp32_state_dict(), a.get_lr(), a.lr_scheduler.last_epoch
    a.close()
    for flags in ({"load_lr_scheduler_states": False}, {}, {"load_module_strict": False}):
        b = engine_of(seed + 1, scheduler=schedule)
        train(b, data[:1])
        b_lr, b_epoch = b.get_lr(), b.lr_scheduler.last_epoch
        path, client = b.load_checkpoint(saved, **flags)
        T.check(path is not None and b.global_steps == 3, "load_checkpoint(%s): loads (path, global_steps)" % flags,
                (path, b.global_steps), ("the checkpoint", 3))
        diff = next((n for n in a_weights if not torch.equal(a_weights[n], b.fp32_state_dict()[n])), None)
        T.check(diff is None, "load_checkpoint(%s): the saved weights, bit for bit (first that differs)" % flags, diff,
                None)
        if flags.get("load_lr_scheduler_states", True):
            want = (a_epoch, a_lr)
            what = "restores the scheduler's state and the lr"
        else:
            want = (b_epoch, b_lr)
            what = "keeps the scheduler's state and the lr as they were"
        got = (b.lr_scheduler.last_epoch, b.get_lr())
        T.check(got == want, "load_checkpoint(%s) %s (last_epoch, lr)" % (flags, what), got, want)
        T.check(b_epoch != a_epoch and b_lr != a_lr, "the two schedules differ before the load (the check means "
                "something)", (b_epoch, b_lr), (a_epoch, a_lr))
        # the next step runs at the lr that the kept or restored schedule gives
        got_lrs = []
        c_step = b.engine.step
        b.engine.step = lambda lr=None: (got_lrs.append(lr), c_step(lr=lr))[1]
        train(b, data[3:])
        T.check(got_lrs == [want[1][0]], "load_checkpoint(%s): the next step runs at that lr" % flags, got_lrs,
                [want[1][0]])
        b.close()


def save_16bit(seed):
    root = T.scratch("py_torch_ds_surface_16bit")
    engine = engine_of(seed, {"bf16": {"enabled": True}}, dtype=torch.bfloat16)  # frozen layer and buffer too
    T.check(engine.bfloat16_enabled() and not engine.fp16_enabled(), "bf16: bfloat16_enabled() and not "
            "fp16_enabled()", (engine.bfloat16_enabled(), engine.fp16_enabled()), (True, False))
    x = torch.randn(4, 6).to(torch.bfloat16)
    for _ in range(2):
        engine.backward(engine(x).float().pow(2).mean())
        engine.step()
    out = engine.save_16bit_model(root, "weights.bin")
    T.check(out is True, "save_16bit_model returns True", out, True)
    saved = torch.load(os.path.join(root, "weights.bin"))
    master = engine.fp32_state_dict()
    fresh = Net().to(torch.bfloat16)
    fresh.load_state_dict(saved)  # strict: every key of the model, no other
    got = fresh.state_dict()
    T.check(all(saved[n].dtype == torch.bfloat16 for n in master), "the trained weights are saved in bf16, the "
            "compute dtype", {n: str(saved[n].dtype) for n in master}, "torch.bfloat16")
    diff = next((n for n in master if not torch.equal(got[n], master[n].to(torch.bfloat16))), None)
    T.check(diff is None, "save_16bit_model loaded into a fresh model gives fp32_state_dict() rounded to bf16 (first "
            "that differs)", diff, None)
    T.check(torch.equal(saved["shift"], engine.module.shift) and "frozen.weight" in saved,
            "the model's buffer and frozen parameters are in it", sorted(saved), "shift, frozen.* included")
    engine.save_16bit_model(root, "trained.bin", exclude_frozen_parameters=True)
    keys = sorted(torch.load(os.path.join(root, "trained.bin")))
    T.check(not any(k.startswith("frozen.") for k in keys) and "shift" in keys and "body.0.weight" in keys,
            "exclude_frozen_parameters=True leaves the frozen parameters out", keys, "no frozen.*")
    engine.close()
    m = net(seed)
    engine = strata.torch.initialize(model=m, config={"fp16": {"enabled": True}, "strata": {"backend": "host"}},
                                     device="cpu")[0]
    T.check(engine.fp16_enabled() and not engine.bfloat16_enabled(), "fp16: fp16_enabled() and not "
            "bfloat16_enabled()", (engine.fp16_enabled(), engine.bfloat16_enabled()), (True, False))
    engine.close()
    engine = engine_of(seed)
    T.check(not engine.fp16_enabled() and not engine.bfloat16_enabled(), "fp32: neither enabled")
    T.check(engine.local_rank == 0 and engine.local_rank == engine.comm.local_rank,
            "local_rank is the launcher's (0 in a world of one)", engine.local_rank, 0)
    engine.close()


def fall_through(seed):
    engine = engine_of(seed)
    x = torch.randn(5, 6)
    with torch.no_grad():
        want = engine(x).argmax(-1)
        got = engine.generate(x)
    T.check(torch.equal(got, want), "engine.generate(...) is the model's, running through strata", got, want)
    T.check(engine.vocab == 7, "engine.vocab falls through to the model", getattr(engine, "vocab", None), 7)
    T.check(isinstance(engine.config, strata.Config), "engine.config is the engine's strata.Config, not the model's",
            type(engine.config).__name__, "Config")
    T.check_raises(AttributeError, "_private", lambda: engine._private, "engine._private (the model has it)")
    T.check_raises(AttributeError, "nor has its model (Net)", lambda: engine.no_such_thing, "engine.no_such_thing")
    T.check(not hasattr(engine, "no_such_thing"), "hasattr(engine, 'no_such_thing') is False")
    engine.close()
    T.check(engine.vocab == 7, "after close() the fall-through still works", getattr(engine, "vocab", None), 7)
    T.check_raises(AttributeError, "no_such_thing", lambda: engine.no_such_thing, "after close(): a missing name")
    bare = StrataEngine.__new__(StrataEngine)  # as during __init__, before the model is set
    T.check_raises(AttributeError, "vocab", lambda: bare.vocab, "an engine before __init__ set its model")
    T.check_raises(AttributeError, "module", lambda: bare.module, "engine.module before __init__ set it")


def scale_wrt_gas(seed):
    """engine.backward(loss, scale_wrt_gas=False) leaves the 1 / gradient_accumulation_steps to the caller (as
    transformers' Trainer divides its loss itself): backward(loss / 2, scale_wrt_gas=False) at accumulation 2 trains
    as backward(loss) does, and as plain torch does with (loss / 2).backward(); the flag left True divides again."""
    data = batches(seed, 4)
    config = {"gradient_accumulation_steps": 2}
    a, b, c = engine_of(seed, config), engine_of(seed, config), engine_of(seed, config)
    ref = net(seed)
    opt = adam_oracle.oracle(torch.optim.AdamW([p for p in ref.parameters() if p.requires_grad], **HP))
    for i, (x, y) in enumerate(data):
        a.backward(torch.nn.functional.mse_loss(a(x), y))
        b.backward(torch.nn.functional.mse_loss(b(x), y) / 2, scale_wrt_gas=False)
        c.backward(torch.nn.functional.mse_loss(c(x), y) / 2)
        (torch.nn.functional.mse_loss(ref(x), y) / 2).backward()
        for e in (a, b, c):
            e.step()
        if i % 2 == 1:
            opt.step()
            opt.zero_grad()
    want = {n: p.detach() for n, p in ref.named_parameters() if p.requires_grad}
    got_a, got_b, got_c = a.fp32_state_dict(), b.fp32_state_dict(), c.fp32_state_dict()
    same = all(torch.equal(got_b[n], got_a[n]) for n in want)
    T.check(same, "backward(loss / 2, scale_wrt_gas=False) == backward(loss) at accumulation 2, bit for bit",
            [n for n in want if not torch.equal(got_b[n], got_a[n])], [])
    diff = adam_oracle.first_difference(got_b, want)
    T.check(diff is None, "... and == torch's (loss / 2).backward(), %s" % adam_oracle.HOW, diff, "no difference")
    T.check(not all(torch.equal(got_c[n], got_a[n]) for n in want), "with scale_wrt_gas left True the loss is divided "
            "again (a different run)", "the same weights", "different weights")
    for e in (a, b, c):
        e.close()


seed = T.seed()
scale_wrt_gas(seed)
grad_norm(seed)
load_flags(seed)
save_16bit(seed)
fall_through(seed)
T.done()
