"""What the strata.torch GPT tests (examples/gpt/model.py) share: random token batches that depend only on (seed, step,
micro-batch), and strata's training steps over them. Import after strata_test.require_torch()."""
import torch


def tokens(cfg, rows, seed, step, micro):
    """rows x cfg.block_size random tokens below cfg.vocab_size for (seed, step, micro), and their next-token targets."""
    g = torch.Generator().manual_seed(seed * 1000003 + step * 101 + micro)
    x = torch.randint(0, cfg.vocab_size, (rows, cfg.block_size), generator=g)
    return x, torch.roll(x, -1, dims=1)


def train_steps(engine, batch, seed, first, last, gas, on_step=None):
    """Steps first..last-1 of a strata.torch engine, gas micro-batches each from batch(seed, step, micro); calls
    on_step(step) after each step when given. Returns every micro-batch's loss, in order."""
    losses = []
    for step in range(first, last):
        for micro in range(gas):
            x, y = batch(seed, step, micro)
            loss = engine(x, y)
            engine.backward(loss)
            engine.step()
            losses.append(loss.item())
        if on_step:
            on_step(step)
    return losses
