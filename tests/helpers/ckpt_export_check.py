"""What tests/cli_ckpt_export.sh checks an exported file against, in Debian's Python with torch (exit 77 without it).

  gpt-oracle DUMP LAYERS HIDDEN VOCAB CONTEXT OUT.pt   the final master weights `strata train --dump-weights` wrote
      (raw fp32 in model order), cut into the built-in GPT's tensors by an independent statement of its layout
      (names, order, and nn.Linear's out x in shapes), saved as {name: tensor}
  flat-ckpt DIR OUT.pt SEED    a checkpoint of an Engine driven by hand that declares no shapes (fresh random
      weights, one step), saved to DIR; its master weights as the engine reports them (read_master), flat
  compare FILE ORACLE.pt DTYPE   FILE parsed as safetensors by hand (8-byte length, JSON header, data; torch 1.13
      has no safetensors module) must hold exactly the oracle's tensors, each in its shape, of DTYPE (F32, BF16, F16)
      and equal bit for bit to the oracle converted by torch (round to nearest even)
Prints FAIL lines with both values; exits 1 on any."""
import json
import os
import random
import sys

try:
    import torch
except ImportError:
    print("SKIP: %s cannot import torch (install Debian's python3-torch)" % sys.executable)
    sys.exit(77)

DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}
failed = []


def fail(what, got, want):
    failed.append(what)
    print("FAIL %s: got %s, want %s" % (what, got, want))


def gpt_layout(layers, h, vocab, context):
    """The built-in GPT's parameters in registration order with their shapes (model/gpt.h, PyTorch's layout)."""
    out = [("embeddings.wte", [vocab, h]), ("embeddings.wpe", [context, h])]
    for b in range(layers):
        p = "block%d." % b
        out += [(p + "ln1.weight", [h]), (p + "ln1.bias", [h]), (p + "attn.qkv.weight", [3 * h, h]),
                (p + "attn.qkv.bias", [3 * h]), (p + "attn.proj.weight", [h, h]), (p + "attn.proj.bias", [h]),
                (p + "ln2.weight", [h]), (p + "ln2.bias", [h]), (p + "mlp.fc.weight", [4 * h, h]),
                (p + "mlp.fc.bias", [4 * h]), (p + "mlp.proj.weight", [h, 4 * h]), (p + "mlp.proj.bias", [h])]
    return out + [("ln_f.ln_f.weight", [h]), ("ln_f.ln_f.bias", [h])]


def gpt_oracle(dump, layers, hidden, vocab, context, out):
    with open(dump, "rb") as f:
        flat = torch.frombuffer(bytearray(f.read()), dtype=torch.float32)
    layout = gpt_layout(int(layers), int(hidden), int(vocab), int(context))
    total = sum(torch.Size(s).numel() for _, s in layout)
    if flat.numel() != total:
        fail("%s holds the model's elements" % dump, flat.numel(), total)
        return
    tensors, pos = {}, 0
    for name, shape in layout:
        n = torch.Size(shape).numel()
        tensors[name] = flat[pos:pos + n].clone().view(shape)
        pos += n
    torch.save(tensors, out)


def flat_ckpt(directory, out, seed):
    import strata
    rng = random.Random(int(seed))
    engine = strata.Engine({"strata": {"backend": "host"}})
    params = []
    for m in range(3):
        mod = engine.add_module("layer%d" % m)
        for name in ("weight", "bias"):
            numel = rng.randrange(1, 3000)
            values = torch.randn(numel, generator=torch.Generator().manual_seed(rng.randrange(1 << 30)))

            def init(offset, count, arr, _v=values):
                torch.frombuffer(arr, dtype=torch.float32).copy_(_v[offset:offset + count])
            params.append(("layer%d.%s" % (m, name), engine.add_param(mod, name, numel, init), numel))
    engine.finalize()
    engine.step()  # no gradients: weight decay alone moves the weights
    engine.save(directory)
    engine.sync()
    tensors = {}
    for name, pid, numel in params:
        t = torch.empty(numel, dtype=torch.float32)
        engine.read_master(pid, 0, numel, t.data_ptr())
        tensors[name] = t
    engine.close()
    torch.save(tensors, out)


def parse(path):
    """{name: (dtype, shape, bytes)} of a safetensors file, every offset checked."""
    with open(path, "rb") as f:
        data = f.read()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    header.pop("__metadata__", None)
    body, out, end = data[8 + n:], {}, 0
    for name, e in header.items():
        b, c = e["data_offsets"]
        if b != end:
            fail("%s: %s starts where the previous tensor ends" % (path, name), b, end)
        end = c
        out[name] = (e["dtype"], e["shape"], body[b:c])
    if end != len(body):
        fail("%s: the data section ends with the last tensor" % path, len(body), end)
    return out


def compare(path, oracle, dtype):
    want = torch.load(oracle)
    got = parse(path)
    if sorted(got) != sorted(want):
        fail("%s: tensor names" % path, sorted(set(got) ^ set(want)), "the same set")
    for name in sorted(set(got) & set(want)):
        dt, shape, raw = got[name]
        w = want[name].to(DTYPES[dtype])
        if dt != dtype or shape != list(w.shape):
            fail("%s: %s dtype and shape" % (path, name), (dt, shape), (dtype, list(w.shape)))
            continue
        g = torch.frombuffer(bytearray(raw), dtype=DTYPES[dtype]).view(w.shape)
        bits = torch.int32 if dtype == "F32" else torch.int16
        diff = (g.view(bits) != w.view(bits)).nonzero()
        if len(diff):
            i = tuple(diff[0].tolist())
            fail("%s: %s bit-identical (%d elements differ; first at %s)" % (path, name, len(diff), i),
                 g[i].item(), w[i].item())
    print("%s: %d tensors compared with %s as %s" % (path, len(got), oracle, dtype))


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    {"gpt-oracle": gpt_oracle, "flat-ckpt": flat_ckpt, "compare": compare}[cmd](*args)
    sys.exit(1 if failed else 0)
