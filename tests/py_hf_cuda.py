"""StrataTrainer and strata.torch on a GPU, against the same transformers and torch on the same GPU (issue 34's GPU
checks; tools/gpu/items.sh runs it in the GPU call, and it skips where torch sees no GPU).

A tiny Llama trains 4 steps (where this python has transformers) with accumulation 2 through transformers.Trainer and through StrataTrainer (parameters
and optimizer state in host memory, compute on the GPU):
  - bf16 with the config's bf16 off: strata keeps fp32 weights under Trainer's autocast, as Trainer does. Trainer's
    AdamW runs on the GPU (the fused kernel on CUDA, whose rounding is its own), strata's on the CPU, so the weights
    agree within float rounding (1e-5), and the losses within 1e-4 relative;
  - bf16 by default (strata's weights bf16, as DeepSpeed's): the losses within bf16's rounding, 1e-2 relative over
    4 steps;
  - fp16: StrataTrainer must not hand Trainer's GradScaler an optimizer without gradients (torch asserts "No inf
    checks were recorded"); it trains with strata's own loss scaling, losses finite and within 1e-2 of Trainer's
    fp16 run, and the lr schedule stays put at any step strata skipped.
Then strata.torch.initialize on the GPU against torch.optim.AdamW on the same GPU, fp32: within 1e-6 (CUDA's AdamW
is torch's foreach kernel, strata's the CPU's).
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "helpers"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import strata_test as T  # noqa: E402

torch = T.require_torch()
if not torch.cuda.is_available():
    T.skip("torch %s sees no GPU" % torch.__version__)
import strata.torch  # noqa: E402

try:  # the GPU machine's python3 may have torch alone: the Trainer checks then say so and the rest runs
    import transformers
    import hf_models as H  # noqa: E402
    import py_hf_trainer as HT  # noqa: E402  (its data, arguments and model)
    from strata.torch.hf import StrataTrainer  # noqa: E402
except ImportError as e:
    transformers, why = None, str(e)


def cuda_args(out, **extra):
    extra.setdefault("use_cpu", False)
    return HT.args(out, 2, **extra)


def pair(seed, tag, precision, config):
    data = HT.Data(seed, HT.STEPS * 2)
    ref = transformers.Trainer(model=HT.model(seed), args=cuda_args(T.scratch("hf-cuda-ref-" + tag), **precision),
                               train_dataset=data)
    ref.train()
    st = StrataTrainer(model=HT.model(seed), args=cuda_args(T.scratch("hf-cuda-st-" + tag), **precision),
                       train_dataset=data, strata_config=config)
    st.train()
    return ref, st


def rel(a, b):
    return max(abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a, b))


def check_trainer(seed):
    host = {"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"},
                                  "offload_optimizer": {"device": "cpu"}}}
    ref, st = pair(seed, "bf16-fp32", {"bf16": True}, dict(host, bf16={"enabled": False}))
    got, want = HT.logged(st, "loss"), HT.logged(ref, "loss")
    T.check(len(got) == HT.STEPS and rel(got, want) <= 1e-4, "CUDA bf16 autocast, strata fp32 weights: Trainer's "
            "losses", got, want)
    w, v = st.engine.fp32_state_dict(), HT.weights(ref.model)
    worst = max((w[n] - v[n].float().cpu()).abs().max().item() for n in v)
    T.check(worst <= 1e-5, "CUDA bf16 autocast: weights within 1e-5 of Trainer's", worst, "<= 1e-5")
    st.engine.close()
    ref, st = pair(seed, "bf16", {"bf16": True}, host)
    got, want = HT.logged(st, "loss"), HT.logged(ref, "loss")
    T.check(st.engine.dtype == torch.bfloat16 and rel(got, want) <= 1e-2, "CUDA bf16 weights: losses within 1e-2",
            got, want)
    st.engine.close()
    ref, st = pair(seed, "fp16", {"fp16": True}, host)
    got, want = HT.logged(st, "loss"), HT.logged(ref, "loss")
    T.check(len(got) == HT.STEPS and all(x == x and abs(x) < 1e30 for x in got) and rel(got, want) <= 1e-2,
            "CUDA fp16 through StrataTrainer: trains with strata's loss scaling, losses within 1e-2 of Trainer's", got,
            want)
    st.engine.close()


def check_initialize(seed):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 64))
    ref = torch.nn.Sequential(*[torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 64)])
    ref.load_state_dict(model.state_dict())
    ref = ref.cuda()
    hp = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    opt = torch.optim.AdamW(ref.parameters(), **hp)
    engine = strata.torch.initialize(model=model, optimizer=torch.optim.AdamW(model.parameters(), **hp),
                                     config={"train_micro_batch_size_per_gpu": 8}, device="cuda")[0]
    g = torch.Generator().manual_seed(seed)
    for _ in range(5):
        x, y = torch.randn(8, 64, generator=g).cuda(), torch.randn(8, 64, generator=g).cuda()
        engine.backward(torch.nn.functional.mse_loss(engine(x), y))
        engine.step()
        torch.nn.functional.mse_loss(ref(x), y).backward()
        opt.step()
        opt.zero_grad()
    got = engine.fp32_state_dict()
    worst = max((got[n] - p.detach().cpu()).abs().max().item() for n, p in ref.named_parameters())
    T.check(worst <= 1e-6, "strata.torch on CUDA == torch.optim.AdamW on the same GPU (5 steps)", worst, "<= 1e-6")
    engine.close()


seed = T.seed()
print("torch %s, %s" % (torch.__version__, torch.cuda.get_device_name()))
if transformers is not None:
    print("transformers %s" % transformers.__version__)
    check_trainer(seed)
else:
    print("NOT RUN: the StrataTrainer checks (%s cannot import transformers: %s)" % (sys.executable, why))
check_initialize(seed)
T.done()
