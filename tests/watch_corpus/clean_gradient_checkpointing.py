# expect: clean
# Activation checkpointing (torch.utils.checkpoint, non-reentrant) over blocks with BatchNorm and Dropout: the
# recomputation in backward runs the blocks again, which is not an evaluation.
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint
from torch.utils.data import DataLoader

from _data import blobs


class Deep(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(8, 64)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(64, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Dropout(0.1))
                                    for _ in range(3))
        self.out = nn.Linear(64, 4)

    def forward(self, x):
        x = self.inp(x)
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False)
        return self.out(x)


torch.manual_seed(0)
model = Deep()
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
for X, y in DataLoader(blobs(), batch_size=32, shuffle=True):
    loss = F.cross_entropy(model(X), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
print(f"loss {loss.item():.3f}")
