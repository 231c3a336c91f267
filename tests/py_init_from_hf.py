"""`strata train --init-from` of Hugging Face GPT-2 weights, against transformers' own loss.

A random tiny GPT2LMHeadModel (dropout off) is saved with save_pretrained (one model.safetensors, F32; its tied
lm_head left out as transformers leaves it), and again sharded into a model.safetensors.index.json with two files in
bf16; its weights also go into a bare .safetensors with the "transformer." prefix. The data is one window of
seq + 1 random bytes, so strata's first step sees exactly tokens[:seq] -> tokens[1:]; its first loss must equal
transformers' cross-entropy on the same tokens to fp32 rounding (both printed), for each form of the file (the bf16
shards against the bf16-rounded model's loss). A model whose shape differs is refused with the flag to change.
Runs under the venv that has transformers (hf_models.require_transformers), else skips.
"""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "helpers"))
import strata_test as T  # noqa: E402
import hf_models as H  # noqa: E402

torch = T.require_torch()
transformers = H.require_transformers()

LAYERS, HEADS, HIDDEN, VOCAB, CONTEXT, SEQ = 2, 4, 32, 256, 24, 16
BIN = os.environ.get("STRATA_BIN") or os.path.join(T.BUILD_DIR, "strata")
seed = T.seed()
scratch = T.scratch("py_init_from_hf")

torch.manual_seed(seed)
config = transformers.GPT2Config(vocab_size=VOCAB, n_embd=HIDDEN, n_layer=LAYERS, n_head=HEADS, n_positions=CONTEXT,
                                 resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
model = transformers.GPT2LMHeadModel(config).eval()
hf_dir = os.path.join(scratch, "hf")
model.save_pretrained(hf_dir, safe_serialization=True)
sharded = os.path.join(scratch, "sharded")
import copy  # noqa: E402
copy.deepcopy(model).to(torch.bfloat16).save_pretrained(sharded, safe_serialization=True, max_shard_size="40KB")
T.check(os.path.exists(os.path.join(sharded, "model.safetensors.index.json")), "save_pretrained wrote shards")
from safetensors.torch import save_file  # noqa: E402
prefixed = os.path.join(scratch, "prefixed.safetensors")
save_file({k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}, prefixed)

data = bytes(torch.randint(0, 256, (SEQ + 1,), generator=torch.Generator().manual_seed(seed)).tolist())
data_path = os.path.join(scratch, "data.bin")
with open(data_path, "wb") as f:
    f.write(data)
ids = torch.tensor([list(data)], dtype=torch.long)


def hf_loss(m):
    with torch.no_grad():
        logits = m(ids[:, :SEQ]).logits.double()
    return torch.nn.functional.cross_entropy(logits.view(-1, VOCAB), ids[0, 1:].view(-1)).item()


shape = ["--layers", str(LAYERS), "--heads", str(HEADS), "--hidden", str(HIDDEN), "--vocab", str(VOCAB),
         "--context", str(CONTEXT)]


def strata_train(init_from, extra=()):
    log = os.path.join(scratch, "log.jsonl")
    if os.path.exists(log):
        os.remove(log)
    cmd = [BIN, "train", *shape, "--seq", str(SEQ), "--batch", "1", "--steps", "1", "--data", data_path, "--device",
           "host", "--threads", "1", "--quiet", "--init-from", init_from, "--log-jsonl", log, *extra]
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    loss = None
    if r.returncode == 0:
        with open(log) as f:
            loss = json.loads(f.readline())["loss"]
    return r, loss


want = hf_loss(model)
bf16_model = transformers.GPT2LMHeadModel(config).eval()
bf16_model.load_state_dict({k: v.to(torch.bfloat16).float() for k, v in model.state_dict().items()})
want_bf16 = hf_loss(bf16_model)
for name, path, ref in (("save_pretrained directory", hf_dir, want),
                        ("its model.safetensors", os.path.join(hf_dir, "model.safetensors"), want),
                        ("transformer.-prefixed file", prefixed, want),
                        ("bf16 shards (index)", sharded, want_bf16)):
    r, got = strata_train(path)
    if not T.check(r.returncode == 0, "%s: strata train --init-from runs" % name, r.returncode, 0):
        print(r.stdout)
        continue
    T.check("Hugging Face GPT-2 layout" in r.stdout, "%s: the header names the weights' layout" % name)
    # The log prints 6 decimals; the rest is fp32 against float64 logits.
    print("%-28s first loss: strata %.6f, transformers %.9f (diff %.2e)" % (name, got, ref, abs(got - ref)))
    T.check(abs(got - ref) < 2e-6, "%s: strata's first loss equals transformers'" % name, got, ref)

# A model of another shape: the flag to change is named.
# The heads leave every tensor's shape as it is: config.json beside the weights tells them, else the header says.
r, _ = strata_train(hf_dir)
T.check("%d heads, as" % HEADS in r.stdout and "config.json" in r.stdout, "the heads checked against config.json",
        r.stdout[-400:], "%d heads, as .../config.json says" % HEADS)
r, _ = strata_train(hf_dir, ["--heads", str(HEADS * 2)])
T.check(r.returncode == 2 and "set --heads %d" % HEADS in r.stdout, "another --heads is refused naming config.json",
        r.stdout[-400:], "set --heads %d" % HEADS)
r, _ = strata_train(prefixed)
T.check(r.returncode == 0 and ("heads (%d) not checked" % HEADS in r.stdout or "%d heads, as" % HEADS in r.stdout),
        "a lone file: the header says whether the heads were checked", r.stdout[-400:], "heads ... checked")
r, _ = strata_train(hf_dir, ["--hidden", "64"])
T.check(r.returncode == 1 and "set --hidden 32" in r.stdout and "wte.weight" in r.stdout,
        "another --hidden is refused naming the tensor and the flag", r.stdout[-400:], "set --hidden 32")
r, _ = strata_train(hf_dir, ["--context", "32"])
T.check(r.returncode == 1 and "set --context %d" % CONTEXT in r.stdout, "another --context is refused",
        r.stdout[-400:], "set --context %d" % CONTEXT)
T.done()
