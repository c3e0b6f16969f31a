# expect: shuffle-off-for-training
# Two bugs at once: class-sorted batches and Adam at lr 10. With shuffled data (--shuffled) the loss still rises
# about 1e4x (tested), so the rise is no consequence of the order. Review of the watch's texts, row 42: it was
# marked one. The watch cannot measure which bug made the rise: the order is the cause, the rise a hint naming it.
import sys

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from _data import blobs

torch.manual_seed(0)
shuffled = "--shuffled" in sys.argv
data = blobs(spread=1.0)
if not shuffled:
    X, y = data.tensors
    order = y.argsort()
    data = TensorDataset(X[order], y[order])             # BUG: sorted by class
model = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 4))
opt = torch.optim.Adam(model.parameters(), lr=10.0)      # BUG: far too high
losses = []
for X, y in DataLoader(data, batch_size=32, shuffle=shuffled):
    loss = F.cross_entropy(model(X), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    losses.append(loss.item())
print(f"first {losses[0]:.3g} max {max(losses):.3g} last5 {sum(losses[-5:]) / 5:.3g}")
