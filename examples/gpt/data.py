"""The examples' data: a byte stream (one token per byte, vocabulary 256) and random windows of it.

The default corpus is this repository's own text (README.md and docs/*.md, concatenated), so the examples run
with nothing to download. Batches are random windows drawn from a torch.Generator seeded with --seed: micro-batch
i of a run is the same in train_torch.py and train_strata.py, after a resume (skip), and on every rank of a
world, each rank taking its own rows of one draw of world_size x batch windows.
"""
import glob
import os

import torch

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def load_corpus(path=None):
    """The bytes of path, or of README.md + docs/*.md when path is None, as an int64 tensor of tokens."""
    docs = sorted(glob.glob(os.path.join(REPO, "docs", "*.md")))
    files = [path] if path else [os.path.join(REPO, "README.md")] + docs
    data = b"".join(open(f, "rb").read() for f in files)
    return torch.tensor(list(data), dtype=torch.int64)


class Batches:
    """(x, y) micro-batches of batch windows of block tokens; y is x shifted by one token."""

    def __init__(self, data, block, batch, seed, rank=0, world_size=1, device="cpu"):
        if data.numel() <= block + 1:
            raise SystemExit("data: %d tokens is too short for windows of %d" % (data.numel(), block))
        self.data, self.block, self.batch, self.device = data, block, batch, device
        self.rank, self.world_size = rank, world_size
        self.gen = torch.Generator().manual_seed(seed)

    def _offsets(self):
        starts = torch.randint(self.data.numel() - self.block - 1, (self.world_size * self.batch,), generator=self.gen)
        return starts[self.rank * self.batch:(self.rank + 1) * self.batch]

    def next(self):
        starts = self._offsets()
        x = torch.stack([self.data[i:i + self.block] for i in starts.tolist()])
        y = torch.stack([self.data[i + 1:i + 1 + self.block] for i in starts.tolist()])
        return x.to(self.device), y.to(self.device)

    def skip(self, n):
        """Draws (and drops) n micro-batches: where a run resumed after n micro-batches continues."""
        for _ in range(n):
            self._offsets()
