"""strata.torch with offloaded activations (strata.offload_activations): the tensors autograd saves in forward go
to strata (strata_act_push) and come back in backward (strata_act_pop), to pinned host memory and to NVMe. A small
GPT (examples/gpt/model.py) trained for a few steps with gradient accumulation 2 must end with weights and losses
bit-identical to the same run keeping its activations (the oracle), and the stats must show every kept activation
offloaded and restored, none left kept after the step. A store too small for what forward saves fails with
strata's message naming the key (strata.offload_activations.bytes).
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "helpers"))
import strata_test as T  # noqa: E402

torch = T.require_torch()
import strata  # noqa: E402
import strata.torch  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402
import gpt_batches  # noqa: E402

STEPS, GAS, BATCH = 3, 2, 4
MODEL = GPTConfig(vocab_size=96, block_size=32, n_layer=4, n_head=4, n_embd=64)


def batch(seed, step, micro):
    return gpt_batches.tokens(MODEL, BATCH, seed, step, micro)


def config(acts=None, nvme_dir=None, kept="64MiB"):
    c = {"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}},
         "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.1}},
         "gradient_accumulation_steps": GAS}
    if nvme_dir:
        c["zero_optimization"]["offload_optimizer"]["nvme_path"] = nvme_dir
    if acts:
        c["strata"] = {"offload_activations": {"device": acts, "bytes": kept}}
    return c


def train(seed, cfg):
    torch.manual_seed(seed)
    model = GPT(MODEL)
    engine = strata.torch.initialize(model=model, config=cfg, device="cpu")[0]
    engine.activation_min_bytes = 4096  # this model's saved tensors are small
    losses = gpt_batches.train_steps(engine, batch, seed, 0, STEPS, GAS)
    stats = engine.engine.stats()
    weights = engine.fp32_state_dict()
    engine.close()
    return losses, weights, stats


def main():
    seed = T.seed()
    nvme = T.scratch("py_torch_activations")
    want_losses, want, _ = train(seed, config())
    for acts in ("cpu", "nvme"):
        losses, got, s = train(seed, config(acts, nvme if acts == "nvme" else None))
        T.check(losses == want_losses, "%s: losses equal to keeping the activations" % acts, losses, want_losses)
        diff = [n for n in want if not torch.equal(got[n].view(torch.int32), want[n].view(torch.int32))]
        T.check(not diff, "%s: weights bit-identical to keeping the activations" % acts, diff[:3], [])
        T.check(s["act_pushes"] > 0 and s["act_restore_bytes"] == s["act_offload_bytes"],
                "%s: every kept activation offloaded and restored" % acts,
                (s["act_pushes"], s["act_offload_bytes"], s["act_restore_bytes"]), "pushes > 0, restored == offloaded")
        print("%s: %d activations offloaded, %d B each way, kept at most %d B, backward stall %.3f ms" % (
            acts, s["act_pushes"], s["act_offload_bytes"], s["act_kept_peak_bytes"], s["act_stall_ns"] / 1e6))
    # autograd re-raises what a saved-tensor hook raised as a RuntimeError carrying the message (BudgetError: ...)
    T.check_raises(RuntimeError, "strata.offload_activations.bytes is 64.00 KiB",
                   lambda: train(seed, config("cpu", kept="64KiB")), "a store too small for one forward")
    T.done()


main()
