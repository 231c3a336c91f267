"""strata.torch.load_pretrained: pretrained weights from safetensors files, against transformers' own from_pretrained.

- Tiny random GPT-2 (its head tied to the embedding) and Llama, saved by save_pretrained once as one file and once
  sharded (an index.json and several shards): built on the meta device (accelerate's init_empty_weights), loaded,
  and put through strata.torch.initialize at ZeRO stage 3 (parameters and optimizer on the CPU for the one file, on
  NVMe for the shards, a device budget below the model), they give eval logits bit-identical to from_pretrained's
  model on the same ids; so does a model with tensors of its own (from_config, other random weights) loaded in
  place, and one built under zero_init (its parameters stay the file-backed tensors they were). The sharded loads
  read in 1000-byte chunks, so that a tensor spans many reads.
- dtypes: F16, BF16 and F64 tensors convert into fp32 parameters (real, and meta through their source) as torch's
  .to() does, F64 into a bf16 parameter in one rounding, an integer buffer in its own dtype; an old GPT-2 checkpoint
  without "transformer." loads.
- Refused, naming the tensor and the file, with the model unchanged (a real model's values, a meta model's
  parameters: the same objects, still meta, no source): a renamed tensor (missing), a wrong shape, a truncated
  shard, I32 and I8 tensors where a float is expected, a dtype strata does not read, an index naming a missing
  shard, malformed headers, a path that is not there. With strict=False the renamed one is left as it was and the
  summary lists it as missing and the file's name as unexpected.
- Memory: in a child process, a 192 MiB checkpoint loaded into a zero_init model raises the peak RSS (VmHWM) by
  under a quarter of it; read whole by the safetensors package, by at least the model (the oracle that the measure
  sees it).
"""
import json
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "helpers"))
import strata_test as T  # noqa: E402
import hf_models as H  # noqa: E402

torch = T.require_torch()
transformers = H.require_transformers()  # this test in the venv that has transformers, or a skip
try:
    import accelerate
    from safetensors.torch import load_file, save_file
except ImportError as e:
    T.skip("%s cannot import %s; tools/run test makes the venvs (accelerate and safetensors from PyPI)"
           % (sys.executable, e.name))
import torch.nn as nn  # noqa: E402
import strata  # noqa: E402
import strata.torch  # noqa: E402
from strata.torch import _safetensors, _sources, _zero_init  # noqa: E402

SEED = T.seed()
SCRATCH = T.scratch("py_load_pretrained")
IDS = torch.randint(1, H.VOCAB, (H.BATCH, H.SEQ), generator=torch.Generator().manual_seed(SEED))


def saved(name):
    """(model class, config, one-file dir, sharded dir) of the model `name` from SEED, saved by save_pretrained."""
    config, cls, _ = H._configs(transformers)[name]
    model = H.build(transformers, name, SEED)
    one, sharded = os.path.join(SCRATCH, name + "-one"), os.path.join(SCRATCH, name + "-sharded")
    model.save_pretrained(one)
    model.save_pretrained(sharded, max_shard_size="20KB")
    shards = [f for f in os.listdir(sharded) if f.endswith(".safetensors")]
    T.check(os.path.isfile(os.path.join(one, "model.safetensors")), "%s: save_pretrained wrote model.safetensors"
            % name, sorted(os.listdir(one)), "model.safetensors")
    T.check(os.path.isfile(os.path.join(sharded, "model.safetensors.index.json")) and len(shards) > 1,
            "%s: save_pretrained(max_shard_size=20KB) wrote an index and shards" % name, sorted(os.listdir(sharded)),
            "an index and > 1 shard")
    return cls, config, one, sharded


def logits(model):
    model.eval()
    with torch.no_grad():
        return model(input_ids=IDS).logits


def same_logits(got, want, what):
    T.check(torch.equal(got, want), "%s: eval logits bit-identical to from_pretrained's" % what,
            "max |diff| %g" % (got - want).abs().max().item(), 0.0)


def unique_params(model):
    return list({id(p): p for p in model.parameters()}.values())


def engine_config(model, offload, nvme):
    # A device budget below the model's size, as tests/py_hf_models.py's: parameters come and go.
    model_bytes = sum(p.numel() * 4 for p in unique_params(model))
    layer = max(sum(p.numel() * 4 for p in layer.parameters()) for m in model.modules()
                if isinstance(m, nn.ModuleList) for layer in m)
    place = {"device": offload}
    if nvme:
        place["nvme_path"] = nvme
    return {"train_micro_batch_size_per_gpu": H.BATCH, "optimizer": H.optimizer_section(),
            "zero_optimization": {"stage": 3, "offload_param": dict(place), "offload_optimizer": dict(place),
                                  "stage3_param_persistence_threshold": 0},
            "strata": {"device_budget_bytes": max(model_bytes * 6 // 10, layer * 8, 256 << 10),
                       "prefetch_bytes": 64 << 10}}


def meta_model(config):
    with accelerate.init_empty_weights():
        return transformers.AutoModelForCausalLM.from_config(config)


def computes_numbers(model):
    """Whether a forward gives values: a meta weight makes torch refuse (2.x) or give meta tensors (1.13)."""
    try:
        with torch.no_grad():
            return not model(input_ids=IDS).logits.is_meta
    except (RuntimeError, NotImplementedError):
        return False


def check_meta(name, config, d, layout, offload, want):
    """Meta model + load_pretrained + initialize: from_pretrained's logits, through strata."""
    model = meta_model(config)
    summary = strata.torch.load_pretrained(model, d)
    params = unique_params(model)
    what = "%s %s, meta + load_pretrained + initialize (offload %s)" % (name, layout, offload)
    T.check(summary["sources"] == summary["parameters"] == summary["tensors"] == len(params),
            "%s: every parameter given a source" % what, summary, len(params))
    T.check(summary["bytes"] == sum(p.numel() * 4 for p in params) and not summary["missing_keys"]
            and not summary["unexpected_keys"], "%s: the summary counts the bytes, nothing missing or unexpected"
            % what, summary, sum(p.numel() * 4 for p in params))
    T.check(all(p.is_meta and _sources.source_of(p) is not None for p in params),
            "%s: every parameter stays on the meta device, with its source" % what)
    T.check(not computes_numbers(model), "%s: before initialize the model computes no numbers" % what)
    if name == "gpt2":
        T.check(model.lm_head.weight is model.transformer.wte.weight, "%s: the head is tied again" % what)
    nvme = T.scratch("py_load_pretrained-nvme") if offload == "nvme" else None
    tight = engine_config(model, offload, nvme)
    tight["strata"]["device_budget_bytes"] = 4096
    T.check_raises(strata.errors.BudgetError, "device budget", lambda: strata.torch.initialize(
        model=model, config=tight, device="cpu"), "%s: a device budget too small refused" % what)
    T.check(all(p.is_meta and _sources.source_of(p) is not None for p in unique_params(model)) and
            not computes_numbers(model), "%s: the refused initialize puts the meta parameters back" % what)
    engine, _, _, _ = strata.torch.initialize(model=model, config=engine_config(model, offload, nvme), device="cpu")
    engine.eval()
    with torch.no_grad():
        got = engine(input_ids=IDS).logits
    same_logits(got, want, what)
    engine.close()


def check_in_place(name, cls, config, d, layout):
    """A model with tensors of its own, plain or under zero_init, overwritten in place."""
    want = logits(cls.from_pretrained(d))
    torch.manual_seed(SEED + 1)
    plain = transformers.AutoModelForCausalLM.from_config(config)
    ids = [id(p) for p in plain.parameters()]
    strata.torch.load_pretrained(plain, d)
    T.check([id(p) for p in plain.parameters()] == ids, "%s %s: the parameters are loaded in place" % (name, layout))
    same_logits(logits(plain), want, "%s %s, from_config + load_pretrained" % (name, layout))
    with strata.torch.zero_init(staging_dir=SCRATCH, min_bytes=1):
        staged = transformers.AutoModelForCausalLM.from_config(config)
    summary = strata.torch.load_pretrained(staged, d)
    backed = [p for p in staged.parameters() if _zero_init._STAGING.find(p.data_ptr()) is not None]
    T.check(len(backed) == len(list(staged.parameters())) and summary["sources"] == 0,
            "%s %s, zero_init: the parameters stay file-backed" % (name, layout), len(backed),
            len(list(staged.parameters())))
    same_logits(logits(staged), want, "%s %s, zero_init + load_pretrained" % (name, layout))
    return want


def check_models():
    for name in ("gpt2", "llama"):
        cls, config, one, sharded = saved(name)
        for layout, d, offload, chunk in (("one file", one, "cpu", _safetensors.CHUNK_BYTES),
                                          ("sharded", sharded, "nvme", 1000)):
            default, _safetensors.CHUNK_BYTES = _safetensors.CHUNK_BYTES, chunk
            try:
                want = check_in_place(name, cls, config, d, layout)
                check_meta(name, config, d, layout, offload, want)
            finally:
                _safetensors.CHUNK_BYTES = default
    # An old GPT-2 checkpoint: its names lack the base model's "transformer.".
    _, config, one, _ = saved("gpt2")
    old = os.path.join(SCRATCH, "gpt2-old.safetensors")
    save_file({k[len("transformer."):]: v for k, v in load_file(os.path.join(one, "model.safetensors")).items()}, old)
    torch.manual_seed(SEED + 2)
    model = transformers.AutoModelForCausalLM.from_config(config)
    summary = strata.torch.load_pretrained(model, old)
    T.check(not summary["missing_keys"] and not summary["unexpected_keys"], "names without transformer. all match",
            summary["missing_keys"][:3] + summary["unexpected_keys"][:3], [])
    same_logits(logits(model), logits(transformers.GPT2LMHeadModel.from_pretrained(one)), "gpt2, an old checkpoint")


class Small(nn.Module):
    def __init__(self, dtype=torch.float32):
        super().__init__()
        self.a = nn.Parameter(torch.zeros(3, 5, dtype=dtype))
        self.b = nn.Parameter(torch.zeros(7, dtype=dtype))
        self.c = nn.Parameter(torch.zeros(2, 2, 3, dtype=dtype))
        self.register_buffer("steps", torch.zeros(4, dtype=torch.int64))
        self.register_buffer("scale", torch.zeros(5))
        self.register_buffer("cache", torch.zeros(5), persistent=False)


def check_dtypes():
    g = torch.Generator().manual_seed(SEED + 3)
    values = {"a": torch.randn(3, 5, generator=g, dtype=torch.float64), "b": torch.randn(7, generator=g),
              "c": torch.randn(2, 2, 3, generator=g)}
    stored = {"a": values["a"], "b": values["b"].bfloat16(), "c": values["c"].half(),
              "steps": torch.arange(4, dtype=torch.int64) * 1000003, "scale": torch.randn(5, generator=g)}
    path = os.path.join(SCRATCH, "dtypes.safetensors")
    save_file(stored, path)
    _safetensors.CHUNK_BYTES, default = 8, _safetensors.CHUNK_BYTES  # an element or four a read
    try:
        real = Small()
        summary = strata.torch.load_pretrained(real, path)
        for k, v in stored.items():
            got = getattr(real, k)
            T.check(torch.equal(got, v.to(got.dtype)), "%s (%s) into a %s tensor: torch's conversion"
                    % (k, v.dtype, got.dtype), got.flatten()[:3].tolist(), v.flatten()[:3].tolist())
        T.check(summary["parameters"] == 3 and summary["buffers"] == 2 and real.cache.abs().sum() == 0,
                "3 parameters and the 2 persistent buffers loaded, the other buffer left", summary, (3, 2))
        half = Small(torch.bfloat16)
        strata.torch.load_pretrained(half, path)
        T.check(torch.equal(half.a, values["a"].bfloat16()), "F64 into a bf16 parameter: one rounding",
                half.a.flatten()[:3].tolist(), values["a"].bfloat16().flatten()[:3].tolist())
        with accelerate.init_empty_weights(include_buffers=True):
            meta = Small()
        strata.torch.load_pretrained(meta, path)
        for k in ("a", "b", "c"):
            p = getattr(meta, k)
            out = torch.empty(p.numel())
            _sources.source_of(p).read_into(1, p.numel() - 1, out[1:])
            want = stored[k].float().flatten()
            T.check(torch.equal(out[1:], want[1:]), "meta %s: its source reads elements [1, n) as fp32" % k,
                    out[1:4].tolist(), want[1:4].tolist())
        T.check(not meta.steps.is_meta and torch.equal(meta.steps, stored["steps"]),
                "a meta buffer gets a real tensor with the file's values", meta.steps.tolist(),
                stored["steps"].tolist())
    finally:
        _safetensors.CHUNK_BYTES = default


def rewrite(src, dst, edit):
    """dst: src with its header edited (edit(header) -> header), the data as it was."""
    with open(src, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
        data = f.read()
    text = json.dumps(edit(header)).encode()
    with open(dst, "wb") as f:
        f.write(len(text).to_bytes(8, "little") + text + data)


def last_tensor(path):
    with open(path, "rb") as f:
        header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
    return max((k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"][1])


def cases(one, sharded):
    """(what, path, error class, fragments its message must hold)."""
    sd = load_file(os.path.join(one, "model.safetensors"))
    made = []

    def variant(change):
        path = os.path.join(SCRATCH, "bad-%d.safetensors" % len(made))
        d = dict(sd)
        change(d)
        save_file(d, path)
        made.append(path)
        return path

    qkv, fc, ln = "transformer.h.0.attn.c_attn.weight", "transformer.h.1.mlp.c_fc.weight", "transformer.ln_f.weight"
    inv, uns, bad = strata.errors.InvalidArgument, strata.errors.Unsupported, strata.errors.CorruptError
    out = [("a renamed tensor", variant(lambda d: d.update({qkv + "_renamed": d.pop(qkv)})), inv,
            [qkv, "bad-0.safetensors", "strict=False", qkv + "_renamed"]),
           ("a wrong shape", variant(lambda d: d.update({fc: d[fc].t().contiguous()})), inv,
            [fc, "bad-1.safetensors", str(list(sd[fc].shape)), str(list(sd[fc].t().shape))]),
           ("an I32 tensor for a float", variant(lambda d: d.update({ln: d[ln].int()})), uns,
            [ln, "bad-2.safetensors", "is I32", "F32, F16, BF16, F64"]),
           ("an I8 tensor for a float", variant(lambda d: d.update({qkv: d[qkv].to(torch.int8)})), uns,
            [qkv, "bad-3.safetensors", "is I8"])]
    f8 = os.path.join(SCRATCH, "f8.safetensors")
    rewrite(os.path.join(one, "model.safetensors"), f8,
            lambda h: dict(h, **{ln: dict(h[ln], dtype="F8_E4M3")}))
    out.append(("a dtype strata does not read", f8, uns, [ln, f8, "F8_E4M3", "does not read"]))
    index = json.load(open(os.path.join(sharded, "model.safetensors.index.json")))
    shard = index["weight_map"][fc]
    short = os.path.join(SCRATCH, "truncated")
    shutil.copytree(sharded, short)
    with open(os.path.join(short, shard), "r+b") as f:
        f.truncate(os.path.getsize(os.path.join(short, shard)) - 100)
    out.append(("a truncated shard", short, bad, [last_tensor(os.path.join(sharded, shard)),
                                                  os.path.join(short, shard), "truncated"]))
    gone = os.path.join(SCRATCH, "missing-shard")
    shutil.copytree(sharded, gone)
    os.remove(os.path.join(gone, shard))
    out.append(("an index naming a missing shard", os.path.join(gone, "model.safetensors.index.json"),
                strata.errors.NotFound, [os.path.join(gone, shard), "is missing", fc]))
    huge = os.path.join(SCRATCH, "huge-header.safetensors")
    with open(huge, "wb") as f:
        f.write((1 << 40).to_bytes(8, "little") + b"{}")
    out.append(("a header length past the file", huge, bad, [huge, "header length"]))
    garbled = os.path.join(SCRATCH, "garbled.safetensors")
    with open(garbled, "wb") as f:
        f.write((5).to_bytes(8, "little") + b"{\"a\":")
    out.append(("a header that is not JSON", garbled, bad, [garbled, "not JSON"]))
    offsets = os.path.join(SCRATCH, "offsets.safetensors")
    rewrite(os.path.join(one, "model.safetensors"), offsets,
            lambda h: dict(h, **{ln: dict(h[ln], data_offsets=[0, 4])}))
    out.append(("data_offsets that do not fit the shape", offsets, bad, [ln, offsets, "data_offsets"]))
    out.append(("a path that is not there", os.path.join(SCRATCH, "nothing"), strata.errors.NotFound,
                [os.path.join(SCRATCH, "nothing"), "does not exist"]))
    out.append(("a directory without a checkpoint", SCRATCH, strata.errors.NotFound,
                [SCRATCH, "model.safetensors.index.json"]))
    return out


def check_refusals():
    _, config, one, sharded = saved("gpt2")
    torch.manual_seed(SEED + 4)
    real = transformers.AutoModelForCausalLM.from_config(config)
    before = {k: v.clone() for k, v in real.state_dict().items()}
    meta = meta_model(config)
    meta_params = dict(meta.named_parameters())
    for what, path, error, fragments in cases(one, sharded):
        for kind, model in (("real", real), ("meta", meta)):
            try:
                strata.torch.load_pretrained(model, path)
                T.check(False, "%s: refused" % what, "loaded", error.__name__)
                continue
            except error as e:
                message = str(e)
            except Exception as e:  # the wrong kind of failure
                T.check(False, "%s: refused with %s" % (what, error.__name__), "%s: %s" % (type(e).__name__, e),
                        error.__name__)
                continue
            lacking = [f for f in fragments if f not in message]
            T.check(not lacking, "%s (%s model): the message names %s" % (what, kind, fragments), repr(message),
                    lacking)
        changed = [k for k, v in real.state_dict().items() if not torch.equal(v, before[k])]
        T.check(not changed, "%s: the real model's values unchanged" % what, changed[:3], [])
        now = dict(meta.named_parameters())
        T.check(list(now) == list(meta_params) and all(now[k] is p and p.is_meta and _sources.source_of(p) is None
                                                       for k, p in meta_params.items()),
                "%s: the meta model's parameters unchanged (the same, meta, no source)" % what)
    print("last refusal: %s" % message)
    # strict=False: the renamed tensor is left as it was and listed, the name it has in the file too.
    qkv = "transformer.h.0.attn.c_attn.weight"
    path = os.path.join(SCRATCH, "bad-0.safetensors")
    keep = real.transformer.h[0].attn.c_attn.weight.detach().clone()
    summary = strata.torch.load_pretrained(real, path, strict=False)
    T.check(summary["missing_keys"] == [qkv] and summary["unexpected_keys"] == [qkv + "_renamed"],
            "strict=False: the summary lists the missing and the unexpected tensor",
            (summary["missing_keys"], summary["unexpected_keys"]), ([qkv], [qkv + "_renamed"]))
    T.check(torch.equal(real.transformer.h[0].attn.c_attn.weight, keep), "strict=False: the missing one is left")
    ln = real.transformer.ln_f.weight
    T.check(torch.equal(ln, load_file(path)["transformer.ln_f.weight"]), "strict=False: the others are loaded")
    summary = strata.torch.load_pretrained(meta, path, strict=False)
    others = len(unique_params(meta)) - 1
    T.check(meta.transformer.h[0].attn.c_attn.weight.is_meta and summary["sources"] == others,
            "strict=False, meta: the missing one stays on the meta device, the others get sources",
            summary["sources"], others)
    T.check_raises(strata.errors.InvalidArgument, "meta device", lambda: strata.torch.initialize(
        model=meta, config=engine_config(meta, "cpu", None), device="cpu"),
        "initialize after a load that left a meta parameter")
    T.check_raises(strata.errors.InvalidArgument, "torch.nn.Module",
                   lambda: strata.torch.load_pretrained({"a": 1}, path), "a model that is not a Module")

CHILD = r"""
import json, sys
import torch, torch.nn as nn
import strata.torch
def rss(key):
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) << 10 for l in f if l.startswith(key))
how, path, stage, layers = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
with strata.torch.zero_init(staging_dir=stage):
    model = nn.Sequential(*[nn.Linear(2048, 2048, bias=False) for _ in range(layers)])
base = rss("VmRSS:")
if how == "load_pretrained":
    strata.torch.load_pretrained(model, path)
else:  # the oracle: the safetensors package reads every tensor whole
    from safetensors.torch import load_file
    model.load_state_dict(load_file(path))
rise = rss("VmHWM:") - base
from safetensors import safe_open
with safe_open(path, framework="pt") as f:
    same = all(torch.equal(model[i].weight[-1], f.get_slice("%d.weight" % i)[-1]) for i in range(layers))
print(json.dumps({"rise": rise, "same": same}))
"""


def check_memory():
    """In children: a 192 MiB checkpoint loaded into a zero_init model raises the peak RSS (VmHWM) by under a
    quarter of it; read whole by the safetensors package, by at least the model (the oracle that the measure sees
    it)."""
    layers = 12
    path = os.path.join(SCRATCH, "big.safetensors")
    g = torch.Generator().manual_seed(SEED + 5)
    save_file({"%d.weight" % i: torch.randn(2048, 2048, generator=g) for i in range(layers)}, path)
    nbytes = layers * 2048 * 2048 * 4
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    rises = {}
    for how in ("load_pretrained", "load_file"):
        out = subprocess.run([sys.executable, "-c", CHILD, how, path, SCRATCH, str(layers)], env=env,
                             capture_output=True, text=True, timeout=120)
        if not T.check(out.returncode == 0, "the %s child ran" % how, out.stderr[-2000:], "exit 0"):
            return
        got = json.loads(out.stdout.strip().splitlines()[-1])
        T.check(got["same"], "%s: the zero_init model holds the file's values" % how)
        rises[how] = got["rise"]
    os.remove(path)
    mib = lambda n: "%.1f MiB" % (n / 2**20)  # noqa: E731
    T.check(rises["load_file"] >= 0.9 * nbytes, "safetensors' load_file: VmHWM rises by the model (the oracle)",
            mib(rises["load_file"]), ">= " + mib(0.9 * nbytes))
    T.check(rises["load_pretrained"] < nbytes / 4, "load_pretrained: VmHWM rises by under a quarter of the model",
            mib(rises["load_pretrained"]), "< " + mib(nbytes / 4))
    print("peak RSS rise loading %s into a zero_init model: load_pretrained %s, safetensors' load_file %s"
          % (mib(nbytes), mib(rises["load_pretrained"]), mib(rises["load_file"])))


def main():
    print("transformers %s, torch %s, accelerate %s" % (transformers.__version__, torch.__version__,
                                                         accelerate.__version__))
    check_models()
    check_dtypes()
    check_refusals()
    check_memory()
    T.done()


if __name__ == "__main__":
    main()
