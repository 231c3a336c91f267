"""strata.torch.zero_init: models built with their large tensors on disk, against the same models built plainly.

- The weights are bit-identical to a plain construction from the same seed, for torch's own modules (Linear,
  Embedding, LayerNorm: their reset_parameters) and for Hugging Face models (GPT-2, Llama: post_init's
  _init_weights, tied embeddings), and the large ones really are file-backed (each in a staging mapping).
- initialize takes such a model: two steps of ZeRO-3 with parameters and optimizer on NVMe give the losses and
  weights of the same model built plainly, and the staging files are gone once strata holds the values.
- Memory: in a child process, a 384 MiB (fp32) stack of Linear layers built under zero_init raises the peak RSS
  (VmHWM) by less than a quarter of that; built plainly, by at least the model (the oracle that the measure sees it).
- Refused, naming what to do: DeepSpeed arguments strata does not take, a staging directory on tmpfs or missing, a
  disk without room (RLIMIT_FSIZE in a child), meta parameters without values, meta buffers.
"""
import json
import os
import resource
import signal
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "helpers"))
import strata_test as T  # noqa: E402
import hf_models as H  # noqa: E402

torch = T.require_torch()
transformers = H.require_transformers()  # this test in the venv that has transformers, or a skip
import torch.nn as nn  # noqa: E402
import strata  # noqa: E402
import strata.torch  # noqa: E402
from strata.torch import _zero_init  # noqa: E402

SEED = T.seed()
SCRATCH = T.scratch("py_zero_init")
STAGE = os.path.join(SCRATCH, "stage")
os.makedirs(STAGE)


class Net(nn.Module):
    """torch's own modules, an embedding tied to the head, and a buffer: each initialised by its constructor."""

    def __init__(self, vocab=1000, width=96, layers=3):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList(nn.Sequential(nn.LayerNorm(width), nn.Linear(width, 4 * width), nn.GELU(),
                                                  nn.Linear(4 * width, width)) for _ in range(layers))
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.embed.weight
        self.register_buffer("scale", torch.ones(width))

    def forward(self, ids, labels):
        x = self.embed(ids) * self.scale
        for b in self.blocks:
            x = x + b(x)
        return nn.functional.cross_entropy(self.head(x).flatten(0, 1), labels.flatten())


def build(make, staged, **kw):
    torch.manual_seed(SEED)
    if not staged:
        return make(), None
    with strata.torch.zero_init(staging_dir=STAGE, **kw) as z:
        model = make()
    return model, z


def same_weights(a, b, what):
    sa, sb = a.state_dict(), b.state_dict()
    T.check(list(sa) == list(sb), "%s: the same tensors" % what, list(sa)[:4], list(sb)[:4])
    for name in sa:
        if not torch.equal(sa[name], sb[name]):
            T.check(False, "%s: %s bit-identical to the plain construction" % (what, name),
                    "max |diff| %g" % (sa[name].float() - sb[name].float()).abs().max().item(), 0)
            return
    T.check(True, "%s: every tensor bit-identical" % what)


def file_backed(model):
    return [n for n, p in model.named_parameters() if _zero_init._STAGING.find(p.data_ptr()) is not None]


def check_construction():
    plain, _ = build(Net, False)
    staged, z = build(Net, True, min_bytes=4096)
    same_weights(plain, staged, "Net")
    big = [n for n, p in plain.named_parameters() if p.numel() * 4 >= 4096]
    T.check(sorted(file_backed(staged)) == sorted(big), "Net: the tensors of 4096 bytes or more are file-backed",
            sorted(file_backed(staged)), sorted(big))
    T.check(z.staged_tensors >= len(big) and z.staged_bytes >= sum(plain.state_dict()[n].numel() * 4 for n in big),
            "Net: staged_tensors / staged_bytes count them", (z.staged_tensors, z.staged_bytes), len(big))
    T.check(staged.head.weight is staged.embed.weight, "Net: the tie survives")
    T.check(os.listdir(STAGE) == [], "the staging files are unlinked from the start", os.listdir(STAGE), [])
    x = torch.randint(0, 1000, (2, 8), generator=torch.Generator().manual_seed(SEED))
    T.check(torch.equal(plain(x, x), staged(x, x)), "Net: the staged model computes the same loss")


def check_hf():
    for name in ("gpt2", "llama"):
        config, cls, _ = H._configs(transformers)[name]
        plain, _ = build(lambda: cls(config), False)
        staged, _ = build(lambda: cls(config), True, min_bytes=1)
        same_weights(plain, staged, name)
        T.check(len(file_backed(staged)) == len(list(staged.parameters())), "%s: every parameter file-backed" % name,
                len(file_backed(staged)), len(list(staged.parameters())))


def engine_config(nvme):
    return {"train_micro_batch_size_per_gpu": 2, "gradient_clipping": 1.0,
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.01}},
            "zero_optimization": {"stage": 3, "offload_param": {"device": "nvme", "nvme_path": nvme},
                                  "offload_optimizer": {"device": "nvme", "nvme_path": nvme}},
            "strata": {"device_budget_bytes": 4 << 20, "host_budget_bytes": 256 << 20}}


def train(model, nvme):
    os.makedirs(nvme, exist_ok=True)
    engine, _, _, _ = strata.torch.initialize(model=model, config=engine_config(nvme))
    g = torch.Generator().manual_seed(SEED + 1)
    losses = []
    for _ in range(2):
        x = torch.randint(0, 1000, (2, 8), generator=g)
        loss = engine(x, x)
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    weights = {k: v.clone() for k, v in engine.fp32_state_dict().items()}
    engine.close()
    return losses, weights


def check_initialize():
    plain, _ = build(Net, False)
    staged, _ = build(Net, True, min_bytes=4096)
    want, want_w = train(plain, os.path.join(SCRATCH, "nvme_plain"))
    before = _zero_init.staged_bytes()
    got, got_w = train(staged, os.path.join(SCRATCH, "nvme_staged"))
    T.check(got == want, "initialize(zero_init model): the plain model's losses", got, want)
    T.check(all(torch.equal(got_w[k], want_w[k]) for k in want_w), "initialize(zero_init model): the same weights")
    T.check(before > 0 and _zero_init.staged_bytes() == 0, "the staging mappings are gone once strata holds the "
            "values", (before, _zero_init.staged_bytes()), "(>0, 0)")


CHILD = r"""
import json, os, resource, sys
import torch, torch.nn as nn
import strata.torch
def rss(key):
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) << 10 for l in f if l.startswith(key))
torch.manual_seed(1)
nn.Linear(8, 8)  # torch's first-use allocations, before the baseline
base = rss("VmRSS:")
staged = sys.argv[1] == "staged"
if staged:
    z = strata.torch.zero_init(staging_dir=sys.argv[2])
    z.__enter__()
model = nn.Sequential(*[nn.Linear(2048, 2048) for _ in range(24)])
if staged:
    z.__exit__(None, None, None)
print(json.dumps({"rise": rss("VmHWM:") - base, "bytes": sum(p.numel() * 4 for p in model.parameters())}))
"""


def child(*args, **popen):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    out = subprocess.run([sys.executable, "-c", CHILD] + list(args), env=env, capture_output=True, text=True,
                         timeout=120, **popen)
    if out.returncode != 0:
        T.check(False, "the memory child ran", out.stderr[-2000:], "exit 0")
        return None
    return json.loads(out.stdout.strip().splitlines()[-1])


def check_memory():
    plain, staged = child("plain", STAGE), child("staged", STAGE)
    if not plain or not staged:
        return
    mib = lambda n: "%.1f MiB" % (n / 2**20)  # noqa: E731
    T.check(plain["rise"] >= 0.9 * plain["bytes"], "plain construction: VmHWM rises by the model (the oracle)",
            mib(plain["rise"]), ">= " + mib(0.9 * plain["bytes"]))
    T.check(staged["rise"] < staged["bytes"] / 4, "zero_init: VmHWM rises by under a quarter of the model",
            mib(staged["rise"]), "< " + mib(staged["bytes"] / 4))
    print("peak RSS rise building %s of Linear weights: plain %s, zero_init %s" %
          (mib(plain["bytes"]), mib(plain["rise"]), mib(staged["rise"])))


def no_room():
    """In a child: the disk 'full' at 1 MiB (RLIMIT_FSIZE, its signal ignored) gives a clear error, not a SIGBUS."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
    try:
        with strata.torch.zero_init(staging_dir=STAGE):
            nn.Linear(1024, 1024)
    except strata.errors.OutOfMemory as e:
        print("REFUSED " + str(e))
        sys.exit(0)
    print("NOT REFUSED")
    sys.exit(1)


def check_refusals():
    inv = strata.errors.InvalidArgument
    T.check_raises(inv, "remote_device", lambda: strata.torch.zero_init(remote_device="cpu"),
                   "a DeepSpeed argument strata does not take")
    T.check_raises(inv, "unknown argument", lambda: strata.torch.zero_init(stagin_dir=STAGE), "a misspelt argument")
    T.check_raises(inv, "not a directory", lambda: strata.torch.zero_init(staging_dir=os.path.join(SCRATCH, "no")),
                   "a missing staging directory")
    if os.path.isdir("/dev/shm") and _zero_init._file_system("/dev/shm") == "tmpfs":
        T.check_raises(strata.errors.ConfigError, "tmpfs", lambda: strata.torch.zero_init(staging_dir="/dev/shm"),
                       "a staging directory in memory")
    nvme = os.path.join(SCRATCH, "nvme_cfg")
    os.makedirs(nvme)
    T.check(strata.torch.zero_init(engine_config(nvme)).dir == os.path.realpath(nvme),
            "the config's offload_param.nvme_path is the default staging directory")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), STRATA_ZERO_INIT_CHILD="no_room")
    out = subprocess.run([sys.executable, os.path.abspath(__file__)], env=env, capture_output=True, text=True,
                         timeout=120)
    T.check(out.returncode == 0 and "no room in" in out.stdout, "a full disk: refused naming the directory",
            (out.returncode, out.stdout[-400:] + out.stderr[-400:]), "REFUSED ... no room in")
    meta = nn.Linear(4, 4, device="meta")
    T.check_raises(inv, "meta device", lambda: strata.torch.initialize(model=meta, config=engine_config(nvme)),
                   "meta parameters without values")
    withbuf = nn.Linear(4, 4)
    withbuf.register_buffer("mask", torch.empty(4, device="meta"))
    T.check_raises(inv, "init_empty_weights", lambda: strata.torch.initialize(model=withbuf,
                                                                             config=engine_config(nvme)),
                   "a meta buffer")


if os.environ.get("STRATA_ZERO_INIT_CHILD") == "no_room":
    T.child_process()
    no_room()
check_construction()
check_initialize()
check_memory()
check_refusals()
check_hf()
T.done()
