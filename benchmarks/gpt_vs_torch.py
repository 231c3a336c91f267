#!/usr/bin/env python3
"""An independent implementation of strata's GPT model in PyTorch (the oracle of tests/t_model_torch.c).

Reads what the C side wrote into DIR: dims.txt ("layers heads hidden vocab seq batch T"), params.bin (every
parameter, fp32, in model/gpt.h's order), tokens.bin / targets.bin (int32, batch x T), loss.txt and
grads.bin (the C model's loss and gradients). Runs the same forward and backward with torch.nn.functional
(float64, so the reference's own rounding does not count) and prints the differences; exits 1 when the loss
or any gradient tensor differs beyond fp32 tolerance.
"""
import math
import sys

import numpy as np
import torch
import torch.nn.functional as F

BLOCK = ["ln1.weight", "ln1.bias", "attn.qkv.weight", "attn.qkv.bias", "attn.proj.weight", "attn.proj.bias",
         "ln2.weight", "ln2.bias", "mlp.fc.weight", "mlp.fc.bias", "mlp.proj.weight", "mlp.proj.bias"]


def layout(L, C, V, S):
    """(module, name, shape) in the order of model/gpt_layout.c."""
    out = [(0, "wte", (V, C)), (0, "wpe", (S, C))]
    shapes = [(C,), (C,), (3 * C, C), (3 * C,), (C, C), (C,), (C,), (C,), (4 * C, C), (4 * C,), (C, 4 * C), (C,)]
    for l in range(L):
        out += [(l + 1, n, s) for n, s in zip(BLOCK, shapes)]
    out += [(L + 1, "ln_f.weight", (C,)), (L + 1, "ln_f.bias", (C,))]
    return out


def main(d):
    L, NH, C, V, S, B, T = (int(x) for x in open(f"{d}/dims.txt").read().split())
    flat = np.fromfile(f"{d}/params.bin", dtype=np.float32)
    cgrads = np.fromfile(f"{d}/grads.bin", dtype=np.float32)
    tok = torch.from_numpy(np.fromfile(f"{d}/tokens.bin", dtype=np.int32).astype(np.int64)).view(B, T)
    tgt = torch.from_numpy(np.fromfile(f"{d}/targets.bin", dtype=np.int32).astype(np.int64)).view(B, T)
    closs = float(open(f"{d}/loss.txt").read())

    P, pos = [], 0
    for m, name, shape in layout(L, C, V, S):
        n = int(np.prod(shape))
        t = torch.tensor(flat[pos:pos + n].astype(np.float64)).view(shape).requires_grad_(True)
        P.append((m, name, t, pos, n))
        pos += n
    assert pos == flat.size, f"params.bin holds {flat.size} values, the layout {pos}"
    p = {(m, name): t for m, name, t, _, _ in P}

    x = p[(0, "wte")][tok] + p[(0, "wpe")][:T]
    hs = C // NH
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    for l in range(1, L + 1):
        h = F.layer_norm(x, (C,), p[(l, "ln1.weight")], p[(l, "ln1.bias")], eps=1e-5)
        qkv = F.linear(h, p[(l, "attn.qkv.weight")], p[(l, "attn.qkv.bias")])
        q, k, v = (t.view(B, T, NH, hs).transpose(1, 2) for t in qkv.split(C, dim=2))
        att = (q @ k.transpose(-1, -2)) / math.sqrt(hs)
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + F.linear(y, p[(l, "attn.proj.weight")], p[(l, "attn.proj.bias")])
        h = F.layer_norm(x, (C,), p[(l, "ln2.weight")], p[(l, "ln2.bias")], eps=1e-5)
        h = F.gelu(F.linear(h, p[(l, "mlp.fc.weight")], p[(l, "mlp.fc.bias")]), approximate="tanh")
        x = x + F.linear(h, p[(l, "mlp.proj.weight")], p[(l, "mlp.proj.bias")])
    x = F.layer_norm(x, (C,), p[(L + 1, "ln_f.weight")], p[(L + 1, "ln_f.bias")], eps=1e-5)
    logits = x @ p[(0, "wte")].t()
    loss = F.cross_entropy(logits.view(-1, V), tgt.view(-1))
    loss.backward()

    bad = 0
    dl = abs(loss.item() - closs)
    print(f"loss: torch {loss.item():.9f}  strata {closs:.9f}  |diff| {dl:.3e}")
    if dl > 1e-5 * max(1.0, abs(loss.item())):
        bad += 1
    print(f"{'module':>6} {'tensor':<18} {'max|g|':>10} {'max|diff|':>10} {'rel':>9}")
    for m, name, t, off, n in P:
        ref = t.grad.reshape(-1).numpy()
        got = cgrads[off:off + n].astype(np.float64)
        scale = max(np.abs(ref).max(), 1e-12)
        diff = np.abs(ref - got).max()
        rel = diff / scale
        flag = "" if rel < 1e-5 else "  <-- FAIL"
        print(f"{m:>6} {name:<18} {scale:10.3e} {diff:10.3e} {rel:9.2e}{flag}")
        bad += rel >= 1e-5
    print("OK: loss and every gradient match" if not bad else f"FAILED: {bad} mismatches")
    return 1 if bad else 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print(__doc__)
        sys.exit(2)
    sys.exit(main(sys.argv[1]))
